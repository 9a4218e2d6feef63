"""The `lengths` seqpack.torch takes (pack_padded_sequence, the layers' forward):
what torch.nn.utils.rnn.pack_padded_sequence takes (1.13 and 2.6 alike: any
integer tensor, lists, tuples, NumPy integer arrays), with the same result;
floating-point and bool lengths, which torch truncates or reads as 0/1
silently, and values that are no lengths at all are a TypeError naming them."""
import numpy as np
import pytest
import torch
import torch.nn.utils.rnn as trnn

import seqpack.torch as st
from tolerance import assert_like_torch

LENGTHS = [5, 2, 4]

ACCEPTED = {
    "list": lambda: list(LENGTHS),
    "tuple": lambda: tuple(LENGTHS),
    "int64": lambda: torch.tensor(LENGTHS),
    "int32": lambda: torch.tensor(LENGTHS, dtype=torch.int32),
    "int16": lambda: torch.tensor(LENGTHS, dtype=torch.int16),
    "int8": lambda: torch.tensor(LENGTHS, dtype=torch.int8),
    "uint8": lambda: torch.tensor(LENGTHS, dtype=torch.uint8),
    "numpy-int64": lambda: np.array(LENGTHS),
    "numpy-int32": lambda: np.array(LENGTHS, dtype=np.int32),
}


def padded(batch_first=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn((3, 5, 2) if batch_first else (5, 3, 2), generator=g)


def same_packed(got, want):
    assert torch.equal(got.data, want.data)
    assert torch.equal(got.batch_sizes, want.batch_sizes)
    for a, b in [(got.sorted_indices, want.sorted_indices),
                 (got.unsorted_indices, want.unsorted_indices)]:
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))


@pytest.mark.parametrize("kind", sorted(ACCEPTED))
@pytest.mark.parametrize("batch_first", [False, True])
def test_pack_takes_what_torch_takes(kind, batch_first):
    x = padded(batch_first)
    same_packed(st.pack_padded_sequence(x, ACCEPTED[kind](), batch_first, enforce_sorted=False),
                trnn.pack_padded_sequence(x, ACCEPTED[kind](), batch_first, enforce_sorted=False))
    ordered = sorted(LENGTHS, reverse=True)
    lengths = ACCEPTED[kind]()
    lengths = type(lengths)(ordered) if isinstance(lengths, (list, tuple)) else \
        lengths[torch.tensor([0, 2, 1])] if isinstance(lengths, torch.Tensor) else lengths[[0, 2, 1]]
    same_packed(st.pack_padded_sequence(x, lengths, batch_first),
                trnn.pack_padded_sequence(x, lengths, batch_first))


@pytest.mark.parametrize("kind", ["list", "tuple", "int32", "uint8", "numpy-int32"])
@pytest.mark.parametrize("cls", [st.LSTM, st.GRU, st.RNN])
def test_layer_lengths_of_any_integer_kind(kind, cls):
    torch.manual_seed(0)
    m = cls(2, 3, batch_first=True)
    x = padded(batch_first=True, seed=1)
    with torch.no_grad():
        want = m(x, lengths=torch.tensor(LENGTHS))
        got = m(x, lengths=ACCEPTED[kind]())
    assert torch.equal(got[0], want[0])
    # The output against torch's module on torch's packing.
    ref = getattr(torch.nn, cls.__name__)(2, 3, batch_first=True)
    ref.load_state_dict(m.state_dict())
    with torch.no_grad():
        out, _ = ref(trnn.pack_padded_sequence(x, LENGTHS, True, enforce_sorted=False))
        ref_out, _ = trnn.pad_packed_sequence(out, True, total_length=5)
    assert_like_torch(got[0], ref_out, m, LENGTHS, f"{cls.__name__} output, lengths as {kind}")


@pytest.mark.parametrize("lengths,message", [
    (torch.tensor([5.0, 2.0, 4.0]), "lengths has dtype torch.float32"),
    ([5.0, 2.5, 4.0], "lengths has dtype torch.float32"),
    (np.array([5.0, 2.0, 4.0]), "lengths has dtype torch.float64"),
    (torch.tensor([True, True, False]), "lengths has dtype torch.bool"),
    ("abc", "got str"),
    ([5, None, 4], "got list"),
    ({5, 2, 4}, "got set"),
])
def test_lengths_that_are_no_lengths_are_a_type_error(lengths, message):
    x = padded()
    with pytest.raises(TypeError, match=f"pack_padded_sequence: .*{message}"):
        st.pack_padded_sequence(x, lengths, enforce_sorted=False)
    with pytest.raises(TypeError, match=f"GRU.forward: .*{message}"):
        st.GRU(2, 3)(x, lengths=lengths)


def test_lengths_of_the_wrong_shape_are_an_error():
    # pack_padded_sequence: torch's type (RuntimeError); the layers' lengths=
    # (seqpack's own argument): ValueError.
    x = padded()
    with pytest.raises(RuntimeError, match="lengths must be 1-D"):
        st.pack_padded_sequence(x, 3)
    with pytest.raises(ValueError, match="lengths must be 1-D with one entry per sequence"):
        st.LSTM(2, 3)(x, lengths=[5, 2])


def test_empty_list_is_an_empty_batch():
    x = torch.zeros(0, 0, 2)
    got = st.pack_padded_sequence(x, [], enforce_sorted=False)
    assert got.data.shape == (0, 2) and got.batch_sizes.numel() == 0
