"""examples/ddp_langid.py on 2 processes (gloo over loopback, 1 thread each): the gradients
after DistributedDataParallel's all-reduce equal one process's on the union of the two ranks'
batches, and no rank hangs when the batches do not divide evenly (every process runs under a
timeout and is killed if it overruns)."""
import importlib.util
import os
import random
import socket
import subprocess
import sys

import pytest
import torch

from seqpack.data import BucketBatchSampler, DistributedBucketBatchSampler
from seqpack.torch import collate_packed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "ddp_langid.py")
TIMEOUT = 120  # seconds for the whole 2-process run; it takes a few on an idle machine
MAX_TOKENS = 64
FLAGS = ["--max-tokens", str(MAX_TOKENS), "--embed", "4", "--hidden", "8", "--threads", "1",
         "--epochs", "2", "--no-eval", "--timeout", "60", "--dump-steps", "3"]


def load_example():
    spec = importlib.util.spec_from_file_location("ddp_langid", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_split(path, n=301):
    rng = random.Random(5)
    with open(os.path.join(path, "train.tsv"), "w", encoding="utf-8") as f:
        for i in range(n):
            label = i % 3
            word = "".join(rng.choice(["abc", "xyz", "mno"][label]) for _ in range(rng.randint(1, 12)))
            f.write(f"{label}\t{word}\n")
    with open(os.path.join(path, "labels.txt"), "w", encoding="utf-8") as f:
        f.write("a\nb\nc\n")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_ranks(split, dump):
    # USE_LIBUV=0: PyTorch 2.4+ makes the TCPStore of env:// rendezvous use libuv by
    # default, and Debian 13's torch 2.6 (gloo built without it) then fails with
    # "use_libuv was requested but PyTorch was build without libuv support";
    # 1.13 ignores the variable.
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2",
               GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", USE_LIBUV="0",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    procs = [subprocess.Popen([sys.executable, EXAMPLE, "--split", split, "--dump", dump] + FLAGS,
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=TIMEOUT)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
            p.communicate()
        pytest.fail(f"a rank did not finish within {TIMEOUT} s")
    for r, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{out}"
    return outputs


def test_two_ranks_match_one_process_and_do_not_hang(tmp_path):
    split = str(tmp_path)
    write_split(split)
    ex = load_example()
    args = ex.parse_args(["--split", split] + FLAGS)
    rows = ex.read_split(os.path.join(split, "train.tsv"))
    lengths = [len(w) for _, w in rows]
    # The data does not divide evenly between the ranks: an odd number of batches.
    assert len(BucketBatchSampler(lengths, max_tokens=MAX_TOKENS)) % 2 == 1

    outputs = run_two_ranks(split, str(tmp_path / "dump"))
    steps = len(DistributedBucketBatchSampler(lengths, 2, 0, max_tokens=MAX_TOKENS))
    for epoch in (1, 2):
        assert f"epoch {epoch}: steps per rank [{steps}, {steps}]" in outputs[0], outputs[0]

    # One process on the union of the two ranks' batches, step by step.
    vocab = ex.vocabulary(rows)
    data = ex.encode(rows, vocab)
    model = ex.build_model(args, len(vocab) + 2, 3)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    plan = DistributedBucketBatchSampler(lengths, 2, 0, max_tokens=MAX_TOKENS).all_ranks()
    worst = 0.0
    for step in range(3):
        dumps = [torch.load(tmp_path / "dump" / f"step{step}_rank{r}.pt") for r in range(2)]
        assert [d["indices"] for d in dumps] == [plan[0][step], plan[1][step]]
        union = dumps[0]["indices"] + dumps[1]["indices"]
        packed, labels = collate_packed([data[i] for i in union])
        opt.zero_grad()
        ex.step_loss(model, packed, labels, packed.data.numel()).backward()
        tokens = packed.data.numel()
        for name, p in model.named_parameters():
            # Each gradient element sums at most `tokens` per-token terms, which the ranks
            # add in another order (two halves, then DDP's average): float32 rounding of
            # such a sum stays within tokens * eps * the largest magnitude, and 4x covers
            # the rounding of the average itself. Measured: at most about 7 eps relative.
            bound = 4 * tokens * torch.finfo(torch.float32).eps * p.grad.abs().max().item()
            for r in range(2):
                diff = (dumps[r]["grads"][name] - p.grad).abs().max().item()
                worst = max(worst, diff / bound)
                assert diff <= bound, (f"step {step}, rank {r}, {name}: max |difference| {diff}, "
                                       f"bound {bound} ({tokens} tokens)")
        opt.step()
    print(f"largest gradient difference {worst:.2e} of its bound")
