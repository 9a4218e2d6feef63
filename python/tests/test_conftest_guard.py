"""The suite refuses to run against a seqpack other than the one under test
(conftest.py): a decoy package first on PYTHONPATH, with this tree's build
missing or another package named as expected, stops pytest with both
locations in the message."""
import os
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def decoy(tmp_path):
    package = tmp_path / "seqpack"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "_seqpack.py").write_text("")
    return package


def run_pytest(tmp_path, env_changes):
    env = {k: v for k, v in os.environ.items()
           if k not in ("SEQPACK_EXPECTED_PACKAGE", "SEQPACK_BUILD_DIR")}
    env.update(env_changes)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           os.path.join(TESTS, "test_packing.py")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)


def test_decoy_on_pythonpath_without_this_trees_build_fails(tmp_path, decoy):
    result = run_pytest(tmp_path, {"PYTHONPATH": str(decoy.parent),
                                   "SEQPACK_BUILD_DIR": "no-such-build"})
    assert result.returncode != 0
    assert f"imported seqpack from {decoy}" in result.stdout + result.stderr


def test_expected_package_elsewhere_fails(tmp_path, decoy):
    result = run_pytest(tmp_path, {"PYTHONPATH": str(decoy.parent),
                                   "SEQPACK_EXPECTED_PACKAGE": str(tmp_path / "other" / "seqpack")})
    assert result.returncode != 0
    assert "the seqpack under test is " + str(tmp_path / "other" / "seqpack") in \
        result.stdout + result.stderr


def test_expected_package_found_runs(tmp_path, decoy):
    # The decoy named as expected is accepted by the guard (the tests then fail
    # on its empty contents, which shows they ran against it).
    result = run_pytest(tmp_path, {"PYTHONPATH": str(decoy.parent),
                                   "SEQPACK_EXPECTED_PACKAGE": str(decoy)})
    assert "the seqpack under test" not in result.stdout + result.stderr
    assert result.returncode != 0
