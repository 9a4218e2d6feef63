#!/usr/bin/env python3
"""Token imbalance across ranks: mean over an epoch of (most / fewest real tokens in a step),
with and without seqpack's token balancing, on the main job's training words and on
long-tailed lengths (log-normal, 1..2000):

    ./build/seqpack data export --out /tmp/langid
    /usr/bin/python3 bench/data_balance.py --split /tmp/langid

Without balancing: the bucketing sampler's batches dealt round-robin to the ranks
(batches[rank::R], the remainder dropped), which is what splitting one sampler's batches
across ranks gives. With: DistributedBucketBatchSampler.
"""
import argparse
import os

import numpy as np

from seqpack import _seqpack
from seqpack.data import BucketBatchSampler, DistributedBucketBatchSampler


def imbalance(per_rank, lengths):
    t = np.array([_seqpack.batch_tokens(lengths, r) for r in per_rank], dtype=np.float64)
    return float(np.mean(t.max(axis=0) / np.maximum(t.min(axis=0), 1)))


def round_robin(batches, ranks):
    steps = len(batches) // ranks
    return [batches[r:steps * ranks:ranks] for r in range(ranks)]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", help="directory from `seqpack data export` (the main job's words)")
    ap.add_argument("--epochs", type=int, default=3, help="epochs averaged")
    args = ap.parse_args()
    sets = []
    if args.split:
        with open(os.path.join(args.split, "train.tsv"), encoding="utf-8") as f:
            words = [len(line.rstrip("\n").split("\t", 1)[1]) for line in f if line.strip()]
        sets.append(("main job words", words, 128, 2048))
    rng = np.random.default_rng(0)
    tail = np.clip(rng.lognormal(4.0, 1.0, 50000).astype(np.int64) + 1, 1, 2000).tolist()
    sets.append(("long tail", tail, 32, 8192))
    print("| lengths | ranks | batch_size, round-robin | max_tokens, round-robin | "
          "batch_size, distributed | max_tokens, distributed |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, lengths, bs, mt in sets:
        for ranks in (2, 3, 8):
            cells = []
            for kw in (dict(batch_size=bs), dict(max_tokens=mt)):
                vals = []
                s = BucketBatchSampler(lengths, **kw)
                for e in range(args.epochs):
                    s.set_epoch(e)
                    vals.append(imbalance(round_robin(list(s), ranks), lengths))
                cells.append(np.mean(vals))
            for kw in (dict(batch_size=bs), dict(max_tokens=mt)):
                vals = []
                d = DistributedBucketBatchSampler(lengths, ranks, 0, **kw)
                for e in range(args.epochs):
                    d.set_epoch(e)
                    vals.append(d.token_imbalance())
                cells.append(np.mean(vals))
            print(f"| {name} (batch_size {bs}, max_tokens {mt}) | {ranks} | " +
                  " | ".join(f"{c:.3f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
