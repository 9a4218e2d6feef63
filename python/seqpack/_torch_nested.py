"""Jagged nested tensors (torch.nested.nested_tensor(seqs, layout=torch.jagged),
PyTorch 2.6+) for seqpack.torch: pack_nested and to_nested (the conversions
to and from a PackedSequence, and from a padded batch with lengths), and the
layers' forward on a nested tensor (`forward`).

A contiguous CPU nested tensor that seqpack's kernels run goes to the operator
seqpack::rnn_nested as its values and offsets (seqpack_torch/ops.cpp: the plan
from the offsets and the row copies between the values' order and the packed
order in C++), linked to the nested tensors around it by _ValuesOfNested and
_NestedOfValues (under torch.compile by torch's values() and
nested_tensor_from_jagged). Any other (CUDA, torch's dtypes, one with lengths)
runs the layer's packed forward on a PackedSequence made as below.

A jagged nested tensor of shape (batch, ragged steps, features) keeps every
sequence's rows end to end in one values tensor, sequence b at rows
offsets[b]:offsets[b + 1] (or offsets[b]:offsets[b] + lengths[b] for a
non-contiguous one). A PackedSequence keeps the same rows step by step, the
sequences of each step in decreasing length. Between the two is one gather
(index_select, on the data's device, differentiable) by a plan made from the
offsets on the CPU; where the gather would be the identity (one non-empty
sequence, or no sequence longer than one step) the data is passed through
uncopied. The PackedSequence is the one pack_sequence(seqs,
enforce_sorted=False) makes: sorted by decreasing length (stable), with
indices, zero-length sequences kept (they get no rows, h_n is h0 for them).

Under autograd the rows go in and out through _RowsOfNested and _NestedOfRows,
whose backward make one nested tensor each (torch's values() view and
nested_tensor_from_jagged would add nested operations, each a Python dispatch).
Under torch.compile the plan is the custom operator seqpack_nested::plan,
whose fake implementation gives the packed step count an unbacked size (as
seqpack::pack_padded_sequence's does), so a layer fed a nested tensor traces
into one graph (fullgraph=True) with seqpack::rnn.

A private module (STYLE.md: modules import downward only): it imports
_torch_ops and _torch_packing; _torch_layers calls `forward`, seqpack.torch
re-exports pack_nested and to_nested.
"""
from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence

from . import _torch_packing
from ._torch_ops import _compiling, _dynamic_size, _lengths_tensor, _traced_packed


def _version(v: str) -> Tuple[int, int]:
    parts = v.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return 0, 0


MIN_TORCH = (2, 6)
# nested_tensor_from_jagged and jagged NJTs under autograd and Dynamo as seqpack
# uses them are tested on PyTorch 2.6 (torch.jagged itself came earlier, with
# gaps: older versions are refused rather than half-working).
HAS_JAGGED = hasattr(torch, "jagged") and _version(torch.__version__) >= MIN_TORCH
if HAS_JAGGED:
    from torch.nested._internal.nested_tensor import NestedTensor as _JAGGED_CLASS
    from torch.nested._internal.nested_tensor import ViewNestedFromBuffer as _ViewNested
else:
    _JAGGED_CLASS = _ViewNested = None


# PyTorch 2.6's NestedTensor.__init__ spends most of a nested tensor's
# construction (~45 of ~60 µs) in torch._dynamo.maybe_mark_dynamic, whose only
# effect is the two index sets _make_nested writes; on 2.6 (checked by
# test_torch_nested.py against torch's own constructor) seqpack makes its
# nested tensors that way, on any other version with the constructor.
_FAST_NESTED = HAS_JAGGED and _version(torch.__version__) == (2, 6)


def _make_nested(values: Tensor, offsets: Tensor, lengths: Optional[Tensor] = None) -> Tensor:
    """NestedTensor(values, offsets, lengths=lengths) with ragged dimension 1, not
    differentiable (the autograd functions below link it)."""
    if not _FAST_NESTED:
        return _JAGGED_CLASS(values, offsets, lengths=lengths, _ragged_idx=1)
    r = _JAGGED_CLASS.__new__(_JAGGED_CLASS, values, offsets, lengths=lengths, _ragged_idx=1)
    r._values, r._offsets, r._lengths, r._metadata_cache = values, offsets, lengths, {}
    # maybe_mark_dynamic(r, 1) and maybe_mark_dynamic(values, 0): the ragged
    # dimension stays dynamic if the tensor meets torch.compile later.
    r._dynamo_weak_dynamic_indices = {1}
    if not hasattr(values, "_dynamo_weak_dynamic_indices"):
        values._dynamo_weak_dynamic_indices = set()
    values._dynamo_weak_dynamic_indices.add(0)
    return r


def _require_jagged(where: str) -> None:
    if not HAS_JAGGED:
        raise RuntimeError(
            f"{where}: nested tensors need PyTorch {MIN_TORCH[0]}.{MIN_TORCH[1]} or later (jagged "
            f"layout, torch.nested.nested_tensor(seqs, layout=torch.jagged)); this is PyTorch "
            f"{torch.__version__}: pass a PackedSequence (seqpack.torch.pack_sequence) or a "
            f"padded batch with lengths instead")


def check(input: Tensor, where: str) -> None:
    """A nested tensor seqpack takes: jagged layout, (batch, ragged steps, features).
    (The jagged class's own attributes: its layout and dim() cost several µs each,
    through torch's __torch_function__.)"""
    _require_jagged(where)
    if not isinstance(input, _JAGGED_CLASS):
        raise ValueError(f"{where}: the nested tensor has layout {input.layout}; seqpack takes "
                         f"layout=torch.jagged (torch.nested.nested_tensor(seqs, "
                         f"layout=torch.jagged))")
    if input._values.dim() != 2 or input._ragged_idx != 1:
        raise ValueError(f"{where}: the nested tensor must have shape (batch, ragged steps, "
                         f"features), got {input.dim()}-D with ragged dimension "
                         f"{input._ragged_idx} (shape {list(input.shape)})")


def _is_nested(x) -> bool:
    return isinstance(x, Tensor) and x.is_nested


# ---- the plan ----------------------------------------------------------------

def _plan(offsets: Tensor, lengths: Optional[Tensor]
          ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, int, bool]:
    """From a nested tensor's offsets (and lengths, where it is not contiguous):
    (gather: the values row of each packed row, in packed order; scatter: the
    packed row of each values row (contiguous only, else empty); batch_sizes;
    sorted_indices; unsorted_indices; the longest length; whether gather is the
    identity). int64 tensors on the CPU, made in NumPy (a few µs per operation
    fewer than torch's on these small arrays: the plan is most of what a nested
    forward adds to a packed one)."""
    off = offsets.detach().to(device="cpu", dtype=torch.int64).numpy()
    starts = off[:-1]
    if lengths is None:
        lens = off[1:] - starts
    else:
        lens = lengths.detach().to(device="cpu", dtype=torch.int64).numpy()
    B = lens.shape[0]
    order = np.argsort(-lens, kind="stable")
    sorted_lengths = lens[order]
    T = int(sorted_lengths[0]) if B else 0
    present = sorted_lengths[None, :] > np.arange(T)[:, None]  # [T, B]
    t, k = np.nonzero(present)  # row-major: the packed order
    gather = starts[order[k]] + t
    batch_sizes = present.sum(1)
    unsorted = np.empty_like(order)
    unsorted[order] = np.arange(B)
    identity = lengths is None and (T <= 1 or int(batch_sizes[0]) <= 1)
    if lengths is None:
        scatter = np.empty_like(gather)
        scatter[gather] = np.arange(gather.shape[0])
    else:
        scatter = gather[:0]
    as_torch = torch.from_numpy
    return (as_torch(gather), as_torch(scatter), as_torch(batch_sizes.astype(np.int64)),
            as_torch(order), as_torch(unsorted), T, identity)


if hasattr(torch.library, "custom_op"):
    @torch.library.custom_op("seqpack_nested::plan", mutates_args=())
    def _plan_op(offsets: Tensor, rows: int) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """_plan of a contiguous nested tensor as one operator (what torch.compile
        traces): gather, scatter and the indices on the offsets' device,
        batch_sizes on the CPU. `rows`: the values' row count."""
        gather, scatter, batch_sizes, order, unsorted, _, _ = _plan(offsets, None)
        d = offsets.device
        return gather.to(d), scatter.to(d), batch_sizes, order.to(d), unsorted.to(d)

    @_plan_op.register_fake
    def _plan_fake(offsets, rows):
        ctx = torch.library.get_ctx()
        steps = _dynamic_size(ctx)  # the longest length
        B = offsets.size(0) - 1
        index = offsets.new_empty((rows,), dtype=torch.int64)
        return (index, torch.empty_like(index), torch.empty((steps,), dtype=torch.int64),
                offsets.new_empty((B,), dtype=torch.int64),
                offsets.new_empty((B,), dtype=torch.int64))


class _RowsOfNested(torch.autograd.Function):
    """A contiguous nested tensor's values gathered by `gather` (the packed rows),
    differentiable into the nested tensor itself: its gradient is made as one
    nested tensor of the rows scattered back (torch's values() view would add
    a nested tensor operation or two, each a Python dispatch, per backward)."""

    @staticmethod
    def forward(ctx, input, gather, scatter):
        ctx.scatter, ctx.offsets = scatter, input._offsets
        return input._values.index_select(0, gather)

    @staticmethod
    def backward(ctx, grad):
        return _make_nested(grad.index_select(0, ctx.scatter), ctx.offsets), None, None


class _NestedOfRows(torch.autograd.Function):
    """Packed rows -> the contiguous nested tensor of `offsets`, the rows in its order
    (`scatter`), differentiable: the gradient is the nested gradient's values
    gathered back (`gather`)."""

    @staticmethod
    def forward(ctx, data, scatter, gather, offsets):
        ctx.gather = gather
        return _make_nested(data.index_select(0, scatter), offsets)

    @staticmethod
    def backward(ctx, grad):
        values = grad._values if isinstance(grad, _JAGGED_CLASS) else grad.values()
        return values.index_select(0, ctx.gather), None, None, None


class _Layout:
    """What a nested tensor's packing remembers to unpack a result into its
    layout: its offsets and lengths, values row count, scatter, gather, and
    whether the gather was the identity."""
    __slots__ = ("offsets", "lengths", "rows", "gather", "scatter", "identity", "longest")

    def __init__(self, offsets, lengths, rows, gather, scatter, identity, longest):
        self.offsets, self.lengths, self.rows = offsets, lengths, rows
        self.gather, self.scatter, self.identity, self.longest = gather, scatter, identity, longest


def _pack(input: Tensor) -> Tuple[PackedSequence, _Layout]:
    offsets = input._offsets
    lengths = input._lengths
    rows = input._values.size(0)
    # Under autograd the rows are taken through a differentiable function of the
    # nested tensor (values(), or _RowsOfNested); without it from its buffer itself.
    grad = torch.is_grad_enabled() and input.requires_grad
    if _compiling():
        if lengths is not None:
            raise NotImplementedError(
                "seqpack.torch under torch.compile takes contiguous nested tensors only (this "
                "one has lengths: a narrowed or sliced one); pass nt.contiguous()")
        gather, scatter, batch_sizes, order, unsorted = torch.ops.seqpack_nested.plan(
            offsets, rows)
        data = input.values().index_select(0, gather)
        packed = _traced_packed(data, batch_sizes, order, unsorted)
        return packed, _Layout(offsets, None, rows, gather, scatter, False, None)
    if offsets.is_meta:
        raise NotImplementedError(
            "seqpack.torch: the nested tensor's offsets are on the meta device, which holds no "
            "values: packing it needs them (its lengths decide the packed order); make the "
            "nested tensor on a real device")
    gather, scatter, batch_sizes, order, unsorted, T, identity = _plan(offsets, lengths)
    device = input._values.device
    gather, scatter = gather.to(device), scatter.to(device)
    if identity:
        data = input.values() if grad else input._values
    elif grad and lengths is None:
        data = _RowsOfNested.apply(input, gather, scatter)
    else:
        data = (input.values() if grad else input._values).index_select(0, gather)
    packed = tuple.__new__(PackedSequence, (data, batch_sizes, order.to(device),
                                            unsorted.to(device)))
    return packed, _Layout(offsets, lengths, rows, gather, scatter, identity, T)


def _unpack(data: Tensor, layout: _Layout) -> Tensor:
    """Packed rows of the layout's batch (any trailing shape) -> the nested tensor with
    its offsets (and lengths: the rows between sequences are then zeros)."""
    if (layout.lengths is None and not layout.identity and data.requires_grad
            and not _compiling()):
        return _NestedOfRows.apply(data, layout.scatter, layout.gather, layout.offsets)
    if layout.identity:
        values = data
    elif layout.lengths is None:
        values = data.index_select(0, layout.scatter)
    else:
        values = data.new_zeros((layout.rows,) + tuple(data.shape[1:])).index_copy(
            0, layout.gather, data)
    if _compiling():
        return torch.nested.nested_tensor_from_jagged(values, layout.offsets)
    if values.requires_grad:
        if layout.lengths is not None:
            return torch.nested.nested_tensor_from_jagged(values, layout.offsets,
                                                          lengths=layout.lengths)
        # torch's differentiable view (what nested_tensor_from_jagged makes of
        # values and offsets), without its dispatch through an operator.
        return _ViewNested.apply(values, layout.offsets)
    return _make_nested(values, layout.offsets, layout.lengths)


# ---- public conversions -------------------------------------------------------

def pack_nested(input: Tensor) -> PackedSequence:
    """Jagged nested tensor (batch, ragged steps, *) -> PackedSequence, as
    pack_sequence(input.unbind(), enforce_sorted=False) makes it (with indices;
    zero-length sequences kept). One gather of the values on their device
    (differentiable), none where the packed order is the values' own."""
    if not _is_nested(input):
        raise TypeError(f"seqpack.torch.pack_nested: input must be a nested tensor "
                        f"(torch.nested.nested_tensor(seqs, layout=torch.jagged)), got "
                        f"{_describe(input)}")
    _require_jagged("seqpack.torch.pack_nested")
    if not isinstance(input, _JAGGED_CLASS) or input._ragged_idx != 1:
        raise ValueError(f"seqpack.torch.pack_nested: the nested tensor must have layout "
                         f"torch.jagged with its ragged dimension 1 (batch, ragged steps, *), "
                         f"got layout {input.layout}, shape {list(input.shape)}")
    return _pack(input)[0]


def to_nested(input, lengths=None, batch_first: bool = False) -> Tensor:
    """PackedSequence -> jagged nested tensor (batch, ragged steps, *), the
    sequences in the caller's order (zero-length ones kept); or a padded batch
    (T, B, *) ((B, T, *) with batch_first) with `lengths` (every sequence T
    steps when None) -> the same. One gather on the data's device
    (differentiable), none where the values are the data's rows in order (a
    view where they are a prefix of them)."""
    where = "seqpack.torch.to_nested"
    _require_jagged(where)
    if isinstance(input, PackedSequence):
        if lengths is not None:
            raise ValueError(f"{where}: lengths is for a padded batch; a PackedSequence has its "
                             f"own")
        return _packed_to_nested(input, where)
    if not isinstance(input, Tensor) or input.is_nested:
        raise TypeError(f"{where}: input must be a PackedSequence or a padded tensor, got "
                        f"{_describe(input)}")
    if input.dim() < 2:
        raise ValueError(f"{where}: a padded batch has time and batch dimensions, got shape "
                         f"{list(input.shape)}")
    T, B = (input.size(1), input.size(0)) if batch_first else (input.size(0), input.size(1))
    if lengths is None:
        lengths = torch.full((B,), T, dtype=torch.int64)
    else:
        lengths = _lengths_tensor(lengths, where)
    _torch_packing.check_lengths(input, lengths, batch_first, False, where)
    present = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)  # [B, T]: caller's order
    b, t = present.nonzero(as_tuple=True)
    flat = b * T + t if batch_first else t * B + b
    rows = input.flatten(0, 1)
    n = flat.numel()
    if n == 0 or (int(flat[-1]) == n - 1 and torch.equal(flat, torch.arange(n))):
        values = rows.narrow(0, 0, n)
    else:
        values = rows.index_select(0, flat.to(input.device))
    offsets = torch.zeros(B + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return torch.nested.nested_tensor_from_jagged(
        values, offsets.to(input.device), max_seqlen=int(lengths.max()) if B else None)


def _packed_to_nested(packed: PackedSequence, where: str) -> Tensor:
    data = packed.data
    _torch_packing.check_packed(data, packed.batch_sizes, packed.sorted_indices, where)
    sorted_lengths, order, t, k = _torch_packing._packed_plan(packed.batch_sizes,
                                                              packed.sorted_indices)
    B = order.numel()
    lengths = torch.empty(B, dtype=torch.int64)
    lengths[order] = sorted_lengths
    offsets = torch.zeros(B + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    T = packed.batch_sizes.numel()
    # The values row of each packed row; the identity where the packed order is
    # the caller's (no sequence longer than one step and the indices in order,
    # or one non-empty sequence).
    gather = offsets[:-1][order[k]] + t
    n = gather.numel()
    if n == 0 or torch.equal(gather, torch.arange(n)):
        values = data
    else:
        scatter = torch.empty_like(gather)
        scatter[gather] = torch.arange(n)
        values = data.index_select(0, scatter.to(data.device))
    return torch.nested.nested_tensor_from_jagged(values, offsets.to(data.device),
                                                  max_seqlen=T if T else None)


def _describe(x) -> str:
    if isinstance(x, Tensor):
        kind = "a nested tensor" if x.is_nested else "a tensor"
        return f"{kind} of layout {x.layout}, dtype {x.dtype}"
    return type(x).__name__


# ---- the layers ----------------------------------------------------------------

def forward(layer, input: Tensor, h0: Optional[Tensor], c0: Optional[Tensor],
            lengths) -> Tuple[Tensor, Tensor, Tensor]:
    """A seqpack.torch layer's forward on a jagged nested tensor (batch, ragged
    steps, input_size): seqpack::rnn_nested on its values where it can
    (_forward_in_place), else its packed forward on pack_nested(input); states
    in the caller's batch order (as for padded input), the output a nested
    tensor with the input's offsets. -> (output, h_n, c_n)."""
    where = f"seqpack.torch.{type(layer).__name__}"
    if lengths is not None:
        raise ValueError(f"{where}: lengths is for a padded input; a nested tensor has its own "
                         f"(its offsets)")
    check(input, where)
    values, offsets = input._values, input._offsets
    if (input._lengths is None and values.is_cpu and offsets.dtype == torch.int64
            and layer.dropout < 1.0 and not layer._exporting_onnx()
            and not layer._autocast_bf16(values) and layer._seqpack_can_run(values, h0, c0)):
        if _compiling():
            # What Dynamo traces: torch's own links between the nested tensors and
            # their values around the operator (whose fake needs no unbacked size).
            out, h_n, c_n = _rnn_nested(layer, input.values(), offsets, h0, c0)
            return torch.nested.nested_tensor_from_jagged(out, offsets), h_n, c_n
        return _forward_in_place(layer, input, h0, c0)
    packed, layout = _pack(input)
    out, h_n, c_n = layer._forward_packed(packed, h0, c0, None)
    return _unpack(out.data, layout), h_n, c_n


class _ValuesOfNested(torch.autograd.Function):
    """A contiguous nested tensor's values, differentiable into the nested tensor
    itself: the gradient is made as one nested tensor of the values' gradient
    (torch's values() would add a nested tensor operation, a Python dispatch,
    each way). A backward that records a graph (create_graph) makes it with
    torch's differentiable constructor."""

    @staticmethod
    def forward(ctx, input):
        ctx.offsets = input._offsets
        return input._values.detach()

    @staticmethod
    def backward(ctx, grad):
        if torch.is_grad_enabled():
            return torch.nested.nested_tensor_from_jagged(grad, ctx.offsets)
        return _make_nested(grad, ctx.offsets)


class _NestedOfValues(torch.autograd.Function):
    """Values -> the contiguous nested tensor of `offsets`, differentiable: the
    gradient is the nested gradient's values."""

    @staticmethod
    def forward(ctx, values, offsets):
        return _make_nested(values.detach(), offsets)

    @staticmethod
    def backward(ctx, grad):
        if isinstance(grad, _JAGGED_CLASS) and not torch.is_grad_enabled():
            return grad._values, None
        return grad.values(), None


def _rnn_nested(layer, values: Tensor, offsets: Tensor, h0: Optional[Tensor],
                c0: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    return torch.ops.seqpack.rnn_nested(
        values, offsets, h0, c0, layer._flat_weights, layer.mode, layer.hidden_size,
        layer.num_layers, layer.bias, layer.bidirectional, layer.proj_size, layer.dropout,
        layer.training, None, "fp32")


def _forward_in_place(layer, input: Tensor, h0: Optional[Tensor], c0: Optional[Tensor]
                      ) -> Tuple[Tensor, Tensor, Tensor]:
    """forward on a contiguous CPU nested tensor that seqpack's operators run, in
    eager mode: seqpack::rnn_nested takes the values and offsets as they are and
    gives the output's rows in the values' order (its plan and the row copies
    into and out of the packed order in C++, no torch operation between); its
    results equal the packed forward's."""
    values, offsets = input._values, input._offsets
    layer.check_input(values, offsets)  # torch's checks of packed rows (2-D, input_size)
    layer._check_states(h0, c0, offsets.size(0) - 1)
    if torch.is_grad_enabled() and input.requires_grad:  # (a nested tensor's attribute: ~4 µs)
        values = _ValuesOfNested.apply(input)
    out, h_n, c_n = _rnn_nested(layer, values, offsets, h0, c0)
    if out.requires_grad:
        return _NestedOfValues.apply(out, offsets), h_n, c_n
    return _make_nested(out, offsets), h_n, c_n
