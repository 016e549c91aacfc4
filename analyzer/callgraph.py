"""The call graph (networkx): nodes are qualified names, edges keep every call site.

Each edge `caller → callee` carries `sites`: a list of `Site(path, line, conditions)`,
one per call expression, so a report can tell the overlap path from the normal one.
Edges are computed on demand (`expand`), so a question about one entry point resolves
only the functions it reaches; `build_all` computes the whole graph for export.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import networkx as nx

from eaglegate.analyzer.index import Codebase, Site, ordered
from eaglegate.analyzer.parse import ParsedTree, parse_tree, reachable_files


@dataclass
class CallGraph:
    codebase: Codebase
    graph: nx.DiGraph = field(default_factory=nx.DiGraph)
    expanded: set[str] = field(default_factory=set)

    def node(self, qn: str) -> None:
        if qn in self.graph:
            return
        scope = self.codebase.scopes.get(qn)
        if scope is None:
            self.graph.add_node(qn, kind="external")
            return
        module = self.codebase.scope_module[qn]
        self.graph.add_node(
            qn, kind=scope.kind, path=module.path, lineno=scope.lineno, end_lineno=scope.end_lineno
        )

    def callees(self, caller: str) -> Iterable[tuple[str, Site]]:
        """Resolve every call made directly in `caller`'s body."""
        cb = self.codebase
        scope = cb.scopes[caller]
        owner = cb.owner_class(caller) if scope.kind == "function" else None
        selfname = cb.self_param(caller) if owner else None
        for call in scope.calls:
            site = cb.site(caller, call.lineno, call.cond)
            targets: set[str] = set()
            for value in ordered(cb.values(call.func, caller)):
                if value[0] == "func":
                    targets.add(value[1])
                elif value[0] == "class":
                    targets.add(cb.constructor(value[1]) or value[1])
                elif value[0] == "inst":
                    targets.update(v[1] for v in cb.attribute(value, "__call__") if v[0] == "func")
            func = call.func
            # `self.method()` dispatches to overrides in subclasses too (template methods).
            if owner and selfname and func and func[0] == "a" and func[1] == ("n", selfname):
                for sub in cb.subclasses(owner):
                    override = f"{sub}.{func[2]}"
                    if override in cb.scopes and cb.scopes[override].kind == "function":
                        targets.add(override)
            for target in sorted(targets):  # edge order decides what a limited reach visits
                yield target, site

    def expand(self, caller: str) -> None:
        if caller in self.expanded or caller not in self.codebase.scopes:
            return
        self.expanded.add(caller)
        self.node(caller)
        for target, site in self.callees(caller):
            self.node(target)
            if self.graph.has_edge(caller, target):
                sites = self.graph.edges[caller, target]["sites"]
                if site not in sites:
                    sites.append(site)
            else:
                self.graph.add_edge(caller, target, sites=[site])

    def reach(self, roots: Iterable[str], limit: int | None = None, depth: int | None = None) -> set[str]:
        """Expand what `roots` reach (at most `limit` nodes, `depth` calls deep); returns those nodes."""
        seen: set[str] = set()
        queue = deque((root, 0) for root in roots)
        while queue:
            current, level = queue.popleft()
            if current in seen:
                continue
            seen.add(current)
            if depth is not None and level >= depth:
                continue
            self.expand(current)
            if current in self.graph:
                queue.extend((callee, level + 1) for callee in self.graph.successors(current))
            if limit and len(seen) >= limit:
                break
        return seen

    def build_all(self) -> nx.DiGraph:
        for qn, scope in self.codebase.scopes.items():
            if scope.kind in ("function", "module", "class"):
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
    files = reachable_files(root, reach_from) if reach_from else None
    parsed = parse_tree(root, files=files, progress=progress)
    # Summaries live as long as the analysis: move them out of the cyclic GC's view, or
    # every later allocation burst re-scans millions of objects that are never garbage.
    gc.freeze()
    return Codebase(parsed), parsed, time.perf_counter() - start


def export(graph: nx.DiGraph) -> dict[str, object]:
    """The graph as `{"nodes": [...], "edges": [{"caller", "callee", "sites"}]}`, sorted."""
    nodes = sorted(n for n, data in graph.nodes(data=True) if data.get("kind") != "external")
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
