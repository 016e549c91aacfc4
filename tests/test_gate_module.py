"""The gate module added to SGLang, imported straight from its file (no torch, no SGLang)."""

from __future__ import annotations

import ast
import importlib.util
import sys
import types
from pathlib import Path

import pytest

GATE_FILE = Path(__file__).resolve().parents[1] / "patches" / "gate_module.py"


@pytest.fixture()
def gate(monkeypatch):
    monkeypatch.delenv("SGLANG_SPEC_BATCH_GATE_THRESHOLD", raising=False)
    monkeypatch.delenv("SGLANG_SPEC_BATCH_GATE_RESUME", raising=False)
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
    """At module level; SGLang's own prometheus_client only inside the metrics hook."""
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
    assert lazy - set(sys.stdlib_module_names) == {"prometheus_client"}, lazy


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
    g = gate.BatchGate(8)
    assert g.resume_below == 7
    sizes = [4, 8, 9, 8, 7, 6, 8, 9, 20, 1]
    decisions = [g.decide(n) for n in sizes]
    # Off above 8; stays off at 8 and 7 (not below the lower mark); back on at 6.
    assert decisions == [False, False, True, True, True, False, False, True, True, False]
    assert g.switches == 4


def test_resume_mark_from_env(gate):
    g = gate.BatchGate.from_settings(10, environ={gate.ENV_RESUME: "4"})
    assert (g.threshold, g.resume_below) == (10, 4)
    assert [g.decide(n) for n in (11, 5, 4, 3)] == [True, True, True, False]
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
    ranks = [gate.BatchGate(8), gate.BatchGate(8)]
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


def test_idle_dp_rank_joins_a_gated_step(gate):
    w = worker(4)
    idle = types.SimpleNamespace(
        forward_mode=Mode("idle"), reqs=[], global_num_tokens=[0, 9], return_logprob=False
    )
    # Another rank is above the threshold: the idle rank takes the extend branch too,
    # without bookkeeping and without counting a step.
    assert gate.prepare_gated_decode(w, idle) is True
    g = gate.gate_for(w)
    assert (g.gated_steps, g.speculative_steps) == (0, 0)
    gate.finish_gated_decode(w, idle, next_token_ids=None)
    assert idle.forward_mode.name == "idle"  # still idle, nothing to book
