"""Gather the raw GPU runs (bench/gpu/raw/<run>/rows_<run>.json) into bench/gpu/results.json
and print the README's table. Paths of the GPU machine are replaced by placeholders first.

    python bench/gpu/collect.py            # rewrites results.json, prints the table
"""

import json
import re
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
RAW = HERE / "raw"
LEVELS = [1, 8, 32, 64, 128, 256]
# The table comes from one device call that ran all four servers at every C, three repeats.
TABLE_RUN = "E"
# The control: EAGLE and gated from the same tree path (C=1 and 32), and the equivalence sets.
CONTROL_RUN = "F"
# Kept raw only, each for what it measured wrong or with older code.
SUPERSEDED = {
    "smoke": "an earlier state of the patch; it found two bugs, fixed since",
    "A": "C=128 and 256 ran at 100 requests (aiohttp's connection cap), before the start-up compile",
    "B": "C=128 and 256 ran at 100 requests (aiohttp's connection cap), before the start-up compile",
    "C": "equivalence with DECODE graphs at the speculative batch sizes (fixed since)",
    "D": "C=128 and 256 ran at 100 requests; its probe found the first gated step's 7.5 s compile",
}
# Absolute paths of the machine that ran the servers, whatever its folders: the kit's stage
# (setup.sh's $STAGE, a folder named eg-stage) and any site-packages.
MACHINE_PATHS = [
    (re.compile(r"(?:/[\w.-]+)*/eg-stage\b"), "$STAGE"),
    (re.compile(r"(?:/[\w.-]+)*/site-packages\b"), "<site-packages>"),
]


def scrub_raw() -> None:
    for path in RAW.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            new = text
            for pattern, placeholder in MACHINE_PATHS:
                new = pattern.sub(placeholder, new)
            if new != text:
                path.write_text(new)


def load() -> dict:
    return {run: json.loads((RAW / run / f"rows_{run}.json").read_text()) for run in (TABLE_RUN, CONTROL_RUN)}


def collect() -> dict:
    runs = load()
    table, control = runs[TABLE_RUN], runs[CONTROL_RUN]
    rows = []
    for run, data in runs.items():
        for row in data["rows"]:
            threshold = data.get("threshold") if row["server"] == "gated" else None
            rows.append({**row, "run": run, "threshold": threshold})
    servers = {f"{s['server']}:{s['pair']} (run {run})": {k: s.get(k) for k in
               ("args", "env", "startup_s", "warm_s", "max_running_requests", "tracebacks")}
               for run, data in runs.items() for s in data["servers"]}
    return {"sglang": table["sglang"], "gpu": "1x NVIDIA H200",
            "model_shapes": {pair: shape for data in runs.values()
                             for pair, shape in ((data.get("weights") or {}).get("shapes") or {}).items()},
            "table_run": TABLE_RUN, "control_run": CONTROL_RUN, "superseded_runs": SUPERSEDED,
            "calibrate": table.get("calibrate"), "servers": servers, "rows": rows,
            "equivalence": control.get("equivalence")}


# The overlap worker's gate (0.5.12.post1, default launch): runs of the same servers
# (plain-default / eagle-v2 / gated-v2, threshold from calibrate on each run's own rows), and
# the equivalence run on the context pair. Each run's gated-v2 is the patch of its day.
OVERLAP_RUNS = ("G2", "G3", "G4", "G5", "G6")
OVERLAP_TABLE_RUN = "G4"  # the accept pair; G6 is the real pair
# The greedy-output sets: with SGLang's default kernels, and with batch-invariant ones.
OVERLAP_EQUIVALENCE_RUNS = {"G1": "default kernels", "D1": "--enable-deterministic-inference"}
OVERLAP_SERVERS = ("plain-default", "eagle-v2", "gated-v2")
OVERLAP_NOTES = {
    "G2": "accept pair; gated-v2 before the gated prefill: prefills ran EAGLE's own (draft "
          "prefill, eager target prefill with full hidden states)",
    "G3": "accept pair; gated decode and gated prefill; speculation resumed at the first step "
          "below the lower mark; two waves of requests per level",
    "G4": "accept pair; the gate as committed: speculation resumes after 8 steps in a row below "
          "the lower mark; an untimed pass per level; three waves of requests per level",
    "G5": "real pair (temperature 1); cut short by the call's deadline after gated-v2's first "
          "repeat at C=128 (the machine started cold: 136 s to the first healthy server); "
          "sampled verify renormalised with a torch sort, not flashinfer's kernel, and the "
          "harness's top-k shortcut read k on the CPU: a sync inside every sampled verify",
    "G6": "real pair (temperature 1), every level; the sampling shim without the sync (two "
          "torch sorts per sampled verify, no CPU read)",
}


def collect_overlap() -> dict:
    runs = {run: json.loads((RAW / run / f"rows_{run}.json").read_text())
            for run in (*OVERLAP_RUNS, *OVERLAP_EQUIVALENCE_RUNS)}
    rows = [{**row, "run": run, "sglang": data["sglang"], "pair": row.get("pair", "accept"),
             "threshold": data.get("threshold") if row["server"] == "gated-v2" else None}
            for run in OVERLAP_RUNS for data in [runs[run]] for row in data["rows"]]
    medians = {run: {s: [median(rows, s, c, run) for c in LEVELS] for s in OVERLAP_SERVERS}
               for run in OVERLAP_RUNS}
    return {
        "sglang": runs[OVERLAP_TABLE_RUN]["sglang"], "table_run": OVERLAP_TABLE_RUN,
        "notes": OVERLAP_NOTES,
        "thresholds": {run: runs[run].get("threshold") for run in OVERLAP_RUNS},
        "calibrate": {run: runs[run].get("calibrate") for run in OVERLAP_RUNS},
        "medians": medians,
        "rows": rows,
        "equivalence": {run: {"kernels": kernels, "threshold": 16,
                              "report": runs[run].get("equivalence")}
                        for run, kernels in OVERLAP_EQUIVALENCE_RUNS.items()},
    }


def overlap_table(result: dict) -> str:
    ov = result["overlap_worker"]
    lines = ["| output tok/s, median of 3, SGLang " + ov["sglang"] + " | run (pair) | "
             + " | ".join(f"C={c}" for c in LEVELS) + " |", "|---" * (len(LEVELS) + 2) + "|"]
    for server in OVERLAP_SERVERS:
        for run in OVERLAP_RUNS:
            label = server + (f", threshold {ov['thresholds'][run]}" if server == "gated-v2" else "")
            lines.append(f"| {label} | {run} ({pair_of(ov, run)}) | "
                         + " | ".join(f"{v:.0f}" if v else "-" for v in ov["medians"][run][server]) + " |")
    for run in OVERLAP_RUNS:
        m = ov["medians"][run]
        best = [max(p, e) for p, e in zip(m["plain-default"], m["eagle-v2"], strict=True)]
        lines.append(ratio_line(f"gated-v2 / max(plain-default, eagle-v2) | {run} ({pair_of(ov, run)})",
                                m["gated-v2"], best))
    return "\n".join(lines)


def pair_of(ov: dict, run: str) -> str:
    return next(r["pair"] for r in ov["rows"] if r["run"] == run)


def median(rows, server, c, run=TABLE_RUN):
    vals = [r["tok_s"] for r in rows if r["server"] == server and r["C"] == c
            and r["run"] == run and not r["errors"]]
    return statistics.median(vals) if vals else None


def ratio_line(label, num, den):
    cells = ["-" if a is None or not b else f"{a / b:.0%}" for a, b in zip(num, den, strict=True)]
    return f"| {label} | " + " | ".join(cells) + " |"


def table(result: dict) -> str:
    rows = result["rows"]
    t = result["calibrate"]["threshold"]
    med = {s: [median(rows, s, c) for c in LEVELS] for s in ("plain-default", "plain", "eagle", "gated")}
    best = [max(p, e) for p, e in zip(med["plain"], med["eagle"], strict=True)]
    lines = ["| output tok/s, median of 3 (run " + TABLE_RUN + ") | " + " | ".join(f"C={c}" for c in LEVELS) + " |",
             "|---" * (len(LEVELS) + 1) + "|"]
    for label, server in [("plain-default (SGLang's defaults, overlap on)", "plain-default"),
                          ("plain (overlap off: the v1 worker's scheduler)", "plain"),
                          ("EAGLE-3 v1, unpatched, the gated server's running cap", "eagle"),
                          (f"gated, threshold {t} (calibrate's), plan's flags", "gated")]:
        lines.append(f"| {label} | " + " | ".join(f"{v:.0f}" for v in med[server]) + " |")
    lines.append(ratio_line("gated / max(plain, EAGLE)", med["gated"], best))
    lines.append(ratio_line("gated / plain-default", med["gated"], med["plain-default"]))
    lines.append(ratio_line("plain / plain-default (what overlap is worth)", med["plain"], med["plain-default"]))
    control = [r for r in rows if r["run"] == CONTROL_RUN]
    levels = sorted({r["C"] for r in control})
    lines += ["", f"| control (run {CONTROL_RUN}): one tree path, each repeat | "
              + " | ".join(f"C={c}" for c in levels) + " |", "|---" * (len(levels) + 1) + "|"]
    for server in ("eagle", "gated"):
        cells = [" / ".join(f"{r['tok_s']:.0f}" for r in control if r["server"] == server and r["C"] == c)
                 for c in levels]
        lines.append(f"| {server} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    scrub_raw()
    result = collect()
    result["overlap_worker"] = collect_overlap()
    (HERE / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    print()
    print(overlap_table(result))


if __name__ == "__main__":
    main()
