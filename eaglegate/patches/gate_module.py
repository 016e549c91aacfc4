"""Batch-size gate for EAGLE speculative decoding (added to SGLang by eaglegate).

This file is copied verbatim into SGLang as `sglang/srt/speculative/batch_gate.py` by
`eaglegate patch`; eaglegate's tests import it directly. It must stay pure Python and
import nothing beyond the standard library at module level: it runs inside SGLang's
scheduler process and is unit-tested without torch.

What it holds:
- `BatchGate`: the threshold, hysteresis and counters. Speculation is switched off
  (the step is "gated") when the batch size rises above `threshold`, and back on only
  once it has stayed below `resume_below` (< threshold) for `resume_steps` decode steps
  in a row, so a batch hovering at the threshold does not flap between the two paths,
  and a batch that refills (requests finishing and their successors still arriving, one
  prefill at a time) does not speculate for the one or two steps in between.
- `init_batch_gate(worker)`: called at the end of `EAGLEWorker.__init__`. Builds the
  gate from the server argument `speculative_batch_gate_threshold` (or, when unset,
  `SGLANG_SPEC_BATCH_GATE_THRESHOLD`; off unless one is a positive int), and, when it
  is on, a plain-decode path for the target model: its own attention backend and its
  own CUDA graphs captured in DECODE mode (one token per request), beside the
  TARGET_VERIFY graphs speculation uses. It also compiles, at start-up, the kernel a
  plain decode batch takes its positions from (no speculative path calls it, and its
  first call compiles for seconds), puts the gate in SGLang's decode log line and, with
  `--enable-metrics`, in its Prometheus metrics.
- `prepare_gated_decode` / `finish_gated_decode`: the two calls the patched batch entry
  makes. A gated step is a plain decode step of the target model alone: the version's
  own `prepare_for_decode` (plain path) allocates one KV slot per request and advances
  seq_lens; the target forward replays the DECODE graph; afterwards the sampled token
  is appended, finish and grammar are checked and the draft state keeps the rows of
  unfinished requests, as verify would have done. The draft model does not run.

Resuming speculation needs no catch-up step for correctness: the draft input keeps the
last sampled token per request (the verify root), and its top-k and hidden-state rows
are those of the last speculative step. The first speculative step after a gated
stretch therefore proposes poor drafts, verify rejects them and emits the correct
token, and the draft extend after it refreshes the draft state. What stays stale is the
draft model's KV for the positions decoded while gated; docs/gate-patch.md gives the
measured cost in acceptance.

Attention data parallelism: every DP rank must take the same decision, or one rank
runs a plain step while another runs draft/verify and their collectives diverge. The
decision is therefore made from a *global* batch size: by default the maximum of
`batch.global_num_tokens`, which SGLang's MLP sync already gathered from all DP ranks
(one token per request for a decode batch), so every rank sees the same input; since
all ranks start with the same state and see the same inputs, their hysteresis stays
in lock step. Where that list is missing, inject `BatchGate.global_view`, a function
`(local_batch_size, local_eligible) -> (global_batch_size, all_eligible)` (e.g. a max
/ min all-reduce over the DP group) and it is used instead.

The overlap worker (`EAGLEWorkerV2`, the second half of this file): the step is decided
where its KV is reserved (`decode_alloc_len`, called from the draft input's
`prepare_for_decode`; up to 0.5.5.post3 `decode_alloc_window`, which keeps the release's
reservation window), and a gated step runs in the worker as the target's plain DECODE
(`run_gated_decode`), returning the speculative result layout; a prefill while speculation
is off runs without the draft (`run_gated_prefill`). `init_overlap_batch_gate` ends
`EAGLEWorkerV2.__init__` (from 0.5.14 `EAGLEWorkerV2.init_cuda_graphs`, after the target's
graphs and SGLang's adaptive tiers). The section's opening comment says why it is built that
way.

Not gated, by design: batches with a logprob request (verify produces spec-v1 output
logprobs; under DP this local veto can split the ranks unless `global_view` reduces
it too), and hybrid mamba / linear-attention targets (their state update after a plain
step is untested; the gate stays off).
"""

from __future__ import annotations

import bisect
import collections
import logging
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Only in annotations: the module must import on the oldest Python SGLang 0.4 runs on.
    from collections.abc import Callable, Sequence

    GlobalView = Callable[[int, bool], tuple[int, bool]]

ENV_THRESHOLD = "SGLANG_SPEC_BATCH_GATE_THRESHOLD"
ENV_RESUME = "SGLANG_SPEC_BATCH_GATE_RESUME"  # optional: resume speculation below this size
# optional: ...after this many decode steps in a row below it
ENV_RESUME_STEPS = "SGLANG_SPEC_BATCH_GATE_RESUME_STEPS"
# On the H200 (0.5.12.post1, C=64, threshold 53) a refilling batch spent 1 to 3 decode steps
# below the lower mark; each return to speculation costs a draft that has not seen the gated
# positions. When the load really fell, eight steps cost about 20 ms of plain decoding (2.5 ms
# a step at 8 requests on that machine) before speculation resumes.
DEFAULT_RESUME_STEPS = 8
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
        resume_steps: int = DEFAULT_RESUME_STEPS,
    ) -> None:
        if threshold <= 0:
            raise ValueError("threshold must be a positive integer")
        self.threshold = threshold
        self.resume_below = (
            default_resume_below(threshold) if resume_below is None else resume_below
        )
        if not 0 < self.resume_below <= threshold:
            raise ValueError("resume_below must be in 1..threshold")
        if resume_steps <= 0:
            raise ValueError("resume_steps must be a positive integer")
        self.resume_steps = resume_steps
        self._steps_below = 0  # consecutive gated steps below resume_below
        self.global_view = global_view
        self.gated = False  # current state: True while speculation is off
        self.gated_steps = 0
        self.speculative_steps = 0
        self.switches = 0
        self.failures = 0  # errors in the gate's own code: the first turns it off for good
        self.failure: str | None = None  # what that error was
        self.metrics: _GateMetrics | None = None  # set when SGLang's metrics are on
        self._switches_recorded = 0
        self.depth_gate: DepthGate | None = None  # set only when the launch gives a depth table

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
        resume_steps = _positive_int(env.get(ENV_RESUME_STEPS)) or DEFAULT_RESUME_STEPS
        return cls(threshold, resume, resume_steps=resume_steps)

    def decide(self, global_batch_size: int) -> bool:
        """Advance the hysteresis with this step's (global) batch size; True = gate it."""
        if self.gated:
            self._steps_below = self._steps_below + 1 if global_batch_size < self.resume_below else 0
            if self._steps_below >= self.resume_steps:
                self._steps_below = 0
                self.gated = False
                self.switches += 1
                logger.info(
                    "batch gate: batch size %d < %d for %d steps, speculation back on",
                    global_batch_size,
                    self.resume_below,
                    self.resume_steps,
                )
        elif global_batch_size > self.threshold:
            self.gated = True
            self.switches += 1
            logger.info(
                "batch gate: batch size %d > %d, speculation off", global_batch_size, self.threshold
            )
        return self.gated

    def record(self, gated: bool) -> None:
        """Count one decode step of this rank (gated = run as a plain decode step)."""
        if gated:
            self.gated_steps += 1
        else:
            self.speculative_steps += 1
        if self.metrics is not None:
            self.metrics.step(gated, switched=self.switches != self._switches_recorded)
        self._switches_recorded = self.switches

    def fail(self, where: str, exc: BaseException) -> None:
        """Count an error in the gate's own code, and say it in one log line; the caller
        turns the gate off, and the server speculates from now on."""
        self.failures += 1
        self.failure = f"{type(exc).__name__} in {where}: {exc}"
        self.gated = False
        if self.depth_gate is not None:
            self.depth_gate.hand_back()
        if self.metrics is not None:
            self.metrics.failed()
        logger.error("batch gate: off for the life of this server after %s; "
                     "the server runs as unpatched SGLang", self.failure)

    def describe(self) -> str:
        """For SGLang's decode log line, e.g. `gate(>32, <28): spec, 90 spec / 10 gated`;
        after an error in the gate, `gate(>32, <28): failed (<error>), ..., 1 failure`."""
        state = f"failed ({self.failure})" if self.failure else "off" if self.gated else "spec"
        failures = f", {self.failures} failure{'s' * (self.failures != 1)}" if self.failures else ""
        if self.depth_gate is not None:
            return self.depth_gate.describe(state) + failures
        return (
            f"gate(>{self.threshold}, <{self.resume_below}): {state}, "
            f"{self.speculative_steps} spec / {self.gated_steps} gated{failures}"
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
            # Mamba/linear-attention state after a plain gated step is untested: stay off.
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


# ---- the target's plain-decode path ----------------------------------------------------


# The model runner's attribute for its decode-step CUDA graphs: `decode_cuda_graph_runner`
# from 0.5.14 (`DecodeCudaGraphRunner`), `graph_runner` before (`CudaGraphRunner`).
_GRAPH_ATTRS = ("decode_cuda_graph_runner", "graph_runner")


def graph_attr(runner: Any) -> str:
    """The name under which this version's model runner keeps its decode graphs."""
    return next((name for name in _GRAPH_ATTRS if hasattr(runner, name)), _GRAPH_ATTRS[-1])


class PlainDecode:
    """What the target model runner swaps in for a gated step: an attention backend of
    its own (the verify graphs keep theirs) and CUDA graphs captured in DECODE mode.

    `graphs` is None when CUDA graphs are off or could not be captured; the step then
    runs the target's decode eagerly, still without the draft model."""

    def __init__(self, attn_backend: Any, graphs: Any) -> None:
        self.attn_backend = attn_backend
        self.graphs = graphs
        self._saved: tuple[Any, str, Any, Any] | None = None

    def enter(self, runner: Any) -> None:
        attr = graph_attr(runner)
        if self._saved is None:
            self._saved = (runner, attr, runner.attn_backend, getattr(runner, attr))
        runner.attn_backend = self.attn_backend
        setattr(runner, attr, self.graphs)

    def leave(self) -> None:
        if self._saved is not None:
            runner, attr, backend, graphs = self._saved
            runner.attn_backend = backend
            setattr(runner, attr, graphs)
            self._saved = None


def _plain_algorithm(real: Any) -> Any:
    """The `NONE` member of the version's speculative-algorithm enum, else a stand-in
    whose `is_*` checks all say "not speculative"."""
    none = getattr(type(real), "NONE", None)
    return none if none is not None else _PlainDecodeAlgorithm(real)


def _swap(obj: Any, **values: Any) -> dict[str, Any]:
    saved = {name: getattr(obj, name) for name in values if hasattr(obj, name)}
    for name, value in values.items():
        if hasattr(obj, name):
            setattr(obj, name, value)
    return saved


def _new_attention_backend(runner: Any) -> Any:
    make = runner._get_attention_backend
    # Its own workspace: factories that take no flag read this attribute instead.
    saved = _swap(runner, init_new_workspace=True)
    try:
        try:
            return make(init_new_workspace=True)
        except TypeError:  # versions whose factory takes no workspace flag
            return make()
    finally:
        _swap(runner, **saved)


def _graph_batch_sizes(server_args: Any) -> tuple[Any, str, Any] | None:
    """Where this version keeps the decode CUDA-graph batch sizes, and the function that
    generates its default list: (holder, attribute, generate)."""
    decode = getattr(getattr(server_args, "cuda_graph_config", None), "decode", None)
    generate = getattr(server_args, "_generate_decode_cuda_graph_batch_sizes", None)
    if decode is not None and generate is not None:  # 0.5.14 on
        return decode, "bs", lambda: generate(decode.max_bs)
    generate = getattr(server_args, "_generate_cuda_graph_batch_sizes", None)
    if generate is not None:
        return server_args, "cuda_graph_bs", generate
    return None


def _plain_batch_sizes(server_args: Any) -> tuple[Any, str, list[int]] | None:
    """The CUDA-graph batch sizes SGLang picks without speculation, where it picked the
    speculative list itself (not the user): a plain step then pads to the same size, and
    runs the same kernels, as in a server without speculation. Returned with the holder
    and attribute to swap them into while the DECODE graphs are captured."""
    where = _graph_batch_sizes(server_args)
    if where is None or not getattr(server_args, "speculative_algorithm", None):
        return None
    holder, attr, generate = where
    try:
        chosen = generate()
        saved = _swap(server_args, speculative_algorithm=None)
        try:
            plain = generate()
        finally:
            _swap(server_args, **saved)
    except Exception:  # noqa: BLE001 - keep the list the server has
        return None
    if list(getattr(holder, attr, None) or []) != list(chosen):
        return None  # the user's own list
    return holder, attr, list(plain)


def build_plain_decode(worker: Any, full_hidden: bool = True) -> PlainDecode | None:
    """The target's plain-decode path, or None when this version cannot build one.

    `full_hidden`: capture the graphs with full hidden states (the v1 worker's target step
    asks for them); the overlap worker's gated step asks for none, as plain decoding does.
    A step must ask for the mode its graphs were captured with, or SGLang recaptures them."""
    runner = worker.target_worker.model_runner
    try:
        backend = _new_attention_backend(runner)
    except Exception:  # noqa: BLE001 - any failure leaves the gate on its extend-free eager path
        logger.exception("batch gate: no separate attention backend; gated steps stay off")
        return None
    graphs = None
    verify_graphs = getattr(runner, graph_attr(runner), None)
    if verify_graphs is not None:
        # Capture in DECODE mode (the runner reads `spec_algorithm` to pick its mode), with
        # full hidden states, which the worker's target step asks for, and at the batch
        # sizes a server without speculation captures.
        saved_runner = _swap(
            runner, spec_algorithm=_plain_algorithm(runner.spec_algorithm), attn_backend=backend
        )
        saved_args = (
            _swap(runner.server_args, enable_return_hidden_states=True) if full_hidden else {}
        )
        plain_sizes = _plain_batch_sizes(runner.server_args)
        saved_sizes: tuple[Any, dict[str, Any]] | None = None
        if plain_sizes is not None:
            holder, attr, sizes = plain_sizes
            saved_sizes = holder, _swap(holder, **{attr: sizes})
        try:
            graphs = type(verify_graphs)(runner)
        except Exception:  # noqa: BLE001
            logger.exception("batch gate: DECODE graphs not captured; gated steps run eagerly")
        finally:
            if saved_sizes is not None:
                _swap(saved_sizes[0], **saved_sizes[1])
            _swap(runner.server_args, **saved_args)
            _swap(runner, **saved_runner)
        if graphs is not None:
            logger.info(
                "batch gate: captured target DECODE graphs for batch sizes up to %s",
                getattr(graphs, "max_bs", "?"),
            )
    return PlainDecode(backend, graphs)


def compile_decode_positions(runner: Any) -> None:
    """Run `clamp_position`, which gives a plain DECODE batch its positions, once now.

    No speculative path calls it (their batches carry positions), and it compiles on its
    first call: a torch.compile function up to 0.5.9, a JIT CUDA kernel (nvcc) since
    0.5.10. Left to the first gated step, that compile stalls every running request for
    seconds (7.5 s measured on the H200). Size 2 is the smallest gated batch, and the
    size torch.compile's dynamic shapes treat as general."""
    try:
        import torch
        from sglang.srt.model_executor import forward_batch_info
    except ImportError:  # not inside SGLang
        return
    clamp = getattr(forward_batch_info, "clamp_position", None)
    if clamp is None:
        return
    try:
        clamp(torch.ones(2, dtype=torch.int64, device=runner.device))
    except Exception:  # noqa: BLE001 - a failed warm-up only moves the compile to the first gated step
        logger.exception("batch gate: clamp_position not compiled at start-up")


def init_batch_gate(worker: Any) -> None:
    """At the end of `EAGLEWorker.__init__`: the gate, its plain-decode path, its log
    line and metrics. Does nothing when the gate is off, or for an overlap worker that runs
    this `__init__` as its base class's (0.5.3.x's `EAGLEWorkerV2`): its own
    `init_overlap_batch_gate` builds its gate once this returns."""
    if _is_overlap_worker(worker):
        return
    _no_depth_gate_here(worker)
    gate = gate_for(worker)
    if gate is None:
        return
    worker._eaglegate_plain_decode = build_plain_decode(worker)
    if worker._eaglegate_plain_decode is None:
        worker._eaglegate_batch_gate = None  # no plain path: speculate always, as unpatched
        return
    compile_decode_positions(worker.target_worker.model_runner)
    _add_to_decode_log(gate)
    if getattr(getattr(worker, "server_args", None), "enable_metrics", False):
        gate.metrics = _GateMetrics.create(gate)
    logger.info("batch gate: on, %s", gate.describe())


def _no_depth_gate_here(worker: Any) -> None:
    """A launch that gives a depth table to the v1 worker is told, once, that it runs without
    one: the depth gate lives in the overlap worker alone."""
    if depth_table_setting(getattr(getattr(worker, "server_args", None), DEPTH_SERVER_ARG, None)) is not None:
        logger.warning("depth gate: off, the depth table is ignored: this server runs the v1 EAGLEWorker, "
                       "and the depth gate runs in the overlap worker (EAGLEWorkerV2) only")


OVERLAP_WORKER = "EAGLEWorkerV2"  # the class `init_overlap_batch_gate` ends the init of


def _is_overlap_worker(worker: Any) -> bool:
    return any(cls.__name__ == OVERLAP_WORKER for cls in type(worker).__mro__)


# ---- SGLang's decode log line and Prometheus metrics -------------------------------------


class _DecodeLogLine(logging.Filter):
    """Appends the gate's state to SGLang's own "Decode batch ..." log record."""

    def __init__(self, gate: BatchGate) -> None:
        super().__init__()
        self.gate = gate

    def filter(self, record: logging.LogRecord) -> bool:
        if (
            isinstance(record.msg, str)
            and record.msg.startswith("Decode batch")
            and not getattr(record, "_eaglegate", False)
        ):
            record.msg = f"{record.msg}, {self.gate.describe()}"
            record._eaglegate = True  # a record passes every handler: append once
        return True


def _add_to_decode_log(gate: BatchGate) -> None:
    # Handler filters see records of every logger that propagates to them, so the line
    # is found whichever module of this version logs it.
    line = _DecodeLogLine(gate)
    for handler in logging.getLogger().handlers:
        handler.addFilter(line)


class _GateMetrics:
    """`sglang:spec_batch_gate_*` metrics beside SGLang's own (prometheus_client, which
    SGLang installs; imported only when metrics are enabled)."""

    def __init__(self, state: Any, threshold: Any, steps: Any, switches: Any, failures: Any) -> None:
        self.state, self.threshold, self.steps, self.switches = state, threshold, steps, switches
        self.failures = failures

    @classmethod
    def create(cls, gate: BatchGate) -> _GateMetrics | None:
        try:
            from prometheus_client import Counter, Gauge
        except ImportError:
            return None
        try:
            metrics = cls(
                Gauge(
                    "sglang:spec_batch_gate_gated",
                    "1 while the batch gate has speculation off, else 0.",
                    multiprocess_mode="mostrecent",
                ),
                Gauge(
                    "sglang:spec_batch_gate_threshold",
                    "Speculation stops above this running batch size.",
                    multiprocess_mode="mostrecent",
                ),
                Counter(
                    "sglang:spec_batch_gate_steps",
                    "Decode steps by kind: speculative or gated (plain decode).",
                    ["kind"],
                ),
                Counter("sglang:spec_batch_gate_switches", "Times the gate changed state."),
                Counter(
                    "sglang:spec_batch_gate_failures",
                    "Errors in the gate's own code; the first turns the gate off for the "
                    "server's life, which then runs as unpatched SGLang.",
                ),
            )
        except Exception:  # noqa: BLE001 - e.g. a registry that already has these names; never fail start-up
            logger.exception("batch gate: no Prometheus metrics")
            return None
        metrics.threshold.set(gate.threshold)
        metrics.state.set(0)
        return metrics

    def failed(self) -> None:
        self.failures.inc()
        self.state.set(0)

    def step(self, gated: bool, switched: bool) -> None:
        self.steps.labels(kind="gated" if gated else "speculative").inc()
        if switched:
            self.switches.inc()
            self.state.set(int(gated))


# ---- the depth gate: speculation's depth per decode step (overlap worker) ----------------
#
# Off unless the launch gives a depth table (`SGLANG_SPEC_DEPTH_TABLE`). The table maps a
# batch band x a context band to a depth: 0 is the gate's plain decode, d > 0 speculation
# with d draft steps (d + 1 tokens verified). The context of a step is the mean KV length
# its requests read, their KV tokens (`_kv_tokens`, on the CPU: no device sync) / the
# batch size: the step reads batch x mean tokens of KV, so a band of the mean with a band of the
# batch places the step by its KV read, and one long request does not move the whole batch
# as the maximum would.
#
# A depth runs through CUDA graphs of its own only where the release built them: the tiers of
# SGLang's adaptive speculation (`--speculative-adaptive`, 0.5.12 on), one
# `SpecRuntimeState` per step count in `AdaptiveController._states`. The gate switches to a
# tier through the worker's own `apply_runtime_state` (what the controller's `_activate`
# calls) when it decides the step, where the KV is reserved: the reservation is sized for the
# deepest tier (`max_speculative_num_draft_tokens`), as SGLang's own per-step switch in the
# worker's forward relies on. Nothing is captured at a switch. The controller's own choice
# (per batch from 0.5.13, from acceptance) is replaced by `_DepthPolicy` while the gate
# holds the depth, so the two never pull the worker between tiers. A depth the server has no
# tier for (no `--speculative-adaptive`, a depth outside its candidate steps, or a release
# before 0.5.12) runs at the launch's `--speculative-num-steps`: the table collapses to
# {0, launch depth}, said in one line at start-up.

ENV_DEPTH_TABLE = "SGLANG_SPEC_DEPTH_TABLE"  # inline JSON, or the path of a JSON file
DEPTH_SERVER_ARG = "speculative_depth_table"  # the same, where a launch flag sets it
LAUNCH_DEPTH = "launch"  # a cell's depth: the launch's own --speculative-num-steps
MAX_DEPTH = 16  # a sanity bound on a cell; SGLang's tiers are a few steps deep
MAX_TABLE_BYTES = 1 << 20  # a table is a few hundred bytes; a bigger file is not one


class DepthTable:
    """Batch bands x context bands -> depth, from a JSON object:

        {"batch": [8, 32], "context": [4096],
         "depth": [[3, 3], [2, 3], [0, 1]], "margin": [[...], ...]}

    `batch` and `context` are the inclusive upper bounds of each band but the last, which is
    open (so 3 batch bands and 2 context bands above); `depth[i][j]` is the depth for batch
    band i and context band j, an integer 0..16 or "launch"; `margin`, optional and of the same
    shape, is what the table's maker measured for each choice (shown, never used)."""

    def __init__(
        self,
        batch_bounds: Sequence[int],
        context_bounds: Sequence[int],
        depths: Sequence[Sequence[int | str]],
        margins: Sequence[Sequence[float]] | None = None,
    ) -> None:
        self.batch_bounds = list(batch_bounds)
        self.context_bounds = list(context_bounds)
        self.depths = [list(row) for row in depths]
        self.margins = None if margins is None else [list(row) for row in margins]

    @classmethod
    def parse(cls, text: str) -> DepthTable:
        """The table a setting gives: inline JSON, else the path of a JSON file. Raises
        ValueError, saying what is wrong, for anything else."""
        import json

        text = text.strip()
        if not text.startswith("{"):
            text = _table_file_text(text)
        if len(text) > MAX_TABLE_BYTES:
            raise ValueError(f"over {MAX_TABLE_BYTES} characters")
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {exc.msg} at line {exc.lineno}") from None
        except RecursionError:
            raise ValueError("nested too deep") from None
        if not isinstance(spec, dict):
            raise ValueError("not a JSON object")
        unknown = sorted(set(spec) - {"batch", "context", "depth", "margin"})
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r}")
        batch = _bounds(spec.get("batch"), "batch")
        context = _bounds(spec.get("context", []), "context")
        depths = _matrix(spec.get("depth"), "depth", len(batch) + 1, len(context) + 1)
        for row in depths:
            for cell in row:
                if cell != LAUNCH_DEPTH and not (_is_int(cell) and 0 <= cell <= MAX_DEPTH):
                    raise ValueError(f"depth {cell!r}: not an integer 0..{MAX_DEPTH} or {LAUNCH_DEPTH!r}")
        margins = spec.get("margin")
        if margins is not None:
            margins = _matrix(margins, "margin", len(batch) + 1, len(context) + 1)
            if not all(isinstance(m, (int, float)) and not isinstance(m, bool) for row in margins for m in row):
                raise ValueError("margin: not all numbers")
        return cls(batch, context, depths, margins)

    @classmethod
    def from_settings(cls, server_arg: Any = None, environ: dict[str, str] | None = None) -> DepthTable | None:
        """The launch's table, or None: when unset (the depth gate is off, silently), or bad
        (off, said in one line). The server argument wins; the environment variable is used
        when it is unset."""
        given = depth_table_setting(server_arg, environ)
        if given is None:
            return None
        name, text = given
        try:
            return cls.parse(text)
        except ValueError as exc:
            logger.warning("depth gate: off, %s is not a depth table: %s", name, exc)
            return None

    def cell(self, batch_size: int, context: int) -> int | str:
        """The table's depth for a step of this batch size and mean KV length."""
        row = bisect.bisect_left(self.batch_bounds, batch_size)
        return self.depths[row][bisect.bisect_left(self.context_bounds, context)]

    def shape(self) -> str:
        return f"{len(self.batch_bounds) + 1}x{len(self.context_bounds) + 1}"

    def inline(self) -> str:
        """The table as one line of JSON, which `parse` reads back: what a launch passes, so
        every rank of every node reads the same table (the margins, never used, left out)."""
        import json

        return json.dumps({"batch": self.batch_bounds, "context": self.context_bounds, "depth": self.depths},
                          separators=(",", ":"))


def depth_table_setting(server_arg: Any = None, environ: dict[str, str] | None = None) -> tuple[str, str] | None:
    """The launch's depth table setting as (the setting's name, its text), or None where it
    gives none: the server argument wins; the environment variable is used when it is unset."""
    if isinstance(server_arg, str) and server_arg.strip():
        return DEPTH_SERVER_ARG, server_arg
    text = (os.environ if environ is None else environ).get(ENV_DEPTH_TABLE, "")
    return (ENV_DEPTH_TABLE, text) if text.strip() else None


def _table_file_text(path: str) -> str:
    """A table file's text: a regular file of at most MAX_TABLE_BYTES, else ValueError. Opened
    without blocking and checked before it is read, so a FIFO or a device named by mistake
    neither hangs nor fills the scheduler's memory at start-up."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise ValueError(f"cannot read {path!r}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path!r} is not a regular file")
        with os.fdopen(fd, "rb") as handle:
            fd = -1  # the handle closes it
            data = handle.read(MAX_TABLE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read {path!r}: {exc.strerror}") from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > MAX_TABLE_BYTES:
        raise ValueError(f"{path!r} is over {MAX_TABLE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path!r} is not UTF-8 text") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bounds(value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or not all(_is_int(v) and v > 0 for v in value):
        raise ValueError(f"{name}: not a list of positive integers")
    if any(b <= a for a, b in zip(value, value[1:])):  # noqa: B905 - Python 3.8 in SGLang 0.4's range
        raise ValueError(f"{name}: bounds not strictly increasing")
    return value


def _matrix(value: Any, name: str, rows: int, columns: int) -> list[list[Any]]:
    if not (isinstance(value, list) and len(value) == rows
            and all(isinstance(row, list) and len(row) == columns for row in value)):
        raise ValueError(f"{name}: not {rows} rows (batch bands) of {columns} (context bands)")
    return value


class DepthGate:
    """The depth of each decode step: the table's cell, mapped to a depth this server runs,
    with the batch gate's hysteresis on leaving depth 0 (the draft state a plain stretch left
    behind costs acceptance at each return); between depths above 0 it follows the table
    at once, as a switch is a pointer swap."""

    def __init__(self, table: DepthTable, launch_depth: int, tiers: dict[int, Any],
                 worker: Any = None, controller: Any = None) -> None:
        self.table = table
        self.launch_depth = launch_depth
        self.tiers = tiers  # depth -> the release's SpecRuntimeState; {} where it has none
        self.worker = worker
        self.controller = controller
        self.depth = launch_depth  # of the last decode step decided
        self.steps_by_depth: dict[int, int] = {}
        self.depth_switches = 0
        self.last_context = 0
        self.metrics: _DepthMetrics | None = None
        self._steps_out = 0  # consecutive gated steps whose cell is above 0
        self._release_policy: Any = None  # the controller's policy, while `_DepthPolicy` stands in

    @classmethod
    def attach(cls, worker: Any, table: DepthTable) -> DepthGate:
        """The depth gate for this worker: its tiers, where the release built them, else the
        launch depth alone (said in one line)."""
        # 0.5.3.x's worker keeps the steps in its server args only.
        launch = int(getattr(worker, "speculative_num_steps", None) or worker.server_args.speculative_num_steps)
        controller = getattr(worker, "adaptive_controller", None)
        states = getattr(controller, "_states", None)
        tiers: dict[int, Any] = {}
        if isinstance(states, dict) and hasattr(worker, "apply_runtime_state"):
            tiers = {int(d): s for d, s in states.items() if int(d) > 0}
        gate = cls(table, launch, tiers, worker, controller if tiers else None)
        wanted = sorted({gate.runs(cell, wanted=True) for row in table.depths for cell in row} - {0})
        missing = [d for d in wanted if d != launch and d not in tiers]
        if missing:
            logger.warning(
                "depth gate: no CUDA-graph tier for depth %s in this server (SGLang builds them "
                "with --speculative-adaptive, from 0.5.12); those cells run at the launch's %d steps",
                ", ".join(map(str, missing)), launch)
        if gate.controller is not None:
            gate._release_policy = gate.controller.params
            gate.controller.params = _DepthPolicy(gate._release_policy, gate)
        return gate

    def runs(self, cell: int | str, wanted: bool = False) -> int:
        """The depth a cell runs at here (`wanted`: the cell's own depth, launch resolved)."""
        depth = self.launch_depth if cell == LAUNCH_DEPTH else int(cell)
        if wanted or depth == 0 or depth in self.tiers:
            return depth
        return self.launch_depth

    def decide(self, gate: BatchGate, batch_size: int, context: int) -> int:
        """This step's depth; 0 is a gated (plain) step. Advances `gate.gated`, its
        hysteresis and switch count as `BatchGate.decide` does."""
        self.last_context = context
        depth = self.runs(self.table.cell(batch_size, context))
        if gate.gated:
            self._steps_out = self._steps_out + 1 if depth > 0 else 0
            if self._steps_out < gate.resume_steps:
                return 0
            self._steps_out = 0
            gate.gated = False
            gate.switches += 1
            logger.info("depth gate: depth %d for %d steps, speculation back on", depth, gate.resume_steps)
        elif depth == 0:
            gate.gated = True
            gate.switches += 1
            logger.info("depth gate: batch %d, context %d: depth 0, speculation off", batch_size, context)
        return depth

    def run_at(self, depth: int) -> None:
        """Put the worker in `depth`'s tier for the step about to run (a gated step, 0, runs
        in whichever tier is in place: its forward is the gate's own), and count the step."""
        if depth > 0:
            state = self.tiers.get(depth)
            if state is not None and self.in_place() != depth:
                self.worker.apply_runtime_state(state)
                self.depth_switches += 1
        self.depth = depth
        self.steps_by_depth[depth] = self.steps_by_depth.get(depth, 0) + 1
        if self.metrics is not None:
            self.metrics.step(depth)

    def step(self, gate: BatchGate, batch: Any, eligible: bool) -> bool:
        """Decide, switch and count one decode step of the scheduler's `batch`; True = gated.
        A step the gate may not gate (`_step_eligible`) speculates in the tier in place."""
        size = len(batch.reqs)
        context = _kv_tokens(batch) // size if size else 0
        depth = self.decide(gate, size, context)
        if depth == 0 and not eligible:
            depth = self.in_place()
        self.run_at(depth)
        return depth == 0

    def in_place(self) -> int:
        """The depth of the tier the worker is in (the launch's where it has no tiers)."""
        return int(getattr(self.worker, "speculative_num_steps", None) or self.launch_depth)

    def prefill_gated(self, gate: BatchGate, batch_size: int) -> bool:
        """Whether requests joining a batch of this size run their prefill without the draft:
        speculation is off, or the table puts the next decode step at depth 0."""
        return gate.gated or self.runs(self.table.cell(batch_size, self.last_context)) == 0

    def hand_back(self) -> None:
        """After an error in the gate: the controller's own policy back, and (0.5.12.x,
        whose policy switches only on acceptance) the worker back in the tier it chose."""
        controller, policy = self.controller, self._release_policy
        self.controller = self._release_policy = None
        if controller is None or policy is None:
            return
        try:
            controller.params = policy
            current = getattr(policy, "current_steps", None)
            state = self.tiers.get(current) if current is not None else None
            if state is not None:
                self.worker.apply_runtime_state(state)
        except Exception as exc:  # noqa: BLE001 - from 0.5.13 the next step's own switch corrects it
            logger.warning("depth gate: the release's tier not restored: %s: %s", type(exc).__name__, exc)

    def describe(self, state: str) -> str:
        """For the decode log line, e.g. `depth gate(3x2): spec, depth 2, by depth 0:10 2:50
        3:7, 4 depth switches`."""
        counts = " ".join(f"{d}:{n}" for d, n in sorted(self.steps_by_depth.items()))
        return (f"depth gate({self.table.shape()}): {state}, depth {self.depth}, "
                f"by depth {counts or '-'}, {self.depth_switches} depth switches")


def _kv_tokens(batch: Any) -> int:
    """The KV tokens a decode step's requests read: the scheduler's CPU sum where it holds one,
    else (from 0.5.13 routinely: a filtered or merged batch, or a backend that needs no CPU
    lengths, leaves the sum None for the forward to recompute) the requests' own lengths,
    counted on the CPU with no device sync."""
    total = batch.seq_lens_sum
    if total is None:
        return sum(req.seqlen for req in batch.reqs)
    return int(total)


class _DepthPolicy:
    """Stands in for the adaptive controller's policy while the depth gate holds the depth:
    its per-batch choice (0.5.13 on) is the depth the gate chose for this step, and measured
    acceptance switches nothing (`on_verify_complete` from 0.5.13, `update` in 0.5.12.x). Any
    other member is the release's. After an error in the gate (`_overlap_gate` off) every
    member is the release's again."""

    def __init__(self, release: Any, depth_gate: DepthGate) -> None:
        self._release = release
        self._depth_gate = depth_gate

    def _held(self) -> bool:
        gate = _overlap_gate
        return gate is not None and gate.depth_gate is self._depth_gate

    def get_steps_for_batch(self, batch_size: int) -> int:
        if self._held():
            depth = self._depth_gate.depth
            # A gated step never reaches the worker's switch; any other keeps the gate's tier.
            return depth if depth in self._depth_gate.tiers else self._depth_gate.in_place()
        return self._release.get_steps_for_batch(batch_size)

    def on_verify_complete(self, *args: Any, **kwargs: Any) -> int | None:
        if self._held():
            return None
        return self._release.on_verify_complete(*args, **kwargs)

    def update(self, *args: Any, **kwargs: Any) -> bool:
        if self._held():
            return False
        return self._release.update(*args, **kwargs)

    @property
    def current_steps(self) -> int:
        if self._held():
            return self._depth_gate.in_place()
        return self._release.current_steps

    def __getattr__(self, name: str) -> Any:
        return getattr(self._release, name)


class _DepthMetrics:
    """`sglang:spec_depth_gate_*` metrics: the depth of the last decode step, and decode steps
    by depth."""

    def __init__(self, depth: Any, steps: Any) -> None:
        self.depth, self.steps = depth, steps

    @classmethod
    def create(cls) -> _DepthMetrics | None:
        try:
            from prometheus_client import Counter, Gauge
        except ImportError:
            return None
        try:
            return cls(
                Gauge("sglang:spec_depth_gate_depth",
                      "Speculation depth (draft steps) of the last decode step; 0 = plain decode.",
                      multiprocess_mode="mostrecent"),
                Counter("sglang:spec_depth_gate_steps", "Decode steps by the depth they ran at.", ["depth"]),
            )
        except Exception:  # noqa: BLE001 - never fail start-up over metrics
            logger.exception("depth gate: no Prometheus metrics")
            return None

    def step(self, depth: int) -> None:
        self.depth.set(depth)
        self.steps.labels(depth=str(depth)).inc()



# ---- the gated step ----------------------------------------------------------------------


class _PlainDecodeAlgorithm:
    """Stands for a speculative algorithm that says "none" where the version's enum has no
    NONE member: every `is_*` check answers as for plain decoding."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def is_none(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        if name.startswith("is_"):
            return lambda *args, **kwargs: False
        return getattr(self._real, name)


_TOKEN_FIELDS = ("verified_id", "bonus_tokens")  # renamed in 0.5.11
_DRAFT_ROWS = ("topk_p", "topk_index", "hidden_states", *_TOKEN_FIELDS)


def _token_field(draft_input: Any) -> str:
    # The draft input's field for the token each request sampled last, whose KV is not
    # written yet (the root of the next verify).
    for name in _TOKEN_FIELDS:
        if getattr(draft_input, name, None) is not None:
            return name
    # Neither set: the one this release's draft input has (the newer name first).
    return next((name for name in reversed(_TOKEN_FIELDS) if hasattr(draft_input, name)), _TOKEN_FIELDS[0])


class _GatedStep:
    """What `prepare_gated_decode` changed on the batch, for `finish_gated_decode`."""

    def __init__(self, draft_input: Any, spec_algorithm: Any, plain: PlainDecode | None) -> None:
        self.draft_input = draft_input
        self.spec_algorithm = spec_algorithm
        self.plain = plain


def prepare_gated_decode(worker: Any, batch: Any) -> bool:
    """Decide this step; when gated, make `batch` a plain one-token DECODE for the target.

    Returns True when the caller must run its target step (without the draft model) and
    then `finish_gated_decode`. Extend batches and mixed DP steps are left alone.
    """
    plain: PlainDecode | None = getattr(worker, "_eaglegate_plain_decode", None)
    if plain is not None:
        plain.leave()  # a step that raised between prepare and finish left it entered
    gate = gate_for(worker)
    if gate is None:
        return False
    batch.eaglegate_gated_step = False  # read by the patched scheduler's spec metrics
    mode = batch.forward_mode
    if mode.is_extend() or getattr(batch, "is_extend_in_batch", False):
        return False
    idle = mode.is_idle()
    if not (idle or mode.is_decode()):
        return False
    try:
        local_size = 0 if idle else len(batch.reqs)
        # Output logprobs of a spec-v1 batch are produced by verify; keep them on that path.
        eligible = not getattr(batch, "return_logprob", False)
        size, eligible = gate.global_size(local_size, eligible, batch)
        gated = gate.decide(size) and eligible
        if not idle:
            gate.record(gated)
    except Exception as exc:  # noqa: BLE001 - nothing changed yet: the step speculates
        worker._eaglegate_batch_gate = None
        gate.fail("the decision", exc)
        return False
    if not gated:
        return False
    runner = worker.target_worker.model_runner
    if idle:
        # An idle DP rank runs the target's idle step too, so collectives match.
        batch._eaglegate_step = _GatedStep(batch.spec_info, batch.spec_algorithm, plain)
        if plain is not None:
            plain.enter(runner)
        return True

    draft_input = batch.spec_info
    batch.output_ids = getattr(draft_input, _token_field(draft_input))
    real_algorithm = batch.spec_algorithm
    # The target sees exactly a plain decode batch: no speculative algorithm (so
    # `prepare_for_decode` takes its plain path and the DECODE graph, not the
    # TARGET_VERIFY one, serves it) and no draft tree.
    batch.spec_algorithm = _plain_algorithm(real_algorithm)
    try:
        # The version's own decode preparation: one KV slot per request (and its SWA
        # eviction), req_to_token written, seq_lens (+cpu, orig) and, where they exist,
        # kv_committed/kv_allocated advanced by one; penalties see the last token.
        batch.prepare_for_decode()
    except BaseException:
        batch.spec_algorithm = real_algorithm
        raise
    batch._eaglegate_step = _GatedStep(draft_input, real_algorithm, plain)
    batch.forward_mode = type(mode).DECODE
    batch.spec_info = None
    if plain is not None:
        plain.enter(runner)
    return True


def finish_gated_decode(worker: Any, batch: Any, next_token_ids: Any) -> None:
    """After the target step: verify's bookkeeping, and the batch back to speculation."""
    step: _GatedStep | None = getattr(batch, "_eaglegate_step", None)
    batch._eaglegate_step = None
    if step is None:
        return
    if step.plain is not None:
        step.plain.leave()
    batch.spec_algorithm = step.spec_algorithm
    batch.spec_info = step.draft_input
    if batch.forward_mode.is_idle() or not batch.reqs:
        return  # an idle DP rank: nothing was prepared
    # The patched scheduler leaves this step out of accept len / spec_accept_length.
    batch.eaglegate_gated_step = True
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
    draft_input = step.draft_input
    if draft_input is None:
        return
    # The sampled token is the next verify's root; the other rows stay as they were.
    setattr(draft_input, _token_field(draft_input), next_token_ids)
    if len(keep) < len(batch.reqs):
        # The scheduler's v1 filter keeps the first rows of the draft state, as after verify.
        for name in _DRAFT_ROWS:
            rows = getattr(draft_input, name, None)
            if rows is not None and hasattr(rows, "__getitem__"):
                setattr(draft_input, name, rows[keep])


# ---- the overlap worker (EAGLEWorkerV2) --------------------------------------------------
#
# Under the overlap scheduler the decode batch is prepared (its KV slots reserved) on the CPU
# while the previous step still runs, and the worker sees a separate ModelWorkerBatch whose
# draft input the FutureMap filled in on the GPU. So the decision is taken where the slots
# are reserved, in the draft input's `prepare_for_decode`, and travels to the worker on
# that draft input object (the one `get_model_worker_batch` hands over): a step reserved
# for one token can never run as a speculative one.
#
# A gated step returns what a speculative step with every draft rejected returns: one token
# per request, accept length 1, and a draft input whose token is the one just sampled and
# whose length is one longer. The token sits in a row of the width the result processing
# reads: 1 from 0.5.12 (the result carries it), `speculative_num_draft_tokens` before. The
# result processing runs unchanged: one token appended, one KV slot committed. The draft's
# top-k and hidden-state rows pass through; its KV for the gated positions is not written
# (docs/gate-patch.md has what that costs in acceptance). From 0.5.13 the scheduler relays the
# draft state between steps through its FutureMap (a gather before the forward, a stash
# after); a gated step relays its sampled token alone (`resolve_gated_relay`,
# `stash_gated_relay`): the other rows would go out and come back unchanged, and a decode
# step as short as the host's own work pays for every op (measured in eaglegate's bench/gpu).

# The result's field for the step's reservation, up to 0.5.5.post3 (renamed in 0.5.4).
_ALLOCATION_FIELDS = ("allocate_lens", "last_batch_allocate_lens")
GATED_DECODE_ATTR = "eaglegate_gated"  # on the draft input: this step was reserved gated
# The FutureMap's gather of the draft state (0.5.13 on), which the relay edit opens with
# `resolve_gated_relay` (codemods/spec_relay.py takes the name from here).
RELAY_RESOLVE = "_resolve_spec_extras"

_overlap_gate: BatchGate | None = None  # the gate of this scheduler process's v2 worker
_last_decode_size = 0  # the running batch of the last decode step this process prepared
# The sampled tokens of the last gated steps, each until the scheduler stashes that step's
# relay (`stash_gated_relay` knows a gated step's payload by them: it carries that tensor). A
# few, not one: a stash the scheduler defers must still find its step's; bounded, since
# without the overlap scheduler nothing is stashed.
_gated_relay_tokens: collections.deque[Any] = collections.deque(maxlen=4)
_relay_map: Any = None  # the scheduler's FutureMap, once a gated step's relay went through it
_accept_ones: Any = None  # a gated step's accept lengths: a slice of these ones

# ---- what the overlap worker's gate relies on in SGLang ----------------------------------
#
# Every attribute, method and enum member of SGLang the gate reads or writes, by the class
# that declares it: (module, class, names). `A|B` in a module or class is the first the
# release has; in a name, either spelling. `?name` is used only where the release has it.
# `name:T|U` says what the release may declare it as: the annotation's types must be among
# these, and `None` must be listed for a field it declares Optional. `patches/gate_contract.py`
# checks this against a release's source (`eaglegate verify`); `_missing_in_server` against
# the live classes and objects before the gate first engages.
RELIES_ON: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("sglang.srt.model_executor.forward_batch_info", "CaptureHiddenMode", ("NULL",)),
    ("sglang.srt.model_executor.forward_batch_info", "ForwardMode", ("is_extend",)),
    ("sglang.srt.speculative.spec_info", "SpeculativeAlgorithm", ("?NONE",)),
    # The decision reads the scheduler's batch; the gated steps read and write the batch the
    # worker gets: a ModelWorkerBatch up to 0.5.12, the scheduler's own batch from 0.5.13.
    ("sglang.srt.managers.schedule_batch", "ScheduleBatch",
     ("reqs", "return_logprob", "return_hidden_states", "?has_grammar", "?seq_lens_sum:int|None")),
    ("sglang.srt.managers.schedule_batch", "Req", ("?seqlen",)),
    ("sglang.srt.managers.schedule_batch", "ModelWorkerBatch|ScheduleBatch",
     ("forward_mode", "spec_info", "spec_algorithm", "seq_lens:Tensor",
      "seq_lens_cpu:Tensor|None", "seq_lens_sum:int|None", "req_pool_indices:Tensor",
      "out_cache_loc:Tensor", "input_ids:Tensor",
      "?capture_hidden_mode:CaptureHiddenMode|None")),
    ("sglang.srt.speculative.eagle_info", "EagleDraftInput",
     ("topk_p:Tensor", "topk_index:Tensor", "hidden_states:Tensor|None",
      "bonus_tokens|verified_id:Tensor", "?new_seq_lens", "?verify_done", "?allocate_lens",
      "?future_indices", "?hidden_size_for", "?dtype_for")),
    ("sglang.srt.managers.utils|sglang.srt.managers.scheduler", "GenerationBatchResult",
     ("next_token_ids", "accept_lens", "next_draft_input", "?speculative_num_draft_tokens",
      "?new_seq_lens", "?allocate_lens|last_batch_allocate_lens")),
    ("sglang.srt.managers.overlap_utils", "FutureMap", ("?output_tokens_buf",)),
    # The depth gate, with a depth table only: the adaptive tiers (0.5.12 on) and the policy
    # it stands in for (`params`: AdaptiveSpeculativeParams, from 0.5.20 any AdaptiveSpecPolicy).
    ("sglang.srt.speculative.adaptive_runtime_state", "AdaptiveController",
     ("?_states", "?params")),
    ("sglang.srt.speculative.adaptive_runtime_state", "SpecRuntimeState",
     ("?speculative_num_steps",)),
    # The members of that policy `_DepthPolicy` overrides: the per-batch choice and the
    # acceptance feed from 0.5.13, the current steps and the acceptance update in 0.5.12.x.
    ("sglang.srt.speculative.adaptive_spec_params", "AdaptiveSpeculativeParams",
     ("?get_steps_for_batch", "?on_verify_complete", "?update", "?current_steps")),
)
# What the depth gate reads of the entries here and below, as (class, member), all optional
# there (the batch gate runs without them): the step's context (`_kv_tokens`: the batch's sum,
# else its requests' lengths), without which no step is placed in a context band; and the
# adaptive tiers it switches between, without which the table collapses to {0, the launch depth}.
DEPTH_READS: tuple[tuple[str, str], ...] = (("ScheduleBatch", "seq_lens_sum"), ("Req", "seqlen"))
# `a|b`: either member. The policy's step choice and acceptance feed are the members
# `_DepthPolicy` overrides: a release that renames one would bypass the gate's choice.
DEPTH_TIERS: tuple[tuple[str, str], ...] = (
    ("EAGLEWorkerV2", "adaptive_controller"), ("EAGLEWorkerV2", "apply_runtime_state"),
    ("AdaptiveController", "_states"), ("AdaptiveController", "params"),
    ("SpecRuntimeState", "speculative_num_steps"),
    ("AdaptiveSpeculativeParams", "get_steps_for_batch|current_steps"),
    ("AdaptiveSpeculativeParams", "on_verify_complete|update"),
)
# The objects the gate finds on the worker, by the class each is, for the same check.
RELIES_ON_OBJECTS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("", "sglang.srt.speculative.eagle_worker_v2", "EAGLEWorkerV2",
     ("server_args", "target_worker", "?topk", "?speculative_num_draft_tokens",
      "?war_fastpath_runner", "?speculative_num_steps", "?adaptive_controller",
      "?apply_runtime_state")),
    ("target_worker", "sglang.srt.managers.tp_worker", "TpModelWorker",
     ("model_runner", "forward_batch_generation")),
    ("target_worker.model_runner", "sglang.srt.model_executor.model_runner", "ModelRunner",
     ("req_to_token_pool", "device", "attn_backend", "spec_algorithm", "server_args",
      "decode_cuda_graph_runner|graph_runner", "_get_attention_backend",
      "?prefill_cuda_graph_runner")),
)


def _required(names: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The required names of a RELIES_ON entry, each as its alternative spellings."""
    return [tuple(name.split(":")[0].split("|")) for name in names if not name.startswith("?")]


def _import_first(modules: str, classes: str) -> Any:
    import importlib

    for module_name in modules.split("|"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for class_name in classes.split("|"):
            found = getattr(module, class_name, None)
            if found is not None:
                return found
    return None


def _declares(cls: Any, name: str) -> bool:
    import dataclasses

    if dataclasses.is_dataclass(cls) and name in {f.name for f in dataclasses.fields(cls)}:
        return True
    return hasattr(cls, name)


def _missing_in_server(worker: Any) -> list[str]:
    """What the gate relies on that this server lacks, as `Class.name`: the classes it
    imports from SGLang and the objects it finds on the worker."""
    missing = []
    for modules, classes, names in RELIES_ON:
        cls = _import_first(modules, classes)
        if cls is None:
            if _required(names):  # a class the gate only reads where it exists may be absent
                missing.append(classes)
            continue
        missing += [f"{cls.__name__}.{'|'.join(alts)}" for alts in _required(names)
                    if not any(_declares(cls, name) for name in alts)]
    for path, _module, class_name, names in RELIES_ON_OBJECTS:
        obj = worker
        for step in filter(None, path.split(".")):
            obj = getattr(obj, step, None)
        if obj is None:
            missing.append(f"{class_name} (the worker's {path})")
            continue
        missing += [f"{class_name}.{'|'.join(alts)}" for alts in _required(names)
                    if not any(hasattr(obj, name) for name in alts)]
    return missing


def _batch_supported(batch: Any) -> bool:
    """Whether the scheduler's batch has what the decision reads; the first time it does
    not, the gate turns itself off (it has not engaged yet: nothing to hand back)."""
    if hasattr(batch, "reqs"):
        return True
    _fail("the decision", AttributeError("the scheduler's batch has no `reqs`"))
    return False


# ---- the gate fails open ----------------------------------------------------------------


def _fail(where: str, exc: BaseException) -> None:
    """Turn the gate off for the life of this server after an error in its own code: one
    log line, and a failure counted where the gate's state shows (the decode log line,
    Prometheus). From here every step is SGLang's own speculative step."""
    global _overlap_gate
    gate, _overlap_gate = _overlap_gate, None
    if gate is not None:  # else already off: said once
        gate.fail(where, exc)


def _passed_on(worker: Any, batch: Any, passed: dict[str, Any]) -> Any:
    """SGLang's own step for `batch` with the gate off: the worker's entry again (its
    speculative branches, since the gate is off now), with the arguments it was called with.
    A step the FutureMap resolved for a gated step (its token rows only) is resolved again
    in full first."""
    if _relay_map is not None and getattr(batch.spec_info, GATED_DECODE_ATTR, False):
        getattr(_relay_map, RELAY_RESOLVE)(batch)
    return worker.forward_batch_generation(batch, **passed)


class _SavedBatch:
    """The worker batch's fields a gated step writes, as they were: put back before a step
    is handed back to SGLang."""

    FIELDS = ("out_cache_loc", "input_ids", "seq_lens", "seq_lens_cpu", "seq_lens_sum",
              "spec_info", "spec_algorithm", "capture_hidden_mode")

    def __init__(self, batch: Any) -> None:
        self.values = {name: getattr(batch, name) for name in self.FIELDS if hasattr(batch, name)}

    def restore(self, batch: Any) -> None:
        for name, value in self.values.items():
            setattr(batch, name, value)


def _overlap_gate_off_reason(worker: Any) -> str | None:
    missing = _missing_in_server(worker)
    if missing:
        return "this SGLang lacks what it relies on: " + ", ".join(missing)
    return parallel_off_reason(getattr(worker, "server_args", None))


# How releases spell attention data parallelism and pipeline parallelism: ServerArgs'
# `enable_dp_attention` up to 0.5.21 (`--enable-dp-attention`), which from 0.5.22 stays false
# while `attn_dp_size` (`--attn-dp-size N`) holds the width; from 0.5.20 also the runtime's
# parallel context (`runtime_context.get_parallel()`), which `attn_dp_enabled` joins in 0.5.22.
DP_ATTENTION_FLAGS = ("enable_dp_attention", "attn_dp_enabled")
DP_ATTENTION_SIZES = ("attn_dp_size",)
PIPELINE_SIZES = ("pp_size",)


def _views(server_args: Any) -> list[Any]:
    views = [server_args]
    try:
        from sglang.srt.runtime_context import get_parallel
    except ImportError:  # before 0.5.20, or not inside SGLang
        return views
    try:
        views.append(get_parallel())
    except Exception:  # noqa: BLE001 - not published yet: the server args alone
        pass
    return views


def _above_one(value: Any) -> bool:
    try:
        return int(value) > 1
    except (TypeError, ValueError):
        return False


def parallel_off_reason(server_args: Any, views: list[Any] | None = None) -> str | None:
    """Why the gate must stay off under this launch's parallelism, or None."""
    for view in _views(server_args) if views is None else views:
        if view is None:
            continue
        if any(getattr(view, name, False) is True for name in DP_ATTENTION_FLAGS) or any(
            _above_one(getattr(view, name, 1)) for name in DP_ATTENTION_SIZES
        ):
            # The decision is taken while the batch is prepared, before the ranks exchange
            # their sizes: ranks could split between a plain step and draft/verify collectives.
            return "data-parallel attention is on"
        if any(_above_one(getattr(view, name, 1)) for name in PIPELINE_SIZES):
            # A rank that is not the last stage gets proxy tensors from the target, not tokens.
            return "pipeline parallelism is on"
    # SGLang's adaptive speculation stays on below the threshold: its tiers switch only in
    # the worker's speculative branch, which a gated step never enters, and the patched
    # result processing keeps gated steps out of its accept statistics.
    return None


def init_overlap_batch_gate(worker: Any) -> None:
    """At the end of `EAGLEWorkerV2.__init__` (from 0.5.14 its `init_cuda_graphs`): the gate,
    the target's DECODE graphs, the log line and metrics. Does nothing when the gate is off,
    and leaves it off, saying why in one line, when this server lacks what it relies on.
    Never raises: a failure here leaves the server as unpatched SGLang."""
    global _overlap_gate
    _overlap_gate = None
    try:
        table = DepthTable.from_settings(getattr(getattr(worker, "server_args", None), DEPTH_SERVER_ARG, None))
        gate = gate_for(worker) if table is None else _gate_for_table(worker, table)
        if gate is None:
            return
        reason = _overlap_gate_off_reason(worker)
        if reason is not None:
            logger.warning("batch gate: off because %s", reason)
            worker._eaglegate_batch_gate = None
            return
        if table is not None:
            gate.depth_gate = DepthGate.attach(worker, table)
            if getattr(getattr(worker, "server_args", None), "enable_metrics", False):
                gate.depth_gate.metrics = _DepthMetrics.create()
        worker._eaglegate_plain_decode = build_plain_decode(worker, full_hidden=False)
        if worker._eaglegate_plain_decode is None:
            worker._eaglegate_batch_gate = None
            return
        compile_decode_positions(worker.target_worker.model_runner)
        worker._eaglegate_capture_argument = _takes_capture_argument(worker.target_worker)
        _add_to_decode_log(gate)
        if getattr(getattr(worker, "server_args", None), "enable_metrics", False):
            gate.metrics = _GateMetrics.create(gate)
    except Exception as exc:  # noqa: BLE001 - the server starts as unpatched SGLang
        logger.error("batch gate: off: %s in its start-up: %s", type(exc).__name__, exc)
        depth_gate = getattr(getattr(worker, "_eaglegate_batch_gate", None), "depth_gate", None)
        if depth_gate is not None:
            depth_gate.hand_back()
        worker._eaglegate_batch_gate = None
        return
    _overlap_gate = gate
    logger.info("batch gate: on (overlap worker), %s", gate.describe())


def _gate_for_table(worker: Any, table: DepthTable) -> BatchGate | None:
    """The gate when the launch gives a depth table: the batch gate's own (its threshold
    then unused: the table decides), or one built for the table alone, off for the same
    targets (hybrid) as the batch gate."""
    gate = gate_for(worker)
    if gate is None and not _hybrid_target(worker):
        resume = _positive_int(os.environ.get(ENV_RESUME_STEPS)) or DEFAULT_RESUME_STEPS
        # The threshold only names the gate here: the largest batch bound of the table.
        gate = BatchGate(table.batch_bounds[-1] if table.batch_bounds else 1, resume_steps=resume)
        worker._eaglegate_batch_gate = gate
    return gate


def _step_eligible(batch: Any) -> bool:
    # Logprobs and returned hidden states come from verify's own layout; a grammar's state
    # runs one step behind under overlap, and the speculative path has no delayed sampling.
    return not (
        getattr(batch, "return_logprob", False)
        or getattr(batch, "return_hidden_states", False)
        or getattr(batch, "has_grammar", False)
    )


def decode_alloc_len(draft_input: Any, batch: Any, alloc_len: Any) -> Any:
    """The per-request KV reservation of this decode step, in the draft input's
    `prepare_for_decode`: `alloc_len`, the speculative value, unchanged. Decides the step and
    marks `draft_input`. Never raises.

    A gated step reserves what a speculative step reserves (a plain step writes one slot of
    it), so any gated step can still be handed back to SGLang's speculative path
    (`_hand_back`): the reservation is the one that path expects."""
    if hasattr(draft_input, "__dict__") and GATED_DECODE_ATTR in vars(draft_input):
        return alloc_len  # a release that reads the reservation once per request: decided
    global _last_decode_size
    gated = False
    gate = _overlap_gate
    if gate is not None:
        try:
            if not _batch_supported(batch):
                return alloc_len
            _last_decode_size = len(batch.reqs)
            if gate.depth_gate is None:
                gated = gate.decide(len(batch.reqs)) and _step_eligible(batch)
            else:
                gated = gate.depth_gate.step(gate, batch, _step_eligible(batch))
            gate.record(gated)
        except Exception as exc:  # noqa: BLE001 - a broken decision speculates, as unpatched
            _fail("the decision", exc)
            gated = False
    try:
        setattr(draft_input, GATED_DECODE_ATTR, gated)
    except Exception:  # noqa: BLE001 - an input that takes no attribute speculates
        pass
    return alloc_len


def decode_alloc_window(draft_input: Any, batch: Any, alloc_len: Any) -> Any:
    """The reservation `<batch>.seq_lens + alloc_len` of a release that reserves a window over
    the batch's lengths (0.5.3.post2 to 0.5.5.post3), returned unchanged after the step is
    decided (as `decode_alloc_len` decides it, once per draft input). Never raises.

    Those schedulers free a request that finished while a step was in flight as the last
    `ALLOC_LEN_PER_DECODE` slots below the step's `allocate_lens`: a narrower window would
    free slots of committed tokens. A gated step still allocates one new slot per request,
    since its window moves by the one token the step before wrote."""
    decode_alloc_len(draft_input, batch, alloc_len)
    return alloc_len


def is_gated_decode(batch: Any) -> bool:
    """Whether this worker batch runs as a gated (plain) step: the gate is on and the step
    was decided gated when its slots were reserved."""
    if _overlap_gate is None:
        return False  # off, or turned off since the step was decided: SGLang's own step
    try:
        return bool(getattr(getattr(batch, "spec_info", None), GATED_DECODE_ATTR, False))
    except Exception as exc:  # noqa: BLE001
        _fail("the gated-step check", exc)
        return False


def _prefill_capture_mode(runner: Any) -> Any:
    """The hidden-state capture the target's prefill CUDA graphs were captured with (0.5.14
    on: FULL for an EAGLE target), or None where the runner has no such graphs. Up to 0.5.16
    they replay only for that mode (from 0.5.17 for any mode not above it): a prefill asking
    for none there runs eagerly, its kernels launched one by one from the scheduler's thread."""
    graphs = getattr(runner, "prefill_cuda_graph_runner", None)
    return getattr(graphs, "capture_hidden_mode", None)


def _takes_capture_argument(target_worker: Any) -> bool:
    """Whether the target worker's forward takes the hidden-state capture as an argument
    (0.5.16 on), for a batch without a field for it."""
    import inspect

    parameters = inspect.signature(target_worker.forward_batch_generation).parameters
    return "capture_hidden_mode" in parameters


def _capture_hidden_mode(name: str) -> Any:
    """The member `name` of the release's `CaptureHiddenMode`."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    return getattr(CaptureHiddenMode, name)


def _target_forward(worker: Any, batch: Any, saved: _SavedBatch) -> Any:
    """The target's forward of `batch` as a plain (non-speculative) batch, through the
    target's graphs: the gate's DECODE graphs for a decode step, for a prefill the prefill
    graphs the version captured, with the hidden-state capture they were captured with. The
    batch's speculative fields come back afterwards: from 0.5.13 the worker gets the
    scheduler's own batch, which reads them after the call."""
    runner = worker.target_worker.model_runner
    prefill = batch.forward_mode.is_extend()
    capture = _prefill_capture_mode(runner) if prefill else None
    # `saved`: the entry's snapshot; nothing before the forward changed these three fields.
    batch.spec_info = None
    batch.spec_algorithm = _plain_algorithm(batch.spec_algorithm)
    kwargs = {}
    if hasattr(batch, "capture_hidden_mode"):
        # The batch's field, where it has one. Its value is no guide: on 0.5.13 to 0.5.15.post1
        # the scheduler's batch leaves it None until a speculative step sets it.
        batch.capture_hidden_mode = capture or _capture_hidden_mode("NULL")
    elif capture is not None and getattr(worker, "_eaglegate_capture_argument", False):
        kwargs["capture_hidden_mode"] = capture  # 0.5.16 on: the target worker's argument
    plain: PlainDecode | None = getattr(worker, "_eaglegate_plain_decode", None)
    if plain is not None and not prefill:
        plain.enter(runner)
    try:
        return worker.target_worker.forward_batch_generation(batch, **kwargs)
    finally:
        if plain is not None:
            plain.leave()
        for name in ("spec_algorithm", "spec_info", "capture_hidden_mode"):
            if name in saved.values:
                setattr(batch, name, saved.values[name])
        _hand_over_read_done(worker, runner)


def _hand_over_read_done(worker: Any, target_runner: Any) -> None:
    """From 0.5.14 the scheduler fences its next buffer writes on a read-done event of the
    worker's `war_fastpath_runner`, for EAGLE the draft runner, whose draft extend records it.
    A gated step has no draft extend; the target's DECODE graph replay recorded the event on
    the target runner instead, so it moves to where the scheduler looks. None (an eager
    step) makes the scheduler wait for the whole forward, which is always safe."""
    name = "war_fastpath_read_done_event"
    fast = getattr(worker, "war_fastpath_runner", None)
    if fast is None or fast is target_runner or not hasattr(target_runner, name):
        return
    setattr(fast, name, getattr(target_runner, name))
    setattr(target_runner, name, None)


def _publish(result: Any, on_publish: Any, new_seq_lens: Any) -> None:
    # 0.5.13 on: the lengths travel on the result and through the scheduler's publish hook.
    if hasattr(result, "new_seq_lens"):
        result.new_seq_lens = new_seq_lens
    if on_publish is not None:
        on_publish(new_seq_lens)


def resolve_gated_relay(future_map: Any, batch: Any) -> bool:
    """First in the FutureMap's `_resolve_spec_extras` (0.5.13 on): for a batch reserved
    gated, gather the last sampled token only (the plain decode's input) and return True;
    the top-k and hidden-state rows stay in the FutureMap, where a gated step leaves them.
    False for any other batch, whose resolve then runs as the version wrote it. Never raises:
    after an error the gate is off and the release's resolve runs."""
    global _relay_map
    if not is_gated_decode(batch):
        return False
    try:
        draft_input = batch.spec_info
        indices = getattr(draft_input, "future_indices", None)
        tokens = getattr(future_map, "output_tokens_buf", None)
        if indices is None or tokens is None:
            return False
        setattr(draft_input, _token_field(draft_input), tokens[indices])
    except Exception as exc:  # noqa: BLE001
        _fail("the relay's resolve", exc)
        return False
    _relay_map = future_map  # a gated step handed back resolves again in full through it
    return True


def stash_gated_relay(future_map: Any, indices: Any, payload: Any) -> bool:
    """First in the FutureMap's `stash` (0.5.13 on): for the relay of a gated step (its
    payload carries the tokens `run_gated_decode` sampled), write those tokens to their rows
    as every version's stash writes them, and return True: the payload's other rows are the
    ones `resolve_gated_relay` did not gather, so they must not be written back. False for any
    other payload, which the version's own stash then writes. Never raises."""
    try:
        tokens = getattr(payload, _token_field(payload), None)
        # By identity: `==` on tensors compares their elements.
        mine = next((i for i, pending in enumerate(_gated_relay_tokens) if pending is tokens), None)
        if tokens is None or mine is None:
            return False
        del _gated_relay_tokens[mine]  # stashed once: the same payload again is the release's
        buffer = future_map.output_tokens_buf
        buffer[indices] = _cast(tokens, buffer.dtype)
    except Exception as exc:  # noqa: BLE001
        _fail("the relay's stash", exc)
        return False
    return True


def _cast(tensor: Any, dtype: Any) -> Any:
    """`tensor` in `dtype`; itself where it already is, without the op a no-op `.to` still
    dispatches (a gated step is as short as the host's work: a profile of one in eaglegate's
    bench/gpu)."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def _ones_int32(size: int, device: Any) -> Any:
    """`size` int32 ones on `device`: a view of a buffer made once (and again when a batch
    outgrows it), not a new tensor and fill each step. Nothing writes a result's accept
    lengths; they are read and copied to the host."""
    import torch

    global _accept_ones
    ones = _accept_ones
    if ones is None or ones.shape[0] < size or ones.device != device:
        ones = torch.ones(max(size, 256), dtype=torch.int32, device=device)
        _accept_ones = ones
    return ones[:size]


def run_gated_decode(worker: Any, batch: Any, **passed: Any) -> Any:
    """One plain DECODE step of the target for a batch whose draft input the FutureMap
    resolved (a ModelWorkerBatch up to 0.5.12, the scheduler's batch from 0.5.13); `passed`
    is what the worker's entry was called with after the batch, by name (from 0.5.13 the
    scheduler's publish hook, from 0.5.17 its grammar barrier, from 0.5.19 the pipeline's
    proxy tensors, which are None here: the gate is off with pipeline parallelism). Returns
    the result in the speculative layout (see above).

    Never raises: after an error in the gate's code the batch's fields are put back, the
    gate turns itself off, and the step is SGLang's own speculative step (`_passed_on`). The
    step reserved what a speculative step reserves, so that is always possible."""
    saved = _SavedBatch(batch)
    try:
        return _gated_decode(worker, batch, saved, passed.get("on_publish"), passed.get("grammar_barrier"))
    except Exception as exc:  # noqa: BLE001 - never into the scheduler
        saved.restore(batch)
        _fail("a gated decode step", exc)
    return _passed_on(worker, batch, passed)


def _gated_decode(worker: Any, batch: Any, saved: _SavedBatch, on_publish: Any, grammar_barrier: Any) -> Any:
    """`run_gated_decode`'s step. The step does not depend on the adaptive tier the worker
    is in: the target's backend and graphs in place are put back after the forward, and the
    result records its own row width."""
    import copy

    import torch

    draft_input = batch.spec_info
    runner = worker.target_worker.model_runner
    device_module = torch.get_device_module(runner.device)
    seq_lens = batch.seq_lens
    # seq_lens was made on the schedule stream; keep it alive while this stream reads it.
    seq_lens.record_stream(device_module.current_stream())
    field = _token_field(draft_input)
    tokens = getattr(draft_input, field)
    size = int(seq_lens.shape[0])
    new_seq_lens = seq_lens + 1
    published = None
    if hasattr(draft_input, "verify_done"):
        # The next batch's preparation waits on this event for new_seq_lens, which does not
        # depend on the forward: record it now, so the CPU does not wait for the forward.
        published = device_module.Event()
        published.record()
    elif on_publish is not None:
        on_publish(new_seq_lens)  # the same, through 0.5.13's hook: before the forward
        on_publish = None
    # A plain decode batch: the last sampled token in the slot the preparation reserved at
    # position seq_lens, positions from seq_lens (clamp_position), no draft tree.
    req_to_token = runner.req_to_token_pool.req_to_token
    batch.out_cache_loc = _cast(req_to_token[batch.req_pool_indices, seq_lens], torch.int64)
    batch.input_ids = _cast(tokens, torch.int64)  # the FutureMap's are int64 already (0.5.13 on)
    batch.seq_lens = new_seq_lens
    if batch.seq_lens_cpu is not None:  # None from 0.5.13 where the backend needs none
        batch.seq_lens_cpu = batch.seq_lens_cpu + 1
    if batch.seq_lens_sum is not None:  # None from 0.5.13 too: the forward recomputes it
        batch.seq_lens_sum = batch.seq_lens_sum + size
    result = _target_forward(worker, batch, saved)
    if grammar_barrier is not None and getattr(batch, "has_grammar", False):
        # Where verify calls it: after the target's launch, for a batch with a grammar (the
        # gate never gates one, `_step_eligible`, so this only keeps the order if it did).
        grammar_barrier()
    sampled = result.next_token_ids
    if hasattr(result, "speculative_num_draft_tokens"):
        # From 0.5.12 result processing reads each request's row width from the result: one
        # token per request, as a plain decode returns them.
        stride, rows = 1, sampled
    else:
        # Before, it reads the worker's `speculative_num_draft_tokens`: rows that wide, the
        # one accepted token at the start of each.
        stride = int(worker.speculative_num_draft_tokens)
        rows = torch.zeros((size, stride), dtype=sampled.dtype, device=sampled.device)
        rows[:, 0] = sampled
    next_input = copy.copy(draft_input)
    vars(next_input).pop(GATED_DECODE_ATTR, None)  # the next step is decided afresh
    next_tokens = _cast(sampled, tokens.dtype)
    setattr(next_input, field, next_tokens)
    if hasattr(draft_input, "new_seq_lens"):  # up to 0.5.12: the lengths ride on the input
        next_input.new_seq_lens = new_seq_lens
    if published is not None:
        next_input.verify_done = published
    accept_lens = _ones_int32(size, sampled.device)
    allocated = getattr(draft_input, "allocate_lens", None)
    # Nothing can fail from here on: the result is the step's.
    _publish(result, on_publish, new_seq_lens)
    result.next_token_ids = rows.reshape(-1)
    result.accept_lens = accept_lens
    if allocated is not None:
        # Up to 0.5.5.post3 the result processing frees a finished request's over-allocation
        # from the step's reservation: `allocate_lens` (0.5.4 on), `last_batch_allocate_lens`
        # (0.5.3.x); the verify step returns the draft input's, as set by the preparation.
        for name in _ALLOCATION_FIELDS:
            if hasattr(result, name):
                setattr(result, name, allocated)
    result.next_draft_input = next_input
    if hasattr(result, "speculative_num_draft_tokens"):
        result.speculative_num_draft_tokens = stride
    result.eaglegate_gated_step = True  # the patched scheduler leaves it out of accept length
    _gated_relay_tokens.append(next_tokens)  # this step's relay: its token alone (stash_gated_relay)
    return result


def is_gated_prefill(batch: Any) -> bool:
    """Whether this extend batch runs as a plain prefill: the gate has speculation off, or
    these requests joining the running batch take it above the threshold (so its next decode
    step will be gated), and the batch asks nothing speculation must give."""
    gate = _overlap_gate
    if gate is None:
        return False
    try:
        mode = getattr(batch, "forward_mode", None)
        if mode is None or not mode.is_extend() or not _step_eligible(batch):
            return False
        seq_lens = getattr(batch, "seq_lens", None)
        joining = 0 if seq_lens is None else len(seq_lens)
        # The last decode step's size may count requests that have finished since: a prefill
        # misjudged that way only starts those requests with empty draft rows.
        if gate.depth_gate is not None:
            return gate.depth_gate.prefill_gated(gate, _last_decode_size + joining)
        return gate.gated or _last_decode_size + joining > gate.threshold
    except Exception as exc:  # noqa: BLE001
        _fail("the gated-prefill check", exc)
        return False


def _draft_hidden_spec(draft: Any) -> tuple[Any, Any]:
    """Width and dtype of the hidden-state rows the draft carries between steps, as the
    version computes them: classmethods of the draft input up to 0.5.14, a function of the
    draft runner in `eagle_utils` from 0.5.15, the runner's config before either."""
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    width_of = getattr(EagleDraftInput, "hidden_size_for", None)
    dtype_of = getattr(EagleDraftInput, "dtype_for", None)
    if width_of is not None and dtype_of is not None:
        return width_of(draft), dtype_of(draft)
    runner: Any = getattr(draft, "draft_runner", None) or getattr(draft, "draft_model_runner", None)
    try:
        from sglang.srt.speculative.eagle_utils import get_draft_recurrent_hidden_state_spec
    except ImportError:
        return runner.model_config.hidden_size, runner.model_config.dtype
    return get_draft_recurrent_hidden_state_spec(runner)


def _empty_draft_rows(worker: Any, size: int, tokens: Any, seq_lens: Any) -> Any:
    """A draft input for requests whose prefill the draft model did not see: the sampled
    token and the lengths are real, the top-k and hidden-state rows zeros of the shapes the
    version's FutureMap stores."""
    import dataclasses

    import torch
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    # 0.5.3.x: the overlap worker is its own draft worker.
    width, dtype = _draft_hidden_spec(getattr(worker, "draft_worker", worker))
    device = tokens.device
    topk = int(getattr(worker, "topk", 1) or 1)
    fields = {f.name: f.init for f in dataclasses.fields(EagleDraftInput)}
    values: dict[str, Any] = {
        _TOKEN_FIELDS[1] if _TOKEN_FIELDS[1] in fields else _TOKEN_FIELDS[0]: tokens,
        "topk_p": torch.zeros((size, topk), dtype=torch.float32, device=device),
        "topk_index": torch.zeros((size, topk), dtype=torch.int64, device=device),
        "hidden_states": (
            torch.zeros((size, width), dtype=dtype, device=device) if width else None
        ),
        "new_seq_lens": seq_lens,
        "allocate_lens": seq_lens,  # up to 0.5.5.post3: what the prefill reserved
        "num_tokens_per_req": 1,
        "num_tokens_for_logprob_per_req": 1,
        "num_tokens_per_batch": 1,  # the names up to 0.5.5.post3
        "num_tokens_for_logprob_per_batch": 1,
    }
    rows = EagleDraftInput(**{k: v for k, v in values.items() if fields.get(k)})
    for name, value in values.items():
        if name in fields and not fields[name]:
            setattr(rows, name, value)
    return rows


def run_gated_prefill(worker: Any, batch: Any, **passed: Any) -> Any:
    """The target's prefill of an extend batch while the gate has speculation off, through
    the target's prefill graphs where the version has them, and no draft prefill. The draft
    state of these requests starts empty: they speculate with poor drafts until their first
    speculative step refreshes it. `passed` as for `run_gated_decode`; never raises, as it."""
    saved = _SavedBatch(batch)
    try:
        result = _target_forward(worker, batch, saved)
        tokens = result.next_token_ids
        rows = _empty_draft_rows(worker, int(tokens.shape[0]), tokens, batch.seq_lens)
    except Exception as exc:  # noqa: BLE001 - never into the scheduler
        saved.restore(batch)
        _fail("a gated prefill", exc)
        return _passed_on(worker, batch, passed)
    # After a prefill the length is the prompt's: the first decode step's input is the
    # sampled token, not yet in the KV cache.
    _publish(result, passed.get("on_publish"), batch.seq_lens)
    result.next_draft_input = rows
    return result
