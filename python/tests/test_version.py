"""seqpack.__version__ is the compiled library's version, CMake's
project(seqpack VERSION x.y.z) read here from CMakeLists.txt, and the wheel's
metadata (python/build_backend.py) says the same."""
import os
import re
import sys

import seqpack

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cmake_project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        m = re.search(r"project\(\s*seqpack\s+VERSION\s+(\d+\.\d+\.\d+)", f.read())
    assert m, "no project(seqpack VERSION ...) in CMakeLists.txt"
    return m.group(1)


def test_version_is_the_cmake_project_version():
    assert seqpack.__version__ == cmake_project_version()
    assert seqpack._seqpack.__version__ == seqpack.__version__


def test_wheel_metadata_version(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "python"))
    try:
        import build_backend
    finally:
        sys.path.pop(0)
    dist_info = build_backend.prepare_metadata_for_build_wheel(str(tmp_path))
    with open(tmp_path / dist_info / "METADATA") as f:
        fields = dict(line.split(": ", 1) for line in f.read().split("\n\n")[0].splitlines())
    assert fields["Name"] == "seqpack"
    assert fields["Version"] == cmake_project_version()
    assert dist_info == f"seqpack-{cmake_project_version()}.dist-info"


def test_installed_distribution_version():
    """Under scripts/test_wheel.sh (SEQPACK_EXPECTED_PACKAGE): the installed
    wheel's metadata names the version of the module it installed."""
    if not os.environ.get("SEQPACK_EXPECTED_PACKAGE"):
        import pytest
        pytest.skip("seqpack is imported from a build tree, not an installed wheel "
                    "(scripts/test_wheel.sh runs this)")
    from importlib import metadata
    assert metadata.version("seqpack") == seqpack.__version__
