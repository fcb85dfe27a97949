#!/usr/bin/env bash
# Developer tool: sweep the CUDA dispatch's ring-tier knobs with fnbench on a GPU. Needs a
# build configured with -DFNORM_TUNING=ON (BUILD, default build-tune). Each configuration is
# one line "label ENV=VALUE ..." in the file given as $1 (or on stdin); the rows of every
# configuration go to $OUT/sweep.csv with the label in the first column.
#   scripts/tune_sweep.sh configs.txt
# Each line is killed (SIGKILL: a process waiting on a kernel that never ends does not exit on
# SIGTERM) after SWEEP_LINE_TIMEOUT seconds (default 300), and the sweep goes on.
set -uo pipefail
OUT=${OUT:-$PWD/out}
BUILD=${BUILD:-build-tune}
mkdir -p "$OUT"
: >"$OUT/sweep.csv"
while read -r label rest; do
  [ -z "$label" ] || [ "${label#\#}" != "$label" ] && continue
  args=() envs=()
  for w in $rest; do
    case $w in
    FNORM_TUNE_*=*) envs+=("$w") ;;
    *) args+=("$w") ;;
    esac
  done
  echo "== $(date -u +%H:%M:%S) $label ${envs[*]} ${args[*]}"
  env "${envs[@]}" timeout -s KILL "${SWEEP_LINE_TIMEOUT:-300}" "$BUILD/bench/fnbench" --quiet \
    --csv "$OUT/tmp.csv" "${args[@]}" \
    >/dev/null 2>"$OUT/tmp.err" || { echo "   rc=$? $(tail -2 "$OUT/tmp.err")"; }
  [ -f "$OUT/tmp.csv" ] && sed "s/^/$label,/" "$OUT/tmp.csv" >>"$OUT/sweep.csv"
  rm -f "$OUT/tmp.csv"
done <"${1:-/dev/stdin}"
