#!/usr/bin/python3
"""seqpack against torch.nn, side by side in one run.

For every workload and mode, `seqpack bench --json` (a subprocess, one workload and
mode at a time) and the same work through torch.nn (LSTM/GRU/RNN of identical
shapes; packed input from pack_padded_sequence with the exact lengths,
enforce_sorted=False) are timed one right after the other, so both see the same
machine load. Also measured in the same run: this machine's single-core sgemm rate
(build/bench/bench_gemm, the GEMM seqpack itself calls), the fraction of it the
forward passes achieve, and whether train_packed time is linear in the lengths
(seqpack bench --scale 2).

    /usr/bin/python3 bench/compare_torch.py --threads 1,2
    /usr/bin/python3 bench/compare_torch.py --quick --workload gru-chars
    /usr/bin/python3 bench/compare_torch.py --precision bf16 --mode train_packed

--device cuda runs bench/compare_torch_cuda.py instead (seqpack's CUDA kernels
against torch's six GPU configurations; no CPU build needed), with the other
arguments:

    python3 bench/compare_torch.py --device cuda --workload gru-chars --quick

--fastest-torch times torch.nn in every configuration (fp32, bf16 or int8
module, packed or padded input: bench/torch_peer.py; int8 in the forward modes
only) and reports seqpack against the fastest; --torch-2.6 adds PyTorch 2.6
from Debian 13 (scripts/debian13.sh, as root) beside the torch this script
runs under, timed in the same run:

    /usr/bin/python3 bench/compare_torch.py --malloc tuned --torch-2.6 --precision bf16 --mode train_packed
    /usr/bin/python3 bench/compare_torch.py --malloc tuned --torch-2.6 --precision int8

--precision bf16 runs seqpack in bf16 mixed precision and adds a second torch
peer: the same module converted with module.to(torch.bfloat16) on bf16 packed
input (PyTorch 1.13's only way to run a packed LSTM in bf16 on the CPU); the
ratios are then given against both torch peers. --precision int8 runs seqpack
in int8 (`seqpack bench --precision int8`: inference, the forward modes only)
and adds PyTorch's int8 inference as the second peer:
torch.ao.quantization.quantize_dynamic(module, {nn.LSTM, nn.GRU, nn.RNN},
dtype=torch.qint8) on fp32 input (neither 1.13 nor 2.6 quantizes nn.RNN: that
peer is absent on the RNN workloads), and seqpack's own bf16 on the same
workloads where the CPU has native bf16 (the issue's targets compare int8 with
both). The ISA the run had (`seqpack info`) is printed first: the targets
depend on it.

Modes (both implementations time exactly this; inputs and weights are built
outside the timed region):
    forward_packed   forward of the packed batch, no autograd
    forward_padded   forward of a [max_len, batch, input] tensor (every sequence at max_len)
    train_packed     forward of the packed batch + backward of sum(output) (input gradient too)
                     (not at --precision int8)
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch

from torch_peer import DTYPES, Absent, median_time, torch_bench
from torch_threads import (add_malloc_option, add_openblas_option, apply_malloc,
                           apply_openblas_core, malloc_settings, placement_note, set_torch_threads)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ["forward_packed", "forward_padded", "train_packed"]
# The torch dtype of a precision ("int8": quantize_dynamic's qint8 module).
TORCH_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "int8": "qint8"}
PEER_CONFIGS = [f"{p}-{layout}" for p in TORCH_DTYPE for layout in ("packed", "padded")]
GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


class RemotePeer:
    """PyTorch 2.6 in Debian 13: bench/torch_peer.py --serve through scripts/debian13.sh."""

    def __init__(self, malloc):
        self.proc = subprocess.Popen(
            ["bash", os.path.join(REPO, "scripts", "debian13.sh"), "/usr/bin/python3",
             "bench/torch_peer.py", "--serve", "--malloc", malloc],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.hello = self._read()
        self.version = self.hello["torch"]

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith("PEER "):
                return json.loads(line[5:])
        sys.exit(f"compare_torch: the Debian 13 torch peer ended (exit {self.proc.wait()})")

    def bench(self, **request):
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        r = self._read()
        if "absent" in r:
            raise Absent(r["absent"])
        if "error" in r:
            sys.exit(f"compare_torch: torch {self.version} failed on {request['workload']['name']} "
                     f"{request['mode']} {request['dtype']} {request['layout']}: {r['error']}")
        return r["sec"], r["cpu"], r["reps"]


class LocalPeer:
    """The torch this script runs under (1.13 on Debian 12)."""
    version = torch.__version__

    def bench(self, workload, mode, lengths, min_time, slow_single, dtype, layout, threads):
        set_torch_threads(threads)
        return torch_bench(workload, mode, lengths, min_time, slow_single, DTYPES[dtype], layout)


def peer_configs(mode, names):
    """The (dtype, layout) pairs of `names` ("fp32-packed", ...) that apply to `mode`
    (int8 is inference only: not train_packed)."""
    out = []
    for n in names:
        precision, layout = n.split("-")
        if mode == "forward_padded" and layout == "packed":
            continue
        if mode == "train_packed" and precision == "int8":
            continue
        out.append((TORCH_DTYPE[precision], layout))
    return out


def seqpack_bench(args, threads, name, mode, scale=1, precision=None):
    cmd = [args.seqpack, "bench", "--workloads", args.workloads, "--workload", name, "--mode",
           mode, "--threads", str(threads), "--json", "--min-time", str(args.min_time),
           "--scale", str(scale), "--precision", precision or args.precision]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"compare_torch: {' '.join(cmd)} failed:\n{res.stderr}")
    line = json.loads(res.stdout.strip().splitlines()[-1])
    return line["sec_per_batch"], line["cpu_sec_per_batch"], line["reps"]


def sgemm_rate(args):
    """Single-core sgemm FLOP/s of a 1024^3 product through seqpack's GEMM wrapper
    (Google Benchmark program bench/bench_gemm.cpp), or torch.mm as a fallback."""
    exe = os.path.join(args.build_dir, "bench", "bench_gemm")
    if os.path.exists(exe):
        res = subprocess.run([exe, "--threads=1", "--benchmark_filter=BM_sgemm_peak",
                              "--benchmark_format=json",
                              f"--benchmark_min_time={max(args.min_time, 0.2)}"],
                             capture_output=True, text=True, check=True)
        bench = json.loads(res.stdout)["benchmarks"][0]
        return bench["FLOPS"], "bench_gemm BM_sgemm_peak/1024 (OpenBLAS through seqpack::cpu::gemm)"
    n = 1024
    a, b = torch.rand(n, n), torch.rand(n, n)
    set_torch_threads(1)
    _, sec, _ = median_time(lambda: torch.mm(a, b), max(args.min_time, 0.2), 60)
    return 2.0 * n ** 3 / sec, f"torch.mm {n}^3 (fallback: {exe} not built)"


def bench_gemm_one(args, bench_filter, extra=(), min_time=0.2):
    """The first benchmark of bench_gemm (one thread) matching `bench_filter`, as Google
    Benchmark's JSON dict, or None when bench_gemm is not built, fails, or skips it."""
    exe = os.path.join(args.build_dir, "bench", "bench_gemm")
    if not os.path.exists(exe):
        return None
    res = subprocess.run([exe, "--threads=1", *extra, f"--benchmark_filter={bench_filter}",
                          "--benchmark_format=json", f"--benchmark_min_time={min_time}"],
                         capture_output=True, text=True)
    if res.returncode != 0:
        return None
    benches = json.loads(res.stdout)["benchmarks"]
    if not benches or "error_message" in benches[0]:
        return None
    return benches[0]


def fma_peak(args):
    """The core's arithmetic peak for the run's precision: independent multiply-add
    chains in registers (bench_gemm BM_fma_peak: fp32 FMA, or bf16 dot products;
    BM_int8_peak: int8 dot products, vpdpbusd), FLOP/s (int8: operations per second,
    2 per multiply-add), or None when bench_gemm is not built or the CPU lacks the
    instructions. No GEMM on this core runs faster, so a target above the ceiling at
    this rate is out of reach for any implementation."""
    if args.precision == "int8":
        bench = bench_gemm_one(args, "^BM_int8_peak$")
        return bench["OPS"] if bench else None
    arg = 1 if args.precision == "bf16" else 0
    bench = bench_gemm_one(args, f"^BM_fma_peak/bf16:{arg}$")
    return bench["FLOPS"] if bench else None


def peak_source(precision):
    """What fma_peak measures, for the tables' headers."""
    if precision == "int8":
        return "int8 dot products in registers, bench_gemm BM_int8_peak (vpdpbusd)"
    return f"{precision} multiply-adds in registers, bench_gemm BM_fma_peak"


def onednn_rate(args, name, mode):
    """oneDNN's own rate on exactly the GEMMs seqpack issues for this workload and mode, at
    the run's precision (bench_gemm BM_workload_gemms, one thread; int8: seqpack's int8
    engine's own rate, rows quantized per product, weights once): (FLOP/s, FLOPs per
    batch), or None when bench_gemm is not built."""
    if mode == "forward_padded":
        return None
    bench = bench_gemm_one(args, f"^BM_workload_gemms/{name}/{mode}/{args.precision}$",
                           extra=[f"--workloads={args.workloads}"],
                           min_time=max(args.min_time, 0.2))
    return (bench["FLOPS"], bench["gemm_flop"]) if bench else None


def forward_flops(w, tokens):
    """2 * gates*H * (I_layer + H) FLOPs per token, layer and direction: the input and
    recurrent products of a forward pass (the elementwise gate work is not counted)."""
    h, dirs, g = w["hidden_size"], 2 if w.get("bidirectional") else 1, GATES[w["cell"]]
    total = 0
    for layer in range(w["num_layers"]):
        i = w["input_size"] if layer == 0 else h * dirs
        total += dirs * 2 * g * h * (i + h)
    return total * tokens


def min_flops(w, lengths, mode):
    """The GEMM FLOPs the mode cannot do without, per batch: the input products
    (2 * gates*H * I_layer per token, layer and direction) and the recurrent ones
    (2 * gates*H * H per row whose h_prev is not the zero h0: every token but each
    sequence's first step in its direction). train_packed (forward, then the backward
    of sum(output) with the input gradient, no h0 given) does each product three
    times: forward, gradient of its input (dX, dh_prev) and of its weight (dW)."""
    h, dirs, g = w["hidden_size"], 2 if w.get("bidirectional") else 1, GATES[w["cell"]]
    tokens = sum(lengths)
    recurrent_rows = tokens - sum(1 for n in lengths if n > 0)
    total = 0
    for layer in range(w["num_layers"]):
        i = w["input_size"] if layer == 0 else h * dirs
        total += dirs * 2 * g * h * (i * tokens + h * recurrent_rows)
    return 3 * total if mode == "train_packed" else total


def fmt_s(x):
    return f"{x:.4g}" if x is not None else "-"


def fmt_r(x):
    return f"{x:.2f}" if x is not None else "-"


BF16_FOUR = ("lstm-sentences", "lstm-bi-2layer", "lstm-long-tail", "gru-chars")


def target_of(name, mode, threads, precision="fp32", cpu=None):
    """The issue's targets against torch fp32 at one thread, for this precision and CPU
    (int8's are against torch's fastest configuration: target_fastest)."""
    if threads != 1 or precision == "int8":
        return None
    if precision == "bf16":
        amx = bool(cpu and cpu.get("amx"))
        if mode == "train_packed" and name in BF16_FOUR:
            return 8.0 if amx else 5.0
        if mode == "forward_packed" and name == "lstm-bi-2layer" and amx:
            return 4.0
        return None
    if mode == "train_packed":
        return 20.0 if name == "lstm-long-seq" else 3.0
    if mode == "forward_packed":
        return 2.0
    return None


def target_same_peer(name, mode, threads, precision, cpu):
    """Against torch at the same precision (bf16: module.to(torch.bfloat16)): set only
    for bf16 on a CPU with AMX (int8's targets are against torch's fastest)."""
    if threads != 1 or precision != "bf16" or not (cpu and cpu.get("amx")):
        return None
    return 4.0 if mode == "train_packed" and name in BF16_FOUR else None


def target_fastest(name, mode, threads, precision):
    """Against PyTorch's fastest inference configuration (fp32, bf16 or int8; packed or
    padded), one thread: int8 forward_packed >= 1.5x on every shared workload."""
    if threads == 1 and precision == "int8" and mode == "forward_packed":
        return 1.5
    return None


def target_vs_bf16(name, mode, threads):
    """seqpack int8 against seqpack's own bf16, one thread."""
    if threads == 1 and mode == "forward_packed" and name in ("lstm-bi-2layer", "lstm-long-tail"):
        return 1.5
    return None


def print_fastest(results, peers, precision):
    """seqpack against each torch's fastest configuration, and against the fastest of all."""
    print(f"\nagainst each PyTorch's fastest configuration (seqpack {precision}; the configuration "
          f"is dtype and layout, int8 = quantize_dynamic; ratio = torch s / seqpack s, wall "
          f"clock, same run):")
    head = f"{'threads':>7} {'workload':<15} {'mode':<15} {'seqpack s':>10}"
    for peer in peers:
        head += f" {'torch ' + peer.version[:8] + ' fastest':>36} {'ratio':>6}"
    print(head + f" {'vs fastest of all':>17} {'ceiling at peak':>15} {'target':>10}")
    absent = {}  # (torch and dtype, reason) -> {layout: None}, [workload]
    for r in results:
        for key, why in r.get("peers_absent", {}).items():
            config, layout = key.rsplit(" ", 1)
            layouts, names = absent.setdefault((config, why), ({}, []))
            layouts[layout] = None
            names.append(r["workload"])
        line = f"{r['threads']:>7} {r['workload']:<15} {r['mode']:<15} {fmt_s(r['seqpack_sec']):>10}"
        best_all = None
        for peer in peers:
            mine = {k: v for k, v in r["peers"].items() if k.startswith(peer.version + " ")}
            if not mine:
                line += f" {'-':>36} {'-':>6}"
                continue
            key = min(mine, key=lambda k: mine[k][0])
            sec = mine[key][0]
            best_all = sec if best_all is None else min(best_all, sec)
            config = key[len(peer.version) + 1:]
            line += f" {fmt_s(sec) + ' s ' + config:>36} {fmt_r(sec / r['seqpack_sec']):>6}"
        ratio = best_all / r["seqpack_sec"] if best_all else None
        line += f" {fmt_r(ratio):>17} {fmt_r(r.get('ceiling_peak_fastest')):>15}"
        target = target_fastest(r["workload"], r["mode"], r["threads"], precision)
        if target is not None and ratio is not None:
            line += f" {f'>={target:g} ' + ('ok' if ratio >= target else 'MISS'):>10}"
        print(line)
    for (config, why), (layouts, names) in absent.items():
        print(f"  absent: torch {config} ({', '.join(layouts)}) on "
              f"{', '.join(dict.fromkeys(names))}: {why}")
    if any(r.get("ceiling_peak_fastest") for r in results):
        print("  'ceiling at peak': the fastest torch's seconds over those of the mode's "
              "unavoidable GEMM operations at the core's peak for seqpack's precision (the "
              "ceiling table above; 1 thread): no implementation's ratio exceeds it")


def seqpack_info(args):
    res = subprocess.run([args.seqpack, "info", "--json"], capture_output=True, text=True)
    return json.loads(res.stdout) if res.returncode == 0 else {}


def run_on_cuda():
    """--device cuda: bench/compare_torch_cuda.py, with the other arguments, in place
    of this process (it needs neither the CPU build nor the seqpack binary)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    known, rest = pre.parse_known_args()
    if known.device == "cuda":
        script = os.path.join(REPO, "bench", "compare_torch_cuda.py")
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, script] + rest)


def main():
    run_on_cuda()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: seqpack's CUDA kernels against torch on the GPU "
                        "(bench/compare_torch_cuda.py, which takes its own options)")
    p.add_argument("--threads", default="1",
                   help="thread counts, comma-separated (e.g. 1,2); both implementations use each")
    p.add_argument("--workloads", default=os.path.join(REPO, "bench", "workloads.json"),
                   help="workloads JSON (default: the repository's bench/workloads.json)")
    p.add_argument("--workload", action="append", help="only these workloads (repeatable)")
    p.add_argument("--mode", action="append", choices=MODES, help="only these modes (repeatable)")
    p.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    p.add_argument("--seqpack", help="the seqpack binary (default BUILD_DIR/seqpack)")
    p.add_argument("--min-time", type=float, default=None,
                   help="seconds of timed runs per measurement (default 0.5, 0.1 with --quick)")
    p.add_argument("--quick", action="store_true",
                   help="short measurements, no linearity check")
    p.add_argument("--no-linearity", action="store_true",
                   help="skip the seqpack train_packed --scale 2 linearity check")
    p.add_argument("--torch-single-run", type=float, default=5.0,
                   help="a torch warm-up slower than this many seconds is taken as the only sample")
    p.add_argument("--rounds", type=int, default=1,
                   help="run each seqpack/torch pair this many times, alternating, every --threads "
                        "count in turn within a round, and report the median round with the range "
                        "of the ratios (the machine's speed drifts); thread scaling is the median "
                        "of the rounds' own ratios")
    p.add_argument("--seqpack-only", action="store_true",
                   help="time seqpack only (e.g. for the thread-scaling figures)")
    p.add_argument("--json-out", help="also write every measurement to this file (JSON)")
    p.add_argument("--precision", choices=["fp32", "bf16", "int8"], default="fp32",
                   help="seqpack's precision; bf16 adds a torch bf16 peer (module.to(torch.bfloat16)), "
                        "int8 (the forward modes only) a torch int8 peer (quantize_dynamic, qint8) "
                        "and seqpack bf16")
    p.add_argument("--torch-2.6", dest="torch26", action="store_true",
                   help="also time PyTorch 2.6 (Debian 13 through scripts/debian13.sh, as root)")
    p.add_argument("--fastest-torch", action="store_true",
                   help="time every configuration of --peer-configs on each torch and report "
                        "seqpack against the fastest (implied by --torch-2.6)")
    p.add_argument("--peer-configs", default=",".join(PEER_CONFIGS),
                   help="torch configurations for --fastest-torch (dtype-layout, comma-separated; "
                        "int8 = quantize_dynamic, forward modes only)")
    add_malloc_option(p)
    add_openblas_option(p)
    args = p.parse_args()
    apply_malloc(args.malloc)
    openblas = apply_openblas_core(args.openblas_core)
    args.workloads = os.path.abspath(args.workloads)
    args.seqpack = args.seqpack or os.path.join(args.build_dir, "seqpack")
    if args.min_time is None:
        args.min_time = 0.1 if args.quick else 0.5
    try:
        thread_counts = [int(t) for t in args.threads.split(",")]
    except ValueError:
        sys.exit(f"compare_torch: --threads '{args.threads}' is not a comma-separated list of integers")
    if args.rounds < 1:
        sys.exit(f"compare_torch: --rounds {args.rounds} must be >= 1")
    if any(t < 1 for t in thread_counts):
        sys.exit(f"compare_torch: --threads '{args.threads}': every count must be >= 1")
    if not os.path.exists(args.seqpack):
        sys.exit(f"compare_torch: no seqpack binary at '{args.seqpack}' (build it, or pass --seqpack)")
    with open(args.workloads) as f:
        workloads = json.load(f)["workloads"]
    if args.workload:
        known = {w["name"] for w in workloads}
        for n in args.workload:
            if n not in known:
                sys.exit(f"compare_torch: --workload '{n}' is not in {args.workloads} (it has: {', '.join(sorted(known))})")
        workloads = [w for w in workloads if w["name"] in args.workload]
    if args.precision == "int8":
        # int8 is inference only: seqpack bench refuses train_packed at int8.
        if args.mode and "train_packed" in args.mode:
            sys.exit("compare_torch: --mode train_packed cannot run at --precision int8: int8 is "
                     "for inference only (forward_packed, forward_padded)")
        modes = args.mode or [m for m in MODES if m != "train_packed"]
    else:
        modes = args.mode or MODES

    # Other processes on the machine skew every figure (multi-threaded OpenMP runs most:
    # a spinning thread that loses its core stalls the whole region), so say how busy it was.
    print(f"# torch {torch.__version__}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f} at start, workloads {args.workloads}", flush=True)
    print(f"# allocator: {malloc_settings()}; {openblas}; {placement_note()}", flush=True)
    cpu = seqpack_info(args)
    print(f"# seqpack precision {args.precision}; CPU ISA {cpu.get('isa', '?')} (native bf16 "
          f"{cpu.get('native_bf16', '?')}, native int8 {cpu.get('native_int8', '?')}, AMX "
          f"{cpu.get('amx', '?')}), oneDNN {cpu.get('onednn', '?')}, {cpu.get('blas', '?')}",
          flush=True)
    # --precision bf16 / int8: torch at the same precision as a second peer (bf16:
    # module.to(torch.bfloat16); int8: quantize_dynamic), and for int8 seqpack's own bf16.
    same_peer = args.precision != "fp32" and not args.seqpack_only
    same_dtype = DTYPES[TORCH_DTYPE[args.precision]]
    seqpack_bf16 = args.precision == "int8" and cpu.get("native_bf16") is True
    configs = [c.strip() for c in args.peer_configs.split(",") if c.strip()]
    for c in configs:
        if c not in PEER_CONFIGS:
            sys.exit(f"compare_torch: --peer-configs entry '{c}' is not one of "
                     f"{', '.join(PEER_CONFIGS)}")
    peers = []
    if (args.fastest_torch or args.torch26) and not args.seqpack_only:
        peers.append(LocalPeer())
        if args.torch26:
            peers.append(RemotePeer(args.malloc))
            print(f"# second torch: {peers[-1].version} in Debian 13 (allocator: "
                  f"{peers[-1].hello['allocator']})", flush=True)
    # The sgemm rate is measured again before every workload: on a shared machine one
    # reading can catch a slow moment, and the ceilings below want the machine's best.
    rate, rate_src = sgemm_rate(args)
    rates = [rate]

    def one_round(threads, w, mode, tag):
        """One round of the pair (and the other peers) at `threads` threads."""
        lengths = list(w["lengths"])
        print(f"{tag}: seqpack", file=sys.stderr, flush=True)
        s_sec, s_cpu, s_reps = seqpack_bench(args, threads, w["name"], mode)
        print(f"{tag}: torch", file=sys.stderr, flush=True)
        if args.seqpack_only:
            t_sec = t_cpu = t_reps = None
        else:
            t_sec, t_cpu, t_reps = torch_bench(w, mode, lengths, args.min_time,
                                               args.torch_single_run)
        b_sec = b_cpu = b_absent = None
        if same_peer:
            print(f"{tag}: torch {args.precision}", file=sys.stderr, flush=True)
            try:
                b_sec, b_cpu, _ = torch_bench(w, mode, lengths, args.min_time,
                                              args.torch_single_run, same_dtype)
            except Absent as e:
                b_absent = str(e)
        sb_sec = sb_cpu = None
        if seqpack_bf16:
            print(f"{tag}: seqpack bf16", file=sys.stderr, flush=True)
            sb_sec, sb_cpu, _ = seqpack_bench(args, threads, w["name"], mode, precision="bf16")
        fastest, absent = {}, {}
        for peer in peers:
            for dtype, layout in peer_configs(mode, configs):
                print(f"{tag}: torch {peer.version} {dtype} {layout}", file=sys.stderr,
                      flush=True)
                key = f"{peer.version} {dtype} {layout}"
                try:
                    sec, cpu_sec, _ = peer.bench(
                        workload=w, mode=mode, lengths=lengths, min_time=args.min_time,
                        slow_single=args.torch_single_run, dtype=dtype, layout=layout,
                        threads=threads)
                except Absent as e:
                    absent[key] = str(e)
                    continue
                fastest[key] = (sec, cpu_sec)
        p = args.precision
        r = {"peers": fastest, "peers_absent": absent,
             "seqpack_sec": s_sec, "seqpack_cpu": s_cpu, "seqpack_reps": s_reps,
             "torch_sec": t_sec, "torch_cpu": t_cpu, "torch_reps": t_reps,
             "ratio": t_sec / s_sec if t_sec else None,
             "cpu_ratio": t_cpu / s_cpu if t_cpu else None,
             # torch at seqpack's precision (bf16 or int8)
             f"torch_{p}_sec": b_sec, f"torch_{p}_cpu": b_cpu,
             f"torch_{p}_absent": b_absent,
             f"ratio_{p}": b_sec / s_sec if b_sec else None,
             f"cpu_ratio_{p}": b_cpu / s_cpu if b_cpu else None,
             # seqpack bf16 (at --precision int8)
             "seqpack_bf16_sec": sb_sec, "seqpack_bf16_cpu": sb_cpu,
             "ratio_seqpack_bf16": sb_sec / s_sec if sb_sec else None,
             "cpu_ratio_seqpack_bf16": sb_cpu / s_cpu if sb_cpu else None}
        print(f"... {w['name']} {mode}: seqpack {s_sec:.4g} s, torch {fmt_s(t_sec)} s, "
              f"ratio {fmt_r(r['ratio'])} (cpu {fmt_r(r['cpu_ratio'])})",
              file=sys.stderr, flush=True)
        return r

    # --rounds N: the pair N times, alternating, so that a slow moment of the machine
    # hits one round rather than one implementation; and each round runs every thread
    # count in turn, so that it hits one round rather than one count (the thread
    # scaling below divides times of the same rounds). The round whose ratio is the
    # median is reported, with the range.
    by_key = {}
    unset_torch_threads = set()
    for w in workloads:
        tokens = sum(w["lengths"])
        if 1 in thread_counts:
            rates.append(sgemm_rate(args)[0])
        for mode in modes:
            rounds_at = {threads: [] for threads in thread_counts}
            for k in range(args.rounds):
                for threads in thread_counts:
                    if not set_torch_threads(threads) and not args.seqpack_only:
                        if threads not in unset_torch_threads:
                            print(f"# note: could not set torch's OpenBLAS threads to {threads}",
                                  flush=True)
                        unset_torch_threads.add(threads)
                    tag = f"... threads {threads} {w['name']} {mode}" + (
                        f" round {k + 1}/{args.rounds}" if args.rounds > 1 else "")
                    rounds_at[threads].append(one_round(threads, w, mode, tag))
            for threads, rounds in rounds_at.items():
                gemm = onednn_rate(args, w["name"], mode) if threads == 1 else None
                for r in rounds:
                    r["onednn_flops_per_s"], r["gemm_flop"] = gemm if gemm else (None, None)
                key = (lambda r: r["ratio"]) if not args.seqpack_only else (lambda r: r["seqpack_sec"])
                median_round = sorted(rounds, key=key)[(len(rounds) - 1) // 2]
                ratios = [r["ratio"] for r in rounds if r["ratio"] is not None]
                by_key[threads, w["name"], mode] = dict(
                    threads=threads, workload=w["name"], mode=mode, tokens=tokens,
                    **median_round,
                    ratio_min=min(ratios) if ratios else None,
                    ratio_max=max(ratios) if ratios else None,
                    rounds=rounds,
                    flops=forward_flops(w, tokens) if mode != "train_packed" else None)
    results = [by_key[threads, w["name"], mode]
               for threads in thread_counts for w in workloads for mode in modes]

    rate = max(rates)
    print(f"# single-core sgemm rate: {rate / 1e9:.1f} GFLOP/s, the best of {len(rates)} readings "
          f"(lowest {min(rates) / 1e9:.1f}) taken before each workload ({rate_src})")
    print()
    print("s = median wall-clock seconds per batch; cpu ratio = the same ratio of median process "
          "CPU seconds (at 1 thread, unaffected by other processes on the machine)")
    if args.rounds > 1:
        print(f"each row: the median of {args.rounds} alternating rounds of the pair, each round "
              f"running every thread count in turn; 'range' = the lowest and highest ratio of "
              f"the rounds")
    print(f"{'threads':>7} {'workload':<15} {'mode':<15} {'seqpack s':>10} {'torch s':>10} "
          f"{'torch/seqpack':>13} {'cpu ratio':>9} {'target wall/cpu':>15} {'reps s/t':>9}"
          + (f" {'range':>13}" if args.rounds > 1 else ""))
    for r in results:
        target = target_of(r["workload"], r["mode"], r["threads"], args.precision, cpu)
        verdict = ""
        if target is not None and r["ratio"] is not None:
            ok = lambda x: "ok" if x >= target else "MISS"
            verdict = f">={target:g} {ok(r['ratio'])}/{ok(r['cpu_ratio'])}"
        print(f"{r['threads']:>7} {r['workload']:<15} {r['mode']:<15} {fmt_s(r['seqpack_sec']):>10} "
              f"{fmt_s(r['torch_sec']):>10} {fmt_r(r['ratio']):>13} {fmt_r(r['cpu_ratio']):>9} {verdict:>15} "
              f"{r['seqpack_reps']:>4}/{r['torch_reps'] or '-'}"
              + (f" {fmt_r(r['ratio_min']):>6}-{fmt_r(r['ratio_max']):<6}" if args.rounds > 1 else ""))

    if same_peer:
        p = args.precision
        print()
        if p == "bf16":
            print("against torch bf16 (module.to(torch.bfloat16), bf16 packed input):")
        else:
            print("against torch int8 (quantize_dynamic(module, {nn.LSTM, nn.GRU, nn.RNN}, "
                  "dtype=torch.qint8): int8 weights, activations quantized per tensor at run "
                  "time; fp32 input, packed for forward_packed):")
        print(f"{'threads':>7} {'workload':<15} {'mode':<15} {'seqpack s':>10} {f'torch {p} s':>12} "
              f"{'torch/seqpack':>13} {'cpu ratio':>9} {'target':>10}")
        absent = {}
        for r in results:
            target = target_same_peer(r["workload"], r["mode"], r["threads"], p, cpu)
            verdict = ""
            if target is not None and r[f"ratio_{p}"] is not None:
                verdict = f">={target:g} {'ok' if r[f'ratio_{p}'] >= target else 'MISS'}"
            if r.get(f"torch_{p}_absent"):
                absent.setdefault(r[f"torch_{p}_absent"], []).append(r["workload"])
            print(f"{r['threads']:>7} {r['workload']:<15} {r['mode']:<15} {fmt_s(r['seqpack_sec']):>10} "
                  f"{fmt_s(r[f'torch_{p}_sec']):>12} {fmt_r(r[f'ratio_{p}']):>13} "
                  f"{fmt_r(r[f'cpu_ratio_{p}']):>9} {verdict:>10}")
        for why, names in absent.items():
            print(f"  absent on {', '.join(dict.fromkeys(names))}: {why}")

    if seqpack_bf16:
        print()
        print("seqpack int8 against seqpack bf16 (same run; ratio = bf16 s / int8 s):")
        print(f"{'threads':>7} {'workload':<15} {'mode':<15} {'int8 s':>10} {'bf16 s':>10} "
              f"{'bf16/int8':>9} {'cpu ratio':>9} {'target':>10}")
        for r in results:
            target = target_vs_bf16(r["workload"], r["mode"], r["threads"])
            verdict = ""
            if target is not None and r["ratio_seqpack_bf16"] is not None:
                verdict = f">={target:g} {'ok' if r['ratio_seqpack_bf16'] >= target else 'MISS'}"
            print(f"{r['threads']:>7} {r['workload']:<15} {r['mode']:<15} {fmt_s(r['seqpack_sec']):>10} "
                  f"{fmt_s(r['seqpack_bf16_sec']):>10} {fmt_r(r['ratio_seqpack_bf16']):>9} "
                  f"{fmt_r(r['cpu_ratio_seqpack_bf16']):>9} {verdict:>10}")

    gem = [r for r in results if r.get("onednn_flops_per_s")]
    if gem:
        print()
        if args.precision == "int8":
            print("GEMM rate at 1 thread, int8: the operations (2 per multiply-add) of the GEMMs "
                  "seqpack issues for the mode per second of seqpack's CPU time, against its int8 "
                  "engine's own rate on exactly those products measured in this run (bench_gemm "
                  "BM_workload_gemms: rows quantized per product, weights once; set the engine's "
                  "rate against the int8 peak, bench_gemm BM_int8_peak, and BM_int8_gemm per "
                  "shape):")
        else:
            print(f"GEMM rate at 1 thread, {args.precision}: the FLOPs of the GEMMs seqpack issues "
                  f"for the mode per second of seqpack's CPU time, against oneDNN's own rate on "
                  f"exactly those products measured in this run (bench_gemm BM_workload_gemms: "
                  f"{args.precision} matmul, steps on weights laid out once):")
        ref, unit = ("engine", "GOP") if args.precision == "int8" else ("oneDNN", "GFLOP")
        print(f"{'workload':<15} {'mode':<15} {unit:>7} {f'{ref} {unit}/s':>14} "
              f"{f'seqpack {unit}/s':>15} {f'% of {ref}':>11}")
        for r in gem:
            achieved = r["gemm_flop"] / r["seqpack_cpu"]
            r["seqpack_gemm_fraction_of_onednn"] = achieved / r["onednn_flops_per_s"]
            print(f"{r['workload']:<15} {r['mode']:<15} {r['gemm_flop'] / 1e9:>7.3f} "
                  f"{r['onednn_flops_per_s'] / 1e9:>14.1f} {achieved / 1e9:>15.1f} "
                  f"{100 * achieved / r['onednn_flops_per_s']:>10.1f}%")

    fwd = [r for r in results if r["mode"] == "forward_packed"]
    if fwd:
        print()
        print(f"forward_packed GEMM FLOPs (2*gates*H*(I+H) per token, layer, direction) against the "
              f"single-core sgemm rate {rate / 1e9:.1f} GFLOP/s (Google Benchmark: CPU time);")
        print("'cpu' columns divide by CPU seconds (like the sgemm rate), 'wall' by wall-clock seconds:")
        print(f"{'threads':>7} {'workload':<15} {'seqpack GFLOP/s':>15} {'% sgemm cpu':>11} "
              f"{'% sgemm wall':>12} {'torch GFLOP/s':>13}")
        for r in fwd:
            s_rate = r["flops"] / r["seqpack_cpu"]
            t_rate = r["flops"] / r["torch_cpu"] if r["torch_cpu"] else float("nan")
            r["seqpack_fraction_of_sgemm_cpu"] = s_rate / rate
            r["seqpack_fraction_of_sgemm_wall"] = r["flops"] / r["seqpack_sec"] / rate
            mark = "  (target >= 90% at 1 thread)" if r["workload"] == "lstm-bi-2layer" else ""
            print(f"{r['threads']:>7} {r['workload']:<15} {s_rate / 1e9:>15.1f} "
                  f"{100 * s_rate / rate:>10.1f}% {100 * r['seqpack_fraction_of_sgemm_wall']:>11.1f}% "
                  f"{t_rate / 1e9:>13.1f}{mark}")

    one = [r for r in results if r["threads"] == 1 and r["torch_sec"]]
    if one:
        print()
        peaks = [p for p in (fma_peak(args), fma_peak(args)) if p]  # the better of two readings
        peak = max(peaks) if peaks else None
        print(f"ceiling at 1 thread: the best torch/seqpack ratio any implementation could reach if "
              f"it ran the mode's unavoidable GEMM FLOPs")
        print(f"(min_flops: zero-h0 rows skipped; train = 3x forward) at the sgemm rate above, with "
              f"the elementwise gate work free; 'at peak' runs them at the core's arithmetic peak "
              f"instead ({peak_source(args.precision)}: "
              f"{peak / 1e9 if peak else float('nan'):.1f} "
              f"{'GOP/s' if args.precision == 'int8' else 'GFLOP/s'}), which no implementation "
              f"can beat. A target above that ceiling cannot be met against this torch on this "
              f"machine:")
        print(f"{'workload':<15} {'mode':<15} {'GFLOP':>7} {'floor s':>9} {'seqpack s':>10} "
              f"{'floor/seqpack':>13} {'ratio':>6} {'ceiling wall/cpu':>16} {'at peak':>7} "
              f"{'target':>7}")
        for r in one:
            w = next(x for x in workloads if x["name"] == r["workload"])
            flops = min_flops(w, list(w["lengths"]), r["mode"])
            floor = flops / rate
            r["min_flops"] = flops
            r["ceiling"] = r["torch_sec"] / floor
            r["ceiling_cpu"] = r["torch_cpu"] / floor
            r["ceiling_peak"] = r["torch_sec"] * peak / flops if peak else None
            if peak and r["peers"]:
                # The same ceiling against torch's fastest configuration (print_fastest).
                r["ceiling_peak_fastest"] = min(v[0] for v in r["peers"].values()) * peak / flops
            target = target_of(r["workload"], r["mode"], 1, args.precision, cpu)
            note = ""
            if target is not None:
                note = f"{target:>6g}"
                if r["ceiling_peak"] and target > r["ceiling_peak"]:
                    note += " (above the ceiling at peak)"
                elif target > r["ceiling"] and args.precision == "fp32":
                    # The sgemm rate bounds fp32 GEMMs only; bf16 ones pass it.
                    note += " (above the ceiling)"
            at_peak = f"{r['ceiling_peak']:>7.2f}" if r["ceiling_peak"] else f"{'-':>7}"
            print(f"{r['workload']:<15} {r['mode']:<15} {flops / 1e9:>7.3f} {floor:>9.4g} "
                  f"{r['seqpack_sec']:>10.4g} {100 * floor / r['seqpack_sec']:>12.1f}% "
                  f"{r['ratio']:>6.2f} {r['ceiling']:>7.2f}/{r['ceiling_cpu']:<8.2f} {at_peak} "
                  f"{note}")

    if len(thread_counts) > 1:
        base = thread_counts[0]
        print()
        # Round k of every count ran back to back: the ratio of round k's times, the
        # median over the rounds, and their range.
        print(f"thread scaling (time at {base} thread(s) / time at N, in the same round; the "
              f"median of the rounds" + (", and their range" if args.rounds > 1 else "") + "):")
        print(f"{'N':>3} {'workload':<15} {'mode':<15} {'seqpack':>8} {'torch':>8}"
              + (f" {'seqpack range':>13} {'torch range':>13}" if args.rounds > 1 else ""))
        index = {(r["threads"], r["workload"], r["mode"]): r for r in results}

        def paired(b, r, key):
            return sorted(x[key] / y[key] for x, y in zip(b["rounds"], r["rounds"])
                          if x[key] and y[key])

        def median(xs):
            return xs[(len(xs) - 1) // 2] if xs else None

        def span(xs):
            return f"{fmt_r(xs[0])}-{fmt_r(xs[-1])}" if xs else "-"

        for r in results:
            if r["threads"] == base:
                continue
            b = index.get((base, r["workload"], r["mode"]))
            if b:
                s_x, t_x = paired(b, r, "seqpack_sec"), paired(b, r, "torch_sec")
                print(f"{r['threads']:>3} {r['workload']:<15} {r['mode']:<15} "
                      f"{fmt_r(median(s_x)):>8} {fmt_r(median(t_x)):>8}"
                      + (f" {span(s_x):>13} {span(t_x):>13}" if args.rounds > 1 else ""))

    linearity = []
    if not args.quick and not args.no_linearity and args.precision == "int8":
        print("\nlinearity: not at --precision int8 (it checks train_packed; int8 is inference only)")
    elif not args.quick and not args.no_linearity:
        threads = thread_counts[0]
        print()
        print(f"linearity: seqpack train_packed with every length doubled (--scale 2), "
              f"threads {threads}, target <= 2.2x:")
        for w in workloads:
            print(f"... linearity {w['name']}", file=sys.stderr, flush=True)
            one, one_cpu, _ = seqpack_bench(args, threads, w["name"], "train_packed", scale=1)
            two, two_cpu, _ = seqpack_bench(args, threads, w["name"], "train_packed", scale=2)
            linearity.append(dict(threads=threads, workload=w["name"], sec_scale1=one,
                                  sec_scale2=two, ratio=two / one, cpu_scale1=one_cpu,
                                  cpu_scale2=two_cpu, cpu_ratio=two_cpu / one_cpu))
            print(f"  {w['name']:<15} {fmt_s(one):>10} s -> {fmt_s(two):>10} s  "
                  f"x{two / one:.2f} {'ok' if two / one <= 2.2 else 'MISS'}   "
                  f"(cpu x{two_cpu / one_cpu:.2f})", flush=True)

    if peers:
        print_fastest(results, peers, args.precision)

    print(f"\n# load average {os.getloadavg()[0]:.2f} at the end")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(dict(torch=torch.__version__, precision=args.precision, cpu=cpu,
                           torch_peers=[p.version for p in peers],
                           sgemm_flops=rate, sgemm_readings=rates,
                           sgemm_source=rate_src,
                           results=results, linearity=linearity), f, indent=1)


if __name__ == "__main__":
    main()
