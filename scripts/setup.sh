#!/usr/bin/env bash
# Installs what seqpack needs from Debian's archive (as root), then configures
# and builds it into build/ (or $SEQPACK_BUILD_DIR). Safe to run again:
# apt-get skips what is there. Debian 12 (bookworm) and 13 (trixie); with
# SEQPACK_SETUP_PACKAGES_ONLY=1 it stops after the packages; with
# SEQPACK_SETUP_NO_PTH=1 it leaves site-packages alone (a second checkout, such
# as a git worktree, builds without taking `import seqpack` over: use
# PYTHONPATH=$BUILD_DIR/python there).
set -euo pipefail
cd "$(dirname "$0")/.."

# The release's clang (sanitizer and fuzzing builds): scripts/clang_version.sh.
CLANG_VERSION=$(bash scripts/clang_version.sh)

PACKAGES=(
  build-essential cmake git pkg-config
  libopenblas-dev libhwy-dev nlohmann-json3-dev libcli11-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-dev python3-numpy python3-pytest python3-torch pybind11-dev
  python3-pytest-xdist  # the Python suite on every core (scripts/test.sh)
  python3-setuptools  # torch.compile's inductor builds its C++ kernels with it
  wamerican wfrench wngerman wspanish witalian wportuguese wdutch
  "clang-$CLANG_VERSION" "libclang-rt-$CLANG_VERSION-dev" "libomp-$CLANG_VERSION-dev"
  libdnnl-dev libtorch-dev libonnx-dev python3-onnx python3-venv python3-pip
  libprotobuf-dev  # seqpack_onnx links protobuf; libonnx-dev does not depend on it
  ccache  # repeated builds (the wheel's reuses this build's objects: scripts/test.sh)
  ninja-build  # torch.utils.cpp_extension: bench/cuda_cpp_ops.py builds the C++ CUDA kernels
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# SEQPACK_CUDA=1: also the CUDA toolkit from Debian's contrib and non-free
# components (nvidia-cuda-toolkit: nvcc 11.8 on Debian 12, 12.4 on 13; about
# 1.6 GB to download, 5.4 GB installed, 6 minutes: docs/gpu-build.md), and the
# build gets -DSEQPACK_CUDA=ON (libseqpack_cuda.so in $BUILD_DIR/cuda/).
CUDA_ARGS=()
if [ "${SEQPACK_CUDA:-0}" = 1 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  if ! dpkg-query -W -f='${Status}' nvidia-cuda-toolkit 2>/dev/null | grep -q "install ok installed"; then
    . /etc/os-release
    echo "setup: installing nvidia-cuda-toolkit from $VERSION_CODENAME contrib non-free"
    printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: %s %s-updates\nComponents: contrib non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      "$VERSION_CODENAME" "$VERSION_CODENAME" | $SUDO tee /etc/apt/sources.list.d/seqpack-nonfree.sources >/dev/null
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nvidia-cuda-toolkit
  fi
  CUDA_ARGS=(-DSEQPACK_CUDA=ON)
  nvcc_args=$(bash scripts/nvcc_args.sh /usr/bin/nvcc)
  mapfile -t nvcc_args <<<"$nvcc_args"
  CUDA_ARGS+=("${nvcc_args[@]}")
  # Debian's nvcc finds ptxas on PATH: a CUDA under /usr/local (its bin/ first
  # on PATH) would lend it another version's ptxas.
  PATH=$(bash scripts/nvcc_args.sh --path)
  export PATH
fi
if [ "${SEQPACK_SETUP_PACKAGES_ONLY:-0}" = 1 ]; then exit 0; fi

# ONNX Runtime (CPU) for the ONNX export tests: the npm package onnxruntime-node,
# pinned by tools/ort/package-lock.json. --ignore-scripts: its install script
# would download a GPU build; the CPU runtime is inside the package.
if [ ! -f tools/ort/node_modules/onnxruntime-node/package.json ]; then
  echo "setup: installing onnxruntime-node into tools/ort"
  (cd tools/ort && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
fi

BUILD_DIR=${SEQPACK_BUILD_DIR:-build}
# Compiles through ccache (SEQPACK_CCACHE=0: not), with paths relative to the
# repository, so another build directory beside build/ (the wheel's in
# scripts/test.sh) gets the same objects from the cache.
LAUNCHER=()
if [ "${SEQPACK_CCACHE:-1}" = 1 ] && command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
  LAUNCHER=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "${LAUNCHER[@]}" \
  -DSEQPACK_BUILD_TESTS=ON -DSEQPACK_BUILD_PYTHON=ON -DSEQPACK_BUILD_BENCHMARKS=ON \
  -DSEQPACK_BUILD_TORCH=ON \
  -DPython3_EXECUTABLE=/usr/bin/python3 "${CUDA_ARGS[@]}" "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"

# Makes the in-tree Python package importable by Debian's python3 from any
# directory (`import seqpack, seqpack.torch`): a .pth file in its site-packages
# naming the build's python/ directory.
if [ -d "$BUILD_DIR/python/seqpack" ] && [ "${SEQPACK_SETUP_NO_PTH:-0}" != 1 ]; then
  PY_ROOT=$(cd "$BUILD_DIR/python" && pwd)
  SITE=$(/usr/bin/python3 -c 'import site; print(site.getsitepackages()[0])')
  if mkdir -p "$SITE" 2>/dev/null && echo "$PY_ROOT" > "$SITE/seqpack.pth" 2>/dev/null; then
    echo "setup: $SITE/seqpack.pth -> $PY_ROOT"
  else
    echo "setup: cannot write $SITE/seqpack.pth; use PYTHONPATH=$PY_ROOT" >&2
  fi
fi
