#!/usr/bin/env python3
"""The operators' C++ CUDA kernels (seqpack_torch/cuda_ops.cpp) on the GPU
machine: built there against its own torch (bench/cuda_operators.py:
torch.utils.cpp_extension, the kernels, their CUDA registration and the
operators' schemas, no CPU core needed), checked against torch, then timed
against torch's packed layers (torch._VF) per call.

  python3 bench/cuda_cpp_ops.py [--calls 300] [--rounds 5]     # a CUDA GPU
  /usr/bin/python3 bench/cuda_cpp_ops.py --cpu                  # self-test here

What it prints:
  - check: a 2-layer bidirectional LSTM with a projection and a bidirectional
    GRU, packed from an unsorted batch, outputs, states and every gradient of
    the C++ kernels against torch._VF's packed layers (the tolerance rule of
    docs/testing.md with the reduction length, TF32 off); a difference past
    the bound ends the script with an error;
  - a table of microseconds per inference call (torch.no_grad, the caller's
    stream, one synchronisation after the calls): torch._VF's packed layer
    against the C++ operator running seqpack's kernels, in paired rounds, with
    the ratio. The calls are
    queued without waiting, so where the GPU's work per call takes longer than
    the host's, that is what is measured; the host time per call (the process's
    CPU time over the calls) is printed beside it.

--cpu: the same code on the CPU for this script's own test: the kernels are
built with their CPU test registration (cuda_emulated_ops.cpp, the operators
torch.ops.seqpack_cuda_emulated.*) over the CUDA library compiled for the CPU
(cuda/emulate/; SEQPACK_CUDA_LIBRARY names one already built); the figures
mean nothing.
"""
import argparse
import importlib.util
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python" / "tests"))
from tolerance import fp_bound, rnn_reduction_length  # noqa: E402  (docs/testing.md's rule)


def load_operators():
    """bench/cuda_operators.py, by file path."""
    spec = importlib.util.spec_from_file_location("seqpack_cuda_operators", ROOT / "bench" / "cuda_operators.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def emulated_library(workdir: pathlib.Path) -> str:
    out = workdir / "libseqpack_cuda.so"
    cxx = shutil.which("g++") or "c++"
    subprocess.run([cxx, "-std=c++20", "-O1", "-fPIC", "-shared", "-Wno-unknown-pragmas", "-x", "c++",
                    *sorted(str(f) for f in (ROOT / "cuda" / "src").glob("*.cu")), "-DSEQPACK_CUDA_EMULATE",
                    "-I", str(ROOT / "cuda" / "emulate"), "-I", str(ROOT / "include"), "-o", str(out), "-pthread"],
                   check=True)
    return str(out)


def close(what, got, want, n):
    scale = max(1.0, float(want.detach().abs().max()))
    bound = fp_bound(scale, n, "float32")
    err = float((got.detach().double() - want.detach().double()).abs().max())
    print(f"  {what}: max |difference| {err:.3g} (bound {bound:.3g})")
    if not err <= bound:
        raise SystemExit(f"cuda_cpp_ops: {what} differs by {err:.3g} > {bound:.3g}")


def check(ops, device):
    """The C++ kernels against torch's packed layer, forward and every gradient."""
    torch.manual_seed(0)
    for mode, kwargs in (("LSTM", dict(num_layers=2, bidirectional=True, proj_size=3)),
                         ("GRU", dict(num_layers=1, bidirectional=True))):
        layer = getattr(torch.nn, mode)(5, 8, **kwargs).to(device)
        seqs = [torch.randn(n, 5, device=device) for n in (3, 7, 1, 7, 4)]
        packed = torch.nn.utils.rnn.pack_sequence(seqs, enforce_sorted=False)
        weights = list(layer._flat_weights)
        dirs, layers = 2, layer.num_layers
        hout = layer.proj_size or 8
        h0 = torch.randn(dirs * layers, 5, hout, device=device)
        c0 = torch.randn(dirs * layers, 5, 8, device=device) if mode == "LSTM" else None
        n = rnn_reduction_length(5, 8, layers, True, int(packed.data.shape[0]), layer.proj_size)
        runs = {}
        for who in ("cpp", "torch"):
            x = packed.data.detach().clone().requires_grad_()
            h = h0.clone().requires_grad_()
            c = c0.clone().requires_grad_() if c0 is not None else None
            ws = [w.detach().clone().requires_grad_() for w in weights]
            if who == "cpp":
                y, hn, cn = ops.rnn(x, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices, h, c,
                                    ws, mode, 8, layers, True, True, layer.proj_size, 0.0, False, None, "fp32")
                cn = cn if mode == "LSTM" else None
            else:
                hx = h.index_select(1, packed.sorted_indices)
                hx = (hx, c.index_select(1, packed.sorted_indices)) if c is not None else hx
                fn = getattr(torch._VF, mode.lower())
                out = fn(x, packed.batch_sizes, hx, ws, True, layers, 0.0, False, True)
                y, hn = out[0], out[1].index_select(1, packed.unsorted_indices)
                cn = out[2].index_select(1, packed.unsorted_indices) if mode == "LSTM" else None
            loss = y.square().sum() + hn.sum() + (cn.sum() if cn is not None else 0)
            leaves = [x, h] + ([c] if c is not None else []) + ws
            runs[who] = [y, hn] + ([cn] if cn is not None else []) + list(torch.autograd.grad(loss, leaves))
        print(f"{mode}: the C++ kernels against torch._VF's packed {mode.lower()}")
        names = ["output", "h_n"] + (["c_n"] if c0 is not None else []) + ["dx", "dh0"] + \
            (["dc0"] if c0 is not None else []) + [f"dweights[{i}]" for i in range(len(weights))]
        for name, got, want in zip(names, runs["cpp"], runs["torch"]):
            close(name, got, want, n)


def timed(fn, calls, device):
    for _ in range(10):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - w0) / calls * 1e6, (time.process_time() - c0) / calls * 1e6


def cases(device):
    scale = 16 if device.type == "cpu" else 1  # the self-test's emulated kernels: small sizes
    for mode, hidden, batch, steps, layers, bi in (("LSTM", 256, 1, 1, 1, False), ("GRU", 256, 64, 1, 1, False),
                                                   ("LSTM", 512, 64, 32, 2, True)):
        hidden, batch, steps = hidden // scale, max(batch // scale, 1), max(steps // scale, 1)
        torch.manual_seed(0)
        layer = getattr(torch.nn, mode)(hidden, hidden, num_layers=layers, bidirectional=bi).to(device)
        dirs = 2 if bi else 1
        data = torch.randn(batch * steps, hidden, device=device)
        bs = torch.full((steps,), batch, dtype=torch.int64)
        h0 = torch.zeros(layers * dirs, batch, hidden, device=device)
        c0 = torch.zeros_like(h0) if mode == "LSTM" else None
        name = f"{mode}(H {hidden}) batch {batch} x {steps} steps" + (f", {layers} layers, bi" if layers > 1 else "")
        yield name, mode, hidden, layers, bi, data, bs, h0, c0, [w.detach() for w in layer._flat_weights]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cpu", action="store_true", help="self-test on the CPU (see above)")
    args = ap.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        print("cuda_cpp_ops: no CUDA GPU (torch.cuda.is_available() is False); --cpu tests this script")
        return 0
    device = torch.device("cpu" if args.cpu else "cuda")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = pathlib.Path(tmp)
        if args.cpu and not os.environ.get("SEQPACK_CUDA_LIBRARY"):
            os.environ["SEQPACK_CUDA_LIBRARY"] = emulated_library(workdir)
        operators = load_operators()
        # On the GPU into torch's extension cache, where the tests find them; the self-test's apart.
        ops = operators.load(on_cpu=args.cpu, workdir=workdir if args.cpu else None)
        print("library:", ops._cuda_library(""))
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        check(ops, device)
        print(f"\nmicroseconds per inference call, median of {args.rounds} paired rounds of {args.calls} calls "
              f"(wall with one synchronisation after the calls; host CPU time in parentheses); torch "
              f"{torch.__version__}" + (" (self-test on the CPU: meaningless)" if args.cpu else ""))
        print("| case | torch packed | C++ operator | C++ / torch |\n| --- | ---: | ---: | ---: |")
        for name, mode, hidden, layers, bi, data, bs, h0, c0, weights in cases(device):
            hx = (h0, c0) if c0 is not None else h0

            def via_torch():
                return getattr(torch._VF, mode.lower())(data, bs, hx, weights, True, layers, 0.0, False, bi)

            def via_cpp():
                return ops.rnn(data, bs, None, None, h0, c0, weights, mode, hidden, layers, True, bi, 0, 0.0,
                               False, None, "fp32")

            g, c, ratios = [], [], []
            with torch.no_grad():
                for _ in range(args.rounds):
                    g.append(timed(via_torch, args.calls, device))
                    c.append(timed(via_cpp, args.calls, device))
                    ratios.append(c[-1][0] / g[-1][0])
            gw, gc = statistics.median(t[0] for t in g), statistics.median(t[1] for t in g)
            cw, cc = statistics.median(t[0] for t in c), statistics.median(t[1] for t in c)
            print(f"| {name} | {gw:.1f} ({gc:.1f}) | {cw:.1f} ({cc:.1f}) | {statistics.median(ratios):.2f} |")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
