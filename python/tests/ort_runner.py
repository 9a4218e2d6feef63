"""ONNX Runtime for the tests: tools/ort/run_ort.js (onnxruntime-node, installed
by scripts/setup.sh) runs many models in one Node process."""
import json
import os
import subprocess
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNNER = os.path.join(ROOT, "tools", "ort", "run_ort.js")

_TYPES = {np.dtype(np.float32): "float32", np.dtype(np.float64): "float64",
          np.dtype(np.int64): "int64", np.dtype(np.int32): "int32"}


def feed(array):
    a = np.ascontiguousarray(array)
    return {"type": _TYPES[a.dtype], "dims": list(a.shape), "data": a.ravel().tolist()}


def run(runs, threads=1):
    """runs: [{"model": path, "inputs": {name: array}, "repeat": n?}] ->
    [{"outputs": {name: np.ndarray}, "seconds": [...]} or {"error": message}]."""
    request = {"threads": threads,
               "runs": [dict(r, inputs={k: feed(v) for k, v in r["inputs"].items()}) for r in runs]}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(request, f)
    try:
        proc = subprocess.run(["node", RUNNER, f.name], capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    assert proc.returncode == 0, f"ONNX Runtime runner failed: {proc.stderr}"
    results = json.loads(proc.stdout)["results"]
    for r in results:
        for name, t in r.get("outputs", {}).items():
            r["outputs"][name] = np.array(t["data"], dtype=t["type"]).reshape(t["dims"])
    return results
