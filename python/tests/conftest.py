"""Makes the in-tree build importable when PYTHONPATH does not point at it
(scripts/test.sh sets PYTHONPATH; the .pth install of scripts/setup.sh works too)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    import seqpack._seqpack  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(ROOT, os.environ.get("SEQPACK_BUILD_DIR", "build"), "python"))
    for name in [m for m in sys.modules if m == "seqpack" or m.startswith("seqpack.")]:
        del sys.modules[name]
