#!/usr/bin/env bash
# Packs the CPU build's command-line tool with the shared libraries it needs
# beyond glibc (oneDNN, OpenBLAS, Highway, fmt, ONNX, protobuf, libgomp,
# libstdc++, ...) and the main job's data (train.tsv) into build-device/seqpack-cpu.tar.xz, for a machine that has
# none of them: the GPU machine, whose 16-core Xeon issue 27's thread sweep
# needs (scripts/device_check.sh's cpu stage unpacks it). Carry it there with
# the working tree (the device tool's carry: ["build-device"]). Needs glibc
# 2.34 or newer there, as Debian 12's build does.
#   SEQPACK_BUILD_DIR  the build to pack (default build)
#   SEQPACK_BUNDLE_TESTS  test programs of BUILD_DIR/tests to take along (default: the
#                      engine and core tests; empty: none)
#   SEQPACK_BUNDLE     where to write it (default build-device/seqpack-cpu.tar.xz; a
#                      baseline for device_check.sh: build-device/baseline/seqpack-cpu.tar.xz)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${SEQPACK_BUILD_DIR:-build}
BUNDLE=${SEQPACK_BUNDLE:-build-device/seqpack-cpu.tar.xz}
tool=$BUILD_DIR/seqpack
[ -x "$tool" ] || { echo "device_bundle: no $tool (bash scripts/setup.sh builds it)" >&2; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/seqpack-cpu/lib" "$(dirname "$BUNDLE")"
cp "$tool" "$stage/seqpack-cpu/seqpack"
cp bench/workloads.json "$stage/seqpack-cpu/"
# The main job's data (the GPU machine has no word lists): 6000 words a language.
"$tool" data export --words-per-language 6000 --out "$stage/data" >/dev/null
cp "$stage/data/train.tsv" "$stage/seqpack-cpu/train.tsv"
# The engine and recurrent-core test programs, for the GPU machine's AMX CPU
# (they need no library the tool does not): SEQPACK_BUNDLE_TESTS, a list.
tests=${SEQPACK_BUNDLE_TESTS-test_gemm_engine_sweep test_gemm_engine test_rnn_threads test_rnn_bf16 test_rnn_int8 test_rnn_cell_step test_rnn_plan test_precision}
mkdir -p "$stage/seqpack-cpu/tests"
for t in $tests; do
  [ -x "$BUILD_DIR/tests/$t" ] && cp "$BUILD_DIR/tests/$t" "$stage/seqpack-cpu/tests/"
done
# Every library ldd resolves, but glibc's own (the loader, libc, libm, ...):
# those must be the machine's.
ldd "$tool" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
  grep -Ev '/(ld-linux[^/]*|libc|libm|libpthread|libdl|librt|libresolv)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/seqpack-cpu/lib/"; done
tar -C "$stage" -cJf "$BUNDLE" seqpack-cpu
echo "device_bundle: $BUNDLE ($(du -h "$BUNDLE" | cut -f1)," \
  "$(find "$stage/seqpack-cpu/lib" -type f | wc -l) libraries)"
