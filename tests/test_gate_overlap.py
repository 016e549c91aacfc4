"""The overlap worker's gate (batch_gate's EAGLEWorkerV2 half), run on each release's own classes.

Each scenario runs on the releases it is about (`version`; 0.5.12.post1 and 0.5.16 where it
names none), on their own classes (`release_defs`: the draft input, SpeculativeAlgorithm,
CaptureHiddenMode, ForwardMode, ScheduleBatch / ModelWorkerBatch and GenerationBatchResult,
built from the release's source with their fields, defaults, members and methods); the gate
module itself is the real file. What stays a double is the GPU side: tensors (a small
NumPy-backed stand-in for torch), the model runner, its CUDA graphs, the target's forward,
the KV pool and device events. What this establishes: where the decision is taken and what it
reserves, what the target forward of a gated decode and of a gated prefill sees, the result
layout the scheduler's FutureMap and result processing read, the resume, and that ranks of a
data-parallel-attention launch never split (the gate is off there). For 0.5.3.post2 to
0.5.5.post3 (the window reservation) the patched release methods themselves run: the
reservation, the worker's entry, and the release's own reading of the result. What it cannot:
that SGLang's kernels accept it (bench/gpu runs that on an H200).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib.util
import json
import sys
import types
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from packaging.version import Version

from conftest import release
from release_defs import Release

GATE_FILE = Path(__file__).resolve().parents[1] / "eaglegate" / "patches" / "gate_module.py"
CATALOGUE = Path(__file__).resolve().parents[1] / "bench" / "versions.json"
# Every catalogued release whose model runner captures prefill CUDA graphs of its own.
PREFILL_GRAPH_RELEASES = [v["version"] for v in json.loads(CATALOGUE.read_text())["versions"]
                          if Version(v["version"]) >= Version("0.5.14")]


class T:
    """A tensor stand-in over a NumPy array (GPU: a release's source gives no tensors)."""

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
        key = tuple(map(self._raw, key)) if isinstance(key, tuple) else self._raw(key)
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
    """A device event (GPU): records in order; the scheduler waits on it with `synchronize`."""

    recorded = 0

    def synchronize(self):
        pass

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


# The releases of the newer shape (the draft input's `bonus_tokens`, the result's row width):
# 0.5.12.post1's ModelWorkerBatch, 0.5.16's scheduler batch without a capture field. A test
# about other releases names its own `version`.
NEWER = ["0.5.12.post1", "0.5.16"]


def load_gate(source: str | None = None):
    """A fresh copy of the gate module (its process-wide state new), from `source` if given."""
    spec = importlib.util.spec_from_file_location("batch_gate_under_release", GATE_FILE)
    module = importlib.util.module_from_spec(spec)
    if source is None:
        spec.loader.exec_module(module)
    else:
        exec(compile(source, str(GATE_FILE), "exec"), module.__dict__)  # noqa: S102
    return module


class Sglang:
    """One release's SGLang as the gate sees it: its classes built from its source
    (`release_defs`: class bodies with their fields, defaults, enum members and methods),
    installed under their modules' names, and a fresh copy of the gate module (of
    `gate_source`, where given)."""

    def __init__(self, version: str, monkeypatch, gate_source: str | None = None) -> None:
        for name in ("SGLANG_SPEC_BATCH_GATE_THRESHOLD", "SGLANG_SPEC_BATCH_GATE_RESUME",
                     "SGLANG_SPEC_BATCH_GATE_RESUME_STEPS"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setitem(sys.modules, "torch", fake_torch())
        self.version = version
        self.root = release(version).root
        self.defs = Release(self.root)
        self.defs.install(monkeypatch)
        cls = self.defs.cls
        self.Capture = cls("sglang.srt.model_executor.forward_batch_info", "CaptureHiddenMode")
        self.Mode = cls("sglang.srt.model_executor.forward_batch_info", "ForwardMode")
        self.Algorithm = self.defs.imported("sglang.srt.speculative.spec_info", "SpeculativeAlgorithm")
        self.ScheduleBatch = cls("sglang.srt.managers.schedule_batch", "ScheduleBatch")
        self.WorkerBatch = cls("sglang.srt.managers.schedule_batch", "ModelWorkerBatch|ScheduleBatch")
        self.DraftInput = cls("sglang.srt.speculative.eagle_info", "EagleDraftInput")
        self.Result = cls("sglang.srt.managers.utils|sglang.srt.managers.scheduler", "GenerationBatchResult")
        self.draft_fields = {f.name for f in dataclasses.fields(self.DraftInput)}
        self.token_field = "bonus_tokens" if "bonus_tokens" in self.draft_fields else "verified_id"
        self.batch_fields = {f.name for f in dataclasses.fields(self.WorkerBatch)}
        # What the worker's entry and the target worker's forward take, in the release's source.
        self.passed_names = self._arguments("sglang.srt.speculative.eagle_worker_v2", "EAGLEWorkerV2")[2:]
        self.capture_argument = "capture_hidden_mode" in self._arguments(
            "sglang.srt.managers.tp_worker", "TpModelWorker")
        self.gate = load_gate(gate_source)

    def _arguments(self, module: str, cls: str) -> list[str]:
        found = self.defs.find(module, cls)
        forward = next(f for f in found.node.body if isinstance(f, ast.FunctionDef)
                       and f.name == "forward_batch_generation")
        return [a.arg for a in forward.args.args + forward.args.kwonlyargs]

    def algorithm(self, name: str = "EAGLE3"):
        """The release's member `name` (a registry's as its module registers it)."""
        return getattr(self.Algorithm, name)

    def passed(self, **hooks) -> dict:
        """What the release's entry passes on after the batch: these hooks where it takes them."""
        return {name: hooks.get(name) for name in self.passed_names}

    def draft_input(self, size: int, **values):
        """The release's draft input with the rows the FutureMap resolved, its other fields
        the release's defaults."""
        rows = {"topk_p": T(np.full((size, 1), 0.5), np.float32),
                "topk_index": T(np.full((size, 1), 7), np.int64),
                "hidden_states": T(np.ones((size, 6)), np.float16),
                self.token_field: T([11 + i for i in range(size)], np.int32)}
        if "new_seq_lens" in self.draft_fields:  # up to 0.5.12: the lengths ride on the input
            rows["new_seq_lens"] = T([10 + i for i in range(size)], np.int64)
        return self.defs.instance(self.DraftInput, **{**rows, **values})

    def schedule_batch(self, size: int, **values):
        """The scheduler's batch the decision reads: `size` requests, its other fields the
        release's defaults."""
        return self.defs.instance(self.ScheduleBatch, **{"reqs": [object()] * size, **values})

    def worker_batch(self, spec_info, size: int, mode: str = "DECODE", **values):
        """The batch the worker gets: a ModelWorkerBatch up to 0.5.12, which
        `get_model_worker_batch` fills, the capture mode included; from 0.5.13 the scheduler's
        own batch, whose fields the scheduler leaves unset keep the release's defaults."""
        seq_lens = [10 + i for i in range(size)]
        fields = {
            "forward_mode": getattr(self.Mode, mode), "spec_info": spec_info,
            "spec_algorithm": self.algorithm(), "seq_lens": T(seq_lens, np.int64),
            "seq_lens_cpu": T(seq_lens, np.int64), "seq_lens_sum": sum(seq_lens),
            "req_pool_indices": T(list(range(size)), np.int64),
            "input_ids": T([5] * size, np.int64), "out_cache_loc": T([0] * size, np.int64),
            "is_extend_in_batch": False,
        }
        if self.WorkerBatch is not self.ScheduleBatch:
            fields["capture_hidden_mode"] = self.Capture.FULL
        else:
            fields["reqs"] = [object()] * size
        return self.defs.instance(self.WorkerBatch, **{**fields, **values})

    def result(self, **values):
        """The release's GenerationBatchResult as the target worker makes it."""
        return self.defs.instance(self.Result, **values)


@pytest.fixture(params=NEWER)
def version(request):
    return request.param


@pytest.fixture()
def sglang(version, monkeypatch):
    return Sglang(version, monkeypatch)


@pytest.fixture()
def gate(sglang):
    return sglang.gate


# The GPU side stays a double: a release's source cannot give a model runner, its CUDA graphs,
# a target forward or a KV pool without a GPU.


class GraphRunner:
    """The target's CUDA graphs (GPU): captured in the mode the runner's algorithm says."""

    def __init__(self, runner):
        self.mode = "DECODE" if runner.spec_algorithm.is_none() else "TARGET_VERIFY"
        self.full_hidden = runner.server_args.enable_return_hidden_states
        self.max_bs = 8


class TargetWorker:
    """The target's forward (GPU): records what it saw and samples 100 + each sequence
    length, into the release's own GenerationBatchResult. It takes the hidden-state capture
    as an argument where the release's TpModelWorker does (0.5.16 on)."""

    def __init__(self, sglang, runner):
        self.sglang = sglang
        self.model_runner = runner
        self.seen: list[dict] = []
        if sglang.capture_argument:
            self.forward_batch_generation = self._forward_with_capture

    def forward_batch_generation(self, batch):
        return self._forward(batch, getattr(batch, "capture_hidden_mode", None))

    def _forward_with_capture(self, batch, capture_hidden_mode=None):
        return self._forward(batch, capture_hidden_mode)

    def _forward(self, batch, capture):
        runner = self.model_runner
        self.seen.append({
            "input_ids": batch.input_ids.tolist(),
            "out_cache_loc": batch.out_cache_loc.tolist(),
            "seq_lens": batch.seq_lens.tolist(),
            "spec_info": batch.spec_info,
            "algorithm": batch.spec_algorithm,
            "capture": capture,
            "graphs": getattr(runner, self.sglang.gate.graph_attr(runner)).mode,
            "backend": runner.attn_backend,
        })
        sampled = T([100 + n for n in batch.seq_lens.tolist()], np.int64)
        return self.sglang.result(next_token_ids=sampled)


def make_worker(sglang, threshold=4, **server_args):
    """The overlap worker around the release's classes; its model runner, target forward and
    draft runner are the GPU side (doubles with the attributes the release declares on them,
    which `gate_contract` checks against its source)."""
    config = types.SimpleNamespace(hidden_size=6, spec_hidden_size=6, dtype=np.float16)
    runner = types.SimpleNamespace(
        server_args=types.SimpleNamespace(enable_return_hidden_states=False),
        spec_algorithm=sglang.algorithm(),
        attn_backend="verify backend",
        init_new_workspace=False,
        device="cuda",
        # req_to_token[r, p] = 1000 * r + p: the KV slot of request r's position p.
        req_to_token_pool=types.SimpleNamespace(
            req_to_token=T(np.arange(4)[:, None] * 1000 + np.arange(64)[None, :], np.int32)
        ),
        _get_attention_backend=lambda **kwargs: "decode backend",
        model_config=config,
    )
    runner.graph_runner = GraphRunner(runner)
    args = {"speculative_batch_gate_threshold": threshold, "enable_metrics": False,
            "enable_dp_attention": False, "speculative_adaptive": False, **server_args}
    draft_runner = types.SimpleNamespace(model_config=config)
    return types.SimpleNamespace(
        server_args=types.SimpleNamespace(**args),
        target_worker=TargetWorker(sglang, runner),
        draft_worker=types.SimpleNamespace(draft_runner=draft_runner, draft_model_runner=draft_runner,
                                           speculative_algorithm=sglang.algorithm()),
        speculative_algorithm=sglang.algorithm(),
        speculative_num_draft_tokens=4,
        topk=1,
    )


def test_above_the_threshold_a_step_reserves_one_slot_and_runs_the_targets_plain_decode(sglang, gate):
    worker = make_worker(sglang, threshold=2)
    gate.init_overlap_batch_gate(worker)
    runner = worker.target_worker.model_runner
    assert (runner.graph_runner.mode, runner.attn_backend) == ("TARGET_VERIFY", "verify backend")
    spec = sglang.draft_input(3)
    # The draft input's prepare_for_decode asks once per step (some releases once per request).
    # The first gated step after a speculative one keeps the speculative reservation: the step
    # still in flight may add num_draft_tokens tokens before this one writes.
    assert gate.decode_alloc_len(spec, sglang.schedule_batch(3), 4) == 4
    assert gate.decode_alloc_len(spec, sglang.schedule_batch(3), 4) == 4
    assert gate.gate_for(worker).gated_steps == 1
    batch = sglang.worker_batch(spec, 3)
    assert gate.is_gated_decode(batch)
    published = []
    result = gate.run_gated_decode(worker, batch, **sglang.passed(on_publish=published.append))

    seen = worker.target_worker.seen[-1]
    assert seen["input_ids"] == [11, 12, 13]  # the last sampled token of each request
    assert seen["out_cache_loc"] == [10, 1011, 2012]  # its slot at position seq_lens
    assert seen["seq_lens"] == [11, 12, 13]
    assert seen["spec_info"] is None and seen["algorithm"] is sglang.algorithm("NONE")
    if "capture_hidden_mode" in sglang.batch_fields:
        # The release's own NULL, the mode the DECODE graphs were captured with.
        assert seen["capture"] is sglang.Capture.NULL
    else:  # no field and no argument: the forward derives NULL from the absent spec_info
        assert seen["capture"] is None
    assert (seen["graphs"], seen["backend"]) == ("DECODE", "decode backend")
    assert (runner.graph_runner.mode, runner.attn_backend) == ("TARGET_VERIFY", "verify backend")
    assert batch.seq_lens_cpu.tolist() == [11, 12, 13] and batch.seq_lens_sum == 36

    # The speculative layout with every draft rejected: one token per request, in rows one
    # wide, a width the result records (0.5.12 on).
    assert result.next_token_ids.tolist() == [111, 112, 113]
    assert result.accept_lens.tolist() == [1, 1, 1] and result.accept_lens.dtype is np.int32
    assert result.speculative_num_draft_tokens == 1
    assert result.eaglegate_gated_step is True
    nxt = result.next_draft_input
    tokens = getattr(nxt, sglang.token_field)
    assert nxt is not spec and tokens.tolist() == [111, 112, 113]
    assert tokens.dtype is np.int32  # the dtype the FutureMap's buffer has
    # The new lengths: on the draft input up to 0.5.12, on the result and through the
    # scheduler's publish hook from 0.5.13.
    if "new_seq_lens" in sglang.draft_fields:
        assert nxt.new_seq_lens.tolist() == [11, 12, 13]
    else:
        assert result.new_seq_lens.tolist() == [11, 12, 13]
        assert [lens.tolist() for lens in published] == [[11, 12, 13]]
    if "verify_done" in sglang.draft_fields:
        assert nxt.verify_done is not None and nxt.verify_done is not spec.verify_done
    assert nxt.topk_index is spec.topk_index and nxt.hidden_states is spec.hidden_states
    assert gate.GATED_DECODE_ATTR not in vars(nxt)  # the next step is decided afresh
    # After a gated step too: the speculative reservation, so any step can be handed back.
    assert gate.decode_alloc_len(nxt, sglang.schedule_batch(3), 4) == 4


@pytest.mark.parametrize("version", ["0.5.9", "0.5.11"])
def test_before_the_result_records_its_row_width_the_rows_are_num_draft_tokens_wide(sglang, gate):
    """Up to 0.5.11 the result processing reads each request's row at the worker's
    `speculative_num_draft_tokens` stride, so the gated step's one token starts a row that
    wide."""
    worker = make_worker(sglang, threshold=1)
    gate.init_overlap_batch_gate(worker)
    spec = sglang.draft_input(3)
    gate.decode_alloc_len(spec, sglang.schedule_batch(3), 4)
    result = gate.run_gated_decode(worker, sglang.worker_batch(spec, 3), **sglang.passed())
    assert result.next_token_ids.tolist() == [111, 0, 0, 0, 112, 0, 0, 0, 113, 0, 0, 0]
    assert result.accept_lens.tolist() == [1, 1, 1]
    assert not hasattr(result, "speculative_num_draft_tokens")


# Every catalogued release with the overlap worker.
OVERLAP_RELEASES = [v["version"] for v in json.loads(CATALOGUE.read_text())["versions"]
                    if Version(v["version"]) >= Version("0.5.3.post2")]


@pytest.mark.parametrize("version", OVERLAP_RELEASES)
def test_the_result_has_a_row_width_field_exactly_where_result_processing_reads_it(version):
    """`run_gated_decode` returns one-token rows where the result has the field
    `speculative_num_draft_tokens`: in the release's own source, the scheduler's result
    processing reads each row's width from that field from the release that adds it."""
    managers = release(version).root / "srt" / "managers"
    result_class = next(
        node for path in sorted(managers.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.name == "GenerationBatchResult"
    )
    fields = {n.target.id for n in result_class.body
              if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    reads = any("result.speculative_num_draft_tokens" in path.read_text()
                for path in managers.rglob("*.py"))
    assert ("speculative_num_draft_tokens" in fields) == reads
    assert reads == (Version(version) >= Version("0.5.12"))


def test_the_published_lengths_are_recorded_before_the_forward(sglang, gate):
    """Up to 0.5.12 an event on the draft input says the new lengths are ready; from 0.5.13
    the scheduler's publish hook takes them. Either happens before the target's forward, so
    the next batch's preparation does not wait for the forward."""
    worker = make_worker(sglang, threshold=1)
    gate.init_overlap_batch_gate(worker)
    spec = sglang.draft_input(2)
    gate.decode_alloc_len(spec, sglang.schedule_batch(2), 4)
    batch = sglang.worker_batch(spec, 2)
    seq_lens = batch.seq_lens
    order = []
    forward = worker.target_worker.forward_batch_generation
    worker.target_worker.forward_batch_generation = lambda b, **kw: (order.append("forward"), forward(b, **kw))[1]
    before = Event.recorded
    result = gate.run_gated_decode(worker, batch, **sglang.passed(on_publish=lambda lens: order.append("publish")))
    if "verify_done" in sglang.draft_fields:
        assert result.next_draft_input.verify_done.order == before + 1
        assert Event.recorded == before + 1 and order == ["forward"]
    else:
        assert order == ["publish", "forward"]
    assert seq_lens.streams == ["forward stream"]  # kept alive for the forward stream


def test_below_the_threshold_and_ineligible_batches_speculate_with_their_own_reservation(sglang, gate):
    worker = make_worker(sglang, threshold=4)
    gate.init_overlap_batch_gate(worker)
    spec = sglang.draft_input(3)
    assert gate.decode_alloc_len(spec, sglang.schedule_batch(3), 4) == 4
    assert not gate.is_gated_decode(sglang.worker_batch(spec, 3))
    flags = [f.name for f in dataclasses.fields(sglang.ScheduleBatch)
             if f.name in ("return_logprob", "return_hidden_states", "has_grammar")]
    assert len(flags) == 3
    for flag in flags:
        spec = sglang.draft_input(8)
        assert gate.decode_alloc_len(spec, sglang.schedule_batch(8, **{flag: True}), 4) == 4
        assert not gate.is_gated_decode(sglang.worker_batch(spec, 8))


def test_resume_after_gated_steps_speculates_again_below_the_lower_mark(sglang, gate):
    worker = make_worker(sglang, threshold=8)
    gate.init_overlap_batch_gate(worker)
    spec = sglang.draft_input(3)
    assert gate.decode_alloc_len(spec, sglang.schedule_batch(9), 4) == 4  # 9 > 8: gated
    assert gate.is_gated_decode(sglang.worker_batch(spec, 3))
    nxt = gate.run_gated_decode(worker, sglang.worker_batch(spec, 3), **sglang.passed()).next_draft_input
    gate.decode_alloc_len(nxt, sglang.schedule_batch(8), 4)
    assert gate.is_gated_decode(sglang.worker_batch(nxt, 8))  # hysteresis: still gated at 8
    for _ in range(gate.DEFAULT_RESUME_STEPS - 1):  # below 7, not yet for long enough
        nxt = gate.run_gated_decode(worker, sglang.worker_batch(nxt, 3), **sglang.passed()).next_draft_input
        assert gate.decode_alloc_len(nxt, sglang.schedule_batch(6), 4) == 4
    following = sglang.draft_input(3)
    assert gate.decode_alloc_len(following, sglang.schedule_batch(6), 4) == 4  # below 7: speculate
    assert not gate.is_gated_decode(sglang.worker_batch(following, 3))
    assert gate.gate_for(worker).switches == 2
    assert gate.gate_for(worker).failures == 0


@pytest.mark.parametrize("setting", [{"enable_dp_attention": True}, {"pp_size": 2}])
def test_off_where_ranks_could_disagree(sglang, gate, setting):
    """With attention data parallelism the decision would be taken per rank before the ranks
    exchange sizes: the gate stays off on every rank, so none ever splits from the others.
    With pipeline parallelism a stage before the last gets no tokens to publish."""
    worker = make_worker(sglang, threshold=1, **setting)
    gate.init_overlap_batch_gate(worker)
    spec = sglang.draft_input(4)
    assert gate.decode_alloc_len(spec, sglang.schedule_batch(64), 4) == 4
    assert not gate.is_gated_decode(sglang.worker_batch(spec, 4))
    assert not gate.is_gated_prefill(sglang.worker_batch(None, 2, mode="EXTEND"))


def prefill_batch(sglang, **values):
    """An extend batch of two requests of 20 and 30 tokens, as the release's worker gets it."""
    return sglang.worker_batch(None, 2, mode="EXTEND", input_ids=T([5, 6, 7], np.int64),
                               out_cache_loc=T([1, 2, 3], np.int64), seq_lens=T([20, 30], np.int64),
                               **values)


def test_gated_prefill_is_the_targets_plain_prefill_with_empty_draft_rows(sglang, gate):
    worker = make_worker(sglang, threshold=2)
    gate.init_overlap_batch_gate(worker)
    extend = prefill_batch(sglang)
    assert not gate.is_gated_prefill(extend)  # speculation is on: the draft prefills too
    gate.decode_alloc_len(sglang.draft_input(3), sglang.schedule_batch(3), 4)  # 3 > 2: speculation off
    assert gate.is_gated_prefill(extend)
    result = gate.run_gated_prefill(worker, extend, **sglang.passed())
    assert gate.gate_for(worker).failures == 0
    seen = worker.target_worker.seen[-1]
    assert seen["algorithm"] is sglang.algorithm("NONE")
    # No prefill graphs here: the batch's field, where it has one, asks for none.
    assert seen["capture"] is (sglang.Capture.NULL if "capture_hidden_mode" in sglang.batch_fields else None)
    rows = result.next_draft_input
    assert isinstance(rows, sglang.DraftInput)
    assert getattr(rows, sglang.token_field).tolist() == [120, 130]
    if "new_seq_lens" in sglang.draft_fields:
        assert rows.new_seq_lens.tolist() == [20, 30]
    assert rows.topk_p.shape == (2, 1) and rows.topk_index.shape == (2, 1)
    assert rows.hidden_states.shape == (2, 6) and rows.hidden_states.dtype is np.float16
    assert rows.num_tokens_per_req == 1
    assert gate.decode_alloc_len(rows, sglang.schedule_batch(3), 4) == 4


@pytest.mark.parametrize("version", ["0.5.14", "0.5.16"])
def test_gated_prefill_asks_for_the_capture_the_targets_prefill_graphs_were_captured_with(sglang, gate):
    """From 0.5.14 an EAGLE target's prefill graphs hold full hidden states, and a prefill
    asking for none runs eagerly; a gated prefill asks for theirs: through the batch's field
    (0.5.14) or the target worker's argument (0.5.16 on). Its decode steps still ask for none
    (the gate's own DECODE graphs)."""
    worker = make_worker(sglang, threshold=2)
    runner = worker.target_worker.model_runner
    # The prefill graphs (GPU): only the mode they were captured with.
    runner.prefill_cuda_graph_runner = types.SimpleNamespace(capture_hidden_mode=sglang.Capture.FULL)
    gate.init_overlap_batch_gate(worker)
    gate.decode_alloc_len(sglang.draft_input(3), sglang.schedule_batch(3), 4)  # 3 > 2: speculation off
    extend = prefill_batch(sglang)
    gate.run_gated_prefill(worker, extend, **sglang.passed())
    assert worker.target_worker.seen[-1]["capture"] is sglang.Capture.FULL
    spec = sglang.draft_input(3)
    gate.decode_alloc_len(spec, sglang.schedule_batch(3), 4)
    gate.run_gated_decode(worker, sglang.worker_batch(spec, 3), **sglang.passed())
    seen = worker.target_worker.seen[-1]["capture"]
    assert seen is (sglang.Capture.NULL if "capture_hidden_mode" in sglang.batch_fields else None)
    assert gate.gate_for(worker).failures == 0


def _class_methods(tree: ast.Module) -> dict[str, list[ast.FunctionDef]]:
    return {
        node.name: [f for f in node.body if isinstance(f, ast.FunctionDef)]
        for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
    }


@pytest.mark.parametrize("version", PREFILL_GRAPH_RELEASES)
def test_releases_capture_the_targets_prefill_graphs_with_the_mode_the_gated_prefill_reads(version):
    """What `_prefill_capture_mode` and `_target_forward` rely on, in the release's own
    source: the model runner keeps its prefill graphs as `prefill_cuda_graph_runner`, their
    runner records `capture_hidden_mode` and refuses a batch whose mode differs, EAGLE's own
    prefill asks for FULL, and the mode reaches the forward through the scheduler's batch
    field or the target worker's argument."""
    from conftest import release

    root = release(version).root
    def parse(path):
        return ast.parse((root / path).read_text())

    runner_src = parse("srt/model_executor/model_runner.py")
    assigned = {t.attr for n in ast.walk(runner_src) if isinstance(n, ast.Assign)
                for t in n.targets if isinstance(t, ast.Attribute)}
    assert "prefill_cuda_graph_runner" in assigned
    graphs = parse("srt/model_executor/runner/prefill_cuda_graph_runner.py")
    methods = {f.name: f for fs in _class_methods(graphs).values() for f in fs}
    init_assigns = {t.attr for n in ast.walk(methods["__init__"]) if isinstance(n, ast.Assign)
                    for t in n.targets if isinstance(t, ast.Attribute)}
    assert "capture_hidden_mode" in init_assigns
    # The replay check: up to 0.5.16 `can_run_graph` refuses a batch whose mode differs from
    # the captured one; from 0.5.17 `can_replay_locally` refuses one whose mode exceeds it.
    # Asking for the captured mode itself replays under either rule.
    refusals = {
        type(compare.ops[0]).__name__
        for name in ("can_run_graph", "can_replay_locally") if name in methods
        for node in ast.walk(methods[name])
        if isinstance(node, ast.If)
        and any(isinstance(b, ast.Return) and ast.unparse(b.value) == "False" for b in node.body)
        for compare in ast.walk(node.test)
        if isinstance(compare, ast.Compare) and ast.unparse(compare.left) == "self.capture_hidden_mode"
        or isinstance(compare, ast.Compare)
        and ast.unparse(compare.comparators[0]) == "self.capture_hidden_mode"
    }
    assert refusals == ({"NotEq"} if Version(version) <= Version("0.5.16") else {"Lt"})
    worker = parse("srt/speculative/eagle_worker_v2.py")
    assert "CaptureHiddenMode.FULL" in {ast.unparse(n) for n in ast.walk(worker) if isinstance(n, ast.Attribute)}
    batch_fields = {n.target.id for n in ast.walk(parse("srt/managers/schedule_batch.py"))
                    if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    tp_forward = next(f for f in _class_methods(parse("srt/managers/tp_worker.py"))["TpModelWorker"]
                      if f.name == "forward_batch_generation")
    arguments = {a.arg for a in tp_forward.args.args + tp_forward.args.kwonlyargs}
    assert "capture_hidden_mode" in batch_fields or "capture_hidden_mode" in arguments


@pytest.mark.parametrize("version", ["0.5.16", "0.5.23"])
def test_gated_prefill_rows_take_the_draft_runners_hidden_spec_where_the_input_has_none(
    sglang, gate, monkeypatch, version
):
    """From 0.5.15 the draft input no longer says its hidden-state width; `eagle_utils` asks
    the draft runner (the release's own function)."""
    from conftest import release_function

    assert not hasattr(sglang.DraftInput, "hidden_size_for")  # the release's own draft input
    path = "srt/speculative/eagle_utils.py"
    spec_of = release_function(version, path, "get_draft_recurrent_hidden_state_spec")
    if "get_draft_recurrent_hidden_state_spec_from_config" in spec_of.__code__.co_names:
        spec_of.__globals__["get_draft_recurrent_hidden_state_spec_from_config"] = (
            release_function(version, path, "get_draft_recurrent_hidden_state_spec_from_config")
        )
    eagle_utils = types.ModuleType("sglang.srt.speculative.eagle_utils")
    eagle_utils.get_draft_recurrent_hidden_state_spec = spec_of
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.eagle_utils", eagle_utils)
    worker = make_worker(sglang, threshold=2)
    worker.draft_worker.draft_runner.spec_algorithm = sglang.algorithm()
    # The width the release's function reads, unlike the target's own hidden size.
    worker.draft_worker.draft_runner.model_config = types.SimpleNamespace(
        hidden_size=9, spec_hidden_size=6, dtype=np.float16)
    gate.init_overlap_batch_gate(worker)
    gate.decode_alloc_len(sglang.draft_input(3), sglang.schedule_batch(3), 4)
    extend = sglang.worker_batch(None, 2, mode="EXTEND", input_ids=T([5, 6], np.int64),
                                 out_cache_loc=T([1, 2], np.int64), seq_lens=T([20, 30], np.int64))
    rows = gate.run_gated_prefill(worker, extend, **sglang.passed()).next_draft_input
    assert gate.gate_for(worker).failures == 0
    assert rows.hidden_states.shape == (2, 6) and rows.hidden_states.dtype is np.float16


def test_off_unless_a_threshold_is_set(sglang, gate):
    worker = make_worker(sglang, threshold=None)
    gate.init_overlap_batch_gate(worker)
    spec = sglang.draft_input(3)
    assert gate.decode_alloc_len(spec, sglang.schedule_batch(500), 4) == 4
    assert not gate.is_gated_decode(sglang.worker_batch(spec, 3))


def test_a_prefill_that_takes_the_running_batch_above_the_threshold_is_plain(sglang, gate):
    """Its requests' next decode step will be gated: their prefill need not feed the draft."""
    worker = make_worker(sglang, threshold=4)
    gate.init_overlap_batch_gate(worker)
    gate.decode_alloc_len(sglang.draft_input(3), sglang.schedule_batch(3), 4)  # 3 running, speculating

    def extend(size):
        return sglang.worker_batch(None, size, mode="EXTEND", seq_lens=T(list(range(20, 20 + size)), np.int64))

    assert not gate.is_gated_prefill(extend(1))  # 3 + 1 = 4: not above the threshold
    assert gate.is_gated_prefill(extend(2))  # 3 + 2 = 5 > 4
    assert not gate.gate_for(worker).gated  # the decode steps decide the gate's state


@pytest.mark.parametrize("version", ["0.5.6", "0.5.9", "0.5.10"])
def test_reservations_cover_every_step_when_committed_tokens_lag_a_speculative_step(sglang, gate):
    """0.5.6-0.5.10's decode preparation reserves `max(allocated, committed + 2 * len)` with
    `committed` missing the tokens of the step still in flight, which a speculative step makes
    as many as num_draft_tokens. Through speculative, gated and resumed stretches, every step
    must find the slots it writes reserved: num_draft_tokens from its length when it
    speculates, one when gated."""
    ndt = 4
    worker = make_worker(sglang, threshold=4)
    gate.init_overlap_batch_gate(worker)
    true_len, in_flight, allocated = 10, 0, 10
    spec = sglang.draft_input(1)
    for size in [2, 2, 2, 9, 9, 9, 9, 2, 2, 9, 9, 9, 2]:
        reserve = gate.decode_alloc_len(spec, sglang.schedule_batch(size), ndt)
        allocated = max(allocated, true_len - in_flight + 2 * reserve)
        gated = gate.is_gated_decode(sglang.worker_batch(spec, 1))
        written = 1 if gated else ndt  # a speculative step writes its whole draft width
        assert allocated >= true_len + written, (size, gated, allocated, true_len)
        if gated:
            batch = sglang.worker_batch(spec, 1, seq_lens=T([true_len], np.int64))
            spec = gate.run_gated_decode(worker, batch, **sglang.passed()).next_draft_input
        else:
            spec = sglang.draft_input(1)  # a speculative step's new draft input
        in_flight = 1 if gated else ndt  # worst case: every draft accepted
        true_len += in_flight
    assert gate.gate_for(worker).gated_steps >= 4 and gate.gate_for(worker).failures == 0


@pytest.mark.parametrize("pre_claims", [True, False])
@pytest.mark.parametrize("version", ["0.5.13.post1", "0.5.16"])
def test_a_doubled_reserve_covers_every_step_with_and_without_the_pre_claimed_slot(sglang, gate, pre_claims):
    """0.5.13 on reserve `max(allocated, committed + get_alloc_reserve_per_decode())`, the
    doubled per-decode length. Up to 0.5.14 the preparation pre-claims the step's slot in
    `committed`; from 0.5.15 `committed` leaves out the step still in flight. The wrapped
    reserve is SGLang's own doubled value, gated or not."""
    ndt = 4
    reserve_spec = 2 * ndt  # get_alloc_reserve_per_decode() with a chain of ndt tokens
    worker = make_worker(sglang, threshold=4)
    gate.init_overlap_batch_gate(worker)
    true_len, in_flight, allocated = 10, 0, 10
    spec = sglang.draft_input(1)
    for size in [2, 2, 9, 9, 9, 2, 9, 9, 2, 2]:
        reserve = gate.decode_alloc_len(spec, sglang.schedule_batch(size), reserve_spec)
        assert reserve == reserve_spec
        committed = true_len if pre_claims else true_len - in_flight
        allocated = max(allocated, committed + reserve)
        gated = gate.is_gated_decode(sglang.worker_batch(spec, 1))
        written = 1 if gated else ndt
        assert allocated >= true_len + written, (size, gated, allocated, true_len)
        if gated:
            batch = sglang.worker_batch(spec, 1, seq_lens=T([true_len], np.int64))
            spec = gate.run_gated_decode(worker, batch, **sglang.passed()).next_draft_input
        else:
            spec = sglang.draft_input(1)
        in_flight = 1 if gated else ndt
        true_len += in_flight
    assert gate.gate_for(worker).gated_steps >= 4 and gate.gate_for(worker).failures == 0


# ---- the 0.5.14+ runner: DecodeCudaGraphRunner, graph sizes in cuda_graph_config ----------


class DecodeGraphRunner:
    """0.5.14's DecodeCudaGraphRunner (GPU): mode from the runner's algorithm, sizes from the
    server's `cuda_graph_config.decode.bs` as they are at construction."""

    def __init__(self, runner):
        self.mode = "DECODE" if runner.spec_algorithm.is_none() else "TARGET_VERIFY"
        self.capture_bs = list(runner.server_args.cuda_graph_config.decode.bs)


@pytest.mark.parametrize("version", ["0.5.14", "0.5.16"])
def test_on_the_decode_graph_runner_the_gated_step_captures_plains_sizes_and_hands_over_the_war_event(
    sglang, gate, version
):
    from conftest import release_function

    generate = release_function(
        version, "srt/server_args.py", "_generate_decode_cuda_graph_batch_sizes", "ServerArgs"
    )
    worker = make_worker(sglang, threshold=2)
    runner = worker.target_worker.model_runner
    del runner.graph_runner
    # The server's settings the release's size generator reads.
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
    forward = worker.target_worker.forward_batch_generation

    def replay(batch, **kwargs):  # the DECODE replay records the read-done event on the target runner
        seen.append(runner.decode_cuda_graph_runner.mode)
        runner.war_fastpath_read_done_event = "DECODE replay's"
        return forward(batch, **kwargs)

    gate.init_overlap_batch_gate(worker)
    worker.target_worker.forward_batch_generation = replay

    plain = worker._eaglegate_plain_decode.graphs
    assert plain.mode == "DECODE"
    without_spec = types.SimpleNamespace(**{**vars(server_args), "speculative_algorithm": None})
    assert plain.capture_bs == generate(without_spec, 64) != spec_sizes  # plain's own list
    assert server_args.cuda_graph_config.decode.bs == spec_sizes  # restored after the capture

    spec = sglang.draft_input(3)
    gate.decode_alloc_len(spec, sglang.schedule_batch(3), 4)
    gate.run_gated_decode(worker, sglang.worker_batch(spec, 3), **sglang.passed(on_publish=lambda lens: None))
    assert seen == ["DECODE"] and gate.gate_for(worker).failures == 0
    capture = worker.target_worker.seen[-1]["capture"]
    assert capture is (sglang.Capture.NULL if "capture_hidden_mode" in sglang.batch_fields else None)
    assert runner.decode_cuda_graph_runner is verify_graphs
    # The scheduler's barrier reads the draft runner: it now waits on the DECODE replay.
    assert draft_runner.war_fastpath_read_done_event == "DECODE replay's"
    assert runner.war_fastpath_read_done_event is None


# ---- SGLang's adaptive speculation (its tiers below the threshold) -----------------------


class TierGraphs(GraphRunner):
    """One tier's target graphs (GPU; a runner of the same class, as SGLang builds them)."""

    def __init__(self, runner, steps=None):
        super().__init__(runner)
        if steps is not None:
            self.mode = f"TARGET_VERIFY {steps}"


class Tiers:
    """0.5.14's AdaptiveController as the worker sees it: a tier is the step count, the
    draft-token count and the target's attention backend and graphs (GPU), swapped in by
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
@pytest.mark.parametrize("version", ["0.5.14", "0.5.16"])
def test_with_adaptive_speculation_on_the_gated_step_is_the_same_in_every_tier(sglang, gate, tier):
    """`--speculative-adaptive` no longer turns the gate off: below the threshold the native
    tiers run (the gate only decides); above it a step is the plain decode whatever tier the
    worker is in, and the tier's own backend and graphs are back in place after it."""
    worker = make_worker(sglang, threshold=20, speculative_adaptive=True)
    tiers = Tiers(worker)
    gate.init_overlap_batch_gate(worker)
    assert gate.gate_for(worker) is not None  # on, beside the controller
    runner = worker.target_worker.model_runner
    # Below the threshold: the native reservation of whatever tier is active, not gated.
    tiers.activate_step_by_batch(12)
    spec = sglang.draft_input(3)
    assert gate.decode_alloc_len(spec, sglang.schedule_batch(12), 2 * 2) == 4
    assert not gate.is_gated_decode(sglang.worker_batch(spec, 3))
    # Above it: gated, in the tier the worker was left in.
    tiers.activate(tier)
    spec = sglang.draft_input(3)
    gate.decode_alloc_len(spec, sglang.schedule_batch(30), 2 * (tier + 1))
    assert gate.is_gated_decode(sglang.worker_batch(spec, 3))
    result = gate.run_gated_decode(worker, sglang.worker_batch(spec, 3), **sglang.passed())
    seen = worker.target_worker.seen[-1]
    assert (seen["graphs"], seen["backend"]) == ("DECODE", "decode backend")
    assert seen["input_ids"] == [11, 12, 13] and seen["seq_lens"] == [11, 12, 13]
    assert (runner.attn_backend, runner.graph_runner.mode) == (f"verify backend {tier}", f"TARGET_VERIFY {tier}")
    # The row width travels on the result, so a tier switched before result processing
    # still reads this step's tokens right.
    assert result.speculative_num_draft_tokens == 1
    assert result.next_token_ids.tolist() == [111, 112, 113]
    assert result.eaglegate_gated_step is True  # kept out of the accept statistics
    # The next gated step reserves what the tier's speculative step would.
    assert gate.decode_alloc_len(result.next_draft_input, sglang.schedule_batch(30), 8) == 8


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_the_grammar_barrier_is_called_after_the_targets_launch_only_for_a_grammar_batch(sglang, gate):
    """From 0.5.17 the worker's entry takes the scheduler's grammar barrier."""
    assert "grammar_barrier" in sglang.passed_names
    worker = make_worker(sglang, threshold=2)
    gate.init_overlap_batch_gate(worker)
    calls = []
    forward = worker.target_worker.forward_batch_generation

    def recording(batch, **kwargs):
        calls.append("forward")
        return forward(batch, **kwargs)

    worker.target_worker.forward_batch_generation = recording
    for grammar in (False, True):
        spec = sglang.draft_input(3)
        gate.decode_alloc_len(spec, sglang.schedule_batch(3), 4)
        batch = sglang.worker_batch(spec, 3, has_grammar=grammar)
        gate.run_gated_decode(worker, batch, **sglang.passed(grammar_barrier=lambda: calls.append("barrier")))
    assert calls == ["forward", "forward", "barrier"]
    assert gate.gate_for(worker).failures == 0


# ---- 0.5.3.post2 to 0.5.5.post3: the window reservation, driven through the patched release ------
#
# These releases reserve `new_allocate_lens = seq_lens + ALLOC_LEN_PER_DECODE` (the batch's own
# `allocate_for_eagle_v2` on 0.5.3.x, the draft input's `prepare_for_decode` on 0.5.4-0.5.5.x)
# and free a request that finished while a step was in flight as `[allocate_lens - ALLOC,
# allocate_lens)` of that step's result. The patched release methods run here on a fake KV pool;
# the result is read by the release's own result-processing method.

ALLOC = 4  # ALLOC_LEN_PER_DECODE: max(steps * topk, num_draft_tokens) for a chain of 3 steps
# Every catalogued release that reserves the window (0.5.3.post2 to 0.5.5.post3).
WINDOW_RELEASES = [v["version"] for v in json.loads(CATALOGUE.read_text())["versions"]
                   if Version("0.5.3.post2") <= Version(v["version"]) < Version("0.5.6")]
READERS = ("_resolve_spec_overlap_token_ids", "hacky_process_eagle_overlap_result")  # 0.5.4 on, 0.5.3.x
WINDOW_AT = {  # where generate.decode_prep_edit finds the window: the class and method that reserve it
    "srt/managers/schedule_batch.py": ("ScheduleBatch", "allocate_for_eagle_v2"),
    "srt/speculative/eagle_info_v2.py": ("EagleDraftInputV2Mixin", "prepare_for_decode"),
}


def old_shape(version: str):
    """From the release itself: where it reserves the window, the result's field for the
    step's reservation, and the output processor's method that reads the result."""
    from eaglegate.patches.generate import decode_prep_edit

    from conftest import release

    tree = release(version)
    rel = decode_prep_edit(tree)[0]
    fields = result_fields(version)
    alloc_field = next(f for f in ("allocate_lens", "last_batch_allocate_lens") if f in fields)
    mixin = (tree.root / "srt/managers/scheduler_output_processor_mixin.py").read_text()
    reader = next(r for r in READERS if f"def {r}(" in mixin)
    return (rel, *WINDOW_AT[rel]), alloc_field, reader


_patches: dict = {}


def _t_sum(self):
    return T(self.a.sum(), device=self.device)


T.__sub__ = lambda self, other: T(self.a - T._raw(other), device=self.device)
T.sum = _t_sum
T.item = lambda self: self.a.item()
T.cpu = lambda self: T(self.a.copy(), device="cpu")
T.is_cpu = property(lambda self: True)  # what `copy_to_cpu` gives the result processing


def _compile(source: str, path: str, cls_name: str, name: str, namespace: dict):
    """A method of `cls_name` from `source`, compiled alone; its free names not in `namespace`
    become permissive mocks."""
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name)
    func = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)
    func.decorator_list, func.returns = [], None
    for arg in func.args.args:
        arg.annotation = None
    stored = {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    stored |= {a.arg for a in func.args.args}
    stored |= {alias.asname or alias.name for n in ast.walk(func) if isinstance(n, ast.ImportFrom)
               for alias in n.names}
    free = {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    for missing in free - stored - set(namespace) - set(dir(builtins)):
        namespace[missing] = mock.MagicMock(name=missing)
    exec(compile(ast.Module(body=[func], type_ignores=[]), path, "exec"), namespace)
    return namespace[name]


def patched_method(version: str, rel: str, cls_name: str, name: str, namespace: dict):
    """The method as `eaglegate patch` leaves it in this release."""
    from eaglegate.patches.generate import generate_patch

    from conftest import release

    if version not in _patches:
        _patches[version] = generate_patch(release(version), worker="v2", required=True)
    after = next(c.after for c in _patches[version].changes if c.path.endswith(rel)).decode()
    return _compile(after, rel, cls_name, name, namespace)


def release_method(version: str, rel: str, cls_name: str, name: str, namespace: dict):
    from conftest import release

    return _compile((release(version).root / rel).read_text(), rel, cls_name, name, namespace)


def result_fields(version: str) -> list[str]:
    """The fields of the release's GenerationBatchResult."""
    from conftest import release

    for rel in ("srt/managers/utils.py", "srt/managers/scheduler.py"):
        tree = ast.parse((release(version).root / rel).read_text())
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == "GenerationBatchResult":
                return [n.target.id for n in node.body if isinstance(n, ast.AnnAssign)]
    raise AssertionError("no GenerationBatchResult")


class Pool:
    """The KV pool (GPU): slots handed out in order, `req_to_token` written as the release's
    `assign_req_to_token_pool` Triton kernel writes it (start..end of each request)."""

    def __init__(self, req_to_token):
        self.req_to_token = req_to_token
        self.next_slot = 5000
        self.allocations: list[int] = []  # slots per call

    def alloc(self, tree_cache, count):
        slots = list(range(self.next_slot, self.next_slot + int(count)))
        self.next_slot += int(count)
        self.allocations.append(int(count))
        return T(slots, np.int64)

    def assign(self, req_pool_indices, req_to_token, start, end, out_cache_loc, *rest):
        locs = iter(out_cache_loc.tolist())
        for r, s, e in zip(req_pool_indices.tolist(), start.tolist(), end.tolist(), strict=True):
            for p in range(s, e):
                req_to_token.a[r, p] = next(locs)
        assert next(locs, None) is None  # every slot handed out placed

    def __getitem__(self, grid):  # `assign_req_to_token_pool[(bs,)](...)`, a Triton launch
        return self.assign


class OldRun:
    """One request batch of an old release under the overlap scheduler, on the release's own
    classes: the patched window reservation, the patched worker entry, the release's own
    result reader. The KV pool, the draft and the verify forward are the GPU side."""

    def __init__(self, sglang, monkeypatch, threshold, size=3, **server_args):
        version, gate = sglang.version, sglang.gate
        self.sglang, self.version, self.gate, self.size = sglang, version, gate, size
        (rel, cls_name, name), self.alloc_field, reader = old_shape(version)
        # What the worker's __init__ sets on the class (`EagleDraftInput.ALLOC_LEN_PER_DECODE = ...`).
        monkeypatch.setattr(sglang.DraftInput, "ALLOC_LEN_PER_DECODE", ALLOC)
        self.worker = make_worker(sglang, threshold=threshold, **server_args)
        runner = self.worker.target_worker.model_runner
        runner.req_to_token_pool.req_to_token = T(np.full((4, 64), -1), np.int64)
        self.pool = Pool(runner.req_to_token_pool.req_to_token)
        spec_utils = types.ModuleType("sglang.srt.speculative.spec_utils")
        spec_utils.assign_req_to_token_pool = self.pool
        spec_utils.assign_req_to_token_pool_func = self.pool.assign
        monkeypatch.setitem(sys.modules, "sglang.srt.speculative.spec_utils", spec_utils)
        self.reserve = patched_method(version, rel, cls_name, name, {
            gate.decode_alloc_window.__name__: gate.decode_alloc_window,
            "alloc_token_slots": self.pool.alloc,
        })
        self.mixin = name == "prepare_for_decode"
        self.entry = patched_method(version, "srt/speculative/eagle_worker_v2.py", "EAGLEWorkerV2",
                                    "forward_batch_generation", {
                                        n: getattr(gate, n) for n in ("is_gated_decode", "run_gated_decode",
                                                                      "is_gated_prefill", "run_gated_prefill")})
        self.read = release_method(version, "srt/managers/scheduler_output_processor_mixin.py",
                                   "SchedulerOutputProcessorMixin", reader, {})
        self.calls: list[str] = []
        self.worker.draft = self.worker.draft_worker.draft = lambda batch: self._draft(batch)
        self.worker.verify = self._verify
        self.worker.draft_worker._draft_extend_for_decode = lambda batch, output: self.calls.append("extend")
        gate.init_overlap_batch_gate(self.worker)
        # After the prefill: the request's prompt slots [0, seq) are allocated, nothing ahead.
        seq = [10 + 3 * i for i in range(size)]
        self.seq = np.array(seq)
        for r, n in enumerate(seq):
            runner.req_to_token_pool.req_to_token.a[r, :n] = np.arange(n) + 100 * r
        self.spec = sglang.draft_input(size, new_seq_lens=T(seq, np.int64), allocate_lens=T(seq, np.int64))
        # The scheduler's requests as the result reader counts them (a Req needs a tokenizer).
        self.reqs = [types.SimpleNamespace(spec_verify_ct=0, spec_accepted_tokens=0, kv_committed_len=0,
                                           kv_allocated_len=0) for _ in range(size)]

    def _draft(self, batch):  # the draft model's forward (GPU)
        self.calls.append("draft")
        return mock.MagicMock(name="verify_input")

    def _verify(self, batch, allocate_lens):
        """A speculative step that accepts every draft token (the widest it writes)."""
        self.calls.append("verify")
        size, stride = self.size, int(self.worker.speculative_num_draft_tokens)
        seq = batch.seq_lens.a
        assert all(int(allocate_lens.a[i]) >= seq[i] + stride for i in range(size))  # its writes reserved
        new_seq = T(seq + stride, np.int64)
        return self.sglang.result(
            next_token_ids=T(np.arange(size * stride) + 500, np.int64), accept_lens=T([stride] * size, np.int32),
            **{self.alloc_field: allocate_lens},
            next_draft_input=self.sglang.draft_input(
                size, topk_p=T(np.full((size, 1), 0.25), np.float32), topk_index=T(np.full((size, 1), 8), np.int64),
                verified_id=T(np.arange(size) + 900, np.int32),
                new_seq_lens=new_seq, allocate_lens=allocate_lens, verify_done=Event()),
        )

    def step(self, running: int):
        """One decode step with `running` requests in the (global) batch: the scheduler's
        preparation, the worker, the result reader. Returns what the step did."""
        seq = self.seq.copy()
        before = self.spec.allocate_lens.tolist()
        pool = self.worker.target_worker.model_runner.req_to_token_pool
        # The batch size the gate decides on (`len(batch.reqs)`): these requests among others.
        batch = self.sglang.schedule_batch(
            0, reqs=Running(self.reqs, running), seq_lens=T(seq, np.int64), spec_info=self.spec,
            req_pool_indices=T(list(range(self.size)), np.int64), req_to_token_pool=pool,
            token_to_kv_pool_allocator=types.SimpleNamespace(page_size=1),  # the KV pool (GPU)
            enable_overlap=True, spec_algorithm=self.sglang.algorithm(),
        )
        self.pool.allocations.clear()
        if self.mixin:
            self.reserve(self.spec, batch)
        else:
            self.reserve(batch)
        allocated = int(sum(self.pool.allocations))
        to_run = self.sglang.worker_batch(self.spec, self.size, seq_lens=T(seq, np.int64),
                                          seq_lens_cpu=T(seq, np.int64), seq_lens_sum=int(seq.sum()))
        self.calls = []
        result = self.entry(self.worker, to_run)
        scheduler = types.SimpleNamespace(draft_worker=self.worker)
        tokens = self.read(scheduler, result, self.sglang.schedule_batch(0, reqs=self.reqs))
        if isinstance(tokens, tuple):  # 0.5.3.x: (allocate lens, accept lens, tokens)
            tokens = tokens[2]
        # The scheduler's hand-over to the next step.
        self.spec = result.next_draft_input
        self.seq = np.array(self.spec.new_seq_lens.tolist())
        return types.SimpleNamespace(
            gated=self.calls == [], calls=self.calls, tokens=tokens, allocated=allocated, before=before,
            result_alloc=getattr(result, self.alloc_field).tolist(), seq=seq.tolist(), result=result,
        )


class Running(list):
    """This run's requests, counted as `running` (the rest of the batch is not simulated)."""

    def __init__(self, reqs, running):
        super().__init__(reqs)
        self.running = running

    def __len__(self):
        return self.running


@pytest.mark.parametrize("version", WINDOW_RELEASES)
def test_old_window_releases_gate_a_step_with_the_speculative_result_layout(sglang, monkeypatch):
    run = OldRun(sglang, monkeypatch, threshold=4)
    first = run.step(running=3)  # speculating
    assert not first.gated and "draft" in first.calls and "verify" in first.calls
    gated = run.step(running=9)
    assert gated.gated  # the target's plain DECODE alone: no draft, no verify
    seen = run.worker.target_worker.seen[-1]
    assert seen["algorithm"] is sglang.algorithm("NONE") and seen["spec_info"] is None
    assert (seen["graphs"], seen["backend"]) == ("DECODE", "decode backend")
    req_to_token = run.worker.target_worker.model_runner.req_to_token_pool.req_to_token.a
    # Its one token goes to the slot the window reserved at each request's length.
    assert seen["out_cache_loc"] == [int(req_to_token[r, n]) for r, n in enumerate(gated.seq)]
    assert all(slot >= 5000 for slot in seen["out_cache_loc"])
    assert seen["input_ids"] == [900, 901, 902]  # the token the speculative step left
    # What the release's result processing reads: one token per request at the start of its
    # num_draft_tokens-wide row, and the step's reservation.
    assert gated.tokens == [[100 + n + 1] for n in gated.seq]
    assert gated.result.accept_lens.tolist() == [1, 1, 1]
    assert gated.result_alloc == [n + ALLOC for n in gated.seq]
    nxt = run.spec
    assert nxt.verified_id.tolist() == [n + 101 for n in gated.seq] and nxt.new_seq_lens.tolist() == [
        n + 1 for n in gated.seq]
    assert nxt.allocate_lens.tolist() == gated.result_alloc and nxt.verify_done is not None
    assert gated.result.eaglegate_gated_step is True


@pytest.mark.parametrize("version", WINDOW_RELEASES)
def test_old_window_releases_reserve_one_slot_a_gated_step_and_free_exactly_the_overallocation(
    sglang, gate, monkeypatch
):
    """Through speculative, gated and resumed stretches: each step finds its writes reserved;
    a gated step after a gated step allocates one slot per request; the reservation the result
    reports always ends ALLOC past the step's length, so freeing a request that finished
    (`[allocate_lens - ALLOC, allocate_lens)`) returns exactly the slots past its tokens."""
    run = OldRun(sglang, monkeypatch, threshold=4)
    kinds = []
    for running in [2, 2, 9, 9, 9, 9, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 9, 2]:
        done = run.step(running)
        kinds.append("gated" if done.gated else "spec")
        assert done.result_alloc == [n + ALLOC for n in done.seq]
        req_to_token = run.worker.target_worker.model_runner.req_to_token_pool.req_to_token.a
        for r, n in enumerate(done.seq):  # every slot up to the window's end is this request's
            assert (req_to_token[r, : n + ALLOC] >= 0).all()
        if done.gated and kinds[-2:] == ["gated", "gated"]:
            assert done.allocated == run.size  # one new slot per request
    resume = gate.DEFAULT_RESUME_STEPS
    assert kinds[:2] == ["spec", "spec"] and kinds[2:6] == ["gated"] * 4
    # Below the lower mark the hysteresis holds; the step that completes `resume` of them speculates.
    assert kinds[6:5 + resume] == ["gated"] * (resume - 1) and kinds[5 + resume] == "spec"
    assert kinds[-2:] == ["gated", "gated"]  # 9 > 4 again; 2 right after: still gated


@pytest.mark.parametrize("version", ["0.5.3.post2", "0.5.4"])
def test_old_window_releases_with_attention_dp_every_rank_speculates(sglang, monkeypatch):
    """Two data-parallel ranks with local batches on either side of the threshold: the gate
    is off on both (as from 0.5.6), so neither runs a plain step while the other verifies."""
    ranks = []
    for local in (9, 1):
        run = OldRun(sglang, monkeypatch, threshold=4, size=3, enable_dp_attention=True)
        ranks.append([run.step(running=local + 2 * i).gated for i in range(4)])
    assert ranks == [[False] * 4, [False] * 4]


@pytest.mark.parametrize("version", ["0.5.3.post2", "0.5.5.post3"])
def test_old_releases_gated_prefill_rows_carry_their_reservation(sglang, monkeypatch, version):
    """A prefill while speculation is off: the rows the FutureMap stores and the next decode
    preparation reads (`allocate_lens`, the prompt's length: nothing reserved ahead yet)."""
    run = OldRun(sglang, monkeypatch, threshold=2)
    run.step(running=3)  # 3 > 2: speculation off
    extend = sglang.worker_batch(None, 2, mode="EXTEND", input_ids=T([5, 6], np.int64),
                                 out_cache_loc=T([1, 2], np.int64), seq_lens=T([20, 30], np.int64))
    assert not hasattr(sglang.DraftInput, "hidden_size_for")  # no width on the draft input
    config = types.SimpleNamespace(hidden_size=6, dtype=np.float16)  # the draft model's (GPU)
    if version == "0.5.3.post2":  # the overlap worker is its own draft worker there
        del run.worker.draft_worker
        run.worker.draft_model_runner = types.SimpleNamespace(model_config=config)
    else:
        run.worker.draft_worker.draft_runner.model_config = config
    rows = run.entry(run.worker, extend).next_draft_input
    assert run.calls == []  # no draft prefill
    assert rows.allocate_lens.tolist() == [20, 30] and rows.new_seq_lens.tolist() == [20, 30]
    assert rows.verified_id.tolist() == [120, 130] and rows.num_tokens_per_batch == 1
    assert rows.hidden_states.shape == (2, 6)


# ---- a gated step's FutureMap relay (0.5.13 on) ------------------------------------------
RELAY_RELEASES = [v for v in OVERLAP_RELEASES if Version(v) >= Version("0.5.13")]


class ReleaseCodeRan(Exception):
    """Raised by the doubles below when the release's own relay code reads them."""


class Strict:
    """A double with the given attributes; reading any other raises ReleaseCodeRan (the
    release's own code, past the gate's first statement, reads something else first)."""

    def __init__(self, **values):
        vars(self).update(values)

    def __getattr__(self, name):
        raise ReleaseCodeRan(name)


def patched_relay(version, gate):
    """The release's `FutureMap._resolve_spec_extras` and `stash` as the patch leaves them,
    compiled from its own source with the gate's functions (annotations dropped)."""
    from eaglegate.patches.codemods import spec_relay
    from eaglegate.patches.generate import RELAY

    from conftest import release

    source = spec_relay.relay_where_present((release(version).root / RELAY).read_text(), RELAY)
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == spec_relay.CLASS)
    funcs = [n for n in cls.body if isinstance(n, ast.FunctionDef)
             and n.name in (spec_relay.RESOLVE, spec_relay.STASH)]
    for func in funcs:
        func.decorator_list, func.returns = [], None
        for arg in func.args.args:
            arg.annotation = None
    namespace = {spec_relay.RESOLVE_HOOK: gate.resolve_gated_relay,
                 spec_relay.STASH_HOOK: gate.stash_gated_relay,
                 "torch": types.SimpleNamespace(Tensor=T)}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), RELAY, "exec"), namespace)
    return namespace[spec_relay.RESOLVE], namespace[spec_relay.STASH]


def future_map(rows=4):
    """The FutureMap's buffers (GPU), one row per request slot: tokens 500 + row, top-k and hidden
    rows of their own values."""
    return Strict(
        output_tokens_buf=T(np.arange(rows) + 500, np.int64),
        topk_p_buf=T(np.full((rows, 1), 0.25), np.float32),
        topk_index_buf=T(np.full((rows, 1), 3), np.int64),
        hidden_states_buf=T(np.full((rows, 6), 2.0), np.float16),
    )


@pytest.mark.parametrize("version", RELAY_RELEASES)
def test_a_gated_step_relays_its_token_alone_through_the_releases_own_future_map(sglang, gate, version):
    """On the release's patched FutureMap methods: a gated batch gathers the last sampled
    token of its rows and nothing else, and its step's stash writes the tokens the gated step
    sampled and nothing else; a speculative batch and any other payload go to the release's
    own code."""
    resolve, stash = patched_relay(version, gate)
    worker = make_worker(sglang, threshold=1)
    gate.init_overlap_batch_gate(worker)
    fmap = future_map()
    tops = [fmap.topk_p_buf.a.copy(), fmap.topk_index_buf.a.copy(), fmap.hidden_states_buf.a.copy()]
    # The rows of the step before: to be left as they are.
    spec = sglang.draft_input(3, future_indices=T([2, 0, 1], np.int64))
    stale = (spec.topk_p, spec.topk_index, spec.hidden_states)
    gate.decode_alloc_len(spec, sglang.schedule_batch(3), 4)
    batch = sglang.worker_batch(spec, 3)
    assert resolve(fmap, batch) is None
    assert spec.bonus_tokens.tolist() == [502, 500, 501]  # the rows' own tokens, in batch order
    assert (spec.topk_p, spec.topk_index, spec.hidden_states) == stale

    result = gate.run_gated_decode(worker, batch, **sglang.passed())
    assert gate.gate_for(worker).failures == 0
    sampled = result.next_draft_input.bonus_tokens
    assert worker.target_worker.seen[-1]["input_ids"] == [502, 500, 501]
    # 0.5.13 stashes the draft input, 0.5.15 on a payload made of its fields: either carries
    # the token rows (the gate reads no other field of it)
    payload = types.SimpleNamespace(bonus_tokens=sampled, topk_p=spec.topk_p, topk_index=spec.topk_index,
                                    hidden_states=spec.hidden_states)
    assert stash(fmap, spec.future_indices, payload) is None
    assert fmap.output_tokens_buf.tolist() == [112, 113, 111, 503]  # rows 2, 0, 1 took 111-113
    assert fmap.output_tokens_buf.dtype is np.int64
    for kept, buf in zip(tops, (fmap.topk_p_buf, fmap.topk_index_buf, fmap.hidden_states_buf), strict=True):
        assert (buf.a == kept).all()

    # The same payload again, or a speculative step's: the release's own stash.
    with pytest.raises(ReleaseCodeRan):
        stash(fmap, spec.future_indices, payload)
    with pytest.raises(ReleaseCodeRan):
        resolve(fmap, sglang.worker_batch(Strict(eaglegate_gated=False), 3))


@pytest.mark.parametrize("version", ["0.5.13.post1", "0.5.16"])
def test_a_deferred_stash_still_finds_its_gated_step(sglang, gate, monkeypatch):
    """Two gated steps launched before the first one's relay is stashed: each stash finds its
    own step (by the tensor its payload carries, never by comparing token values), once."""
    # As torch's: `==` compares elements, and the truth of several is an error.
    monkeypatch.setattr(T, "__eq__", lambda self, other: T(self.a == T._raw(other)), raising=False)
    monkeypatch.setattr(T, "__bool__", lambda self: bool(self.a), raising=False)
    worker = make_worker(sglang, threshold=1)
    gate.init_overlap_batch_gate(worker)
    fmap, rows = future_map(), T([0, 1, 2], np.int64)
    spec = sglang.draft_input(3)
    gate.decode_alloc_len(spec, sglang.schedule_batch(3), 4)
    first = gate.run_gated_decode(worker, sglang.worker_batch(spec, 3), **sglang.passed()).next_draft_input
    gate.decode_alloc_len(first, sglang.schedule_batch(3), 4)
    second = gate.run_gated_decode(worker, sglang.worker_batch(first, 3), **sglang.passed()).next_draft_input
    assert bool((first.bonus_tokens == second.bonus_tokens).a.all())  # equal, not the same
    assert gate.stash_gated_relay(fmap, rows, second) and gate.stash_gated_relay(fmap, rows, first)
    assert not gate.stash_gated_relay(fmap, rows, first)
    assert not gate.stash_gated_relay(fmap, rows, spec)  # a speculative step's input
    assert fmap.output_tokens_buf.tolist() == [111, 112, 113, 503]
