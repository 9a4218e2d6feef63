"""Dropout between recurrent layers in seqpack.nn and seqpack.torch: the keep
rate, the 1/(1-p) scale of every kept element, nothing in eval, and the gradient
through the mask. torch.nn.RNN itself is put through the same checks, so the
rule they enforce is PyTorch's.

The mask is made visible by a relu stack that copies its input: no bias,
W_hh = 0, W_ih of layer 0 the identity, and in layer 1 the forward direction
reads the first H columns of its input ([I 0]) and the reverse direction the
last H ([0 I]). For x > 0 every product is exact, so layer 1's output at
(t, b, d*H + k) is m * x[t, b, k] with m = 0 (dropped) or 1/(1-p) (kept).
The keep rate is checked on 24,000-48,000 elements within 9 standard deviations
(at least 0.01): a correct mask fails with probability < 1e-15 for any seed."""
import numpy as np
import pytest
import torch

import seqpack
import seqpack.torch as spt
from helpers import base_seed

H, T, B = 40, 30, 20


def copy_state(bidirectional):
    d = 2 if bidirectional else 1
    state = {}
    for sfx in ["", "_reverse"][:d]:
        state["weight_ih_l0" + sfx] = np.eye(H)
        state["weight_hh_l0" + sfx] = np.zeros((H, H))
        w1 = np.zeros((H, d * H))
        off = H if sfx else 0
        w1[:, off:off + H] = np.eye(H)
        state["weight_ih_l1" + sfx] = w1
        state["weight_hh_l1" + sfx] = np.zeros((H, H))
    return state


def positive_input(dtype, seed):
    return np.random.default_rng(seed).uniform(0.5, 1.5, (T, B, H)).astype(dtype)


def check_mask(out, x, p, bidirectional, what):
    """Every output element is 0 or x/(1-p) (exactly for a power-of-two scale,
    else within 2 ulp); the keep rate is 1-p. Returns the mask (0 or the scale)."""
    out = np.asarray(out, dtype=np.float64)
    xd = np.concatenate([x] * (2 if bidirectional else 1), axis=-1).astype(np.float64)
    scale = 1.0 / (1.0 - p)
    kept = out != 0
    eps = np.finfo(x.dtype).eps
    exact = np.log2(scale) == np.round(np.log2(scale))
    want = xd * scale
    bad = kept & (np.abs(out - want) > (0 if exact else 2 * eps) * want)
    assert not bad.any(), (
        f"{what}: {bad.sum()} kept elements are not x/(1-p); first at "
        f"{tuple(int(i) for i in np.argwhere(bad)[0])}: {out[bad][0]!r} vs {want[bad][0]!r}")
    n = kept.size
    tol = max(0.01, 9 * np.sqrt(p * (1 - p) / n))
    assert abs(kept.mean() - (1 - p)) <= tol, f"{what}: keep rate {kept.mean()} for p = {p}"
    # Each feature column on its own: a mask shared by all rows fails here.
    col = kept.reshape(-1, kept.shape[-1]).mean(axis=0)
    col_tol = 9 * np.sqrt(p * (1 - p) / (T * B))
    assert np.abs(col - (1 - p)).max() <= col_tol, f"{what}: column keep rates {col}"
    return np.where(kept, scale, 0.0)


def check_grad_input(got, mask, g, bidirectional, what):
    """dL/dx for L = <g, output> is the sum over directions of mask * g: within
    4 ulp of the sum of the terms' magnitudes (the two directions may cancel)."""
    mg = mask * np.asarray(g, dtype=np.float64)
    want = mg[..., :H] + mg[..., H:] if bidirectional else mg
    mag = np.abs(mg[..., :H]) + np.abs(mg[..., H:]) if bidirectional else np.abs(mg)
    got = np.asarray(got, dtype=np.float64)
    bad = np.abs(got - want) > 4 * np.finfo(np.asarray(g).dtype).eps * mag
    assert not bad.any(), (
        f"{what}: {bad.sum()} input gradients wrong; first at "
        f"{tuple(int(i) for i in np.argwhere(bad)[0])}: {got[bad][0]!r} vs {want[bad][0]!r} "
        f"(seed {base_seed()})")


@pytest.mark.parametrize("p,bidirectional,dtype", [(0.3, True, np.float32),
                                                   (0.75, False, np.float32),
                                                   (0.2, True, np.float64)])
def test_nn_keep_rate_scale_and_gradient(p, bidirectional, dtype):
    m = seqpack.nn.RNN(H, H, num_layers=2, nonlinearity="relu", bias=False, dropout=p,
                       bidirectional=bidirectional, dtype=dtype, seed=0)
    m.load_state_dict(copy_state(bidirectional))
    x = positive_input(dtype, base_seed())
    m.eval()
    out, _ = m(x)
    np.testing.assert_array_equal(out, np.concatenate([x] * (2 if bidirectional else 1), -1))
    m.train()
    out, _ = m(x)
    mask = check_mask(out, x, p, bidirectional, "seqpack.nn")
    g = np.random.default_rng(base_seed() + 1).standard_normal(out.shape).astype(dtype)
    g_in, _ = m.backward(g)
    check_grad_input(g_in, mask, g, bidirectional, "seqpack.nn")
    # The next training forward draws a new mask.
    out2, _ = m(x)
    assert ((out2 != 0) != (mask != 0)).mean() > 0.2


@pytest.mark.parametrize("cls", [torch.nn.RNN, spt.RNN], ids=["torch", "seqpack.torch"])
@pytest.mark.parametrize("p,bidirectional", [(0.3, True), (0.75, False)])
def test_torch_keep_rate_scale_and_gradient(cls, p, bidirectional):
    m = cls(H, H, num_layers=2, nonlinearity="relu", bias=False, dropout=p,
            bidirectional=bidirectional)
    with torch.no_grad():
        for k, v in copy_state(bidirectional).items():
            getattr(m, k).copy_(torch.from_numpy(v))
    x_np = positive_input(np.float32, base_seed())
    x = torch.from_numpy(x_np).requires_grad_()
    m.eval()
    with torch.no_grad():
        out, _ = m(x)
    np.testing.assert_array_equal(out.numpy(),
                                  np.concatenate([x_np] * (2 if bidirectional else 1), -1))
    m.train()
    torch.manual_seed(base_seed())
    out, _ = m(x)
    mask = check_mask(out.detach().numpy(), x_np, p, bidirectional, cls.__module__)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(base_seed() + 1))
    (out * g).sum().backward()
    check_grad_input(x.grad.numpy(), mask, g.numpy(), bidirectional, cls.__module__)
