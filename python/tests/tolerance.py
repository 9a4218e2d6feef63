"""The one rule by which seqpack's tests compare floating-point results computed
along different code paths: seqpack against PyTorch, a fixture generated on one
CPU against a fresh run on another, one ISA against another (docs/testing.md).

Two valid orders of a sum of n terms each differ from the exact sum by at most
gamma_n * sum|terms| ~ n * u * sum|terms| (u: the unit roundoff of the dtype), so
they differ from each other by at most 2 * n * u * sum|terms|. A test does not
see the terms; it takes the largest magnitude of the tensor compared as their
scale. So an element of a tensor `expected` may differ by

    bound = 2 * u(dtype) * n * max|expected|

where n is the length of the longest chain of roundings that feeds the tensor:
for a recurrent layer, (input_size + (D + 1) * hidden_size) per step, times the
steps and layers a value depends on (rnn_reduction_length below). Nothing here
depends on the CPU, so a bound that holds on one machine holds on every one."""
import numpy as np

UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "float64": 2.0 ** -53, "bfloat16": 2.0 ** -8,
                 "float16": 2.0 ** -11}


# The roundings of one step's element-wise gate math: sigmoid and tanh within
# a few ulps each (seqpack's own approximations, PyTorch's Sleef and libm), a
# handful of products and sums.
GATE_MATH_ROUNDINGS = 16


def dtype_name(dtype):
    """'float32', ... for a NumPy or torch dtype or a name."""
    s = str(dtype)
    for name in UNIT_ROUNDOFF:
        if s.endswith(name):
            return name
    raise ValueError(f"no unit roundoff for dtype {dtype!r}")


def fp_bound(scale, n, dtype="float32"):
    """The largest difference allowed between two evaluations of a tensor whose
    largest magnitude is `scale`, computed through chains of at most `n`
    roundings in `dtype`."""
    return 2.0 * UNIT_ROUNDOFF[dtype_name(dtype)] * max(int(n), 1) * float(scale)


def rnn_reduction_length(input_size, hidden_size, num_layers=1, bidirectional=False,
                         steps=1, proj_size=0):
    """n for the outputs, states and gradients of a recurrent layer: each step
    reduces over the layer input (input_size, or D * (proj_size or hidden_size)
    above the first layer), the state, and with proj_size the cell's hidden
    units; its gate math (sigmoid, tanh, products) adds GATE_MATH_ROUNDINGS; a
    value depends on at most `steps` steps (for a weight gradient: every token
    of the batch) of every layer."""
    d = 2 if bidirectional else 1
    h_out = proj_size or hidden_size
    per_step = max(input_size, d * h_out) + h_out + (hidden_size if proj_size else 0) \
        + GATE_MATH_ROUNDINGS
    return per_step * max(int(steps), 1) * max(int(num_layers), 1)


def _numpy(x):
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        x = x.numpy()
    return np.asarray(x)


def assert_fp_close(actual, expected, n, dtype=None, what="", scale=None):
    """Asserts |actual - expected| <= fp_bound(scale, n, dtype) elementwise,
    scale defaulting to max|expected|; names the first offending index, both
    values, the bound and n on failure. NaN must meet NaN."""
    if dtype is None:
        dtype = getattr(expected, "dtype", None) or "float32"
    a = _numpy(actual).astype(np.float64)
    e = _numpy(expected).astype(np.float64)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    if scale is None:
        finite = e[np.isfinite(e)]
        scale = float(np.abs(finite).max()) if finite.size else 0.0
    bound = fp_bound(scale, n, dtype)
    both_nan = np.isnan(a) & np.isnan(e)
    same_inf = np.isinf(e) & (a == e)
    bad = ~((np.abs(a - e) <= bound) | both_nan | same_inf)
    if bad.any():
        i = np.unravel_index(np.argmax(bad), bad.shape)
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} elements differ; first at "
            f"{tuple(int(k) for k in i)}: {a[i]!r} vs expected {e[i]!r}, |difference| "
            f"{abs(a[i] - e[i]):.3g} > bound {bound:.3g} (2 * u({dtype_name(dtype)}) * n {n} "
            f"* scale {scale:.3g})")


def module_reduction_length(m, lengths):
    """rnn_reduction_length of a recurrent module (seqpack.torch's or
    torch.nn's: input_size, hidden_size, ...) over a batch of `lengths`."""
    return rnn_reduction_length(m.input_size, m.hidden_size, m.num_layers, m.bidirectional,
                                sum(int(n) for n in lengths), getattr(m, "proj_size", 0))


def assert_like_torch(actual, expected, m, lengths, what):
    """A result of module `m` over a batch of `lengths` against torch.nn's on the
    same inputs: assert_fp_close at the module's reduction length."""
    assert_fp_close(actual, expected, module_reduction_length(m, lengths), what=what)


# ---- int8 (dynamic quantization) --------------------------------------------

def int8_product_error(k, a_max, w_max):
    """The most a k-term product's sum can move when both operands are
    quantized as seqpack's int8 does (docs/performance.md, "int8 numerics"):
    a row of the layer input or of h over at least 127 levels of its range
    (step <= 2 * a_max / 127, so each a is off by at most a_max / 127), the
    weights symmetric over 127 levels of their unit's max|w| (each off by at
    most w_max / 254). A term a'w' - aw is off by at most
    |da||w| + |a||dw| + |da||dw|."""
    da, dw = a_max / 127.0, w_max / 254.0
    return k * (da * w_max + a_max * dw + da * dw)


def int8_rnn_bound(m, x_max, steps, h_max=1.0, h0_zero=True):
    """A first-order bound on |int8 - exact| for the outputs and states of
    torch.nn-style recurrent module `m` (its parameters give the weights'
    magnitudes) over inputs of magnitude at most x_max and `steps` steps.
    Each step's products are off by int8_product_error, plus what the error
    already in h (and, above the first layer, in the layer input) moves them;
    the gate math passes errors on at most at its derivatives' bounds
    (sigmoid 1/4, tanh and relu 1), the LSTM cell adds its gates' errors
    weighted by |c| <= t, GRU's h = (1-z) n + z h_prev by |n - h_prev| <= 2.
    h_max bounds |h| (1 for tanh-bounded cells; a relu RNN's comes from the
    reference). The bound grows with the steps and is meant for short
    sequences, where it is tight enough to catch a wrong result."""
    mode = getattr(m, "mode", "RNN_TANH")
    H = m.hidden_size
    proj = getattr(m, "proj_size", 0)
    R = proj or H
    D = 2 if m.bidirectional else 1
    in_k, a_in, e_in = m.input_size, float(x_max), 0.0
    worst = 0.0

    def wmax(name):
        p = getattr(m, name, None)
        return 0.0 if p is None else float(p.detach().abs().max())

    for layer in range(m.num_layers):
        e_out = 0.0
        for d in range(D):
            sfx = f"_l{layer}" + ("_reverse" if d else "")
            w_ih, w_hh, w_hr = wmax("weight_ih" + sfx), wmax("weight_hh" + sfx), wmax("weight_hr" + sfx)
            b = getattr(m, "bias_hh" + sfx, None)
            b_hn = 0.0 if b is None or mode != "GRU" else float(b.detach()[2 * H:].abs().max())
            e_h = e_c = c_max = 0.0
            for t in range(int(steps)):
                px = int8_product_error(in_k, a_in, w_ih) + in_k * w_ih * e_in
                ph = 0.0
                if t > 0 or not h0_zero:
                    ph = int8_product_error(R, h_max, w_hh) + R * w_hh * e_h
                if mode == "LSTM":
                    p = px + ph
                    e_c = e_c + c_max * p / 4 + p / 4 + p  # f c_prev + i g
                    c_max += 1.0
                    e_m = e_c + p / 4  # o tanh(c)
                    e_h = e_m if not proj else int8_product_error(H, 1.0, w_hr) + H * w_hr * e_m
                    worst = max(worst, e_c)
                elif mode == "GRU":
                    e_gate = (px + ph) / 4
                    e_n = px + ph + (R * w_hh * h_max + b_hn) * e_gate
                    e_h = e_h + 2 * e_gate + e_n
                else:
                    e_h = px + ph
                worst = max(worst, e_h)
            e_out = max(e_out, e_h)
        in_k, a_in, e_in = D * R, h_max, e_out
    return worst
