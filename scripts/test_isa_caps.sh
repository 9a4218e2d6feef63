#!/usr/bin/env bash
# The comparisons against PyTorch again with PyTorch, oneDNN and seqpack's own
# kernels forced onto other code paths (docs/testing.md), so that no CPU the
# project meets can fail them: the fixture check (fixtures generated on one CPU,
# regenerated here on other paths), the C++ parity tests against those
# fixtures, and the Python parity tests against torch.nn run live.
#
# Two passes take every cap the project tests:
#   1. ATEN_CPU_CAPABILITY=default  ONEDNN_MAX_CPU_ISA=AVX2         SEQPACK_MAX_CPU_ISA=avx2
#   2. ATEN_CPU_CAPABILITY=avx2     ONEDNN_MAX_CPU_ISA=AVX512_CORE  SEQPACK_MAX_CPU_ISA=sse4
# On a CPU with AVX-512 the uncapped run (scripts/test.sh) covers the widest
# paths. A cap above what the CPU has changes nothing, so the script passes on
# smaller CPUs too. Needs a build in $SEQPACK_BUILD_DIR (default build/).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${SEQPACK_BUILD_DIR:-build}
# The C++ tests that compare with PyTorch's fixtures, and the fast path against
# the float64 reference (seqpack's kernels on the capped paths).
CTEST_TESTS='RNNParity\.|RNNFastVsReference\.|CharClassifier\.TorchWrittenModelGivesTorchLogits'
PYTESTS=(python/tests/test_torch.py python/tests/test_nn.py python/tests/test_torch_ops.py
         python/tests/test_torch_parity_grid.py)

run_pass() {
  local label=$1
  shift
  echo "== ISA caps: $label =="
  env "$@" /usr/bin/python3 scripts/check_fixtures.py --computed-only
  (cd "$BUILD_DIR" && env "$@" ctest --output-on-failure -j "$(nproc)" -R "$CTEST_TESTS")
  env "$@" PYTHONPATH="$PWD/$BUILD_DIR/python:$PWD/python${PYTHONPATH:+:$PYTHONPATH}" \
    /usr/bin/python3 -m pytest -q -p no:cacheprovider ${SEQPACK_PYTEST_JOBS:-} "${PYTESTS[@]}" \
    -k "not test_every_highway_target"  # (its own caps: every Highway target, uncapped)
  # What the caps did, as each library reports it.
  env "$@" PYTHONPATH="$PWD/$BUILD_DIR/python" /usr/bin/python3 -c '
import torch, seqpack
get = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
info = seqpack.cpu_info()
print("caps in effect: torch", get() if get else "(not reported by this torch)",
      "| oneDNN", info["isa"], "| seqpack kernels", info["kernels"], "int8", info["native_int8"])'
}

run_pass "pass 1 of 2" ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=AVX2 SEQPACK_MAX_CPU_ISA=avx2
run_pass "pass 2 of 2" ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX512_CORE SEQPACK_MAX_CPU_ISA=sse4
echo "test_isa_caps: both passes passed"
