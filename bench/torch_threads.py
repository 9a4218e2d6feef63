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
