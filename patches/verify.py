"""`eaglegate verify`: is the gate patch in this tree sound, and does it sit on the decode path?

Four checks, each with its evidence:
1. every patched file parses with LibCST (the parser eaglegate rewrites with) and byte-compiles;
2. the analyzer, re-run on the patched tree, finds a call path from the scheduler's batch
   runner through the v1 worker's batch entry into the gate module;
3. the behavioural check (`patches.behaviour`) with recording test doubles passes;
4. the patch manifest, if any, says the tree is patched (not modified since).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import libcst as cst
import networkx as nx

from eaglegate.analyzer.needed import analyze_checked
from eaglegate.analyzer.source import SourceTree
from eaglegate.patches import behaviour, generate


@dataclass
class VerifyCheck:
    name: str
    passed: bool
    detail: str = ""


@dataclass
class VerifyReport:
    version: str
    checks: list[VerifyCheck] = field(default_factory=list)
    gate_path: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {"schema": "eaglegate.verify/1", "version": self.version, "ok": self.ok,
                "checks": [vars(c) for c in self.checks], "gate_path": self.gate_path}


PATCHED_FILES = (generate.WORKER, generate.SERVER_ARGS, generate.GATE)


def verify_tree(tree: SourceTree, threshold: int = 4) -> VerifyReport:
    from eaglegate.patches.transaction import find_marks, status

    report = VerifyReport(tree.version)
    # The v1 files, and any other file that carries the gate's marks (another patch's edits).
    marked = [p.split("/", 1)[1] for p in find_marks(tree.root.parent).files]
    for rel in dict.fromkeys([*PATCHED_FILES, *marked]):
        path = tree.root / rel
        if not path.is_file():
            report.checks.append(VerifyCheck(f"{rel} parses and compiles", False, "missing"))
            continue
        data = path.read_bytes()  # bytes: both parsers honour a BOM or a PEP 263 coding line
        try:
            cst.parse_module(data)
            compile(data, str(path), "exec")
            report.checks.append(VerifyCheck(f"{rel} parses and compiles", True))
        except (cst.ParserSyntaxError, SyntaxError, UnicodeDecodeError) as exc:
            report.checks.append(VerifyCheck(f"{rel} parses and compiles", False, str(exc).splitlines()[0]))

    analysis = analyze_checked(tree)
    report.gate_path = _gate_path(analysis)
    report.checks.append(VerifyCheck(
        "gate on the decode path from the scheduler", bool(report.gate_path),
        " → ".join(f"{h['callee'].rsplit('.', 2)[-2]}.{h['callee'].rsplit('.', 1)[-1]} ({h['site']})"
                   for h in report.gate_path) or "no call path from the scheduler reaches the gate module"))

    try:
        result = behaviour.check_tree(tree.root, threshold)
        failed = [c for c in result.checks if not c.passed]
        report.checks.append(VerifyCheck(
            "behaviour with recording test doubles", result.ok,
            "; ".join(f"{c.name}: {c.detail}" for c in failed) or f"{len(result.checks)} checks passed"))
    except Exception as exc:  # a patched method that cannot even be loaded is a failed check
        report.checks.append(VerifyCheck("behaviour with recording test doubles", False, f"{type(exc).__name__}: {exc}"))

    state = status(tree.root.parent)
    if state.manifest is not None:
        report.checks.append(VerifyCheck("manifest agrees", state.state == "patched", state.state))
    elif state.files:  # applied by `git apply`/`patch`: the marks in the files are all there is
        report.checks.append(VerifyCheck("gate module and the edits that import it are both there",
                                         state.state == "patched", state.note))
    return report


def _gate_path(analysis: Any) -> list[dict[str, Any]]:
    """Hops from the scheduler's batch runner, through the v1 entry, into the gate module."""
    spec_map = analysis.spec_map
    worker = spec_map.worker("v1")
    if worker is None or not worker.paths or worker.entry is None:
        return []
    graph = spec_map.callgraph
    graph.reach([worker.entry], limit=200)
    gate_module = f"{analysis.tree.root.name}.{generate.GATE[:-3].replace('/', '.')}"
    gate_calls = [(graph.sites(worker.entry, n)[0].lineno, n) for n in graph.graph.successors(worker.entry)
                  if n.startswith(gate_module + ".")]
    if not gate_calls:
        return []
    # The scheduler's own loop (not a disaggregation/pipeline variant), then the first gate call.
    own = spec_map.scheduler + "."
    path = min(worker.paths, key=lambda p: (not p.event_loop.startswith(own), len(p.hops), p.event_loop))
    hops = [h.to_json() for h in path.hops]
    target = min(gate_calls)[1]
    route = nx.shortest_path(graph.graph, worker.entry, target)
    for caller, callee in zip(route, route[1:], strict=False):
        site = graph.sites(caller, callee)[0]
        hops.append({"caller": caller, "callee": callee, "site": site.where, "condition": list(site.cond)})
    return hops
