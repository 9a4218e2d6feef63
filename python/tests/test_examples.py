"""Runs each examples/NN_*.py (they assert seqpack's values equal torch's).

In-process with runpy, as `python examples/NAME.py` would run them, to avoid
re-importing torch per script."""
import ast
import glob
import os
import runpy

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The numbered ones; ddp_langid.py needs processes and data (test_ddp.py runs it).
EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "[0-9][0-9]_*.py")))


def test_all_five_examples_present():
    assert len(EXAMPLES) >= 5, EXAMPLES


def _needs_torch(path):
    """An example's NEEDS_TORCH = (major, minor) line, or None."""
    with open(path) as f:
        for line in f:
            if line.startswith("NEEDS_TORCH = "):
                return ast.literal_eval(line.split("=", 1)[1].split("#")[0].strip())
    return None


def _torch_version():
    return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


@pytest.mark.parametrize("path", EXAMPLES, ids=os.path.basename)
def test_example(path, capsys):
    needs = _needs_torch(path)
    if needs is not None and _torch_version() < needs:
        pytest.skip(f"{os.path.basename(path)} needs PyTorch {needs[0]}.{needs[1]}+; this is "
                    f"{torch.__version__}")
    runpy.run_path(path, run_name="__main__")
    assert "seqpack == torch" in capsys.readouterr().out
