#!/usr/bin/env bash
# Compiles the CUDA library (cuda/, standalone: libseqpack_cuda.so, sm_80 and
# sm_90) with every warning an error, so that the CUDA code is compiled on every
# change even where no GPU runs it (scripts/test.sh calls it; docs/gpu-build.md).
# The nvcc: $SEQPACK_NVCC, else the machine's CUDA under /usr/local/cuda, else
# Debian's (/usr/bin/nvcc); where there is none it installs Debian's
# nvidia-cuda-toolkit (SEQPACK_CUDA=1 bash scripts/setup.sh's packages: about
# 6 minutes and 7 GB).
#   SEQPACK_CUDA_BUILD_DIR  build directory (default build-cuda)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${SEQPACK_CUDA_BUILD_DIR:-build-cuda}
nvcc=${SEQPACK_NVCC:-}
if [ -z "$nvcc" ]; then
  for c in /usr/local/cuda/bin/nvcc /usr/bin/nvcc; do
    if [ -x "$c" ]; then nvcc=$c; break; fi
  done
fi
if [ -z "$nvcc" ]; then
  echo "build_cuda: no nvcc here; installing Debian's nvidia-cuda-toolkit"
  SEQPACK_CUDA=1 SEQPACK_SETUP_PACKAGES_ONLY=1 bash scripts/setup.sh
  nvcc=/usr/bin/nvcc
fi
if [ "$nvcc" = /usr/bin/nvcc ]; then
  # Debian's nvcc finds ptxas on PATH: not another CUDA's.
  PATH=$(bash scripts/nvcc_args.sh --path)
  export PATH
fi
args=$(bash scripts/nvcc_args.sh "$nvcc")
mapfile -t args <<<"$args"
echo "build_cuda: $("$nvcc" --version | tail -n 2 | head -n 1) ($nvcc)"
start=$(date +%s)
cmake -S cuda -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DSEQPACK_CUDA_WERROR=ON "${args[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
echo "build_cuda: $BUILD_DIR/libseqpack_cuda.so in $(( $(date +%s) - start )) s"

# The operators' CUDA registration (seqpack_torch/cuda_register.cpp), built only
# against a CUDA build of LibTorch, compiled here against Debian's LibTorch
# headers and this CUDA's (a CPU build of LibTorch lacks one generated header,
# which a stand-in gives) with every warning an error: a syntax check.
torch_include=/usr/include
if [ -f "$torch_include/c10/cuda/CUDAStream.h" ]; then
  stub=$(mktemp -d)
  trap 'rm -rf "$stub"' EXIT
  if [ ! -f "$torch_include/c10/cuda/impl/cuda_cmake_macros.h" ]; then
    mkdir -p "$stub/c10/cuda/impl"
    printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' >"$stub/c10/cuda/impl/cuda_cmake_macros.h"
  fi
  cuda_include=$(cd "$(dirname "$nvcc")/../include" && pwd)
  ${CXX:-g++} -std=c++17 -fsyntax-only -Wall -Wextra -Werror -Wno-unused-parameter -I"$stub" \
    -I"$torch_include/torch/csrc/api/include" -I"$cuda_include" -Iinclude -Iseqpack_torch \
    seqpack_torch/cuda_register.cpp
  echo "build_cuda: seqpack_torch/cuda_register.cpp compiles against $torch_include's LibTorch"
else
  echo "build_cuda: no LibTorch CUDA headers under $torch_include: cuda_register.cpp not checked"
fi
