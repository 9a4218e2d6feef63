"""A NaN or inf in weight_hh propagates as torch's does when no initial state
is given (issue 41, item 4).

Without h0 the core skips W_hh·h0 for the rows that hold the zero state; that
product is zero only where W_hh is finite (NaN·0 and inf·0 are NaN), so the
skip must not hide a corrupted weight. Each case compares seqpack's layer with
torch.nn's, live, on the same weights: the NaNs in the same places, the finite
values within the tolerance rule (tolerance.py)."""
import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence as torch_pack

import seqpack.torch as st
from helpers import torch_twin
from tolerance import assert_like_torch

MODES = {"LSTM": st.LSTM, "GRU": st.GRU, "RNN": st.RNN}


def _layer(mode, bad, num_layers=1, bidirectional=False, dtype=torch.float32, where=(1, 2)):
    torch.manual_seed(7)
    m = MODES[mode](3, 4, num_layers=num_layers, bidirectional=bidirectional, dtype=dtype)
    with torch.no_grad():
        m.weight_hh_l0[where] = bad
    return m


def _compare(m, x, lengths, packed, grad, what):
    t = torch_twin(m)
    if packed:
        args = [torch_pack(x, lengths, batch_first=False, enforce_sorted=False)]
    else:
        args = [x]
    ctx = torch.enable_grad() if grad else torch.no_grad()
    with ctx:
        y, s = m(*args)
        ty, ts = t(*args)
    if packed:
        y, ty = y.data, ty.data
    states = (s, ts) if not isinstance(s, tuple) else (s[0], ts[0])
    assert_like_torch(y, ty, t, lengths, f"{what}: output")
    assert_like_torch(states[0], states[1], t, lengths, f"{what}: h_n")
    # The corrupted gate row reaches h_n, as in torch: not a vacuous check.
    assert torch.isnan(states[1]).any(), f"{what}: torch gave no NaN"
    if isinstance(s, tuple):
        assert_like_torch(s[1], ts[1], t, lengths, f"{what}: c_n")
    return y, ty


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_length_one_without_h0(mode, bad, packed):
    m = _layer(mode, bad)
    x = torch.randn(1, 2, 3)
    _compare(m, x, [1, 1], packed, grad=False, what=f"{mode} {bad} T=1")


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_longer_sequences_two_layers_bidirectional(mode, grad, dtype):
    m = _layer(mode, float("nan"), num_layers=2, bidirectional=True, dtype=dtype)
    lengths = [4, 1, 3, 2]
    x = torch.randn(4, 4, 3, dtype=dtype)
    for packed in (False, True):
        _compare(m, x, lengths if packed else [4] * 4, packed, grad,
                 f"{mode} {dtype} {'packed' if packed else 'padded'} grad={grad}")


@pytest.mark.parametrize("mode", sorted(MODES))
def test_reverse_direction_weight(mode):
    # The reverse direction's rows begin at each sequence's last step.
    torch.manual_seed(3)
    m = MODES[mode](3, 4, bidirectional=True)
    with torch.no_grad():
        m.weight_hh_l0_reverse[0, 0] = float("inf")
    x = torch.randn(3, 3, 3)
    _compare(m, x, [3, 1, 2], packed=True, grad=False, what=f"{mode} reverse")


@pytest.mark.parametrize("mode", sorted(MODES))
def test_weight_gradients_where_the_first_step_is_not_finite(mode):
    # W_hh finite, but a NaN input row at the first step: torch's dW_hh takes
    # dG·h0 = NaN·0 of that row, and so must seqpack's.
    torch.manual_seed(5)
    m = MODES[mode](3, 4)
    t = torch_twin(m)
    x = torch.randn(2, 2, 3)
    x[0, 1, 0] = float("nan")
    lengths = [2, 1]
    for net in (m, t):
        net.zero_grad()
        y, _ = net(torch_pack(x, lengths, enforce_sorted=False))
        y.data.sum().backward()
    g, tg = m.weight_hh_l0.grad, t.weight_hh_l0.grad
    assert torch.isnan(tg).any()
    assert_like_torch(g, tg, t, lengths, f"{mode}: grad weight_hh")
    assert_like_torch(m.weight_ih_l0.grad, t.weight_ih_l0.grad, t, lengths,
                      f"{mode}: grad weight_ih")


def test_finite_weights_still_give_torchs_result():
    # The skip stays where it is exact: a finite model without h0 matches torch.
    torch.manual_seed(11)
    m = st.LSTM(3, 4, bidirectional=True)
    t = torch_twin(m)
    x = torch.randn(3, 2, 3)
    with torch.no_grad():
        y, (h, c) = m(x)
        ty, (th, tc) = t(x)
    assert np.isfinite(y.numpy()).all()
    assert_like_torch(y, ty, t, [3, 3], "output")
    assert_like_torch(h, th, t, [3, 3], "h_n")


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("nan", [False, True], ids=["finite", "nan-input"])
def test_one_step_weight_gradients_without_h0(mode, nan):
    # A one-step call without h0: every row's h_prev is the zero h0, so dW_hh
    # is dGᵀ·0: zeros where dG is finite (seqpack writes them without a
    # product), NaN where a row's dG is not, as torch's product gives; both
    # directions, two layers, batch 1 and 3.
    torch.manual_seed(13)
    for batch in (1, 3):
        m = MODES[mode](3, 4, num_layers=2, bidirectional=True)
        t = torch_twin(m)
        x = torch.randn(1, batch, 3)
        if nan:
            x[0, batch - 1, 1] = float("nan")
        for net in (m, t):
            net.zero_grad()
            y, _ = net(x)
            y.sum().backward()
        for name, p in m.named_parameters():
            tp = dict(t.named_parameters())[name]
            if not nan and name.startswith("weight_hh"):
                assert torch.equal(tp.grad, torch.zeros_like(tp.grad)), name
            assert_like_torch(p.grad, tp.grad, t, [1] * batch, f"{mode} batch {batch}: grad {name}")
        if nan:
            assert torch.isnan(t.weight_hh_l0.grad).any()
            assert torch.isnan(m.weight_hh_l0_reverse.grad).any()
