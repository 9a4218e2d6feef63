#!/usr/bin/env python3
"""Regenerates every PyTorch fixture into a temporary directory and compares it
with the committed one, so the fixtures cannot drift from PyTorch.

Each generator tests/fixtures/gen_<name>.py takes --out DIR and writes JSON files
there (and possibly binary *.safetensors files, compared byte for byte).
Integers and strings must match exactly. Floats (and strings that spell floats)
are compared tensor by tensor with the bound of python/tests/tolerance.py,
2 * u(dtype) * n * max|tensor|: the fixtures are committed from one CPU and
checked on others (and PyTorch versions), whose summation orders differ
(docs/testing.md). n is the length of the longest chain of roundings behind a
case's values: for a recurrent layer rnn_reduction_length of its options and
lengths; for any other case the number of floats in it, which bounds every sum
over its inputs. The key naming the PyTorch version that generated a fixture is
reported, not compared: the committed fixtures come from 1.13 and are checked
against 2.6 on Debian 13 too.
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
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))
from tolerance import UNIT_ROUNDOFF, fp_bound, rnn_reduction_length  # noqa: E402


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


def _floats(x):
    """Every float of a JSON value (float-spelling strings included)."""
    if isinstance(x, bool) or x is None:
        return
    if isinstance(x, float):
        yield x
    elif isinstance(x, str):
        f = _float_text(x)
        if f is not None:
            yield f
    elif isinstance(x, list):
        for y in x:
            yield from _floats(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _floats(y)


def _case_rule(case):
    """(dtype, n) for the values of one fixture case (a dict)."""
    options = case.get("options") if isinstance(case.get("options"), dict) else case
    dtype = str(options.get("dtype", case.get("dtype", "float32")))
    if dtype not in UNIT_ROUNDOFF or dtype == "float64":
        # Integer cases hold no floats but their inputs. The float64 cases'
        # random inputs are float32 draws of torch's random kernels (modules are
        # made in float32, then converted), whose rounding depends on
        # ATEN_CPU_CAPABILITY: across code paths they agree to float32's roundoff.
        dtype = "float32"
    if "hidden_size" in options and "input_size" in options:
        lengths = case.get("lengths")
        steps = sum(lengths) if isinstance(lengths, list) else 0
        if not steps:  # a cell: one step over a batch
            inp = case.get("input")
            steps = len(inp) if isinstance(inp, list) else 1
        return dtype, rnn_reduction_length(
            int(options["input_size"]), int(options["hidden_size"]),
            int(options.get("num_layers", 1)), str(options.get("bidirectional")) == "True",
            steps, int(options.get("proj_size", 0) or 0))
    return dtype, sum(1 for _ in _floats(case))


def _file_rule(name, fixture):
    """(dtype, n) for a fixture's top-level values; cases inside it (dicts with a
    "name") get their own rule."""
    if name == "model_torch_expected.json":
        # Logits of the classifier in model_torch_config.json: an embedding
        # lookup, a one-layer LSTM over the longest word, the output layer.
        with open(os.path.join(FIXTURES, "model_torch_config.json")) as f:
            config = json.load(f)
        longest = max(len(ids) for ids in fixture["ids"])
        return "float32", (rnn_reduction_length(config["embed_dim"], config["hidden_size"],
                                                steps=longest) + config["hidden_size"])
    return _case_rule(fixture) if isinstance(fixture, dict) else ("float32", 1)


def _is_tensor(x):
    """A number or a (nested) list of numbers: compared with one scale."""
    if isinstance(x, bool) or x is None:
        return False
    if isinstance(x, (int, float)) or (isinstance(x, str) and _float_text(x) is not None):
        return True
    return isinstance(x, list) and len(x) > 0 and all(_is_tensor(y) for y in x)


# The largest |difference| / bound of the file being compared (reported).
_worst = [0.0]


def _note(diff, bound):
    if diff > 0:
        _worst[0] = max(_worst[0], diff / bound if bound else math.inf)


def compare(a, b, path, errors, rule=("float32", 1), bound=None):
    if len(errors) > 20:
        return
    if bound is None and _is_tensor(b) and any(True for _ in _floats(b)):
        finite = [abs(v) for v in _floats(b) if math.isfinite(v)]
        bound = fp_bound(max(finite, default=0.0), rule[1], rule[0])
    fa, fb = _float_text(a), _float_text(b)
    if fa is not None and fb is not None and a != b:
        # Two spellings of float64 values that one PyTorch version draws or
        # rounds 1 ulp apart (2.6 and 1.13 on tensor_repr's random values).
        _note(abs(fa - fb), bound)
        if not abs(fa - fb) <= (bound or 0.0):
            errors.append(f"{path}: {a!r} != {b!r} (bound {bound:.3g})")
    elif isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or a is None:
        if a != b:
            errors.append(f"{path}: {a!r} != {b!r}")
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, int) and isinstance(b, int):
            if a != b:
                errors.append(f"{path}: {a} != {b}")
        elif math.isfinite(a) and math.isfinite(b) and _note(abs(a - b), bound):
            pass
        elif not (abs(a - b) <= (bound or 0.0) or a == b or (math.isnan(a) and math.isnan(b))):
            errors.append(f"{path}: {a!r} != {b!r} (|difference| {abs(a - b):.3g} > bound "
                          f"{bound or 0.0:.3g}: 2 * u({rule[0]}) * n {rule[1]} * max|tensor|)")
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            errors.append(f"{path}: length {len(a)} != {len(b)}")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            compare(x, y, f"{path}[{i}]", errors, rule, bound)
    elif isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            errors.append(f"{path}: keys {sorted(set(a) ^ set(b))} differ")
            return
        if bound is None and ("name" in b or "options" in b):
            rule = _case_rule(b)
        for k in a:
            compare(a[k], b[k], f"{path}.{k}", errors, rule, bound)
    else:
        errors.append(f"{path}: type {type(a).__name__} != {type(b).__name__}")


# Fixtures that hold torch's random draws themselves (repr strings of them,
# files of them written byte for byte) rather than values computed from them:
# under ATEN_CPU_CAPABILITY=default torch's random kernels round differently
# from every vectorised path, so --computed-only (the ISA-capped stage of
# scripts/test.sh) leaves them out; every CPU the project runs on takes a
# vectorised path and checks them.
DRAWS_ONLY = {"tensor_repr.json", "model_torch.safetensors", "safetensors_model.safetensors"}


def main():
    computed_only = "--computed-only" in sys.argv[1:]
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
            if computed_only and name in DRAWS_ONLY:
                print(f"check_fixtures: {name} left out (--computed-only: torch's draws)")
                continue
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
            _worst[0] = 0.0
            if isinstance(a, dict) and isinstance(b, dict):
                for key in VERSION_KEYS & set(a) & set(b):
                    if a[key] != b[key]:
                        print(f"check_fixtures: {name} was committed from PyTorch {b[key]}, "
                              f"compared with {a[key]}")
                    a[key] = b[key]
            compare(a, b, name, errors, _file_rule(name, b))
            if errors:
                failed = True
                print(f"check_fixtures: {name} differs from a fresh PyTorch run:")
                for e in errors[:20]:
                    print("  " + e)
            else:
                print(f"check_fixtures: {name} matches PyTorch {_torch_version()} (largest "
                      f"difference {_worst[0]:.2g} of its bound)")
        # Binary fixtures (safetensors) are written byte-deterministically: compare bytes.
        fresh_bin = sorted(os.path.basename(p) for p in glob.glob(os.path.join(tmp, "*.safetensors")))
        committed_bin = sorted(os.path.basename(p)
                               for p in glob.glob(os.path.join(FIXTURES, "*.safetensors")))
        for name in sorted(set(fresh_bin) | set(committed_bin)):
            if computed_only and name in DRAWS_ONLY:
                print(f"check_fixtures: {name} left out (--computed-only: torch's draws)")
                continue
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
