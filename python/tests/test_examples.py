"""Runs each examples/NN_*.py (they assert seqpack's values equal torch's).

In-process with runpy, as `python examples/NAME.py` would run them, to avoid
re-importing torch per script."""
import glob
import os
import runpy

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The numbered ones; ddp_langid.py needs processes and data (test_ddp.py runs it).
EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "[0-9][0-9]_*.py")))


def test_all_five_examples_present():
    assert len(EXAMPLES) >= 5, EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=os.path.basename)
def test_example(path, capsys):
    runpy.run_path(path, run_name="__main__")
    assert "seqpack == torch" in capsys.readouterr().out
