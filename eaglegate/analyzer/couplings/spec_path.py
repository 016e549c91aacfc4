"""Code that runs only because speculation is on: asserts on the spec path, v2's relay.

The evidence starts where speculation switches the worker on: the scheduler builds the
worker only under a test on the speculative algorithm (the map's constructor site, whose
condition the data flow ties to `server_args.speculative_algorithm`). From there:

- `path_assert`: an assert in a worker step (two calls deep, in the worker's package) or in
  a method of the per-batch speculative state that the scheduler calls (filter, merge);
  a step that runs without drafting still passes through it;
- `overlap_relay`: beside the v2 worker's entry, an object that takes the batch before the
  call and the call's result after it (the overlap scheduler's FutureMap): the next step's
  draft input comes through it, so a step without drafting must still feed it.
"""

from __future__ import annotations

import ast
from typing import Any, ClassVar

from eaglegate.analyzer.couplings.context import Context, graph_runners
from eaglegate.analyzer.couplings.dataflow import frames_chain, text_of
from eaglegate.analyzer.couplings.model import Chain, Finding, Step
from eaglegate.analyzer.spec_map import WorkerMap
from eaglegate.analyzer.step_calls import dotted, function_node

_STEP_DEPTH = 2


def selection_chain(ctx: Context, worker: WorkerMap) -> Chain | None:
    """From the speculative setting to the worker being built: the constructor site's guard."""
    for sel in worker.selection:
        if sel.kind != "constructor":
            continue
        facts = ctx.flow.functions.get(sel.function)
        if facts is None or not facts.analysed:
            continue
        for call in facts.calls:
            guard = frames_chain(call.cond) if call.line == sel.site.lineno else None
            if guard is not None:
                frame, chain = guard
                test = f"not ({frame.text})" if frame.negated else frame.text
                return (*chain, Step(f"if {test}", facts.path, frame.line),
                        Step(f"{worker.name} built: {text_of(call.node)}", facts.path, call.line))
    return None


def spec_state_classes(ctx: Context) -> set[str]:
    """Classes of the per-batch speculative state: defined in the worker's own package, with
    fields the draft step reads and the worker's other steps write (the scheduler's batch,
    which holds that state, is not one of them)."""
    cached = ctx.scratch.get("spec_state")
    if isinstance(cached, set):
        return cached
    found: set[str] = set()
    cb = ctx.codebase
    for worker in ctx.workers:
        family = set(cb.mro(worker.cls or ""))
        package = (worker.cls or "").rsplit(".", 2)[0] + "."
        writers = ctx.step_functions(worker, ("verify", "draft_extend"), depth=2) | {worker.entry or ""}
        for qn in ctx.step_functions(worker, ("draft",), depth=1):
            facts = ctx.flow.functions.get(qn)
            if facts is None or not facts.analysed:
                continue
            for read in facts.reads:
                if read.classes & family:
                    continue
                found |= {c for c in read.classes if c.startswith(package)
                          and any(w in writers for _, _, w in ctx.flow.attr_writes.get((c, read.attr), ()))}
    ctx.scratch["spec_state"] = found
    return found


class SpecPathDetector:
    CATEGORY: ClassVar[str] = "mode_check"
    DESCRIPTION: ClassVar[str] = "asserts on the speculative path and v2's overlap relay"
    REQUIRES: ClassVar[tuple[str, ...]] = ("flow", "spec_map", "callgraph")

    def find(self, ctx: Context) -> list[Finding]:
        findings: list[Finding] = []
        for worker in ctx.workers:
            chain = selection_chain(ctx, worker)
            if chain is None or worker.cls is None:
                continue
            findings += self._asserts(ctx, worker, chain)
            findings += self._relay(ctx, worker, chain)
        return findings

    def _asserts(self, ctx: Context, worker: WorkerMap, chain: Chain) -> list[Finding]:
        cb = ctx.codebase
        package = worker.cls.rsplit(".", 2)[0] + "." if worker.cls else ""
        roots = ([worker.entry] if worker.entry else []) + [s.function for s in worker.steps]
        scope = {qn for qn in ctx.near(roots, _STEP_DEPTH) if qn in cb.scopes
                 and cb.scope_module[qn].name.startswith(package)}
        # The state's own methods the scheduler calls on it (filter, merge).
        for cls in spec_state_classes(ctx):
            scope |= {m for m in ctx.class_methods(cls) if cb.owner_class(m) == cls and _called_from_outside(ctx, m)}
        runners = graph_runners(ctx)  # their checks are the runtime-check detector's
        family = set(cb.mro(worker.cls or ""))
        found: list[Finding] = []
        for qn in sorted(scope):
            node = function_node(cb, qn)
            owner = cb.owner_class(qn)
            if node is None or owner in runners:
                continue
            where = worker.label if owner in family else ctx.worker_path(qn)
            path = cb.scope_module[qn].path
            for stmt in _own_statements(node):
                if isinstance(stmt, ast.Assert):
                    test = text_of(stmt.test)
                    found.append(Finding(
                        self.CATEGORY, "path_assert", qn, path, stmt.lineno,
                        (*chain, Step(f"runs on {worker.label}'s path: {qn.rsplit('.', 2)[-2]}."
                                      f"{qn.rsplit('.', 1)[-1]}", path, node.lineno),
                         Step(f"assert {test}", path, stmt.lineno)),
                        f"{qn.rsplit('.', 1)[-1]} asserts `{test}` on the speculative path: a step without "
                        "drafting that passes here must still satisfy it",
                        where, "blocks-runtime-switch", {"test": test}))
        return found

    def _relay(self, ctx: Context, worker: WorkerMap, chain: Chain) -> list[Finding]:
        """Objects beside the entry that take the batch before the call and its result after,
        at every site where a loop calls the worker (the overlap loop's and the normal one's)."""
        if not worker.relay or not worker.paths:
            return []
        hops = {(h.caller, h.site.lineno): h for h in (p.hops[-1] for p in worker.paths if p.hops)}
        found: dict[tuple[str, int], Finding] = {}
        for hop in hops.values():
            for finding in self._relay_at(ctx, worker, chain, hop):
                found.setdefault((finding.symbol, finding.line), finding)
        return list(found.values())

    def _relay_at(self, ctx: Context, worker: WorkerMap, chain: Chain, hop: Any) -> list[Finding]:
        cb = ctx.codebase
        scope = cb.scopes[hop.caller]
        result = {a.target[1] for a in scope.assigns if a.lineno == hop.site.lineno and a.target
                  and a.target[0] == "n"} | {a.target[1] for a in scope.assigns
                                             if a.target and a.target[0] == "n" and a.value
                                             and a.value[0] == "c" and a.lineno <= hop.site.lineno + 3
                                             and a.lineno >= hop.site.lineno}
        entry_args = {arg[1] for call in scope.calls if call.lineno == hop.site.lineno
                      for arg in call.args if arg and arg[0] == "n"}
        receivers: dict[tuple, list[tuple[int, str, str]]] = {}
        for call in scope.calls:
            func = call.func
            if not func or func[0] != "a" or call.cond[:len(hop.site.cond)] != hop.site.cond:
                continue
            names = {arg[1] for arg in call.args if arg and arg[0] == "n"}
            side = "before" if call.lineno < hop.site.lineno and names & entry_args else \
                "after" if call.lineno > hop.site.lineno and names & result else ""
            if side:
                receivers.setdefault(func[1], []).append((call.lineno, side, func[2]))
        found: list[Finding] = []
        path = cb.scope_module[hop.caller].path
        for receiver, calls in sorted(receivers.items(), key=lambda item: item[1][0][0]):
            if {side for _, side, _ in calls} != {"before", "after"}:
                continue
            holder = ".".join(dotted(receiver)) or "?"
            for line, side, method in calls:
                found.append(Finding(
                    self.CATEGORY, "overlap_relay", f"{hop.caller}:{holder}.{method}", path, line,
                    (*chain, Step(f"{worker.name}'s entry called: {hop.callee.rsplit('.', 1)[-1]}", path,
                                  hop.site.lineno),
                     Step(f"{holder}.{method} {side} the call", path, line)),
                    f"`{holder}` relays the step's output to the next step ({method} {side} the worker call): "
                    "a step without drafting must still store what the next one resolves",
                    worker.label, "blocks-runtime-switch", {"holder": holder, "side": side}))
        return found



def _own_statements(node: ast.AST) -> list[ast.stmt]:
    """The function's statements, nested blocks included, nested defs not."""
    found: list[ast.stmt] = []
    stack = list(getattr(node, "body", []))
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        found.append(stmt)
        for name in ("body", "orelse", "finalbody", "handlers"):
            stack.extend(getattr(stmt, name, []) or [])
    return sorted(found, key=lambda s: s.lineno)


def _called_from_outside(ctx: Context, qn: str) -> bool:
    cg, cb = ctx.callgraph, ctx.codebase
    if qn not in cg.graph:
        return False
    owner = cb.owner_class(qn)
    return any((cb.owner_class(p) if p in cb.scopes else None) != owner for p in cg.graph.predecessors(qn))
