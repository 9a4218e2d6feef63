#!/usr/bin/env python3
"""seqpack's CUDA kernels against PyTorch on the GPU, on the shared workloads
(bench/workloads.json). `bench/compare_torch.py --device cuda` runs this file.

    python3 bench/compare_torch_cuda.py
    python3 bench/compare_torch.py --device cuda --workload gru-chars --quick
    python3 bench/compare_torch_cuda.py --json-out cuda.json --markdown-out cuda.md

It needs neither the CPU build nor the `seqpack bench` binary: seqpack's side
is rnn_packed of bench/cuda_operators.py (the operators' C++ CUDA kernels,
built against the machine's torch where libseqpack_torch has none), loaded by
file path (the seqpack package needs the CPU extension to import). Where the
kernels cannot run, PyTorch's side is timed alone and seqpack's columns say why.

Timed, per workload and mode (inputs and weights built outside the timed region;
CUDA-event medians after warm-up runs, every run synchronised):
    seqpack  rnn_packed on the packed rows in fp32, bf16 and fp16 (fp32
             accumulation and cell state), zero h0, the products that are not
             recurrent in torch (the default); fp32-library: fp32 with every
             product in the library (SEQPACK_CUDA_PRODUCTS=library);
             fp32-cluster, bf16-cluster: the recurrence on thread-block
             clusters (SEQPACK_CUDA_KERNEL=cluster); fp32-cluster-tf32: the
             same with TF32 allowed (torch's products in TF32, the step
             products on tensor cores as 3xTF32); timed last, and counted
             in seqpack's best
    auto     what the layers run by default (SEQPACK_CUDA_LAYERS=auto: the
             operator's choice, seqpack_torch/cuda_ops.cpp): the faster of
             seqpack fp32 and torch's recurrent operators in fp32 as the
             configuration's first call times them, then that one alone (the
             table names the choice)
    torch    nn.LSTM/GRU/RNN of the same shapes in six configurations: fp32,
             bf16, fp16 (module.to(dtype) and input in dtype) x packed (the
             module on an already packed batch) or padded ([max_len, batch,
             input]: cuDNN computes on the padding)
Modes:
    forward_packed   forward, no autograd
    train_packed     forward + backward of sum(output), the input's gradient too
The cost of pack_padded_sequence and pad_packed_sequence (fp32) is timed
separately, once per workload.

TF32: by default both of torch's flags (torch.backends.cuda.matmul.allow_tf32,
torch.backends.cudnn.allow_tf32) are set False, so fp32 is fp32 on both sides
(seqpack reads the same flags); --tf32 default leaves torch's defaults, --tf32
on sets both True. The header prints them.

Targets (the summary's verdicts): seqpack at its fastest precision at least 3x
torch packed fp32, and at least 1.0x torch's fastest configuration; seqpack
fp32 at least 1.0x torch packed fp32; auto at least 1.0x torch packed fp32
(the default is never slower than torch's packed path).

SEQPACK_CUDA_GLUE=/path/glue.py loads another module with rnn_packed;
SEQPACK_CUDA_TEST_DEVICE=cpu runs everything on the CPU with wall-clock timing,
for the self-test of this script with a fake glue only (its figures mean
nothing)."""
import argparse
import faulthandler
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_peer import torch_module  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ["forward_packed", "train_packed"]
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# seqpack's columns beside its precisions: (dtype, the library's settings while it runs).
# TF32: not a variable but torch's matmul setting, which the glue passes to the
# library as allow_tf32.
TF32 = "torch.backends.cuda.matmul.allow_tf32"
SEQPACK_VARIANTS = {"fp32-library": ("fp32", {"SEQPACK_CUDA_PRODUCTS": "library"}),
                    "fp32-cluster": ("fp32", {"SEQPACK_CUDA_KERNEL": "cluster"}),
                    "fp32-cluster-tf32": ("fp32", {"SEQPACK_CUDA_KERNEL": "cluster", TF32: "1"}),
                    "bf16-cluster": ("bf16", {"SEQPACK_CUDA_KERNEL": "cluster"})}
EXTRAS = list(SEQPACK_VARIANTS) + ["auto"]
GLUE_MODE = {"lstm": "LSTM", "gru": "GRU", "rnn_tanh": "RNN_TANH", "rnn_relu": "RNN_RELU"}
TORCH_CONFIGS = [f"{p}-{layout}" for p in PRECISIONS for layout in ("packed", "padded")]
SELF_TEST = os.environ.get("SEQPACK_CUDA_TEST_DEVICE") == "cpu"
DEVICE = torch.device("cpu" if SELF_TEST else "cuda")


class Absent(Exception):
    """A configuration that cannot run here (its message says why)."""


class OutOfTime(Exception):
    """The run's --budget is spent."""


def install_policy(glue):
    """The library's policy from the SEQPACK_CUDA_* variables as they are now
    (the operators read them when they load the library, and at install_policy)."""
    if glue is not None and hasattr(glue, "install_policy"):  # a fake glue may have none
        glue.install_policy()


def load_glue():
    """(glue module, '') or (None, why seqpack is not timed)."""
    path = os.environ.get("SEQPACK_CUDA_GLUE") or os.path.join(REPO, "bench", "cuda_operators.py")
    if not os.path.exists(path):
        return None, f"no CUDA glue at {path}"
    try:
        spec = importlib.util.spec_from_file_location("seqpack_cuda_glue", path)
        glue = importlib.util.module_from_spec(spec)
        # Registered under its name, as an import would: torch.compile's tracing looks
        # functions' modules up in sys.modules.
        sys.modules[spec.name] = glue
        spec.loader.exec_module(glue)
    except Exception as e:  # reported in the table's header
        return None, f"the glue {path} failed to load: {type(e).__name__}: {e}"
    if not glue.available():
        return None, f"seqpack's CUDA library is unavailable: {glue.why_unavailable()}"
    return glue, ""


def sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


class Timer:
    """Median milliseconds of a function: warm-up runs, then timed runs until
    min_time seconds are spent on at least 3 runs or max_reps are done. On CUDA each
    run lies between two events and is synchronised before the next; on the CPU
    (self-test) wall-clock. A second warm-up slower than slow_single seconds is itself
    the one sample. Raises OutOfTime past the deadline."""

    def __init__(self, min_time, max_reps, warmup, slow_single, deadline):
        self.min_time, self.max_reps, self.warmup = min_time, max_reps, warmup
        self.slow_single, self.deadline = slow_single, deadline

    def __call__(self, fn):
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise OutOfTime("the --budget is spent")
        def once():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            return time.perf_counter() - t0

        # The first call may load and initialise a library (seconds): only a
        # second slow call makes the single sample.
        if once() > self.slow_single:
            second = once()
            if second > self.slow_single:
                return second * 1e3, 1
        for _ in range(self.warmup - 1):
            fn()
        sync()
        times = []
        start = time.perf_counter()
        while True:
            if DEVICE.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            else:
                t = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t) * 1e3)
            if len(times) >= self.max_reps or (
                    len(times) >= 3 and time.perf_counter() - start >= self.min_time):
                break
        return statistics.median(times), len(times)


def make_batch(w):
    """The workload's padded input (fp32, CPU, as bench/torch_peer.py draws it) and
    its lengths."""
    lengths = list(w["lengths"])
    torch.manual_seed(0)
    x = torch.rand(max(lengths), len(lengths), w["input_size"]) * 2 - 1
    return x, lengths


def train_step(run, leaf, params):
    """Forward + backward of sum(output); gradients dropped between runs, not
    accumulated (as bench/torch_peer.py does)."""
    def step():
        for p in params:
            p.grad = None
        leaf.grad = None
        out = run()
        out.sum().backward()
    return step


def torch_case(w, mode, precision, layout, x, lengths):
    """The function that runs torch's configuration once."""
    dtype = PRECISIONS[precision]
    m = torch_module(w).to(DEVICE, dtype)
    params = list(m.parameters())
    xd = x.to(DEVICE, dtype)
    if layout == "padded":
        if mode == "forward_packed":
            return lambda: _no_grad(lambda: m(xd))
        leaf = xd.detach().requires_grad_()
        return train_step(lambda: m(leaf)[0], leaf, params)
    packed = pack_padded_sequence(xd, torch.tensor(lengths), enforce_sorted=False)
    if mode == "forward_packed":
        return lambda: _no_grad(lambda: m(packed))
    leaf = packed.data.detach().requires_grad_()
    lp = PackedSequence(leaf, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices)
    return train_step(lambda: m(lp)[0].data, leaf, params)


def seqpack_case(glue, w, mode, precision, x, lengths):
    """The function that runs seqpack's rnn_packed once (zero h0 in the packed order)."""
    dtype = PRECISIONS[precision]
    m = torch_module(w).to(DEVICE, dtype)
    weights = list(m._flat_weights)
    packed = pack_padded_sequence(x.to(DEVICE, dtype), torch.tensor(lengths),
                                  enforce_sorted=False)
    rows = w["num_layers"] * (2 if w.get("bidirectional") else 1)
    h0 = torch.zeros(rows, len(lengths), w["hidden_size"], device=DEVICE, dtype=dtype)
    hx = (h0, h0.clone()) if w["cell"] == "lstm" else h0
    mode_name = GLUE_MODE[w["cell"]]

    def run(data, train):
        return glue.rnn_packed(mode_name, data, packed.batch_sizes, hx, weights, True,
                               w["num_layers"], 0.0, train, bool(w.get("bidirectional")))[0]

    if mode == "forward_packed":
        data = packed.data
        return lambda: _no_grad(lambda: run(data, False))
    leaf = packed.data.detach().requires_grad_()
    return train_step(lambda: run(leaf, True), leaf, weights)


def auto_case(glue, w, mode, x, lengths, chosen):
    """What the layers' default runs: the operator's choice (SEQPACK_CUDA_LAYERS=auto)
    between seqpack's kernels and torch's, made at the configuration's first call
    (the timer's warm-up) by timing both, then the chosen one's run of `mode`;
    chosen[0] gets (impl, why)."""
    if not hasattr(glue, "layers"):
        raise RuntimeError(f"{glue.__file__} makes no choice between seqpack's kernels and torch's")
    run = seqpack_case(glue, w, mode, "fp32", x, lengths)

    def auto():
        glue.layers("auto")
        try:
            out = run()
            chosen[0] = glue.last_choice()
        finally:
            glue.layers("seqpack")
        return out
    return auto


def packing_cases(x, lengths):
    """pack_padded_sequence (enforce_sorted=False) and pad_packed_sequence, fp32."""
    xd = x.to(DEVICE)
    lens = torch.tensor(lengths)
    packed = pack_padded_sequence(xd, lens, enforce_sorted=False)
    return {"pack_padded_sequence": lambda: pack_padded_sequence(xd, lens,
                                                                 enforce_sorted=False),
            "pad_packed_sequence": lambda: pad_packed_sequence(packed)}


def _no_grad(fn):
    with torch.no_grad():
        return fn()


def measure(timer, make):
    """(ms, reps) of the function `make` builds, or raises Absent with the reason
    (a configuration torch or seqpack refuses, or one that runs out of memory)."""
    try:
        fn = make()
        return timer(fn)
    except OutOfTime:
        raise
    except Exception as e:  # torch without a bf16 RNN path, say: shown in the table
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        raise Absent(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


def environment(glue, why):
    """The header's facts: GPU, driver, torch, CUDA, cuDNN, flags, library."""
    env = dict(torch=torch.__version__, cuda=torch.version.cuda,
               cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available()
               else None,
               allow_tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
               allow_tf32_cudnn=torch.backends.cudnn.allow_tf32,
               device=str(DEVICE), self_test=SELF_TEST,
               seqpack_library=glue.library_path() if glue else None,
               seqpack_unavailable=None if glue else why)
    if DEVICE.type == "cuda":
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, capability=f"{p.major}.{p.minor}",
                   multiprocessors=p.multi_processor_count,
                   memory_gib=round(p.total_memory / 2 ** 30, 1))
        try:
            env["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20).stdout.strip() or None
        except (OSError, subprocess.TimeoutExpired):
            env["driver"] = None
    return env


def fmt(ms):
    return f"{ms:.3f}" if isinstance(ms, (int, float)) else "-"


def ratio(a, b):
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def verdict(r, target):
    return "-" if r is None else f"{r:.2f} {'ok' if r >= target else 'MISS'}"


def summarise(results, packing, env, precisions, extras=()):
    """The markdown report: header, summary against the targets, every configuration,
    the packing cost, and what could not run."""
    lines = ["# seqpack CUDA against PyTorch"]
    if env.get("self_test"):
        lines.append("\n**SELF-TEST on the CPU with a fake glue: these figures mean nothing.**")
    lines.append("")
    lines.append("| | |")
    lines.append("| --- | --- |")
    for k in ("gpu", "capability", "multiprocessors", "memory_gib", "driver", "torch", "cuda",
              "cudnn", "allow_tf32_matmul", "allow_tf32_cudnn", "seqpack_library",
              "seqpack_unavailable", "device"):
        if env.get(k) is not None:
            lines.append(f"| {k} | {env[k]} |")
    lines.append("")
    lines.append("Median milliseconds per batch (CUDA events, every run synchronised). "
                 "seqpack best = the fastest of its precisions and variants; torch fastest = the fastest of "
                 "torch's six configurations (fp32, bf16, fp16 x packed, padded); auto = what "
                 "the layers run by default (the faster of seqpack fp32 and torch packed fp32 as "
                 "their first call times them; the choice in brackets). Ratios are "
                 "torch / seqpack, with the targets: packed fp32 / best >= 3, fastest / "
                 "best >= 1, packed fp32 / seqpack fp32 >= 1, packed fp32 / auto >= 1.")
    lines.append("")
    lines.append("| workload | mode | seqpack best (precision) | seqpack fp32 | torch packed fp32 "
                 "| torch fastest (config) | auto (choice) | packed fp32 / best | fastest / best "
                 "| fp32 / fp32 | packed fp32 / auto |")
    lines.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        columns = precisions + [v for v in extras if v in SEQPACK_VARIANTS]
        s = {p: r["seqpack"].get(p) for p in columns}
        s_ok = {p: v for p, v in s.items() if isinstance(v, (int, float))}
        best_p = min(s_ok, key=s_ok.get) if s_ok else None
        t_ok = {c: v for c, v in r["torch"].items() if isinstance(v, (int, float))}
        fast_c = min(t_ok, key=t_ok.get) if t_ok else None
        best = s_ok.get(best_p)
        packed32 = t_ok.get("fp32-packed")
        fastest = t_ok.get(fast_c)
        auto = r.get("auto", {}).get("fp32")
        auto = auto if isinstance(auto, (int, float)) else None
        r["summary"] = dict(seqpack_best=best, seqpack_best_precision=best_p,
                            torch_fastest=fastest, torch_fastest_config=fast_c,
                            ratio_packed_fp32=ratio(packed32, best),
                            ratio_fastest=ratio(fastest, best),
                            ratio_fp32=ratio(packed32, s_ok.get("fp32")),
                            auto=auto, auto_choice=r.get("auto_choice"),
                            ratio_auto=ratio(packed32, auto))
        auto_cell = fmt(auto) + (f" ({r['auto_choice']})" if auto is not None and r.get("auto_choice")
                                 else "")
        lines.append(
            f"| {r['workload']} | {r['mode']} | "
            f"{fmt(best) + f' ({best_p})' if best_p else '-'} | {fmt(s_ok.get('fp32'))} | "
            f"{fmt(packed32)} | {fmt(fastest) + f' ({fast_c})' if fast_c else '-'} | {auto_cell} | "
            f"{verdict(r['summary']['ratio_packed_fp32'], 3.0)} | "
            f"{verdict(r['summary']['ratio_fastest'], 1.0)} | "
            f"{verdict(r['summary']['ratio_fp32'], 1.0)} | "
            f"{verdict(r['summary']['ratio_auto'], 1.0)} |")
    lines.append("")
    lines.append("Every configuration (ms):")
    lines.append("")
    variants = [v for v in extras if v in SEQPACK_VARIANTS]
    cols = [f"seqpack {p}" for p in precisions + variants] + [f"torch {c}" for c in TORCH_CONFIGS]
    lines.append("| workload | mode | " + " | ".join(cols) + " |")
    lines.append("| --- | --- | " + " | ".join("---:" for _ in cols) + " |")
    for r in results:
        vals = [r["seqpack"].get(p) for p in precisions + variants] + [r["torch"].get(c)
                                                                         for c in TORCH_CONFIGS]
        lines.append(f"| {r['workload']} | {r['mode']} | "
                     + " | ".join(fmt(v) for v in vals) + " |")
    if packing:
        lines.append("")
        lines.append("Packing cost, fp32 (ms), not included above:")
        lines.append("")
        lines.append("| workload | pack_padded_sequence | pad_packed_sequence |")
        lines.append("| --- | ---: | ---: |")
        for name, p in packing.items():
            lines.append(f"| {name} | {fmt(p.get('pack_padded_sequence'))} | "
                         f"{fmt(p.get('pad_packed_sequence'))} |")
    why = {}
    for r in results:
        for side in ("seqpack", "torch", "auto"):
            for k, v in r.get(side, {}).items():
                if isinstance(v, str):
                    why.setdefault(f"{side} {k}: {v}", []).append(f"{r['workload']} {r['mode']}")
    if why:
        lines.append("")
        lines.append("Not measured:")
        lines.append("")
        for reason, where in why.items():
            shown = ", ".join(where[:4]) + (f" and {len(where) - 4} more" if len(where) > 4
                                            else "")
            lines.append(f"- {reason} ({shown})")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default=os.path.join(REPO, "bench", "workloads.json"))
    p.add_argument("--workload", action="append", help="only these workloads (repeatable)")
    p.add_argument("--mode", action="append", choices=MODES, help="only these modes (repeatable)")
    p.add_argument("--precisions", default="fp32,bf16,fp16",
                   help="seqpack's precisions, comma-separated (fp32, bf16, fp16)")
    p.add_argument("--extras", default=",".join(EXTRAS),
                   help="the other columns, comma-separated: fp32-library (seqpack fp32 with every "
                        "product in the library), fp32-cluster and bf16-cluster (the recurrence on "
                        "thread-block clusters), fp32-cluster-tf32 (the same with TF32 allowed: "
                        "3xTF32 step products), auto (the layers' default choice); empty: none")
    p.add_argument("--torch-configs", default=",".join(TORCH_CONFIGS),
                   help="torch's configurations, comma-separated (precision-layout)")
    p.add_argument("--min-time", type=float, default=None,
                   help="seconds of timed runs per measurement (default 0.2, 0.05 with --quick)")
    p.add_argument("--max-reps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--slow-single", type=float, default=2.0,
                   help="a first run slower than this many seconds is the only sample")
    p.add_argument("--quick", action="store_true", help="short measurements")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for the whole run; measurements past it are left out, and the "
                        "table says so")
    p.add_argument("--tf32", choices=["off", "default", "on"], default="off",
                   help="torch's TF32 flags for fp32 (default: off, fp32 on both sides)")
    p.add_argument("--hang-timeout", type=float, default=90,
                   help="a measurement running longer than this many seconds (a hung kernel) "
                        "ends the run with every thread's traceback; the reports written so far "
                        "stay")
    p.add_argument("--json-out", help="also write every measurement to this file")
    p.add_argument("--markdown-out", help="also write the markdown report to this file")
    args = p.parse_args(argv)
    if args.min_time is None:
        args.min_time = 0.05 if args.quick else 0.2

    if not SELF_TEST and not torch.cuda.is_available():
        print("compare_torch_cuda: no CUDA GPU (torch.cuda.is_available() is False); nothing "
              "to time", file=sys.stderr)
        return 2
    if args.tf32 != "default":
        torch.backends.cuda.matmul.allow_tf32 = args.tf32 == "on"
        torch.backends.cudnn.allow_tf32 = args.tf32 == "on"
    precisions = [s.strip() for s in args.precisions.split(",") if s.strip()]
    configs = [s.strip() for s in args.torch_configs.split(",") if s.strip()]
    for s in precisions:
        if s not in PRECISIONS:
            p.error(f"--precisions entry '{s}' is not one of {', '.join(PRECISIONS)}")
    for c in configs:
        if c not in TORCH_CONFIGS:
            p.error(f"--torch-configs entry '{c}' is not one of {', '.join(TORCH_CONFIGS)}")
    with open(args.workloads) as f:
        workloads = json.load(f)["workloads"]
    if args.workload:
        known = {w["name"] for w in workloads}
        for n in args.workload:
            if n not in known:
                p.error(f"--workload '{n}' is not in {args.workloads} (it has: "
                        f"{', '.join(sorted(known))})")
        workloads = [w for w in workloads if w["name"] in args.workload]
    modes = args.mode or MODES

    extras = [s.strip() for s in args.extras.split(",") if s.strip()]
    for e in extras:
        if e not in EXTRAS:
            p.error(f"--extras entry '{e}' is not one of {', '.join(EXTRAS)}")
    glue, why = load_glue()
    env = environment(glue, why)
    print(f"# {env.get('gpu', DEVICE)}, torch {env['torch']}, CUDA {env['cuda']}, cuDNN "
          f"{env['cudnn']}, driver {env.get('driver')}, TF32 matmul/cuDNN "
          f"{env['allow_tf32_matmul']}/{env['allow_tf32_cudnn']}", flush=True)
    print(f"# seqpack: {env['seqpack_library'] or why}", flush=True)
    deadline = time.monotonic() + args.budget if args.budget else None
    timer = Timer(args.min_time, args.max_reps, args.warmup, args.slow_single, deadline)

    results, packing = [], {}
    out_of_time = False

    def emit():
        """The reports as they stand; written before every measurement, so that a run that
        is killed leaves what it measured."""
        report = summarise(results, packing, env, precisions, extras)
        if args.markdown_out:
            with open(args.markdown_out, "w") as f:
                f.write(report)
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(dict(environment=env, results=results, packing=packing,
                               min_time=args.min_time, budget_spent=out_of_time), f, indent=1)
        return report

    for w in workloads:
        x, lengths = make_batch(w)
        for mode in modes:
            row = dict(workload=w["name"], mode=mode, seqpack={}, torch={}, auto={}, reps={})
            results.append(row)
            chosen = [None]
            # (side, key, make, the library's settings while it runs); the
            # variants last, so that a spent --budget leaves them out first.
            jobs = [("seqpack", s, lambda s=s: seqpack_case(glue, w, mode, s, x, lengths), {})
                    for s in precisions]
            jobs += [("torch", c, lambda c=c: torch_case(w, mode, *c.split("-"), x, lengths), {})
                     for c in configs]
            if "auto" in extras:
                jobs.append(("auto", "fp32", lambda: auto_case(glue, w, mode, x, lengths, chosen),
                             {}))
            jobs += [("seqpack", v, lambda v=v: seqpack_case(glue, w, mode, SEQPACK_VARIANTS[v][0], x,
                                                             lengths), SEQPACK_VARIANTS[v][1])
                     for v in extras if v in SEQPACK_VARIANTS]
            for side, key, make, settings in jobs:
                if side in ("seqpack", "auto") and glue is None:
                    row[side][key] = why
                    continue
                if out_of_time:
                    row[side][key] = "not run: the --budget was spent"
                    continue
                # Written first, so that a run killed inside this measurement says where.
                row[side][key] = "did not finish (hung or killed)"
                emit()
                faulthandler.dump_traceback_later(args.hang_timeout, exit=True)
                variables = {k: v for k, v in settings.items() if k != TF32}
                saved = {k: os.environ.get(k) for k in variables}
                os.environ.update(variables)
                install_policy(glue)
                saved_tf32 = torch.backends.cuda.matmul.allow_tf32
                if TF32 in settings:
                    torch.backends.cuda.matmul.allow_tf32 = settings[TF32] == "1"
                try:
                    ms, reps = measure(timer, make)
                    row[side][key], row["reps"][f"{side} {key}"] = ms, reps
                except Absent as e:
                    row[side][key] = str(e)
                except OutOfTime:
                    out_of_time = True
                    row[side][key] = "not run: the --budget was spent"
                finally:
                    faulthandler.cancel_dump_traceback_later()
                    torch.backends.cuda.matmul.allow_tf32 = saved_tf32
                    for k, v in saved.items():
                        if v is None:
                            os.environ.pop(k, None)
                        else:
                            os.environ[k] = v
                    install_policy(glue)
                if side == "auto" and chosen[0] is not None:
                    row["auto_choice"], row["auto_why"] = chosen[0]
                v = row[side][key]
                print(f"... {w['name']} {mode} {side} {key}: {v if isinstance(v, str) else fmt(v)}",
                      file=sys.stderr, flush=True)
        if not out_of_time:
            packing[w["name"]] = {}
            for name, fn in packing_cases(x, lengths).items():
                try:
                    packing[w["name"]][name] = timer(fn)[0]
                except OutOfTime:
                    out_of_time = True
                    break
        emit()

    print()
    print(emit(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
