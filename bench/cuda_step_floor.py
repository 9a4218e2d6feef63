#!/usr/bin/env python3
"""The per-step floor of a persistent recurrence on thread-block clusters, on
the GPU: cuda/probe/step_floor.cu (libseqpack_cuda_probe.so, beside the CUDA
library), a tanh RNN whose W_hh slices stay in the shared memory of one
cluster's blocks, h all-gathered through distributed shared memory, one
cluster barrier a step. The device check's first measurement (issue 44: at
most 1 us a step for H <= 512 in bf16, before the full kernels are tuned).

    python3 bench/cuda_step_floor.py [--json floor.json] [--hidden 128,256,512]

Per (dtype, H, batch, cluster size): the results are checked first against a
float64 recurrence (python/tests/step_floor_check.py, a short run); then one
launch of S1 steps and one of S2 steps are timed with CUDA events (the median
of --repeats each), and the floor is their difference over S2 - S1 steps, so
the launch's own cost cancels. A configuration the GPU refuses (a cluster of
16 needs the non-portable size; shared memory) is reported with its CUDA error.
"""
import argparse
import ctypes
import json
import os
import statistics
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python", "tests"))
from step_floor_check import bind, check_floor, make_case, run_floor  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def probe_library():
    """libseqpack_cuda_probe.so beside SEQPACK_CUDA_LIBRARY, or under build-cuda/."""
    where = []
    lib = os.environ.get("SEQPACK_CUDA_LIBRARY")
    if lib:
        where.append(os.path.join(os.path.dirname(lib), "libseqpack_cuda_probe.so"))
    where += [os.path.join(REPO, "build-cuda", "libseqpack_cuda_probe.so"),
              os.path.join(REPO, "build", "cuda", "libseqpack_cuda_probe.so")]
    for path in where:
        if os.path.isfile(path):
            return path
    return None


def time_launch(f, w, xg, h0, cluster, threads, steps, repeats):
    """Median milliseconds of one launch of `steps` steps (CUDA events; wall
    clock on the CPU, the self-test's emulated library)."""
    cuda = w.is_cuda
    stream = torch.cuda.current_stream() if cuda else None
    times = []
    for _ in range(repeats + 1):  # the first warms up
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(stream)
        t0 = time.perf_counter()
        status, _ = run_floor(f, w, xg, h0, cluster, threads, steps, stream.cuda_stream if cuda else None)
        if cuda:
            b.record(stream)
            b.synchronize()
        if status != 0:
            raise RuntimeError(f"CUDA error {status}")
        times.append(a.elapsed_time(b) if cuda else (time.perf_counter() - t0) * 1e3)
    return statistics.median(times[1:])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", default="128,256,512")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--clusters", default="8,16", help="cluster sizes (blocks)")
    p.add_argument("--threads", type=int, default=256)
    p.add_argument("--steps", default="64,1088", help="the two step counts S1,S2")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", help="write the measurements here")
    p.add_argument("--self-test-library",
                   help="the self-test only: this emulated probe library on the CPU (its figures mean nothing)")
    args = p.parse_args(argv)
    if args.self_test_library:
        path, device, gpu = args.self_test_library, torch.device("cpu"), "SELF-TEST on the CPU (emulated)"
    else:
        if not torch.cuda.is_available():
            print("cuda_step_floor: no CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
            return 2
        path = probe_library()
        if path is None:
            print("cuda_step_floor: no libseqpack_cuda_probe.so (cmake -S cuda builds it)", file=sys.stderr)
            return 2
        device = torch.device("cuda")
        props = torch.cuda.get_device_properties(device)
        gpu = f"{props.name}, sm_{props.major}{props.minor}, {props.multi_processor_count} SMs"
    f = bind(ctypes.CDLL(path))
    s1, s2 = (int(s) for s in args.steps.split(","))
    print(f"# {gpu}; {path}")
    print(f"# per step = (t({s2} steps) - t({s1} steps)) / {s2 - s1}, medians of {args.repeats} launches; "
          f"{args.threads} threads a block")
    print("| dtype | H | batch | cluster | us per step | max error (bound) |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    rows = []
    for name in args.dtypes.split(","):
        dtype = DTYPES[name]
        for hidden in (int(h) for h in args.hidden.split(",")):
            for batch in (int(b) for b in args.batch.split(",")):
                for cluster in (int(c) for c in args.clusters.split(",")):
                    row = dict(dtype=name, hidden=hidden, batch=batch, cluster=cluster)
                    try:
                        w, xg, h0 = make_case(hidden, batch, s2, dtype, hidden + batch, device)
                        status, y = run_floor(f, w, xg[:16], h0, cluster, args.threads)
                        if device.type == "cuda":
                            torch.cuda.synchronize()
                        if status != 0:
                            raise RuntimeError(f"CUDA error {status}")
                        err, bound = check_floor(w, xg[:16], h0, y)
                        t1 = time_launch(f, w, xg, h0, cluster, args.threads, s1, args.repeats)
                        t2 = time_launch(f, w, xg, h0, cluster, args.threads, s2, args.repeats)
                        row.update(us_per_step=(t2 - t1) * 1e3 / (s2 - s1), error=err, bound=bound)
                        print(f"| {name} | {hidden} | {batch} | {cluster} | {row['us_per_step']:.3f} | "
                              f"{err:.2g} ({bound:.2g}) |", flush=True)
                    except (RuntimeError, AssertionError) as e:
                        row["error_message"] = str(e)
                        row["wrong"] = isinstance(e, AssertionError)
                        print(f"| {name} | {hidden} | {batch} | {cluster} | - | {e} |", flush=True)
                    rows.append(row)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(dict(gpu=gpu, library=path, steps=[s1, s2], threads=args.threads, rows=rows), out,
                      indent=1)
    # Wrong results fail the run; a configuration the GPU refuses is reported only.
    return 1 if any(r.get("wrong") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
