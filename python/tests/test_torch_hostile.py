"""Hostile inputs to seqpack.torch's packing functions (issue 41, items 6, 9,
12, 13), compared with torch.nn.utils.rnn live where torch takes them."""
import pytest
import torch
import torch.nn.utils.rnn as tr
from torch.nn.utils.rnn import PackedSequence

import seqpack.torch as st


def _outcome(f, *args):
    try:
        return f(*args), None
    except Exception as e:  # the type is compared, torch's message differs by version
        return None, type(e)


@pytest.mark.parametrize("a,b", [(torch.int64, torch.float32), (torch.float32, torch.float64),
                                 (torch.bool, torch.int64), (torch.float16, torch.float32)])
def test_pack_sequence_takes_the_first_sequences_dtype(a, b):
    seqs = [torch.arange(6).view(3, 2).to(a), torch.arange(4).view(2, 2).to(b)]
    want = tr.pack_sequence(seqs)
    got = st.pack_sequence(seqs)
    assert got.data.dtype == want.data.dtype == a
    assert torch.equal(got.data, want.data)


@pytest.mark.parametrize("devices", [("cpu", "meta"), ("meta", "cpu")])
def test_pack_sequence_mixed_devices_as_torch(devices):
    seqs = [torch.ones(3, 2, device=devices[0]), torch.ones(2, 2, device=devices[1])]
    want, want_error = _outcome(tr.pack_sequence, seqs)
    got, got_error = _outcome(st.pack_sequence, seqs)
    assert got_error == want_error
    if want is not None:
        assert got.data.device == want.data.device


@pytest.mark.parametrize("dtype", [torch.float16, torch.int64, torch.float32])
@pytest.mark.parametrize("f", ["pad", "unpack"])
def test_huge_batch_sizes_refused_before_any_plan(dtype, f):
    p = PackedSequence(torch.ones(3, 2, dtype=dtype), torch.tensor([200_000_000]))
    with pytest.raises(ValueError, match="batch_sizes add up to 200000000 rows but data has 3"):
        if f == "pad":
            st.pad_packed_sequence(p)
        else:
            st.unpack_sequence(p)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_rising_batch_sizes_refused_on_every_path(dtype):
    p = PackedSequence(torch.ones(3, 2, dtype=dtype), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"batch_sizes\[1\] = 2 is greater than batch_sizes\[0\]"):
        st.pad_packed_sequence(p)
    with pytest.raises(ValueError, match=r"batch_sizes\[1\] = 2 is greater"):
        st.unpack_sequence(p)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_float_total_length_names_the_argument(dtype):
    p = st.pack_sequence([torch.ones(3, 2, dtype=dtype), torch.ones(2, 2, dtype=dtype)])
    with pytest.raises((TypeError, RuntimeError), match="total_length"):
        st.pad_packed_sequence(p, total_length=3.0)


def test_unpadded_and_unpacked_sequences_modify_in_place_as_torchs():
    x = torch.randn(3, 2, 2, requires_grad=True)
    for unpad in (tr.unpad_sequence, st.unpad_sequence):
        seqs = unpad(x * 1, torch.tensor([3, 2]))
        seqs[0].mul_(2)
        sum(s.sum() for s in seqs).backward()
    packed = st.pack_sequence([torch.randn(3, 2), torch.randn(2, 2)], enforce_sorted=False)
    y = packed.data.clone().requires_grad_()
    for unpack in (tr.unpack_sequence, st.unpack_sequence):
        seqs = unpack(PackedSequence(y * 1, packed.batch_sizes, packed.sorted_indices,
                                     packed.unsorted_indices))
        seqs[1].add_(1)
        want = sum(s.sum() for s in seqs)
        want.backward()


def test_collate_refuses_mixed_devices():
    # torch.cat of a CPU and a meta tensor gives a meta tensor without a word.
    from seqpack.torch_data import collate_packed
    with pytest.raises(ValueError, match=r"samples\[1\].*on meta does not match samples\[0\]"):
        collate_packed([torch.ones(3, 2), torch.ones(2, 2, device="meta")])
