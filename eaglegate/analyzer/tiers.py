"""Adaptive speculation's step tiers: per-tier graph runners, their selection, per-tier sizes.

A worker with adaptive speculation keeps one set of runtime resources per step count (a
tier) and swaps them per batch. Everything here is read from the code's structure, from
the worker class outward; no name of SGLang's is assumed:

- a *tier builder* is a method of the worker's class (or a base) with a parameter named
  after a speculative count setting (`speculative_num_steps: int`), which some function
  calls inside a `for` loop with the loop's variable in that parameter (`for steps in
  candidates: self.worker.build(speculative_num_steps=steps)`): one call per tier;
- the tier's *graph runners* are the graph-runner classes it constructs, itself or in a
  function it calls directly (the draft worker's capture, run while a context manager
  that receives the tier's count overrides the worker's own);
- the tier's *switch* is a method of the worker's family with a parameter annotated with
  the class the builder returns (the tier's state): its assignments `obj.attr =
  state.field` put the tier's runners (fields whose annotation names a runner class) and
  counts (speculative fields) in place, and what calls it (per batch) selects the tier;
- the tier's *allocations* are the allocations in methods of the classes whose
  speculative counts the switch (or the builder's context) assigns, sized from that count
  (`torch.empty((n, self.speculative_num_steps))`, a local computed from it).

`find_tiers` returns them for the map (as `Call`s under the worker) and for the couplings
detector (`couplings/tiers.py`), which cites the same sites.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eaglegate.analyzer import files
from eaglegate.analyzer.callgraph import CallGraph
from eaglegate.analyzer.index import Codebase, Site
from eaglegate.analyzer.step_calls import Call, capturing_functions, function_node
from eaglegate.analyzer.summary import expr_ir

SPEC_PREFIX = "speculative_"
# Allocators whose size is written out (not `*_like`, which copies another tensor's).
_ALLOCATORS = frozenset({"empty", "zeros", "ones", "full", "arange", "randn", "rand"})


@dataclass(frozen=True)
class TierLoop:
    caller: str  # the function that loops over the tiers
    line: int  # the `for`
    text: str  # `for steps in self.candidate_steps`
    call_line: int  # the builder's call in it
    param: str  # the builder's parameter the loop variable reaches
    path: str


@dataclass(frozen=True)
class TierRunner:
    builder: str
    line: int  # the builder's own line that builds it (directly or through `via`)
    text: str
    runner: str  # the runner class (the family's base)
    runners: tuple[str, ...]
    via: str | None  # the function the builder calls that constructs it, when not itself
    built_line: int  # where the constructor is called
    built_path: str
    context: tuple[int, str] | None  # the `with` that receives the tier's count, if any
    capture: str | None  # the runner's capturing method


@dataclass(frozen=True)
class TierSwitch:
    switcher: str
    line: int
    text: str  # `dw.cuda_graph_runner = state.cuda_graph_runner`
    field: str
    kind: str  # runner | count | setting
    runners: tuple[str, ...] = ()
    replayed: tuple[tuple[str, int, str], ...] = ()  # (function, line, text) that call the swapped runner


@dataclass(frozen=True)
class TierAlloc:
    function: str
    line: int
    text: str
    attr: str  # the per-tier count it is sized from
    switched_at: tuple[str, int]  # (function, line) that assigns that count per tier


@dataclass
class Tiers:
    worker: str
    builder: str
    builder_line: int
    path: str
    params: tuple[str, ...]
    loops: list[TierLoop] = field(default_factory=list)
    runners: list[TierRunner] = field(default_factory=list)
    state: str | None = None
    switches: list[TierSwitch] = field(default_factory=list)
    switched_by: list[str] = field(default_factory=list)  # who calls the switch
    allocations: list[TierAlloc] = field(default_factory=list)
    settings: list[tuple[str, int, str]] = field(default_factory=list)  # (setting, line, text) the switch overrides
    switcher: str | None = None

    def calls(self, cb: Codebase) -> list[Call]:
        """The tiers as the map's calls under the worker."""
        def site(qn: str, line: int) -> Site:
            return cb.site(qn, line)

        found: list[Call] = []
        for loop in self.loops:
            found.append(Call("tier_loop", loop.caller, self.builder, site(loop.caller, loop.call_line),
                              {"loop": loop.text, "loop_site": f"{loop.path}:{loop.line}", "per": loop.param}))
        for r in self.runners:
            detail: dict[str, Any] = {"runner": r.runner, "per": list(self.params),
                                      "built_at": f"{r.built_path}:{r.built_line}"}
            if r.via:
                detail["via"] = r.via
            if r.context:
                detail["context"] = r.context[1]
            if r.capture:
                detail["capture"] = r.capture
            found.append(Call("tier_runner", self.builder, r.runner, site(self.builder, r.line), detail))
        for s in self.switches:
            if s.kind != "runner":
                continue  # the counts it sets show in the allocations they size
            detail = {"field": s.field, "state": self.state, "switched_by": list(self.switched_by)}
            if s.replayed:
                detail["replayed_by"] = [f"{'.'.join(f.rsplit('.', 2)[-2:])} ({cb.scope_module[f].path}:{line})"
                                         for f, line, _ in s.replayed]
            found.append(Call("tier_switch", s.switcher, s.text, site(s.switcher, s.line), detail))
        for setting, line, text in self.settings:
            found.append(Call("tier_switch", self.switcher or self.builder, text, site(self.switcher or self.builder, line),
                              {"field": setting, "state": self.state, "switched_by": list(self.switched_by),
                               "setting": True}))
        for a in self.allocations:
            found.append(Call("tier_alloc", a.function, a.text, site(a.function, a.line),
                              {"sized_by": a.attr, "switched_at": f"{a.switched_at[0]}:{a.switched_at[1]}"}))
        return found


def _count_param(arg: ast.arg) -> bool:
    """A parameter named after a speculative count setting (`speculative_num_steps: int`)."""
    if not arg.arg.startswith(SPEC_PREFIX):
        return False
    return arg.annotation is None or "int" in {n.id for n in ast.walk(arg.annotation) if isinstance(n, ast.Name)}


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    return [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _callee_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _text(node: ast.AST, limit: int = 110) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _loops(cb: Codebase, builder: str, node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[TierLoop]:
    """Calls of the builder inside a `for` loop whose variable reaches a count parameter."""
    name = node.name
    params = _params(node)
    positional = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
    if positional and positional[0] in ("self", "cls"):
        positional = positional[1:]
    counts = {a.arg for a in params if _count_param(a)}
    found: list[TierLoop] = []
    seen: set[str] = set()
    for caller, call in cb._calls_named(name):
        if caller == builder or caller in seen:
            continue
        caller_node = function_node(cb, caller)
        if caller_node is None:
            continue
        for loop in ast.walk(caller_node):
            if not isinstance(loop, (ast.For, ast.AsyncFor)):
                continue
            variables = _names(loop.target)
            for inner in ast.walk(loop):
                if not (isinstance(inner, ast.Call) and _callee_name(inner) == name and inner.lineno == call.lineno):
                    continue
                bound = [(kw.arg, kw.value) for kw in inner.keywords if kw.arg] + \
                    [(positional[i], a) for i, a in enumerate(inner.args) if i < len(positional)]
                for param, value in bound:
                    if param in counts and _names(value) & variables:
                        found.append(TierLoop(caller, loop.lineno, f"for {_text(loop.target)} in {_text(loop.iter)}",
                                              inner.lineno, param, cb.scope_module[caller].path))
                        seen.add(caller)
                        break
                if caller in seen:
                    break
            if caller in seen:
                break
    return found


class _Runners:
    """Which classes are graph runners: the ones given, or a class with a method that captures a
    CUDA graph or calls a function that does (a runner may hand the capture to a backend)."""

    def __init__(self, cb: Codebase, cg: CallGraph, capturing: set[str], known: set[str]):
        self.cb, self.cg, self.capturing = cb, cg, capturing
        self.memo: dict[str, str | None] = {}
        self.known = set(known)

    def capture(self, cls: str) -> str | None:
        if cls not in self.memo:
            self.memo[cls] = _capture(self.cb, self.cg, cls, self.capturing)
        return self.memo[cls]

    def __contains__(self, cls: object) -> bool:
        return isinstance(cls, str) and cls in self.cb.scopes and (cls in self.known or self.capture(cls) is not None)


def _constructed(cb: Codebase, cg: CallGraph, caller: str, runners: _Runners) -> list[tuple[int, list[str]]]:
    """(line, classes built) for each call in `caller` that constructs a graph runner (all the
    classes that call may build: a device's alternatives are listed with it)."""
    found = []
    node = None
    for call, targets in cg.call_targets(caller):
        built = sorted({owner for t in targets if t.endswith(".__init__") and (owner := cb.owner_class(t))}
                       | {t for t in targets if cb.is_class(t)})
        if any(cls in runners for cls in built):
            if len(built) > 1 and call.func and call.func[0] == "n":
                node = node or function_node(cb, caller)
                built = _chosen_locally(cb, caller, node, call.func[1], built) if node is not None else built
            found.append((call.lineno, built))
    return found


def _chosen_locally(cb: Codebase, caller: str, node: ast.AST, name: str, built: list[str]) -> list[str]:
    """Of the classes a local may hold (`cls = pick(builtin=lambda: A if npu else B)`; `cls(self)`),
    those its own assignment names inside a lambda: the index, which reads `pick`'s result
    from every caller's lambdas, would list them all."""
    module = cb.scope_module[caller].name
    local: dict[str, set[str]] = {}  # a local → the names its assignments read
    for stmt in ast.walk(node):
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    local.setdefault(target.id, set()).update(_names(stmt.value))
    words: set[str] = set()
    for stmt in ast.walk(node):
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
            for lam in ast.walk(stmt.value):
                if isinstance(lam, ast.Lambda):
                    body = _names(lam.body)  # and one level through the locals it reads (a registry dict)
                    words |= body | {w for n in body if n != name for w in local.get(n, ())}
    named = {cls for n in words for cls in _named(cb, n, module)}
    chosen = [c for c in built if c in named]
    return chosen or built


def _base(cb: Codebase, built: list[str]) -> str:
    """The family's base among the classes one call may build (`{"npu": A, "cuda": B}[d](…)`):
    of the classes no other one derives from, the one most of the others derive from."""
    bases = [r for r in built if not any(b != r and b in cb.mro(r) for b in built)] or built
    return max(bases, key=lambda r: (sum(1 for b in built if r in cb.mro(b)), -bases.index(r)))


def _capture(cb: Codebase, cg: CallGraph, runner: str, capturing: set[str]) -> str | None:
    """The runner's method that captures (itself, or by calling a capturing function)."""
    methods = []
    for member in cb.mro(runner):
        module = cb.scope_module[member].name
        methods += [f"{module}.{c}" for c in cb.scopes[member].children
                    if cb.scopes.get(f"{module}.{c}") is not None and cb.scopes[f"{module}.{c}"].kind == "function"]
    for qn in methods:
        if qn in capturing:
            return qn
    for qn in methods:
        if any(t in capturing for _, targets in cg.call_targets(qn) for t in targets):
            return qn
    return None


def _with_contexts(node: ast.AST, params: set[str]) -> list[tuple[int, int, int, str]]:
    """(start, end, line, text) of `with` blocks whose context call receives a count parameter."""
    found = []
    for stmt in ast.walk(node):
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                expr = item.context_expr
                if isinstance(expr, ast.Call) and _names(expr) & params:
                    found.append((stmt.lineno, stmt.end_lineno or stmt.lineno, stmt.lineno, f"with {_text(expr)}"))
    return found


def _methods(cb: Codebase, cls: str) -> list[str]:
    found = []
    for member in cb.mro(cls):
        if member not in cb.scope_module:
            continue
        module = cb.scope_module[member].name
        for child in cb.scopes[member].children:
            qn = f"{module}.{child}"
            if cb.scopes.get(qn) is not None and cb.scopes[qn].kind == "function":
                found.append(qn)
    return found


def _field_annotations(cb: Codebase, cls: str) -> dict[str, str]:
    """A class's annotated fields and their annotations' text (string annotations read as code)."""
    module = cb.scope_module.get(cls)
    if module is None:
        return {}
    tree = files.tree(Path(cb.root) / module.path)
    if tree is None:
        return {}
    line = cb.scopes[cls].lineno
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls.rsplit(".", 1)[-1] and \
                (node.lineno == line or any(d.lineno == line for d in node.decorator_list)):
            found = {}
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    ann = stmt.annotation
                    text = ann.value if isinstance(ann, ast.Constant) and isinstance(ann.value, str) else ast.unparse(ann)
                    found[stmt.target.id] = text
            return found
    return {}


def _instances(cb: Codebase, expr: ast.expr, scope: str) -> set[str]:
    ir = expr_ir(expr)
    if ir is None:
        return set()
    return {v[1] for v in cb.values(ir, scope) if v[0] == "inst"}


def _sized_from(node: ast.FunctionDef | ast.AsyncFunctionDef, attrs: set[str]) -> list[tuple[int, str, str]]:
    """Allocations (`torch.<allocator>(…)`) in the function sized from `self.<attr>`, directly or
    through locals computed from it: (line, text, attr)."""
    self_name = node.args.args[0].arg if node.args.args else None
    if self_name is None:
        return []

    def reads(expr: ast.AST) -> set[str]:
        return {n.attr for n in ast.walk(expr) if isinstance(n, ast.Attribute) and n.attr in attrs
                and isinstance(n.value, ast.Name) and n.value.id == self_name}

    derived: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for stmt in ast.walk(node):
            if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and stmt.value is not None:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                source = reads(stmt.value) or {derived[n] for n in _names(stmt.value) if n in derived}
                if not source:
                    continue
                for target in targets:
                    for name in _names(target) if isinstance(target, (ast.Name, ast.Tuple)) else ():
                        if name not in derived:
                            derived[name] = sorted(source)[0]
                            changed = True
    found = []
    for call in ast.walk(node):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr in _ALLOCATORS and isinstance(call.func.value, ast.Name)
                and call.func.value.id == "torch"):
            continue
        shape = [*call.args, *(kw.value for kw in call.keywords if kw.arg in ("size", "end", "start", "step"))]
        for arg in shape:
            source = reads(arg) or {derived[n] for n in _names(arg) if n in derived}
            if source:
                found.append((call.lineno, _text(call), sorted(source)[0]))
                break
    return found


def find_tiers(cb: Codebase, cg: CallGraph, worker_cls: str, runners: set[str] | None = None) -> list[Tiers]:
    """The worker's adaptive tiers: one `Tiers` per tier builder (none for a worker without)."""
    found: list[Tiers] = []
    capturing = capturing_functions(cb)
    for builder in _methods(cb, worker_cls):
        node = function_node(cb, builder)
        if node is None or node.name == "__init__":
            continue
        counts = [a.arg for a in _params(node) if _count_param(a)]
        if not counts:
            continue
        loops = _loops(cb, builder, node)
        if not loops:
            continue
        tiers = Tiers(worker_cls, builder, node.lineno, cb.scope_module[builder].path, tuple(counts), loops)
        found.append(tiers)
        known = _Runners(cb, cg, capturing, runners or set())
        contexts = _with_contexts(node, set(counts))
        path = cb.scope_module[builder].path

        def context_of(line: int, contexts=contexts) -> tuple[int, str] | None:
            return next(((w_line, text) for start, end, w_line, text in contexts if start < line <= end), None)

        for line, built in _constructed(cb, cg, builder, known):
            runner = _base(cb, [c for c in built if c in known] or built)
            tiers.runners.append(TierRunner(builder, line, _line_text(node, line), runner, tuple(built),
                                            None, line, path, context_of(line), _first_capture(known, [runner, *built])))
        for call, targets in cg.call_targets(builder):
            for target in sorted(targets):
                if target.endswith(".__init__") or target not in cb.scopes:
                    continue
                sites = _constructed(cb, cg, target, known)
                for line, built in sites:
                    runner = _base(cb, [c for c in built if c in known] or built)
                    tiers.runners.append(TierRunner(
                        builder, call.lineno, _line_text(node, call.lineno), runner, tuple(built), target,
                        line, cb.scope_module[target].path, context_of(call.lineno),
                        _first_capture(known, [runner, *built])))
        _switches(cb, cg, tiers, known)
    return found


def _first_capture(runners: _Runners, built: list[str]) -> str | None:
    return next((c for cls in built if (c := runners.capture(cls)) is not None), None)


def _line_text(node: ast.AST, line: int) -> str:
    for stmt in ast.walk(node):
        if isinstance(stmt, ast.Call) and stmt.lineno == line:
            return _text(stmt)
    return ""


def _switches(cb: Codebase, cg: CallGraph, tiers: Tiers, runners: _Runners) -> None:
    """The switch (a method taking the builder's returned state), what it assigns, who calls it;
    and the allocations sized from the counts it (or the builder's context) assigns."""
    states = {v[1] for v in cb.returns(tiers.builder) if v[0] in ("inst", "class")}
    if not states:
        return
    state = sorted(states)[0]
    tiers.state = state
    fields = _field_annotations(cb, state)
    module = cb.scope_module[state].name
    runner_fields = {f: tuple(sorted(cls for n in _words(text) for cls in _named(cb, n, module) if cls in runners))
                     for f, text in fields.items()}
    runner_fields = {f: rs for f, rs in runner_fields.items() if rs}
    switched: dict[str, set[tuple[str, str]]] = {}  # attr → {(class, function)}
    assigned_at: dict[tuple[str, str], tuple[str, int]] = {}
    for switcher in _methods(cb, tiers.worker):
        node = function_node(cb, switcher)
        if node is None or switcher == tiers.builder:
            continue
        params = [a.arg for a in _params(node) if a.annotation is not None
                  and (ir := expr_ir(a.annotation)) is not None
                  and state in {v[1] for v in cb.type_values(ir, switcher)}]
        if not params:
            continue
        for stmt in ast.walk(node):
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute):
                value = stmt.value
                if not (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
                        and value.value.id in params):
                    continue
                target = stmt.targets[0]
                name = value.attr
                if name in runner_fields:
                    replayed = _replayed(cb, cg, target, switcher)
                    tiers.switches.append(TierSwitch(switcher, stmt.lineno, _text(stmt), name, "runner",
                                                     runner_fields[name], replayed))
                elif name.startswith(SPEC_PREFIX) and target.attr.startswith(SPEC_PREFIX):
                    tiers.switches.append(TierSwitch(switcher, stmt.lineno, _text(stmt), name, "count"))
                    for cls in _instances(cb, target.value, switcher):
                        switched.setdefault(target.attr, set()).add((cls, switcher))
                        assigned_at.setdefault((cls, target.attr), (switcher, stmt.lineno))
            elif isinstance(stmt, ast.Call):
                for kw in stmt.keywords:
                    if kw.arg and kw.arg.startswith(SPEC_PREFIX) and isinstance(kw.value, ast.Attribute) \
                            and isinstance(kw.value.value, ast.Name) and kw.value.value.id in params:
                        tiers.settings.append((kw.arg, stmt.lineno, _text(stmt)))
        if any(s.switcher == switcher for s in tiers.switches):
            tiers.switcher = switcher
            tiers.switched_by = sorted({caller for caller, _ in cb._calls_named(node.name) if caller != switcher})
    # Allocations sized from a switched count, in the classes it is switched on (and the
    # methods the switch calls on them, such as a rebuild of per-count buffers).
    done: set[tuple[str, int]] = set()
    for (cls, attr), where in sorted(assigned_at.items()):
        for method in _methods(cb, cls):
            node = function_node(cb, method)
            if node is None:
                continue
            for line, text, sized in _sized_from(node, {attr}):
                if (method, line) in done:
                    continue
                done.add((method, line))
                tiers.allocations.append(TierAlloc(method, line, text, sized, where))


def _named(cb: Codebase, name: str, module: str) -> set[str]:
    """The classes a name in an annotation of `module` means: what it imports or defines by
    that name (a `TYPE_CHECKING` import included), else any class of that name."""
    resolved = {v[1] for v in cb.member(module, name) if v[0] == "class"}
    return resolved or {qn for qn in cb.find(name) if cb.is_class(qn)}


def _words(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_]\w*", text))


def _replayed(cb: Codebase, cg: CallGraph, target: ast.Attribute, switcher: str) -> tuple[tuple[str, int, str], ...]:
    """Where the swapped attribute's runner is called: `self.<attr>.<method>(…)` in the methods of
    the class the switch assigns it on."""
    found = []
    for cls in sorted(_instances(cb, target.value, switcher)):
        for method in _methods(cb, cls):
            node = function_node(cb, method)
            if node is None:
                continue
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                        and isinstance(call.func.value, ast.Attribute) and call.func.value.attr == target.attr \
                        and isinstance(call.func.value.value, ast.Name) and call.func.value.value.id == "self":
                    found.append((method, call.lineno, _text(call)))
    return tuple(sorted(set(found))[:6])
