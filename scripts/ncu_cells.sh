#!/usr/bin/env bash
# Developer tool: Nsight Compute reports of single fnbench cells on a GPU. Each line of the
# file given as $1 is "label KERNEL_REGEX fnbench-args..."; the report of the 12th matching
# launch (past warm-up and the correctness check) goes to $OUT/ncu-LABEL.txt. Clocks are left
# alone (--clock-control none), as the device notes ask.
#   scripts/ncu_cells.sh cells.txt
set -uo pipefail
OUT=${OUT:-$PWD/out}
BUILD=${BUILD:-build-dev}
mkdir -p "$OUT"
while read -r label regex rest; do
  [ -z "$label" ] || [ "${label#\#}" != "$label" ] && continue
  echo "== $(date -u +%H:%M:%S) ncu $label"
  # shellcheck disable=SC2086
  timeout 120 ncu --clock-control none -k "regex:$regex" --launch-skip 11 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats \
    "$BUILD/bench/fnbench" --quiet --iters 20 $rest >"$OUT/ncu-$label.txt" 2>&1 ||
    echo "   rc=$?"
  grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occ|Registers Per|Block Limit|Issued Warp|No Eligible|Executed Instructions|Stall" \
    "$OUT/ncu-$label.txt" | head -20
done <"${1:-/dev/stdin}"
