"""Score `eaglegate couplings` against our own reviewer's reading of a release.

The reading (`reading-<version>.json`) lists the sites a reviewer reading the release by
hand names as couplings: a file, the function (`Class.method` or a module function), the
mechanism and one line saying why. A site is found when a finding of the release's
couplings lies in that file and function: the function enclosing the finding's line in the
release's own source (or, for a finding on a class or field, the function its symbol names).

Reports, as markdown: recall per release (every finding, `--all`; and the default list of
a triton EAGLE launch), the sites missed, what `--all` adds to that list by file, and
findings per rule (category/kind) on the precision releases with how many of them fall in a
reading's function.

    python bench/couplings_reading/score.py [--recall 0.5.9 0.5.4] [--precision 0.5.9 0.5.23]
                                            [--out bench/couplings_reading/score.md]

This reading is ours, made from the releases' source; it is not the issue's held-out one.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import tempfile
from collections import Counter
from functools import cache
from pathlib import Path

from eaglegate.analyzer.source import from_release
from eaglegate.app import couplings_answer

HERE = Path(__file__).resolve().parent
LAUNCH = "--speculative-algorithm EAGLE --attention-backend triton"


@cache
def _functions(path: Path) -> list[tuple[int, int, str]]:
    """(first line, last line, qualified name) of every top-level function and method."""
    found: list[tuple[int, int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                found.append((start, child.end_lineno or child.lineno, prefix + child.name))

    visit(ast.parse(path.read_text()), "")
    return found


def enclosing(root: Path, rel: str, line: int) -> str | None:
    """The function (`Class.method`) of `root/rel` whose body holds `line`."""
    path = root / rel
    if not path.is_file():
        return None
    spans = [(a, b, qn) for a, b, qn in _functions(path) if a <= line <= b]
    return min(spans, key=lambda s: s[1] - s[0])[2] if spans else None


def finding_places(root: Path, finding: dict) -> set[tuple[str, str]]:
    """The (file, function) places a finding stands for: its site's function and, for a
    finding on a field or class, the function its symbol names if that is in the file."""
    places = set()
    function = enclosing(root, finding["path"], finding["line"])
    if function:
        places.add((finding["path"], function))
    module = "sglang." + finding["path"].removesuffix(".py").replace("/", ".")
    symbol = finding["symbol"].split(":", 1)[0]
    if symbol.startswith(module + "."):
        places.add((finding["path"], symbol[len(module) + 1:]))
    return places


def load_reading(version: str) -> list[dict]:
    return json.loads((HERE / f"reading-{version}.json").read_text())["sites"]


def check_reading(root: Path, sites: list[dict]) -> list[str]:
    """Reading sites whose file or function the release does not have (a typo in the reading)."""
    bad = []
    for site in sites:
        path = root / site["file"]
        if not path.is_file() or site["function"] not in {qn for _, _, qn in _functions(path)}:
            bad.append(f"{site['file']}::{site['function']}")
    return bad


def run(version: str) -> tuple[Path, list[dict], list[dict]]:
    """The release's root, every finding (`--all`) and the findings of the triton launch."""
    tree = from_release(version)
    every = couplings_answer(tree, every=True).to_json()["findings"]
    scoped = couplings_answer(tree, LAUNCH).to_json()
    return Path(tree.root), every, scoped


def recall(root: Path, sites: list[dict], findings: list[dict]) -> tuple[int, list[dict]]:
    found = set()
    for finding in findings:
        found |= finding_places(root, finding)
    missed = [s for s in sites if (s["file"], s["function"]) not in found]
    return len(sites) - len(missed), missed


def _write_atomic(path: Path, text: str) -> None:
    """Write beside the target, then rename over it: a reader never sees half a file."""
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as tmp:
        tmp.write(text)
    os.replace(tmp.name, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recall", nargs="*", default=["0.5.9", "0.5.4"])
    parser.add_argument("--precision", nargs="*", default=["0.5.9", "0.5.23"])
    parser.add_argument("--out", type=Path, default=HERE / "score.md")
    args = parser.parse_args(argv)
    runs = {v: run(v) for v in dict.fromkeys([*args.recall, *args.precision])}
    lines = ["# Couplings against our own reading", "",
             "Our own reviewer's reading (bench/couplings_reading/reading-*.json), made from each",
             "release's source: not the issue's held-out reading. A site is found when a finding",
             "lies in its file and function. `--all`: every finding; `triton`: the default list",
             f"for `{LAUNCH}` (a v1 launch: the reading's v2 sites are not on its path).", "",
             "| release | sites | found (--all) | recall (--all) | found (triton) | recall (triton) |"
             " blocking mechanisms (triton) | findings (--all) | findings (triton) |",
             "|---|---|---|---|---|---|---|---|---|"]
    missed_lines: list[str] = []
    for version in args.recall:
        root, every, scoped = runs[version]
        sites = load_reading(version)
        bad = check_reading(root, sites)
        if bad:
            print(f"reading-{version}.json names what {version} does not have: {', '.join(bad)}", file=sys.stderr)
            return 2
        hit, missed = recall(root, sites, every)
        hit_scoped, missed_scoped = recall(root, sites, scoped["findings"])
        blocking = sum(1 for m in scoped["mechanisms"] if m["severity"] == "blocks-runtime-switch")
        lines.append(f"| {version} | {len(sites)} | {hit} | {hit / len(sites):.0%} | {hit_scoped} | "
                     f"{hit_scoped / len(sites):.0%} | {blocking} | {len(every)} | {len(scoped['findings'])} |")
        missed_lines += [f"- {version} (--all): `{s['file']}` `{s['function']}`: {s['mechanism']}" for s in missed]
        missed_lines += [f"- {version} (triton only): `{s['file']}` `{s['function']}`: {s['mechanism']}"
                         for s in missed_scoped if s not in missed]
    lines += ["", "## Sites missed", "", *(missed_lines or ["none"]), ""]
    # Why `--all` is larger than the launch's list: what it adds, by the file of the site.
    for version in args.recall:
        _, every, scoped = runs[version]
        kept = {json.dumps(f, sort_keys=True) for f in scoped["findings"]}
        added = Counter(f["site"].split(":")[0] for f in every if json.dumps(f, sort_keys=True) not in kept)
        lines += [f"## What `--all` adds to the triton list on {version}", "",
                  f"{sum(added.values())} findings, by the file of their site:", "",
                  "| file | findings |", "|---|---|",
                  *(f"| `{path}` | {n} |" for path, n in sorted(added.items(), key=lambda kv: (-kv[1], kv[0]))), ""]
    # Precision: findings per rule, and how many fall in a function of a reading (a rough
    # bound from below: the reading names ~55 functions, a rule may rightly find more).
    readings = {(s["file"], s["function"]) for v in args.recall for s in load_reading(v)}
    header = " | ".join(f"{v} findings | {v} in a reading's function" for v in args.precision)
    lines += ["## Findings per rule", "", f"| rule | {header} |",
              "|---|" + "---|---|" * len(args.precision)]
    table: dict[str, dict[str, tuple[int, int]]] = {}
    for version in args.precision:
        root, every, _ = runs[version]
        per_rule: Counter = Counter()
        in_reading: Counter = Counter()
        for finding in every:
            rule = f"{finding['category']}/{finding['kind']}"
            per_rule[rule] += 1
            in_reading[rule] += bool(finding_places(root, finding) & readings)
        for rule in per_rule:
            table.setdefault(rule, {})[version] = (per_rule[rule], in_reading[rule])
    for rule in sorted(table):
        cells = " | ".join(f"{table[rule].get(v, (0, 0))[0]} | {table[rule].get(v, (0, 0))[1]}"
                           for v in args.precision)
        lines.append(f"| {rule} | {cells} |")
    lines += ["", "The second column of each release counts findings in a function the readings name (both",
              "readings' files and functions; a later release that moved a file counts 0 there, so the",
              "0.5.23 column says little). A rule may rightly find more than the ~55 functions named."]
    text = "\n".join(lines) + "\n"
    _write_atomic(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
