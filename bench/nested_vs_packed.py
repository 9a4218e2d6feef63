#!/usr/bin/env python3
"""What a jagged nested tensor costs a seqpack.torch layer over the same batch as
a PackedSequence (PyTorch 2.6+: docs/python.md "Nested tensors").

For each workload one batch of random lengths (zero-length sequences included)
is made as a nested tensor `nt` and as `pack_nested(nt)`; the layer is timed on
each, in paired rounds: every round times both calls (alternating which goes
first) over --reps calls each and takes the ratio of their medians; the ratio
printed is the median of the rounds' ratios (a slow moment of a shared machine
hits both sides of a round), in wall time and in process CPU time (the machine
is shared). --malloc tuned runs with glibc's mmap and trim thresholds raised
(docs/performance.md, "PyTorch's allocator"): the nested call allocates its
gathered rows afresh on every call, which glibc's defaults may serve with
mmap and page faults, while the packed side's input is one tensor. Forward: under no_grad. Training step: zero_grad,
forward, sum of the output rows + sum of h_n, backward (gradients into the
layer's weights and into the input rows, which require grad on both sides).

The nested call pays what the packed one does not. On the CPU (float32 and
float64, seqpack's own kernels) seqpack::rnn_nested takes the values and
offsets: its plan is made from the offsets in C++ (kept while they repeat) and
the rows move between the values' order and the packed order by one row copy
in C++ each way, forward and backward. Around it: the nested output's
construction and, in training, the links between the nested tensors and their
values (two autograd functions) and torch's nested-tensor autograd (the
output's values() and its backward, the leaf's gradient accumulation), each a
Python dispatch. The last lines measure those fixed costs: torch's own (a leaf
nested tensor, x * 2, values(), sum, backward) and the plumbing alone (the
layer's two links with no layer between them).

    bash scripts/debian13.sh bash -c 'PYTHONPATH=$PWD/build-debian13/python:$PWD/python \\
        /usr/bin/python3 bench/nested_vs_packed.py [--rounds 11] [--reps 20] [--threads 1] \\
        [--malloc tuned]'
"""
import argparse
import os
import statistics
import sys
import time

import torch

import seqpack.torch as st

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_threads import add_malloc_option, apply_malloc, malloc_settings  # noqa: E402

# (name, layer class, batch, longest length, input size, hidden size, layers)
WORKLOADS = [
    ("LSTM B32 T0-64 64->128", st.LSTM, 32, 64, 64, 128, 1),
    ("GRU B32 T0-64 64->128 x2 bi", st.GRU, 32, 64, 64, 128, 2),
    ("LSTM B64 T0-128 128->256", st.LSTM, 64, 128, 128, 256, 1),
    ("LSTM B8 T0-16 16->32 (small)", st.LSTM, 8, 16, 16, 32, 1),
]


def make(cls, B, T, F, H, layers, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[0] = T
    torch.manual_seed(seed)
    m = cls(F, H, num_layers=layers, bidirectional=layers > 1, batch_first=True)
    seqs = [torch.randn(int(n), F, generator=g) for n in lengths]
    nt = torch.nested.nested_tensor(seqs, layout=torch.jagged, requires_grad=True)
    packed = st.pack_nested(nt.detach())
    packed = packed._replace(data=packed.data.clone().requires_grad_())
    return m, nt, packed


def forward_call(m, x):
    with torch.no_grad():
        m(x)


def train_call(m, x):
    m.zero_grad(set_to_none=True)
    # A fresh input gradient each step, on both sides: PyTorch 2.6 cannot add a
    # second gradient into a nested tensor's ("operator aten::stride does not exist").
    (x if isinstance(x, torch.Tensor) else x.data).grad = None
    out, hidden = m(x)
    h_n = hidden[0] if isinstance(hidden, tuple) else hidden
    rows = out.values() if isinstance(out, torch.Tensor) else out.data
    (rows.sum() + h_n.sum()).backward()


def median_time(fn, reps):
    """(median wall s, median process CPU s) per call."""
    wall, cpu = [], []
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def paired_ratio(call, m, nt, packed, rounds, reps):
    """Medians over rounds: (nested/packed wall, nested/packed CPU, nested wall s,
    packed wall s)."""
    call(m, nt), call(m, packed)  # warm-up (first-call allocations, lazy imports)
    wall_ratios, cpu_ratios, tn, tp = [], [], [], []
    for r in range(rounds):
        sides = [("n", nt), ("p", packed)]
        if r % 2:
            sides.reverse()
        got = {k: median_time(lambda x=x: call(m, x), reps) for k, x in sides}
        wall_ratios.append(got["n"][0] / got["p"][0])
        cpu_ratios.append(got["n"][1] / max(got["p"][1], 1e-9))
        tn.append(got["n"][0])
        tp.append(got["p"][0])
    return (statistics.median(wall_ratios), statistics.median(cpu_ratios), statistics.median(tn),
            statistics.median(tp))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--seed", type=int, default=62)
    add_malloc_option(p)
    args = p.parse_args()
    if args.rounds < 1 or args.reps < 1:
        raise SystemExit(f"nested_vs_packed: --rounds {args.rounds} and --reps {args.reps} "
                         f"must be >= 1")
    apply_malloc(args.malloc)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.rounds} paired rounds "
          f"x {args.reps} calls; times are wall medians per call, ratios nested/packed "
          f"(wall, process CPU); allocator: {malloc_settings()}")
    print(f"{'workload':30} {'rows':>5} {'fwd packed':>10} {'nested':>9} {'wall':>5} {'cpu':>5} "
          f"{'step packed':>11} {'nested':>9} {'wall':>5} {'cpu':>5}")
    for name, cls, B, T, F, H, layers in WORKLOADS:
        m, nt, packed = make(cls, B, T, F, H, layers, args.seed)
        fw, fc, fn, fp = paired_ratio(forward_call, m, nt, packed, args.rounds, args.reps)
        tw, tc, tn, tp = paired_ratio(train_call, m, nt, packed, args.rounds, args.reps)
        print(f"{name:30} {packed.data.size(0):5d} {fp * 1e3:8.3f}ms {fn * 1e3:7.3f}ms "
              f"{fw:5.2f} {fc:5.2f} {tp * 1e3:9.3f}ms {tn * 1e3:7.3f}ms {tw:5.2f} {tc:5.2f}")

    # What torch itself charges a training step for a nested tensor, whatever the
    # layer: a leaf nested tensor, one elementwise op, values(), sum, backward,
    # against the same on its values as a plain tensor.
    _, nt, _ = make(st.LSTM, 8, 16, 16, 32, 1, args.seed)
    plain = nt.values().detach().clone().requires_grad_()

    def nested_floor(x):
        x.grad = None
        (x * 2).values().sum().backward()

    def plain_floor(x):
        x.grad = None
        (x * 2).sum().backward()

    nested_floor(nt), plain_floor(plain)
    fn = statistics.median(median_time(lambda: nested_floor(nt), args.reps)[0]
                           for _ in range(args.rounds))
    fp = statistics.median(median_time(lambda: plain_floor(plain), args.reps)[0]
                           for _ in range(args.rounds))
    print(f"torch's own nested-tensor autograd (x * 2, values(), sum, backward on a leaf): "
          f"{fn * 1e3:.3f} ms against {fp * 1e3:.3f} ms on a plain tensor")

    # A training step of the nested path's plumbing with no layer: the leaf's
    # values through _ValuesOfNested, a nested tensor of them through
    # _NestedOfValues, values(), sum, backward: what a step on a nested tensor
    # costs beyond the same step on its packed rows, whatever the layer.
    nested_mod = sys.modules["seqpack._torch_nested"]
    if hasattr(nested_mod, "_NestedOfValues"):
        def plumbing(x):
            x.grad = None
            rows = nested_mod._ValuesOfNested.apply(x)
            nested_mod._NestedOfValues.apply(rows, x._offsets).values().sum().backward()

        plumbing(nt)
        fn = statistics.median(median_time(lambda: plumbing(nt), args.reps)[0]
                               for _ in range(args.rounds))
        print(f"the nested path's plumbing alone (no layer; values(), sum, backward on a leaf): "
              f"{fn * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
