"""Runs each examples/*.py (they assert seqpack's values equal torch's)."""
import glob
import os
import subprocess
import sys

import pytest

import seqpack

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.py")))


def test_all_five_examples_present():
    assert len(EXAMPLES) >= 5, EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=os.path.basename)
def test_example(path):
    env = dict(os.environ)
    # The package this test imported, whichever way it was found.
    package_root = os.path.dirname(os.path.dirname(seqpack.__file__))
    env["PYTHONPATH"] = package_root + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    r = subprocess.run([sys.executable, path], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, f"{path} failed:\n{r.stdout}\n{r.stderr}"
    assert "seqpack == torch" in r.stdout
