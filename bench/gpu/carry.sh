#!/usr/bin/env bash
# Makes room in the working tree for a device call, and puts it back after. A call carries
# the tree and a release's pack (.gpu, 45-53 MB of the 64 MiB carry); the committed raw
# results and the gallery (about 35 MB together) do not fit beside it.
#   bash bench/gpu/carry.sh out [RUN ...]   move bench/gpu/raw and docs/gallery to the hold,
#                                           and put each RUN's rows_RUN.json.gz in the tree's
#                                           root first (what DEPTH_ROWS_FROM names)
#   bash bench/gpu/carry.sh in              bring them back; the root's copies of rows go
# The hold is CARRY_HOLD, by default a folder beside the checkout (never inside it: the carry
# would take it along). Nothing is overwritten: each step refuses what would replace a file.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
HOLD=${CARRY_HOLD:-$(dirname "$ROOT")/$(basename "$ROOT")-carry-hold}
MOVED=(bench/gpu/raw docs/gallery)
fail() { echo "carry.sh: $*" >&2; exit 2; }
case "${1:-}" in
  out)
    shift
    [ -e "$HOLD" ] && fail "$HOLD already holds a tree's results: run 'carry.sh in' first"
    for run in "$@"; do
      rows=bench/gpu/raw/$run/rows_$run.json.gz
      [ -f "$rows" ] || fail "no committed rows for run $run ($rows)"
      [ -e "rows_$run.json.gz" ] && fail "rows_$run.json.gz is already in the tree's root"
    done
    for run in "$@"; do cp "bench/gpu/raw/$run/rows_$run.json.gz" .; done
    mkdir -p "$HOLD"
    for path in "${MOVED[@]}"; do
      mkdir -p "$HOLD/$(dirname "$path")"
      mv "$path" "$HOLD/$path"
    done
    echo "carry.sh: ${MOVED[*]} held in $HOLD${1:+; in the root: $(cd "$ROOT" && ls rows_*.json.gz | tr '\n' ' ')}"
    ;;
  in)
    [ -d "$HOLD" ] || fail "nothing is held ($HOLD does not exist)"
    for path in "${MOVED[@]}"; do
      [ -e "$path" ] && fail "$path is in the tree again: move it away or compare it with $HOLD/$path"
    done
    for path in "${MOVED[@]}"; do mv "$HOLD/$path" "$path"; done
    find "$HOLD" -depth -type d -empty -delete  # only the folders `out` made, now empty
    # only the copies `out` made: a committed run's rows, never another file of the root
    for rows in rows_*.json.gz; do
      [ -e "$rows" ] || continue
      run=${rows#rows_}
      run=${run%.json.gz}
      cmp -s "$rows" "bench/gpu/raw/$run/rows_$run.json.gz" && rm "$rows"
    done
    echo "carry.sh: ${MOVED[*]} back in the tree"
    ;;
  *)
    fail "usage: carry.sh out [RUN ...] | carry.sh in"
    ;;
esac
