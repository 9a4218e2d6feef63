"""seqpack.torch's packing functions in plain torch operations: the path for
every tensor seqpack's operators do not take (another device, CUDA or meta,
and every dtype but float32/float64), and for the functions that have no
operator (pack_sequence, unpack_sequence, unpad_sequence).

Each function makes its plan once from the lengths on the CPU (batch_sizes,
the stable sort by decreasing length, and the flat index of every packed row
in the padded or concatenated input), then moves the data in one indexing
operation on its own device (index_select, or index_copy into the padding),
so autograd, CUDA and meta tensors work as with any torch operation.

The rules are the operators' (seqpack_torch/ops.cpp), with the same messages:
zero-length sequences are accepted (no packed rows; with enforce_sorted the
indices are then kept, to record the batch size), a batch of size 0 too; a
length beyond the padded length is a ValueError; where torch raises
(unsorted lengths with enforce_sorted, a negative length, a count that is not
the batch size), the exception type is torch's and the message starts with
torch's own, then seqpack's detail.

A private module below seqpack._torch_ops, whose packing functions (which
seqpack.torch re-exports) call it for what the operators do not take: it
imports nothing of seqpack's.
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence

PACK = "seqpack::pack_padded_sequence"
PAD = "seqpack::pad_packed_sequence"

# torch's messages (aten/src/ATen/native/PackedSequence.cpp), which seqpack's
# start with where torch raises for the same condition (as ops.cpp's).
TORCH_SORTED = ("`lengths` array must be sorted in decreasing order when `enforce_sorted` is "
                "True. You can pass `enforce_sorted=False` to pack_padded_sequence and/or "
                "pack_sequence to sidestep this requirement if you do not need ONNX "
                "exportability.")
TORCH_POSITIVE = ("Length of all samples has to be greater than 0, but found an element in "
                  "'lengths' that is <= 0")


def check_lengths(input: Tensor, lengths: Tensor, batch_first: bool, enforce_sorted: bool,
                  where: str) -> None:
    """The operators' checks of (padded input, int64 CPU lengths), with their
    messages and torch's exception types (check_lengths_as_torch in ops.cpp),
    then the length bound (ValueError: torch does not check it)."""
    if input.dim() < 2:
        d = max(input.dim(), 1)  # a 0-D tensor's range is a 1-D's
        raise IndexError(f"Dimension out of range (expected to be in range of [{-d}, {d - 1}], "
                         f"but got 1); {where}: input must have at least 2 dimensions "
                         f"(time and batch), got shape {list(input.shape)}")
    if lengths.dim() != 1:
        raise RuntimeError(f"'lengths' argument should be a 1D CPU int64 tensor, but got "
                           f"{lengths.dim()}D cpu Long tensor; {where}: lengths must be 1-D, "
                           f"got shape {list(lengths.shape)}")
    batch = input.size(0 if batch_first else 1)
    T = input.size(1 if batch_first else 0)
    bf = " (batch_first=true)" if batch_first else " (batch_first=false)"
    n = lengths.numel()
    if n != batch:
        raise RuntimeError(f"Expected `len(lengths)` to be equal to batch_size, but got {n} "
                           f"(batch_size={batch}); {where}: got {n} lengths but the input of shape "
                           f"{list(input.shape)} has batch size {batch}{bf}")
    if n == 0:
        return
    negative = (lengths < 0).nonzero()
    if enforce_sorted and n > 1:
        rising = (lengths[1:] > lengths[:-1]).nonzero()
        first_rise = int(rising[0]) + 1 if rising.numel() else n
    else:
        first_rise = n
    first_negative = int(negative[0]) if negative.numel() else n
    # The first offending entry, as the operators' loop finds it.
    if first_negative < n and first_negative <= first_rise:
        b = first_negative
        raise RuntimeError(f"{TORCH_POSITIVE}; {where}: lengths[{b}] = {int(lengths[b])} is "
                           f"negative (zero-length sequences are accepted)")
    if first_rise < n:
        b = first_rise
        raise RuntimeError(f"{TORCH_SORTED}; {where}: lengths[{b}] = {int(lengths[b])} is greater than "
                           f"lengths[{b - 1}] = {int(lengths[b - 1])}: with enforce_sorted=true "
                           f"lengths must be sorted in decreasing order; pass "
                           f"enforce_sorted=false to accept unsorted lengths")
    over = (lengths > T).nonzero()
    if over.numel():
        b = int(over[0])
        raise ValueError(f"{where}: lengths[{b}] = {int(lengths[b])} exceeds the padded length "
                         f"{T} of the input of shape {list(input.shape)}{bf}")


def _order(lengths: Tensor, enforce_sorted: bool) -> Tuple[Tensor, Tensor]:
    """(lengths in packed order, caller's index of each): a stable sort by
    decreasing length (ties keep the caller's order), or none."""
    if enforce_sorted:
        return lengths, torch.arange(lengths.numel())
    return torch.sort(lengths, descending=True, stable=True)


def _steps(sorted_lengths: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """(batch_sizes, step t and sorted position k of every packed row, in
    packed order): row (t, k) exists while sorted_lengths[k] > t."""
    T = int(sorted_lengths.max()) if sorted_lengths.numel() else 0
    present = sorted_lengths.unsqueeze(0) > torch.arange(T).unsqueeze(1)  # [T, B]
    t, k = present.nonzero(as_tuple=True)  # row-major: the packed order
    return present.sum(1), t, k


def _indices(order: Tensor, sorted_lengths: Tensor, enforce_sorted: bool,
             device: torch.device) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """PackedSequence's indices, on the data's device as torch puts them: none
    with enforce_sorted unless some sequence is empty (the indices then keep
    the batch size), none for a batch of size 0 (as the operators)."""
    B = order.numel()
    if B == 0 or (enforce_sorted and int(sorted_lengths[-1]) > 0):
        return None, None
    unsorted = torch.empty_like(order)
    unsorted[order] = torch.arange(B)
    return order.to(device), unsorted.to(device)


def pack_padded_sequence(input: Tensor, lengths: Tensor, batch_first: bool,
                         enforce_sorted: bool) -> PackedSequence:
    """`lengths`: int64 on the CPU (seqpack.torch converted them)."""
    check_lengths(input, lengths, batch_first, enforce_sorted, PACK)
    sorted_lengths, order = _order(lengths, enforce_sorted)
    batch_sizes, t, k = _steps(sorted_lengths)
    b = order[k]
    # Rows of the input with its first two dimensions flattened.
    flat = b * input.size(1) + t if batch_first else t * input.size(1) + b
    data = input.flatten(0, 1).index_select(0, flat.to(input.device))
    sorted_indices, unsorted_indices = _indices(order, sorted_lengths, enforce_sorted,
                                                input.device)
    return PackedSequence(data, batch_sizes, sorted_indices, unsorted_indices)


def check_packed(data: Tensor, batch_sizes: Tensor, sorted_indices: Optional[Tensor],
                 where: str) -> Tensor:
    """The operators' checks of a PackedSequence's rows (PackedSequence::validate
    in the core, with its messages), in O(steps), before any plan of O(batch)
    is made: a hand-built batch_sizes of 2e8 is refused here, not by the
    allocator. Returns batch_sizes as int64 on the CPU."""
    bs = batch_sizes.cpu().to(torch.int64)
    rows = data.size(0) if data.dim() >= 1 else 0
    if bs.numel():
        bad = (bs <= 0).nonzero()
        rising = (bs[1:] > bs[:-1]).nonzero()
        first_bad = int(bad[0]) if bad.numel() else bs.numel()
        first_rise = int(rising[0]) + 1 if rising.numel() else bs.numel()
        if first_bad < bs.numel() and first_bad <= first_rise:
            raise ValueError(f"{where}: PackedSequence: batch_sizes[{first_bad}] = "
                             f"{int(bs[first_bad])} must be positive")
        if first_rise < bs.numel():
            t = first_rise
            raise ValueError(f"{where}: PackedSequence: batch_sizes[{t}] = {int(bs[t])} is greater "
                             f"than batch_sizes[{t - 1}] = {int(bs[t - 1])}: batch_sizes must be "
                             f"non-increasing")
    total = int(bs.sum())
    if total != rows:
        raise ValueError(f"{where}: PackedSequence: batch_sizes add up to {total} rows but data "
                         f"has {rows} rows (shape {list(data.shape)})")
    if sorted_indices is not None and bs.numel() and sorted_indices.numel() < int(bs[0]):
        raise ValueError(f"{where}: PackedSequence: sorted_indices has {sorted_indices.numel()} "
                         f"entries but batch_sizes[0] = {int(bs[0])} sequences")
    return bs


def _packed_plan(batch_sizes: Tensor, sorted_indices: Optional[Tensor]
                 ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """From a PackedSequence: (lengths in packed order, caller's index of each,
    step and sorted position of every packed row). The indices' values are
    needed on the CPU (as torch's pad_packed_sequence needs them for the
    lengths): a meta PackedSequence with indices cannot be unpacked."""
    bs = batch_sizes.cpu().to(torch.int64)
    if sorted_indices is not None:
        B = sorted_indices.numel()
        order = sorted_indices.cpu().to(torch.int64)
    else:
        B = int(bs[0]) if bs.numel() else 0
        order = torch.arange(B)
    present = torch.arange(B).unsqueeze(0) < bs.unsqueeze(1)  # [T, B], sorted positions
    t, k = present.nonzero(as_tuple=True)
    return present.sum(0), order, t, k


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool, padding_value: float,
                        total_length: Optional[int]) -> Tuple[Tensor, Tensor]:
    data = sequence.data
    if total_length is not None and (isinstance(total_length, bool)
                                     or not isinstance(total_length, int)):
        raise TypeError(f"{PAD}: total_length must be an int or None (argument 'total_length'), "
                        f"got {type(total_length).__name__} {total_length!r}")
    check_packed(data, sequence.batch_sizes, sequence.sorted_indices, PAD)
    sorted_lengths, order, t, k = _packed_plan(sequence.batch_sizes, sequence.sorted_indices)
    if t.numel() != data.size(0):
        raise ValueError(f"{PAD}: data has {data.size(0)} rows but batch_sizes sum to "
                         f"{t.numel()}")
    longest = sequence.batch_sizes.numel()
    T = longest
    if total_length is not None:
        if total_length < longest:
            raise ValueError(f"Expected total_length to be at least the length of the longest "
                             f"sequence in input, but got total_length={total_length} and max "
                             f"sequence length being {longest}; "
                             f"{PAD}: total_length = {total_length} is less than the longest "
                             f"sequence's length {longest}")
        T = total_length
    B = order.numel()
    b = order[k]
    flat = b * T + t if batch_first else t * B + b
    tail = tuple(data.shape[1:])
    padded = data.new_full((T * B,) + tail, padding_value).index_copy(
        0, flat.to(data.device), data)
    padded = padded.view(((B, T) if batch_first else (T, B)) + tail)
    lengths = torch.empty(B, dtype=torch.int64)
    lengths[order] = sorted_lengths
    return padded, lengths


def pack_sequence(sequences: List[Tensor], enforce_sorted: bool) -> PackedSequence:
    sequences = list(sequences)  # torch's TypeError for what is not iterable
    if len(sequences) == 0:
        raise RuntimeError("received an empty list of sequences (seqpack.torch.pack_sequence)")
    lengths = torch.tensor([s.size(0) for s in sequences], dtype=torch.int64)
    if enforce_sorted:
        rising = (lengths[1:] > lengths[:-1]).nonzero()
        if rising.numel():
            b = int(rising[0]) + 1
            raise RuntimeError(f"{TORCH_SORTED}; "
                               f"seqpack.torch.pack_sequence: sequences[{b}] has length "
                               f"{int(lengths[b])}, greater than sequences[{b - 1}]'s "
                               f"{int(lengths[b - 1])}: with enforce_sorted=true the sequences "
                               f"must be sorted by decreasing length; pass enforce_sorted=false "
                               f"to accept them in any order")
    # torch's result takes the first sequence's dtype and device (each copied
    # into it: a meta sequence after a CPU one raises torch's error).
    first = sequences[0]
    values = torch.cat([s.to(device=first.device, dtype=first.dtype) for s in sequences])
    sorted_lengths, order = _order(lengths, enforce_sorted)
    batch_sizes, t, k = _steps(sorted_lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    b = order[k]
    data = values.index_select(0, (starts[b] + t).to(values.device))
    sorted_indices, unsorted_indices = _indices(order, sorted_lengths, enforce_sorted,
                                                values.device)
    return PackedSequence(data, batch_sizes, sorted_indices, unsorted_indices)


def unpad_sequence(padded: Tensor, lengths: Tensor, batch_first: bool) -> List[Tensor]:
    """`lengths`: int64 on the CPU. Never modifies `padded` (torch's transposes
    it in place); the sequences are views of one gathered tensor."""
    check_lengths(padded, lengths, batch_first, False, "seqpack.torch.unpad_sequence")
    B = lengths.numel()
    T = padded.size(1 if batch_first else 0)
    present = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)  # [B, T]: caller's order
    b, t = present.nonzero(as_tuple=True)
    flat = b * T + t if batch_first else t * B + b
    rows = padded.flatten(0, 1).index_select(0, flat.to(padded.device))
    return _sequences(rows, lengths.tolist())


def _sequences(rows: Tensor, lengths: List[int]) -> List[Tensor]:
    """The consecutive sequences of `rows`, each a view of its own (narrow),
    not outputs of one split: torch's can be modified in place under autograd,
    and so can these."""
    out, start = [], 0
    for n in lengths:
        out.append(rows.narrow(0, start, n))
        start += n
    return out


def unpack_sequence(packed: PackedSequence) -> List[Tensor]:
    """Sequences in the caller's order, zero-length ones as [0, *] tensors
    (torch's unpack_sequence raises IndexError on them)."""
    check_packed(packed.data, packed.batch_sizes, packed.sorted_indices,
                 "seqpack.torch.unpack_sequence")
    sorted_lengths, order, t, k = _packed_plan(packed.batch_sizes, packed.sorted_indices)
    data = packed.data
    if t.numel() != data.size(0):
        raise ValueError(f"seqpack.torch.unpack_sequence: data has {data.size(0)} rows but "
                         f"batch_sizes sum to {t.numel()}")
    B = order.numel()
    T = packed.batch_sizes.numel()
    # Packed row number of (sorted position, step), then read sequence by
    # sequence in the caller's order.
    grid = torch.full((B, T), -1, dtype=torch.int64)
    grid[k, t] = torch.arange(t.numel())
    unsorted = torch.empty_like(order)
    unsorted[order] = torch.arange(B)
    grid = grid[unsorted]
    rows = data.index_select(0, grid[grid >= 0].to(data.device))
    return _sequences(rows, sorted_lengths[unsorted].tolist())
