"""eaglegate's general call graph beside PyCG and jarviscg: on the idiom tables and on a tree.

1. The idiom tables (tests/callgraph/test_idiom_*.py): each case is a small program with its
   complete expected call graph. Every tool analyses the same files, and its output becomes
   caller → callee edges scored against the expected ones (precision, recall, the cases it
   gets exactly right), per table.
2. SGLang 0.5.9's `srt/` tree: the edges between the tree's own functions, classes and
   modules that all three find, that some find, that eaglegate alone finds (counts and a
   sample of each).

Naming (one mapping for every tool): PyCG's output format is what the tables already use, so
it is read as it is: a node is a dotted name from the analysed root (`main.A.m`; a module's
top-level calls belong to the module's node), a lambda is `<scope>.<lambdaN>`, a builtin is
`<builtin>.name`. jarviscg writes the same format. eaglegate's graph is read from
`CallGraph.build_all()` (the tables' own `graph_of`) or from `eaglegate graph --format json`.
Two kinds of peer edges stand for no call in the tables' convention and are dropped for every
tool: an edge into a class itself (jarviscg links a module to each class it defines, for
running the class body; the tables name instantiation by the `__init__` that runs and file a
class body's calls under the class's node), and `<builtin>.super` (the tables read `super()`
as the lookup it starts, and score the method it reaches). On `srt/` only edges whose two ends
are names under `sglang.srt.` are compared (external names differ between tools:
`torch.zeros` against `torch.zeros` or an unresolved attribute).

PyCG 0.0.8 (the last release; the project is archived) needs two things on Python 3.11: its
wheel installs the package as `PyCG/` while its code imports `pycg` (a case-sensitive file
system finds nothing), so it runs with a directory holding a `pycg` link to it on
PYTHONPATH; and it imports `pkg_resources`, which setuptools 81 dropped (bench/requirements.txt
pins setuptools below 81). Where it stops on a tree with a RecursionError, a second attempt
runs it in a thread with a 512 MiB stack and the recursion limit raised, under its own limit
(`--pycg-deep-timeout`). The peers read a copy of `srt/` without UTF-8 byte-order marks
(`peers_copy`: PyCG fails on one, U+FEFF); eaglegate reads the release itself.

    python bench/peer_tables.py                # both parts; writes bench/peers.json and bench/PEERS.md
    python bench/peer_tables.py --tables-only  # seconds
    python bench/peer_tables.py --tree-only    # the peers take minutes on srt/

It must run with the interpreter eaglegate is installed in; the peers come from
bench/_work/peers (bench/run.py creates it from bench/requirements.txt; `--install` here too).
"""

from __future__ import annotations

import argparse
import ast
import codecs
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from idiom_tables import load_module  # bench/ is the script's own folder on sys.path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
TABLES = ROOT / "tests" / "callgraph"
WORK = BENCH / "_work"
PEERS_VENV = WORK / "peers"
PYCG_SHIM = WORK / "pycg_shim"
RESULTS_JSON = BENCH / "peers.json"
RESULTS_MD = BENCH / "PEERS.md"
TOOLS = ("eaglegate", "pycg", "jarviscg")
TREE_PREFIX = "sglang.srt."
SAMPLE = 12


def _pycg_env() -> dict[str, str]:
    """PYTHONPATH with a `pycg` link to the installed `PyCG/` package (see the docstring)."""
    site = next((PEERS_VENV / "lib").glob("python*/site-packages"))
    PYCG_SHIM.mkdir(parents=True, exist_ok=True)
    link = PYCG_SHIM / "pycg"
    if not link.exists():
        link.symlink_to(site / "PyCG", target_is_directory=True)
    env = dict(os.environ, PYTHONPATH=str(PYCG_SHIM), PYTHONWARNINGS="ignore")
    return env


# PyCG with a deeper stack: its AST visitors recurse once per nesting level and call.
_DEEP_PYCG = """
import runpy, sys, threading
sys.setrecursionlimit(200000)
threading.stack_size(512 * 1024 * 1024)
def main():
    sys.argv[0] = "pycg"
    runpy.run_module("pycg", run_name="__main__")
thread = threading.Thread(target=main)
thread.start()
thread.join()
"""


def peer_command(tool: str, files: list[str], package: Path, output: Path) -> tuple[list[str], dict[str, str]]:
    python = str(PEERS_VENV / "bin" / "python")
    if tool == "pycg":
        return [python, "-m", "pycg", *files, "--package", str(package), "-o", str(output)], _pycg_env()
    if tool == "pycg-deep-stack":
        return [python, "-c", _DEEP_PYCG, *files, "--package", str(package), "-o", str(output)], _pycg_env()
    return [str(PEERS_VENV / "bin" / "jarviscg"), *files, "--package", str(package), "-o", str(output)], \
        dict(os.environ)


def class_names(files: list[str], package: Path) -> set[str]:
    """The qualified names of the classes the files define, named from `package` (as the
    peers name them)."""
    found: set[str] = set()
    for file in files:
        path = Path(file)
        parts = list(path.relative_to(package).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):
            continue
        stack: list[tuple[ast.AST, str]] = [(tree, ".".join(parts))]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = f"{prefix}.{child.name}"
                    if isinstance(child, ast.ClassDef):
                        found.add(name)
                    stack.append((child, name))
                elif not isinstance(child, ast.expr):
                    stack.append((child, prefix))
    return found


def comparable(edges: set[tuple[str, str]], classes: set[str]) -> set[tuple[str, str]]:
    """The edges that stand for a call in the tables' convention (see the docstring)."""
    return {(a, b) for a, b in edges if b != "<builtin>.super" and b not in classes}


def run_peer(tool: str, files: list[str], package: Path, output: Path, timeout: float) -> dict:
    """Run one peer; its edges, or why there are none."""
    cmd, env = peer_command(tool, files, package, output)
    output.unlink(missing_ok=True)
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, cwd=package, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "wall_s": round(time.perf_counter() - start, 1), "edges": set()}
    wall = round(time.perf_counter() - start, 1)
    if done.returncode != 0 or not output.exists():
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return {"status": "error", "wall_s": wall, "edges": set(), "error": lines[-1] if lines else f"exit {done.returncode}"}
    data = json.loads(output.read_text())
    return {"status": "ok", "wall_s": wall, "edges": {(a, b) for a, bs in data.items() for b in bs}}


# --------------------------------------------------------------------------- the idiom tables

def score_tables(timeout: float) -> list[dict]:
    sys.path.insert(0, str(TABLES))
    graph_of = load_module(TABLES / "callgraph_cases.py").graph_of
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["EAGLEGATE_CACHE"] = str(Path(scratch) / "cache")
        for table in sorted(TABLES.glob("test_idiom_*.py")):
            row: dict = {"table": table.stem.removeprefix("test_idiom_"), "cases": 0,
                         **{tool: {"tp": 0, "fp": 0, "fn": 0, "exact": 0, "errors": []} for tool in TOOLS}}
            for number, (name, files, expected) in enumerate(load_module(table).CASES):
                row["cases"] += 1
                program = Path(scratch) / f"{table.stem}-{number}"
                found = {"eaglegate": {(a, b) for a, callees in graph_of(program, files).items() for b in callees}}
                paths = sorted(str(program / name) for name in files)
                for tool in TOOLS[1:]:
                    result = run_peer(tool, paths, program, Path(scratch) / f"{tool}.json", timeout)
                    if result["status"] != "ok":
                        row[tool]["errors"].append(f"{name}: {result['status']} {result.get('error', '')}".strip())
                    found[tool] = result["edges"]
                wanted = {(a, b) for a, callees in expected.items() for b in callees}
                classes = class_names(paths, program)
                for tool, edges in found.items():
                    edges = comparable(edges, classes)
                    tally = row[tool]
                    tally["tp"] += len(edges & wanted)
                    tally["fp"] += len(edges - wanted)
                    tally["fn"] += len(wanted - edges)
                    tally["exact"] += edges == wanted
            rows.append(row)
            print(f"{row['table']}: " + ", ".join(f"{t} {row[t]['exact']}/{row['cases']}" for t in TOOLS), flush=True)
    total: dict = {"table": "all", "cases": sum(r["cases"] for r in rows)}
    for tool in TOOLS:
        total[tool] = {key: sum(r[tool][key] for r in rows) for key in ("tp", "fp", "fn", "exact")}
        total[tool]["errors"] = [e for r in rows for e in r[tool]["errors"]]
    for row in [*rows, total]:
        for tool in TOOLS:
            tally = row[tool]
            tally["precision"] = _ratio(tally["tp"], tally["tp"] + tally["fp"])
            tally["recall"] = _ratio(tally["tp"], tally["tp"] + tally["fn"])
    return [*rows, total]


def _ratio(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 1) if whole else 100.0


# --------------------------------------------------------------------------- the srt/ tree

def eaglegate_tree_edges(srt: Path, output: Path) -> dict:
    script = Path(sys.executable).parent / "eaglegate"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "eaglegate"]
    start = time.perf_counter()
    done = subprocess.run([*cmd, "graph", str(srt), "--format", "json", "-o", str(output)],
                          capture_output=True, text=True)
    wall = round(time.perf_counter() - start, 1)
    if done.returncode != 0:
        return {"status": "error", "wall_s": wall, "edges": set(), "error": done.stderr.strip()[-300:]}
    data = json.loads(output.read_text())
    return {"status": "ok", "wall_s": wall, "edges": {(e["caller"], e["callee"]) for e in data["edges"]}}


def peers_copy(srt: Path, into: Path) -> tuple[list[str], int]:
    """`srt/` as the peers read it: a copy under `into/sglang/srt` with each file's UTF-8
    byte-order mark removed (PyCG reads a file as text and parses the mark as a character,
    a SyntaxError on U+FEFF; Python's own parser skips it). Its files, and how many had one."""
    shutil.rmtree(into, ignore_errors=True)
    files, marked = [], 0
    for source in sorted(p for p in srt.rglob("*.py") if "__pycache__" not in p.parts):
        target = into / "sglang" / "srt" / source.relative_to(srt)
        target.parent.mkdir(parents=True, exist_ok=True)
        data = source.read_bytes()
        marked += data.startswith(codecs.BOM_UTF8)
        target.write_bytes(data.removeprefix(codecs.BOM_UTF8))
        files.append(str(target))
    return files, marked


def compare_tree(version: str, timeout: float, deep_timeout: float) -> dict:
    from eaglegate.analyzer.source import from_release  # noqa: PLC0415

    srt = Path(from_release(version).root) / "srt"
    WORK.mkdir(parents=True, exist_ok=True)
    peer_root = WORK / "tree-peers"
    files, marked = peers_copy(srt, peer_root)
    runs = {"eaglegate": eaglegate_tree_edges(srt, WORK / "tree-eaglegate.json")}
    print(f"eaglegate: {runs['eaglegate']['status']} {runs['eaglegate']['wall_s']} s", flush=True)
    for tool in TOOLS[1:]:
        runs[tool] = run_peer(tool, files, peer_root, WORK / f"tree-{tool}.json", timeout)
        print(f"{tool}: {runs[tool]['status']} {runs[tool]['wall_s']} s {runs[tool].get('error', '')}", flush=True)
        if tool == "pycg" and "RecursionError" in runs[tool].get("error", ""):
            deep = run_peer("pycg-deep-stack", files, peer_root, WORK / "tree-pycg.json", deep_timeout)
            print(f"pycg, deeper stack: {deep['status']} {deep['wall_s']} s", flush=True)
            runs[tool]["attempts"] = [{"attempt": "default", "status": runs[tool]["status"], "wall_s": runs[tool]["wall_s"],
                                       "error": runs[tool]["error"]},
                                      {"attempt": "deeper stack, recursion limit raised", "status": deep["status"],
                                       "wall_s": deep["wall_s"], "error": deep.get("error")}]
            if deep["status"] == "ok":
                runs[tool].update(status="ok", edges=deep["edges"], wall_s=deep["wall_s"], error=None)
    classes = class_names(files, peer_root)
    inside = {tool: {(a, b) for a, b in comparable(run["edges"], classes)
                     if a.startswith(TREE_PREFIX) and b.startswith(TREE_PREFIX)}
              for tool, run in runs.items()}
    ran = [tool for tool in TOOLS if runs[tool]["status"] == "ok"]
    union = set().union(*(inside[t] for t in ran)) if ran else set()
    groups: dict[str, set] = {}
    for edge in union:
        finders = tuple(t for t in ran if edge in inside[t])
        groups.setdefault(" + ".join(finders), set()).add(edge)
    return {
        "version": version, "files": len(files), "byte_order_marks_removed": marked, "tools_that_ran": ran,
        "runs": {t: {k: v for k, v in r.items() if k != "edges"} | {"edges_total": len(r["edges"]),
                                                                      "edges_inside": len(inside[t])}
                 for t, r in runs.items()},
        "found_by": {name: len(edges) for name, edges in sorted(groups.items(), key=lambda g: -len(g[1]))},
        "samples": {name: [f"{a} -> {b}" for a, b in _sample(edges)] for name, edges in sorted(groups.items())},
    }


def _sample(edges: set) -> list:
    """Evenly spaced edges of the sorted set: the same sample on every run."""
    ordered = sorted(edges)
    step = max(1, len(ordered) // SAMPLE)
    return ordered[::step][:SAMPLE]


# --------------------------------------------------------------------------- report

def render(results: dict) -> str:
    lines = ["# eaglegate's call graph beside PyCG and jarviscg", "",
             "Written by `bench/peer_tables.py` (its docstring says how each tool's output is named "
             "and read); rerun it to refresh.", ""]
    versions = results.get("versions", {})
    lines.append("Tools: " + ", ".join(f"{t} {versions.get(t, '?')}" for t in TOOLS) + ".")
    if "tables" in results:
        lines += ["", "## The idiom tables (tests/callgraph/)", "",
                  "Precision / recall in %, and the cases each tool gets exactly right.", "",
                  "| table | cases | " + " | ".join(f"{t} P / R | {t} exact" for t in TOOLS) + " |",
                  "|---|---:|" + "---:|---:|" * len(TOOLS)]
        for row in results["tables"]:
            cells = [f"{row[t]['precision']} / {row[t]['recall']} | {row[t]['exact']}" for t in TOOLS]
            name = f"**{row['table']}**" if row["table"] == "all" else row["table"]
            lines.append(f"| {name} | {row['cases']} | " + " | ".join(cells) + " |")
        total = results["tables"][-1]
        for tool in TOOLS:
            if total[tool]["errors"]:
                lines += ["", f"{tool} failed on {len(total[tool]['errors'])} cases (scored as finding no edge): "
                          + "; ".join(total[tool]["errors"][:5]) + ("…" if len(total[tool]["errors"]) > 5 else "")]
    tree = results.get("tree")
    if tree:
        lines += ["", f"## SGLang {tree['version']} `srt/` ({tree['files']} files)", "",
                  "Edges whose two ends are in `sglang.srt`.", "",
                  "| tool | status | wall s | edges (all) | edges inside srt/ |", "|---|---|---:|---:|---:|"]
        for tool, run in tree["runs"].items():
            for attempt in run.get("attempts") or [run]:
                status = attempt["status"] + (f" ({attempt['error']})" if attempt.get("error") else "")
                name = f"{tool}, {attempt['attempt']}" if "attempt" in attempt else tool
                lines.append(f"| {name} | {status} | {attempt['wall_s']} | {run['edges_total']} | {run['edges_inside']} |")
        lines += ["", "| found by | edges |", "|---|---:|"]
        lines += [f"| {name} | {count} |" for name, count in tree["found_by"].items()]
        for name in ("eaglegate", *(n for n in tree["samples"] if n != "eaglegate" and "eaglegate" not in n)):
            if name in tree["samples"]:
                lines += ["", f"Sample, found by {name} alone:", "", "```",
                          *tree["samples"][name], "```"]
    return "\n".join(lines) + "\n"


def tool_versions() -> dict[str, str]:
    found = {}
    freeze = subprocess.run([str(PEERS_VENV / "bin" / "python"), "-m", "pip", "freeze"],
                            capture_output=True, text=True).stdout
    for line in freeze.splitlines():
        name, _, version = line.partition("==")
        if name.lower() in ("pycg", "jarviscg"):
            found[name.lower()] = version
    from eaglegate import __version__  # noqa: PLC0415

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    found["eaglegate"] = f"{__version__} ({commit})"
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=textwrap.dedent(__doc__ or ""),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables-only", action="store_true")
    parser.add_argument("--tree-only", action="store_true")
    parser.add_argument("--version", default="0.5.9", help="the SGLang release whose srt/ is compared")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per peer run on the tree")
    parser.add_argument("--pycg-deep-timeout", type=float, default=900,
                        help="seconds for PyCG's second attempt on the tree (deeper stack)")
    parser.add_argument("--install", action="store_true", help="install bench/requirements.txt into the peers' venv")
    args = parser.parse_args()
    if args.install or not (PEERS_VENV / "bin" / "python").exists():
        if not (PEERS_VENV / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
        subprocess.run([str(PEERS_VENV / "bin" / "python"), "-m", "pip", "install", "-q", "-r",
                        str(BENCH / "requirements.txt")], check=True)
    results = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {}
    results["versions"] = tool_versions()
    if not args.tree_only:
        results["tables"] = score_tables(timeout=120)
    if not args.tables_only:
        results["tree"] = compare_tree(args.version, args.timeout, args.pycg_deep_timeout)
    RESULTS_JSON.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    RESULTS_MD.write_text(render(results), encoding="utf-8")
    print(f"wrote {RESULTS_JSON.name} and {RESULTS_MD.name}")


if __name__ == "__main__":
    main()
