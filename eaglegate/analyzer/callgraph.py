"""The call graph (networkx): nodes are qualified names, edges keep every call site.

Nodes are the tree's modules, classes and functions by qualified name; a lambda is
`<scope>.<lambdaN>` (the Nth lambda of that scope in source order); a callee outside the
tree keeps the name it was imported by (`numpy.zeros`), a builtin is `<builtin>.len`.
Instantiating a class is a call to the `__init__` that runs (its own or inherited; a
base outside the tree gives `ext.Base.__init__`), and no edge when only `object.__init__`
runs. A function, class or callable instance passed to a builtin or standard-library
function that calls it (`map`, `filter`, `sorted(key=)`, `threading.Thread(target=)`…) is
called by the caller. `functools.partial(f, …)` is a value that calls `f`: the edge is made
where the partial is called (or handed to something that calls it), not where it is made.

Each edge `caller → callee` carries `sites`: a list of `Site(path, line, conditions)`,
one per call expression, so a report can tell the overlap path from the normal one.
Edges are computed on demand (`expand`), so a question about one entry point resolves
only the functions it reaches; `build_all` computes the whole graph for export.

A parameter called in the body (`def template(self, b, call_fn): call_fn(b)`) has an edge
to every callable any caller hands it; `through_param` marks those edges. `reach` reads
them per path: a function is visited once per set of callables its callers hand it
(handed on through other parameters too), and follows only those, so code that hands a
template its capture-time closure is not reached from code that hands its run-time one.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from eaglegate.analyzer.index import BUILTIN_PREFIX, Codebase, Site, ordered
from eaglegate.analyzer.parse import ParsedTree, no_cyclic_gc, parse_tree, reachable_files
from eaglegate.analyzer.summary import Call, Expr

if TYPE_CHECKING:
    import networkx as nx

# Callables outside the tree that call the functions passed to them: which arguments (a
# position, or a keyword) they call. `key=` is called by every external or unresolved callee
# taking it (`sorted`, `min`, `list.sort`, `heapq.nlargest`…).
_CALLBACK_TAKERS: dict[str, tuple[int | str, ...]] = {
    f"{BUILTIN_PREFIX}.map": (0,), f"{BUILTIN_PREFIX}.filter": (0,), f"{BUILTIN_PREFIX}.iter": (0,),
    "functools.reduce": (0,),
    "itertools.starmap": (0,), "itertools.filterfalse": (0,), "itertools.takewhile": (0,),
    "itertools.dropwhile": (0,), "itertools.accumulate": (1, "func"),
    "threading.Thread": ("target",), "multiprocessing.Process": ("target",),
    "atexit.register": (0,),
    "collections.defaultdict": (0,),  # its factory, for each missing key
}
_KEY_ARGUMENT = "key"

KIND_EXTERNAL = "external"
# What a function's callers hand it for the parameters it calls: (parameter, functions)
# pairs, None when nothing narrows them (see `CallGraph.reach`).
Handed = tuple[tuple[str, frozenset[str]], ...] | None


def _digraph() -> nx.DiGraph:
    # networkx is imported where a graph is built: a map read from the cache needs none.
    import networkx as nx

    return nx.DiGraph()


@dataclass
class CallGraph:
    codebase: Codebase
    graph: nx.DiGraph = field(default_factory=_digraph)
    expanded: set[str] = field(default_factory=set)
    # (caller, callee) → the caller's parameters through which alone it calls the callee
    # (`def common_template(self, call_fn): call_fn(i)`): the edge holds only where the
    # caller was handed that callee (see `reach`).
    through_param: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    _param_called: dict[str, tuple[frozenset[str], frozenset[str]]] = field(default_factory=dict)
    # `handed`'s inputs and answers: each caller's explicit calls with the tree's functions
    # they run (resolved once per caller, not once per followed edge), and each answer by
    # (caller, callee, what the caller was handed): the map reaches the same edges again
    # and again (from the loops, the scheduler's setup, each worker).
    _call_targets: dict[str, list[tuple[Call, frozenset[str]]]] = field(default_factory=dict)
    _handed: dict[tuple[str, str, Handed], Handed] = field(default_factory=dict)

    def node(self, qn: str) -> None:
        if qn in self.graph:
            return
        scope = self.codebase.scopes.get(qn)
        if scope is None:
            self.graph.add_node(qn, kind=KIND_EXTERNAL)
            return
        module = self.codebase.scope_module[qn]
        self.graph.add_node(
            qn, kind=scope.kind, path=module.path, lineno=scope.lineno, end_lineno=scope.end_lineno
        )

    def callees(self, caller: str) -> Iterable[tuple[str, Site]]:
        """Resolve every call made directly in `caller`'s body."""
        for target, site, _ in self._callees(caller):
            yield target, site

    def _targets(self, values: Iterable[tuple], implicit: bool = False) -> tuple[set[str], list[str]]:
        """The tree's functions that calling one of `values` runs, and the external names."""
        cb = self.codebase
        targets: set[str] = set()
        external: list[str] = []
        for value in ordered(values):
            if value[0] == "func":
                targets.add(value[1])
            elif value[0] == "class":
                init = cb.instantiation(value[1])
                if init is not None:
                    targets.add(init)
            elif implicit:
                continue
            elif value[0] == "inst":
                targets.update(v[1] for v in cb.attribute(value, "__call__") if v[0] == "func")
            elif value[0] == "partial":  # `functools.partial(f, …)` calls `f`
                more, outside = self._targets((value[1],))
                targets.update(more)
                external.extend(outside)
            elif value[0] == "ext":
                external.append(value[1])
        return targets, external

    def _callees(self, caller: str) -> Iterable[tuple[str, Site, str | None]]:
        """Every call made directly in `caller`'s body: (callee, site, the caller's parameter
        the call goes through, or None for any other call)."""
        cb = self.codebase
        scope = cb.scopes[caller]
        owner = cb.owner_class(caller) if scope.kind in ("function", "lambda") else None
        selfname = cb.self_param(caller) if owner else None
        params = {p for p, _ in scope.params} if scope.kind in ("function", "lambda") else set()
        for call in scope.calls:
            site = cb.site(caller, call.lineno, call.cond)
            targets, external = self._targets(cb.values(call.func, caller), call.implicit)
            func = call.func
            # `fn(…)` where `fn` is a parameter (and the body never rebinds it): what runs is
            # what this call of the caller was handed.
            param = func[1] if func and func[0] == "n" and func[1] in params \
                and not any(a.target == func for a in scope.assigns) else None
            handed = frozenset(targets) if param else frozenset()
            # The code behind an external or unresolved callee (`xs.sort(key=f)`) calls back.
            if (external or not targets) and (call.args or call.kwargs) and not call.implicit:
                targets.update(self._callbacks(caller, call, external))
            targets.update(external)
            # `self.method()` dispatches to overrides in subclasses too (template methods).
            if owner and selfname and func and func[0] == "a" and func[1] == ("n", selfname):
                for sub in cb.subclasses(owner):
                    override = f"{sub}.{func[2]}"
                    if override in cb.scopes and cb.scopes[override].kind == "function":
                        targets.add(override)
            for target in sorted(targets):  # edge order decides what a limited reach visits
                yield target, site, param if target in handed else None

    def _callbacks(self, caller: str, call: Call, external: list[str]) -> set[str]:
        """The tree's functions that the external callees call back (`map(f, xs)`)."""
        cb = self.codebase
        keys: set[int | str] = {_KEY_ARGUMENT}
        for name in external:
            keys.update(_CALLBACK_TAKERS.get(name, ()))
        passed = [ir for position, ir in enumerate(call.args) if position in keys]
        passed += [ir for keyword, ir in call.kwargs if keyword in keys]
        return {target for ir in passed if ir is not None for target in self._targets(cb.values(ir, caller))[0]}

    def expand(self, caller: str) -> None:
        if caller in self.expanded or caller not in self.codebase.scopes:
            return
        self.expanded.add(caller)
        self.node(caller)
        through: dict[str, set[str] | None] = {}  # callee → parameters, None once called otherwise
        for target, site, param in self._callees(caller):
            self.node(target)
            if self.graph.has_edge(caller, target):
                sites = self.graph.edges[caller, target]["sites"]
                if site not in sites:
                    sites.append(site)
            else:
                self.graph.add_edge(caller, target, sites=[site])
            known = through.setdefault(target, set())
            if param is None:
                through[target] = None
            elif known is not None:
                known.add(param)
        for target, params in through.items():
            if params:
                self.through_param[(caller, target)] = frozenset(params)

    def reach(self, roots: Iterable[str], limit: int | None = None, depth: int | None = None,
              avoid: Collection[str] = ()) -> set[str]:
        """Expand what `roots` reach (at most `limit` nodes, `depth` calls deep, never entering
        `avoid` unless it is a root); returns those nodes."""
        with no_cyclic_gc():
            return self._reach(roots, limit, depth, avoid)

    def _reach(self, roots: Iterable[str], limit: int | None, depth: int | None,
               avoid: Collection[str] = ()) -> set[str]:
        # A function that calls one of its parameters (`call_fn(i)`) is visited once per
        # set of callables its callers hand it, and follows only those: the runtime
        # `init_forward_metadata` passing its own closure to a shared template does not
        # reach the closure the capture-time method passes to the same template.
        seen: set[str] = set()
        visited: set[tuple[str, Handed]] = set()
        queue: deque[tuple[str, int, Handed]] = deque((root, 0, None) for root in roots)
        scopes = self.codebase.scopes
        while queue:
            current, level, handed = queue.popleft()
            if current not in scopes:  # external callees are leaves, not counted
                continue
            if (current, None) in visited or (current, handed) in visited:
                continue
            visited.add((current, handed))
            seen.add(current)
            if depth is not None and level >= depth:
                continue
            self.expand(current)
            if current in self.graph:
                given = dict(handed) if handed else {}
                for callee in self.graph.successors(current):
                    params = self.through_param.get((current, callee))
                    if params and given and all(p in given and callee not in given[p] for p in params):
                        continue  # a callable this call of `current` was not handed
                    if callee not in avoid:
                        queue.append((callee, level + 1, self._handed_memo(current, callee, handed, given)))
            if limit and len(seen) >= limit:
                break
        return seen

    def param_called(self, qn: str) -> tuple[frozenset[str], frozenset[str]]:
        """The parameters `qn` calls (`def f(fn): fn()`) and those it hands on as an argument
        (`def g(fn): f(fn)`), read from its calls alone."""
        found = self._param_called.get(qn)
        if found is None:
            scope = self.codebase.scopes.get(qn)
            params = {p for p, _ in scope.params} if scope is not None else set()
            called: set[str] = set()
            passed: set[str] = set()
            for call in scope.calls if scope is not None and params else ():
                if call.func and call.func[0] == "n" and call.func[1] in params:
                    called.add(call.func[1])
                passed.update(ir[1] for ir in (*call.args, *(v for _, v in call.kwargs))
                              if ir is not None and ir[0] == "n" and ir[1] in params)
            found = self._param_called[qn] = (frozenset(called), frozenset(passed - called))
        return found

    def _handed_memo(self, caller: str, callee: str, handed: Handed, given: dict[str, frozenset[str]]) -> Handed:
        """`handed(caller, callee, given)`, where `given` is `dict(handed)`: computed once."""
        key = (caller, callee, handed)
        try:
            return self._handed[key]
        except KeyError:
            found = self._handed[key] = self.handed(caller, callee, given)
            return found

    def call_targets(self, caller: str) -> list[tuple[Call, frozenset[str]]]:
        """`caller`'s explicit calls, each with the tree's functions calling its callee runs."""
        found = self._call_targets.get(caller)
        if found is None:
            cb = self.codebase
            found = self._call_targets[caller] = [
                (call, frozenset(self._targets(cb.values(call.func, caller))[0]))
                for call in cb.scopes[caller].calls if not call.implicit]
        return found

    def handed(self, caller: str, callee: str, given: dict[str, frozenset[str]]) -> Handed:
        """What `caller`'s calls of `callee` pass for the parameters `callee` calls: each
        parameter's functions, where every such call passes a known callable (a parameter
        of `caller` passes what `caller` was handed, in `given`); None when nothing is
        known (no such parameter, a call that cannot be matched, an argument not passed)."""
        called, passed = self.param_called(callee)
        wanted = called | passed
        if not wanted:
            return None
        cb = self.codebase
        scope = cb.scopes[caller]
        own = {p for p, _ in scope.params} if scope.kind in ("function", "lambda") else set()
        found: dict[str, set[str]] = {}
        matched = False
        for call, runs in self.call_targets(caller):
            if callee not in runs:
                continue
            matched = True
            bound = call.func is not None and call.func[0] == "a" or callee.endswith(".__init__")
            arguments: dict[str, Expr] = {}
            written: set[str] = set(call.keywords)  # passed, with or without IR
            for position in range(call.npos):
                name = cb.parameter_for(callee, position, bound)
                if name is not None:
                    written.add(name)
                    ir = call.args[position] if position < len(call.args) else None
                    if name in wanted and ir is not None:
                        arguments[name] = ir
            arguments.update((k, ir) for k, ir in call.kwargs if k in wanted)
            for name in sorted(wanted):
                arg = arguments.get(name)
                if arg is None:
                    if name in written:  # a constant or an expression: nothing callable
                        found.setdefault(name, set())
                    else:  # left to a default, or to `*args`/`**kwargs`
                        wanted = wanted - {name}
                    continue
                if arg[0] == "n" and arg[1] in own and arg[1] in given:
                    targets = set(given[arg[1]])
                else:
                    targets = self._targets(cb.values(arg, caller))[0]
                found.setdefault(name, set()).update(targets)
        if not matched:
            return None
        # A parameter only handed on is kept when it carries a callable (most carry data).
        kept = tuple(sorted((name, frozenset(found[name])) for name in wanted if name in found
                            and (name in called or found[name])))
        return kept or None

    def build_all(self) -> nx.DiGraph:
        with no_cyclic_gc():
            for qn in self.codebase.scopes:
                self.expand(qn)
        return self.graph

    def sites(self, caller: str, callee: str) -> list[Site]:
        return list(self.graph.edges[caller, callee]["sites"])


def load_codebase(
    root: Path,
    progress: Callable[[int, int], None] | None = None,
    reach_from: tuple[str, ...] | None = None,
) -> tuple[Codebase, ParsedTree, float]:
    """Parse the tree (only the modules that define `reach_from` classes and what they import)."""
    start = time.perf_counter()
    digests: dict[Path, str] = {}
    files = reachable_files(root, reach_from, digests) if reach_from else None
    parsed = parse_tree(root, files=files, progress=progress, digests=digests)
    # Summaries live as long as the analysis: move them out of the cyclic GC's view, or
    # every later allocation burst re-scans millions of objects that are never garbage.
    gc.freeze()
    return Codebase(parsed), parsed, time.perf_counter() - start


def export(graph: nx.DiGraph) -> dict[str, object]:
    """The graph as `{"nodes": [...], "edges": [{"caller", "callee", "sites"}]}`, sorted."""
    with no_cyclic_gc():
        return _export(graph)


def _export(graph: nx.DiGraph) -> dict[str, object]:
    nodes = sorted(n for n, data in graph.nodes(data=True) if data.get("kind") != KIND_EXTERNAL)
    edges = []
    for caller, callee, data in sorted(graph.edges(data=True), key=lambda e: (e[0], e[1])):
        edges.append(
            {
                "caller": caller,
                "callee": callee,
                "sites": [{"path": s.path, "line": s.lineno, "condition": list(s.cond)} for s in data["sites"]],
            }
        )
    return {"nodes": nodes, "edges": edges}


def to_dot(graph: nx.DiGraph, name: str = "calls") -> str:
    lines = [f'digraph "{name}" {{', "  node [shape=box, fontname=monospace];"]
    for node in sorted(graph.nodes):
        lines.append(f'  "{node}";')
    for caller, callee in sorted(graph.edges):
        lines.append(f'  "{caller}" -> "{callee}";')
    lines.append("}")
    return "\n".join(lines) + "\n"
