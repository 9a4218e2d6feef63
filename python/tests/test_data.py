"""seqpack.data: the bucketing samplers (on the C++ sampler), the distributed split and the
varlen (cu_seqlens) conversions; seqpack.torch_data's collate functions. References:
hand-worked batches, torch.nn.utils.rnn's packing and padding, and direct counts."""
import os
import tempfile

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pack_sequence, pad_sequence

import seqpack
from seqpack.data import (BucketBatchSampler, DistributedBucketBatchSampler, cu_seqlens_to_padded,
                          from_cu_seqlens, padded_to_cu_seqlens, to_cu_seqlens)
from seqpack.torch import collate_packed, collate_padded

from helpers import base_seed


def long_tail(seed, n, max_len=2000):
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(4.0, 1.0, n).astype(np.int64) + 1, 1, max_len)


def word_like(seed, n):
    rng = np.random.default_rng(seed)
    return np.clip(rng.normal(9, 3, n).round().astype(np.int64), 1, 30)


def assert_partition(batches, n):
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(n)), "every index exactly once"


# ---------------------------------------------------------------------------
# BucketBatchSampler


def test_bucket_sampler_hand_worked():
    # Sorted lengths 1 2 3 4 5 6 under max_tokens 8 (size * longest <= 8):
    # {1, 2} (3 * 3 > 8), {3, 4} (2 * 4 = 8), {5}, {6}.
    s = BucketBatchSampler([1, 2, 3, 4, 5, 6], max_tokens=8, shuffle=False)
    assert list(s) == [[0, 1], [2, 3], [4], [5]]
    assert len(s) == 4 and s.max_tokens == 8 and s.batch_size is None
    # By count: lengths 5 1 5 1 3 3 in pairs group {1, 1}, {3, 3}, {5, 5}.
    s = BucketBatchSampler([5, 1, 5, 1, 3, 3], batch_size=2, seed=9)
    assert sorted(sorted(b) for b in s) == [[0, 2], [1, 3], [4, 5]]
    st = s.padding_stats()
    assert st["bucketed"] == {"real_tokens": 18, "padded_slots": 18, "efficiency": 1.0}
    assert st["packed"]["efficiency"] == 1.0 and st["num_batches"] == 3


@pytest.mark.parametrize("kw", [dict(batch_size=32), dict(max_tokens=500),
                                dict(batch_size=16, max_tokens=300, bucket_size_multiplier=None)])
def test_bucket_sampler_every_index_once_and_reproducible(kw):
    seed = base_seed()
    lengths = word_like(seed, 2001)
    s = BucketBatchSampler(lengths, seed=seed, **kw)
    for epoch in range(3):
        s.set_epoch(epoch)
        batches = list(s)
        assert_partition(batches, 2001)
        assert len(s) == len(batches)
        for b in batches:
            if "max_tokens" in kw:
                assert len(b) * max(lengths[b]) <= kw["max_tokens"], f"seed {seed}"
            if "batch_size" in kw:
                assert len(b) <= kw["batch_size"]
        again = BucketBatchSampler(torch.tensor(lengths), seed=seed, **kw)
        again.set_epoch(epoch)
        assert list(again) == batches, f"seed {seed}: same seed and epoch, same batches"
    s.set_epoch(0)
    e0 = list(s)
    s.set_epoch(1)
    assert list(s) != e0
    assert list(BucketBatchSampler(lengths, seed=seed + 1, **kw)) != e0


def test_padding_stats_match_a_direct_count():
    lengths = word_like(3, 3000)
    s = BucketBatchSampler(lengths, batch_size=64, seed=2)
    s.set_epoch(2)
    batches = list(s)
    st = s.padding_stats()
    assert st["bucketed"]["real_tokens"] == int(lengths.sum())
    assert st["bucketed"]["padded_slots"] == sum(len(b) * int(max(lengths[b])) for b in batches)
    assert st["random"]["real_tokens"] == int(lengths.sum())
    assert st["bucketed"]["efficiency"] > st["random"]["efficiency"]
    # By max_tokens alone the random baseline uses the mean batch size.
    st = BucketBatchSampler(lengths, max_tokens=512).padding_stats()
    assert st["random"]["padded_slots"] >= st["bucketed"]["padded_slots"]


def test_drop_last_and_zero_lengths():
    s = BucketBatchSampler(word_like(1, 105), batch_size=10, drop_last=True,
                           bucket_size_multiplier=None)
    assert len(s) == 10 and all(len(b) == 10 for b in s)
    # Zero-length sequences count as one token against max_tokens.
    s = BucketBatchSampler([0, 0, 0, 0, 0], max_tokens=2, shuffle=False)
    assert list(s) == [[0, 1], [2, 3], [4]]
    assert list(BucketBatchSampler([], batch_size=3)) == []
    # Bounds far beyond the data: one batch, no overflow in pool sizes or token products.
    for kw in (dict(max_tokens=2**62), dict(batch_size=2**62), dict(max_tokens=2**63 - 1)):
        assert [sorted(b) for b in BucketBatchSampler([3, 1, 2], bucket_size_multiplier=7,
                                                      **kw)] == [[0, 1, 2]]


def test_works_as_a_dataloader_batch_sampler():
    lengths = [3, 1, 4, 1, 5, 9, 2, 6]
    data = [(torch.arange(n), i) for i, n in enumerate(lengths)]
    loader = torch.utils.data.DataLoader(data, batch_sampler=BucketBatchSampler(
        lengths, batch_size=3, seed=1), collate_fn=collate_packed)
    seen = []
    for packed, labels in loader:
        seqs = torch.nn.utils.rnn.unpack_sequence(packed)
        assert [len(q) for q in seqs] == [lengths[i] for i in labels.tolist()]
        seen += labels.tolist()
    assert sorted(seen) == list(range(8))


@pytest.mark.parametrize("kw, message", [
    (dict(batch_size=0), "batch_size must be None or a positive int, got 0"),
    (dict(batch_size=2.5), "got 2.5"),
    (dict(batch_size=True), "got True"),
    (dict(), "both are None"),
    (dict(max_tokens=-3), "max_tokens must be None or a positive int, got -3"),
    (dict(max_tokens=4), "lengths[2] = 5 exceeds max_tokens = 4"),
    (dict(batch_size=2, seed=-1), "seed must be a non-negative int, got -1"),
    (dict(batch_size=2, bucket_size_multiplier=0), "bucket_size_multiplier"),
])
def test_bucket_sampler_bad_arguments(kw, message):
    with pytest.raises(ValueError) as e:
        BucketBatchSampler([1, 2, 5], **kw)
    assert message in str(e.value)


def test_bucket_sampler_bad_lengths_and_flags():
    with pytest.raises(ValueError, match=r"lengths\[1\] = -2 is negative"):
        BucketBatchSampler([1, -2], batch_size=2)
    with pytest.raises(TypeError, match="float64"):
        BucketBatchSampler([1.5, 2.0], batch_size=2)
    with pytest.raises(TypeError, match="shuffle"):
        BucketBatchSampler([1, 2], batch_size=2, shuffle="yes")
    with pytest.raises(ValueError, match="epoch must be a non-negative int, got -1"):
        BucketBatchSampler([1, 2], batch_size=2).set_epoch(-1)


# ---------------------------------------------------------------------------
# DistributedBucketBatchSampler


@pytest.mark.parametrize("ranks", [1, 2, 3, 8])
@pytest.mark.parametrize("kw", [dict(batch_size=24), dict(max_tokens=400)])
def test_distributed_equal_counts_every_index_once(ranks, kw):
    seed = base_seed() + ranks
    lengths = word_like(seed, 1001)
    samplers = [DistributedBucketBatchSampler(lengths, ranks, r, seed=seed, **kw)
                for r in range(ranks)]
    for epoch in range(2):
        for s in samplers:
            s.set_epoch(epoch)
        shares = [list(s) for s in samplers]
        assert len({len(x) for x in shares}) == 1, f"seed {seed}: equal batch counts"
        assert_partition([b for x in shares for b in x], 1001)
        assert shares == samplers[0].all_ranks()
        assert all(len(b) > 0 for x in shares for b in x)
    # drop_last keeps the counts equal too.
    dropped = [list(DistributedBucketBatchSampler(lengths, ranks, r, seed=seed, drop_last=True,
                                                  **kw)) for r in range(ranks)]
    assert len({len(x) for x in dropped}) == 1


def test_distributed_hand_worked():
    # Pairs without shuffling: {0, 1} (2 tokens), {2, 3} (4), {4, 5} (6), {6, 7} (8);
    # two ranks take the two lightest, then the two heaviest.
    lengths = [1, 1, 2, 2, 3, 3, 4, 4]
    s = DistributedBucketBatchSampler(lengths, 2, 1, batch_size=2, shuffle=False,
                                      bucket_size_multiplier=None)
    assert s.all_ranks() == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
    assert list(s) == [[2, 3], [6, 7]]
    assert s.token_imbalance() == pytest.approx((4 / 2 + 8 / 6) / 2)
    # 3 ranks: {6, 7} and {4, 5} are halved so 6 batches make 2 steps.
    s = DistributedBucketBatchSampler(lengths, 3, 0, batch_size=2, shuffle=False,
                                      bucket_size_multiplier=None)
    assert s.all_ranks() == [[[0, 1], [2, 3]], [[4], [6]], [[5], [7]]]
    with pytest.raises(ValueError, match="8 sequences cannot be split evenly among 9 ranks"):
        list(DistributedBucketBatchSampler(lengths, 9, 0, batch_size=2))


@pytest.mark.parametrize("ranks", [2, 3, 8])
def test_distributed_tokens_balanced(ranks):
    seed = base_seed()
    for lengths, max_tokens in [(long_tail(seed, 20000), 4096), (word_like(seed, 30000), 1024)]:
        s = DistributedBucketBatchSampler(lengths, ranks, 0, max_tokens=max_tokens, seed=seed)
        for epoch in range(2):
            s.set_epoch(epoch)
            assert s.token_imbalance() <= 1.10, f"seed {seed}, {ranks} ranks, epoch {epoch}"


def test_distributed_defaults_from_torch_distributed():
    import torch.distributed as dist
    with pytest.raises(ValueError, match="torch.distributed is not initialised"):
        DistributedBucketBatchSampler([1, 2, 3], batch_size=2)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method="file://" + os.path.join(tmp, "store"),
                                rank=0, world_size=1)
        try:
            s = DistributedBucketBatchSampler([1, 2, 3], batch_size=2)
            assert (s.num_replicas, s.rank) == (1, 0)
        finally:
            dist.destroy_process_group()


def test_distributed_bad_arguments():
    with pytest.raises(ValueError, match=r"rank = 2 is out of range \[0, 2\)"):
        DistributedBucketBatchSampler([1, 2], 2, 2, batch_size=1)
    with pytest.raises(ValueError, match="num_replicas must be a positive int, got 0"):
        DistributedBucketBatchSampler([1, 2], 0, 0, batch_size=1)
    with pytest.raises(ValueError, match="rank must be a non-negative int, got -1"):
        DistributedBucketBatchSampler([1, 2], 2, -1, batch_size=1)


# ---------------------------------------------------------------------------
# Varlen layout


def test_varlen_hand_worked_numpy():
    # a = [1, 2], b = [], c = [3, 4, 5]: packed c0 a0 | c1 a1 | c2.
    p = seqpack.pack_sequence([np.array([1., 2]), np.zeros(0), np.array([3., 4, 5])],
                              enforce_sorted=False)
    values, cu, max_len = to_cu_seqlens(p)
    assert values.tolist() == [1, 2, 3, 4, 5]
    assert cu.dtype == np.int32 and cu.tolist() == [0, 2, 2, 5] and max_len == 3
    back = from_cu_seqlens(values, cu)
    assert back.data.tolist() == p.data.tolist()
    assert back.batch_sizes.tolist() == [2, 2, 1]
    assert back.sorted_indices.tolist() == [2, 0, 1, ] and back.unsorted_indices.tolist() == [1, 2, 0]
    padded, lengths = cu_seqlens_to_padded(values, cu, batch_first=True, padding_value=-1)
    assert padded.tolist() == [[1, 2, -1], [-1, -1, -1], [3, 4, 5]]
    assert lengths.tolist() == [2, 0, 3]
    v2, cu2, m2 = padded_to_cu_seqlens(padded, lengths, batch_first=True)
    assert v2.tolist() == [1, 2, 3, 4, 5] and cu2.tolist() == [0, 2, 2, 5] and m2 == 3


def test_varlen_random_against_torch():
    rng = np.random.default_rng(base_seed())
    for trial in range(30):
        B = int(rng.integers(1, 9))
        lengths = rng.integers(1, 7, B).tolist()
        seqs = [torch.randn(n, 3, dtype=torch.float64) for n in lengths]
        values = torch.cat(seqs)
        cu = [0] + np.cumsum(lengths).tolist()
        # torch's own packing is the reference.
        ref = pack_sequence(seqs, enforce_sorted=False)
        got = from_cu_seqlens(values, torch.tensor(cu, dtype=torch.int32))
        assert isinstance(got, torch.nn.utils.rnn.PackedSequence)
        for a, b in zip(got, ref):
            assert torch.equal(a, b), f"trial {trial}"
        v, c, m = to_cu_seqlens(ref)
        assert torch.equal(v, values) and c.tolist() == cu and m == max(lengths)
        for bf in (False, True):
            padded, lens = cu_seqlens_to_padded(values, cu, batch_first=bf, total_length=7)
            assert lens.tolist() == lengths
            ref_padded = pad_sequence(seqs, batch_first=bf)
            assert torch.equal(padded.narrow(1 if bf else 0, 0, max(lengths)), ref_padded)
            assert torch.count_nonzero(padded.narrow(1 if bf else 0, max(lengths),
                                                     7 - max(lengths))) == 0
            v2, c2, m2 = padded_to_cu_seqlens(ref_padded, torch.tensor(lengths), batch_first=bf)
            assert torch.equal(v2, values) and c2.tolist() == cu


def test_varlen_sorted_packing_and_other_dtypes():
    # enforce_sorted=True: no sorted_indices; int32 and bool rows gather as well.
    seqs = [torch.tensor([1, 2, 3], dtype=torch.int32), torch.tensor([4, 5], dtype=torch.int32)]
    v, c, m = to_cu_seqlens(torch.nn.utils.rnn.pack_sequence(seqs))
    assert v.tolist() == [1, 2, 3, 4, 5] and v.dtype == torch.int32 and c.tolist() == [0, 3, 5]
    flags = [torch.tensor([True, False]), torch.tensor([False])]
    v, c, m = to_cu_seqlens(torch.nn.utils.rnn.pack_sequence(flags, enforce_sorted=False))
    assert v.tolist() == [True, False, False] and m == 2


def test_varlen_zero_lengths_and_gradients():
    values = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    cu = [0, 0, 2, 2, 5, 5]
    packed = from_cu_seqlens(values, cu)
    assert packed.batch_sizes.tolist() == [2, 2, 1] and packed.sorted_indices.numel() == 5
    v, c, m = to_cu_seqlens(packed)
    assert torch.equal(v, values) and c.tolist() == cu and m == 3
    # s1 = v0 v1, s3 = v2 v3 v4, the rest empty; packed longest first: v2 v0 | v3 v1 | v4.
    assert torch.equal(packed.data, values[[2, 0, 3, 1, 4]])
    # The gathers are differentiable: the gradient goes back to each value's row.
    w = torch.randn_like(packed.data)
    (packed.data * w).sum().backward()
    assert torch.equal(values.grad, w[[1, 3, 0, 2, 4]])
    padded, lengths = cu_seqlens_to_padded(values, cu)
    assert padded.shape == (3, 5, 2) and lengths.tolist() == [0, 2, 0, 3, 0]
    empty = from_cu_seqlens(np.zeros((0, 4)), [0, 0, 0])
    assert empty.data.shape == (0, 4) and empty.batch_sizes.size == 0


def test_varlen_bad_input():
    with pytest.raises(ValueError, match=r"cu_seqlens\[0\] = 1 must be 0"):
        from_cu_seqlens(np.zeros(3), [1, 3])
    with pytest.raises(ValueError, match=r"cu_seqlens\[2\] = 1 is less than cu_seqlens\[1\] = 2"):
        from_cu_seqlens(np.zeros(3), [0, 2, 1])
    with pytest.raises(ValueError, match=r"cu_seqlens\[1\] = 2 does not match the 3 rows"):
        from_cu_seqlens(np.zeros(3), [0, 2])
    with pytest.raises(TypeError, match="cu_seqlens must hold integers"):
        from_cu_seqlens(np.zeros(3), [0.0, 3.0])
    with pytest.raises(ValueError, match="total_length = 2 is less than the longest length 3"):
        cu_seqlens_to_padded(np.zeros(3), [0, 3], total_length=2)
    with pytest.raises(ValueError, match=r"lengths\[0\] = 4 exceeds the padded length 3"):
        padded_to_cu_seqlens(np.zeros((3, 1)), [4])
    with pytest.raises(ValueError, match="2 lengths for a batch of 1"):
        padded_to_cu_seqlens(np.zeros((3, 1)), [1, 1])
    with pytest.raises(TypeError, match="PackedSequence"):
        to_cu_seqlens(np.zeros(3))


# ---------------------------------------------------------------------------
# collate_packed / collate_padded


def test_collate_against_torch():
    seqs = [torch.randint(2, 50, (n,)) for n in (4, 1, 6, 3)]
    samples = [(s, i) for i, s in enumerate(seqs)]
    packed, labels = collate_packed(samples)
    ref = pack_sequence(seqs, enforce_sorted=False)
    for a, b in zip(packed, ref):
        assert torch.equal(a, b)
    assert labels.tolist() == [0, 1, 2, 3]
    padded, lengths, labels = collate_padded(samples, batch_first=True, padding_value=0)
    assert torch.equal(padded, pad_sequence(seqs, batch_first=True))
    assert lengths.dtype == torch.int64 and lengths.tolist() == [4, 1, 6, 3]
    # Bare sequences, features, and several fields.
    feats = [torch.randn(n, 2) for n in (2, 0, 3)]
    p = collate_packed(feats)
    assert p.batch_sizes.tolist() == [2, 2, 1] and p.data.shape == (5, 2)
    p, y, w = collate_packed([(f, 1, 0.5) for f in feats])
    assert y.tolist() == [1, 1, 1] and w.dtype == torch.float64
    padded, lengths = collate_padded(feats)
    assert padded.shape == (3, 3, 2) and lengths.tolist() == [2, 0, 3]


def test_collate_bad_input():
    with pytest.raises(ValueError, match=r"samples\[1\]: sequence of shape \(2, 3\)"):
        collate_packed([torch.zeros(2, 2), torch.zeros(2, 3)])
    with pytest.raises(ValueError, match=r"samples\[1\] is a bare sequence"):
        collate_packed([(torch.zeros(2), 1), torch.zeros(2)])
    with pytest.raises(ValueError, match=r"samples\[0\]: a sequence needs a time dimension"):
        collate_packed([torch.tensor(3.0)])
    with pytest.raises(TypeError, match="samples must be a list"):
        collate_packed(torch.zeros(3, 2))


def test_collate_list_samples_are_sequences():
    # A list sample is a sequence (docs/python.md): two sequences of two steps with one
    # feature each, not two length-1 sequences and a "target" (issue 21, defect 8).
    samples = [[[1.0], [2.0]], [[3.0], [4.0]]]
    packed = collate_packed(samples)
    assert isinstance(packed, torch.nn.utils.rnn.PackedSequence)
    ref = pack_sequence([torch.tensor(s) for s in samples], enforce_sorted=False)
    for a, b in zip(packed, ref):
        assert torch.equal(a, b)
    assert packed.batch_sizes.tolist() == [2, 2]
    assert packed.data.tolist() == [[1.0], [3.0], [2.0], [4.0]]
    padded, lengths = collate_padded(samples, batch_first=True)
    assert padded.tolist() == samples and lengths.tolist() == [2, 2]
    # Token ids as lists of ints; lists inside a tuple are the tuple's sequence.
    ids = collate_packed([[5, 6, 7], [8, 9]])
    assert ids.batch_sizes.tolist() == [2, 2, 1] and ids.data.tolist() == [5, 8, 6, 9, 7]
    packed, targets = collate_packed([([5, 6, 7], 0), ([8, 9], 1)])
    assert packed.data.tolist() == [5, 8, 6, 9, 7] and targets.tolist() == [0, 1]
    # An empty list is a zero-length sequence; an empty tuple has no sequence at all.
    assert collate_packed([[1.0], []]).batch_sizes.tolist() == [1]
    with pytest.raises(ValueError, match=r"samples\[0\] is an empty tuple"):
        collate_packed([(), ()])
    with pytest.raises(ValueError, match=r"samples\[1\] is a bare sequence"):
        collate_packed([([1.0], 0), [1.0, 2.0]])
