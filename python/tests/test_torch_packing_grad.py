"""Gradients of every order through seqpack.torch.pack_padded_sequence and
pad_packed_sequence (the operators' backward operators are differentiable:
each is the other's adjoint), against torch.nn.utils.rnn's values and
finite differences (gradcheck, gradgradcheck) in float64, alone and with a
recurrent layer between them (whose double backward
test_torch_double_backward.py checks in full)."""
import pytest
import torch
from torch.nn.utils import rnn as trnn

import seqpack.torch as spt
from helpers import base_seed, torch_twin
from tolerance import assert_fp_close, module_reduction_length

f64 = torch.float64


def close(actual, expected, what):
    # Packing only moves values: the composite losses below differ from
    # torch's by float64 summation order at most.
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12,
                               msg=lambda m: f"{what}: {m}")


def round_trip(lib, x, lengths, batch_first, enforce_sorted, total_length=None):
    p = lib.pack_padded_sequence(x, lengths, batch_first=batch_first,
                                 enforce_sorted=enforce_sorted)
    return lib.pad_packed_sequence(p, batch_first=batch_first, total_length=total_length)[0]


def second_order_grads(lib, x, w, lengths, batch_first=False, enforce_sorted=False,
                       total_length=None):
    """The issue's repro: a loss with a gradient inside it, backward to x and w."""
    x = x.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    o = round_trip(lib, x * w, lengths, batch_first, enforce_sorted, total_length)
    g = torch.autograd.grad((o ** 2).sum(), x, create_graph=True)[0]
    ((o ** 2).sum() + (g ** 2).sum() + (x * w).sum()).backward()
    return o.detach(), g.detach(), x.grad, w.grad


def test_issue_repro_second_order_gradients_equal_torchs():
    gen = torch.Generator().manual_seed(base_seed())
    x = torch.randn(4, 3, 2, dtype=f64, generator=gen)
    w = torch.randn(2, dtype=f64, generator=gen)
    lengths = torch.tensor([4, 2, 3])
    ours = second_order_grads(spt, x, w, lengths)
    ref = second_order_grads(trnn, x, w, lengths)
    for a, b, name in zip(ours, ref, ("output", "grad", "x.grad", "w.grad")):
        close(a, b, name)


# (lengths, batch_first, enforce_sorted, total_length); seqpack also takes
# zero-length sequences, which torch refuses (compared with finite differences).
CASES = [
    ([4, 2, 3], False, False, None),
    ([4, 2, 3], True, False, None),
    ([4, 3, 1], False, True, None),
    ([4, 3, 1], True, True, 6),
    ([1, 4, 4, 2], True, False, 5),
    ([3], False, True, None),
    ([2, 2, 2], False, False, None),
]


@pytest.mark.parametrize("lengths, batch_first, enforce_sorted, total_length", CASES)
def test_second_order_gradients_equal_torchs(lengths, batch_first, enforce_sorted, total_length):
    gen = torch.Generator().manual_seed(base_seed())
    T, B = max(lengths), len(lengths)
    x = torch.randn(*((B, T) if batch_first else (T, B)), 3, dtype=f64, generator=gen)
    w = torch.randn(3, dtype=f64, generator=gen)
    lens = torch.tensor(lengths)
    ours = second_order_grads(spt, x, w, lens, batch_first, enforce_sorted, total_length)
    ref = second_order_grads(trnn, x, w, lens, batch_first, enforce_sorted, total_length)
    for a, b, name in zip(ours, ref, ("output", "grad", "x.grad", "w.grad")):
        close(a, b, f"{lengths} batch_first={batch_first} enforce_sorted={enforce_sorted}: {name}")


GRADCHECK_CASES = CASES + [
    ([2, 0, 4], False, False, 5),  # a zero-length sequence (seqpack only)
    ([0, 3], True, False, None),
]


@pytest.mark.parametrize("lengths, batch_first, enforce_sorted, total_length", GRADCHECK_CASES)
def test_gradcheck_and_gradgradcheck(lengths, batch_first, enforce_sorted, total_length):
    gen = torch.Generator().manual_seed(base_seed())
    T, B = max(lengths), len(lengths)
    shape = ((B, T) if batch_first else (T, B)) + (2,)
    x = torch.randn(*shape, dtype=f64, generator=gen, requires_grad=True)
    lens = torch.tensor(lengths)

    def f(x):
        # Squared, so that second derivatives are not all zero.
        return round_trip(spt, x, lens, batch_first, enforce_sorted, total_length) ** 2

    def packed(x):
        p = spt.pack_padded_sequence(x, lens, batch_first=batch_first,
                                     enforce_sorted=enforce_sorted)
        return p.data ** 2

    def padded(data):
        p = spt.pack_padded_sequence(x.detach(), lens, batch_first=batch_first,
                                     enforce_sorted=enforce_sorted)
        p = p._replace(data=data)
        return spt.pad_packed_sequence(p, batch_first=batch_first,
                                       total_length=total_length)[0] ** 2

    data = spt.pack_padded_sequence(x.detach(), lens, batch_first=batch_first,
                                    enforce_sorted=enforce_sorted).data.clone().requires_grad_()
    for fn, arg in ((f, x), (packed, x), (padded, data)):
        assert torch.autograd.gradcheck(fn, (arg,))
        assert torch.autograd.gradgradcheck(fn, (arg,))


def test_third_order_gradient_equals_torchs():
    gen = torch.Generator().manual_seed(base_seed())
    x0 = torch.randn(4, 3, 2, dtype=f64, generator=gen)
    lengths = torch.tensor([4, 2, 3])

    def third(lib):
        x = x0.clone().requires_grad_()
        o = round_trip(lib, x, lengths, False, False) ** 3
        g1 = torch.autograd.grad(o.sum(), x, create_graph=True)[0]
        g2 = torch.autograd.grad(g1.sum(), x, create_graph=True)[0]
        return torch.autograd.grad(g2.sum(), x)[0]
    close(third(spt), third(trnn), "third derivative")


def test_backward_operators_alone():
    """The backward operators called directly with create_graph: the adjoint of
    pack's backward is pad's backward and the other way round."""
    gen = torch.Generator().manual_seed(base_seed())
    ops = torch.ops.seqpack
    x = torch.randn(4, 3, 2, dtype=f64, generator=gen)
    data, batch_sizes, sorted_idx, unsorted_idx = ops.pack_padded_sequence(
        x, torch.tensor([4, 2, 3]), False, False)
    g = torch.randn(data.shape, dtype=f64, generator=gen, requires_grad=True)
    assert torch.autograd.gradgradcheck(
        lambda g: ops._pack_padded_sequence_backward(g, batch_sizes, sorted_idx, unsorted_idx,
                                                     list(x.shape), False) ** 2, (g,))
    gp = torch.randn(5, 3, 2, dtype=f64, generator=gen, requires_grad=True)
    assert torch.autograd.gradgradcheck(
        lambda gp: ops._pad_packed_sequence_backward(gp, batch_sizes, sorted_idx, unsorted_idx,
                                                     list(data.shape), False) ** 2, (gp,))


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_layers_double_backward_through_packing_equals_torchs(mode):
    """pack_padded_sequence, a layer, pad_packed_sequence: second derivatives
    (the gradient of an input-gradient penalty) against torch.nn's."""
    torch.manual_seed(base_seed())
    m = (spt.LSTM if mode == "LSTM" else spt.GRU)(2, 3, dtype=f64)
    twin = torch_twin(m)
    x0 = torch.randn(4, 3, 2, dtype=f64)
    lengths = torch.tensor([4, 3, 2])

    def second_order(lib, layer, enforce_sorted):
        x = x0.clone().requires_grad_()
        p = lib.pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)
        out = lib.pad_packed_sequence(layer(p)[0])[0]
        (g,) = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
        return [g.detach()] + list(torch.autograd.grad(g.pow(2).sum(),
                                                       [x] + list(layer.parameters())))
    for enforce_sorted in (False, True):
        ours = second_order(spt, m, enforce_sorted)
        ref = second_order(trnn, twin, enforce_sorted)
        for a, b in zip(ours, ref):
            # forward, backward, and that backward's backward
            assert_fp_close(a, b, 3 * module_reduction_length(m, lengths.tolist()),
                            what=f"{mode} second derivatives (enforce_sorted={enforce_sorted})")


def test_torch_unpack_sequence_of_a_seqpack_pack():
    """torch's unpack_sequence / unpad_sequence on seqpack's PackedSequence (seqpack.torch
    has no functions of its own for them; they reach seqpack's pack operator)."""
    gen = torch.Generator().manual_seed(base_seed())
    x0 = torch.randn(4, 3, 2, dtype=f64, generator=gen)
    lengths = torch.tensor([4, 2, 3])

    def loss(lib):
        x = x0.clone().requires_grad_()
        p = lib.pack_padded_sequence(x, lengths, enforce_sorted=False)
        seqs = trnn.unpack_sequence(p)
        seqs += trnn.unpad_sequence(lib.pad_packed_sequence(p)[0], lengths)
        s = sum((q ** 3).sum() for q in seqs)
        g = torch.autograd.grad(s, x, create_graph=True)[0]
        return torch.autograd.grad((g ** 2).sum(), x)[0]
    close(loss(spt), loss(trnn), "second derivative through unpack/unpad_sequence")
