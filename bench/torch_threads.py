"""Thread count of the torch side of the benchmarks."""
import ctypes

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
