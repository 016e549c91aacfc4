#!/usr/bin/env python
"""What the overlap worker's gate adds to a decode step where it speculates (below its
threshold), on the CPU, against the step time the GPU runs measured.

Below the threshold a gated-v2 server runs EAGLE v2's own path; the patch adds, per decode
step, the gate's decision in the decode preparation (`decode_alloc_len`: the batch's
eligibility, the hysteresis, the step counters) and the test at the worker's entry
(`is_gated_decode`). This times exactly those functions of the installed eaglegate with a
gate on, per step, over batches of 1 and 8 requests (a fresh draft input per step, as SGLang
makes one per step), in one process. No SGLang, no GPU.

    python bench/gate_overhead.py            # prints the table, writes bench/gate_overhead.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import timeit
from pathlib import Path
from types import SimpleNamespace

from eaglegate.patches import gate_module
from eaglegate.patches.gate_module import BatchGate, decode_alloc_len, is_gated_decode

BENCH = Path(__file__).resolve().parent
GPU_ROWS = BENCH / "gpu" / "raw"
# The runs whose eagle-v2 rows give the speculative step time at C=1 and 8 (real pair).
STEP_TIME_RUNS = ("G6", "G7", "G9", "G10")


def one_step(size: int, alloc_len: int = 4) -> None:
    """One decode step's gate work while speculating: the reservation's decision on a new
    draft input, then the worker's test of the batch that carries it."""
    reqs = [None] * size
    draft_input = SimpleNamespace()
    batch = SimpleNamespace(reqs=reqs, return_logprob=False, return_hidden_states=False,
                            has_grammar=False, spec_info=draft_input)
    decode_alloc_len(draft_input, batch, alloc_len)
    if is_gated_decode(batch):
        raise SystemExit("the gate gated a step below its threshold")


def bare_step(size: int) -> None:
    """The same objects made without the gate's calls: what the harness itself costs."""
    reqs = [None] * size
    draft_input = SimpleNamespace()
    SimpleNamespace(reqs=reqs, return_logprob=False, return_hidden_states=False,
                    has_grammar=False, spec_info=draft_input)


def per_step_us(fn, size: int, number: int, repeats: int) -> float:
    times = timeit.repeat(lambda: fn(size), number=number, repeat=repeats)
    return statistics.median(times) / number * 1e6


def step_ms_on_gpu() -> dict[str, dict[str, float]]:
    """eagle-v2's decode step time at C=1 and 8 on the real pair, per run: C / tok/s x the
    accept length (tokens per request per step), from the rows the GPU runs kept."""
    out: dict[str, dict[str, float]] = {}
    for run in STEP_TIME_RUNS:
        path = GPU_ROWS / run / f"rows_{run}.json.gz"
        if not path.exists():
            continue
        rows = json.loads(gzip.decompress(path.read_bytes()))["rows"]
        for c in (1, 8):
            mine = [r for r in rows if r["server"] == "eagle-v2" and r["C"] == c and not r["errors"]]
            if mine:
                tok_s = statistics.median(r["tok_s"] for r in mine)
                accept = statistics.median(r["mean_accept_len"] for r in mine)
                out.setdefault(run, {})[f"C={c}"] = round(c * accept / tok_s * 1e3, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--number", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    gate_module._overlap_gate = BatchGate(threshold=16)  # on, as init_overlap_batch_gate leaves it
    result: dict = {"threshold": 16, "number": a.number, "repeats": a.repeats, "per_step_us": {}}
    for size in (1, 8):
        gated = per_step_us(one_step, size, a.number, a.repeats)
        bare = per_step_us(bare_step, size, a.number, a.repeats)
        result["per_step_us"][f"C={size}"] = {"with_gate": round(gated, 2), "objects_only": round(bare, 2),
                                              "gate": round(gated - bare, 2)}
    result["eagle_v2_step_ms"] = step_ms_on_gpu()
    (BENCH / "gate_overhead.json").write_text(json.dumps(result, indent=1) + "\n")
    print("| batch | gate work per step (µs) | eagle-v2 step on the H200, real pair (ms, per run) | share |")
    print("|---|---|---|---|")
    for key, us in result["per_step_us"].items():
        steps = [runs[key] for runs in result["eagle_v2_step_ms"].values() if key in runs]
        share = f"{us['gate'] / (min(steps) * 1e3):.2%} at most" if steps else "-"
        print(f"| {key} | {us['gate']:.1f} | {', '.join(f'{s:.2f}' for s in steps) or '-'} | {share} |")


if __name__ == "__main__":
    main()
