"""The meaning of cuda/probe/step_floor.cu's results, shared by its CPU run
through the emulation (test_cuda_step_floor.py) and its GPU run
(bench/cuda_step_floor.py, the device check's first measurement).

make_case draws a tanh RNN (W_hh uniform in +-0.5/sqrt(H): a spectral norm
near 0.6, so the recurrence contracts), the input gates and h0; run_floor
calls seqpack_cuda_probe_step_floor on tensors of a device; check_floor
compares y with a float64 recurrence on the same rounded weights (h rounded
to the data type after each step, as the kernel keeps it). The bounds:
float32, H products summed per step, twice that for each step (an error
carried through tanh' <= 1 and a contracting W does not grow); bfloat16 adds
four units of its rounding (2^-8: the kernel's float32 sum and the float64
one may round h to neighbouring values, and the difference contracts after).
The emulation lets a cluster's blocks drift apart (cuda/emulate/), so a
missing cluster barrier fails the check there too."""
import ctypes

import torch

DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 2}
EPS = {torch.float32: torch.finfo(torch.float32).eps, torch.bfloat16: 2.0 ** -8}


def bind(lib):
    f = lib.seqpack_cuda_probe_step_floor
    f.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 2 + [ctypes.c_int] * 3 + [
        ctypes.c_void_p]
    f.restype = ctypes.c_int
    return f


def make_case(hidden, batch, steps, dtype, seed, device):
    g = torch.Generator().manual_seed(seed)
    w = (torch.rand(hidden, hidden, generator=g) * 2 - 1) * (0.5 / hidden ** 0.5)
    xg = torch.rand(steps, batch, hidden, generator=g) * 2 - 1
    h0 = torch.rand(batch, hidden, generator=g) * 2 - 1
    return w.to(device, dtype), xg.to(device), h0.to(device, dtype)


def run_floor(f, w, xg, h0, cluster, threads, steps=None, stream=None):
    """(status, y) with y float32 [steps, batch, hidden] on w's device."""
    steps = xg.shape[0] if steps is None else steps
    hidden, batch = w.shape[0], h0.shape[0]
    y = torch.full((steps, batch, hidden), float("nan"), device=w.device)
    status = f(DTYPE_CODE[w.dtype], w.data_ptr(), xg.data_ptr(), h0.data_ptr(), y.data_ptr(), hidden, batch,
               steps, cluster, threads, stream)
    return status, y


def reference(w, xg, h0):
    """float64 recurrence on the stored values, h rounded to w's dtype each step."""
    wd, h = w.double().cpu(), h0.double().cpu()
    out = []
    for t in range(xg.shape[0]):
        h = torch.tanh(xg[t].double().cpu() + h @ wd.T).to(w.dtype).double()
        out.append(h)
    return torch.stack(out)


def check_floor(w, xg, h0, y):
    want = reference(w, xg, h0)
    hidden, steps = w.shape[0], xg.shape[0]
    eps = EPS[w.dtype]
    # Per step: the float32 sum's error (H products of magnitude <= |w||h|) and,
    # in bfloat16, one rounding of h; carried over the steps without growing.
    per_step = hidden * torch.finfo(torch.float32).eps * float(w.double().abs().sum(1).max())
    bound = 2 * per_step * steps + 1e-7 + (4 * eps if w.dtype != torch.float32 else 0.0)
    err = float((y.double().cpu() - want).abs().max())
    assert err <= bound, f"step floor kernel: max |y - reference| = {err:.3g} > {bound:.3g}"
    return err, bound
