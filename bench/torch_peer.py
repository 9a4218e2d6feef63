#!/usr/bin/python3
"""The torch side of bench/compare_torch.py: times torch.nn on one workload in
one configuration (fp32, bf16 or int8 module; packed or padded input).

compare_torch.py uses it in-process for the torch it runs under (1.13 on
Debian 12) and, with --torch-2.6, starts it inside Debian 13 (PyTorch 2.6,
oneDNN 3.7) through scripts/debian13.sh as a server: one JSON request per line
on stdin, one reply per line on stdout after the prefix `PEER `.

    bash scripts/debian13.sh /usr/bin/python3 bench/torch_peer.py --serve --malloc tuned

Configurations of a mode (inputs and weights built outside the timed region):
    forward_packed / train_packed, layout "packed": pack_padded_sequence of the exact lengths
    forward_packed / train_packed, layout "padded": the [max_len, batch, input] batch
        (every sequence at max_len: torch's padded path, oneDNN's RNN on 2.x,
        computing on the padding)
    forward_padded: the padded batch only
with dtype float32, bfloat16 (module.to(torch.bfloat16) and bf16 input), or
qint8: PyTorch's int8 inference, torch.ao.quantization.quantize_dynamic(module,
{nn.LSTM, nn.GRU, nn.RNN}, dtype=torch.qint8) (int8 weights, activations
quantized per tensor at run time; fp32 input), forward modes only. Neither
1.13 nor 2.6 has a dynamically quantized nn.RNN (quantize_dynamic leaves it
in fp32): that configuration is absent (the Absent exception; the server
replies {"absent": reason}).
"""
import argparse
import json
import statistics
import sys
import time

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

from torch_threads import add_malloc_option, apply_malloc, malloc_settings, set_torch_threads

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "qint8": torch.qint8}


class Absent(Exception):
    """A configuration this torch does not have (its message says why)."""


def quantized_module(m):
    """PyTorch's int8 inference module for m: quantize_dynamic with qint8 weights.
    quantize_dynamic swaps the children of the module it is given, never that module
    itself, so m goes in inside a Sequential. Raises Absent where this torch has no
    dynamically quantized module of m's type (it would leave m in fp32)."""
    nn = torch.nn
    q = torch.ao.quantization.quantize_dynamic(nn.Sequential(m), {nn.LSTM, nn.GRU, nn.RNN},
                                               dtype=torch.qint8)[0]
    if type(q) is type(m):
        raise Absent(f"torch {torch.__version__}'s quantize_dynamic has no int8 "
                     f"nn.{type(m).__name__} (it leaves the module in fp32)")
    return q


def median_time(run, min_time, slow_single):
    """One warm-up, then timed runs until min_time is spent on >= 3 runs and the
    median is stable (as `seqpack bench` does), within a budget of 5 * min_time.
    A warm-up slower than `slow_single` seconds is itself the one sample: PyTorch's
    packed LSTM backward is quadratic in the length and takes tens of seconds on
    lstm-long-seq, where one run in either direction changes nothing."""
    c0, t0 = time.process_time(), time.perf_counter()
    run()
    warm, warm_cpu = time.perf_counter() - t0, time.process_time() - c0
    if warm > slow_single:
        return warm, warm_cpu, 1
    budget = 5 * min_time
    samples, cpu_samples = [], []
    while True:
        c0, t0 = time.process_time(), time.perf_counter()
        run()
        samples.append(time.perf_counter() - t0)
        cpu_samples.append(time.process_time() - c0)
        total = sum(samples)
        if total >= budget:
            break
        if total >= min_time and len(samples) >= 3:
            m = statistics.median(samples)
            if abs(m - statistics.median(samples[:-2])) <= 0.01 * m:
                break
    return statistics.median(samples), statistics.median(cpu_samples), len(samples)


def torch_module(w):
    kw = dict(input_size=w["input_size"], hidden_size=w["hidden_size"],
              num_layers=w["num_layers"], bidirectional=w.get("bidirectional", False))
    cell = w["cell"]
    if cell == "lstm":
        return torch.nn.LSTM(**kw)
    if cell == "gru":
        return torch.nn.GRU(**kw)
    if cell in ("rnn_tanh", "rnn_relu"):
        return torch.nn.RNN(nonlinearity=cell[4:], **kw)
    raise ValueError(f"workload '{w['name']}': cell '{cell}' is not one of lstm, gru, rnn_tanh, "
                     f"rnn_relu")


def torch_bench(w, mode, lengths, min_time, slow_single, dtype=torch.float32, layout="packed"):
    """(median seconds, median CPU seconds, runs) of torch.nn on `mode`. dtype
    torch.qint8 is quantize_dynamic's module on fp32 input (forward modes only)."""
    torch.manual_seed(0)
    if dtype == torch.qint8:
        if mode == "train_packed":
            raise Absent("int8 (quantize_dynamic) is for inference: no train_packed")
        m, dtype = quantized_module(torch_module(w)), torch.float32
    else:
        m = torch_module(w).to(dtype)
    batch, max_len = len(lengths), max(lengths)
    x = (torch.rand(max_len, batch, w["input_size"]) * 2 - 1).to(dtype)
    if mode == "forward_padded" or (mode == "forward_packed" and layout == "padded"):
        with torch.no_grad():
            return median_time(lambda: m(x), min_time, slow_single)
    params = list(m.parameters())
    if mode == "train_packed" and layout == "padded":
        xl = x.detach().requires_grad_()

        def step_padded():
            for p in params:
                p.grad = None
            xl.grad = None
            out, _ = m(xl)
            out.sum().backward()

        return median_time(step_padded, min_time, slow_single)
    packed = pack_padded_sequence(x, torch.tensor(lengths), enforce_sorted=False)
    if mode == "forward_packed":
        with torch.no_grad():
            return median_time(lambda: m(packed), min_time, slow_single)
    # train_packed: the packed rows are a leaf so the input gradient is computed too,
    # as seqpack's rnn_backward does; gradients are dropped between runs instead of
    # accumulated, as seqpack's are returned fresh.
    data = packed.data.detach().requires_grad_()
    leaf = PackedSequence(data, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices)

    def step():
        for p in params:
            p.grad = None
        data.grad = None
        out, _ = m(leaf)
        out.data.sum().backward()

    return median_time(step, min_time, slow_single)


def handle(request):
    """One request: {workload, mode, lengths, min_time, slow_single, dtype, layout, threads}."""
    set_torch_threads(request["threads"])
    sec, cpu, reps = torch_bench(request["workload"], request["mode"], request["lengths"],
                                 request["min_time"], request["slow_single"],
                                 DTYPES[request["dtype"]], request["layout"])
    return dict(sec=sec, cpu=cpu, reps=reps)


def serve():
    def reply(obj):
        sys.stdout.write("PEER " + json.dumps(obj) + "\n")
        sys.stdout.flush()

    reply(dict(torch=torch.__version__, allocator=malloc_settings(),
               mkldnn=torch.backends.mkldnn.is_available()))
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply(handle(json.loads(line)))
        except Absent as e:
            reply(dict(absent=str(e)))
        except Exception as e:  # the client reports it with the request
            reply(dict(error=f"{type(e).__name__}: {e}"))


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--serve", action="store_true", help="answer JSON requests on stdin")
    add_malloc_option(p)
    args = p.parse_args()
    apply_malloc(args.malloc)
    if not args.serve:
        p.error("only --serve is a command; compare_torch.py imports the rest")
    serve()


if __name__ == "__main__":
    main()
