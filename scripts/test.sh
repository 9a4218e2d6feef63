#!/usr/bin/env bash
# Sets everything up and runs every test: the C++ suite (CTest), the check that
# committed PyTorch fixtures still match a fresh generation, and the Python suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=${SEQPACK_BUILD_DIR:-build}

echo "== fixtures: regenerate with PyTorch and compare with the committed ones =="
/usr/bin/python3 scripts/check_fixtures.py

echo "== C++ tests (CTest) =="
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$(nproc)")

if [ -d python/tests ]; then
  echo "== Python tests (pytest) =="
  PYTHONPATH="$PWD/$BUILD_DIR/python:$PWD/python${PYTHONPATH:+:$PYTHONPATH}" \
    /usr/bin/python3 -m pytest -q python/tests
fi

echo "== pip: the wheel in a virtual environment, the Python suite against it from outside the tree =="
bash scripts/test_wheel.sh

echo "== C++ tests again under AddressSanitizer + UndefinedBehaviorSanitizer =="
bash scripts/test_sanitize.sh

echo "== fuzzing: each libFuzzer target for a short fixed time =="
bash scripts/fuzz.sh
