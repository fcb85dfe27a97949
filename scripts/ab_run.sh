#!/usr/bin/env bash
# Developer tool: an A/B run of two release builds on one GPU, fnbench alternated T0 T1 T1 T0 at
# each element count, so that the machine's drift falls on both builds alike (how every "A/B run"
# of bench/RESULTS.md was made).
#
# T1 is this tree; T0 is this tree with the files under $T0_DIR laid over it (the device copy of
# the repository has no .git, so the old files travel beside it). Here, before the device call:
#   scripts/ab_run.sh prepare HEAD~1 src/cuda/forward.cu      # writes ab-t0/src/cuda/forward.cu
# (ab-t0/ is git-ignored: name it in the device call's carry), then on the GPU machine:
#   ELEMS="33554432 134217728" ARGS="--ops ln-fwd --dtypes bf16,fp16 --n 65536" \
#     scripts/ab_run.sh run
# Optional: LABEL (the CSV's name, default ab), ARCH (default 90-real), JOBS (per build, default
# half the cores), TEST_FILTER (;-separated --filter strings run on T1 afterwards), QUICK=1 (T1's
# --quick suite afterwards). Writes $OUT/$LABEL.csv (fnbench's rows, the first column
# t0-aE / t1-aE) and prints each cell's percentages of the copy and the mean difference.
set -uo pipefail
OUT=${OUT:-$PWD/out}
T0_DIR=${T0_DIR:-ab-t0}

if [ "${1:-}" = prepare ]; then
  [ $# -ge 3 ] || { echo "usage: $0 prepare REV FILE..." >&2; exit 2; }
  rev=$2
  shift 2
  # Start afresh: files left by an earlier prepare would be laid over T0 too.
  rm -rf "$T0_DIR"
  for f in "$@"; do
    mkdir -p "$T0_DIR/$(dirname "$f")"
    git show "$rev:$f" >"$T0_DIR/$f" || exit 1
  done
  echo "T0 files from $rev in $T0_DIR/: $*"
  exit 0
fi
[ "${1:-}" = run ] || { echo "usage: $0 prepare REV FILE... | $0 run" >&2; exit 2; }
[ -d "$T0_DIR" ] || { echo "$0: no $T0_DIR/ (run '$0 prepare' here and carry it)" >&2; exit 2; }
if [ -z "${ELEMS:-}" ] || [ -z "${ARGS:-}" ]; then
  echo "$0: set ELEMS (element counts) and ARGS (fnbench's cell options)" >&2
  exit 2
fi
mkdir -p "$OUT"
LABEL=${LABEL:-ab}
ARCH=${ARCH:-90-real}
JOBS=${JOBS:-$(($(nproc) / 2 > 0 ? $(nproc) / 2 : 1))}
start=$SECONDS
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader

# T0's source: a copy of this tree without its build folders, the old files laid over it.
src0=$(mktemp -d)
tar --exclude='./build*' --exclude="./$T0_DIR" -cf - . | tar -xf - -C "$src0"
cp -r "$T0_DIR/." "$src0/"
build() {
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFNORM_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" >"$3" 2>&1 && cmake --build "$2" -j "$JOBS" >>"$3" 2>&1
}
rm -rf build-ab-t0 # its cache names an earlier run's temporary source folder
build "$src0" build-ab-t0 "$OUT/ab-t0-build.log" &
pid0=$!
build . build-ab-t1 "$OUT/ab-t1-build.log"
rc1=$?
wait $pid0
rc0=$?
echo "builds: T0 rc=$rc0, T1 rc=$rc1 ($((SECONDS - start)) s)"
if [ $rc0 -ne 0 ] || [ $rc1 -ne 0 ]; then
  tail -n 20 "$OUT"/ab-t*-build.log
  exit 1
fi

csv="$OUT/$LABEL.csv"
: >"$csv"
for e in $ELEMS; do
  for t in t0 t1 t1 t0; do
    # shellcheck disable=SC2086 # ARGS is a list of options
    "build-ab-$t/bench/fnbench" $ARGS --elements "$e" --quiet --csv "$OUT/ab-cell.csv" \
      >/dev/null 2>>"$OUT/ab-fnbench.err" || echo "fnbench $t at $e: rc=$?"
    sed "s/^/$t-a$e,/" "$OUT/ab-cell.csv" >>"$csv"
  done
done
echo "fnbench done ($((SECONDS - start)) s)"
python3 - "$csv" <<'EOF'
import collections, csv, sys
cells = collections.defaultdict(lambda: {"t0": [], "t1": []})
status = collections.defaultdict(set)
for row in csv.reader(open(sys.argv[1])):
    if row[1] == "device":
        continue
    build, elements = row[0].split("-a")
    key = (row[2], row[3], row[4], row[5], row[6], elements)
    cells[key][build].append(100 * float(row[11]))
    status[key].add(row[13])
for key, v in cells.items():
    t0, t1 = v["t0"], v["t1"]
    diff = sum(t1) / len(t1) - sum(t0) / len(t0) if t0 and t1 else float("nan")
    print("%s %s/%s M=%s N=%s E=%s: t0 %s, t1 %s, t1 - t0 %+.1f points %s" % (
        *key, " ".join("%.1f" % x for x in t0), " ".join("%.1f" % x for x in t1), diff,
        ",".join(sorted(status[key]))))
EOF
if [ -n "${TEST_FILTER:-}" ]; then
  IFS=';' read -ra filters <<<"$TEST_FILTER"
  : >"$OUT/ab-tests.log"
  for f in "${filters[@]}"; do
    build-ab-t1/tests/fnorm_tests --filter "$f" >>"$OUT/ab-tests.log" 2>&1
    echo "T1 tests --filter '$f': rc=$? $(tail -1 "$OUT/ab-tests.log") ($((SECONDS - start)) s)"
  done
fi
if [ -n "${QUICK:-}" ]; then
  build-ab-t1/tests/fnorm_tests --quick >"$OUT/ab-quick.log" 2>&1
  echo "T1 --quick: rc=$? $(tail -1 "$OUT/ab-quick.log") ($((SECONDS - start)) s)"
fi
rm -rf "$src0"
echo "end ($((SECONDS - start)) s)"
