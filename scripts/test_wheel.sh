#!/usr/bin/env bash
# The pip route, as a Python user takes it: builds a wheel with
# `pip wheel --no-build-isolation` (the in-tree PEP 517 backend runs CMake for
# the library, the Python extension and libseqpack_torch only, in a build
# directory of its own), installs it into a virtual environment that sees
# Debian's torch and NumPy (--system-site-packages), and runs the Python suite
# from outside the source tree against the installed package
# (SEQPACK_EXPECTED_PACKAGE: python/tests/conftest.py fails if another seqpack
# is imported). Prints the build time.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export SEQPACK_WHEEL_BUILD_DIR=${SEQPACK_WHEEL_BUILD_DIR:-$WORK/build}

start=$(date +%s)
/usr/bin/python3 -m pip wheel --no-build-isolation --no-deps --no-index -q -w "$WORK/dist" .
echo "test_wheel: wheel built in $(( $(date +%s) - start )) s: $(cd "$WORK/dist" && ls)"

/usr/bin/python3 -m venv --system-site-packages "$WORK/venv"
"$WORK/venv/bin/python" -m pip install --no-build-isolation --no-deps --no-index -q \
  "$WORK"/dist/seqpack-*.whl
PACKAGE=$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')/seqpack
echo "test_wheel: installed into $PACKAGE"

# From a directory outside the tree, with nothing of the tree on sys.path but
# the tests themselves (helpers, cases).
cd "$WORK"
SEQPACK_EXPECTED_PACKAGE=$PACKAGE "$WORK/venv/bin/python" -m pytest -q -p no:cacheprovider \
  --rootdir "$WORK" "$ROOT/python/tests"
