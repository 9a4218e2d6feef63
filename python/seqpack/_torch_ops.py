"""seqpack.torch's operators and packing functions: loads libseqpack_torch
(torch.ops.seqpack.*), defines the packing functions seqpack.torch exports
(pack_padded_sequence, pad_packed_sequence, pack_sequence, pad_sequence,
unpack_sequence, unpad_sequence, invert_permutation), the helpers that tell a
call traced by torch.compile or torch.export from an eager one, and registers
the operators' fake implementations (PyTorch 2.4+, seqpack/_torch_fakes.py)
that those traces run.

A private module at the bottom of seqpack's torch modules (STYLE.md: Python
modules import downward only): _torch_layers builds the layers on it, and
seqpack.torch, torch_classifier and torch_quantize import from it. It
imports none of them, so importing an implementation module never imports
seqpack.torch, which re-exports them.
"""
import os
from typing import List, Optional, Tuple

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence

from . import _torch_fakes, _torch_orig, _torch_packing
from ._torch_fakes import _dynamic_size  # noqa: F401  (_torch_nested's)

_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libseqpack_torch.so")
if not os.path.exists(_LIBRARY):
    raise ImportError(f"seqpack.torch needs the operator library {_LIBRARY}: build seqpack with "
                      f"-DSEQPACK_BUILD_TORCH=ON (scripts/setup.sh does), or install the wheel")
torch.ops.load_library(_LIBRARY)


def library_path() -> str:
    """Path of libseqpack_torch (for torch.ops.load_library in another process)."""
    return _LIBRARY


def pack_padded_sequence(input: Tensor, lengths: Tensor, batch_first: bool = False,
                         enforce_sorted: bool = True) -> PackedSequence:
    """torch.nn.utils.rnn.pack_padded_sequence, accepting zero-length sequences.

    `lengths`: a 1-D integer tensor on the CPU (int64, int32, int16, int8, uint8),
    or in eager mode a list or tuple of ints (or a NumPy integer array), as torch
    takes them; floating-point or bool lengths are a TypeError (torch truncates
    floats). With zero-length sequences the indices are kept even when
    enforce_sorted, to record the batch size (those sequences have no packed rows).

    Any device and dtype: CPU float32/float64 input runs seqpack's operator,
    anything else (CUDA, meta, float16, bfloat16, integers, bool) one gather in
    torch operations, with the same results and errors (a scripted call runs
    the operator: CPU float32/float64).
    """
    if not torch.jit.is_scripting():
        lengths = _lengths_tensor(lengths, "pack_padded_sequence")
        if not _operators_take(input):
            return _generic_pack(input, lengths, batch_first, enforce_sorted)
    data, batch_sizes, sorted_indices, unsorted_indices = torch.ops.seqpack.pack_padded_sequence(
        input, lengths, batch_first, enforce_sorted)
    if not torch.jit.is_scripting() and _traced(data):
        # Traced (torch.compile, torch.export): the indices' count is a symbol;
        # with enforce_sorted it is 0 or the batch size, known only when the
        # graph runs. The tensors are kept (empty where torch's are None), and
        # seqpack's operators read an empty index tensor as none.
        return _traced_packed(data, batch_sizes, sorted_indices, unsorted_indices)
    if torch.jit.is_scripting():
        no_indices = sorted_indices.numel() == 0
    else:
        no_indices = _no_indices(sorted_indices)
    if no_indices:  # where torch's are None (enforce_sorted, none empty)
        return PackedSequence(data, batch_sizes, None, None)
    return PackedSequence(data, batch_sizes, sorted_indices, unsorted_indices)


def _operators_take(t: Tensor) -> bool:
    """Whether seqpack's packing operators take `t`: a CPU float32/float64
    tensor (under torch.compile, a fake one standing for it)."""
    return t.is_cpu and (t.dtype == torch.float32 or t.dtype == torch.float64)


@torch.jit.unused
def _generic_pack(input: Tensor, lengths: Tensor, batch_first: bool,
                  enforce_sorted: bool) -> PackedSequence:
    return _torch_packing.pack_padded_sequence(input, lengths, batch_first, enforce_sorted)


@torch.jit.unused
def _generic_pad(sequence: PackedSequence, batch_first: bool, padding_value: float,
                 total_length: Optional[int]) -> Tuple[Tensor, Tensor]:
    return _torch_packing.pad_packed_sequence(sequence, batch_first, padding_value, total_length)


def _no_indices(sorted_indices: Tensor) -> bool:
    """Whether the operator returned no indices. Under torch.jit.trace (and so
    torch.onnx.export) the test would warn that the trace might not generalise:
    either answer gives a graph that is right for any lengths (with no indices
    the layers and pad_packed_sequence keep the packed order, which is then the
    caller's), so the warning is silenced there. Not compiled by TorchScript
    (pack_padded_sequence tests the indices itself when scripted)."""
    if not torch.jit.is_tracing():
        return sorted_indices.numel() == 0
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return bool(sorted_indices.numel() == 0)


if hasattr(torch.nn.utils.rnn, "PackedSequence_"):
    class _TracedPackedSequence(PackedSequence, torch.nn.utils.rnn.PackedSequence_):
        """A PackedSequence that Dynamo can make. PackedSequence's own __new__
        (which checks its arguments) makes Dynamo stop at the constructor
        ("call_function UserDefinedClassVariable(PackedSequence)", PyTorch 2.6);
        with the plain namedtuple's __new__ Dynamo sees a namedtuple, and the
        result is still an instance of PackedSequence. The packing operators
        made the fields, so there is nothing to check."""
        __slots__ = ()
        __new__ = torch.nn.utils.rnn.PackedSequence_.__new__
else:  # no Dynamo to serve
    _TracedPackedSequence = PackedSequence


@torch.jit.unused
def _traced_packed(data: Tensor, batch_sizes: Tensor, sorted_indices: Optional[Tensor],
                   unsorted_indices: Optional[Tensor]) -> PackedSequence:
    return _TracedPackedSequence(data, batch_sizes, sorted_indices, unsorted_indices)


@torch.jit.unused
def _lengths_tensor(lengths, where: str) -> Tensor:
    """`lengths` as pack_padded_sequence and the layers' forward take them (an
    integer tensor, a list or tuple of ints, a NumPy integer array) -> an int64
    tensor; anything else is a TypeError naming it."""
    if not isinstance(lengths, torch.Tensor):
        try:
            t = torch.as_tensor(lengths)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"{where}: lengths must be a 1-D integer tensor or a list or tuple of "
                            f"ints, got {type(lengths).__name__} ({e})") from None
        if t.numel() == 0:  # [] is a float32 tensor to torch.as_tensor
            t = t.to(torch.int64)
    else:
        t = lengths
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{where}: lengths has dtype {t.dtype}; lengths are whole numbers: pass an "
                        f"integer tensor (int64, int32, ...) or a list of ints, e.g. lengths.long()")
    t = t if t.dtype == torch.int64 else t.to(torch.int64)
    return t.cpu()  # as PyTorch 2.x takes them (self for a CPU tensor)


# What _symbolic and _compiling ask torch, looked up once: on torch 1.x none of
# them exists, and a getattr that misses raises (and formats) an AttributeError
# inside, four of them per forward.
_SYM_INT = getattr(torch, "SymInt", None)
_IS_COMPILING = getattr(getattr(torch, "compiler", None), "is_compiling", None)
_TORCH_1 = torch.__version__.startswith("1.")  # no torch.compile at all


@torch.jit.unused
def _symbolic(t: Tensor) -> bool:
    """True when `t` has a symbolic size: it is being traced by torch.compile or
    torch.export with dynamic shapes, or is the output of an operator whose
    output size depends on values (the packing operators' fake implementations)."""
    return _SYM_INT is not None and any(isinstance(n, _SYM_INT) for n in t.shape)


@torch.jit.unused
def _compiling() -> bool:
    """Inside torch.compile or torch.export (PyTorch 2.x; never on 1.13)."""
    if _IS_COMPILING is not None:
        return _IS_COMPILING()
    if _TORCH_1:
        return False
    dynamo = getattr(torch, "_dynamo", None)
    return dynamo is not None and dynamo.is_compiling()


@torch.jit.unused
def _traced(t: Tensor) -> bool:
    return _compiling() or _symbolic(t)


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False,
                        padding_value: float = 0.0,
                        total_length: Optional[int] = None) -> Tuple[Tensor, Tensor]:
    """torch.nn.utils.rnn.pad_packed_sequence, accepting zero-length sequences, on
    any device and dtype (as pack_padded_sequence). The lengths are int64 on
    the CPU, in the caller's order."""
    if not torch.jit.is_scripting() and not _operators_take(sequence.data):
        return _generic_pad(sequence, batch_first, padding_value, total_length)
    return torch.ops.seqpack.pad_packed_sequence(
        sequence.data, sequence.batch_sizes, sequence.sorted_indices, sequence.unsorted_indices,
        batch_first, padding_value, total_length)


def pack_sequence(sequences: List[Tensor], enforce_sorted: bool = True) -> PackedSequence:
    """torch.nn.utils.rnn.pack_sequence, accepting zero-length sequences, on any
    device and dtype: one concatenation and one gather (no padded batch in
    between). As pack_padded_sequence, the indices are kept with
    enforce_sorted when some sequence is empty. Not for TorchScript."""
    return _torch_packing.pack_sequence(sequences, enforce_sorted)


def pad_sequence(sequences: List[Tensor], batch_first: bool = False,
                 padding_value: float = 0.0, padding_side: str = "right") -> Tensor:
    """torch.nn.utils.rnn.pad_sequence (torch's own: any device and dtype),
    with padding_side="left" on every PyTorch version (1.13's has no padding_side)."""
    if padding_side == "right":
        return _torch_orig.pad_sequence(sequences, batch_first, padding_value)
    if padding_side != "left":
        raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    if not torch.jit.is_scripting() and not _iterable(sequences):
        # torch's error for it (its type and message differ between versions)
        return _torch_orig.pad_sequence(sequences, batch_first, padding_value)
    flipped = [s.flip(0) for s in sequences]
    return _torch_orig.pad_sequence(flipped, batch_first, padding_value).flip(
        1 if batch_first else 0)


@torch.jit.unused
def _iterable(x) -> bool:
    try:
        iter(x)
    except TypeError:
        return False
    return True


def unpad_sequence(padded_sequences: Tensor, lengths, batch_first: bool = False) -> List[Tensor]:
    """torch.nn.utils.rnn.unpad_sequence, on any device and dtype: one gather,
    the sequences views of its result. Unlike torch's, it never modifies its
    input, and lengths are checked as pack_padded_sequence checks them (a
    length beyond the padded length is a ValueError, where torch's cuts)."""
    lengths = _lengths_tensor(lengths, "unpad_sequence")
    return _torch_packing.unpad_sequence(padded_sequences, lengths, batch_first)


def unpack_sequence(packed_sequences: PackedSequence) -> List[Tensor]:
    """torch.nn.utils.rnn.unpack_sequence, on any device and dtype: one gather.
    A batch holding zero-length sequences unpacks (they come back as [0, *]
    tensors; torch's raises IndexError)."""
    return _torch_packing.unpack_sequence(packed_sequences)


def invert_permutation(permutation: Optional[Tensor]) -> Optional[Tensor]:
    """torch.nn.utils.rnn.invert_permutation: None for None, any device."""
    if permutation is None:
        return None
    output = torch.empty_like(permutation, memory_format=torch.legacy_contiguous_format)
    output.scatter_(0, permutation,
                    torch.arange(0, permutation.numel(), device=permutation.device))
    return output


@torch.jit.unused
def _new_packed(data: Tensor, like: PackedSequence) -> PackedSequence:
    """PackedSequence(data, like.batch_sizes, like.sorted_indices,
    like.unsorted_indices) without the constructor's checks (a tenth of the time)."""
    if _traced(data):
        return _traced_packed(data, like.batch_sizes, like.sorted_indices, like.unsorted_indices)
    return tuple.__new__(PackedSequence,
                         (data, like.batch_sizes, like.sorted_indices, like.unsorted_indices))


# The operators' fake implementations (PyTorch 2.4+): seqpack/_torch_fakes.py.
_torch_fakes.register("seqpack")
