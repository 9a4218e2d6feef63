"""seqpack's CUDA RNN kernels (the operators' C++ CUDA kernels through
bench/cuda_operators.py's rnn_packed) against PyTorch's own GPU results:
torch._VF's packed overload (cuDNN) and torch.nn's LSTM, GRU and RNN modules on
a PackedSequence.

Skipped, with the reason, unless torch sees a CUDA GPU and the kernels run the
library found (cuda_operators.available(): it builds the kernels against the
machine's torch where libseqpack_torch has none). The module is loaded by file
path, not through the seqpack package: on the GPU machine seqpack/__init__.py
cannot import (it needs the CPU extension, which is not built there).

    python3 python/tests/test_cuda_gpu.py                 # without pytest
    python3 python/tests/test_cuda_gpu.py -k lstm --json report.json
    python3 -m pytest -q python/tests/test_cuda_gpu.py    # --noconftest without the CPU build

The runner's --require fails instead of skipping (scripts/device_check.sh on a
GPU machine), --budget stops starting tests after so many seconds, and
--test-timeout ends a run whose test hangs (the --json file names the test).

Bounds (docs/gpu.md):
- float32, TF32 off on both sides: values of magnitude <= 1 within 1e-5 of
  torch's (the issue's target); larger values and every gradient within the
  larger of 1e-5 * max|expected| and tolerance.py's bound (docs/testing.md).
- bfloat16 and float16 against torch in float32 on the same rounded inputs and
  weights: ||seqpack - ref|| / ||ref|| within HALF_BOUNDS (RNN_RELU's gradients:
  RELU_GRADIENT_BOUNDS); torch's own error in that dtype is printed beside it.
- Dropout: the values cannot match torch's random numbers; a relu stack that
  copies its input makes the mask visible (as test_rnn_dropout.py does on the
  CPU) so that the keep rate, the 1/(1-p) scale and the gradient through the
  mask are checked exactly.

Environment: SEQPACK_TEST_SEED replays a run (each failure names its seed);
SEQPACK_CUDA_GLUE=/path/glue.py loads another module with rnn_packed. For the self-test
of this file on a machine without a GPU only: SEQPACK_CUDA_TEST_DEVICE=cpu runs
every test on the CPU with a fake glue (one that calls torch._VF) named by
SEQPACK_CUDA_GLUE; it checks the tests' own code paths, nothing of seqpack."""
import argparse
import contextlib
import copy
import faulthandler
import importlib.util
import json
import math
import os
import sys
import time
import traceback

import torch
from torch.nn.utils.rnn import PackedSequence, pack_sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tolerance import fp_bound, rnn_reduction_length  # noqa: E402

try:
    import pytest
except ImportError:  # the GPU machine may have no pytest: main() runs the tests
    pytest = None

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEED = int(os.environ.get("SEQPACK_TEST_SEED", 1234))
SELF_TEST = os.environ.get("SEQPACK_CUDA_TEST_DEVICE") == "cpu"
DEVICE = torch.device("cpu" if SELF_TEST else "cuda")

FP32_TARGET = 1e-5
# ||seqpack - ref|| / ||ref|| against torch fp32 on the same rounded inputs and
# weights: (outputs and states, gradients). Five times what a 2-layer LSTM with
# fp32 products and cell state and h rounded to the dtype at every step gives in
# an emulation on the CPU (bf16 about 2e-3, fp16 about 2.5e-4 over 46 steps).
HALF_BOUNDS = {torch.bfloat16: (1e-2, 2e-2), torch.float16: (1.5e-3, 3e-3)}
# RNN_RELU's gradients: relu's derivative is a step, so rounding a pre-activation
# near 0 flips that unit's gradient on or off, and the change runs back through
# every earlier step. seqpack's library emulated on the CPU measured up to 4.1%
# in bf16 on test_half_precision's case, torch's own CPU bf16 5.7%; fp16 rounds
# 8 times finer.
RELU_GRADIENT_BOUNDS = {torch.bfloat16: 8e-2, torch.float16: 2e-2}
MODES = ("LSTM", "GRU", "RNN_TANH", "RNN_RELU")

# Figures the plain runner prints at the end (and writes with --json).
FP32_WORST = []   # (what, largest |difference|, bound)
HALF_ERRORS = []  # (what, dtype, seqpack relative error, torch's, bound)


def _load_glue():
    """(glue module, '') or (None, why the tests are skipped)."""
    if not SELF_TEST and not torch.cuda.is_available():
        return None, "no CUDA GPU (torch.cuda.is_available() is False)"
    path = os.environ.get("SEQPACK_CUDA_GLUE") or os.path.join(ROOT, "bench", "cuda_operators.py")
    if not os.path.exists(path):
        return None, f"no CUDA glue at {path}"
    try:
        spec = importlib.util.spec_from_file_location("seqpack_cuda_glue", path)
        glue = importlib.util.module_from_spec(spec)
        # Registered under its name, as an import would: torch.compile's tracing looks
        # functions' modules up in sys.modules.
        sys.modules[spec.name] = glue
        spec.loader.exec_module(glue)
    except Exception as e:  # a broken glue is reported as the reason, not a crash
        return None, f"the CUDA glue {path} failed to load: {type(e).__name__}: {e}"
    if not glue.available():
        return None, f"seqpack's CUDA library is unavailable: {glue.why_unavailable()}"
    return glue, ""


GLUE, SKIP_REASON = _load_glue()
if GLUE is not None and not SELF_TEST:
    # fp32 means fp32: torch's reference and seqpack's kernels both read these flags.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

if pytest is not None:
    pytestmark = pytest.mark.skipif(GLUE is None, reason=SKIP_REASON)


class SkipTest(Exception):
    """A test that cannot run here (the plain runner counts it as skipped)."""


SKIPS = (SkipTest,) + ((pytest.skip.Exception,) if pytest is not None else ())


def skip(reason):
    if pytest is not None:
        pytest.skip(reason)
    raise SkipTest(reason)


def cases(names, values):
    """pytest.mark.parametrize where pytest is, and the same cases for main()."""
    values = list(values)

    def wrap(f):
        f.cases = (names.split(","), values)
        if pytest is not None:
            return pytest.mark.parametrize(names, values)(f)
        return f
    return wrap


# ---------------------------------------------------------------- building cases

def make_module(mode, input_size, hidden_size, num_layers=1, bidirectional=False, bias=True,
                proj_size=0, dropout=0.0, seed=SEED):
    """torch.nn's module of `mode` on DEVICE in float32, weights drawn from `seed`."""
    torch.manual_seed(seed)
    kw = dict(num_layers=num_layers, bidirectional=bidirectional, bias=bias, dropout=dropout)
    if mode == "LSTM":
        m = torch.nn.LSTM(input_size, hidden_size, proj_size=proj_size, **kw)
    elif mode == "GRU":
        m = torch.nn.GRU(input_size, hidden_size, **kw)
    else:
        m = torch.nn.RNN(input_size, hidden_size, nonlinearity=mode[4:].lower(), **kw)
    return m.to(DEVICE)


def make_packed(lengths, input_size, seed, dtype=torch.float32):
    """A PackedSequence of random sequences of `lengths` (any order) on DEVICE whose
    data is a leaf that requires grad."""
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.rand(n, input_size, generator=g) * 2 - 1 for n in lengths]
    p = pack_sequence(seqs, enforce_sorted=False)
    data = p.data.to(DEVICE, dtype).requires_grad_()
    return PackedSequence(data, p.batch_sizes, p.sorted_indices.to(DEVICE),
                          p.unsorted_indices.to(DEVICE))


def state_sizes(m):
    """(h size, c size or None) of module m's states."""
    h_out = m.proj_size if getattr(m, "proj_size", 0) else m.hidden_size
    return h_out, (m.hidden_size if m.mode == "LSTM" else None)


def make_hx(m, batch, seed, dtype=torch.float32):
    """Random initial states of m for `batch` sequences (batch order), leaves that
    require grad: h0, or (h0, c0) for an LSTM."""
    g = torch.Generator().manual_seed(seed + 1)
    rows = m.num_layers * (2 if m.bidirectional else 1)
    h_size, c_size = state_sizes(m)

    def leaf(size):
        return (torch.rand(rows, batch, size, generator=g) - 0.5).to(DEVICE, dtype) \
            .requires_grad_()
    return (leaf(h_size), leaf(c_size)) if c_size else leaf(h_size)


def seqpack_forward(m, packed, hx=None):
    """What torch.nn.RNNBase.forward does with a PackedSequence, with seqpack's
    rnn_packed in place of torch._VF: zero states when hx is None, states put
    into the packed (sorted) order and back."""
    batch = int(packed.batch_sizes[0])
    rows = m.num_layers * (2 if m.bidirectional else 1)
    h_size, c_size = state_sizes(m)
    dtype, dev = packed.data.dtype, packed.data.device
    if hx is None:
        h0 = torch.zeros(rows, batch, h_size, dtype=dtype, device=dev)
        hx = (h0, torch.zeros(rows, batch, c_size, dtype=dtype, device=dev)) if c_size else h0
    perm = packed.sorted_indices
    if perm is not None:
        hx = tuple(h.index_select(1, perm) for h in hx) if c_size else hx.index_select(1, perm)
    res = GLUE.rnn_packed(m.mode, packed.data, packed.batch_sizes, hx, m._flat_weights, m.bias,
                          m.num_layers, float(m.dropout), m.training, m.bidirectional,
                          proj_size=getattr(m, "proj_size", 0))
    out = PackedSequence(res[0], packed.batch_sizes, packed.sorted_indices,
                         packed.unsorted_indices)
    inv = packed.unsorted_indices
    states = [s.index_select(1, inv) if inv is not None else s for s in res[1:]]
    return out, (tuple(states) if c_size else states[0])


def flat(out, hidden):
    """[output rows, h_n(, c_n)] of a module's result."""
    return [out.data] + (list(hidden) if isinstance(hidden, tuple) else [hidden])


def grads(tensors, inputs, seed):
    """Gradients of sum_k <tensors[k], R_k> with respect to `inputs`, R_k random
    (fixed by seed): every output and state gets an upstream gradient."""
    g = torch.Generator().manual_seed(seed + 7)
    loss = sum((t.float() * (torch.rand(t.shape, generator=g) - 0.5).to(t.device)).sum()
               for t in tensors)
    return torch.autograd.grad(loss, inputs, allow_unused=True, retain_graph=True)


# ---------------------------------------------------------------- comparisons

def assert_fp32_close(actual, expected, n, what, gradient=False):
    """seqpack's fp32 result against torch's, at the bounds in the module's docstring.
    A gradient that autograd leaves out (None) stands for zeros."""
    if actual is None or expected is None:
        other = expected if actual is None else actual
        assert other is None or not other.detach().any(), \
            f"{what}: {'seqpack' if actual is None else 'torch'} has no gradient, the other " \
            f"a nonzero one"
        return
    assert tuple(actual.shape) == tuple(expected.shape), \
        f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    a = actual.detach().double().cpu()
    e = expected.detach().double().cpu()
    assert torch.isfinite(e).all(), f"{what}: torch's result is not finite (seed {SEED})"
    scale = float(e.abs().max()) if e.numel() else 0.0
    if scale <= 1.0 and not gradient:
        bound = FP32_TARGET
    else:
        bound = max(FP32_TARGET * max(scale, 1.0), fp_bound(scale, n, "float32"))
    diff = (a - e).abs()
    diff[torch.isnan(a)] = math.inf
    worst = float(diff.max()) if diff.numel() else 0.0
    FP32_WORST.append((what, worst, bound))
    if worst > bound:
        i = tuple(int(k) for k in torch.nonzero(diff > bound)[0])
        raise AssertionError(
            f"{what}: {int((diff > bound).sum())} of {diff.numel()} elements differ; first at "
            f"{i}: seqpack {float(a[i])!r} vs torch {float(e[i])!r}, |difference| "
            f"{float(diff[i]):.3g} > bound {bound:.3g} (largest {worst:.3g}, scale {scale:.3g}, "
            f"n {n}, seed {SEED})")


def relative_error(actual, ref):
    a, r = actual.detach().double().cpu(), ref.detach().double().cpu()
    if not torch.isfinite(a).all():
        return math.inf
    return float((a - r).norm() / max(float(r.norm()), 1e-30))


def compare_module(m, lengths, with_hx, seed, check_grads=True, packed=None):
    """seqpack against torch.nn on module m over a batch of `lengths`: outputs,
    states and, with check_grads, the gradients of data, hx and every weight."""
    packed = packed if packed is not None else make_packed(lengths, m.input_size, seed)
    hx = make_hx(m, len(lengths), seed) if with_hx else None
    ours = flat(*seqpack_forward(m, packed, hx))
    theirs = flat(*m(packed, hx))
    steps = max(lengths)
    n_out = rnn_reduction_length(m.input_size, m.hidden_size, m.num_layers, m.bidirectional,
                                 steps, getattr(m, "proj_size", 0))
    names = ["output", "h_n", "c_n"]
    tag = f"{m.mode} lengths {lengths if len(lengths) <= 8 else f'{len(lengths)} seqs'}"
    for k, (a, e) in enumerate(zip(ours, theirs)):
        assert_fp32_close(a, e, n_out, f"{tag}: {names[k]}")
    if not check_grads:
        return
    inputs = [packed.data] + (list(hx) if isinstance(hx, tuple) else [hx] if hx is not None
                              else []) + list(m._flat_weights)
    input_names = ["d data"] + (["d h0", "d c0"][:len(inputs) - 1 - len(m._flat_weights)]) \
        + [f"d {w}" for w in m._flat_weights_names]
    n_grad = rnn_reduction_length(m.input_size, m.hidden_size, m.num_layers, m.bidirectional,
                                  sum(lengths), getattr(m, "proj_size", 0))
    g_ours = grads(ours, inputs, seed)
    g_theirs = grads(theirs, inputs, seed)
    for name, a, e in zip(input_names, g_ours, g_theirs):
        assert_fp32_close(a, e, n_grad, f"{tag}: {name}", gradient=True)


LENGTHS = [7, 3, 12, 1, 5, 12, 9]


# ---------------------------------------------------------------- the tests

@cases("mode,num_layers,bidirectional,with_hx,bias",
       [(mode, layers, bidir, with_hx, True) for mode in MODES for layers in (1, 2)
        for bidir in (False, True) for with_hx in (False, True)]
       + [(mode, 2, True, True, False) for mode in MODES])
def test_module_fp32(mode, num_layers, bidirectional, with_hx, bias):
    """Every cell, 1-2 layers, one or two directions, h0/c0 given or None, with and
    without biases: outputs, states and gradients against torch.nn on the GPU."""
    m = make_module(mode, 10, 16, num_layers, bidirectional, bias)
    compare_module(m, LENGTHS, with_hx, SEED)


@contextlib.contextmanager
def _environment(name, value):
    """The variable set to value, then as before; the operators install the
    library's policy from the SEQPACK_CUDA_* variables each time (install_policy:
    the library reads none itself; SEQPACK_CUDA_PRODUCTS they read at every call)."""
    old = os.environ.get(name)
    os.environ[name] = value
    _install_policy()
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old
        _install_policy()


def _install_policy():
    if GLUE is not None and hasattr(GLUE, "install_policy"):  # a fake glue (the self-test) may have none
        GLUE.install_policy()


@cases("mode", MODES)
def test_library_products_fp32(mode):
    """SEQPACK_CUDA_PRODUCTS=library (every product in the library's own GEMM, the
    path of its C users) instead of torch's products: the same comparison."""
    with _environment("SEQPACK_CUDA_PRODUCTS", "library"):
        m = make_module(mode, 10, 16, 2, True, True)
        compare_module(m, LENGTHS, True, SEED + 7)


@cases("mode,hidden_size", [(mode, h) for mode in MODES for h in (16, 33)])
def test_cluster_kernel_fp32(mode, hidden_size):
    """SEQPACK_CUDA_KERNEL=cluster (the forward recurrence of each layer and
    direction on one thread-block cluster, h all-gathered through distributed
    shared memory): the same comparison. Needs sm_90 (elsewhere it falls back
    to the per-step kernels, which the other tests check)."""
    if not SELF_TEST and torch.cuda.get_device_capability(DEVICE) < (9, 0):
        skip("thread-block clusters need sm_90")
    with _environment("SEQPACK_CUDA_KERNEL", "cluster"):
        m = make_module(mode, 10, hidden_size, 2, True, True)
        compare_module(m, LENGTHS, True, SEED + 8)


@contextlib.contextmanager
def _matmul_tf32():
    """torch.backends.cuda.matmul.allow_tf32 on (what seqpack's layers pass to
    the library as allow_tf32), then as before."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


@cases("mode", MODES)
def test_cluster_kernel_3xtf32(mode):
    """SEQPACK_CUDA_KERNEL=cluster in float32 with TF32 allowed and H = 32 (a
    multiple of 16): the step products on tensor cores as 3xTF32, forward and
    backward, within float32's bound of torch (cuDNN with TF32 off). Every
    product in the library (SEQPACK_CUDA_PRODUCTS=library): torch's own input
    products would take TF32 themselves. sm_90."""
    if not SELF_TEST and torch.cuda.get_device_capability(DEVICE) < (9, 0):
        skip("thread-block clusters need sm_90")
    with _environment("SEQPACK_CUDA_KERNEL", "cluster"), \
            _environment("SEQPACK_CUDA_PRODUCTS", "library"), _matmul_tf32():
        m = make_module(mode, 10, 32, 2, True, True)
        compare_module(m, LENGTHS, True, SEED + 9)


@cases("num_layers,bidirectional,proj_size,with_hx",
       [(1, False, 5, True), (2, True, 7, False), (2, True, 7, True), (1, True, 1, True)])
def test_lstm_proj_fp32(num_layers, bidirectional, proj_size, with_hx):
    m = make_module("LSTM", 9, 20, num_layers, bidirectional, proj_size=proj_size)
    compare_module(m, LENGTHS, with_hx, SEED + 1)


@cases("kernel", ["cluster", "persistent"])
def test_one_launch_lstm_proj_fp32(kernel):
    """SEQPACK_CUDA_KERNEL=cluster (sm_90) or persistent (a cooperative grid)
    with a projection: the one-launch kernels that share out W_hh's rows by
    hidden unit and W_hr's by output column, h and m through global memory."""
    if kernel == "cluster" and not SELF_TEST and torch.cuda.get_device_capability(DEVICE) < (9, 0):
        skip("thread-block clusters need sm_90")
    with _environment("SEQPACK_CUDA_KERNEL", kernel):
        m = make_module("LSTM", 9, 20, 2, True, proj_size=7)
        compare_module(m, LENGTHS, True, SEED + 11)


@cases("mode,hidden_size", [(mode, h) for mode in MODES for h in (1, 3, 17, 33, 129)])
def test_odd_hidden_sizes(mode, hidden_size):
    m = make_module(mode, 11, hidden_size, 1, True)
    compare_module(m, LENGTHS, True, SEED + hidden_size)


@cases("mode", MODES)
def test_batch_one(mode):
    m = make_module(mode, 6, 17, 2, True)
    compare_module(m, [13], True, SEED + 2)


@cases("mode", MODES)
def test_long_sequence(mode):
    """T = 500: batch 1, and one long sequence among short ones."""
    m = make_module(mode, 8, 33, 1, False)
    compare_module(m, [500], True, SEED + 3)
    compare_module(m, [500, 20, 3, 499, 1], False, SEED + 4)


@cases("mode", MODES)
def test_equal_lengths_and_length_one(mode):
    m = make_module(mode, 5, 12, 2, True)
    compare_module(m, [6, 6, 6, 6], True, SEED + 5)
    compare_module(m, [1, 1, 1], True, SEED + 6)


@cases("mode", MODES)
def test_vf_packed_overload(mode):
    """rnn_packed called exactly as torch._VF's packed overload, in eval mode (no
    autograd), against torch._VF itself on the same arguments."""
    m = make_module(mode, 7, 24, 2, True).eval()
    packed = make_packed(LENGTHS, 7, SEED + 8)
    hx = make_hx(m, len(LENGTHS), SEED + 8)
    fn = {"LSTM": torch._VF.lstm, "GRU": torch._VF.gru, "RNN_TANH": torch._VF.rnn_tanh,
          "RNN_RELU": torch._VF.rnn_relu}[mode]
    args = (packed.data.detach(), packed.batch_sizes,
            tuple(h.detach() for h in hx) if mode == "LSTM" else hx.detach(), m._flat_weights,
            True, 2, 0.0, False, True)
    with torch.no_grad():
        ours = GLUE.rnn_packed(mode, *args)
        theirs = fn(*args)
    assert isinstance(ours, tuple) and len(ours) == (3 if mode == "LSTM" else 2), \
        f"{mode}: rnn_packed returned {type(ours).__name__} of {len(ours)}"
    n = rnn_reduction_length(7, 24, 2, True, max(LENGTHS))
    for name, a, e in zip(["output", "h_n", "c_n"], ours, theirs):
        assert_fp32_close(a, e, n, f"{mode} _VF: {name}")


@cases("mode", MODES)
def test_zero_length_sequences(mode):
    """B > batch_sizes[0] (seqpack's extension): the columns past batch_sizes[0]
    are zero-length sequences whose h_n/c_n are their h0/c0, and whose h0/c0
    gradients are the upstream gradients of h_n/c_n."""
    m = make_module(mode, 6, 10, 2, True)
    lengths = [5, 4, 2]
    extra = 3
    packed = make_packed(lengths, 6, SEED + 9)
    hx = make_hx(m, len(lengths) + extra, SEED + 9)
    states = list(hx) if mode == "LSTM" else [hx]
    # The sorted order of the real sequences, then the zero-length ones.
    order = torch.cat([packed.sorted_indices.cpu(), torch.arange(len(lengths),
                                                                 len(lengths) + extra)])
    sorted_states = [s.index_select(1, order.to(DEVICE)) for s in states]
    b0 = int(packed.batch_sizes[0])
    ours = GLUE.rnn_packed(mode, packed.data, packed.batch_sizes,
                           tuple(sorted_states) if mode == "LSTM" else sorted_states[0],
                           m._flat_weights, True, 2, 0.0, True, True)
    fn = {"LSTM": torch._VF.lstm, "GRU": torch._VF.gru, "RNN_TANH": torch._VF.rnn_tanh,
          "RNN_RELU": torch._VF.rnn_relu}[mode]
    real = [s[:, :b0].contiguous() for s in sorted_states]  # cuDNN wants hx dense
    theirs = fn(packed.data, packed.batch_sizes, tuple(real) if mode == "LSTM" else real[0],
                m._flat_weights, True, 2, 0.0, True, True)
    theirs = [theirs[0]] + [torch.cat([t, s[:, b0:]], 1) for t, s in zip(theirs[1:],
                                                                          sorted_states)]
    n = rnn_reduction_length(6, 10, 2, True, sum(lengths))
    for name, a, e in zip(["output", "h_n", "c_n"], ours, theirs):
        assert_fp32_close(a, e, n, f"{mode} zero-length: {name}")
    for name, a, e in zip(["h_n", "c_n"], ours[1:], sorted_states):
        assert torch.equal(a[:, b0:].detach(), e[:, b0:].detach()), \
            f"{mode} zero-length: {name} of the empty sequences is not their initial state"
    inputs = [packed.data] + states + list(m._flat_weights)
    names = ["d data", "d h0", "d c0"][:1 + len(states)] + [f"d {w}" for w in
                                                            m._flat_weights_names]
    for name, a, e in zip(names, grads(ours, inputs, SEED), grads(theirs, inputs, SEED)):
        assert_fp32_close(a, e, n, f"{mode} zero-length: {name}", gradient=True)


@cases("mode,dtype",
       [(mode, dt) for mode in MODES for dt in (["bfloat16"] if SELF_TEST
                                                else ["bfloat16", "float16"])])
def test_half_precision(mode, dtype):
    """bf16/fp16 outputs, states and gradients against torch in fp32 on the same
    rounded inputs and weights (HALF_BOUNDS), torch's own error in the same dtype
    recorded beside seqpack's. In the CPU self-test the fake glue is torch's CPU
    bf16, which rounds more often than HALF_BOUNDS allow: there twice torch's
    error passes."""
    check_half(mode, dtype, 40, 6 if mode == "LSTM" else 0)


@cases("mode,dtype", [(mode, dt) for mode in MODES for dt in ("bfloat16", "float16")
                      if not SELF_TEST or dt == "bfloat16"])
def test_cluster_kernel_half(mode, dtype):
    """SEQPACK_CUDA_KERNEL=cluster in bf16/fp16 with H = 48 (a multiple of 16: the
    forward's step product on tensor cores), as test_half_precision checks. sm_90."""
    if not SELF_TEST and torch.cuda.get_device_capability(DEVICE) < (9, 0):
        skip("thread-block clusters need sm_90")
    with _environment("SEQPACK_CUDA_KERNEL", "cluster"):
        check_half(mode, dtype, 48, 0)


def check_half(mode, dtype, hidden, proj):
    """test_half_precision's comparison for a 2-layer bidirectional layer of `hidden` units."""
    dt = getattr(torch, dtype)
    lengths = [30, 17, 46, 5, 22, 1, 40]
    base = make_module(mode, 24, hidden, 2, True, proj_size=proj, seed=SEED + 10)
    m_half = copy.deepcopy(base).to(dt)
    m_ref = copy.deepcopy(m_half).float()  # the rounded weights, computed in fp32
    packed = make_packed(lengths, 24, SEED + 10, dt)
    ref_packed = PackedSequence(packed.data.detach().float().requires_grad_(),
                                packed.batch_sizes, packed.sorted_indices,
                                packed.unsorted_indices)
    hx = make_hx(m_half, len(lengths), SEED + 10, dt)
    hx_ref = tuple(h.detach().float().requires_grad_() for h in hx) if mode == "LSTM" \
        else hx.detach().float().requires_grad_()

    def inputs(m, p, h):
        return [p.data] + (list(h) if isinstance(h, tuple) else [h]) + list(m._flat_weights)

    ours = flat(*seqpack_forward(m_half, packed, hx))
    ref = flat(*m_ref(ref_packed, hx_ref))
    for t in ours:
        assert t.dtype == dt, f"{mode}: seqpack returned {t.dtype} for {dtype} input"
    g_ours = grads(ours, inputs(m_half, packed, hx), SEED)
    g_ref = grads(ref, inputs(m_ref, ref_packed, hx_ref), SEED)
    try:  # torch's own path in this dtype, for comparison
        theirs = flat(*m_half(packed, hx))
        g_theirs = grads(theirs, inputs(m_half, packed, hx), SEED)
    except RuntimeError as e:
        print(f"  torch has no {dtype} path here: {e}".splitlines()[0])
        theirs = g_theirs = [None] * 100
    value_bound, grad_bound = HALF_BOUNDS[dt]
    names = ["output", "h_n", "c_n"][:len(ours)] \
        + ["d data", "d h0", "d c0"][:len(ours)] + [f"d {w}" for w in m_half._flat_weights_names]
    failures = []
    for name, a, r, t in zip(names, ours + list(g_ours), ref + list(g_ref),
                             theirs[:len(ours)] + list(g_theirs)):
        bound = grad_bound if name.startswith("d ") else value_bound
        if mode == "RNN_RELU" and name.startswith("d "):
            bound = RELU_GRADIENT_BOUNDS[dt]
        err = relative_error(a, r)
        torch_err = relative_error(t, r) if t is not None else None
        allowed = bound
        if SELF_TEST and torch_err is not None and math.isfinite(torch_err):
            allowed = max(bound, 2 * torch_err)
        HALF_ERRORS.append((f"{mode} {name}", dtype, err, torch_err, allowed))
        if not err <= allowed:
            failures.append(f"{name}: relative error {err:.3g} > {allowed:.3g} (torch {dtype}: "
                            f"{torch_err if torch_err is None else f'{torch_err:.3g}'})")
    assert not failures, f"{mode} {dtype}, seed {SEED}: " + "; ".join(failures)


# ---------------------------------------------------------------- dropout

@cases("mode", MODES)
def test_dropout_zero_is_eval(mode):
    """dropout = 0 in training mode computes what eval mode computes."""
    m = make_module(mode, 8, 16, 2, True)
    packed = make_packed(LENGTHS, 8, SEED + 11)
    hx = make_hx(m, len(LENGTHS), SEED + 11)
    train = flat(*seqpack_forward(m.train(), packed, hx))
    with torch.no_grad():
        evaluated = flat(*seqpack_forward(m.eval(), packed, hx))
    for name, a, e in zip(["output", "h_n", "c_n"], train, evaluated):
        diff = float((a.detach().double() - e.double()).abs().max())
        assert diff <= 1e-6, \
            f"{mode}: {name} in training (dropout 0) differs from eval by {diff:.3g}"


def copy_stack(bidirectional, hidden, p):
    """A 2-layer relu RNN that copies its input (docstring of test_rnn_dropout.py):
    no biases, W_hh = 0, W_ih of layer 0 the identity, layer 1 reading its own
    direction's half. For x > 0 layer 1's output is mask * x exactly."""
    m = make_module("RNN_RELU", hidden, hidden, 2, bidirectional, bias=False, dropout=p)
    d = 2 if bidirectional else 1
    eye = torch.eye(hidden, device=DEVICE)
    with torch.no_grad():
        for sfx in ["", "_reverse"][:d]:
            getattr(m, "weight_ih_l0" + sfx).copy_(eye)
            getattr(m, "weight_hh_l0" + sfx).zero_()
            getattr(m, "weight_hh_l1" + sfx).zero_()
            w1 = torch.zeros(hidden, d * hidden, device=DEVICE)
            off = hidden if sfx else 0
            w1[:, off:off + hidden] = eye
            getattr(m, "weight_ih_l1" + sfx).copy_(w1)
    return m


@cases("bidirectional,p", [(False, 0.3), (True, 0.5)])
def test_dropout_mask(bidirectional, p):
    """dropout > 0 between layers, training mode: every element of layer 1's output
    is 0 or x / (1 - p); the keep rate is 1 - p within 9 standard deviations; the
    gradient of the input is the upstream gradient through that mask; eval mode
    (and layer 0's states) are untouched; two calls draw different masks."""
    hidden, lengths = 40, [30] * 20
    m = copy_stack(bidirectional, hidden, p).train()
    g = torch.Generator().manual_seed(SEED + 12)
    x = (torch.rand(sum(lengths), hidden, generator=g) + 0.5).to(DEVICE).requires_grad_()
    batch_sizes = torch.full((30,), 20, dtype=torch.int64)
    packed = PackedSequence(x, batch_sizes, None, None)
    out, h_n = seqpack_forward(m, packed)
    y = out.data
    assert torch.isfinite(y).all(), "dropout output is not finite"
    d = 2 if bidirectional else 1
    xs = x.detach().repeat(1, d)
    kept = y.detach() != 0
    scale = 1.0 / (1.0 - p)
    bad = (y.detach()[kept] - xs[kept] * scale).abs() > 1e-5 * scale * 2
    assert not bad.any(), f"{int(bad.sum())} kept elements are not x / (1 - p) (seed {SEED})"
    rate = float(kept.double().mean())
    n = kept.numel()
    sd = math.sqrt(p * (1 - p) / n)
    assert abs(rate - (1 - p)) <= max(9 * sd, 0.01), \
        f"keep rate {rate:.4f} over {n} elements, expected {1 - p} (seed {SEED})"
    # Layer 0's final states do not go through the mask.
    with torch.no_grad():
        _, h_eval = seqpack_forward(m.eval(), packed)
    assert_fp32_close(h_n[:d], h_eval[:d], 40, "dropout: layer 0's h_n")
    m.train()
    upstream = torch.rand(y.shape, generator=g).to(DEVICE)
    (dx,) = torch.autograd.grad((y * upstream).sum(), [x])
    expected = (upstream * kept * scale).reshape(y.shape[0], d, hidden).sum(1)
    assert_fp32_close(dx, expected, 4, "dropout: d data through the mask", gradient=True)
    assert torch.isfinite(dx).all()
    y2 = seqpack_forward(m, packed)[0].data
    assert not torch.equal(y2 != 0, kept), "two training calls drew the same dropout mask"


@cases("mode", MODES)
def test_dropout_general_cells(mode):
    """Every cell with dropout 0.4 in training: finite outputs and gradients, an
    output unlike eval's, and layer 0's states and the gradients of a loss on
    them equal to eval's (the mask sits between the layers only)."""
    m = make_module(mode, 8, 16, 2, True, dropout=0.4)
    packed = make_packed(LENGTHS, 8, SEED + 13)
    hx = make_hx(m, len(LENGTHS), SEED + 13)
    out, hidden = seqpack_forward(m.train(), packed, hx)
    res = flat(out, hidden)
    inputs = [packed.data] + (list(hx) if mode == "LSTM" else [hx]) + list(m._flat_weights)
    all_grads = grads(res, inputs, SEED)
    for t in res + [t for t in all_grads if t is not None]:
        assert torch.isfinite(t).all(), f"{mode}: dropout gave a non-finite value"
    with torch.no_grad():
        out_eval, hidden_eval = seqpack_forward(m.eval(), packed, hx)
    assert not torch.allclose(out.data, out_eval.data), f"{mode}: dropout 0.4 changed nothing"
    layer0 = [h[:2] for h in (hidden if mode == "LSTM" else (hidden,))]
    layer0_eval = [h[:2] for h in (hidden_eval if mode == "LSTM" else (hidden_eval,))]
    for a, e in zip(layer0, layer0_eval):
        assert_fp32_close(a, e, 100, f"{mode} dropout: layer 0's state")
    # torch in training mode (cuDNN's backward needs it): its mask, drawn from its own
    # generator, reaches layer 1 only, so layer 0's states are deterministic.
    _, hidden_t = m.train()(packed, hx)
    layer0_torch = [h[:2] for h in (hidden_t if mode == "LSTM" else (hidden_t,))]
    ins = [packed.data] + (list(hx) if mode == "LSTM" else [hx]) \
        + [w for w in m._flat_weights]
    n = rnn_reduction_length(8, 16, 2, True, sum(LENGTHS))
    # Layer 1's weights: nothing of layer 0 depends on them, so zeros or None on either side.
    for k, (a, e) in enumerate(zip(grads(layer0, ins, SEED), grads(layer0_torch, ins, SEED))):
        assert_fp32_close(a, e, n, f"{mode} dropout: gradient {k} of layer 0's state",
                          gradient=True)


# ---------------------------------------------------------------- torch.compile

@cases("mode", MODES)
def test_torch_compile(mode):
    """rnn_packed inside torch.compile(fullgraph=True) (the operator's autograd
    kernel, traced through its _rnn_train and _rnn_backward and their fakes;
    backend aot_eager: dynamo and autograd tracing, no code generation) gives
    eager's outputs and gradients."""
    if tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 4):
        skip(f"torch.compile of a custom op needs torch >= 2.4, not {torch.__version__}")
    m = make_module(mode, 6, 12, 2, True)
    packed = make_packed(LENGTHS, 6, SEED + 15)
    hx = make_hx(m, len(LENGTHS), SEED + 15)
    hx = tuple(h.index_select(1, packed.sorted_indices) for h in hx) if mode == "LSTM" \
        else hx.index_select(1, packed.sorted_indices)
    states = list(hx) if mode == "LSTM" else [hx]
    batch_sizes = packed.batch_sizes
    n_states = len(states)

    def fn(data, *rest):
        h = tuple(rest[:n_states]) if mode == "LSTM" else rest[0]
        return GLUE.rnn_packed(mode, data, batch_sizes, h, list(rest[n_states:]), True, 2, 0.0,
                               True, True)

    inputs = [packed.data] + states + list(m._flat_weights)
    eager = fn(*inputs)
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(*inputs)
    n = rnn_reduction_length(6, 12, 2, True, sum(LENGTHS))
    for name, a, e in zip(["output", "h_n", "c_n"], compiled, eager):
        assert_fp32_close(a, e, n, f"{mode} compiled: {name}")
    for k, (a, e) in enumerate(zip(grads(list(compiled), inputs, SEED),
                                   grads(list(eager), inputs, SEED))):
        assert_fp32_close(a, e, n, f"{mode} compiled: gradient of input {k}", gradient=True)


# ---------------------------------------------------------------- cluster primitives

@cases("cluster,clusters", [(2, 1), (4, 3), (8, 2), (16, 2)])
def test_cluster_probe(cluster, clusters):
    """The thread-block cluster primitives on the GPU (cuda/probe/cluster_probe.cu,
    libseqpack_cuda_probe.so beside the library): an all-gather through the
    cluster's shared memory every step and a flag barrier between clusters,
    checked as the CPU emulation's run is (cluster_probe_check.py). Needs sm_90;
    16 blocks is the non-portable cluster size."""
    if SELF_TEST:
        skip("the probe is the library's own code: nothing of it runs on the self-test's fake glue")
    if torch.cuda.get_device_capability(DEVICE) < (9, 0):
        skip(f"thread-block clusters need sm_90, this GPU is sm_{''.join(map(str, torch.cuda.get_device_capability(DEVICE)))}")
    import ctypes
    from cluster_probe_check import bind, check_probe, run_probe
    path = os.path.join(os.path.dirname(GLUE.library_path()), "libseqpack_cuda_probe.so")
    if not os.path.exists(path):
        skip(f"no {path} (cmake -S cuda builds it beside the library)")
    probe = bind(ctypes.CDLL(path))
    steps = 4
    status, *results = run_probe(probe, DEVICE, cluster, clusters, 37, 64, steps, SEED + cluster,
                                 torch.cuda.current_stream(DEVICE).cuda_stream)
    assert status == 0, f"launch_cluster({cluster} blocks a cluster, {clusters} clusters): CUDA error {status}"
    check_probe(cluster, clusters, steps, *results)


# ---------------------------------------------------------------- bad inputs

def _raises(call, what):
    try:
        call()
    except (RuntimeError, ValueError, TypeError):
        return
    raise AssertionError(f"{what}: no exception")


@cases("mode", MODES)
def test_bad_inputs_raise(mode):
    """A CPU tensor among CUDA ones, a dtype other than the weights', and states of
    the wrong shape raise, and the next good call still works."""
    m = make_module(mode, 5, 8)
    packed = make_packed([4, 2], 5, SEED + 14)
    hx = make_hx(m, 2, SEED + 14)
    hx = tuple(h.detach() for h in hx) if mode == "LSTM" else hx.detach()
    data = packed.data.detach()
    w = m._flat_weights

    def call(d=data, h=hx, weights=w):
        return GLUE.rnn_packed(mode, d, packed.batch_sizes, h, weights, True, 1, 0.0, False,
                               False)

    if not SELF_TEST:
        _raises(lambda: call(d=data.cpu()), f"{mode}: CPU data with CUDA weights")
        _raises(lambda: call(weights=[t.detach().cpu() for t in w]),
                f"{mode}: CPU weights with CUDA data")
    _raises(lambda: call(d=data.double()), f"{mode}: float64 data")
    _raises(lambda: call(d=data.to(torch.bfloat16)), f"{mode}: bf16 data with fp32 weights")
    bad_h = (hx[0][:, :1], hx[1]) if mode == "LSTM" else hx[:, :1]
    _raises(lambda: call(h=bad_h), f"{mode}: h0 of the wrong batch size")
    _raises(lambda: call(d=data[:, :3]), f"{mode}: data narrower than input_size")
    with torch.no_grad():
        res = call()
    assert torch.isfinite(res[0]).all(), f"{mode}: a good call after the bad ones failed"


# ---------------------------------------------------------------- plain runner

def _all_tests(keyword=None):
    out = []
    for name, f in list(globals().items()):
        if not name.startswith("test_") or not callable(f):
            continue
        names, values = getattr(f, "cases", ([], [()]))
        for v in values:
            v = v if isinstance(v, tuple) else (v,)
            kwargs = dict(zip(names, v))
            test_id = f"{name}[{'-'.join(str(x) for x in v)}]" if names else name
            if keyword is None or keyword.lower() in test_id.lower():
                out.append((test_id, f, kwargs))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description="seqpack's GPU tests without pytest")
    ap.add_argument("-k", dest="keyword", help="only tests whose id contains this")
    ap.add_argument("--json", help="write the results and measured errors to this file")
    ap.add_argument("--budget", type=float,
                    help="seconds for the run: tests not started by then are counted as not run")
    ap.add_argument("--require", action="store_true",
                    help="fail (exit 1) instead of skipping when the GPU or the library is missing "
                         "(the device check on a GPU machine)")
    ap.add_argument("--test-timeout", type=float, default=120,
                    help="a test running longer than this many seconds (a hung kernel) ends the "
                         "run with every thread's traceback; --json names the test")
    args = ap.parse_args(argv)

    def write(report):  # after every test, so that a killed run leaves what it did
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)

    tests = _all_tests(args.keyword)
    report = dict(torch=torch.__version__, seed=SEED, self_test=SELF_TEST, skipped_all=None,
                  results=[])
    if GLUE is None:
        print(f"SKIPPED all {len(tests)} GPU tests: {SKIP_REASON}")
        report["skipped_all"] = SKIP_REASON
        report["results"] = [dict(test=t, status="skipped", sec=0.0, detail=SKIP_REASON)
                             for t, _, _ in tests]
    else:
        print(f"seqpack CUDA tests on {DEVICE}"
              + (f" ({torch.cuda.get_device_name(0)})" if DEVICE.type == "cuda" else
                 " (SELF-TEST with a fake glue: nothing of seqpack is tested)")
              + f", library {GLUE.library_path()}, torch {torch.__version__}, seed {SEED}",
              flush=True)
        deadline = time.monotonic() + args.budget if args.budget else None
        for test_id, f, kwargs in tests:
            if deadline is not None and time.monotonic() > deadline:
                report["results"].append(dict(test=test_id, status="not run", sec=0.0,
                                              detail="the --budget was spent"))
                continue
            report["running"] = test_id
            write(report)
            faulthandler.dump_traceback_later(args.test_timeout, exit=True)
            t0 = time.perf_counter()
            try:
                f(**kwargs)
                status, detail = "passed", ""
            except SKIPS as e:
                status, detail = "skipped", str(e)
            except Exception as e:  # every failure is reported, and the run goes on
                status, detail = "FAILED", f"{type(e).__name__}: {e}"
                traceback.print_exc()
            sec = time.perf_counter() - t0
            faulthandler.cancel_dump_traceback_later()
            report["running"] = None
            report["results"].append(dict(test=test_id, status=status, sec=sec, detail=detail))
            print(f"{status:>7} {test_id} ({sec:.2f} s){': ' + detail if detail else ''}",
                  flush=True)
    counts = {s: sum(r["status"] == s for r in report["results"])
              for s in ("passed", "FAILED", "skipped", "not run")}
    if FP32_WORST:
        worst = max(FP32_WORST, key=lambda r: r[1] / r[2] if r[2] else 0)
        target = [r for r in FP32_WORST if r[2] == FP32_TARGET]
        print(f"fp32: largest |seqpack - torch| on values of magnitude <= 1: "
              f"{max((r[1] for r in target), default=0):.3g} (target {FP32_TARGET:g}); "
              f"closest to its bound: {worst[0]}, {worst[1]:.3g} of {worst[2]:.3g}")
        report["fp32_largest_unit_scale_difference"] = max((r[1] for r in target), default=0)
    if HALF_ERRORS:
        print("half precision: relative error against torch fp32 on the same rounded inputs")
        print(f"  {'dtype':<9} {'largest seqpack':>15} {'largest torch':>13}  quantity")
        for dt in ("bfloat16", "float16"):
            rows = [r for r in HALF_ERRORS if r[1] == dt]
            for kind, pick in (("values", lambda r: not r[0].split(" ", 1)[1].startswith("d ")),
                               ("gradients", lambda r: r[0].split(" ", 1)[1].startswith("d "))):
                sel = [r for r in rows if pick(r)]
                if sel:
                    t = [r[3] for r in sel if r[3] is not None]
                    print(f"  {dt:<9} {max(r[2] for r in sel):>15.3g} "
                          f"{(max(t) if t else float('nan')):>13.3g}  {kind}")
        report["half_errors"] = [dict(what=r[0], dtype=r[1], seqpack=r[2], torch=r[3],
                                      bound=r[4]) for r in HALF_ERRORS]
    print(f"GPU tests: {counts['passed']} passed, {counts['FAILED']} failed, "
          f"{counts['skipped']} skipped"
          + (f", {counts['not run']} not run (the --budget was spent)" if counts["not run"] else "")
          + (f" ({SKIP_REASON})" if GLUE is None else ""))
    write(report)
    if GLUE is None and args.require:
        print(f"FAILED: --require, and {SKIP_REASON}")
        return 1
    return 1 if counts["FAILED"] or counts["not run"] else 0


if __name__ == "__main__":
    sys.exit(main())
