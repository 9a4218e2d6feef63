"""Makes the suite test the seqpack it is meant to test, and fail otherwise.

By default that is this tree's build: <root>/<SEQPACK_BUILD_DIR or build>/python/seqpack,
whose pure-Python files are symlinks to <root>/python/seqpack. It is put first
on sys.path, so a seqpack.pth naming another build (scripts/setup.sh writes
one into Debian's site-packages) cannot shadow it; if the import still finds
another copy (this tree not built), the suite stops with both locations.

SEQPACK_EXPECTED_PACKAGE=/path/to/seqpack names another expected package
directory instead (the wheel installed into a virtual environment): nothing
is added to sys.path, and the seqpack imported must be that one.

Subprocesses started by the tests inherit a PYTHONPATH that finds the same
package (see helpers.subprocess_env).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _expected_package():
    named = os.environ.get("SEQPACK_EXPECTED_PACKAGE")
    if named:
        return os.path.abspath(named), False
    build = os.environ.get("SEQPACK_BUILD_DIR", "build")
    return os.path.join(ROOT, build, "python", "seqpack"), True


def _import_and_check():
    expected, in_tree = _expected_package()
    if in_tree:
        sys.path.insert(0, os.path.dirname(expected))
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [os.path.dirname(expected)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    for name in [m for m in sys.modules if m == "seqpack" or m.startswith("seqpack.")]:
        del sys.modules[name]
    import seqpack
    import seqpack._seqpack

    found = os.path.dirname(os.path.abspath(seqpack.__file__))
    extension = os.path.dirname(os.path.realpath(seqpack._seqpack.__file__))
    problems = []
    if os.path.realpath(found) != os.path.realpath(expected):
        problems.append(f"imported seqpack from {found}")
    if extension != os.path.realpath(expected):
        problems.append(f"imported its extension from {extension}")
    if in_tree:
        source = os.path.dirname(os.path.realpath(seqpack.__file__))
        if source != os.path.join(os.path.realpath(ROOT), "python", "seqpack"):
            problems.append(f"imported its Python sources from {source}")
    if problems:
        hint = (f"Build this tree (cmake --build {os.path.dirname(os.path.dirname(expected))}), "
                f"or set SEQPACK_EXPECTED_PACKAGE to the package directory meant to be tested."
                if in_tree else "Check SEQPACK_EXPECTED_PACKAGE.")
        raise RuntimeError(f"the seqpack under test is {expected}, but the suite "
                           f"{', '.join(problems)}. {hint}")


_import_and_check()


try:
    import pytest
    import torch
except ImportError:  # the suite's torch-free parts
    torch = None

if torch is not None:
    @pytest.fixture(autouse=True)
    def _torch_without_onednn():
        """torch's own modules, the suite's reference, run without oneDNN
        (torch.backends.mkldnn). Symptom on Debian 13 (PyTorch 2.6 with oneDNN
        3.7): torch.nn.LSTM on padded float32 input (batch 1 with h0, and a
        2-layer LSTM at batch 1 and 3 without) differs from a float64 LSTM
        written out by hand by up to 0.2, against 3e-8 with oneDNN off; 1.13
        (Debian 12) agrees either way. seqpack never calls oneDNN through torch,
        so this changes only torch's side of the comparisons."""
        with torch.backends.mkldnn.flags(enabled=False):
            yield
