"""bench/sweep_vs_torch.py runs end to end on the smallest sweep and writes its
three outputs: the markdown table, the JSON of the raw numbers and an SVG heatmap
that is well-formed XML carrying the JSON's ratios. Nothing about speed is
asserted: a timing is never a test assertion (STYLE.md); the benchmark reports it."""
import glob
import json
import math
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "sweep_vs_torch.py")
SVG = "{http://www.w3.org/2000/svg}"


def run_sweep(tmp_path, cell, modes, threads):
    """The smallest sweep of one cell: hidden 8, batch 2, 3 steps, fp32, one round."""
    # --malloc env and --openblas-core env: the script would otherwise start itself
    # again with other settings (seconds of imports, and nothing this test checks).
    cmd = [sys.executable, SCRIPT, "--cells", cell, "--hidden", "8", "--batch", "2",
           "--steps", "3", "--modes", modes, "--threads", threads, "--precisions", "fp32",
           "--rounds", "1", "--min-time", "0.001", "--malloc", "env", "--openblas-core", "env",
           "--out-dir", str(tmp_path)]
    # The environment as conftest left it: its PYTHONPATH finds the seqpack under test.
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, \
        f"{' '.join(cmd)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}"


def test_smallest_sweep_writes_table_json_and_svg(tmp_path):
    run_sweep(tmp_path, "lstm", "infer,train", "1")

    # Named for the CPU kind, the thread count and this torch's version.
    version = ".".join(torch.__version__.split(".")[:2])
    outputs = {ext: glob.glob(os.path.join(str(tmp_path), f"*-1t-torch{version}.{ext}"))
               for ext in ("md", "json", "svg")}
    assert all(len(v) == 1 for v in outputs.values()), f"outputs in {tmp_path}: {outputs}"

    with open(outputs["json"][0]) as f:
        data = json.load(f)
    assert data["threads"] == 1
    results = data["results"]
    assert [(r["cell"], r["hidden"], r["batch"], r["steps"], r["mode"]) for r in results] == \
        [("lstm", 8, 2, 3, "infer"), ("lstm", 8, 2, 3, "train")]
    for r in results:
        assert r["status"] == "measured", r
        assert math.isfinite(r["ratio"]) and r["ratio"] > 0, r
        assert r["torch_config"] in ("packed", "padded") and \
            r["seqpack_config"] in ("packed", "padded"), r

    with open(outputs["md"][0]) as f:
        table = f.read()
    for mode in ("infer", "train"):
        assert f"| LSTM | 8 | 2 | 3 | {mode} |" in table, table

    svg = ET.parse(outputs["svg"][0]).getroot()
    assert svg.tag == f"{SVG}svg"
    titles = [t.text or "" for t in svg.iter(f"{SVG}title")]
    for r in results:
        # Each square's <title> carries its ratio to three decimals.
        assert any(f"{r['mode']} " in t and f"ratio {r['ratio']:.3f}" in t for t in titles), \
            (r["ratio"], titles)


def test_more_threads_time_torch_fp32_with_openblas_at_one_thread_too(tmp_path):
    # At two threads torch's fp32 module is timed with the OpenBLAS its GEMMs call at
    # two threads and again at one ("BLAS 1t"), where this torch calls an OpenBLAS.
    run_sweep(tmp_path, "gru", "infer", "2")
    (path,) = glob.glob(os.path.join(str(tmp_path), "*-2t-torch*.json"))
    with open(path) as f:
        (result,) = json.load(f)["results"]
    with open("/proc/self/maps") as f:  # this process imported the same torch
        openblas = any("openblas" in line for line in f)
    expected = {"packed", "padded"}
    if openblas:
        expected |= {"packed, BLAS 1t", "padded, BLAS 1t"}
    (round_,) = result["rounds"]
    assert set(round_["torch"]) == expected, round_["torch"]
    assert set(round_["seqpack"]) == {"packed", "padded"}, round_["seqpack"]
    assert result["torch_config"] in expected, result
