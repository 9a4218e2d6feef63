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
