#!/usr/bin/env bash
# The depth gate's probe on one release in one device call, on the GPU machine:
#   device run, carry [".gpu"] (pack.sh VERSION first), command: bash bench/gpu/depth.sh TAG
# Does the depth-gated server start, follow its table, and land in the right range? Not the
# issue's Done-when (medians of 3 at eight levels, 512-token outputs, both pairs, both prompt
# lengths: several calls); here one repeat a level, today's 256-token prompts and 128-token
# outputs, the accept pair, C = 16, 32, 64, 128. The environment changes that shape for a call of
# the Done-when's sweep: DEPTH_PAIR, DEPTH_LEVELS, DEPTH_PROMPT, DEPTH_OUTPUT, DEPTH_REPEATS and
# DEPTH_KV (each server's KV pool); run.py refuses, before any server starts, levels whose
# requests the pools cannot hold. DEPTH_STATIC chooses the static depths (three at most: four
# servers fit; 1,2,3 by default, 3,5,7 for drafts deeper than SGLang's default launch).
#   TAG-a: plain-default and static EAGLE-3 at those depths (eagle-v2-dN; eagle-v2 is depth 3)
#          side by side: the rows `eaglegate calibrate --depth` picks the depth table from.
#   TAG-b: gated-depth with that table (calibrated from TAG-a's rows: --rows-from; it comes back
#          as depth_table_PAIR.json), launched at its deepest depth, beside plain-default,
#          eagle-v2 and SGLang's adaptive route where plan gives the release one (its threshold
#          calibrated on TAG-a's rows too), else the first static depth other than 3 (a second
#          start of it).
# DEPTH_BESIDE=static (with DEPTH_HALF=b) runs TAG-b's gated server beside plain-default and the
# DEPTH_STATIC depths (two at most) instead of R(C)'s servers: E(C), the no-regret line's
# measure, side by side in one call, where TAG-b otherwise meets TAG-a's static depths only
# from another start. DEPTH_BESIDE=plain runs it beside plain-default alone: the free off
# state's measure (the gated server against plain-default where its table decodes plainly),
# two servers, which fit an H100 at C=256 where four do not.
# DEPTH_BUDGET_S (default 600, a call's limit): the seconds this script may take. Every half
# ends 50 s before it (TAG-a of both halves by 7/12 of it), so run.py's deadline, not the
# device's limit, cuts the last repeats of a call given less than a whole call's time.
# DEPTH_HALF (a, b or ab, the default) runs one half alone, with the whole call's time: a half
# of the Done-when's sweep (512-token outputs, medians of 3) takes a call of its own. TAG-b alone
# calibrates from DEPTH_ROWS_FROM, earlier calls' TAG-a rows in this checkout, comma-separated
# (where bench/gpu/raw stays behind for the call, copy those files into the tree): rows of
# another prompt length give the table a context band of their own; run.py refuses rows of
# another output length before any server starts.
# Everything comes back as one archive, $OUT/all.tgz (call.sh), even when the device's limit
# cuts the call off.
#
# Time: 485 s on a warm H100 for 0.5.16 (D16a). It was planned from the raw side-by-side runs
# (rows: n x 128 tokens / tok_s per pass; H28, H30, H31 cold calls of 498-514 s): setup and the
# weights about 70 s cold (the call's length less its start-ups and passes); four servers launched together healthy in 95-145 s cold (75-110 s
# warm, V6: 68-77 s for three); one pass of one server at C = 16, 32, 64, 128 about 1.0, 1.3,
# 2.6, 4.4 s, so an untimed and a timed pass of four servers at the four levels about 75 s;
# stopping four servers 10-30 s. Each half is then 180-250 s, the call 430-570 s with the plan
# check and the archive: the deadlines below (at the default budget TAG-a done by 350 s, TAG-b or
# a half alone by 550 s of this script) cut the last repeats of a slow call rather than overrun
# the 600 s a call may run.
set -u
TAG=${1:?usage: depth.sh TAG}
A="${TAG}-a"; B="${TAG}-b"
PAIR=${DEPTH_PAIR:-accept}
LEVELS=${DEPTH_LEVELS:-16,32,64,128}
SHAPE="--prompt-len ${DEPTH_PROMPT:-256} --output-len ${DEPTH_OUTPUT:-128} --repeats ${DEPTH_REPEATS:-1}"
# Four servers' KV pools of 64,000 tokens (C=128 x 384 needs 49,152): the accept pair's 16
# layers of 8 x 128 KV dims hold 64 KiB a token, so about 4 GB a pool against 13 GB at the
# harness's default: four servers fit an 80 GB H100 (D16a: each pool 3.9 GB, and the last
# server to start reported 12 GB free), as well as an H200.
KV=${DEPTH_KV:-64000}
HALF=${DEPTH_HALF:-ab}
BESIDE=${DEPTH_BESIDE:-}
ROWS_FROM=${DEPTH_ROWS_FROM:-}
# The adaptive route's threshold: calibrate's on TAG-a's rows, unless those levels never cross
# (speculation wins at all of them: a band's call); then DEPTH_THRESHOLD, from a sweep that does.
THRESHOLD=${DEPTH_THRESHOLD:+--threshold $DEPTH_THRESHOLD}
BUDGET=${DEPTH_BUDGET_S:-600}
SUMMARY="tok/s\|healthy\|calibrate\|refus\|Error\|error:\|cut off"
source bench/gpu/call.sh
# The static depths' servers, as servers.STATIC_DEPTHS names them (",NAME:PAIR" each), and the
# first other than depth 3 (TAG-b's fourth server where the release has no adaptive route):
# refused here, before the set-up spends its minute of device time, where a depth has no server
# or more than fit beside plain-default (and gated-depth, DEPTH_BESIDE=static); so are a half
# that is not one, a DEPTH_BESIDE the half cannot serve, and TAG-b alone without
# rows run.py can read.
CHECKED=$(python3 - "${DEPTH_STATIC:-1,2,3}" "$PAIR" "$HALF" "$ROWS_FROM" "${DEPTH_THRESHOLD:-}" "$BESIDE" "$BUDGET" <<'CHECK'
import argparse
import os
import sys
sys.path.insert(0, "bench/gpu")
import harness
import servers
from phases.throughput import SIDE_BY_SIDE_MAX
given, pair, half, rows_from, threshold, beside, budget = sys.argv[1:8]
if not harness.is_positive_int(budget) or int(budget) <= 100:
    sys.exit(f"depth.sh: DEPTH_BUDGET_S: seconds over 100, not {budget!r}")
if half not in ("a", "b", "ab"):
    sys.exit(f"depth.sh: DEPTH_HALF: a, b or ab, not {half!r}")
if threshold and not harness.is_positive_int(threshold):
    sys.exit(f"depth.sh: DEPTH_THRESHOLD: a batch size, not {threshold!r}")
if beside not in ("", "static", "plain"):
    sys.exit(f"depth.sh: DEPTH_BESIDE: static, plain, or unset for R(C)'s servers, not {beside!r}")
if beside and half != "b":
    sys.exit(f"depth.sh: DEPTH_BESIDE={beside} serves DEPTH_HALF=b alone: TAG-a runs no gated server")
if beside and threshold:
    sys.exit(f"depth.sh: DEPTH_THRESHOLD serves the adaptive route, which DEPTH_BESIDE={beside} does not run")
if beside == "plain" and "DEPTH_STATIC" in os.environ:
    sys.exit("depth.sh: DEPTH_STATIC: DEPTH_BESIDE=plain runs no static depth")
if threshold and half == "a":
    sys.exit("depth.sh: DEPTH_THRESHOLD serves TAG-b's adaptive route, and DEPTH_HALF=a runs no TAG-b")
if half == "b" and not rows_from:
    sys.exit("depth.sh: DEPTH_HALF=b needs DEPTH_ROWS_FROM, an earlier call's TAG-a rows (raw/TAG-a/rows_TAG-a.json.gz)")
if rows_from and half != "b":
    sys.exit(f"depth.sh: DEPTH_ROWS_FROM serves DEPTH_HALF=b alone, not {half}")
for path in filter(None, rows_from.split(",")):
    try:
        harness.rows_arg(path)
    except argparse.ArgumentTypeError as e:
        sys.exit(f"depth.sh: DEPTH_ROWS_FROM: {e}")
depths = [int(d) if d.strip().isdigit() else d for d in given.split(",")]
unknown = [d for d in depths if d not in servers.STATIC_DEPTHS]
if unknown:
    sys.exit(f"depth.sh: DEPTH_STATIC: no static depth {unknown[0]}: one of {', '.join(map(str, servers.STATIC_DEPTHS))}")
if len(set(depths)) < len(depths):
    sys.exit(f"depth.sh: DEPTH_STATIC: a depth named twice in {given}")
if len(depths) > SIDE_BY_SIDE_MAX - 1:
    sys.exit(f"depth.sh: DEPTH_STATIC: {len(depths)} depths, beside plain-default at most {SIDE_BY_SIDE_MAX - 1}")
if beside == "static" and len(depths) > SIDE_BY_SIDE_MAX - 2:
    sys.exit(f"depth.sh: DEPTH_STATIC: {len(depths)} depths, beside plain-default and gated-depth at most {SIDE_BY_SIDE_MAX - 2}")
names = [servers.STATIC_DEPTHS[d] for d in depths]
print("".join(f",{n}:{pair}" for n in names), next((n for n in names if servers.KINDS[n].steps != 3), ""))
CHECK
) || exit 2
read -r STATIC FOURTH <<<"$CHECKED"
source .gpu/kit/setup.sh 56
if [ "$HALF" != b ]; then
  A_END=$([ "$HALF" = a ] && echo $((BUDGET - 50)) || echo $((BUDGET * 7 / 12)))
  mkdir -p "$OUT/$A"
  run_py "$OUT/$A.out" --servers plain-default:$PAIR$STATIC \
    --side-by-side --start-together --plain-caps 4096,256 --kv-tokens $KV --levels "$LEVELS" $SHAPE \
    --tag "$A" --out "$OUT/$A" --deadline-s $((A_END - SECONDS))
fi
if [ "$HALF" = a ]; then
  archive
  exit 0
fi
# Beside the gated server: plain-default alone (DEPTH_BESIDE=plain), E(C)'s servers
# (DEPTH_BESIDE=static), or R(C)'s, eagle-v2 and
# SGLang's adaptive route (0.5.14 on) where plan gives one, as `adaptive` launches it
BESIDE_GATED=$STATIC
if [ "$BESIDE" = plain ]; then
  BESIDE_GATED=""
elif [ "$BESIDE" != static ]; then
  FOURTH=${FOURTH:-eagle-v2-d1}
  if $EG plan --path "$STAGE/pristine" --threshold 56 --json --flags "--speculative-algorithm EAGLE3 \
      --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4" \
      2>/dev/null | grep -q '"native-adaptive"'; then
    FOURTH=adaptive
  fi
  BESIDE_GATED=",eagle-v2:$PAIR,$FOURTH:$PAIR"
fi
# TAG-a's rows, or each of DEPTH_ROWS_FROM's (comma-separated: calls of other prompt lengths
# give the depth table a context band each)
EARLIER=(--rows-from "$OUT/$A/rows_$A.json")
if [ -n "$ROWS_FROM" ]; then
  EARLIER=()
  IFS=, read -ra FILES <<<"$ROWS_FROM"
  for f in "${FILES[@]}"; do [ -n "$f" ] && EARLIER+=(--rows-from "$f"); done
fi
mkdir -p "$OUT/$B"
run_py "$OUT/$B.out" --servers "plain-default:$PAIR,gated-depth:$PAIR$BESIDE_GATED" \
  "${EARLIER[@]}" --side-by-side --start-together --plain-caps 4096,256 --kv-tokens $KV --levels "$LEVELS" \
  $SHAPE $THRESHOLD --tag "$B" --out "$OUT/$B" --deadline-s $((BUDGET - 50 - SECONDS))
archive
