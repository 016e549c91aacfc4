"""bench/gpu/trace_digest.py on small traces written here (CPU): what a profile without Python
stacks reports, the GPU's busy share and the time from one graph launch to the next."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu"
sys.path.insert(0, str(BENCH))

import trace_digest  # noqa: E402


def event(cat, name, ts, dur, tid=1):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def write_trace(path, launches_us, kernels, extra=()):
    events = [
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaGraphLaunch",
            "ts": t,
            "dur": 5.0,
            "pid": 1,
            "tid": 1,
        }
        for t in launches_us
    ]
    events += [
        {"ph": "X", "cat": "kernel", "name": "k", "ts": a, "dur": b - a, "pid": 0, "tid": 7}
        for a, b in kernels
    ]
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events + list(extra)}, f)


def test_a_trace_without_stacks_gives_the_launch_interval_a_long_step_does_not_move(tmp_path):
    # Nine decode steps 3 ms apart and one 20 ms step (a prefill) among them.
    launches = [0, 3000, 6000, 9000, 29000, 32000, 35000, 38000, 41000, 44000]
    kernels = [(t, t + 2400) for t in launches]  # busy 2.4 ms of each launch's step
    path = tmp_path / "x.trace.json.gz"
    write_trace(path, launches, kernels)
    text = trace_digest.digest(str(path))
    assert "no Python stacks" in text and "10 graph launches" in text
    assert "graph launch to launch: median 3.000 ms (p25 3.000, p75 3.000, 9 intervals)" in text
    busy = 100 * 10 * 2400 / (44000 + 2400)
    assert f"GPU busy {busy:.0f} % of 46.4 ms" in text


def test_one_launch_gives_no_interval(tmp_path):
    path = tmp_path / "one.trace.json.gz"
    write_trace(path, [0], [(0, 1000)])
    text = trace_digest.digest(str(path))
    assert "1 graph launches" in text and "launch to launch" not in text


def py(name, ts, dur):
    return {
        "ph": "X",
        "cat": "python_function",
        "name": name,
        "ts": ts,
        "dur": dur,
        "pid": 1,
        "tid": 1,
    }


def test_the_gates_module_counts_once_however_its_calls_nest(tmp_path):
    gate = "sglang/srt/speculative/batch_gate.py(10): "
    events = []
    for step in range(3):  # run_batch 10 ms apart; each step calls the gate twice, once nested
        t = step * 10_000
        events += [
            py("sglang/srt/managers/scheduler.py(1): run_batch", t, 9_000),
            py(gate + "decide", t + 100, 50),
            py(gate + "run_gated_decode", t + 1_000, 4_000),
            py(gate + "_target_forward", t + 1_100, 3_000),  # inside run_gated_decode
            py("sglang/srt/model_executor/model_runner.py(5): forward", t + 1_200, 2_000),
        ]
    events.append(py("sglang/srt/managers/scheduler.py(1): run_batch", 30_000, 9_000))
    path = tmp_path / "g.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    text = trace_digest.digest(str(path))
    assert "steps 3," in text
    # 50 + 4000 us a step (the nested _target_forward and the forward within it count once)
    assert "## the gate's module per step (ms): 4.050 " in text


def test_an_unpatched_server_has_no_gate_line(tmp_path):
    events = [py("sglang/srt/managers/scheduler.py(1): run_batch", t, 900) for t in (0, 1000, 2000)]
    path = tmp_path / "p.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    text = trace_digest.digest(str(path))
    assert "steps 2," in text and "gate's module" not in text


def test_the_digest_looks_for_the_module_the_patch_writes():
    from eaglegate.patches.behaviour import GATE_PATH

    assert ("/" + GATE_PATH + "(").endswith(trace_digest.GATE_FILE)


def test_a_trace_without_stacks_says_how_long_the_cpu_waited_on_the_gpu(tmp_path):
    # Four launches 3 ms apart; the CPU blocked 1.2 ms after each of the first three (a
    # GPU-bound step), a free that does not block, and a synchronize outside the GPU's window
    # that does not count.
    launches = [0, 3000, 6000, 9000]
    waits = [("cudaEventSynchronize", t + 1500, 1200.0) for t in launches[:2]]
    waits.append(("cudaFree", 7500, 1200.0))  # blocks until the device is idle
    waits.append(("cudaFreeAsync", 7600, 500.0))  # does not
    waits.append(("cudaStreamSynchronize", 50_000, 9000.0))
    path = tmp_path / "w.trace.json.gz"
    write_trace(
        path,
        launches,
        [(t, t + 2800) for t in launches],
        [event("cuda_runtime", n, ts, d) for n, ts, d in waits],
    )
    text = trace_digest.digest(str(path))
    assert (
        "CPU blocked on the GPU: 0.900 ms per graph launch (3 blocking calls, "
        "cudaEventSynchronize 0.600, cudaFree 0.300)"
    ) in text


def test_a_cpu_bound_trace_shows_no_wait(tmp_path):
    path = tmp_path / "c.trace.json.gz"
    write_trace(path, [0, 4000, 8000], [(t, t + 2000) for t in (0, 4000, 8000)])
    text = trace_digest.digest(str(path))
    assert "CPU blocked on the GPU: 0.000 ms per graph launch (0 blocking calls)" in text


def test_a_trace_without_stacks_lists_the_kernels_that_take_the_most_per_launch(tmp_path):
    kernels = [("attn_stage1", 0, 900), ("gemm", 900, 1500), ("attn_stage1", 3000, 1100)]
    path = tmp_path / "k.trace.json.gz"
    write_trace(path, [0, 3000], [], [event("kernel", n, ts, d, tid=7) for n, ts, d in kernels])
    text = trace_digest.digest(str(path))
    # per launch: attention (900 + 1100) / 2, the GEMM 1500 / 2; the larger first
    assert text.index("   1.000  attn_stage1") < text.index("   0.750  gemm")


def host_events(launches, per_step):
    """Per step after each launch: (category, name, offset us, duration us) events on the
    scheduler's thread."""
    return [event(cat, name, t + off, dur) for t in launches for cat, name, off, dur in per_step]


def test_a_trace_without_stacks_counts_the_hosts_work_per_launch(tmp_path):
    # Three steps 3 ms apart. Each: an aten::to that calls aten::_to_copy (one op called from
    # Python, its caller's time only), an aten::ones, and two runtime calls. The fourth
    # launch closes the last whole step; what follows it does not count.
    launches = [0, 3000, 6000, 9000]
    step = [("cpu_op", "aten::to", 100, 40.0), ("cpu_op", "aten::_to_copy", 110, 20.0),
            ("cpu_op", "aten::ones", 300, 25.0), ("cuda_runtime", "cudaLaunchKernel", 320, 4.0),
            ("cuda_runtime", "cudaEventQuery", 900, 2.0)]
    path = tmp_path / "h.trace.json.gz"
    write_trace(path, launches, [(t, t + 2000) for t in launches], host_events(launches, step))
    text = trace_digest.digest(str(path))
    # per launch: two outer torch ops (40 + 25 us), and the graph launch's own 5 us counts
    # with the runtime calls (5 + 4 + 2 us, three calls)
    assert "host per graph launch: 2.0 torch ops (0.065 ms), 3.0 CUDA runtime calls (0.011 ms)" in text


def test_compare_lists_the_ops_one_trace_runs_more_often_first(tmp_path):
    launches = [0, 3000, 6000]
    common = [("cpu_op", "aten::multinomial", 100, 400.0)]
    a, b = tmp_path / "a.trace.json.gz", tmp_path / "b.trace.json.gz"
    write_trace(a, launches, [], host_events(launches, common))
    write_trace(b, [0, 3500, 7000], [], host_events([0, 3500, 7000], [
        *common, ("cpu_op", "aten::ones", 500, 25.0), ("cpu_op", "aten::index", 600, 45.0),
        ("cpu_op", "aten::index", 700, 45.0)]))
    text = trace_digest.compare(str(a), str(b))
    lines = text.splitlines()
    assert "launch to launch 3.000 ms" in lines[0] and "launch to launch 3.500 ms" in lines[1]
    rows = [line.split() for line in lines[3:]]
    # aten::index twice per step in B, never in A; then aten::ones; multinomial alike
    assert [r[-1] for r in rows] == ["aten::index", "aten::ones", "aten::multinomial",
                                     "cudaGraphLaunch"]
    assert rows[0][:4] == ["0.00", "2.00", "0.0", "90.0"]


def test_compare_refuses_a_trace_without_a_whole_step(tmp_path):
    one = tmp_path / "one.trace.json.gz"
    write_trace(one, [0], [(0, 1000)])
    with pytest.raises(ValueError, match="fewer than two graph launches"):
        trace_digest.compare(str(one), str(one))


def test_command_line_refuses_a_trace_without_a_whole_step_in_one_line(tmp_path, capsys):
    one = tmp_path / "one.trace.json.gz"
    write_trace(one, [0], [(0, 1000)])
    with pytest.raises(SystemExit) as exit_info:
        trace_digest.main(["--compare", str(one), str(one)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and err.count("\n") == 1
    assert err.startswith("trace_digest.py: error: ") and "fewer than two graph launches" in err


def test_command_line_names_a_bad_trace_in_one_line(tmp_path, capsys):
    missing, not_a_trace = tmp_path / "missing.json.gz", tmp_path / "other.json"
    not_a_trace.write_text("{}")
    for path, words in ((missing, "No such file"), (not_a_trace, "not a torch profiler trace")):
        with pytest.raises(SystemExit) as exit_info:
            trace_digest.main([str(path)])
        assert exit_info.value.code == 1
        err = capsys.readouterr().err
        assert err.startswith("trace_digest.py: error: ") and words in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_info:
        trace_digest.main(["--compare", str(missing)])
    assert exit_info.value.code == 2 and "--compare takes two traces" in capsys.readouterr().err


def test_command_line_prints_each_trace_with_its_top(tmp_path, capsys):
    path = tmp_path / "p.trace.json.gz"
    write_trace(path, [0, 3000, 6000], [(0, 2000), (3000, 5000)])
    trace_digest.main(["--top", "3", str(path)])
    assert capsys.readouterr().out == trace_digest.digest(str(path), top=3) + "\n"
