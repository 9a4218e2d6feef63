"""Gradients of second order through seqpack.torch's recurrent operators
(seqpack::rnn, rnn_padded, and so the layers and cells): create_graph=True,
gradgradcheck in float64 and gradient penalties.

A backward asked to record a graph recomputes the forward in torch's own
differentiable recurrent operators (seqpack_torch/ops.cpp, graph_backward), so
its second derivatives are torch's; what these tests hold it to:
- gradgradcheck (finite differences in float64) for every mode, with and
  without biases, one and two directions, one and two layers, proj_size,
  packed input (enforce_sorted true and false, a zero-length sequence),
  padded input with and without lengths, states given or not, and dropout
  between layers in training (the masks of seqpack's forward);
- its first derivatives equal the core's first-order backward within the
  tolerance rule (docs/testing.md), in float64 and float32: gradgradcheck alone
  would pass a recomputation of a wrong function;
- a gradient penalty, and second derivatives through packing, equal
  torch.nn's with the same weights."""
import pytest
import torch
from torch.nn.utils import rnn as trnn

import seqpack
import seqpack.torch as spt
from helpers import base_seed, torch_twin
from tolerance import assert_fp_close, module_reduction_length, rnn_reduction_length

ops = torch.ops.seqpack
f64 = torch.float64
MODES = ["LSTM", "GRU", "RNN_TANH", "RNN_RELU"]
INPUT, HIDDEN, PROJ = 3, 4, 2
SEED = 4321  # the dropout masks' seed, passed to the operators (deterministic masks)


def layer(mode, dtype=f64, input_size=INPUT, hidden_size=HIDDEN, **kwargs):
    torch.manual_seed(base_seed())
    if mode == "LSTM":
        return spt.LSTM(input_size, hidden_size, dtype=dtype, **kwargs)
    if mode == "GRU":
        return spt.GRU(input_size, hidden_size, dtype=dtype, **kwargs)
    return spt.RNN(input_size, hidden_size, nonlinearity=mode[4:].lower(), dtype=dtype, **kwargs)


class Case:
    """One operator call as a function of its differentiable tensors:
    fn(x, [h0], [c0], *weights) -> (output, h_n[, c_n]), output padded.

    layout: "packed" (pack_padded_sequence, seqpack::rnn, pad_packed_sequence:
    the packing operators' double backward too), "padded" (rnn_padded, no
    lengths) or "padded-lengths" (rnn_padded with lengths, batch_first).
    states: "none", "h0" (LSTM without c0) or "both"."""

    def __init__(self, mode, layout, lengths, num_layers=1, bias=True, bidirectional=False,
                 proj=False, states="both", enforce_sorted=False, dropout=0.0,
                 dtype=f64, input_size=INPUT, hidden_size=HIDDEN):
        self.mode, self.layout, self.lengths = mode, layout, lengths
        self.enforce_sorted, self.dropout, self.dtype = enforce_sorted, dropout, dtype
        self.lstm = mode == "LSTM"
        kwargs = dict(num_layers=num_layers, bias=bias, bidirectional=bidirectional)
        if proj and self.lstm:
            kwargs["proj_size"] = PROJ
        self.m = layer(mode, dtype, input_size, hidden_size, **kwargs)
        gen = torch.Generator().manual_seed(base_seed())
        T, B = max(lengths), len(lengths)
        shape = (B, T, input_size) if layout == "padded-lengths" else (T, B, input_size)
        self.x = torch.randn(*shape, dtype=dtype, generator=gen)
        layers = num_layers * (2 if bidirectional else 1)
        real = self.m.proj_size if self.lstm and self.m.proj_size else hidden_size
        self.h0 = torch.randn(layers, B, real, dtype=dtype, generator=gen) \
            if states != "none" else None
        self.c0 = torch.randn(layers, B, hidden_size, dtype=dtype, generator=gen) \
            if states == "both" and self.lstm else None

    def inputs(self):
        """The tensors fn differentiates, fresh leaves requiring grad."""
        leaves = [self.x] + [s for s in (self.h0, self.c0) if s is not None] \
            + [w.detach() for w in self.m._flat_weights]
        return tuple(t.detach().clone().requires_grad_() for t in leaves)

    def fn(self, x, *rest):
        rest = list(rest)
        h0 = rest.pop(0) if self.h0 is not None else None
        c0 = rest.pop(0) if self.c0 is not None else None
        m = self.m
        args = (m.mode, m.hidden_size, m.num_layers, m.bias)
        tail = (m.proj_size if self.lstm else 0, self.dropout, self.dropout > 0, SEED, "fp32")
        if self.layout == "packed":
            p = spt.pack_padded_sequence(x, torch.tensor(self.lengths),
                                         enforce_sorted=self.enforce_sorted)
            out, h_n, c_n = ops.rnn(p.data, p.batch_sizes, p.sorted_indices, p.unsorted_indices,
                                    h0, c0, rest, *args, m.bidirectional, *tail)
            out = spt.pad_packed_sequence(trnn.PackedSequence(
                out, p.batch_sizes, p.sorted_indices, p.unsorted_indices))[0]
        else:
            lengths = torch.tensor(self.lengths) if self.layout == "padded-lengths" else None
            out, h_n, c_n = ops.rnn_padded(x, lengths, h0, c0, rest, *args,
                                           self.layout == "padded-lengths", m.bidirectional,
                                           *tail)
        return (out, h_n, c_n) if self.lstm else (out, h_n)

    def reduction_length(self):
        m = self.m
        return rnn_reduction_length(m.input_size, m.hidden_size, m.num_layers, m.bidirectional,
                                    sum(self.lengths), m.proj_size if self.lstm else 0)


# Per mode: packed input unsorted with a zero-length sequence and sorted,
# padded input with and without lengths, two layers with dropout in training.
def cases(mode):
    lstm = mode == "LSTM"
    return [
        ("packed-unsorted-zero-length",
         dict(layout="packed", lengths=[2, 3, 0, 1], states="both")),
        ("packed-sorted-2-layers-bidir-no-bias-no-states",
         dict(layout="packed", lengths=[3, 2, 1], enforce_sorted=True, num_layers=2,
              bias=False, bidirectional=True, proj=True, states="none")),
        ("padded-bidir-no-bias" + ("-h0-only" if lstm else ""),
         dict(layout="padded", lengths=[3, 3], bias=False, bidirectional=True, proj=True,
              states="h0")),
        ("padded-lengths-2-layers",
         dict(layout="padded-lengths", lengths=[1, 3, 2], num_layers=2, states="both")),
        ("packed-2-layers-bidir-dropout-train",
         dict(layout="packed", lengths=[2, 3, 1], num_layers=2, bidirectional=True, proj=True,
              dropout=0.5, states="both")),
    ]


CASES = [pytest.param(mode, kwargs, id=f"{mode}-{name}")
         for mode in MODES for name, kwargs in cases(mode)]


@pytest.mark.parametrize("mode,kwargs", CASES)
def test_gradgradcheck_float64(mode, kwargs):
    """Second derivatives against finite differences of the first (fast mode:
    random projections of the Jacobian; the full check is below)."""
    c = Case(mode, **kwargs)
    assert torch.autograd.gradgradcheck(c.fn, c.inputs(), fast_mode=True)


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_gradgradcheck_full_jacobian(mode):
    """The whole second-derivative matrix (torch's own tests run this on LSTM
    and GRU), on a small bidirectional layer with a zero-length sequence."""
    c = Case(mode, "packed", [2, 0, 1], bidirectional=True, proj=True, input_size=2,
             hidden_size=3)
    assert torch.autograd.gradgradcheck(c.fn, c.inputs())


def first_derivatives(c, inputs, create_graph):
    gen = torch.Generator().manual_seed(base_seed() + 1)
    outs = c.fn(*inputs)
    # A loss linear in every output: the same upstream gradients both ways.
    loss = sum((o * torch.randn(o.shape, dtype=o.dtype, generator=gen)).sum() for o in outs)
    return torch.autograd.grad(loss, inputs, create_graph=create_graph)


@pytest.mark.parametrize("dtype", [f64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("mode,kwargs", CASES)
def test_graph_backward_equals_first_order_backward(mode, kwargs, dtype):
    """The first derivatives of a backward recording its graph (torch's
    operators) against the core's first-order backward on the same call."""
    c = Case(mode, dtype=dtype, **kwargs)
    inputs = c.inputs()
    plain = first_derivatives(c, inputs, False)
    graph = first_derivatives(c, inputs, True)
    names = ["x"] + [n for n, s in (("h0", c.h0), ("c0", c.c0)) if s is not None] \
        + list(c.m._flat_weights_names)
    for a, b, name in zip(graph, plain, names):
        assert a.requires_grad, f"d/d{name} records no graph"
        assert_fp_close(a, b, c.reduction_length(), dtype, what=f"d/d{name}")


def gradient_penalty(lib_module, x, lengths):
    """The gradient penalty of WGAN-GP and friends: the norm of the input
    gradient, differentiated with respect to the weights."""
    x = x.detach().clone().requires_grad_()
    p = trnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
    out, _ = lib_module(p)
    loss = out.data.pow(2).sum()
    (g,) = torch.autograd.grad(loss, x, create_graph=True)
    penalty = g.norm()
    params = list(lib_module.parameters())
    return [g.detach()] + list(torch.autograd.grad(penalty, params))


@pytest.mark.parametrize("dtype", [f64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("mode", MODES)
def test_gradient_penalty_equals_torchs(mode, dtype):
    kwargs = dict(num_layers=2, bidirectional=True)
    if mode == "LSTM":
        kwargs["proj_size"] = PROJ
    m = layer(mode, dtype, **kwargs)
    twin = torch_twin(m)
    gen = torch.Generator().manual_seed(base_seed())
    x = torch.randn(3, 3, INPUT, dtype=dtype, generator=gen)
    lengths = [3, 1, 2]
    ours = gradient_penalty(m, x, torch.tensor(lengths))
    ref = gradient_penalty(twin, x, torch.tensor(lengths))
    # The penalty's gradient chains the forward, its backward and that
    # backward's backward: three times a layer's reduction length.
    n = 3 * module_reduction_length(m, lengths)
    names = ["d/dx"] + [f"d penalty/d{w}" for w in m._flat_weights_names]
    for a, b, name in zip(ours, ref, names):
        assert_fp_close(a, b, n, dtype, what=name)


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN"])
def test_cells_second_derivatives_equal_torchs(mode):
    """The cells run a one-step seqpack::rnn: a Hessian-vector product through
    them against torch.nn's cells."""
    torch.manual_seed(base_seed())
    cell = {"LSTM": spt.LSTMCell, "GRU": spt.GRUCell, "RNN": spt.RNNCell}[mode](
        INPUT, HIDDEN, dtype=f64)
    twin = getattr(torch.nn, mode + "Cell")(INPUT, HIDDEN, dtype=f64)
    twin.load_state_dict(cell.state_dict())
    gen = torch.Generator().manual_seed(base_seed())
    x0 = torch.randn(2, INPUT, dtype=f64, generator=gen)
    h0 = torch.randn(2, HIDDEN, dtype=f64, generator=gen)
    v = torch.randn(2, INPUT, dtype=f64, generator=gen)

    def hvp(c):
        x = x0.clone().requires_grad_()
        hx = (h0, h0.cos()) if mode == "LSTM" else h0
        out = c(x, hx)
        out = out[0] * out[1] if mode == "LSTM" else out
        (g,) = torch.autograd.grad(out.pow(3).sum(), x, create_graph=True)
        return torch.autograd.grad((g * v).sum(), [x] + list(c.parameters()))
    for a, b in zip(hvp(cell), hvp(twin)):
        assert_fp_close(a, b, rnn_reduction_length(INPUT, HIDDEN), f64, what=f"{mode}Cell HVP")


def test_empty_batch_double_backward():
    """A padded batch of size 0: no rows, the states pass through (h_n = h0)."""
    m = layer("LSTM")
    x = torch.randn(3, 0, INPUT, dtype=f64, requires_grad=True)
    h0 = torch.randn(1, 0, HIDDEN, dtype=f64, requires_grad=True)
    out, (h_n, _) = m(x, (h0, torch.zeros(1, 0, HIDDEN, dtype=f64)))
    assert out.shape == (3, 0, HIDDEN)
    (g,) = torch.autograd.grad(out.sum() + h_n.pow(2).sum(), h0, create_graph=True)
    assert g.requires_grad and g.shape == h0.shape


def test_double_backward_under_autocast_is_fp32s():
    """Under torch.autocast("cpu", bfloat16) the forward runs seqpack's bf16
    precision where the CPU has native bf16; a backward recording a graph
    recomputes it in fp32, so its gradients are those of the fp32 layer."""
    m = layer("LSTM", torch.float32, num_layers=2)
    gen = torch.Generator().manual_seed(base_seed())
    x0 = torch.randn(3, 2, INPUT, generator=gen)
    g_out = torch.randn(3, 2, HIDDEN, generator=gen)

    def grads(autocast):
        x = x0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = m(x)[0]
            (g,) = torch.autograd.grad((out.float() * g_out).sum(), x, create_graph=True)
        return [g.detach()] + list(torch.autograd.grad(g.pow(2).sum(), list(m.parameters())))
    n = 3 * module_reduction_length(m, [3, 3])
    for a, b in zip(grads(True), grads(False)):
        assert a.dtype == torch.float32
        assert_fp_close(a, b, n, torch.float32, what="under autocast")


@pytest.mark.skipif(not seqpack.cpu_info()["native_bf16"],
                    reason=f"no native bf16 on {seqpack.cpu_info()['isa']}")
def test_bf16_graph_gradients_within_bf16s_bound_of_its_first_order_ones():
    """Where the CPU has native bf16, autocast's forward runs bf16 products; the
    first-order backward is bf16's, the graph's is fp32's recomputation: they
    differ by bf16's error bound (docs/performance.md, "bf16 numerics": cosine
    >= 0.999, relative L2 error <= 0.05 for LSTM)."""
    m = layer("LSTM", torch.float32, input_size=16, hidden_size=32, bidirectional=True)
    gen = torch.Generator().manual_seed(base_seed())
    x0 = torch.randn(20, 4, 16, generator=gen)
    g_out = torch.randn(20, 4, 64, generator=gen)

    def grads(create_graph):
        x = x0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(x)[0]
            return torch.autograd.grad((out.float() * g_out).sum(), [x] + list(m.parameters()),
                                       create_graph=create_graph)
    for a, b, name in zip(grads(True), grads(False), ["x"] + m._flat_weights_names):
        a, b = a.detach().double().flatten(), b.double().flatten()
        cosine = float(a @ b / (a.norm() * b.norm()))
        rel = float((a - b).norm() / a.norm())
        assert cosine >= 0.999 and rel <= 0.05, f"d/d{name}: cosine {cosine}, rel. L2 {rel}"
