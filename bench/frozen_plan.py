"""The input gradient of a frozen 2-layer bidirectional LSTM (lstm-bi-2layer's shapes) through
seqpack.torch, with its weights kept in the operators' model plan, against the same call with
the plan made afresh at every call (an in-place no-op under no_grad moves a weight's version,
so the operators' cache misses: what every such call cost before the plan served it).
Interleaved rounds, medians.

    PYTHONPATH=build/python:python /usr/bin/python3 bench/frozen_plan.py --threads 1
"""
import argparse
import json
import os
import statistics
import time

import torch
from torch.nn.utils import rnn as trnn

import seqpack
import seqpack.torch as spt


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5, help="calls per round and variant")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    seqpack.set_num_threads(args.threads)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workloads.json")
    with open(path, encoding="utf-8") as f:
        wl = next(w for w in json.load(f)["workloads"] if w["name"] == "lstm-bi-2layer")
    torch.manual_seed(0)
    m = spt.LSTM(wl["input_size"], wl["hidden_size"], num_layers=wl["num_layers"],
                 bidirectional=wl["bidirectional"])
    m.requires_grad_(False)
    lengths = torch.tensor(wl["lengths"])
    x = torch.randn(int(lengths.max()), len(lengths), wl["input_size"])

    def call(new_plan):
        if new_plan:
            with torch.no_grad():
                m.weight_hh_l0.add_(0.0)
        xs = x.clone().requires_grad_(True)
        out, _ = m(trnn.pack_padded_sequence(xs, lengths, enforce_sorted=False))
        out.data.sum().backward()

    for new_plan in (False, True):
        for _ in range(3):
            call(new_plan)
    times = {False: [], True: []}
    for _ in range(args.rounds):
        for new_plan in (False, True):
            t0 = time.perf_counter()
            for _ in range(args.calls):
                call(new_plan)
            times[new_plan].append((time.perf_counter() - t0) / args.calls)
    kept, fresh = statistics.median(times[False]), statistics.median(times[True])
    print(f"threads {args.threads}: plan kept {kept * 1e3:.1f} ms, plan made every call "
          f"{fresh * 1e3:.1f} ms, ratio {fresh / kept:.3f}")


if __name__ == "__main__":
    main()
