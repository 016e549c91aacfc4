"""The overlap worker's gate (batch_gate's EAGLEWorkerV2 half), run on recording doubles.

torch is replaced by a small NumPy-backed stand-in with the few tensor operations the gated
step uses, and `sglang.srt.speculative.eagle_info` by a dataclass shaped like 0.5.12's
`EagleDraftInput`; the gate module itself is the real file. What this establishes: where the
decision is taken and what it reserves, what the target forward of a gated decode and of a
gated prefill sees, the result layout the scheduler's FutureMap and result processing read,
the resume, and that ranks of a data-parallel-attention launch never split (the gate is off
there). What it cannot: that SGLang's kernels accept it (bench/gpu runs that on an H200).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import pytest

GATE_FILE = Path(__file__).resolve().parents[1] / "eaglegate" / "patches" / "gate_module.py"


class T:
    """A tensor stand-in over a NumPy array."""

    def __init__(self, values, dtype=None, device="cuda"):
        self.a = np.array(values, dtype=dtype)
        self.device = device
        self.streams: list = []

    @property
    def dtype(self):
        return self.a.dtype.type

    @property
    def shape(self):
        return self.a.shape

    @staticmethod
    def _raw(x):
        return x.a if isinstance(x, T) else x

    def __add__(self, other):
        return T(self.a + self._raw(other), device=self.device)

    def __getitem__(self, key):
        key = tuple(map(self._raw, key)) if isinstance(key, tuple) else self._raw(key)
        return T(self.a[key], device=self.device)

    def __setitem__(self, key, value):
        self.a[key] = self._raw(value)

    def __len__(self):
        return len(self.a)

    def to(self, dtype):
        return T(self.a.astype(dtype), device=self.device)

    def reshape(self, *shape):
        return T(self.a.reshape(*shape), device=self.device)

    def record_stream(self, stream):
        self.streams.append(stream)

    def tolist(self):
        return self.a.tolist()


class Event:
    recorded = 0

    def record(self):
        Event.recorded += 1
        self.order = Event.recorded


def fake_torch():
    torch = types.ModuleType("torch")
    torch.int64, torch.int32, torch.float32, torch.bfloat16 = np.int64, np.int32, np.float32, np.float16
    device = types.SimpleNamespace(current_stream=lambda: "forward stream", Event=Event)
    torch.get_device_module = lambda _device: device
    torch.zeros = lambda shape, dtype=None, device="cuda": T(np.zeros(shape), dtype, device)
    torch.ones = lambda shape, dtype=None, device="cuda": T(np.ones(shape), dtype, device)
    return torch


@dataclasses.dataclass
class EagleDraftInput:
    """0.5.12's draft input: the fields the gate reads and the FutureMap stores."""

    topk_p: T = None
    topk_index: T = None
    hidden_states: T = None
    bonus_tokens: T = None
    num_tokens_per_req: int = -1
    num_tokens_for_logprob_per_req: int = -1
    new_seq_lens: T = None
    verify_done: Event = None
    future_indices: object = dataclasses.field(default=None, init=False)

    @classmethod
    def hidden_size_for(cls, worker):
        return worker.draft_runner.model_config.spec_hidden_size

    @classmethod
    def dtype_for(cls, worker):
        return worker.draft_runner.model_config.dtype


@pytest.fixture()
def gate(monkeypatch):
    monkeypatch.delenv("SGLANG_SPEC_BATCH_GATE_THRESHOLD", raising=False)
    monkeypatch.delenv("SGLANG_SPEC_BATCH_GATE_RESUME", raising=False)
    monkeypatch.delenv("SGLANG_SPEC_BATCH_GATE_RESUME_STEPS", raising=False)
    monkeypatch.setitem(sys.modules, "torch", fake_torch())
    for name in ("sglang", "sglang.srt", "sglang.srt.speculative"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    eagle_info = types.ModuleType("sglang.srt.speculative.eagle_info")
    eagle_info.EagleDraftInput = EagleDraftInput
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.eagle_info", eagle_info)
    spec = importlib.util.spec_from_file_location("batch_gate_overlap_under_test", GATE_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Algorithm(enum.Enum):
    NONE = enum.auto()
    EAGLE3 = enum.auto()

    def is_none(self):
        return self is Algorithm.NONE

    def is_standalone(self):
        return False


class Capture(enum.Enum):
    NULL = 0
    FULL = 2


class Mode(enum.Enum):
    EXTEND = 1
    DECODE = 2

    def is_extend(self):
        return self is Mode.EXTEND


class GraphRunner:
    def __init__(self, runner):
        self.mode = "DECODE" if runner.spec_algorithm.is_none() else "TARGET_VERIFY"
        self.full_hidden = runner.server_args.enable_return_hidden_states
        self.max_bs = 8


class TargetWorker:
    """Records what the target forward saw, and samples 100 + its sequence length."""

    def __init__(self, runner):
        self.model_runner = runner
        self.seen: list[dict] = []

    def forward_batch_generation(self, batch):
        runner = self.model_runner
        self.seen.append({
            "input_ids": batch.input_ids.tolist(),
            "out_cache_loc": batch.out_cache_loc.tolist(),
            "seq_lens": batch.seq_lens.tolist(),
            "spec_info": batch.spec_info,
            "algorithm": batch.spec_algorithm,
            "capture": getattr(batch, "capture_hidden_mode", None),
            "graphs": runner.graph_runner.mode,
            "backend": runner.attn_backend,
        })
        sampled = T([100 + n for n in batch.seq_lens.tolist()], np.int64)
        return types.SimpleNamespace(next_token_ids=sampled, speculative_num_draft_tokens=None)


def make_worker(threshold=4, **server_args):
    runner = types.SimpleNamespace(
        server_args=types.SimpleNamespace(enable_return_hidden_states=False),
        spec_algorithm=Algorithm.EAGLE3,
        attn_backend="verify backend",
        init_new_workspace=False,
        device="cuda",
        # req_to_token[r, p] = 1000 * r + p: the KV slot of request r's position p.
        req_to_token_pool=types.SimpleNamespace(
            req_to_token=T(np.arange(4)[:, None] * 1000 + np.arange(64)[None, :], np.int32)
        ),
        _get_attention_backend=lambda **kwargs: "decode backend",
    )
    runner.graph_runner = GraphRunner(runner)
    args = {"speculative_batch_gate_threshold": threshold, "enable_metrics": False,
            "enable_dp_attention": False, "speculative_adaptive": False, **server_args}
    return types.SimpleNamespace(
        server_args=types.SimpleNamespace(**args),
        target_worker=TargetWorker(runner),
        draft_worker=types.SimpleNamespace(draft_runner=types.SimpleNamespace(
            model_config=types.SimpleNamespace(spec_hidden_size=6, dtype=np.float16))),
        speculative_num_draft_tokens=4,
        topk=1,
    )


def schedule_batch(size, **flags):
    values = {"return_logprob": False, "return_hidden_states": False, "has_grammar": False, **flags}
    return types.SimpleNamespace(reqs=[object()] * size, **values)


def draft_input(size):
    return EagleDraftInput(
        topk_p=T(np.full((size, 1), 0.5), np.float32),
        topk_index=T(np.full((size, 1), 7), np.int64),
        hidden_states=T(np.ones((size, 6)), np.float16),
        bonus_tokens=T([11 + i for i in range(size)], np.int32),
        new_seq_lens=T([10 + i for i in range(size)], np.int64),
    )


def worker_batch(spec_info, size):
    seq_lens = T([10 + i for i in range(size)], np.int64)
    return types.SimpleNamespace(
        forward_mode=Mode.DECODE, spec_info=spec_info, seq_lens=seq_lens,
        seq_lens_cpu=np.array([10 + i for i in range(size)]), seq_lens_sum=sum(range(10, 10 + size)),
        req_pool_indices=T(list(range(size)), np.int64), input_ids=None, out_cache_loc=None,
        spec_algorithm=Algorithm.EAGLE3, capture_hidden_mode=Capture.FULL,
    )


def test_above_the_threshold_a_step_reserves_one_slot_and_runs_the_targets_plain_decode(gate):
    worker = make_worker(threshold=2)
    gate.init_overlap_batch_gate(worker)
    runner = worker.target_worker.model_runner
    assert (runner.graph_runner.mode, runner.attn_backend) == ("TARGET_VERIFY", "verify backend")
    spec = draft_input(3)
    # The draft input's prepare_for_decode asks once per step (some releases once per request).
    # The first gated step after a speculative one keeps the speculative reservation: the step
    # still in flight may add num_draft_tokens tokens before this one writes.
    assert gate.decode_alloc_len(spec, schedule_batch(3), 4) == 4
    assert gate.decode_alloc_len(spec, schedule_batch(3), 4) == 4
    assert gate.gate_for(worker).gated_steps == 1
    batch = worker_batch(spec, 3)
    assert gate.is_gated_decode(batch)
    result = gate.run_gated_decode(worker, batch)

    seen = worker.target_worker.seen[-1]
    assert seen["input_ids"] == [11, 12, 13]  # the last sampled token of each request
    assert seen["out_cache_loc"] == [10, 1011, 2012]  # its slot at position seq_lens
    assert seen["seq_lens"] == [11, 12, 13]
    assert seen["spec_info"] is None and seen["algorithm"] is Algorithm.NONE
    assert seen["capture"] is Capture.NULL  # the mode the DECODE graphs were captured with
    assert (seen["graphs"], seen["backend"]) == ("DECODE", "decode backend")
    assert (runner.graph_runner.mode, runner.attn_backend) == ("TARGET_VERIFY", "verify backend")
    assert batch.seq_lens_cpu.tolist() == [11, 12, 13] and batch.seq_lens_sum == 36

    # The speculative layout: rows of num_draft_tokens, one accepted token at the start of each.
    assert result.next_token_ids.tolist() == [111, 0, 0, 0, 112, 0, 0, 0, 113, 0, 0, 0]
    assert result.accept_lens.tolist() == [1, 1, 1] and result.accept_lens.dtype is np.int32
    assert result.speculative_num_draft_tokens == 4
    assert result.eaglegate_gated_step is True
    nxt = result.next_draft_input
    assert nxt is not spec and nxt.bonus_tokens.tolist() == [111, 112, 113]
    assert nxt.bonus_tokens.dtype is np.int32  # the dtype the FutureMap's buffer has
    assert nxt.new_seq_lens.tolist() == [11, 12, 13]
    assert nxt.verify_done is not None and nxt.verify_done is not spec.verify_done
    assert nxt.topk_index is spec.topk_index and nxt.hidden_states is spec.hidden_states
    assert gate.GATED_DECODE_ATTR not in vars(nxt)  # the next step is decided afresh
    assert gate.decode_alloc_len(nxt, schedule_batch(3), 4) == 1  # after a gated step: one slot


def test_the_published_lengths_are_recorded_before_the_forward(gate):
    worker = make_worker(threshold=1)
    gate.init_overlap_batch_gate(worker)
    spec = draft_input(2)
    gate.decode_alloc_len(spec, schedule_batch(2), 4)
    batch = worker_batch(spec, 2)
    seq_lens = batch.seq_lens
    before = Event.recorded
    result = gate.run_gated_decode(worker, batch)
    assert result.next_draft_input.verify_done.order == before + 1
    assert seq_lens.streams == ["forward stream"]  # kept alive for the forward stream


def test_below_the_threshold_and_ineligible_batches_speculate_with_their_own_reservation(gate):
    worker = make_worker(threshold=4)
    gate.init_overlap_batch_gate(worker)
    spec = draft_input(3)
    assert gate.decode_alloc_len(spec, schedule_batch(3), 4) == 4
    assert not gate.is_gated_decode(worker_batch(spec, 3))
    for flag in ("return_logprob", "return_hidden_states", "has_grammar"):
        spec = draft_input(8)
        assert gate.decode_alloc_len(spec, schedule_batch(8, **{flag: True}), 4) == 4
        assert not gate.is_gated_decode(worker_batch(spec, 8))


def test_resume_after_gated_steps_speculates_again_below_the_lower_mark(gate):
    worker = make_worker(threshold=8)
    gate.init_overlap_batch_gate(worker)
    spec = draft_input(3)
    assert gate.decode_alloc_len(spec, schedule_batch(9), 4) == 4  # 9 > 8: gated
    assert gate.is_gated_decode(worker_batch(spec, 3))
    nxt = gate.run_gated_decode(worker, worker_batch(spec, 3)).next_draft_input
    assert gate.decode_alloc_len(nxt, schedule_batch(8), 4) == 1  # hysteresis: still gated at 8
    for _ in range(gate.DEFAULT_RESUME_STEPS - 1):  # below 7, not yet for long enough
        nxt = gate.run_gated_decode(worker, worker_batch(nxt, 3)).next_draft_input
        assert gate.decode_alloc_len(nxt, schedule_batch(6), 4) == 1
    following = draft_input(3)
    assert gate.decode_alloc_len(following, schedule_batch(6), 4) == 4  # below 7: speculate
    assert not gate.is_gated_decode(worker_batch(following, 3))
    assert gate.gate_for(worker).switches == 2


@pytest.mark.parametrize("setting", [{"enable_dp_attention": True}, {"pp_size": 2}])
def test_off_where_ranks_could_disagree(gate, setting):
    """With attention data parallelism the decision would be taken per rank before the ranks
    exchange sizes: the gate stays off on every rank, so none ever splits from the others.
    With pipeline parallelism a stage before the last gets no tokens to publish."""
    worker = make_worker(threshold=1, **setting)
    gate.init_overlap_batch_gate(worker)
    spec = draft_input(4)
    assert gate.decode_alloc_len(spec, schedule_batch(64), 4) == 4
    assert not gate.is_gated_decode(worker_batch(spec, 4))
    assert not gate.is_gated_prefill(types.SimpleNamespace(forward_mode=Mode.EXTEND))


def test_gated_prefill_is_the_targets_plain_prefill_with_empty_draft_rows(gate):
    worker = make_worker(threshold=2)
    gate.init_overlap_batch_gate(worker)
    extend = types.SimpleNamespace(
        forward_mode=Mode.EXTEND, return_logprob=False, return_hidden_states=False, has_grammar=False,
        input_ids=T([5, 6, 7], np.int64), out_cache_loc=T([1, 2, 3], np.int64),
        seq_lens=T([20, 30], np.int64), spec_info=None, spec_algorithm=Algorithm.EAGLE3,
        capture_hidden_mode=Capture.NULL,
    )
    assert not gate.is_gated_prefill(extend)  # speculation is on: the draft prefills too
    gate.decode_alloc_len(draft_input(3), schedule_batch(3), 4)  # 3 > 2: speculation off
    assert gate.is_gated_prefill(extend)
    result = gate.run_gated_prefill(worker, extend)
    seen = worker.target_worker.seen[-1]
    assert seen["algorithm"] is Algorithm.NONE and seen["capture"] is Capture.NULL
    rows = result.next_draft_input
    assert rows.bonus_tokens.tolist() == [120, 130] and rows.new_seq_lens.tolist() == [20, 30]
    assert rows.topk_p.shape == (2, 1) and rows.topk_index.shape == (2, 1)
    assert rows.hidden_states.shape == (2, 6) and rows.hidden_states.dtype is np.float16
    assert rows.num_tokens_per_req == 1
    assert gate.decode_alloc_len(rows, schedule_batch(3), 4) == 1  # nothing in flight to cover


@pytest.mark.parametrize("version", ["0.5.16", "0.5.23"])
def test_gated_prefill_rows_take_the_draft_runners_hidden_spec_where_the_input_has_none(
    gate, monkeypatch, version
):
    """From 0.5.15 the draft input no longer says its hidden-state width; `eagle_utils` asks
    the draft runner (the release's own function)."""
    from conftest import release_function

    path = "srt/speculative/eagle_utils.py"
    spec_of = release_function(version, path, "get_draft_recurrent_hidden_state_spec")
    if "get_draft_recurrent_hidden_state_spec_from_config" in spec_of.__code__.co_names:
        spec_of.__globals__["get_draft_recurrent_hidden_state_spec_from_config"] = (
            release_function(version, path, "get_draft_recurrent_hidden_state_spec_from_config")
        )
    eagle_utils = types.ModuleType("sglang.srt.speculative.eagle_utils")
    eagle_utils.get_draft_recurrent_hidden_state_spec = spec_of
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.eagle_utils", eagle_utils)
    monkeypatch.delattr(EagleDraftInput, "hidden_size_for")
    monkeypatch.delattr(EagleDraftInput, "dtype_for")
    worker = make_worker(threshold=2)
    worker.draft_worker.draft_runner.spec_algorithm = Algorithm.EAGLE3
    gate.init_overlap_batch_gate(worker)
    gate.decode_alloc_len(draft_input(3), schedule_batch(3), 4)
    extend = types.SimpleNamespace(
        forward_mode=Mode.EXTEND, return_logprob=False, return_hidden_states=False, has_grammar=False,
        input_ids=T([5, 6], np.int64), out_cache_loc=T([1, 2], np.int64),
        seq_lens=T([20, 30], np.int64), spec_info=None, spec_algorithm=Algorithm.EAGLE3,
    )
    rows = gate.run_gated_prefill(worker, extend).next_draft_input
    assert rows.hidden_states.shape == (2, 6) and rows.hidden_states.dtype is np.float16


def test_off_unless_a_threshold_is_set(gate):
    worker = make_worker(threshold=None)
    gate.init_overlap_batch_gate(worker)
    spec = draft_input(3)
    assert gate.decode_alloc_len(spec, schedule_batch(500), 4) == 4
    assert not gate.is_gated_decode(worker_batch(spec, 3))


def test_a_prefill_that_takes_the_running_batch_above_the_threshold_is_plain(gate):
    """Its requests' next decode step will be gated: their prefill need not feed the draft."""
    worker = make_worker(threshold=4)
    gate.init_overlap_batch_gate(worker)
    gate.decode_alloc_len(draft_input(3), schedule_batch(3), 4)  # 3 running, speculating

    def extend(size):
        return types.SimpleNamespace(forward_mode=Mode.EXTEND, return_logprob=False,
                                     return_hidden_states=False, has_grammar=False,
                                     seq_lens=T(list(range(20, 20 + size)), np.int64))

    assert not gate.is_gated_prefill(extend(1))  # 3 + 1 = 4: not above the threshold
    assert gate.is_gated_prefill(extend(2))  # 3 + 2 = 5 > 4
    assert not gate.gate_for(worker).gated  # the decode steps decide the gate's state


def test_reservations_cover_every_step_when_committed_tokens_lag_a_speculative_step(gate):
    """0.5.6-0.5.10's decode preparation reserves `max(allocated, committed + 2 * len)` with
    `committed` missing the tokens of the step still in flight, which a speculative step makes
    as many as num_draft_tokens. Through speculative, gated and resumed stretches, every step
    must find the slots it writes reserved: num_draft_tokens from its length when it
    speculates, one when gated."""
    ndt = 4
    worker = make_worker(threshold=4)
    gate.init_overlap_batch_gate(worker)
    true_len, in_flight, allocated = 10, 0, 10
    spec = draft_input(1)
    for size in [2, 2, 2, 9, 9, 9, 9, 2, 2, 9, 9, 9, 2]:
        reserve = gate.decode_alloc_len(spec, schedule_batch(size), ndt)
        allocated = max(allocated, true_len - in_flight + 2 * reserve)
        gated = gate.is_gated_decode(worker_batch(spec, 1))
        written = 1 if gated else ndt  # a speculative step writes its whole draft width
        assert allocated >= true_len + written, (size, gated, allocated, true_len)
        if gated:
            batch = worker_batch(spec, 1)
            batch.seq_lens = T([true_len], np.int64)
            spec = gate.run_gated_decode(worker, batch).next_draft_input
        else:
            spec = draft_input(1)  # a speculative step's new draft input
        in_flight = 1 if gated else ndt  # worst case: every draft accepted
        true_len += in_flight


@pytest.mark.parametrize("pre_claims", [True, False])
def test_a_doubled_reserve_covers_every_step_with_and_without_the_pre_claimed_slot(gate, pre_claims):
    """0.5.13 on reserve `max(allocated, committed + get_alloc_reserve_per_decode())`, the
    doubled per-decode length. Up to 0.5.14 the preparation pre-claims the step's slot in
    `committed`; from 0.5.15 `committed` leaves out the step still in flight. The wrapped
    reserve is SGLang's own doubled value when speculating, and `gated_len=2` when gated."""
    ndt = 4
    reserve_spec = 2 * ndt  # get_alloc_reserve_per_decode() with a chain of ndt tokens
    worker = make_worker(threshold=4)
    gate.init_overlap_batch_gate(worker)
    true_len, in_flight, allocated = 10, 0, 10
    spec = draft_input(1)
    for size in [2, 2, 9, 9, 9, 2, 9, 9, 2, 2]:
        reserve = gate.decode_alloc_len(spec, schedule_batch(size), reserve_spec, gated_len=2)
        committed = true_len if pre_claims else true_len - in_flight
        allocated = max(allocated, committed + reserve)
        gated = gate.is_gated_decode(worker_batch(spec, 1))
        written = 1 if gated else ndt
        assert allocated >= true_len + written, (size, gated, allocated, true_len)
        if gated:
            batch = worker_batch(spec, 1)
            batch.seq_lens = T([true_len], np.int64)
            spec = gate.run_gated_decode(worker, batch).next_draft_input
        else:
            spec = draft_input(1)
        in_flight = 1 if gated else ndt
        true_len += in_flight
    assert gate.gate_for(worker).gated_steps >= 4


# ---- the 0.5.14+ runner: DecodeCudaGraphRunner, graph sizes in cuda_graph_config ----------


class DecodeGraphRunner:
    """0.5.14's DecodeCudaGraphRunner: mode from the runner's algorithm, sizes from the
    server's `cuda_graph_config.decode.bs` as they are at construction."""

    def __init__(self, runner):
        self.mode = "DECODE" if runner.spec_algorithm.is_none() else "TARGET_VERIFY"
        self.capture_bs = list(runner.server_args.cuda_graph_config.decode.bs)


@pytest.mark.parametrize("version", ["0.5.14", "0.5.16"])
def test_on_the_decode_graph_runner_the_gated_step_captures_plains_sizes_and_hands_over_the_war_event(
    gate, version
):
    from conftest import release_function

    generate = release_function(
        version, "srt/server_args.py", "_generate_decode_cuda_graph_batch_sizes", "ServerArgs"
    )
    worker = make_worker(threshold=2)
    runner = worker.target_worker.model_runner
    del runner.graph_runner
    server_args = types.SimpleNamespace(
        enable_return_hidden_states=False, disable_cuda_graph_padding=False,
        speculative_algorithm="EAGLE3",
        cuda_graph_config=types.SimpleNamespace(decode=types.SimpleNamespace(max_bs=64, bs=None)),
    )
    server_args._generate_decode_cuda_graph_batch_sizes = types.MethodType(generate, server_args)
    server_args.cuda_graph_config.decode.bs = spec_sizes = generate(server_args, 64)
    runner.server_args = server_args
    runner.decode_cuda_graph_runner = verify_graphs = DecodeGraphRunner(runner)
    draft_runner = types.SimpleNamespace(war_fastpath_read_done_event="draft extend's, stale")
    runner.war_fastpath_read_done_event = None
    worker.war_fastpath_runner = draft_runner
    seen = []

    def forward(batch):  # the DECODE replay records the read-done event on the target runner
        seen.append((runner.decode_cuda_graph_runner.mode, hasattr(batch, "capture_hidden_mode")))
        runner.war_fastpath_read_done_event = "DECODE replay's"
        return types.SimpleNamespace(next_token_ids=T([100 + n for n in batch.seq_lens.tolist()],
                                                      np.int64))

    worker.target_worker.forward_batch_generation = forward
    gate.init_overlap_batch_gate(worker)

    plain = worker._eaglegate_plain_decode.graphs
    assert plain.mode == "DECODE"
    without_spec = types.SimpleNamespace(**{**vars(server_args), "speculative_algorithm": None})
    assert plain.capture_bs == generate(without_spec, 64) != spec_sizes  # plain's own list
    assert server_args.cuda_graph_config.decode.bs == spec_sizes  # restored after the capture

    spec = draft_input(3)
    gate.decode_alloc_len(spec, schedule_batch(3), 4)
    batch = worker_batch(spec, 3)
    del batch.capture_hidden_mode  # 0.5.18 on: the forward derives it from spec_info
    gate.run_gated_decode(worker, batch, on_publish=lambda lens: None)
    assert seen == [("DECODE", False)]
    assert runner.decode_cuda_graph_runner is verify_graphs
    # The scheduler's barrier reads the draft runner: it now waits on the DECODE replay.
    assert draft_runner.war_fastpath_read_done_event == "DECODE replay's"
    assert runner.war_fastpath_read_done_event is None


# ---- SGLang's adaptive speculation (its tiers below the threshold) -----------------------


class TierGraphs(GraphRunner):
    """One tier's target graphs (a runner of the same class, as SGLang builds them)."""

    def __init__(self, runner, steps=None):
        super().__init__(runner)
        if steps is not None:
            self.mode = f"TARGET_VERIFY {steps}"


class Tiers:
    """0.5.14's AdaptiveController as the worker sees it: a tier is the step count, the
    draft-token count and the target's attention backend and graphs, swapped in by
    `apply_runtime_state` at the top of the speculative branch and after result processing."""

    def __init__(self, worker):
        self.worker = worker
        runner = worker.target_worker.model_runner
        self.tiers = {
            steps: (steps + 1, f"verify backend {steps}", TierGraphs(runner, steps))
            for steps in (0, 1, 3)
        }
        self.activate(3)

    def activate(self, steps):
        ndt, backend, graphs = self.tiers[steps]
        runner = self.worker.target_worker.model_runner
        self.worker.speculative_num_steps, self.worker.speculative_num_draft_tokens = steps, ndt
        runner.attn_backend, runner.graph_runner = backend, graphs

    def activate_step_by_batch(self, size):  # the config {"1": [3], "8": [1], "16": [0]}
        self.activate(3 if size < 8 else 1 if size < 16 else 0)


@pytest.mark.parametrize("tier", [0, 1, 3])
def test_with_adaptive_speculation_on_the_gated_step_is_the_same_in_every_tier(gate, tier):
    """`--speculative-adaptive` no longer turns the gate off: below the threshold the native
    tiers run (the gate only decides); above it a step is the plain decode whatever tier the
    worker is in, and the tier's own backend and graphs are back in place after it."""
    worker = make_worker(threshold=20, speculative_adaptive=True)
    tiers = Tiers(worker)
    gate.init_overlap_batch_gate(worker)
    assert gate.gate_for(worker) is not None  # on, beside the controller
    runner = worker.target_worker.model_runner
    # Below the threshold: the native reservation of whatever tier is active, not gated.
    tiers.activate_step_by_batch(12)
    spec = draft_input(3)
    assert gate.decode_alloc_len(spec, schedule_batch(12), 2 * 2, gated_len=2) == 4
    assert not gate.is_gated_decode(worker_batch(spec, 3))
    # Above it: gated, in the tier the worker was left in.
    tiers.activate(tier)
    spec = draft_input(3)
    gate.decode_alloc_len(spec, schedule_batch(30), 2 * (tier + 1), gated_len=2)
    assert gate.is_gated_decode(worker_batch(spec, 3))
    result = gate.run_gated_decode(worker, worker_batch(spec, 3))
    seen = worker.target_worker.seen[-1]
    assert (seen["graphs"], seen["backend"]) == ("DECODE", "decode backend")
    assert seen["input_ids"] == [11, 12, 13] and seen["seq_lens"] == [11, 12, 13]
    assert (runner.attn_backend, runner.graph_runner.mode) == (f"verify backend {tier}", f"TARGET_VERIFY {tier}")
    # The row width travels on the result, so a tier switched before result processing
    # still reads this step's tokens right.
    stride = result.speculative_num_draft_tokens
    assert stride == tier + 1 and result.next_token_ids.tolist()[::stride] == [111, 112, 113]
    assert result.eaglegate_gated_step is True  # kept out of the accept statistics
    # The next gated step reserves its two slots, whatever the tier's reservation is.
    assert gate.decode_alloc_len(result.next_draft_input, schedule_batch(30), 8, gated_len=2) == 2


def test_the_grammar_barrier_is_called_after_the_targets_launch_only_for_a_grammar_batch(gate):
    worker = make_worker(threshold=2)
    gate.init_overlap_batch_gate(worker)
    calls = []
    forward = worker.target_worker.forward_batch_generation

    def recording(batch):
        calls.append("forward")
        return forward(batch)

    worker.target_worker.forward_batch_generation = recording
    for grammar in (False, True):
        spec = draft_input(3)
        gate.decode_alloc_len(spec, schedule_batch(3), 4)
        batch = worker_batch(spec, 3)
        batch.has_grammar = grammar
        gate.run_gated_decode(worker, batch, on_publish=None,
                              grammar_barrier=lambda: calls.append("barrier"), pp_proxy_tensors=None)
    assert calls == ["forward", "forward", "barrier"]
