#!/usr/bin/env python3
"""Trains the main job's model (`seqpack train`) across processes with PyTorch's
DistributedDataParallel, the gloo backend and seqpack's distributed bucketing sampler.

    ./build/seqpack data export --out /tmp/langid
    torchrun --nproc_per_node 2 examples/ddp_langid.py --split /tmp/langid
    /usr/bin/python3 examples/ddp_langid.py --split /tmp/langid      # one process

Model: Embedding(V, 32, padding_idx=0) -> bidirectional seqpack.torch.LSTM(128) over packed
batches -> both final states -> Linear(256, classes); Adam (lr 2e-3). Batches come from
DistributedBucketBatchSampler(max_tokens=...): every rank gets the same number of batches and
about the same number of characters per step. The loss of a step is the sum of the
cross-entropies on all ranks divided by the global token count (or sequence count, with
--normalize sequences), so N ranks make the same update as one process on the union of their
batches; every rank computes that count from the sampler's plan, without an all-reduce. Prints tokens/s per rank and in total. Run with Debian's /usr/bin/python3.
"""
import argparse
import datetime
import os
import sys
import time


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", required=True,
                    help="directory written by `seqpack data export --out DIR`")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=2048, help="characters per rank and step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--embed", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="threads per process")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--normalize", choices=["tokens", "sequences"], default="tokens")
    ap.add_argument("--max-steps", type=int, default=0, help="stop each epoch after N steps")
    ap.add_argument("--no-eval", action="store_true", help="skip the validation accuracy")
    ap.add_argument("--dump", help="directory: each rank saves its batch indices and the "
                                   "all-reduced gradients of the first --dump-steps steps")
    ap.add_argument("--dump-steps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300,
                    help="seconds a collective may wait before failing (no hang)")
    return ap.parse_args(argv)


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None:
    # Before torch loads OpenBLAS: its thread count is read at load time.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.utils.rnn import PackedSequence  # noqa: E402

import seqpack  # noqa: E402
from seqpack.data import DistributedBucketBatchSampler  # noqa: E402
from seqpack.torch import LSTM  # noqa: E402
from seqpack.torch import collate_packed  # noqa: E402


def read_split(path):
    """[(label, word)] from a `label index<TAB>word` file."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line:
                label, word = line.split("\t", 1)
                rows.append((int(label), word))
    return rows


def vocabulary(rows):
    """seqpack's: <pad> = 0, <unk> = 1, then the training words' code points in order."""
    return {c: i + 2 for i, c in enumerate(sorted({c for _, w in rows for c in w}))}


def encode(rows, vocab):
    return [(torch.tensor([vocab.get(c, 1) for c in w], dtype=torch.int64), y) for y, w in rows]


class Classifier(torch.nn.Module):
    def __init__(self, vocab, embed, hidden, classes):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab, embed, padding_idx=0)
        self.lstm = LSTM(embed, hidden, bidirectional=True)
        self.fc = torch.nn.Linear(2 * hidden, classes)

    def forward(self, packed_ids):
        x = PackedSequence(self.embedding(packed_ids.data), packed_ids.batch_sizes,
                           packed_ids.sorted_indices, packed_ids.unsorted_indices)
        _, (h_n, _) = self.lstm(x)
        return self.fc(torch.cat([h_n[0], h_n[1]], dim=1))


def build_model(args, vocab_size, classes):
    torch.manual_seed(args.seed)
    model = Classifier(vocab_size, args.embed, args.hidden, classes)
    return model.to(getattr(torch, args.dtype))


def step_loss(model, packed, labels, denominator):
    """Sum of the cross-entropies of this batch / `denominator` (the global count)."""
    loss = torch.nn.functional.cross_entropy(model(packed), labels, reduction="sum")
    return loss / denominator


def global_count(batch, lengths, normalize):
    """Tokens (characters) or sequences of one batch of indices."""
    return sum(lengths[i] for i in batch) if normalize == "tokens" else len(batch)


@torch.no_grad()
def accuracy(model, data):
    model.eval()
    ok = 0
    for start in range(0, len(data), 512):
        packed, labels = collate_packed(data[start:start + 512])
        ok += (model(packed).argmax(1) == labels).sum().item()
    model.train()
    return ok / max(1, len(data))


def main(args):
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    world = dist.get_world_size() if distributed else 1
    rank = dist.get_rank() if distributed else 0
    torch.set_num_threads(args.threads)
    seqpack.set_num_threads(args.threads)

    train = read_split(os.path.join(args.split, "train.tsv"))
    with open(os.path.join(args.split, "labels.txt"), encoding="utf-8") as f:
        classes = len([line for line in f if line.strip()])
    vocab = vocabulary(train)
    data = encode(train, vocab)
    lengths = [len(w) for _, w in train]
    sampler = DistributedBucketBatchSampler(lengths, num_replicas=world,
                                            rank=rank, max_tokens=args.max_tokens,
                                            seed=args.seed)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler, collate_fn=collate_packed)

    model = build_model(args, len(vocab) + 2, classes)
    net = torch.nn.parallel.DistributedDataParallel(model) if distributed else model
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    if rank == 0:
        print(f"{world} process(es), {args.threads} thread(s) each; {len(train)} words, "
              f"{len(sampler)} steps per epoch, max_tokens {args.max_tokens} per rank; "
              f"token imbalance across ranks {sampler.token_imbalance():.3f}", flush=True)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        tokens = steps = 0
        loss_total = 0.0
        batches = list(sampler)  # what the loader yields, in order
        # Every rank knows every rank's batches, so the global count of each step needs no
        # all-reduce.
        global_counts = [sum(global_count(b, lengths, args.normalize) for b in step)
                         for step in zip(*sampler.all_ranks())]
        t0, c0 = time.perf_counter(), time.process_time()
        for step, batch in enumerate(loader):
            if args.max_steps and step >= args.max_steps:
                break
            packed, labels = batch
            # DDP averages the gradients over the ranks: scale by world to get the sum.
            loss = step_loss(net, packed, labels, global_counts[step] / world)
            opt.zero_grad()
            loss.backward()
            if args.dump and epoch == 0 and step < args.dump_steps:
                os.makedirs(args.dump, exist_ok=True)
                torch.save({"indices": batches[step],
                            "grads": {n: p.grad.clone() for n, p in model.named_parameters()}},
                           os.path.join(args.dump, f"step{step}_rank{rank}.pt"))
            opt.step()
            tokens += packed.data.numel()
            loss_total += loss.item()
            steps += 1
        secs, cpu = time.perf_counter() - t0, time.process_time() - c0
        report(epoch, rank, world, distributed, tokens, steps, secs, cpu, loss_total,
               args.normalize)
        if rank == 0 and not args.no_eval:
            val = encode(read_split(os.path.join(args.split, "val.tsv")), vocab)
            print(f"epoch {epoch + 1}: validation accuracy {100 * accuracy(model, val):.2f}%",
                  flush=True)
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return 0


# Every Python tensor given to a collective stays referenced until the process exits.
# PyTorch's gloo workers drop their last reference to a finished collective after the
# caller has returned (a barrier behind it can keep it until the barrier ends); dropping the
# last reference to a tensor Python has seen needs the GIL. If that happens while the main
# thread, holding the GIL, destroys the process group (whose destructor joins the workers),
# the process never exits: seen with PyTorch 1.13 at the end of about one run in eight.
_COLLECTIVE_TENSORS = []


def report(epoch, rank, world, distributed, tokens, steps, secs, cpu, loss_total, normalize):
    """Rank 0 prints every rank's tokens/s and the total (all tokens / the slowest rank's
    time), and the same per CPU second (steadier on a shared machine)."""
    rates = torch.tensor([tokens / secs, float(tokens), secs, float(steps), cpu, loss_total],
                         dtype=torch.float64)
    gathered = [torch.zeros_like(rates) for _ in range(world)]
    if distributed:
        dist.all_gather(gathered, rates)
        _COLLECTIVE_TENSORS.extend([rates] + gathered)
    else:
        gathered = [rates]
    if rank == 0:
        per_rank = ", ".join(f"rank {r}: {g[0]:.0f}" for r, g in enumerate(gathered))
        total = sum(g[1] for g in gathered) / max(g[2] for g in gathered)
        total_cpu = sum(g[1] for g in gathered) / max(g[4] for g in gathered)
        # The ranks' losses add up to world x the step's global loss.
        loss = sum(g[5] for g in gathered) / world / max(steps, 1)
        print(f"epoch {epoch + 1}: steps per rank {[int(g[3]) for g in gathered]}, train loss "
              f"{loss:.4f} per {'token' if normalize == 'tokens' else 'sequence'}; "
              f"tokens/s {per_rank}; "
              f"total {total:.0f} tokens/s, {total_cpu:.0f} per CPU second of the busiest rank",
              flush=True)


if __name__ == "__main__":
    sys.exit(main(ARGS))
