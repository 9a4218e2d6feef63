#!/usr/bin/env bash
# Builds seqpack with AddressSanitizer + UndefinedBehaviorSanitizer into
# build-asan/ and runs the whole CTest suite under them.
#
# The Python extension stays off: an ASan-instrumented extension would need
# libasan preloaded into CPython and torch, which report their own leaks and
# false positives. -O1 -g1 (ASan's recommended optimisation, line tables
# only) gives sanitizer reports file:line stacks and compiles in about half
# the time of RelWithDebInfo's -O2 -g (a test file: 15 s against 30 s), which
# is most of this script's time.
#
# Usage: bash scripts/test_sanitize.sh [extra cmake args]
#   SEQPACK_ASAN_BUILD_DIR  build directory (default build-asan)
#   SEQPACK_JOBS            parallel build/test jobs (default nproc)
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${SEQPACK_ASAN_BUILD_DIR:-build-asan}
JOBS=${SEQPACK_JOBS:-$(nproc)}
start=$(date +%s)


# LeakSanitizer needs ptrace-like access to stop the process; it is unavailable
# under some containers and debuggers ("LeakSanitizer has encountered a fatal
# error"). Probe it once and keep leak detection only where it works, saying so,
# rather than failing every test for a reason that is not seqpack's.
detect_leaks=1
probe_dir=$(mktemp -d)
trap 'rm -rf "$probe_dir"' EXIT
printf 'int main() { return 0; }\n' >"$probe_dir/probe.cpp"
if ${CXX:-c++} -fsanitize=address "$probe_dir/probe.cpp" -o "$probe_dir/probe" 2>/dev/null; then
  if ! ASAN_OPTIONS=detect_leaks=1 "$probe_dir/probe" >"$probe_dir/out" 2>&1; then
    detect_leaks=0
    echo "test_sanitize: LeakSanitizer does not run here ($(head -c 200 "$probe_dir/out" | tr '\n' ' ')); leak detection off"
  fi
fi

export ASAN_OPTIONS="detect_leaks=${detect_leaks}:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:abort_on_error=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# Exported before the build too: gtest_discover_tests runs each test binary
# at build time.
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  -DSEQPACK_SANITIZE=ON \
  -DSEQPACK_BUILD_TESTS=ON -DSEQPACK_BUILD_CLI=ON -DSEQPACK_BUILD_PYTHON=OFF \
  -DSEQPACK_BUILD_BENCHMARKS=OFF -DSEQPACK_BUILD_EXAMPLES=ON "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
built=$(date +%s)
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$JOBS")
end=$(date +%s)
echo "test_sanitize: build $((built - start)) s, tests $((end - built)) s, total $((end - start)) s"
