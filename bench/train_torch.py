#!/usr/bin/env python3
"""Trains the model of `seqpack train` in PyTorch on one thread, on exactly the
split seqpack uses, and prints seconds per epoch, tokens/s and test accuracy,
so the two can be compared in one run:

    ./build/seqpack data export --out /tmp/langid
    /usr/bin/python3 bench/train_torch.py --split /tmp/langid --epochs 1
    ./build/seqpack train --threads 1 --epochs 1

(--seqpack ./build/seqpack exports the split itself when --split is missing.)
Model: Embedding(V, 32, padding_idx=0) -> bidirectional LSTM(128) over packed
batches -> [h_n fwd ; h_n bwd] -> Linear(256, classes); Adam lr 2e-3, batches
of 128 grouped by length (shuffled, sorted by length, cut, batch order shuffled).
Run with Debian's /usr/bin/python3.
"""
import argparse
import os
import random
import subprocess
import sys
import tempfile
import time

import torch
from torch.nn.utils.rnn import PackedSequence, pack_sequence


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from torch_char_classifier import CharClassifier  # noqa: E402
from torch_threads import (add_malloc_option, add_openblas_option, apply_malloc,  # noqa: E402
                           apply_openblas_core, malloc_settings, set_torch_threads)


def read_split(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            label, word = line.split("\t", 1)
            rows.append((int(label), word))
    return rows


def batches_by_length(rows, batch_size, rng):
    idx = list(range(len(rows)))
    rng.shuffle(idx)
    idx.sort(key=lambda i: len(rows[i][1]))
    batches = [idx[i:i + batch_size] for i in range(0, len(idx), batch_size)]
    rng.shuffle(batches)
    return batches


def encode(rows, ids, vocab):
    seqs = [torch.tensor([vocab.get(c, 1) for c in rows[i][1]], dtype=torch.int64) for i in ids]
    labels = torch.tensor([rows[i][0] for i in ids], dtype=torch.int64)
    return pack_sequence(seqs, enforce_sorted=False), labels


@torch.no_grad()
def accuracy(model, rows, vocab):
    model.eval()
    ok = 0
    for start in range(0, len(rows), 512):
        ids = list(range(start, min(len(rows), start + 512)))
        packed, labels = encode(rows, ids, vocab)
        ok += (model(packed).argmax(1) == labels).sum().item()
    model.train()
    return ok / max(1, len(rows))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", help="directory written by `seqpack data export --out DIR`")
    ap.add_argument("--seqpack", help="seqpack binary, to export the split when --split is not given")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--embed", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile", action="store_true",
                    help="print the CPU seconds of each phase of the step per epoch (as seqpack train --profile)")
    add_malloc_option(ap)
    add_openblas_option(ap)
    args = ap.parse_args()
    apply_malloc(args.malloc)
    openblas = apply_openblas_core(args.openblas_core)

    tmp = None
    split = args.split
    if split is None:
        if not args.seqpack:
            ap.error("give --split DIR (from `seqpack data export`) or --seqpack BINARY")
        tmp = tempfile.TemporaryDirectory()
        split = tmp.name
        subprocess.run([args.seqpack, "data", "export", "--out", split], check=True,
                       stdout=subprocess.DEVNULL)
    blas_limited = set_torch_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)

    train = read_split(os.path.join(split, "train.tsv"))
    val = read_split(os.path.join(split, "val.tsv"))
    test = read_split(os.path.join(split, "test.tsv"))
    with open(os.path.join(split, "labels.txt"), encoding="utf-8") as f:
        labels = [l.rstrip("\n") for l in f if l.strip()]
    # Same vocabulary as seqpack's: <pad> = 0, <unk> = 1, then the training
    # split's code points in increasing order.
    chars = sorted({c for _, w in train for c in w})
    vocab = {c: i + 2 for i, c in enumerate(chars)}

    model = CharClassifier(len(chars) + 2, args.embed, args.hidden, len(labels))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s) "
          f"(OpenBLAS {'limited too' if blas_limited else 'not found'}); "
          f"{len(train)} train, {len(val)} val, {len(test)} test; vocabulary {len(chars) + 2}")
    print(f"allocator: {malloc_settings()}; {openblas}")
    epoch_times, cpu_times = [], []
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        c0 = time.process_time()  # CPU time: comparable on a shared machine
        tokens = 0
        total = 0.0
        # Phase clock for --profile: CPU seconds charged to the phase that just ended.
        phases = dict.fromkeys(["batching", "encode", "forward", "loss", "zero_grad", "backward", "step", "other"], 0.0)
        last = [time.process_time()]

        def mark(name):
            if args.profile:
                now = time.process_time()
                phases[name] += now - last[0]
                last[0] = now

        batches = batches_by_length(train, args.batch_size, rng)
        mark("batching")
        for ids in batches:
            packed, y = encode(train, ids, vocab)
            mark("encode")
            logits = model(packed)
            mark("forward")
            loss = loss_fn(logits, y)
            mark("loss")
            opt.zero_grad()
            mark("zero_grad")
            loss.backward()
            mark("backward")
            opt.step()
            mark("step")
            tokens += packed.data.numel()
            total += loss.item()
            mark("other")
        secs = time.perf_counter() - t0
        cpu = time.process_time() - c0
        if args.profile:
            spent = sum(phases.values())
            print("step profile (cpu s): total {:.3f}, ".format(spent) +
                  ", ".join(f"{k} {v:.3f} ({100 * v / max(spent, 1e-9):.1f}%)" for k, v in phases.items()))
        epoch_times.append(secs)
        cpu_times.append(cpu)
        print(f"epoch {epoch}/{args.epochs}: train loss {total / len(batches):.4f}, "
              f"validation accuracy {100 * accuracy(model, val, vocab):.2f}%, {secs:.2f} s, cpu {cpu:.2f} s "
              f"({len(train) / secs:.0f} words/s, {tokens / secs:.0f} tokens/s)", flush=True)
    n = max(1, len(epoch_times))
    print(f"seconds per epoch: {sum(epoch_times) / n:.2f} (cpu {sum(cpu_times) / n:.2f})")
    print(f"test accuracy: {100 * accuracy(model, test, vocab):.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
