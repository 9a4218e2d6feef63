"""torch.nn.utils.rnn's packing utilities on NumPy arrays.

Same names, arguments and defaults as PyTorch 1.13 (plus padding_side), and
the same results; zero-length sequences are accepted too. Arrays are shared
with the C++ core without copying when they are C-contiguous float32, float64
or int64.
"""
from collections import namedtuple

import numpy as np

from . import _seqpack
from ._checks import as_array, as_bool, as_float, as_int, as_lengths, refuse_torch

_PackedSequenceBase = namedtuple(
    "PackedSequence", ["data", "batch_sizes", "sorted_indices", "unsorted_indices"])


class PackedSequence(_PackedSequenceBase):
    """Packed batch: time-major rows `data`, `batch_sizes[t]` = sequences longer than t.

    A namedtuple, like torch's, so ``data, batch_sizes, _, _ = packed`` works.
    Given only `sorted_indices`, `unsorted_indices` is its inverse.
    """
    __slots__ = ()

    def __new__(cls, data, batch_sizes=None, sorted_indices=None, unsorted_indices=None):
        if batch_sizes is None:
            raise TypeError("PackedSequence needs batch_sizes; build it with pack_padded_sequence "
                            "or pack_sequence")
        data = as_array(data, "data")
        batch_sizes = as_lengths(batch_sizes, "batch_sizes")
        sorted_indices = None if sorted_indices is None else as_lengths(
            sorted_indices, "sorted_indices")
        if unsorted_indices is None:
            unsorted_indices = invert_permutation(sorted_indices)
        else:
            unsorted_indices = as_lengths(unsorted_indices, "unsorted_indices")
        return super().__new__(cls, data, batch_sizes, sorted_indices, unsorted_indices)

    @classmethod
    def _from_core(cls, t):
        # Results of the C++ core are valid already: skip the conversions.
        return _PackedSequenceBase.__new__(cls, *t)

    def __repr__(self):
        return _seqpack.packed_repr(tuple(self))

    def validate(self):
        """Raises ValueError naming the first broken invariant of a hand-built batch."""
        _seqpack.validate_packed(tuple(self))


def _twin(name):
    return f"seqpack.torch.{name}"


def _sequences(sequences, fn):
    refuse_torch(sequences, "sequences", _twin(fn))
    if isinstance(sequences, (list, tuple)):
        for i, s in enumerate(sequences):
            refuse_torch(s, f"sequences[{i}]", _twin(fn))
    if isinstance(sequences, np.ndarray) and sequences.dtype != object:
        sequences = list(sequences)  # torch iterates a tensor along dim 0 too
    return [as_array(s, f"sequences[{i}]") for i, s in enumerate(sequences)]


def _padding_side(padding_side):
    try:
        return _seqpack.PaddingSide.__members__[padding_side]
    except (KeyError, TypeError):
        raise ValueError(
            f"padding_side must be 'right' or 'left', got {padding_side!r}") from None


def pad_sequence(sequences, batch_first=False, padding_value=0.0, padding_side="right"):
    """Stacks sequences [L_i, *] into [max L, B, *] (or [B, max L, *]) with padding_value."""
    return _seqpack.pad_sequence(_sequences(sequences, "pad_sequence"),
                                 as_bool(batch_first, "batch_first"),
                                 as_float(padding_value, "padding_value"),
                                 _padding_side(padding_side))


def pack_padded_sequence(input, lengths, batch_first=False, enforce_sorted=True):
    """Packs a padded batch [T, B, *] (or [B, T, *]) whose sequence b has lengths[b] steps."""
    refuse_torch(input, "input", _twin("pack_padded_sequence"))
    return PackedSequence._from_core(_seqpack.pack_padded_sequence(
        as_array(input, "input"), as_lengths(lengths), as_bool(batch_first, "batch_first"),
        as_bool(enforce_sorted, "enforce_sorted")))


def pack_sequence(sequences, enforce_sorted=True):
    """Packs a list of sequences [L_i, *]."""
    return PackedSequence._from_core(_seqpack.pack_sequence(
        _sequences(sequences, "pack_sequence"), as_bool(enforce_sorted, "enforce_sorted")))


def _as_packed(sequence, name, fn):
    if not isinstance(sequence, tuple) or len(sequence) != 4:
        raise TypeError(f"{name} must be a PackedSequence, got {type(sequence).__name__}")
    refuse_torch(sequence[0], f"{name}.data", _twin(fn))
    if isinstance(sequence, PackedSequence):
        return tuple(sequence)
    return tuple(PackedSequence(*sequence))


def pad_packed_sequence(sequence, batch_first=False, padding_value=0.0, total_length=None):
    """Inverse of pack_padded_sequence: (padded, lengths), both in the caller's order."""
    if total_length is not None:
        total_length = as_int(total_length, "total_length")
    return _seqpack.pad_packed_sequence(_as_packed(sequence, "sequence", "pad_packed_sequence"),
                                        as_bool(batch_first, "batch_first"),
                                        as_float(padding_value, "padding_value"), total_length)


def unpad_sequence(padded_sequences, lengths, batch_first=False):
    """Splits a padded batch into a list of sequences (never modifies its input)."""
    refuse_torch(padded_sequences, "padded_sequences", _twin("unpad_sequence"))
    return _seqpack.unpad_sequence(as_array(padded_sequences, "padded_sequences"),
                                   as_lengths(lengths).tolist(),
                                   as_bool(batch_first, "batch_first"))


def unpack_sequence(packed_sequences):
    """Splits a PackedSequence into a list of sequences in the caller's order."""
    return _seqpack.unpack_sequence(
        _as_packed(packed_sequences, "packed_sequences", "unpack_sequence"))


def invert_permutation(permutation):
    """inverse[permutation[i]] = i; None for None, as torch."""
    if permutation is None:
        return None
    refuse_torch(permutation, "permutation", _twin("invert_permutation"))
    return _seqpack.invert_permutation(as_lengths(permutation, "permutation"))
