#!/usr/bin/env python3
"""seqpack.torch.LSTM/GRU/RNN vs torch.nn.LSTM/GRU/RNN, packed input, in one run.

For each workload of bench/workloads.json (in the repository; --workloads for
another file): the same weights and the same packed batch (pack_padded_sequence with
the workload's lengths, enforce_sorted=False) through both modules, forward
(under torch.no_grad) and forward+backward (sum of the packed outputs), the
two implementations interleaved repetition by repetition, one thread by
default. Prints median ms per batch and the ratio torch / seqpack (> 1: seqpack
is faster).

    /usr/bin/python3 bench/bench_python_torch.py [--threads 1] [--budget 2]
        [--workloads FILE] [--workload NAME]... [--mode forward|train]...
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
from torch.nn.utils import rnn as trnn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# SEQPACK_PYTHON_ROOT: another seqpack package root to time (e.g. an older build).
sys.path.insert(0, os.environ.get("SEQPACK_PYTHON_ROOT") or
                os.path.join(ROOT, os.environ.get("SEQPACK_BUILD_DIR", "build"), "python"))
import seqpack  # noqa: E402
import seqpack.torch as spt  # noqa: E402
from torch_threads import add_malloc_option, apply_malloc, malloc_settings, set_torch_threads  # noqa: E402

CLASSES = {"lstm": (torch.nn.LSTM, spt.LSTM, {}), "gru": (torch.nn.GRU, spt.GRU, {}),
           "rnn_tanh": (torch.nn.RNN, spt.RNN, {"nonlinearity": "tanh"}),
           "rnn_relu": (torch.nn.RNN, spt.RNN, {"nonlinearity": "relu"})}


def build(w, seed=0):
    tcls, scls, extra = CLASSES[w["cell"]]
    args = (w["input_size"], w["hidden_size"])
    kwargs = dict(num_layers=w["num_layers"], bidirectional=w["bidirectional"], **extra)
    torch.manual_seed(seed)
    t = tcls(*args, **kwargs)
    s = scls(*args, **kwargs)
    s.load_state_dict(t.state_dict())
    lengths = torch.tensor(w["lengths"])
    x = torch.randn(int(lengths.max()), len(w["lengths"]), w["input_size"])
    packed = trnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
    return t, s, packed


def run_once(module, packed, mode):
    """(wall seconds, process CPU seconds) of one batch."""
    start, cpu = time.perf_counter(), time.process_time()
    if mode == "forward":
        with torch.no_grad():
            module(packed)
    else:
        module.zero_grad(set_to_none=True)
        out, _ = module(packed)
        out.data.sum().backward()
    return time.perf_counter() - start, time.process_time() - cpu


def measure(w, mode, budget, max_reps):
    t, s, packed = build(w)
    run_once(t, packed, mode)  # warm-up (also tells how slow each is)
    run_once(s, packed, mode)
    times = {"torch": [], "seqpack": [], "torch_cpu": [], "seqpack_cpu": []}
    spent = 0.0
    while len(times["torch"]) < max_reps and (spent < budget or len(times["torch"]) < 1):
        for name, m in (("torch", t), ("seqpack", s)):  # interleaved
            dt, cpu = run_once(m, packed, mode)
            times[name].append(dt)
            times[name + "_cpu"].append(cpu)
            spent += dt
    return {k: statistics.median(v) for k, v in times.items()}, len(times["torch"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default=os.path.join(ROOT, "bench", "workloads.json"),
                   help="workloads JSON (default: the repository's bench/workloads.json)")
    p.add_argument("--workload", action="append", help="only these (repeatable)")
    p.add_argument("--mode", action="append", choices=["forward", "train"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--budget", type=float, default=2.0,
                   help="seconds per measurement, both implementations together")
    p.add_argument("--max-reps", type=int, default=15)
    add_malloc_option(p)
    args = p.parse_args()
    apply_malloc(args.malloc)

    set_torch_threads(args.threads)  # torch's and the OpenBLAS its GEMMs call
    seqpack.set_num_threads(args.threads)
    with open(args.workloads) as f:
        workloads = json.load(f)["workloads"]
    if args.workload:
        workloads = [w for w in workloads if w["name"] in args.workload]
    modes = args.mode or ["forward", "train"]

    print(f"seqpack from {os.path.dirname(seqpack.__file__)}")
    print(f"allocator: {malloc_settings()}")
    print(f"threads={args.threads} torch {torch.__version__}; median ms per batch (wall, and "
          f"process CPU time, steadier on a shared machine); ratio = torch / seqpack "
          f"(> 1: seqpack faster)")
    print(f"{'workload':<16} {'mode':<8} {'tokens':>6} {'torch ms':>10} {'seqpack ms':>10} "
          f"{'ratio':>7} {'torch cpu':>10} {'seqpack cpu':>11} {'cpu ratio':>9} {'reps':>4}")
    for w in workloads:
        for mode in modes:
            med, reps = measure(w, mode, args.budget, args.max_reps)
            print(f"{w['name']:<16} {mode:<8} {sum(w['lengths']):>6} {1e3 * med['torch']:>10.2f} "
                  f"{1e3 * med['seqpack']:>10.2f} {med['torch'] / med['seqpack']:>7.2f} "
                  f"{1e3 * med['torch_cpu']:>10.2f} {1e3 * med['seqpack_cpu']:>11.2f} "
                  f"{med['torch_cpu'] / med['seqpack_cpu']:>9.2f} {reps:>4}", flush=True)


if __name__ == "__main__":
    main()
