#!/usr/bin/python3
"""One step with a given state, as a decoder or a sampler runs it: seqpack.torch's
layer against torch.nn's, the same weights, one call per step.

For each cell and batch: `infer` is a forward of one step under torch.no_grad()
with the module in training mode (a sampler inside a training loop; eval() gives
the same figures for seqpack); `train` is a forward of one step and the backward
of its output's sum, the input requiring grad, parameter gradients cleared
(set_to_none) between calls (the weights unchanged: a decoder's steps within one
optimiser step); `train+sgd` adds an SGD step after each backward, so the
weights change at every call (seqpack then lays them out at every call). Times are the best of 5 runs of N calls; a round
times torch then seqpack; the ratio (torch / seqpack, > 1: seqpack faster) is the
median of --rounds paired rounds. Threads: torch's and its OpenBLAS pool's
(bench/torch_threads.py) and seqpack's at --threads; glibc malloc tuned by default.

--precision bf16 runs seqpack's layer under torch.autocast("cpu", dtype=torch.bfloat16)
(its bf16 products; native bf16 or SEQPACK_BF16=emulated needed) and gives torch its
best of two configurations per round: its fp32 module, and its bf16 module
(module.to(torch.bfloat16) with bf16 input and state); the column `torch` then names
the faster.

    /usr/bin/python3 bench/step_vs_torch.py [--threads 1] [--rounds 3] [--malloc tuned]
                                            [--precision fp32|bf16]
"""
import argparse
import contextlib
import copy
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_threads import add_malloc_option, apply_malloc, malloc_settings, set_torch_threads  # noqa: E402

import seqpack  # noqa: E402
import seqpack.torch as st  # noqa: E402


def amp(autocast):
    """CPU bf16 autocast where asked, made once and entered per call (torch 1.13's
    constructor probes for torch_xla through importlib at every construction: 30-40 us,
    more than a small call); no context at all otherwise (not even a disabled one,
    whose entry and exit would be counted in torch's time)."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()


def best_per_call(f, calls):
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cases", default="GRU:500,LSTM:500,GRU:64",
                   help="cell:hidden pairs (input_size = hidden)")
    p.add_argument("--batch", default="1,64")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="seqpack's products (bf16: under CPU autocast; torch then also "
                        "tries its bf16 module)")
    add_malloc_option(p)
    p.set_defaults(malloc="tuned")
    args = p.parse_args()
    apply_malloc(args.malloc)
    set_torch_threads(args.threads)
    seqpack.set_num_threads(args.threads)
    bf16 = args.precision == "bf16"
    print(f"# torch {torch.__version__}, seqpack ISA {seqpack.cpu_info()['isa']}, "
          f"precision {args.precision}, {args.threads} thread(s), {malloc_settings()}")
    print("cell(H)     batch mode       torch us  seqpack us  ratio (rounds)"
          + ("  torch's faster" if bf16 else ""))
    for case in args.cases.split(","):
        cls, hidden = case.split(":")
        H = int(hidden)
        for B in (int(b) for b in args.batch.split(",")):
            torch.manual_seed(0)
            ref = getattr(torch.nn, cls)(H, H)
            sp = getattr(st, cls)(H, H)
            sp.load_state_dict(ref.state_dict())
            x32 = torch.randn(1, B, H)
            h32 = torch.randn(1, B, H)
            # torch's configurations: its fp32 module, and with --precision bf16 its
            # bf16 module too; seqpack's layer takes the fp32 tensors.
            refs = {"fp32": (ref, torch.float32)}
            if bf16:
                refs["bf16"] = (copy.deepcopy(ref).to(torch.bfloat16), torch.bfloat16)

            def inputs(dtype):
                x, h = x32.to(dtype), h32.to(dtype)
                return x, (h, h.clone()) if cls == "LSTM" else h, x.clone().requires_grad_()

            def infer(m, dtype, autocast):
                x, hx, _ = inputs(dtype)
                ac = amp(autocast)

                def f():
                    with torch.no_grad(), ac:
                        m(x, hx)
                return f

            def train(m, dtype, autocast):
                _, hx, xr = inputs(dtype)
                ac = amp(autocast)

                def f():
                    m.zero_grad(set_to_none=True)
                    xr.grad = None
                    with ac:
                        out, _ = m(xr, hx)
                    out.sum().backward()
                return f

            def train_sgd(m, dtype, autocast):
                opt = torch.optim.SGD(m.parameters(), lr=1e-6)
                step = train(m, dtype, autocast)

                def f():
                    step()
                    opt.step()
                return f

            calls = 200 if B == 1 else 50
            for mode, make in (("infer", infer), ("train", train), ("train+sgd", train_sgd)):
                ratios, t_ref, t_sp, won = [], [], [], []
                for _ in range(args.rounds):
                    times = {k: best_per_call(make(m, dt, False), calls)
                             for k, (m, dt) in refs.items()}
                    faster = min(times, key=times.get)
                    a = times[faster]
                    b = best_per_call(make(sp, torch.float32, bf16), calls)
                    ratios.append(a / b)
                    t_ref.append(a)
                    t_sp.append(b)
                    won.append(faster)
                name = f"{cls}({H})"
                print(f"{name:<11} {B:5d} {mode:9s} {statistics.median(t_ref) * 1e6:9.0f} "
                      f"{statistics.median(t_sp) * 1e6:11.0f}  {statistics.median(ratios):.2f} "
                      f"({min(ratios):.2f}-{max(ratios):.2f})"
                      + (f"  {'/'.join(won)}" if bf16 else ""), flush=True)


if __name__ == "__main__":
    main()
