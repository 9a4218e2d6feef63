#!/usr/bin/env python3
"""Per-call cost of going through seqpack.torch: the same workload timed by
`seqpack bench` (one rnn_forward / rnn_backward in C++, nothing else) and
through a seqpack.torch layer from Python (forward under no_grad on the packed
batch; forward + out.data.sum().backward() with zero_grad), alternating round
by round. The difference of the medians is the bridge: argument checks,
operator dispatch, autograd and the hand-over of tensors (it also holds what
any torch model pays: the sum, its backward, the gradient accumulation).
The same run times that harness around one elementwise product of an
output-sized tensor with a parameter ("torch harness"): what a torch model
pays per step whatever its layers are, so the bridge's own share of the
forward+backward overhead is the difference minus that.

    /usr/bin/python3 bench/bench_torch_overhead.py [--workload rnn-tanh-tiny]
        [--rounds 5] [--reps 300] [--seqpack build/seqpack]
SEQPACK_PYTHON_ROOT picks another seqpack package root (an older build).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from torch.nn.utils import rnn as trnn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.environ.get("SEQPACK_PYTHON_ROOT") or
                os.path.join(ROOT, os.environ.get("SEQPACK_BUILD_DIR", "build"), "python"))
import seqpack  # noqa: E402
import seqpack.torch as spt  # noqa: E402
from bench_python_torch import CLASSES  # noqa: E402
from torch_threads import set_torch_threads  # noqa: E402


def cpp_times(binary, workloads, name):
    """{mode: median process CPU seconds per batch} from `seqpack bench`."""
    out = subprocess.run([binary, "bench", "--workloads", workloads, "--workload", name,
                          "--threads", "1", "--json", "--mode", "forward_packed",
                          "--mode", "train_packed"],
                         capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {r["mode"]: r["cpu_sec_per_batch"] for r in rows}


def python_times(module, packed, reps):
    """(forward, forward+backward) median process CPU seconds per call. Each
    mode runs its calls back to back, as `seqpack bench` does (a forward timed
    right after a training step would also pay for the caches that step
    evicted, which is not the bridge's cost)."""
    fwd, train = [], []
    for _ in range(reps):
        c = time.process_time()
        with torch.no_grad():
            module(packed)
        fwd.append(time.process_time() - c)
    for _ in range(reps):
        c = time.process_time()
        module.zero_grad(set_to_none=True)
        packed.data.grad = None
        out, _ = module(packed)
        out.data.sum().backward()
        train.append(time.process_time() - c)
    return statistics.median(fwd), statistics.median(train)


def harness_floor(module, rows, width, reps):
    """Median process CPU seconds of zero_grad + one elementwise op on a
    parameter + sum + backward: the training step's fixed cost in torch."""
    x = torch.randn(rows, width)
    p = next(module.parameters())
    times = []
    for _ in range(reps):
        c = time.process_time()
        module.zero_grad(set_to_none=True)
        (x * p.view(-1)[:width]).sum().backward()
        times.append(time.process_time() - c)
    return statistics.median(times)


def linear_floor(module, reps):
    """Median process CPU seconds of a training step (zero_grad, forward,
    sum, backward) of a torch.nn.Linear(input_size, hidden_size) on 4 rows:
    the lightest torch layer with weights, i.e. what any layer pays per call
    for the dispatcher and autograd, with next to no arithmetic."""
    lin = torch.nn.Linear(module.input_size, module.hidden_size)
    x = torch.randn(4, module.input_size, requires_grad=True)
    times = []
    for _ in range(reps):
        c = time.process_time()
        lin.zero_grad(set_to_none=True)
        x.grad = None
        lin(x).sum().backward()
        times.append(time.process_time() - c)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default=os.path.join(ROOT, "..", "shared", "workloads.json"))
    p.add_argument("--workload", default="rnn-tanh-tiny")
    p.add_argument("--seqpack", default=os.path.join(ROOT, "build", "seqpack"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=300, help="Python calls per round and mode")
    args = p.parse_args()
    set_torch_threads(1)
    seqpack.set_num_threads(1)
    with open(args.workloads) as f:
        w = next(w for w in json.load(f)["workloads"] if w["name"] == args.workload)
    _, scls, extra = CLASSES[w["cell"]]
    torch.manual_seed(0)
    m = scls(w["input_size"], w["hidden_size"], num_layers=w["num_layers"],
             bidirectional=w["bidirectional"], **extra)
    lengths = torch.tensor(w["lengths"])
    x = torch.randn(int(lengths.max()), len(w["lengths"]), w["input_size"])
    packed = trnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
    # The packed rows are a leaf that requires grad, as in `seqpack bench`'s
    # train_packed, so both compute the input gradient (an input without grad
    # skips the first layer's dX product, which would hide overhead).
    packed = trnn.PackedSequence(packed.data.detach().requires_grad_(), packed.batch_sizes,
                                 packed.sorted_indices, packed.unsorted_indices)
    python_times(m, packed, 20)  # warm-up

    print(f"seqpack from {os.path.dirname(seqpack.__file__)}; workload {w['name']}, 1 thread; "
          f"median process CPU µs per call")
    print(f"{'round':>5} {'C++ fwd':>9} {'torch fwd':>9} {'overhead':>9} "
          f"{'C++ f+b':>9} {'torch f+b':>9} {'overhead':>9} {'harness':>9} {'bridge':>9}")
    over_f, over_t, bridge = [], [], []
    width = m.proj_size or m.hidden_size
    for r in range(args.rounds):
        cpp = cpp_times(args.seqpack, args.workloads, w["name"])
        f, t = python_times(m, packed, args.reps)
        floor = harness_floor(m, packed.data.size(0), width, args.reps)
        cf, ct = cpp["forward_packed"], cpp["train_packed"]
        over_f.append(f - cf)
        over_t.append(t - ct)
        bridge.append(t - ct - floor)
        print(f"{r:>5} {1e6 * cf:>9.1f} {1e6 * f:>9.1f} {1e6 * (f - cf):>9.1f} "
              f"{1e6 * ct:>9.1f} {1e6 * t:>9.1f} {1e6 * (t - ct):>9.1f} {1e6 * floor:>9.1f} "
              f"{1e6 * (t - ct - floor):>9.1f}", flush=True)
    print(f"overhead per call, µs: forward {1e6 * min(over_f):.1f} to {1e6 * max(over_f):.1f} "
          f"(median {1e6 * statistics.median(over_f):.1f}); forward+backward "
          f"{1e6 * min(over_t):.1f} to {1e6 * max(over_t):.1f} "
          f"(median {1e6 * statistics.median(over_t):.1f}), of which the bridge's own "
          f"{1e6 * min(bridge):.1f} to {1e6 * max(bridge):.1f} "
          f"(median {1e6 * statistics.median(bridge):.1f})")
    print(f"for scale: a training step of torch.nn.Linear({m.input_size}, {m.hidden_size}) on "
          f"4 rows costs {1e6 * linear_floor(m, args.reps):.1f} µs in all")


if __name__ == "__main__":
    main()
