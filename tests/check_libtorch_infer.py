#!/usr/bin/env python3
"""The LibTorch example against Python: scripts a model of seqpack.torch layers
(with seqpack's pack/pad operators), saves it, runs examples/libtorch_infer on
it, and compares the C++ outputs with the same model run eagerly in Python on
the same batch, and with torch.nn's modules of the same weights.

    check_libtorch_infer.py --example build/examples/libtorch_infer --work DIR
"""
import argparse
import math
import os
import subprocess
import sys
from typing import Tuple

import torch
from torch import Tensor
from torch.nn.utils import rnn as trnn

import seqpack.torch as spt

INPUT_SIZE = 3
LENGTHS = [6, 0, 3, 1, 6, 2]  # a zero-length sequence, ties, unsorted


class Tagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lstm = spt.LSTM(INPUT_SIZE, 5, num_layers=2, bidirectional=True, batch_first=True)
        self.gru = spt.GRU(10, 4, batch_first=True)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x: Tensor, lengths: Tensor) -> Tuple[Tensor, Tensor]:
        packed = spt.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, (h_n, _) = self.lstm(packed)
        out, _ = self.gru(out)
        padded, _ = spt.pad_packed_sequence(out, batch_first=True, total_length=x.size(1))
        return self.head(padded), h_n


def batch():
    """The example's batch: x[b][t][i] = sin(0.1 (31 b + 7 t + i + 1)) on valid steps."""
    x = torch.zeros(len(LENGTHS), max(LENGTHS), INPUT_SIZE)
    for b, n in enumerate(LENGTHS):
        for t in range(n):
            for i in range(INPUT_SIZE):
                x[b, t, i] = math.sin(0.1 * (31 * b + 7 * t + i + 1))
    return x, torch.tensor(LENGTHS)


def torch_reference(model, x, lengths):
    """The same weights in torch.nn modules, on the non-empty sequences."""
    lstm = torch.nn.LSTM(INPUT_SIZE, 5, num_layers=2, bidirectional=True, batch_first=True)
    lstm.load_state_dict(model.lstm.state_dict())
    gru = torch.nn.GRU(10, 4, batch_first=True)
    gru.load_state_dict(model.gru.state_dict())
    keep = [b for b, n in enumerate(LENGTHS) if n > 0]
    packed = trnn.pack_padded_sequence(x[keep], lengths[keep], batch_first=True,
                                       enforce_sorted=False)
    out, _ = gru(lstm(packed)[0])
    padded, _ = trnn.pad_packed_sequence(out, batch_first=True, total_length=x.size(1))
    full = torch.zeros(len(LENGTHS), x.size(1), 4)
    full[keep] = padded
    return model.head(full)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--example", required=True)
    p.add_argument("--work", required=True)
    args = p.parse_args()
    os.makedirs(args.work, exist_ok=True)
    model = Tagger().eval()
    path = os.path.join(args.work, "tagger.pt")
    torch.jit.save(torch.jit.script(model), path)

    run = subprocess.run([args.example, path, str(INPUT_SIZE)] + [str(n) for n in LENGTHS],
                         capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        sys.exit(f"libtorch_infer failed ({run.returncode}): {run.stderr}")
    lines = run.stdout.split("\n")
    shape = [int(d) for d in lines[0].split()[1:]]
    values = torch.tensor([float(v) for v in lines[1:] if v], dtype=torch.float64)
    cpp = values.reshape(shape)

    x, lengths = batch()
    with torch.no_grad():
        python_out, _ = model(x, lengths)
        reference = torch_reference(model, x, lengths)
    failures = []
    for name, expected, tol in (("Python (eager seqpack.torch)", python_out, 1e-6),
                                ("torch.nn", reference, 1e-5)):
        expected = expected.double()
        if list(expected.shape) != shape:
            failures.append(f"{name}: shape {list(expected.shape)} vs C++ {shape}")
            continue
        diff = (cpp - expected).abs()
        bad = diff > tol + tol * expected.abs()
        if bad.any():
            i = tuple(int(k) for k in bad.nonzero()[0])
            failures.append(f"{name}: {int(bad.sum())} values differ; first at {i}: "
                            f"C++ {cpp[i].item()!r} vs {expected[i].item()!r} (tol {tol})")
    if failures:
        sys.exit("\n".join(failures))
    print(f"libtorch_infer: {cpp.numel()} outputs of shape {shape} match Python and torch.nn "
          f"(max |C++ - Python| = {(cpp - python_out.double()).abs().max().item():.3g})")


if __name__ == "__main__":
    main()
