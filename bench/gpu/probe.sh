#!/usr/bin/env bash
# A probe of a release with no live check, in one short device call, on the GPU machine:
#   device run, carry [".gpu"] (pack.sh VERSION first; on_builds.sh DONOR for its code on
#   another release's builds), command: bash bench/gpu/probe.sh TAG
# Do plain-default and gated-v2 start on the image, and serve? Side by side, the accept pair,
# C=8, one repeat. A server that cannot import its kernels dies within seconds, and its record
# keeps the line it died on (last_error_line). Catalogued with purpose `probe` (section live),
# the run puts what it found, and the builds it ran on, into the release's VERSIONS.md cell.
# Everything comes back as one archive, $OUT/all.tgz (call.sh).
# Time: setup and the weights about 70 s cold; two servers 60-150 s to start; a pass at C=8 a
# few seconds: run.py's deadline (165 s after its start) ends a slow call well inside 600 s.
# PROBE_DEADLINE_S (default 165): a shorter deadline, for a call that little device time is
# left for; a server still starting 30 s before it is recorded as cut off while starting, and
# the probe's VERSIONS.md cell says so (not that it died).
set -u
TAG=${1:?usage: probe.sh TAG}
SUMMARY="tok/s\|healthy\|refus\|Error\|error:\|cut off\|did not start"
source bench/gpu/call.sh
source .gpu/kit/setup.sh 56
mkdir -p "$OUT/$TAG"
run_py "$OUT/$TAG.out" --servers plain-default:accept,gated-v2:accept --side-by-side --start-together \
  --plain-caps 4096,256 --threshold 56 --levels 8 --repeats 1 --tag "$TAG" --out "$OUT/$TAG" --deadline-s "${PROBE_DEADLINE_S:-165}"
archive
