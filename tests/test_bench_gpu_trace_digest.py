"""bench/gpu/trace_digest.py on small traces written here (CPU): what a profile without Python
stacks reports, the GPU's busy share and the time from one graph launch to the next."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu"
sys.path.insert(0, str(BENCH))

import trace_digest  # noqa: E402


def write_trace(path, launches_us, kernels):
    events = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t, "dur": 5.0,
               "pid": 1, "tid": 1} for t in launches_us]
    events += [{"ph": "X", "cat": "kernel", "name": "k", "ts": a, "dur": b - a, "pid": 0, "tid": 7}
               for a, b in kernels]
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)


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
