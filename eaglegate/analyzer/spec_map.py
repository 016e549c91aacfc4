"""The map: every path from the Scheduler's event loops to each EAGLE worker and its steps.

The names below (`Question`) are the user's question and its defaults; everything
else is derived from the parsed tree: which methods are event loops, which worker
method the scheduler calls (the batch entry), where the worker class is chosen and
under which condition, and which path each event loop can really take (call sites
whose conditions contradict the path's are not taken).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eaglegate.analyzer import files
from eaglegate.analyzer.callgraph import CallGraph, load_codebase
from eaglegate.analyzer.conditions import (
    Formula,
    Literal,
    atoms_of,
    conflicts,
    formula,
    literals,
    satisfiable,
)
from eaglegate.analyzer.index import Codebase, Site
from eaglegate.analyzer.source import SourceTree
from eaglegate.analyzer.step_calls import Call, StepCalls, capturing_functions, graph_runner_classes
from eaglegate.analyzer.tiers import find_tiers
from eaglegate.errors import UserError

if TYPE_CHECKING:
    import networkx as nx

MAP_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Question:
    """What to map. The defaults ask SGLang's question."""

    scheduler: str = "Scheduler"
    event_loop_prefix: str = "event_loop"
    workers: tuple[tuple[str, str], ...] = (("EAGLEWorker", "v1"), ("EAGLEWorkerV2", "v2"))
    steps: tuple[tuple[str, str], ...] = (
        ("draft_extend", r"draft_extend"),
        ("verify", r"^_?verify$"),
        ("draft", r"^_?draft$|^draft_forward$"),
    )
    max_path_len: int = 8
    # One level below the steps (eaglegate/analyzer/step_calls.py): the forward-mode attribute, the
    # verbs of KV-slot allocation and release, decode preparation, result processing and
    # the requests' output tokens.
    mode_attribute: str = "forward_mode"
    kv_alloc: str = r"^alloc(_|$)"
    kv_free: str = r"^free(_|$)"
    decode_preparation: str = r"^prepare_for_decode$"
    result_processing: str = r"^process_batch_result"
    output_tokens: str = "output_ids"
    # The call chain inside the steps: tree building (its inputs are found by data flow), the
    # verify input's preparation (its sampling is found by data flow from the target
    # forward), and the result's next tokens (what replaces them on the overlap path).
    tree_building: str = r"^build_tree"
    verify_preparation: str = r"prepare_for\w*_verify$"
    next_tokens: str = "next_token_ids"

    @property
    def classes(self) -> tuple[str, ...]:
        """The classes the question names: parsing starts from the modules that define them."""
        return (self.scheduler, *(name for name, _ in self.workers))


@dataclass
class Hop:
    caller: str
    callee: str
    site: Site
    # The caller's other sites of this call whose conditions can hold on the same way here
    # (0.5.23's non-overlap run_batch calls the worker at two, one per pipeline stage kind).
    also: list[Site] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"caller": self.caller, "callee": self.callee, "site": self.site.where,
                "condition": list(self.site.cond),
                "also_at": [{"site": s.where, "condition": list(s.cond)} for s in self.also]}


@dataclass
class WorkerPath:
    event_loop: str
    hops: list[Hop]
    literals: set[Literal] = field(default_factory=set)

    def to_json(self) -> dict[str, Any]:
        return {"event_loop": self.event_loop, "hops": [h.to_json() for h in self.hops]}


@dataclass
class Step:
    kind: str  # draft | verify | draft_extend
    function: str
    hops: list[Hop]
    site: Site  # the definition
    calls: list[Call] = field(default_factory=list)  # what it does below (model calls, KV slots…)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "function": self.function, "defined_at": self.site.where,
                "hops": [h.to_json() for h in self.hops], "calls": [c.to_json() for c in self.calls]}


@dataclass
class Selection:
    """Where the worker class is chosen: a factory's return or a constructor call."""

    kind: str  # factory (a return) | choice (an assignment) | constructor (a call)
    function: str
    site: Site

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "function": self.function, "site": self.site.where,
                "condition": list(self.site.cond)}


@dataclass
class WorkerMap:
    name: str
    label: str
    cls: str | None
    defined_at: Site | None = None
    entry: str | None = None
    selection: list[Selection] = field(default_factory=list)
    paths: list[WorkerPath] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    note: str = ""  # why no paths are reported for a present worker
    # The scheduler's side of the main path: decode preparation, result processing, and
    # the calls beside the worker's entry (v2's FutureMap relay).
    decode: list[Call] = field(default_factory=list)
    results: list[Call] = field(default_factory=list)
    relay: list[Call] = field(default_factory=list)
    # The call chain: the entry's calls into the worker's package and the model, through its
    # helpers and steps; and the scheduler's own calls from the loop and result processing.
    chain: list[Call] = field(default_factory=list)
    scheduler_calls: list[Call] = field(default_factory=list)
    # The model calls the entry makes outside its steps (the target's extend forward), and
    # the scheduler's side of the overlap path: deferred sampling, the overlap token resolution.
    entry_calls: list[Call] = field(default_factory=list)
    overlap: list[Call] = field(default_factory=list)
    # Adaptive speculation's step tiers (eaglegate/analyzer/tiers.py): the loop that builds one
    # per step count, each tier's graph runners, the switch that puts a tier's runners in place
    # and the allocations sized from the count it sets. Empty for a worker without tiers.
    tiers: list[Call] = field(default_factory=list)

    @property
    def present(self) -> bool:
        return self.cls is not None

    @property
    def reachable(self) -> bool:
        return bool(self.paths)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "label": self.label, "class": self.cls, "present": self.present,
            "defined_at": self.defined_at.where if self.defined_at else None,
            "entry": self.entry, "reachable": self.reachable,
            "selection": [s.to_json() for s in self.selection],
            "paths": [p.to_json() for p in self.paths],
            "steps": [s.to_json() for s in self.steps],
            "decode_preparation": [c.to_json() for c in self.decode],
            "result_processing": [c.to_json() for c in self.results],
            "around_entry": [c.to_json() for c in self.relay],
            "entry_calls": [c.to_json() for c in self.entry_calls],
            "overlap_calls": [c.to_json() for c in self.overlap],
            "call_chain": [c.to_json() for c in self.chain],
            "scheduler_calls": [c.to_json() for c in self.scheduler_calls],
            "adaptive_tiers": [c.to_json() for c in self.tiers],
            "note": self.note,
        }


@dataclass
class EventLoop:
    function: str
    site: Site
    dispatch: list[tuple[str, Site]]  # (caller, call site) that start this loop

    def to_json(self) -> dict[str, Any]:
        return {"function": self.function, "defined_at": self.site.where,
                "dispatch": [{"caller": c, "site": s.where, "condition": list(s.cond)}
                             for c, s in self.dispatch]}


@dataclass
class MapAnswer:
    """The map's answer: what its JSON and the terminal rendering read. `SpecMap` is the
    analysis behind it (the call graph, for what goes on from the map); `CachedMap` is the
    answer as `eaglegate map` reads it back from eaglegate's cache, without the analysis."""

    tree: SourceTree
    scheduler: str
    event_loops: list[EventLoop]
    workers: list[WorkerMap]
    failures: list[dict[str, Any]]
    timing: dict[str, float]

    def worker(self, label_or_name: str) -> WorkerMap | None:
        return next((w for w in self.workers if label_or_name in (w.label, w.name)), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": f"eaglegate.map/{MAP_SCHEMA_VERSION}",
            "sglang": {"version": self.tree.version, "origin": self.tree.origin, "root": str(self.tree.root)},
            "scheduler": self.scheduler,
            "event_loops": [e.to_json() for e in self.event_loops],
            "workers": [w.to_json() for w in self.workers],
            "parse_failures": self.failures,
            "timing_s": {k: round(v, 3) for k, v in self.timing.items()},
        }

    def short_name(self, qn: str) -> str:
        """`Class.method` without its module, for display (the location says where it lives)."""
        raise NotImplementedError

    def in_tree(self, qn: str) -> bool:
        """Whether `qn` is one of the tree's modules, classes or functions."""
        raise NotImplementedError

    def scheduler_site(self) -> Site:
        """Where the scheduler class is defined."""
        raise NotImplementedError


@dataclass
class SpecMap(MapAnswer):
    callgraph: CallGraph
    # The functions the map expanded: later queries grow the shared call graph, so what
    # the map itself looked at is kept apart.
    mapped: frozenset[str] = frozenset()
    graph_runners: frozenset[str] = frozenset()  # classes that capture CUDA graphs

    def short_name(self, qn: str) -> str:
        module = self.callgraph.codebase.scope_module.get(qn)
        return qn[len(module.name) + 1 :] if module and qn != module.name else qn

    def in_tree(self, qn: str) -> bool:
        return qn in self.callgraph.codebase.scopes

    def scheduler_site(self) -> Site:
        cb = self.callgraph.codebase
        return cb.site(self.scheduler, cb.scopes[self.scheduler].lineno)

    def detached(self) -> CachedMap:
        """The answer alone, with what rendering it reads of the index: the short name of
        each of the tree's names the answer cites (every name it shows is in its JSON)."""
        cb = self.callgraph.codebase
        cited = {text for text in json_strings(self.to_json()) if text in cb.scope_module}
        return CachedMap(self.tree, self.scheduler, self.event_loops, self.workers, self.failures, {},
                         names={qn: self.short_name(qn) for qn in sorted(cited)},
                         scopes=frozenset(qn for qn in cited if qn in cb.scopes),
                         defined_at=self.scheduler_site())


@dataclass
class CachedMap(MapAnswer):
    """A map read back from the cache (eaglegate/analyzer/answers.py): no call graph."""

    names: dict[str, str] = field(default_factory=dict)  # the cited names of the tree → short names
    scopes: frozenset[str] = frozenset()  # those that are its modules, classes or functions
    defined_at: Site | None = None  # the scheduler's

    def short_name(self, qn: str) -> str:
        return self.names.get(qn, qn)

    def in_tree(self, qn: str) -> bool:
        return qn in self.scopes

    def scheduler_site(self) -> Site:
        assert self.defined_at is not None
        return self.defined_at


def json_strings(data: Any) -> Iterator[str]:
    """Every string value in a JSON-like structure."""
    if isinstance(data, str):
        yield data
    elif isinstance(data, dict):
        for value in data.values():
            yield from json_strings(value)
    elif isinstance(data, (list, tuple)):
        for value in data:
            yield from json_strings(value)


def check_needed_files(cb: Codebase, question: Question) -> None:
    """Stop when a file that defines a class the question names did not parse: the map
    would silently answer about another class of that name, or miss a worker."""
    defines = re.compile(r"^[ \t]*class[ \t]+(" + "|".join(map(re.escape, question.classes)) + r")\b", re.M)
    for failure in cb.parsed.failures:
        text = files.read_bytes(cb.root / failure.path).decode("utf-8", errors="replace")
        found = defines.search(text)
        if found:
            raise UserError(f"{cb.root / failure.path}:{failure.lineno}: {failure.message}; it defines "
                            f"{found.group(1)}, which the map starts from: fix or restore that file")


def find_scheduler(cb: Codebase, question: Question) -> str:
    candidates = [qn for qn in cb.find(question.scheduler) if cb.is_class(qn)]
    with_loops = [qn for qn in candidates if _event_loops(cb, qn, question)]
    if not with_loops:
        raise UserError(f"no class {question.scheduler} with {question.event_loop_prefix}* methods in {cb.root}")
    # The scheduler with the most event loops is the one the server runs.
    return max(with_loops, key=lambda qn: (len(_event_loops(cb, qn, question)), -len(qn)))


def _event_loops(cb: Codebase, scheduler: str, question: Question) -> list[str]:
    loops = []
    seen_names = set()
    for cls in cb.mro(scheduler):
        scope = cb.scopes[cls]
        for child in scope.children:
            name = child.rsplit(".", 1)[-1]
            if name.startswith(question.event_loop_prefix) and name not in seen_names:
                seen_names.add(name)
                loops.append(f"{cb.scope_module[cls].name}.{child}")
    return sorted(loops)


def _cond_literals(cb: Codebase, site: Site, scope_qn: str) -> set[Literal]:
    found: set[Literal] = set()
    for text in site.cond:
        found |= literals(cb, text, scope_qn)
    return found


def selection_literals(cb: Codebase, worker: WorkerMap) -> list[set[Literal]]:
    """The ways the worker class can be selected, each as the literals that must hold.

    A class chosen by a factory (or an inline choice) and then constructed: both sites'
    conditions hold at once, so each alternative joins one choice with one constructor call.
    """
    choices = [_cond_literals(cb, s.site, s.function) for s in worker.selection if s.kind != "constructor"]
    builds = [_cond_literals(cb, s.site, s.function) for s in worker.selection if s.kind == "constructor"]
    return [c | b for c in choices or [set()] for b in builds or [set()] if not conflicts(c, b)]


def selection_formulas(cb: Codebase, worker: WorkerMap) -> list[tuple[list[Site], list[Formula]]]:
    """Like `selection_literals`, with each alternative's conditions kept whole (`or` and
    `not (a and b)` included) and the sites they come from."""
    def of(s: Selection) -> tuple[list[Site], list[Formula]]:
        return [s.site], [formula(cb, text, s.function) for text in s.site.cond]

    choices = [of(s) for s in worker.selection if s.kind != "constructor"]
    builds = [of(s) for s in worker.selection if s.kind == "constructor"]
    return [(c[0] + b[0], c[1] + b[1]) for c in choices or [([], [])] for b in builds or [([], [])]]


def _choose_site(cb: Codebase, caller: str, sites: list[Site], state: set[Literal],
                 held: list[Formula]) -> tuple[list[Site], set[Literal], list[Formula]] | None:
    """The sites whose conditions can hold with those on the way here, the first one's
    literals and formulas added: no literal conflicts, and the whole conditions are
    satisfiable together (`not self.enable_overlap`, an `or` once the alias is followed,
    leaves no literal, yet rules out `self.enable_overlap`)."""
    fitting = []
    for site in sites:
        lits = _cond_literals(cb, site, caller)
        if conflicts(lits, state):
            continue
        own = [formula(cb, text, caller) for text in site.cond]
        if _compatible(held, own):
            fitting.append((site, lits, own))
    if not fitting:
        return None
    _, lits, own = fitting[0]
    return [f[0] for f in fitting], state | lits, held + own


def _compatible(held: list[Formula], new: list[Formula]) -> bool:
    """Whether `new` can hold with `held`, trying only the formulas that share atoms with
    `new`, directly or through one another (the rest cannot make it false)."""
    relevant, atoms = list(new), set().union(set(), *(atoms_of(f) for f in new))
    rest = [f for f in held if f not in relevant]
    grown = True
    while grown:
        grown = False
        for f in rest:
            if atoms_of(f) & atoms:
                relevant.append(f)
                atoms |= atoms_of(f)
                grown = True
        rest = [f for f in rest if f not in relevant]
    return satisfiable(relevant, {})


def _feasible(cg: CallGraph, path: list[str], start: set[Literal],
              held: list[Formula] | None = None) -> tuple[list[Hop], set[Literal]] | None:
    hops: list[Hop] = []
    state = set(start)
    formulas = list(held or [])
    for caller, callee in zip(path, path[1:], strict=False):
        chosen = _choose_site(cg.codebase, caller, cg.sites(caller, callee), state, formulas)
        if chosen is None:
            return None
        sites, state, formulas = chosen
        hops.append(Hop(caller, callee, sites[0], sites[1:]))
    return hops, state


def _worker_entries(cg: CallGraph, cls: str, reached: set[str]) -> list[str]:
    """Methods of the worker called from outside the worker: its batch entries."""
    cb = cg.codebase
    family = set(cb.mro(cls))
    inside = family | cb.subclasses(cls)
    entries = []
    for node in reached:
        owner, name = node.rsplit(".", 1)
        if owner not in family or name == "__init__":
            continue
        # A base method the worker overrides is not the worker's: its own override is.
        if next(f"{c}.{name}" for c in cb.mro(cls) if f"{c}.{name}" in cb.scopes) != node:
            continue
        callers = [c for c in cg.graph.predecessors(node) if c in reached]
        if any((cb.owner_class(c) or "") not in inside for c in callers):
            entries.append(node)
    return sorted(entries)


def _steps(cg: CallGraph, entry: str, question: Question) -> list[Step]:
    cb = cg.codebase
    patterns = [(kind, re.compile(rx)) for kind, rx in question.steps]
    cg.reach([entry], limit=400)
    import networkx as nx  # only a map built from source walks the graph

    depth = nx.single_source_shortest_path(cg.graph, entry, cutoff=3)
    steps: list[Step] = []
    for node, path in sorted(depth.items(), key=lambda item: (len(item[1]), item[0])):
        if node == entry or node not in cb.scopes or cb.owner_class(node) is None:
            continue
        name = node.rsplit(".", 1)[-1]
        kind = next((k for k, rx in patterns if rx.search(name)), None)
        if kind is None:
            continue
        hops = [Hop(a, b, cg.sites(a, b)[0]) for a, b in zip(path, path[1:], strict=False)]
        steps.append(Step(kind, node, hops, cb.site(node, cb.scopes[node].lineno)))
    order = {kind: i for i, (kind, _) in enumerate(question.steps)}
    steps.sort(key=lambda s: (len(s.hops), order[s.kind], s.function))
    return steps


def _selections(cg: CallGraph, cls: str, reached: set[str]) -> list[Selection]:
    cb = cg.codebase
    family = {cls} | cb.subclasses(cls)
    found: list[Selection] = []
    # Factories: functions whose return statements yield the class itself.
    for qn in sorted(reached):
        scope = cb.scopes.get(qn)
        if scope is None or scope.kind != "function":
            continue
        for ret in scope.return_values:
            if ("class", cls) in cb.values(ret.value, qn):
                found.append(Selection("factory", qn, cb.site(qn, ret.lineno, ret.cond)))
        # Choices made inline: `WorkerClass = V2 if overlap else V1`.
        for assign in scope.assigns:
            if assign.target and assign.target[0] == "n" and assign.value and assign.value[0] in ("n", "a") \
                    and ("class", cls) in cb.values(assign.value, qn):
                found.append(Selection("choice", qn, cb.site(qn, assign.lineno, assign.cond)))
    # Constructor calls from outside the class family (not `super().__init__`).
    init = cb.constructor(cls) or cls
    if init in cg.graph:
        for caller in sorted(cg.graph.predecessors(init)):
            if caller in reached and (cb.owner_class(caller) or "") not in family:
                for site in cg.sites(caller, init):
                    found.append(Selection("constructor", caller, site))
    return found


def build_map(
    tree: SourceTree,
    question: Question = Question(),
    progress: Callable[[int, int], None] | None = None,
    codebase: Codebase | None = None,
) -> SpecMap:
    """Map the scheduler → worker paths of one SGLang tree."""
    timing: dict[str, float] = {}
    if codebase is None:
        codebase, _, timing["parse"] = load_codebase(tree.root, progress, question.classes)
    cb = codebase
    start = time.perf_counter()
    check_needed_files(cb, question)
    cg = CallGraph(cb)
    scheduler = find_scheduler(cb, question)
    loop_names = _event_loops(cb, scheduler, question)
    reached = cg.reach(loop_names)

    # Who starts each loop, and under which condition (e.g. `scheduler.enable_overlap`).
    home = cb.scope_module[scheduler]
    module_level = [cb.qn(home, qual) for qual, s in home.scopes.items() if s.kind == "function"
                    and (s.parent == "" or s.parent is None)]
    # Worker classes are chosen while the scheduler is built, not in its loops: every
    # scheduler method (mixins included), the module's own functions, and what they call
    # directly (a factory such as `create_worker`); from the constructor, deeper (a factory
    # that a registry holds, called through a closure).
    scheduler_methods = [f"{cb.scope_module[cls].name}.{child}" for cls in cb.mro(scheduler)
                         for child in cb.scopes[cls].children]
    setup = cg.reach(module_level + scheduler_methods, depth=2)
    init = cb.constructor(scheduler)
    if init is not None:
        setup |= cg.reach([init], depth=5)
    loops = []
    for loop in loop_names:
        dispatch = [(caller, site) for caller in sorted(cg.graph.predecessors(loop))
                    for site in cg.sites(caller, loop)] if loop in cg.graph else []
        loops.append(EventLoop(loop, cb.site(loop, cb.scopes[loop].lineno), dispatch))

    workers: list[WorkerMap] = []
    for name, label in question.workers:
        classes = [qn for qn in cb.find(name) if cb.is_class(qn)]
        if not classes:
            workers.append(WorkerMap(name, label, None))
            continue
        cls = min(classes, key=len)
        worker = WorkerMap(name, label, cls, cb.site(cls, cb.scopes[cls].lineno))
        worker.selection = _selections(cg, cls, setup | reached)
        if not worker.selection:
            # Paths to a class nobody is seen building would only be guesses (a base
            # method reached through another object is not this worker's entry).
            worker.note = (f"where {name} is built was not found (a factory or registry this analysis "
                           "does not follow); no paths are reported for it")
            workers.append(worker)
            continue
        entries = _worker_entries(cg, cls, reached)
        best: tuple[int, str] | None = None
        for entry in entries:
            steps = _steps(cg, entry, question)
            score = len({s.kind for s in steps})
            if best is None or score > best[0]:
                best = (score, entry)
                worker.steps = steps
        worker.entry = best[1] if best else None
        if worker.entry:
            worker.paths = _paths(cg, loops, worker, reached)
        workers.append(worker)

    mapped = frozenset(cg.expanded)
    runners = graph_runner_classes(cb, capturing_functions(cb))
    details = StepCalls(cg, question, runners)
    for worker in workers:
        _deeper(details, worker, scheduler, reached)
        if worker.cls is not None:
            # Reads the index and the calls' targets only: the shared graph is not expanded.
            worker.tiers = [c for tiers in find_tiers(cb, cg, worker.cls, set(runners)) for c in tiers.calls(cb)]
    timing["map"] = time.perf_counter() - start
    failures = [{"path": f.path, "line": f.lineno, "message": f.message} for f in cb.parsed.failures]
    return SpecMap(tree, scheduler, loops, workers, failures, timing, cg, mapped, frozenset(runners))


def main_path(worker: WorkerMap, scheduler: str) -> WorkerPath | None:
    """The worker's main path: from a loop the scheduler class defines itself (mixins add the
    specialised ones), the shortest."""
    own = [p for p in worker.paths if p.event_loop.startswith(scheduler + ".")] or worker.paths
    return min(own, key=lambda p: (len(p.hops), p.event_loop)) if own else None


def _deeper(details: StepCalls, worker: WorkerMap, scheduler: str, reached: set[str]) -> None:
    """One level below the steps, and the scheduler's side of the worker's main path."""
    cb = details.cb
    scheduler_family = set(cb.mro(scheduler))
    main = main_path(worker, scheduler)
    if main is None or worker.cls is None:
        return
    package = worker.cls.rsplit(".", 2)[0] + "."
    for step in worker.steps:
        step.calls = details.step(step.function, package)
    worker.decode = details.decode_preparation(main.event_loop, reached, scheduler_family)
    worker.results = details.result_processing(main.event_loop, reached, scheduler_family)
    # The calls beside every site where a loop of the scheduler's own calls the worker (on the
    # v2-only releases the overlap loop's site, with the FutureMap relay, and the normal loop's).
    own = [p for p in worker.paths if p.event_loop.startswith(scheduler + ".") and p.hops]
    sites = dict.fromkeys((h.caller, h.callee, h.site) for h in [main.hops[-1], *(p.hops[-1] for p in own)])
    relay: dict[str, Any] = {}
    for caller, callee, site in sites:
        for call in details.relay(caller, callee, site):
            relay.setdefault(json.dumps(call.to_json(), sort_keys=True), call)
    worker.relay = list(relay.values())
    if worker.entry:
        worker.chain = details.chain(worker.entry, [s.function for s in worker.steps], package)
        worker.entry_calls = details.entry_models(worker.entry, [s.function for s in worker.steps], package)
    processing = [c.callee for c in worker.results if c.kind == "result"]
    # Every loop of the scheduler's own that reaches the worker (0.5.12's v2 runs from both).
    loops = sorted({p.event_loop for p in worker.paths if p.event_loop.startswith(scheduler + ".")}) \
        or [main.event_loop]
    worker.scheduler_calls = details.scheduler_calls([*loops, *processing], scheduler_family)
    if worker.entry:
        worker.overlap = details.overlap_calls(worker.entry, loops, processing, scheduler_family)


def _paths(cg: CallGraph, loops: list[EventLoop], worker: WorkerMap, reached: set[str]) -> list[WorkerPath]:
    """For each event loop, the shortest call path to the worker's entry whose conditions agree."""
    cb = cg.codebase
    assert worker.entry is not None
    selection_lits = selection_literals(cb, worker)
    results = []
    import networkx as nx

    ancestors = nx.ancestors(cg.graph, worker.entry) | {worker.entry}
    for loop in loops:
        if loop.function not in cg.graph:
            continue
        sub = cg.graph.subgraph((nx.descendants(cg.graph, loop.function) | {loop.function}) & ancestors)
        if worker.entry not in sub:
            continue
        starts = [(_cond_literals(cb, s, caller), [formula(cb, text, caller) for text in s.cond])
                  for caller, s in loop.dispatch] or [(set(), [])]
        found = None
        for candidate in _bounded_paths(sub, loop.function, worker.entry, 20):
            for start, held in starts:
                for sel in selection_lits:
                    if conflicts(start, sel):
                        continue
                    feasible = _feasible(cg, candidate, start | sel, held)
                    if feasible is not None:
                        found = WorkerPath(loop.function, feasible[0], feasible[1])
                        break
                if found:
                    break
            if found:
                break
        if found:
            results.append(found)
    return results


def _bounded_paths(graph: nx.DiGraph, source: str, target: str, limit: int) -> list[list[str]]:
    import networkx as nx

    paths = []
    try:
        for path in nx.shortest_simple_paths(graph, source, target):
            paths.append(path)
            if len(paths) >= limit:
                break
    except nx.NetworkXNoPath:
        pass
    return paths
