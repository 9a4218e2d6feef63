#!/usr/bin/env bash
# The install is complete and relocatable (CTest: install_relocatable):
#   bash tests/install/test_install.sh BUILD_DIR
# installs BUILD_DIR with `cmake --install` to a prefix P, checks that the
# package files name no path of the build machine and libseqpack_torch has no
# RUNPATH, moves the tree (cp -a P Q; rm -rf P), then configures, builds and
# runs examples/consumer against Q: core_consumer (seqpack::seqpack) and, when
# the build has the torch component, torch_consumer (seqpack::torch, linked
# with --as-needed, as Ubuntu's toolchain links by default). It also checks
# that find_package rejects an unknown component and an incompatible version.
# The work directory is BUILD_DIR/install_test (a fixed path, so the build's
# compiler cache serves the consumer on later runs); it is removed on success.
set -euo pipefail
BUILD=$(cd "${1:?usage: test_install.sh BUILD_DIR}" && pwd)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
W=$BUILD/install_test
rm -rf "$W"
mkdir -p "$W"
fail() { echo "test_install: FAIL: $*" >&2; exit 1; }
cache() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt"; }

TORCH=$(cache SEQPACK_BUILD_TORCH)
GEN=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$(cache CMAKE_CXX_COMPILER)")
LAUNCHER=$(cache CMAKE_CXX_COMPILER_LAUNCHER)
[ -n "$LAUNCHER" ] && GEN+=(-DCMAKE_CXX_COMPILER_LAUNCHER="$LAUNCHER")

cmake --install "$BUILD" --prefix "$W/P" >"$W/install.log"
P_CMAKE=$(dirname "$(find "$W/P" -name seqpackConfig.cmake)")
[ -f "$P_CMAKE/seqpackConfigVersion.cmake" ] || fail "no seqpackConfigVersion.cmake in $P_CMAKE"
[ -f "$W/P/include/seqpack/version.h" ] || fail "include/seqpack/version.h is not installed"
# No absolute path in the package files: the build, the source, the prefix,
# or a library directory of this machine.
if grep -n -e "$BUILD" -e "$ROOT" -e "$W/P" -e '/usr/lib' -e '/usr/local' "$P_CMAKE"/*.cmake \
   | grep -v 'FindDNNL.cmake'; then
  fail "the package files above name absolute paths"
fi
if [ "$TORCH" = ON ]; then
  TORCH_LIB=$(find "$W/P" -name 'libseqpack_torch.so*' | head -1)
  [ -n "$TORCH_LIB" ] || fail "libseqpack_torch.so is not installed"
  if readelf -d "$TORCH_LIB" | grep -E 'RPATH|RUNPATH'; then
    fail "$TORCH_LIB keeps a run path"
  fi
fi

# Move the installed tree.
cp -a "$W/P" "$W/Q"
rm -rf "$W/P"
"$W/Q/bin/seqpack" --version | grep -qx "seqpack [0-9]*\.[0-9]*\.[0-9]*" ||
  fail "the moved tree's seqpack --version"

# The consumer against the moved tree.
cmake -S "$ROOT/examples/consumer" -B "$W/consumer" "${GEN[@]}" \
  -DCMAKE_PREFIX_PATH="$W/Q" -DSEQPACK_CONSUMER_TORCH="$TORCH" \
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,--as-needed" >"$W/consumer.log" 2>&1 ||
  { cat "$W/consumer.log"; fail "configuring examples/consumer against $W/Q"; }
grep -q "seqpack .* from $W/Q/" "$W/consumer.log" || { cat "$W/consumer.log"; fail "seqpack not found in $W/Q"; }
cmake --build "$W/consumer" -j 2 >>"$W/consumer.log" 2>&1 ||
  { cat "$W/consumer.log"; fail "building examples/consumer"; }
"$W/consumer/core_consumer"
if [ "$TORCH" = ON ]; then
  readelf -d "$W/consumer/torch_consumer" | grep -q 'NEEDED.*libseqpack_torch' ||
    fail "torch_consumer does not load libseqpack_torch (dropped by --as-needed)"
  "$W/consumer/torch_consumer"
fi

probe() {  # probe NAME FIND_PACKAGE_ARGUMENTS [MORE CMAKE]: configures; prints the log
  mkdir -p "$W/$1"
  printf 'cmake_minimum_required(VERSION 3.22)\nproject(probe LANGUAGES CXX)\nfind_package(%s)\n%s\n' \
    "$2" "${3:-}" >"$W/$1/CMakeLists.txt"
  cmake -S "$W/$1" -B "$W/$1/build" -DCMAKE_PREFIX_PATH="$W/Q" "${GEN[@]}" \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,--as-needed" 2>&1
}

# A program that links seqpack::torch and refers to nothing of it keeps the
# library under --as-needed (its operators register when it loads).
if [ "$TORCH" = ON ]; then
  echo 'int main() { return 0; }' >"$W/main.cpp"
  probe linked_only "seqpack CONFIG REQUIRED COMPONENTS torch" \
    "add_executable(linked_only $W/main.cpp)
target_link_libraries(linked_only PRIVATE seqpack::torch)" >"$W/linked_only.log" ||
    { cat "$W/linked_only.log"; fail "configuring a seqpack::torch program"; }
  cmake --build "$W/linked_only/build" >>"$W/linked_only.log" 2>&1 ||
    { cat "$W/linked_only.log"; fail "building a seqpack::torch program"; }
  readelf -d "$W/linked_only/build/linked_only" | grep -q 'NEEDED.*libseqpack_torch' ||
    fail "a program linking seqpack::torch does not load libseqpack_torch (dropped by --as-needed)"
fi

# find_package's refusals, each in a small project of its own.
if out=$(probe nonexistent "seqpack CONFIG REQUIRED COMPONENTS nonexistent"); then
  fail "find_package(seqpack COMPONENTS nonexistent) succeeded"
fi
grep -q "seqpack has no component 'nonexistent'" <<<"$out" ||
  { echo "$out"; fail "find_package(seqpack COMPONENTS nonexistent) did not say why"; }
if out=$(probe other_minor "seqpack 0.99 CONFIG REQUIRED"); then
  fail "find_package(seqpack 0.99) accepted this version"
fi
grep -q "compatible with requested version \"0.99\"" <<<"$out" || { echo "$out"; fail "the version refusal"; }

rm -rf "$W"
echo "test_install: installed, moved and used from another prefix: ok"
