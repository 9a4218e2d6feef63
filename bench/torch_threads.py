"""Thread count and allocator settings of the torch side of the benchmarks."""
import ctypes
import os
import sys

import torch


def set_torch_threads(n):
    """torch.set_num_threads(n), and the same for the OpenBLAS that torch's GEMMs call:
    Debian's torch (BLAS_INFO=generic) uses the system OpenBLAS, whose own thread count
    torch.set_num_threads does not touch; left alone it uses every core even at
    torch.set_num_threads(1). Returns whether OpenBLAS was found and set."""
    torch.set_num_threads(n)
    return set_openblas_threads(n)


def set_openblas_threads(n):
    """openblas_set_num_threads(n) in every OpenBLAS loaded in this process; returns
    whether there was one. At n > 1 torch's fp32 GEMMs then run on OpenBLAS's own
    pthreads beside torch's OpenMP ones, which on a machine of n cores can wait on each
    other for milliseconds a call (docs/performance.md, "Every shape"): the sweep also
    times torch's fp32 module with this pool at one thread and counts the faster."""
    with open("/proc/self/maps") as f:
        libs = {line.split()[-1] for line in f
                if "openblas" in line and line.split()[-1].startswith("/")}
    done = False
    for path in sorted(libs):
        try:
            ctypes.CDLL(path).openblas_set_num_threads(n)
            done = True
        except (OSError, AttributeError):
            pass
    return done


# glibc malloc settings under which PyTorch 1.13's CPU training runs about twice as
# fast on this project's workloads (docs/performance.md, "PyTorch's allocator"):
# buffers up to 32 MB come from the heap instead of fresh mmap()s, and the heap is
# never given back to the kernel, so torch's per-call temporaries are not page-faulted
# and zeroed by the kernel on every call. Left alone, glibc's threshold adapts to the
# sizes freed so far, and whether a run lands in the fast or the slow state varies.
TUNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "1000000000"}


def malloc_settings():
    """The allocator settings of this process's environment, for a benchmark's header:
    glibc's malloc tunables (MALLOC_*_, GLIBC_TUNABLES) and LD_PRELOAD."""
    env = sorted(f"{k}={v}" for k, v in os.environ.items()
                 if (k.startswith("MALLOC_") and k.endswith("_")) or k in ("GLIBC_TUNABLES",
                                                                          "LD_PRELOAD"))
    return " ".join(env) if env else "glibc defaults (no MALLOC_* tunables, no LD_PRELOAD)"


def add_malloc_option(parser):
    parser.add_argument("--malloc", choices=["env", "tuned"], default="env",
                        help="glibc malloc settings of the whole run: env (as the environment "
                             "has them; glibc's defaults unless MALLOC_* are set) or tuned ("
                             + " ".join(f"{k}={v}" for k, v in TUNED_MALLOC.items()) +
                             ": PyTorch's fast state, see docs/performance.md)")


def apply_malloc(choice):
    """--malloc tuned: runs this script again with TUNED_MALLOC in its environment
    (glibc reads its tunables at start-up; child processes inherit them)."""
    if choice != "tuned" or all(os.environ.get(k) == v for k, v in TUNED_MALLOC.items()):
        return
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, **TUNED_MALLOC))


# OpenMP's thread placement. The seqpack tool binds its own threads
# (OMP_PROC_BIND=close OMP_PLACES=cores, set as it runs itself again) where they
# fill the CPUs; the peer stays unbound, its fastest: with those two settings in
# its environment, torch 2.11 at 16 threads ran 10 to 50 times slower on the GPU
# machine's 16-vCPU Xeon (docs/performance.md, "Many threads"), and every process
# it started inherited its first thread's one-core affinity.
_PLACEMENT_VARS = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")


def placement_note():
    """How the run's OpenMP threads are placed, for its header."""
    placed = [f"{k}={os.environ[k]}" for k in _PLACEMENT_VARS if os.environ.get(k)]
    if placed:
        return ("threads placed by the environment (" + " ".join(placed) + ") on both sides: "
                "slower for torch, and its child processes inherit its first thread's CPUs")
    return ("torch's threads unbound; the seqpack tool binds its own where they fill the CPUs"
            + (" (SEQPACK_BIND_THREADS=" + os.environ["SEQPACK_BIND_THREADS"] + ")"
               if os.environ.get("SEQPACK_BIND_THREADS") else ""))


# OpenBLAS picks its kernels from the CPU model at start-up; a model newer than
# the release (Debian 12's 0.3.21 on the AMX Xeons) gets its generic Prescott
# (SSE3) kernels, which made Debian's torch fp32 1.9x slower than it can be there
# (issue 27: the main job at 1 thread took 63.6 s per epoch, 34.2 s with
# OPENBLAS_CORETYPE=SkylakeX). Peers at their best name the core for it.
_GENERIC_OPENBLAS_CORES = {"prescott", "core2", "katmai", "coppermine", "northwood", "banias",
                           "atom", "penryn", "dunnington", "nehalem"}
_CORE_FOR_FLAG = [("avx512f", "SkylakeX"), ("avx2", "Haswell")]


def openblas_corename():
    """The kernel set the OpenBLAS loaded in this process chose (openblas_get_corename),
    or None where there is none."""
    with open("/proc/self/maps") as f:
        libs = sorted({line.split()[-1] for line in f
                       if "openblas" in line and line.split()[-1].startswith("/")})
    for path in libs:
        try:
            fn = ctypes.CDLL(path).openblas_get_corename
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_char_p
        return fn().decode()
    return None


def cpu_flags():
    """The CPU's feature flags (/proc/cpuinfo), empty where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def openblas_core_to_name(corename, flags):
    """The OPENBLAS_CORETYPE that gives OpenBLAS the kernels this CPU can run, when
    it fell back to a generic set (corename one of the pre-AVX cores) on a CPU with
    AVX2 or AVX-512; None when its own choice stands."""
    if corename is None or corename.lower() not in _GENERIC_OPENBLAS_CORES:
        return None
    for flag, core in _CORE_FOR_FLAG:
        if flag in flags:
            return core
    return None


def add_openblas_option(parser):
    parser.add_argument("--openblas-core", choices=["auto", "env"], default="auto",
                        help="auto: where OpenBLAS falls back to its generic Prescott kernels "
                             "on a CPU it does not know (Debian 12's 0.3.21 on AMX Xeons), run "
                             "again with OPENBLAS_CORETYPE naming the core the CPU can run "
                             "(SkylakeX with AVX-512, Haswell with AVX2), so torch's fp32 peer "
                             "is at its best; env: as the environment has it")


def apply_openblas_core(choice):
    """--openblas-core auto: runs this script again with OPENBLAS_CORETYPE set when
    OpenBLAS fell back to generic kernels (OpenBLAS reads it at load time; child
    processes inherit it). Returns a line for the benchmark's header."""
    corename = openblas_corename()
    if choice == "auto" and "OPENBLAS_CORETYPE" not in os.environ:
        core = openblas_core_to_name(corename, cpu_flags())
        if core is not None:
            sys.stdout.flush()
            os.execve(sys.executable, [sys.executable] + sys.argv,
                      dict(os.environ, OPENBLAS_CORETYPE=core))
    named = os.environ.get("OPENBLAS_CORETYPE")
    return (f"OpenBLAS core {corename}" + (f" (OPENBLAS_CORETYPE={named})" if named else "")
            if corename else "no OpenBLAS loaded")
