#!/usr/bin/env bash
# Builds the libFuzzer targets (the release's clang, ASan + UBSan) into build-fuzz/ and runs
# each for a short fixed time from the seed corpus under fuzz/corpus/<target>/.
#
# Inputs libFuzzer finds interesting go to a scratch corpus in the build
# directory, never into the repository. A crash stops the script with the
# crashing input saved as build-fuzz/artifacts/<target>-crash-*; replay it with
#   build-fuzz/fuzz/fuzz_<target> build-fuzz/artifacts/<target>-crash-...
# then add it to fuzz/regressions/<target>/ and a test to tests/test_regressions.cpp.
#
# Usage: bash scripts/fuzz.sh [target...]      (default: every target)
#   SEQPACK_FUZZ_SECONDS    seconds per target (default 60)
#   SEQPACK_FUZZ_BUILD_DIR  build directory (default build-fuzz)
#   SEQPACK_FUZZ_SEED       libFuzzer's -seed (default 0: a new random seed each run);
#                           scripts/test.sh fixes it, so a CI run explores the same inputs
#                           in the same order on every machine (a faster one goes further)
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET=${SEQPACK_FUZZ_SECONDS:-60}
BUILD_DIR=${SEQPACK_FUZZ_BUILD_DIR:-build-fuzz}
SEED=${SEQPACK_FUZZ_SEED:-0}
JOBS=${SEQPACK_JOBS:-$(nproc)}
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(safetensors tsv_vocabulary packing model_files)

CLANG_VERSION=$(bash scripts/clang_version.sh)
# -O1 -g1 (line tables): the stacks of a report, at half the compile time of -O2 -g.
CC=clang-$CLANG_VERSION CXX=clang++-$CLANG_VERSION cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  -DSEQPACK_BUILD_FUZZERS=ON -DSEQPACK_BUILD_TESTS=OFF -DSEQPACK_BUILD_CLI=OFF \
  -DSEQPACK_BUILD_EXAMPLES=OFF -DSEQPACK_BUILD_PYTHON=OFF -DSEQPACK_BUILD_BENCHMARKS=OFF \
  >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]/#/fuzz_}"

# Leak detection needs LeakSanitizer, which some containers forbid (ptrace).
detect_leaks=1
if ! ASAN_OPTIONS=detect_leaks=1 "$BUILD_DIR/fuzz/fuzz_${TARGETS[0]}" -runs=0 >/dev/null 2>&1; then
  detect_leaks=0
  echo "fuzz: LeakSanitizer does not run here; leak detection off"
fi
export ASAN_OPTIONS="detect_leaks=${detect_leaks}:abort_on_error=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

mkdir -p "$BUILD_DIR/artifacts"
for t in "${TARGETS[@]}"; do
  scratch="$BUILD_DIR/corpus/$t"
  mkdir -p "$scratch"
  dict=()
  [ -f "fuzz/$t.dict" ] && dict=(-dict="fuzz/$t.dict")
  echo "== fuzz_$t: ${SECONDS_PER_TARGET} s, seed ${SEED} =="
  # -timeout: one input taking over 10 s is a finding (a hang), not slowness.
  "$BUILD_DIR/fuzz/fuzz_$t" "${dict[@]}" -max_total_time="$SECONDS_PER_TARGET" -seed="$SEED" -timeout=10 \
    -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="$BUILD_DIR/artifacts/$t-" "$scratch" "fuzz/corpus/$t" \
    2>"$BUILD_DIR/fuzz_$t.log" || {
      tail -n 60 "$BUILD_DIR/fuzz_$t.log"
      echo "fuzz: fuzz_$t found a crash; input saved under $BUILD_DIR/artifacts/" >&2
      exit 1
    }
  grep -E "^stat::number_of_executed_units|^stat::new_units_added|Done [0-9]+ runs" \
    "$BUILD_DIR/fuzz_$t.log" || true
done
