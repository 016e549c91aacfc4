"""Couplings inside the steps: the work each speculative step does at the speculative width.

The other detectors look at what the server sets up; these rules look at what runs on
every step, from the same data flow (taint from the speculative settings):

- `step_alloc` (buffer): a run-time allocation (the question's KV-allocation verb, or a
  torch allocator) whose size carries a speculative width: the draft step reserving
  steps × topk slots per request, v2's decode preparation over-allocating for the next
  draft. A plain step needs one slot per request, so it fits (`compatible`), but a gate
  must not pay for the speculative reservation.
- `alloc_len` (buffer): the run-time helpers those sizes come from: a function on the
  spec path that reads a speculative width itself and returns a value computed from it
  (the per-decode allocation length, the batch's next-decode token requirement).
- `runner_build` (cuda_graph): where a graph runner whose set-up is spec-shaped is
  constructed (the workers' graph initialisation), and `graph_capture`: the runner's own
  capturing method. Both are sites of the runner's mechanism (`detail["runner"]`).
- `state_class` / `state_prepare` (draft_state): the per-batch speculative state class
  itself, and its methods the worker's steps call to prepare the next forward (extend
  after decode, v2's draft, verify and fill-draft-KV preparations): state only
  speculation keeps, which a step without drafting leaves stale.
- `state_assert` (mode_check): asserts at run time on an object of the speculative state
  (`assert isinstance(spec_info, …)`, `assert forward_batch.spec_info is not None`) and
  asserts or branches on the mode in the functions the overlap relay's result passes
  through: they fail, or take the other arm, on a step without drafting.
"""

from __future__ import annotations

import ast
import re
from typing import ClassVar

from eaglegate.analyzer.couplings.buffer import is_allocation
from eaglegate.analyzer.couplings.context import Context, graph_runners, names_in
from eaglegate.analyzer.couplings.dataflow import frames_chain, is_source_attr, text_of
from eaglegate.analyzer.couplings.model import Chain, Finding, Step
from eaglegate.analyzer.couplings.spec_path import _own_statements
from eaglegate.analyzer.spec_map import Question
from eaglegate.analyzer.step_calls import function_node
from eaglegate.analyzer.summary import expr_ir

_SETTING = re.compile(r"speculative_\w+")
_STEP_DEPTH = 2
_LOOP_DEPTH = 4  # as the mode-check detector reads the scheduler's paths

def width_settings(ctx: Context) -> frozenset[str]:
    """The speculative settings that are counts (declared `int`): the steps, the top-k, the
    draft tokens. The others (the algorithm, the attention mode) choose a mode, not a size."""
    cached = ctx.scratch.get("width_settings")
    if isinstance(cached, frozenset):
        return cached
    cb = ctx.codebase
    found = frozenset(
        assign.target[1] for cls in sorted(ctx.settings_classes) for assign in cb.scopes[cls].assigns
        if assign.target and assign.target[0] == "n" and is_source_attr(str(assign.target[1]))
        and assign.annotation is not None and "int" in names_in(assign.annotation))
    ctx.scratch["width_settings"] = found
    return found


def is_width(ctx: Context, chain: Chain) -> bool:
    """Whether the chain starts from a count setting."""
    match = _SETTING.search(chain[0].text)
    return match is not None and match.group(0) in width_settings(ctx)


def run_time(ctx: Context) -> set[str]:
    """Functions that run on every step: reached from the event loops or a worker's methods,
    and not part of a class's set-up."""
    cached = ctx.scratch.get("run_time")
    if isinstance(cached, set):
        return cached
    reached = set(ctx.loop_reach)
    for reach in ctx.worker_reach.values():
        reached |= reach
    flow = ctx.flow
    found = {qn for qn in reached if qn in flow.functions and flow.functions[qn].analysed
             and not flow.is_setup(qn)}
    ctx.scratch["run_time"] = found
    return found


def state_classes(ctx: Context) -> dict[str, tuple[Chain, list[tuple[str, str, str]]]]:
    """Classes of the worker's package (not the worker's own, not graph runners) whose methods
    the worker's steps call and whose fields carry a speculative value: the per-batch
    speculative state (draft input, verify input and their mixins). For each: the evidence
    chain of its fields and the (worker, step function, method) calls into it."""
    cached = ctx.scratch.get("state_classes")
    if isinstance(cached, dict):
        return cached
    cb, graph = ctx.codebase, ctx.callgraph.graph
    runners = graph_runners(ctx)
    calls: dict[str, set[tuple[str, str, str]]] = {}
    for worker in ctx.workers:
        package = (worker.cls or "").rsplit(".", 2)[0] + "."
        family = set(cb.mro(worker.cls or ""))
        # The classes that own a step (v2's draft worker) and those the worker builds in its
        # set-up (its model runner) are the worker's collaborators, not per-batch state.
        family |= {cb.owner_class(s.function) or "" for s in worker.steps}
        for setup in ctx.flow._setup_methods(worker.cls or ""):
            if setup in graph:
                family |= {cb.owner_class(c) or "" for c in graph.successors(setup) if c.endswith(".__init__")}
        steps = ctx.step_functions(worker, ("draft", "verify", "draft_extend"), depth=2)
        if worker.entry:
            steps |= ctx.near([worker.entry], 1)
        for caller in sorted(steps):
            if caller not in graph or not caller.startswith(package):
                continue
            for method in graph.successors(caller):
                owner = cb.owner_class(method) if method in cb.scopes else None
                if owner is None or not owner.startswith(package) or owner in family or owner in runners \
                        or cb.owner_class(caller) == owner or method.rsplit(".", 1)[-1].startswith("__") \
                        or not cb.scopes[method].calls:  # a getter prepares nothing
                    continue
                calls.setdefault(owner, set()).add((worker.label, caller, method))
    found: dict[str, tuple[Chain, list[tuple[str, str, str]]]] = {}
    for cls, sites in calls.items():
        chain = _state_chain(ctx, cls)
        if chain is not None:
            found[cls] = (chain, sorted(sites))
            for module in {cb.scope_module[cls].name, *(cb.scope_module[m].name for _, _, m in sites)}:
                ctx.flow.load(module)  # the report names what it read
    ctx.scratch["state_classes"] = found
    return found


def _state_chain(ctx: Context, cls: str) -> Chain | None:
    """The shortest evidence that a field of the class (or a relative) holds a speculative value."""
    from eaglegate.analyzer.couplings.draft_state import DraftStateDetector

    flow = ctx.flow
    members = set(flow.family(cls))
    best: Chain | None = None
    for (owner, attr), sites in sorted(flow.attr_writes.items()):
        if owner not in members:
            continue
        chain = DraftStateDetector()._chain(ctx, owner, attr, sorted(sites))
        if chain is not None and (best is None or len(chain) < len(best)):
            best = chain
    return best


class StepWorkDetector:
    CATEGORY: ClassVar[str] = "buffer"
    DESCRIPTION: ClassVar[str] = ("run-time allocations, graph builds, state preparation and asserts "
                                  "at the speculative width")
    REQUIRES: ClassVar[tuple[str, ...]] = ("flow", "spec_map", "callgraph", "graph_runners")

    def find(self, ctx: Context) -> list[Finding]:
        return [*self._allocations(ctx), *self._runner_builds(ctx), *self._state(ctx), *self._state_asserts(ctx)]

    # -- allocations at the speculative width, each step -------------------------------------
    def _allocations(self, ctx: Context) -> list[Finding]:
        flow = ctx.flow
        verb = re.compile(Question().kv_alloc)
        # Tensors allocated by the steps themselves and the state they prepare; KV slots
        # wherever the run-time path reserves them.
        steps: set[str] = set()
        for worker in ctx.workers:
            roots = ([worker.entry] if worker.entry else []) + [s.function for s in worker.steps]
            steps |= ctx.near(roots, _STEP_DEPTH)
        for _, calls in state_classes(ctx).values():
            steps |= {method for _, _, method in calls}
        findings: list[Finding] = []
        for qn in sorted(run_time(ctx)):
            facts = flow.functions[qn]
            if verb.search(qn.rsplit(".", 1)[-1]):
                continue  # an allocator itself: its callers say what they reserve
            for call in facts.calls:
                name = call.func.rsplit(".", 1)[-1]
                if not (verb.search(name) or (qn in steps and is_allocation(call.node))):
                    continue
                tainted = [c for _, c, _ in call.tainted_args() if is_width(ctx, c)]
                if not tainted:
                    continue
                chain = min(tainted, key=len)
                findings.append(Finding(
                    "buffer", "step_alloc", qn, facts.path, call.line,
                    (*chain, Step(text_of(call.node), facts.path, call.line)),
                    f"{qn.rsplit('.', 1)[-1]} reserves memory each step at a size computed from the speculative "
                    "width; a plain step needs one slot per request, so it fits, but pays the speculative "
                    "reservation unless the size follows the gate",
                    ctx.worker_path(qn), "compatible", {"allocator": call.func}))
            returned = flow.ret_taint.get(qn)
            if returned is None or not is_width(ctx, returned):
                continue
            # A helper reads the settings object itself and returns a size computed from it.
            if any(read.line == returned[0].line and read.classes & ctx.settings_classes for read in facts.reads):
                findings.append(Finding(
                    "buffer", "alloc_len", qn, facts.path, returned[0].line, returned,
                    f"{qn.rsplit('.', 1)[-1]} computes a per-step size from the speculative settings it reads "
                    "itself; whoever sizes a step from it reserves for speculation",
                    ctx.worker_path(qn), "compatible", {}))
        return findings

    # -- graph runners built and captured at the speculative width ---------------------------
    def _runner_builds(self, ctx: Context) -> list[Finding]:
        from eaglegate.analyzer.step_calls import capturing_functions

        flow, cb = ctx.flow, ctx.codebase
        runners = graph_runners(ctx)
        shaped: dict[str, Chain] = {}
        for runner in sorted(runners):
            chain = min(flow.tainted_fields(runner).values(), key=len, default=None)
            if chain is not None:
                shaped[runner] = chain
        findings: list[Finding] = []
        for qn, facts in sorted(flow.functions.items()):
            if not facts.analysed:
                continue
            for call in facts.calls:
                built = sorted(v[1] for v in call.callees if v[0] == "class" and v[1] in shaped)
                if not built:
                    continue
                # One of a family (`{"npu": NPUGraphRunner}` or the CudaGraphRunner it
                # derives from): the mechanism is the family's, named by its base.
                runner = next((r for r in built if not any(b != r and b in cb.mro(r) for b in built)), built[0])
                findings.append(Finding(
                    "cuda_graph", "runner_build", qn, facts.path, call.line,
                    (*shaped[runner], Step(f"built: {text_of(call.node)}", facts.path, call.line)),
                    f"{qn.rsplit('.', 1)[-1]} builds {runner.rsplit('.', 1)[-1]}, which captures its graphs at "
                    "the speculative width",
                    ctx.worker_path(qn), "blocks-runtime-switch",
                    # A registry call (`{"cuda": A, "npu": B}[device](self)`) builds one of several.
                    # `sized_by`: the arguments that carry a speculative value, or that are
                    # passed by a setting's name (an adaptive tier's `speculative_num_steps=`:
                    # one runner per tier).
                    {"runner": runner, "runners": built, "part_of": _runner_kind(runners, runner),
                     "sized_by": sorted({str(k) for k, chain, _ in call.args
                                         if chain is not None or isinstance(k, str) and is_source_attr(k)})}))
        for qn in sorted(capturing_functions(cb)):
            capturer = cb.owner_class(qn)
            if capturer is None or capturer not in shaped or qn not in flow.functions:
                continue
            facts = flow.functions[qn]
            findings.append(Finding(
                "cuda_graph", "graph_capture", qn, facts.path, facts.span[0],
                (*shaped[capturer], Step(f"captured by {qn.rsplit('.', 1)[-1]}", facts.path, facts.span[0])),
                f"{capturer.rsplit('.', 1)[-1]}.{qn.rsplit('.', 1)[-1]} captures CUDA graphs at shapes fixed from "
                "a speculative setting",
                ctx.worker_path(qn), "blocks-runtime-switch", {"runner": capturer, "part_of": _runner_kind(runners, capturer)}))
        return findings

    # -- the speculative state and its preparations -------------------------------------------
    def _state(self, ctx: Context) -> list[Finding]:
        cb = ctx.codebase
        findings: list[Finding] = []
        for cls, (chain, calls) in sorted(state_classes(ctx).items()):
            module = cb.scope_module[cls]
            line = cb.scopes[cls].lineno
            labels = sorted({label for label, _, _ in calls})
            findings.append(Finding(
                "draft_state", "state_class", cls, module.path, line,
                (*chain, Step(f"state class {cls.rsplit('.', 1)[-1]}", module.path, line)),
                f"{cls.rsplit('.', 1)[-1]} holds per-batch state that only speculative steps write; a step "
                "without drafting leaves it describing an older token",
                labels[0] if len(labels) == 1 else "both", "degrades-acceptance", {"class": cls}))
            for label, caller, method in calls:
                site = ctx.callgraph.sites(caller, method)[0]
                path, start = cb.scope_module[method].path, cb.scopes[method].lineno
                findings.append(Finding(
                    "draft_state", "state_prepare", method, path, start,
                    (*chain, Step(f"called by the step {caller.rsplit('.', 2)[-2]}.{caller.rsplit('.', 1)[-1]}",
                                  site.path, site.lineno),
                     Step(f"def {method.rsplit('.', 1)[-1]}", path, start)),
                    f"{label}'s steps prepare the next forward through {cls.rsplit('.', 1)[-1]}."
                    f"{method.rsplit('.', 1)[-1]} from speculative state; a step without drafting must "
                    "prepare its own (or keep this state in step)",
                    label, "degrades-acceptance", {"class": cls, "caller": caller}))
        return _merge_workers(findings)

    # -- asserts on the speculative state, and in what runs only under a mode test -------------
    def _state_asserts(self, ctx: Context) -> list[Finding]:
        flow, cb = ctx.flow, ctx.codebase
        states = state_classes(ctx)
        family = {m for cls in states for m in cb.mro(cls)}
        chains = [chain for chain, _ in states.values()]
        if not chains:
            return []
        chain = min(chains, key=len)
        names = {cls.rsplit(".", 1)[-1] for cls in family}
        # The spec path's modules that the data flow read (reached code, and code the call
        # graph does not reach, such as an attention backend's updater stored on `self`).
        modules = sorted(m for m in flow.loaded if any(name in flow._text(m) for name in names))
        findings: list[Finding] = []
        for qn in (f"{m}.{q}" for m in modules for q, sc in cb.modules[m].scopes.items() if sc.kind == "function"):
            if cb.owner_class(qn) in family:
                continue
            node = function_node(cb, qn)
            if node is None:
                continue
            path = cb.scope_module[qn].path
            for stmt in _own_statements(node):
                if not isinstance(stmt, ast.Assert) or not self._on_state(flow, qn, stmt.test, family, names):
                    continue
                test = text_of(stmt.test)
                findings.append(Finding(
                    "mode_check", "state_assert", qn, path, stmt.lineno,
                    (*chain, Step(f"assert {test}", path, stmt.lineno)),
                    f"{qn.rsplit('.', 1)[-1]} asserts on the speculative state at run time (`{test}`): a batch "
                    "without drafting carries none, and fails it",
                    ctx.worker_path(qn), "blocks-runtime-switch", {"test": test, "part_of": "path_assert"}))
        return findings + self._guarded_asserts(ctx)

    def _guarded_asserts(self, ctx: Context) -> list[Finding]:
        """Asserts in functions the scheduler calls only under a test on the mode (`elif
        batch.is_spec_v2: self._resolve_spec_overlap_token_ids(…)`): they hold for speculative
        results only, and a step without drafting still takes that branch."""
        flow, cb = ctx.flow, ctx.codebase
        loops = [e.function for e in ctx.spec_map.event_loops]
        findings: list[Finding] = []
        seen: set[str] = set()
        for qn in sorted(ctx.near(loops, _LOOP_DEPTH)):
            facts = flow.functions.get(qn)
            if facts is None or not facts.analysed:
                continue
            for call in facts.calls:
                guard = frames_chain(call.cond)
                if guard is None or "speculative_algorithm" not in guard[1][0].text:
                    continue
                frame, chain = guard
                # The caller's own helpers (`self._resolve…()` under `elif batch.is_spec_v2`):
                # shared utilities called under a mode test elsewhere are not the spec path's.
                own = [v[1] for v in call.callees if v[0] == "func" and v[1] in cb.scopes
                       and cb.owner_class(v[1]) == facts.owner
                       and cb.scope_module[v[1]].name == facts.module if facts.owner is None
                       or v[0] == "func" and v[1] in cb.scopes and cb.owner_class(v[1]) == facts.owner]
                for callee in sorted(own):
                    node = function_node(cb, callee)
                    if node is None or callee in seen:
                        continue
                    seen.add(callee)
                    flow.load(cb.scope_module[callee].name)  # the report names what it read
                    path = cb.scope_module[callee].path
                    test = f"not ({frame.text})" if frame.negated else frame.text
                    for stmt in _own_statements(node):
                        if isinstance(stmt, ast.Assert):
                            findings.append(Finding(
                                "mode_check", "guarded_assert", callee, path, stmt.lineno,
                                (*chain, Step(f"if {test}", facts.path, frame.line),
                                 Step(f"calls {callee.rsplit('.', 1)[-1]}", facts.path, call.line),
                                 Step(f"assert {text_of(stmt.test)}", path, stmt.lineno)),
                                f"{callee.rsplit('.', 1)[-1]} runs only under a speculative test and asserts "
                                f"`{text_of(stmt.test)}` of a speculative result: a step without drafting that "
                                "takes the branch must still satisfy it",
                                ctx.worker_path(callee), "blocks-runtime-switch",
                                {"test": text_of(stmt.test), "part_of": "path_assert"}))
        return findings

    @staticmethod
    def _on_state(flow, qn: str, test: ast.expr, family: set[str], names: set[str]) -> bool:
        """The test checks an object of the speculative state: an isinstance against one of its
        classes, or an expression the index resolves to an instance of one."""
        for node in ast.walk(test):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" \
                    and len(node.args) == 2:
                kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                if any(isinstance(k, ast.Name) and k.id in names for k in kinds):
                    return True
            if isinstance(node, ast.Attribute):
                ir = expr_ir(node)
                if ir is not None and flow.instances(ir, qn) & family:
                    return True
        return False


def _runner_kind(runners: dict[str, str], runner: str) -> str:
    """The runner's own mechanism: its capture mode (the target runner) or width (draft ones)."""
    return "capture_mode" if runners.get(runner) == "target" else "capture_width"


def _merge_workers(findings: list[Finding]) -> list[Finding]:
    """One finding per site: a method both workers' steps call is on both paths."""
    merged: dict[tuple, Finding] = {}
    for finding in findings:
        found = merged.get(finding.key)
        if found is None:
            merged[finding.key] = finding
        elif found.worker_path != finding.worker_path:
            found.worker_path = "both"
    return list(merged.values())

