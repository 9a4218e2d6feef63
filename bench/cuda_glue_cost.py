#!/usr/bin/env python3
"""The host cost of the CUDA glue (python/seqpack/_cuda.py) per forward call,
measured without a GPU: the glue runs on CPU tensors against a null library
(every entry point of include/seqpack/cuda.h returning at once, built here
with the C compiler), so what is timed is the glue alone: the checks, the
buffer sizes, the allocations, the ctypes call and torch's registration
(torch.library.custom_op where torch has it, else an autograd.Function).

On a GPU the glue adds the device guard and the current stream's lookup,
which the CPU path skips; scripts/device_check.sh times the whole call there.

  /usr/bin/python3 bench/cuda_glue_cost.py [--calls 2000] [--rounds 5] [--products torch|library] [--cpp]

Prints, per case, the median over rounds of the mean microseconds per call.

--cpp: the glue against the operators' C++ CUDA kernels (seqpack_torch/
cuda_ops.cpp, what seqpack::rnn runs on CUDA tensors where libseqpack_torch is
built against a CUDA LibTorch), both over the null library, the C++ kernels
through the build's test library (libseqpack_torch_cuda_emulated.so: the same
kernels registered for CPU tensors). Both run their products for real here
(the C++ kernels' are torch's own at:: calls, which no stand-in replaces), so
the cases are small (hidden size 16): a call's fixed cost, each product a
microsecond or two. Paired rounds: the ratio is C++ / glue.

--products torch (the glue's default, SEQPACK_CUDA_PRODUCTS): the products
that are not recurrent are torch's (one library call per layer after one
input projection per direction). Those products would compute here on the
CPU, which on a GPU runs asynchronously: the glue's products (_linear, _mm)
are replaced by stand-ins that only allocate their result, so what is timed
is the glue's own cost and a product's dispatch and allocation. A real
product on a GPU adds its cuBLAS launch on top (a few microseconds each,
not measured here). --products library: every product in the library, one
call for the whole stack.
"""
import argparse
import functools
import importlib.util
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Every entry point returns at once. Its parameters are those of any ABI
# version (the passes' arguments are ignored, which the x86-64 calling
# convention allows), so that an older glue can be timed too (--against).
NULL_LIBRARY = r"""
#include <stddef.h>
#include <stdint.h>
int seqpack_cuda_abi_version(void) { return ABI; }
const char* seqpack_cuda_last_error(void) { return ""; }
int seqpack_cuda_rnn_buffer_sizes(int mode, int dtype, int64_t rows, int64_t batch, int64_t input_size,
                                  int64_t hidden_size, int64_t proj_size, int64_t num_layers,
                                  int bidirectional, size_t* workspace_bytes, size_t* reserve_bytes) {
  *workspace_bytes = 256;
  *reserve_bytes = (size_t)rows * 64;
  return 0;
}
int seqpack_cuda_rnn_forward(const void* args) { return 0; }
int seqpack_cuda_rnn_backward(const void* args) { return 0; }
"""


def null_glue(workdir: pathlib.Path, glue: pathlib.Path = ROOT / "python" / "seqpack" / "_cuda.py",
              name: str = "seqpack_cuda_glue_null"):
    abi = re.search(r"^ABI_VERSION = (\d+)", glue.read_text(), re.M).group(1)
    src = workdir / "null.c"
    lib = workdir / f"abi{abi}" / "libseqpack_cuda.so"
    src.write_text(NULL_LIBRARY)
    lib.parent.mkdir(exist_ok=True)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", f"-DABI={abi}", str(src), "-o", str(lib)], check=True)
    os.environ["SEQPACK_CUDA_LIBRARY"] = str(lib)
    spec = importlib.util.spec_from_file_location(name, glue)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module._library() is not None, module.why_unavailable()
    # CPU tensors stand for CUDA ones: the one check that tells them apart is skipped.
    module._validate = functools.partial(module._validate, require_cuda=False)
    return module


def _stand_in_linear(x, w, b=None):
    """torch.nn.functional.linear's result, allocated, not computed (see --products)."""
    return x.new_empty((x.shape[0], w.shape[0]))


def _stand_in_mm(a, b):
    return a.new_empty((a.shape[0], b.shape[1]))


def case(mode, hidden, batch, steps, layers=1, bidirectional=False):
    torch.manual_seed(0)
    cls = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU}[mode]
    m = cls(hidden, hidden, num_layers=layers, bidirectional=bidirectional)
    data = torch.randn(batch * steps, hidden)
    bs = torch.full((steps,), batch, dtype=torch.int64)
    dirs = 2 if bidirectional else 1
    h0 = torch.zeros(layers * dirs, batch, hidden)
    hx = (h0, torch.zeros_like(h0)) if mode == "LSTM" else h0
    return dict(mode=mode, data=data, bs=bs, hx=hx, weights=list(m._flat_weights), layers=layers, hidden=hidden,
                bidirectional=bidirectional, name=f"{mode}(H {hidden}) batch {batch} x {steps} steps"
                + (f", {layers} layers" if layers > 1 else "") + (", bi" if bidirectional else ""))


def one_call(glue, c):
    out = glue.rnn_packed(c["mode"], c["data"], c["bs"], c["hx"], c["weights"], True, c["layers"], 0.0, False,
                          c["bidirectional"])
    return out


def cpp_operators(workdir: pathlib.Path):
    """torch.ops.seqpack_cuda_emulated over the null library (see --cpp)."""
    import seqpack.torch  # noqa: F401  (libseqpack_torch: the kernels)
    import seqpack
    build = (pathlib.Path(seqpack.__file__).parent / "libseqpack_torch.so").resolve().parents[2]
    lib = build / "tests" / "libseqpack_torch_cuda_emulated.so"
    if not lib.is_file():
        sys.exit(f"cuda_glue_cost: {lib} is not built (SEQPACK_BUILD_TESTS and SEQPACK_BUILD_TORCH)")
    torch.ops.load_library(str(lib))
    torch.ops.seqpack_cuda_emulated._cuda_library(os.environ["SEQPACK_CUDA_LIBRARY"])
    return torch.ops.seqpack_cuda_emulated


def cpp_call(ops, c):
    hx = c["hx"]
    h0, c0 = (hx[0], hx[1]) if c["mode"] == "LSTM" else (hx, None)
    return ops.rnn(c["data"], c["bs"], None, None, h0, c0, c["weights"], c["mode"], c["hidden"], c["layers"],
                   True, c["bidirectional"], 0, 0.0, False, None, "fp32")


def main_cpp(args):
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        glue = null_glue(pathlib.Path(tmp))
        ops = cpp_operators(pathlib.Path(tmp))
        print(f"torch {torch.__version__}; null library; median of {args.rounds} paired rounds of {args.calls} "
              f"calls; products computed (hidden size 16); ratio C++ / glue")
        print("| case | glue inference (us) | C++ (us) | ratio | glue recording (us) | C++ (us) | ratio |\n"
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for c in (case("LSTM", 16, 1, 1), case("GRU", 16, 64, 1), case("LSTM", 16, 8, 32, 2, True)):
            times = {k: [] for k in ("gi", "ci", "gr", "cr")}
            for _ in range(args.rounds):
                with torch.no_grad():
                    times["gi"].append(timed(lambda: one_call(glue, c), args.calls))
                    times["ci"].append(timed(lambda: cpp_call(ops, c), args.calls))
                for w in c["weights"]:
                    w.requires_grad_(True)
                times["gr"].append(timed(lambda: one_call(glue, c), args.calls))
                times["cr"].append(timed(lambda: cpp_call(ops, c), args.calls))
                for w in c["weights"]:
                    w.requires_grad_(False)
            cells = []
            for g, k in (("gi", "ci"), ("gr", "cr")):
                ratio = statistics.median(b / a for a, b in zip(times[g], times[k]))
                cells += [f"{statistics.median(times[g]):.1f}", f"{statistics.median(times[k]):.1f}",
                          f"{ratio:.2f}"]
            print(f"| {c['name']} | " + " | ".join(cells) + " |")
            sys.stdout.flush()


def timed(fn, calls):
    for _ in range(50):
        fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--against", type=pathlib.Path,
                    help="another version of _cuda.py (git show REV:python/seqpack/_cuda.py > FILE), timed "
                         "in the same rounds: its microseconds and ours / its")
    ap.add_argument("--products", choices=["torch", "library"], default="torch",
                    help="where the products that are not recurrent run (SEQPACK_CUDA_PRODUCTS)")
    ap.add_argument("--cpp", action="store_true",
                    help="the glue against the operators' C++ CUDA kernels (see above)")
    args = ap.parse_args()
    if args.cpp:
        main_cpp(args)
        return
    os.environ["SEQPACK_CUDA_PRODUCTS"] = args.products
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        glues = [null_glue(pathlib.Path(tmp))]
        if args.against:
            glues.append(null_glue(pathlib.Path(tmp), args.against, "seqpack_cuda_glue_against"))
        for glue in glues:  # the glue's products (an older glue has none)
            glue._linear, glue._mm = _stand_in_linear, _stand_in_mm
        print(f"torch {torch.__version__}; registration: "
              f"{'custom_op' if glues[0]._HAS_CUSTOM_OP else 'autograd.Function'}; null library; "
              f"median of {args.rounds} rounds of {args.calls} calls; products: {args.products}"
              + (f"; against {args.against}" if args.against else ""))
        head = "| case | inference (us) | recording a graph (us) |"
        if args.against:
            head = "| case | inference (us) | against (us) | ratio | recording (us) | against (us) | ratio |"
        print(head + "\n|" + " --- |" + " ---: |" * (head.count("|") - 2))
        for c in (case("LSTM", 256, 1, 1), case("GRU", 256, 64, 1), case("LSTM", 512, 64, 32, 2, True)):
            inf = [[] for _ in glues]
            rec = [[] for _ in glues]
            for _ in range(args.rounds):
                for i, glue in enumerate(glues):
                    with torch.no_grad():
                        inf[i].append(timed(lambda: one_call(glue, c), args.calls))
                    for w in c["weights"]:
                        w.requires_grad_(True)
                    rec[i].append(timed(lambda: one_call(glue, c), args.calls))
                    for w in c["weights"]:
                        w.requires_grad_(False)
            cells = []
            for times in (inf, rec):
                cells.append(f"{statistics.median(times[0]):.1f}")
                if args.against:
                    ratio = statistics.median(a / b for a, b in zip(times[0], times[1]))
                    cells += [f"{statistics.median(times[1]):.1f}", f"{ratio:.2f}"]
            print(f"| {c['name']} | " + " | ".join(cells) + " |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
