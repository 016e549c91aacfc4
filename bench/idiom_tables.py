"""Precision and recall of `eaglegate graph` over the idiom tables (tests/callgraph/).

Each table case is a small program with its complete expected call graph. This scores the
engine on every case: an edge found and expected is a true positive, found and not expected a
false positive, expected and not found a false negative. Prints one row per table and the
total; `--json` prints the same as JSON.

    python bench/idiom_tables.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

TABLES = Path(__file__).resolve().parent.parent / "tests" / "callgraph"


def load_module(path: Path):
    """A table file (or the cases' helper) loaded as a module; peer_tables.py uses it too."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def score() -> list[dict[str, object]]:
    sys.path.insert(0, str(TABLES))
    graph_of = load_module(TABLES / "callgraph_cases.py").graph_of
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["EAGLEGATE_CACHE"] = str(Path(scratch) / "cache")
        for table in sorted(TABLES.glob("test_idiom_*.py")):
            tp = fp = fn = 0
            failed = []
            for number, (name, files, expected) in enumerate(load_module(table).CASES):
                found = graph_of(Path(scratch) / f"{table.stem}-{number}", files)
                found_edges = {(a, b) for a, callees in found.items() for b in callees}
                expected_edges = {(a, b) for a, callees in expected.items() for b in callees}
                tp += len(found_edges & expected_edges)
                fp += len(found_edges - expected_edges)
                fn += len(expected_edges - found_edges)
                if found_edges != expected_edges:
                    failed.append(name)
            rows.append({"table": table.stem.removeprefix("test_idiom_"), "tp": tp, "fp": fp, "fn": fn,
                         "failed": failed})
    return rows


def _ratio(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else 100.0


def main() -> None:
    rows = score()
    total = {"table": "all", "tp": sum(r["tp"] for r in rows), "fp": sum(r["fp"] for r in rows),  # type: ignore[misc]
             "fn": sum(r["fn"] for r in rows), "failed": [f for r in rows for f in r["failed"]]}  # type: ignore[attr-defined]
    for row in [*rows, total]:
        tp, fp, fn = row["tp"], row["fp"], row["fn"]
        row["precision"] = round(_ratio(tp, tp + fp), 1)  # type: ignore[operator]
        row["recall"] = round(_ratio(tp, tp + fn), 1)  # type: ignore[operator]
    if "--json" in sys.argv:
        print(json.dumps([*rows, total], indent=1))
        return
    print(f"{'table':<20} {'edges':>6} {'precision':>10} {'recall':>8}  failed cases")
    for row in [*rows, total]:
        print(f"{row['table']:<20} {row['tp'] + row['fn']:>6} {row['precision']:>9}% {row['recall']:>7}%  "  # type: ignore[operator]
              f"{', '.join(row['failed']) or '-'}")  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
