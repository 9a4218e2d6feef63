"""seqpack's CUDA kernels on the CPU, for the tests: the operators' C++ CUDA
kernels (seqpack_torch/cuda_ops.cpp) registered for CPU tensors as
torch.ops.seqpack_cuda_emulated (libseqpack_torch_cuda_emulated.so, built with
the tests: cuda_emulated_ops.cpp) over libseqpack_cuda.so compiled for the CPU
(cuda/emulate/), and ctypes declarations of the library's C interface
(include/seqpack/cuda.h) for the tests of the library itself.

One library per process (the kernels load one): emulated() builds and loads it
once, and every test module takes it from there."""
import contextlib
import ctypes
import os
import pathlib

import pytest
import torch

from helpers import CUDA_LIBRARY, build_emulated_cuda

TEST_LIBRARY = "libseqpack_torch_cuda_emulated.so"
ABI_VERSION = 4
MODES = {"LSTM": 0, "GRU": 1, "RNN_TANH": 2, "RNN_RELU": 3}
GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

_i, _i64, _p, _size = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t
_pi64, _pp, _psize = ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_size)


class RnnArgs(ctypes.Structure):
    """seqpack_cuda_rnn_args, field for field (test_cuda_glue.py checks the two)."""
    _fields_ = [
        ("mode", _i), ("dtype", _i), ("bidirectional", _i), ("has_biases", _i), ("allow_tf32", _i),
        ("caller_products", _i),
        ("rows", _i64), ("steps", _i64), ("batch_sizes", _pi64), ("batch", _i64), ("input_size", _i64),
        ("hidden_size", _i64), ("proj_size", _i64), ("num_layers", _i64),
        ("weights", _pp), ("x", _p), ("h0", _p), ("c0", _p), ("dropout_mask", _p),
        ("workspace", _p), ("workspace_bytes", _size), ("reserve", _p), ("reserve_bytes", _size),
        ("stream", _p),
        ("y", _p), ("hn", _p), ("cn", _p),
        ("dy", _p), ("dhn", _p), ("dcn", _p), ("dx", _p), ("dh0", _p), ("dc0", _p), ("dweights", _pp),
        ("input_gates", _p * 2), ("dgates_x", _p * 2), ("dgates_h", _p * 2), ("hprev", _p * 2), ("dh", _p * 2),
        ("m", _p * 2),
    ]


class Policy(ctypes.Structure):
    """seqpack_cuda_policy, field for field (test_cuda_glue.py checks the two)."""
    _fields_ = [("version", _i), ("kernel", _i), ("gemm", _i), ("gemm_tile", _i), ("cluster_size", _i),
                ("cluster_gather", _i), ("cluster_mma", _i), ("tf32", _i)]

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name, _ in self._fields_}

    @classmethod
    def of(cls, fields) -> "Policy":
        """The record of a list of fields in the header's order (the operators' int[])."""
        return cls(*fields)


POLICY_VERSION = 1
KERNELS = {"simple": 0, "persistent": 1, "cluster": 2}
GEMMS = {"simt": 0, "wmma": 1}
GATHERS = {"shared": 0, "global": 1}

# (restype, argtypes) of each function of seqpack/cuda.h, in its order.
SIGNATURES = {
    "seqpack_cuda_abi_version": (_i, []),
    "seqpack_cuda_last_error": (ctypes.c_char_p, []),
    "seqpack_cuda_set_policy": (_i, [ctypes.POINTER(Policy)]),
    "seqpack_cuda_get_policy": (_i, [ctypes.POINTER(Policy)]),
    "seqpack_cuda_rnn_buffer_sizes": (_i, [_i, _i, _i64, _i64, _i64, _i64, _i64, _i64, _i, _psize, _psize]),
    "seqpack_cuda_rnn_forward": (_i, [ctypes.POINTER(RnnArgs)]),
    "seqpack_cuda_rnn_backward": (_i, [ctypes.POINTER(RnnArgs)]),
}


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    for name, (restype, argtypes) in SIGNATURES.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = restype, argtypes
    return lib


@contextlib.contextmanager
def _settings(torch_products: bool, allow_tf32: bool):
    """SEQPACK_CUDA_PRODUCTS (read at every call) and torch's TF32 setting for a call."""
    old_products = os.environ.get("SEQPACK_CUDA_PRODUCTS")
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    os.environ["SEQPACK_CUDA_PRODUCTS"] = "torch" if torch_products else "library"
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
        if old_products is None:
            del os.environ["SEQPACK_CUDA_PRODUCTS"]
        else:
            os.environ["SEQPACK_CUDA_PRODUCTS"] = old_products


class Emulated:
    """The emulated operators (`ops`) and the library they run (`lib`, through ctypes)."""

    def __init__(self, ops, path: str):
        self.ops, self.path = ops, path
        self.lib = bind(ctypes.CDLL(path))  # the very library the kernels loaded (dlopen: one copy)

    def run(self, mode, data, batch_sizes, h0, c0, weights, bias=True, layers=1, bidirectional=False, proj=0,
            allow_tf32=False, torch_products=True, dropout=0.0, train=False, seed=None, sorted_indices=None,
            unsorted_indices=None):
        """seqpack_cuda_emulated::rnn on packed rows, every product in torch (the
        default) or in the library: (y, h_n, c_n or None)."""
        hidden = weights[1].shape[0] // GATES[mode]
        with _settings(torch_products, allow_tf32):
            y, hn, cn = self.ops.rnn(data, batch_sizes, sorted_indices, unsorted_indices, h0, c0, list(weights),
                                     mode, hidden, layers, bias, bidirectional, proj, dropout, train, seed, "fp32")
        return y, hn, (cn if mode == "LSTM" else None)

    @staticmethod
    def mask(data, layers, width, p, seed):
        """The dropout mask the kernels draw with `seed`: (layers - 1, rows, width)."""
        g = torch.Generator().manual_seed(seed)
        keep = torch.empty((layers - 1, data.shape[0], width), dtype=torch.float32).bernoulli_(1.0 - p, generator=g)
        return (keep / (1.0 - p)).to(data.dtype)

    def check(self, status: int) -> None:
        if status != 0:
            raise RuntimeError(self.lib.seqpack_cuda_last_error().decode())

    def install_policy(self) -> dict:
        """The SEQPACK_CUDA_* variables' policy installed (the C++ front end's)."""
        return Policy.of(torch.ops.seqpack._cuda_install_policy()).as_dict()

    def set_policy(self, **fields) -> None:
        """The policy of the unset variables with `fields` changed, installed through the C interface."""
        p = Policy.of(torch.ops.seqpack_cuda_emulated._cuda_policy_from_environment())
        for name, value in fields.items():
            setattr(p, name, value)
        self.check(self.lib.seqpack_cuda_set_policy(ctypes.byref(p)))

    def installed_policy(self) -> dict:
        p = Policy()
        self.check(self.lib.seqpack_cuda_get_policy(ctypes.byref(p)))
        return p.as_dict()

    def buffer_sizes(self, mode, dtype, rows, batch, input_size, hidden, proj, layers, bidirectional):
        ws, rs = ctypes.c_size_t(0), ctypes.c_size_t(0)
        self.check(self.lib.seqpack_cuda_rnn_buffer_sizes(MODES[mode], DTYPES[dtype], rows, batch, input_size,
                                                          hidden, proj, layers, int(bidirectional),
                                                          ctypes.byref(ws), ctypes.byref(rs)))
        return ws.value, rs.value

    def grid_launches(self):
        """The one-launch kernel launches since the last call: [(grid blocks,
        cluster blocks or 0 for a cooperative grid)]."""
        blocks = (ctypes.c_uint * 64)()
        n = self.lib.seqpack_cuda_emulated_grid_launches(blocks, 32)
        return [(blocks[2 * i], blocks[2 * i + 1]) for i in range(min(n, 32))] + [None] * max(n - 32, 0)


_LOADED: dict = {}


def emulated(tmp_path_factory) -> Emulated:
    """The emulated operators over the emulated library, built and loaded once
    per process; seqpack's kernels run every call (SEQPACK_CUDA_LAYERS=seqpack:
    the tests of the choice set it back)."""
    if "emulated" not in _LOADED:
        import seqpack.torch  # noqa: F401  (loads libseqpack_torch: the kernels' own library)
        build = (pathlib.Path(seqpack.torch.__file__).parent / "libseqpack_torch.so").resolve().parents[2]
        lib = build / "tests" / TEST_LIBRARY
        if not lib.is_file():
            pytest.skip(f"{lib} is not built (a CMake build with SEQPACK_BUILD_TESTS and SEQPACK_BUILD_TORCH)")
        cuda = build_emulated_cuda(CUDA_LIBRARY, tmp_path_factory.mktemp("emulated") / "libseqpack_cuda.so")
        if not hasattr(torch.ops.seqpack_cuda_emulated, "rnn"):
            torch.ops.load_library(str(lib))
        assert torch.ops.seqpack_cuda_emulated._cuda_library(cuda) == cuda
        _LOADED["emulated"] = Emulated(torch.ops.seqpack_cuda_emulated, cuda)
    torch.ops.seqpack._cuda_layers("seqpack")
    return _LOADED["emulated"]
