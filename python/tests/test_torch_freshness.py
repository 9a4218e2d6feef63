"""Fresh by construction (issue 59): whatever wrote a weight, the next call of a
seqpack.torch layer computes with the values the module holds then, as
torch.nn, which reads its weights at every call, does. The operators keep a
plan per weight set (seqpack_torch/ops.cpp, "the model plan") and compare the
weights' bytes with the plan's copy at every call; neither torch's version
counter nor the data pointer decides. Each write path below moves no version
counter (or replaces the storage), and each test first runs the layer so that
a plan of the old values exists: a plan kept by version would answer with the
old values, far outside the bound.

Also: the backward computes with the forward's weights when a parameter's
storage is replaced or freed in between (as torch, which saves them);
layers run and are made under torch.inference_mode(); a deleted model's
weights are freed (the operators' cache holds them weakly); the cache is
bounded."""
import datetime
import gc
import os
import subprocess
import sys
import weakref

import pytest
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from torch.nn.utils.rnn import pack_padded_sequence

import seqpack
import seqpack.torch as st
from tolerance import assert_fp_close, rnn_reduction_length

NATIVE_BF16 = seqpack.cpu_info()["native_bf16"]

LAYERS = {"LSTM": (torch.nn.LSTM, st.LSTM), "GRU": (torch.nn.GRU, st.GRU),
          "RNN": (torch.nn.RNN, st.RNN)}
CELLS = {"LSTMCell": (torch.nn.LSTMCell, st.LSTMCell), "GRUCell": (torch.nn.GRUCell, st.GRUCell),
         "RNNCell": (torch.nn.RNNCell, st.RNNCell)}

I, H, B, T = 5, 8, 3, 4
LENGTHS = torch.tensor([4, 2, 3])

# (mode, num_layers, bidirectional, proj_size, form): one and two layers, both
# directions, proj_size, packed and padded input.
CONFIGS = [("LSTM", 1, False, 0, "padded"), ("GRU", 2, True, 0, "packed"),
           ("RNN", 2, False, 0, "padded"), ("LSTM", 2, True, 3, "packed"),
           ("GRU", 1, False, 0, "padded")]


def config_id(c):
    return f"{c[0]}-L{c[1]}{'-bi' if c[2] else ''}{f'-proj{c[3]}' if c[3] else ''}-{c[4]}"


def layer_pair(mode, layers, bidir, proj, seed=0):
    torch.manual_seed(seed)
    ref_cls, sp_cls = LAYERS[mode]
    kw = {"proj_size": proj} if proj else {}
    ref = ref_cls(I, H, num_layers=layers, bidirectional=bidir, **kw)
    sp = sp_cls(I, H, num_layers=layers, bidirectional=bidir, **kw)
    sp.load_state_dict(ref.state_dict())
    return ref, sp


def cell_pair(name, seed=0):
    torch.manual_seed(seed)
    ref_cls, sp_cls = CELLS[name]
    ref = ref_cls(I, H)
    sp = sp_cls(I, H)
    sp.load_state_dict(ref.state_dict())
    return ref, sp


def inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, B, I, generator=g)


def run(m, x, form):
    """The layer's output and final states, flattened into one tensor."""
    if isinstance(m, (torch.nn.RNNCellBase,)):
        h = None
        outs = []
        for t in range(x.size(0)):
            h = m(x[t], h)
            outs.append(torch.cat(h, 1) if isinstance(h, tuple) else h)
        return torch.stack(outs)
    if form == "packed":
        out, h = m(pack_padded_sequence(x, LENGTHS, enforce_sorted=False))
        out = out.data
    else:
        out, h = m(x)
    hs = torch.cat([s.flatten() for s in h]) if isinstance(h, tuple) else h.flatten()
    return torch.cat([out.flatten(), hs])


def bound_n(m, x):
    layers = getattr(m, "num_layers", 1)
    return rnn_reduction_length(I, H, layers, getattr(m, "bidirectional", False),
                                steps=x.size(0) * layers, proj_size=getattr(m, "proj_size", 0))


# ---- the write paths: each is applied the same way to both modules ---------

def data_mul(m):
    """A no-grad `w.data.mul_(0.5)` between calls."""
    for p in m.parameters():
        p.data.mul_(0.5)


def numpy_view(m):
    """A write through a NumPy view of each weight."""
    for p in m.parameters():
        a = p.detach().numpy()
        a *= -0.75


def ema(m):
    """A mean-teacher EMA written through `.data`."""
    g = torch.Generator().manual_seed(7)
    for p in m.parameters():
        student = torch.randn(p.shape, generator=g)
        p.data.mul_(0.5).add_(student, alpha=0.5)


def vector_then_edit(m):
    """vector_to_parameters, a call, then an in-place edit of the vector the
    parameters now view (their version counters do not move)."""
    vec = parameters_to_vector(m.parameters()).detach().clone()
    vector_to_parameters(vec, m.parameters())
    m._seqpack_test_vector = vec  # kept: the parameters view it


def vector_edit(m):
    m._seqpack_test_vector.mul_(0.5)


WRITES = {"data_mul": [data_mul], "numpy_view": [numpy_view], "ema": [ema],
          "vector_to_parameters": [vector_then_edit, vector_edit]}


def check_fresh(ref, sp, x, form, writes, what):
    n = bound_n(ref, x)
    with torch.no_grad():
        for _ in range(2):  # the second call reads the kept plan, laid out
            assert_fp_close(run(sp, x, form), run(ref, x, form), n, what=f"{what} before")
        for write in writes:
            write(ref)
            write(sp)
            # A call after each write: a plan of these values is kept before the next.
            got, want = run(sp, x, form), run(ref, x, form)
        assert_fp_close(got, want, n, what=f"{what} after")


@pytest.mark.parametrize("path", list(WRITES))
@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_layers_see_every_write(config, path):
    mode, layers, bidir, proj, form = config
    ref, sp = layer_pair(mode, layers, bidir, proj)
    check_fresh(ref, sp, inputs(), form, WRITES[path], f"{config_id(config)} {path}")


@pytest.mark.parametrize("path", list(WRITES))
@pytest.mark.parametrize("name", list(CELLS))
def test_cells_see_every_write(name, path):
    ref, sp = cell_pair(name)
    check_fresh(ref, sp, inputs(), "cell", WRITES[path], f"{name} {path}")


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_a_training_step_through_data_is_seen(config):
    """PyTorch's word_language_model: `p.data.add_(p.grad, alpha=-lr)` after
    the backward. Both modules take the same step (torch's gradients; seqpack's
    are checked against them first), then the next forward is compared."""
    mode, layers, bidir, proj, form = config
    ref, sp = layer_pair(mode, layers, bidir, proj)
    x = inputs()
    n = bound_n(ref, x)
    for step in range(3):
        for m in (ref, sp):
            m.zero_grad()
            run(m, x, form).square().sum().backward()
        for (name, p), q in zip(sp.named_parameters(), ref.parameters()):
            assert_fp_close(p.grad, q.grad, n * T * B, what=f"step {step} grad {name}")
        for p, q in zip(sp.parameters(), ref.parameters()):
            p.data.add_(q.grad, alpha=-0.1)
            q.data.add_(q.grad, alpha=-0.1)
        with torch.no_grad():
            assert_fp_close(run(sp, x, form), run(ref, x, form), n, what=f"after step {step}")


@pytest.mark.skipif(not NATIVE_BF16, reason=f"no native bf16 on {seqpack.cpu_info()['isa']}")
@pytest.mark.parametrize("path", list(WRITES))
@pytest.mark.parametrize("config", CONFIGS[:2], ids=config_id)
def test_bf16_calls_see_every_write(config, path):
    """Under autocast (bf16 products): after the write, the kept module's
    output is that of a module made now from the written values (bf16's own
    error bound against fp32 torch would not tell a stale plan apart)."""
    mode, layers, bidir, proj, form = config
    _, sp = layer_pair(mode, layers, bidir, proj)
    x = inputs()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(2):
            run(sp, x, form)
        for write in WRITES[path]:
            write(sp)
            got = run(sp, x, form)
        _, fresh = layer_pair(mode, layers, bidir, proj, seed=3)
        fresh.load_state_dict(sp.state_dict())
        want = run(fresh, x, form)
    assert_fp_close(got, want, bound_n(sp, x), what=f"bf16 {config_id(config)} {path}")


def test_int8_layers_see_every_write():
    """quantize_dynamic's layers keep the float weights and quantize in the
    operators' plan: a write to them is quantized again at the next call (the
    result: that of a layer quantized from the written values)."""
    _, sp = layer_pair("LSTM", 2, True, 0)
    q = st.quantize_dynamic(sp)
    x = inputs()
    with torch.no_grad():
        for _ in range(2):
            run(q, x, "padded")
        data_mul(q)
        got = run(q, x, "padded")
        _, fresh = layer_pair("LSTM", 2, True, 0, seed=3)
        fresh.load_state_dict(q.state_dict())
        want = run(st.quantize_dynamic(fresh), x, "padded")
    assert torch.equal(got, want), (got - want).abs().max()


def test_the_operator_sees_writes_to_its_weight_list():
    """torch.ops.seqpack.rnn called directly (TorchScript, LibTorch) with a
    weight list written in place between calls through `.data`."""
    ref, sp = layer_pair("GRU", 1, False, 0)
    x = inputs()
    weights = [p.detach() for p in ref._flat_weights]
    lengths = torch.full((B,), T, dtype=torch.long)

    def call():
        out, h, _ = torch.ops.seqpack.rnn_padded(x, lengths, None, None, weights, "GRU", H, 1,
                                                 True, False, 0, False, 0.0, False, None, "fp32")
        return out

    with torch.no_grad():
        call(), call()
        ref.weight_hh_l0.data.mul_(-1.0)  # weights view the same memory
        assert_fp_close(call(), ref(x)[0], bound_n(ref, x), what="operator after a write")


# ---- the backward reads the forward's weights --------------------------------

def replace_storage(m):
    for p in m.parameters():
        p.data = torch.full_like(p, 1e30)


def share_memory(m):
    m.share_memory()


@pytest.mark.parametrize("change", [replace_storage, share_memory])
@pytest.mark.parametrize("config", CONFIGS[:4], ids=config_id)
def test_the_backward_uses_the_forwards_weights(config, change):
    """A parameter's storage replaced (`p.data = ...`) or moved to shared memory
    (`model.share_memory()` frees the old one) between forward and backward:
    gradients as torch's, which saves the forward's weights."""
    mode, layers, bidir, proj, form = config
    ref, sp = layer_pair(mode, layers, bidir, proj)
    x = inputs()
    n = bound_n(ref, x)
    losses = []
    for m in (ref, sp):
        loss = run(m, x, form).square().sum()
        change(m)
        gc.collect()
        # The freed memory reused (what made seqpack's gradients garbage).
        junk = [torch.full((4096,), 1e30) for _ in range(64)]
        xs = [p for p in m.parameters()]
        g = torch.autograd.grad(loss, xs)
        del junk
        losses.append(g)
    for k, (a, b) in enumerate(zip(*losses[::-1])):
        assert torch.isfinite(a).all(), f"gradient {k} is not finite"
        assert_fp_close(a, b, n * T * B, what=f"gradient {k}")


# ---- inference tensors --------------------------------------------------------

@pytest.mark.parametrize("name", ["LSTM", "GRU", "LSTMCell"])
def test_layers_made_and_run_in_inference_mode(name):
    x = inputs()
    with torch.inference_mode():
        if name in LAYERS:
            ref, sp = layer_pair(name, 2, True, 0)
        else:
            ref, sp = cell_pair(name)
        for _ in range(2):
            got, want = run(sp, x, "padded"), run(ref, x, "padded")
        assert_fp_close(got, want, bound_n(ref, x), what="inference_mode")
    # Made outside, run inside.
    ref, sp = layer_pair("GRU", 1, False, 0) if name in LAYERS else cell_pair(name)
    with torch.inference_mode():
        assert_fp_close(run(sp, x, "padded"), run(ref, x, "padded"), bound_n(ref, x),
                        what="made outside, run in inference_mode")


# ---- what the operators' cache holds -----------------------------------------

def test_a_deleted_model_is_freed():
    """The operators' plan cache holds no weight alive: 12 models run and
    deleted, each parameter freed (torch.nn's are too)."""
    refs = []
    for k in range(12):
        m = st.GRU(16, 32, num_layers=2, bidirectional=True)
        with torch.no_grad():
            m(torch.randn(3, 2, 16))
            m(torch.randn(3, 2, 16))
        refs += [weakref.ref(p) for p in m.parameters()]
        del m
    gc.collect()
    alive = sum(r() is not None for r in refs)
    assert alive == 0, f"{alive} of {len(refs)} parameters of deleted models are alive"


def test_the_plan_cache_is_bounded():
    """More weight sets than the cache keeps: it holds at most its count and
    bytes (torch.ops.seqpack._plan_cache_size: entries, bytes of copies)."""
    kept = []
    x = torch.randn(3, 2, 16)
    with torch.no_grad():
        for k in range(40):
            m = st.LSTM(16, 32)
            m(x), m(x)
            kept.append(m)
    entries, nbytes = torch.ops.seqpack._plan_cache_size()
    assert 0 < entries <= 16 and 0 < nbytes <= 256 << 20, (entries, nbytes)


# ---- torch.distributed ---------------------------------------------------------

def _distributed_rank(rank, world, init):
    import torch.distributed as dist  # noqa: PLC0415
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        torch.set_num_threads(1)
        for op in ("broadcast", "all_reduce"):
            ref, sp = layer_pair("LSTM", 2, True, 0, seed=10 + rank)
            x = inputs()
            with torch.no_grad():
                run(sp, x, "padded"), run(sp, x, "padded")
                for m in (ref, sp):
                    for p in m.parameters():
                        if op == "broadcast":
                            dist.broadcast(p, 0)
                        else:
                            dist.all_reduce(p.data)
                        p.data.mul_(0.25)  # sums of two stay in a tame range
                assert_fp_close(run(sp, x, "padded"), run(ref, x, "padded"), bound_n(ref, x),
                                what=f"rank {rank} after {op}")
    finally:
        dist.destroy_process_group()


def _distributed_main(init):
    import torch.multiprocessing as mp  # noqa: PLC0415
    mp.spawn(_distributed_rank, args=(2, init), nprocs=2, join=True)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")
@pytest.mark.skipif(int(torch.__version__.split(".")[0]) >= 2,
                    reason="under PyTorch 2.6 (Debian 13 root) the two gloo ranks hang in some "
                           "runs (passed alone, hung twice after other tests): issue 59, open")
def test_distributed_broadcast_and_all_reduce_are_seen(tmp_path):
    """A gloo process group of two ranks on this machine: the receiving rank's
    weights change in place with no version counter moving. Run from a fresh
    interpreter (the ranks hung under PyTorch 2.6 when spawned from this
    session's process after the tests above), with a deadline."""
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run(
        [sys.executable, "-c",
         f"import test_torch_freshness as t; t._distributed_main('file://{tmp_path}/init')"],
        cwd=here, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
