"""Batch-size gate for EAGLE speculative decoding (added to SGLang by eaglegate).

This file is copied verbatim into SGLang as `sglang/srt/speculative/batch_gate.py` by
`eaglegate patch`; eaglegate's tests import it directly. It must stay pure Python and
import nothing beyond the standard library: it runs inside SGLang's scheduler process
and is unit-tested without torch.

What it holds:
- `BatchGate`: the threshold, hysteresis and counters. Speculation is switched off
  (the step is "gated") when the batch size rises above `threshold`, and back on only
  once it falls below `resume_below` (< threshold), so a batch hovering at the
  threshold does not flap between the two paths every step.
- `gate_for(worker)`: the worker's gate, built once from the server argument
  `speculative_batch_gate_threshold` or, when that is unset, the environment variable
  `SGLANG_SPEC_BATCH_GATE_THRESHOLD`. Off (None) unless one of them is a positive int.
- `prepare_gated_decode` / `finish_gated_decode`: the two calls the patched
  `EAGLEWorker` batch entry makes. The first decides and, when gated, turns the decode
  batch into a one-token-per-request EXTEND (the version's own `prepare_for_decode`
  does the KV slot, seq_lens and kv_committed/kv_allocated bookkeeping); the second,
  after the worker's own target-extend / draft-extend pair has run, does what verify
  would have done: append the sampled tokens, check finish and grammar, keep only the
  draft-state rows of unfinished requests, and put the batch back in DECODE mode.
  Both only use the objects they are handed (duck typing), never import torch.

Attention data parallelism: every DP rank must take the same decision, or one rank
runs an extend while another runs draft/verify and their collectives diverge. The
decision is therefore made from a *global* batch size: by default the maximum of
`batch.global_num_tokens`, which SGLang's MLP sync already gathered from all DP ranks
(one token per request for a decode batch), so every rank sees the same input; since
all ranks start with the same state and see the same inputs, their hysteresis stays
in lock step. Where that list is missing, inject `BatchGate.global_view`, a function
`(local_batch_size, local_eligible) -> (global_batch_size, all_eligible)` (e.g. a max
/ min all-reduce over the DP group) and it is used instead.

Not gated, by design: batches with a logprob request (verify produces spec-v1 output
logprobs; an extend would drop them; under DP this local veto can split the ranks
unless `global_view` reduces it too), and hybrid mamba / linear-attention targets
(their state update after a one-token extend is untested; the gate stays off).
Gated steps run the target and draft as eager extends (no decode CUDA graph), so the
threshold is worth calibrating against a sweep.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Only in annotations: the module must import on the oldest Python SGLang 0.4 runs on.
    from collections.abc import Callable, Sequence

    GlobalView = Callable[[int, bool], tuple[int, bool]]

ENV_THRESHOLD = "SGLANG_SPEC_BATCH_GATE_THRESHOLD"
ENV_RESUME = "SGLANG_SPEC_BATCH_GATE_RESUME"  # optional: resume speculation below this size
SERVER_ARG = "speculative_batch_gate_threshold"

logger = logging.getLogger(__name__)
_UNSET = object()


def _positive_int(value: Any) -> int | None:
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        logger.warning("batch gate: ignoring non-integer setting %r", value)
        return None
    return number if number > 0 else None


def default_resume_below(threshold: int) -> int:
    """The lower mark: an eighth below the threshold, at least one request below it."""
    return max(1, threshold - max(1, threshold // 8))


class BatchGate:
    """Decides per decode step whether to speculate, with hysteresis and counters."""

    def __init__(
        self,
        threshold: int,
        resume_below: int | None = None,
        global_view: GlobalView | None = None,
    ) -> None:
        if threshold <= 0:
            raise ValueError("threshold must be a positive integer")
        self.threshold = threshold
        self.resume_below = (
            default_resume_below(threshold) if resume_below is None else resume_below
        )
        if not 0 < self.resume_below <= threshold:
            raise ValueError("resume_below must be in 1..threshold")
        self.global_view = global_view
        self.gated = False  # current state: True while speculation is off
        self.gated_steps = 0
        self.speculative_steps = 0
        self.switches = 0

    @classmethod
    def from_settings(
        cls, server_arg: Any = None, environ: dict[str, str] | None = None
    ) -> BatchGate | None:
        """The gate for these settings, or None when the gate is off.

        The server argument wins; the environment variable is used when it is unset.
        """
        env = os.environ if environ is None else environ
        threshold = _positive_int(server_arg)
        if threshold is None:
            threshold = _positive_int(env.get(ENV_THRESHOLD))
        if threshold is None:
            return None
        resume = _positive_int(env.get(ENV_RESUME))
        if resume is not None and resume > threshold:
            logger.warning("batch gate: %s=%d above the threshold, ignored", ENV_RESUME, resume)
            resume = None
        return cls(threshold, resume)

    def decide(self, global_batch_size: int) -> bool:
        """Advance the hysteresis with this step's (global) batch size; True = gate it."""
        if self.gated:
            if global_batch_size < self.resume_below:
                self.gated = False
                self.switches += 1
                logger.info(
                    "batch gate: batch size %d < %d, speculation back on",
                    global_batch_size,
                    self.resume_below,
                )
        elif global_batch_size > self.threshold:
            self.gated = True
            self.switches += 1
            logger.info(
                "batch gate: batch size %d > %d, speculation off", global_batch_size, self.threshold
            )
        return self.gated

    def record(self, gated: bool) -> None:
        if gated:
            self.gated_steps += 1
        else:
            self.speculative_steps += 1

    def describe(self) -> str:
        """A short string for SGLang's decode log line, e.g. `gate: spec, 90 spec / 10 gated`."""
        state = "off" if self.gated else "spec"
        return (
            f"gate(>{self.threshold}, <{self.resume_below}): {state}, "
            f"{self.speculative_steps} spec / {self.gated_steps} gated"
        )

    def global_size(
        self, local_batch_size: int, local_eligible: bool, batch: Any
    ) -> tuple[int, bool]:
        """The batch size (and eligibility) every DP rank agrees on."""
        if self.global_view is not None:
            size, eligible = self.global_view(local_batch_size, local_eligible)
            return int(size), bool(eligible)
        sizes = getattr(batch, "global_num_tokens", None)
        if sizes:
            # Gathered by SGLang's MLP sync on every rank: identical input everywhere.
            return max(int(n) for n in sizes), local_eligible
        return local_batch_size, local_eligible


def gate_for(worker: Any) -> BatchGate | None:
    """The worker's gate, built on first use from its server args and the environment."""
    gate: BatchGate | None
    cached: Any = getattr(worker, "_eaglegate_batch_gate", _UNSET)
    if cached is _UNSET:
        server_args = getattr(worker, "server_args", None)
        gate = BatchGate.from_settings(getattr(server_args, SERVER_ARG, None))
        if gate is not None and _hybrid_target(worker):
            # Mamba/linear-attention state after a one-token extend is untested: stay off.
            logger.warning("batch gate: off for hybrid (mamba / linear attention) models")
            gate = None
        worker._eaglegate_batch_gate = gate
    else:
        gate = cached
    return gate


_HYBRID_CONFIGS = ("hybrid_gdn_config", "mamba2_config", "hybrid_lightning_config")


def _hybrid_target(worker: Any) -> bool:
    # The same test EAGLEWorker.verify uses before its mamba state update.
    runner = getattr(getattr(worker, "target_worker", None), "model_runner", None)
    return any(getattr(runner, name, None) is not None for name in _HYBRID_CONFIGS)


def describe(worker: Any) -> str:
    """The decode-log string for a worker, or "" when its gate is off."""
    gate = gate_for(worker)
    return gate.describe() if gate is not None else ""


class _PlainDecodeAlgorithm:
    """Wraps the batch's speculative algorithm so `prepare_for_decode` takes its plain
    (non-speculative) path: the one that allocates a KV slot per request."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def is_none(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        if name.startswith("is_"):
            return lambda *args, **kwargs: False
        return getattr(self._real, name)


def _last_tokens(draft_input: Any) -> Any:
    # The token each request sampled last and whose KV is not written yet.
    tokens = getattr(draft_input, "verified_id", None)
    if tokens is None:
        tokens = getattr(draft_input, "bonus_tokens", None)  # renamed in 0.5.11
    return tokens


_DRAFT_ROWS = ("topk_p", "topk_index", "hidden_states", "verified_id", "bonus_tokens")


def prepare_gated_decode(worker: Any, batch: Any) -> bool:
    """Decide this step; when gated, make `batch` a one-token-per-request EXTEND.

    Returns True when the caller must run its target-extend / draft-extend pair and
    then `finish_gated_decode`. Extend batches and mixed DP steps are left alone.
    """
    gate = gate_for(worker)
    if gate is None:
        return False
    mode = batch.forward_mode
    if mode.is_extend() or getattr(batch, "is_extend_in_batch", False):
        return False
    idle = mode.is_idle()
    if not (idle or mode.is_decode()):
        return False
    local_size = 0 if idle else len(batch.reqs)
    # Output logprobs of a spec-v1 batch are produced by verify; an extend would drop them.
    eligible = not getattr(batch, "return_logprob", False)
    size, eligible = gate.global_size(local_size, eligible, batch)
    gated = gate.decide(size) and eligible
    if idle:
        # An idle DP rank joins the extend pair so collectives match the other ranks.
        return gated
    gate.record(gated)
    if not gated:
        return False

    draft_input = batch.spec_info
    seq_lens_cpu = getattr(batch, "seq_lens_cpu", None)
    prefix_lens = [
        int(n) for n in (seq_lens_cpu if seq_lens_cpu is not None else batch.seq_lens).tolist()
    ]
    batch.output_ids = _last_tokens(draft_input)
    real_algorithm = batch.spec_algorithm
    batch.spec_algorithm = _PlainDecodeAlgorithm(real_algorithm)
    try:
        # The version's own decode preparation: one KV slot per request (and its SWA
        # eviction), req_to_token written, seq_lens (+cpu, orig) and, where they exist,
        # kv_committed/kv_allocated advanced by one; penalties see the last token.
        batch.prepare_for_decode()
    finally:
        batch.spec_algorithm = real_algorithm
    batch.input_ids = batch.input_ids.long()
    bs = len(batch.reqs)
    # The same one-token extend layout SGLang uses to mix running requests into a prefill.
    batch.forward_mode = type(mode).EXTEND
    batch.prefix_lens = prefix_lens
    batch.extend_lens = [1] * bs
    batch.extend_num_tokens = bs
    batch.extend_logprob_start_lens = [0] * bs
    if hasattr(batch, "is_prefill_only"):
        batch.is_prefill_only = False
    # The target extend must not see the draft tree of the last step.
    batch.spec_info = None
    return True


def finish_gated_decode(worker: Any, batch: Any, next_token_ids: Any) -> None:
    """After the extend pair: verify's bookkeeping, and the batch back in DECODE mode."""
    if batch.forward_mode.is_idle() or not batch.reqs:
        return  # an idle DP rank that joined the extend pair: nothing was prepared
    batch.forward_mode = type(batch.forward_mode).DECODE
    tokens: Sequence[int] = next_token_ids.tolist()
    keep: list[int] = []
    # One sampled token per request; no zip(strict=) (Python 3.10+) in SGLang 0.4's range.
    for i, (req, token) in enumerate(zip(batch.reqs, tokens)):  # noqa: B905
        req.output_ids.append(int(token))
        req.check_finished()
        if req.finished():
            continue
        keep.append(i)
        if req.grammar is not None:
            req.grammar.accept_token(int(token))
    if len(keep) < len(batch.reqs):
        # The scheduler's v1 filter keeps the first rows of the draft state, as after verify.
        spec_info = batch.spec_info
        for name in _DRAFT_ROWS:
            rows = getattr(spec_info, name, None)
            if rows is not None and hasattr(rows, "__getitem__"):
                setattr(spec_info, name, rows[keep])
