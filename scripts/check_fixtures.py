#!/usr/bin/env python3
"""Regenerates every PyTorch fixture into a temporary directory and compares it
with the committed one, so the fixtures cannot drift from PyTorch.

Each generator tests/fixtures/gen_<name>.py takes --out DIR and writes JSON files
there (and possibly binary *.safetensors files, compared byte for byte). Integers and strings must match exactly; floats (and strings that spell
floats) within 1e-6 (mixed relative/absolute), since BLAS summation order may
differ between CPUs and PyTorch versions. The key naming the PyTorch version
that generated a fixture is reported, not compared: the committed fixtures come
from 1.13 and are checked against 2.6 on Debian 13 too.
Run with Debian's /usr/bin/python3 (it has python3-torch).
"""
import glob
import json
import math
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
TOL = 1e-6


# Top-level keys that record which PyTorch generated a fixture: the fixtures
# are committed from PyTorch 1.13 (Debian 12) and checked against 2.6 too
# (Debian 13), where only these differ by design.
VERSION_KEYS = {"torch", "torch_version"}


def _float_text(x):
    """The float a decimal string spells (fixtures keep some float64 values as
    strings, exactly as torch printed them), or None."""
    try:
        return float(x) if isinstance(x, str) else None
    except ValueError:
        return None


def compare(a, b, path, errors):
    if len(errors) > 20:
        return
    fa, fb = _float_text(a), _float_text(b)
    if fa is not None and fb is not None and a != b:
        # Two spellings of float64 values that one PyTorch version draws or
        # rounds 1 ulp apart (2.6 and 1.13 on tensor_repr's random values).
        if not math.isclose(fa, fb, rel_tol=TOL, abs_tol=TOL):
            errors.append(f"{path}: {a!r} != {b!r}")
    elif isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or a is None:
        if a != b:
            errors.append(f"{path}: {a!r} != {b!r}")
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, int) and isinstance(b, int):
            if a != b:
                errors.append(f"{path}: {a} != {b}")
        elif not (math.isclose(a, b, rel_tol=TOL, abs_tol=TOL) or (math.isnan(a) and math.isnan(b))):
            errors.append(f"{path}: {a!r} != {b!r}")
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            errors.append(f"{path}: length {len(a)} != {len(b)}")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            compare(x, y, f"{path}[{i}]", errors)
    elif isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            errors.append(f"{path}: keys {sorted(set(a) ^ set(b))} differ")
            return
        for k in a:
            compare(a[k], b[k], f"{path}.{k}", errors)
    else:
        errors.append(f"{path}: type {type(a).__name__} != {type(b).__name__}")


def main():
    generators = sorted(glob.glob(os.path.join(FIXTURES, "gen_*.py")))
    if not generators:
        print("check_fixtures: no fixture generators yet")
        return 0
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for gen in generators:
            subprocess.run([sys.executable, gen, "--out", tmp], check=True)
        fresh = sorted(os.path.basename(p) for p in glob.glob(os.path.join(tmp, "*.json")))
        committed = sorted(os.path.basename(p) for p in glob.glob(os.path.join(FIXTURES, "*.json")))
        for name in sorted(set(fresh) | set(committed)):
            if name not in committed:
                print(f"check_fixtures: {name} is generated but not committed")
                failed = True
                continue
            if name not in fresh:
                print(f"check_fixtures: {name} is committed but no generator writes it")
                failed = True
                continue
            with open(os.path.join(tmp, name)) as f:
                a = json.load(f)
            with open(os.path.join(FIXTURES, name)) as f:
                b = json.load(f)
            errors = []
            if isinstance(a, dict) and isinstance(b, dict):
                for key in VERSION_KEYS & set(a) & set(b):
                    if a[key] != b[key]:
                        print(f"check_fixtures: {name} was committed from PyTorch {b[key]}, "
                              f"compared with {a[key]}")
                    a[key] = b[key]
            compare(a, b, name, errors)
            if errors:
                failed = True
                print(f"check_fixtures: {name} differs from a fresh PyTorch run:")
                for e in errors[:20]:
                    print("  " + e)
            else:
                print(f"check_fixtures: {name} matches PyTorch {_torch_version()}")
        # Binary fixtures (safetensors) are written byte-deterministically: compare bytes.
        fresh_bin = sorted(os.path.basename(p) for p in glob.glob(os.path.join(tmp, "*.safetensors")))
        committed_bin = sorted(os.path.basename(p)
                               for p in glob.glob(os.path.join(FIXTURES, "*.safetensors")))
        for name in sorted(set(fresh_bin) | set(committed_bin)):
            if name not in committed_bin or name not in fresh_bin:
                print(f"check_fixtures: {name} is "
                      + ("generated but not committed" if name not in committed_bin
                         else "committed but no generator writes it"))
                failed = True
                continue
            with open(os.path.join(tmp, name), "rb") as f:
                a = f.read()
            with open(os.path.join(FIXTURES, name), "rb") as f:
                b = f.read()
            if a != b:
                failed = True
                print(f"check_fixtures: {name} differs byte-wise from a fresh generation")
            else:
                print(f"check_fixtures: {name} matches byte for byte")
    return 1 if failed else 0


def _torch_version():
    try:
        import torch
        return torch.__version__
    except ImportError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
