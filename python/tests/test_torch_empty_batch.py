"""A padded batch of size 0 through the seqpack.torch layers: torch.nn's
output, h_n and c_n shapes and dtypes (compared with torch.nn's layers live),
and a backward that gives zero gradients of the right shapes."""
import itertools

import pytest
import torch

import seqpack.torch as spt
from helpers import base_seed

KINDS = ["LSTM", "LSTM-proj", "GRU", "RNN_TANH", "RNN_RELU"]


def layers(kind, dtype, **kwargs):
    """(seqpack.torch layer, torch.nn layer with the same weights)."""
    torch.manual_seed(base_seed())
    if kind.startswith("LSTM"):
        if kind == "LSTM-proj":
            kwargs["proj_size"] = 2
        pair = spt.LSTM(3, 4, dtype=dtype, **kwargs), torch.nn.LSTM(3, 4, dtype=dtype, **kwargs)
    elif kind == "GRU":
        pair = spt.GRU(3, 4, dtype=dtype, **kwargs), torch.nn.GRU(3, 4, dtype=dtype, **kwargs)
    else:
        nl = kind[4:].lower()
        pair = (spt.RNN(3, 4, nonlinearity=nl, dtype=dtype, **kwargs),
                torch.nn.RNN(3, 4, nonlinearity=nl, dtype=dtype, **kwargs))
    pair[1].load_state_dict(pair[0].state_dict())
    return pair


def flat(result):
    out, hidden = result
    return [out] + (list(hidden) if isinstance(hidden, tuple) else [hidden])


def run(m, x, h0):
    """Forward, then backward of every result's sum: the tensors, the grads
    of x and h0 (None where not asked) and of every weight."""
    m.zero_grad()
    x = x.clone().requires_grad_()
    h = None if h0 is None else tuple(t.clone().requires_grad_() for t in h0)
    hx = None if h is None else (h if len(h) == 2 else h[0])
    results = flat(m(x, hx))
    sum(r.sum() for r in results).backward()
    return (results, x.grad, None if h is None else [t.grad for t in h],
            [p.grad for p in m.parameters()])


def same_shapes(ours, ref, what):
    assert ours.shape == ref.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    assert ours.dtype == ref.dtype, f"{what}: dtype {ours.dtype} != {ref.dtype}"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch_first, bidirectional, num_layers, with_h0, dtype",
                         [c for c in itertools.product((False, True), (False, True), (1, 2),
                                                       (False, True),
                                                       (torch.float32, torch.float64))
                          if not (c[2] == 2 and c[4] == torch.float64)])
def test_empty_batch_matches_torch(kind, batch_first, bidirectional, num_layers, with_h0, dtype):
    ours_m, ref_m = layers(kind, dtype, batch_first=batch_first, bidirectional=bidirectional,
                           num_layers=num_layers)
    T = 5
    x = torch.zeros((0, T, 3) if batch_first else (T, 0, 3), dtype=dtype)
    h0 = None
    if with_h0:
        layers_dirs = num_layers * (2 if bidirectional else 1)
        real = 2 if kind == "LSTM-proj" else 4
        h0 = (torch.zeros(layers_dirs, 0, real, dtype=dtype),)
        if kind.startswith("LSTM"):
            h0 += (torch.zeros(layers_dirs, 0, 4, dtype=dtype),)
    ours = run(ours_m, x, h0)
    ref = run(ref_m, x, h0)
    assert len(ours[0]) == len(ref[0])
    for i, (a, b) in enumerate(zip(ours[0], ref[0])):
        same_shapes(a, b, f"result {i}")
    same_shapes(ours[1], ref[1], "x.grad")
    if with_h0:
        for i, (a, b) in enumerate(zip(ours[2], ref[2])):
            same_shapes(a, b, f"h0[{i}].grad")
    for (name, _), a, b in zip(ours_m.named_parameters(), ours[3], ref[3]):
        assert b is not None and a is not None, f"{name}.grad: {a} (torch: {b})"
        same_shapes(a, b, f"{name}.grad")
        assert not a.any(), f"{name}.grad is not all zeros"


@pytest.mark.parametrize("kind", KINDS)
def test_empty_batch_without_grad_and_with_lengths(kind):
    m, ref_m = layers(kind, torch.float32)
    x = torch.zeros(4, 0, 3)
    with torch.no_grad():
        ours, ref = flat(m(x)), flat(ref_m(x))
        for i, (a, b) in enumerate(zip(ours, ref)):
            same_shapes(a, b, f"no_grad result {i}")
    # seqpack's lengths= (torch has none): no lengths for no sequences.
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            got = flat(m(x, lengths=torch.zeros(0, dtype=torch.int64)))
        for i, (a, b) in enumerate(zip(got, ref)):
            same_shapes(a, b, f"lengths result {i} (grad {grad})")


class Tagger(torch.nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        out, (h_n, c_n) = self.rnn(x)
        return out, h_n, c_n


def test_empty_batch_scripted():
    m, ref_m = layers("LSTM", torch.float32)
    scripted = torch.jit.script(Tagger(m))
    x = torch.zeros(4, 0, 3)
    for a, b in zip(scripted(x), flat(ref_m(x))):
        same_shapes(a, b, "scripted")


def test_issue_repro():
    out, (h_n, c_n) = spt.LSTM(3, 5)(torch.zeros(4, 0, 3))
    assert out.shape == (4, 0, 5) and h_n.shape == (1, 0, 5) and c_n.shape == (1, 0, 5)
