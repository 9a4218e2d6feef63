#!/usr/bin/python3
"""Is seqpack.torch ever slower than torch.nn? A sweep over shapes, with torch at its best.

What it measures: for every combination of
    cell        LSTM, GRU, RNN (tanh)                     --cells lstm,gru,rnn
    hidden      64, 256, 512, 1024 (input_size = hidden)  --hidden
    batch       1, 8, 64, 256                             --batch
    steps       1, 8, 64 with every length equal (packing saves nothing there), and
                "mixed": lengths drawn uniformly from 1..64 (--mixed-max), seed 0
                                                          --steps 1,8,64,mixed
    mode        infer: forward under torch.no_grad() after module.eval();
                train: forward + backward of output.sum(), the input requiring grad
                (parameter and input gradients dropped between calls, not accumulated)
                                                          --modes infer,train
    threads     1 and all cores (os.cpu_count())          --threads 1,all
    precision   seqpack's default "auto" (bf16 products where the CPU has native bf16,
                fp32 elsewhere: the layers run it under torch.autocast("cpu",
                dtype=torch.bfloat16)) and fp32; where "auto" is fp32 (no native
                bf16) the two are one measurement      --precisions default,fp32
one layer, unidirectional (--layers, --bidirectional), the ratio
    torch seconds / seqpack seconds per call   (> 1: seqpack is faster).

How: torch.nn.LSTM/GRU/RNN and seqpack.torch's layer of the same class with the same
weights (load_state_dict), each given the packed batch (pack_padded_sequence,
enforce_sorted=False, made outside the timed region) and the plain padded [T, B, H]
tensor (every sequence at the longest length: what a caller who does not pack runs);
each side's time is the faster of its layouts, and which won is recorded. Against
seqpack's bf16, torch runs its bf16 module too (module.to(torch.bfloat16) given bf16
input, packed and padded: on a CPU with native bf16 its GEMMs go to oneDNN's bf16
matmul), and its time is the fastest of its four configurations. torch is at its
best: its threads and those of the OpenBLAS its GEMMs call at the same count as
seqpack's (bench/torch_threads.py), and at more than one thread its fp32 module again
with that OpenBLAS at one thread ("BLAS 1t": OpenBLAS's pthreads and torch's OpenMP
threads, both spinning while they wait, can slow torch's call tens of times on a
machine with no core to spare), glibc malloc tuned (--malloc tuned, the default
here: PyTorch 1.13's fast allocator state, docs/performance.md) and OpenBLAS's kernels
named for the CPU where it fell back to generic ones (--openblas-core auto).

Timing: a round times torch's layouts, then seqpack's, back to back; each layout runs
repeatedly for --min-time seconds (at least once) and its fastest call counts, the one
least disturbed by the machine's other work. A round's ratio is of its own two times,
so a slow moment of the machine hits one round, not one side; the reported ratio is
the median round's (--rounds, default 5), with the range of the rounds.

Shapes whose calls are estimated (from a GEMM of the step's shape timed on this
machine) to take more than --max-call seconds are skipped unless --full, and --budget
skips the most expensive remaining ones until the whole sweep's estimate fits; skipped
cells stay in the table as "skipped (estimated N s/call)". --dry-run prints the
estimates and stops.

Output, in --out-dir (default bench/sweep_results/), per CPU kind and thread count
(named from the CPU model, seqpack's ISA, the thread count and torch's version,
e.g. amd-epyc-avx2-1t-torch1.13): a markdown table (.md), the raw numbers (.json: every round's
time of every layout) and a heatmap (.svg, hand-written: rows cell x hidden, columns
batch x steps, a panel per mode and precision, red below 1.0x, white at 1.0x, green
above). A summary (cells, those below 1.0x, median ratio) is printed at the end.

    /usr/bin/python3 bench/sweep_vs_torch.py --quick                 # 96 cells, 1-2 minutes
    /usr/bin/python3 bench/sweep_vs_torch.py --dry-run               # what the default would run
    /usr/bin/python3 bench/sweep_vs_torch.py                         # the default sweep
(on a 2-core Zen 3 the default sweep measures 706 of its 768 cells, estimated 35 minutes;
the 62 it skips are the H=512/1024 shapes at batch 64-256 estimated over 1 s a call.)
    /usr/bin/python3 bench/sweep_vs_torch.py --full --rounds 7       # every shape, however slow
    /usr/bin/python3 bench/sweep_vs_torch.py --cells lstm --hidden 256 --batch 8,64 \\
        --steps 64,mixed --modes train --threads 1 --out-dir /tmp/sweep
"""
import argparse
import copy
import datetime
import json
import math
import os
import re
import statistics
import sys
import time
from xml.sax.saxutils import escape

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

from torch_threads import (add_malloc_option, add_openblas_option, apply_malloc,
                           apply_openblas_core, malloc_settings, placement_note,
                           set_openblas_threads, set_torch_threads)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:
    import seqpack
    import seqpack.torch as spt
except ImportError:  # no seqpack.pth in this Python: this tree's build
    sys.path.insert(0, os.path.join(REPO, os.environ.get("SEQPACK_BUILD_DIR", "build"), "python"))
    import seqpack
    import seqpack.torch as spt

CELLS = {"lstm": ("LSTM", torch.nn.LSTM, spt.LSTM, {}, 4),
         "gru": ("GRU", torch.nn.GRU, spt.GRU, {}, 3),
         "rnn": ("RNN", torch.nn.RNN, spt.RNN, {"nonlinearity": "tanh"}, 1)}
MIXED_SEED = 0


# ---------------------------------------------------------------- the shapes

def parse_list(text, what, convert=int, extra=()):
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if item in extra:
            out.append(item)
            continue
        try:
            value = convert(item)
        except ValueError:
            sys.exit(f"sweep_vs_torch: --{what} entry '{item}' is not a number"
                     + (f" or one of {', '.join(extra)}" if extra else ""))
        if value < 1:
            sys.exit(f"sweep_vs_torch: --{what} entry '{item}' must be >= 1")
        out.append(value)
    if not out:
        sys.exit(f"sweep_vs_torch: --{what} '{text}' names nothing")
    return list(dict.fromkeys(out))


def lengths_of(steps, batch, mixed_max):
    if steps == "mixed":
        g = torch.Generator().manual_seed(MIXED_SEED)
        return torch.randint(1, mixed_max + 1, (batch,), generator=g).tolist()
    return [steps] * batch


def precisions_to_run(requested, native_bf16):
    """[(label, seqpack precision)]: "default" is what seqpack picks on this CPU
    ("auto"); where that is fp32 it is the fp32 measurement, made once."""
    out = {}
    for p in requested:
        effective = ("bf16" if native_bf16 else "fp32") if p == "default" else p
        out.setdefault(effective, []).append(p)
    runs = []
    for eff, labels in out.items():
        if labels == ["default"]:
            runs.append((f"default ({eff})", eff))
        elif "default" in labels:
            runs.append((f"{eff} (default)", eff))
        else:
            runs.append((eff, eff))
    return runs


# ------------------------------------------------------------ the estimates

_mm_cache = {}


def mm_seconds(rows, hidden, gates, threads):
    """Fastest of a few torch.mm([rows, hidden] x [hidden, gates * hidden]) at
    `threads`: one step's GEMM at the shape the layers run, so that small batches'
    matrix-vector inefficiency is in the estimate as well."""
    key = rows, hidden, gates, threads
    if key not in _mm_cache:
        a, w = torch.rand(rows, hidden), torch.rand(hidden, gates * hidden)
        best, spent = math.inf, 0.0
        for _ in range(50):
            t0 = time.perf_counter()
            torch.mm(a, w)
            dt = time.perf_counter() - t0
            best, spent = min(best, dt), spent + dt
            if spent > 0.02:
                break
        _mm_cache[key] = best
    return _mm_cache[key]


def estimate_call(cell, hidden, lengths, mode, layers, directions, threads):
    """Rough seconds of the slower side's slowest layout per call: per step of the
    padded length, the input and the recurrent GEMM at the batch's rows and 10 us of
    framework (what dominates small shapes); training three times that (forward, and
    two products in backward); 1.5x for the gate math. Within about 2x of the calls
    measured on a Zen 3 at 1 thread."""
    gates = CELLS[cell][4]
    step = 2 * mm_seconds(len(lengths), hidden, gates, threads) + 1e-5
    return 1.5 * max(lengths) * step * (3 if mode == "train" else 1) * layers * directions


def sweep_cost(call, rounds, min_time, layouts):
    """Seconds one cell of the sweep takes: a warm-up per layout and side, then per
    round each of the `layouts` (both sides') for max(min_time, one call)."""
    return layouts * call + rounds * layouts * max(min_time, call)


# --------------------------------------------------------------- the timing

def fastest(run, min_time):
    """(fastest call's seconds, calls): runs `run` until min_time has passed, at least once."""
    best, spent, calls = math.inf, 0.0, 0
    while calls < 1 or spent < min_time:
        t0 = time.perf_counter()
        run()
        dt = time.perf_counter() - t0
        best, spent, calls = min(best, dt), spent + dt, calls + 1
    return best, calls


def runners(module, x, packed, mode, autocast_bf16):
    """{layout: a function running one call} for one module."""
    params = list(module.parameters())
    # seqpack's layers run their "auto" precision under CPU bf16 autocast. The
    # context is made once and entered per call, as a loop inside one autocast
    # region pays it: torch 1.13's constructor probes for torch_xla through
    # importlib at every construction (30-40 us, more than a small layer's call).
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if autocast_bf16 else None

    def forward(inp):
        if amp is not None:
            with amp:
                return module(inp)
        return module(inp)

    if mode == "infer":
        module.eval()

        def infer(inp):
            def run():
                with torch.no_grad():
                    forward(inp)
            return run

        return {"packed": infer(packed), "padded": infer(x)}

    module.train()
    # Leaves of their own per module and layout, so that the input gradient is
    # computed (as a caller training an embedding below the layer needs) and no
    # call accumulates into another's.
    data = packed.data.detach().clone().requires_grad_()
    leaf = PackedSequence(data, packed.batch_sizes, packed.sorted_indices,
                          packed.unsorted_indices)
    xl = x.detach().clone().requires_grad_()

    def train(inp, grad_leaf, rows):
        def run():
            for p in params:
                p.grad = None
            grad_leaf.grad = None
            out, _ = forward(inp)
            rows(out).sum().backward()
        return run

    return {"packed": train(leaf, data, lambda out: out.data),
            "padded": train(xl, xl, lambda out: out)}


def measure(cell, hidden, lengths, mode, precision, args, threads=1, openblas=False):
    name, tcls, scls, extra, _ = CELLS[cell]
    torch.manual_seed(0)
    kwargs = dict(num_layers=args.layers, bidirectional=args.bidirectional, **extra)
    tm = tcls(hidden, hidden, **kwargs)
    sm = scls(hidden, hidden, **kwargs)
    sm.load_state_dict(tm.state_dict())
    x = torch.rand(max(lengths), len(lengths), hidden) * 2 - 1
    packed = pack_padded_sequence(x, torch.tensor(lengths), enforce_sorted=False)
    sides = {"torch": runners(tm, x, packed, mode, False),
             "seqpack": runners(sm, x, packed, mode, precision == "bf16")}
    # At more than one thread torch's fp32 GEMMs run on OpenBLAS's pthreads beside
    # torch's OpenMP threads, and on a machine of that many cores the two pools can
    # wait on each other for milliseconds a call; the fp32 module is timed again with
    # OpenBLAS's pool at one thread (torch's own threads unchanged), the faster counting.
    one_blas_thread = set()
    if threads > 1 and openblas:
        for layout, run in list(sides["torch"].items()):
            sides["torch"][f"{layout}, BLAS 1t"] = run
            one_blas_thread.add(f"{layout}, BLAS 1t")
    if precision == "bf16":  # torch's bf16 module is one of its configurations
        tb = copy.deepcopy(tm).to(torch.bfloat16)
        xb = x.to(torch.bfloat16)
        pb = pack_padded_sequence(xb, torch.tensor(lengths), enforce_sorted=False)
        for layout, run in runners(tb, xb, pb, mode, False).items():
            sides["torch"][f"bf16 {layout}"] = run
    def pooled(side, layout, fn):
        if side != "torch" or layout not in one_blas_thread:
            return fn()
        set_openblas_threads(1)
        try:
            return fn()
        finally:
            set_openblas_threads(threads)

    warm = {}
    for side, runs in sides.items():
        for layout, run in runs.items():
            t0 = time.perf_counter()
            pooled(side, layout, run)  # first calls allocate, lay weights out, fill caches
            warm[f"{side} {layout}"] = time.perf_counter() - t0
    rounds = []
    for _ in range(args.rounds):
        r = {}
        for side, runs in sides.items():  # torch, then seqpack, back to back
            r[side] = {}
            for layout, run in runs.items():
                sec, calls = pooled(side, layout, lambda: fastest(run, args.min_time))
                r[side][layout] = dict(sec=sec, calls=calls)
        for side in sides:
            best = min(r[side], key=lambda lay: r[side][lay]["sec"])
            r[f"{side}_config"], r[f"{side}_sec"] = best, r[side][best]["sec"]
        r["ratio"] = r["torch_sec"] / r["seqpack_sec"]
        rounds.append(r)
    ratios = sorted(r["ratio"] for r in rounds)
    median_round = sorted(rounds, key=lambda r: r["ratio"])[(len(rounds) - 1) // 2]
    return dict(status="measured", ratio=median_round["ratio"], ratio_min=ratios[0],
                ratio_max=ratios[-1], torch_sec=median_round["torch_sec"],
                seqpack_sec=median_round["seqpack_sec"],
                torch_config=median_round["torch_config"],
                seqpack_config=median_round["seqpack_config"],
                warmup_sec=warm, rounds=rounds)


# ------------------------------------------------------------------ output

def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def slug(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "cpu"


def steps_label(steps):
    return "mixed" if steps == "mixed" else str(steps)


def fmt_ratio(r):
    """A ratio as printed in the table and the heatmap's squares."""
    return f"{r:.2f}" if r < 10 else f"{r:.1f}" if r < 100 else f"{r:.0f}"


def fmt_ms(sec):
    return f"{sec * 1e3:.3g}" if sec < 1 else f"{sec * 1e3:.0f}"


def write_markdown(path, meta, results):
    lines = [f"# seqpack.torch against torch.nn: {meta['cpu_model']}, "
             f"{meta['threads']} thread(s)", ""]
    lines += [f"- {k}: {v}" for k, v in meta["header"].items()]
    lines += ["", "ratio = torch ms / seqpack ms (> 1: seqpack faster), the median of "
              f"{meta['rounds']} paired rounds (range: the rounds' lowest and highest); ms = "
              "the fastest call of the median round; config = the layout that was faster "
              "(packed: pack_padded_sequence; padded: a plain [T, B, H] tensor; bf16: torch's module "
              "in bf16, module.to(torch.bfloat16); BLAS 1t: torch's fp32 module with the "
              "OpenBLAS its GEMMs call at one thread, torch's own threads unchanged).", "",
              "| cell | hidden | batch | steps | mode | precision | torch ms | seqpack ms | "
              "ratio | range | torch config | seqpack config |",
              "| --- | ---: | ---: | --- | --- | --- | ---: | ---: | ---: | --- | --- | --- |"]
    for r in results:
        head = (f"| {CELLS[r['cell']][0]} | {r['hidden']} | {r['batch']} | "
                f"{steps_label(r['steps'])} | {r['mode']} | {r['precision']} |")
        if r["status"] == "measured":
            lines.append(f"{head} {fmt_ms(r['torch_sec'])} | {fmt_ms(r['seqpack_sec'])} | "
                         f"{fmt_ratio(r['ratio'])}{'' if r['ratio'] >= 1 else ' **<1**'} | "
                         f"{fmt_ratio(r['ratio_min'])}-{fmt_ratio(r['ratio_max'])} | "
                         f"{r['torch_config']} | {r['seqpack_config']} |")
        else:
            lines.append(f"{head} {r['skip_reason']} | | | | | |")
    lines += ["", summary_text(results)]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def ratio_colour(r):
    """White at 1.0x, towards red below and green above, full at 0.5x and 2x (log scale)."""
    t = max(-1.0, min(1.0, math.log2(r)))
    target = (215, 48, 39) if t < 0 else (26, 152, 80)
    t = abs(t)
    return "#%02x%02x%02x" % tuple(round(255 + (c - 255) * t) for c in target)


def write_svg(path, meta, results, panels, cells, hidden, batches, steps):
    """The heatmap: a panel per (mode, precision), rows cell x hidden, columns
    batch x steps; each square's <title> carries the exact ratio and times."""
    cw, ch, left, gap = 50, 24, 96, 30
    cols = [(b, s) for b in batches for s in steps]
    rows = [(c, h) for c in cells for h in hidden]
    width = max(left + cw * len(cols) + 20, 760)  # the title and the legend fit too
    index = {(r["mode"], r["precision"], r["cell"], r["hidden"], r["batch"], r["steps"]): r
             for r in results}
    out = []
    y = 30
    title = (f"torch time / seqpack time (&gt;1: seqpack faster): {escape(meta['cpu_model'])}, "
             f"{meta['threads']} thread(s), torch {escape(meta['torch'])}")
    out.append(f'<text x="10" y="20" font-size="14" font-weight="bold">{title}</text>')
    # The legend: the colour scale's ends and middle.
    y += 6
    for i, r in enumerate((0.5, 0.71, 1.0, 1.41, 2.0)):
        x = 10 + i * 60
        out.append(f'<rect x="{x}" y="{y}" width="60" height="14" fill="{ratio_colour(r)}" '
                   f'stroke="#999"/>')
        out.append(f'<text x="{x + 30}" y="{y + 26}" font-size="10" text-anchor="middle">'
                   f'{"&lt;=" if r == 0.5 else "&gt;=" if r == 2.0 else ""}{r:g}x</text>')
    out.append(f'<text x="{10 + 5 * 60 + 10}" y="{y + 11}" font-size="10">grey: skipped '
               f'(estimated too slow; hover for the estimate)</text>')
    y += 46
    for mode, precision in panels:
        out.append(f'<text x="10" y="{y}" font-size="13" font-weight="bold">'
                   f'{escape(mode)}, seqpack {escape(precision)}</text>')
        y += 16
        for j, b in enumerate(batches):  # batch headers span their steps' columns
            x = left + j * len(steps) * cw
            out.append(f'<text x="{x + len(steps) * cw / 2}" y="{y}" font-size="11" '
                       f'text-anchor="middle">batch {b}</text>')
            out.append(f'<line x1="{x}" y1="{y + 3}" x2="{x + len(steps) * cw - 4}" '
                       f'y2="{y + 3}" stroke="#666"/>')
        y += 15
        for k, (b, s) in enumerate(cols):
            out.append(f'<text x="{left + k * cw + cw / 2}" y="{y}" font-size="10" '
                       f'text-anchor="middle">T {escape(steps_label(s))}</text>')
        y += 5
        for i, (c, h) in enumerate(rows):
            ry = y + i * ch
            out.append(f'<text x="{left - 6}" y="{ry + ch / 2 + 4}" font-size="11" '
                       f'text-anchor="end">{CELLS[c][0]} {h}</text>')
            for k, (b, s) in enumerate(cols):
                rx = left + k * cw
                r = index.get((mode, precision, c, h, b, s))
                if r is None:  # not yet measured, or not in this sweep
                    continue
                what = (f"{CELLS[c][0]} hidden {h} batch {b} steps {steps_label(s)} {mode} "
                        f"{precision}: ")
                if r["status"] == "measured":
                    fill, label = ratio_colour(r["ratio"]), fmt_ratio(r["ratio"])
                    what += (f"ratio {r['ratio']:.3f} (rounds {r['ratio_min']:.3f}-"
                             f"{r['ratio_max']:.3f}); torch {fmt_ms(r['torch_sec'])} ms "
                             f"{r['torch_config']}, seqpack {fmt_ms(r['seqpack_sec'])} ms "
                             f"{r['seqpack_config']}")
                else:
                    fill, label = "#d9d9d9", "skip"
                    what += r["skip_reason"]
                out.append(f'<g><title>{escape(what)}</title>'
                           f'<rect x="{rx}" y="{ry}" width="{cw}" height="{ch}" fill="{fill}" '
                           f'stroke="#fff"/>'
                           f'<text x="{rx + cw / 2}" y="{ry + ch / 2 + 4}" font-size="11" '
                           f'text-anchor="middle">{label}</text></g>')
        y += len(rows) * ch + gap
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y}" '
           f'font-family="sans-serif">\n<rect width="100%" height="100%" fill="white"/>\n'
           + "\n".join(out) + "\n</svg>\n")
    with open(path, "w") as f:
        f.write(svg)


def summary_text(results):
    measured = [r for r in results if r["status"] == "measured"]
    skipped = [r for r in results if r["status"] != "measured"]
    below = [r for r in measured if r["ratio"] < 1.0]
    lines = [f"cells measured: {len(measured)}, skipped: {len(skipped)}, below 1.0x: "
             f"{len(below)}"
             + (f", median ratio {fmt_ratio(statistics.median(r['ratio'] for r in measured))}"
                f" (lowest {fmt_ratio(min(r['ratio'] for r in measured))}, highest "
                f"{fmt_ratio(max(r['ratio'] for r in measured))})" if measured else "")]
    for r in sorted(below, key=lambda r: r["ratio"]):
        lines.append(f"  below 1.0x: {fmt_ratio(r['ratio'])} (rounds {fmt_ratio(r['ratio_min'])}-"
                     f"{fmt_ratio(r['ratio_max'])}) {r['threads']} thread(s) "
                     f"{CELLS[r['cell']][0]} hidden {r['hidden']} batch {r['batch']} steps "
                     f"{steps_label(r['steps'])} {r['mode']} {r['precision']} (torch "
                     f"{r['torch_config']} {fmt_ms(r['torch_sec'])} ms, seqpack "
                     f"{r['seqpack_config']} {fmt_ms(r['seqpack_sec'])} ms)")
    return "\n".join(lines)


# -------------------------------------------------------------------- main

def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cells", default="lstm,gru,rnn", help="of lstm, gru, rnn (tanh)")
    p.add_argument("--hidden", default="64,256,512,1024",
                   help="hidden sizes (input_size is the same)")
    p.add_argument("--batch", default="1,8,64,256")
    p.add_argument("--steps", default="1,8,64,mixed",
                   help="sequence lengths (all equal), or 'mixed': uniform in 1..--mixed-max")
    p.add_argument("--mixed-max", type=int, default=64, help="longest length of 'mixed'")
    p.add_argument("--modes", default="infer,train", help="of infer, train")
    p.add_argument("--threads", default="1,all", help="thread counts; 'all' = os.cpu_count()")
    p.add_argument("--precisions", default="default,fp32",
                   help="seqpack's: default (auto: bf16 with native bf16, else fp32), fp32, bf16")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--bidirectional", action="store_true")
    p.add_argument("--rounds", type=int, default=5, help="paired rounds; the median is reported")
    p.add_argument("--min-time", type=float, default=0.05,
                   help="seconds each layout runs per round (at least one call)")
    p.add_argument("--max-call", type=float, default=1.0,
                   help="skip shapes whose call is estimated above this many seconds "
                        "(unless --full)")
    p.add_argument("--full", action="store_true", help="no --max-call skipping")
    p.add_argument("--budget", type=float,
                   help="seconds for the whole sweep: skip the most expensive shapes until "
                        "the estimate fits")
    p.add_argument("--quick", action="store_true",
                   help="a small subset for a smoke run (about a minute on an idle 2-core "
                        "machine): hidden 64,256, batch 1,64, steps 8,mixed, 3 rounds, "
                        "--min-time 0.02, --max-call 0.1 (which skips the largest, so the "
                        "skipping shows too)")
    p.add_argument("--dry-run", action="store_true", help="print the estimates only")
    p.add_argument("--out-dir", default=os.path.join(REPO, "bench", "sweep_results"))
    add_malloc_option(p)
    add_openblas_option(p)
    p.set_defaults(malloc="tuned")
    args = p.parse_args()
    apply_malloc(args.malloc)
    openblas = apply_openblas_core(args.openblas_core)
    if args.quick:
        defaults = {a.dest: a.default for a in p._actions}
        for k, v in dict(hidden="64,256", batch="1,64", steps="8,mixed", rounds=3,
                         min_time=0.02, max_call=0.1).items():
            if getattr(args, k) == defaults[k]:  # what the command line set stands
                setattr(args, k, v)
    cells = [c.strip() for c in args.cells.split(",") if c.strip()]
    for c in cells:
        if c not in CELLS:
            sys.exit(f"sweep_vs_torch: --cells entry '{c}' is not one of {', '.join(CELLS)}")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in ("infer", "train"):
            sys.exit(f"sweep_vs_torch: --modes entry '{m}' is not one of infer, train")
    hidden = parse_list(args.hidden, "hidden")
    batches = parse_list(args.batch, "batch")
    steps = parse_list(args.steps, "steps", extra=("mixed",))
    threads = list(dict.fromkeys(os.cpu_count() if t == "all" else t
                                 for t in parse_list(args.threads, "threads", extra=("all",))))
    requested = [q.strip() for q in args.precisions.split(",") if q.strip()]
    for q in requested:
        if q not in ("default", "fp32", "bf16"):
            sys.exit(f"sweep_vs_torch: --precisions entry '{q}' is not one of default, fp32, bf16")
    if args.rounds < 1 or args.layers < 1 or args.mixed_max < 1:
        sys.exit("sweep_vs_torch: --rounds, --layers and --mixed-max must be >= 1")
    info = seqpack.cpu_info()
    if "bf16" in requested and not info.get("native_bf16"):
        sys.exit(f"sweep_vs_torch: --precisions bf16 needs native bf16; this CPU's ISA is "
                 f"{info.get('isa')}")
    precisions = precisions_to_run(requested, info.get("native_bf16"))
    directions = 2 if args.bidirectional else 1

    model = cpu_model()
    torch_cfg = torch.__config__.show()
    blas_info = re.search(r"BLAS_INFO=([^,\s]+)", torch_cfg)
    capability = re.search(r"CPU capability usage: (\S+)", torch_cfg)
    header = {
        "CPU": f"{model}, {os.cpu_count()} CPUs, seqpack ISA {info.get('isa')} (native bf16 "
               f"{info.get('native_bf16')})",
        "torch": f"{torch.__version__} (BLAS_INFO={blas_info.group(1) if blas_info else '?'}, "
                 f"CPU capability {capability.group(1) if capability else '?'}, mkldnn "
                 f"{torch.backends.mkldnn.is_available()})",
        "BLAS": f"seqpack: {info.get('blas')}; torch's: {openblas}",
        "allocator": malloc_settings(),
        "threads": placement_note(),
        "shapes": f"{args.layers} layer(s), {'bi' if args.bidirectional else 'uni'}directional, "
                  f"input_size = hidden; 'mixed' steps: lengths uniform in 1..{args.mixed_max} "
                  f"(seed {MIXED_SEED})",
        "precision": ", ".join(f"{label} -> seqpack {eff}" for label, eff in precisions)
                     + "; torch fp32"
                     + (", and against seqpack bf16 also torch's bf16 module (the faster counts)"
                        if any(eff == "bf16" for _, eff in precisions) else ""),
        "timing": f"{args.rounds} paired rounds, each layout for {args.min_time} s per round "
                  f"(fastest call)",
    }
    print(f"# sweep_vs_torch {datetime.datetime.now().isoformat(timespec='seconds')}, load "
          f"average {os.getloadavg()[0]:.2f}", flush=True)
    for k, v in header.items():
        print(f"# {k}: {v}", flush=True)

    # Every cell with its estimate, before any is measured, so that the skipped
    # ones are known (and said) up front.
    plan = []
    openblas_present = False
    for n in threads:
        openblas_present = set_torch_threads(n)
        for mode, (label, eff) in ((m, q) for m in modes for q in precisions):
            for c in cells:
                for h in hidden:
                    for b in batches:
                        for s in steps:
                            lengths = lengths_of(s, b, args.mixed_max)
                            est = estimate_call(c, h, lengths, mode, args.layers, directions, n)
                            plan.append(dict(threads=n, mode=mode, precision=label,
                                             seqpack_precision=eff, cell=c, hidden=h, batch=b,
                                             steps=s, input_size=h, layers=args.layers,
                                             bidirectional=args.bidirectional,
                                             lengths=lengths, estimate_sec_per_call=est,
                                             status="planned"))
    for r in plan:
        if not args.full and r["estimate_sec_per_call"] > args.max_call:
            r["status"] = "skipped"
            r["skip_reason"] = (f"skipped (estimated {r['estimate_sec_per_call']:.2g} s/call, "
                                f"over --max-call {args.max_call:g})")
    cost = lambda r: sweep_cost(r["estimate_sec_per_call"], args.rounds, args.min_time,
                                (6 if r["seqpack_precision"] == "bf16" else 4)
                                + (2 if r["threads"] > 1 and openblas_present else 0))
    kept = [r for r in plan if r["status"] == "planned"]
    if args.budget is not None:
        total = sum(cost(r) for r in kept)
        for r in sorted(kept, key=cost, reverse=True):
            if total <= args.budget:
                break
            total -= cost(r)
            r["status"] = "skipped"
            r["skip_reason"] = (f"skipped (estimated {r['estimate_sec_per_call']:.2g} s/call; "
                                f"over --budget {args.budget:g} s)")
        kept = [r for r in plan if r["status"] == "planned"]
    skipped = [r for r in plan if r["status"] == "skipped"]
    print(f"# {len(plan)} cells: {len(kept)} to measure (estimated "
          f"{sum(cost(r) for r in kept) / 60:.1f} min), {len(skipped)} skipped", flush=True)
    for r in skipped:
        print(f"#   {r['threads']}t {CELLS[r['cell']][0]} hidden {r['hidden']} batch "
              f"{r['batch']} steps {steps_label(r['steps'])} {r['mode']} {r['precision']}: "
              f"{r['skip_reason']}", flush=True)
    if args.dry_run:
        return

    os.makedirs(args.out_dir, exist_ok=True)
    kind = slug(f"{model} {info.get('isa', '')}")
    panels = [(m, label) for m in modes for label, _ in precisions]
    started = time.perf_counter()
    for n in threads:
        set_torch_threads(n)  # torch's and its OpenBLAS's
        seqpack.set_num_threads(n)
        mine = [r for r in plan if r["threads"] == n]
        meta = dict(cpu_model=model, cpu_kind=kind, threads=n, torch=torch.__version__,
                    seqpack_cpu_info=info, header=header, rounds=args.rounds,
                    min_time=args.min_time, argv=sys.argv[1:],
                    date=datetime.datetime.now().isoformat(timespec="seconds"))
        version = ".".join(torch.__version__.split(".")[:2])
        base = os.path.join(args.out_dir, f"{kind}-{n}t-torch{version}")
        done = []
        for r in mine:
            if r["status"] == "planned":
                print(f"... {n}t {CELLS[r['cell']][0]} hidden {r['hidden']} batch {r['batch']} "
                      f"steps {steps_label(r['steps'])} {r['mode']} {r['precision']} (estimated "
                      f"{r['estimate_sec_per_call']:.2g} s/call)", file=sys.stderr, flush=True)
                r.update(measure(r["cell"], r["hidden"], r["lengths"], r["mode"],
                                 r["seqpack_precision"], args, n, openblas_present))
                print(f"    ratio {fmt_ratio(r['ratio'])} (torch {r['torch_config']} "
                      f"{fmt_ms(r['torch_sec'])} ms, seqpack {r['seqpack_config']} "
                      f"{fmt_ms(r['seqpack_sec'])} ms)", file=sys.stderr, flush=True)
            done.append(r)
            # Written after every cell, so that a long sweep stopped early keeps what it measured.
            with open(base + ".json", "w") as f:
                json.dump(dict(meta, results=done), f, indent=1)
            write_markdown(base + ".md", meta, done)
            write_svg(base + ".svg", meta, done, panels, cells, hidden, batches, steps)
        print(f"\n## {n} thread(s): {base}.md, .json, .svg", flush=True)
        print(summary_text(mine), flush=True)
    if len(threads) > 1:
        print(f"\n## all thread counts\n{summary_text(plan)}")
    print(f"\n# {time.perf_counter() - started:.0f} s, load average {os.getloadavg()[0]:.2f} at "
          f"the end", flush=True)


if __name__ == "__main__":
    main()
