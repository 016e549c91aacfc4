"""CUDA-graph couplings: graph runners and the backends they drive, set up at spec shapes.

A graph runner is a class whose methods (or the methods they call on `self`) capture a
CUDA graph (`torch.cuda.graph`, `torch.cuda.CUDAGraph`). In its set-up phase (`__init__`
and what it calls on `self`) this detector reports:

- `capture_mode`: an assignment made only under a speculative condition (the target
  runner switching its capture mode to TARGET_VERIFY when speculation is on);
- `capture_width`: an attribute set from a speculative value (tokens per request,
  capture batch sizes, the draft runners' fixed widths);
- `capture_setup`: a call that hands spec-derived sizes to a collaborator
  (`attn_backend.init_cuda_graph_state(max_bs, max_num_token)`);
- `backend_width`: a class the runner calls into (an attention backend) that keeps a
  speculative width from its own set-up.

It does not report tensor allocations (the buffer detector does) or replay-time code.
"""

from __future__ import annotations

from typing import ClassVar

from eaglegate.analyzer.couplings.buffer import is_allocation
from eaglegate.analyzer.couplings.dataflow import frames_chain, text_of
from eaglegate.analyzer.couplings.model import Finding, Step
from eaglegate.analyzer.couplings.registry import Context
from eaglegate.analyzer.step_calls import capturing_functions


def graph_runners(ctx: Context) -> dict[str, str]:
    """Graph-runner classes (those whose methods capture a CUDA graph), cached in scratch."""
    cached = ctx.scratch.get("graph_runners")
    if isinstance(cached, dict):
        return cached
    cb = ctx.codebase
    functions = capturing_functions(cb)
    capturing = {owner for qn in functions if (owner := cb.owner_class(qn)) is not None}
    # A runner may hand the capture to a backend object (`self.backend.capture(…)`): the
    # classes that call a capturing method directly are runners too.
    graph = ctx.callgraph.graph
    for qn in functions:
        if qn in graph:
            for caller in graph.predecessors(qn):
                owner = cb.owner_class(caller) if caller in cb.scopes else None
                if owner is not None:
                    capturing.add(owner)
    runners: dict[str, str] = {}
    for cls in capturing:
        for member in sorted({cls} | cb.subclasses(cls)):
            runners[member] = "draft"
    ctx.scratch["graph_runners"] = runners
    return runners


class CudaGraphDetector:
    CATEGORY: ClassVar[str] = "cuda_graph"
    DESCRIPTION: ClassVar[str] = "CUDA-graph runners and backends set up at speculative shapes or modes"
    REQUIRES: ClassVar[tuple[str, ...]] = ("flow", "callgraph")

    def find(self, ctx: Context) -> list[Finding]:
        flow, cb = ctx.flow, ctx.codebase
        runners = graph_runners(ctx)
        findings: list[Finding] = []
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
                        findings.append(Finding(
                            self.CATEGORY, "capture_mode", f"{runner}.{assign.attr}", facts.path, assign.line,
                            (*chain, Step(f"if {test}", facts.path, frame.line),
                             Step(target, facts.path, assign.line)),
                            f"`{assign.attr}` of graph runner {runner.rsplit('.', 1)[-1]} is chosen by whether "
                            "speculation is on; graphs are captured only in that mode, so a plain decode "
                            "batch cannot replay them",
                            where, "blocks-runtime-switch", {"runner": runner, "attribute": assign.attr,
                                                             "condition": test, "negated": frame.negated}))
                for call in facts.calls:
                    internal = [v[1] for v in sorted(call.callees) if v[0] == "func"
                                and (cb.owner_class(v[1]) or "") not in family]
                    tainted = call.tainted_args()
                    if not internal or not tainted:
                        continue
                    key, chain, node = tainted[0]
                    # One finding per function the call may reach (`self.backend.init_…()` on
                    # whichever backend was built): a launch keeps the ones whose code it runs.
                    for callee in internal:
                        findings.append(Finding(
                            self.CATEGORY, "capture_setup", callee, facts.path, call.line,
                            (*chain, Step(text_of(call.node), facts.path, call.line)),
                            f"graph runner {runner.rsplit('.', 1)[-1]} sizes {callee.rsplit('.', 1)[-1]} "
                            "from a speculative value while capturing",
                            where, "blocks-runtime-switch", {"runner": runner}))
            if found_mode:
                runners[runner] = "target"
        findings += self._backends(ctx, runners)
        for finding in findings:
            built = finding.detail.get("runner")
            if built:
                finding.detail["role"] = runners.get(built, "backend")
        return findings

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
