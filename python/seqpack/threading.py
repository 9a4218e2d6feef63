"""Thread count of seqpack's kernels (OpenMP and OpenBLAS), process-wide."""
from . import _seqpack


def set_num_threads(n):
    """Runs seqpack's kernels on `n` threads (like torch.set_num_threads)."""
    # The C++ side takes an int: a larger n would reach pybind11 as a bare TypeError.
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 2**31 - 1:
        raise ValueError(f"set_num_threads: n must be a positive int (at most 2**31 - 1), "
                         f"got {n!r}")
    _seqpack.set_num_threads(n)


def get_num_threads():
    return _seqpack.get_num_threads()
