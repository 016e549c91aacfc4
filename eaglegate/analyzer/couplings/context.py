"""The context every detector reads: the map, the index, the call graph and the taint,
and how it is built. Its own module, so that the detectors import it and the registry
imports the detectors, without a cycle."""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import networkx as nx

from eaglegate.analyzer.callgraph import CallGraph
from eaglegate.analyzer.couplings.dataflow import SpecFlow
from eaglegate.analyzer.couplings.model import Chain, Finding, Step
from eaglegate.analyzer.index import Codebase
from eaglegate.analyzer.spec_map import SpecMap, WorkerMap
from eaglegate.analyzer.step_calls import capturing_functions, function_node
from eaglegate.analyzer.summary import expr_ir

# Names from the user's question (like spec_map.Question): the settings object.
SETTINGS_CLASS = "ServerArgs"
_REACH_LIMIT = 6000


@dataclass
class Context:
    """Everything a detector may read: the map, the index, the call graph, the taint."""

    spec_map: SpecMap
    codebase: Codebase
    callgraph: CallGraph
    flow: SpecFlow
    workers: list[WorkerMap]  # the present ones
    worker_reach: dict[str, set[str]]  # label → functions reached from the worker's methods
    loop_reach: set[str]  # functions reached from the scheduler's event loops
    settings_classes: set[str]
    settings_reach: set[str] = field(default_factory=set)  # server-argument post-processing
    settings_handlers: set[str] = field(default_factory=set)
    scratch: dict[str, object] = field(default_factory=dict)  # shared between detectors

    def worker_path(self, qn: str) -> str:
        """v1 / v2 when only one present worker reaches `qn`, else both."""
        labels = [w.label for w in self.workers if qn in self.worker_reach.get(w.label, ())]
        if len(labels) == 1 and len(self.workers) > 1:
            return labels[0]
        if len(self.workers) == 1:
            return self.workers[0].label
        return "both"

    def near(self, roots: Iterable[str], depth: int) -> set[str]:
        """Functions within `depth` calls of `roots` (breadth first over the call graph)."""
        cg = self.callgraph
        seen: dict[str, int] = {}
        queue = deque((r, 0) for r in roots)
        while queue:
            node, d = queue.popleft()
            if node in seen:
                continue
            seen[node] = d
            if d >= depth:
                continue
            cg.expand(node)
            if node in cg.graph:
                queue.extend((n, d + 1) for n in cg.graph.successors(node))
        return set(seen)

    def step_functions(self, worker: WorkerMap, kinds: tuple[str, ...], depth: int = 2) -> set[str]:
        roots = [s.function for s in worker.steps if s.kind in kinds]
        return self.near(roots, depth)

    def class_methods(self, cls: str) -> list[str]:
        cb = self.codebase
        found = []
        for member in cb.mro(cls):
            module = cb.scope_module[member].name
            found += [f"{module}.{child}" for child in cb.scopes[member].children
                      if cb.scopes[f"{module}.{child}"].kind == "function"]
        return found


def settings_handlers(ctx: Context, modules: set[str]) -> set[str]:
    """Functions of these modules with a parameter annotated as the settings class."""
    cb = ctx.codebase
    names = {cls.rsplit(".", 1)[-1] for cls in ctx.settings_classes}
    found: set[str] = set()
    for module in modules:
        summary = cb.modules[module]
        for qual, scope in summary.scopes.items():
            if scope.kind != "function":
                continue
            if any(annotation is not None and names_in(annotation) & names for _, annotation in scope.params):
                found.add(f"{module}.{qual}")
    return found


def names_in(expr: object) -> set[str]:
    """Every name and attribute name inside an IR expression (`Optional[ServerArgs]` too)."""
    found: set[str] = set()
    stack = [expr]
    while stack:
        item = stack.pop()
        if isinstance(item, tuple):
            if len(item) == 2 and item[0] == "n" and isinstance(item[1], str):
                found.add(item[1])
            elif len(item) == 3 and item[0] == "a" and isinstance(item[2], str):
                found.add(item[2])
            stack.extend(i for i in item if isinstance(i, tuple))
    return found


class Detector(Protocol):
    CATEGORY: ClassVar[str]
    DESCRIPTION: ClassVar[str]
    REQUIRES: ClassVar[tuple[str, ...]]

    def find(self, context: Context) -> list[Finding]: ...


def runner_classes(cb: Codebase, graph: nx.DiGraph) -> set[str]:
    """Classes whose methods capture a CUDA graph, or call a capturing method directly (a
    runner may hand the capture to a backend object: `self.backend.capture(…)`), and their
    subclasses. `graph`: the call graph as far as it is expanded."""
    functions = capturing_functions(cb)
    capturing = {owner for qn in functions if (owner := cb.owner_class(qn)) is not None}
    for qn in functions:
        if qn in graph:
            for caller in graph.predecessors(qn):
                owner = cb.owner_class(caller) if caller in cb.scopes else None
                if owner is not None:
                    capturing.add(owner)
    return {member for cls in capturing for member in {cls} | cb.subclasses(cls)}


def graph_runners(ctx: Context) -> dict[str, str]:
    """Graph-runner classes (those whose methods capture a CUDA graph), cached in scratch."""
    cached = ctx.scratch.get("graph_runners")
    if isinstance(cached, dict):
        return cached
    runners = dict.fromkeys(runner_classes(ctx.codebase, ctx.callgraph.graph), "draft")
    ctx.scratch["graph_runners"] = runners
    return runners


def build_context(spec_map: SpecMap) -> Context:
    cg = spec_map.callgraph
    cb = cg.codebase
    workers = [w for w in spec_map.workers if w.present]
    settings = {qn for qn in cb.find(SETTINGS_CLASS) if cb.is_class(qn)}
    loops = [e.function for e in spec_map.event_loops]
    # Building a graph runner captures graphs: start-up work, even where a loop repeats it
    # (a weight update re-captures; a runner re-captures when a batch needs another size).
    # What only a runner's set-up (its constructor and the methods that calls on itself,
    # `capture` among them) reaches is set-up code, not the steps'.
    placeholder = SpecFlow(cb, set())
    loop_reach = cg.reach(loops)  # expands the graph the runners are read from
    builds = {qn for cls in sorted(_runner_family(cb, cg, runner_classes(cb, cg.graph)))
              for qn in placeholder._setup_methods(cls)}
    if builds & loop_reach:
        loop_reach = cg.reach(loops, avoid=builds)
    ctx = Context(spec_map, cb, cg, placeholder, workers, {}, loop_reach, settings)
    for worker in workers:
        assert worker.cls is not None
        ctx.worker_reach[worker.label] = cg.reach(ctx.class_methods(worker.cls), limit=_REACH_LIMIT)
    ctx.settings_reach = cg.reach([m for cls in sorted(settings) for m in ctx.class_methods(cls)],
                                  limit=_REACH_LIMIT)
    # The spec path: modules of everything the scheduler, the workers and the settings reach
    # (from the map's own expansion, not the shared graph's, so a second analysis of the
    # same map reads the same modules).
    reached = set(spec_map.mapped) | loop_reach | ctx.settings_reach
    for worker_reach in ctx.worker_reach.values():
        reached |= worker_reach
    candidates = {cb.scope_module[qn].name for qn in reached if qn in cb.scope_module}
    # Post-processing handlers dispatched through a registry have no resolved caller; they
    # take the settings object as a parameter.
    packages = {cls.split(".", 2)[0] + "." + cls.split(".", 2)[1] for cls in settings if cls.count(".") >= 2}
    ctx.settings_handlers = settings_handlers(
        ctx, {m for m in cb.modules if any(m.startswith(p + ".") for p in packages)})
    ctx.settings_reach |= ctx.settings_handlers
    reached |= ctx.settings_handlers
    candidates |= {cb.scope_module[qn].name for qn in ctx.settings_handlers}
    # The workers' steps are read for what they do even where no taint reaches them (the
    # verify step appending output tokens, the draft step reading its state).
    steps: set[str] = set()
    for worker in workers:
        roots = ([worker.entry] if worker.entry else []) + [s.function for s in worker.steps]
        steps |= ctx.near(roots, 2)
    # And the scheduler's own step functions (what its event loops call directly): their mode
    # tests (which way run_batch calls the worker, when overlap is off for a batch) hold
    # whether or not a width reaches them.
    steps |= ctx.near(loops, 1)
    ctx.flow = SpecFlow(cb, candidates, also_record={qn for qn in steps if qn in cb.scopes},
                        reached=reached | steps,
                        settings={member for cls in settings for member in placeholder.family(cls)})
    ctx.flow.seed()
    for (callee, param), chain in sorted(worker_flags(ctx).items()):
        ctx.flow.taint_param(callee, param, chain)
    ctx.flow.run()
    return ctx


def worker_flags(ctx: Context) -> dict[tuple[str, str], Chain]:
    """(function, parameter) of a flag a speculative worker passes as a literal `True` to a
    method the plain path runs too (`target_worker.forward_batch_generation(…, is_verify=True)`,
    which the scheduler calls itself without speculation): only speculation sets it, so a branch
    on it is a speculative branch. Constructors are the hand-off rules' (`is_draft_worker=True`
    builds the draft's runner)."""
    cb = ctx.codebase
    flags: dict[tuple[str, str], Chain] = {}
    # What the event loops reach without entering the workers' package (the speculative
    # workers, present or not, and their draft workers) is the plain path.
    packages = tuple({worker.cls.rsplit(".", 2)[0] + "." for worker in ctx.workers if worker.cls})
    speculative = {qn for qn in cb.scopes if qn.startswith(packages)} if packages else set()
    plain = ctx.callgraph.reach([e.function for e in ctx.spec_map.event_loops], avoid=speculative)
    for worker in ctx.workers:
        # Its own methods, not those inherited from a plain base (v1's TpModelWorker).
        for qn in [m for m in ctx.class_methods(worker.cls or "") if cb.owner_class(m) == worker.cls]:
            node = function_node(cb, qn)
            if node is None:
                continue
            path = cb.scope_module[qn].path
            for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
                keywords = [kw.arg for kw in call.keywords
                            if kw.arg and isinstance(kw.value, ast.Constant) and kw.value.value is True]
                ir = expr_ir(call.func) if keywords else None
                for value in sorted(cb.values(ir, qn)) if ir is not None else ():
                    callee = value[1]
                    owner = cb.owner_class(callee) if value[0] == "func" else None
                    if owner is None or cb.constructor(owner) == callee or callee not in plain:
                        continue
                    for name in keywords:
                        if cb.parameter_for(callee, name, bound=True) == name:
                            flags.setdefault((callee, name), (Step(
                                f"{worker.name} calls {callee.rsplit('.', 2)[-2]}.{callee.rsplit('.', 1)[-1]} "
                                f"with {name}=True", path, call.lineno),))
    return flags


def _runner_family(cb: Codebase, cg: CallGraph, runners: set[str]) -> set[str]:
    """The graph runners and the classes built by the same call as one of them (the device's
    alternative: `defaultdict(lambda: CudaGraphRunner, {"cpu": CPUGraphRunner})[device](self)`,
    where the CPU runner compiles instead of capturing)."""
    family = set(runners)
    graph = cg.graph
    for cls in sorted(runners):
        init = cb.constructor(cls)
        if init is None or init not in graph:
            continue
        for caller in sorted(graph.predecessors(init)):
            lines = {site.lineno for site in cg.sites(caller, init)}
            for other in graph.successors(caller):
                owner = cb.owner_class(other) if other in cb.scopes else None
                if owner and other == cb.constructor(owner) and lines & {s.lineno for s in cg.sites(caller, other)}:
                    family.add(owner)
    return family


