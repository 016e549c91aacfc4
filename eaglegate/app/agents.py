"""The agent tools' operations: one call answers what an agent asks (`plan_gate` reads the
map, the couplings of the launch, the gate plan and the patch generator's insertion point at
once), over analyses kept per tree for the life of the server process.

`eaglegate.agents.tools` shapes and pages what these return; nothing here words an answer.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglegate.analyzer import source
from eaglegate.app.analysis import analyse, check_launch_settings, couplings_of, planned
from eaglegate.app.patching import Patch, apply, make_patch, patch_files, revert
from eaglegate.app.requests import (
    MAX_TEXT,
    TEXT_LIMITS,
    CouplingsRequest,
    PlanRequest,
    TreeArgs,
    check_text,
    check_threshold,
)
from eaglegate.app.tree import locate, status
from eaglegate.errors import UsageError, UserError

if TYPE_CHECKING:
    from eaglegate.analyzer.analysis import Analysis
    from eaglegate.analyzer.callgraph import CallGraph
    from eaglegate.analyzer.couplings.model import CouplingReport
    from eaglegate.analyzer.couplings.scope import LaunchScope
    from eaglegate.app.analysis import Couplings
    from eaglegate.app.patching import Applied
    from eaglegate.patches import transaction
    from eaglegate.patches.model import PatchSet
    from eaglegate.patches.plan import GatePlan
    from eaglegate.reports.model import Report

log = logging.getLogger("eaglegate.agents")


class Session:
    """The trees and analyses one server process has seen, and its latest report.

    Tools run in worker threads; the analyzer's memo tables are not thread-safe, so
    every use of an analysis holds `lock`."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._analyses: dict[tuple[str, str], Analysis] = {}
        self._full_graphs: dict[tuple[str, str], CallGraph] = {}
        self._stamps: dict[tuple[str, str], tuple[int, int]] = {}
        self.latest_report: dict[str, str] | None = None  # {"markdown", "json", "version"}

    def locate(self, args: TreeArgs) -> source.SourceTree:
        """The tree an agent names, under the agents' policy (`TreeArgs.confined`)."""
        return locate(args, confined=True)

    def analysis(self, tree: source.SourceTree) -> Analysis:
        key = (str(tree.root), tree.version)
        with self.lock:
            stamp = _stamp(tree)
            found = self._analyses.get(key)
            if found is None or self._stamps.get(key) != stamp:
                self.forget(tree)
                found = analyse(tree)
                self._analyses[key] = found
                self._stamps[key] = stamp
            return found

    def full_graph(self, analysis: Analysis) -> CallGraph:
        """The whole tree's call graph (for callers), built once, apart from the map's."""
        from eaglegate.analyzer.callgraph import CallGraph

        key = (str(analysis.tree.root), analysis.tree.version)
        with self.lock:
            graph = self._full_graphs.get(key)
            if graph is None:
                graph = CallGraph(analysis.codebase)
                graph.build_all()
                self._full_graphs[key] = graph
            return graph

    def forget(self, tree: source.SourceTree) -> None:
        """Drop what is known of a tree whose files just changed."""
        with self.lock:
            for store in (self._analyses, self._full_graphs, self._stamps):
                for key in [k for k in store if k[0] == str(tree.root)]:
                    del store[key]


SESSION = Session()


def _stamp(tree: source.SourceTree) -> tuple[int, int]:
    """How many Python files the tree has and the newest mtime: an edit since the last
    analysis shows here (a stat per file, milliseconds). Cached releases never change."""
    if tree.origin == "release":
        return (0, 0)
    count, newest = 0, 0
    for file in tree.root.rglob("*.py"):
        try:
            newest = max(newest, file.stat().st_mtime_ns)
        except OSError:
            continue
        count += 1
    return (count, newest)


# ---------------------------------------------------------------- locate, map, couplings


@dataclass
class Located:
    tree: source.SourceTree
    workers: list[str]
    patch_state: str


def located(args: TreeArgs, session: Session = SESSION) -> Located:
    """Which SGLang this is, its speculative workers, and its patch state."""
    tree = session.locate(args)
    try:
        state = status(tree).state
    except (UserError, OSError) as exc:
        state = f"unknown ({exc})"
    return Located(tree, source.speculative_workers(tree), state)


def analysed(args: TreeArgs, session: Session = SESSION) -> tuple[source.SourceTree, Analysis]:
    """The tree and its analysis (kept for the session). Read it holding `session.lock`."""
    tree = session.locate(args)
    with session.lock:
        return tree, session.analysis(tree)


def couplings_for(args: TreeArgs, request: CouplingsRequest,
                  session: Session = SESSION) -> tuple[source.SourceTree, Analysis, Couplings]:
    """`find_couplings`: the couplings of the tree for the request's launch."""
    tree = session.locate(args)
    with session.lock:
        analysis = session.analysis(tree)
        return tree, analysis, couplings_of(analysis, request)


# ---------------------------------------------------------------- explain_symbol


@dataclass(frozen=True)
class ExplainRequest:
    """A function or class, named (`symbol`) or pointed at (`location`, file[:line])."""

    symbol: str | None = None
    location: str | None = None

    def __post_init__(self) -> None:
        symbol = check_text("symbol", self.symbol, TEXT_LIMITS["symbol"])
        location = check_text("location", self.location, TEXT_LIMITS["location"])
        if (symbol is None) == (location is None):
            raise UsageError("give exactly one of symbol (e.g. EAGLEWorker.forward_batch_generation) "
                             "or location (e.g. srt/managers/scheduler.py:2368)")
        if symbol is not None and not re.fullmatch(r"[A-Za-z_][\w.]*", symbol):
            raise UsageError(f"symbol must be a dotted Python name, not {symbol!r}")
        object.__setattr__(self, "symbol", symbol)
        object.__setattr__(self, "location", location)


@dataclass
class Explained:
    """A symbol's definition and calls, or the candidates its name matches."""

    tree: source.SourceTree
    analysis: Analysis
    symbol: str = ""  # the qualified name; empty when `candidates` are to choose from
    candidates: list[str] = field(default_factory=list)
    callers: list[tuple[str, Any]] = field(default_factory=list)  # (qualified name, call site)
    callees: list[tuple[str, Any]] = field(default_factory=list)
    focus: int | None = None  # the line asked for
    file: str = ""  # the definition's file, relative to the package
    lines: list[str] = field(default_factory=list)  # that file's lines (empty: not read)


def inside_tree(tree: source.SourceTree, given: str) -> Path:
    """The file `given` names (relative to the package, `sglang/...`, or absolute), resolved
    with symlinks followed; refused unless it lies inside the located tree."""
    text = check_text("location", given, MAX_TEXT)
    if text is None:
        raise UsageError("location is empty")
    root = tree.root.resolve()
    candidate = Path(text).expanduser()
    if not candidate.is_absolute():
        parts = candidate.parts
        if parts and parts[0] == root.name and not (root / candidate).exists():
            candidate = Path(*parts[1:]) if len(parts) > 1 else Path(".")
        candidate = root / candidate
    resolved = candidate.resolve()
    if not resolved.is_relative_to(root):
        raise UsageError(f"{given!r} is outside the located SGLang tree ({root}); "
                         "give a path inside it, e.g. srt/managers/scheduler.py:1123")
    if not resolved.is_file():
        raise UsageError(f"{given!r} is not a file in the located SGLang tree")
    return resolved


def _symbol_at(analysis: Analysis, rel: str, line: int) -> str | None:
    """The innermost function or class of file `rel` whose lines hold `line`."""
    cb = analysis.codebase
    best: tuple[int, str] | None = None
    for qn, scope in cb.scopes.items():
        if scope.kind not in ("function", "class") or cb.scope_module[qn].path != rel:
            continue
        end = scope.end_lineno or scope.lineno
        if scope.lineno <= line <= end and (best is None or end - scope.lineno < best[0]):
            best = (end - scope.lineno, qn)
    if best is None:
        module = next((m for m in cb.modules.values() if m.path == rel), None)
        return module.name if module else None
    return best[1]


def explain(args: TreeArgs, request: ExplainRequest, session: Session = SESSION) -> Explained:
    """`explain_symbol`: where a function or class is defined, who calls it, what it calls,
    and the lines of its file. Read the answer holding `session.lock`."""
    from eaglegate.analyzer import files

    tree = session.locate(args)
    with session.lock:
        analysis = session.analysis(tree)
        cb = analysis.codebase
        focus: int | None = None
        if request.location is not None:
            match = re.fullmatch(r"(.+?)(?::(\d+))?", request.location)
            assert match is not None
            file = inside_tree(tree, match.group(1))
            rel = file.relative_to(tree.root.resolve()).as_posix()
            focus = int(match.group(2)) if match.group(2) else None
            qn = _symbol_at(analysis, rel, focus or 1)
            if qn is None:
                raise UsageError(f"{rel} is not a Python module the analysis parsed")
        else:
            assert request.symbol is not None
            candidates = cb.find(request.symbol)
            if not candidates:
                raise UsageError(f"no function or class named {request.symbol!r} in SGLang {tree.version}; "
                                 "try a qualified name such as Scheduler.run_batch")
            if len(candidates) > 1:
                return Explained(tree, analysis, candidates=candidates)
            qn = candidates[0]
        graph = session.full_graph(analysis)
        callers = ([(c, s) for c in sorted(graph.graph.predecessors(qn)) for s in graph.sites(c, qn)]
                   if qn in graph.graph else [])
        callees = ([(c, s) for c in sorted(graph.graph.successors(qn)) for s in graph.sites(qn, c)]
                   if qn in graph.graph else [])
        rel = cb.scope_module[qn].path
        path = (tree.root / rel).resolve()
        lines: list[str] = []
        if path.is_relative_to(tree.root.resolve()):  # a symlink out of the tree: never read through it
            try:
                lines = files.text(path).splitlines()
            except (OSError, UnicodeDecodeError, SyntaxError):
                lines = []
        return Explained(tree, analysis, qn, [], callers, callees, focus, rel, lines)


# ---------------------------------------------------------------- plan_gate


@dataclass
class Gate:
    """The patch generator's answer for a default launch: its patch, or why there is none."""

    family: str = ""
    patch: PatchSet | None = None
    refused: str = ""


@dataclass
class GateAnswer:
    """Everything `plan_gate` says: each part that failed says why, the others still answer."""

    tree: source.SourceTree
    analysis: Analysis
    couplings: CouplingReport | None = None
    scope: LaunchScope | None = None
    couplings_note: str = ""
    plan: GatePlan | None = None
    plan_note: str = ""
    gate: Gate = field(default_factory=Gate)


def gate(tree: source.SourceTree) -> Gate:
    """The gate patch a default launch gets (the same for every threshold), or why none."""
    from eaglegate.patches import generate

    try:
        family = generate.check_family(tree)
        return Gate(family, patch_files(tree, confined=True))
    except UserError as exc:
        return Gate(refused=str(exc))


def plan_gate(args: TreeArgs, request: PlanRequest, session: Session = SESSION) -> GateAnswer:
    """One call: which worker runs, what blocks switching speculation off, and where the gate
    goes. A malformed launch is the caller's error, refused before any part is computed."""
    tree = session.locate(args)
    with session.lock:
        analysis = session.analysis(tree)
        launch = request.launch
        check_launch_settings(analysis, str(launch.flags), list(launch.env))
        answer = GateAnswer(tree, analysis)
        try:
            found = couplings_of(analysis, CouplingsRequest(launch))
            answer.couplings, answer.scope = found.report, found.scoped
        except UserError as exc:
            answer.couplings_note = str(exc)
        except Exception as exc:  # noqa: BLE001 - one failing part must not sink the one-call answer
            log.exception("couplings failed on %s", tree.root)
            answer.couplings_note = f"the couplings analysis failed: {type(exc).__name__}: {exc}"
        try:
            answer.plan = planned(analysis, request)
        except UsageError:
            raise  # an argument the launch cannot take (a depth table for the v1 worker): the caller's
        except UserError as exc:
            answer.plan_note = str(exc)
        except Exception as exc:  # noqa: BLE001
            log.exception("plan failed on %s", tree.root)
            answer.plan_note = f"the gate plan failed: {type(exc).__name__}: {exc}"
    answer.gate = gate(tree)
    return answer


# ---------------------------------------------------------------- patches and reports


def generate(args: TreeArgs, threshold: object, session: Session = SESSION) -> tuple[source.SourceTree, Patch]:
    """`generate_patch`: the gate patch for the tree and its launch flags (nothing is written)."""
    checked = check_threshold(threshold)
    tree = session.locate(args)
    return tree, make_patch(tree, checked, confined=True)


def _confirmed(tool: str, confirm: object, extra: str = "") -> None:
    if confirm is not True:
        raise UsageError(f"{tool} changes SGLang's files: call it again with confirm: true{extra}; "
                         "nothing was written")


def apply_gate(args: TreeArgs, threshold: object, confirm: object,
               session: Session = SESSION) -> tuple[source.SourceTree, Applied]:
    """`apply_patch`: install the gate patch, only when confirmed; the tree's analysis is dropped."""
    checked = check_threshold(threshold)
    _confirmed("apply_patch", confirm, " (generate_patch shows the diff first)")
    tree = session.locate(args)
    with session.lock:
        try:
            return tree, apply(tree, checked, confined=True)
        finally:
            session.forget(tree)


def revert_gate(args: TreeArgs, confirm: object, force: bool,
                session: Session = SESSION) -> tuple[source.SourceTree, transaction.Outcome, transaction.Status]:
    """`revert_patch`: restore every byte the gate patch changed, only when confirmed."""
    _confirmed("revert_patch", confirm)
    tree = session.locate(args)
    with session.lock:
        try:
            outcome, state = revert(tree, force=bool(force), confined=True)
        finally:
            session.forget(tree)
    return tree, outcome, state


def report(args: TreeArgs, session: Session = SESSION) -> tuple[source.SourceTree, Report]:
    """`report`: the report of the tree (its analysis kept for the session)."""
    from eaglegate.app.reports import report_of

    tree = session.locate(args)
    with session.lock:
        return tree, report_of(session.analysis(tree))
