"""Every recurrent layer and cell of seqpack.torch against PyTorch run live, over
the hidden sizes where SIMD kernels and blocked layouts have tails (1-17,
31-33, 63-65, 100), one and two layers, both directions, padded input (every
sequence full: the dense path), padded input with lengths and packed input,
with and without autograd recording; fp32 against the bound of
tolerance.py, bf16 (autocast) and int8 (quantize_dynamic) against their
documented bounds (docs/performance.md).

The reference is torch.nn in float64 on the same weights (torch's native
kernels: its oneDNN RNN primitive runs float32 only), so a fault in torch's
own float32 path cannot pass for seqpack's. seqpack's float32 results are
also held to torch.nn's float32 ones, computed with and without torch's
oneDNN (torch.backends.mkldnn), wherever that one of torch's float32 paths
is itself within the bound of torch's float64: one that is not is reported
(a warning naming the configuration), not counted against seqpack.

test_every_highway_target runs the fp32 grid again in a subprocess under each
Highway target the CPU offers (SEQPACK_MAX_CPU_ISA avx2, avx3, avx3_dl,
avx3_zen4 and the uncapped one: AVX2, AVX3, AVX3_DL, AVX3_ZEN4, AVX3_SPR as
the CPU has them)."""
import copy
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch.nn.utils import rnn as trnn

import seqpack
import seqpack.torch as st
from helpers import base_seed
from tolerance import fp_bound, rnn_reduction_length

HIDDEN = list(range(1, 18)) + [31, 32, 33, 63, 64, 65, 100]
INPUT_SIZE = 3
T, B = 5, 3
LENGTHS = [5, 2, 4]  # unsorted: the sorting and unsorting paths too
KINDS = {
    "RNN_TANH": (torch.nn.RNN, st.RNN, dict(nonlinearity="tanh")),
    "RNN_RELU": (torch.nn.RNN, st.RNN, dict(nonlinearity="relu")),
    "LSTM": (torch.nn.LSTM, st.LSTM, {}),
    "LSTM_PROJ": (torch.nn.LSTM, st.LSTM, {}),
    "GRU": (torch.nn.GRU, st.GRU, {}),
}
# bf16's and int8's documented bounds (docs/performance.md: "bf16 numerics",
# "int8 numerics"; absolute, for weights U(-1/sqrt(H), 1/sqrt(H)) and inputs
# in [0, 1)).
BF16_BOUND = 0.03
INT8_BOUND = 0.03


def proj_of(kind, hidden):
    """LSTM_PROJ's proj_size: below the hidden size (torch requires it), 0 else."""
    return max(hidden // 2, 1) if kind == "LSTM_PROJ" and hidden > 1 else 0


def make(kind, hidden, layers, bidirectional, seed):
    """(torch.nn fp32 module, its float64 twin, seqpack's) with one set of weights."""
    torch_cls, ours_cls, kwargs = KINDS[kind]
    kwargs = dict(kwargs, num_layers=layers, bidirectional=bidirectional)
    if kind == "LSTM_PROJ":
        kwargs["proj_size"] = proj_of(kind, hidden)
    torch.manual_seed(seed)
    ref = torch_cls(INPUT_SIZE, hidden, **kwargs)
    ours = ours_cls(INPUT_SIZE, hidden, **kwargs)
    ours.load_state_dict(ref.state_dict())
    return ref, copy.deepcopy(ref).double(), ours


def inputs(form, seed, dtype=torch.float32):
    """The input of `form` ('dense': padded, every sequence of length T;
    'lengths': padded with LENGTHS given to the layer; 'packed')."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(T, B, INPUT_SIZE, generator=g, dtype=torch.float64).to(dtype)
    if form == "packed":
        return trnn.pack_padded_sequence(x, torch.tensor(LENGTHS), enforce_sorted=False)
    return x


def reference(ref64, x, form):
    """The float64 module's results on x (padded or packed) in float64."""
    if isinstance(x, trnn.PackedSequence):
        x = trnn.PackedSequence(x.data.double(), x.batch_sizes, x.sorted_indices,
                                x.unsorted_indices)
    else:
        x = x.double()
    return call(ref64, x, form, grad=False)


def call(module, x, form, grad):
    """(output as padded rows, h_n, c_n or None) of module on x; with `grad`,
    with autograd recording (input requiring grad), else under no_grad."""
    with torch.set_grad_enabled(grad):
        if isinstance(x, trnn.PackedSequence):
            if grad:
                x = trnn.PackedSequence(x.data.detach().requires_grad_(), x.batch_sizes,
                                        x.sorted_indices, x.unsorted_indices)
            out, hidden = module(x)
            out, _ = trnn.pad_packed_sequence(out)
        else:
            if grad:
                x = x.detach().requires_grad_()
            if form == "lengths" and isinstance(module, (st.RNN, st.LSTM, st.GRU)):
                out, hidden = module(x, lengths=torch.tensor(LENGTHS))
            elif form == "lengths":  # torch.nn: through packing, as seqpack's lengths mean
                packed = trnn.pack_padded_sequence(x, torch.tensor(LENGTHS), enforce_sorted=False)
                out, hidden = module(packed)
                out, _ = trnn.pad_packed_sequence(out, total_length=T)
            else:
                out, hidden = module(x)
    h, c = hidden if isinstance(hidden, tuple) else (hidden, None)
    return [t.detach() for t in (out, h)] + [None if c is None else c.detach()]


def torch_fp32(ref, x, form, grad, onednn):
    """torch.nn's float32 results, with its oneDNN RNN path on or off."""
    with torch.backends.mkldnn.flags(enabled=onednn):
        return call(ref, x, form, grad)


def worst(actual, expected):
    """max |actual - expected| over (output, h_n, c_n), and the largest magnitude
    of expected (the bound's scale)."""
    err = scale = 0.0
    for a, e in zip(actual, expected):
        if e is None:
            continue
        e = e.double()
        err = max(err, (a.double() - e).abs().max().item())
        scale = max(scale, e.abs().max().item())
    return err, scale


def fp32_grid(kind, layers, bidirectional, seed):
    """Runs the fp32 grid of one kind, layer count and direction; returns
    (failures, torch faults): lines naming each case."""
    failures, torch_faults = [], []
    for hidden in HIDDEN:
        ref, ref64, ours = make(kind, hidden, layers, bidirectional, seed + hidden)
        n = rnn_reduction_length(INPUT_SIZE, hidden, layers, bidirectional, T,
                                 proj_of(kind, hidden))
        for form in ("dense", "lengths", "packed"):
            x = inputs(form, seed + 1000 + hidden)
            expected = reference(ref64, x, form)
            for grad in (False, True):
                case = (f"{kind} H={hidden} layers={layers} bidirectional={bidirectional} "
                        f"{form} {'grad' if grad else 'no_grad'} (seed {seed + hidden})")
                actual = call(ours, x, form, grad)
                err, scale = worst(actual, expected)
                bound = fp_bound(scale, n)
                if not err <= bound:
                    failures.append(f"{case}: seqpack off torch float64 by {err:.3g} > {bound:.3g}")
                    continue
                for onednn in (True, False):
                    theirs = torch_fp32(ref, x, form, grad, onednn)
                    t_err, _ = worst(theirs, expected)
                    if not t_err <= bound:
                        torch_faults.append(
                            f"{case}: torch.nn float32 (oneDNN {'on' if onednn else 'off'}) "
                            f"is off its own float64 by {t_err:.3g} > {bound:.3g}")
                        continue
                    d, _ = worst(actual, theirs)
                    if not d <= 2 * bound:
                        failures.append(f"{case}: seqpack off torch.nn float32 (oneDNN "
                                        f"{'on' if onednn else 'off'}) by {d:.3g} > {2 * bound:.3g}")
    return failures, torch_faults


GRID = [(k, layers, bi) for k in KINDS for layers in (1, 2) for bi in (False, True)]


def _report(failures, torch_faults):
    for line in torch_faults:
        warnings.warn(line)
    assert not failures, f"{len(failures)} cases:\n" + "\n".join(failures[:20])


@pytest.mark.parametrize("kind,layers,bidirectional", GRID,
                         ids=[f"{k}-{n}l-{'bi' if b else 'uni'}" for k, n, b in GRID])
def test_fp32_layers(kind, layers, bidirectional):
    _report(*fp32_grid(kind, layers, bidirectional, base_seed()))


CELLS = {
    "RNNCell_tanh": (torch.nn.RNNCell, st.RNNCell, dict(nonlinearity="tanh")),
    "RNNCell_relu": (torch.nn.RNNCell, st.RNNCell, dict(nonlinearity="relu")),
    "LSTMCell": (torch.nn.LSTMCell, st.LSTMCell, {}),
    "GRUCell": (torch.nn.GRUCell, st.GRUCell, {}),
}


@pytest.mark.parametrize("name", list(CELLS))
def test_fp32_cells(name):
    torch_cls, ours_cls, kwargs = CELLS[name]
    seed = base_seed()
    failures = []
    for hidden in HIDDEN:
        torch.manual_seed(seed + hidden)
        ref = torch_cls(INPUT_SIZE, hidden, **kwargs)
        ours = ours_cls(INPUT_SIZE, hidden, **kwargs)
        ours.load_state_dict(ref.state_dict())
        ref64 = copy.deepcopy(ref).double()
        n = INPUT_SIZE + 2 * hidden + 16
        g = torch.Generator().manual_seed(seed + hidden)
        for batched in (True, False):
            shape = (B, INPUT_SIZE) if batched else (INPUT_SIZE,)
            x = torch.rand(shape, generator=g, dtype=torch.float64)
            hx = torch.rand(shape[:-1] + (hidden,), generator=g, dtype=torch.float64) - 0.5
            state = (hx, hx * 0.5) if name == "LSTMCell" else hx
            state32 = tuple(s.float() for s in state) if name == "LSTMCell" else state.float()
            with torch.no_grad():
                expected = ref64(x, state)
            expected = expected if isinstance(expected, tuple) else (expected,)
            for grad in (False, True):
                with torch.set_grad_enabled(grad):
                    xi = x.float().requires_grad_(grad)
                    got = ours(xi, state32)
                got = got if isinstance(got, tuple) else (got,)
                err, scale = worst([t.detach() for t in got], expected)
                bound = fp_bound(scale, n)
                if not err <= bound:
                    failures.append(f"{name} H={hidden} batched={batched} grad={grad} "
                                    f"(seed {seed + hidden}): off float64 by {err:.3g} > {bound:.3g}")
    assert not failures, "\n".join(failures[:20])


def _has_native_bf16():
    return seqpack.cpu_info().get("native_bf16", False)


@pytest.mark.parametrize("kind", list(KINDS))
def test_bf16_layers(kind):
    """Under torch.autocast (bf16 products, fp32 state), within bf16's bound of
    the float64 reference, every hidden size, padded and packed, with and
    without autograd recording."""
    seed = base_seed()
    failures = []
    for hidden in HIDDEN:
        for layers, bidirectional in ((1, False), (2, True)):
            _, ref64, ours = make(kind, hidden, layers, bidirectional, seed + hidden)
            for form in ("dense", "packed"):
                x = inputs(form, seed + 2000 + hidden)
                expected = reference(ref64, x, form)
                for grad in (False, True):
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        actual = call(ours, x, form, grad)
                    err, _ = worst([t.float() if t is not None else None for t in actual],
                                   expected)
                    if not err <= BF16_BOUND:
                        failures.append(f"{kind} H={hidden} layers={layers} {form} grad={grad} "
                                        f"(seed {seed + hidden}): bf16 off float64 by {err:.3g}")
    assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize("kind", list(KINDS))
def test_int8_layers(kind):
    """quantize_dynamic's layers within int8's bound of the float64 reference,
    every hidden size, padded and packed (int8 is inference only)."""
    seed = base_seed()
    failures = []
    for hidden in HIDDEN:
        for layers, bidirectional in ((1, False), (2, True)):
            ref, ref64, _ = make(kind, hidden, layers, bidirectional, seed + hidden)
            q = st.quantize_dynamic(ref.eval())
            for form in ("dense", "packed"):
                x = inputs(form, seed + 3000 + hidden)
                expected = reference(ref64, x, form)
                actual = call(q, x, form, grad=False)
                err, _ = worst(actual, expected)
                if not err <= INT8_BOUND:
                    failures.append(f"{kind} H={hidden} layers={layers} {form} "
                                    f"(seed {seed + hidden}): int8 off float64 by {err:.3g}")
    assert not failures, "\n".join(failures[:20])


# ---- the same fp32 grid under each Highway target ---------------------------

_CHILD = r"""
import json, sys, warnings
sys.path.insert(0, {tests!r})
import seqpack
import test_torch_parity_grid as g
failures, faults = [], []
for kind, layers, bi in g.GRID:
    if layers == 2 and bi is False:
        continue  # one-layer and two-layer bidirectional cover the kernels' paths
    f, t = g.fp32_grid(kind, layers, bi, {seed})
    failures += f
    faults += t
print(json.dumps({{"kernels": seqpack.cpu_info()["kernels"], "failures": failures,
                  "torch_faults": faults}}))
"""


def test_every_highway_target():
    """The fp32 grid under every Highway target this CPU offers (one
    subprocess each, SEQPACK_MAX_CPU_ISA capping the target)."""
    here = os.path.dirname(os.path.abspath(__file__))
    seen = {}
    for level in ("avx2", "avx3", "avx3_dl", "avx3_zen4", "avx512"):
        env = dict(os.environ, SEQPACK_MAX_CPU_ISA=level)
        res = subprocess.run([sys.executable, "-c", _CHILD.format(tests=here, seed=base_seed())],
                             env=env, capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, f"SEQPACK_MAX_CPU_ISA={level}:\n{res.stdout}\n{res.stderr}"
        result = json.loads(res.stdout.strip().splitlines()[-1])
        for line in result["torch_faults"]:
            warnings.warn(f"SEQPACK_MAX_CPU_ISA={level}: {line}")
        assert not result["failures"], (
            f"SEQPACK_MAX_CPU_ISA={level} (kernels {result['kernels']}): "
            f"{len(result['failures'])} cases:\n" + "\n".join(result["failures"][:20]))
        seen.setdefault(result["kernels"], level)
    print("Highway targets run:", seen)
