"""Bounded inputs from Python (docs/reliability.md, "Bounded inputs"): a size
too large for the C++ core is a ValueError naming the argument, never a
segfault or a raw pybind11 "incompatible function arguments"."""
import numpy as np
import pytest

import seqpack


@pytest.mark.parametrize("hidden", [2**60, 2**62])
def test_huge_hidden_size_is_a_value_error_not_a_crash(hidden):
    # 2**60 segfaulted in the constructor; 2**62 constructed and segfaulted on forward.
    with pytest.raises(ValueError, match=f"hidden_size = {hidden} is too large: seqpack allows "
                                         "at most 16777216"):
        seqpack.nn.LSTM(4, hidden)
    with pytest.raises(ValueError, match=f"hidden_size = {hidden} is too large"):
        seqpack.nn.GRUCell(4, hidden)


def test_sizes_past_int64_name_the_argument():
    int64_range = r"must be in \[-9223372036854775808, 9223372036854775807\]"
    with pytest.raises(ValueError, match=r"hidden_size = 1180591620717411303424 is out of range: "
                                         + int64_range):
        seqpack.nn.LSTM(4, 2**70)
    with pytest.raises(ValueError, match="input_size = -1180591620717411303424 is out of range"):
        seqpack.nn.RNN(-2**70, 4)
    with pytest.raises(ValueError, match="num_layers = 1180591620717411303424"):
        seqpack.nn.GRU(4, 4, num_layers=2**70)
    with pytest.raises(ValueError, match="proj_size = 1180591620717411303424"):
        seqpack.nn.LSTM(4, 8, proj_size=2**70)
    with pytest.raises(ValueError, match="hidden_size = 1180591620717411303424"):
        seqpack.nn.LSTMCell(4, 2**70)


def test_seed_outside_uint64_names_the_argument():
    with pytest.raises(ValueError, match=r"seed = -1 is out of range: must be in \[0, "
                                         r"18446744073709551615\]"):
        seqpack.nn.LSTM(4, 4, seed=-1)
    with pytest.raises(ValueError, match="seed = 18446744073709551616 is out of range"):
        seqpack.nn.GRU(4, 4, seed=2**64)
    m = seqpack.nn.LSTM(4, 4, seed=2**64 - 1)  # the largest seed is one
    with pytest.raises(ValueError, match="seed = -5 is out of range"):
        m.reset_parameters(-5)


def test_sizes_allowed_alone_whose_product_is_too_large():
    with pytest.raises(ValueError, match=r"parameter weight_ih_l0: a float32 tensor of shape "
                                         r"\[67108864, 16777216\] would take"):
        seqpack.nn.LSTM(2**24, 2**24)


def test_pad_packed_total_length_past_int64():
    x = seqpack.pack_sequence([np.ones((2, 1), np.float32)])
    with pytest.raises(ValueError, match="total_length = 1180591620717411303424 is out of range"):
        seqpack.pad_packed_sequence(x, total_length=2**70)


def test_set_num_threads_past_int():
    with pytest.raises(ValueError, match=r"set_num_threads: n must be a positive int \(at most "
                                         r"2\*\*31 - 1\), got 1180591620717411303424"):
        seqpack.set_num_threads(2**70)


def test_padding_value_too_large_for_a_double_names_the_argument():
    seq = [np.ones((2, 1), np.float32)]
    too_large = "padding_value = 1" + "0" * 400 + " is too large for a double"
    with pytest.raises(ValueError, match=too_large):
        seqpack.pad_sequence(seq, padding_value=10**400)
    with pytest.raises(TypeError, match="padding_value should be a number, got: str"):
        seqpack.pad_sequence(seq, padding_value="0")
    with pytest.raises(ValueError, match="padding_value = .* is too large for a double"):
        seqpack.pad_packed_sequence(seqpack.pack_sequence(seq), padding_value=-10**400)
