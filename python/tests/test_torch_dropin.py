"""seqpack.torch as a drop-in for torch.nn.utils.rnn and torch.nn's cells, on
every dtype and on the meta device (CPU only: CUDA is the same code as meta
and float16, the path in plain torch operations).

Expected values come from torch itself, on the same inputs. Packing moves
values without arithmetic (gathers and scatters, and their gradients add each
value once into zeros), so its results and gradients must equal torch's
exactly (torch.equal); the cells compute, and are compared with
tolerance.assert_fp_close. Zero-length sequences (seqpack's extension, which
torch rejects) are compared between seqpack's two paths instead: the
operators (CPU float32/float64) and the plain torch operations.
"""
import warnings

import numpy as np
import pytest
import torch
import torch.nn.utils.rnn as trnn

import seqpack
import seqpack.torch as st
from helpers import base_seed
from tolerance import assert_fp_close, rnn_reduction_length

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
DTYPES = FLOATS + INTS + [torch.bool]


def values(shape, dtype, seed=0):
    """Random values of `dtype` (integers in a small range, bools half true)."""
    g = torch.Generator().manual_seed(base_seed() + seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


def assert_same(a, b, what):
    """Equal values, dtype, device and shape (packing moves values: exact)."""
    assert (a is None) == (b is None), what
    if a is None:
        return
    assert a.dtype == b.dtype, f"{what}: {a.dtype} != {b.dtype}"
    assert a.device == b.device, f"{what}: {a.device} != {b.device}"
    assert a.shape == b.shape, f"{what}: {tuple(a.shape)} != {tuple(b.shape)}"
    if a.device.type != "meta":
        assert torch.equal(a, b), f"{what}: {a} != {b}"


def assert_same_packed(a, b, what=""):
    assert isinstance(a, trnn.PackedSequence), what
    for x, y, name in zip(a, b, trnn.PackedSequence._fields):
        assert_same(x, y, f"{what} {name}")


# Lengths without ties (PyTorch 1.13 sorts ties stably only up to 16
# sequences; seqpack always does) and without zeros (torch rejects them).
LENGTHS = {True: [5, 3, 3, 1], False: [2, 5, 1, 3]}


# ---- values, dtypes, batch_sizes and indices against torch ----------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_pack_and_pad_match_torch(dtype, batch_first, enforce_sorted):
    lengths = LENGTHS[enforce_sorted]
    x = values((4, 5, 3) if batch_first else (5, 4, 3), dtype)
    ours = st.pack_padded_sequence(x, lengths, batch_first, enforce_sorted)
    ref = trnn.pack_padded_sequence(x, torch.tensor(lengths), batch_first, enforce_sorted)
    assert_same_packed(ours, ref, "pack_padded_sequence")
    for padding_value, total_length in ((0.0, None), (3.0, 7)):
        got = st.pad_packed_sequence(ours, batch_first, padding_value, total_length)
        want = trnn.pad_packed_sequence(ref, batch_first, padding_value, total_length)
        assert_same(got[0], want[0], "pad_packed_sequence padded")
        assert_same(got[1], want[1], "pad_packed_sequence lengths")
    # A PackedSequence made by torch unpacks the same.
    assert_same(st.pad_packed_sequence(ref, batch_first)[0],
                trnn.pad_packed_sequence(ref, batch_first)[0], "pad of torch's")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_pack_sequence_unpack_and_unpad_match_torch(dtype, enforce_sorted):
    lengths = LENGTHS[enforce_sorted]
    seqs = [values((n, 2, 3), dtype, seed=i) for i, n in enumerate(lengths)]
    ours = st.pack_sequence(seqs, enforce_sorted)
    ref = trnn.pack_sequence(seqs, enforce_sorted)
    assert_same_packed(ours, ref, "pack_sequence")
    for a, b in zip(st.unpack_sequence(ours), trnn.unpack_sequence(ref)):
        assert_same(a, b, "unpack_sequence")
    for batch_first in (False, True):
        padded = trnn.pad_sequence(seqs, batch_first)
        assert_same(st.pad_sequence(seqs, batch_first, 1.0),
                    trnn.pad_sequence(seqs, batch_first, 1.0), "pad_sequence")
        before = padded.clone()
        got = st.unpad_sequence(padded, torch.tensor(lengths), batch_first)
        assert torch.equal(padded, before), "unpad_sequence modified its input"
        want = trnn.unpad_sequence(padded.clone(), torch.tensor(lengths), batch_first)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert_same(a, b, "unpad_sequence")
    perm = torch.tensor([2, 0, 3, 1])
    assert_same(st.invert_permutation(perm), trnn.invert_permutation(perm), "invert_permutation")
    assert st.invert_permutation(None) is None


def test_pad_sequence_left():
    seqs = [values((n, 2), torch.float32, seed=n) for n in (3, 1, 2)]
    for batch_first in (False, True):
        got = st.pad_sequence(seqs, batch_first, -1.0, padding_side="left")
        # Left padding is right padding of the reversed sequences, reversed.
        want = trnn.pad_sequence([s.flip(0) for s in seqs], batch_first, -1.0).flip(
            1 if batch_first else 0)
        assert_same(got, want, "pad_sequence left")
    with pytest.raises(ValueError, match="padding_side"):
        st.pad_sequence(seqs, padding_side="middle")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_gradients_match_torch(dtype, enforce_sorted):
    lengths = LENGTHS[enforce_sorted]
    x = values((5, 4, 3), dtype)
    g = values((6, 4, 3), dtype, seed=7)

    def grads(rnn):
        xi = x.clone().requires_grad_()
        p = rnn.pack_padded_sequence(xi, torch.tensor(lengths), False, enforce_sorted)
        padded, _ = rnn.pad_packed_sequence(p, False, 0.0, 6)
        (padded.float() * g.float()).sum().backward()
        seqs = [values((n, 3), dtype, seed=n).requires_grad_() for n in lengths]
        p2 = rnn.pack_sequence(seqs, enforce_sorted)
        (p2.data.float() * torch.arange(p2.data.numel()).view_as(p2.data)).sum().backward()
        return [xi.grad] + [s.grad for s in seqs]
    for a, b in zip(grads(st), grads(trnn)):
        assert_same(a, b, "gradient")


def test_collate_functions_keep_the_dtype_and_match_torch():
    for dtype in DTYPES:
        seqs = [values((n, 2), dtype, seed=n) for n in (2, 5, 1, 3)]
        got = st.collate_packed(seqs)
        assert_same_packed(got, trnn.pack_sequence(seqs, enforce_sorted=False),
                           f"collate_packed {dtype}")
        padded, lengths = st.collate_padded(seqs, batch_first=True)
        assert_same(padded, trnn.pad_sequence(seqs, batch_first=True), f"collate_padded {dtype}")
        assert lengths.tolist() == [2, 5, 1, 3]
    seqs = [torch.empty(n, 2, device="meta") for n in (2, 5, 1, 3)]
    assert_same_packed(st.collate_packed(seqs), trnn.pack_sequence(seqs, enforce_sorted=False),
                       "collate_packed meta")
    assert_same(st.collate_padded(seqs)[0], trnn.pad_sequence(seqs), "collate_padded meta")


# ---- the meta device -------------------------------------------------------

@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_meta_tensors_match_torch(batch_first, enforce_sorted):
    lengths = LENGTHS[enforce_sorted]
    x = torch.empty((4, 5, 3) if batch_first else (5, 4, 3), device="meta")
    ours = st.pack_padded_sequence(x, lengths, batch_first, enforce_sorted)
    ref = trnn.pack_padded_sequence(x, torch.tensor(lengths), batch_first, enforce_sorted)
    assert_same_packed(ours, ref, "meta pack_padded_sequence")
    # With indices, the lengths in the caller's order need the indices' values,
    # which a meta tensor has not: PyTorch 1.13 raises NotImplementedError
    # then, and seqpack must do as the PyTorch it runs with.
    try:
        want = trnn.pad_packed_sequence(ref, batch_first)
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        assert not enforce_sorted, e
        with pytest.raises(type(e)):
            st.pad_packed_sequence(ours, batch_first)
    else:
        got = st.pad_packed_sequence(ours, batch_first)
        assert_same(got[0], want[0], "meta padded")
        assert_same(got[1], want[1], "meta lengths")
    seqs = [torch.empty(n, 3, device="meta") for n in lengths]
    assert_same_packed(st.pack_sequence(seqs, enforce_sorted),
                       trnn.pack_sequence(seqs, enforce_sorted), "meta pack_sequence")
    assert_same(st.pad_sequence(seqs, batch_first), trnn.pad_sequence(seqs, batch_first),
                "meta pad_sequence")
    for a, b in zip(st.unpad_sequence(x, torch.tensor(lengths), batch_first),
                    trnn.unpad_sequence(x, torch.tensor(lengths), batch_first)):
        assert_same(a, b, "meta unpad_sequence")


# ---- zero-length sequences: the same on both of seqpack's paths -------------

@pytest.mark.parametrize("dtype", [d for d in DTYPES if d not in (torch.float32, torch.float64)],
                         ids=str)
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_zero_lengths_behave_as_on_the_operators(dtype, enforce_sorted):
    lengths = [4, 2, 0, 0] if enforce_sorted else [0, 4, 0, 2]
    x = values((4, 4, 2), dtype)
    ref_x = x.to(torch.float64)  # the operators' path; values are exact in float64
    for batch_first in (False, True):
        xi, ri = (x.transpose(0, 1), ref_x.transpose(0, 1)) if batch_first else (x, ref_x)
        ours = st.pack_padded_sequence(xi, lengths, batch_first, enforce_sorted)
        ref = st.pack_padded_sequence(ri, lengths, batch_first, enforce_sorted)
        assert ours.data.dtype == dtype
        assert_same(ours.data.to(torch.float64), ref.data, "data")
        for name in ("batch_sizes", "sorted_indices", "unsorted_indices"):
            assert_same(getattr(ours, name), getattr(ref, name), name)
        got = st.pad_packed_sequence(ours, batch_first, 1.0, 5)
        want = st.pad_packed_sequence(ref, batch_first, 1.0, 5)
        assert_same(got[0].to(torch.float64), want[0], "padded")
        assert_same(got[1], want[1], "lengths")
        # unpack_sequence: torch's raises IndexError on such a batch.
        unpacked = st.unpack_sequence(ours)
        assert [len(s) for s in unpacked] == lengths
        for b, s in enumerate(unpacked):
            assert_same(s, xi[b, :lengths[b]] if batch_first else xi[:lengths[b], b],
                        f"unpack_sequence[{b}]")
        for b, s in enumerate(st.unpad_sequence(xi, lengths, batch_first)):
            assert_same(s, xi[b, :lengths[b]] if batch_first else xi[:lengths[b], b],
                        f"unpad_sequence[{b}]")
    seqs = [x[:n, 0] for n in lengths]
    ours = st.pack_sequence(seqs, enforce_sorted)
    ref = st.pack_sequence([s.to(torch.float64) for s in seqs], enforce_sorted)
    assert_same(ours.data.to(torch.float64), ref.data, "pack_sequence data")
    assert_same(ours.sorted_indices, ref.sorted_indices, "pack_sequence sorted_indices")


def test_unpack_sequence_with_zero_lengths_where_torch_raises():
    p = st.pack_padded_sequence(torch.arange(12.0).view(4, 3, 1), [4, 0, 1],
                                enforce_sorted=False)
    with pytest.raises(IndexError):
        trnn.unpack_sequence(p)
    got = st.unpack_sequence(p)
    assert [s.flatten().tolist() for s in got] == [[0.0, 3.0, 6.0, 9.0], [], [2.0]]


def test_an_empty_batch_on_the_torch_path():
    x = torch.zeros(3, 0, 2, dtype=torch.float16)
    p = st.pack_padded_sequence(x, torch.zeros(0, dtype=torch.int64), enforce_sorted=False)
    assert p.data.shape == (0, 2) and p.batch_sizes.numel() == 0 and p.sorted_indices is None
    padded, lengths = st.pad_packed_sequence(p, total_length=3)
    assert padded.shape == (3, 0, 2) and lengths.numel() == 0


# ---- errors: torch's exception types ----------------------------------------

def bad_calls(dtype):
    """(name, call with seqpack.torch's or torch's functions) for every bad input
    torch.nn.utils.rnn raises on."""
    x = values((4, 3, 2), dtype)
    short = trnn.pack_padded_sequence(values((4, 3, 2), dtype), torch.tensor([4, 2, 1]))
    return [
        ("unsorted", lambda r: r.pack_padded_sequence(x, torch.tensor([2, 4, 1]))),
        ("negative", lambda r: r.pack_padded_sequence(x, torch.tensor([4, 2, -1]),
                                                      enforce_sorted=False)),
        ("count", lambda r: r.pack_padded_sequence(x, torch.tensor([4, 2]))),
        ("2-D lengths", lambda r: r.pack_padded_sequence(x, torch.tensor([[4, 2, 1]]))),
        ("1-D input", lambda r: r.pack_padded_sequence(values((4,), dtype), torch.tensor([4]))),
        ("total_length", lambda r: r.pad_packed_sequence(short, total_length=2)),
        ("pack_sequence unsorted", lambda r: r.pack_sequence([x[:2, 0], x[:, 0]])),
        ("pack_sequence empty", lambda r: r.pack_sequence([])),
        ("pack_sequence shapes", lambda r: r.pack_sequence([x[:, 0], values((2, 3), dtype)])),
        ("pad_sequence shapes", lambda r: r.pad_sequence([x[:, 0], values((2, 3), dtype)])),
        ("pad_sequence empty", lambda r: r.pad_sequence([])),
        ("string lengths", lambda r: r.pack_padded_sequence(x, "abc")),
        ("0-d sequence", lambda r: r.pack_sequence([values((), dtype)])),
        ("batch_first count", lambda r: r.pack_padded_sequence(x, torch.tensor([3, 2, 1]),
                                                               batch_first=True)),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64], ids=str)
def test_errors_have_torchs_types(dtype):
    for name, call in bad_calls(dtype):
        with pytest.raises(Exception) as want:
            call(trnn)
        with pytest.raises(Exception) as got:
            call(st)
        assert got.type is want.type, f"{name}: seqpack raised {got.type.__name__} " \
            f"({got.value}), torch {want.type.__name__} ({want.value})"


def test_error_messages_name_the_operator_once():
    x = torch.zeros(4, 3, 2)
    for dtype in (torch.float32, torch.float16):  # the operators, then torch operations
        with pytest.raises(RuntimeError) as e:
            st.pack_padded_sequence(x.to(dtype), [2, 4, 1])
        # torch's message first (test_torch_edge_messages.py), then seqpack's detail
        assert str(e.value).startswith("`lengths` array must be sorted in decreasing order")
        assert "; seqpack::pack_padded_sequence: lengths[1] = 4 is greater" in str(e.value)
        with pytest.raises(ValueError) as e:
            st.pack_padded_sequence(x.to(dtype), [4, 9, 1], enforce_sorted=False)
        assert str(e.value).startswith("seqpack::pack_padded_sequence: lengths[1] = 9 exceeds")
        assert str(e.value).count("pack_padded_sequence") == 1


def test_numpy_level_refuses_torch_tensors():
    t = torch.zeros(3, 2)
    cases = [
        ("pack_sequence", lambda: seqpack.pack_sequence([t, t])),
        ("pad_sequence", lambda: seqpack.pad_sequence([t])),
        ("pack_padded_sequence", lambda: seqpack.pack_padded_sequence(t.view(3, 1, 2), [3])),
        ("pad_packed_sequence", lambda: seqpack.pad_packed_sequence(
            trnn.pack_sequence([t]))),
        ("unpack_sequence", lambda: seqpack.unpack_sequence(trnn.pack_sequence([t]))),
        ("unpad_sequence", lambda: seqpack.unpad_sequence(t.view(3, 1, 2), [3])),
        ("invert_permutation", lambda: seqpack.invert_permutation(torch.tensor([1, 0]))),
    ]
    for name, call in cases:
        with pytest.raises(TypeError, match=f"seqpack.torch.{name}"):
            call()
    with pytest.raises(TypeError, match="torch.Tensor"):
        seqpack.nn.GRU(2, 3)(t.view(3, 1, 2))
    # NumPy arrays still work.
    assert isinstance(seqpack.pack_sequence([np.zeros(2)]).data, np.ndarray)


# ---- the cells ---------------------------------------------------------------

CELLS = [("LSTMCell", {}), ("GRUCell", {}), ("RNNCell", {"nonlinearity": "tanh"}),
         ("RNNCell", {"nonlinearity": "relu"})]


def cell_pair(name, kwargs, dtype=torch.float32, bias=True):
    torch.manual_seed(base_seed())
    ref = getattr(torch.nn, name)(3, 4, bias=bias, **kwargs).to(dtype)
    torch.manual_seed(base_seed())
    ours = getattr(st, name)(3, 4, bias=bias, **kwargs).to(dtype)
    return ours, ref


@pytest.mark.parametrize("name, kwargs", CELLS)
def test_cells_are_torchs_modules(name, kwargs):
    ours, ref = cell_pair(name, kwargs)
    assert isinstance(ours, getattr(torch.nn, name))
    assert repr(ours) == repr(ref)
    assert list(ours.state_dict()) == list(ref.state_dict())
    for k, v in ref.state_dict().items():  # the same initialisation (RNG draws)
        assert torch.equal(ours.state_dict()[k], v), k


@pytest.mark.parametrize("name, kwargs", CELLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_cells_match_torch(name, kwargs, dtype, bias):
    ours, ref = cell_pair(name, kwargs, dtype, bias)
    assert ours._cell_runs(values((2, 3), dtype), None, None)  # seqpack's kernels
    n = rnn_reduction_length(3, 4)
    lstm = name == "LSTMCell"
    for batched in (True, False):
        shape = (5, 3) if batched else (3,)
        hshape = (5, 4) if batched else (4,)
        x = values(shape, dtype)
        h0 = values(hshape, dtype, seed=1) * 0.5
        c0 = values(hshape, dtype, seed=2) * 0.5
        for hx in (None, (h0, c0) if lstm else h0):
            results = []
            for m in (ours, ref):
                m.zero_grad()
                xi = x.clone().requires_grad_()
                hi = None if hx is None else tuple(t.clone().requires_grad_() for t in
                                                     (hx if lstm else (hx,)))
                out = m(xi, None if hi is None else (hi if lstm else hi[0]))
                outs = out if lstm else (out,)
                sum((o * (k + 1)).sum() for k, o in enumerate(outs)).backward()
                grads = [xi.grad] + ([] if hi is None else [t.grad for t in hi]) + \
                    [p.grad for p in m.parameters()]
                results.append((outs, grads))
            (o1, g1), (o2, g2) = results
            for a, b in zip(o1, o2):
                assert a.shape == b.shape and a.dtype == b.dtype
                assert_fp_close(a, b, n, what=f"{name} output")
            for a, b in zip(g1, g2):
                assert_fp_close(a, b, n, what=f"{name} gradient")


@pytest.mark.parametrize("name, kwargs", CELLS)
def test_cells_fall_back_to_torch(name, kwargs):
    lstm = name == "LSTMCell"
    # bfloat16 (torch's cell runs it on the CPU), float16 (torch's raises), an
    # empty batch, and wrong shapes: torch's results and errors.
    for dtype in (torch.bfloat16, torch.float16):
        ours, ref = cell_pair(name, kwargs, dtype)
        x = values((2, 3), dtype)
        try:
            want = ref(x)
        except Exception as e:  # noqa: BLE001 - the type is what is compared
            with pytest.raises(type(e)):
                ours(x)
        else:
            got = ours(x)
            for a, b in zip(got if lstm else (got,), want if lstm else (want,)):
                assert a.dtype == b.dtype and a.shape == b.shape
                assert_fp_close(a, b, rnn_reduction_length(3, 4), dtype=dtype)
    ours, ref = cell_pair(name, kwargs)
    got, want = ours(torch.zeros(0, 3)), ref(torch.zeros(0, 3))
    assert (got[0] if lstm else got).shape == (want[0] if lstm else want).shape
    for bad in (torch.zeros(2, 5), torch.zeros(2, 2, 3)):
        with pytest.raises(Exception) as e_ref:
            ref(bad)
        with pytest.raises(e_ref.type):
            ours(bad)
    h = torch.zeros(3, 4)  # batch 3 for an input of batch 2
    with pytest.raises(Exception) as e_ref:
        ref(torch.zeros(2, 3), (h, h) if lstm else h)
    with pytest.raises(e_ref.type):
        ours(torch.zeros(2, 3), (h, h) if lstm else h)


@pytest.mark.parametrize("name, kwargs", CELLS)
def test_cells_script(name, kwargs):
    ours, ref = cell_pair(name, kwargs)
    scripted = torch.jit.script(ours)
    x = values((2, 3), torch.float32)
    for a, b in ((scripted(x), ref(x)), (scripted(x[0]), ref(x[0]))):
        for u, v in zip(a if name == "LSTMCell" else (a,), b if name == "LSTMCell" else (b,)):
            assert_fp_close(u, v, rnn_reduction_length(3, 4))


# ---- the layers on other dtypes ------------------------------------------------

@pytest.mark.parametrize("name", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_layers_on_half_precision_behave_as_torchs(name, dtype):
    torch.manual_seed(base_seed())
    ref = getattr(torch.nn, name)(3, 4).to(dtype)
    ours = getattr(st, name)(3, 4).to(dtype)
    ours.load_state_dict(ref.state_dict())
    x = values((5, 2, 3), dtype)
    # Padded, and packed by each library's pack_padded_sequence.
    calls = [(lambda: ours(x)[0], lambda: ref(x)[0]),
             (lambda: ours(st.pack_padded_sequence(x, [5, 3]))[0].data,
              lambda: ref(trnn.pack_padded_sequence(x, torch.tensor([5, 3])))[0].data)]
    for call_ours, call_ref in calls:
        try:
            want = call_ref()
        except Exception as e:  # noqa: BLE001 - torch's error type is what is compared
            with pytest.raises(type(e)):
                call_ours()
            continue
        got = call_ours()
        assert got.dtype == dtype
        assert_fp_close(got, want, rnn_reduction_length(3, 4, steps=5), dtype=dtype)


def test_layers_have_one_place_that_decides_and_a_cuda_hook():
    assert st._cuda_backend() is None
    m = st.LSTM(3, 4)
    assert m._seqpack_can_run(torch.zeros(2, 1, 3), None, None)
    assert not m._seqpack_can_run(torch.zeros(2, 1, 3, dtype=torch.bfloat16), None, None)


# ---- torch.ao.quantization -------------------------------------------------------

def model():
    return torch.nn.Sequential(st.LSTM(3, 4), torch.nn.Linear(4, 2))


def test_torch_quantize_dynamic_says_it_leaves_seqpack_layers_float32():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        q = torch.ao.quantization.quantize_dynamic(model())
    assert type(q[0]) is st.LSTM  # torch selects by exact type
    notices = [str(w.message) for w in caught if "seqpack.torch.LSTM" in str(w.message)]
    assert len(notices) == 1 and "float32" in notices[0] and "qconfig_spec" in notices[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(st.GRUCell(3, 4)))
    assert any("no int8 cell" in str(w.message) for w in caught)


def test_torch_quantize_dynamic_swaps_named_seqpack_layers():
    m = model()
    q = torch.ao.quantization.quantize_dynamic(m, {st.LSTM, torch.nn.Linear})
    assert type(q[0]) is st.QuantizedLSTM
    for k, v in m[0].state_dict().items():  # the fp32 weights, kept as parameters
        assert torch.equal(q[0].state_dict()[k], v), k
    q = torch.ao.quantization.quantize_dynamic(model(), {"0"})
    assert type(q[0]) is st.QuantizedLSTM
    with pytest.raises(ValueError, match="qint8"):
        torch.ao.quantization.quantize_dynamic(model(), {st.LSTM}, dtype=torch.float16)
    with torch.no_grad():
        out, _ = q[0](values((5, 2, 3), torch.float32))
    assert out.shape == (5, 2, 4)


# ---- CUDA (where there is one) ----------------------------------------------------

@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.int64], ids=str)
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_cuda_tensors_match_torch(dtype, enforce_sorted):
    lengths = LENGTHS[enforce_sorted]
    x = values((5, 4, 3), dtype).cuda()
    ours = st.pack_padded_sequence(x, lengths, False, enforce_sorted)
    ref = trnn.pack_padded_sequence(x, torch.tensor(lengths), False, enforce_sorted)
    assert_same_packed(ours, ref, "cuda pack_padded_sequence")
    got, want = st.pad_packed_sequence(ours, False, 2.0, 6), \
        trnn.pad_packed_sequence(ref, False, 2.0, 6)
    assert_same(got[0], want[0], "cuda padded")
    assert_same(got[1], want[1], "cuda lengths")
    seqs = [values((n, 3), dtype, seed=n).cuda() for n in lengths]
    assert_same_packed(st.pack_sequence(seqs, enforce_sorted),
                       trnn.pack_sequence(seqs, enforce_sorted), "cuda pack_sequence")
    for a, b in zip(st.unpack_sequence(ours), trnn.unpack_sequence(ref)):
        assert_same(a, b, "cuda unpack_sequence")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_layers_and_cells_run_torchs():
    torch.manual_seed(base_seed())
    ref = torch.nn.LSTM(3, 4).cuda()
    ours = st.LSTM(3, 4).cuda()
    ours.load_state_dict(ref.state_dict())
    x = values((5, 2, 3), torch.float32).cuda()
    # Both run torch's kernels; compared by the tolerance rule all the same.
    assert_fp_close(ours(st.pack_padded_sequence(x, [5, 3]))[0].data,
                    ref(trnn.pack_padded_sequence(x, torch.tensor([5, 3])))[0].data,
                    rnn_reduction_length(3, 4, steps=5), what="cuda LSTM")
    cell, ref_cell = cell_pair("GRUCell", {})
    cell, ref_cell = cell.cuda(), ref_cell.cuda()
    assert_fp_close(cell(x[0]), ref_cell(x[0]), rnn_reduction_length(3, 4), what="cuda GRUCell")


def test_the_namespace_covers_torch_nn_utils_rnn():
    """Code that swaps `torch.nn.utils.rnn` for `seqpack.torch` in its imports finds
    every public name of the torch at hand (`from seqpack.torch import PackedSequence`
    failed): seqpack's own functions, torch's for the rest, all in __all__."""
    rnn = torch.nn.utils.rnn
    names = getattr(rnn, "__all__", None) or [
        n for n, v in vars(rnn).items()
        if not n.startswith("_") and getattr(v, "__module__", None) == rnn.__name__]
    assert "PackedSequence" in names and "pack_padded_sequence" in names
    missing = [n for n in names if not hasattr(st, n)]
    assert missing == [], f"seqpack.torch lacks {missing} of torch.nn.utils.rnn"
    not_exported = [n for n in names if n not in st.__all__]
    assert not_exported == [], f"seqpack.torch.__all__ lacks {not_exported}"
    assert st.PackedSequence is rnn.PackedSequence  # seqpack's functions return torch's class
    namespace = {}
    exec("from seqpack.torch import *", namespace)
    assert set(names) <= set(namespace)
    # What seqpack implements stays seqpack's own.
    for own in ("pack_padded_sequence", "pad_packed_sequence", "pad_sequence"):
        assert getattr(st, own).__module__.startswith("seqpack"), own
