#!/usr/bin/env bash
# Prints, one per line, the CMake arguments that make a CUDA build use the nvcc
# given as $1 (default: Debian's /usr/bin/nvcc), with the host compiler it
# accepts. Debian's nvcc (nvidia-cuda-toolkit) runs the newest g++ it supports
# (g++-11 for nvcc 11.8) through /usr/lib/nvidia-cuda-toolkit/bin/g++; without
# one that wrapper fails naming a supported clang, which scripts/setup.sh
# installs anyway on Debian 12 (clang-14). Exits 1 when nvcc has no host
# compiler here.
#
# `nvcc_args.sh --path` prints $PATH without the directories that hold another
# CUDA's ptxas (/usr/local/cuda*/bin, or wrappers such as /usr/local/bin/ptxas):
# Debian's nvcc runs the ptxas it finds on PATH, and another version's fails
# ("Value 'sm_52' is not defined for option 'gpu-name'"). Callers using Debian's
# nvcc set PATH to it.
set -euo pipefail
if [ "${1:-}" = --path ]; then
  echo "$PATH" | tr ':' '\n' | while read -r d; do
    case $d in
      /usr/bin | /bin) echo "$d" ;;
      *) [ -e "$d/ptxas" ] || echo "$d" ;;
    esac
  done | paste -sd: -
  exit 0
fi
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
