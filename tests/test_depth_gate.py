"""The depth gate (speculation's depth per decode step) on each release's own classes.

The table's parsing; the decision per step over batch x context, made where the scheduler
reserves the step's KV (`decode_alloc_len`) on the release's ScheduleBatch and draft input;
the switch between the release's adaptive tiers through its own `EAGLEWorkerV2.apply_runtime_state`
and `AdaptiveController`, with its own policy (`AdaptiveSpeculativeParams`) replaced while the
gate holds the depth and handed back after an error; the counters (decode log line and
Prometheus); and failing open. The releases' classes come from `release_defs`; the worker's
GPU side (draft worker, model runner, graph runners, attention backends) are stand-ins.
"""

from __future__ import annotations

import json
import logging
import os
import types

import prometheus_client
import pytest
from test_gate_releases import Server

from conftest import release
from release_defs import Release

# Before any tiers (0.5.9); the first with tiers and its acceptance-only policy (0.5.12.post1);
# per-batch policies (0.5.16); the pluggable policy (0.5.23).
WITHOUT_TIERS = ["0.5.9"]
WITH_TIERS = ["0.5.12.post1", "0.5.16", "0.5.23"]
ENV = "SGLANG_SPEC_DEPTH_TABLE"
LAUNCH = 3  # the launch's --speculative-num-steps

# Batch bands <=4, 5..16, >16; context bands <=1024, >1024. Depth 0 only for big batches of
# short context: a long context keeps speculation on at the same batch size.
TABLE = {"batch": [4, 16], "context": [1024],
         "depth": [["launch", "launch"], [1, 2], [0, 2]],
         "margin": [[0.3, 0.4], [0.1, 0.2], [0.05, 0.1]]}


def tier_modules(defs: Release):
    classes = {}
    for module, name in (("sglang.srt.speculative.adaptive_runtime_state", "AdaptiveController"),
                         ("sglang.srt.speculative.adaptive_runtime_state", "SpecRuntimeState"),
                         ("sglang.srt.speculative.adaptive_spec_params", "AdaptiveSpeculativeParams"),
                         ("sglang.srt.speculative.eagle_worker_v2", "EAGLEWorkerV2")):
        classes[name] = defs.cls(module, name)
    return classes


class DraftWorker:
    """The draft worker's GPU side, as far as the release's `apply_runtime_state` writes it."""

    def __init__(self):
        self.draft_runner = types.SimpleNamespace()
        self.rebuilt = 0

    def _rebuild_topk1_chain_buffers(self):
        self.rebuilt += 1


def start(version, monkeypatch, tmp_path, table=TABLE, tiers=True, threshold=0):
    """The release's server with the table set; with `tiers`, the release's adaptive controller
    and policy holding one SpecRuntimeState per step count 1..3, as `init_states` leaves them."""
    server = Server(version, monkeypatch, threshold=threshold)
    monkeypatch.setenv("SGLANG_SPEC_BATCH_GATE_RESUME_STEPS", "2")
    if table is not None:
        monkeypatch.setenv(ENV, json.dumps(table) if isinstance(table, dict) else table)
    else:
        monkeypatch.delenv(ENV, raising=False)
    worker = server.worker
    worker.speculative_num_steps = LAUNCH
    worker.server_args.speculative_num_steps = LAUNCH
    server.states = {}
    if tiers:
        classes = tier_modules(server.defs)
        # The release's own switch, on this worker.
        worker.apply_runtime_state = types.MethodType(classes["EAGLEWorkerV2"].apply_runtime_state, worker)
        worker._draft_worker = DraftWorker()
        runner = worker.target_worker.model_runner
        worker._target_worker = worker.target_worker
        worker.server_args.override = lambda *args, **kwargs: None  # ServerArgs' own, 0.5.14..0.5.19
        Params = classes["AdaptiveSpeculativeParams"]
        if "config" in Params.__init__.__code__.co_varnames:  # 0.5.12.x: the config itself
            params = Params(initial_steps=LAUNCH, config={"candidate_steps": [1, 2, 3]})
        else:  # 0.5.13 on: a config file, one batch slot
            path = tmp_path / "adaptive.json"
            path.write_text(json.dumps({"1": {"candidate_steps": [1, 2, 3]}}))
            params = Params(initial_steps=LAUNCH, cfg_path=str(path))
        controller = server.defs.instance(classes["AdaptiveController"], worker=worker, params=params)
        controller._states = {}
        for steps in (1, 2, 3):
            # The launch's tier is the worker's own objects, as `register` records them.
            launch = steps == LAUNCH
            controller._states[steps] = server.states[steps] = server.defs.instance(
                classes["SpecRuntimeState"], speculative_num_steps=steps, speculative_num_draft_tokens=steps + 1,
                draft_attn_backend=f"draft backend {steps}", cuda_graph_runner=f"draft graphs {steps}",
                target_attn_backend=runner.attn_backend if launch else f"verify backend {steps}",
                target_graph_runner=runner.graph_runner if launch else f"verify graphs {steps}",
                draft_extend_attn_backend=None, cuda_graph_runner_for_draft_extend=f"extend graphs {steps}")
        worker.speculative_num_draft_tokens = LAUNCH + 1
        worker._draft_worker.cuda_graph_runner = server.states[LAUNCH].cuda_graph_runner
        worker.adaptive_controller = controller
        server.release_params = params
    server.start()
    server.state = server.gate._overlap_gate
    return server


def decide(server, size: int, context: int) -> tuple[bool, int]:
    """One decode step's decision on the release's scheduler batch of `size` requests whose mean
    KV length is `context`: (gated, the reservation returned)."""
    batch = server.defs.instance(server.ScheduleBatch, reqs=[object()] * size, seq_lens_sum=size * context)
    spec = server.draft_input(size)
    alloc = server.gate.decode_alloc_len(spec, batch, 8)
    return getattr(spec, server.gate.GATED_DECODE_ATTR), alloc


# ---- the table ----------------------------------------------------------------------------


def test_a_table_reads_inline_or_from_a_file_and_places_each_step_in_its_cell(tmp_path):
    from eaglegate.patches.gate_module import DepthTable

    path = tmp_path / "table.json"
    path.write_text(json.dumps(TABLE))
    for text in (json.dumps(TABLE), str(path)):
        table = DepthTable.parse(text)
        assert table.shape() == "3x2"
        # Bounds are inclusive: 4 is the first band, 5 the second; context 1024 short, 1025 long.
        cells = {(b, c): table.cell(b, c) for b in (1, 4, 5, 16, 17, 500) for c in (1, 1024, 1025, 10**6)}
        assert cells[(4, 1024)] == cells[(1, 1)] == "launch"
        assert cells[(5, 1024)] == 1 and cells[(5, 1025)] == 2
        assert cells[(16, 1)] == 1 and cells[(17, 1024)] == 0 and cells[(500, 1025)] == 2
        assert table.margins == TABLE["margin"]


BAD_TABLES = {
    "not JSON": ("{batch: [4]}", "not JSON"),
    "a list": ("[1, 2]", "cannot read"),  # not an object, so read as a path
    "no batch bounds": (json.dumps({"depth": [[1]]}), "batch: not a list of positive integers"),
    "bounds not increasing": (json.dumps({"batch": [8, 8], "depth": [[1], [1], [0]]}),
                              "batch: bounds not strictly increasing"),
    "a zero bound": (json.dumps({"batch": [0], "depth": [[1], [0]]}), "batch: not a list"),
    "rows short": (json.dumps({"batch": [8], "depth": [[1]]}), "depth: not 2 rows"),
    "a column short": (json.dumps({"batch": [8], "context": [100], "depth": [[1, 1], [0]]}),
                       "depth: not 2 rows (batch bands) of 2"),
    "a negative depth": (json.dumps({"batch": [8], "depth": [[1], [-1]]}), "depth -1"),
    "a depth too deep": (json.dumps({"batch": [8], "depth": [[17], [0]]}), "depth 17"),
    "a boolean depth": (json.dumps({"batch": [8], "depth": [[True], [0]]}), "depth True"),
    "a word": (json.dumps({"batch": [8], "depth": [["deep"], [0]]}), "depth 'deep'"),
    "an unknown key": (json.dumps({"batch": [8], "depth": [[1], [0]], "bands": 1}), "unknown key 'bands'"),
    "a margin misshapen": (json.dumps({"batch": [8], "depth": [[1], [0]], "margin": [[1]]}), "margin: not 2"),
    "a file missing": ("/nonexistent/table.json", "cannot read '/nonexistent/table.json'"),
    # Python's JSON parser recurses per level: a RecursionError, not a table.
    "nested too deep": ('{"batch": ' + "[" * 200_000 + "]" * 200_000 + "}", "nested too deep"),
    # Endless: read, it would fill the scheduler's memory at start-up.
    "a device": ("/dev/zero", "'/dev/zero' is not a regular file"),
}


@pytest.mark.parametrize("name", sorted(BAD_TABLES))
def test_a_bad_table_leaves_the_depth_gate_off_in_one_line(name, caplog):
    from eaglegate.patches.gate_module import DepthTable

    text, why = BAD_TABLES[name]
    with pytest.raises(ValueError) as raised:
        DepthTable.parse(text)
    assert why in str(raised.value)
    with caplog.at_level(logging.WARNING):
        assert DepthTable.from_settings(environ={ENV: text}) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith(f"depth gate: off, {ENV} is not a depth table: ")
    assert why in lines[0] and "\n" not in lines[0]


def test_a_fifo_or_a_file_too_large_is_refused_without_reading_it(tmp_path):
    from eaglegate.patches.gate_module import MAX_TABLE_BYTES, DepthTable

    fifo = tmp_path / "table.fifo"
    os.mkfifo(fifo)  # opened to be read, it would wait for a writer for ever
    with pytest.raises(ValueError, match="is not a regular file"):
        DepthTable.parse(str(fifo))
    large = tmp_path / "large.json"
    large.write_text(json.dumps(TABLE) + " " * MAX_TABLE_BYTES)
    with pytest.raises(ValueError, match=f"is over {MAX_TABLE_BYTES} bytes"):
        DepthTable.parse(str(large))


def test_the_server_argument_wins_over_the_environment(tmp_path, caplog):
    from eaglegate.patches.gate_module import DepthTable

    good = json.dumps(TABLE)
    assert DepthTable.from_settings(good, environ={ENV: "{bad"}).depths == TABLE["depth"]
    assert DepthTable.from_settings(None, environ={ENV: good}).depths == TABLE["depth"]
    assert DepthTable.from_settings("", environ={}) is None
    with caplog.at_level(logging.WARNING):
        assert DepthTable.from_settings("{bad", environ={ENV: good}) is None
    assert [r.getMessage().split(":")[1] for r in caplog.records] == [
        " off, speculative_depth_table is not a depth table"]


@pytest.mark.parametrize("bad", ["misshapen", "nested too deep"])
@pytest.mark.parametrize("version", ["0.5.9", "0.5.16"])
def test_a_bad_table_at_launch_starts_the_server_as_without_one(version, bad, monkeypatch, tmp_path, caplog):
    """With a bad table and no threshold the gate is off; with a threshold it is the batch gate."""
    table = '{"batch": [8], "depth": [[1]]}' if bad == "misshapen" else BAD_TABLES[bad][0]
    with caplog.at_level(logging.WARNING):
        server = start(version, monkeypatch, tmp_path, table=table, tiers=False)
    assert server.state is None and server.gate.gate_for(server.worker) is None
    assert decide(server, 40, 10) == (False, 8)
    server = start(version, monkeypatch, tmp_path, table=table, tiers=False, threshold=4)
    assert server.state is not None and server.state.depth_gate is None
    assert decide(server, 5, 10) == (True, 8)  # the threshold's decision, as without a table
    assert server.state.describe().startswith("gate(>4, <")


@pytest.mark.parametrize("version", WITHOUT_TIERS + WITH_TIERS)
def test_without_a_table_nothing_of_the_depth_gate_runs(version, monkeypatch, tmp_path):
    server = start(version, monkeypatch, tmp_path, table=None, threshold=4, tiers=version in WITH_TIERS)
    assert server.state.depth_gate is None
    if version in WITH_TIERS:  # the release's own policy stays in the controller
        assert server.worker.adaptive_controller.params is server.release_params
    assert decide(server, 3, 5000) == (False, 8) and decide(server, 5, 5000) == (True, 8)
    assert server.worker.speculative_num_steps == LAUNCH
    assert "depth" not in server.state.describe()


# ---- the decision and the switch ----------------------------------------------------------


@pytest.mark.parametrize("version", WITH_TIERS)
def test_each_step_runs_at_its_cells_depth_in_the_releases_own_tier_without_a_capture(
        version, monkeypatch, tmp_path):
    server = start(version, monkeypatch, tmp_path)
    worker, state = server.worker, server.state
    depth_gate = state.depth_gate
    assert depth_gate is not None and sorted(depth_gate.tiers) == [1, 2, 3]
    # No graph may be captured or state built from here on.
    worker.build_adaptive_runtime_state = lambda *a, **k: pytest.fail("a tier was rebuilt")
    graph_class = type(worker.target_worker.model_runner.graph_runner)
    monkeypatch.setattr(graph_class, "__init__", lambda *a, **k: pytest.fail("graphs were captured"))
    runner = worker.target_worker.model_runner

    def in_tier(steps):
        tier = server.states[steps]
        assert worker.speculative_num_steps == steps
        assert worker.speculative_num_draft_tokens == steps + 1
        assert worker._draft_worker.cuda_graph_runner == tier.cuda_graph_runner
        assert runner.attn_backend == tier.target_attn_backend
        assert tier.target_graph_runner in vars(runner).values()

    # (batch, mean context) -> depth, by the table: every step reserves the speculative width.
    for size, context, depth in ((2, 100, 3), (8, 100, 1), (8, 5000, 2), (3, 5000, 3), (8, 800, 1)):
        assert decide(server, size, context) == (False, 8)
        in_tier(depth)
        assert depth_gate.depth == depth
    assert depth_gate.depth_switches == 4  # 3 -> 1 -> 2 -> 3 -> 1
    # A big batch of long context keeps speculating (at 2); of short context it is gated.
    assert decide(server, 40, 5000) == (False, 8)
    in_tier(2)
    assert decide(server, 40, 500) == (True, 8)
    assert state.gated and depth_gate.depth == 0
    in_tier(2)  # a gated step runs the gate's plain decode in whatever tier is in place
    # Back above 0 only after the hysteresis' steps (2 here) in a row.
    assert decide(server, 8, 100) == (True, 8)
    assert decide(server, 8, 100) == (False, 8)
    in_tier(1)
    assert depth_gate.steps_by_depth == {3: 2, 1: 3, 2: 2, 0: 2}
    assert state.gated_steps == 2 and state.speculative_steps == 7


@pytest.mark.parametrize("version", WITHOUT_TIERS + WITH_TIERS)
def test_without_tiers_the_table_collapses_to_plain_and_the_launch_depth(version, monkeypatch, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        server = start(version, monkeypatch, tmp_path, tiers=False)
    depth_gate = server.state.depth_gate
    assert depth_gate.tiers == {}
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("depth gate:")]
    assert said == ["depth gate: no CUDA-graph tier for depth 1, 2 in this server (SGLang builds them "
                    "with --speculative-adaptive, from 0.5.12); those cells run at the launch's 3 steps"]
    assert decide(server, 8, 100) == (False, 8) and depth_gate.depth == LAUNCH
    assert decide(server, 40, 100) == (True, 8) and depth_gate.depth == 0
    assert server.worker.speculative_num_steps == LAUNCH


@pytest.mark.parametrize("version", WITH_TIERS)
def test_the_releases_own_policy_follows_the_gate_and_acceptance_switches_nothing(version, monkeypatch, tmp_path):
    server = start(version, monkeypatch, tmp_path)
    worker, controller = server.worker, server.worker.adaptive_controller
    assert controller.params is not server.release_params  # the gate's stand-in policy
    decide(server, 8, 5000)
    assert worker.speculative_num_steps == 2
    # The worker's own per-step switch (0.5.13 on, in its forward) keeps the gate's tier...
    if hasattr(controller, "activate_step_by_batch"):
        controller.activate_step_by_batch(8)
        assert worker.speculative_num_steps == 2
    # ...and however good the acceptance, the release's controller moves nothing.
    for _ in range(40):
        if "batch_size" in controller.on_verify_complete.__code__.co_varnames:
            controller.on_verify_complete([3] * 8, 8)
        else:
            controller.on_verify_complete([3] * 8)
    assert worker.speculative_num_steps == 2


@pytest.mark.parametrize("version", WITH_TIERS)
def test_a_gated_step_sizes_the_joining_prefill_by_the_table(version, monkeypatch, tmp_path):
    server = start(version, monkeypatch, tmp_path)
    decide(server, 14, 500)  # depth 1: 14 requests of short context
    prefill = server.worker_batch(None, 2, mode="EXTEND")
    assert not server.gate.is_gated_prefill(prefill)  # 16 still speculate
    prefill = server.worker_batch(None, 3, mode="EXTEND")
    assert server.gate.is_gated_prefill(prefill)  # 17 of short context: depth 0


# ---- the step's context where the scheduler leaves its sum unset ---------------------------
#
# From 0.5.13 the scheduler's batch routinely holds `seq_lens_sum = None` at the decision (its
# filter and merge reset it, the FutureMap leaves it None for a backend that needs no CPU
# lengths): the context is then its requests' own lengths.


def requests(server, size: int, prompt: int, generated: int = 1) -> list:
    """`size` of the release's own requests, each `prompt` tokens in and `generated` out."""
    Req = server.defs.cls("sglang.srt.managers.schedule_batch", "Req")
    return [server.defs.instance(Req, origin_input_ids=[7] * prompt, output_ids=[9] * generated)
            for _ in range(size)]


@pytest.mark.parametrize("version", ["0.5.9", "0.5.12.post1", "0.5.13", "0.5.16", "0.5.23"])
def test_without_the_schedulers_sum_each_step_is_placed_by_its_requests_lengths(version, monkeypatch, tmp_path):
    tiers = version != "0.5.9"
    server = start(version, monkeypatch, tmp_path, tiers=tiers)
    state, depth_gate = server.state, server.state.depth_gate
    # (batch, prompt, generated) -> the table's depth; without tiers 1 and 2 run at the launch's 3.
    for size, prompt, generated, depth in ((8, 90, 10, 1), (8, 4990, 10, 2), (40, 4000, 1000, 2),
                                           (40, 500, 24, 0)):
        batch = server.defs.instance(server.ScheduleBatch, reqs=requests(server, size, prompt, generated),
                                     seq_lens_sum=None)
        spec = server.draft_input(size)
        assert server.gate.decode_alloc_len(spec, batch, 8) == 8
        assert depth_gate.last_context == prompt + generated
        assert depth_gate.depth == (depth if tiers or depth == 0 else LAUNCH)
        assert getattr(spec, server.gate.GATED_DECODE_ATTR) is (depth == 0)
    assert server.gate._overlap_gate is state and state.failures == 0 and state.failure is None
    if tiers:
        assert server.worker.speculative_num_steps == 2  # the tier of the last speculative step


@pytest.mark.parametrize("version", ["0.5.13", "0.5.16", "0.5.23"])
def test_a_gated_step_leaves_a_sum_the_scheduler_left_unset_for_the_forward_to_count(version, monkeypatch, tmp_path):
    """The batch gate's own gated step, on a batch whose CPU lengths are there and whose sum the
    release left None (its plain `prepare_for_decode` and `filter_batch` do)."""
    server = start(version, monkeypatch, tmp_path, table=None, tiers=False, threshold=2)
    spec = server.draft_input(3)
    server.gate.decode_alloc_len(spec, server.schedule_batch(3), 4)
    batch = server.worker_batch(spec, 3, seq_lens_sum=None)
    result = server.gate.run_gated_decode(server.worker, batch, **server.passed())
    assert result.eaglegate_gated_step is True and result.next_token_ids.tolist() == [111, 112, 113]
    assert server.gate._overlap_gate is server.state and server.state.failures == 0
    assert batch.seq_lens_cpu.tolist() == [11, 12, 13] and batch.seq_lens_sum is None


# ---- counters -----------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.5.9", "0.5.16"])
def test_the_depth_shows_in_the_decode_log_line_and_prometheus(version, monkeypatch, tmp_path):
    registry = prometheus_client.CollectorRegistry()
    for name in ("Counter", "Gauge"):
        kind = getattr(prometheus_client, name)
        monkeypatch.setattr(prometheus_client, name, lambda *a, _k=kind, **kw: _k(*a, registry=registry, **kw))
    # A handler of this test's own: the gates of other tests filter the root's handlers.
    handler = logging.NullHandler()
    monkeypatch.setattr(logging.getLogger(), "handlers", [handler])
    server = Server(version, monkeypatch, threshold=0)
    server.worker.server_args.enable_metrics = True
    monkeypatch.setenv(ENV, json.dumps(TABLE))
    server.worker.speculative_num_steps = LAUNCH
    server.start()
    # Depth 1 and 2 have no tier here: they run at the launch's 3.
    for size, context in ((8, 100), (8, 5000), (40, 100)):
        decide(server, size, context)
    line = logging.LogRecord("sglang", logging.INFO, "", 0, "Decode batch, #running-req: 40", None, None)
    handler.filter(line)
    assert line.msg == ("Decode batch, #running-req: 40, depth gate(3x2): off, depth 0, "
                        "by depth 0:1 3:2, 0 depth switches")
    assert registry.get_sample_value("sglang:spec_depth_gate_depth") == 0
    assert registry.get_sample_value("sglang:spec_depth_gate_steps_total", {"depth": "0"}) == 1
    assert registry.get_sample_value("sglang:spec_depth_gate_steps_total", {"depth": "3"}) == 2
    assert registry.get_sample_value("sglang:spec_batch_gate_steps_total", {"kind": "gated"}) == 1


# ---- failing open -------------------------------------------------------------------------


@pytest.mark.parametrize("version", WITH_TIERS)
def test_an_error_in_the_switch_speculates_and_hands_the_depth_back_to_the_release(
        version, monkeypatch, tmp_path, caplog):
    server = start(version, monkeypatch, tmp_path)
    worker, controller = server.worker, server.worker.adaptive_controller
    decide(server, 8, 100)
    assert worker.speculative_num_steps == 1

    def broken(state):
        raise RuntimeError("tier switch broke")

    monkeypatch.setattr(worker, "apply_runtime_state", broken)
    with caplog.at_level(logging.ERROR):
        assert decide(server, 8, 5000) == (False, 8)  # a speculative step, the reservation as SGLang's
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == ["batch gate: off for the life of this server after RuntimeError in the decision: "
                      "tier switch broke; the server runs as unpatched SGLang"]
    assert server.gate._overlap_gate is None and server.state.failures == 1
    assert controller.params is server.release_params  # the release's own policy again
    assert not server.gate.is_gated_decode(server.worker_batch(server.draft_input(40), 40))
    assert decide(server, 40, 100) == (False, 8)  # nothing gated any more


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_an_error_in_the_decision_speculates(version, monkeypatch, tmp_path, caplog):
    server = start(version, monkeypatch, tmp_path, tiers=False)
    batch = server.defs.instance(server.ScheduleBatch, reqs=[object()] * 8, seq_lens_sum="not a number")
    spec = server.draft_input(8)
    with caplog.at_level(logging.ERROR):
        assert server.gate.decode_alloc_len(spec, batch, 8) == 8
    assert getattr(spec, server.gate.GATED_DECODE_ATTR) is False
    assert server.state.failures == 1 and "in the decision" in server.state.failure


@pytest.mark.parametrize("version", ["0.4.10", "0.5.9"])
def test_a_table_given_to_the_v1_worker_is_said_to_be_ignored_in_one_line(version, monkeypatch, caplog):
    """The v1 EAGLEWorker has no depth gate: a launch with a table hears so once, and its batch
    gate (off here: no threshold) is as without one."""
    from eaglegate.patches import gate_module

    defs = Release(release(version).root)
    worker = defs.instance(defs.cls("sglang.srt.speculative.eagle_worker", "EAGLEWorker"),
                           server_args=types.SimpleNamespace(speculative_batch_gate_threshold=None))
    monkeypatch.setenv(ENV, json.dumps(TABLE))
    with caplog.at_level(logging.WARNING):
        gate_module.init_batch_gate(worker)
    assert [r.getMessage() for r in caplog.records] == [
        "depth gate: off, the depth table is ignored: this server runs the v1 EAGLEWorker, and the depth gate "
        "runs in the overlap worker (EAGLEWorkerV2) only"]
    assert gate_module.gate_for(worker) is None


@pytest.mark.parametrize(("server_arg", "env"), [
    ("table", None), (None, "table"), ("  ", "table"), ("table", "  "), ("", None), ("  ", "  "), (None, None)])
def test_the_v1_worker_hears_of_a_table_exactly_where_the_overlap_worker_would_read_one(
        server_arg, env, monkeypatch, caplog):
    from eaglegate.patches import gate_module

    defs = Release(release("0.5.9").root)
    text = {"table": json.dumps(TABLE)}
    args = types.SimpleNamespace(speculative_batch_gate_threshold=None,
                                 speculative_depth_table=text.get(server_arg, server_arg))
    worker = defs.instance(defs.cls("sglang.srt.speculative.eagle_worker", "EAGLEWorker"), server_args=args)
    if env is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, text.get(env, env))
    with caplog.at_level(logging.WARNING):
        gate_module.init_batch_gate(worker)
    told = any("the depth table is ignored" in r.getMessage() for r in caplog.records)
    assert told is (gate_module.DepthTable.from_settings(args.speculative_depth_table) is not None)
    assert told is ("table" in (server_arg, env))
