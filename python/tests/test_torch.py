"""seqpack.torch (drop-in torch.nn.LSTM/GRU/RNN on torch.ops.seqpack.*) against torch.nn."""
import io

import pytest
import torch
from torch.nn.utils import rnn as trnn

import seqpack.torch as spt
from helpers import assert_close, base_seed
from tolerance import assert_like_torch
from tolerance import assert_fp_close
from rnn_cases import config_id, make_configs, make_inputs, run_torch, reduction_length, torch_module

CONFIGS = make_configs(base_seed() + 7, 40)
DROP_IN = {"LSTM": spt.LSTM, "GRU": spt.GRU, "RNN_TANH": spt.RNN, "RNN_RELU": spt.RNN}


@pytest.mark.parametrize("c", CONFIGS, ids=config_id)
def test_parity_with_torch(c):
    tm = torch_module(c)
    sm = torch_module(c, DROP_IN[c["mode"]])
    assert isinstance(sm, type(tm))
    # Same constructor, same RNG draws: identical initialisation.
    for (n, p), (m, q) in zip(tm.named_parameters(), sm.named_parameters()):
        assert n == m
        assert torch.equal(p, q), n
    inputs = make_inputs(c)
    expected = run_torch(tm, c, inputs)
    actual = run_torch(sm, c, inputs)
    n = reduction_length(c)
    for key in ("output", "h_n", "c_n"):
        if expected[key] is not None:
            assert_fp_close(actual[key], expected[key], n, c["dtype"], key)
    for key in ("grad_input", "grad_h0", "grad_c0"):
        if expected[key] is not None:
            assert_fp_close(actual[key], expected[key], n, c["dtype"], key)
    for name, g in expected["grad_params"].items():
        assert_fp_close(actual["grad_params"][name], g, n, c["dtype"], f"grad {name}")


def test_returns_torch_types_and_unbatched_input():
    torch.manual_seed(base_seed())
    t = torch.nn.LSTM(3, 4, batch_first=True)
    s = spt.LSTM(3, 4, batch_first=True)
    s.load_state_dict(t.state_dict())
    x = torch.randn(5, 3)  # unbatched [T, I]
    h = (torch.randn(1, 4), torch.randn(1, 4))
    with torch.no_grad():
        out_t, (h_t, c_t) = t(x, h)
        out_s, (h_s, c_s) = s(x, h)
    assert out_s.shape == out_t.shape and h_s.shape == h_t.shape
    assert_like_torch(out_s, out_t, t, [5], "unbatched output")
    assert_like_torch(c_s, c_t, t, [5], "unbatched c_n")
    packed = trnn.pack_sequence([torch.randn(4, 3), torch.randn(2, 3)])
    out, _ = s(packed)
    assert isinstance(out, trnn.PackedSequence)
    assert torch.equal(out.batch_sizes, packed.batch_sizes)


@pytest.mark.parametrize("cls", ["GRU", "LSTM"])
def test_errors_match_torch(cls):
    t = getattr(torch.nn, cls)(3, 4)
    s = getattr(spt, cls)(3, 4)

    def state(*shape):
        return (torch.randn(*shape), torch.randn(*shape)) if cls == "LSTM" else torch.randn(*shape)
    for bad_input, hx in [(torch.randn(5, 2, 6), None),       # input_size mismatch
                          (torch.randn(5, 2, 3), state(1, 3, 4)),  # wrong batch in hx
                          (torch.randn(5, 2, 3), state(2, 4)),     # hx 2-D for 3-D input
                          (torch.randn(5, 3), state(1, 1, 4)),     # hx 3-D for 2-D input
                          (torch.randn(5, 3), state(2, 4))]:       # 2 layers' hx for 1
        with pytest.raises(RuntimeError) as expected:
            t(bad_input, hx)
        with pytest.raises(RuntimeError) as actual:
            s(bad_input, hx)
        assert str(actual.value) == str(expected.value)
    with pytest.raises(ValueError, match="got 4D"):  # torch 2.x's message
        s(torch.randn(2, 2, 2, 3))


def test_optimiser_steps_match_torch():
    torch.manual_seed(base_seed())
    t = torch.nn.LSTM(3, 5, num_layers=2)
    torch.manual_seed(base_seed())
    s = spt.LSTM(3, 5, num_layers=2)
    ot = torch.optim.Adam(t.parameters(), lr=1e-2)
    os_ = torch.optim.Adam(s.parameters(), lr=1e-2)
    seqs = [torch.randn(n, 3) for n in (4, 2, 5)]
    for _ in range(3):
        for m, o in ((t, ot), (s, os_)):
            o.zero_grad()
            out, _ = m(trnn.pack_sequence(seqs, enforce_sorted=False))
            out.data.pow(2).sum().backward()
            o.step()
    for (n, p), (_, q) in zip(t.named_parameters(), s.named_parameters()):
        # Three Adam steps, each on the gradient of a pass over the batch.
        assert_like_torch(q, p, t, [4 + 2 + 5] * 3, n)


def test_state_dict_save_load_between_torch_and_seqpack():
    s = spt.GRU(3, 4, bidirectional=True)
    buf = io.BytesIO()
    torch.save(s.state_dict(), buf)
    buf.seek(0)
    t = torch.nn.GRU(3, 4, bidirectional=True)
    t.load_state_dict(torch.load(buf))
    x = torch.randn(6, 2, 3)
    with torch.no_grad():
        assert_like_torch(s(x)[0], t(x)[0], t, [6, 6], "output")
    assert repr(s) == repr(t)


def test_inference_and_dropout():
    torch.manual_seed(base_seed())
    s = spt.LSTM(3, 4, num_layers=2, dropout=0.5)
    x = torch.randn(5, 2, 3)
    s.eval()
    with torch.no_grad():
        a = s(x)[0]
        b = s(x)[0]
    assert torch.equal(a, b)
    s.train()
    torch.manual_seed(1)
    c = s(x)[0]
    torch.manual_seed(1)
    d = s(x)[0]
    assert torch.equal(c, d)  # masks drawn from torch's generator
    assert not torch.allclose(a, c)
    c.sum().backward()
    assert all(p.grad is not None for p in s.parameters())


def test_in_place_weight_change_after_forward_is_caught():
    s = spt.GRU(2, 3)
    out, _ = s(torch.randn(4, 1, 2))
    with torch.no_grad():
        s.weight_hh_l0.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_distributed_data_parallel(tmp_path):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        torch.manual_seed(base_seed())
        s = spt.LSTM(3, 4)
        torch.manual_seed(base_seed())
        t = torch.nn.LSTM(3, 4)
        ddp = torch.nn.parallel.DistributedDataParallel(s)
        x = trnn.pack_sequence([torch.randn(3, 3), torch.randn(2, 3)])
        ddp(x)[0].data.sum().backward()
        t(x)[0].data.sum().backward()
        for (n, p), (_, q) in zip(t.named_parameters(), s.named_parameters()):
            assert_like_torch(q.grad, p.grad, t, [3, 2], n)
    finally:
        dist.destroy_process_group()


def test_unsupported_dtype_runs_torchs_implementation():
    torch.manual_seed(base_seed())
    t = torch.nn.GRU(2, 3).bfloat16()
    torch.manual_seed(base_seed())
    s = spt.GRU(2, 3).bfloat16()
    x = torch.randn(4, 1, 2).bfloat16()
    assert torch.equal(s(x)[0], t(x)[0])


def test_runs_seqpacks_operator_not_torchs():
    s = spt.LSTM(2, 3)
    out, (h, c) = s(trnn.pack_sequence([torch.randn(3, 2), torch.randn(1, 2)]))
    assert "RNNFunction" in out.data.grad_fn.name()
    out, _ = s(torch.randn(3, 2, 2))
    assert "RNNFunction" in out.grad_fn.next_functions[0][0].name()  # a view
