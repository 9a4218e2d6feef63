#!/usr/bin/env python3
"""How far seqpack's fp32 is from PyTorch's: the largest difference (relative to the
tensor's largest magnitude) between seqpack.torch's LSTM/GRU/RNN and torch.nn's (oneDNN off, its
reference path) on outputs, final states and every gradient, over a few
realistic shapes. docs/python.md quotes the result ("equal to PyTorch within
fp32 rounding").

    /usr/bin/python3 bench/fp32_vs_torch.py          # with seqpack importable
"""
import torch
from torch.nn.utils.rnn import pack_padded_sequence

import seqpack.torch as spt

SHAPES = [  # (mode, input, hidden, layers, bidirectional, batch, max length)
    ("LSTM", 64, 128, 2, True, 16, 50),
    ("LSTM", 128, 256, 1, False, 16, 100),
    ("GRU", 64, 128, 2, True, 16, 50),
    ("RNN", 64, 128, 2, False, 16, 50),
]


def run(cls, mode, inp, hidden, layers, bi, x, lengths, seed):
    torch.manual_seed(seed)
    m = cls(inp, hidden, layers, bidirectional=bi) if mode != "RNN" else cls(
        inp, hidden, layers, bidirectional=bi, nonlinearity="tanh")
    x = x.clone().requires_grad_(True)
    out, h = m(pack_padded_sequence(x, lengths, enforce_sorted=False))
    h_n = h[0] if isinstance(h, tuple) else h
    g = torch.Generator().manual_seed(seed + 1)
    loss = (out.data * torch.randn(out.data.shape, generator=g)).sum() + \
        (h_n * torch.randn(h_n.shape, generator=g)).sum()
    loss.backward()
    return [out.data, h_n, x.grad] + [p.grad for p in m.parameters()]


def main():
    print(f"torch {torch.__version__}; largest |seqpack - torch.nn| / max |torch.nn| per tensor, fp32 (oneDNN off)")
    worst = {"forward": 0.0, "gradients": 0.0}
    for i, (mode, inp, hidden, layers, bi, batch, t) in enumerate(SHAPES):
        g = torch.Generator().manual_seed(i)
        lengths = torch.randint(1, t + 1, (batch,), generator=g)
        lengths[0] = t
        x = torch.randn(t, batch, inp, generator=g)
        with torch.backends.mkldnn.flags(enabled=False):
            ref = run(getattr(torch.nn, mode), mode, inp, hidden, layers, bi, x, lengths, i)
        got = run(getattr(spt, mode), mode, inp, hidden, layers, bi, x, lengths, i)
        # Differences relative to the tensor's largest magnitude (gradients
        # summed over many steps are large; their rounding scales with them).
        def rel(pairs):
            return max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) for a, b in pairs)
        fwd = rel(zip(got[:2], ref[:2]))
        grad = rel(zip(got[2:], ref[2:]))
        worst["forward"] = max(worst["forward"], fwd)
        worst["gradients"] = max(worst["gradients"], grad)
        print(f"  {mode:4} in {inp:3} hidden {hidden:3} layers {layers} {'bi ' if bi else '   '}"
              f"batch {batch:2} T {t:3}: outputs/h_n {fwd:.1e}, gradients {grad:.1e}")
    print(f"  worst: outputs/h_n {worst['forward']:.1e}, gradients {worst['gradients']:.1e}")


if __name__ == "__main__":
    main()
