#!/usr/bin/python3
"""What fresh weights cost seqpack.torch: the same calls timed with two builds,
in alternating rounds (so both see the same machine load), and the ratio.

Every call of a seqpack.torch layer compares its weights' bytes with the copy
its plan was made from (seqpack_torch/ops.cpp, "the model plan"); an older
build trusted torch's version counter instead. This times, per workload of
bench/workloads.json, an inference forward of the packed batch (no_grad), a
training step (forward + backward of sum(output)), the same with an SGD step after it (the
weights change at every call: a new plan each time), and a decoder's step
(batch 1, one step per call: the comparison's worst case, weights read once
per call), each with the weights unchanged between calls.

    /usr/bin/python3 bench/freshness_cost.py --builds /work/main/build,build
    /usr/bin/python3 bench/freshness_cost.py --builds OLD,NEW --rounds 5 --threads 1

The figures of a run are in docs/performance.md ("What fresh weights cost").
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("forward", "train", "sgd_step", "decode_step")


def child(args):
    import torch  # noqa: PLC0415
    import seqpack.torch as st  # noqa: PLC0415
    from torch.nn.utils.rnn import pack_padded_sequence  # noqa: PLC0415
    torch.set_num_threads(args.threads)
    cls = {"lstm": st.LSTM, "gru": st.GRU, "rnn_tanh": st.RNN}
    out = {}
    for wl in json.load(open(args.workloads))["workloads"]:
        if args.workload and wl["name"] not in args.workload:
            continue
        torch.manual_seed(0)
        m = cls[wl["cell"]](wl["input_size"], wl["hidden_size"], num_layers=wl["num_layers"],
                            bidirectional=wl["bidirectional"])
        lengths = torch.tensor(wl["lengths"])
        x = torch.randn(int(lengths.max()), len(wl["lengths"]), wl["input_size"])
        packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
        step = torch.randn(1, 1, wl["input_size"])

        def forward():
            with torch.no_grad():
                m(packed)

        def train():
            m(packed)[0].data.sum().backward()

        opt = torch.optim.SGD(m.parameters(), lr=1e-6)

        def sgd_step():
            opt.zero_grad()
            m(packed)[0].data.sum().backward()
            opt.step()

        def decode_step():
            with torch.no_grad():
                m(step)

        for mode, fn in (("forward", forward), ("train", train), ("sgd_step", sgd_step),
                         ("decode_step", decode_step)):
            fn(), fn()  # warm: plans made
            # Process CPU time: what the machine's other tenants take from
            # this process does not count (the machine is shared).
            reps, t0 = 0, time.process_time()
            while True:
                fn()
                reps += 1
                elapsed = time.process_time() - t0
                if elapsed >= args.min_time and reps >= 3:
                    break
            out[f"{wl['name']} {mode}"] = elapsed / reps
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--builds", required=True, help="BEFORE,AFTER: build directories")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--min-time", type=float, default=0.3, help="seconds per measurement")
    p.add_argument("--workloads", default=os.path.join(REPO, "bench", "workloads.json"))
    p.add_argument("--workload", action="append")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    builds = [os.path.abspath(b) for b in args.builds.split(",")]
    assert len(builds) == 2, "--builds takes two build directories"
    times = {b: {} for b in builds}
    for r in range(args.rounds):
        for b in (builds if r % 2 == 0 else builds[::-1]):
            env = dict(os.environ, PYTHONPATH=os.path.join(b, "python"))
            cmd = [sys.executable, __file__, "--child", "--builds", args.builds,
                   "--threads", str(args.threads), "--min-time", str(args.min_time),
                   "--workloads", args.workloads]
            for w in args.workload or []:
                cmd += ["--workload", w]
            res = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True,
                                            text=True).stdout.strip().splitlines()[-1])
            for k, v in res.items():
                times[b].setdefault(k, []).append(v)
    before, after = builds
    print("median process CPU time per call")
    print(f"{'workload mode':34} {'before ms':>10} {'after ms':>10} {'after/before':>13}")
    ratios = []
    for k in times[before]:
        a, c = statistics.median(times[before][k]), statistics.median(times[after][k])
        ratios.append(c / a)
        print(f"{k:34} {a * 1e3:10.3f} {c * 1e3:10.3f} {c / a:13.3f}")
    print(f"geometric mean after/before: {statistics.geometric_mean(ratios):.3f}")


if __name__ == "__main__":
    sys.exit(main())
