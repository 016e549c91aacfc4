"""The overlap worker's gate run against each release's own classes, and failing open.

Every release the overlap worker's patch reaches (0.5.3.post2 on) gets its entry points run
on the classes it defines (`release_defs`: the class bodies of its ScheduleBatch,
ModelWorkerBatch, EagleDraftInput, GenerationBatchResult, CaptureHiddenMode, ForwardMode and
SpeculativeAlgorithm, executed from its source with their defaults): the decision, the gated
decode, the gated prefill, the resume, the relay hand-over and the counters. The worker, its
target worker and model runner are stand-ins with the attributes the release declares on them
(`gate_contract` checks those names against its source). Tensors are the NumPy stand-in of
test_gate_overlap. Then errors are injected at each entry point: none reaches the caller.
"""

from __future__ import annotations

import ast
import json
import logging
import types
from pathlib import Path

import numpy as np
import prometheus_client
import pytest
from packaging.version import Version

from eaglegate.patches import gate_contract

from conftest import release
from test_gate_overlap import GATE_FILE, Sglang, T

CATALOGUE = Path(__file__).resolve().parents[1] / "bench" / "versions.json"
# Every release the overlap worker's patch reaches.
RELEASES = [v["version"] for v in json.loads(CATALOGUE.read_text())["versions"]
            if Version(v["version"]) >= Version("0.5.3.post2")]
# The releases the gate crashed on, live, before the fix (and two it did not).
CRASHED = ["0.5.13.post1", "0.5.15.post1"]
HELD = ["0.5.12.post1", "0.5.16"]
FIXED_LINE = 'batch.capture_hidden_mode = capture or _capture_hidden_mode("NULL")'
OLD_LINE = "batch.capture_hidden_mode = capture or type(batch.capture_hidden_mode).NULL"


class Server(Sglang):
    """One release's SGLang (its own classes, test_gate_overlap's `Sglang`) with a worker of
    stand-ins around it."""

    def __init__(self, version: str, monkeypatch, threshold: int = 4, gate_source: str | None = None):
        super().__init__(version, monkeypatch, gate_source)
        self.published: list = []
        self.speculative_steps: list = []
        self.worker = self._worker(threshold)

    def _worker(self, threshold: int):
        server = self
        runner = types.SimpleNamespace(
            server_args=types.SimpleNamespace(enable_return_hidden_states=False),
            spec_algorithm=self.algorithm(), attn_backend="verify backend", device="cuda",
            req_to_token_pool=types.SimpleNamespace(
                req_to_token=T(np.arange(4)[:, None] * 1000 + np.arange(64)[None, :], np.int32)),
            _get_attention_backend=lambda **kwargs: "decode backend",
            model_config=types.SimpleNamespace(hidden_size=6, dtype=np.float16, spec_hidden_size=6),
        )

        class GraphRunner:  # captures in the mode the runner's algorithm says, as SGLang's
            def __init__(self, runner):
                self.mode = "TARGET_VERIFY" if runner.spec_algorithm is not None else "DECODE"
                self.max_bs = 8

        runner.graph_runner = GraphRunner(runner)

        class TargetWorker:
            def __init__(self):
                self.model_runner = runner
                self.seen: list[dict] = []

            def forward_batch_generation(self, batch, capture_hidden_mode=None):
                self.seen.append({"capture": getattr(batch, "capture_hidden_mode", capture_hidden_mode),
                                  "seq_lens": batch.seq_lens.tolist(), "algorithm": batch.spec_algorithm,
                                  "spec_info": batch.spec_info, "backend": runner.attn_backend})
                sampled = T([100 + n for n in batch.seq_lens.tolist()], np.int64)
                return server.defs.instance(server.Result, next_token_ids=sampled)

        class Worker:  # the patched entry's own speculative branch, as far as the gate sees it
            def forward_batch_generation(self, batch, **passed):
                assert sorted(passed) == sorted(server.passed_names)
                server.speculative_steps.append(batch)
                return "speculative step"

        worker = Worker()
        args = {"speculative_batch_gate_threshold": threshold, "enable_metrics": False,
                "enable_dp_attention": False, "pp_size": 1}
        worker.server_args = types.SimpleNamespace(**args)
        worker.target_worker = TargetWorker()
        draft_runner = types.SimpleNamespace(model_config=runner.model_config)
        worker.draft_worker = types.SimpleNamespace(draft_runner=draft_runner, draft_model_runner=draft_runner,
                                                    speculative_algorithm=self.algorithm())
        worker.draft_runner = draft_runner
        worker.speculative_algorithm = self.algorithm()
        worker.speculative_num_draft_tokens = 4
        worker.topk = 1
        return worker

    def passed(self, **hooks) -> dict:
        return super().passed(on_publish=self.published.append, **hooks)

    def start(self):
        self.gate.init_overlap_batch_gate(self.worker)
        return self.gate.gate_for(self.worker)


@pytest.mark.parametrize("version", RELEASES)
def test_every_entry_point_runs_on_the_releases_own_classes(version, monkeypatch):
    server = Server(version, monkeypatch, threshold=2)
    monkeypatch.setenv("SGLANG_SPEC_BATCH_GATE_RESUME", "2")
    gate = server.gate
    state = server.start()
    assert state is not None and gate._overlap_gate is state, "the gate refused this release's classes"

    # The decision, on the scheduler's batch: 3 > 2, gated; the reservation is the speculative one.
    spec = server.draft_input(3)
    assert gate.decode_alloc_len(spec, server.schedule_batch(3), 4) == 4
    assert state.gated and state.gated_steps == 1

    # The gated decode, on the worker's batch as the release defines it.
    batch = server.worker_batch(spec, 3)
    assert gate.is_gated_decode(batch)
    before = {name: getattr(batch, name) for name in ("spec_info", "spec_algorithm")}
    result = gate.run_gated_decode(server.worker, batch, **server.passed())
    assert state.failures == 0, state.failure
    assert isinstance(result, server.Result) and not server.speculative_steps
    seen = server.worker.target_worker.seen[-1]
    assert seen["seq_lens"] == [11, 12, 13] and seen["spec_info"] is None
    assert seen["capture"] in (server.Capture.NULL, None)  # None: passed as no argument
    assert {name: getattr(batch, name) for name in before} == before  # put back for the scheduler
    assert result.next_token_ids.tolist()[:1] == [111] and result.accept_lens.tolist() == [1, 1, 1]
    nxt = result.next_draft_input
    assert isinstance(nxt, server.DraftInput) and gate.GATED_DECODE_ATTR not in vars(nxt)
    assert getattr(nxt, gate._token_field(nxt)).tolist() == [111, 112, 113]
    if "on_publish" in server.passed_names:
        assert server.published[-1].tolist() == [11, 12, 13]

    # The relay hand-over (0.5.13 on): the token rows alone, stashed once.
    future_map = object.__new__(server.defs.cls("sglang.srt.managers.overlap_utils", "FutureMap"))
    future_map.output_tokens_buf = T(np.zeros(8), np.int64)
    nxt.future_indices = T([1, 2, 3], np.int64)
    assert gate.stash_gated_relay(future_map, nxt.future_indices, nxt)
    assert future_map.output_tokens_buf.tolist()[1:4] == [111, 112, 113]
    assert not gate.stash_gated_relay(future_map, nxt.future_indices, nxt)  # once
    gate.decode_alloc_len(nxt, server.schedule_batch(3), 4)
    assert gate.resolve_gated_relay(future_map, server.worker_batch(nxt, 3))

    # The gated prefill: the target alone, the draft rows the release's own draft input.
    extend = server.worker_batch(None, 2, mode="EXTEND")
    assert gate.is_gated_prefill(extend)
    prefilled = gate.run_gated_prefill(server.worker, extend, **server.passed())
    assert state.failures == 0, state.failure
    assert isinstance(prefilled.next_draft_input, server.DraftInput)
    assert prefilled.next_draft_input.topk_p.shape == (2, 1)

    # The resume: below the lower mark for the resume steps, speculating again.
    for _ in range(state.resume_steps):
        spec = server.draft_input(1)
        gate.decode_alloc_len(spec, server.schedule_batch(1), 4)
    assert not state.gated and not gate.is_gated_decode(server.worker_batch(spec, 1))

    # The counters, in the decode log's words.
    assert state.describe().startswith("gate(>2, <2): spec, ")
    assert state.gated_steps >= 2 and state.switches == 2 and state.failures == 0


@pytest.mark.parametrize("version", CRASHED + HELD)
def test_the_line_that_crashed_live_fails_on_the_releases_that_crashed_and_no_other(version, monkeypatch, caplog):
    """The gate's line before the fix, run on each release's own ScheduleBatch: on 0.5.13.post1
    and 0.5.15.post1 its `capture_hidden_mode` defaults to None, and `type(None).NULL` fails
    there as it did on the H200; it held on 0.5.12.post1 (a ModelWorkerBatch the scheduler
    fills) and 0.5.16 (no such field). Today the error turns the gate off instead of reaching
    the scheduler, and the step is SGLang's own."""
    source = GATE_FILE.read_text()
    assert FIXED_LINE in source
    server = Server(version, monkeypatch, threshold=2, gate_source=source.replace(FIXED_LINE, OLD_LINE))
    state = server.start()
    spec = server.draft_input(3)
    server.gate.decode_alloc_len(spec, server.schedule_batch(3), 4)
    with caplog.at_level(logging.ERROR):
        result = server.gate.run_gated_decode(server.worker, server.worker_batch(spec, 3), **server.passed())
    if version in CRASHED:
        # The words the scheduler died with on the H200.
        assert state.failures == 1 and "type object 'NoneType' has no attribute 'NULL'" in state.failure
        assert result == "speculative step" and len(server.speculative_steps) == 1
    else:
        assert state.failures == 0 and result != "speculative step"
    # With the fix, every release runs the step.
    fixed = Server(version, monkeypatch, threshold=2)
    fixed_state = fixed.start()
    fixed.gate.decode_alloc_len(spec, fixed.schedule_batch(3), 4)
    fixed.gate.run_gated_decode(fixed.worker, fixed.worker_batch(spec, 3), **fixed.passed())
    assert fixed_state.failures == 0


# ---- failing open ----------------------------------------------------------------------


def _boom(*args, **kwargs):
    raise RuntimeError("injected")


INJECTED = {
    "decision": lambda s: setattr(s.gate.gate_for(s.worker), "decide", _boom),
    "gated decode": lambda s: setattr(s.worker.target_worker, "forward_batch_generation", _boom),
    "gated prefill": lambda s: setattr(s.worker.target_worker, "forward_batch_generation", _boom),
    "relay resolve": lambda s: None,
    "relay stash": lambda s: None,
    "counters": lambda s: setattr(s.gate.gate_for(s.worker), "record", _boom),
}


@pytest.mark.parametrize("where", sorted(INJECTED))
@pytest.mark.parametrize("version", ["0.5.9", "0.5.13.post1", "0.5.16", "0.5.23"])
def test_an_error_in_the_gate_never_reaches_the_scheduler(version, where, monkeypatch, caplog):
    """An error at each entry point: the call returns as the unpatched code would go on (the
    step handed back to SGLang's speculative path with the batch's fields as they were), the
    gate is off for the life of the server, one log line says why, and the decode log line
    counts the failure."""
    server = Server(version, monkeypatch, threshold=2)
    state = server.start()
    gate = server.gate
    INJECTED[where](server)
    spec = server.draft_input(3)
    with caplog.at_level(logging.INFO):
        reserved = gate.decode_alloc_len(spec, server.schedule_batch(3), 4)
        assert reserved == 4
        batch = server.worker_batch(spec, 3)
        if where in ("decision", "counters"):
            assert not gate.is_gated_decode(batch)
        elif where == "gated decode":
            kept = {name: getattr(batch, name) for name in gate._SavedBatch.FIELDS if hasattr(batch, name)}
            assert gate.run_gated_decode(server.worker, batch, **server.passed()) == "speculative step"
            assert server.speculative_steps == [batch]
            assert all(getattr(batch, name) is value for name, value in kept.items())
        elif where == "gated prefill":
            extend = server.worker_batch(None, 2, mode="EXTEND")
            assert gate.is_gated_prefill(extend)
            assert gate.run_gated_prefill(server.worker, extend, **server.passed()) == "speculative step"
        else:
            future_map = types.SimpleNamespace(output_tokens_buf=None)
            if where == "relay resolve":
                spec.future_indices = "not an index"
                future_map.output_tokens_buf = T(np.zeros(8), np.int64)
                assert not gate.resolve_gated_relay(future_map, batch)
            else:
                result = gate.run_gated_decode(server.worker, batch, **server.passed())
                nxt = result.next_draft_input
                assert not gate.stash_gated_relay(future_map, "rows", nxt)  # None has no dtype
    assert gate._overlap_gate is None  # off for good
    cause = {"relay resolve": "IndexError in the relay's resolve",
             "relay stash": "AttributeError in the relay's stash"}.get(where, "RuntimeError in ")
    assert state.failures == 1 and state.failure.startswith(cause), state.failure
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].getMessage().startswith("batch gate: off for the life of this server")
    assert "\n" not in errors[0].getMessage()
    assert "failed (" in state.describe() and state.describe().endswith("1 failure")
    # From now on every step is SGLang's own.
    later = server.draft_input(3)
    assert gate.decode_alloc_len(later, server.schedule_batch(9), 4) == 4
    assert not gate.is_gated_decode(server.worker_batch(later, 3))
    assert not gate.is_gated_prefill(server.worker_batch(None, 2, mode="EXTEND"))


def test_the_failure_counter_reaches_prometheus(monkeypatch):
    registry = prometheus_client.CollectorRegistry()
    for name in ("Counter", "Gauge"):
        kind = getattr(prometheus_client, name)
        monkeypatch.setattr(prometheus_client, name, lambda *a, _k=kind, **kw: _k(*a, registry=registry, **kw))
    server = Server("0.5.16", monkeypatch, threshold=2)
    server.worker.server_args.enable_metrics = True
    state = server.start()
    assert state.metrics is not None
    server.worker.target_worker.forward_batch_generation = _boom
    spec = server.draft_input(3)
    server.gate.decode_alloc_len(spec, server.schedule_batch(3), 4)
    server.gate.run_gated_decode(server.worker, server.worker_batch(spec, 3), **server.passed())
    assert registry.get_sample_value("sglang:spec_batch_gate_failures_total") == 1
    assert registry.get_sample_value("sglang:spec_batch_gate_gated") == 0


@pytest.mark.parametrize("version", ["0.5.9", "0.5.16"])
def test_a_server_lacking_what_the_gate_relies_on_keeps_the_gate_off(version, monkeypatch, caplog):
    """Before it first engages, the gate checks the classes and objects it relies on; a
    release without one of them runs as unpatched SGLang, and one line says what is missing."""
    server = Server(version, monkeypatch, threshold=2)
    del server.worker.target_worker.model_runner.req_to_token_pool
    with caplog.at_level(logging.WARNING):
        assert server.start() is None or server.gate._overlap_gate is None
    lines = [r.getMessage() for r in caplog.records if "batch gate" in r.getMessage()]
    assert lines == ["batch gate: off because this SGLang lacks what it relies on: "
                     "ModelRunner.req_to_token_pool"]
    spec = server.draft_input(3)
    assert server.gate.decode_alloc_len(spec, server.schedule_batch(9), 4) == 4
    assert not server.gate.is_gated_decode(server.worker_batch(spec, 3))


# ---- the off condition, as each release spells its settings -----------------------------


def declared_settings(root: Path) -> dict[str, str]:
    """The server's settings as the release declares them, with their defaults: the fields of
    `ServerArgs` (up to 0.5.21) and of its namespaces in `arg_groups/fields/` (0.5.22 on)."""
    found = {}
    sources = [root / "srt" / "server_args.py", *sorted((root / "srt" / "arg_groups" / "fields").glob("*.py"))]
    for path in sources:
        if not path.is_file():
            continue
        for cls in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(cls, ast.ClassDef) or (path.name == "server_args.py" and cls.name != "ServerArgs"):
                continue
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    found[stmt.target.id] = ast.unparse(stmt.value) if stmt.value is not None else ""
    return found


@pytest.mark.parametrize("version", RELEASES)
def test_the_gate_stays_off_under_attention_dp_and_pipeline_parallelism_as_each_release_spells_them(
        version, monkeypatch):
    server = Server(version, monkeypatch)
    gate = server.gate
    settings = declared_settings(server.root)
    dp = [n for n in (*gate.DP_ATTENTION_FLAGS, *gate.DP_ATTENTION_SIZES) if n in settings]
    pp = [n for n in gate.PIPELINE_SIZES if n in settings]
    assert dp and pp, f"{version} declares neither spelling the gate reads: {sorted(settings)[:5]}..."
    # The release's defaults: the gate may run.
    defaults = types.SimpleNamespace(**{n: ast.literal_eval(settings[n]) for n in dp + pp})
    assert gate.parallel_off_reason(defaults, views=[defaults]) is None
    for name in dp + pp:
        on = types.SimpleNamespace(**vars(defaults))
        setattr(on, name, True if isinstance(getattr(defaults, name), bool) else 8)
        reason = gate.parallel_off_reason(on, views=[on])
        assert reason == ("pipeline parallelism is on" if name in pp else "data-parallel attention is on")
    # Where attention DP has a width of its own (0.5.22 on), the flag's field stays false once
    # resolved: the width alone must keep the gate off.
    if "attn_dp_size" in settings:
        resolved = types.SimpleNamespace(enable_dp_attention=False, attn_dp_size=8, pp_size=1)
        assert gate.parallel_off_reason(resolved, views=[resolved]) == "data-parallel attention is on"


# ---- verify: the gate's contract against the tree -----------------------------------------


def _field_line(path: Path, cls: str, name: str) -> int:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(s.lineno for s in node.body if isinstance(s, ast.AnnAssign) and s.target.id == name)


@pytest.mark.parametrize("version", CRASHED + HELD)
def test_the_static_check_would_have_caught_the_crash(version, monkeypatch):
    """Had the gate declared that it handles the capture mode only as a CaptureHiddenMode (what
    the crashing line assumed), the check of the tree names the field, with its file:line,
    exactly where the release declares it Optional."""
    from eaglegate.patches import gate_module

    narrowed = tuple(
        (modules, classes, tuple(n.replace("capture_hidden_mode:CaptureHiddenMode|None",
                                           "capture_hidden_mode:CaptureHiddenMode") for n in names))
        for modules, classes, names in gate_module.RELIES_ON)
    monkeypatch.setattr(gate_module, "RELIES_ON", narrowed)
    root = release(version).root
    problems = [str(p) for p in gate_contract.check(root)]
    if version in CRASHED:
        line = _field_line(root / "srt/managers/schedule_batch.py", "ScheduleBatch", "capture_hidden_mode")
        assert problems == [f"ScheduleBatch.capture_hidden_mode (srt/managers/schedule_batch.py:{line}): "
                            "declared `Optional[CaptureHiddenMode]`; the gate handles CaptureHiddenMode"]
    else:
        assert problems == []


def test_verify_fails_on_a_release_with_a_field_missing_or_typed_otherwise_and_names_it(tmp_path):
    """A real release, patched, then one field of the scheduler's batch renamed (as a release
    renames one: everywhere in its module) and another retyped: verify fails and names both,
    with their file:line."""
    import shutil

    from eaglegate.analyzer.source import from_path
    from eaglegate.patches.generate import generate_patch
    from eaglegate.patches.transaction import apply
    from eaglegate.patches.verify import verify_tree

    parent = tmp_path / "site"
    shutil.copytree(release("0.5.16").root, parent / "sglang")
    tree = from_path(parent)
    assert apply(parent, generate_patch(tree, "v2", required=True), tree_version=tree.version).changed
    assert verify_tree(from_path(parent)).ok
    path = parent / "sglang" / "srt" / "managers" / "schedule_batch.py"
    retyped = _field_line(path, "ScheduleBatch", "out_cache_loc")
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    assert "torch.Tensor" in lines[retyped - 1]
    lines[retyped - 1] = lines[retyped - 1].replace("torch.Tensor", "List[int]")
    path.write_text("".join(lines), encoding="utf-8")
    for module in (parent / "sglang").rglob("*.py"):
        text = module.read_text(encoding="utf-8", errors="surrogateescape")
        if "seq_lens_cpu" in text:
            module.write_text(text.replace("seq_lens_cpu", "seq_lens_host"), encoding="utf-8",
                              errors="surrogateescape")
    report = verify_tree(from_path(parent))
    assert not report.ok
    check = next(c for c in report.checks if "field, method and enum member" in c.name)
    assert not check.passed
    class_line = next(n.lineno for n in ast.parse(path.read_text(encoding="utf-8")).body
                      if isinstance(n, ast.ClassDef) and n.name == "ScheduleBatch")
    assert (f"ScheduleBatch.seq_lens_cpu (srt/managers/schedule_batch.py:{class_line}): not declared in "
            "this release") in check.detail
    assert (f"ScheduleBatch.out_cache_loc (srt/managers/schedule_batch.py:{retyped}): declared "
            "`List[int]`; the gate handles Tensor") in check.detail
