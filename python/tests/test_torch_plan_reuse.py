"""Weights laid out once per version: every call of a seqpack.torch layer reads
its weights through a plan kept per weight set and torch version counter
(seqpack_torch/ops.cpp, "the model plan"), training calls too. These tests
check that a plan never outlives the weights it was made from: after an
in-place change (an optimiser step, a no_grad edit) the next call, forward
and backward, computes with the new values, as torch.nn does."""
import pytest
import torch

import seqpack.torch as st
from tolerance import assert_fp_close, rnn_reduction_length

CELLS = {"LSTM": (torch.nn.LSTM, st.LSTM), "GRU": (torch.nn.GRU, st.GRU),
         "RNN": (torch.nn.RNN, st.RNN)}


def pair(name, input_size, hidden, dtype, seed=0):
    torch.manual_seed(seed)
    ref_cls, sp_cls = CELLS[name]
    ref = ref_cls(input_size, hidden).to(dtype)
    sp = sp_cls(input_size, hidden).to(dtype)
    sp.load_state_dict(ref.state_dict())
    return ref, sp


def state(name, h):
    return (h, h.clone()) if name == "LSTM" else h


@pytest.mark.parametrize("name", list(CELLS))
def test_an_in_place_change_between_training_calls_is_seen(name):
    """Train mode, weights requiring grad: a forward and backward, then W_hh
    negated in place, then another: the second call's outputs and gradients
    are torch's with the new weights, not the first plan's."""
    I, H, B = 7, 33, 3
    ref, sp = pair(name, I, H, torch.float32)
    x = torch.randn(4, B, I)
    h0 = torch.randn(1, B, H)
    n = rnn_reduction_length(I, H, steps=4)
    outs = []
    for change in (False, True):
        if change:
            with torch.no_grad():
                for m in (ref, sp):
                    m.weight_hh_l0.mul_(-1)
                    m.bias_ih_l0.add_(0.5)
        for m in (ref, sp):
            m.zero_grad(set_to_none=True)
        xr, xs = x.clone().requires_grad_(), x.clone().requires_grad_()
        yr, _ = ref(xr, state(name, h0))
        ys, _ = sp(xs, state(name, h0))
        assert_fp_close(ys.detach(), yr.detach(), n, what=f"{name} output, change {change}")
        yr.square().sum().backward()
        ys.square().sum().backward()
        assert_fp_close(xs.grad, xr.grad, n, what=f"{name} input grad, change {change}")
        for (k, pr), (_, ps) in zip(ref.named_parameters(), sp.named_parameters()):
            assert_fp_close(ps.grad, pr.grad, n * B, what=f"{name} {k} grad, change {change}")
        outs.append(ys.detach())
    assert (outs[0] - outs[1]).abs().max() > 0.05  # the change was not a no-op


@pytest.mark.parametrize("name", ["LSTM", "GRU"])
def test_a_decoder_run_one_step_per_call_trains_as_torch(name):
    """A decoder run a step per call (teacher forcing) for 5 steps, a loss, a
    backward and an SGD step, three times: the same plan serves the calls
    within an optimiser step and a new one follows each step. float64, so the
    bound stays tight over the iterations."""
    I, H, B, T = 5, 24, 2, 5
    ref, sp = pair(name, I, H, torch.float64, seed=3)
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (ref, sp)]
    torch.manual_seed(4)
    xs = torch.randn(T, 1, B, I, dtype=torch.float64)
    h0 = torch.randn(1, B, H, dtype=torch.float64)
    n = rnn_reduction_length(I, H, steps=T) * 4
    for it in range(3):
        losses = []
        for m, opt in zip((ref, sp), opts):
            opt.zero_grad()
            hx, loss, ys = state(name, h0), 0, []
            for t in range(T):
                y, hx = m(xs[t], hx)
                ys.append(y)
                loss = loss + y.square().mean()
            loss.backward()
            opt.step()
            losses.append((loss.detach(), torch.cat(ys).detach()))
        assert_fp_close(losses[1][1], losses[0][1], n, what=f"{name} outputs, iteration {it}")
        assert_fp_close(losses[1][0], losses[0][0], n * T, what=f"{name} loss, iteration {it}")
        for (k, pr), (_, ps) in zip(ref.named_parameters(), sp.named_parameters()):
            assert_fp_close(ps.detach(), pr.detach(), n * T,
                            what=f"{name} {k} after step {it}")
