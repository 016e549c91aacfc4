"""The time of one decode step, per server and level, from a call's server logs (raw/<run>/
log_<server>-<pair>.txt): what a speculative step costs beside a plain one.

SGLang logs a decode line every 40 decode steps (`decode_log_interval`): the running batch,
the accept length (tokens a speculative step emits, its bonus token included; 1 without
speculation) and the interval's throughput. An interval that also ran prefill, or that
spans a server's idle turn in a side-by-side call, is slower, so a level keeps the intervals
whose batch is the level's, whose throughput is within PURE of its fastest, and that ran no
slower than the slowest of the server's whole passes at that level (rows_<run>.json.gz: a
pass counts its prefills too, so an interval slower than every pass did something besides
decoding). One step then takes batch x accept length / throughput; the median over those
intervals is the level's. A level whose every interval is slower than its passes (drafts
whose requests live fewer steps than the 40 between two decode lines) has no figure, nor has
a level the server's rows never ran (the harness's warm-up batch is no level of the call).

    python bench/gpu/step_times.py bench/gpu/raw/D16a-a bench/gpu/raw/D16a-b --levels 16,32,64,128
"""

import argparse
import re
import statistics
import sys
from pathlib import Path

import harness  # its reader of a call's rows (.json or .json.gz)

PURE = 0.8  # an interval within this share of the level's fastest is pure decode
DECODE = re.compile(r"Decode batch, #running-req: (\d+),.*?(?:accept len: ([\d.]+),.*?)?"
                    r"gen throughput \(token/s\): ([\d.]+)")
LOG = re.compile(r"^log_(?P<server>.+)-(?P<pair>[a-z0-9]+)\.txt$")


def intervals(log_text):
    """(batch, tokens a step, tok/s) of each decode line."""
    for m in DECODE.finditer(log_text):
        yield int(m.group(1)), float(m.group(2) or 1), float(m.group(3))


def step_times(log_text, levels, passes=None):
    """{level: (ms a step, tokens a step, pure intervals)} for each level with a pure decode
    line; passes: {level: the slowest whole pass's tok/s}, the floor of a pure interval, and
    the levels the server ran (None where its rows are not kept: every level may count)."""
    out = {}
    for c in levels:
        if passes is not None and c not in passes:
            continue
        floor = (passes or {}).get(c, 0)
        at = [(tokens, tok_s) for batch, tokens, tok_s in intervals(log_text)
              if batch == c and tok_s > 0 and tok_s >= floor]
        if not at:
            continue
        fastest = max(tok_s for _, tok_s in at)
        pure = [(tokens, tok_s) for tokens, tok_s in at if tok_s >= PURE * fastest]
        out[c] = (statistics.median(1000 * c * tokens / tok_s for tokens, tok_s in pure),
                  statistics.median(tokens for tokens, _ in pure), len(pure))
    return out


def slowest_passes(folder, server):
    """{level: the slowest tok/s of the server's passes} from the folder's rows; None where
    the folder keeps none."""
    rows = harness.folder_rows(folder)
    if rows is None:
        return None
    slowest = {}
    for row in rows:
        if row["server"] == server and row.get("tok_s") and not row.get("errors"):
            slowest[row["C"]] = min(slowest.get(row["C"], row["tok_s"]), row["tok_s"])
    return slowest


def table(folders, levels):
    """One markdown row per server log in the folders: ms a step (tokens a step) per level."""
    lines = ["| time of one decode step | " + " | ".join(f"C={c}" for c in levels) + " |",
             "|---" * (len(levels) + 1) + "|"]
    for folder in folders:
        for log in sorted(Path(folder).glob("log_*.txt")):
            m = LOG.match(log.name)
            if not m:
                continue
            times = step_times(log.read_text(errors="replace"), levels, slowest_passes(folder, m["server"]))
            cells = [f"{times[c][0]:.1f} ms ({times[c][1]:.1f})" if c in times else "-" for c in levels]
            lines.append(f"| {m['server']} ({Path(folder).name}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="step_times.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", help="a call's raw folders (bench/gpu/raw/<run>)")
    ap.add_argument("--levels", default="16,32,64,128",
                    type=lambda s: [int(x) for x in s.split(",")], help="the levels' batch sizes")
    args = ap.parse_args(argv)
    missing = [f for f in args.folders if not Path(f).is_dir()]
    if missing:
        print(f"step_times.py: no folder {missing[0]}", file=sys.stderr)
        return 2
    print(table(args.folders, args.levels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
