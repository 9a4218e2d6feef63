"""seqpack's Python modules import downward only (STYLE.md): seqpack.torch
re-exports the implementation modules (torch_streaming, torch_data,
torch_classifier, torch_quantize, torch_onnx) and the private modules below
them (_torch_ops, _torch_layers), and none of those imports it back, so each
one imports alone instead of failing on a half-initialised circle.

Two checks: every module of the package is read with ast (no import of
seqpack.torch but in torch.py itself), and each implementation module is
imported in one fresh interpreter, which must not have seqpack.torch loaded
afterwards.
"""
import ast
import os
import subprocess
import sys

import pytest

import seqpack

IMPLEMENTATION = ["_torch_ops", "_torch_layers", "torch_streaming", "torch_data",
                  "torch_classifier", "torch_quantize", "torch_onnx"]


def _sources():
    """The package's .py files, read where the build's symlinks point."""
    package = os.path.dirname(os.path.realpath(os.path.join(os.path.dirname(seqpack.__file__),
                                                            "torch.py")))
    return sorted(os.path.join(package, n) for n in os.listdir(package) if n.endswith(".py"))


def _imports_seqpack_torch(tree):
    """(line, statement) of every import of seqpack.torch in `tree`, at any depth
    (a lazy import inside a function closes the circle as well)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "seqpack.torch" or alias.name.startswith("seqpack.torch."):
                    found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom):
            absolute = node.level == 0 and node.module is not None and (
                node.module == "seqpack.torch" or node.module.startswith("seqpack.torch.")
                or (node.module == "seqpack" and any(a.name == "torch" for a in node.names)))
            relative = node.level == 1 and (
                node.module == "torch" or (node.module is None
                                           and any(a.name == "torch" for a in node.names)))
            if absolute or relative:
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_module_imports_seqpack_torch():
    sources = _sources()
    names = {os.path.basename(p) for p in sources}
    assert {"torch.py", "torch_quantize.py", "torch_classifier.py"} <= names, sorted(names)
    offenders = []
    for path in sources:
        if os.path.basename(path) == "torch.py":
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        offenders += [f"{os.path.basename(path)}:{line}: {text}"
                      for line, text in _imports_seqpack_torch(tree)]
    assert not offenders, ("seqpack.torch re-exports these modules and must stay above them "
                           "(STYLE.md: import downward only):\n" + "\n".join(offenders))


def test_the_checker_sees_each_form():
    # The forms the circle took before (torch_quantize, torch_classifier), and others.
    for line in ["from . import torch as _st", "from .torch import LSTM",
                 "import seqpack.torch as st", "from seqpack.torch import LSTM",
                 "from seqpack import torch", "from . import data, torch",
                 "def f():\n    from .torch import pack_padded_sequence"]:
        assert _imports_seqpack_torch(ast.parse(line)), line
    for line in ["import torch", "from torch import Tensor", "from . import _torch_layers",
                 "from .torch_quantize import _Int8Layer", "from ._torch_ops import _traced"]:
        assert not _imports_seqpack_torch(ast.parse(line)), line


def test_implementation_modules_import_alone():
    # One interpreter for all: a module that imported seqpack.torch would leave
    # it in sys.modules right after its own import, which names it.
    pytest.importorskip("torch")
    code = ("import importlib, sys\n"
            f"for name in {IMPLEMENTATION!r}:\n"
            "    importlib.import_module('seqpack.' + name)\n"
            "    if 'seqpack.torch' in sys.modules:\n"
            "        sys.exit('importing seqpack.' + name + ' imported seqpack.torch')\n"
            "import seqpack.torch as st\n"
            "import seqpack._torch_layers as layers, seqpack.torch_quantize as q\n"
            "assert st.LSTM is layers.LSTM and issubclass(q.QuantizedLSTM, st.LSTM)\n"
            "assert st.QuantizedGRU is q.QuantizedGRU\n")
    # PYTHONPATH (conftest.py) finds the seqpack under test.
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
