#!/usr/bin/env bash
# The pip route, as a Python user takes it: builds a wheel with
# `pip wheel --no-build-isolation` (the in-tree PEP 517 backend runs CMake for
# the library, the Python extension, the tool and libseqpack_torch only, in a temporary
# build directory, or SEQPACK_WHEEL_BUILD_DIR when set; SEQPACK_CMAKE_ARGS and
# CMAKE_*_COMPILER_LAUNCHER pass on), checks that the build left the source
# tree as it was (`git status --porcelain --ignored`, __pycache__ aside),
# installs the wheel into a virtual environment that sees Debian's torch and
# NumPy (--system-site-packages), and runs the Python suite from outside the
# source tree against the installed package (SEQPACK_EXPECTED_PACKAGE:
# python/tests/conftest.py fails if another seqpack is imported;
# test_version.py checks the installed metadata's version against
# seqpack.__version__). The wheel also installs the command-line tool: the
# environment's bin/seqpack must find its shared libraries (ldd), print the
# package's version and run `seqpack demo` from outside the tree. Prints the
# build time.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# Everything in the tree, ignored files included, except bytecode caches
# (importing the backend writes python/__pycache__).
tree_state() {
  git -C "$ROOT" status --porcelain --ignored=matching --untracked-files=all 2>/dev/null |
    grep -v '__pycache__/' | sort || true
}
in_git=false
git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1 && in_git=true
$in_git && tree_state >"$WORK/tree.before"

start=$(date +%s)
/usr/bin/python3 -m pip wheel --no-build-isolation --no-deps --no-index -q -w "$WORK/dist" .
echo "test_wheel: wheel built in $(( $(date +%s) - start )) s: $(cd "$WORK/dist" && ls)"
if $in_git; then
  tree_state >"$WORK/tree.after"
  if ! diff "$WORK/tree.before" "$WORK/tree.after" >"$WORK/tree.diff"; then
    echo "test_wheel: FAIL: building the wheel changed the source tree:" >&2
    cat "$WORK/tree.diff" >&2
    exit 1
  fi
  echo "test_wheel: the source tree is as it was"
fi

/usr/bin/python3 -m venv --system-site-packages "$WORK/venv"
"$WORK/venv/bin/python" -m pip install --no-build-isolation --no-deps --no-index -q \
  "$WORK"/dist/seqpack-*.whl
PACKAGE=$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')/seqpack
echo "test_wheel: installed into $PACKAGE"

# From a directory outside the tree, with nothing of the tree on sys.path but
# the tests themselves (helpers, cases).
cd "$WORK"

TOOL="$WORK/venv/bin/seqpack"
if [ ! -x "$TOOL" ]; then
  echo "test_wheel: FAIL: the wheel installed no command $TOOL" >&2
  exit 1
fi
if ldd "$TOOL" | grep -q 'not found'; then
  echo "test_wheel: FAIL: $TOOL misses shared libraries:" >&2
  ldd "$TOOL" | grep 'not found' >&2
  exit 1
fi
want="seqpack $("$WORK/venv/bin/python" -c 'import seqpack; print(seqpack.__version__)')"
got=$("$TOOL" --version)
if [ "$got" != "$want" ]; then
  echo "test_wheel: FAIL: $TOOL --version printed '$got', expected '$want'" >&2
  exit 1
fi
"$TOOL" demo >"$WORK/demo.txt"
if ! grep -q 'batch_sizes' "$WORK/demo.txt"; then
  echo "test_wheel: FAIL: $TOOL demo printed no packed batch:" >&2
  cat "$WORK/demo.txt" >&2
  exit 1
fi
echo "test_wheel: $TOOL runs ($got)"

# The CUDA kernels' CPU emulation (test_cuda_library.py, test_cuda_cpp_ops.py)
# compiles and runs the same sources whatever the package: it ran in the suite
# before, not again here.
SEQPACK_TEST_CUDA=0 SEQPACK_EXPECTED_PACKAGE=$PACKAGE "$WORK/venv/bin/python" -m pytest -q -p no:cacheprovider \
  ${SEQPACK_PYTEST_JOBS:-} --rootdir "$WORK" "$ROOT/python/tests"
