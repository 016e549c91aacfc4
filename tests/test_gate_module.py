"""The gate module added to SGLang, imported straight from its file (no torch, no SGLang)."""

from __future__ import annotations

import ast
import enum
import importlib.util
import logging
import sys
import types
from pathlib import Path

import pytest

GATE_FILE = Path(__file__).resolve().parents[1] / "eaglegate" / "patches" / "gate_module.py"


@pytest.fixture()
def gate(monkeypatch):
    monkeypatch.delenv("SGLANG_SPEC_BATCH_GATE_THRESHOLD", raising=False)
    monkeypatch.delenv("SGLANG_SPEC_BATCH_GATE_RESUME", raising=False)
    monkeypatch.delenv("SGLANG_SPEC_BATCH_GATE_RESUME_STEPS", raising=False)
    spec = importlib.util.spec_from_file_location("batch_gate_under_test", GATE_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def worker(threshold=None):
    return types.SimpleNamespace(
        server_args=types.SimpleNamespace(speculative_batch_gate_threshold=threshold)
    )


class Mode:
    def __init__(self, name):
        self.name = name

    def is_extend(self):
        return self.name == "extend"

    def is_decode(self):
        return self.name == "decode"

    def is_idle(self):
        return self.name == "idle"


def test_imports_only_the_standard_library():
    """At module level; inside functions, only what SGLang's process has loaded: its own
    prometheus_client (the metrics hook), torch and sglang (the start-up compile)."""
    tree = ast.parse(GATE_FILE.read_text())
    top, lazy = set(), set()
    for node in ast.walk(tree):
        names = set()
        if isinstance(node, ast.Import):
            names = {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names = {(node.module or "").split(".")[0]}
        (top if node in tree.body or _in_type_checking(tree, node) else lazy).update(names)
    assert top <= set(sys.stdlib_module_names) | {"__future__"}, top
    assert lazy - set(sys.stdlib_module_names) == {"prometheus_client", "torch", "sglang"}, lazy


def _in_type_checking(tree, node):
    return any(
        isinstance(stmt, ast.If) and node in ast.walk(stmt) and "TYPE_CHECKING" in ast.unparse(stmt.test)
        for stmt in tree.body
    )


def test_off_unless_set(gate):
    assert gate.BatchGate.from_settings(None, environ={}) is None
    assert gate.gate_for(worker(None)) is None
    assert gate.gate_for(worker(0)) is None  # zero means off, not "gate everything"
    assert gate.describe(worker(None)) == ""
    w = worker(None)
    batch = types.SimpleNamespace(forward_mode=Mode("decode"), reqs=[object()] * 500)
    assert gate.prepare_gated_decode(w, batch) is False


def test_threshold_from_server_arg_and_env(gate, monkeypatch):
    assert gate.BatchGate.from_settings(16, environ={}).threshold == 16
    assert gate.BatchGate.from_settings(None, environ={gate.ENV_THRESHOLD: "24"}).threshold == 24
    # The server argument wins over the environment.
    assert gate.BatchGate.from_settings(16, environ={gate.ENV_THRESHOLD: "24"}).threshold == 16
    assert gate.BatchGate.from_settings(None, environ={gate.ENV_THRESHOLD: "many"}) is None
    monkeypatch.setenv(gate.ENV_THRESHOLD, "12")
    built = gate.gate_for(worker(None))
    assert built is not None and built.threshold == 12
    w = worker(None)
    assert gate.gate_for(w) is gate.gate_for(w)  # built once per worker


def test_off_for_hybrid_models(gate):
    w = worker(8)
    w.target_worker = types.SimpleNamespace(
        model_runner=types.SimpleNamespace(hybrid_gdn_config=object(), mamba2_config=None)
    )
    assert gate.gate_for(w) is None
    plain = worker(8)
    plain.target_worker = types.SimpleNamespace(
        model_runner=types.SimpleNamespace(mamba2_config=None)
    )
    assert gate.gate_for(plain) is not None


def test_hysteresis(gate):
    g = gate.BatchGate(8, resume_steps=1)
    assert g.resume_below == 7
    sizes = [4, 8, 9, 8, 7, 6, 8, 9, 20, 1]
    decisions = [g.decide(n) for n in sizes]
    # Off above 8; stays off at 8 and 7 (not below the lower mark); back on at 6.
    assert decisions == [False, False, True, True, True, False, False, True, True, False]
    assert g.switches == 4


def test_speculation_resumes_only_after_steps_in_a_row_below_the_mark(gate):
    g = gate.BatchGate(8, resume_steps=3)
    # A refilling batch dips below the mark for two steps, then a third prefill lands.
    sizes = [9, 2, 3, 9, 5, 4, 3, 2]
    assert [g.decide(n) for n in sizes] == [True, True, True, True, True, True, False, False]
    assert g.switches == 2
    assert gate.BatchGate(8).resume_steps == gate.DEFAULT_RESUME_STEPS
    with pytest.raises(ValueError):
        gate.BatchGate(8, resume_steps=0)


def test_resume_mark_from_env(gate):
    g = gate.BatchGate.from_settings(
        10, environ={gate.ENV_RESUME: "4", gate.ENV_RESUME_STEPS: "2"}
    )
    assert (g.threshold, g.resume_below, g.resume_steps) == (10, 4, 2)
    assert [g.decide(n) for n in (11, 5, 4, 3, 3)] == [True, True, True, True, False]
    # A resume mark above the threshold would flap; it is ignored.
    assert gate.BatchGate.from_settings(10, environ={gate.ENV_RESUME: "40"}).resume_below == 9
    with pytest.raises(ValueError):
        gate.BatchGate(0)
    with pytest.raises(ValueError):
        gate.BatchGate(8, resume_below=9)


def test_counters_and_log_string(gate):
    w = worker(2)
    big = types.SimpleNamespace(
        forward_mode=Mode("decode"), reqs=[object()] * 3, return_logprob=True
    )
    small = types.SimpleNamespace(
        forward_mode=Mode("decode"), reqs=[object()], return_logprob=False
    )
    assert gate.prepare_gated_decode(w, small) is False
    # Logprob batches are not gated (verify produces their logprobs), but are counted.
    assert gate.prepare_gated_decode(w, big) is False
    g = gate.gate_for(w)
    assert (g.gated_steps, g.speculative_steps) == (0, 2)
    g.record(True)
    text = gate.describe(w)
    assert text.startswith("gate(>2, <1)") and "2 spec / 1 gated" in text
    # Prefill batches are not decisions and are not counted.
    prefill = types.SimpleNamespace(forward_mode=Mode("extend"), reqs=[object()] * 9)
    assert gate.prepare_gated_decode(w, prefill) is False
    assert (g.gated_steps, g.speculative_steps) == (1, 2)


def test_dp_ranks_decide_alike_from_the_gathered_sizes(gate):
    # Two attention-DP ranks with different local batches; SGLang's MLP sync gave both
    # the same per-rank token counts (one per request in decode).
    ranks = [gate.BatchGate(8, resume_steps=1), gate.BatchGate(8, resume_steps=1)]
    local = [[2, 10, 3, 1, 0], [9, 1, 6, 7, 0]]
    for step in range(5):
        gathered = [local[0][step], local[1][step]]
        decisions = []
        for rank, g in enumerate(ranks):
            batch = types.SimpleNamespace(global_num_tokens=gathered)
            size, _ = g.global_size(local[rank][step], True, batch)
            decisions.append(g.decide(size))
        assert decisions[0] == decisions[1], (step, decisions)
    assert [r.switches for r in ranks] == [2, 2]


def test_dp_injected_global_view(gate):
    seen = []

    def all_reduce(size, eligible):
        seen.append((size, eligible))
        return 40, False  # another rank has a logprob request

    w = worker(8)
    g = gate.gate_for(w)
    g.global_view = all_reduce
    batch = types.SimpleNamespace(forward_mode=Mode("decode"), reqs=[object()] * 2)
    assert gate.prepare_gated_decode(w, batch) is False  # not eligible everywhere
    assert seen == [(2, True)]
    assert g.gated  # the hysteresis still saw the global size


def test_idle_dp_rank_joins_a_gated_step(gate, monkeypatch):
    monkeypatch.setenv("SGLANG_SPEC_BATCH_GATE_RESUME_STEPS", "1")  # resume at once
    runner = ModelRunner()
    verify_graphs = runner.graph_runner
    w = gated_worker(threshold=4, runner=runner)
    w._eaglegate_plain_decode = gate.PlainDecode("decode backend", "decode graphs")
    draft_input, algorithm = object(), Algorithm.EAGLE
    idle = types.SimpleNamespace(
        forward_mode=Mode("idle"),
        reqs=[],
        global_num_tokens=[0, 9],
        return_logprob=False,
        spec_info=draft_input,
        spec_algorithm=algorithm,
    )
    # Another rank is above the threshold: the idle rank runs the target's idle step too
    # (through the same DECODE graphs), without bookkeeping and without counting a step.
    assert gate.prepare_gated_decode(w, idle) is True
    g = gate.gate_for(w)
    assert g.gated and (g.gated_steps, g.speculative_steps) == (0, 0)
    assert (runner.attn_backend, runner.graph_runner) == ("decode backend", "decode graphs")
    gate.finish_gated_decode(w, idle, next_token_ids=None)
    assert idle.forward_mode.name == "idle"  # still idle, nothing to book
    assert idle.spec_info is draft_input and idle.spec_algorithm is algorithm
    assert idle.eaglegate_gated_step is False  # no step for the spec metrics to leave out
    assert (runner.attn_backend, runner.graph_runner) == ("verify backend", verify_graphs)
    # Below the lower mark on every rank, the idle rank speculates with the others.
    idle.global_num_tokens = [0, 1]
    assert gate.prepare_gated_decode(w, idle) is False


# ---- start-up: the target's plain-decode path --------------------------------------------


class Algorithm(enum.Enum):
    """Like SGLang's SpeculativeAlgorithm: an enum with a NONE member."""

    NONE = enum.auto()
    EAGLE = enum.auto()

    def is_none(self):
        return self is Algorithm.NONE


class GraphRunner:
    """A CudaGraphRunner double: what its constructor saw decides its capture mode, as the
    real one reads the runner's speculative algorithm and the hidden-state setting."""

    def __init__(self, runner):
        self.mode = "DECODE" if runner.spec_algorithm.is_none() else "TARGET_VERIFY"
        self.full_hidden = runner.server_args.enable_return_hidden_states
        self.backend = runner.attn_backend
        self.max_bs = 8


class FailingGraphRunner(GraphRunner):
    def __init__(self, runner):
        super().__init__(runner)
        if self.mode == "DECODE":
            raise RuntimeError("capture failed")


class ModelRunner:
    def __init__(self, graphs=GraphRunner, backend_error=None, workspace_flag=True):
        self.server_args = types.SimpleNamespace(enable_return_hidden_states=False)
        self.spec_algorithm = Algorithm.EAGLE
        self.attn_backend = "verify backend"
        self.init_new_workspace = False
        self.graph_runner = graphs(self) if graphs is not None else None
        self.backend_error = backend_error
        self.workspace_flag = workspace_flag
        self.backend_calls = []

    def _get_attention_backend(self, **kwargs):
        """0.5.9 on: takes `init_new_workspace` and sets the runner's attribute of that
        name, which the backend constructor reads; 0.5.4: no keyword, the constructor
        reads the runner's attribute as it is."""
        if kwargs and not self.workspace_flag:
            raise TypeError("unexpected keyword argument 'init_new_workspace'")
        if kwargs:
            self.init_new_workspace = kwargs["init_new_workspace"]
        self.backend_calls.append(self.init_new_workspace)  # the workspace the backend got
        if self.backend_error is not None:
            raise self.backend_error
        return f"decode backend {len(self.backend_calls)}"


def gated_worker(threshold=4, runner=None):
    w = worker(threshold)
    w.server_args.enable_metrics = False
    w.target_worker = types.SimpleNamespace(model_runner=runner or ModelRunner())
    return w


@pytest.fixture()
def root_handler():
    """A handler on the root logger for init_batch_gate's log filter, removed afterwards."""
    handler = logging.NullHandler()
    root = logging.getLogger()
    root.addHandler(handler)
    yield handler
    root.removeHandler(handler)


def runner_state(runner):
    return (
        runner.graph_runner,
        runner.attn_backend,
        runner.spec_algorithm,
        runner.server_args.enable_return_hidden_states,
        runner.init_new_workspace,
    )


def test_init_builds_decode_graphs_with_full_hidden_states_and_their_own_backend(gate, root_handler):
    runner = ModelRunner()
    before = runner_state(runner)
    w = gated_worker(runner=runner)
    gate.init_batch_gate(w)
    plain = w._eaglegate_plain_decode
    assert isinstance(plain, gate.PlainDecode)
    assert plain.attn_backend == "decode backend 1"
    # The new backend got a workspace of its own, and the runner's flag is back.
    assert runner.backend_calls == [True]
    graphs = plain.graphs
    assert isinstance(graphs, GraphRunner) and graphs is not runner.graph_runner
    assert (graphs.mode, graphs.full_hidden, graphs.backend) == ("DECODE", True, "decode backend 1")
    assert runner_state(runner) == before  # verify graphs, backend, algorithm, args restored
    assert runner.graph_runner.mode == "TARGET_VERIFY"
    assert gate.gate_for(w) is not None
    assert any(isinstance(f, gate._DecodeLogLine) for f in root_handler.filters)


def test_init_with_a_backend_factory_without_the_workspace_flag(gate, root_handler):
    runner = ModelRunner(workspace_flag=False)
    w = gated_worker(runner=runner)
    gate.init_batch_gate(w)
    assert len(runner.backend_calls) == 1  # the keyword call refused, the plain call made
    assert w._eaglegate_plain_decode.attn_backend == "decode backend 1"
    assert runner.init_new_workspace is False


def test_a_factory_without_the_workspace_flag_still_gets_a_new_workspace(gate, root_handler):
    runner = ModelRunner(workspace_flag=False)
    gate.init_batch_gate(gated_worker(runner=runner))
    assert runner.backend_calls == [True]


def test_init_when_the_decode_graphs_fail_runs_gated_steps_eagerly(gate, root_handler):
    runner = ModelRunner(graphs=FailingGraphRunner)
    before = runner_state(runner)
    w = gated_worker(runner=runner)
    gate.init_batch_gate(w)
    plain = w._eaglegate_plain_decode
    assert plain is not None and plain.graphs is None and plain.attn_backend == "decode backend 1"
    assert runner_state(runner) == before
    assert gate.gate_for(w) is not None


def test_init_without_cuda_graphs_builds_no_graphs(gate, root_handler):
    runner = ModelRunner(graphs=None)
    w = gated_worker(runner=runner)
    gate.init_batch_gate(w)
    assert w._eaglegate_plain_decode.graphs is None
    assert runner.graph_runner is None and runner.spec_algorithm is Algorithm.EAGLE


def test_init_turns_the_gate_off_when_no_backend_can_be_built(gate, root_handler):
    runner = ModelRunner(backend_error=RuntimeError("no backend"))
    before = runner_state(runner)
    w = gated_worker(runner=runner)
    gate.init_batch_gate(w)
    assert w._eaglegate_plain_decode is None
    assert gate.gate_for(w) is None
    assert gate.describe(w) == ""
    assert runner_state(runner) == before
    assert not root_handler.filters  # no log line for a gate that is off
    # The worker then speculates as unpatched, whatever the batch size.
    batch = types.SimpleNamespace(forward_mode=Mode("decode"), reqs=[object()] * 50)
    assert gate.prepare_gated_decode(w, batch) is False


def test_init_does_nothing_when_the_gate_is_off(gate, root_handler):
    runner = ModelRunner()
    w = gated_worker(threshold=None, runner=runner)
    gate.init_batch_gate(w)
    assert runner.backend_calls == []
    assert getattr(w, "_eaglegate_plain_decode", None) is None
    assert not root_handler.filters


def test_plain_algorithm_is_the_enums_none_member_or_a_stand_in(gate):
    assert gate._plain_algorithm(Algorithm.EAGLE) is Algorithm.NONE

    class Eagle:  # no NONE member on its type
        def is_eagle(self):
            return True

        def is_none(self):
            return False

    stand_in = gate._plain_algorithm(Eagle())
    assert stand_in.is_none() is True and stand_in.is_eagle() is False


# ---- PlainDecode: swapping the runner's backend and graphs --------------------------------


def test_plain_decode_enter_and_leave(gate):
    runner = ModelRunner()
    verify_graphs = runner.graph_runner
    plain = gate.PlainDecode("decode backend", "decode graphs")
    plain.enter(runner)
    assert (runner.attn_backend, runner.graph_runner) == ("decode backend", "decode graphs")
    plain.enter(runner)  # entering twice keeps the originals, not the swapped-in pair
    plain.leave()
    assert (runner.attn_backend, runner.graph_runner) == ("verify backend", verify_graphs)
    runner.attn_backend = "changed since"
    plain.leave()  # a second leave restores nothing
    assert runner.attn_backend == "changed since"


def test_prepare_leaves_a_stale_enter(gate):
    """A step that raised between prepare and finish left the DECODE graphs in place: the
    next prepare restores the verify graphs, even for a step it does not gate."""
    runner = ModelRunner()
    verify_graphs = runner.graph_runner
    w = gated_worker(threshold=4, runner=runner)
    plain = gate.PlainDecode("decode backend", "decode graphs")
    w._eaglegate_plain_decode = plain
    plain.enter(runner)
    small = types.SimpleNamespace(forward_mode=Mode("decode"), reqs=[object()] * 2)
    assert gate.prepare_gated_decode(w, small) is False
    assert (runner.attn_backend, runner.graph_runner) == ("verify backend", verify_graphs)
    assert small.eaglegate_gated_step is False


# ---- SGLang's decode log line --------------------------------------------------------------


class Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_decode_log_line_appends_the_gate_once(gate):
    g = gate.BatchGate(8)
    g.record(True)
    log = logging.Logger("sglang.srt.managers.scheduler_under_test")
    first, second = Collect(), Collect()
    line = gate._DecodeLogLine(g)
    for handler in (first, second):
        handler.addFilter(line)
        log.addHandler(handler)
    log.info("Decode batch. #running-req: %d, #token: %d", 12, 340)
    log.info("Prefill batch. #new-seq: %d", 3)
    log.info("Decode batches are logged every %d steps", 40)  # not SGLang's line: still starts so
    expected = [
        f"Decode batch. #running-req: 12, #token: 340, {g.describe()}",
        "Prefill batch. #new-seq: 3",
        f"Decode batches are logged every 40 steps, {g.describe()}",
    ]
    assert first.lines == expected
    assert second.lines == expected  # the second handler did not append it again
    assert g.describe() == "gate(>8, <7): spec, 0 spec / 1 gated"


def test_decode_log_line_leaves_non_string_messages(gate):
    line = gate._DecodeLogLine(gate.BatchGate(8))
    record = logging.LogRecord("x", logging.INFO, __file__, 1, {"Decode batch": 1}, None, None)
    assert line.filter(record) is True
    assert record.msg == {"Decode batch": 1}


# ---- Prometheus metrics ----------------------------------------------------------------------


METRIC_NAMES = (
    "sglang:spec_batch_gate_gated",
    "sglang:spec_batch_gate_threshold",
    "sglang:spec_batch_gate_steps",
    "sglang:spec_batch_gate_switches",
    "sglang:spec_batch_gate_failures",
)


@pytest.fixture()
def registry():
    """prometheus_client's default registry (the one the gate registers in, as SGLang's
    own metrics do), with the gate's collectors removed afterwards."""
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.REGISTRY
    yield registry
    for collector in list(registry._collector_to_names):
        if set(registry._collector_to_names[collector]) & {
            f"{name}{suffix}" for name in METRIC_NAMES for suffix in ("", "_total", "_created")
        }:
            registry.unregister(collector)


def test_metrics_count_steps_by_kind_and_switches(gate, monkeypatch, registry, root_handler):
    monkeypatch.setenv("SGLANG_SPEC_BATCH_GATE_RESUME_STEPS", "1")  # resume at once
    w = gated_worker(threshold=2)
    w.server_args.enable_metrics = True
    gate.init_batch_gate(w)
    g = gate.gate_for(w)
    assert g.metrics is not None

    def value(name, **labels):
        return registry.get_sample_value(name, labels) or 0.0

    assert value("sglang:spec_batch_gate_threshold") == 2.0
    assert value("sglang:spec_batch_gate_gated") == 0.0
    assert g.resume_below == 1
    for size in (1, 3, 4, 0):  # speculative, gated (switch), gated, speculative (switch)
        g.record(g.decide(size))
        if size == 3:
            assert value("sglang:spec_batch_gate_gated") == 1.0
    assert value("sglang:spec_batch_gate_steps_total", kind="gated") == 2.0
    assert value("sglang:spec_batch_gate_steps_total", kind="speculative") == 2.0
    assert value("sglang:spec_batch_gate_switches_total") == 2.0
    assert value("sglang:spec_batch_gate_gated") == 0.0


def test_metrics_already_registered_leave_the_gate_without_metrics(gate, registry):
    first = gate._GateMetrics.create(gate.BatchGate(4))
    assert first is not None
    # A second gate in the same process (names already taken): no metrics, no exception.
    assert gate._GateMetrics.create(gate.BatchGate(4)) is None
    assert registry.get_sample_value("sglang:spec_batch_gate_threshold") == 4.0


def _real_server_args(version):
    """A stand-in ServerArgs whose `_generate_cuda_graph_batch_sizes` is the release's own."""
    from conftest import release_function

    generate = release_function(
        version, "srt/server_args.py", "_generate_cuda_graph_batch_sizes", "ServerArgs"
    )
    args_class = type("ServerArgs", (types.SimpleNamespace,), {
        "_generate_cuda_graph_batch_sizes": generate})
    args = args_class(
        speculative_algorithm="EAGLE3", cuda_graph_max_bs=256, disable_cuda_graph_padding=False,
        torch_compile_max_bs=32, enable_torch_compile=False,
    )
    args.cuda_graph_bs = args._generate_cuda_graph_batch_sizes()
    return args


@pytest.mark.parametrize("version", ["0.5.9", "0.5.12.post1"])
def test_decode_graphs_use_the_batch_sizes_sglang_picks_without_speculation(gate, version):
    args = _real_server_args(version)
    spec_sizes = list(args.cuda_graph_bs)
    holder, attr, plain = gate._plain_batch_sizes(args)
    assert (holder, attr) == (args, "cuda_graph_bs")
    args.speculative_algorithm = None
    expected = args._generate_cuda_graph_batch_sizes()
    args.speculative_algorithm = "EAGLE3"
    assert plain == expected and plain != spec_sizes  # the two lists pad batches differently
    assert args.cuda_graph_bs == spec_sizes and args.speculative_algorithm == "EAGLE3"
    args.cuda_graph_bs = [1, 2, 3]  # the user's own list stays
    assert gate._plain_batch_sizes(args) is None


def test_init_captures_decode_graphs_at_the_plain_batch_sizes(gate, root_handler):
    args = _real_server_args("0.5.12.post1")
    spec_sizes = list(args.cuda_graph_bs)
    seen = {}

    class Recording(GraphRunner):
        def __init__(self, runner):
            super().__init__(runner)
            if self.mode == "DECODE":
                seen["sizes"] = list(runner.server_args.cuda_graph_bs)

    runner = ModelRunner(graphs=Recording)
    args.enable_return_hidden_states = False
    runner.server_args = args
    gate.init_batch_gate(gated_worker(runner=runner))
    assert seen["sizes"] == gate._plain_batch_sizes(args)[2] != spec_sizes
    assert runner.server_args.cuda_graph_bs == spec_sizes  # the server's own list is back


class StepMode(enum.Enum):
    EXTEND = 1
    DECODE = 2
    IDLE = 3

    def is_extend(self):
        return self is StepMode.EXTEND

    def is_decode(self):
        return self is StepMode.DECODE

    def is_idle(self):
        return self is StepMode.IDLE


def test_two_attention_dp_ranks_take_the_same_step_every_time(gate, monkeypatch):
    """Tensor/attention-DP ranks run their own scheduler on their own batch; their
    collectives deadlock unless every rank takes the same kind of step. Two ranks, local
    batch sizes that differ (one rank idle at times), sizes gathered by SGLang's MLP sync."""
    monkeypatch.setenv("SGLANG_SPEC_BATCH_GATE_RESUME_STEPS", "1")  # resume at once
    ranks = [gated_worker(threshold=8), gated_worker(threshold=8)]
    for w in ranks:
        w._eaglegate_plain_decode = gate.PlainDecode("decode backend", "decode graphs")
    local = [(2, 3), (10, 0), (3, 12), (9, 9), (1, 6), (0, 2), (1, 1), (12, 0)]
    kinds = []
    for sizes in local:
        step = []
        for rank, w in enumerate(ranks):
            n = sizes[rank]
            batch = types.SimpleNamespace(
                forward_mode=StepMode.DECODE if n else StepMode.IDLE,
                reqs=[types.SimpleNamespace(output_ids=[], grammar=None) for _ in range(n)],
                global_num_tokens=list(sizes),
                return_logprob=False,
                spec_info=types.SimpleNamespace(verified_id=[7] * n),
                spec_algorithm=Algorithm.EAGLE,
                seq_lens=[5] * n,
                prepare_for_decode=lambda: None,
            )
            step.append(gate.prepare_gated_decode(w, batch))
            if step[-1]:
                w.target_worker.model_runner.attn_backend = "verify backend"  # what finish restores
                batch._eaglegate_step = None
        assert step[0] == step[1], (sizes, step)
        kinds.append(step[0])
    # Gated from the first step above 8 on either rank until both are below 7 (8 - 8 // 8).
    assert kinds == [False, True, True, True, False, False, False, True]


# ---- start-up: the plain decode's positions kernel, compiled before the first gated step ---


@pytest.fixture()
def fake_sglang(monkeypatch):
    """`torch` and SGLang's forward_batch_info as the gate imports them inside SGLang: a
    recording `clamp_position` and a `torch.ones` that says what it was asked for."""
    calls = []
    torch = types.ModuleType("torch")
    torch.int64 = "int64"
    torch.ones = lambda *size, dtype, device: ("ones", size, dtype, device)
    info = types.ModuleType("sglang.srt.model_executor.forward_batch_info")
    info.clamp_position = calls.append
    parents = {name: types.ModuleType(name) for name in ("sglang", "sglang.srt", "sglang.srt.model_executor")}
    parents["sglang.srt.model_executor"].forward_batch_info = info
    for name, module in {**parents, "torch": torch, info.__name__: info}.items():
        monkeypatch.setitem(sys.modules, name, module)
    return types.SimpleNamespace(calls=calls, info=info)


def test_init_compiles_the_decode_positions_kernel(gate, root_handler, fake_sglang):
    runner = ModelRunner()
    runner.device = "cuda"
    gate.init_batch_gate(gated_worker(runner=runner))
    # Once, at start-up, on a batch of two int64 sequence lengths (seq_lens' dtype).
    assert fake_sglang.calls == [("ones", (2,), "int64", "cuda")]


def test_no_positions_compile_when_the_gate_is_off_or_has_no_plain_path(gate, root_handler, fake_sglang):
    gate.init_batch_gate(gated_worker(threshold=None, runner=ModelRunner()))
    gate.init_batch_gate(gated_worker(runner=ModelRunner(backend_error=RuntimeError("no backend"))))
    assert fake_sglang.calls == []


def test_a_failed_positions_compile_leaves_the_gate_on(gate, root_handler, fake_sglang, caplog):
    def broken(seq_lens):
        raise RuntimeError("nvcc not found")

    fake_sglang.info.clamp_position = broken
    runner = ModelRunner()
    runner.device = "cuda"
    w = gated_worker(runner=runner)
    with caplog.at_level(logging.ERROR):
        gate.init_batch_gate(w)
    assert gate.gate_for(w) is not None and w._eaglegate_plain_decode is not None
    assert "clamp_position not compiled" in caplog.text


def _assigned_names(node):
    return {t.id for stmt in ast.walk(node) if isinstance(stmt, ast.Assign) for t in stmt.targets if isinstance(t, ast.Name)}


@pytest.mark.parametrize("version", ["0.4.10.post2", "0.5.4", "0.5.9", "0.5.12.post1"])
def test_plain_decode_positions_come_from_clamp_position_and_speculation_skips_it(release_tree, version):
    """What `compile_decode_positions` relies on, read from each release: the module binds
    `clamp_position` to code that compiles on its first call (a torch.compile function, or
    a kernel from sglang.jit_kernel); `ForwardBatch.init_new` calls it for a decode batch
    only when no positions were set, and a speculative batch's own positions are set
    before that."""
    source = release_tree(version).root / "srt/model_executor/forward_batch_info.py"
    tree = ast.parse(source.read_text())
    module_level = [n for n in tree.body if not isinstance(n, ast.ClassDef)]
    compiled_def = any(
        isinstance(n, ast.FunctionDef) and n.name == "clamp_position"
        and any("torch.compile" in ast.unparse(d) for d in n.decorator_list)
        for n in module_level
    )
    jit_bound = any(
        isinstance(n, ast.If) and "clamp_position" in _assigned_names(n)
        and any(isinstance(i, ast.ImportFrom) and (i.module or "").startswith("sglang.jit_kernel")
                for i in ast.walk(n))
        for n in module_level
    )
    assert compiled_def or jit_bound
    forward_batch = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ForwardBatch")
    init_new = next(n for n in forward_batch.body if isinstance(n, ast.FunctionDef) and n.name == "init_new")
    spec_positions = clamp_call = None
    for node in ast.walk(init_new):
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "ret.positions":
            value = ast.unparse(node.value)
            if value == "ret.spec_info.positions":
                spec_positions = node
            elif value == "clamp_position(batch.seq_lens)":
                clamp_call = node
    assert spec_positions is not None and clamp_call is not None
    assert spec_positions.lineno < clamp_call.lineno
    guards = [
        n.test for n in ast.walk(init_new)
        if isinstance(n, ast.If) and any(c is clamp_call for c in ast.walk(n))
    ]
    assert any("is_decode()" in ast.unparse(t) for t in guards)
    assert any(ast.unparse(t) == "ret.positions is None" for t in guards)


def test_the_v1_decision_fails_open(gate, caplog):
    """An error while the v1 worker's step is decided: nothing is changed yet, so the step
    speculates, the gate is off for the worker's life, and one line and the decode log say why."""
    w = worker(2)
    g = gate.gate_for(w)

    def broken(size):
        raise RuntimeError("injected")

    g.decide = broken
    batch = types.SimpleNamespace(forward_mode=Mode("decode"), reqs=[object()] * 3, return_logprob=False)
    with caplog.at_level(logging.ERROR):
        assert gate.prepare_gated_decode(w, batch) is False
        assert gate.prepare_gated_decode(w, batch) is False  # off: no second line
    assert gate.gate_for(w) is None and not hasattr(batch, "_eaglegate_step")
    assert [r.getMessage() for r in caplog.records] == [
        "batch gate: off for the life of this server after RuntimeError in the decision: injected; "
        "the server runs as unpatched SGLang"]
    assert g.describe().startswith("gate(>2, <1): failed (RuntimeError in the decision: injected)")
    assert g.describe().endswith(", 1 failure")
