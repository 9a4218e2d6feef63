#!/usr/bin/env bash
# Prints, one per line, the CMake arguments that make a CUDA build use the nvcc
# given as $1 (default: Debian's /usr/bin/nvcc), with the host compiler it
# accepts. Debian's nvcc (nvidia-cuda-toolkit) runs the newest g++ it supports
# (g++-11 for nvcc 11.8) through /usr/lib/nvidia-cuda-toolkit/bin/g++; without
# one that wrapper fails naming a supported clang, which scripts/setup.sh
# installs anyway on Debian 12 (clang-14). Exits 1 when nvcc has no host
# compiler here. Callers using Debian's nvcc also drop /usr/local/cuda*/bin from
# PATH: that nvcc finds ptxas on PATH, and another CUDA's would not match it.
set -euo pipefail
nvcc=${1:-/usr/bin/nvcc}
echo "-DCMAKE_CUDA_COMPILER=$nvcc"
wrapper=/usr/lib/nvidia-cuda-toolkit/bin/g++
if [ "$nvcc" = /usr/bin/nvcc ] && [ -e "$wrapper" ] && ! "$wrapper" --version >/dev/null 2>&1; then
  host=$( ("$wrapper" --version 2>&1 || true) | sed -n "s/.*nvcc -ccbin \(clang-[0-9.]*\).*/\1/p" | head -n1)
  if [ -z "$host" ]; then
    echo "nvcc_args: $nvcc has no supported host compiler; install the g++ that $wrapper names" >&2
    exit 1
  fi
  echo "-DCMAKE_CUDA_HOST_COMPILER=${host/clang-/clang++-}"
fi
