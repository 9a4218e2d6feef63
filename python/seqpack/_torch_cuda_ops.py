"""seqpack's torch operators on CUDA tensors: the CUDA kernels of
torch.ops.seqpack.rnn and torch.ops.seqpack.rnn_padded, over the CUDA glue
(seqpack/_cuda.py and its library), registered from Python.

Where libseqpack_torch was built against a CUDA build of LibTorch, these
kernels are its own, in C++ (seqpack_torch/cuda_ops.h: no Python in the call,
so TorchScript and LibTorch programs without Python reach them too), and
register() only hands them the library the glue found. Otherwise
register(backend) adds them, for the CUDA and AutogradCUDA dispatch keys, to
the operators libseqpack_torch defines (its C++ kernels are the CPU ones): the
same operator then runs on either device, from eager code, TorchScript,
torch.compile or a LibTorch model run in this Python process. The AutogradCUDA
kernel takes precedence over the operators' C++ autograd kernel on CUDA
tensors; the glue records its own autograd node (gradients to the packed rows,
h0, c0 and every weight). seqpack.torch's layers register them at their first
CUDA forward where seqpack's CUDA kernels can run (_torch_layers._cuda_backend),
and run their CUDA forwards through these operators.

The kernels take the operators' arguments with their CPU semantics: states in
the caller's batch order (sorted_indices/unsorted_indices permute them, an
empty index tensor is none), zero-length sequences keep their h0/c0, padded
input with lengths is packed and padded back to its own length, padded input
without lengths is a batch of equal lengths. The CUDA kernels compute in the
data's dtype (float32, bfloat16, float16); precision "fp32" and "auto" run
that, any other value is refused by name. seed, where given, seeds the dropout
masks drawn on the data's device.
"""
import contextlib
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _torch_packing

_STATE: dict = {"backend": None, "library": None}
_KEYS = ("CUDA", "AutogradCUDA")
_PRECISIONS = ("fp32", "auto")


def cpp_kernels() -> bool:
    """Whether libseqpack_torch has the operators' CUDA kernels in C++
    (seqpack_torch/cuda_ops.h: built where its LibTorch is a CUDA build).
    Asked once: a library's registrations do not change."""
    if "cpp" not in _STATE:
        _STATE["cpp"] = _STATE["library"] is None and torch._C._dispatch_has_kernel_for_dispatch_key(
            "seqpack::rnn", "CUDA")
    return _STATE["cpp"]


def register(backend) -> None:
    """Registers the kernels over `backend` (the glue module) once per process.
    Where libseqpack_torch has them in C++ (cpp_kernels()), those stay the
    operators' kernels, and they are given the library the glue found."""
    if cpp_kernels():
        path = backend.library_path()
        # Loading the library there installs the policy of the SEQPACK_CUDA_*
        # variables (cuda_ops.cpp): a bad one is its own error, naming it.
        if hasattr(backend, "policy_from_environment"):
            backend.policy_from_environment()
        try:
            torch.ops.seqpack._cuda_library(path if path is not None else "")
        except ValueError as e:  # they loaded another file first (a scripted call, say)
            raise RuntimeError(f"seqpack CUDA: the glue found {path}, but {e}; name one with "
                               "SEQPACK_CUDA_LIBRARY") from e
        _STATE["backend"] = backend
        return
    if _STATE["library"] is not None:
        _STATE["backend"] = backend
        return
    library = torch.library.Library("seqpack", "IMPL")
    for key in _KEYS:
        library.impl("rnn", rnn, key)
        library.impl("rnn_padded", rnn_padded, key)
    _STATE["backend"], _STATE["library"] = backend, library


def registered() -> bool:
    """Whether the operators' CUDA kernels run over a backend (register() was called)."""
    return _STATE["backend"] is not None


def _backend():
    backend = _STATE["backend"]
    if backend is None:
        raise RuntimeError("seqpack CUDA: the operators' CUDA kernels are not registered")
    return backend


def _index(t: Optional[Tensor]) -> Optional[Tensor]:
    return t if t is not None and t.numel() > 0 else None


def _seeded(seed: Optional[int], device: torch.device):
    """torch's RNG seeded with `seed` for the call (and restored after), or as it is."""
    if seed is None:
        return contextlib.nullcontext()
    devices = [device] if device.type == "cuda" else []
    stack = contextlib.ExitStack()
    stack.enter_context(torch.random.fork_rng(devices=devices))
    torch.manual_seed(seed)
    return stack


def rnn(data: Tensor, batch_sizes: Tensor, sorted_indices: Optional[Tensor],
        unsorted_indices: Optional[Tensor], h0: Optional[Tensor], c0: Optional[Tensor],
        weights: List[Tensor], mode: str, hidden_size: int, num_layers: int, bias: bool,
        bidirectional: bool, proj_size: int, dropout: float, train: bool, seed: Optional[int] = None,
        precision: str = "fp32") -> Tuple[Tensor, Tensor, Tensor]:
    """seqpack::rnn's CUDA kernel: (output, h_n, c_n), c_n empty but for LSTM."""
    cuda = _backend()
    if precision not in _PRECISIONS:
        raise ValueError(f"seqpack::rnn on {data.device}: precision = {precision!r} is not one of "
                         f"{list(_PRECISIONS)}; seqpack's CUDA kernels compute in the data's dtype "
                         f"({data.dtype}): pass bfloat16 or float16 tensors for those")
    sorted_i, unsorted_i = _index(sorted_indices), _index(unsorted_indices)
    if sorted_i is not None:
        batch = sorted_i.numel()
    else:
        batch = int(batch_sizes[0]) if batch_sizes.numel() > 0 else 0
    states = num_layers * (2 if bidirectional else 1)
    if h0 is None:
        h0 = data.new_zeros(states, batch, proj_size if proj_size > 0 else hidden_size)
    elif sorted_i is not None:
        h0 = h0.index_select(1, sorted_i.to(h0.device))
    hx = h0
    if mode == "LSTM":
        if c0 is None:
            c0 = data.new_zeros(states, batch, hidden_size)
        elif sorted_i is not None:
            c0 = c0.index_select(1, sorted_i.to(c0.device))
        hx = (h0, c0)
    with _seeded(seed, data.device):
        res = cuda.rnn_packed(mode, data, batch_sizes, hx, list(weights), bias, num_layers,
                              float(dropout), train, bidirectional, proj_size)
    output, h_n = res[0], res[1]
    c_n = res[2] if mode == "LSTM" else data.new_empty(0)
    if unsorted_i is not None:
        h_n = h_n.index_select(1, unsorted_i.to(h_n.device))
        if mode == "LSTM":
            c_n = c_n.index_select(1, unsorted_i.to(c_n.device))
    return output, h_n, c_n


def rnn_padded(input: Tensor, lengths: Optional[Tensor], h0: Optional[Tensor], c0: Optional[Tensor],
               weights: List[Tensor], mode: str, hidden_size: int, num_layers: int, bias: bool,
               batch_first: bool, bidirectional: bool, proj_size: int, dropout: float, train: bool,
               seed: Optional[int] = None, precision: str = "fp32") -> Tuple[Tensor, Tensor, Tensor]:
    """seqpack::rnn_padded's CUDA kernel: input with lengths is packed (one
    gather), run and padded back to its own length; without lengths it is
    already the packed rows of a batch of equal lengths."""
    bf = batch_first
    if lengths is not None:
        total_length = input.size(1 if bf else 0)
        packed = _torch_packing.pack_padded_sequence(input, lengths.to(torch.int64), bf, False)
        out, h_n, c_n = rnn(packed.data, packed.batch_sizes, packed.sorted_indices,
                            packed.unsorted_indices, h0, c0, weights, mode, hidden_size, num_layers,
                            bias, bidirectional, proj_size, dropout, train, seed, precision)
        padded, _ = _torch_packing.pad_packed_sequence(
            torch.nn.utils.rnn.PackedSequence(out, packed.batch_sizes, packed.sorted_indices,
                                              packed.unsorted_indices), bf, 0.0, total_length)
        return padded, h_n, c_n
    x = input.transpose(0, 1) if bf else input
    steps, batch = x.size(0), x.size(1)
    data = x.reshape(steps * batch, x.size(2))
    batch_sizes = torch.full((steps if batch > 0 else 0,), batch, dtype=torch.int64)
    # The states default to zeros of the batch (with no step, batch_sizes cannot tell it).
    states = num_layers * (2 if bidirectional else 1)
    if h0 is None:
        h0 = input.new_zeros(states, batch, proj_size if proj_size > 0 else hidden_size)
    if c0 is None and mode == "LSTM":
        c0 = input.new_zeros(states, batch, hidden_size)
    out, h_n, c_n = rnn(data, batch_sizes, None, None, h0, c0, weights, mode, hidden_size,
                        num_layers, bias, bidirectional, proj_size, dropout, train, seed, precision)
    out = out.view(steps, batch, out.size(1))
    return (out.transpose(0, 1) if bf else out), h_n, c_n
