"""A verdict per worker path: can a plain decode step run in this worker at runtime?

Read from the findings and the map, not from version numbers:

- when the target's CUDA graph is captured only in the speculative mode
  (`capture_mode` on the target runner), a plain decode cannot replay it; the step is
  still feasible when the worker receives the scheduler's own (mutable) batch and has
  a draft-extend step: the worker turns the batch into a plain decode for the target,
  which replays a second set of graphs captured in DECODE mode (the runner picks its
  mode from the speculative algorithm it is built under), and the draft extend of the
  next speculative step refreshes the draft state; the cost is that second capture
  plus redoing what verify does (the `verify_appends` and `early_return` findings);
- a worker with a `zero_steps` branch (adaptive speculation at steps=0) also has a native
  route: the alternative to the plain decode above, and the verdict where that one is not
  feasible (feasible-natively: no code patch, a configuration);
- otherwise the worker is blocked: it only sees a copy of the batch, so it cannot turn
  the step into a plain decode, and no width-1 graph or backend exists.
"""

from __future__ import annotations

from eaglegate.analyzer.couplings.context import Context
from eaglegate.analyzer.couplings.model import Finding, Verdict
from eaglegate.analyzer.spec_map import WorkerMap, main_path


def receives_scheduler_batch(ctx: Context, worker: WorkerMap) -> bool:
    """Whether the worker's entry takes the very object the scheduler's caller holds."""
    cb = ctx.codebase
    if not worker.entry or not worker.paths:
        return False
    entry = cb.scopes[worker.entry]
    params = entry.params[1:]
    if not params or params[0][1] is None:
        return False
    entry_types = {v for v in cb.type_values(params[0][1], worker.entry) if v[0] == "inst"}
    for path in worker.paths:
        if not path.hops:
            continue
        caller = path.hops[-1].caller
        for _, annotation in cb.scopes[caller].params[1:]:
            if annotation is not None and entry_types & cb.type_values(annotation, caller):
                return True
    return False


def draft_input_decode_prep(ctx: Context, worker: WorkerMap) -> str | None:
    """The draft input's own decode preparation, when the scheduler calls one on its batch
    and it reserves the step's KV slots: there a gate can decide the step (and reserve one
    slot per request) before the worker runs, and carry the decision on the draft input the
    worker receives, even where the worker gets a copy of the batch."""
    cb = ctx.codebase
    preps = [c for c in worker.decode if c.kind == "decode_prep"]
    if not preps:
        return None
    batch_class = cb.owner_class(preps[0].callee)  # the scheduler's batch prepares first
    reserving = {c.caller for c in worker.decode if c.kind == "kv_alloc"}
    for call in preps[1:]:
        if cb.owner_class(call.callee) != batch_class and call.callee in reserving:
            return call.callee
    return None


def _batch_types(ctx: Context, worker: WorkerMap) -> set[str]:
    """The classes of the batch object the worker's entry receives (and their bases)."""
    cb = ctx.codebase
    if not worker.entry:
        return set()
    params = cb.scopes[worker.entry].params[1:]
    if not params or params[0][1] is None:
        return set()
    found: set[str] = set()
    for value in cb.type_values(params[0][1], worker.entry):
        if value[0] == "inst":
            found |= set(cb.mro(value[1]))
    return found


def _on(findings: list[Finding], label: str, kinds: set[str]) -> list[Finding]:
    return [f for f in findings if f.kind in kinds and f.worker_path in (label, "both")]


def build_verdicts(ctx: Context, findings: list[Finding]) -> list[Verdict]:
    verdicts: list[Verdict] = []
    for worker in ctx.spec_map.workers:
        if not worker.present:
            verdicts.append(Verdict(worker.label, None, "absent", "none",
                                    "", [f"no {worker.name} in this version"], []))
            continue
        label = worker.label
        if not worker.paths:
            verdicts.append(Verdict(label, worker.cls, "unknown", "none", "",
                                    [worker.note or f"no path from the scheduler's event loops reaches {worker.name}"],
                                    []))
            continue
        zero = _on(findings, label, {"zero_steps"})
        # The mode taken when speculation is on (not the `else` arm of that test).
        verify_graph = [f for f in _on(findings, label, {"capture_mode"}) if f.detail.get("role") == "target"
                        and not f.detail.get("negated")]
        widths = [f for f in _on(findings, label, {"capture_width", "backend_width"})
                  if f.detail.get("role") in ("target", "backend")][:3]
        # What verify does that a plain step must redo: its own appends, and the early returns
        # on the event loops this worker is driven from.
        main = main_path(worker, ctx.spec_map.scheduler)
        loops = ctx.near([main.event_loop] if main else [], 3)
        steps = {s.function for s in worker.steps}
        batch_types = _batch_types(ctx, worker)
        early = sorted((f for f in _on(findings, label, {"early_return"}) if f.symbol in loops),
                       key=lambda f: (ctx.codebase.owner_class(f.symbol) not in batch_types, f.path, f.line))
        bookkeeping = early[:2] + sorted(
            _on(findings, label, {"verify_appends"}), key=lambda f: (f.symbol not in steps, f.path, f.line))
        # Stale fields any launch has before those of one attention backend's code.
        state = sorted(_on(findings, label, {"draft_input_field"}), key=lambda f: "launch_keys" in f.detail)
        caps = _on(findings, label, {"setting_changed"})
        cap_note = [f"config: {f.detail['setting']} = {f.detail['value']} under speculation ({f.where})"
                    for f in caps if "48" in f.detail.get("value", "")][:2]
        graph_reason = [f"target CUDA graph captured only in speculative mode: {f.symbol.rsplit('.', 1)[-1]} "
                        f"({f.where})" for f in verify_graph[:2]]
        mutable = receives_scheduler_batch(ctx, worker)
        has_extend = any(s.kind == "draft_extend" for s in worker.steps)
        prep = None if mutable else draft_input_decode_prep(ctx, worker)
        # A zero-step tier is the no-patch alternative, not the route: it still verifies and
        # runs the draft extend every step, which a plain decode does not.
        native = [f"alternative without a patch: the worker's zero-step tier ({f.where}), which still "
                  "verifies one token per request and runs the draft extend each step" for f in zero[:1]]
        if verify_graph and prep and has_extend:
            verdicts.append(Verdict(
                label, worker.cls, "feasible",
                "plain one-token DECODE of the target through its own DECODE-mode CUDA graphs, draft "
                "skipped, decided where the draft input prepares the decode step",
                "the decision at the draft input's decode preparation (one KV slot per request when "
                "gated), carried on the draft input the worker receives; a second capture of the "
                "target's graphs and an attention backend for them; the result in the speculative "
                "layout (one accepted token per request) so the relay and result processing run as they are",
                graph_reason
                + [f"the worker receives a copy of the batch ({worker.entry}), but the draft input's "
                   f"decode preparation {prep.rsplit('.', 2)[-2]}.{prep.rsplit('.', 1)[-1]} reserves the "
                   "step's KV slots on the scheduler's batch"]
                + native + cap_note,
                verify_graph + widths + state[:3] + caps + zero))
            continue
        if verify_graph and mutable and has_extend:
            verdicts.append(Verdict(
                label, worker.cls, "feasible",
                "plain one-token DECODE of the target through its own DECODE-mode CUDA graphs, draft skipped",
                "a second capture of the target's graphs (the existing ones serve verify only) and an attention "
                "backend for them; the step must also do verify's bookkeeping (KV slot, seq_lens, output "
                "tokens, finish checks) and keep the draft state of unfinished requests",
                graph_reason
                + [f"the worker receives the scheduler's batch ({worker.entry}) and has a draft-extend step"]
                + [f"verify's bookkeeping to redo: {f.kind} {f.symbol.rsplit('.', 2)[-2]}."
                   f"{f.symbol.rsplit('.', 1)[-1]} ({f.where})" for f in bookkeeping[:5]]
                + native + cap_note,
                verify_graph + widths + bookkeeping + state[:3] + caps + zero))
            continue
        if zero:
            verdicts.append(Verdict(
                label, worker.cls, "feasible-natively", "adaptive speculation at steps=0 (configuration)",
                "no code patch: a step with zero draft steps still verifies one token per request; "
                "the draft extend keeps the draft state warm",
                [f"the worker branches on a zero step count ({f.where})" for f in zero[:2]] + cap_note,
                zero + caps))
            continue
        reasons = graph_reason + [f"graph/backend width: {f.symbol} ({f.where})" for f in widths]
        if not mutable:
            reasons.append(f"the worker's entry {worker.entry} receives a copy of the batch, not the "
                           "scheduler's batch: it cannot turn the step into a plain decode")
        if not has_extend:
            reasons.append("no draft-extend step to refresh the draft state")
        if not reasons:
            # Say what was looked for: a verdict never comes without a reason.
            reasons.append(f"no zero-step branch in {worker.name}, and no plain-decode route: the target "
                           "graph's speculative-only capture mode was not found on this path")
        verdicts.append(Verdict(
            label, worker.cls, "blocked", "none",
            "no runtime switch: turn this worker path off (use the other path) or restart without speculation",
            reasons + cap_note, verify_graph + widths + state[:3] + caps))
    return verdicts
