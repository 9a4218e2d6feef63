#!/usr/bin/python3
"""Memory over many calls of new shapes: seqpack.torch.LSTM(8, 16) trained
(forward and backward) on random batch sizes and lengths, packed, and the
process's resident and virtual memory (/proc/self/status VmRSS, VmSize)
after call 1,000 and after the last. Every cache a call fills (oneDNN's
primitives and reorders, the operators' plans, the packing plans, the buffer
pool) is bounded, so after the first thousand calls memory stays flat:
the target is at most 64 MB more resident and 512 MB more virtual memory
(issue 59; docs/performance.md, "Caches and their bounds").

    PYTHONPATH=build/python /usr/bin/python3 bench/memory_growth.py
    PYTHONPATH=build/python /usr/bin/python3 bench/memory_growth.py --calls 20000 --check

With --check it exits 1 where either bound is passed.
"""
import argparse
import json
import sys


def status():
    """(VmRSS, VmSize) in MB."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmSize"):
                fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmSize"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--baseline-call", type=int, default=1000)
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--max-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action="store_true", help="exit 1 past the bounds")
    p.add_argument("--rss-bound-mb", type=float, default=64)
    p.add_argument("--vm-bound-mb", type=float, default=512)
    args = p.parse_args()

    import torch  # noqa: PLC0415
    import seqpack.torch as st  # noqa: PLC0415
    from torch.nn.utils.rnn import pack_padded_sequence  # noqa: PLC0415

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(args.seed)
    m = st.LSTM(8, 16)
    start = status()
    at_baseline = None
    for call in range(1, args.calls + 1):
        batch = int(torch.randint(1, args.max_batch + 1, (1,), generator=g))
        lengths = torch.randint(1, args.max_len + 1, (batch,), generator=g)
        x = torch.randn(int(lengths.max()), batch, 8, generator=g)
        out, _ = m(pack_padded_sequence(x, lengths, enforce_sorted=False))
        out.data.sum().backward()
        if call == args.baseline_call:
            at_baseline = status()
    end = status()
    result = {
        "calls": args.calls, "seed": args.seed, "threads": args.threads,
        "start_mb": {"rss": round(start[0], 1), "vm": round(start[1], 1)},
        f"after_call_{args.baseline_call}_mb": {"rss": round(at_baseline[0], 1),
                                               "vm": round(at_baseline[1], 1)},
        "end_mb": {"rss": round(end[0], 1), "vm": round(end[1], 1)},
        "growth_after_baseline_mb": {"rss": round(end[0] - at_baseline[0], 1),
                                     "vm": round(end[1] - at_baseline[1], 1)},
    }
    print(json.dumps(result, indent=1))
    grown = result["growth_after_baseline_mb"]
    if args.check and (grown["rss"] > args.rss_bound_mb or grown["vm"] > args.vm_bound_mb):
        print(f"memory grew past the bounds ({args.rss_bound_mb} MB resident, "
              f"{args.vm_bound_mb} MB virtual)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
