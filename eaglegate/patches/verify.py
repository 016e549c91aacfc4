"""`eaglegate verify`: is the gate patch in this tree sound, and does it sit on the decode path?

Checks, each with its evidence, for every worker family the tree's patch wires (the v1
`EAGLEWorker`, the overlap worker `EAGLEWorkerV2`, or both):
1. every patched file parses with LibCST (the parser eaglegate rewrites with) and byte-compiles;
2. the analyzer, re-run on the patched tree, finds a call path from the scheduler's batch
   runner through the worker's batch entry into the gate module;
3. v1: the behavioural check (`patches.behaviour`) with recording test doubles passes;
   overlap worker: the gated decode and the gated prefill come first in their branches of
   the batch entry, and the decode preparation reserves KV through the gate (its behaviour
   with each release's own classes is tests/test_gate_releases.py; on a GPU, bench/gpu), and
   every SGLang field, method and enum member the gate uses is declared in the tree, with a
   type the gate handles (`gate_contract`: the failure names it and its file:line);
4. the patch manifest, if any, says the tree is patched (not modified since).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import libcst as cst
import networkx as nx

from eaglegate.analyzer import files
from eaglegate.analyzer.needed import analyze_checked
from eaglegate.analyzer.source import SourceTree
from eaglegate.errors import UserError
from eaglegate.patches import behaviour, gate_contract, gate_module, generate, live_runs
from eaglegate.patches.codemods import v2_worker
from eaglegate.patches.codemods.common import GATE_MODULE
from eaglegate.patches.codemods.server_args import DEPTH_TABLE


@dataclass
class VerifyCheck:
    name: str
    passed: bool
    detail: str = ""
    # Passed, but something the check looks for is missing where it may not matter (the
    # detail says what): shown as a warning, never failing the report.
    warning: bool = False


@dataclass
class VerifyReport:
    version: str
    checks: list[VerifyCheck] = field(default_factory=list)
    gate_path: list[dict[str, Any]] = field(default_factory=list)
    live: str = ""  # whether the gate ran on this release on a GPU, or was checked statically only

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {"schema": "eaglegate.verify/1", "version": self.version, "ok": self.ok,
                "checks": [vars(c) for c in self.checks], "gate_path": self.gate_path, "live": self.live}


def _wired(tree: SourceTree, rel: str) -> bool:
    path = tree.root / rel
    return path.is_file() and files.contains(path, GATE_MODULE.encode())


def patched_families(tree: SourceTree) -> list[str]:
    """The worker labels (`v1`, `v2`) whose files in this tree call the gate; v1 when none
    does (an unpatched tree is checked, and fails, as the v1 patch)."""
    found = [label for label, rel in (("v1", generate.WORKER), ("v2", generate.WORKER_V2))
             if _wired(tree, rel)]
    return found or ["v1"]


def verify_tree(tree: SourceTree, threshold: int = 4) -> VerifyReport:
    from eaglegate.patches.transaction import find_marks, status

    report = VerifyReport(tree.version, live=live_runs.live_status(tree.version))
    families = patched_families(tree)
    edited = [generate.WORKER] if "v1" in families else []
    if "v2" in families:
        edited += [generate.WORKER_V2, generate.decode_prep_edit(tree)[0]]
    # Any other file that carries the gate's marks (edits of a patch this one does not know).
    marked = [p.split("/", 1)[1] for p in find_marks(tree.root.parent).files]
    for rel in dict.fromkeys([*edited, generate.SERVER_ARGS, generate.GATE, *marked]):
        path = tree.root / rel
        if not path.is_file():
            report.checks.append(VerifyCheck(f"{rel} parses and compiles", False, "missing"))
            continue
        try:
            files.check_compiles(files.read_bytes(path), str(path))
            report.checks.append(VerifyCheck(f"{rel} parses and compiles", True))
        except (cst.ParserSyntaxError, SyntaxError, UnicodeDecodeError) as exc:
            report.checks.append(VerifyCheck(f"{rel} parses and compiles", False, str(exc).splitlines()[0]))

    analysis = analyze_checked(tree)
    for label in families:
        hops = _gate_path(analysis, label)
        report.gate_path = report.gate_path or hops
        name = "gate on the decode path from the scheduler" + (" (overlap worker)" if label == "v2" else "")
        report.checks.append(VerifyCheck(
            name, bool(hops),
            " → ".join(f"{h['callee'].rsplit('.', 2)[-2]}.{h['callee'].rsplit('.', 1)[-1]} ({h['site']})"
                       for h in hops) or "no call path from the scheduler reaches the gate module"))

    if "v1" in families:
        try:
            result = behaviour.check_tree(tree.root, threshold)
            failed = [c for c in result.checks if not c.passed]
            report.checks.append(VerifyCheck(
                "behaviour with recording test doubles", result.ok,
                "; ".join(f"{c.name}: {c.detail}" for c in failed) or f"{len(result.checks)} checks passed"))
        except Exception as exc:  # a patched method that cannot even be loaded is a failed check
            report.checks.append(VerifyCheck("behaviour with recording test doubles", False,
                                             f"{type(exc).__name__}: {exc}"))
    if "v2" in families:
        report.checks.append(_overlap_wiring(tree))
        report.checks.append(_gate_contract(tree))
        depth = _depth_gate(tree, analysis)
        if depth is not None:
            report.checks.append(depth)

    state = status(tree.root.parent)
    if state.manifest is not None:
        report.checks.append(VerifyCheck("manifest agrees", state.state == "patched", state.state))
    elif state.files:  # applied by `git apply`/`patch`: the marks in the files are all there is
        report.checks.append(VerifyCheck("gate module and the edits that import it are both there",
                                         state.state == "patched", state.note))
    return report


def _overlap_wiring(tree: SourceTree) -> VerifyCheck:
    """The overlap worker's edits where they must be: re-running its codemods on the patched
    files changes nothing (each one finds its anchors, already wired, and refuses a file
    that is wired by half), and the gated branches come first in their branches."""
    name = "overlap worker: gated decode and prefill first in their branches, KV reserved through the gate"
    try:
        for rel, transform in ((generate.WORKER_V2, v2_worker.patch_worker),
                               generate.decode_prep_edit(tree)):
            text = files.text(tree.root / rel)
            if transform(text, rel) != text:
                return VerifyCheck(name, False, f"{rel} is not fully patched")
        worker = files.concrete(files.text(tree.root / generate.WORKER_V2))
        firsts = _first_statements_of_branches(worker)
    except Exception as exc:  # noqa: BLE001 - a refusal or a broken file is a failed check
        return VerifyCheck(name, False, str(exc).splitlines()[0])
    wanted = {v2_worker.IS_GATED, v2_worker.IS_GATED_PREFILL}
    found = wanted & firsts
    return VerifyCheck(name, found == wanted, f"first in their branches: {sorted(found)}")


def _gate_contract(tree: SourceTree) -> VerifyCheck:
    """Everything the overlap worker's gate reads and writes, declared in this tree as the
    gate handles it (`gate_contract`)."""
    problems = gate_contract.check(tree.root)
    return VerifyCheck("overlap worker: every SGLang field, method and enum member the gate uses, "
                       "declared as it handles it", not problems,
                       "; ".join(map(str, problems)) or f"{len(gate_module.RELIES_ON) + len(gate_module.RELIES_ON_OBJECTS)} classes checked")


DEPTH_CHECK = "depth gate: whether what it reads is declared, and the route its table takes"


def _depth_gate(tree: SourceTree, analysis: Any) -> VerifyCheck | None:
    """Where the patch declares the depth table's server argument: the step's context the
    depth gate reads is declared in this release, and whether the table's depths run in
    adaptive tiers or collapse to {0, the launch depth} (`plan.depth_tiers`, which `plan`
    asks too). None for a patch without it. A launch without a table never runs the depth
    gate, so what it alone reads is a warning here, never a failed check: verify does not
    know the launch: the check passes with its warning state set."""
    from eaglegate.patches.plan import depth_tiers

    try:
        rel = generate.gate_fields_module(tree)
        declares = f"{DEPTH_TABLE.field}:" in files.text(tree.root / rel)
    except (UserError, OSError):  # where the arguments are declared is the other checks' finding
        return None
    if not declares:
        return None
    missing = gate_contract.undeclared(tree.root, gate_module.DEPTH_READS)
    tiers, why_not = depth_tiers(analysis)
    route = ("route: adaptive tiers, each depth of the table in a tier of its own when the server "
             "is launched with --speculative-adaptive (`eaglegate plan --depth-table` gives the flags)"
             if tiers is not None else
             f"route: no adaptive tiers ({why_not}): the table collapses to {{0, the launch depth}}")
    lacks = (f"warning: {', '.join(missing)} not declared: with a depth table the depth gate cannot place "
             "a step in a context band; " if missing else "")
    return VerifyCheck(DEPTH_CHECK, True, lacks + route, warning=bool(missing))


def _first_statements_of_branches(module: cst.Module) -> set[str]:
    """Names called by the test of the first statement of each if/else branch of
    `EAGLEWorkerV2.forward_batch_generation`."""
    names: set[str] = set()
    for cls in module.body:
        if not (isinstance(cls, cst.ClassDef) and cls.name.value == v2_worker.WORKER_CLASS):
            continue
        for func in cls.body.body:
            if not (isinstance(func, cst.FunctionDef) and func.name.value == v2_worker.ENTRY):
                continue
            for stmt in func.body.body:
                if not (isinstance(stmt, cst.If) and isinstance(stmt.orelse, cst.Else)):
                    continue
                for block in (stmt.body, stmt.orelse.body):
                    first = block.body[0] if isinstance(block, cst.IndentedBlock) else None
                    if isinstance(first, cst.If) and isinstance(first.test, cst.Call) \
                            and isinstance(first.test.func, cst.Name):
                        names.add(first.test.func.value)
    return names


def _gate_path(analysis: Any, label: str = "v1") -> list[dict[str, Any]]:
    """Hops from the scheduler's batch runner, through the worker's entry, into the gate module."""
    spec_map = analysis.spec_map
    worker = spec_map.worker(label)
    if worker is None or not worker.paths or worker.entry is None:
        return []
    graph = spec_map.callgraph
    graph.reach([worker.entry], limit=200)
    gate_module = f"{analysis.tree.root.name}.{generate.GATE[:-3].replace('/', '.')}"
    gate_calls = [(graph.sites(worker.entry, n)[0].lineno, n) for n in graph.graph.successors(worker.entry)
                  if n.startswith(gate_module + ".")]
    if label == "v2":  # the overlap worker's path runs to the gated decode step
        gate_calls = [c for c in gate_calls if c[1].endswith("." + v2_worker.RUN_GATED)] or gate_calls
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
