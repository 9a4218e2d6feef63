#!/usr/bin/env python3
"""Per-call cost of going through seqpack.torch: the same workload timed by
`seqpack bench` (one rnn_forward / rnn_backward in C++, nothing else) and
through a seqpack.torch layer from Python (forward under no_grad on the packed
batch; forward + out.data.sum().backward() with zero_grad), alternating round
by round. All times are median process CPU µs per call.

Columns, forward:
  C++ fwd, torch fwd  the C++ core alone; the seqpack.torch layer.
  overhead            torch fwd - C++ fwd: what the layer adds to the core.
  noop fwd            the floor: seqpack_bench::noop_rnn (bench/torch_noop_op.cpp),
                      an operator with seqpack::rnn's schema that allocates its
                      outputs and does nothing else, called from Python with
                      the arguments the layer passes to seqpack::rnn.
  own                 overhead - noop fwd: seqpack's own share (its Python
                      wrapper, the module call, its C++ conversions and checks).
Columns, forward+backward (training step):
  C++ f+b, torch f+b, overhead  as for the forward.
  harness             zero_grad + one elementwise op on a parameter + sum +
                      backward: what a torch model pays per step whatever its
                      layers are.
  bridge              overhead - harness: argument checks, operator dispatch,
                      autograd node and gradient accumulation, tensor hand-over.
  floor               noop f+b - harness, with noop f+b the no-op operator in
                      the same training harness (its C++ autograd Function
                      saves the same tensors, one saved_data entry, returns
                      gradients of the right shapes for input and weights): the
                      part of the bridge that any custom operator pays in torch,
                      i.e. the lowest the bridge column can go.
  own                 bridge - floor: seqpack's own share of the bridge.
The harness's product and its backward are arithmetic on output-sized
tensors, which the no-op skips, so the floor may be negative; the summary
also gives the no-op f+b over a bare harness (zero_grad + sum + backward of
an output-sized leaf): what a custom operator's autograd node costs at least.
The summary adds the same no-op through a Python torch.autograd.Function (a
bridge written in Python instead of C++) and the cost of calling an empty
torch.nn.Module (every layer pays it; it is in "own" above, not in the floor).
"own" also holds whatever makes the core itself slower inside a torch
training step than in `seqpack bench`. The C++ and Python times come from
different processes and moments: on a shared machine their differences can
swing by tens of µs between rounds (even below zero); --instructions gives
figures that do not.
Without the no-op library (built with -DSEQPACK_BUILD_TORCH=ON
-DSEQPACK_BUILD_BENCHMARKS=ON into <build>/bench/) the floor is skipped.

    /usr/bin/python3 bench/bench_torch_overhead.py [--workload rnn-tanh-tiny]
        [--rounds 5] [--reps 300] [--seqpack build/seqpack] [--noop-library PATH]
        [--instructions N]
--instructions N counts instructions per call instead (valgrind --tool=callgrind,
N calls per mode: the layer's and the no-op's forward and forward+backward,
each split into seqpack's core and the rest); unlike the times they do not
move with the machine's load.
SEQPACK_BUILD_DIR names the build (default build); SEQPACK_PYTHON_ROOT picks
another seqpack package root (an older build).
"""
import argparse
import ctypes
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch.nn.utils import rnn as trnn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, os.environ.get("SEQPACK_BUILD_DIR", "build"))
sys.path.insert(0, os.environ.get("SEQPACK_PYTHON_ROOT") or os.path.join(BUILD, "python"))
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


def bare_harness(module, rows, width, reps):
    """Median process CPU seconds of zero_grad + sum + backward of an
    output-sized leaf: the training harness with no layer and no arithmetic
    besides the sum (harness_floor adds a product and its backward)."""
    out = torch.randn(rows, width, requires_grad=True)
    times = []
    for _ in range(reps):
        c = time.process_time()
        module.zero_grad(set_to_none=True)
        out.grad = None
        out.sum().backward()
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


class _NoopPyFunction(torch.autograd.Function):
    """The no-op as a Python autograd Function: outputs and gradients of the
    right shapes, no arithmetic."""

    @staticmethod
    def forward(ctx, shapes, data, *weights):
        ctx.save_for_backward(data, *weights)
        ctx.set_materialize_grads(False)
        return tuple(data.new_empty(s) for s in shapes)

    @staticmethod
    def backward(ctx, *grads):
        return (None,) + tuple(t.new_empty(t.shape) for t in ctx.saved_tensors)


def noop_args(module, packed):
    """The arguments the seqpack.torch layer passes to seqpack::rnn."""
    return (packed.data, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices,
            None, None, module._flat_weights, module.mode, module.hidden_size,
            module.num_layers, module.bias, module.bidirectional, module.proj_size,
            module.dropout, module.training, None, "fp32")


def op_times(module, packed, call, reps):
    """(forward, forward+backward) median process CPU seconds of `call()`
    (returning the output rows first) in the harness of python_times."""
    fwd, train = [], []
    for _ in range(reps):
        c = time.process_time()
        with torch.no_grad():
            call()
        fwd.append(time.process_time() - c)
    for _ in range(reps):
        c = time.process_time()
        module.zero_grad(set_to_none=True)
        packed.data.grad = None
        out = call()[0]
        out.sum().backward()
        train.append(time.process_time() - c)
    return statistics.median(fwd), statistics.median(train)


def noop_calls(module, packed, library):
    """{name: call} of the no-op operator (None without its library) and of the
    Python autograd Function."""
    calls = {"op": None}
    if os.path.exists(library):
        torch.ops.load_library(library)
        op, args = torch.ops.seqpack_bench.noop_rnn, noop_args(module, packed)
        calls["op"] = lambda: op(*args)
    with torch.no_grad():
        out, h_n = module(packed)
    shapes = [tuple(out.data.shape), tuple(h_n.shape)]
    weights, data = module._flat_weights, packed.data
    calls["py"] = lambda: _NoopPyFunction.apply(shapes, data, *weights)
    return calls


def module_call_floor(reps):
    """Median process CPU seconds of calling an empty torch.nn.Module."""
    class Empty(torch.nn.Module):
        def forward(self, x):
            return x
    e = Empty()
    times = []
    for _ in range(reps):
        c = time.process_time()
        e(None)
        times.append(time.process_time() - c)
    return statistics.median(times)


def _range(name, values):
    return (f"{name} {1e6 * min(values):.1f} to {1e6 * max(values):.1f} "
            f"(median {1e6 * statistics.median(values):.1f})")


def _steps(module, packed, call):
    """(forward, forward+backward) of `call()` (output rows first) as the timed
    modes run them."""
    def forward():
        with torch.no_grad():
            call()

    def train():
        module.zero_grad(set_to_none=True)
        packed.data.grad = None
        call()[0].sum().backward()
    return forward, train


def instructions_child(module, packed, library, n):
    """Under callgrind: each mode's n calls counted as one dump named after it."""
    torch.ops.load_library(library)
    lib = ctypes.CDLL(library)
    lib.seqpack_bench_callgrind_stop.argtypes = [ctypes.c_char_p]
    op, args = torch.ops.seqpack_bench.noop_rnn, noop_args(module, packed)
    modes = list(zip(("layer f", "layer f+b"), _steps(module, packed, lambda: module(packed)[0])))
    modes += zip(("noop f", "noop f+b"), _steps(module, packed, lambda: op(*args)))
    for name, step in modes:
        for _ in range(20):
            step()
        if not lib.seqpack_bench_callgrind_start():
            sys.exit("not under valgrind, or the no-op library was built without "
                     "valgrind's headers")
        for _ in range(n):
            step()
        lib.seqpack_bench_callgrind_stop(name.encode())


def instructions(args):
    """Runs this script under callgrind (--instructions-child) and prints
    instructions per call of each mode: all, in seqpack's core (rnn_forward,
    rnn_backward, inclusive) and the rest. Unlike the times, these do not
    move with the machine's load."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "callgrind.out")
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
               f"--callgrind-out-file={out}", sys.executable, os.path.abspath(__file__),
               "--instructions-child", str(args.instructions), "--workloads", args.workloads,
               "--workload", args.workload, "--noop-library", args.noop_library]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"callgrind run failed:\n{proc.stderr[-2000:]}")
        rows = {}
        for dump in glob.glob(out + ".*"):
            with open(dump) as f:
                text = f.read()
            name = text.split("Client Request: ", 1)[1].split("\n", 1)[0]
            total = int(text.split("\nsummary: ", 1)[1].split()[0])
            annotate = subprocess.run(["callgrind_annotate", "--inclusive=yes", dump],
                                      capture_output=True, text=True, check=True).stdout
            core = sum(int(line.split()[0].replace(",", "")) for line in annotate.splitlines()
                       if "seqpack::rnn_forward(" in line or "seqpack::rnn_backward(" in line)
            rows[name] = (total / args.instructions, core / args.instructions)
    print(f"instructions per call, valgrind --tool=callgrind, {args.instructions} calls per mode, "
          f"workload {args.workload}")
    print(f"{'mode':>10} {'all':>10} {'core':>10} {'rest':>10}")
    for name in ("layer f", "noop f", "layer f+b", "noop f+b"):
        total, core = rows[name]
        print(f"{name:>10} {total:>10.0f} {core:>10.0f} {total - core:>10.0f}")
    own = [rows[f"layer {m}"][0] - rows[f"layer {m}"][1] - rows[f"noop {m}"][0]
           for m in ("f", "f+b")]
    print(f"seqpack's own share (layer's rest - noop's): forward {own[0]:.0f}, "
          f"forward+backward {own[1]:.0f} instructions per call")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default=os.path.join(ROOT, "bench", "workloads.json"))
    p.add_argument("--workload", default="rnn-tanh-tiny")
    p.add_argument("--seqpack", default=os.path.join(BUILD, "seqpack"))
    p.add_argument("--noop-library",
                   default=os.path.join(BUILD, "bench", "libseqpack_bench_torch_noop.so"),
                   help="the no-op operator library (bench/torch_noop_op.cpp)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=300, help="Python calls per round and mode")
    p.add_argument("--instructions", type=int, metavar="N",
                   help="instead of times, count instructions per call over N calls of each "
                        "mode under valgrind --tool=callgrind (needs valgrind)")
    p.add_argument("--instructions-child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.instructions:
        instructions(args)
        return
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
    if args.instructions_child:
        instructions_child(m, packed, args.noop_library, args.instructions_child)
        return
    python_times(m, packed, 20)  # warm-up
    noop = noop_calls(m, packed, args.noop_library)
    for call in noop.values():
        if call is not None:
            op_times(m, packed, call, 20)

    print(f"seqpack from {os.path.dirname(seqpack.__file__)}; workload {w['name']}, 1 thread; "
          f"median process CPU µs per call")
    if noop["op"] is None:
        print(f"floor skipped: no no-op operator library at {args.noop_library} (build "
              f"seqpack_bench_torch_noop: -DSEQPACK_BUILD_TORCH=ON -DSEQPACK_BUILD_BENCHMARKS=ON)")
    print(f"{'':>5} {'--------------------- forward ----------------------':>52} "
          f"{'--------------------------- forward+backward -----------------------------':>79}")
    print(f"{'round':>5} {'C++ fwd':>9} {'torch fwd':>9} {'overhead':>9} {'noop fwd':>9} "
          f"{'own':>9} {'C++ f+b':>9} {'torch f+b':>9} {'overhead':>9} {'harness':>9} "
          f"{'bridge':>9} {'floor':>9} {'own':>9}")
    over_f, over_t, bridge, floor_f, floor_t, own_f, own_t, py_f, py_t, bare_t, node_t = (
        [] for _ in range(11))
    width = m.proj_size or m.hidden_size

    def us(v):
        return f"{1e6 * v:>9.1f}" if v is not None else f"{'-':>9}"

    for r in range(args.rounds):
        cpp = cpp_times(args.seqpack, args.workloads, w["name"])
        f, t = python_times(m, packed, args.reps)
        harness = harness_floor(m, packed.data.size(0), width, args.reps)
        cf, ct = cpp["forward_packed"], cpp["train_packed"]
        over_f.append(f - cf)
        over_t.append(t - ct)
        bridge.append(t - ct - harness)
        nf = nt = None
        if noop["op"] is not None:
            nf, nt = op_times(m, packed, noop["op"], args.reps)
            floor_f.append(nf)
            floor_t.append(nt - harness)
            own_f.append(over_f[-1] - nf)
            own_t.append(bridge[-1] - floor_t[-1])
        pf, pt = op_times(m, packed, noop["py"], args.reps)
        bare = bare_harness(m, packed.data.size(0), width, args.reps)
        py_f.append(pf)
        py_t.append(pt - harness)
        bare_t.append(bare)
        if nt is not None:
            node_t.append(nt - bare)
        print(f"{r:>5} {us(cf)} {us(f)} {us(f - cf)} {us(nf)} "
              f"{us(None if nf is None else own_f[-1])} "
              f"{us(ct)} {us(t)} {us(t - ct)} {us(harness)} {us(bridge[-1])} "
              f"{us(None if nt is None else floor_t[-1])} "
              f"{us(None if nt is None else own_t[-1])}", flush=True)
    print(f"overhead per call, µs: {_range('forward', over_f)}; "
          f"{_range('forward+backward', over_t)}, of which the bridge "
          f"{_range('', bridge).strip()}")
    if floor_t:
        print(f"floor (no-op operator, C++ autograd Function), µs: {_range('forward', floor_f)}; "
              f"{_range('forward+backward over the harness', floor_t)}")
        print(f"seqpack's own share, µs: {_range('forward', own_f)}; "
              f"{_range('bridge - floor', own_t)}")
        print(f"the harness holds arithmetic on output-sized tensors; without it (zero_grad + "
              f"sum + backward of an output-sized leaf, {_range('', bare_t).strip()} µs) the "
              f"no-op operator's f+b costs {_range('', node_t).strip()} µs: what any custom "
              f"operator's node adds to a training step in this torch")
    print(f"the no-op through a Python torch.autograd.Function, µs: {_range('forward', py_f)}; "
          f"{_range('forward+backward over the harness', py_t)}")
    print(f"calling an empty torch.nn.Module costs {1e6 * module_call_floor(args.reps):.1f} µs; "
          f"a training step of torch.nn.Linear({m.input_size}, {m.hidden_size}) on "
          f"4 rows costs {1e6 * linear_floor(m, args.reps):.1f} µs in all")


if __name__ == "__main__":
    main()
