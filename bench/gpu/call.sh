# Sourced by live.sh and depth.sh, the device calls: how they run run.py and bring back what
# it wrote. A call returns at most eight files, so everything goes back as one archive,
# $OUT/all.tgz: each half's files in a folder named by its tag, as bench/gpu/raw/ keeps them,
# and its console as TAG.out. SUMMARY (set by the caller): the console lines worth printing.
# The device ends a call that runs past its limit with SIGTERM. run.py then stops its servers
# and writes what ran (harness.CutOff), and the archive is made all the same (exit 124, as the
# device's limit reports it).
# setup.sh installs a stage's packages once per machine: one stage per release (and per release
# whose builds the pack carries instead: on_builds.sh), named by harness.carried_stage.
STAGE=$HOME/$(python3 -c 'import sys; sys.path.insert(0, "bench/gpu"); import harness; print(harness.carried_stage())')
export STAGE
RUNNING=
archive() {
  grep -h "$SUMMARY" "$OUT"/*.out | tail -60
  (cd "$OUT" && tar czf all.tgz -- * && find . -mindepth 1 ! -name all.tgz -delete)
}
cut_off() {
  echo "cut off by the device's limit after ${SECONDS} s" >&2
  if [ -n "$RUNNING" ]; then kill -TERM "$RUNNING" 2>/dev/null; wait "$RUNNING"; fi
  archive
  exit 124
}
trap cut_off TERM
# run_py CONSOLE ARGS...: bench/gpu/run.py ARGS, its console in CONSOLE. In the background and
# awaited, because bash runs a trap only once a command in the foreground has ended.
run_py() {
  local console=$1
  shift
  python3 bench/gpu/run.py "$@" > "$console" 2>&1 &
  RUNNING=$!
  wait "$RUNNING"
  RUNNING=
}
