#!/usr/bin/env bash
# Sets everything up and runs every test: the C++ suite (CTest), the check that
# committed PyTorch fixtures still match a fresh generation, the Python suite,
# the wheel, then AddressSanitizer/UBSan and fuzzing. On a Debian 12 host (as
# root) it then runs the same suite on Debian 13 through scripts/debian13.sh
# (whose root it prepares in the background meanwhile), without the sanitizer
# and fuzzing builds and the wheel, which run once, here.
#
# Environment:
#   SEQPACK_TEST_DEBIAN13=0   skip the Debian 13 suite (default: 1 on Debian 12 as root)
#   SEQPACK_TEST_SANITIZERS=0 skip the sanitizer and fuzzing builds
#   SEQPACK_TEST_WHEEL=0      skip the wheel (the Debian 13 suite does: CI's time)
#   SEQPACK_TEST_ISA_CAPS=0   skip the ISA-capped comparisons with PyTorch
#                             (scripts/test_isa_caps.sh; the Debian 13 suite does)
#   SEQPACK_TEST_CUDA=0       skip compiling the CUDA library (scripts/build_cuda.sh),
#                             the device check's run without a GPU, and the CUDA
#                             kernels' CPU emulation in pytest (the Debian 13 suite does)
#   SEQPACK_TEST_CUDA_COMPILE=1 with SEQPACK_TEST_CUDA=0: still run the CUDA operators
#                             under torch.compile through their CPU emulation (the
#                             Debian 13 suite does: torch.compile's fakes need PyTorch 2.4+)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${SEQPACK_BUILD_DIR:-build}
codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
start=$(date +%s)
stage() { echo "== [$(( $(date +%s) - start )) s] $* =="; }

DEBIAN13=${SEQPACK_TEST_DEBIAN13:-}
if [ -z "$DEBIAN13" ]; then
  DEBIAN13=0
  if [ "$codename" = bookworm ] && [ "$(id -u)" -eq 0 ]; then DEBIAN13=1; fi
fi

stage "setup: packages"
SEQPACK_SETUP_PACKAGES_ONLY=1 bash scripts/setup.sh
if [ "$DEBIAN13" = 1 ]; then
  # The Debian 13 root (debootstrap and its packages: mostly downloads) is
  # made while this machine builds; its log goes to a file.
  mkdir -p "$BUILD_DIR"
  prepare_log=$PWD/$BUILD_DIR/debian13-prepare.log
  SEQPACK_DEBIAN13_REFRESH=1 bash scripts/debian13.sh true >"$prepare_log" 2>&1 &
  prepare_pid=$!
fi

stage "setup: build"
bash scripts/setup.sh

stage "versions: $(. /etc/os-release && echo "$PRETTY_NAME"), $(uname -m)"
# What this stage tests with (a fresh machine may get newer ones: the Debian 13
# root is brought up to date before its stage, scripts/debian13.sh).
dpkg-query -W -f='  ${Package} ${Version}\n' python3-torch libdnnl-dev libhwy-dev g++ \
  python3 libopenblas-dev 2>/dev/null || true
PYTHONPATH="$PWD/$BUILD_DIR/python" /usr/bin/python3 -c '
import seqpack, torch
info = seqpack.cpu_info()
print("  torch", torch.__version__, "| oneDNN", info["onednn_version"], "ISA", info["isa"], "| seqpack kernels",
      info["kernels"], "| bf16", info["bf16"], "| int8", info["int8_kernel"])' || true

stage "fixtures: regenerate with PyTorch and compare with the committed ones"
/usr/bin/python3 scripts/check_fixtures.py

stage "C++ tests (CTest)"
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$(nproc)")

# The Python suite's files spread over one worker process per core
# (pytest-xdist): most of its time is one core's Python.
pytest_jobs=()
if /usr/bin/python3 -c 'import xdist' 2>/dev/null; then pytest_jobs=(-n "$(nproc)"); fi
export SEQPACK_PYTEST_JOBS="${pytest_jobs[*]}"  # scripts/test_wheel.sh's suite too

if [ -d python/tests ]; then
  stage "Python tests (pytest)"
  PYTHONPATH="$PWD/$BUILD_DIR/python:$PWD/python${PYTHONPATH:+:$PYTHONPATH}" \
    /usr/bin/python3 -m pytest -q "${pytest_jobs[@]}" python/tests
  if [ "${SEQPACK_TEST_CUDA:-1}" = 0 ] && [ "${SEQPACK_TEST_CUDA_COMPILE:-0}" = 1 ]; then
    stage "CUDA operators under torch.compile, through their CPU emulation"
    PYTHONPATH="$PWD/$BUILD_DIR/python:$PWD/python${PYTHONPATH:+:$PYTHONPATH}" SEQPACK_TEST_CUDA=1 \
      /usr/bin/python3 -m pytest -q python/tests/test_cuda_cpp_ops.py -k compile
  fi
fi

if [ "${SEQPACK_TEST_ISA_CAPS:-1}" = 1 ]; then
  stage "ISA caps: the comparisons with PyTorch on other code paths (docs/testing.md)"
  SEQPACK_BUILD_DIR=$BUILD_DIR bash scripts/test_isa_caps.sh
fi

if [ "${SEQPACK_TEST_CUDA:-1}" = 1 ]; then
  stage "CUDA: the library compiled (sm_80, sm_90, warnings as errors), the device check without a GPU"
  # No GPU here: the kernels run on the GPU machine (scripts/device_check.sh,
  # docs/gpu.md); pytest ran them through their CPU emulation above.
  bash scripts/build_cuda.sh
  device_out=$(mktemp -d)
  OUT=$device_out bash scripts/device_check.sh >"$device_out/run.log" 2>&1 || {
    tail -n 40 "$device_out/run.log"
    echo "test: scripts/device_check.sh failed without a GPU (log: $device_out/run.log)" >&2
    exit 1
  }
  rm -rf "$device_out"
fi

if [ "${SEQPACK_TEST_WHEEL:-1}" = 1 ]; then
  stage "pip: the wheel in a virtual environment, the Python suite against it from outside the tree"
  # Built beside build/ through ccache (when setup.sh used it), so the library's
  # objects come from the cache rather than from a second compilation.
  if [ "${SEQPACK_CCACHE:-1}" = 1 ] && command -v ccache >/dev/null; then
    mkdir -p build-wheel  # before test_wheel.sh notes the tree's state
    SEQPACK_WHEEL_BUILD_DIR=$PWD/build-wheel CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} \
      CCACHE_NOHASHDIR=1 CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache \
      bash scripts/test_wheel.sh
  else
    bash scripts/test_wheel.sh
  fi
fi

if [ "${SEQPACK_TEST_SANITIZERS:-1}" = 1 ]; then
  stage "C++ tests again under AddressSanitizer + UndefinedBehaviorSanitizer"
  bash scripts/test_sanitize.sh

  stage "fuzzing: each libFuzzer target for a short fixed time"
  SEQPACK_FUZZ_SECONDS=${SEQPACK_FUZZ_SECONDS:-30} SEQPACK_FUZZ_SEED=${SEQPACK_FUZZ_SEED:-1} \
    bash scripts/fuzz.sh
fi

if [ "$DEBIAN13" = 1 ]; then
  stage "Debian 13: preparing its root (log: $prepare_log)"
  if ! wait "$prepare_pid"; then
    tail -n 40 "$prepare_log"
    echo "test: making the Debian 13 root failed (log: $prepare_log)" >&2
    exit 1
  fi
  stage "Debian 13 (PyTorch 2.6, oneDNN 3.7, Python 3.13, GCC 14): the same suite"
  SEQPACK_TEST_SANITIZERS=0 SEQPACK_TEST_WHEEL=0 SEQPACK_TEST_DEBIAN13=0 SEQPACK_TEST_ISA_CAPS=0 \
    SEQPACK_TEST_CUDA=0 SEQPACK_TEST_CUDA_COMPILE=1 \
    bash scripts/debian13.sh bash scripts/test.sh
fi
stage "all tests passed"
