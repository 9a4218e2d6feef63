"""seqpack.torch's layers on jagged nested tensors, and pack_nested / to_nested
(seqpack/_torch_nested.py). The reference is the same layer on the equivalent
PackedSequence (pack_sequence(seqs, enforce_sorted=False)): outputs, h_n,
c_n and every gradient (values, h0, c0, weights). PyTorch 2.6+; on an older
torch only the error that names the version needed is tested."""
import importlib.util

import pytest
import torch

import seqpack.torch as st
from seqpack import _torch_nested
from rnn_cases import make_configs, torch_module
from tolerance import fp_bound, rnn_reduction_length

HAS_JAGGED = _torch_nested.HAS_JAGGED
needs_jagged = pytest.mark.skipif(
    not HAS_JAGGED, reason=f"jagged nested tensors need PyTorch 2.6+; this is {torch.__version__}")
# torch's warning for a nested tensor of the strided layout (the errors' tests make some).
pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype")


# ---- an older torch: the error ---------------------------------------------------

@pytest.mark.skipif(HAS_JAGGED, reason="PyTorch 2.6+ takes nested tensors (tested below)")
@pytest.mark.parametrize("cls", [st.LSTM, st.GRU, st.RNN])
def test_old_torch_names_the_version(cls):
    nt = torch.nested.nested_tensor([torch.randn(3, 4), torch.randn(2, 4)])
    m = cls(4, 5, batch_first=True)
    with pytest.raises(RuntimeError, match=r"PyTorch 2\.6 or later.*this is PyTorch " +
                       torch.__version__.replace("+", r"\+")):
        m(nt)
    with pytest.raises(RuntimeError, match=r"seqpack.torch.pack_nested: nested tensors need "
                                           r"PyTorch 2\.6"):
        st.pack_nested(nt)
    with pytest.raises(RuntimeError, match=r"seqpack.torch.to_nested: nested tensors need "
                                           r"PyTorch 2\.6"):
        st.to_nested(st.pack_sequence([torch.randn(3, 4)]))


# ---- helpers ------------------------------------------------------------------------

def nested(seqs, requires_grad=False):
    return torch.nested.nested_tensor([s.detach() for s in seqs], layout=torch.jagged,
                                      requires_grad=requires_grad)


def seqpack_layer(c):
    cls = {"LSTM": st.LSTM, "GRU": st.GRU}.get(c["mode"], st.RNN)
    m = torch_module(c, cls)
    if c["mode"] == "RNN_RELU":
        assert m.nonlinearity == "relu"
    return m


def close(actual, expected, n, what):
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if expected.numel() == 0:
        return
    diff = (actual.double() - expected.double()).abs().max().item()
    bound = fp_bound(expected.abs().max().item(), n, expected.dtype)
    assert diff <= bound, f"{what}: differs by {diff} > {bound}"


def run(m, x, hx, upstream):
    """Forward, then backward of sum(output * upstream) + sum(h_n) (+ sum(c_n))."""
    out, hidden = m(x, hx)
    out_rows = out.values() if isinstance(out, torch.Tensor) and out.is_nested else out.data
    loss = (out_rows * upstream).sum()
    for h in (hidden if isinstance(hidden, tuple) else (hidden,)):
        loss = loss + h.sum()
    loss.backward()
    return out, hidden


CONFIGS = make_configs(62, 24)


@needs_jagged
@pytest.mark.parametrize("c", CONFIGS, ids=lambda c: f"{c['index']}-{c['mode']}")
def test_layer_matches_packed(c):
    """Every layer option (rnn_cases' grid) with a zero-length sequence in the
    batch: outputs, states and every gradient equal the packed call's."""
    g = torch.Generator().manual_seed(c["seed"])
    lengths = list(c["lengths"]) + [0]  # a zero-length sequence, last or moved in
    if c["index"] % 2:
        lengths.insert(0, lengths.pop())
    dt = c["dtype"]
    seqs = [torch.randn(n, c["input_size"], generator=g, dtype=dt) for n in lengths]
    m = seqpack_layer(c)
    B, D = len(lengths), 2 if c["bidirectional"] else 1
    real = c["proj_size"] or c["hidden_size"]
    hx = None
    if c["h0"]:
        h0 = torch.randn(c["num_layers"] * D, B, real, generator=g, dtype=dt)
        c0 = torch.randn(c["num_layers"] * D, B, c["hidden_size"], generator=g, dtype=dt)
        hx = (h0, c0) if c["mode"] == "LSTM" else h0
    nt = nested(seqs, requires_grad=True)
    packed_seqs = [s.clone().requires_grad_() for s in seqs]
    packed = st.pack_sequence(packed_seqs, enforce_sorted=False)
    hx_n = hx_p = None
    if hx is not None:
        states = hx if isinstance(hx, tuple) else (hx,)
        hx_n = tuple(s.clone().requires_grad_() for s in states)
        hx_p = tuple(s.clone().requires_grad_() for s in states)
        if c["mode"] != "LSTM":
            hx_n, hx_p = hx_n[0], hx_p[0]
    upstream = torch.randn(sum(lengths), D * real, generator=g, dtype=dt)
    n = rnn_reduction_length(c["input_size"], c["hidden_size"], c["num_layers"],
                             c["bidirectional"], sum(lengths), c["proj_size"])

    out_n, hid_n = run(m, nt, hx_n, upstream)
    grads_n = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    out_p, hid_p = run(m, packed, hx_p,
                       st.pack_sequence(list(upstream.split(lengths)), enforce_sorted=False).data)
    grads_p = [p.grad.clone() for p in m.parameters()]

    assert out_n.is_nested and out_n.offsets() is nt.offsets()
    close(out_n.values(), torch.cat(st.unpack_sequence(out_p)), n, "output")
    for a, b, what in zip(hid_n if isinstance(hid_n, tuple) else (hid_n,),
                          hid_p if isinstance(hid_p, tuple) else (hid_p,), ("h_n", "c_n")):
        close(a, b, n, what)
    close(nt.grad.values(), torch.cat([s.grad for s in packed_seqs]), n, "grad values")
    if hx is not None:
        for a, b, what in zip(hx_n if isinstance(hx_n, tuple) else (hx_n,),
                              hx_p if isinstance(hx_p, tuple) else (hx_p,), ("h0", "c0")):
            close(a.grad, b.grad, n, f"grad {what}")
    for (name, _), a, b in zip(m.named_parameters(), grads_n, grads_p):
        close(a, b, n, f"grad {name}")


@needs_jagged
def test_cpu_forward_reads_values_in_place(monkeypatch):
    """A contiguous CPU nested tensor of float32 or float64 runs seqpack::rnn_nested
    on its values (no PackedSequence made in Python: _pack is not called); one with
    lengths packs."""
    def no_pack(input):
        raise AssertionError("packed a nested tensor that rnn_nested takes")

    monkeypatch.setattr(_torch_nested, "_pack", no_pack)
    m = st.GRU(3, 4, batch_first=True)
    out, _ = m(nested([torch.randn(2, 3), torch.randn(0, 3)], requires_grad=True))
    assert out.is_nested and out.values().shape == (2, 4)
    narrowed = torch.nested.nested_tensor_from_jagged(
        torch.randn(4, 3), torch.tensor([0, 2, 4]), lengths=torch.tensor([1, 2]))
    with pytest.raises(AssertionError, match="packed a nested tensor"):
        m(narrowed)


@needs_jagged
def test_large_batch_on_threads_matches_packed():
    """Rows enough for seqpack::rnn_nested to split its row copies over two threads
    (past their 256 KiB grain): output, h_n and the gradients equal the packed call's."""
    torch.manual_seed(11)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        lengths = [300, 0, 700, 1, 1500, 500]
        m = st.GRU(48, 64, batch_first=True)
        seqs = [torch.randn(k, 48) for k in lengths]
        nt = nested(seqs, requires_grad=True)
        out, h = m(nt)
        (out.values().square().sum() + h.sum()).backward()
        grads_n = [p.grad.clone() for p in m.parameters()]
        m.zero_grad()
        ps = [s.clone().requires_grad_() for s in seqs]
        out_p, h_p = m(st.pack_sequence(ps, enforce_sorted=False))
        (out_p.data.square().sum() + h_p.sum()).backward()
    finally:
        torch.set_num_threads(threads)
    n = rnn_reduction_length(48, 64, steps=1500)
    close(out.values(), torch.cat(st.unpack_sequence(out_p)), n, "output")
    close(h, h_p, n, "h_n")
    close(nt.grad.values(), torch.cat([s.grad for s in ps]), n, "grad values")
    for (name, _), a, b in zip(m.named_parameters(), grads_n, [p.grad for p in m.parameters()]):
        close(a, b, n, f"grad {name}")


@needs_jagged
@pytest.mark.parametrize("cls", [st.LSTM, st.GRU])
def test_double_backward_matches_packed(cls):
    """A gradient penalty (the input gradient taken with create_graph, its square
    summed and differentiated into the weights) through seqpack::rnn_nested equals
    the packed call's. (On the operator: PyTorch 2.6 cannot differentiate twice
    through a nested tensor's own operations, aten._nested_tensor_storage_offsets.)"""
    torch.manual_seed(7)
    lengths = [3, 0, 4, 1]
    m = cls(3, 4, num_layers=2, bidirectional=True, batch_first=True, dtype=torch.float64)
    seqs = [torch.randn(k, 3, dtype=torch.float64) for k in lengths]
    offsets = torch.tensor([0, 3, 3, 7, 8])

    def nested_rows(values):
        return torch.ops.seqpack.rnn_nested(
            values, offsets, None, None, m._flat_weights, m.mode, m.hidden_size, m.num_layers,
            m.bias, m.bidirectional, m.proj_size, 0.0, False)[0]

    def packed_rows(values):
        out, _ = m(st.pack_sequence(list(values.split(lengths)), enforce_sorted=False))
        return torch.cat(st.unpack_sequence(out))

    results = []
    for rows in (nested_rows, packed_rows):
        values = torch.cat(seqs).requires_grad_()
        (g,) = torch.autograd.grad(rows(values).square().sum(), [values], create_graph=True)
        m.zero_grad()
        g.square().sum().backward()
        results.append([g.detach()] + [p.grad.clone() for p in m.parameters()])
    n = rnn_reduction_length(3, 4, 2, True, 8)
    names = ["input gradient"] + [f"penalty grad {name}" for name, _ in m.named_parameters()]
    for a, b, what in zip(results[0], results[1], names):
        close(a, b, n, what)


@needs_jagged
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_torch_dtypes_match_packed(dtype):
    """Dtypes seqpack's CPU kernels do not take run torch's, on nested input as on packed."""
    torch.manual_seed(5)
    m = st.GRU(3, 4, num_layers=2, batch_first=True, dtype=dtype)
    seqs = [torch.randn(n, 3, dtype=dtype) for n in (4, 2, 5)]
    nt = nested(seqs, requires_grad=True)
    out, h = m(nt)
    (out.values().float().sum() + h.float().sum()).backward()
    g_n = nt.grad.values().clone()
    ps = [s.clone().requires_grad_() for s in seqs]
    out_p, h_p = m(st.pack_sequence(ps, enforce_sorted=False))
    (out_p.data.float().sum() + h_p.float().sum()).backward()
    n = rnn_reduction_length(3, 4, 2, False, 11)
    close(out.values(), torch.cat(st.unpack_sequence(out_p)), n, "output")
    close(h, h_p, n, "h_n")
    close(g_n, torch.cat([s.grad for s in ps]), n, "grad values")


@needs_jagged
def test_from_jagged_values_gets_gradient():
    """A nested tensor made from a values leaf (nested_tensor_from_jagged) passes
    the gradient to that leaf; the output keeps the offsets, so it adds to a
    nested tensor of the input's (a residual)."""
    torch.manual_seed(1)
    lengths = [2, 0, 3]
    values = torch.randn(5, 4, requires_grad=True)
    offsets = torch.tensor([0, 2, 2, 5])
    nt = torch.nested.nested_tensor_from_jagged(values, offsets)
    m = st.LSTM(4, 4, batch_first=True)
    out, _ = m(nt)
    (out + nt).values().sum().backward()
    ref = values.detach().clone().requires_grad_()
    out_p, _ = m(st.pack_sequence(list(ref.split(lengths)), enforce_sorted=False))
    (torch.cat(st.unpack_sequence(out_p)) + ref).sum().backward()
    close(values.grad, ref.grad, rnn_reduction_length(4, 4, steps=3), "grad values")


@needs_jagged
def test_non_contiguous_nested():
    """A nested tensor with lengths (a narrowed one) runs as its sequences; the
    output keeps its offsets and lengths."""
    torch.manual_seed(2)
    values = torch.randn(10, 3)
    offsets = torch.tensor([0, 4, 7, 10])
    lengths = torch.tensor([3, 0, 2])
    nt = torch.nested.nested_tensor_from_jagged(values, offsets, lengths=lengths)
    m = st.RNN(3, 5, batch_first=True)
    out, h = m(nt)
    seqs = [values[0:3], values[4:4], values[7:9]]
    out_p, h_p = m(st.pack_sequence(seqs, enforce_sorted=False))
    n = rnn_reduction_length(3, 5, steps=3)
    assert out.offsets() is offsets and out.lengths() is lengths
    for a, b in zip(out.unbind(), st.unpack_sequence(out_p)):
        close(a, b, n, "output")
    close(h, h_p, n, "h_n")


@needs_jagged
def test_layer_errors():
    m = st.LSTM(3, 4, batch_first=True)
    nt = nested([torch.randn(2, 3), torch.randn(1, 3)])
    with pytest.raises(ValueError, match="seqpack.torch.LSTM: lengths is for a padded input"):
        m(nt, lengths=torch.tensor([2, 1]))
    with pytest.raises(RuntimeError, match="input.size\\(-1\\) must be equal to input_size. "
                                           "Expected 3, got 5"):
        m(nested([torch.randn(2, 5)]))
    with pytest.raises(RuntimeError, match=r"Expected hidden\[0\] size \(1, 2, 4\), got "
                                           r"\[1, 3, 4\]"):
        m(nt, (torch.zeros(1, 3, 4), torch.zeros(1, 3, 4)))
    strided = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(1, 3)])
    with pytest.raises(ValueError, match="layout torch.strided; seqpack takes layout=torch.jagged"):
        m(strided)
    with pytest.raises(ValueError, match="shape \\(batch, ragged steps, features\\), got 2-D"):
        m(nested([torch.randn(2), torch.randn(3)]))


@needs_jagged
def test_rnn_nested_operator_errors():
    """seqpack::rnn_nested names what is wrong with its values and offsets."""
    m = st.LSTM(3, 4)
    args = (m._flat_weights, m.mode, m.hidden_size, m.num_layers, m.bias, m.bidirectional,
            m.proj_size, 0.0, False)

    def call(values, offsets):
        torch.ops.seqpack.rnn_nested(values, offsets, None, None, *args)

    v = torch.randn(5, 3)
    with pytest.raises(ValueError, match=r"seqpack::rnn_nested: offsets must be 1-D .* got shape "
                                         r"\[1, 2\]"):
        call(v, torch.tensor([[0, 5]]))
    with pytest.raises(ValueError, match=r"offsets\[2\] = 4 does not match the 5 rows of the "
                                         r"values"):
        call(v, torch.tensor([0, 2, 4]))
    with pytest.raises(ValueError, match=r"offsets\[2\] = 2 is less than offsets\[1\] = 3"):
        call(v, torch.tensor([0, 3, 2, 5]))
    with pytest.raises(ValueError, match=r"offsets\[0\] = 1 must be 0"):
        call(v, torch.tensor([1, 5]))
    with pytest.raises(TypeError, match="offsets must be int64, got Int"):
        call(v, torch.tensor([0, 5], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"values must be 2-D \[rows, input_size\], got shape "
                                         r"\[5\]"):
        call(torch.randn(5), torch.tensor([0, 5]))
    call(v, torch.tensor([0, 5]))  # after the errors, a good call (the plan kept is sound)
    with pytest.raises(ValueError, match=r"offsets\[1\] = 5 does not match the 4 rows"):
        call(v[:4], torch.tensor([0, 5]))  # the kept plan's offsets, other values


@needs_jagged
@pytest.mark.parametrize("with_lengths", [False, True])
def test_make_nested_is_torchs_constructor(with_lengths):
    """seqpack's shortcut of NestedTensor's constructor (seqpack/_torch_nested.py,
    _make_nested) leaves what torch's leaves: the same attributes and dynamo marks."""
    from torch.nested._internal.nested_tensor import NestedTensor
    offsets = torch.tensor([0, 2, 2, 5])
    lengths = torch.tensor([2, 0, 1]) if with_lengths else None
    ours_values, torchs_values = torch.randn(5, 3), torch.randn(5, 3)
    ours = _torch_nested._make_nested(ours_values, offsets, lengths)
    torchs = NestedTensor(torchs_values, offsets, lengths=lengths, _ragged_idx=1)
    assert type(ours) is type(torchs)
    assert ours.shape == torchs.shape and ours.stride() == torchs.stride()
    assert sorted(vars(ours)) == sorted(vars(torchs))
    for name, value in vars(torchs).items():
        if name == "_values":
            assert vars(ours)[name] is ours_values
        elif type(value).__name__ == "PyCapsule":  # per-object caches (_sym_sizes_capsule)
            continue
        elif isinstance(value, torch.Tensor) or value is None:
            assert vars(ours)[name] is value, name
        else:
            assert vars(ours)[name] == value, name
    assert ours._ragged_idx == torchs._ragged_idx == 1
    assert getattr(ours_values, "_dynamo_weak_dynamic_indices", None) == \
        getattr(torchs_values, "_dynamo_weak_dynamic_indices", None)


# ---- the conversions ------------------------------------------------------------------

@needs_jagged
@pytest.mark.parametrize("lengths", [[3, 0, 5, 1, 2], [4, 4], [1, 0, 1], [0, 6, 0], [2]])
def test_pack_nested_is_pack_sequence(lengths):
    seqs = [torch.randn(n, 2, 3) for n in lengths]
    nt = torch.nested.nested_tensor(seqs, layout=torch.jagged)
    got = st.pack_nested(nt)
    want = st.pack_sequence(seqs, enforce_sorted=False)
    assert torch.equal(got.batch_sizes, want.batch_sizes)
    assert torch.equal(got.sorted_indices, want.sorted_indices)
    assert torch.equal(got.unsorted_indices, want.unsorted_indices)
    assert torch.equal(got.data, want.data)
    # Where the packed order is the values' own, the data is the values (no copy).
    one_step = max(lengths) <= 1 or sum(n > 0 for n in lengths) <= 1
    assert (got.data.data_ptr() == nt.values().data_ptr()) == one_step
    back = st.to_nested(got)
    assert torch.equal(back.offsets(), nt.offsets())
    assert torch.equal(back.values(), nt.values())
    assert (back.values().data_ptr() == got.data.data_ptr()) == one_step


@needs_jagged
@pytest.mark.parametrize("batch_first", [False, True])
def test_to_nested_from_padded(batch_first):
    lengths = torch.tensor([3, 0, 4, 1])
    padded = torch.randn(4, 4, 2) if batch_first else torch.randn(4, 4, 2)
    nt = st.to_nested(padded, lengths, batch_first=batch_first)
    want = st.unpad_sequence(padded, lengths, batch_first=batch_first)
    assert torch.equal(nt.offsets(), torch.tensor([0, 3, 3, 7, 8]))
    assert torch.equal(nt.values(), torch.cat(want))
    # Every sequence full length, batch first: a view of the padded batch.
    full = st.to_nested(padded, None, batch_first=True)
    assert full.values().data_ptr() == padded.data_ptr()
    assert torch.equal(full.values(), padded.reshape(16, 2))
    with pytest.raises(ValueError, match=r"lengths\[2\] = 5 exceeds the padded length 4"):
        st.to_nested(padded, [1, 1, 5, 1], batch_first=batch_first)
    with pytest.raises(TypeError, match="must be a PackedSequence or a padded tensor, got list"):
        st.to_nested([padded])
    with pytest.raises(TypeError, match="must be a nested tensor .* got a tensor of layout "
                                        "torch.strided"):
        st.pack_nested(padded)


@needs_jagged
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64, torch.bool])
def test_conversions_any_dtype(dtype):
    seqs = [torch.arange(2 * n).view(n, 2).to(dtype) for n in (2, 0, 3)]
    nt = torch.nested.nested_tensor(seqs, layout=torch.jagged)
    packed = st.pack_nested(nt)
    assert torch.equal(packed.data, st.pack_sequence(seqs, enforce_sorted=False).data)
    assert torch.equal(st.to_nested(packed).values(), nt.values())


@needs_jagged
def test_meta_device():
    """to_nested runs on meta data (CPU lengths); a meta nested tensor's offsets have
    no values to pack by, and that is said."""
    nt = st.to_nested(torch.empty(3, 4, 2, device="meta"), torch.tensor([3, 0, 2]),
                      batch_first=True)
    assert nt.device.type == "meta" and nt.values().shape == (5, 2)
    with pytest.raises(NotImplementedError, match="offsets are on the meta device"):
        st.pack_nested(nt)


@needs_jagged
def test_conversions_are_differentiable():
    lengths = [2, 0, 3, 1]
    seqs = [torch.randn(n, 3, dtype=torch.float64) for n in lengths]
    values = torch.cat(seqs).requires_grad_()
    offsets = torch.tensor([0, 2, 2, 5, 6])

    def via_packed(v):
        packed = st.pack_nested(torch.nested.nested_tensor_from_jagged(v, offsets))
        return st.to_nested(packed._replace(data=packed.data * 2)).values()

    assert torch.autograd.gradcheck(via_packed, (values,))

    def via_padded(p):
        return st.to_nested(p, torch.tensor([3, 1, 0]), batch_first=True).values()

    assert torch.autograd.gradcheck(via_padded, (torch.randn(3, 3, 2, dtype=torch.float64,
                                                             requires_grad=True),))


# ---- torch.compile --------------------------------------------------------------------

HAS_SETUPTOOLS = importlib.util.find_spec("setuptools.command") is not None


@needs_jagged
@pytest.mark.parametrize("cls,backend", [
    (st.LSTM, "aot_eager"), (st.GRU, "aot_eager"),
    pytest.param(st.LSTM, "inductor", marks=pytest.mark.skipif(
        not HAS_SETUPTOOLS, reason="torch.compile's default backend (inductor) needs "
                                   "setuptools (Debian: python3-setuptools)"))],
    ids=["LSTM", "GRU", "LSTM-inductor"])
def test_compile_fullgraph(cls, backend, monkeypatch):
    """fullgraph torch.compile of a layer on a nested tensor: forward and backward
    equal eager's, for three batches (static, then dynamic shapes); both run
    seqpack::rnn_nested on the values (neither packs)."""
    import torch._dynamo.testing

    def no_pack(input):
        raise AssertionError("packed a nested tensor that rnn_nested takes")

    monkeypatch.setattr(_torch_nested, "_pack", no_pack)
    torch._dynamo.reset()
    torch.manual_seed(3)
    m = cls(4, 6, num_layers=2, bidirectional=True, batch_first=True)

    def f(nt, h0):
        out, hidden = m(nt, (h0, torch.zeros_like(h0)) if cls is st.LSTM else h0)
        h_n = hidden[0] if isinstance(hidden, tuple) else hidden
        return out, h_n

    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    compiled = torch.compile(f, fullgraph=True, backend=counter)
    n = rnn_reduction_length(4, 6, 2, True, 11)
    for lengths in ([3, 0, 5, 1, 2], [2, 4, 1, 1, 3, 1], [7, 1, 2]):
        seqs = [torch.randn(k, 4) for k in lengths]
        state = torch.randn(4, len(lengths), 6)
        results = []
        for fn in (compiled, f):
            nt = nested(seqs, requires_grad=True)
            h0 = state.clone().requires_grad_()
            out, h_n = fn(nt, h0)
            (out.values().square().sum() + h_n.sum()).backward()
            assert out.offsets() is nt.offsets()
            results.append((out.values(), h_n, nt.grad.values(), h0.grad))
        for a, b, what in zip(results[0], results[1], ("output", "h_n", "grad values",
                                                       "grad h0")):
            close(a, b, n, f"compiled {what}")
    assert counter.frame_count == 2  # the first batch's shapes, then dynamic
    torch._dynamo.reset()
