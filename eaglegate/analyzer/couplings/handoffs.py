"""Where a speculative size or the draft state is handed on: the sites a reviewer names beside
the ones the other detectors find.

The other detectors report where a width is defined (an allocation, a captured runner's
field, a state class's rewrite). A reviewer also names where that width or state is handed
to the next holder. These rules find those hand-offs from the earlier findings and the
code's structure (they run last and read the findings so far, `ctx.scratch["findings"]`):

- `pool_build` (buffer): where a pool allocated at a speculative width is built: the call
  whose argument carries the width into the allocating constructor (the model runner's
  memory-pool set-up building the request-to-token pool with the draft tokens added). A
  site of the allocation's own mechanism.
- `graph_inputs` (cuda_graph): a graph runner's method, other than its constructor, that
  uses a field the runner sized from a speculative setting (the capture of each batch size at
  the verify width), and the method of another object it hands that width to (the graph
  input buffers filled from the forward batch at tokens-per-request). A site of the
  runner's capture-width mechanism.
- `state_handoff` (draft_state): where the batch calls the draft state's filter or merge
  (the batch's own filter and merge carry the state along). A site of that filter/merge.
- `relay_state` (draft_state): the methods of the overlap relay's holder (v2's FutureMap)
  that branch on the algorithm or read and write the draft state's fields: the store of a
  step's draft input for the next batch and its resolution before the next forward.
- `step_dispatch` (mode_check): in a worker's entry, a branch whose arms call different
  steps of the map (extend vs draft/verify): where the step is routed by the batch's mode.
- `step_reservation` (buffer): a field of the scheduler set from a speculative width that a
  step function hands to a call (the decode memory check's multiplier), the callee's use of
  it and where the field is set.
- `mode_decision` (mode_check): a function the scheduler's event loop calls directly that
  returns a test on the algorithm (whether overlap is off for this batch).
- `draft_runner_pool` (buffer): a flag a worker passes as a literal `True` when it builds
  the runner it drafts with (`is_draft_worker=True`), followed into the runner's fields; a
  method of that runner that branches on the flag and returns a value the branch computes
  (the KV pool's token count from the draft's layers).
"""

from __future__ import annotations

import ast
from typing import ClassVar

from eaglegate.analyzer.couplings.context import Context, graph_runners, names_in
from eaglegate.analyzer.couplings.dataflow import FunctionFacts, SpecFlow, text_of
from eaglegate.analyzer.couplings.model import Chain, Finding, Step
from eaglegate.analyzer.couplings.spec_path import (
    _own_statements,
    selection_chain,
    spec_state_classes,
)
from eaglegate.analyzer.index import Codebase
from eaglegate.analyzer.step_calls import function_node

_RELAY_DEPTH = 3


class HandoffDetector:
    CATEGORY: ClassVar[str] = "draft_state"
    DESCRIPTION: ClassVar[str] = "where a speculative size or the draft state is handed to the next holder"
    REQUIRES: ClassVar[tuple[str, ...]] = ("flow", "spec_map", "callgraph", "findings")

    def find(self, ctx: Context) -> list[Finding]:
        kept = ctx.scratch.get("findings")
        earlier = [f for f in kept if isinstance(f, Finding)] if isinstance(kept, list) else []
        found: list[Finding] = []
        found += self._pool_builds(ctx, earlier)
        found += self._graph_inputs(ctx)
        found += self._state_handoffs(ctx, earlier)
        found += self._relay_state(ctx, earlier)
        found += self._step_dispatch(ctx)
        found += self._draft_runner_pool(ctx)
        found += self._mode_decisions(ctx)
        found += self._step_reservations(ctx)
        return found

    # -- pools built at the speculative width -------------------------------------------------
    def _pool_builds(self, ctx: Context, earlier: list[Finding]) -> list[Finding]:
        found: dict[tuple[str, int], Finding] = {}
        for alloc in earlier:
            if (alloc.category, alloc.kind) != ("buffer", "alloc"):
                continue
            # The last binding into a constructor from another function: the call that built it.
            for step in reversed(alloc.evidence):
                if "←" not in step.text or ".__init__(" not in step.text.split("←", 1)[0]:
                    continue
                caller = _function_at(ctx, step.path, step.line)
                if caller is None or (step.path, step.line) == (alloc.path, alloc.line):
                    break
                built = step.text.split("←", 1)[0].split(".__init__(", 1)[0].strip().rsplit(".", 1)[-1]
                if caller.endswith(".__init__") and built in {b.rsplit(".", 1)[-1] for b in
                                                              ctx.codebase.mro(ctx.codebase.owner_class(caller) or "")}:
                    break  # a subclass's constructor calling its base's: not where it is built
                owner = alloc.detail.get("class") or alloc.symbol.rsplit(".", 1)[0]
                found.setdefault((step.path, step.line), Finding(
                    "buffer", "pool_build", caller, step.path, step.line,
                    alloc.evidence[:alloc.evidence.index(step) + 1],
                    f"{caller.rsplit('.', 1)[-1]} builds {str(owner).rsplit('.', 1)[-1]} with a speculative "
                    "width: the pool it allocates is sized for speculation from start-up",
                    alloc.worker_path, alloc.severity,
                    {"class": owner, "part_of": "alloc", "allocation": alloc.where, "built": built}))
                break
        return list(found.values())

    # -- graph inputs at the runner's speculative width ----------------------------------------
    def _graph_inputs(self, ctx: Context) -> list[Finding]:
        flow, cb = ctx.flow, ctx.codebase
        found: list[Finding] = []
        handed: set[str] = set()  # one site per method a width is handed to: its first use
        runners = graph_runners(ctx)
        for runner in sorted(runners):
            shaped = flow.tainted_fields(runner)
            # A subclass (the NPU runner) is one more site of its base runner's mechanism.
            base = next((b for b in reversed(cb.mro(runner)) if b in runners and flow.tainted_fields(b)), runner)
            if not shaped:
                continue
            init = cb.constructor(runner)
            family = set(cb.mro(runner))
            for qn in sorted(m for m in ctx.class_methods(runner) if cb.owner_class(m) == runner and m != init):
                facts = flow.functions.get(qn)
                if facts is None or not facts.analysed:
                    continue
                read = next((r for r in sorted(facts.reads, key=lambda r: r.line)
                             if r.attr in shaped and r.classes & family), None)
                if read is None:
                    continue
                chain = (*shaped[read.attr], Step(f"used: {read.text}", facts.path, read.line))
                found.append(Finding(
                    "cuda_graph", "graph_inputs", qn, facts.path, read.line, chain,
                    f"{qn.rsplit('.', 1)[-1]} uses `{read.attr}`, which {runner.rsplit('.', 1)[-1]} sizes from a "
                    "speculative setting: the graphs are captured and filled at that width",
                    ctx.worker_path(qn), "blocks-runtime-switch", {"runner": base, "part_of": "capture_width"}))
                found += self._handed_width(ctx, facts, base, family, chain, handed)
        return found

    def _handed_width(self, ctx: Context, facts: FunctionFacts, runner: str, family: set[str],
                      chain: Chain, handed: set[str]) -> list[Finding]:
        """Methods of other objects the runner hands a speculative width to, at the first use."""
        cb = ctx.codebase
        found: list[Finding] = []
        for call in facts.calls:
            for key, arg_chain, _ in call.tainted_args():
                if not isinstance(key, str):
                    continue
                for target in sorted(v[1] for v in call.callees if v[0] == "func"):
                    owner = cb.owner_class(target) if target in cb.scopes else None
                    if owner is None or owner in family or target in handed:
                        continue
                    node = function_node(cb, target)
                    use = _first_use(node, key) if node is not None else None
                    if use is None:
                        continue
                    handed.add(target)
                    path = cb.scope_module[target].path
                    found.append(Finding(
                        "cuda_graph", "graph_inputs", target, path, use,
                        (*arg_chain, Step(f"{target.rsplit('.', 1)[-1]}({key}=…) ← {text_of(call.node)}",
                                          facts.path, call.line)),
                        f"{target.rsplit('.', 1)[-1]} fills the graph's inputs at the width "
                        f"{runner.rsplit('.', 1)[-1]} hands it (`{key}`)",
                        ctx.worker_path(facts.qn), "blocks-runtime-switch", {"runner": runner, "part_of": "capture_width"}))
        return found

    # -- the batch handing its draft state to the state's filter and merge --------------------
    def _state_handoffs(self, ctx: Context, earlier: list[Finding]) -> list[Finding]:
        cg = ctx.callgraph
        found: list[Finding] = []
        for rows in earlier:
            if rows.category != "draft_state" or rows.kind not in ("state_filter", "state_merge"):
                continue
            for caller in rows.detail.get("callers", []):
                for site in cg.sites(caller, rows.symbol)[:1]:
                    found.append(Finding(
                        "draft_state", "state_handoff", caller, site.path, site.lineno,
                        (*rows.evidence, Step(f"called by {caller.rsplit('.', 2)[-2]}.{caller.rsplit('.', 1)[-1]}",
                                              site.path, site.lineno)),
                        f"{caller.rsplit('.', 1)[-1]} hands the draft state to "
                        f"{rows.symbol.rsplit('.', 2)[-2]}.{rows.symbol.rsplit('.', 1)[-1]} with the batch's requests",
                        ctx.worker_path(caller), rows.severity,
                        {"class": rows.detail.get("class"), "part_of": rows.kind}))
        return found

    # -- the overlap relay's holder reading and writing the draft state -----------------------
    def _relay_state(self, ctx: Context, earlier: list[Finding]) -> list[Finding]:
        cb, cg, flow = ctx.codebase, ctx.callgraph, ctx.flow
        states = spec_state_classes(ctx)
        state_family = {m for c in states for m in flow.family(c)}
        found: dict[str, Finding] = {}
        for relay in earlier:
            if relay.kind != "overlap_relay":
                continue
            caller = relay.symbol.split(":", 1)[0]
            if caller not in cg.graph:
                continue
            callees = [c for c in cg.graph.successors(caller)
                       if any(s.lineno == relay.line for s in cg.sites(caller, c))]
            for callee in callees:
                holder = cb.owner_class(callee) if callee in cb.scopes else None
                if holder is None:
                    continue
                for qn in sorted(_within_class(ctx, callee, holder)):
                    facts = flow.functions.get(qn)
                    if qn in found:
                        continue
                    hit = (_state_touch(facts, state_family) if facts is not None and facts.analysed else None) \
                        or _state_param(ctx, qn, states)
                    if hit is None:
                        continue
                    line, text = hit
                    path = cb.scope_module[qn].path
                    found[qn] = Finding(
                        "draft_state", "relay_state", qn, path, line,
                        (*relay.evidence, Step(text, path, line)),
                        f"{qn.rsplit('.', 1)[-1]} keeps the draft state between steps for the relay "
                        f"({holder.rsplit('.', 1)[-1]}): a step without drafting must still leave what the next "
                        "step resolves",
                        relay.worker_path, "blocks-runtime-switch", {"class": holder})
        return list(found.values())

    # -- the worker's entry routing the step by the batch's mode ------------------------------
    def _step_dispatch(self, ctx: Context) -> list[Finding]:
        cb, cg = ctx.codebase, ctx.callgraph
        found: list[Finding] = []
        for worker in ctx.workers:
            entry = worker.entry
            if entry is None or entry not in cg.graph:
                continue
            node = function_node(cb, entry)
            if node is None:
                continue
            steps = {s.function for s in worker.steps}
            # A step reached directly or through one helper of the worker's own.
            lines: dict[int, set[str]] = {}
            for callee in cg.graph.successors(entry):
                reached = {callee} | (set(cg.graph.successors(callee)) if callee in cg.graph else set())
                hit = reached & steps
                for site in cg.sites(entry, callee):
                    if hit:
                        lines.setdefault(site.lineno, set()).update(hit)
            chain = selection_chain(ctx, worker) or ()
            path = cb.scope_module[entry].path
            for stmt in _own_statements(node):
                if not isinstance(stmt, ast.If) or not stmt.orelse:
                    continue
                body = _steps_in(stmt.body, lines)
                other = _steps_in(stmt.orelse, lines)
                if not body or not other or body == other:
                    continue
                test = text_of(stmt.test)
                found.append(Finding(
                    "mode_check", "step_dispatch", entry, path, stmt.lineno,
                    (*chain, Step(f"if {test}: {', '.join(sorted(s.rsplit('.', 1)[-1] for s in body))} "
                                  f"else {', '.join(sorted(s.rsplit('.', 1)[-1] for s in other))}",
                                  path, stmt.lineno)),
                    f"{entry.rsplit('.', 1)[-1]} routes the batch by its mode to different speculative steps: "
                    "where a step without drafting would be routed",
                    worker.label, "compatible", {"test": test}))
                break
        return found

    # -- the scheduler's per-batch decisions on the mode --------------------------------------
    def _mode_decisions(self, ctx: Context) -> list[Finding]:
        flow = ctx.flow
        loops = [e.function for e in ctx.spec_map.event_loops]
        found: list[Finding] = []
        for qn in sorted(ctx.near(loops, 1) - set(loops)):
            facts = flow.functions.get(qn)
            if facts is None or not facts.analysed:
                continue
            if not any(line for line, _ in facts.returns):
                continue
            decided = _mode_test(flow, facts)
            if decided is None:
                continue
            line, chain = decided
            found.append(Finding(
                "mode_check", "mode_decision", qn, facts.path, line,
                (*chain, Step(f"decided for the event loop by {qn.rsplit('.', 1)[-1]}", facts.path, line)),
                f"{qn.rsplit('.', 1)[-1]} decides for the event loop from whether speculation is on (per "
                "batch): a step gated inside the worker keeps that decision",
                ctx.worker_path(qn), "compatible", {}))
        return found

    # -- a width the scheduler keeps and hands to each step's memory check --------------------
    def _step_reservations(self, ctx: Context) -> list[Finding]:
        cb, flow = ctx.codebase, ctx.flow
        loops = [e.function for e in ctx.spec_map.event_loops]
        owners = sorted({o for loop in loops if (o := cb.owner_class(loop))})
        family = {m for o in owners for m in cb.mro(o)}
        # Its fields set from a width (not the algorithm) within a copy or two.
        widths = {(o, attr): chain for o in owners for attr, chain in flow.tainted_fields(o).items()
                  if len(chain) <= 3 and "speculative_algorithm" not in chain[0].text}
        found: list[Finding] = []
        for qn in sorted(ctx.loop_reach):
            facts = flow.functions.get(qn)
            if facts is None or not facts.analysed or facts.owner not in family:
                continue
            for call in facts.calls:
                for key, _, node in call.args:
                    if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
                        continue
                    owner = next((o for o in owners if (o, node.attr) in widths), None)
                    if owner is None:
                        continue
                    chain = widths[(owner, node.attr)]
                    handed = Step(f"handed on: {text_of(call.node)[:90]}", facts.path, call.line)
                    reason = (f"the scheduler keeps `{node.attr}` at a speculative width and hands it to each "
                              "step's memory check: a plain step reserves for speculation")
                    detail = {"class": owner, "field": node.attr}
                    found.append(Finding("buffer", "step_reservation", qn, facts.path, call.line,
                                         (*chain, handed), reason, ctx.worker_path(qn), "compatible", detail))
                    for target in sorted(v[1] for v in call.callees if v[0] == "func"):
                        param = _parameter(cb, target, key)
                        body = function_node(cb, target)
                        use = _first_use(body, param) if body is not None and param else None
                        if use is not None:
                            path = cb.scope_module[target].path
                            found.append(Finding(
                                "buffer", "step_reservation", target, path, use,
                                (*chain, handed, Step(f"used as {param}", path, use)), reason,
                                ctx.worker_path(target), "compatible", detail))
        if found:  # and where the width is kept
            for (owner, attr), chain in sorted(widths.items()):
                if any(f.detail["field"] == attr for f in found):
                    last = chain[-1]
                    writer = _function_at(ctx, last.path, last.line)
                    if writer is not None:
                        found.append(Finding("buffer", "step_reservation", writer, last.path, last.line, chain,
                                             f"{attr} is kept at a speculative width for each step's memory check",
                                             "both", "compatible", {"class": owner, "field": attr}))
        return found

    # -- the runner a worker drafts with, its pool sized by a draft flag ----------------------
    def _draft_runner_pool(self, ctx: Context) -> list[Finding]:
        cb = ctx.codebase
        flags = _draft_flags(ctx)
        found: list[Finding] = []
        for (cls, attr), chain in sorted(flags.items()):
            seen: set[str] = set()
            for member in cb.mro(cls):
                for qn in ctx.class_methods(member):
                    if qn in seen or cb.owner_class(qn) != member:
                        continue
                    seen.add(qn)
                    node = function_node(cb, qn)
                    selfname = cb.self_param(qn)
                    if node is None or not selfname:
                        continue
                    hit = _flag_sized_return(node, selfname, attr)
                    if hit is None:
                        continue
                    branch, ret = hit
                    path = cb.scope_module[qn].path
                    found.append(Finding(
                        "buffer", "draft_runner_pool", qn, path, branch.lineno,
                        (*chain, Step(f"if {text_of(branch.test)}", path, branch.lineno),
                         Step(f"return {text_of(ret.value) if ret.value else ''}", path, ret.lineno)),
                        f"{qn.rsplit('.', 1)[-1]} sizes what it returns differently for the runner a worker "
                        f"drafts with (`{attr}`): the draft's pool is sized at start-up for speculation",
                        ctx.worker_path(qn), "compatible", {"class": cls, "flag": attr}))
        return found


def _function_at(ctx: Context, path: str, line: int) -> str | None:
    """The innermost analysed function of `path` whose span holds `line`."""
    best: tuple[int, str] | None = None
    for qn, facts in ctx.flow.functions.items():
        if facts.path == path and facts.span[0] <= line <= facts.span[1]:
            width = facts.span[1] - facts.span[0]
            if best is None or width < best[0]:
                best = (width, qn)
    return best[1] if best else None


def _mode_test(flow: SpecFlow, facts: FunctionFacts) -> tuple[int, Chain] | None:
    """The first test on the algorithm a function returns or reads: its own tainted return, or a
    property it reads whose return is one (`batch.is_spec_v2`; the taint itself stops at the
    property, its chain being long)."""
    def is_mode(chain: Chain | None) -> bool:
        return chain is not None and "speculative_algorithm" in chain[0].text

    hits: list[tuple[int, Chain]] = [(line, chain) for line, chain in facts.returns if chain and is_mode(chain)]
    for read in facts.reads:
        for cls in sorted(read.classes):
            prop = flow.functions.get(f"{cls}.{read.attr}")
            chain = next((c for _, c in prop.returns if c and is_mode(c)), None) if prop and prop.analysed else None
            if chain is not None:
                hits.append((read.line, (*chain, Step(f"read: {read.text}", facts.path, read.line))))
                break
    return min(hits, key=lambda h: h[0]) if hits else None


def _parameter(cb: Codebase, function: str, key: str | int) -> str | None:
    """The parameter a keyword or (past `self`) positional argument binds."""
    names = [name for name, _ in cb.scopes[function].params] if function in cb.scopes else []
    if isinstance(key, str):
        return key if key in names else None
    if names and names[0] == cb.self_param(function):
        names = names[1:]
    return names[key] if 0 <= key < len(names) else None


def _first_use(node: ast.AST, name: str) -> int | None:
    lines = [n.lineno for n in ast.walk(node) if isinstance(n, ast.Name) and n.id == name
             and isinstance(n.ctx, ast.Load)]
    return min(lines) if lines else None


def _within_class(ctx: Context, start: str, holder: str) -> set[str]:
    """`start` and the methods of its class it calls, a few calls deep."""
    cb, cg = ctx.codebase, ctx.callgraph
    seen = {start}
    frontier = [start]
    for _ in range(_RELAY_DEPTH):
        nxt = []
        for qn in frontier:
            cg.expand(qn)
            if qn not in cg.graph:
                continue
            for callee in cg.graph.successors(qn):
                if callee not in seen and callee in cb.scopes and cb.owner_class(callee) == holder:
                    seen.add(callee)
                    nxt.append(callee)
        frontier = nxt
    return seen


def _state_touch(facts: FunctionFacts, state_family: set[str]) -> tuple[int, str] | None:
    """The first branch on the algorithm, or read or write of the draft state's fields."""
    hits: list[tuple[int, str]] = []
    for branch in facts.branches:
        if branch.chain is not None and "speculative_algorithm" in branch.chain[0].text:
            hits.append((branch.line, f"if {branch.test}"))
    for read in facts.reads:
        if read.classes & state_family:
            hits.append((read.line, f"draft state read: {read.text}"))
    for assign in facts.assigns:
        if assign.classes & state_family:
            hits.append((assign.line, f"draft state written: {assign.target}"))
    return min(hits) if hits else None


def _state_param(ctx: Context, qn: str, states: set[str]) -> tuple[int, str] | None:
    """The first use of a parameter annotated with a draft-state class (where the flow does
    not type the reads: `draft_input: EagleDraftInput` handed in by the relay's caller)."""
    names = {c.rsplit(".", 1)[-1] for c in states}
    node = function_node(ctx.codebase, qn)
    if node is None:
        return None
    for param, annotation in ctx.codebase.scopes[qn].params:
        if annotation is not None and names_in(annotation) & names:
            use = _first_use(node, param)
            if use is not None:
                return use, f"draft state handed in: {param}"
    return None


def _steps_in(body: list[ast.stmt], lines: dict[int, set[str]]) -> set[str]:
    found: set[str] = set()
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call):
                found |= lines.get(node.lineno, set())
    return found


def _draft_flags(ctx: Context) -> dict[tuple[str, str], Chain]:
    """(class, field) of a flag a worker sets with a literal True on a runner it builds, followed
    through constructor parameters passed on under the same keyword."""
    cb, cg = ctx.codebase, ctx.callgraph
    flags: dict[tuple[str, str], Chain] = {}
    pending: list[tuple[str, str, Chain]] = []  # (constructor, parameter, chain)
    for worker in ctx.workers:
        for qn in ctx.class_methods(worker.cls or ""):
            node = function_node(cb, qn)
            if node is None or qn not in cg.graph:
                continue
            path = cb.scope_module[qn].path
            for call in ast.walk(node):
                if not isinstance(call, ast.Call):
                    continue
                for kw in call.keywords:
                    if kw.arg and isinstance(kw.value, ast.Constant) and kw.value.value is True:
                        for init in _constructors_called(ctx, qn, call.lineno):
                            pending.append((init, kw.arg, (Step(
                                f"{worker.name} builds {init.rsplit('.', 2)[-2]} with {kw.arg}=True",
                                path, call.lineno),)))
    seen: set[tuple[str, str]] = set()
    scanned: set[tuple[str, str]] = set()
    while pending:
        while pending:
            init, param, chain = pending.pop()
            if (init, param) in seen or len(chain) > 4:
                continue
            seen.add((init, param))
            node = function_node(cb, init)
            cls = cb.owner_class(init)
            selfname = cb.self_param(init)
            if node is None or cls is None or not selfname:
                continue
            path = cb.scope_module[init].path
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name) and stmt.value.id == param:
                    for target in stmt.targets:
                        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                                and target.value.id == selfname:
                            flags.setdefault((cls, target.attr),
                                             (*chain, Step(text_of(stmt)[:100], path, stmt.lineno)))
                if isinstance(stmt, ast.Call):
                    pending += _passed_on(ctx, init, stmt, lambda v, p=param: isinstance(v, ast.Name) and v.id == p,
                                          chain, path)
        # A flag field handed on as `X(flag=self.flag)` by any method of its class.
        for (cls, attr), chain in list(flags.items()):
            if (cls, attr) in scanned:
                continue
            scanned.add((cls, attr))
            for qn in ctx.class_methods(cls):
                node = function_node(cb, qn)
                selfname = cb.self_param(qn)
                if node is None or not selfname:
                    continue
                path = cb.scope_module[qn].path
                for stmt in ast.walk(node):
                    if isinstance(stmt, ast.Call):
                        pending += _passed_on(
                            ctx, qn, stmt, lambda v, a=attr, s=selfname: isinstance(v, ast.Attribute)
                            and v.attr == a and isinstance(v.value, ast.Name) and v.value.id == s, chain, path)
    return flags


def _passed_on(ctx: Context, caller: str, call: ast.Call, is_flag, chain: Chain,
               path: str) -> list[tuple[str, str, Chain]]:
    """(constructor, parameter, chain) for each keyword of `call` that passes the flag on."""
    found = []
    for kw in call.keywords:
        if kw.arg and is_flag(kw.value):
            for nxt in _constructors_called(ctx, caller, call.lineno):
                found.append((nxt, kw.arg, (*chain, Step(f"passed on: {text_of(call)[:80]}", path, call.lineno))))
    return found


def _constructors_called(ctx: Context, caller: str, line: int) -> list[str]:
    cb, cg = ctx.codebase, ctx.callgraph
    cg.expand(caller)
    if caller not in cg.graph:
        return []
    return [c for c in cg.graph.successors(caller) if c in cb.scopes and (owner := cb.owner_class(c))
            and cb.constructor(owner) == c and any(s.lineno == line for s in cg.sites(caller, c))]


def _flag_sized_return(node: ast.AST, selfname: str, attr: str) -> tuple[ast.If, ast.Return] | None:
    """An `if` testing `self.<attr>` whose arm assigns a name that a `return` of the function
    depends on (through the function's own assignments)."""
    depends: dict[str, set[str]] = {}
    for stmt in ast.walk(node):
        if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            used = {n.id for n in ast.walk(stmt.value) if isinstance(n, ast.Name)}
            for target in targets:
                for name in (n.id for n in ast.walk(target) if isinstance(n, ast.Name)):
                    depends.setdefault(name, set()).update(used)
    returns = [(r, r.value) for r in ast.walk(node) if isinstance(r, ast.Return) and r.value is not None]

    def closure(names: set[str]) -> set[str]:
        seen, stack = set(), list(names)
        while stack:
            name = stack.pop()
            if name not in seen:
                seen.add(name)
                stack.extend(depends.get(name, ()))
        return seen

    for branch in (n for n in ast.walk(node) if isinstance(n, ast.If)):
        if not any(isinstance(n, ast.Attribute) and n.attr == attr and isinstance(n.value, ast.Name)
                   and n.value.id == selfname for n in ast.walk(branch.test)):
            continue
        assigned = {n.id for stmt in branch.body for s in ast.walk(stmt)
                    if isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign))
                    for t in (s.targets if isinstance(s, ast.Assign) else [s.target])
                    for n in ast.walk(t) if isinstance(n, ast.Name)}
        if not assigned:
            continue
        for ret, value in returns:
            if closure({n.id for n in ast.walk(value) if isinstance(n, ast.Name)}) & assigned:
                return branch, ret
    return None
