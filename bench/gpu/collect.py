"""Gather the raw GPU runs (bench/gpu/raw/<run>/rows_<run>.json.gz) into bench/gpu/results.json
and print the README's tables. Paths of the GPU machine are replaced by placeholders first, and
a run's rows_<run>.json, as run.py writes it, is gzipped in place (the checkout travels to the
GPU machine beside a 52 MB SGLang pack, under a 64 MiB limit).

    python bench/gpu/collect.py            # rewrites results.json, prints the tables
"""

import gzip
import itertools
import json
import re
import statistics
from collections import Counter
from pathlib import Path

import catchup  # bench/gpu/catchup.py, beside this file

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
        if not path.is_file():
            continue
        zipped = path.suffix == ".gz"
        text = (gzip.decompress(path.read_bytes()) if zipped else path.read_bytes()).decode(errors="replace")
        new = text
        for pattern, placeholder in MACHINE_PATHS:
            new = pattern.sub(placeholder, new)
        if path.name.startswith("rows_") and path.suffix == ".json":
            # mtime=0: the same rows give the same bytes, so git sees no change on a rerun
            path.with_name(path.name + ".gz").write_bytes(gzip.compress(new.encode(), mtime=0))
            path.unlink()
        elif new != text:
            path.write_bytes(gzip.compress(new.encode(), mtime=0) if zipped else new.encode())


def rows_of(run: str) -> dict:
    return json.loads(gzip.decompress((RAW / run / f"rows_{run}.json.gz").read_bytes()))


def load() -> dict:
    return {run: rows_of(run) for run in (TABLE_RUN, CONTROL_RUN)}


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
OVERLAP_RUNS = ("G2", "G3", "G4", "G5", "G6", "G7", "G9", "G10", "G11", "G12", "G13",
                "G14", "G15")
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
    "G7": "G6's command again, a day later (load generator on its own cores since G6)",
    "G9": "G6's servers with each server's scheduler process pinned alone to core 0 (the rest "
          "of the server on cores 1-13) and 24 requests per repeat at C=1; threshold 5 from "
          "calibrate; gated-v2 cut short by the call's deadline after its second repeat at C=128",
    "G10": "G9's pinning, the untimed pass per level as long as a timed repeat (it was 8 tokens), "
           "8 requests per repeat at C=1 again; threshold 5 from calibrate",
    "G11": "real pair, G10's harness without the pinning (run.py's defaults); threshold 24",
    "G12": "G11's command again, the next call on the same machine; threshold 18",
    "G13": "G11's command a third time, the call after G12; threshold 14",
    "G14": "G11's servers with two more levels, C=16 and 24, so calibrate reads the crossing "
           "where it lies (--levels 1,8,16,24,32,64,128,256); threshold 10",
    "G15": "G14's command again, the next call, on another machine; threshold 11",
}
# Repeatability: the same command in two or more calls (each server's medians, calibrate's
# threshold), and one call that starts each server twice (`NAME@2`), at the levels where
# speculation runs.
REPEATED = {"real pair": ("G6", "G7"), "real pair, scheduler pinned": ("G9", "G10"),
            "real pair, run.py's defaults": ("G11", "G12", "G13"),
            "real pair, levels 16 and 24 added": ("G14", "G15")}
TWO_STARTS = ("G8",)


# The same servers on 0.5.16, where SGLang has its own adaptive route: the accept pair (H1)
# and the real pair (H3), one call each; the native route (H2's `adaptive`) and the greedy
# sets under deterministic inference in the call between them. H6 and H7: the accept pair
# again, with the gate changed after the profile P2; H8 the bisect of H6's and H7's C=1 gap
# (each gate beside eagle-v2, no plain-default: its rows count only as C=1 starts); H9 and
# H10 both pairs with the gate of 2026-12-03; H11 to H13 the same servers side by side on one
# GPU (run.py --side-by-side), their repeats interleaved: H11 and H13 the accept pair, H12 the
# real pair; H14 the accept pair with SGLang's PR #35377 backported, H16 its C=64 five times
# (plain-default and gated-v2), H17 its C=1 five times (eagle-v2 and gated-v2: C=1 starts);
# H15 H2's greedy sets with the gate of 2026-12-03; H18 and H19 all four servers side by side
# (adaptive too) with H14's patch, C=1-32 and C=64-256 in two calls of one machine; P4 the C=1
# profile of eagle-v2 and gated-v2 (its repeats count as C=1 starts); H21 the real pair's four
# servers side by side at every level in one call (started together), H22 and H24 its C >= 64
# and C=64 again, H23 the accept pair's C=1 with the native route beside the gate; H25 two
# starts each of plain-default and gated-v2 at C=64 (the second starts, `NAME@2`, count in no
# table), H26 H21's command again and H27 its C=8 and 64 with five repeats, on one machine;
# H28 H21's command with the relay edit (a gated step's token alone through the FutureMap),
# H29 H15's greedy sets with it; H30 the accept pair's four servers with it at every level in one
# call, H31 H28's command again on another machine; H32 and H33 eagle-v2 and gated-v2 started
# twice each on the real pair at C=1 and 8 (how far two starts of one server differ there).
NEWEST_RUNS = ("H1", "H3", "H6", "H7", "H9", "H10", "H11", "H12", "H13", "H14", "H16", "H18", "H19", "H21",
               "H22", "H23", "H24", "H25", "H26", "H27", "H28",
               "H30", "H31", "H32", "H33")
NEWEST_STARTS = ("H8", "H17", "P4")
NEWEST_EQUIVALENCE_RUNS = {"H2": "--enable-deterministic-inference", "H15": "--enable-deterministic-inference",
                           "H29": "--enable-deterministic-inference"}
NEWEST_SERVERS = ("plain-default", "eagle-v2", "adaptive", "gated-v2")
NEWEST_NOTES = {
    "H1": "accept pair, every level; adaptive did not fit the call",
    "H2": "adaptive on the accept pair with threshold 59 (H1's), then the context pair under "
          "deterministic inference. adaptive ran without plain-default's caps (no plain-default "
          "in the call; the harness refuses that since): SGLang reset its running cap to 48, so "
          "its batch never passed 59 and it never left its 3-step tier",
    "H3": "real pair (temperature 1), every level",
    "H4": "adaptive alone on the accept pair, threshold 59 (H1's), with plain-default's caps "
          "(running 4096, decode graphs to 256, as H1's plain-default logged): plan's native config",
    "H5": "adaptive alone on the real pair, threshold 5 (H3's), plain-default's caps as in H4",
    "H6": "H1's command again, with the gate of 2026-12-03 (a gated step's rows one token wide; "
          "the gated prefill asks for the capture of the target's prefill graphs, which P2 found "
          "it missing, so it ran eagerly); threshold 56",
    "H7": "plain-default, gated-v2, eagle-v2 at C=1 and 128, threshold 56 (H6's), H6's gate, on "
          "another machine: whether H6's C=1 gap (gated-v2 91 % of eagle-v2) is a start's "
          "spread; gated-v2@2 did not fit the call",
    "H8": "the bisect of the C=1 gap, one call on one machine, threshold 56, C=1 and 128: the gate "
          "before both changes (713c48d, H1's), with the one-token rows only (ad3a0d2), and today's, "
          "then eagle-v2: 836, 938, 960 and 727 tok/s at C=1: no change slowed C=1, and the spread "
          "between starts is larger than H6's and H7's gaps",
    "H9": "H1's command with today's gate (b8655ee), threshold 56",
    "H10": "H3's command (real pair, threshold from calibrate: 34) with today's gate (b8655ee)",
    "H11": "H9's servers side by side (--side-by-side: all three up at once, KV pools capped at "
           "200,000 tokens, repeats interleaved and rotated), the gate of b8655ee, threshold 56",
    "H12": "H10's servers side by side, real pair, threshold 34 (H10's calibrate)",
    "H13": "H11's command again, on another machine",
    "H14": "H11's command with the patch of 2026-12-03 (SGLang's PR #35377 backported: "
           "alloc_for_spec_decode reads the new KV allocations with one tolist())",
    "H15": "H2's context pair under deterministic inference, threshold 16, the gate of 2026-12-03 "
           "(a gated prefill replays the target's prefill graphs)",
    "H16": "H14's plain-default and gated-v2 side by side at C=64 only, five repeats each",
    "H17": "H14's eagle-v2 and gated-v2 side by side at C=1 only, five repeats each",
    "H18": "H14's servers and adaptive (plan's native config, plain-default's caps) side by side, "
           "four servers up at once, C=1, 8, 32, seven repeats each; threshold 56",
    "H19": "H18's four servers at C=64, 128, 256, three repeats each, the next call on the same "
           "machine",
    "H21": "the real pair, H18's four servers side by side, threshold 34 (H10's calibrate), every "
           "level, three repeats, in one call: --start-together launched the four at once (up in "
           "126-150 s, 104,571 MiB of the GPU in use with all up)",
    "H22": "H21's command at C=64, 128, 256, five repeats each, on another machine (cold)",
    "H23": "eagle-v2, adaptive, gated-v2 side by side at C=1 only, accept pair, threshold 56, nine "
           "repeats each, started together (H20's command, which did not fit)",
    "H24": "plain-default and gated-v2 side by side at C=64 only, real pair, threshold 34, seven "
           "repeats each, the next call on H22's machine",
    "H25": "plain-default and gated-v2 each started twice (NAME@2), side by side at C=64, real "
           "pair, threshold 34, five repeats, the four launched together: whether a slow gated "
           "step belongs to a start; the next call on P5's machine",
    "H26": "H21's command again (the real pair, four servers side by side, every level, three "
           "repeats, one call), the next call on H25's machine",
    "H27": "H26's servers at C=8 and 64, five repeats each, the next call on H26's machine",
    "H28": "H21's command with the gate of 2026-12-04 (a gated step relays its token alone through "
           "SGLang's FutureMap: no top-k or hidden-state rows gathered or written), threshold 34, "
           "every level, three repeats, four servers started together, in one call, on another "
           "machine than P6's",
    "H29": "H15's command (context pair, deterministic inference, threshold 16) with H28's gate, "
           "the next call on H28's machine",
    "H30": "the accept pair, the four servers side by side (H18's and H19's) with H28's gate, "
           "threshold 56, every level, three repeats, started together, in one call (cold machine)",
    "H31": "H28's command again (the real pair, threshold 34), on another machine (cold)",
    "H32": "eagle-v2 and gated-v2 each started twice (NAME@2), side by side, real pair, threshold "
           "34, C=1 and 8, five repeats, the four launched together (cold machine): gated-v2@2 "
           "did not start (SGLang's rendezvous port, picked free by each server, taken by "
           "another: run.py gives each its own since)",
    "H33": "H32's command with a rendezvous port per server, on another machine (cold)",
    "P4": "eagle-v2 and gated-v2 at C=1, two repeats each, then a profile of each (torch "
          "profiler, 30 steps): the gate's module takes 0.021 ms of a 12.2 ms step (gate_P4.txt)",
}
# Servers whose rows come from another call of the same version and pair.
NEWEST_BORROWED = {"H1": {"adaptive": "H4"}, "H3": {"adaptive": "H5"}}


def collect_runs(table_runs, equivalence_runs, notes, servers, borrowed=None, extra_runs=()) -> dict:
    """One version's runs of the overlap worker's servers: rows, medians per run (a server
    another call measured for the same pair is borrowed from it), thresholds, equivalence."""
    borrowed = borrowed or {}
    names = {*table_runs, *equivalence_runs, *extra_runs, *(r for b in borrowed.values() for r in b.values())}
    runs = {run: rows_of(run) for run in sorted(names)}
    rows = [{**row, "run": run, "sglang": data["sglang"], "pair": row.get("pair", "accept"),
             "threshold": data.get("threshold") if row["server"] in ("gated-v2", "adaptive") else None}
            for run in sorted(names) for data in [runs[run]] for row in data["rows"]]
    # Every level a table run measured (a run with a finer grid adds columns; "-" elsewhere).
    levels = sorted({row["C"] for row in rows if row["run"] in table_runs})
    medians = {run: {s: [median(rows, s, c, borrowed.get(run, {}).get(s, run)) for c in levels]
                     for s in servers} for run in table_runs}
    versions = {runs[run]["sglang"] for run in table_runs}
    assert len(versions) == 1, f"one version per table, not {versions}"
    return {
        "sglang": versions.pop(), "table_runs": list(table_runs), "levels": levels, "borrowed": borrowed,
        "notes": notes,
        # run.py --side-by-side: the servers up at once, their repeats interleaved
        "side_by_side": sorted(run for run in runs if runs[run].get("side_by_side")),
        "thresholds": {run: runs[run].get("threshold") for run in runs},
        "calibrate": {run: runs[run].get("calibrate") for run in table_runs},
        "medians": medians,
        "rows": rows,
        "equivalence": {run: {"kernels": kernels, "threshold": 16,
                              "report": runs[run].get("equivalence")}
                        for run, kernels in equivalence_runs.items()},
    }


def best_of(columns) -> list:
    """Per level, the largest of the servers' medians there (each column a server's, None
    where it did not run): what gated-v2 is held against."""
    return [max((v for v in level if v), default=None) for level in zip(*columns, strict=True)]


def runs_table(section: dict, servers) -> str:
    """Each server's medians per run, then gated-v2 against the best of the others."""
    levels = section["levels"]
    lines = ["| output tok/s, median of the run's repeats (3 unless it says), SGLang " + section["sglang"] + " | run (pair) | "
             + " | ".join(f"C={c}" for c in levels) + " |", "|---" * (len(levels) + 2) + "|"]
    others = [s for s in servers if s != "gated-v2"]
    for server in servers:
        for run in section["table_runs"]:
            values = section["medians"][run][server]
            if not any(values):
                continue
            source = section["borrowed"].get(run, {}).get(server)
            label = server + (f", threshold {section['thresholds'][run]}" if server == "gated-v2" else "")
            repeats = max(Counter(r["C"] for r in section["rows"] if r["run"] == (source or run)
                                  and r["server"] == server).values())
            lines.append(f"| {label} | {source or run} ({pair_label(section, run)}"
                         + (f", {repeats} repeats" if repeats != 3 else "") + ") | "
                         + " | ".join(f"{v:.0f}" if v else "-" for v in values) + " |")
    for run in section["table_runs"]:
        m = section["medians"][run]
        present = [s for s in others if any(m[s])]
        best = best_of(m[s] for s in present)
        lines.append(ratio_line(f"gated-v2 / max({', '.join(present)}) | {run} ({pair_label(section, run)})",
                                m["gated-v2"], best))
    return "\n".join(lines)


def repeatability(section: dict) -> dict:
    """Each repeated command's medians side by side, the spread between them (max / min - 1,
    per server and level), calibrate's threshold in each and its move from one call to the
    next, and each two-start call's medians."""
    rows = section["rows"]
    repeated = {}
    for label, runs in REPEATED.items():
        levels = sorted({r["C"] for r in rows if r["run"] in runs})
        columns = [section["levels"].index(c) for c in levels]
        medians = {run: section["medians"][run] for run in runs}
        spread = {s: [None if not all(medians[r][s][i] for r in runs) else
                      round(max(medians[r][s][i] for r in runs) / min(medians[r][s][i] for r in runs) - 1, 3)
                      for i in columns] for s in OVERLAP_SERVERS}
        thresholds = [section["thresholds"][r] for r in runs]
        repeated[label] = {"runs": list(runs), "levels": levels, "spread": spread, "thresholds": thresholds,
                           "threshold_moves": [round(b / a - 1, 3) for a, b in itertools.pairwise(thresholds)]}
    starts = {}
    for run in TWO_STARTS:
        servers = sorted({r["server"] for r in rows if r["run"] == run})
        levels = sorted({r["C"] for r in rows if r["run"] == run})
        starts[run] = {"levels": levels,
                       "medians": {s: [median(rows, s, c, run) for c in levels] for s in servers}}
    c1 = {"real": c1_every_start(section, "real", [*section["table_runs"], *TWO_STARTS])}
    return {"repeated": repeated, "two_starts": starts, "c1_every_start": c1}


def c1_every_start(section: dict, pair: str, runs) -> dict:
    """Every start of eagle-v2 and gated-v2 on `pair` at C=1 in `runs` (the median of its
    repeats), the median over all starts and their ratio. At C=1 every calibrated threshold
    has gated-v2 run EAGLE's own step, so two starts differ there by the start and by what the
    gate adds to a speculative step: many starts tell one from the other. A second start (`NAME@2`) and a gate of another revision (`NAME+REV`, whose
    changes touch only gated steps) count as starts of their server."""
    rows = [r for r in section["rows"] if r["run"] in runs and r["pair"] == pair]
    c1 = {}
    for kind in ("eagle-v2", "gated-v2"):
        medians = {f"{run} {name}": median(rows, name, 1, run) for run in runs
                   for name in sorted({r["server"] for r in rows if r["run"] == run
                                       and re.split(r"[@+]", r["server"])[0] == kind})}
        medians = {k: v for k, v in medians.items() if v}
        c1[kind] = {"starts": medians, "median": statistics.median(medians.values())}
    c1["ratio"] = round(c1["gated-v2"]["median"] / c1["eagle-v2"]["median"], 3)
    return c1


# SGLang's decode log line: every DECODE_LOG_INTERVAL decode steps (its default, which run.py
# keeps outside --catchup), the running batch, the KV tokens in use, and the output tokens per
# second since the line before.
DECODE_LINE = re.compile(r"Decode batch, #running-req: (\d+), #token: (\d+),.*?gen throughput \(token/s\): ([\d.]+)")
DECODE_LOG_INTERVAL = 40
# run.py's digest of a server's log keeps its decode lines in one section; its "tail 40"
# repeats the last of them, which read twice would count the last level's intervals twice.
DECODE_SECTION = re.compile(r"^## decode lines [^\n]*\n(.*?)^## ", re.M | re.S)


def steady_decode(run: str, server: str, pair: str, levels) -> dict:
    """Decode speed alone, read from a server's log: the median of the decode log's
    throughput over the intervals that only decoded the same C requests: the line before at C
    too, and the KV tokens in use up by at least one per request and step. A request that
    finished and was replaced takes its whole length out (SGLang logs few of its prefills), and
    a turn of another server side by side starts with a new wave. The row's tok/s also counts
    each wave's prefills and the steps around them; this tells a slower step from a slower
    turnover."""
    digest = (RAW / run / f"log_{server}-{pair}.txt").read_text(errors="replace")
    section = DECODE_SECTION.search(digest)
    speeds, before = {c: [] for c in levels}, (None, 0)
    for found in DECODE_LINE.finditer(section[1] if section else ""):
        running, tokens, tok_s = int(found[1]), int(found[2]), float(found[3])
        if running == before[0] and running in speeds and tokens - before[1] >= running * DECODE_LOG_INTERVAL:
            speeds[running].append(tok_s)
        before = (running, tokens)
    return {c: statistics.median(v) if v else None for c, v in speeds.items()}


def steady_section(section: dict, servers=("plain-default", "gated-v2")) -> dict:
    """`steady_decode` of plain-default and gated-v2 in each side-by-side run, at the levels
    it measured where the gate decodes, and their ratio."""
    out = {}
    for run in section["side_by_side"]:
        pair = run_pair(section, run)
        measured = {r["C"] for r in section["rows"] if r["run"] == run}
        levels = [c for c in section["levels"] if c > section["thresholds"][run] and c in measured]
        if not levels:
            continue
        speeds = {s: steady_decode(run, s, pair, levels) for s in servers}
        out[run] = {"levels": levels, "tok_s": speeds,
                    "ratio": [round(speeds["gated-v2"][c] / speeds["plain-default"][c], 3) for c in levels]}
    return out


def pooled_side_by_side(section: dict, pair: str, servers) -> dict:
    """Every timed repeat of `pair` in the side-by-side runs pooled per server and level (each
    repeat interleaved with the other servers' in its call), their medians, counts and
    gated-v2 against the best of the others: one figure per level from every call's repeats,
    beside each call's own medians of 3. A server that ran in fewer calls (the native route)
    is pooled over other machines than gated-v2, so `common` pools each level again over the
    calls that ran both gated-v2 and the best of the others there (by the pooled medians)."""
    runs = [r for r in section["side_by_side"] if run_pair(section, r) == pair]
    rows = [r for r in section["rows"] if r["run"] in runs and r["pair"] == pair and not r["errors"]]
    levels = sorted({r["C"] for r in rows})

    def medians_of(kept):
        tok_s = {s: {c: [r["tok_s"] for r in kept if r["server"] == s and r["C"] == c] for c in levels}
                 for s in servers}
        medians = {s: [statistics.median(v) if v else None for v in tok_s[s].values()] for s in servers}
        best = best_of(m for k, m in medians.items() if k != "gated-v2")
        ratio = [round(g / b, 3) if g and b else None for g, b in zip(medians["gated-v2"], best, strict=True)]
        return tok_s, medians, ratio

    tok_s, medians, ratio = medians_of(rows)
    common_runs = {}
    for i, c in enumerate(levels):
        others = [s for s in servers if s != "gated-v2" and medians[s][i]]
        leader = max(others, key=lambda s: medians[s][i], default=None)
        common_runs[c] = [run for run in runs
                          if all(any(r["run"] == run and r["server"] == s and r["C"] == c for r in rows)
                                 for s in ("gated-v2", leader) if s)]
    _, _, common_ratio = medians_of([r for r in rows if r["run"] in common_runs[r["C"]]])
    return {"runs": runs, "levels": levels, "medians": medians,
            "repeats": {s: [len(v) for v in tok_s[s].values()] for s in servers}, "ratio": ratio,
            "common": {"runs": [common_runs[c] for c in levels], "ratio": common_ratio}}


def pooled_table(pooled: dict, pair: str, sglang: str) -> str:
    levels = pooled["levels"]
    lines = [f"| {pair} pair, SGLang {sglang}, every side-by-side repeat of {', '.join(pooled['runs'])} "
             "(median, repeats) | " + " | ".join(f"C={c}" for c in levels) + " |", "|---" * (len(levels) + 1) + "|"]
    lines += [f"| {s} | " + " | ".join(f"{m:.0f} ({n})" if m else "-" for m, n in zip(med, pooled["repeats"][s], strict=True))
              + " |" for s, med in pooled["medians"].items() if any(med)]
    lines.append("| gated-v2 / max(the others) | " + " | ".join(f"{r:.1%}" if r else "-" for r in pooled["ratio"]) + " |")
    common = pooled["common"]
    lines.append("| the same, only the calls that ran gated-v2 and the best of the others | " + " | ".join(
        f"{r:.1%} ({', '.join(runs)})" if r else "-" for r, runs in zip(common["ratio"], common["runs"], strict=True))
        + " |")
    return "\n".join(lines)


def steady_table(steady: dict) -> str:
    lines = []
    for run, rec in steady.items():
        lines += [""] if lines else []
        lines += [f"| {run}: decode log, intervals of decode steps only at C (median tok/s) | "
                  + " | ".join(f"C={c}" for c in rec["levels"]) + " |", "|---" * (len(rec["levels"]) + 1) + "|"]
        lines += [f"| {s} | " + " | ".join(f"{v:.0f}" for v in vals.values()) + " |" for s, vals in rec["tok_s"].items()]
        lines.append("| gated-v2 / plain-default | " + " | ".join(f"{r:.1%}" for r in rec["ratio"]) + " |")
    return "\n".join(lines)


def repeatability_table(section: dict) -> str:
    lines = []
    for label, rep in section["repeatability"]["repeated"].items():
        levels = rep["levels"]
        lines += [f"| {label}: spread of the medians, {' against '.join(rep['runs'])} | "
                  + " | ".join(f"C={c}" for c in levels) + " |", "|---" * (len(levels) + 1) + "|"]
        lines += [f"| {s} | " + " | ".join("-" if v is None else f"{v:.0%}" for v in vals) + " |"
                  for s, vals in rep["spread"].items()]
        moves = ", ".join(f"{m:+.0%}" for m in rep["threshold_moves"])
        lines.append(f"| calibrate's threshold | {' → '.join(map(str, rep['thresholds']))} "
                     f"({moves}) |" + " |" * (len(levels) - 1))
    for run, start in section["repeatability"]["two_starts"].items():
        lines += ["", f"| {run} ({pair_label(section, run)}): each server started twice, median of 3 | "
                  + " | ".join(f"C={c}" for c in start["levels"]) + " |",
                  "|---" * (len(start["levels"]) + 1) + "|"]
        lines += [f"| {s} | " + " | ".join(f"{v:.0f}" for v in vals) + " |"
                  for s, vals in start["medians"].items()]
    return "\n".join(lines)


def c1_table(c1: dict, pair: str, sglang: str) -> str:
    lines = [f"| {pair} pair, SGLang {sglang}, C=1, every start (median of its repeats) | starts | median over starts |",
             "|---|---|---|"]
    lines += [f"| {kind} | " + ", ".join(f"{v:.0f} ({k})" for k, v in c1[kind]["starts"].items())
              + f" | {c1[kind]['median']:.0f} |" for kind in ("eagle-v2", "gated-v2")]
    lines.append(f"| gated-v2 / eagle-v2 | | {c1['ratio']:.0%} |")
    return "\n".join(lines)


def run_pair(section: dict, run: str) -> str:
    return next(r["pair"] for r in section["rows"] if r["run"] == run)


def pair_label(section: dict, run: str) -> str:
    """A run's pair, and how its servers ran when not one after another."""
    return run_pair(section, run) + (", side by side" if run in section.get("side_by_side", ()) else "")


def median(rows, server, c, run=TABLE_RUN):
    vals = [r["tok_s"] for r in rows if r["server"] == server and r["C"] == c
            and r["run"] == run and not r["errors"]]
    return statistics.median(vals) if vals else None


def ratio_line(label, num, den):
    # one decimal: a whole percent would round 94.9 up to the 95 % line (H18's C=1)
    cells = ["-" if a is None or not b else f"{a / b:.1%}" for a, b in zip(num, den, strict=True)]
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


# The catch-up cost (run.py --catchup, the trained pair): each run's summary, re-read from its
# kept runs with catchup.py (the summary written on the GPU machine counted no gated step
# before the resume: it expected gated lines to log `accept len: 0.00`, and they log none).
CATCHUP_RUNS = {"K1": "trained pair (copy offset 16), threshold 16: eagle-v2 and gated-v2, "
                      "8 long requests beside 120 short ones (mixed), then alone",
                "K2": "the control: K1's command with trained-0 (copy offset 0, the draft needs no "
                      "old KV entry), so what a resume loses here is the stale KV's other effects"}


def catchup_section() -> dict:
    out = {}
    for run, note in CATCHUP_RUNS.items():
        data = rows_of(run)["catchup"]
        summary = catchup.catchup_summary(data["runs"], data["workload"]["n_long"])
        out[run] = {"note": note, "threshold": data["threshold"], "workload": data["workload"],
                    "table": summary["table"], "k0": summary["k0"],
                    # each run's first 48 speculative steps once the batch fell to the long ones
                    "after_fall": {key: catchup.steps_after_fall(r["decode_steps"], data["workload"]["n_long"])[0][:48]
                                   for key, r in data["runs"].items()}}
    return out


def catchup_table(section: dict) -> str:
    cols = ("resume_after_gated_steps", "steps_8", "steps_16", "steps_32", "steps_all",
            "after_k0_32", "after_k0_128", "after_k0_all", "same_ids")
    lines = []
    for run, rec in section.items():
        lines += [""] if lines else []
        lines += [f"| {run}: accept length (tokens per step) | " + " | ".join(cols) + " |",
                  "|---" * (len(cols) + 1) + "|"]
        lines += [f"| {key.replace('|', ', ')} | " + " | ".join("-" if row.get(c) is None else f"{row[c]:g}" for c in cols) + " |"
                  for key, row in rec["table"].items()]
    return "\n".join(lines)


def main() -> None:
    scrub_raw()
    result = collect()
    result["overlap_worker"] = collect_runs(OVERLAP_RUNS, OVERLAP_EQUIVALENCE_RUNS, OVERLAP_NOTES,
                                            OVERLAP_SERVERS, extra_runs=TWO_STARTS)
    result["overlap_worker"]["repeatability"] = repeatability(result["overlap_worker"])
    result["overlap_worker"]["table_run"] = OVERLAP_TABLE_RUN
    result["newest"] = collect_runs(NEWEST_RUNS, NEWEST_EQUIVALENCE_RUNS, NEWEST_NOTES,
                                    NEWEST_SERVERS, NEWEST_BORROWED, extra_runs=NEWEST_STARTS)
    result["newest"]["c1_every_start"] = {pair: c1_every_start(result["newest"], pair, [*NEWEST_RUNS, *NEWEST_STARTS])
                                          for pair in ("accept", "real")}
    result["newest"]["steady_decode"] = steady_section(result["newest"])
    result["newest"]["pooled_side_by_side"] = {
        pair: pooled_side_by_side(result["newest"], pair, NEWEST_SERVERS)
        for pair in ("accept", "real")}
    result["catchup"] = catchup_section()
    (HERE / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    for key, servers in (("overlap_worker", OVERLAP_SERVERS), ("newest", NEWEST_SERVERS)):
        print()
        print(runs_table(result[key], servers))
    print()
    print(repeatability_table(result["overlap_worker"]))
    print()
    overlap, newest = result["overlap_worker"], result["newest"]
    for starts, sglang in ((overlap["repeatability"]["c1_every_start"], overlap["sglang"]),
                           (newest["c1_every_start"], newest["sglang"])):
        for pair, c1 in starts.items():
            print(c1_table(c1, pair, sglang))
            print()
    for pair, pooled in result["newest"]["pooled_side_by_side"].items():
        print(pooled_table(pooled, pair, result["newest"]["sglang"]))
        print()
    print(steady_table(result["newest"]["steady_decode"]))
    print()
    print(catchup_table(result["catchup"]))


if __name__ == "__main__":
    main()
