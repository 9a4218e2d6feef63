"""torch.ops.seqpack.* (libseqpack_torch) directly: gradients in float64
against finite differences, zero-length sequences and padded input with
lengths against torch.nn on the non-empty sequences, the packing operators
against torch's, and bad inputs with clear errors."""
from typing import Tuple

import pytest
import torch
from torch.nn.utils import rnn as trnn

import seqpack.torch as spt
from helpers import assert_close, base_seed, torch_twin
from tolerance import assert_fp_close, assert_like_torch, module_reduction_length

ops = torch.ops.seqpack
MODES = ["LSTM", "GRU", "RNN_TANH", "RNN_RELU"]


def module(mode, dtype=torch.float32, **kwargs):
    torch.manual_seed(base_seed())
    if mode == "LSTM":
        return spt.LSTM(2, 3, dtype=dtype, **kwargs)
    if mode == "GRU":
        return spt.GRU(2, 3, dtype=dtype, **kwargs)
    return spt.RNN(2, 3, nonlinearity=mode[4:].lower(), dtype=dtype, **kwargs)


def rnn_args(m):
    return (m._flat_weights, m.mode, m.hidden_size, m.num_layers, m.bias, m.bidirectional,
            m.proj_size, 0.0, False)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["packed-zero-length", "padded", "padded-lengths"])
def test_gradcheck_float64(mode, layout):
    lstm = mode == "LSTM"
    m = module(mode, torch.float64, num_layers=2, bidirectional=True,
               **({"proj_size": 2} if lstm else {}))
    hr = 2 if lstm else 3
    g = torch.Generator().manual_seed(base_seed())
    h0 = torch.randn(4, 4, hr, dtype=torch.float64, generator=g, requires_grad=True)
    c0 = torch.randn(4, 4, 3, dtype=torch.float64, generator=g, requires_grad=True) if lstm \
        else None
    weights = [w.detach().clone().requires_grad_() for w in m._flat_weights]
    args = (m.mode, m.hidden_size, m.num_layers, m.bias)
    if layout == "packed-zero-length":
        lengths = torch.tensor([3, 0, 3, 2])
        x = torch.randn(3, 4, 2, dtype=torch.float64, generator=g)
        data, batch_sizes, si, ui = ops.pack_padded_sequence(x, lengths, False, False)
        data = data.detach().requires_grad_()

        def f(data, h0, c0, *w):
            return ops.rnn(data, batch_sizes, si, ui, h0, c0, list(w), *args, True,
                           2 if lstm else 0, 0.0, False)[:3 if lstm else 2]
        inputs = (data, h0, c0, *weights)
    else:
        lengths = torch.tensor([3, 1, 3, 2]) if layout == "padded-lengths" else None
        x = torch.randn(4, 3, 2, dtype=torch.float64, generator=g, requires_grad=True)

        def f(x, h0, c0, *w):
            return ops.rnn_padded(x, lengths, h0, c0, list(w), *args, True, True, 2 if lstm else 0,
                                  0.0, False)[:3 if lstm else 2]
        inputs = (x, h0, c0, *weights)
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_zero_length_sequences_against_torch_on_the_others(mode, dtype):
    m = module(mode, dtype, bidirectional=True, batch_first=True)
    t = torch_twin(m)
    lengths = [4, 0, 2, 0, 3]
    g = torch.Generator().manual_seed(base_seed())
    x = torch.randn(5, 4, 2, dtype=dtype, generator=g, requires_grad=True)
    h0 = torch.randn(2, 5, 3, dtype=dtype, generator=g)
    hx = (h0, torch.randn(2, 5, 3, dtype=dtype, generator=g)) if mode == "LSTM" else h0
    packed = spt.pack_padded_sequence(x, torch.tensor(lengths), batch_first=True,
                                      enforce_sorted=False)
    out, hidden = m(packed, hx)
    padded, got_lengths = spt.pad_packed_sequence(out, batch_first=True)
    assert got_lengths.tolist() == lengths
    h_n = hidden[0] if mode == "LSTM" else hidden
    keep = [0, 2, 4]
    keep_hx = (hx[0][:, keep], hx[1][:, keep]) if mode == "LSTM" else hx[:, keep]
    x_t = x.detach()[keep].clone().requires_grad_()
    ref_out, ref_hidden = t(trnn.pack_padded_sequence(x_t, [4, 2, 3], batch_first=True,
                                                      enforce_sorted=False), keep_hx)
    ref_padded, _ = trnn.pad_packed_sequence(ref_out, batch_first=True)
    ref_h = ref_hidden[0] if mode == "LSTM" else ref_hidden
    assert_like_torch(padded[keep], ref_padded, m, lengths, "output")
    assert torch.all(padded[[1, 3]] == 0)
    assert_like_torch(h_n[:, keep], ref_h, m, lengths, "h_n")
    assert torch.equal(h_n[:, [1, 3]], h0[:, [1, 3]])  # h_n = h0 for zero-length
    if mode == "LSTM":
        assert torch.equal(hidden[1][:, [1, 3]], hx[1][:, [1, 3]])
    padded.sum().backward()
    ref_padded.sum().backward()
    assert_like_torch(x.grad[keep], x_t.grad, m, lengths, "grad input")
    assert torch.all(x.grad[[1, 3]] == 0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch_first", [False, True])
def test_padded_input_with_lengths_matches_torch_packing(mode, batch_first):
    m = module(mode, num_layers=2, batch_first=batch_first)
    t = torch_twin(m)
    lengths = torch.tensor([2, 5, 1, 5])
    g = torch.Generator().manual_seed(base_seed())
    shape = (4, 5, 2) if batch_first else (5, 4, 2)
    x = torch.randn(*shape, generator=g)
    out, hidden = m(x, lengths=lengths)
    ref, ref_hidden = t(trnn.pack_padded_sequence(x, lengths, batch_first, enforce_sorted=False))
    ref_out, _ = trnn.pad_packed_sequence(ref, batch_first, total_length=5)
    assert_like_torch(out, ref_out, m, lengths, "output")
    h, rh = (hidden[0], ref_hidden[0]) if mode == "LSTM" else (hidden, ref_hidden)
    assert_like_torch(h, rh, m, lengths, "h_n")


def test_packing_operators_match_torch():
    g = torch.Generator().manual_seed(base_seed())
    x = torch.randn(4, 4, 2, generator=g)  # [T, B, F]
    lengths = torch.tensor([2, 4, 4, 1])
    for batch_first in (False, True):
        xi = x.transpose(0, 1).contiguous() if batch_first else x
        for enforce_sorted, lens in ((False, lengths), (True, torch.tensor([4, 4, 2, 1]))):
            ours = spt.pack_padded_sequence(xi, lens, batch_first, enforce_sorted)
            ref = trnn.pack_padded_sequence(xi, lens, batch_first, enforce_sorted)
            for a, b, name in zip(ours, ref, ref._fields):
                assert (a is None) == (b is None), name
                if a is not None:
                    assert torch.equal(a, b), name
            padded, got = spt.pad_packed_sequence(ours, batch_first, -1.0, 6)
            ref_padded, ref_lengths = trnn.pad_packed_sequence(ref, batch_first, -1.0, 6)
            assert torch.equal(padded, ref_padded) and torch.equal(got, ref_lengths)


def test_packing_operator_gradients():
    x = torch.randn(4, 3, 2, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([2, 0, 4])

    def f(x):
        p = spt.pack_padded_sequence(x, lengths, enforce_sorted=False)
        return spt.pad_packed_sequence(p, True, 0.0, 5)[0]
    assert torch.autograd.gradcheck(f, (x,))


def good_call(**change):
    m = module("GRU")
    args = dict(data=torch.randn(5, 2), batch_sizes=torch.tensor([2, 2, 1]), sorted_indices=None,
                unsorted_indices=None, h0=None, c0=None, weights=list(m._flat_weights),
                mode="GRU", hidden_size=3, num_layers=1, bias=True, bidirectional=False,
                proj_size=0, dropout=0.0, train=False)
    args.update(change)
    return lambda: ops.rnn(**args)


@pytest.mark.parametrize("change, error, message", [
    (dict(data=torch.randn(5, 2).half()), TypeError, "input has dtype Half"),
    (dict(data=torch.randint(0, 3, (5, 2))), TypeError, "input has dtype Long"),
    # PyTorch 2.4+: meta tensors run the fake implementations (shapes only),
    # which cannot size a batch known only from batch_sizes' values.
    (dict(data=torch.randn(5, 2, device="meta")),) +
    ((RuntimeError, "data-dependent shape") if hasattr(torch.library, "register_fake") else
     (ValueError, "input is on device meta")),
    (dict(data=torch.randn(5, 3)), ValueError, "weight_ih_l0 has shape"),
    (dict(data=torch.randn(5)), ValueError, "must be 2-D"),
    (dict(data=torch.randn(6, 2)), ValueError, "6"),
    (dict(data=torch.randn(5, 2).double()), ValueError, "dtype"),
    (dict(batch_sizes=torch.tensor([2, 2, 1], dtype=torch.int32)), TypeError,
     "batch_sizes must be int64"),
    (dict(batch_sizes=torch.tensor([2, 3])), ValueError, "batch_sizes"),
    (dict(h0=torch.zeros(1, 3, 3)), ValueError, "h0 has shape [1, 3, 3]"),
    (dict(c0=torch.zeros(1, 2, 3)), ValueError, "c0"),
    (dict(mode="LSTMX"), ValueError, "mode = 'LSTMX'"),
    (dict(weights=[]), ValueError, "expected 4"),
    (dict(num_layers=0), ValueError, "num_layers"),
    (dict(dropout=1.5), ValueError, "dropout"),
])
def test_bad_inputs_to_rnn(change, error, message):
    with pytest.raises(error, match=message.replace("[", r"\[").replace("]", r"\]")):
        good_call(**change)()


def test_bad_lengths_and_packing_inputs():
    # Where torch raises, the type is torch's (RuntimeError; test_torch_dropin.py
    # compares them); a length beyond the padded length is seqpack's ValueError.
    x = torch.randn(4, 2, 3)
    with pytest.raises(ValueError, match="lengths\\[1\\] = 7 exceeds the padded length 4"):
        spt.pack_padded_sequence(x, torch.tensor([2, 7]), enforce_sorted=False)
    with pytest.raises(RuntimeError, match="lengths\\[1\\] = -1 is negative"):
        spt.pack_padded_sequence(x, torch.tensor([2, -1]), enforce_sorted=False)
    with pytest.raises(RuntimeError, match="got 3 lengths"):
        spt.pack_padded_sequence(x, torch.tensor([2, 1, 1]))
    with pytest.raises(TypeError, match="lengths must be int64"):
        ops.pack_padded_sequence(x, torch.tensor([2.0, 1.0]), False, True)
    with pytest.raises(RuntimeError, match="lengths must be 1-D"):
        ops.pack_padded_sequence(x, torch.tensor([[2, 1]]), False, True)
    with pytest.raises(RuntimeError, match="sorted in decreasing order"):
        spt.pack_padded_sequence(x, torch.tensor([1, 2]), enforce_sorted=True)
    p = spt.pack_padded_sequence(x, torch.tensor([3, 2]))
    with pytest.raises(ValueError, match="total_length = 2"):
        spt.pad_packed_sequence(p, total_length=2)
    m = module("LSTM")
    with pytest.raises(ValueError, match="lengths\\[0\\] = 9 exceeds"):
        m(torch.randn(4, 2, 2), lengths=torch.tensor([9, 1]))
    with pytest.raises(ValueError, match="one entry per sequence"):
        m(torch.randn(4, 2, 2), lengths=torch.tensor([1, 1, 1]))
    with pytest.raises(ValueError, match="lengths is for padded input"):
        m(trnn.pack_sequence([torch.randn(2, 2)]), lengths=torch.tensor([2]))


@pytest.mark.parametrize("mode", MODES)
def test_double_backward_equals_torchs(mode):
    """A backward with create_graph records a graph (once refused): a
    Hessian-vector product against torch.nn's on the same weights
    (test_torch_double_backward.py checks every option)."""
    m = module(mode, torch.float64)
    twin = torch_twin(m)
    g = torch.Generator().manual_seed(base_seed())
    x0 = torch.randn(3, 2, 2, dtype=torch.float64, generator=g)
    v = torch.randn(3, 2, 2, dtype=torch.float64, generator=g)

    def hvp(layer):
        x = x0.clone().requires_grad_()
        out, _ = layer(x)
        (gx,) = torch.autograd.grad(out.pow(3).sum(), x, create_graph=True)
        assert gx.requires_grad
        return torch.autograd.grad((gx * v).sum(), [x] + list(layer.parameters()))
    for a, b in zip(hvp(m), hvp(twin)):
        # forward, backward, and that backward's backward
        assert_fp_close(a, b, 3 * module_reduction_length(m, [3, 3]),
                        what=f"{mode} Hessian-vector product")


@pytest.mark.parametrize("mode", MODES)
def test_outputs_modified_in_place_leave_gradients_unchanged(mode):
    # The operator does not save its outputs for backward: this holds only
    # while the core's saved activations do not share their memory.
    m = module(mode, torch.float64, num_layers=2, bidirectional=True)
    x = torch.randn(4, 3, 2, dtype=torch.float64)
    g = torch.randn(4, 3, 6, dtype=torch.float64)

    def grads(modify):
        m.zero_grad()
        out, hidden = m(x)
        loss = (out * g).sum()
        if modify:
            with torch.no_grad():
                out.fill_(3.0)
                for h in (hidden if mode == "LSTM" else (hidden,)):
                    h.fill_(-2.0)
        loss.backward()
        return [p.grad.clone() for p in m.parameters()]
    for a, b in zip(grads(False), grads(True)):
        assert torch.equal(a, b)


class PackedRun(torch.nn.Module):
    """A scriptable caller of a layer on packed input with h0 (a scripted layer
    alone cannot be called: its forward is overloaded, as torch.nn's). The
    branch is a constant: with torch 1.13, `isinstance(self.layer, spt.LSTM)`
    in the scripted code came out false for an LSTM once an earlier test in the
    process had scripted another LSTM, and the other branch then failed to
    compile."""

    is_lstm: torch.jit.Final[bool]

    def __init__(self, layer):
        super().__init__()
        self.layer = layer
        self.is_lstm = isinstance(layer, spt.LSTM)

    def forward(self, x: trnn.PackedSequence, h0: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.is_lstm:
            out, (h, _) = self.layer(x, (h0, torch.zeros_like(h0)))
            return out.data, h
        out, h = self.layer(x, h0)
        return out.data, h


class LengthsRun(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.layer(x, None, lengths)[0]


@pytest.mark.parametrize("mode", MODES)
def test_torch_fallback_for_other_dtypes_packed_lengths_and_scripted(mode):
    # bfloat16 is not seqpack's: the layers run torch's kernels, eagerly and
    # scripted, with h0 in the caller's order and with lengths.
    m = module(mode, num_layers=2, bidirectional=True).bfloat16()
    t = torch_twin(m)
    g = torch.Generator().manual_seed(base_seed())
    seqs = [torch.randn(n, 2, generator=g).bfloat16() for n in (2, 4, 3)]
    h0 = torch.randn(4, 3, 3, generator=g).bfloat16()
    hx = (h0, torch.zeros_like(h0)) if mode == "LSTM" else h0
    packed = trnn.pack_sequence(seqs, enforce_sorted=False)
    padded, lengths = trnn.pad_sequence(seqs), torch.tensor([2, 4, 3])
    with torch.no_grad():
        ref_out, ref_hidden = t(packed, hx)
        ref_h = ref_hidden[0] if mode == "LSTM" else ref_hidden
        ref_padded, _ = trnn.pad_packed_sequence(t(packed)[0], total_length=4)
        for run in (PackedRun(m), torch.jit.script(PackedRun(m))):
            out, h = run(packed, h0)
            assert torch.equal(out, ref_out.data) and torch.equal(h, ref_h)
        for run in (LengthsRun(m), torch.jit.script(LengthsRun(m))):
            assert torch.equal(run(padded, lengths), ref_padded)


@pytest.mark.parametrize("mode", MODES)
def test_input_without_grad_skips_only_the_input_gradient(mode):
    """An input that does not require grad gets none (the first layer's dX is
    skipped), and every weight gradient is what torch.nn computes."""
    m = module(mode, torch.float64, num_layers=2, bidirectional=True)
    t = torch_twin(m)
    g = torch.Generator().manual_seed(base_seed())
    x = torch.randn(5, 4, 2, dtype=torch.float64, generator=g)
    lengths = torch.tensor([5, 2, 4, 1])
    packed = spt.pack_padded_sequence(x, lengths, enforce_sorted=False)
    out, _ = m(packed)
    ref, _ = t(trnn.pack_padded_sequence(x, lengths, enforce_sorted=False))
    weights = torch.randn(out.data.shape, dtype=torch.float64, generator=g)
    (out.data * weights).sum().backward()
    (ref.data * weights).sum().backward()
    assert x.grad is None and packed.data.grad is None
    for (name, p), q in zip(m.named_parameters(), t.parameters()):
        assert_close(p.grad.numpy(), q.grad.numpy(), 1e-10, 1e-10, name)


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_frozen_weights_run_through_the_model_plan_and_follow_in_place_changes(mode):
    """Weights that require no grad (a frozen encoder) go through the cached model plan in
    the forward and in its backward: the output and the input gradient are torch.nn's, call
    after call, and after an in-place change under no_grad (which moves their version) they
    are torch.nn's for the new values, not the old plan's."""
    m = module(mode, torch.float64, num_layers=2, bidirectional=True)
    m.requires_grad_(False)
    g = torch.Generator().manual_seed(base_seed())
    x = torch.randn(5, 4, 2, dtype=torch.float64, generator=g)
    lengths = torch.tensor([5, 2, 4, 1])
    upstream = None
    for change in range(3):
        if change:
            with torch.no_grad():
                for p in m.parameters():
                    p.add_(0.2 * torch.randn(p.shape, dtype=p.dtype, generator=g))
        t = torch_twin(m)
        xt = x.clone().requires_grad_(True)
        ref, _ = t(trnn.pack_padded_sequence(xt, lengths, enforce_sorted=False))
        if upstream is None:
            upstream = torch.randn(ref.data.shape, dtype=torch.float64, generator=g)
        (ref.data * upstream).sum().backward()
        for call in range(2):
            xs = x.clone().requires_grad_(True)
            out, _ = m(spt.pack_padded_sequence(xs, lengths, enforce_sorted=False))
            assert_close(out.data.detach().numpy(), ref.data.detach().numpy(), 1e-10, 1e-10,
                         f"output, change {change}, call {call}")
            (out.data * upstream).sum().backward()
            assert_close(xs.grad.numpy(), xt.grad.numpy(), 1e-10, 1e-10,
                         f"input gradient, change {change}, call {call}")
            assert all(p.grad is None for p in m.parameters())


def test_packing_plan_reuse_follows_the_index_values():
    """seqpack::rnn reuses the last packing plan only for the same index values:
    batches that share batch_sizes but not the order, index tensors changed in
    place between calls, and indices dropped all run their own plan (checked
    against torch.nn)."""
    m = module("GRU")
    t = torch_twin(m)
    g = torch.Generator().manual_seed(base_seed())
    x = torch.randn(3, 3, 2, generator=g)

    def check(packed):
        out, h_n = m(packed)
        ref, ref_h = t(packed)
        assert_like_torch(out.data, ref.data, m, [packed.batch_sizes.sum()], "output")
        assert_like_torch(h_n, ref_h, m, [packed.batch_sizes.sum()], "h_n")

    for lengths in ([3, 1, 2], [1, 2, 3], [2, 3, 1], [2, 3, 1]):
        check(trnn.pack_padded_sequence(x, torch.tensor(lengths), enforce_sorted=False))
    packed = trnn.pack_padded_sequence(x, torch.tensor([3, 1, 2]), enforce_sorted=False)
    check(packed)
    other = trnn.pack_padded_sequence(x, torch.tensor([1, 3, 2]), enforce_sorted=False)
    packed.sorted_indices.copy_(other.sorted_indices)
    packed.unsorted_indices.copy_(other.unsorted_indices)
    check(trnn.PackedSequence(other.data, packed.batch_sizes, packed.sorted_indices,
                              packed.unsorted_indices))
    check(trnn.pack_padded_sequence(x, torch.tensor([3, 2, 1])))  # no indices


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_rnn_padded_without_steps_keeps_the_states_with_and_without_a_graph(mode):
    """T = 0 padded input (no lengths): the B sequences have length zero, so
    h_n/c_n are h0/c0 (zeros where none is given) of shape (states, B, H),
    whether autograd records the call (weights requiring grad) or not."""
    torch.manual_seed(3)
    rnn = getattr(torch.nn, mode)(3, 4, num_layers=2, bidirectional=True)
    x = torch.zeros(0, 2, 3)
    h0, c0 = torch.randn(4, 2, 4), torch.randn(4, 2, 4)
    for weights in ([w.detach() for w in rnn._flat_weights], list(rnn._flat_weights)):
        for given in (True, False):
            out, hn, cn = torch.ops.seqpack.rnn_padded(
                x, None, h0 if given else None, (c0 if given else None) if mode == "LSTM" else None, weights,
                mode, 4, 2, True, False, True, 0, 0.0, False, None, "fp32")
            assert out.shape == (0, 2, 8)
            assert torch.equal(hn, h0 if given else torch.zeros(4, 2, 4))
            if mode == "LSTM":
                assert torch.equal(cn, c0 if given else torch.zeros(4, 2, 4))
