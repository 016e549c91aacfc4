"""The catch-up measurement's reading (run.py --catchup, collect.py): the workload, the
per-step accept lengths from a server's decode log lines, and the summary per run. No
server and no GPU: collect.py re-reads the runs kept in raw/ with it."""
import re
import statistics

import loadgen

# --catchup: 8 long requests (512 new tokens) start with 120 short ones (64): above the
# threshold the batch is gated; when the short ones finish it falls to 8 and, after the gate's
# resume steps (8 by default), speculation resumes for the long ones, whose draft KV lacks
# every token decoded while gated (and, where the prefill was gated, the prompt's).
CATCHUP = {"n_long": 8, "n_short": 120, "long_new": 512, "short_new": 64, "plen": 256, "seed": 21}
# Tokens after the short ones finished before the stream window opens: the gate's 8 resume
# steps (one token each) and a few for the last short responses' flight.
RESUME_MARGIN = 12
WINDOWS = ((0, 32), (0, 128), (0, None))
# The servers log every decode step (--decode-log-interval 1): SGLang's `accept len` of each
# step (tokens per request, bonus included; the patched scheduler leaves gated steps out) and
# the gate's state, which the per-step analysis reads.
DECODE = re.compile(r"Decode batch.*?#running-req: (\d+)")
ACCEPT = re.compile(r"accept len: ([\d.]+)")
GATE = re.compile(r"gate\(>\d+, <\d+\): (\w+)")
STEP_WINDOWS = (4, 8, 16, 32, None)


def decode_steps(lines):
    """[running requests, accept len (None when the line has none), gate state or None] per
    decode log line."""
    out = []
    for ln in lines:
        m = DECODE.search(ln)
        if m:
            acc, gate = ACCEPT.search(ln), GATE.search(ln)
            out.append([int(m.group(1)), float(acc.group(1)) if acc else None,
                        gate.group(1) if gate else None])
    return out


def steps_after_fall(steps, n):
    """The speculative steps once the batch has fallen to n requests (the long ones alone):
    their accept lengths in order, and how many gated steps came first. A gated step's line has
    no `accept len` (SGLang prints the speculative fields only after a speculative step, K1's
    logs); the gate's state on the line is the one decided for the next step under the overlap
    scheduler."""
    above = [i for i, s in enumerate(steps) if s[0] > n]
    after = steps[above[-1] + 1:] if above else steps  # (a run that never exceeded n: all)
    gated = 0
    for s in after:
        if s[1] is not None:
            break
        gated += 1
    return [s[1] for s in after[gated:] if s[1] is not None], gated


def catchup_summary(runs, n_long=None):
    """From each run's decode log: the batch's accept length over the first 4, 8, 16, 32 and
    all speculative steps after the batch fell to the long requests alone (`steps_*`), and the
    gated steps before them (`resume_after_gated_steps`). From the streams, per long request,
    tokens per step over the same output-token windows on every run: from k0, its tokens when
    the last short one finished on the gated server's mixed run (plus RESUME_MARGIN), else on
    the first mixed run, to +32, +128 and the end (`after_k0_*`), and before k0; SGLang's own
    whole-request spec_accept_length; `same_ids`: whether its ids equal the first run's."""
    n_long = n_long or CATCHUP["n_long"]
    ref = next((k for k in runs if k.startswith("gated") and k.endswith("|mixed")),
               next((k for k in runs if k.endswith("|mixed")), None))
    k0 = []
    if ref is not None:
        base = runs[ref]
        for r in base["long"]:
            tok = loadgen.tokens_at(r.get("events", []), base["shorts_done_s"]) if "error" not in r else None
            k0.append(None if tok is None else tok + RESUME_MARGIN)
    first = next(iter(runs.values()))
    table, per_request = {}, {}
    for key, run in runs.items():
        accepts, gated = steps_after_fall(run.get("decode_steps", []), n_long)
        row = {"resume_after_gated_steps": gated, "spec_steps": len(accepts)}
        for w in STEP_WINDOWS:
            vals = accepts[:w] if w else accepts
            row[f"steps_{w or 'all'}"] = round(statistics.mean(vals), 4) if vals else None
        rows = []
        for i, r in enumerate(run["long"]):
            if "error" in r:
                rows.append(None)
                continue
            ev = r["events"]
            one = {"completion_tokens": r["meta"].get("completion_tokens"),
                   "spec_verify_ct": r["meta"].get("spec_verify_ct"),
                   "sglang_accept_len": r["meta"].get("spec_accept_length"),
                   "same_ids": r.get("ids") == first["long"][i].get("ids")}
            if i < len(k0) and k0[i] is not None:
                one["k0"] = k0[i]
                one["before_k0"] = loadgen.window_accept(ev, 0, k0[i])["accept_len"]
                for lo, hi in WINDOWS:
                    w = loadgen.window_accept(ev, k0[i] + lo, None if hi is None else k0[i] + hi)
                    one[f"after_k0_{hi or 'all'}"] = w["accept_len"]
            rows.append(one)
        per_request[key] = rows
        for f in ("sglang_accept_len", "before_k0", "after_k0_32", "after_k0_128", "after_k0_all"):
            vals = [r[f] for r in rows if r and r.get(f) is not None]
            row[f] = round(statistics.mean(vals), 4) if vals else None
        row["same_ids"] = sum(bool(r and r["same_ids"]) for r in rows)
        table[key] = row
    return {"reference": ref, "k0": k0, "resume_margin": RESUME_MARGIN, "table": table,
            "per_request": per_request}
