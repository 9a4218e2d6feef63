"""Where seqpack's CUDA library (libseqpack_cuda.so, seqpack/cuda.h) is, and
whether seqpack's CUDA kernels can run.

The kernels are the operators' C++ CUDA kernels (seqpack_torch/cuda_ops.cpp:
torch.ops.seqpack.rnn and rnn_padded on CUDA tensors, with their autograd, the
library's policy and the choice between seqpack's kernels and torch's); this
module only finds the library and names it to them
(torch.ops.seqpack._cuda_library). find_library is the one place the package
reads SEQPACK_CUDA_LIBRARY: the file it names, else libseqpack_cuda.so next to
this file, else under build/cuda/ or build-cuda/ of the repository (the C++
kernels look alike where nobody names them one). Imports only torch and the
standard library.
"""
import os
import pathlib
from typing import List, Optional, Tuple

import torch

__all__ = ["available", "library_path", "why_unavailable", "find_library", "named_library"]

LIBRARY_NAME = "libseqpack_cuda.so"


def named_library() -> str:
    """SEQPACK_CUDA_LIBRARY ("" where unset or empty): a library named by the
    user, the only one find_library tries. The one place this package reads it."""
    return os.environ.get("SEQPACK_CUDA_LIBRARY") or ""


def _candidates(named: str) -> List[pathlib.Path]:
    """Where the library is looked for, in order."""
    out: List[pathlib.Path] = []
    if named:
        out.append(pathlib.Path(named))
    here = pathlib.Path(__file__).resolve().parent
    out.append(here / LIBRARY_NAME)
    # python/seqpack/ in the repository, or build/python/seqpack/ in a build.
    for root in list(here.parents)[:4]:
        out += [root / "build" / "cuda" / LIBRARY_NAME, root / "build-cuda" / LIBRARY_NAME]
        if root.name == "build":
            out.append(root / "cuda" / LIBRARY_NAME)
    return out


def find_library() -> Tuple[Optional[str], str]:
    """(the library file to load, "") or (None, why there is none): the one named
    by SEQPACK_CUDA_LIBRARY where set (only it: one that is not a file is the
    reason, never skipped for another), else the first of the candidates there
    is."""
    named = named_library()
    try:
        if named and not pathlib.Path(named).is_file():
            return None, (f"SEQPACK_CUDA_LIBRARY={named!r} names no library file "
                          f"(missing, or not a regular file)")
        for c in _candidates(named):
            if c.is_file():
                return str(c), ""
    except (OSError, ValueError) as e:  # an over-long or unreadable path
        return None, f"SEQPACK_CUDA_LIBRARY={named!r} cannot be read: {e}"
    where = ", ".join(str(c) for c in _candidates(named))
    return None, (f"{LIBRARY_NAME} not found (SEQPACK_CUDA_LIBRARY={named!r}; looked in {where}); "
                  "build it with `cmake -S cuda -B build-cuda && cmake --build build-cuda`")


def library_path() -> Optional[str]:
    """The library file that is (or would be) loaded, or None if none exists."""
    return find_library()[0]


def why_unavailable() -> str:
    """Why seqpack's CUDA kernels cannot run ("" where they can): no library
    found, no GPU, operators without C++ CUDA kernels (a libseqpack_torch built
    against a CPU-only LibTorch), or the kernels' refusal of the library (which
    they load here: its ABI version, its policy)."""
    path, error = find_library()
    if path is None:
        return error
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False (no GPU or a CPU-only torch build)"
    if not torch._C._dispatch_has_kernel_for_dispatch_key("seqpack::rnn", "CUDA"):
        return ("torch.ops.seqpack.rnn has no CUDA kernels: libseqpack_torch was built against a "
                "LibTorch without CUDA (seqpack_torch/CMakeLists.txt)")
    try:
        torch.ops.seqpack._cuda_library(path)
    except (RuntimeError, ValueError) as e:
        return str(e)
    return ""


def available() -> bool:
    """The library is found, and the operators' CUDA kernels run it on a GPU."""
    return why_unavailable() == ""
