"""Data loading for variable-length sequences.

- ``BucketBatchSampler``: groups similar lengths into batches (torchtext's
  ``BucketIterator``, fairseq's ``batch_by_size(max_tokens=...)``, AllenNLP's
  ``BucketBatchSampler``, HuggingFace's ``LengthGroupedSampler``), for
  ``torch.utils.data.DataLoader(batch_sampler=...)``.
- ``DistributedBucketBatchSampler``: the same split across processes, with the
  same number of batches on every rank and balanced real tokens per step.
- The varlen layout (FlashAttention's ``cu_seqlens``): ``to_cu_seqlens`` /
  ``from_cu_seqlens`` against a PackedSequence, ``padded_to_cu_seqlens`` /
  ``cu_seqlens_to_padded`` against a padded batch with lengths, on NumPy arrays
  or torch tensors (then autograd flows through the gathers).

The batching itself is seqpack's C++ sampler (include/seqpack/data.h); this
module checks arguments and converts.
"""
import numbers
import sys

import numpy as np

from . import _seqpack
from ._checks import as_bool, as_lengths
from .packing import PackedSequence

__all__ = ["BucketBatchSampler", "DistributedBucketBatchSampler", "to_cu_seqlens",
           "from_cu_seqlens", "padded_to_cu_seqlens", "cu_seqlens_to_padded"]


def _optional_positive(value, name):
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be None or a positive int, got {value!r}")
    return int(value)


def _non_negative(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return int(value)


def _lengths_list(lengths):
    if _is_torch(lengths):
        lengths = lengths.detach().cpu().numpy()
    return as_lengths(lengths).tolist()


def _options(batch_size, max_tokens, shuffle, drop_last, seed, bucket_size_multiplier):
    batch_size = _optional_positive(batch_size, "batch_size")
    max_tokens = _optional_positive(max_tokens, "max_tokens")
    if batch_size == 0 and max_tokens == 0:
        raise ValueError("give batch_size (sequences per batch), max_tokens (padded tokens per "
                         "batch) or both; both are None")
    seed = _non_negative(seed, "seed")
    if seed >= 2**64:
        raise ValueError(f"seed must be below 2**64, got {seed}")
    pool = _optional_positive(bucket_size_multiplier, "bucket_size_multiplier")
    return _seqpack.BucketingOptions(batch_size, max_tokens, seed, pool,
                                     as_bool(drop_last, "drop_last"), as_bool(shuffle, "shuffle"))


def _stats(s):
    return {"real_tokens": s.real_tokens, "padded_slots": s.padded_slots,
            "efficiency": s.efficiency}


class BucketBatchSampler:
    """Batches of indices of similar length, for ``DataLoader(batch_sampler=...)``.

    lengths: the length of every sample (list, NumPy array or torch tensor);
    the dataset itself is not needed. ``batch_size`` bounds the sequences of a
    batch, ``max_tokens`` its padded tokens (batch size * longest, fairseq's
    rule; a sequence longer than max_tokens is an error); give one or both.
    Each epoch the indices are shuffled, sorted by length within pools of
    ``bucket_size_multiplier`` batches (None: the whole dataset), cut into
    batches, and the batches are shuffled. ``shuffle=False`` gives the same
    batches in increasing length every epoch. ``drop_last`` drops each pool's
    last batch unless it is full. Call ``set_epoch(n)`` before each epoch (as
    with DistributedSampler); the order depends only on (seed, epoch).
    """

    def __init__(self, lengths, batch_size=None, max_tokens=None, shuffle=True, drop_last=False,
                 seed=0, bucket_size_multiplier=100):
        self._lengths = _lengths_list(lengths)
        self._core = _seqpack.BucketingSampler(
            self._lengths, _options(batch_size, max_tokens, shuffle, drop_last, seed,
                                    bucket_size_multiplier))
        self.epoch = 0
        self._cache = None

    def set_epoch(self, epoch):
        self.epoch = _non_negative(epoch, "epoch")

    def _batches(self):
        if self._cache is None or self._cache[0] != self.epoch:
            self._cache = (self.epoch, self._core.epoch(self.epoch))
        return self._cache[1]

    def __iter__(self):
        return iter(self._batches())

    def __len__(self):
        return len(self._batches())

    @property
    def batch_size(self):
        return self._core.options.batch_size or None

    @property
    def max_tokens(self):
        return self._core.options.max_tokens or None

    def padding_stats(self):
        """Real tokens against padded slots for this epoch's batches, random batches of the same
        size and packing (as ``seqpack data stats``): a dict with ``random``, ``bucketed`` and
        ``packed`` (each ``real_tokens``, ``padded_slots``, ``efficiency``) and
        ``num_batches``."""
        r = _seqpack.padding_report(self._core, self.epoch)
        return {"random": _stats(r.random), "bucketed": _stats(r.bucketed),
                "packed": _stats(r.packed), "num_batches": r.num_batches}


def _distributed_default(value, name, getter):
    if value is not None:
        return _non_negative(value, name)
    dist = None
    if "torch" in sys.modules:
        import torch.distributed as dist
    if dist is None or not dist.is_available() or not dist.is_initialized():
        raise ValueError(f"{name} is None and torch.distributed is not initialised; pass "
                         f"num_replicas and rank")
    return getattr(dist, getter)()


class DistributedBucketBatchSampler(BucketBatchSampler):
    """BucketBatchSampler split among ``num_replicas`` processes (``rank`` is this one).

    Every rank gets the same number of batches every epoch, so no rank waits
    for a missing all-reduce. Batches of similar real-token counts run at the
    same step, so with ``max_tokens`` the ranks finish a step together. When
    the batches do not divide evenly, the heaviest are halved (every index
    still appears exactly once per epoch over all ranks) or, with
    ``drop_last``, the lightest are dropped. Every rank must use the same
    ``seed`` and call ``set_epoch`` with the same epoch. ``num_replicas`` and
    ``rank`` default to torch.distributed's world size and rank. ``padding_stats()`` covers
    the epoch's batches on all ranks, before any halving.
    """

    def __init__(self, lengths, num_replicas=None, rank=None, batch_size=None, max_tokens=None,
                 shuffle=True, drop_last=False, seed=0, bucket_size_multiplier=100):
        num_replicas = _distributed_default(num_replicas, "num_replicas", "get_world_size")
        rank = _distributed_default(rank, "rank", "get_rank")
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be a positive int, got {num_replicas}")
        if rank >= num_replicas:
            raise ValueError(f"rank = {rank} is out of range [0, {num_replicas})")
        self._lengths = _lengths_list(lengths)
        self._dist = _seqpack.DistributedBucketingSampler(
            self._lengths, _options(batch_size, max_tokens, shuffle, drop_last, seed,
                                    bucket_size_multiplier), num_replicas, rank)
        self._core = self._dist.sampler
        self.num_replicas, self.rank = num_replicas, rank
        self.epoch = 0
        self._cache = None

    def _batches(self):
        if self._cache is None or self._cache[0] != self.epoch:
            self._cache = (self.epoch, self._dist.epoch(self.epoch))
        return self._cache[1]

    def all_ranks(self):
        """Every rank's batches for this epoch: ``all_ranks()[rank][step]``."""
        return self._dist.all_ranks(self.epoch)

    def token_imbalance(self):
        """Mean over this epoch's steps of (most / fewest real tokens across ranks); a rank
        with no real tokens counts as one."""
        ranks = [_seqpack.batch_tokens(self._lengths, r) for r in self.all_ranks()]
        if not ranks[0]:
            return 1.0
        t = np.array(ranks, dtype=np.float64)
        return float(np.mean(t.max(axis=0) / np.maximum(t.min(axis=0), 1)))


# ---------------------------------------------------------------------------
# The varlen layout.


def _is_torch(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _index(idx, like):
    """The gather index as an array of `like`'s kind."""
    if _is_torch(like):
        import torch
        return torch.as_tensor(idx, dtype=torch.int64, device=like.device)
    return np.asarray(idx, dtype=np.int64)


def _gather(values, idx):
    if _is_torch(values):
        return values.index_select(0, _index(idx, values))
    return np.asarray(values)[_index(idx, values)]


def _ints(x, name):
    if _is_torch(x):
        x = x.detach().cpu().numpy()
    return as_lengths(x, name).tolist()


def _check_values(values, name):
    if _is_torch(values):
        if values.dim() < 1:
            raise ValueError(f"{name} must have a row dimension, got a 0-d tensor")
        return values
    a = np.asarray(values)
    if a.ndim < 1:
        raise ValueError(f"{name} must have a row dimension, got a 0-d array")
    return a


def _plan(packed):
    data, batch_sizes, sorted_indices, unsorted_indices = packed
    data = _check_values(data, "packed.data")
    # The plan needs the row count only: a zero-width stand-in keeps any dtype.
    rows = np.zeros((data.shape[0], 0), dtype=np.float32)
    opt = [None if i is None else np.asarray(_ints(i, name), dtype=np.int64)
           for i, name in ((sorted_indices, "sorted_indices"),
                           (unsorted_indices, "unsorted_indices"))]
    return data, _seqpack.PackingPlan.from_packed(
        (rows, np.asarray(_ints(batch_sizes, "batch_sizes"), dtype=np.int64), *opt))


def _cu_seqlens(lengths, like):
    cu = _seqpack.cu_seqlens_from_lengths(lengths)
    if _is_torch(like):
        import torch
        return torch.tensor(cu, dtype=torch.int32, device=like.device)
    return np.asarray(cu, dtype=np.int32)


def to_cu_seqlens(packed):
    """PackedSequence (seqpack's or torch's) -> (values [total, *], cu_seqlens int32 [B + 1],
    max_seqlen): sequences one after another in the caller's order, sequence b at rows
    cu_seqlens[b]:cu_seqlens[b + 1]. One gather of the rows."""
    if not isinstance(packed, tuple) or len(packed) != 4:
        raise TypeError(f"packed must be a PackedSequence, got {type(packed).__name__}")
    data, plan = _plan(packed)
    lengths = plan.lengths
    return (_gather(data, _seqpack.varlen_gather_from_packed(plan)), _cu_seqlens(lengths, data),
            max(lengths, default=0))


def _lengths_of_cu(values, cu_seqlens):
    values = _check_values(values, "values")
    return values, _seqpack.lengths_from_cu_seqlens(_ints(cu_seqlens, "cu_seqlens"),
                                                    int(values.shape[0]))


def from_cu_seqlens(values, cu_seqlens):
    """(values [total, *], cu_seqlens [B + 1]) -> PackedSequence with sorted_indices (as
    ``pack_sequence(..., enforce_sorted=False)``): torch's for torch values, seqpack's for
    NumPy. Zero-length sequences are kept (they get no rows). One gather of the rows."""
    values, lengths = _lengths_of_cu(values, cu_seqlens)
    plan = _seqpack.PackingPlan.from_lengths(lengths, False)
    data = _gather(values, _seqpack.packed_gather_from_varlen(plan))
    fields = [plan.batch_sizes, plan.sorted_indices, plan.unsorted_indices]
    if _is_torch(values):
        import torch
        from torch.nn.utils.rnn import PackedSequence as TorchPackedSequence
        # As torch's pack_sequence: batch_sizes on the CPU, the indices on the
        # data's device.
        return TorchPackedSequence(
            data, torch.tensor(fields[0], dtype=torch.int64),
            *[torch.tensor(f, dtype=torch.int64, device=data.device) for f in fields[1:]])
    return PackedSequence(data, *fields)


def padded_to_cu_seqlens(padded, lengths, batch_first=False):
    """Padded batch [T, B, *] (or [B, T, *]) with lengths [B] -> (values, cu_seqlens int32,
    max_seqlen). One gather of the rows."""
    padded = _check_values(padded, "padded")
    batch_first = as_bool(batch_first, "batch_first")
    lengths = _ints(lengths, "lengths")
    if padded.ndim < 2:
        raise ValueError(f"padded must have time and batch dimensions, got shape "
                         f"{tuple(padded.shape)}")
    T, B = (padded.shape[1], padded.shape[0]) if batch_first else padded.shape[:2]
    if len(lengths) != B:
        raise ValueError(f"{len(lengths)} lengths for a batch of {B} (padded shape "
                         f"{tuple(padded.shape)})")
    rows = padded.reshape((B * T,) + tuple(padded.shape[2:]))
    idx = _seqpack.varlen_gather_from_padded(lengths, int(T), batch_first)
    return _gather(rows, idx), _cu_seqlens(lengths, padded), max(lengths, default=0)


def cu_seqlens_to_padded(values, cu_seqlens, batch_first=False, padding_value=0.0,
                         total_length=None):
    """(values [total, *], cu_seqlens) -> (padded [T, B, *] or [B, T, *], lengths int64 [B]),
    T = total_length or the longest length. One gather of the rows (plus one padding row)."""
    values, lengths = _lengths_of_cu(values, cu_seqlens)
    batch_first = as_bool(batch_first, "batch_first")
    longest = max(lengths, default=0)
    T = longest if total_length is None else _non_negative(total_length, "total_length")
    if T < longest:
        raise ValueError(f"total_length = {T} is less than the longest length {longest}")
    idx = _seqpack.padded_gather_from_varlen(lengths, T, batch_first)
    B, feat = len(lengths), tuple(values.shape[1:])
    shape = (B, T) + feat if batch_first else (T, B) + feat
    if _is_torch(values):
        import torch
        pad = values.new_full((1,) + feat, padding_value)
        padded = torch.cat([values, pad]).index_select(0, _index(idx, values)).reshape(shape)
        return padded, torch.tensor(lengths, dtype=torch.int64)
    pad = np.full((1,) + feat, padding_value, dtype=values.dtype)
    padded = np.concatenate([values, pad])[np.asarray(idx, dtype=np.int64)].reshape(shape)
    return padded, np.asarray(lengths, dtype=np.int64)
