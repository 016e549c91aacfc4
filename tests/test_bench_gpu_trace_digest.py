"""bench/gpu/trace_digest.py on small traces written here (CPU): what a profile without Python
stacks reports, the GPU's busy share and the time from one graph launch to the next. Then what
bench/gpu/README.md reads from D16k's committed profile, and from the releases' own sources about
where the off state's extra work could go."""

from __future__ import annotations

import ast
import gzip
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu"
sys.path.insert(0, str(BENCH))

import trace_digest  # noqa: E402

from conftest import release_def  # noqa: E402


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


def stacked_trace(path, steps, calls):
    """A trace with Python stacks: `steps` run_batch calls 1 ms apart on the scheduler thread,
    and in each, per (caller, op, nested op or None), a Python function that calls the op."""
    events = []
    for i in range(steps):
        t = i * 1000.0
        events.append(event("python_function", "sglang/srt/managers/scheduler.py(10): run_batch", t, 900.0))
        for j, (caller, op, inner) in enumerate(calls):
            at = t + 10 + 50 * j
            events.append(event("python_function", caller, at, 40.0))
            events.append(event("python_function", "<built-in method to of Tensor object at 0x1>", at + 1, 30.0))
            events.append(event("cpu_op", op, at + 2, 20.0))
            if inner:
                events.append(event("cpu_op", inner, at + 3, 10.0))
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)


def test_callers_name_the_function_outside_torch_and_count_an_op_its_op_calls_once(tmp_path):
    a, b = tmp_path / "a.trace.json.gz", tmp_path / "b.trace.json.gz"
    prepare = "sglang/srt/managers/schedule_batch.py(20): prepare_for_decode"
    gate = "sglang/srt/speculative/batch_gate.py(30): _cast"
    stacked_trace(a, 4, [(prepare, "aten::add", None)])
    stacked_trace(b, 4, [(prepare, "aten::add", None), (gate, "aten::to", "aten::_to_copy"),
                         (gate, "aten::to", "aten::_to_copy")])
    callers = trace_digest.op_callers(str(b))
    # three whole steps (the last run_batch opens the window's end); the nested copy is the op's
    assert callers == {("schedule_batch.py:prepare_for_decode", "aten::add"): (1.0, 20.0),
                       ("batch_gate.py:_cast", "aten::to"): (2.0, 40.0)}
    rows = trace_digest.compare_callers(str(a), str(b)).splitlines()
    assert rows[1].split()[:2] == ["1.00", "3.00"]  # every op, A against B
    assert [r.split()[-2:] for r in rows[2:]] == [["batch_gate.py:_cast", "aten::to"]]  # only what differs


def test_callers_refuse_a_trace_without_stacks(tmp_path):
    flat = tmp_path / "flat.trace.json.gz"
    write_trace(flat, [0, 3000], [(0, 1000)])
    with pytest.raises(ValueError, match="no Python stacks"):
        trace_digest.op_callers(str(flat))


def test_the_committed_profile_of_the_off_state_shows_where_a_plain_step_of_the_gated_server_does_more():
    """D16k (the narrow pair at C=32, each server alone): the ops per step that bench/gpu/README.md
    counts, from the committed traces with stacks."""
    raw = BENCH / "raw" / "D16k"
    plain = trace_digest.op_callers(str(raw / "trace_plain-default-narrow-C32-stack.json.gz"))
    gated = trace_digest.op_callers(str(raw / "trace_gated-depth-narrow-C32-stack.json.gz"))

    def count(side, caller=None, op=None):
        return round(sum(n for (c, o), (n, _) in side.items()
                         if (caller is None or c == caller) and (op is None or o == op)), 2)

    assert (count(plain), count(gated)) == (50.0, 62.0)
    assert count(gated, "eagle_utils.py:eagle_prepare_for_decode") == 10.0
    assert count(gated, "eagle_utils.py:eagle_prepare_for_decode", "aten::to") == 4.0
    assert count(gated, "batch_gate.py:_cast", "aten::to") == 2.0
    assert count(gated, "utils.py:_async_d2h", "aten::copy_") == 2.0 and count(plain, "utils.py:_async_d2h", "aten::copy_") == 1.0
    own = {c for c, _ in gated if c.startswith("batch_gate.py:")}
    assert sum(count(gated, c) for c in own) == 9.0
    # the plain path's ops for the same work: the slot, the lengths, the FutureMap
    plain_own = ("schedule_batch.py:prepare_for_decode", "allocation.py:alloc_for_decode", "memory_pool.py:write",
                 "overlap_utils.py:resolve_forward_inputs", "overlap_utils.py:stash")
    assert sum(count(plain, c) for c in plain_own) == 9.0
    speculative = {("eagle_utils.py:eagle_prepare_for_decode", None): 10.0,
                   ("allocation.py:alloc_for_spec_decode", None): 2.0,
                   ("overlap_utils.py:resolve_seq_lens_cpu", None): 1.0,
                   ("batch_result_processor.py:_resolve_spec_v2_tokens", None): 4.0}
    for (caller, op), n in speculative.items():
        assert count(gated, caller, op) == n and count(plain, caller, op) == 0, caller
    d2h = count(gated, "utils.py:_async_d2h") - count(plain, "utils.py:_async_d2h")
    assert sum(speculative.values()) + d2h == 20.0
    # what plain-default runs more often than a gated step, beyond the nine above
    fewer = sum(max(0.0, n - gated.get(key, (0.0, 0.0))[0]) for key, (n, _) in plain.items() if key[0] not in plain_own)
    assert round(fewer, 2) == 8.0
    readme = " ".join((BENCH / "README.md").read_text().split())
    for claim in ("62 torch ops a step against plain-default's 50", "The gate's module runs nine",
                  "Plain decoding runs nine for the same work", "Twenty more are SGLang's speculative scheduling path",
                  "ten in `eagle_prepare_for_decode`", "Plain-default runs eight a gated step does not"):
        assert claim in readme, claim


def _statements(func):
    return [ast.unparse(n) for n in ast.walk(func) if isinstance(n, ast.stmt)]


# Where each release keeps what the README's plan for a depth-0 plain preparation reads
# (path, name, class): the plain preparation, the step that adds to a request's allocation,
# and the finish that asserts a plain server allocated no more than it committed.
_PLAIN_PREPARATION = {
    "0.5.12.post1": {"adds": ("srt/managers/schedule_batch.py", "prepare_for_decode", "ScheduleBatch"),
                     "finish": ("srt/mem_cache/common.py", "release_kv_cache", None)},
    "0.5.16": {"adds": ("srt/mem_cache/allocation.py", "alloc_for_decode", None),
               "finish": ("srt/mem_cache/common.py", "_release_overallocated_kv_indices", None)},
}


@pytest.mark.parametrize("version", sorted(_PLAIN_PREPARATION))
def test_the_readmes_reading_of_the_plain_preparation_holds_on_the_releases_sources(version):
    """bench/gpu/README.md's D16k item: SGLang's plain preparation takes its slot through
    `alloc_for_decode` and adds to `kv_allocated_len`, and a server without speculation asserts
    on finish that a request allocated exactly what it committed."""
    prepare = release_def(version, "srt/managers/schedule_batch.py", "prepare_for_decode", "ScheduleBatch")
    calls = {ast.unparse(n.func) for n in ast.walk(prepare) if isinstance(n, ast.Call)}
    assert "alloc_for_decode" in calls
    adds = release_def(version, *_PLAIN_PREPARATION[version]["adds"])
    assert any(isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add)
               and ast.unparse(n.target).endswith("kv_allocated_len") for n in ast.walk(adds))
    finish = release_def(version, *_PLAIN_PREPARATION[version]["finish"])
    guarded = [n for n in ast.walk(finish) if isinstance(n, ast.If) and "spec_algo is None" in ast.unparse(n.test)]
    assert any(isinstance(s, ast.Assert) and ast.unparse(s.test) == "start_p == end_p" for n in guarded for s in n.body)
    readme = " ".join((BENCH / "README.md").read_text().split())
    assert "(`alloc_for_decode` from `ScheduleBatch.prepare_for_decode`)" in readme
    assert "`kv_allocated_len`" in readme and "`_release_overallocated_kv_indices`" in readme
    assert "0.5.12.post1: `release_kv_cache`" in readme


def test_the_readmes_reading_of_how_the_overlap_scheduler_hands_a_step_its_lengths_holds_on_both_releases():
    """bench/gpu/README.md's plan: the next step's `seq_lens` is the step in flight's new lengths
    on the GPU (0.5.12.post1: the result's draft input; 0.5.16: the FutureMap's buffer, copied to
    the host only where the attention backend asks, after waiting on the forward's publish)."""
    old = _statements(release_def("0.5.12.post1", "srt/managers/scheduler.py", "run_batch", "Scheduler"))
    assert "batch.seq_lens = batch_result.next_draft_input.new_seq_lens" in old

    resolve = release_def("0.5.16", "srt/managers/overlap_utils.py", "resolve_seq_lens_cpu", "FutureMap")
    top = [ast.unparse(s) for s in resolve.body]
    gather = top.index("batch.seq_lens = self.new_seq_lens_buf[fi]")
    host_only = next(i for i, s in enumerate(top) if s.startswith("if not self.needs_cpu_seq_lens:"))
    copy = next(i for i, s in enumerate(top) if "self.new_seq_lens_cpu_pinned.copy_(" in s)
    assert gather < host_only < copy
    assert top[host_only].rstrip().endswith("return")  # no host copy where the backend asks none
    wait = next((i for i, s in enumerate(top) if "self.publish_ready.wait()" in s), None)
    assert wait is not None and wait < gather  # the host waits on the forward's publish first
    readme = " ".join((BENCH / "README.md").read_text().split())
    for claim in ("the result's `next_draft_input.new_seq_lens`", "`FutureMap.resolve_seq_lens_cpu` gathers them",
                  "copies them to the host only where the attention backend asks"):
        assert claim in readme, claim
