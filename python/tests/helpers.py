"""Shared helpers of the Python tests: seeds and closeness checks that name
the first mismatching index and both values."""
import os

import numpy as np


def base_seed(default=1234):
    """SEQPACK_TEST_SEED replays a failing random test (the seed is in its id/message)."""
    return int(os.environ.get("SEQPACK_TEST_SEED", default))


def assert_close(actual, expected, rtol, atol, what=""):
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    bad = ~(np.abs(actual - expected) <= atol + rtol * np.abs(expected))
    if bad.any():
        i = np.unravel_index(np.argmax(bad), bad.shape)
        raise AssertionError(f"{what}: {bad.sum()} of {bad.size} elements differ; first at "
                             f"{tuple(int(k) for k in i)}: {actual[i]!r} vs expected "
                             f"{expected[i]!r} (rtol={rtol}, atol={atol})")


def torch_twin(m):
    """torch.nn's module with the configuration and weights of `m` (a
    seqpack.torch layer, or any torch.nn RNN module)."""
    import torch
    cls = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU}.get(m.mode, torch.nn.RNN)
    kwargs = dict(num_layers=m.num_layers, bidirectional=m.bidirectional, bias=m.bias,
                  batch_first=m.batch_first, dtype=m.weight_ih_l0.dtype)
    if m.mode == "LSTM":
        kwargs["proj_size"] = m.proj_size
    if m.mode.startswith("RNN"):
        kwargs["nonlinearity"] = m.nonlinearity
    t = cls(m.input_size, m.hidden_size, **kwargs)
    t.load_state_dict(m.state_dict())
    return t


_EMULATED_BUILDS = {}  # sources -> the library built from them in this process


# The sources of libseqpack_cuda (cuda/CMakeLists.txt's): every .cu file of
# cuda/src/, relative to the repository's root.
CUDA_LIBRARY = tuple(sorted(os.path.join("cuda", "src", f)
                            for f in os.listdir(os.path.join(os.path.dirname(os.path.dirname(
                                os.path.dirname(os.path.abspath(__file__)))), "cuda", "src"))
                            if f.endswith(".cu")))


def build_emulated_cuda(source, out):
    """Compiles CUDA sources of cuda/ (a path, or a sequence of them such as
    CUDA_LIBRARY, relative to the repository's root) with g++ against the CPU
    emulation (cuda/emulate/) into the shared library `out`; skips the calling
    test where the CUDA emulation is switched off (SEQPACK_TEST_CUDA=0,
    scripts/test.sh) or no g++ is there. Sources compiled before in this
    process are copied from that build instead (the library, CUDA_LIBRARY,
    takes 15 s or more, and three test modules need it). Returns str(out)."""
    import shutil
    import subprocess
    import pytest
    if os.environ.get("SEQPACK_TEST_CUDA") == "0":
        pytest.skip("SEQPACK_TEST_CUDA=0: the CUDA kernels' CPU emulation is not run (scripts/test.sh)")
    sources = (source,) if isinstance(source, str) else tuple(source)
    built = _EMULATED_BUILDS.get(sources)
    if built is not None and os.path.isfile(built):
        shutil.copyfile(built, str(out))
        return str(out)
    cxx = next((shutil.which(c) for c in ("g++-12", "g++", "g++-14", "g++-13") if shutil.which(c)), None)
    if cxx is None:
        pytest.skip("no g++ to build the emulated CUDA code")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([cxx, "-std=c++20", "-O1", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror",
                    "-Wno-unknown-pragmas", "-x", "c++"] + [os.path.join(root, f) for f in sources] +
                   ["-DSEQPACK_CUDA_EMULATE", "-I", os.path.join(root, "cuda", "emulate"),
                    "-I", os.path.join(root, "include"), "-o", str(out), "-pthread"], check=True)
    _EMULATED_BUILDS[sources] = str(out)
    return str(out)
    cxx = next((shutil.which(c) for c in ("g++-12", "g++", "g++-14", "g++-13") if shutil.which(c)), None)
    if cxx is None:
        pytest.skip("no g++ to build the emulated CUDA code")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([cxx, "-std=c++20", "-O1", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror",
                    "-Wno-unknown-pragmas", "-x", "c++", os.path.join(root, source), "-DSEQPACK_CUDA_EMULATE",
                    "-I", os.path.join(root, "cuda", "emulate"), "-I", os.path.join(root, "include"),
                    "-o", str(out), "-pthread"], check=True)
    _EMULATED_BUILDS[source] = str(out)
    return str(out)
