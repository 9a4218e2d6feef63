"""seqpack's packing utilities against torch.nn.utils.rnn, live."""
import numpy as np
import pytest
import torch
from torch.nn.utils import rnn as trnn

import seqpack
from helpers import base_seed


def assert_same(actual, expected, what=""):
    expected = expected.numpy() if isinstance(expected, torch.Tensor) else np.asarray(expected)
    actual = np.asarray(actual)
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    np.testing.assert_array_equal(actual, expected, err_msg=what)


def assert_same_packed(p, t):
    assert isinstance(p, seqpack.PackedSequence)
    assert_same(p.data, t.data, "data")
    assert_same(p.batch_sizes, t.batch_sizes, "batch_sizes")
    for name in ("sorted_indices", "unsorted_indices"):
        a, e = getattr(p, name), getattr(t, name)
        if e is None:
            assert a is None, name
        else:
            assert_same(a, e, name)


def random_sequences(rng, lengths, trailing, dtype):
    if dtype == np.int64:
        return [rng.integers(-50, 50, size=(n,) + trailing).astype(np.int64) for n in lengths]
    return [rng.standard_normal((n,) + trailing).astype(dtype) for n in lengths]


CASES = [
    # (lengths, trailing shape, dtype)
    ([3, 2, 4], (), np.float32),                 # the demo's batch
    ([5, 2], (2,), np.float32),
    ([4, 4, 4], (3,), np.float64),               # all equal
    ([1], (2,), np.float32),                     # batch 1, T = 1
    ([1, 1, 1], (), np.int64),                   # T = 1
    ([2, 5, 5, 1, 2], (2, 3), np.float32),       # ties, unsorted
    ([6, 3, 3, 1], (1, 2, 2), np.float64),       # sorted with ties, 3 trailing dims
    ([7], (), np.int64),
]


@pytest.mark.parametrize("lengths,trailing,dtype", CASES)
@pytest.mark.parametrize("batch_first", [False, True])
def test_pack_pad_parity(lengths, trailing, dtype, batch_first):
    rng = np.random.default_rng(base_seed())
    seqs = random_sequences(rng, lengths, trailing, dtype)
    tseqs = [torch.from_numpy(s) for s in seqs]
    is_sorted = list(lengths) == sorted(lengths, reverse=True)

    for pv in (0.0, -1.5) if dtype != np.int64 else (0, 42):
        padded = seqpack.pad_sequence(seqs, batch_first=batch_first, padding_value=pv)
        tpadded = trnn.pad_sequence(tseqs, batch_first=batch_first, padding_value=pv)
        assert_same(padded, tpadded, "pad_sequence")

    for enforce_sorted in ([True, False] if is_sorted else [False]):
        p = seqpack.pack_sequence(seqs, enforce_sorted=enforce_sorted)
        tp = trnn.pack_sequence(tseqs, enforce_sorted=enforce_sorted)
        assert_same_packed(p, tp)
        # lengths as a list, as an int64 array and as an int32 array
        for lens in (list(lengths), np.array(lengths), np.array(lengths, dtype=np.int32)):
            p2 = seqpack.pack_padded_sequence(padded, lens, batch_first=batch_first,
                                              enforce_sorted=enforce_sorted)
            tp2 = trnn.pack_padded_sequence(tpadded, torch.tensor(lengths),
                                            batch_first=batch_first,
                                            enforce_sorted=enforce_sorted)
            assert_same_packed(p2, tp2)

        for total_length in (None, max(lengths) + 2):
            out, lens = seqpack.pad_packed_sequence(p, batch_first=batch_first,
                                                    padding_value=7,
                                                    total_length=total_length)
            tout, tlens = trnn.pad_packed_sequence(tp, batch_first=batch_first,
                                                   padding_value=7,
                                                   total_length=total_length)
            assert_same(out, tout, "pad_packed_sequence")
            assert_same(lens, tlens, "lengths")

        for a, e in zip(seqpack.unpack_sequence(p), trnn.unpack_sequence(tp)):
            assert_same(a, e, "unpack_sequence")

    before = padded.copy()
    unpadded = seqpack.unpad_sequence(padded, lengths, batch_first=batch_first)
    tunpadded = trnn.unpad_sequence(tpadded.clone(), torch.tensor(lengths),
                                    batch_first=batch_first)
    assert len(unpadded) == len(tunpadded)
    for a, e in zip(unpadded, tunpadded):
        assert_same(a, e, "unpad_sequence")
    np.testing.assert_array_equal(padded, before)  # input not modified (torch's is)


def test_random_round_trips():
    seed = base_seed() + 1
    rng = np.random.default_rng(seed)
    for trial in range(20):
        b = int(rng.integers(1, 7))
        lengths = rng.integers(1, 6, size=b).tolist()
        seqs = random_sequences(rng, lengths, (2,), np.float32)
        tseqs = [torch.from_numpy(s) for s in seqs]
        p = seqpack.pack_sequence(seqs, enforce_sorted=False)
        tp = trnn.pack_sequence(tseqs, enforce_sorted=False)
        try:
            assert_same_packed(p, tp)
            padded, lens = seqpack.pad_packed_sequence(p, batch_first=True)
            for s, u in zip(seqs, seqpack.unpad_sequence(padded, lens, batch_first=True)):
                np.testing.assert_array_equal(s, u)
        except AssertionError as e:
            raise AssertionError(f"seed {seed}, trial {trial}, lengths {lengths}: {e}") from e


def test_demo_batch_hand_worked():
    seqs = [np.array([1., 2, 3]), np.array([4., 5]), np.array([6., 7, 8, 9])]
    p = seqpack.pack_sequence(seqs, enforce_sorted=False)
    np.testing.assert_array_equal(p.data, [6, 1, 4, 7, 2, 5, 8, 3, 9])
    np.testing.assert_array_equal(p.batch_sizes, [3, 3, 2, 1])
    np.testing.assert_array_equal(p.sorted_indices, [2, 0, 1])
    np.testing.assert_array_equal(p.unsorted_indices, [1, 2, 0])
    data, batch_sizes, sorted_indices, unsorted_indices = p  # a namedtuple, like torch's
    assert batch_sizes.dtype == np.int64
    padded, lengths = seqpack.pad_packed_sequence(p)
    np.testing.assert_array_equal(lengths, [3, 2, 4])
    assert padded.shape == (4, 3)


def test_repr_like_torch():
    seqs = [np.array([1, 2, 3]), np.array([4, 5]), np.array([6, 7, 8, 9])]
    p = seqpack.pack_sequence(seqs, enforce_sorted=False)
    tp = trnn.pack_sequence([torch.tensor(s) for s in seqs], enforce_sorted=False)
    assert repr(p) == repr(tp)
    sorted_p = seqpack.pack_sequence([np.array([1, 2]), np.array([3])])
    sorted_tp = trnn.pack_sequence([torch.tensor([1, 2]), torch.tensor([3])])
    assert repr(sorted_p) == repr(sorted_tp)


def test_padding_side_left():
    seqs = [np.array([1., 2, 3]), np.array([4., 5]), np.array([6.])]
    left = seqpack.pad_sequence(seqs, batch_first=True, padding_value=-1, padding_side="left")
    np.testing.assert_array_equal(left, [[1, 2, 3], [-1, 4, 5], [-1, -1, 6]])
    left_tm = seqpack.pad_sequence(seqs, padding_side="left")
    np.testing.assert_array_equal(left_tm, np.array([[1, 2, 3], [0, 4, 5], [0, 0, 6]]).T)
    with pytest.raises(ValueError, match="'middle'"):
        seqpack.pad_sequence(seqs, padding_side="middle")


def test_invert_permutation():
    perm = np.array([2, 0, 3, 1])
    np.testing.assert_array_equal(seqpack.invert_permutation(perm),
                                  trnn.invert_permutation(torch.tensor(perm)).numpy())
    assert seqpack.invert_permutation(None) is None
    with pytest.raises(ValueError):
        seqpack.invert_permutation([0, 0, 1])


def test_packed_sequence_constructor_computes_unsorted_indices():
    p = seqpack.PackedSequence(np.arange(3.0), [2, 1], sorted_indices=[1, 0])
    np.testing.assert_array_equal(p.unsorted_indices, [1, 0])
    tp = trnn.PackedSequence(torch.arange(3.0), torch.tensor([2, 1]), torch.tensor([1, 0]))
    assert_same(p.unsorted_indices, tp.unsorted_indices)


def test_zero_length_sequences_beyond_torch():
    seqs = [np.array([1., 2]), np.zeros((0,)), np.array([3.])]
    p = seqpack.pack_sequence(seqs, enforce_sorted=False)
    np.testing.assert_array_equal(p.data, [1, 3, 2])
    np.testing.assert_array_equal(p.batch_sizes, [2, 1])
    padded, lengths = seqpack.pad_packed_sequence(p, batch_first=True, padding_value=-1)
    np.testing.assert_array_equal(lengths, [2, 0, 1])
    np.testing.assert_array_equal(padded, [[1, 2], [-1, -1], [3, -1]])
    back = seqpack.unpack_sequence(p)
    assert [len(s) for s in back] == [2, 0, 1]


def test_zero_copy_bridge():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = seqpack._seqpack._tensor_roundtrip(a)
    assert np.shares_memory(a, b)
    b[0, 0] = 100
    assert a[0, 0] == 100
    # The result keeps the storage alive after the source is gone.
    c = seqpack._seqpack._tensor_roundtrip(np.ones(5))
    del a
    np.testing.assert_array_equal(c, np.ones(5))
    # Packing a time-major padded batch of equal lengths shares no state with it,
    # but the padded input is not copied before the call: the result is right
    # for a non-contiguous input too (converted by the Python layer).
    x = np.arange(24, dtype=np.float64).reshape(4, 3, 2)
    p = seqpack.pack_padded_sequence(x.transpose(1, 0, 2), [4, 4, 4], batch_first=True)
    np.testing.assert_array_equal(p.data, x.reshape(12, 2))


# Bad inputs: ValueError/TypeError naming the offending value.

def test_bad_lengths():
    x = np.zeros((5, 3, 2), dtype=np.float32)
    with pytest.raises(TypeError, match="float64"):
        seqpack.pack_padded_sequence(x, np.array([5.0, 3.0, 2.0]))
    with pytest.raises(TypeError, match="float"):
        seqpack.pack_padded_sequence(x, [5, 3.5, 2])
    with pytest.raises(TypeError, match="bool"):
        seqpack.pack_padded_sequence(x, np.array([True, True, False]))
    with pytest.raises(ValueError, match=r"1-D.*\(3, 1\)"):
        seqpack.pack_padded_sequence(x, np.array([[5], [3], [2]]))
    with pytest.raises(TypeError, match="lengths"):
        seqpack.pack_padded_sequence(x, "532")
    with pytest.raises(ValueError, match="7"):
        seqpack.pack_padded_sequence(x, [7, 3, 2])          # longer than T = 5
    with pytest.raises(ValueError, match="-1"):
        seqpack.pack_padded_sequence(x, [5, 3, -1])
    with pytest.raises(ValueError, match="enforce_sorted"):
        seqpack.pack_padded_sequence(x, [2, 3, 5])
    with pytest.raises(ValueError, match="2"):
        seqpack.pack_padded_sequence(x, [5, 3])             # 2 lengths for a batch of 3
    with pytest.raises(ValueError, match="total_length"):
        seqpack.pad_packed_sequence(seqpack.pack_padded_sequence(x, [5, 3, 2]), total_length=4)


def test_bad_arrays():
    with pytest.raises(ValueError, match="dim"):
        seqpack.pack_padded_sequence(np.zeros(5, dtype=np.float32), [5])  # rank 1
    with pytest.raises(TypeError, match="int32"):
        seqpack.pad_sequence([np.zeros(3, dtype=np.int32)])
    with pytest.raises(TypeError, match="float16"):
        seqpack.pack_sequence([np.zeros(3, dtype=np.float16)])
    with pytest.raises(TypeError, match="sequences\\[1\\]"):
        seqpack.pad_sequence([np.zeros(3), np.zeros(3, dtype=np.complex64)])
    with pytest.raises(ValueError):
        seqpack.pad_sequence([])
    with pytest.raises(ValueError):
        seqpack.pad_sequence([np.zeros((3, 2)), np.zeros((3, 4))])  # trailing shapes differ
    with pytest.raises(ValueError):
        seqpack.pad_sequence([np.zeros(3), np.zeros(3, dtype=np.float32)])  # dtypes differ
    with pytest.raises(TypeError, match="PackedSequence"):
        seqpack.pad_packed_sequence(np.zeros(3))
    with pytest.raises(TypeError, match="batch_first"):
        seqpack.pad_sequence([np.zeros(3)], batch_first="yes")


def test_bad_hand_built_packed_sequence():
    p = seqpack.PackedSequence(np.arange(4.0), [1, 3])  # batch_sizes increase
    with pytest.raises(ValueError, match="batch_sizes"):
        p.validate()
    with pytest.raises(ValueError, match="batch_sizes"):
        seqpack.pad_packed_sequence(p)
    q = seqpack.PackedSequence(np.arange(5.0), [2, 2])  # 4 rows claimed, 5 given
    with pytest.raises(ValueError):
        seqpack.pad_packed_sequence(q)
