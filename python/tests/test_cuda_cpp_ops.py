"""seqpack's CUDA operator kernels in C++ (seqpack_torch/cuda_ops.cpp) run on
the CPU: the test library libseqpack_torch_cuda_emulated.so registers them for
CPU tensors as torch.ops.seqpack_cuda_emulated (seqpack's schemas), over
libseqpack_cuda.so compiled for the CPU (cuda/emulate/; cuda_emulated.py).
Checked against torch (torch._VF's packed overloads and torch.nn's modules):
outputs, states and every gradient, sorted/unsorted indices, padded input with
and without lengths (zero lengths too), the seeded dropout mask, TorchScript,
torch.compile (PyTorch 2.4+), the double-backward refusal and the bad inputs
by name; seqpack.torch's layers' route on CUDA tensors through them, and the
choice between seqpack's kernels and torch's (SEQPACK_CUDA_LAYERS) that they
make. Where torch is a CUDA build the same kernels are seqpack::rnn's CUDA
kernels (cuda_register.cpp)."""
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_emulated  # noqa: E402
from test_cuda_library import CASES, _make, _reference  # noqa: E402
from tolerance import assert_fp_close, rnn_reduction_length  # noqa: E402

import seqpack.torch  # noqa: E402,F401  (loads libseqpack_torch: the kernels' library)


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    """torch.ops.seqpack_cuda_emulated over the emulated library."""
    return cuda_emulated.emulated(tmp_path_factory).ops


def _bound_n(mode, input_size, hidden, layers, bidirectional, proj, rows):
    return rnn_reduction_length(input_size, hidden, layers, bidirectional, rows, proj)


def _leaves(tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


@pytest.mark.parametrize("mode,layers,bidirectional,bias,proj,lengths,extra", CASES)
def test_cpp_kernels_match_torch(ops, mode, layers, bidirectional, bias, proj, lengths, extra):
    input_size, hidden = 3, 5
    seed = 4321 + len(lengths) * 7 + layers
    rnn = _make(mode, input_size, hidden, layers, bidirectional, bias, proj, seed)
    dirs, hout = (2 if bidirectional else 1), proj or hidden
    packed = torch.nn.utils.rnn.pack_sequence([torch.randn(n, input_size) for n in lengths])
    data, bs = packed.data.detach(), packed.batch_sizes
    batch, real = len(lengths) + extra, len(lengths)
    h0 = torch.randn(layers * dirs, batch, hout)
    c0 = torch.randn(layers * dirs, batch, hidden) if mode == "LSTM" else None
    weights = [w.detach() for w in rnn._flat_weights]
    lstm = c0 is not None
    leaves = _leaves([data, h0] + ([c0] if lstm else []) + weights)
    x_, h_, c_, w_ = leaves[0], leaves[1], (leaves[2] if lstm else None), leaves[2 + lstm:]
    y, hn, cn = ops.rnn(x_, bs, None, None, h_, c_, w_, mode, hidden, layers, bias, bidirectional, proj,
                        0.0, False, None, "fp32")
    rleaves = _leaves([data, h0[:, :real]] + ([c0[:, :real]] if lstm else []) + weights)
    rx, rh, rc, rw = rleaves[0], rleaves[1], (rleaves[2] if lstm else None), rleaves[2 + lstm:]
    ry, rhn, rcn = _reference(mode, rx, bs, rh, rc, rw, bias, layers, bidirectional)
    n = _bound_n(mode, input_size, hidden, layers, bidirectional, proj, sum(lengths))
    assert_fp_close(y, ry, n, what="output", scale=1.0)
    assert_fp_close(hn[:, :real], rhn, n, what="h_n", scale=1.0)
    assert torch.equal(hn[:, real:], h0[:, real:]), "zero-length sequences' h_n is not their h0"
    if lstm:
        assert_fp_close(cn[:, :real], rcn, n, what="c_n", scale=max(1.0, float(rcn.abs().max())))
        assert torch.equal(cn[:, real:], c0[:, real:])
    else:
        assert cn.numel() == 0

    torch.manual_seed(seed + 1)
    gy, ghn = torch.randn_like(ry), torch.randn_like(hn)
    gcn = torch.randn_like(cn) if lstm else None
    loss = (y * gy).sum() + (hn * ghn).sum() + ((cn * gcn).sum() if lstm else 0)
    grads = torch.autograd.grad(loss, leaves)
    rloss = (ry * gy).sum() + (rhn * ghn[:, :real]).sum() + ((rcn * gcn[:, :real]).sum() if lstm else 0)
    rgrads = torch.autograd.grad(rloss, rleaves, allow_unused=True)
    names = ["data", "h0"] + (["c0"] if lstm else []) + [f"weights[{i}]" for i in range(len(weights))]
    for name, g, r in zip(names, grads, rgrads):
        r = torch.zeros_like(g) if r is None else r
        if name in ("h0", "c0"):
            assert_fp_close(g[:, :real], r, n, what="d" + name)
            want = ghn if name == "h0" else gcn  # h_n = h0 where a sequence has no steps
            assert torch.equal(g[:, real:], want[:, real:]), name
        else:
            assert_fp_close(g, r, n, what="d" + name)

    with torch.no_grad():  # the route without a graph: one allocation, the same values
        y2, hn2, cn2 = ops.rnn(data, bs, None, None, h0, c0, weights, mode, hidden, layers, bias,
                               bidirectional, proj, 0.0, False, None, "auto")
    assert torch.equal(y2, y.detach()) and torch.equal(hn2, hn.detach())
    if lstm:
        assert torch.equal(cn2, cn.detach())


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_cpp_kernels_take_the_callers_order(ops, mode):
    """enforce_sorted=False: h0/c0 in, h_n/c_n out in the caller's batch order,
    and gradients through the permutations (against torch.nn's module)."""
    rnn = _make(mode, 4, 6, 2, True, True, 0, 11)
    seqs = [torch.randn(n, 4) for n in (2, 5, 1, 5, 3)]
    packed = torch.nn.utils.rnn.pack_sequence(seqs, enforce_sorted=False)
    h0 = torch.randn(4, 5, 6)
    c0 = torch.randn(4, 5, 6)
    hx = (h0, c0) if mode == "LSTM" else h0
    leaves = _leaves([packed.data, h0, c0])
    y, hn, cn = ops.rnn(leaves[0], packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices, leaves[1],
                        leaves[2] if mode == "LSTM" else None, rnn._flat_weights, mode, 6, 2, True, True, 0, 0.0,
                        False, None, "fp32")
    rleaves = _leaves([packed.data, h0, c0])
    rpacked = torch.nn.utils.rnn.PackedSequence(rleaves[0], packed.batch_sizes, packed.sorted_indices,
                                                packed.unsorted_indices)
    rout, rhx = rnn(rpacked, (rleaves[1], rleaves[2]) if mode == "LSTM" else rleaves[1])
    rhn = rhx[0] if mode == "LSTM" else rhx
    n = _bound_n(mode, 4, 6, 2, True, 0, packed.data.shape[0])
    assert_fp_close(y, rout.data, n, what="output", scale=1.0)
    assert_fp_close(hn, rhn, n, what="h_n", scale=1.0)
    loss = y.sum() + (hn * torch.arange(hn.numel()).view_as(hn)).sum() / hn.numel()
    rloss = rout.data.sum() + (rhn * torch.arange(rhn.numel()).view_as(rhn)).sum() / rhn.numel()
    if mode == "LSTM":
        assert_fp_close(cn, rhx[1], n, what="c_n", scale=max(1.0, float(rhx[1].abs().max())))
        loss = loss + cn.sum()
        rloss = rloss + rhx[1].sum()
    used = 3 if mode == "LSTM" else 2
    grads = torch.autograd.grad(loss, leaves[:used])
    rgrads = torch.autograd.grad(rloss, rleaves[:used])
    for name, g, r in zip(["data", "h0", "c0"], grads, rgrads):
        assert_fp_close(g, r, n, what="d" + name)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN_TANH"])
def test_cpp_padded_kernel_matches_torch(ops, mode, batch_first):
    """rnn_padded with lengths (unsorted, one of them zero): packed, run and
    padded back to the input's own length; h_n of the empty sequence is its h0,
    its output rows zero; values and gradients against torch.nn on the packed
    sequences of nonzero length."""
    rnn = _make(mode, 3, 5, 2, True, True, 0, 21)
    lengths = torch.tensor([3, 0, 6, 2])
    T, B = 7, 4
    x = torch.randn(B, T, 3) if batch_first else torch.randn(T, B, 3)
    h0 = torch.randn(4, B, 5)
    c0 = torch.randn(4, B, 5) if mode == "LSTM" else None
    leaves = _leaves([x, h0] + ([c0] if c0 is not None else []))
    out, hn, cn = ops.rnn_padded(leaves[0], lengths, leaves[1], leaves[2] if c0 is not None else None,
                                 rnn._flat_weights, mode, 5, 2, True, batch_first, True, 0, 0.0, False, None, "fp32")
    assert out.shape == ((B, T, 10) if batch_first else (T, B, 10))
    keep = torch.tensor([0, 2, 3])
    rx = leaves[0].detach().index_select(0 if batch_first else 1, keep).requires_grad_()
    rh = h0[:, keep].clone().requires_grad_()
    rhx = (rh, c0[:, keep].clone()) if c0 is not None else rh
    packed = torch.nn.utils.rnn.pack_padded_sequence(rx, lengths[keep], batch_first=batch_first,
                                                     enforce_sorted=False)
    rout, rstate = rnn(packed, rhx)
    rpadded, _ = torch.nn.utils.rnn.pad_packed_sequence(rout, batch_first=batch_first, total_length=T)
    rhn = rstate[0] if mode == "LSTM" else rstate
    n = _bound_n(mode, 3, 5, 2, True, 0, int(lengths.sum()))
    got = out.index_select(0 if batch_first else 1, keep)
    assert_fp_close(got, rpadded, n, what="output", scale=1.0)
    assert_fp_close(hn[:, keep], rhn, n, what="h_n", scale=1.0)
    empty = out.select(0 if batch_first else 1, 1)
    assert torch.equal(empty, torch.zeros_like(empty)), "the empty sequence's outputs are not zero"
    assert torch.equal(hn[:, 1], h0[:, 1])
    gx, gh = torch.autograd.grad((out * out).sum() + hn.sum(), leaves[:2])
    rgx, rgh = torch.autograd.grad((rpadded * rpadded).sum() + rhn.sum(), [rx, rh])
    assert_fp_close(gx.index_select(0 if batch_first else 1, keep), rgx, n, what="dx")
    assert_fp_close(gh[:, keep], rgh, n, what="dh0")
    assert torch.equal(gh[:, 1], torch.ones_like(gh[:, 1]))  # h_n = h0: d(sum h_n)/dh0 = 1


@pytest.mark.parametrize("batch_first", [False, True])
def test_cpp_padded_kernel_without_lengths_is_a_batch_of_equal_lengths(ops, batch_first):
    rnn = _make("GRU", 3, 4, 1, False, True, 0, 5)
    rnn.batch_first = batch_first
    x = torch.randn(2, 6, 3) if batch_first else torch.randn(6, 2, 3)
    out, hn, _ = ops.rnn_padded(x, None, None, None, rnn._flat_weights, "GRU", 4, 1, True, batch_first, False, 0,
                                0.0, False, None, "fp32")
    rout, rhn = rnn(x)
    n = _bound_n("GRU", 3, 4, 1, False, 0, 12)
    assert_fp_close(out, rout, n, what="output", scale=1.0)
    assert_fp_close(hn, rhn, n, what="h_n", scale=1.0)


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_cpp_padded_kernel_without_steps_keeps_the_states(ops, mode):
    """T = 0 (no lengths): no output rows, h_n/c_n the given states, or zeros of
    the batch's size (states, B, H), as seqpack's CPU kernel gives."""
    rnn = _make(mode, 3, 4, 2, True, True, 0, 6)
    x = torch.zeros(0, 2, 3)
    h0 = torch.randn(4, 2, 4)
    c0 = torch.randn(4, 2, 4) if mode == "LSTM" else None
    args = (rnn._flat_weights, mode, 4, 2, True, False, True, 0, 0.0, False, None, "fp32")
    for given in (True, False):
        out, hn, cn = ops.rnn_padded(x, None, h0 if given else None, c0 if given else None, *args)
        cpu = torch.ops.seqpack.rnn_padded(x, None, h0 if given else None, c0 if given else None, *args)
        assert out.shape == (0, 2, 8)
        assert torch.equal(hn, cpu[1]) and hn.shape == (4, 2, 4)
        assert torch.equal(cn, cpu[2])


def test_cpp_kernels_seed_their_dropout_mask(ops):
    """train with dropout between layers: the mask is torch's Bernoulli draw
    from the data's generator seeded by `seed` (1/(1-p) where kept), so the
    values are the reference's with that mask, and a seed replays them."""
    p, mode = 0.4, "LSTM"
    rnn = _make(mode, 3, 5, 3, True, True, 0, 8)
    packed = torch.nn.utils.rnn.pack_sequence([torch.randn(n, 3) for n in (4, 3, 1)])
    data, bs = packed.data, packed.batch_sizes
    h0, c0 = torch.zeros(6, 3, 5), torch.zeros(6, 3, 5)
    args = (data, bs, None, None, h0, c0, rnn._flat_weights, mode, 5, 3, True, True, 0, p, True)
    before = torch.get_rng_state()
    with torch.no_grad():
        y1, hn1, _ = ops.rnn(*args, 99, "fp32")
        y2, _, _ = ops.rnn(*args, 99, "fp32")
        y3, _, _ = ops.rnn(*args, 100, "fp32")
    assert torch.equal(torch.get_rng_state(), before), "a seeded call moved torch's generator"
    with torch.no_grad():
        torch.manual_seed(99)
        keep = torch.empty(2, data.shape[0], 10).bernoulli_(1.0 - p)
        ry, rhn, _ = _reference(mode, data, bs, h0, c0, [w.detach() for w in rnn._flat_weights], True, 3, True,
                                keep / (1.0 - p))
    assert torch.equal(y1, y2), "the same seed drew another mask"
    assert not torch.equal(y1, y3), "another seed drew the same mask"
    n = _bound_n(mode, 3, 5, 3, True, 0, data.shape[0])
    assert_fp_close(y1, ry, n, what="output", scale=1.0)
    assert_fp_close(hn1, rhn, n, what="h_n", scale=1.0)


def test_cpp_kernels_run_from_torchscript(ops):
    @torch.jit.script
    def run(data: torch.Tensor, bs: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
        return torch.ops.seqpack_cuda_emulated.rnn(data, bs, None, None, None, None, weights, "GRU", 4, 1, True,
                                                   False, 0, 0.0, False, None, "fp32")[0]

    rnn = _make("GRU", 3, 4, 1, False, True, 0, 3)
    packed = torch.nn.utils.rnn.pack_sequence([torch.randn(n, 3) for n in (5, 2)])
    weights = [w.detach() for w in rnn._flat_weights]
    y = run(packed.data, packed.batch_sizes, weights)
    with torch.no_grad():
        ry = rnn(packed)[0].data
    assert_fp_close(y, ry, _bound_n("GRU", 3, 4, 1, False, 0, 7), what="output", scale=1.0)


def test_cpp_kernels_refuse_double_backward_when_asked_for(ops):
    rnn = _make("GRU", 3, 4, 1, False, True, 0, 2)
    packed = torch.nn.utils.rnn.pack_sequence([torch.randn(n, 3) for n in (3, 2)])
    x = packed.data.clone().requires_grad_()
    y, _, _ = ops.rnn(x, packed.batch_sizes, None, None, None, None, rnn._flat_weights, "GRU", 4, 1, True, False,
                      0, 0.0, False, None, "fp32")
    (gx,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        gx.sum().backward()


def _gru_args(**change):
    rnn = _make("GRU", 3, 4, 1, False, True, 0, 2)
    packed = torch.nn.utils.rnn.pack_sequence([torch.randn(n, 3) for n in (3, 2)])
    args = dict(data=packed.data, batch_sizes=packed.batch_sizes, sorted_indices=None, unsorted_indices=None,
                h0=None, c0=None, weights=[w.detach() for w in rnn._flat_weights], mode="GRU", hidden_size=4,
                num_layers=1, bias=True, bidirectional=False, proj_size=0, dropout=0.0, train=False, seed=None,
                precision="fp32")
    args.update(change)
    return list(args.values())


@pytest.mark.parametrize("change,error,message", [
    (dict(precision="bf16"), ValueError, "precision = 'bf16' is not one of"),
    (dict(mode="LSTMX"), ValueError, "mode = 'LSTMX' is not one of"),
    (dict(dropout=1.5), ValueError, "dropout = 1.5 must be in"),
    (dict(num_layers=2), ValueError, "4 weights given, 8 expected"),
    (dict(hidden_size=5), RuntimeError, r"weights\[0\] has shape \[12, 3\], expected \[15, 3\]"),
    (dict(h0=torch.zeros(1, 1, 4)), RuntimeError, r"batch_sizes\[0\] = 2 exceeds the batch of h0, 1$"),
    (dict(h0=torch.zeros(1, 2, 5)), RuntimeError, r"Expected hidden size \(1, batch, 4\) for h0, got \[1, 2, 5\]"),
    (dict(proj_size=2), ValueError, "proj_size = 2 .only LSTM"),
    (dict(data=torch.zeros(5, 2)), RuntimeError,
     r"weights\[0\] has shape \[12, 3\], expected \[12, 2\] \(input.size\(-1\) must be equal to input_size\)"),
    (dict(h0=torch.zeros(1, 2, 4, dtype=torch.float64)), TypeError, "h0 has dtype Double, data Float"),
    (dict(batch_sizes=torch.tensor([2, 3])), RuntimeError, r"batch_sizes\[1\] = 3 exceeds batch_sizes\[0\] = 2 "
     r"\(they must not increase\)$"),
])
def test_cpp_kernels_name_bad_values(ops, change, error, message):
    with pytest.raises(error, match=message):
        ops.rnn(*_gru_args(**change))


def test_cpp_kernels_name_a_bad_dtype_and_bad_lengths(ops):
    with pytest.raises(TypeError, match="data has dtype Double"):
        ops.rnn(*_gru_args(data=torch.zeros(5, 3, dtype=torch.float64)))
    w = _gru_args()[6]
    with pytest.raises(ValueError, match=r"lengths\[1\] = 9 is outside \[0, 4\]"):
        ops.rnn_padded(torch.zeros(4, 2, 3), torch.tensor([2, 9]), None, None, w, "GRU", 4, 1, True, False, False,
                       0, 0.0, False, None, "fp32")
    with pytest.raises(RuntimeError, match=r"lengths has shape \[3\]; one length per sequence \(2\)"):
        ops.rnn_padded(torch.zeros(4, 2, 3), torch.tensor([2, 1, 1]), None, None, w, "GRU", 4, 1, True, False,
                       False, 0, 0.0, False, None, "fp32")


def test_cpp_kernels_keep_their_library(ops, tmp_path):
    """One library per process: another file is refused by name; another name of
    the loaded file is that library."""
    loaded = ops._cuda_library("")
    assert ops._cuda_library(loaded) == loaded
    link = tmp_path / "same.so"  # another name of the same file is the same library
    link.symlink_to(loaded)
    assert ops._cuda_library(str(link)) == loaded
    other = tmp_path / "libseqpack_cuda.so"
    other.write_bytes(b"")
    with pytest.raises(ValueError, match="already use"):
        ops._cuda_library(str(other))


def test_device_check_stage_runs_on_the_cpu(ops):
    """bench/cuda_cpp_ops.py (the device check's cppops stage) in its CPU
    self-test: it builds the kernels with torch.utils.cpp_extension, checks them
    against torch._VF (forward and every gradient) and prints its table; the
    figures mean nothing here."""
    import shutil
    if shutil.which("ninja") is None:  # scripts/setup.sh installs ninja-build
        pytest.skip("no ninja: torch.utils.cpp_extension needs it")
    script = pathlib.Path(__file__).resolve().parents[2] / "bench" / "cuda_cpp_ops.py"
    env = dict(os.environ, SEQPACK_CUDA_LIBRARY=ops._cuda_library(""))  # the emulated one, built
    out = subprocess.run([sys.executable, str(script), "--cpu", "--calls", "2", "--rounds", "1"],
                         capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert "LSTM: the C++ kernels against torch._VF's packed lstm" in lines
    assert "GRU: the C++ kernels against torch._VF's packed gru" in lines
    assert sum(line.startswith("  dweights[") for line in lines) == 20 + 8
    rows = [line for line in lines if line.startswith("| ") and "x " in line]
    assert len(rows) == 3, out.stdout


# ---- torch.compile (PyTorch 2.4+): the autograd kernel calls _rnn_train and
# _rnn_backward, whose fake implementations (seqpack/_torch_fakes.py, registered
# here for the emulated namespace) let the tracer run them.

@pytest.mark.skipif(not hasattr(torch, "compile") or not hasattr(torch.library, "register_fake"),
                    reason="torch.compile of seqpack's operators needs torch >= 2.4")
@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_torch_compile_traces_the_cpp_kernels(ops, mode):
    """torch.compile(fullgraph=True) of a call of the operator: the autograd
    kernel is traced (its forward and backward are operators with fakes), and
    the compiled outputs and gradients are eager's."""
    from seqpack import _torch_fakes
    _torch_fakes.register("seqpack_cuda_emulated")
    rnn = _make(mode, 3, 5, 2, True, True, 0, 31)
    packed = torch.nn.utils.rnn.pack_sequence([torch.randn(n, 3) for n in (5, 3, 2)])
    states = [torch.randn(4, 3, 5), torch.randn(4, 3, 5)] if mode == "LSTM" else [torch.randn(4, 3, 5)]
    weights = [w.detach().clone() for w in rnn._flat_weights]
    n = len(states)

    def fn(data, *rest):
        c0 = rest[1] if mode == "LSTM" else None
        return ops.rnn(data, packed.batch_sizes, None, None, rest[0], c0, list(rest[n:]), mode, 5, 2, True, True,
                       0, 0.0, True, None, "fp32")

    def run(f):
        leaves = [t.clone().requires_grad_() for t in [packed.data] + states + weights]
        out = f(*leaves)
        loss = sum((o * (k + 1)).sum() for k, o in enumerate(out[:n + 1]))
        return out, torch.autograd.grad(loss, leaves)

    eager, eager_grads = run(fn)
    torch._dynamo.reset()
    compiled, compiled_grads = run(torch.compile(fn, fullgraph=True, backend="aot_eager"))
    for a, e in zip(compiled, eager):
        assert torch.equal(a.detach(), e.detach())
    for a, e in zip(compiled_grads, eager_grads):
        assert torch.equal(a, e)


# ---- seqpack.torch's layers on CUDA tensors: _cuda_run (the operators' CUDA
# kernels, packing, the states' order, padding), here the emulated operators on
# CPU tensors.

def _route_cases():
    # (mode, layers, bidirectional, proj, batch_first, form, lengths)
    return [("LSTM", 2, True, 0, False, "packed", [4, 1, 3]),
            ("LSTM", 1, False, 2, True, "lengths", [2, 5, 3, 1]),
            ("GRU", 2, False, 0, True, "padded", [3, 3]),
            ("GRU", 1, True, 0, False, "lengths", [3, 0, 2]),
            ("RNN_TANH", 1, True, 0, False, "packed", [2, 0, 4]),
            ("RNN_RELU", 2, False, 0, False, "padded", [4, 4, 4])]


def _layer(mode, layers=1, bidirectional=False, proj=0, batch_first=False):
    cls = {"LSTM": seqpack.torch.LSTM, "GRU": seqpack.torch.GRU, "RNN_TANH": seqpack.torch.RNN,
           "RNN_RELU": seqpack.torch.RNN}[mode]
    kw = {"nonlinearity": "relu" if mode == "RNN_RELU" else "tanh"} if mode.startswith("RNN") else {}
    if proj:
        kw["proj_size"] = proj
    return cls(3, 5, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first, **kw)


@pytest.fixture
def emulated_route(ops, monkeypatch):
    """The layers' CUDA forwards call the emulated operators (the dispatcher
    would send these CPU tensors to the CPU kernels)."""
    import seqpack._torch_layers as torch_layers  # where the layers look it up
    monkeypatch.setattr(torch_layers, "_cuda_operators", lambda: ops)
    yield
    torch.ops.seqpack._cuda_layers("seqpack")
    torch.ops.seqpack._cuda_choice_times([])


@pytest.mark.parametrize("mode,layers,bidirectional,proj,batch_first,form,lengths", _route_cases())
def test_layers_cuda_route_matches_seqpack_cpu(ops, emulated_route, mode, layers, bidirectional, proj,
                                               batch_first, form, lengths):
    torch.manual_seed(7 + len(lengths))
    m = _layer(mode, layers, bidirectional, proj, batch_first)
    B, T = len(lengths), max(lengths)
    x = torch.randn((B, T, 3) if batch_first else (T, B, 3))
    dirs = 2 if bidirectional else 1
    h0 = torch.randn(layers * dirs, B, proj or 5)
    c0 = torch.randn(layers * dirs, B, 5) if mode == "LSTM" else None
    lens = torch.tensor(lengths)
    if form == "packed":
        p = seqpack.torch.pack_padded_sequence(x, lens, batch_first, enforce_sorted=False)
        args = (p.data, p.batch_sizes, p.sorted_indices, p.unsorted_indices, None)
    elif form == "lengths":
        args = (x, None, None, None, lens)
    else:
        args = (x, None, None, None, None)
    got = m._cuda_run(*args, h0, c0)
    want = m._core_run(*args, h0, c0, "fp32")
    assert seqpack.torch.cuda_choice(m) == ("seqpack", "SEQPACK_CUDA_LAYERS=seqpack")
    # Both are fp32 along different code paths: the bound of docs/testing.md.
    n = rnn_reduction_length(3, 5, layers, bidirectional, sum(lengths), proj)
    for name, g, w in zip(("output", "h_n", "c_n"), got, want):
        assert_fp_close(g.detach(), w.detach(), n, what=name)


def _packed_args(lengths, seed=5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(max(lengths), len(lengths), 3, generator=g)
    p = seqpack.torch.pack_padded_sequence(x, torch.tensor(lengths), enforce_sorted=False)
    h0 = torch.randn(4, len(lengths), 5, generator=g)
    c0 = torch.randn(4, len(lengths), 5, generator=g)
    return (p.data, p.batch_sizes, p.sorted_indices, p.unsorted_indices, None, h0, c0)


def _close_to_torch(m, got, args):
    want = m._core_run(*args, "fp32")
    n = rnn_reduction_length(3, 5, 2, True, int(args[1].sum()), 0)
    for name, g, w in zip(("output", "h_n", "c_n"), got, want):
        assert_fp_close(g.detach(), w.detach(), n, what=name)


@pytest.mark.parametrize("faster", ["seqpack", "torch"])
def test_auto_runs_the_faster_and_remembers_it(ops, emulated_route, faster):
    """SEQPACK_CUDA_LAYERS=auto: the operator times each side at a
    configuration's first call (the times injected here), runs the faster and
    remembers it for the configuration (the batch and rows rounded up to powers
    of two); cuda_choice says which ran and why."""
    slow = "torch" if faster == "seqpack" else "seqpack"
    assert torch.ops.seqpack._cuda_layers("auto") == "auto"
    torch.ops.seqpack._cuda_choice_times([0.001, 0.003] if faster == "seqpack" else [0.003, 0.001])
    torch.manual_seed(3)
    m = _layer("LSTM", 2, True)
    args = _packed_args([4, 2, 3])
    got = m._cuda_run(*args)
    _close_to_torch(m, got, args)
    c = seqpack.torch.cuda_choice(m)
    assert c.impl == faster and "SEQPACK_CUDA_LAYERS=auto" in c.why, c
    assert f"{faster} was faster" in c.why and "1000 us" in c.why and "3000 us" in c.why, c.why
    # Other times: the configuration decided keeps its choice (batch 4 rounds up to 4 like batch 3) ...
    torch.ops.seqpack._cuda_choice_times([0.003, 0.001] if faster == "seqpack" else [0.001, 0.003], False)
    m._cuda_run(*_packed_args([4, 2, 3, 1], seed=6))
    assert seqpack.torch.cuda_choice(m).impl == faster
    # ... whatever mode ran between, another configuration (batch 5: the next power of two) is decided with them,
    torch.ops.seqpack._cuda_layers("seqpack")
    torch.ops.seqpack._cuda_layers("auto")
    m._cuda_run(*_packed_args([4, 2, 3, 1], seed=6))
    assert seqpack.torch.cuda_choice(m).impl == faster
    m._cuda_run(*_packed_args([4, 2, 3, 1, 2], seed=7))
    assert seqpack.torch.cuda_choice(m).impl == slow
    # and so is every configuration once the decisions are forgotten.
    torch.ops.seqpack._cuda_choice_times([0.003, 0.001] if faster == "seqpack" else [0.001, 0.003])
    m._cuda_run(*_packed_args([4, 2, 3, 1], seed=6))
    assert seqpack.torch.cuda_choice(m).impl == slow


def test_auto_configurations_are_told_apart(ops, emulated_route):
    """A decision holds for its configuration only: whether autograd records the
    call, the training flag, the sizes and the precision make others."""
    torch.ops.seqpack._cuda_layers("auto")
    torch.ops.seqpack._cuda_choice_times([0.001, 0.003])  # seqpack's the faster; decisions forgotten
    rnn = _make("GRU", 3, 4, 1, False, True, 0, 2)
    packed = torch.nn.utils.rnn.pack_sequence([torch.randn(n, 3) for n in (3, 2)])
    weights = [w.detach() for w in rnn._flat_weights]

    def run(w=weights, train=False, data=packed.data, hidden=4):
        ops.rnn(data, packed.batch_sizes, None, None, None, None, w, "GRU", hidden, 1, True, False, 0, 0.0,
                train, None, "fp32")
        return torch.ops.seqpack._cuda_last_choice()[0]

    assert run() == "seqpack"
    torch.ops.seqpack._cuda_choice_times([0.003, 0.001], False)  # torch's the faster from now on
    assert run() == "seqpack"  # decided before
    assert run(w=[w.clone().requires_grad_() for w in weights]) == "torch"  # autograd records it
    assert run(train=True) == "torch"
    other = _make("GRU", 3, 5, 1, False, True, 0, 2)
    assert run(w=[w.detach() for w in other._flat_weights], hidden=5) == "torch"
    assert run() == "seqpack"


def test_auto_does_not_choose_a_side_that_fails(ops, emulated_route, monkeypatch):
    """torch's CPU recurrence has no float16 kernel here, seqpack's emulated one
    has (every product in the library: torch's CPU products have no float16
    either): auto runs seqpack's though its injected time is the slower, and
    says why."""
    monkeypatch.setenv("SEQPACK_CUDA_PRODUCTS", "library")
    torch.ops.seqpack._cuda_layers("auto")
    torch.ops.seqpack._cuda_choice_times([0.003, 0.001])
    rnn = _make("GRU", 3, 4, 1, False, True, 0, 2)
    packed = torch.nn.utils.rnn.pack_sequence([torch.randn(n, 3) for n in (3, 2)])
    weights = [w.detach().half() for w in rnn._flat_weights]
    try:
        torch._VF.gru(packed.data.half(), packed.batch_sizes, torch.zeros(1, 2, 4).half(), weights, True, 1, 0.0,
                      False, False)
        pytest.skip("this torch has a float16 GRU on the CPU")
    except RuntimeError:
        pass
    y, _, _ = ops.rnn(packed.data.half(), packed.batch_sizes, None, None, None, None, weights, "GRU", 4, 1, True,
                      False, 0, 0.0, False, None, "fp32")
    assert y.dtype == torch.float16
    impl, why = torch.ops.seqpack._cuda_last_choice()
    assert impl == "seqpack" and "torch failed: " in why and "seqpack 3000 us" in why, why


def test_torch_side_keeps_the_operators_semantics(ops, emulated_route):
    """SEQPACK_CUDA_LAYERS=torch: the operator runs torch's recurrent operators
    with the same semantics (the caller's order, zero-length sequences, the
    seeded mask): torch's values, and gradients through them."""
    torch.ops.seqpack._cuda_layers("torch")
    rnn = _make("LSTM", 3, 5, 2, True, True, 0, 12)
    args = _packed_args([4, 0, 3, 1])
    leaves = [t.clone().requires_grad_() for t in (args[0], args[5], args[6])]
    call = (leaves[0], args[1], args[2], args[3], leaves[1], leaves[2], rnn._flat_weights, "LSTM", 5, 2, True,
            True, 0, 0.3, True, 11, "fp32")
    got = ops.rnn(*call)
    assert torch.ops.seqpack._cuda_last_choice() == ("torch", "SEQPACK_CUDA_LAYERS=torch")
    torch.ops.seqpack._cuda_layers("seqpack")
    want = ops.rnn(*call)
    n = rnn_reduction_length(3, 5, 2, True, 8, 0)
    for name, g, w in zip(("output", "h_n", "c_n"), got, want):
        assert_fp_close(g.detach(), w.detach(), n, what=name)
    grads = torch.autograd.grad(sum(t.sum() for t in got), leaves)
    rgrads = torch.autograd.grad(sum(t.sum() for t in want), leaves)
    for name, g, r in zip(("data", "h0", "c0"), grads, rgrads):
        assert_fp_close(g, r, n, what="d" + name)


def test_cuda_layers_is_checked(ops):
    before = torch.ops.seqpack._cuda_layers()
    for mode in ("auto", "seqpack", "torch", before):
        assert torch.ops.seqpack._cuda_layers(mode) == mode
    with pytest.raises(ValueError, match="mode = 'gpu': use 'auto'"):
        torch.ops.seqpack._cuda_layers("gpu")
    assert torch.ops.seqpack._cuda_layers("") == torch.ops.seqpack._cuda_layers()
    with pytest.raises(ValueError, match="seconds has 1 values"):
        torch.ops.seqpack._cuda_choice_times([1.0])


@pytest.mark.parametrize("value,mode", [("", "auto"), ("torch", "torch"), ("gpu", None)])
def test_cuda_layers_reads_the_environment(value, mode):
    """SEQPACK_CUDA_LAYERS, read once by the operators (a fresh process): unset or
    empty is auto; a value that means nothing is refused by name; =torch leaves
    the layers on torch's kernels without looking for the library."""
    code = ("import torch, seqpack.torch\n"
            "try:\n"
            "    print(torch.ops.seqpack._cuda_layers(), seqpack.torch._cuda_backend())\n"
            "except ValueError as e:\n"
            "    print(e)\n")
    env = dict(os.environ, SEQPACK_CUDA_LAYERS=value)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    if mode is None:
        assert "SEQPACK_CUDA_LAYERS = 'gpu': use 'auto'" in out.stdout, out.stdout
    else:
        # No GPU here: the kernels cannot run, whatever library is found.
        expected = f"{mode} None" if not torch.cuda.is_available() or mode == "torch" else mode
        assert out.stdout.strip().startswith(expected), out.stdout


def test_layers_refuse_a_named_library_that_cannot_load(tmp_path):
    """The layers on CUDA tensors do not fall back to torch's kernels in silence
    when SEQPACK_CUDA_LIBRARY names what cannot load (issue 41, item 11), unless
    torch's kernels are asked for."""
    code = ("import seqpack.torch\n"
            "try:\n"
            "    print(seqpack.torch._cuda_backend())\n"
            "except RuntimeError as e:\n"
            "    print(e)\n")
    for layers, expected in (("", "seqpack CUDA: SEQPACK_CUDA_LIBRARY="), ("torch", "None")):
        env = dict(os.environ, SEQPACK_CUDA_LIBRARY=str(tmp_path / "nope.so"), SEQPACK_CUDA_LAYERS=layers)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(expected), out.stdout
    # Found, but no kernels to run it: this libseqpack_torch has no CUDA kernels (or no GPU).
    if not torch._C._dispatch_has_kernel_for_dispatch_key("seqpack::rnn", "CUDA"):
        assert seqpack.torch.register_cuda_kernels() is False
