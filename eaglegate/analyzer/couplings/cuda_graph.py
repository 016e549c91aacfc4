"""CUDA-graph couplings: graph runners and the backends they drive, set up at spec shapes.

A graph runner is a class whose methods (or the methods they call on `self`) capture a
CUDA graph (`torch.cuda.graph`, `torch.cuda.CUDAGraph`). In its set-up phase (`__init__`
and what it calls on `self`) this detector reports:

- `capture_mode`: an assignment made only under a speculative condition (the target
  runner switching its capture mode to TARGET_VERIFY when speculation is on);
- `capture_width`: an attribute set from a speculative value (tokens per request,
  capture batch sizes, the draft runners' fixed widths);
- `capture_setup`: a call that hands spec-derived sizes to a collaborator
  (`attn_backend.init_cuda_graph_state(max_bs, max_num_token)`), or takes them from one
  that computes them from a speculative setting itself;
- `backend_width`: a class the runner calls into (an attention backend) that keeps a
  speculative width from its own set-up;
- `graph_mode` (a site of the runner's `capture_mode` mechanism): a predicate of the mode
  the runner captures in (`ForwardMode.is_cuda_graph`) that admits that speculative mode
  together with plain ones, where a function deciding to replay the runner's graphs calls
  it: a plain batch passes the same check the verify batches the graphs were captured for
  pass.

It does not report tensor allocations (the buffer detector does) or replay-time code.
"""

from __future__ import annotations

import ast
from typing import ClassVar

from eaglegate.analyzer.couplings.buffer import is_allocation
from eaglegate.analyzer.couplings.context import Context, graph_runners
from eaglegate.analyzer.couplings.dataflow import frames_chain, text_of
from eaglegate.analyzer.couplings.model import Finding, Step
from eaglegate.analyzer.summary import expr_ir


class CudaGraphDetector:
    CATEGORY: ClassVar[str] = "cuda_graph"
    DESCRIPTION: ClassVar[str] = "CUDA-graph runners and backends set up at speculative shapes or modes"
    REQUIRES: ClassVar[tuple[str, ...]] = ("flow", "callgraph")

    def find(self, ctx: Context) -> list[Finding]:
        flow, cb = ctx.flow, ctx.codebase
        runners = graph_runners(ctx)
        findings: list[Finding] = []
        modes: list[tuple[str, str, Finding]] = []  # (mode class, member, its capture_mode finding)
        for runner in sorted(runners):
            family = set(cb.mro(runner)) | cb.subclasses(runner)
            # Each runner answers for the set-up methods it defines itself (a subclass
            # inherits its base's findings, it does not repeat them).
            setup = sorted(q for q in flow._setup_methods(runner) if q in flow.functions
                           and flow.functions[q].analysed and flow.functions[q].owner == runner)
            found_mode = False
            for qn in setup:
                facts = flow.functions[qn]
                where = ctx.worker_path(qn)
                for assign in facts.assigns:
                    if not assign.attr or not (assign.classes & family):
                        continue
                    if assign.value is not None and is_allocation(assign.value):
                        continue  # the buffer detector's
                    target = f"{assign.target} = {text_of(assign.value) if assign.value is not None else ''}"
                    if assign.chain is not None:
                        findings.append(Finding(
                            self.CATEGORY, "capture_width", f"{runner}.{assign.attr}", facts.path, assign.line,
                            (*assign.chain, Step(target, facts.path, assign.line)),
                            f"graph runner {runner.rsplit('.', 1)[-1]} fixes `{assign.attr}` from a speculative "
                            "setting at capture time; the captured graphs replay only at that width",
                            where, "blocks-runtime-switch", {"runner": runner, "attribute": assign.attr}))
                        continue
                    guard = frames_chain(assign.cond)
                    if guard is not None:
                        frame, chain = guard
                        found_mode = True
                        test = f"not ({frame.text})" if frame.negated else frame.text
                        mode = Finding(
                            self.CATEGORY, "capture_mode", f"{runner}.{assign.attr}", facts.path, assign.line,
                            (*chain, Step(f"if {test}", facts.path, frame.line),
                             Step(target, facts.path, assign.line)),
                            f"`{assign.attr}` of graph runner {runner.rsplit('.', 1)[-1]} is chosen by whether "
                            "speculation is on; graphs are captured only in that mode, so a plain decode "
                            "batch cannot replay them",
                            where, "blocks-runtime-switch", {"runner": runner, "attribute": assign.attr,
                                                             "condition": test, "negated": frame.negated})
                        findings.append(mode)
                        # The mode chosen when speculation is on (`ForwardMode.TARGET_VERIFY`).
                        value = assign.value
                        if not frame.negated and isinstance(value, ast.Attribute):
                            base = expr_ir(value.value)
                            for v in sorted(cb.values(base, qn)) if base is not None else ():
                                if v[0] == "class":
                                    modes.append((v[1], value.attr, mode))
                for call in facts.calls:
                    internal = [v[1] for v in sorted(call.callees) if v[0] == "func"
                                and (cb.owner_class(v[1]) or "") not in family]
                    tainted = call.tainted_args()
                    if not internal:
                        continue
                    if tainted:
                        chain = tainted[0][1]
                        # One finding per function the call may reach (`self.backend.init_…()`
                        # on whichever backend was built): a launch keeps the ones it runs.
                        for callee in internal:
                            findings.append(Finding(
                                self.CATEGORY, "capture_setup", callee, facts.path, call.line,
                                (*chain, Step(text_of(call.node), facts.path, call.line)),
                                f"graph runner {runner.rsplit('.', 1)[-1]} sizes {callee.rsplit('.', 1)[-1]} "
                                "from a speculative value while capturing",
                                where, "blocks-runtime-switch", {"runner": runner}))
                        continue
                    # No speculative argument, a speculative result: the callee computes the
                    # runner's sizes from a setting itself (capture sizes that speculation
                    # chose), part of the runner's capture width.
                    for callee in internal:
                        returned = flow.ret_taint.get(callee)
                        if returned is None or flow.returns_self(callee):
                            continue
                        # A result tainted through a parameter another caller filled says
                        # nothing of this call, which passes nothing speculative.
                        bindings = {chain[-1] for chain in flow.param_taint.get(callee, {}).values()}
                        if bindings & set(returned):
                            continue
                        findings.append(Finding(
                            self.CATEGORY, "capture_setup", callee, facts.path, call.line,
                            (*returned, Step(text_of(call.node), facts.path, call.line)),
                            f"graph runner {runner.rsplit('.', 1)[-1]} takes its sizes from "
                            f"{callee.rsplit('.', 1)[-1]}, which computes them from a speculative setting",
                            where, "blocks-runtime-switch", {"runner": runner, "part_of": "capture_width"}))
            if found_mode:
                runners[runner] = "target"
        findings += self._backends(ctx, runners)
        findings += self._mode_predicates(ctx, runners, modes)
        for finding in findings:
            built = finding.detail.get("runner")
            if built:
                finding.detail["role"] = runners.get(built, "backend")
        return findings

    def _mode_predicates(self, ctx: Context, runners: dict[str, str],
                         modes: list[tuple[str, str, Finding]]) -> list[Finding]:
        """`graph_mode`: methods of a speculative capture mode's class that compare `self`
        with that mode and with others (`return self == DECODE or self == TARGET_VERIFY …`),
        called by a function that also calls into a graph runner (the model runner's
        `mode_check() and graph_runner.can_run(…)` before `replay`)."""
        cb, cg = ctx.codebase, ctx.callgraph
        findings: list[Finding] = []
        seen: set[tuple[str, str]] = set()
        for cls, member, mode in modes:
            for qn in sorted(q for q in cb.scopes if cb.owner_class(q) == cls and cb.scopes[q].kind == "function"):
                if (qn, member) in seen or qn not in cg.graph:
                    continue
                admitted = self._compared(ctx, qn, cls)
                if member not in admitted or len(admitted) < 2:
                    continue  # the mode's own test (`is_target_verify`), or no mode test at all
                gates = [(caller, line) for caller in sorted(cg.graph.predecessors(qn)) if caller in cb.scopes
                         and (line := self._gated_replay(ctx, caller, qn, runners)) is not None]
                if not gates:
                    continue
                seen.add((qn, member))
                gate, gated = gates[0]
                path, line = cb.scope_module[qn].path, admitted[member]
                short = f"{cls.rsplit('.', 1)[-1]}.{qn.rsplit('.', 1)[-1]}"
                others = sorted(m for m in admitted if m != member)
                findings.append(Finding(
                    self.CATEGORY, "graph_mode", qn, path, line,
                    (*mode.evidence, Step(f"{short}() holds for {member} and for {', '.join(others)}", path, line),
                     Step(f"{gate.rsplit('.', 2)[-2]}.{gate.rsplit('.', 1)[-1]} calls the graph runner "
                          f"where {short}() holds", cb.scope_module[gate].path, gated)),
                    f"`{short}` admits {member}, the mode the graphs are captured in only under speculation, "
                    f"and plain {', '.join(others)}: a plain batch passes the check that sends a batch "
                    "to the captured graphs",
                    ctx.worker_path(gate), "blocks-runtime-switch",
                    {"runner": mode.detail["runner"], "part_of": "capture_mode", "mode": member,
                     "admits": sorted(admitted), "gates": [g for g, _ in gates]}))
        return findings

    @staticmethod
    def _gated_replay(ctx: Context, caller: str, predicate: str, runners: dict[str, str]) -> int | None:
        """The line of a call into a graph runner (`self.graph_runner.replay(…)`) that
        `caller` makes only where `predicate` held: inside an `if` whose test calls it, or
        reads a local assigned from such a call (`can_run_graph = mode_check() and …`)."""
        flow, cb = ctx.flow, ctx.codebase
        if caller not in flow.functions:
            flow.load(cb.scope_module[caller].name)
        facts = flow.functions.get(caller)
        if facts is None:
            return None

        def resolves(node: ast.expr, wanted) -> bool:
            ir = expr_ir(node)
            return ir is not None and any(wanted(v) for v in cb.values(ir, caller))

        def asks(node: ast.AST, names: set[str]) -> bool:
            return any(isinstance(n, ast.Call) and resolves(n.func, lambda v: v == ("func", predicate))
                       or isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))

        body = flow.node(facts)
        names: set[str] = set()
        for node in ast.walk(body):
            if isinstance(node, ast.Assign) and asks(node.value, set()):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        # A runner's method, or a base's that a runner derives (a model runner that types its
        # graph runner as the base class: `self.decode_cuda_graph_runner.execute(…)` on a
        # `BaseRunner`, which dispatches to the capturing subclass).
        dispatches: dict[str, bool] = {}

        def into_runner(v) -> bool:
            if v[0] != "func":
                return False
            owner = cb.owner_class(v[1])
            if owner is None:
                return False
            if owner not in dispatches:
                dispatches[owner] = owner in runners or any(sub in runners for sub in cb.subclasses(owner))
            return dispatches[owner]

        for node in ast.walk(body):
            if isinstance(node, ast.If) and asks(node.test, names):
                for inner in (n for stmt in node.body for n in ast.walk(stmt)):
                    if isinstance(inner, ast.Call) and resolves(inner.func, into_runner):
                        return inner.lineno
        return None

    @staticmethod
    def _compared(ctx: Context, qn: str, cls: str) -> dict[str, int]:
        """Members of `cls` the method's returns compare `self` with (`self == Cls.X`,
        `self in (Cls.X, …)`), each with its line."""
        flow, cb = ctx.flow, ctx.codebase
        selfname = cb.self_param(qn)
        if qn not in flow.functions:
            flow.load(cb.scope_module[qn].name)
        facts = flow.functions.get(qn)
        if facts is None or not selfname:
            return {}
        found: dict[str, int] = {}

        def member(node: ast.expr) -> str | None:
            if isinstance(node, ast.Attribute):
                base = expr_ir(node.value)
                if base is not None and ("class", cls) in cb.values(base, qn):
                    return node.attr
            return None

        for ret in ast.walk(flow.node(facts)):
            if not isinstance(ret, ast.Return) or ret.value is None:
                continue
            for node in ast.walk(ret.value):
                if not isinstance(node, ast.Compare) or len(node.ops) != 1:
                    continue
                left, right = node.left, node.comparators[0]
                if isinstance(node.ops[0], ast.Eq):
                    sides = [right] if isinstance(left, ast.Name) and left.id == selfname else \
                        [left] if isinstance(right, ast.Name) and right.id == selfname else []
                elif isinstance(node.ops[0], ast.In) and isinstance(left, ast.Name) and left.id == selfname \
                        and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
                    sides = list(right.elts)
                else:
                    sides = []
                for side in sides:
                    name = member(side)
                    if name is not None:
                        found.setdefault(name, side.lineno)
        return found

    def _backends(self, ctx: Context, runners: dict[str, str]) -> list[Finding]:
        """Classes the runners call into that keep a speculative width from their own set-up."""
        flow, cb, cg = ctx.flow, ctx.codebase, ctx.callgraph
        collaborators: set[str] = set()
        for runner in runners:
            for qn in flow._setup_methods(runner):
                cg.expand(qn)
                if qn not in cg.graph:
                    continue
                for callee in cg.graph.successors(qn):
                    owner = cb.owner_class(callee) if callee in cb.scopes else None
                    if owner and owner not in runners and not any(owner == w.cls for w in ctx.workers):
                        collaborators.add(owner)
                        collaborators |= cb.subclasses(owner)
        # Not collaborators: the settings, and the classes that build runners (they own them).
        owners: set[str] = set(ctx.settings_classes)
        for runner in runners:
            init = cb.constructor(runner)
            if init and init in cg.graph:
                owners |= {cb.owner_class(p) or "" for p in cg.graph.predecessors(init) if p in cb.scopes}
        collaborators -= owners
        findings: list[Finding] = []
        seen: set[tuple[str, str]] = set()
        for (cls, attr), chain in sorted(flow.attr_taint.items()):
            if cls not in collaborators or (cls, attr) in seen:
                continue
            # Its own width, not a class attribute another class assigns
            # (`EagleDraftInput.ALLOC_LEN_PER_DECODE = …` in a worker's `__init__`).
            family = set(flow.family(cls))
            writers = flow.class_attr_writers.get((cls, attr), set())
            if writers and not any(cb.owner_class(qn) in family for qn in writers):
                continue
            last = chain[-1]
            seen.add((cls, attr))
            findings.append(Finding(
                self.CATEGORY, "backend_width", f"{cls}.{attr}", last.path, last.line, chain,
                f"{cls.rsplit('.', 1)[-1]}, driven by a graph runner, keeps `{attr}` from a speculative "
                "setting; its captured metadata assumes that width",
                ctx.worker_path(_first_function(ctx, cls)), "blocks-runtime-switch", {"class": cls, "attribute": attr}))
        return findings


def _first_function(ctx: Context, cls: str) -> str:
    init = ctx.codebase.constructor(cls)
    return init or cls
