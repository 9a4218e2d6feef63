#!/usr/bin/env bash
# The one-command check on a machine with an NVIDIA GPU (issue 29; docs/gpu.md):
#
#   bash scripts/device_check.sh            # logs and summary.md in $OUT, else ./device-out
#
# Stages, each time-boxed, each run whatever the one before did; the whole run ends
# within SEQPACK_DEVICE_CHECK_BUDGET seconds (default 450, under the 8 minutes it has):
#   info    nvidia-smi, driver, nvcc, CMake, ninja, torch, CUDA, cuDNN
#   build   the CUDA library, standalone: cmake -S cuda -B build-cuda -G Ninja
#           -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release, then ninja. A library
#           already there (SEQPACK_CUDA_LIBRARY, or a libseqpack_cuda.so under build-cuda/,
#           build/cuda/ or python/seqpack/, carried from another machine) is used as it is;
#           SEQPACK_DEVICE_CHECK_REBUILD=1 builds afresh; SEQPACK_DEVICE_CHECK_BUILD=1 builds
#           without a GPU too (a compile check).
#   floor   bench/cuda_step_floor.py: the per-step floor of a persistent recurrence on
#           thread-block clusters (cuda/probe/step_floor.cu), checked, then timed
#   cppops  bench/cuda_cpp_ops.py: the operators' C++ CUDA kernels built against this torch
#           (the tests' seqpack side too), checked against torch, timed per call against
#           torch's packed layers
#   tests   python/tests/test_cuda_gpu.py through its own runner (no pytest needed)
#   cpu     issue 27's thread sweep: `seqpack bench --threads N` for N in 1 2 4 8 16 on
#           lstm-bi-2layer (fp32, bf16, int8 forward; bf16 training), the same at 8 and 16
#           threads with SEQPACK_STEP_UNITS=128 and with SEQPACK_STEP_GROUPS=0 and 1,
#           every other workload (bf16 and int8 forward, bf16
#           training), the main job (`seqpack train --profile`, one epoch of the bundle's
#           train.tsv), then compare_torch.py at 16 threads on every workload against
#           PyTorch's fastest configuration. With a baseline bundle
#           (build-device/baseline/seqpack-cpu.tar.xz) it first runs three workloads at 1, 2
#           and 16 threads with both tools, alternating, twice. The tool is build/seqpack, or
#           the bundle scripts/device_bundle.sh packs into build-device/ (carry it: the GPU
#           machine lacks oneDNN and the rest); without either, or without a GPU (not that
#           machine; SEQPACK_DEVICE_CHECK_CPU=1 runs it anyway), the stage is skipped.
#           SEQPACK_DEVICE_CHECK_GPU=0 runs this stage alone (no build, tests or bench);
#           SEQPACK_DEVICE_CHECK_SWEEP picks its parts and their order (default
#           gtest,table,int8,train,compare,main,ab,variants,others; gtest runs the
#           bundle's test programs, pairs 2 threads against 1 on the 2-core target's
#           workloads, splits a row split against a column split, repeat the thread
#           counts a single pass found slower again, blas the main job with and without
#           OpenBLAS's pool, knobs OpenMP's and seqpack's settings against the
#           default, bind the tool's thread binding against none at 16 threads and
#           against binding at 8; these six are not in the default);
#           SEQPACK_DEVICE_CHECK_CPU_S caps the stage (default 400 s)
#   bench   bench/compare_torch.py --device cuda: seqpack against torch's six configurations
#           (SEQPACK_DEVICE_CHECK_BENCH_ARGS adds options, e.g. "--workload gru-chars --quick")
# Without a CUDA GPU the GPU stages say "no CUDA GPU" and the script still ends with 0.
# It exits 1 when a stage failed or timed out.
#
# summary.md ends with the cpu stage's measurements, rounds together with their medians
# (scripts/cpu_log_summary.py, which also reads a cpu.log brought back).
# $OUT holds at most 8 files (what the GPU machine sends back): summary.md, info.log,
# build.log, tests.log, tests.json, cpu.log, bench.log, bench.json.
#
# Self-test without a GPU (checks this script, the test runner and the benchmark, nothing
# of seqpack): SEQPACK_CUDA_TEST_DEVICE=cpu SEQPACK_CUDA_GLUE=/path/fake_cuda.py runs the
# tests and the benchmark on the CPU against a fake glue (docs/gpu.md).
# shellcheck disable=SC2317  # info, build and sweep run in a child bash (stages.sh)
set -u
export PYTHONUNBUFFERED=1

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
OUT=${OUT:-$ROOT/device-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/{summary.md,info.log,build.log,tests.log,tests.json,cpu.log,bench.log,bench.json}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

START=$(date +%s)
BUDGET=${SEQPACK_DEVICE_CHECK_BUDGET:-450}
DEADLINE=$((START + BUDGET))
SELF_TEST=0
GPU_STAGES=${SEQPACK_DEVICE_CHECK_GPU:-1}  # 0: the CPU stage alone (build, tests, bench skipped)
[ "${SEQPACK_CUDA_TEST_DEVICE:-}" = cpu ] && SELF_TEST=1

STAGES=()   # "name|status|seconds|log" rows for the summary
FAILED=0

left() { echo $((DEADLINE - $(date +%s))); }

# The first python3 that imports torch: the GPU machine's python3 holds PyTorch; on a
# Debian machine it may be /usr/bin/python3.
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for candidate in python3 /usr/bin/python3; do
    if command -v "$candidate" >/dev/null && timeout 60 "$candidate" -c "import torch" 2>/dev/null; then
      PY=$candidate
      break
    fi
  done
fi

# stage NAME MAX_SECONDS RESERVE LOG COMMAND...: runs COMMAND for at most MAX_SECONDS, and
# never into the RESERVE seconds kept for the stages after it; its output goes to LOG.
stage() {
  local name=$1 max=$2 reserve=$3 log=$4
  shift 4
  local limit=$(($(left) - reserve))
  [ "$limit" -gt "$max" ] && limit=$max
  if [ "$limit" -lt 5 ]; then
    echo "== $name: not run, the budget is spent" | tee -a "$log"
    STAGES+=("$name|not run (budget spent)|0|$(basename "$log")")
    FAILED=1
    return 1
  fi
  echo "== $name (at most ${limit} s)"
  local cmd="$*"
  [ "${#cmd}" -gt 300 ] && cmd="${cmd:0:300}..."
  echo "\$ $cmd" >>"$log"
  local t0 rc
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  local sec=$(($(date +%s) - t0)) status
  case $rc in
    0) status=ok ;;
    124|137) status="TIMED OUT after ${limit} s"; FAILED=1 ;;
    *) status="FAILED (exit $rc)"; FAILED=1 ;;
  esac
  echo "   $name: $status (${sec} s)"
  STAGES+=("$name|$status|$sec|$(basename "$log")")
  return $rc
}

skip_stage() {  # NAME REASON LOG
  echo "== $1: skipped: $2" | tee -a "$3"
  STAGES+=("$1|skipped: $2|0|$(basename "$3")")
}

# ---------------------------------------------------------------- info
info() {
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "host: $(uname -srm), $(nproc) CPUs"
  echo "commit: $(git -C "$ROOT" log -1 --format='%h %s' 2>/dev/null || echo '(not a git checkout)')"
  echo "--- nvidia-smi"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
  else
    echo "no nvidia-smi"
  fi
  echo "--- tools"
  command -v nvcc >/dev/null && nvcc --version | tail -2 || echo "no nvcc"
  command -v cmake >/dev/null && cmake --version | head -1 || echo "no cmake"
  command -v ninja >/dev/null && echo "ninja $(ninja --version)" || echo "no ninja"
  echo "--- python: ${PY:-none with torch}"
  [ -n "$PY" ] && "$PY" - <<'EOF'
import sys
import torch
print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "CUDA", torch.version.cuda, "cuDNN",
      torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
print("cuda available:", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device: {p.name}, capability {p.major}.{p.minor}, {p.multi_processor_count} SMs, "
          f"{p.total_memory / 2**30:.1f} GiB")
for name in ("numpy", "pytest"):
    try:
        print(name, __import__(name).__version__)
    except ImportError:
        print(name, "missing")
EOF
}

[ -d /usr/local/cuda/bin ] && ! command -v nvcc >/dev/null && export PATH=/usr/local/cuda/bin:$PATH
export PY ROOT
declare -f info >"$TMP/stages.sh"
stage info 30 0 "$OUT/info.log" bash -c ". '$TMP/stages.sh'; info"
cat "$OUT/info.log"

HAVE_GPU=0
if [ "$SELF_TEST" = 1 ]; then
  HAVE_GPU=1
  echo "SELF-TEST: the tests and the benchmark run on the CPU with the fake glue ${SEQPACK_CUDA_GLUE:-(SEQPACK_CUDA_GLUE unset)}"
elif [ -n "$PY" ] && command -v nvidia-smi >/dev/null \
    && timeout 60 "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  HAVE_GPU=1
fi
NO_GPU="no CUDA GPU (nvidia-smi absent or torch.cuda.is_available() is False)"
[ -z "$PY" ] && NO_GPU="no python3 with torch"

# ---------------------------------------------------------------- build
find_library() {
  if [ -n "${SEQPACK_CUDA_LIBRARY:-}" ] && [ -f "$SEQPACK_CUDA_LIBRARY" ]; then
    echo "$SEQPACK_CUDA_LIBRARY"
    return
  fi
  local d f
  for d in build-cuda build/cuda python/seqpack; do
    [ -d "$d" ] || continue
    f=$(find "$d" -name 'libseqpack_cuda.so*' \( -type f -o -type l \) 2>/dev/null | sort | head -1)
    [ -n "$f" ] && { echo "$ROOT/$f"; return; }
  done
}

build() {
  set -x
  # A build folder carried from another checkout names that checkout's source folder.
  if [ -f build-cuda/CMakeCache.txt ] \
      && ! grep -q "^CMAKE_HOME_DIRECTORY:INTERNAL=$ROOT/cuda\$" build-cuda/CMakeCache.txt; then
    rm -rf build-cuda/CMakeCache.txt build-cuda/CMakeFiles
  fi
  cmake -S cuda -B build-cuda -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_BUILD_TYPE=Release && ninja -C build-cuda
}

LIB=$(find_library)
if [ "$GPU_STAGES" = 0 ]; then
  skip_stage build "SEQPACK_DEVICE_CHECK_GPU=0" "$OUT/build.log"
elif [ "$HAVE_GPU" = 0 ] && [ "${SEQPACK_DEVICE_CHECK_BUILD:-0}" != 1 ]; then
  skip_stage build "$NO_GPU (SEQPACK_DEVICE_CHECK_BUILD=1 compiles anyway)" "$OUT/build.log"
elif [ "$SELF_TEST" = 1 ]; then
  skip_stage build "self-test (fake glue)" "$OUT/build.log"
elif [ -n "$LIB" ] && [ "${SEQPACK_DEVICE_CHECK_REBUILD:-0}" != 1 ]; then
  skip_stage build "prebuilt library $LIB used as it is" "$OUT/build.log"
elif [ ! -f cuda/CMakeLists.txt ]; then
  echo "no cuda/CMakeLists.txt in this checkout" >>"$OUT/build.log"
  STAGES+=("build|FAILED (no cuda/ sources)|0|build.log")
  FAILED=1
elif ! command -v nvcc >/dev/null || ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
  echo "nvcc, cmake or ninja missing: $(command -v nvcc cmake ninja | tr '\n' ' ')" >>"$OUT/build.log"
  STAGES+=("build|FAILED (nvcc, cmake or ninja missing)|0|build.log")
  FAILED=1
else
  declare -f build >>"$TMP/stages.sh"
  stage build 240 200 "$OUT/build.log" bash -c ". '$TMP/stages.sh'; build"
  LIB=$(find_library)
  tail -5 "$OUT/build.log"
fi
if [ -n "$LIB" ]; then
  export SEQPACK_CUDA_LIBRARY=$LIB
  echo "library: $LIB"
fi

# ---------------------------------------------------------------- floor (issue 44)
# The per-step floor of a persistent recurrence on thread-block clusters
# (cuda/probe/step_floor.cu), before anything else is timed. Its log opens
# bench.log ($OUT brings back 8 files at most).
if [ "$GPU_STAGES" = 0 ]; then
  skip_stage floor "SEQPACK_DEVICE_CHECK_GPU=0" "$TMP/floor.log"
elif [ "$HAVE_GPU" = 0 ]; then
  skip_stage floor "$NO_GPU" "$TMP/floor.log"
elif [ "$SELF_TEST" = 1 ]; then
  skip_stage floor "self-test (fake glue): the probe is the library's own code" "$TMP/floor.log"
else
  stage floor 60 300 "$TMP/floor.log" "$PY" bench/cuda_step_floor.py
fi
cat "$TMP/floor.log" >>"$OUT/bench.log" 2>/dev/null

# ---------------------------------------------------------------- cppops (issue 43)
# The operators' C++ CUDA kernels (seqpack_torch/cuda_ops.cpp), built against this
# machine's torch (bench/cuda_operators.py, into torch's extension cache, where the
# tests find them next), checked against torch and timed per call against torch's
# packed layers (bench/cuda_cpp_ops.py). Its log follows the tests' in tests.log.
if [ "$GPU_STAGES" = 0 ]; then
  skip_stage cppops "SEQPACK_DEVICE_CHECK_GPU=0" "$TMP/cppops.log"
elif [ "$HAVE_GPU" = 0 ]; then
  skip_stage cppops "$NO_GPU" "$TMP/cppops.log"
elif [ "$SELF_TEST" = 1 ]; then
  skip_stage cppops "self-test (fake glue): bench/cuda_cpp_ops.py --cpu tests it on the CPU" "$TMP/cppops.log"
else
  stage cppops 120 200 "$TMP/cppops.log" "$PY" bench/cuda_cpp_ops.py --calls 200 --rounds 5
fi

# ---------------------------------------------------------------- tests
if [ "$GPU_STAGES" = 0 ]; then
  skip_stage tests "SEQPACK_DEVICE_CHECK_GPU=0" "$OUT/tests.log"
elif [ "$HAVE_GPU" = 0 ]; then
  skip_stage tests "$NO_GPU" "$OUT/tests.log"
  # The runner itself still runs: it reports the same and skips every test.
  [ -n "$PY" ] && timeout 120 "$PY" python/tests/test_cuda_gpu.py --json "$OUT/tests.json" \
    >>"$OUT/tests.log" 2>&1
else
  limit=$(($(left) - 100))
  [ "$limit" -gt 180 ] && limit=180
  # --require: on a GPU machine a library that cannot be built or loaded is a failure.
  require=--require
  [ "$SELF_TEST" = 1 ] && require=
  stage tests 180 100 "$OUT/tests.log" "$PY" python/tests/test_cuda_gpu.py --json "$OUT/tests.json" \
    --budget $((limit > 30 ? limit - 15 : 5)) $require
fi
grep -E "^(GPU tests|SKIPPED|FAILED: --require|fp32:|half precision|  (dtype|bfloat16|float16))" "$OUT/tests.log" \
  >"$TMP/tests-summary" 2>/dev/null
grep -E "^ *FAILED " "$OUT/tests.log" | head -20 >>"$TMP/tests-summary"
running=$(grep -o '"running": "[^"]*"' "$OUT/tests.json" 2>/dev/null)
[ -n "$running" ] && echo "the tests stopped inside ${running#*: } (hung or killed)" >>"$TMP/tests-summary"
cat "$TMP/tests-summary"
cat "$TMP/cppops.log" >>"$OUT/tests.log" 2>/dev/null

# ---------------------------------------------------------------- cpu (issue 27)
# The CPU tool: build/seqpack where this machine built it, else the bundle that
# scripts/device_bundle.sh packs (carried as build-device/), unpacked here.
SEQPACK_CPU=
if [ -x build/seqpack ]; then
  SEQPACK_CPU=$ROOT/build/seqpack
elif [ -f build-device/seqpack-cpu.tar.xz ] && tar -C "$TMP" -xJf build-device/seqpack-cpu.tar.xz; then
  SEQPACK_CPU=$TMP/seqpack-cpu/seqpack
  export LD_LIBRARY_PATH="$TMP/seqpack-cpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# A baseline tool to run against in the same run (device_bundle.sh of another build,
# saved as build-device/baseline/seqpack-cpu.tar.xz): the same libraries, its own code.
SEQPACK_BASE=
if [ -f build-device/baseline/seqpack-cpu.tar.xz ] && mkdir -p "$TMP/base" \
    && tar -C "$TMP/base" -xJf build-device/baseline/seqpack-cpu.tar.xz; then
  SEQPACK_BASE=$TMP/base/seqpack-cpu/seqpack
  LD_LIBRARY_PATH="$TMP/base/seqpack-cpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$SEQPACK_BASE" info >/dev/null 2>&1 || SEQPACK_BASE=
fi
if [ "$HAVE_GPU" = 0 ] && [ "${SEQPACK_DEVICE_CHECK_CPU:-0}" != 1 ]; then
  skip_stage cpu "no CUDA GPU: not the GPU machine's CPU (SEQPACK_DEVICE_CHECK_CPU=1 runs it anyway)" \
    "$OUT/cpu.log"
elif [ -n "$SEQPACK_CPU" ] && "$SEQPACK_CPU" info >/dev/null 2>&1; then
  # The parts of the sweep to run (default all of them).
  SEQPACK_DEVICE_CHECK_SWEEP=${SEQPACK_DEVICE_CHECK_SWEEP:-gtest,table,int8,train,compare,main,ab,variants,others}
  export SEQPACK_CPU SEQPACK_BASE PY SEQPACK_DEVICE_CHECK_SWEEP TMP
  sweep() {
    "$SEQPACK_CPU" info
    one() {  # THREADS WORKLOAD MODE PRECISION: one bench line (JSON) of ${TOOL:-$SEQPACK_CPU},
      # with the core's parts (--profile) where the tool is this tree's (a baseline may predate it)
      local profile=--profile
      [ -n "${TOOL:-}" ] && [ "$TOOL" != "$SEQPACK_CPU" ] && profile=
      timeout 20 "${TOOL:-$SEQPACK_CPU}" bench --threads "$1" --workload "$2" --mode "$3" \
        --precision "$4" --min-time 0.1 --json $profile || echo "(not run: exit $?)"
    }
    each_run() {  # LABEL WORKLOADS RUNS COUNTS: a bench line for each workload, run
      # (mode:precision) and thread count, in that nesting, each under "--- LABEL, ..."
      local w run n
      for w in $2; do
        for run in $3; do
          for n in $4; do
            echo "--- $1, $w, threads $n, ${run%:*}, ${run#*:}"
            one "$n" "$w" "${run%:*}" "${run#*:}"
          done
        done
      done
    }
    main_job() {  # TOOL THREADS: the main job, SEQPACK_DEVICE_CHECK_MAIN_EPOCHS epochs, timed
      # with the process's wall, user and system seconds; SEQPACK_DEVICE_CHECK_MAIN_TICKS=1
      # adds the CPU ticks of each of its threads (OpenMP's and any other) as last seen
      # before it ended, read every 0.1 s (those reads take a CPU: they slow a run whose
      # threads fill every CPU)
      local log=$TMP/main.out pid child ticks="" now
      local TIMEFORMAT='time: wall %R s, user %U s, system %S s'
      time {
        timeout 60 "$1" train --data "$(dirname "$SEQPACK_CPU")/train.tsv" \
          --epochs "${SEQPACK_DEVICE_CHECK_MAIN_EPOCHS:-1}" \
          --threads "$2" --quiet --profile --out "$(mktemp -d)/model" >"$log" 2>&1 &
        pid=$!
        while [ "${SEQPACK_DEVICE_CHECK_MAIN_TICKS:-0}" = 1 ] && kill -0 "$pid" 2>/dev/null; do
          child=$(ps -o pid= --ppid "$pid" 2>/dev/null | head -1 | tr -d ' ')
          if [ -n "$child" ]; then
            now=$(cat /proc/"$child"/task/*/stat 2>/dev/null | awk '{print $14 + $15}' |
              sort -rn | tr '\n' ' ')
            [ -n "$now" ] && ticks=$now
          fi
          sleep 0.1
        done
        wait "$pid" || echo "(not run: exit $?)"
      }
      grep -E "^(precision|epoch|step profile|rnn core profile)" "$log"
      [ -n "$ticks" ] && echo "thread cpu ticks: $ticks"
      return 0
    }
    part_gtest() {
      # the bundle's test programs (bf16 and int8 on this CPU's AMX): their summaries
      # SEQPACK_DEVICE_CHECK_GTESTS: the programs (default: every one in the bundle);
      # SEQPACK_DEVICE_CHECK_GTEST_FILTER: a gtest filter; SEQPACK_DEVICE_CHECK_GTEST_ENVS:
      # the settings to run each under, words of VAR=VALUE[,VAR=VALUE] or - for none
      # (e.g. "- ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16"); SEQPACK_DEVICE_CHECK_GTEST_LINES:
      # the lines of failure messages shown per run (default 40)
      tdir=$(dirname "$SEQPACK_CPU")/tests
      progs=${SEQPACK_DEVICE_CHECK_GTESTS:-$(cd "$tdir" 2>/dev/null && ls)}
      # (the knobs test runs the command-line tool of this checkout's build/: not here)
      filter=${SEQPACK_DEVICE_CHECK_GTEST_FILTER:--RNNThreads.BadKnobsAreRefusedByName}
      for envs in ${SEQPACK_DEVICE_CHECK_GTEST_ENVS:--}; do
        for p in $progs; do
          t=$tdir/$p
          [ -x "$t" ] || continue
          echo "--- gtest $p, settings $envs"
          settings=()
          [ "$envs" != - ] && IFS=, read -r -a settings <<<"$envs"
          env "${settings[@]}" timeout 60 "$t" --gtest_brief=1 \
            --gtest_filter="$filter" >"$TMP/gtest.out" 2>&1
          echo "exit $?"
          # each failure with its message (the values and where), the summary
          grep -E -A3 "Failure" "$TMP/gtest.out" | head -"${SEQPACK_DEVICE_CHECK_GTEST_LINES:-40}"
          grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$TMP/gtest.out" | head -30
        done
      done
    }
    part_table() {
      # issue 27's table: lstm-bi-2layer at 1..16 threads, forward in each precision, bf16 training
      for n in 1 2 4 8 16; do
        for run in forward_packed:fp32 forward_packed:bf16 forward_packed:int8 train_packed:bf16; do
          echo "--- threads $n, ${run%:*}, ${run#*:}"
          one "$n" lstm-bi-2layer "${run%:*}" "${run#*:}"
        done
      done
    }
    part_int8() {
      # the int8 kernels (AMX-INT8, AVX512-VNNI) against bf16, alternating,
      # SEQPACK_DEVICE_CHECK_INT8_ROUNDS rounds (default 2)
      for round in $(seq "${SEQPACK_DEVICE_CHECK_INT8_ROUNDS:-2}"); do
        for w in lstm-bi-2layer lstm-long-tail lstm-sentences; do
          for n in 1 16; do
            echo "--- int8 round $round, $w, threads $n, bf16"
            one "$n" "$w" forward_packed bf16
            for kernel in amx vnni; do
              echo "--- int8 round $round, $w, threads $n, int8 $kernel"
              SEQPACK_INT8_KERNEL=$kernel one "$n" "$w" forward_packed int8
            done
          done
        done
      done
    }
    part_train() {
      # lstm-bi-2layer bf16 training at 1 and 16 threads, alternating,
      # SEQPACK_DEVICE_CHECK_TRAIN_ROUNDS rounds (default 3: the issue's 8x target; the
      # 1-thread time drifts between rounds on this machine)
      for round in $(seq "${SEQPACK_DEVICE_CHECK_TRAIN_ROUNDS:-3}"); do
        for n in 1 16; do
          echo "--- train round $round, threads $n"
          one "$n" lstm-bi-2layer train_packed bf16
        done
      done
    }
    part_compare() {
      # the peer at 16 threads, PyTorch at its fastest configuration, in the same run
      if [ -n "$PY" ]; then
        # forward at int8 (which runs seqpack's bf16 too), training at bf16
        # (SEQPACK_DEVICE_CHECK_COMPARE_RUNS: mode:precision words; SEQPACK_DEVICE_CHECK_COMPARE_ARGS:
        # more options, e.g. "--workload lstm-bi-2layer"); torch's threads unbound, the tool's
        # bound by the tool (16 threads fill the CPUs)
        for run in ${SEQPACK_DEVICE_CHECK_COMPARE_RUNS:-forward_packed:int8 train_packed:bf16}; do
          echo "--- compare_torch.py --threads 16 --fastest-torch --mode ${run%:*} --precision ${run#*:}"
          timeout "${SEQPACK_DEVICE_CHECK_COMPARE_S:-150}" "$PY" bench/compare_torch.py \
            --seqpack "$SEQPACK_CPU" --threads 16 --mode "${run%:*}" --precision "${run#*:}" \
            --fastest-torch --quick --no-linearity --malloc tuned ${SEQPACK_DEVICE_CHECK_COMPARE_ARGS:-} ||
            echo "(compare_torch: exit $?)"
        done
      fi
    }
    part_main() {
      # the main job: seqpack train on the bundle's data at each thread count,
      # SEQPACK_DEVICE_CHECK_MAIN_ROUNDS rounds (default 1) of SEQPACK_DEVICE_CHECK_MAIN_EPOCHS
      # epochs (default 1; the first epoch of a process also pays OpenBLAS's start: its
      # pool threads spin about 0.1 s each as the library loads)
      data=$(dirname "$SEQPACK_CPU")/train.tsv
      if [ -f "$data" ]; then
        tools=new
        [ -n "$SEQPACK_BASE" ] && tools="base new"
        for round in $(seq "${SEQPACK_DEVICE_CHECK_MAIN_ROUNDS:-1}"); do
          for n in 1 2 4 8 16; do
            for tool in $tools; do
              echo "--- main job $tool, round $round, threads $n"
              TOOL=$SEQPACK_CPU
              [ "$tool" = base ] && TOOL=$SEQPACK_BASE
              main_job "$TOOL" "$n"
            done
          done
        done
      else
        echo "--- main job: skipped: no $data (the bundle carries it; beside build/seqpack, put one there)"
      fi
    }
    part_ab() {
      # this build against the baseline, alternating, SEQPACK_DEVICE_CHECK_AB_ROUNDS times
      # (default 2: the machine is shared); SEQPACK_DEVICE_CHECK_AB_WORKLOADS,
      # SEQPACK_DEVICE_CHECK_AB_THREADS and SEQPACK_DEVICE_CHECK_AB_RUNS (mode:precision
      # words) choose what runs
      if [ -n "$SEQPACK_BASE" ]; then
        for round in $(seq "${SEQPACK_DEVICE_CHECK_AB_ROUNDS:-2}"); do
          for w in ${SEQPACK_DEVICE_CHECK_AB_WORKLOADS:-lstm-bi-2layer lstm-sentences lstm-long-tail}; do
            for n in ${SEQPACK_DEVICE_CHECK_AB_THREADS:-1 2 16}; do
              for run in ${SEQPACK_DEVICE_CHECK_AB_RUNS:-forward_packed:bf16 train_packed:bf16}; do
                for tool in base new; do
                  echo "--- A/B $tool round $round, $w, threads $n, ${run%:*}, ${run#*:}"
                  TOOL=$SEQPACK_CPU
                  [ "$tool" = base ] && TOOL=$SEQPACK_BASE
                  TOOL=$TOOL one "$n" "$w" "${run%:*}" "${run#*:}"
                done
              done
            done
          done
        done
      fi
    }
    part_variants() {
      # the minimum of hidden units per thread of a column split (default 64)
      for n in 8 16; do
        for run in forward_packed:bf16 forward_packed:int8 train_packed:bf16; do
          echo "--- units 128, threads $n, ${run%:*}, ${run#*:}"
          SEQPACK_STEP_UNITS=128 one "$n" lstm-bi-2layer "${run%:*}" "${run#*:}"
        done
      done
      # a thread's gate blocks as separate oneDNN calls (SEQPACK_STEP_GROUPS=0) and as one
      for w in lstm-bi-2layer lstm-long-tail; do
        for n in 8 16; do
          for run in forward_packed:bf16 train_packed:bf16; do
            for groups in 0 1; do
              echo "--- groups $groups, $w, threads $n, ${run%:*}, ${run#*:}"
              SEQPACK_STEP_GROUPS=$groups one "$n" "$w" "${run%:*}" "${run#*:}"
            done
          done
        done
      done
    }
    part_others() {
      # every other workload: more threads must never be slower
      for w in lstm-sentences gru-chars lstm-long-tail rnn-tanh-tiny lstm-long-seq; do
        for n in 1 2 4 8 16; do
          for run in forward_packed:bf16 forward_packed:int8 train_packed:bf16; do
            echo "--- $w, threads $n, ${run%:*}, ${run#*:}"
            one "$n" "$w" "${run%:*}" "${run#*:}"
          done
        done
      done
    }
    part_splits() {
      # a step split by rows against one by columns (SEQPACK_STEP_SPLIT) at 2 threads, and
      # 1 thread, on the workloads whose bf16 or int8 W_hh takes a row split,
      # SEQPACK_DEVICE_CHECK_SPLITS_ROUNDS rounds (default 3)
      for round in $(seq "${SEQPACK_DEVICE_CHECK_SPLITS_ROUNDS:-3}"); do
        for w in lstm-sentences lstm-long-seq; do
          for run in forward_packed:bf16 train_packed:bf16 forward_packed:int8; do
            echo "--- splits round $round, $w, threads 1, ${run%:*}, ${run#*:}"
            one 1 "$w" "${run%:*}" "${run#*:}"
            for split in rows columns; do
              echo "--- splits round $round, $w, threads 2 $split, ${run%:*}, ${run#*:}"
              SEQPACK_STEP_SPLIT=$split one 2 "$w" "${run%:*}" "${run#*:}"
            done
          done
        done
      done
    }
    part_repeat() {
      # the workloads and thread counts that a single pass found slower than a smaller
      # count, again, SEQPACK_DEVICE_CHECK_REPEAT_ROUNDS rounds (default 3)
      for round in $(seq "${SEQPACK_DEVICE_CHECK_REPEAT_ROUNDS:-3}"); do
        for spec in lstm-long-seq:forward_packed:bf16:2,4,8,16 \
                    lstm-long-tail:forward_packed:bf16:4,8,16 \
                    lstm-long-tail:forward_packed:int8:4,8,16 \
                    rnn-tanh-tiny:train_packed:bf16:4,8,16 \
                    lstm-sentences:forward_packed:int8:1,2,4; do
          IFS=: read -r w m p counts <<<"$spec"
          for n in ${counts//,/ }; do
            echo "--- repeat round $round, $w, threads $n, $m, $p"
            one "$n" "$w" "$m" "$p"
          done
        done
      done
    }
    part_blas() {
      # one epoch of the main job at 16 threads with OpenBLAS's pool (its default) and
      # without (OPENBLAS_NUM_THREADS=1), alternating, two rounds
      for round in 1 2; do
        for pool in default 1; do
          echo "--- main job OpenBLAS threads $pool, round $round, threads 16"
          if [ "$pool" = default ]; then
            main_job "$SEQPACK_CPU" 16
          else
            OPENBLAS_NUM_THREADS=1 main_job "$SEQPACK_CPU" 16
          fi
        done
      done
    }
    with_env() {  # 'VAR=VALUE ...' (or -) COMMAND...: COMMAND with those settings
      local vars=$1
      shift
      if [ "$vars" = - ]; then "$@"; else eval "$vars \"\$@\""; fi
    }
    part_bind() {
      # the tool's thread binding (it binds where the threads fill the CPUs) against
      # none (SEQPACK_BIND_THREADS=0) at 16 threads and against binding (=1) at 8,
      # alternating, SEQPACK_DEVICE_CHECK_BIND_ROUNDS rounds (default 3): the main job,
      # then every workload's forward at int8 and training at bf16 at 8 and 16 threads
      local v n
      for round in $(seq "${SEQPACK_DEVICE_CHECK_BIND_ROUNDS:-3}"); do
        for spec in 8:- 8:SEQPACK_BIND_THREADS=1 16:- 16:SEQPACK_BIND_THREADS=0; do
          n=${spec%%:*} v=${spec#*:}
          echo "--- bind round $round, main job, threads $n, $v"
          with_env "$v" main_job "$SEQPACK_CPU" "$n"
        done
        each_run "bind round $round" \
          "${SEQPACK_DEVICE_CHECK_BIND_WORKLOADS:-lstm-sentences lstm-bi-2layer gru-chars lstm-long-tail rnn-tanh-tiny lstm-long-seq}" \
          "forward_packed:int8 train_packed:bf16" "8 16"
      done
    }
    part_knobs() {
      # settings against the default, alternating, SEQPACK_DEVICE_CHECK_KNOBS_ROUNDS rounds
      # (default 3): the main job at 16 threads (and 8, the default), OpenMP's wait policy
      # and binding, and SEQPACK_STEP_ROWS; lstm-long-tail at 16 and 8 threads;
      # lstm-bi-2layer bf16 at 2 threads and 1, and its training at 16
      local v
      for round in $(seq "${SEQPACK_DEVICE_CHECK_KNOBS_ROUNDS:-3}"); do
        for v in - OMP_WAIT_POLICY=passive SEQPACK_STEP_ROWS=32 \
                 "OMP_PROC_BIND=close OMP_PLACES=cores"; do
          echo "--- knobs round $round, main job, threads 16, $v"
          with_env "$v" main_job "$SEQPACK_CPU" 16
        done
        echo "--- knobs round $round, main job, threads 8, -"
        main_job "$SEQPACK_CPU" 8
        for v in - OMP_WAIT_POLICY=passive; do
          echo "--- knobs round $round, lstm-long-tail, threads 16, forward_packed, bf16, $v"
          with_env "$v" one 16 lstm-long-tail forward_packed bf16
          echo "--- knobs round $round, lstm-bi-2layer, threads 16, train_packed, bf16, $v"
          with_env "$v" one 16 lstm-bi-2layer train_packed bf16
        done
        echo "--- knobs round $round, lstm-long-tail, threads 8, forward_packed, bf16, -"
        one 8 lstm-long-tail forward_packed bf16
        echo "--- knobs round $round, lstm-bi-2layer, threads 1, forward_packed, bf16, -"
        one 1 lstm-bi-2layer forward_packed bf16
        for v in - OMP_WAIT_POLICY=passive "OMP_PROC_BIND=spread OMP_PLACES=cores"; do
          echo "--- knobs round $round, lstm-bi-2layer, threads 2, forward_packed, bf16, $v"
          with_env "$v" one 2 lstm-bi-2layer forward_packed bf16
        done
      done
    }
    part_pairs() {
      # 2 threads against 1 on the workloads of issue 27's 2-core target (bf16 forward and
      # training), alternating, SEQPACK_DEVICE_CHECK_PAIRS_ROUNDS rounds (default 3)
      lscpu | grep -E '^(Model name|Thread|Core|Socket)' || true
      for round in $(seq "${SEQPACK_DEVICE_CHECK_PAIRS_ROUNDS:-3}"); do
        each_run "pairs round $round" "lstm-bi-2layer lstm-long-tail lstm-sentences" \
          "forward_packed:bf16 train_packed:bf16" "1 2"
      done
    }
    for p in ${SEQPACK_DEVICE_CHECK_SWEEP//,/ }; do
      if declare -F "part_$p" >/dev/null; then
        "part_$p"
      else
        echo "--- no sweep part named $p"
      fi
    done
  }
  declare -f sweep >>"$TMP/stages.sh"
  reserve=60  # for the bench stage
  [ "$GPU_STAGES" = 0 ] && reserve=0
  stage cpu "${SEQPACK_DEVICE_CHECK_CPU_S:-400}" "$reserve" "$OUT/cpu.log" bash -c ". '$TMP/stages.sh'; sweep"
else
  skip_stage cpu "no CPU tool: neither build/seqpack nor build-device/seqpack-cpu.tar.xz (scripts/device_bundle.sh) runs here" \
    "$OUT/cpu.log"
fi

# ---------------------------------------------------------------- bench
if [ "$GPU_STAGES" = 0 ]; then
  skip_stage bench "SEQPACK_DEVICE_CHECK_GPU=0" "$OUT/bench.log"
elif [ "$HAVE_GPU" = 0 ]; then
  skip_stage bench "$NO_GPU" "$OUT/bench.log"
else
  limit=$(($(left) - 10))
  [ "$limit" -gt 300 ] && limit=300
  # shellcheck disable=SC2086
  stage bench 300 10 "$OUT/bench.log" "$PY" bench/compare_torch.py --device cuda \
    --budget $((limit > 40 ? limit - 30 : 10)) --json-out "$OUT/bench.json" \
    --markdown-out "$TMP/bench.md" ${SEQPACK_DEVICE_CHECK_BENCH_ARGS:-}
fi

# ---------------------------------------------------------------- summary
{
  echo "# Device check"
  echo
  [ "$SELF_TEST" = 1 ] && echo "**SELF-TEST on the CPU with a fake glue: nothing of seqpack was tested or timed.**" && echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(($(date +%s) - START)) s in all, commit" \
    "$(git -C "$ROOT" log -1 --format=%h 2>/dev/null || echo '?')"
  echo
  echo '```'
  grep -E "^(device:|torch |python |host:)" "$OUT/info.log"
  command -v nvidia-smi >/dev/null \
    && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  echo "library: ${LIB:-none}"
  echo '```'
  echo
  echo "| stage | status | seconds | log |"
  echo "| --- | --- | ---: | --- |"
  for row in "${STAGES[@]}"; do
    IFS='|' read -r name status sec log <<<"$row"
    echo "| $name | $status | $sec | $log |"
  done
  echo
  echo "## Per-step floor (bench/cuda_step_floor.py)"
  echo
  grep -E "^(#|\|)" "$TMP/floor.log" 2>/dev/null || echo "(not run)"
  echo
  echo "## Tests"
  echo
  echo '```'
  cat "$TMP/tests-summary"
  echo '```'
  echo
  echo "## The operators' C++ CUDA kernels (bench/cuda_cpp_ops.py)"
  echo
  grep -E "^(built|library:|[A-Z]+: the C\+\+|micro|\|)" "$TMP/cppops.log" 2>/dev/null || echo "(not run)"
  grep -E "^cuda_cpp_ops: " "$TMP/cppops.log" 2>/dev/null
  echo
  if grep -q '^--- ' "$OUT/cpu.log" 2>/dev/null; then
    # the cpu stage's measurements, rounds together (scripts/cpu_log_summary.py)
    echo "## CPU stage"
    echo
    "${PY:-python3}" scripts/cpu_log_summary.py "$OUT/cpu.log" 2>&1 || echo "(no summary)"
    echo
  fi
  if [ -s "$TMP/bench.md" ]; then
    echo "## Benchmark"
    echo
    sed 's/^# /### /' "$TMP/bench.md"
  else
    echo "## Benchmark"
    echo
    echo "No table. The end of bench.log:"
    echo
    echo '```'
    tail -5 "$OUT/bench.log" 2>/dev/null
    echo '```'
  fi
} >"$OUT/summary.md"

echo
echo "================================================================ summary ($OUT/summary.md)"
cat "$OUT/summary.md"
exit $FAILED
