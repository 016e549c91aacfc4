"""Would a depth table corrected at run time from measured acceptance have chosen better?

One call's rows calibrate (traffic A: each depth's throughput and accept length per level);
other calls' rows measure the same depths on other traffic (B). If a step cost the same
whatever it accepts, depth k would serve T_A(k) x a_B(k) / a_A(k) on B, and plain decoding
(depth 0) T_A(0): what a correction from acceptance beside the calibrated throughput would
predict, as SGLang's controller reads acceptance and the table's maker throughput. The tool
prints that prediction beside what B measured (medians over the repeats of every folder of
B), and the depth each picks per level.

    python bench/gpu/accept_shift.py bench/gpu/raw/D16c-a bench/gpu/raw/D16e-a bench/gpu/raw/D16f-a
"""

import argparse
import statistics
import sys
from pathlib import Path

import harness  # its reader of a call's rows (.json or .json.gz)
import loadgen
import servers


def depth_of(server):
    """A server's depth: 0 for plain-default, its draft steps for a static EAGLE-3 server
    (servers.STATIC_DEPTHS; a second start, NAME@2, counts as its kind), None for any other
    (gated, adaptive)."""
    kind = servers.server_kind(server)
    if kind == "plain-default":
        return 0
    return next((d for d, name in servers.STATIC_DEPTHS.items() if name == kind), None)


def medians(folders):
    """{(level, depth): (tok/s, accept length or None)}: medians over the error-free repeats of
    the static servers in the folders' rows."""
    seen, lengths = {}, set()
    for folder in folders:
        rows = harness.folder_rows(folder)
        if rows is None:
            raise ValueError(f"no rows in {folder}")
        for row in rows:
            depth = depth_of(row["server"])
            if depth is None or row.get("errors") or not row.get("tok_s"):
                continue
            lengths.add(loadgen.row_lengths(row))
            tok_s, accept = seen.setdefault((row["C"], depth), ([], []))
            tok_s.append(row["tok_s"])
            if row.get("mean_accept_len"):
                accept.append(row["mean_accept_len"])
    if len(lengths) > 1:  # medians of two shapes would mean neither
        raise ValueError(f"{', '.join(map(str, folders))} ran {len(lengths)} prompt and output lengths "
                         f"({', '.join(f'{p}+{o}' for p, o in sorted(lengths))}): give calls of one")
    return {key: (statistics.median(t), statistics.median(a) if a else None) for key, (t, a) in seen.items()}


def predicted(calibration, measured):
    """{(level, depth): (T_A, a_A, a_B, predicted T_B, measured T_B)} for each level and depth
    both sides measured."""
    out = {}
    for key in sorted(calibration.keys() & measured.keys()):
        (t_a, a_a), (t_b, a_b) = calibration[key], measured[key]
        guess = t_a if key[1] == 0 else (t_a * a_b / a_a if a_a and a_b else None)
        if guess is not None:
            out[key] = (t_a, a_a, a_b, guess, t_b)
    return out


def picks(rows):
    """{level: (the depth the prediction picks, the depth measured best)}."""
    out = {}
    for c in sorted({c for c, _ in rows}):
        at = {d: v for (level, d), v in rows.items() if level == c}
        out[c] = (max(at, key=lambda d: at[d][3]), max(at, key=lambda d: at[d][4]))
    return out


def table(rows):
    lines = ["| C | depth | A tok/s | A accept | B accept | predicted B tok/s | measured B tok/s | predicted / measured |",
             "|---|---|---|---|---|---|---|---|"]
    for (c, d), (t_a, a_a, a_b, guess, t_b) in rows.items():
        accept = (f"{a_a:.2f}", f"{a_b:.2f}") if d else ("-", "-")
        lines.append(f"| {c} | {d} | {t_a:.0f} | {accept[0]} | {accept[1]} | {guess:.0f} | {t_b:.0f} | "
                     f"{100 * guess / t_b:.1f} % |")
    lines.append("")
    lines += [f"C={c}: the prediction picks depth {p}, the measurement depth {m}" for c, (p, m) in picks(rows).items()]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="accept_shift.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("calibration", help="the calibrating call's raw folder (bench/gpu/raw/<run>)")
    ap.add_argument("measured", nargs="+", help="raw folders of calls on the other traffic")
    args = ap.parse_args(argv)
    missing = [f for f in (args.calibration, *args.measured) if not Path(f).is_dir()]
    if missing:
        print(f"accept_shift.py: no folder {missing[0]}", file=sys.stderr)
        return 2
    try:
        rows = predicted(medians([args.calibration]), medians(args.measured))
    except ValueError as e:
        print(f"accept_shift.py: {e}", file=sys.stderr)
        return 2
    if not rows:
        print("accept_shift.py: the folders share no level and depth", file=sys.stderr)
        return 2
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
