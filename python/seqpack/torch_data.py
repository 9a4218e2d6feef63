"""DataLoader helpers for torch: collate functions that build a PackedSequence (or a padded
batch with lengths) straight from variable-length samples.

    from seqpack.data import BucketBatchSampler
    from seqpack.torch_data import collate_packed
    loader = DataLoader(dataset, batch_sampler=BucketBatchSampler(lengths, max_tokens=4096),
                        collate_fn=collate_packed)
    for packed, targets in loader:
        out, h = lstm(packed)            # seqpack.torch.LSTM or torch.nn.LSTM

(Also importable from seqpack.torch.)

A sample is a sequence (a tensor, array or nested list [L, *]) or a tuple
(sequence, target, ...). Only a tuple is split into fields: a list is always a
sequence, so [[1.0], [2.0]] is one sequence of two steps, never a sequence
[1.0] with the target [2.0].
"""
import torch
from torch.utils.data import default_collate

from .data import cu_seqlens_to_padded, from_cu_seqlens

__all__ = ["collate_packed", "collate_padded"]


def _split(samples):
    """(sequences as tensors, the samples' other fields collated, or None)."""
    if not isinstance(samples, (list, tuple)):
        raise TypeError(f"samples must be a list, got {type(samples).__name__}")
    seqs, rest = [], []
    for i, s in enumerate(samples):
        # Only a tuple is (sequence, target, ...): a list is a sequence's steps.
        if isinstance(s, tuple):
            if len(s) == 0:
                raise ValueError(f"samples[{i}] is an empty tuple")
            seq, other = s[0], tuple(s[1:])
        else:
            seq, other = s, None
        if rest and (other is None) != (rest[0] is None):
            raise ValueError(f"samples[{i}] is {'a bare sequence' if other is None else 'a tuple'}"
                             f" but samples[0] is {'a tuple' if other is None else 'not'}")
        if rest and other is not None and len(other) != len(rest[0]):
            raise ValueError(f"samples[{i}] has {len(other) + 1} fields, samples[0] has "
                             f"{len(rest[0]) + 1}")
        t = torch.as_tensor(seq)
        if t.dim() < 1:
            raise ValueError(f"samples[{i}]: a sequence needs a time dimension, got a 0-d value")
        if seqs and (t.shape[1:] != seqs[0].shape[1:] or t.dtype != seqs[0].dtype
                     or t.device != seqs[0].device):
            raise ValueError(f"samples[{i}]: sequence of shape {tuple(t.shape)}, {t.dtype} on "
                             f"{t.device} does not match samples[0]: {tuple(seqs[0].shape)}, "
                             f"{seqs[0].dtype} on {seqs[0].device}")
        seqs.append(t)
        rest.append(other)
    if not seqs or rest[0] is None:
        return seqs, None
    return seqs, [default_collate([r[k] for r in rest]) for k in range(len(rest[0]))]


def _values(seqs):
    lengths = [s.shape[0] for s in seqs]
    cu = torch.zeros(len(seqs) + 1, dtype=torch.int64)
    if seqs:
        cu[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
        return torch.cat(seqs), cu
    return torch.zeros(0), cu


def collate_packed(samples):
    """[sequence, ...] -> PackedSequence; [(sequence, target, ...), ...] -> (PackedSequence,
    targets, ...), the other fields stacked by default_collate.

    Sequences are tensors (or arrays, lists) [L_i, *] of one dtype; zero-length ones are kept.
    Only tuples are (sequence, target, ...) samples: a list sample is a sequence.
    The PackedSequence has sorted_indices (as pack_sequence(..., enforce_sorted=False)); it is
    built by one concatenation and one gather, without padding."""
    seqs, rest = _split(samples)
    packed = from_cu_seqlens(*_values(seqs))
    return packed if rest is None else (packed, *rest)


def collate_padded(samples, batch_first=False, padding_value=0.0):
    """Like collate_packed, but returns (padded [T, B, *] or [B, T, *], lengths int64 [B], ...)
    for models that take a padded batch (pack_padded_sequence(padded, lengths,
    enforce_sorted=False) packs it)."""
    seqs, rest = _split(samples)
    padded, lengths = cu_seqlens_to_padded(*_values(seqs), batch_first=batch_first,
                                           padding_value=padding_value)
    return (padded, lengths) if rest is None else (padded, lengths, *rest)
