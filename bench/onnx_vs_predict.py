"""ONNX Runtime on the exported main-job model against `seqpack predict`, on the
test split: time and agreement of the logits.

    ./build/seqpack train --epochs 1 --out /tmp/m          # or any trained model
    ./build/seqpack export --model /tmp/m --onnx /tmp/m.onnx
    ./build/seqpack data export --out /tmp/split
    /usr/bin/python3 bench/onnx_vs_predict.py --model /tmp/m --onnx /tmp/m.onnx \
        --split /tmp/split

seqpack is timed as a user runs it: the `seqpack predict --top 1` process on
every test word (start-up, model load, UTF-8 decoding, the forward, printing),
with the same process on one word as its start-up cost. (predict runs the
classifier twice, once for the logits and once for the probabilities.) Its
logits for the agreement come from one more run with --json. The forward alone
(CharClassifier::forward, as predict calls it) is timed by
build/bench/bench_classifier_forward when it is built. ONNX Runtime
(onnxruntime-node, tools/ort) is timed inside one process: session.run on the
whole split as one padded batch, and in batches of 128 in file order. One thread
each (OMP_NUM_THREADS=1, intraOpNumThreads=1). Agreement: the largest
|ONNX Runtime - seqpack| over all logits, and the share of equal argmax.
"""
import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))
import ort_runner  # noqa: E402


def cpu_name():
    """Model name and the vector ISA read from /proc/cpuinfo."""
    name, flags = platform.processor(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return f"{name} ({', '.join(isa) or 'no AVX2'})"


def encode(words, vocab_path):
    with open(vocab_path, encoding="utf-8") as f:
        tokens = json.load(f)["tokens"]
    ids = {t: i + 2 for i, t in enumerate(tokens)}  # 0 <pad>, 1 <unk>
    lengths = np.array([len(w) for w in words], dtype=np.int64)
    out = np.zeros((len(words), max(1, lengths.max())), dtype=np.int64)
    for b, w in enumerate(words):
        out[b, :len(w)] = [ids.get(ch, 1) for ch in w]
    return out, lengths


def time_process(cmd, repeat):
    """Best wall and best CPU seconds (user + system) of `repeat` runs, and the output."""
    walls, cpus, out = [], [], None
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    for _ in range(repeat):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        walls.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
        if proc.returncode != 0:
            raise SystemExit(f"{cmd[0]} failed: {proc.stderr}")
        out = proc.stdout
    return (min(walls), min(cpus)), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model directory of seqpack train")
    ap.add_argument("--onnx", required=True, help="its export (seqpack export)")
    ap.add_argument("--split", required=True, help="directory of seqpack data export")
    ap.add_argument("--seqpack", default=os.path.join(ROOT, "build", "seqpack"))
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench",
                                                    "bench_classifier_forward"),
                    help="the forward alone (built with SEQPACK_BUILD_BENCHMARKS=ON; "
                         "skipped when missing)")
    ap.add_argument("--repeat", type=int, default=3, help="timed repetitions (best is kept)")
    a = ap.parse_args()
    if a.repeat < 1:
        raise SystemExit(f"--repeat = {a.repeat} must be at least 1")

    with open(os.path.join(a.split, "test.tsv"), encoding="utf-8") as f:
        words = [line.rstrip("\n").split("\t", 1)[1] for line in f if line.strip()]
    tokens, lengths = encode(words, os.path.join(a.model, "vocabulary.json"))

    predict = [a.seqpack, "predict", "--top", "1", "--model", a.model]
    t_all, _ = time_process(predict + words, a.repeat)
    t_one, _ = time_process(predict + words[:1], a.repeat)
    _, out = time_process([a.seqpack, "predict", "--json", "--model", a.model] + words, 1)
    ref = np.array([p["logits"] for p in json.loads(out)["predictions"]], dtype=np.float64)

    forward = None
    if os.path.exists(a.bench):
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                   SEQPACK_BENCH_MODEL=a.model,
                   SEQPACK_BENCH_TSV=os.path.join(a.split, "test.tsv"))
        proc = subprocess.run([a.bench, "--benchmark_format=json",
                               f"--benchmark_repetitions={a.repeat}"],
                              capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"{a.bench} failed: {proc.stderr}")
        forward = {}
        for b in json.loads(proc.stdout)["benchmarks"]:
            if b.get("run_type") != "iteration":
                continue
            key = b["run_name"].split("/")[1]  # "0" one batch, "128"
            wall, cpu = b["real_time"] * 1e-3, b["cpu_time"] * 1e-3  # ms -> s
            old = forward.get(key, (wall, cpu))
            forward[key] = (min(old[0], wall), min(old[1], cpu))

    runs = [{"model": a.onnx, "inputs": {"tokens": tokens, "lengths": lengths},
             "repeat": a.repeat}]
    for s in range(0, len(words), 128):
        t = tokens[s:s + 128, :max(1, lengths[s:s + 128].max())]
        runs.append({"model": a.onnx, "inputs": {"tokens": t, "lengths": lengths[s:s + 128]},
                     "repeat": a.repeat})
    t0 = time.perf_counter()
    results = ort_runner.run(runs, threads=1)
    t_node = time.perf_counter() - t0
    for r in results:
        if "error" in r:
            raise SystemExit(f"ONNX Runtime: {r['error']}")
    whole = (min(results[0]["seconds"]), min(results[0]["cpu_seconds"]))
    batched = (sum(min(r["seconds"]) for r in results[1:]),
               sum(min(r["cpu_seconds"]) for r in results[1:]))
    ort_logits = results[0]["outputs"]["logits"].astype(np.float64)
    batched_logits = np.concatenate([r["outputs"]["logits"] for r in results[1:]])

    print(f"CPU: {cpu_name()}; 1 thread each; {len(words)} test words, "
          f"{int(lengths.sum())} characters, longest {int(lengths.max())}; best of {a.repeat}")
    print(f"{'':44s} {'wall s':>8s} {'cpu s':>8s}")
    rows = [("seqpack predict, process on all words", t_all),
            ("seqpack predict, process on one word", t_one),
            ("seqpack predict, all minus one word", (t_all[0] - t_one[0], t_all[1] - t_one[1])),
            ("ONNX Runtime session.run, one batch", whole),
            (f"ONNX Runtime session.run, {len(results) - 1} batches of 128", batched)]
    if forward is not None:
        rows[3:3] = [("seqpack forward alone, one batch", forward["0"]),
                     ("seqpack forward alone, batches of 128", forward["128"])]
    for name, (w, c) in rows:
        print(f"{name:44s} {w:8.3f} {c:8.3f}")
    print(f"ONNX Runtime process (Node, session, JSON, every run {a.repeat + 1} times): "
          f"{t_node:.1f} s wall")
    print(f"ORT / seqpack (all minus one word), CPU time: one batch "
          f"{whole[1] / (t_all[1] - t_one[1]):.2f}x, batches of 128 "
          f"{batched[1] / (t_all[1] - t_one[1]):.2f}x")
    if forward is not None:
        print(f"ORT / seqpack forward alone, CPU time: one batch "
              f"{whole[1] / forward['0'][1]:.2f}x, batches of 128 "
              f"{batched[1] / forward['128'][1]:.2f}x")
    print(f"max |ORT - seqpack| logits: one batch {np.abs(ort_logits - ref).max():.3g}, "
          f"batches of 128 {np.abs(batched_logits - ref).max():.3g}; "
          f"argmax agreement {np.mean(ort_logits.argmax(1) == ref.argmax(1)) * 100:.2f}%")

if __name__ == "__main__":
    main()
