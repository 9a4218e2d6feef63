"""seqpack.nn (NumPy, explicit backward) against torch.nn, live."""
import numpy as np
import pytest
import torch

import seqpack
from helpers import assert_close, base_seed
from tolerance import assert_fp_close, assert_like_torch, rnn_reduction_length
from rnn_cases import (config_id, make_configs, make_inputs, make_wide_configs, run_torch,
                       reduction_length, torch_module)

CONFIGS = make_configs(base_seed(), 40) + make_wide_configs(base_seed())


def parity_id(c):
    return config_id(c) if c["hidden_size"] < 33 else f"H{c['hidden_size']}-{config_id(c)}"


def seqpack_module(c):
    kwargs = dict(num_layers=c["num_layers"], bias=c["bias"], batch_first=c["batch_first"],
                  bidirectional=c["bidirectional"], dtype=str(c["dtype"])[6:])
    mode = c["mode"]
    if mode == "LSTM":
        return seqpack.nn.LSTM(c["input_size"], c["hidden_size"], proj_size=c["proj_size"],
                               **kwargs)
    if mode == "GRU":
        return seqpack.nn.GRU(c["input_size"], c["hidden_size"], **kwargs)
    return seqpack.nn.RNN(c["input_size"], c["hidden_size"],
                          nonlinearity="tanh" if mode == "RNN_TANH" else "relu", **kwargs)


@pytest.mark.parametrize("c", CONFIGS, ids=parity_id)
def test_parity_with_torch(c):
    tm = torch_module(c)
    inputs = make_inputs(c)
    expected = run_torch(tm, c, inputs)
    n = reduction_length(c)

    m = seqpack_module(c)
    m.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items()})
    is_lstm = c["mode"] == "LSTM"
    x = (seqpack.pack_sequence(inputs["seqs"], enforce_sorted=False) if c["packed"]
         else inputs["padded"])
    hx = None
    if c["h0"]:
        hx = (inputs["h0"], inputs["c0"]) if is_lstm else inputs["h0"]
    out, hidden = m(x, hx)
    h_n, c_n = hidden if is_lstm else (hidden, None)
    if c["packed"]:
        assert isinstance(out, seqpack.PackedSequence)
        out = out.data
    assert_fp_close(out, expected["output"], n, c["dtype"], "output")
    assert_fp_close(h_n, expected["h_n"], n, c["dtype"], "h_n")
    if is_lstm:
        assert_fp_close(c_n, expected["c_n"], n, c["dtype"], "c_n")

    g_in, g_hx = m.backward(expected["g_out"], expected["g_h"], expected["g_c"])
    g_h0, g_c0 = g_hx if is_lstm else (g_hx, None)
    if c["packed"]:
        assert isinstance(g_in, seqpack.PackedSequence)
        g_in = g_in.data
    assert_fp_close(g_in, expected["grad_input"], n, c["dtype"], "grad input")
    if c["h0"]:
        assert_fp_close(g_h0, expected["grad_h0"], n, c["dtype"], "grad h0")
        if is_lstm:
            assert_fp_close(g_c0, expected["grad_c0"], n, c["dtype"], "grad c0")
    grads = m.grads
    assert list(grads) == list(expected["grad_params"])
    for name, g in expected["grad_params"].items():
        assert_fp_close(grads[name], g, n, c["dtype"], f"grad {name}")


def test_backward_accumulates_and_zero_grad():
    rng = np.random.default_rng(base_seed())
    m = seqpack.nn.GRU(3, 4, seed=1)
    x = rng.standard_normal((5, 2, 3)).astype(np.float32)
    go = rng.standard_normal((5, 2, 4)).astype(np.float32)
    m(x)
    m.backward(go)
    once = {k: v.copy() for k, v in m.grads.items()}
    m(x)
    m.backward(go)
    for k, v in m.grads.items():
        assert_close(v, 2 * once[k], 1e-5, 1e-6, k)
    m.zero_grad()
    assert all(not v.any() for v in m.grads.values())


def test_parameters_are_views_and_state_dict_round_trip():
    m = seqpack.nn.LSTM(2, 3, num_layers=2, bidirectional=True, seed=3)
    names = [n for n, _ in m.named_parameters()]
    t = torch.nn.LSTM(2, 3, num_layers=2, bidirectional=True)
    assert names == [n for n, _ in t.named_parameters()]
    assert list(m.state_dict()) == list(t.state_dict())
    m.weight_hh_l1_reverse[...] = 0.5  # writes through to the layer
    assert (m.state_dict()["weight_hh_l1_reverse"] == 0.5).all()
    m.bias_ih_l0 = np.ones(12)  # assignment copies into the layer (shape checked)
    assert (m.state_dict()["bias_ih_l0"] == 1).all()
    with pytest.raises(ValueError, match="bias_ih_l0"):
        m.bias_ih_l0 = np.ones(11)
    m.load_state_dict({k: v.numpy() for k, v in t.state_dict().items()})
    for k, v in t.state_dict().items():
        np.testing.assert_array_equal(getattr(m, k), v.numpy())
    # Initialisation: uniform(-1/sqrt(hidden), 1/sqrt(hidden)), as torch.
    bound = 1 / np.sqrt(3)
    fresh = seqpack.nn.LSTM(2, 3, seed=4)
    for _, p in fresh.named_parameters():
        assert np.abs(p).max() <= bound and p.std() > 0.1


def test_same_seed_same_init():
    a = seqpack.nn.GRU(3, 5, seed=7)
    b = seqpack.nn.GRU(3, 5, seed=7)
    for (_, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(p, q)


def test_bad_state_dict():
    t = torch.nn.LSTM(2, 3)
    m = seqpack.nn.LSTM(2, 3)
    good = {k: v.numpy() for k, v in t.state_dict().items()}
    missing = dict(good)
    del missing["bias_hh_l0"]
    with pytest.raises(ValueError, match="bias_hh_l0"):
        m.load_state_dict(missing)
    with pytest.raises(ValueError, match="weight_ih_l1"):
        m.load_state_dict(dict(good, weight_ih_l1=good["weight_ih_l0"]))
    with pytest.raises(ValueError, match="weight_hh_l0"):
        m.load_state_dict(dict(good, weight_hh_l0=np.zeros((12, 4), dtype=np.float32)))
    with pytest.raises(TypeError, match="weight_hh_l0"):
        m.load_state_dict(dict(good, weight_hh_l0=np.array(["a"])))
    with pytest.raises(TypeError):
        m.load_state_dict([("weight_hh_l0", good["weight_hh_l0"])])
    result = m.load_state_dict(dict(missing, extra=np.zeros(1)), strict=False)
    assert result.missing_keys == ["bias_hh_l0"] and result.unexpected_keys == ["extra"]


def test_bad_constructor_and_forward_arguments():
    with pytest.raises(TypeError, match="hidden_size"):
        seqpack.nn.LSTM(2, 3.0)
    with pytest.raises(ValueError, match="dropout"):
        seqpack.nn.LSTM(2, 3, dropout=1.5)
    with pytest.raises(ValueError, match="proj_size"):
        seqpack.nn.LSTM(2, 3, proj_size=3)
    with pytest.raises(ValueError, match="hidden_size"):
        seqpack.nn.GRU(2, 0)
    with pytest.raises(ValueError, match="nonlinearity"):
        seqpack.nn.RNN(2, 3, nonlinearity="sigmoid")
    with pytest.raises(TypeError, match="dtype"):
        seqpack.nn.GRU(2, 3, dtype=np.int64)
    m = seqpack.nn.LSTM(2, 3)
    with pytest.raises(ValueError, match="input_size|2"):
        m(np.zeros((4, 1, 5), dtype=np.float32))  # 5 features for input_size 2
    with pytest.raises(ValueError):
        m(np.zeros((4, 2, 2), dtype=np.float32), (np.zeros((1, 3, 3), np.float32),
                                                  np.zeros((1, 3, 3), np.float32)))
    with pytest.raises(TypeError, match="tuple"):
        m(np.zeros((4, 2, 2), dtype=np.float32), np.zeros((1, 2, 3), np.float32))
    with pytest.raises(TypeError, match="int64"):
        m(np.zeros((4, 2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="backward"):
        seqpack.nn.GRU(2, 3).backward(np.zeros((1, 1, 3)))


@pytest.mark.parametrize("cls,mode", [(seqpack.nn.RNNCell, "tanh"), (seqpack.nn.RNNCell, "relu"),
                                      (seqpack.nn.LSTMCell, None), (seqpack.nn.GRUCell, None)])
@pytest.mark.parametrize("batched", [True, False])
def test_cells_parity(cls, mode, batched):
    torch.manual_seed(base_seed())
    kwargs = {"nonlinearity": mode} if mode else {}
    tcls = getattr(torch.nn, cls.__name__)
    t = tcls(4, 5, **kwargs)
    m = cls(4, 5, **kwargs)
    m.load_state_dict({k: v.numpy() for k, v in t.state_dict().items()})
    shape = (3,) if batched else ()
    x = torch.randn(*shape, 4, requires_grad=True)
    h = torch.randn(*shape, 5, requires_grad=True)
    c = torch.randn(*shape, 5, requires_grad=True)
    is_lstm = cls is seqpack.nn.LSTMCell
    out = t(x, (h, c)) if is_lstm else t(x, h)
    res = m(x.detach().numpy(), (h.detach().numpy(), c.detach().numpy()) if is_lstm
            else h.detach().numpy())
    gh = torch.randn(*shape, 5)
    gc = torch.randn(*shape, 5)
    n = rnn_reduction_length(4, 5, steps=shape[0] if batched else 1)  # one step over the batch
    if is_lstm:
        assert_fp_close(res[0], out[0].detach().numpy(), n, what="h'")
        assert_fp_close(res[1], out[1].detach().numpy(), n, what="c'")
        ((out[0] * gh).sum() + (out[1] * gc).sum()).backward()
        g_in, (g_h, g_c) = m.backward(gh.numpy(), gc.numpy())
        assert_fp_close(g_c, c.grad.numpy(), n, what="grad c")
    else:
        assert_fp_close(res, out.detach().numpy(), n, what="h'")
        (out * gh).sum().backward()
        g_in, g_h = m.backward(gh.numpy())
    assert_fp_close(g_in, x.grad.numpy(), n, what="grad input")
    assert_fp_close(g_h, h.grad.numpy(), n, what="grad h")
    for name, p in t.named_parameters():
        assert_fp_close(m.grads[name], p.grad.numpy(), n, what=f"grad {name}")


def test_zero_length_sequences_keep_h0():
    # Beyond torch: a zero-length sequence has h_n = h0 and no output rows; the
    # others match torch run on the batch without it.
    torch.manual_seed(base_seed())
    t = torch.nn.GRU(2, 3, bidirectional=True)
    m = seqpack.nn.GRU(2, 3, bidirectional=True)
    m.load_state_dict({k: v.numpy() for k, v in t.state_dict().items()})
    rng = np.random.default_rng(base_seed())
    seqs = [rng.standard_normal((n, 2)).astype(np.float32) for n in (3, 0, 2)]
    h0 = rng.standard_normal((2, 3, 3)).astype(np.float32)
    out, h_n = m(seqpack.pack_sequence(seqs, enforce_sorted=False), h0)
    np.testing.assert_array_equal(h_n[:, 1], h0[:, 1])
    keep = [0, 2]
    with torch.no_grad():
        tout, th = t(torch.nn.utils.rnn.pack_sequence([torch.from_numpy(seqs[i]) for i in keep],
                                                      enforce_sorted=False),
                     torch.from_numpy(h0[:, keep].copy()))
    padded, lengths = seqpack.pad_packed_sequence(out)
    tpadded, _ = torch.nn.utils.rnn.pad_packed_sequence(tout)
    np.testing.assert_array_equal(lengths, [3, 0, 2])
    assert not padded[:, 1].any()
    assert_like_torch(padded[:, keep], tpadded, t, [3, 2], "output")
    assert_like_torch(h_n[:, keep], th, t, [3, 2], "h_n")
    g_in, g_h0 = m.backward(np.ones_like(out.data), np.ones_like(h_n))
    np.testing.assert_array_equal(g_h0[:, 1], np.ones((2, 3)))  # h_n = h0: identity


def test_dropout_train_and_eval():
    m = seqpack.nn.LSTM(3, 4, num_layers=2, dropout=0.5, seed=1)
    x = np.random.default_rng(base_seed()).standard_normal((5, 2, 3)).astype(np.float32)
    m.eval()
    a = m(x)[0]
    np.testing.assert_array_equal(a, m(x)[0])
    m.train()
    assert m.training
    assert not np.allclose(a, m(x)[0])


def test_threads():
    n = seqpack.get_num_threads()
    seqpack.set_num_threads(1)
    assert seqpack.get_num_threads() == 1
    seqpack.set_num_threads(n)
    with pytest.raises(ValueError, match="0"):
        seqpack.set_num_threads(0)


def test_wrong_rank_arrays():
    m = seqpack.nn.LSTM(2, 3)
    with pytest.raises(ValueError, match=r"\[2, 2, 2, 2\]"):
        m(np.zeros((2, 2, 2, 2), np.float32))
    with pytest.raises(ValueError, match=r"h0 has shape \[2, 3\]"):
        m(np.zeros((4, 2, 2), np.float32), (np.zeros((2, 3), np.float32),
                                            np.zeros((1, 2, 3), np.float32)))
    with pytest.raises(ValueError, match="float64"):
        m(np.zeros((4, 2, 2), np.float64))  # parameters are float32
    with pytest.raises(ValueError, match=r"\[3\]"):
        seqpack.unpad_sequence(np.zeros(3), [3])
    cell = seqpack.nn.GRUCell(2, 3)
    with pytest.raises(ValueError):
        cell(np.zeros((1, 1, 2), np.float32))


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN_TANH"])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("with_h0", [False, True])
def test_empty_batch_shapes_match_torch(mode, batch_first, with_h0):
    """A padded batch of size 0: torch.nn's shapes and dtypes, zero gradients."""
    c = dict(mode=mode, input_size=3, hidden_size=4, num_layers=2, bias=True,
             batch_first=batch_first, bidirectional=True,
             proj_size=2 if mode == "LSTM" else 0, dtype=torch.float64)
    m = seqpack_module(c)
    kwargs = dict(num_layers=2, batch_first=batch_first, bidirectional=True, dtype=torch.float64)
    ref = {"LSTM": lambda: torch.nn.LSTM(3, 4, proj_size=2, **kwargs),
           "GRU": lambda: torch.nn.GRU(3, 4, **kwargs),
           "RNN_TANH": lambda: torch.nn.RNN(3, 4, **kwargs)}[mode]()
    x = np.zeros((0, 5, 3) if batch_first else (5, 0, 3))
    hx = None
    if with_h0:
        h0 = np.zeros((4, 0, 2 if mode == "LSTM" else 4))
        hx = (h0, np.zeros((4, 0, 4))) if mode == "LSTM" else h0
    out, h = m(x, hx)
    t_hx = None if hx is None else (tuple(map(torch.from_numpy, hx)) if mode == "LSTM"
                                    else torch.from_numpy(hx))
    t_out, t_h = ref(torch.from_numpy(x), t_hx)
    ours = [out] + (list(h) if mode == "LSTM" else [h])
    theirs = [t_out] + (list(t_h) if mode == "LSTM" else [t_h])
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == tuple(b.shape) and a.dtype == np.float64, (i, a.shape, b.shape)
    g_in, g_h = m.backward(np.zeros_like(out))
    assert g_in.shape == x.shape
    if with_h0:
        for a, b in zip(g_h if mode == "LSTM" else (g_h,), hx if mode == "LSTM" else (hx,)):
            assert a.shape == b.shape
    for (name, p), g in zip(m.named_parameters(), m.grads.values()):
        assert g.shape == p.shape and not g.any(), name


@pytest.mark.parametrize("cls", ["RNNCell", "LSTMCell", "GRUCell"])
def test_cells_empty_batch_shapes_match_torch(cls):
    cell = getattr(seqpack.nn, cls)(3, 5)
    ref = getattr(torch.nn, cls)(3, 5)
    x = np.zeros((0, 3), np.float32)
    ours, theirs = cell(x), ref(torch.from_numpy(x))
    ours = list(ours) if isinstance(ours, tuple) else [ours]
    theirs = list(theirs) if isinstance(theirs, tuple) else [theirs]
    for a, b in zip(ours, theirs):
        assert a.shape == tuple(b.shape) and a.dtype == np.float32
    g_in, _ = cell.backward(np.zeros_like(ours[0]))
    assert g_in.shape == (0, 3)
    for name, g in cell.grads.items():
        assert not g.any(), name
