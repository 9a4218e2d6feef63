"""seqpack.torch's operators and packing functions: loads libseqpack_torch
(torch.ops.seqpack.*), defines the packing functions seqpack.torch exports
(pack_padded_sequence, pad_packed_sequence, pack_sequence, pad_sequence,
unpack_sequence, unpad_sequence, invert_permutation), the helpers that tell a
call traced by torch.compile or torch.export from an eager one, and the
operators' fake implementations (PyTorch 2.4+) that those traces run.

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

from . import _torch_orig, _torch_packing

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
_IS_COMPILING = getattr(getattr(torch, "compiler", None), "is_compiling", None)  # as _cuda.py's
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


# ---- fake implementations (PyTorch 2.4+) ---------------------------------
# What torch.compile and torch.export run instead of the operators while they
# trace: the outputs' shapes and dtypes, no computation. The packed row count
# (the sum of the lengths) and the number of time steps (the longest length)
# depend on the lengths' values, so pack_padded_sequence's fake makes them
# unbacked sizes (ctx.new_dynamic_size()); the batch size is the lengths' size
# and stays a known (possibly symbolic) size through the indices. Autograd is
# the operators' C++ autograd kernels, whose forward and backward call
# operators (seqpack::_rnn_train, _rnn_backward, _*_backward) with fakes here.
# PyTorch before 2.4 has no torch.library.register_fake: nothing is registered
# and torch.compile cannot trace the operators.


def _is_unbacked(n) -> bool:
    if not isinstance(n, torch.SymInt):
        return False
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    return bool(free_unbacked_symbols(n))


def _dynamic_size(ctx):
    """A size known only when the graph runs (an unbacked symbol). Dynamo's
    ctx.new_dynamic_size() refuses unless torch._dynamo.config.
    capture_dynamic_output_shape_ops (a graph break at every operator with such
    outputs: torch's own pack_padded_sequence); seqpack's operators opt in on
    their own, with the same symbol from the same ShapeEnv, so a packed model
    compiles with fullgraph=True without changing that setting for other code."""
    try:
        return ctx.new_dynamic_size()
    except torch._subclasses.fake_tensor.DynamicOutputShapeException:
        shape_env = getattr(ctx, "_shape_env", None)
        if shape_env is None:
            raise
        n = shape_env.create_unbacked_symint()
        torch._check_is_size(n)
        return n


def _fake_batch(ctx, h0: Optional[Tensor], sorted_indices: Optional[Tensor]):
    """The batch size of a packed batch as the operators find it: the indices'
    size where there are indices (an empty index tensor stands for none), else
    the first batch size, a value."""
    if sorted_indices is not None:
        n = sorted_indices.size(0)
        if not _is_unbacked(n) and n != 0:
            return n
    if h0 is not None:
        return h0.size(1)
    return _dynamic_size(ctx)


def _fake_rnn(data, batch_sizes, sorted_indices, unsorted_indices, h0, c0, weights, mode,
              hidden_size, num_layers, bias, bidirectional, proj_size, dropout, train, seed=None,
              precision="fp32"):
    ctx = torch.library.get_ctx()
    directions = 2 if bidirectional else 1
    real_hidden = proj_size if proj_size > 0 else hidden_size
    batch = _fake_batch(ctx, h0, sorted_indices)
    output = data.new_empty((data.size(0), directions * real_hidden))
    return (output,) + _fake_states(data, mode, num_layers * directions, batch, hidden_size,
                                    real_hidden)


def _fake_states(like, mode, layers, batch, hidden_size, real_hidden):
    """h_n and c_n (empty but for LSTM) of the fake implementations."""
    h_n = like.new_empty((layers, batch, real_hidden))
    c_n = like.new_empty((layers, batch, hidden_size) if mode == "LSTM" else (0,))
    return h_n, c_n


def _fake_rnn_train(*args, **kwargs):
    output, h_n, c_n = _fake_rnn(*args, **kwargs)
    return output, h_n, c_n, output.new_empty((1,), dtype=torch.uint8)


def _fake_rnn_backward(saved, grad_output, grad_h_n, grad_c_n, data, h0, c0, weights, input_grad,
                       state_grad):
    empty = data.new_empty((0,))
    return (data.new_empty(data.shape) if input_grad else empty,
            h0.new_empty(h0.shape) if state_grad and h0 is not None else empty,
            c0.new_empty(c0.shape) if state_grad and c0 is not None else data.new_empty((0,)),
            [w.new_empty(w.shape) for w in weights])


def _fake_rnn_padded(input, lengths, h0, c0, weights, mode, hidden_size, num_layers, bias,
                     batch_first, bidirectional, proj_size, dropout, train, seed=None,
                     precision="fp32"):
    directions = 2 if bidirectional else 1
    real_hidden = proj_size if proj_size > 0 else hidden_size
    T, B = (input.size(1), input.size(0)) if batch_first else (input.size(0), input.size(1))
    if lengths is not None or not batch_first:  # padded by pad_packed_sequence, or a view
        shape = (B, T) if batch_first else (T, B)
        output = input.new_empty(shape + (directions * real_hidden,))
    else:
        output = input.new_empty((T, B, directions * real_hidden)).transpose(0, 1)
    return (output,) + _fake_states(input, mode, num_layers * directions, B, hidden_size,
                                    real_hidden)


def _fake_rnn_nested(values, offsets, h0, c0, weights, mode, hidden_size, num_layers, bias,
                     bidirectional, proj_size, dropout, train, seed=None, precision="fp32"):
    directions = 2 if bidirectional else 1
    real_hidden = proj_size if proj_size > 0 else hidden_size
    output = values.new_empty((values.size(0), directions * real_hidden))
    return (output,) + _fake_states(values, mode, num_layers * directions, offsets.size(0) - 1,
                                    hidden_size, real_hidden)


def _fake_rnn_nested_train(*args, **kwargs):
    output, h_n, c_n = _fake_rnn_nested(*args, **kwargs)
    return output, h_n, c_n, output.new_empty((1,), dtype=torch.uint8)


def _fake_rnn_nested_backward(saved, offsets, grad_output, grad_h_n, grad_c_n, values, h0, c0,
                              weights, input_grad, state_grad):
    return _fake_rnn_backward(saved, grad_output, grad_h_n, grad_c_n, values, h0, c0, weights,
                              input_grad, state_grad)


def _fake_pack(input, lengths, batch_first=False, enforce_sorted=True):
    ctx = torch.library.get_ctx()
    rows = _dynamic_size(ctx)  # sum(lengths)
    steps = _dynamic_size(ctx)  # max(lengths)
    # Without enforce_sorted the indices are the batch's; with it they are
    # there only when some sequence is empty.
    n = _dynamic_size(ctx) if enforce_sorted else lengths.size(0)
    index = lengths.new_empty((n,), dtype=torch.int64)
    return (input.new_empty((rows,) + tuple(input.shape[2:])),
            lengths.new_empty((steps,), dtype=torch.int64), index, index.new_empty((n,)))


def _fake_pad(data, batch_sizes, sorted_indices, unsorted_indices, batch_first=False,
              padding_value=0.0, total_length=None):
    ctx = torch.library.get_ctx()
    steps = batch_sizes.size(0) if total_length is None else total_length
    batch = _fake_batch(ctx, None, sorted_indices)
    shape = (batch, steps) if batch_first else (steps, batch)
    return (data.new_empty(shape + tuple(data.shape[1:])),
            batch_sizes.new_empty((batch,), dtype=torch.int64))


def _fake_sized(grad, batch_sizes, sorted_indices, unsorted_indices, size, batch_first):
    return grad.new_empty(tuple(size))


def _register_fakes():
    register = getattr(torch.library, "register_fake", None)
    # Once per process (a re-import of this module finds them registered:
    # register_fake also registers a Meta kernel).
    if register is None or torch._C._dispatch_has_kernel_for_dispatch_key("seqpack::rnn", "Meta"):
        return
    for name, fake in [("rnn", _fake_rnn), ("_rnn_train", _fake_rnn_train),
                       ("_rnn_backward", _fake_rnn_backward), ("rnn_padded", _fake_rnn_padded),
                       ("rnn_nested", _fake_rnn_nested),
                       ("_rnn_nested_train", _fake_rnn_nested_train),
                       ("_rnn_nested_backward", _fake_rnn_nested_backward),
                       ("pack_padded_sequence", _fake_pack), ("pad_packed_sequence", _fake_pad),
                       ("_pack_padded_sequence_backward", _fake_sized),
                       ("_pad_packed_sequence_backward", _fake_sized)]:
        register("seqpack::" + name, fake)


_register_fakes()
