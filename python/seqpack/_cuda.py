"""seqpack's CUDA packed RNNs: ctypes glue over libseqpack_cuda.so (seqpack/cuda.h).

Imports only torch, ctypes and the standard library, and works when loaded by
file path (importlib.util.spec_from_file_location) without seqpack/__init__.py,
so it runs on a GPU machine where seqpack's CPU extension was never built::

    spec = importlib.util.spec_from_file_location("seqpack_cuda", "python/seqpack/_cuda.py")
    sc = importlib.util.module_from_spec(spec); spec.loader.exec_module(sc)
    if sc.available():
        out, h_n, c_n = sc.rnn_packed("LSTM", packed.data, packed.batch_sizes, (h0, c0),
                                      lstm._flat_weights, True, lstm.num_layers,
                                      lstm.dropout, lstm.training, lstm.bidirectional)

rnn_packed matches torch._VF.lstm/gru/rnn_tanh/rnn_relu's packed overload
(data, batch_sizes, hx, flat_weights, has_biases, num_layers, dropout, train,
bidirectional); h0/c0 may have more rows than batch_sizes[0] (sequences of
length zero: their h_n/c_n are their h0/c0). Gradients flow to data, hx and
every weight. The library is found through SEQPACK_CUDA_LIBRARY, next to this
file, or in build/cuda/ or build-cuda/ of the repository (find_library: the one
place that reads SEQPACK_CUDA_LIBRARY).

Which of the library's kernels run is its policy (seqpack_cuda_policy in
seqpack/cuda.h), which this module builds from the SEQPACK_CUDA_KERNEL,
SEQPACK_CUDA_GEMM, SEQPACK_CUDA_GEMM_TILE, SEQPACK_CUDA_CLUSTER,
SEQPACK_CUDA_CLUSTER_GATHER and SEQPACK_CUDA_CLUSTER_MMA variables
(policy_from_environment) and installs when it loads the library; the library
reads no environment. A program that changes those variables afterwards calls
install_policy() to install them; a bad value is refused by name, by every
call into the library until a good one is installed.

The products that are not recurrent (the input projection of every packed
row, the weight gradients, the bias sums, dX) run as torch matrix products
(cuBLAS), the library running each layer's recurrence (caller_products = 1 in
seqpack/cuda.h); SEQPACK_CUDA_PRODUCTS=library (read at every call) runs them
all in the library instead, in one call for the whole stack.

Dropout between layers (train=True, dropout > 0, num_layers > 1) draws its mask
here with torch's RNG (torch.bernoulli on the data's device), of shape
(num_layers - 1, rows, dirs * H_out) and scaled by 1/(1-p); the library
multiplies the input of each layer above the first by it. The values differ
from cuDNN's mask, the distribution does not.

What the GPU tests should check (python/tests/test_cuda_gpu.py):
  - forward outputs and h_n/c_n against torch._VF on the same module, for LSTM,
    GRU, RNN_TANH, RNN_RELU; 1 and 2 layers; uni/bidirectional; biases on/off;
    LSTM proj_size; batch 1, T = 1, equal lengths, very different lengths;
    hidden not a multiple of 32/64; h0 with extra rows (zero-length sequences).
  - backward: grads of data, h0, c0 and each weight against torch's (float64
    is not supported: compare float32 with torch's float32 at ~1e-4 relative,
    or against a float64 CPU run); gradients reaching only h_n, only output.
  - bf16/fp16: against the float32 result of the same weights, error within a
    few units of the data type's epsilon times sqrt(T) (h is rounded to the
    data type at each step as torch does; gates, c and sums are float32).
  - train=True with dropout: outputs differ from eval, grads are consistent
    (run torch.autograd.gradcheck-style checks with the mask fixed through
    torch.manual_seed before each call).
  - torch.compile(fullgraph=True) of a function calling rnn_packed (custom op,
    torch >= 2.4), and errors: CPU tensors, mixed dtypes, wrong hx shapes.
  - the library's variants (compare each with the default, values and speed;
    SEQPACK_CUDA_PRODUCTS is read at every call, the others are the library's
    policy: install_policy() after changing them): SEQPACK_CUDA_PRODUCTS=library
    (every product in the library; default torch's), SEQPACK_CUDA_KERNEL=cluster
    (thread-block clusters, sm_90; SEQPACK_CUDA_CLUSTER forces their size),
    SEQPACK_CUDA_KERNEL=persistent
    (forward recurrence as one cooperative launch; default simple) and, for
    bf16/fp16, SEQPACK_CUDA_GEMM=wmma (tensor cores; default simt).
    docs/gpu-build.md says when each runs.
"""
import ctypes
import functools
import os
import pathlib
import threading
from typing import List, Optional, Sequence, Tuple

import torch

__all__ = ["available", "library_path", "why_unavailable", "rnn_packed", "policy_from_environment",
           "install_policy"]

LIBRARY_NAME = "libseqpack_cuda.so"
ABI_VERSION = 4

MODES = {"LSTM": 0, "GRU": 1, "RNN_TANH": 2, "RNN_RELU": 3}
_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_ELEMENT_SIZE = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}

_i = ctypes.c_int
_i64 = ctypes.c_int64
_p = ctypes.c_void_p
_pi64 = ctypes.POINTER(ctypes.c_int64)
_pp = ctypes.POINTER(ctypes.c_void_p)
_psize = ctypes.POINTER(ctypes.c_size_t)

_size = ctypes.c_size_t


class RnnArgs(ctypes.Structure):
    """seqpack_cuda_rnn_args (seqpack/cuda.h), field for field; test_cuda_glue.py
    checks the two against each other."""
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


_pargs = ctypes.POINTER(RnnArgs)


class Policy(ctypes.Structure):
    """seqpack_cuda_policy (seqpack/cuda.h), field for field; test_cuda_glue.py
    checks the two against each other."""
    _fields_ = [("version", _i), ("kernel", _i), ("gemm", _i), ("gemm_tile", _i), ("cluster_size", _i),
                ("cluster_gather", _i), ("cluster_mma", _i), ("tf32", _i)]

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name, _ in self._fields_}


_ppolicy = ctypes.POINTER(Policy)
POLICY_VERSION = 1
# The values of the policy's fields by the names their variables take.
KERNELS = {"simple": 0, "persistent": 1, "cluster": 2}
GEMMS = {"simt": 0, "wmma": 1}
GATHERS = {"shared": 0, "global": 1}


def _choice(environ, name: str, choices: dict, default: str) -> int:
    value = environ.get(name, "") or default
    if value not in choices:
        listed = [f"'{c}'" for c in choices]
        raise ValueError(f"{name} = {value!r} is not {', '.join(listed[:-1])} or {listed[-1]}")
    return choices[value]


def policy_from_environment(environ=None) -> Policy:
    """The library's policy that the SEQPACK_CUDA_* variables of `environ`
    (default os.environ) ask for (docs/gpu-build.md), unset or empty ones the
    defaults; a value that means none is a ValueError naming the variable and the
    value. seqpack_torch/cuda_ops.cpp's policy_from_environment reads them alike."""
    import re
    environ = os.environ if environ is None else environ
    p = Policy()
    p.version = POLICY_VERSION
    p.kernel = _choice(environ, "SEQPACK_CUDA_KERNEL", KERNELS, "simple")
    p.gemm = _choice(environ, "SEQPACK_CUDA_GEMM", GEMMS, "simt")
    tile = environ.get("SEQPACK_CUDA_GEMM_TILE", "")
    if tile not in ("", "32", "64"):
        raise ValueError(f"SEQPACK_CUDA_GEMM_TILE = {tile!r} is not 32 or 64")
    p.gemm_tile = int(tile or 0)
    cluster = environ.get("SEQPACK_CUDA_CLUSTER", "")
    # As C's strtol reads a whole string: blanks, a sign, decimal digits.
    if cluster and not (re.fullmatch(r"\s*[+-]?[0-9]+", cluster) and 1 <= int(cluster) <= 16):
        raise ValueError(f"SEQPACK_CUDA_CLUSTER = {cluster!r} is not a block count from 1 to 16")
    p.cluster_size = int(cluster or 0)
    p.cluster_gather = _choice(environ, "SEQPACK_CUDA_CLUSTER_GATHER", GATHERS, "shared")
    mma = environ.get("SEQPACK_CUDA_CLUSTER_MMA", "")
    if mma not in ("", "0", "1"):
        raise ValueError(f"SEQPACK_CUDA_CLUSTER_MMA = {mma!r} is not 0 or 1")
    p.cluster_mma = int(mma or 1)
    p.tf32 = 1  # each call's allow_tf32 (torch's setting) decides
    return p

# (restype, argtypes) of each function of seqpack/cuda.h, in its order;
# python/tests/test_cuda_glue.py checks them against the header.
SIGNATURES = {
    "seqpack_cuda_abi_version": (_i, []),
    "seqpack_cuda_last_error": (ctypes.c_char_p, []),
    "seqpack_cuda_set_policy": (_i, [_ppolicy]),
    "seqpack_cuda_get_policy": (_i, [_ppolicy]),
    "seqpack_cuda_rnn_buffer_sizes": (
        _i, [_i, _i, _i64, _i64, _i64, _i64, _i64, _i64, _i, _psize, _psize]),
    "seqpack_cuda_rnn_forward": (_i, [_pargs]),
    "seqpack_cuda_rnn_backward": (_i, [_pargs]),
}

_lock = threading.Lock()
_state = {"loaded": False, "lib": None, "path": None, "error": "not searched yet", "policy_error": ""}


def named_library() -> str:
    """SEQPACK_CUDA_LIBRARY ("" where unset or empty): a library named by the
    user, the only one find_library tries. The one place this package reads it."""
    return os.environ.get("SEQPACK_CUDA_LIBRARY") or ""


def _candidates(named: str) -> List[pathlib.Path]:
    """Where the library is looked for, in order."""
    out: List[pathlib.Path] = []
    if named:
        out.append(pathlib.Path(named))
    here = pathlib.Path(__file__).resolve().parent
    out.append(here / LIBRARY_NAME)
    # python/seqpack/ in the repository, or build/python/seqpack/ in a build.
    for root in list(here.parents)[:4]:
        out += [root / "build" / "cuda" / LIBRARY_NAME, root / "build-cuda" / LIBRARY_NAME]
        if root.name == "build":
            out.append(root / "cuda" / LIBRARY_NAME)
    return out


def find_library() -> Tuple[Optional[str], str]:
    """(the library file to load, "") or (None, why there is none): the one named
    by SEQPACK_CUDA_LIBRARY where set (only it: one that is not a file is the
    reason, never skipped for another), else the first of the candidates there
    is. seqpack_torch/cuda_ops.cpp's find_library looks alike."""
    named = named_library()
    try:
        if named and not pathlib.Path(named).is_file():
            return None, (f"SEQPACK_CUDA_LIBRARY={named!r} names no library file "
                          f"(missing, or not a regular file)")
        for c in _candidates(named):
            if c.is_file():
                return str(c), ""
    except (OSError, ValueError) as e:  # an over-long or unreadable path
        return None, f"SEQPACK_CUDA_LIBRARY={named!r} cannot be read: {e}"
    where = ", ".join(str(c) for c in _candidates(named))
    return None, (f"{LIBRARY_NAME} not found (SEQPACK_CUDA_LIBRARY={named!r}; looked in {where}); "
                  "build it with `cmake -S cuda -B build-cuda && cmake --build build-cuda`")


def library_path() -> Optional[str]:
    """The library file that is (or would be) loaded, or None if none exists."""
    return find_library()[0]


def _bind(lib: ctypes.CDLL) -> None:
    for name, (restype, argtypes) in SIGNATURES.items():
        f = getattr(lib, name)
        f.restype = restype
        f.argtypes = argtypes


def _library() -> Optional[ctypes.CDLL]:
    """Loads the library once; None (and the reason in _state) if it cannot."""
    with _lock:
        if _state["loaded"]:
            return _state["lib"]
        _state["loaded"] = True
        path, error = find_library()
        if path is None:
            _state["error"] = error
            return None
        try:
            lib = ctypes.CDLL(path)
            _bind(lib)
        except (OSError, AttributeError) as e:
            _state["error"] = f"cannot load {path}: {e}"
            return None
        version = lib.seqpack_cuda_abi_version()
        if version != ABI_VERSION:
            _state["error"] = f"{path} has ABI version {version}, this module needs {ABI_VERSION}"
            return None
        _state["lib"], _state["path"], _state["error"] = lib, path, ""
        _install_policy(lib, None)
        return lib


def _install_policy(lib: ctypes.CDLL, environ) -> None:
    try:
        policy = policy_from_environment(environ)
    except ValueError as e:
        _state["policy_error"] = str(e)
        return
    _check(lib, lib.seqpack_cuda_set_policy(ctypes.byref(policy)))
    _state["policy_error"] = ""


def install_policy(environ=None) -> None:
    """Reads the SEQPACK_CUDA_* variables of `environ` (default os.environ) again
    and installs their policy in the library (loaded first where it is not; a
    no-op where it cannot be). A bad value is refused by name: every call into
    the library raises it until a good one is installed."""
    lib = _library()
    if lib is not None:
        with _lock:
            _install_policy(lib, environ)


def installed_policy() -> Policy:
    """The policy the library holds (seqpack_cuda_get_policy)."""
    lib = _library()
    if lib is None:
        raise RuntimeError("seqpack CUDA: " + _state["error"])
    p = Policy()
    _check(lib, lib.seqpack_cuda_get_policy(ctypes.byref(p)))
    return p


def why_unavailable() -> str:
    """Why available() is False ("" when it is True)."""
    if _library() is None:
        return _state["error"]
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False (no GPU or a CPU-only torch build)"
    return ""


def available() -> bool:
    """The library is found and loaded, and torch sees a GPU."""
    return why_unavailable() == ""


def _lib_or_raise() -> ctypes.CDLL:
    lib = _library()
    if lib is None:
        raise RuntimeError("seqpack CUDA: " + _state["error"])
    if _state["policy_error"]:
        raise RuntimeError("seqpack CUDA: " + _state["policy_error"])
    return lib


def _check(lib: ctypes.CDLL, status: int) -> None:
    if status != 0:
        message = lib.seqpack_cuda_last_error().decode("utf-8", "replace")
        raise RuntimeError(message or f"seqpack CUDA: error {status}")


def _ptr(t: Optional[torch.Tensor]) -> Optional[int]:
    return None if t is None or t.numel() == 0 else t.data_ptr()


class _Sizes:
    """Sizes of one call, read off the tensors (checked by _validate)."""

    def __init__(self, mode: str, data: torch.Tensor, h0: torch.Tensor, weights: Sequence[torch.Tensor],
                 num_layers: int, bidirectional: bool, proj_size: int):
        self.mode = mode
        self.rows = data.shape[0]
        self.input = data.shape[1]
        self.batch = h0.shape[1]
        self.hidden = weights[1].shape[0] // _GATES[mode]
        self.proj = proj_size
        self.layers = num_layers
        self.dirs = 2 if bidirectional else 1
        self.hout = proj_size if proj_size > 0 else self.hidden
        self.width = self.dirs * self.hout


@functools.lru_cache(maxsize=256)
def buffer_sizes(mode: str, dtype: torch.dtype, rows: int, batch: int, input_size: int, hidden_size: int,
                 proj_size: int, num_layers: int, bidirectional: bool) -> Tuple[int, int]:
    """(workspace bytes, reserve bytes) of seqpack_cuda_rnn_buffer_sizes (host only),
    kept per argument list (a pure function of it): a call of a shape met before
    costs a dict lookup instead of a ctypes round trip. Errors are not kept."""
    lib = _lib_or_raise()
    ws, rs = ctypes.c_size_t(0), ctypes.c_size_t(0)
    _check(lib, lib.seqpack_cuda_rnn_buffer_sizes(MODES[mode], DTYPES[dtype], rows, batch, input_size,
                                                   hidden_size, proj_size, num_layers, int(bidirectional),
                                                   ctypes.byref(ws), ctypes.byref(rs)))
    return ws.value, rs.value


def _pointer_array(tensors: Sequence[torch.Tensor]):
    return (ctypes.c_void_p * max(len(tensors), 1))(*[t.data_ptr() for t in tensors])


def _stream(t: torch.Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


class _DeviceGuard:
    def __init__(self, t: torch.Tensor):
        self.guard = torch.cuda.device(t.device) if t.is_cuda else None

    def __enter__(self):
        if self.guard is not None:
            self.guard.__enter__()

    def __exit__(self, *exc):
        if self.guard is not None:
            self.guard.__exit__(*exc)


def _args(mode, data, bs, s: "_Sizes", h0, c0, weights, mask, has_biases, bidirectional, allow_tf32) -> RnnArgs:
    """The arguments both passes share. The struct keeps the weights' pointer
    array alive (_keep) while the call runs."""
    a = RnnArgs()
    a.mode, a.dtype = MODES[mode], DTYPES[data.dtype]
    a.bidirectional, a.has_biases, a.allow_tf32 = int(bidirectional), int(has_biases), int(allow_tf32)
    a.rows, a.steps, a.batch_sizes = s.rows, bs.numel(), ctypes.cast(bs.data_ptr(), _pi64)
    a.batch, a.input_size, a.hidden_size, a.proj_size, a.num_layers = s.batch, s.input, s.hidden, s.proj, s.layers
    w = _pointer_array(weights)
    a._keep = w
    a.weights = ctypes.cast(w, _pp)
    a.x, a.h0, a.c0, a.dropout_mask = _ptr(data), _ptr(h0), _ptr(c0), _ptr(mask)
    a.stream = _stream(data)
    return a


_ALIGN = 512  # the reserve's offset in a forward's one buffer (torch's blocks are this aligned)


def _forward_library(mode: str, data: torch.Tensor, batch_sizes: torch.Tensor, h0: torch.Tensor,
                     c0: Optional[torch.Tensor], weights: List[torch.Tensor], mask: Optional[torch.Tensor],
                     has_biases: bool, num_layers: int, bidirectional: bool, proj_size: int,
                     allow_tf32: bool, keep_reserve: bool = True
                     ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward, every product in the library (SEQPACK_CUDA_PRODUCTS=library);
    without keep_reserve (no backward will follow) the workspace and the reserve
    share one allocation and the reserve returned is empty."""
    lib = _lib_or_raise()
    s = _Sizes(mode, data, h0, weights, num_layers, bidirectional, proj_size)
    ws_bytes, rs_bytes = buffer_sizes(mode, data.dtype, s.rows, s.batch, s.input, s.hidden, s.proj,
                                      s.layers, bidirectional)
    bs = batch_sizes if batch_sizes.is_contiguous() else batch_sizes.contiguous()  # int64: _validate
    y = data.new_empty((s.rows, s.width))
    hn = torch.empty_like(h0)
    cn = torch.empty_like(c0) if c0 is not None else None
    with _DeviceGuard(data):
        if keep_reserve:
            reserve = torch.empty((rs_bytes,), dtype=torch.uint8, device=data.device)
            workspace = torch.empty((ws_bytes,), dtype=torch.uint8, device=data.device)
            ws_ptr, rs_ptr = _ptr(workspace), _ptr(reserve)
        else:
            at = -(-ws_bytes // _ALIGN) * _ALIGN
            buffer = torch.empty((at + rs_bytes,), dtype=torch.uint8, device=data.device)
            ws_ptr = buffer.data_ptr() if ws_bytes else None
            rs_ptr = buffer.data_ptr() + at if rs_bytes else None
            reserve = buffer[:0]
        a = _args(mode, data, bs, s, h0, c0, weights, mask, has_biases, bidirectional, allow_tf32)
        a.workspace, a.workspace_bytes, a.reserve, a.reserve_bytes = ws_ptr, ws_bytes, rs_ptr, rs_bytes
        a.y, a.hn, a.cn = _ptr(y), _ptr(hn), _ptr(cn)
        _check(lib, lib.seqpack_cuda_rnn_forward(ctypes.byref(a)))
    return y, hn, (cn if cn is not None else data.new_empty((0,))), reserve


def _backward_library(mode: str, data: torch.Tensor, batch_sizes: torch.Tensor, h0: torch.Tensor,
                      c0: Optional[torch.Tensor], weights: List[torch.Tensor], mask: Optional[torch.Tensor],
                      reserve: torch.Tensor, dy: Optional[torch.Tensor], dhn: Optional[torch.Tensor],
                      dcn: Optional[torch.Tensor], has_biases: bool, num_layers: int, bidirectional: bool,
                      proj_size: int, allow_tf32: bool) -> List[torch.Tensor]:
    lib = _lib_or_raise()
    s = _Sizes(mode, data, h0, weights, num_layers, bidirectional, proj_size)
    ws_bytes, rs_bytes = buffer_sizes(mode, data.dtype, s.rows, s.batch, s.input, s.hidden, s.proj,
                                      s.layers, bidirectional)
    bs = batch_sizes.to(torch.int64).contiguous()
    dy = dy.to(data.dtype).contiguous() if dy is not None else None
    dhn = dhn.to(data.dtype).contiguous() if dhn is not None else None
    dcn = dcn.to(data.dtype).contiguous() if dcn is not None and c0 is not None else None
    dx = torch.empty_like(data)
    dh0 = torch.empty_like(h0)
    dc0 = torch.empty_like(c0) if c0 is not None else data.new_empty((0,))
    dweights = [torch.empty_like(w) for w in weights]
    with _DeviceGuard(data):
        workspace = torch.empty((ws_bytes,), dtype=torch.uint8, device=data.device)
        a = _args(mode, data, bs, s, h0, c0, weights, mask, has_biases, bidirectional, allow_tf32)
        a.workspace, a.workspace_bytes, a.reserve, a.reserve_bytes = _ptr(workspace), ws_bytes, _ptr(reserve), rs_bytes
        a.dy, a.dhn, a.dcn = _ptr(dy), _ptr(dhn), _ptr(dcn)
        a.dx, a.dh0, a.dc0 = _ptr(dx), _ptr(dh0), _ptr(dc0) if c0 is not None else None
        dw = _pointer_array(dweights)
        a.dweights = ctypes.cast(dw, _pp)
        _check(lib, lib.seqpack_cuda_rnn_backward(ctypes.byref(a)))
    return [dx, dh0, dc0] + dweights


# ---------------------------------------------------------------------------
# The products that are not recurrent as torch matrix products (cuBLAS on a
# GPU, on the data's stream; float32 under torch's own TF32 setting; float16
# and bfloat16 operands accumulated in float32 by cuBLAS, results in the data
# type): the input projection of every packed row, dW_ih, dW_hh, dW_hr, the
# bias sums and dX. The library runs each layer's recurrence
# (caller_products = 1, seqpack/cuda.h). SEQPACK_CUDA_PRODUCTS=library runs
# them all in the library instead (its SIMT products).

PRODUCTS = ("torch", "library")


def _products() -> bool:
    """True where the products that are not recurrent run in torch (the default)."""
    choice = os.environ.get("SEQPACK_CUDA_PRODUCTS", "") or "torch"
    if choice not in PRODUCTS:
        raise ValueError(f"seqpack CUDA: SEQPACK_CUDA_PRODUCTS = {choice!r} is not one of {list(PRODUCTS)}")
    return choice == "torch"


_SAVED_ALIGN = 256  # each piece of the layered forward's saved buffer starts at a multiple


def _aligned(n):
    return (n + _SAVED_ALIGN - 1) // _SAVED_ALIGN * _SAVED_ALIGN


def _layer_reserve_bytes(mode: str, dtype: torch.dtype, rows, s: "_Sizes", bidirectional: bool):
    """Bytes of one layer's reserve (the library's, num_layers = 1): rows times
    the reserve of one row, which does not depend on the layer's input size."""
    _, per_row = buffer_sizes(mode, dtype, 1, 1, s.input, s.hidden, s.proj, 1, bidirectional)
    return rows * per_row


def _saved_layout(mode: str, dtype: torch.dtype, rows, s: "_Sizes", bidirectional: bool):
    """The layered forward's saved buffer: each layer's reserve, then the outputs
    of the layers below the last (the inputs of those above). Returns
    (reserve offsets, output offsets, total bytes, one layer's reserve bytes);
    rows may be symbolic."""
    layer = _layer_reserve_bytes(mode, dtype, rows, s, bidirectional)
    reserve = _aligned(layer)
    output = _aligned(rows * s.width * _ELEMENT_SIZE[dtype])
    reserves = [l * reserve for l in range(s.layers)]
    outputs = [s.layers * reserve + l * output for l in range(s.layers - 1)]
    return reserves, outputs, s.layers * reserve + (s.layers - 1) * output, layer


def _layer_args(mode, bs, s, dtype, has_biases, bidirectional, allow_tf32, stream):
    """The fields every layer's call shares (caller_products = 1); the caller
    sets each layer's input size, weights (_set_weights), states and buffers."""
    a = RnnArgs()
    a.mode, a.dtype = MODES[mode], DTYPES[dtype]
    a.bidirectional, a.has_biases, a.allow_tf32 = int(bidirectional), int(has_biases), int(allow_tf32)
    a.caller_products = 1
    a.rows, a.steps, a.batch_sizes = s.rows, bs.numel(), ctypes.cast(bs.data_ptr(), _pi64)
    a.batch, a.hidden_size, a.proj_size, a.num_layers = s.batch, s.hidden, s.proj, 1
    a.stream = stream
    return a


def _set_weights(a: RnnArgs, weights: Sequence[torch.Tensor], layer: int, per_layer: int) -> None:
    """a.weights: layer `layer`'s entries of one pointer array of every weight,
    made at the first layer and kept by the struct."""
    if getattr(a, "_keep", None) is None:
        a._keep = _pointer_array(weights)
    a.weights = ctypes.cast(ctypes.addressof(a._keep) + layer * per_layer * ctypes.sizeof(ctypes.c_void_p), _pp)


def _layer_slices(t: Optional[torch.Tensor], dirs: int):
    """(pointer, bytes per layer) of a contiguous (layers * dirs, batch, width)
    state, for the pointer of layer l's slice without a view per layer; None
    where there is none or it is empty."""
    if t is None or t.numel() == 0:
        return None
    return t.data_ptr(), dirs * t.shape[1] * t.shape[2] * t.element_size()


def _slice(ptrs, l: int) -> Optional[int]:
    return None if ptrs is None else ptrs[0] + l * ptrs[1]


# The products, as the glue calls them (bench/cuda_glue_cost.py replaces them
# by stand-ins that only allocate, to time the glue alone on the CPU).
_linear = torch.nn.functional.linear
_mm = torch.mm


def _layer_input(data, outputs, mask, l):
    """The input of layer l: the data, or the output of the layer below (times
    the dropout mask)."""
    if l == 0:
        return data
    return outputs[l - 1] if mask is None else outputs[l - 1] * mask[l - 1]


def _per_layer(s: "_Sizes", has_biases: bool) -> int:
    return 2 + (2 if has_biases else 0) + (1 if s.proj > 0 else 0)


def _forward_layers(mode: str, data: torch.Tensor, batch_sizes: torch.Tensor, h0: torch.Tensor,
                    c0: Optional[torch.Tensor], weights: List[torch.Tensor], mask: Optional[torch.Tensor],
                    has_biases: bool, num_layers: int, bidirectional: bool, proj_size: int,
                    allow_tf32: bool, keep_reserve: bool = True
                    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward, a library call per layer after torch's input projection
    (gates = input W_ih^T + b_ih, one product per direction). The saved buffer
    (_saved_layout) holds what the backward reads; without keep_reserve one
    layer's reserve serves every layer and the saved buffer returned is empty."""
    lib = _lib_or_raise()
    s = _Sizes(mode, data, h0, weights, num_layers, bidirectional, proj_size)
    ws_bytes, _ = buffer_sizes(mode, data.dtype, s.rows, s.batch, s.input, s.hidden, s.proj, 1, bidirectional)
    bs = batch_sizes if batch_sizes.is_contiguous() else batch_sizes.contiguous()
    reserves, output_at, saved_bytes, layer_rs = _saved_layout(mode, data.dtype, s.rows, s, bidirectional)
    per, dirs = _per_layer(s, has_biases), s.dirs
    y = data.new_empty((s.rows, s.width))
    hn = torch.empty_like(h0)
    cn = torch.empty_like(c0) if c0 is not None else None
    stream = _stream(data)
    with _DeviceGuard(data):
        if keep_reserve:
            workspace = torch.empty((ws_bytes,), dtype=torch.uint8, device=data.device)
            ws_ptr = _ptr(workspace)
            saved = torch.empty((saved_bytes,), dtype=torch.uint8, device=data.device)
            outputs = [saved[o:o + y.numel() * y.element_size()].view(data.dtype).view(s.rows, s.width)
                       for o in output_at]
        else:  # one allocation: the workspace, then one layer's reserve that every layer uses
            at = _aligned(ws_bytes)
            saved = torch.empty((at + layer_rs,), dtype=torch.uint8, device=data.device)
            ws_ptr = saved.data_ptr() if ws_bytes else None
            reserves = [at] * s.layers
            outputs = [data.new_empty((s.rows, s.width)) for _ in range(s.layers - 1)]
        base = saved.data_ptr()
        a = _layer_args(mode, bs, s, data.dtype, has_biases, bidirectional, allow_tf32, stream)
        a.workspace, a.workspace_bytes, a.reserve_bytes = ws_ptr, ws_bytes, layer_rs
        h0s, c0s, hns, cns = (_layer_slices(t, dirs) for t in (h0, c0, hn, cn))
        for l in range(s.layers):
            x = _layer_input(data, outputs, mask, l)
            lw = weights[l * dirs * per:(l + 1) * dirs * per]
            # gates = x W_ih^T + b_ih of each direction: torch's products.
            gates = [_linear(x, lw[d * per], lw[d * per + 2] if has_biases else None) for d in range(dirs)]
            for d in range(dirs):
                a.input_gates[d] = _ptr(gates[d])
            _set_weights(a, weights, l, dirs * per)
            a.input_size = x.shape[1]
            a.h0, a.c0, a.hn, a.cn = _slice(h0s, l), _slice(c0s, l), _slice(hns, l), _slice(cns, l)
            a.reserve = base + reserves[l] if layer_rs else None
            a.y = _ptr(y if l + 1 == s.layers else outputs[l])
            _check(lib, lib.seqpack_cuda_rnn_forward(ctypes.byref(a)))
    if not keep_reserve:
        saved = saved[:0]
    return y, hn, (cn if cn is not None else data.new_empty((0,))), saved


def _backward_layers(mode: str, data: torch.Tensor, batch_sizes: torch.Tensor, h0: torch.Tensor,
                     c0: Optional[torch.Tensor], weights: List[torch.Tensor], mask: Optional[torch.Tensor],
                     saved: torch.Tensor, dy: Optional[torch.Tensor], dhn: Optional[torch.Tensor],
                     dcn: Optional[torch.Tensor], has_biases: bool, num_layers: int, bidirectional: bool,
                     proj_size: int, allow_tf32: bool) -> List[torch.Tensor]:
    """The backward of _forward_layers: per layer from the top, the library's
    recurrence (the gradients of the gates, h_{t-1} of each row), then the
    weight gradients, the bias sums and dX as torch products."""
    lib = _lib_or_raise()
    s = _Sizes(mode, data, h0, weights, num_layers, bidirectional, proj_size)
    ws_bytes, _ = buffer_sizes(mode, data.dtype, s.rows, s.batch, s.input, s.hidden, s.proj, 1, bidirectional)
    reserves, output_at, _, layer_rs = _saved_layout(mode, data.dtype, s.rows, s, bidirectional)
    bs = batch_sizes.to(torch.int64).contiguous()
    dtype, per, dirs, G, P = data.dtype, _per_layer(s, has_biases), s.dirs, _GATES[mode] * s.hidden, s.hout
    dY = dy.to(dtype).contiguous() if dy is not None else None
    dhn = dhn.to(dtype).contiguous() if dhn is not None else None
    dcn = dcn.to(dtype).contiguous() if dcn is not None and c0 is not None else None
    dh0 = torch.empty_like(h0)
    dc0 = torch.empty_like(c0) if c0 is not None else data.new_empty((0,))
    dweights: List[Optional[torch.Tensor]] = [None] * len(weights)
    outputs = [saved[o:o + s.rows * s.width * data.element_size()].view(dtype).view(s.rows, s.width)
               for o in output_at]
    stream, base, f32 = _stream(data), saved.data_ptr(), torch.float32
    dx: Optional[torch.Tensor] = None  # layer 0's dX
    with _DeviceGuard(data):
        workspace = torch.empty((ws_bytes,), dtype=torch.uint8, device=data.device)
        a = _layer_args(mode, bs, s, dtype, has_biases, bidirectional, allow_tf32, stream)
        a.workspace, a.workspace_bytes, a.reserve_bytes = _ptr(workspace), ws_bytes, layer_rs
        dhns, dcns, dh0s = (_layer_slices(t, dirs) for t in (dhn, dcn, dh0))
        dc0s = _layer_slices(dc0, dirs) if c0 is not None else None
        # What the library writes for the products, per direction: the same
        # buffers for every layer (each layer's products read them before the
        # next layer's call, in stream order).
        dgx = [data.new_empty((s.rows, G), dtype=f32) for _ in range(dirs)]
        dgh = [data.new_empty((s.rows, G), dtype=f32) for _ in range(dirs)] if mode == "GRU" else dgx
        hprev = [data.new_empty((s.rows, P), dtype=f32) for _ in range(dirs)]
        dh = [data.new_empty((s.rows, P), dtype=f32) for _ in range(dirs)] if s.proj else None
        m = [data.new_empty((s.rows, s.hidden), dtype=f32) for _ in range(dirs)] if s.proj else None
        for d in range(dirs):
            a.dgates_x[d], a.hprev[d] = _ptr(dgx[d]), _ptr(hprev[d])
            if mode == "GRU":
                a.dgates_h[d] = _ptr(dgh[d])
            if s.proj:
                a.dh[d], a.m[d] = _ptr(dh[d]), _ptr(m[d])
        for l in reversed(range(s.layers)):
            x = _layer_input(data, outputs, mask, l)
            lw = weights[l * dirs * per:(l + 1) * dirs * per]
            _set_weights(a, weights, l, dirs * per)
            a.input_size = x.shape[1]
            a.reserve = base + reserves[l] if layer_rs else None
            a.dy = _ptr(dY)
            a.dhn, a.dcn, a.dh0, a.dc0 = _slice(dhns, l), _slice(dcns, l), _slice(dh0s, l), _slice(dc0s, l)
            _check(lib, lib.seqpack_cuda_rnn_backward(ctypes.byref(a)))
            dX = None
            for d in range(dirs):
                at = (l * dirs + d) * per
                gx, gh = dgx[d].to(dtype), dgh[d].to(dtype)
                dweights[at] = _mm(gx.t(), x)
                dweights[at + 1] = _mm(gh.t(), hprev[d].to(dtype))
                if has_biases:
                    dweights[at + 2] = dgx[d].sum(0).to(dtype)
                    dweights[at + 3] = dgh[d].sum(0).to(dtype)
                if s.proj:
                    dweights[at + per - 1] = _mm(dh[d].to(dtype).t(), m[d].to(dtype))
                w_ih = lw[d * per]
                dX = _mm(gx, w_ih) if dX is None else dX.addmm_(gx, w_ih)
            if l > 0:
                dY = dX if mask is None else dX * mask[l - 1]
            else:
                dx = dX
    return [dx, dh0, dc0] + dweights


def _forward_impl(mode, data, batch_sizes, h0, c0, weights, mask, has_biases, num_layers, bidirectional,
                  proj_size, allow_tf32, torch_products, keep_reserve=True):
    """The forward with the products that are not recurrent in torch or in the library."""
    run = _forward_layers if torch_products else _forward_library
    return run(mode, data, batch_sizes, h0, c0, weights, mask, has_biases, num_layers, bidirectional, proj_size,
               allow_tf32, keep_reserve)


def _backward_impl(mode, data, batch_sizes, h0, c0, weights, mask, reserve, dy, dhn, dcn, has_biases, num_layers,
                   bidirectional, proj_size, allow_tf32, torch_products):
    """The backward of a _forward_impl with the same torch_products."""
    run = _backward_layers if torch_products else _backward_library
    return run(mode, data, batch_sizes, h0, c0, weights, mask, reserve, dy, dhn, dcn, has_biases, num_layers,
               bidirectional, proj_size, allow_tf32)


DOUBLE_BACKWARD_REFUSAL = (
    "seqpack CUDA: double backward (differentiating a gradient taken with create_graph=True) through seqpack's "
    "CUDA recurrent kernels is not supported: their backward is not made of differentiable operations (nor is "
    "cuDNN's). seqpack's CPU layers support it; on CUDA, torch's own non-cuDNN kernels do "
    "(SEQPACK_CUDA_LAYERS=torch, inside torch.backends.cudnn.flags(enabled=False))")


class _NoDoubleBackward(torch.autograd.Function):
    """The kernels' backward in a graph recorded with create_graph=True: its
    gradients are the kernels' values, and differentiating them raises
    DOUBLE_BACKWARD_REFUSAL when it is asked for (as torch's cuDNN RNN does),
    instead of counting the RNN's second derivatives as zero."""

    @staticmethod
    def forward(ctx, count, *tensors):
        # tensors: the `count` gradients, then what they depend on (the saved
        # inputs and the upstream gradients).
        return tuple(t.clone() for t in tensors[:count])

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(DOUBLE_BACKWARD_REFUSAL)


def _graph_refusing(grads: List[Optional[torch.Tensor]], depends_on) -> List[Optional[torch.Tensor]]:
    """grads as they are, but under grad mode (a backward with create_graph=True)
    with a node that refuses double backward where anything in depends_on
    requires grad. The first-order backward (grad mode off) is untouched."""
    if not torch.is_grad_enabled():
        return grads
    sources = [t for t in depends_on if t is not None and t.requires_grad]
    defined = [i for i, g in enumerate(grads) if g is not None]
    if not sources or not defined:
        return grads
    wrapped = _NoDoubleBackward.apply(len(defined), *[grads[i] for i in defined], *sources)
    out = list(grads)
    for i, g in zip(defined, wrapped):
        out[i] = g
    return out


# ---------------------------------------------------------------------------
# The operator: torch.library.custom_op where it exists (torch >= 2.4: works
# under torch.compile), else a torch.autograd.Function; rnn_packed calls the
# Function (_run_eager) wherever torch.compile is not tracing, and neither
# where autograd records nothing.

_HAS_CUSTOM_OP = hasattr(torch, "library") and hasattr(torch.library, "custom_op") and hasattr(
    torch.library, "register_fake")


def _unused_op_name(base: str) -> str:
    """base, or base_1, base_2, ... when this file was loaded before in the process (by path)."""
    name, i = base, 0
    while hasattr(torch.ops.seqpack_cuda, name):
        i += 1
        name = f"{base}_{i}"
    return name


if _HAS_CUSTOM_OP:
    @torch.library.custom_op("seqpack_cuda::" + _unused_op_name("rnn_packed"), mutates_args=())
    def _rnn_op(mode: str, data: torch.Tensor, batch_sizes: torch.Tensor, h0: torch.Tensor,
                c0: Optional[torch.Tensor], weights: List[torch.Tensor], mask: Optional[torch.Tensor],
                has_biases: bool, num_layers: int, bidirectional: bool, proj_size: int,
                allow_tf32: bool, torch_products: bool
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return _forward_impl(mode, data, batch_sizes, h0, c0, weights, mask, has_biases, num_layers,
                             bidirectional, proj_size, allow_tf32, torch_products)

    @_rnn_op.register_fake
    def _(mode, data, batch_sizes, h0, c0, weights, mask, has_biases, num_layers, bidirectional, proj_size,
          allow_tf32, torch_products):
        s = _Sizes(mode, data, h0, weights, num_layers, bidirectional, proj_size)
        rows = data.shape[0]
        if torch_products:
            saved_bytes = _saved_layout(mode, data.dtype, rows, s, bidirectional)[2]
        else:  # the reserve is exactly rows times its size for one row
            _, per_row = buffer_sizes(mode, data.dtype, 1, 1, s.input, s.hidden, s.proj, s.layers, bidirectional)
            saved_bytes = rows * per_row
        y = data.new_empty((rows, s.width))
        cn = torch.empty_like(c0) if c0 is not None else data.new_empty((0,))
        reserve = data.new_empty((saved_bytes,), dtype=torch.uint8)
        return y, torch.empty_like(h0), cn, reserve

    @torch.library.custom_op("seqpack_cuda::" + _unused_op_name("rnn_packed_backward"), mutates_args=())
    def _rnn_backward_op(mode: str, data: torch.Tensor, batch_sizes: torch.Tensor, h0: torch.Tensor,
                         c0: Optional[torch.Tensor], weights: List[torch.Tensor], mask: Optional[torch.Tensor],
                         reserve: torch.Tensor, dy: Optional[torch.Tensor], dhn: Optional[torch.Tensor],
                         dcn: Optional[torch.Tensor], has_biases: bool, num_layers: int, bidirectional: bool,
                         proj_size: int, allow_tf32: bool, torch_products: bool) -> List[torch.Tensor]:
        return _backward_impl(mode, data, batch_sizes, h0, c0, weights, mask, reserve, dy, dhn, dcn, has_biases,
                              num_layers, bidirectional, proj_size, allow_tf32, torch_products)

    @_rnn_backward_op.register_fake
    def _(mode, data, batch_sizes, h0, c0, weights, mask, reserve, dy, dhn, dcn, has_biases, num_layers,
          bidirectional, proj_size, allow_tf32, torch_products):
        dc0 = torch.empty_like(c0) if c0 is not None else data.new_empty((0,))
        return [torch.empty_like(data), torch.empty_like(h0), dc0] + [torch.empty_like(w) for w in weights]

    def _setup_context(ctx, inputs, output):
        (mode, data, batch_sizes, h0, c0, weights, mask, has_biases, num_layers, bidirectional, proj_size,
         allow_tf32, torch_products) = inputs
        ctx.save_for_backward(data, batch_sizes, h0, c0, mask, output[3], *weights)
        ctx.params = (mode, has_biases, num_layers, bidirectional, proj_size, allow_tf32, torch_products)

    def _backward(ctx, dy, dhn, dcn, _dreserve):
        mode, has_biases, num_layers, bidirectional, proj_size, allow_tf32, torch_products = ctx.params
        data, batch_sizes, h0, c0, mask, reserve, *weights = ctx.saved_tensors
        grads = _rnn_backward_op(mode, data, batch_sizes, h0, c0, list(weights), mask, reserve, dy, dhn,
                                 dcn if c0 is not None else None, has_biases, num_layers, bidirectional,
                                 proj_size, allow_tf32, torch_products)
        grads = _graph_refusing(list(grads), [data, h0, c0, dy, dhn, dcn] + list(weights))
        dx, dh0, dc0 = grads[0], grads[1], grads[2]
        return (None, dx, None, dh0, dc0 if c0 is not None else None, list(grads[3:]), None, None, None, None,
                None, None, None)

    _rnn_op.register_autograd(_backward, setup_context=_setup_context)

    def _run(mode, data, batch_sizes, h0, c0, weights, mask, has_biases, num_layers, bidirectional, proj_size,
             allow_tf32, torch_products=True):
        return _rnn_op(mode, data, batch_sizes, h0, c0, list(weights), mask, has_biases, num_layers,
                       bidirectional, proj_size, allow_tf32, torch_products)[:3]
else:
    def _run(mode, data, batch_sizes, h0, c0, weights, mask, has_biases, num_layers, bidirectional, proj_size,
             allow_tf32, torch_products=True):
        return _run_eager(mode, data, batch_sizes, h0, c0, weights, mask, has_biases, num_layers, bidirectional,
                          proj_size, allow_tf32, torch_products)


class _RnnFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, params, data, batch_sizes, h0, c0, mask, *weights):
        mode, has_biases, num_layers, bidirectional, proj_size, allow_tf32, torch_products = params
        y, hn, cn, reserve = _forward_impl(mode, data, batch_sizes, h0, c0, list(weights), mask, has_biases,
                                           num_layers, bidirectional, proj_size, allow_tf32, torch_products)
        ctx.params = params
        ctx.has_c0 = c0 is not None
        ctx.save_for_backward(data, batch_sizes, h0, c0 if c0 is not None else data.new_empty((0,)),
                              mask if mask is not None else data.new_empty((0,)), reserve, *weights)
        ctx.has_mask = mask is not None
        return y, hn, cn

    @staticmethod
    def backward(ctx, dy, dhn, dcn):
        mode, has_biases, num_layers, bidirectional, proj_size, allow_tf32, torch_products = ctx.params
        data, batch_sizes, h0, c0, mask, reserve, *weights = ctx.saved_tensors
        c0 = c0 if ctx.has_c0 else None
        mask = mask if ctx.has_mask else None
        grads = _backward_impl(mode, data, batch_sizes, h0, c0, list(weights), mask, reserve, dy, dhn,
                               dcn if c0 is not None else None, has_biases, num_layers, bidirectional,
                               proj_size, allow_tf32, torch_products)
        grads = _graph_refusing(grads, [data, h0, c0, dy, dhn, dcn] + list(weights))
        return (None, grads[0], None, grads[1], grads[2] if c0 is not None else None, None) + tuple(grads[3:])


def _run_eager(mode, data, batch_sizes, h0, c0, weights, mask, has_biases, num_layers, bidirectional,
               proj_size, allow_tf32, torch_products=True):
    """The forward as an autograd.Function: the registration of the calls autograd
    records outside torch.compile (custom_op's costs several times as much a call)."""
    params = (mode, has_biases, num_layers, bidirectional, proj_size, allow_tf32, torch_products)
    return _RnnFunction.apply(params, data, batch_sizes, h0, c0, mask, *weights)


# ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=256)
def _weight_shapes(g: int, hout: int, hidden: int, input_size: int, num_layers: int, dirs: int, has_biases: bool,
                   proj_size: int) -> Tuple[tuple, ...]:
    """The shapes of flat_weights, in its order (g = gates * hidden)."""
    shapes = []
    for l in range(num_layers):
        for _ in range(dirs):
            shapes += [(g, input_size if l == 0 else dirs * hout), (g, hout)]
            if has_biases:
                shapes += [(g,), (g,)]
            if proj_size > 0:
                shapes += [(proj_size, hidden)]
    return tuple(shapes)


def _validate(mode, data, batch_sizes, hx, flat_weights, has_biases, num_layers, bidirectional, proj_size,
              require_cuda: bool = True):
    """Raises what torch raises for the same mistake; returns (h0, c0, weights)."""
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"seqpack CUDA: mode = {mode!r} is not one of {sorted(MODES)}")
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"seqpack CUDA: data must be a Tensor, not {type(data).__name__}")
    if not isinstance(batch_sizes, torch.Tensor):
        raise TypeError(f"seqpack CUDA: batch_sizes must be a Tensor, not {type(batch_sizes).__name__}")
    if require_cuda and not data.is_cuda:
        raise RuntimeError(f"seqpack CUDA: data is on {data.device}, expected a CUDA device")
    if data.dtype not in DTYPES:
        raise RuntimeError(f"seqpack CUDA: data has dtype {data.dtype}; float32, float16 or bfloat16 expected")
    if data.dim() != 2:
        raise RuntimeError(f"seqpack CUDA: data has shape {tuple(data.shape)}; (rows, input_size) expected")
    if batch_sizes.device.type != "cpu" or batch_sizes.dim() != 1 or batch_sizes.dtype != torch.int64:
        raise RuntimeError(f"seqpack CUDA: batch_sizes must be a 1-D int64 CPU tensor, got {batch_sizes.dtype} "
                           f"of shape {tuple(batch_sizes.shape)} on {batch_sizes.device}")
    if not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"seqpack CUDA: num_layers = {num_layers!r} must be a positive int")
    if proj_size < 0 or (proj_size > 0 and mode != "LSTM"):
        raise ValueError(f"seqpack CUDA: proj_size = {proj_size} (only LSTM takes a positive proj_size)")
    dirs = 2 if bidirectional else 1
    per = 2 + (2 if has_biases else 0) + (1 if proj_size > 0 else 0)
    weights = list(flat_weights)
    if len(weights) != num_layers * dirs * per:
        raise ValueError(f"seqpack CUDA: {len(weights)} flat_weights given, {num_layers * dirs * per} expected "
                         f"for num_layers={num_layers}, bidirectional={bidirectional}, has_biases={has_biases}, "
                         f"proj_size={proj_size}")
    device, dtype = data.device, data.dtype
    for i, w in enumerate(weights):
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"seqpack CUDA: flat_weights[{i}] must be a Tensor, not {type(w).__name__}")
        if w.device != device:
            raise RuntimeError(f"seqpack CUDA: flat_weights[{i}] is on {w.device}, data on {data.device}")
        if w.dtype != dtype:
            raise RuntimeError(f"seqpack CUDA: flat_weights[{i}] has dtype {w.dtype}, data {data.dtype}")
    gates = _GATES[mode]
    if hx is None:  # zeros, as torch.nn.LSTM/GRU/RNN make them
        if len(weights) == 0 or weights[1].dim() != 2:
            raise RuntimeError("seqpack CUDA: flat_weights[1] (weight_hh_l0) must be a matrix")
        hidden = weights[1].shape[0] // gates
        batch = int(batch_sizes[0]) if batch_sizes.numel() > 0 else 0
        h = data.new_zeros((num_layers * dirs, batch, proj_size if proj_size > 0 else hidden))
        hx = (h, data.new_zeros((num_layers * dirs, batch, hidden))) if mode == "LSTM" else h
    if mode == "LSTM":
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise RuntimeError("seqpack CUDA: LSTM's hx must be a tuple (h0, c0)")
        h0, c0 = hx
    else:
        if isinstance(hx, (tuple, list)):
            raise RuntimeError(f"seqpack CUDA: {mode}'s hx must be one tensor h0, not a {type(hx).__name__}")
        h0, c0 = hx, None
    w_ih0, w_hh0 = weights[0], weights[1]
    if w_hh0.dim() != 2 or w_hh0.shape[0] % gates != 0:
        raise RuntimeError(f"seqpack CUDA: flat_weights[1] (weight_hh_l0) has shape {tuple(w_hh0.shape)}")
    hidden = w_hh0.shape[0] // gates
    hout = proj_size if proj_size > 0 else hidden
    if w_ih0.dim() != 2 or w_ih0.shape[1] != data.shape[1]:
        raise RuntimeError(f"seqpack CUDA: input.size(-1) must be equal to input_size. Expected "
                           f"{w_ih0.shape[-1]}, got {data.shape[1]}")
    for i, (w, shape) in enumerate(zip(weights, _weight_shapes(gates * hidden, hout, hidden, data.shape[1],
                                                                num_layers, dirs, bool(has_biases), proj_size))):
        if w.shape != shape:
            raise RuntimeError(f"seqpack CUDA: flat_weights[{i}] has shape {tuple(w.shape)}, expected {shape}")
    for name, t, width in (("h0", h0, hout), ("c0", c0, hidden)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"seqpack CUDA: {name} must be a Tensor, not {type(t).__name__}")
        if t.device != data.device or t.dtype != data.dtype:
            raise RuntimeError(f"seqpack CUDA: {name} is {t.dtype} on {t.device}, data {data.dtype} on {data.device}")
        if t.dim() != 3 or t.shape[0] != num_layers * dirs or t.shape[2] != width:
            raise RuntimeError(f"seqpack CUDA: Expected hidden size ({num_layers * dirs}, batch, {width}) for "
                               f"{name}, got {tuple(t.shape)}")
    if c0 is not None and c0.shape[1] != h0.shape[1]:
        raise RuntimeError(f"seqpack CUDA: c0 has batch {c0.shape[1]}, h0 {h0.shape[1]}")
    return h0.contiguous(), (c0.contiguous() if c0 is not None else None), [w.contiguous() for w in weights]


def dropout_mask(data: torch.Tensor, num_layers: int, width: int, dropout: float) -> torch.Tensor:
    """The mask between layers: (num_layers - 1, rows, width), 0 or 1/(1-p), torch's RNG."""
    shape = (num_layers - 1, data.shape[0], width)
    if dropout >= 1.0:
        return data.new_zeros(shape)
    keep = torch.empty(shape, dtype=torch.float32, device=data.device).bernoulli_(1.0 - dropout)
    return (keep / (1.0 - dropout)).to(data.dtype)


_IS_COMPILING = getattr(getattr(torch, "compiler", None), "is_compiling", None)


def _compiling() -> bool:
    return _IS_COMPILING is not None and _IS_COMPILING()


def _allow_tf32() -> bool:
    """torch's setting for float32 matrix products at call time (newer torch: fp32_precision).

    With it, the library's cluster kernels run float32 step products on tensor
    cores as 3xTF32 (float32's accuracy); without it, in float32 on the cores'
    FMA units. Under torch.compile, whose tracer cannot read the setting (torch
    2.11: _get_fp32_precision_getter is marked as skipped), it is not read:
    False."""
    if _compiling():
        return False
    matmul = torch.backends.cuda.matmul
    try:  # torch 1.13's matmul raises AssertionError for an unknown attribute
        precision = getattr(matmul, "fp32_precision", None)
    except (AttributeError, AssertionError):
        precision = None
    if precision in ("tf32", "ieee"):
        return precision == "tf32"
    return bool(matmul.allow_tf32)


def rnn_packed(mode: str, data: torch.Tensor, batch_sizes: torch.Tensor, hx, flat_weights: List[torch.Tensor],
               has_biases: bool, num_layers: int, dropout: float, train: bool, bidirectional: bool,
               proj_size: int = 0) -> tuple:
    """torch._VF.<mode>(data, batch_sizes, hx, flat_weights, ...) on the GPU.

    Returns (output_data, h_n, c_n) for LSTM, (output_data, h_n) otherwise.
    """
    if not isinstance(dropout, (int, float)) or not 0.0 <= float(dropout) <= 1.0:
        raise ValueError(f"seqpack CUDA: dropout = {dropout!r} must be a number in [0, 1]")
    h0, c0, weights = _validate(mode, data, batch_sizes, hx, flat_weights, has_biases, num_layers,
                                bidirectional, proj_size)
    data = data.contiguous()
    s = _Sizes(mode, data, h0, weights, num_layers, bidirectional, proj_size)
    mask = None
    if train and dropout > 0 and num_layers > 1:
        mask = dropout_mask(data, num_layers, s.width, float(dropout))
    allow_tf32 = _allow_tf32()
    torch_products = _products()
    if _compiling():  # torch.compile traces the registered operator
        y, hn, cn = _run(mode, data, batch_sizes, h0, c0, weights, mask, bool(has_biases), num_layers,
                         bool(bidirectional), int(proj_size), allow_tf32, torch_products)
    elif _records(data, h0, c0, weights):
        y, hn, cn = _run_eager(mode, data, batch_sizes, h0, c0, weights, mask, bool(has_biases), num_layers,
                               bool(bidirectional), int(proj_size), allow_tf32, torch_products)
    else:  # no backward can follow: the kernels alone, without torch's registration
        y, hn, cn, _ = _forward_impl(mode, data, batch_sizes, h0, c0, weights, mask, bool(has_biases),
                                     num_layers, bool(bidirectional), int(proj_size), allow_tf32,
                                     torch_products, keep_reserve=False)
    return (y, hn, cn) if mode == "LSTM" else (y, hn)


def _records(data: torch.Tensor, h0: torch.Tensor, c0: Optional[torch.Tensor],
             weights: Sequence[torch.Tensor]) -> bool:
    """Whether autograd records this call: grad mode on and a tensor requires grad."""
    if not torch.is_grad_enabled():
        return False
    return data.requires_grad or h0.requires_grad or (c0 is not None and c0.requires_grad) or any(
        w.requires_grad for w in weights)
