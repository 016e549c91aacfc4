#!/usr/bin/env bash
# A release's live check of the gate in one device call (about six minutes), on the GPU machine:
#   device run, carry [".gpu"] (pack.sh VERSION first), command: bash bench/gpu/live.sh TAG_A TAG_B
# TAG_A: the throughput half (plain-default, eagle-v2 and gated-v2 side by side, accept pair,
# threshold 56, C=8 and 128, medians of 5); TAG_B: the equivalence half (the context pair under
# deterministic inference, the three started together, the equivalence set with its switch
# workload on each). Their rows and logs come back as one archive, $OUT/all.tgz (call.sh),
# even when the device's limit cuts the call off. Then, here: `tar xzf all.tgz -C
# bench/gpu/raw --exclude '*.out'`, one runs.toml entry per tag, collect.py.
# LIVE_BUDGET_S (default 600, a call's limit): the seconds this script may take; the throughput
# half ends by 55 % of it and the equivalence half 30 s before its end (run.py's deadlines cut
# the last repeats of a slow call rather than overrun the call). A tag "-" skips its half, and
# the other half then has the whole budget: on an H100 a release needs the two halves in two
# calls (V12: 300 s for the throughput half, then 210 s before the context servers answer).
# The equivalence half serves gated-v2 right after plain-default: on an H100 its servers take
# 210 s to start, and a deadline then cuts eagle-v2's sets (context only), not the gate's.
set -u
A=${1:?usage: live.sh TAG_A TAG_B}; B=${2:?usage: live.sh TAG_A TAG_B}
[ "$A$B" = "--" ] && { echo "live.sh: both halves skipped" >&2; exit 2; }
BUDGET=${LIVE_BUDGET_S:-600}
SUMMARY="tok/s\|healthy\|EQUIV\|refus\|Error\|cut off"
source bench/gpu/call.sh
source .gpu/kit/setup.sh 56
if [ "$A" != "-" ]; then
  END=$([ "$B" = "-" ] && echo $((BUDGET - 30)) || echo $((BUDGET * 11 / 20)))
  mkdir -p "$OUT/$A"
  run_py "$OUT/$A.out" --servers plain-default:accept,eagle-v2:accept,gated-v2:accept --side-by-side \
    --start-together --plain-caps 4096,256 --threshold 56 --levels 8,128 --repeats 5 \
    --tag "$A" --out "$OUT/$A" --deadline-s $((END - SECONDS))
fi
if [ "$B" != "-" ]; then
  mkdir -p "$OUT/$B"
  run_py "$OUT/$B.out" --servers plain-default:context,gated-v2:context,eagle-v2:context --deterministic \
    --side-by-side --start-together --plain-caps 4096,256 --tag "$B" --out "$OUT/$B" \
    --deadline-s $((BUDGET - 30 - SECONDS))
fi
archive
