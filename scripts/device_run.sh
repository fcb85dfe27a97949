#!/usr/bin/env bash
# One call on a GPU machine: build, test, sanitize and benchmark, in the steps named on the
# command line (default: all). Logs and results go under $OUT (default ./out), so that the
# lent-device workflow brings them back; the same script works on any CUDA machine.
#   scripts/device_run.sh build test sanitize bench graph compare pytest
# (test runs the whole suite, TEST_ARGS its options, with --verbose so that a run cut short by its
# time limit still says how many cases passed and which came last: the whole suite takes more than
# 20 minutes on an H200 (session 42: two shards each ran past 575 s inside cuda-sizes), so split
# it over four calls or more, e.g. TEST_ARGS="--shard 0/4" ... "--shard 3/4", reusing the build
# while the machine stays warm.)
# Tuning (developer builds with -DFNORM_TUNING=ON in $TUNE_BUILD, default build-tune):
#   TUNE_TESTS="FNORM_TUNE_X=1;FNORM_TUNE_Y=2" SWEEP=bench/tune/sweepN.txt \
#     scripts/device_run.sh tunebuild tunetest sweep
# (tunetest runs the tests once for each ;-separated set of knobs, with the set's other words as
# the tests' arguments, --quick when it has none; tunerace runs racecheck over the --quick cases
# matching TUNE_RACE_FILTER with the knobs in TUNE_RACE_KNOBS.)
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-dev}
JOBS=$(nproc)
steps=${*:-build test sanitize bench graph compare pytest}
note() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$OUT/summary.txt"; }

nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv \
  >"$OUT/gpu.txt" 2>&1
for step in $steps; do
  case $step in
  build)
    note "build"
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFNORM_CUDA=ON \
      >"$OUT/build.log" 2>&1 && cmake --build "$BUILD" -j "$JOBS" >>"$OUT/build.log" 2>&1
    note "build rc=$?"
    tail -3 "$OUT/build.log"
    ;;
  test)
    note "tests"
    # shellcheck disable=SC2086 # TEST_ARGS is a list of options
    timeout "${TEST_TIMEOUT:-560}" stdbuf -oL "$BUILD/tests/fnorm_tests" --verbose ${TEST_ARGS:-} \
      >"$OUT/tests.log" 2>&1
    rc=$?
    note "tests rc=$rc"
    if [ $rc -eq 124 ]; then
      note "cut short: $(grep -c '^ok ' "$OUT/tests.log") cases passed, last: $(grep '^ok ' \
        "$OUT/tests.log" | tail -1 | cut -c1-160)"
    fi
    grep -E "FAIL|skipped|passed" "$OUT/tests.log" | tail -40
    ;;
  sanitize)
    # memcheck over the --quick CUDA cases; racecheck (slow) over those of a few row lengths
    # (comma list of test-name substrings: 1024 warp/ring tiers, 4096 one CTA a row, 16384 a
    # cluster a row, 802816 the streaming (fp32) and staged (bf16) forward).
    note "compute-sanitizer memcheck --filter ${SAN_FILTER:-cuda}"
    timeout ${SAN_TIMEOUT:-300} compute-sanitizer --tool memcheck --error-exitcode 9 \
      "$BUILD/tests/fnorm_tests" --quick --filter "${SAN_FILTER:-cuda}" >"$OUT/sanitize_memcheck.log" 2>&1
    note "memcheck rc=$?"
    tail -3 "$OUT/sanitize_memcheck.log"
    IFS=, read -ra race_filters <<<"${RACE_FILTER:-N=1024 M,N=4096 M,N=16384 M,N=802816 M}"
    for filter in "${race_filters[@]}"; do
      note "compute-sanitizer racecheck --filter '$filter'"
      timeout ${SAN_TIMEOUT:-300} compute-sanitizer --tool racecheck --error-exitcode 9 \
        "$BUILD/tests/fnorm_tests" --quick --filter "$filter" >>"$OUT/sanitize_racecheck.log" 2>&1
      note "racecheck rc=$?"
      tail -3 "$OUT/sanitize_racecheck.log"
    done
    ;;
  bench)
    note "fnbench ${BENCH_ARGS:---preset main}"
    timeout 540 "$BUILD/bench/fnbench" ${BENCH_ARGS:---preset main} --csv "$OUT/fnbench.csv" \
      --markdown >"$OUT/fnbench.md" 2>"$OUT/fnbench.err"
    note "fnbench rc=$?"
    cat "$OUT/fnbench.md"
    ;;
  graph)
    note "fnbench graph preset"
    timeout 120 "$BUILD/bench/fnbench" --preset graph --csv "$OUT/fnbench_graph.csv" \
      --markdown >"$OUT/fnbench_graph.md" 2>&1
    note "graph rc=$?"
    cat "$OUT/fnbench_graph.md"
    ;;
  compare)
    note "compare.py ${COMPARE_ARGS:-}"
    FUSEDNORM_LIBRARY=$PWD/$BUILD/libfusednorm.so PYTHONPATH=$PWD/python:${PYTHONPATH:-} \
      timeout 540 python3 bench/compare.py --out "$OUT" ${COMPARE_ARGS:-} >"$OUT/compare.log" 2>&1
    note "compare rc=$?"
    tail -60 "$OUT/compare.log"
    ;;
  pytest)
    note "pytest"
    FUSEDNORM_LIBRARY=$PWD/$BUILD/libfusednorm.so PYTHONPATH=$PWD/python:${PYTHONPATH:-} \
      timeout 400 python3 -m pytest -q -x python/tests ${PYTEST_ARGS:-} >"$OUT/pytest.log" 2>&1
    note "pytest rc=$?"
    tail -30 "$OUT/pytest.log"
    ;;
  tunebuild)
    note "tuning build"
    cmake -S . -B "${TUNE_BUILD:-build-tune}" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFNORM_CUDA=ON \
      -DFNORM_TUNING=ON >"$OUT/tunebuild.log" 2>&1 &&
      cmake --build "${TUNE_BUILD:-build-tune}" -j "$JOBS" >>"$OUT/tunebuild.log" 2>&1
    note "tuning build rc=$?"
    tail -3 "$OUT/tunebuild.log"
    ;;
  tunetest)
    IFS=';' read -ra knob_sets <<<"${TUNE_TESTS:-}"
    for set in "${knob_sets[@]}"; do
      envs=() args=()
      for w in $set; do
        case $w in
        FNORM_TUNE_*=*) envs+=("$w") ;;
        *) args+=("$w") ;;
        esac
      done
      [ ${#args[@]} -gt 0 ] || args=(--quick)
      note "tests ${args[*]} with ${envs[*]}"
      env "${envs[@]}" timeout 300 "${TUNE_BUILD:-build-tune}/tests/fnorm_tests" "${args[@]}" \
        >>"$OUT/tunetest.log" 2>&1
      note "tests rc=$?"
      tail -1 "$OUT/tunetest.log"
    done
    ;;
  tunerace)
    # racecheck of the tuning build's --quick cases matching TUNE_RACE_FILTER under the knobs
    # in TUNE_RACE_KNOBS (space-separated FNORM_TUNE_X=V words)
    note "racecheck --filter '${TUNE_RACE_FILTER:-}' with ${TUNE_RACE_KNOBS:-}"
    # shellcheck disable=SC2086 # the knobs are words
    env ${TUNE_RACE_KNOBS:-} timeout "${SAN_TIMEOUT:-300}" compute-sanitizer --tool racecheck \
      --error-exitcode 9 "${TUNE_BUILD:-build-tune}/tests/fnorm_tests" --quick \
      --filter "${TUNE_RACE_FILTER:-}" >>"$OUT/tune_racecheck.log" 2>&1
    note "racecheck rc=$?"
    tail -3 "$OUT/tune_racecheck.log"
    ;;
  sweep)
    note "sweep ${SWEEP:-(none)}"
    OUT="$OUT" BUILD="${TUNE_BUILD:-build-tune}" timeout 540 scripts/tune_sweep.sh "$SWEEP" \
      >"$OUT/sweep.log" 2>&1
    note "sweep rc=$?"
    tail -5 "$OUT/sweep.log"
    ;;
  *) note "unknown step $step" ;;
  esac
done
