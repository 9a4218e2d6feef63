"""CPU-side checks of seqpack's CUDA library (libseqpack_cuda.so, seqpack/cuda.h).

Needs no GPU, no CUDA toolkit and no built libseqpack_cuda.so:
  - the C header is plain C, and the tests' ctypes declarations of it
    (cuda_emulated.py) match it;
  - seqpack/_cuda.py, which finds the library, imports by file path and says
    why the kernels cannot run;
  - the library's kernels and host code, compiled with g++ against the CPU
    stand-in cuda/emulate/cuda_emulate.h (each block's threads as std::threads),
    give torch's packed LSTM/GRU/RNN outputs and gradients through the
    operators' C++ CUDA kernels (seqpack_torch/cuda_ops.cpp, registered for CPU
    tensors by the test library: cuda_emulated.py), with every variant of the
    library's policy; its C interface refuses bad values by name.
The operators' own semantics (the caller's order, padding, dropout's seed,
TorchScript, torch.compile, the layers' route and the choice between seqpack's
kernels and torch's) are test_cuda_cpp_ops.py's; the GPU's own results are
checked by test_cuda_gpu.py on a GPU machine.
"""
import ctypes
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = os.path.join(ROOT, "include", "seqpack", "cuda.h")
MODULE = os.path.join(ROOT, "python", "seqpack", "_cuda.py")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_emulated  # noqa: E402


def load_module(name="seqpack_cuda_find"):
    spec = importlib.util.spec_from_file_location(name, MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def header_functions():
    """{name: (return type, [parameter types])} of the header's declarations."""
    text = re.sub(r"/\*.*?\*/", "", open(HEADER).read(), flags=re.S)
    out = {}
    for ret, name, params in re.findall(r"^(int|const char\*)\s+(seqpack_cuda_\w+)\((.*?)\);", text, re.S | re.M):
        types = []
        for p in params.split(","):
            p = " ".join(p.split())
            if p in ("void", ""):
                continue
            # Drop the parameter name: the last identifier.
            types.append(re.sub(r"\s*\b\w+$", "", p).replace(" *", "*"))
        out[name] = (ret, types)
    return out


C_TO_CTYPES = {
    "int": ctypes.c_int,
    "int64_t": ctypes.c_int64,
    "size_t": ctypes.c_size_t,
    "const int64_t*": ctypes.POINTER(ctypes.c_int64),
    "size_t*": ctypes.POINTER(ctypes.c_size_t),
    "void*": ctypes.c_void_p,
    "const void*": ctypes.c_void_p,
    "const void* const*": ctypes.POINTER(ctypes.c_void_p),
    "void* const*": ctypes.POINTER(ctypes.c_void_p),
    "float*": ctypes.c_void_p,
    "const char*": ctypes.c_char_p,
}


def header_struct_fields(struct="seqpack_cuda_rnn_args"):
    """[(C type, name)] of the header's struct `struct`, in order."""
    text = re.sub(r"/\*.*?\*/", "", open(HEADER).read(), flags=re.S)
    body = re.search(rf"typedef struct {struct} \{{(.*?)\}} {struct};", text, re.S).group(1)
    fields = []
    for decl in body.split(";"):
        decl = " ".join(decl.split())
        if not decl:
            continue
        ctype, names = re.match(r"(.*?[\s*])(\w+(?:\[\d+\])?(?:, \*?\w+)*)$", decl).groups()
        for name in names.split(", "):
            stars = name.count("*")
            ctype_of = (ctype.strip() + "*" * stars).replace(" *", "*")
            array = re.match(r"(\w+)\[(\d+)\]$", name)
            if array:  # an array field: its element type and its length
                fields.append(((ctype_of, int(array.group(2))), array.group(1)))
            else:
                fields.append((ctype_of, name.lstrip("*")))
    return fields


@pytest.mark.parametrize("struct,ctype", [("seqpack_cuda_rnn_args", "RnnArgs"), ("seqpack_cuda_policy", "Policy")])
def test_header_and_ctypes_struct_agree(struct, ctype):
    module = cuda_emulated
    declared = header_struct_fields(struct)
    got = [(name, t) for name, t in getattr(module, ctype)._fields_]
    assert [n for _, n in declared] == [n for n, _ in got]
    for (ctype, name), (_, t) in zip(declared, got):
        if isinstance(ctype, tuple):  # element type, length
            assert issubclass(t, ctypes.Array) and t._length_ == ctype[1], (name, ctype, t)
            assert C_TO_CTYPES[ctype[0]] == t._type_, (name, ctype, t)
        else:
            assert C_TO_CTYPES[ctype] == t, (name, ctype, t)


def test_header_and_ctypes_signatures_agree():
    module = cuda_emulated
    types = dict(C_TO_CTYPES)
    types["const seqpack_cuda_rnn_args*"] = ctypes.POINTER(module.RnnArgs)
    types["const seqpack_cuda_policy*"] = types["seqpack_cuda_policy*"] = ctypes.POINTER(module.Policy)
    declared = header_functions()
    assert set(declared) == set(module.SIGNATURES), (sorted(declared), sorted(module.SIGNATURES))
    for name, (ret, params) in declared.items():
        restype, argtypes = module.SIGNATURES[name]
        assert types[ret] == restype, (name, ret, restype)
        expected = [types[p] for p in params]
        assert len(expected) == len(argtypes), (name, params, argtypes)
        for i, (want, got) in enumerate(zip(expected, argtypes)):
            assert want == got, f"{name} parameter {i}: header {params[i]}, ctypes {got}"


def test_header_enums_match_module():
    module = cuda_emulated
    text = open(HEADER).read()
    for mode, value in module.MODES.items():
        assert re.search(rf"SEQPACK_CUDA_{mode} = {value}\b", text), mode
    names = {torch.float32: "FLOAT32", torch.float16: "FLOAT16", torch.bfloat16: "BFLOAT16"}
    for dtype, value in module.DTYPES.items():
        assert re.search(rf"SEQPACK_CUDA_{names[dtype]} = {value}\b", text), dtype
    assert re.search(rf"SEQPACK_CUDA_ABI_VERSION {module.ABI_VERSION}\b", text)
    assert re.search(rf"SEQPACK_CUDA_POLICY_VERSION {module.POLICY_VERSION}\b", text)
    for prefix, values in (("KERNEL", module.KERNELS), ("GEMM", module.GEMMS), ("GATHER", module.GATHERS)):
        for name, value in values.items():
            assert re.search(rf"SEQPACK_CUDA_{prefix}_{name.upper()} = {value}\b", text), (prefix, name)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) to check the header with")
def test_header_is_plain_c(tmp_path):
    source = tmp_path / "use.c"
    source.write_text('#include "seqpack/cuda.h"\n'
                      "int (*f)(const seqpack_cuda_rnn_args*) = seqpack_cuda_rnn_forward;\n"
                      "int (*g)(const seqpack_cuda_rnn_args*) = seqpack_cuda_rnn_backward;\n"
                      "int (*s)(const seqpack_cuda_policy*) = seqpack_cuda_set_policy;\n"
                      "int main(void) { seqpack_cuda_rnn_args a = {0}; seqpack_cuda_policy p = {0};\n"
                      "  return f == 0 || g == 0 || s == 0 || a.rows || p.kernel; }\n")
    subprocess.run(["cc", "-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror", "-fsyntax-only",
                    "-I", os.path.join(ROOT, "include"), str(source)], check=True)


def test_imports_without_cuda_and_explains(monkeypatch, tmp_path):
    monkeypatch.setenv("SEQPACK_CUDA_LIBRARY", str(tmp_path / "missing" / "libseqpack_cuda.so"))
    # Imported by path, seqpack/__init__.py (and the CPU extension) is never run.
    before = set(sys.modules)
    module = load_module("seqpack_cuda_find_nolib")
    assert not any(m == "seqpack" or m.startswith("seqpack.") for m in set(sys.modules) - before)
    # The named library is the only one tried, even where another is built.
    assert module.available() is False
    reason = module.why_unavailable()
    assert "SEQPACK_CUDA_LIBRARY" in reason and "names no library file" in reason
    assert module.library_path() is None


@pytest.mark.parametrize("named", ["missing", "directory", "/dev/zero", "long"])
def test_named_library_that_cannot_load_is_the_reason(monkeypatch, tmp_path, named):
    # Issue 41, item 11: never skipped for another library; the same reason at every call.
    path = {"missing": str(tmp_path / "nope.so"), "directory": str(tmp_path),
            "/dev/zero": "/dev/zero", "long": "/" + "x" * 5000}[named]
    monkeypatch.setenv("SEQPACK_CUDA_LIBRARY", path)
    module = load_module(f"seqpack_cuda_find_named_{named.strip('/').replace('/', '_')}")
    for _ in range(2):
        assert module.available() is False
        reason = module.why_unavailable()
        assert "SEQPACK_CUDA_LIBRARY" in reason and path[:40] in reason, reason


# ---------------------------------------------------------------------------
# The library itself, run on the CPU through cuda/emulate/ and the operators'
# C++ kernels.

@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    return cuda_emulated.emulated(tmp_path_factory)


@pytest.fixture
def setenv(emulated, monkeypatch):
    """monkeypatch.setenv, then the library's policy installed from the
    environment (the C++ front end reads the SEQPACK_CUDA_* variables when it
    loads the library and at _cuda_install_policy, the library never; a bad
    value is refused there, by name); after the test, the policy of the
    environment as it was."""
    def set_variable(name, value):
        monkeypatch.setenv(name, value)
        emulated.install_policy()
    yield set_variable
    monkeypatch.undo()
    emulated.install_policy()


VF = {"LSTM": "lstm", "GRU": "gru", "RNN_TANH": "rnn_tanh", "RNN_RELU": "rnn_relu"}
MODULES = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU, "RNN_TANH": torch.nn.RNN, "RNN_RELU": torch.nn.RNN}


def _make(mode, input_size, hidden, layers, bidirectional, bias, proj, seed):
    torch.manual_seed(seed)
    kwargs = dict(num_layers=layers, bidirectional=bidirectional, bias=bias)
    if mode.startswith("RNN"):
        kwargs["nonlinearity"] = "tanh" if mode == "RNN_TANH" else "relu"
    if proj:
        kwargs["proj_size"] = proj
    return MODULES[mode](input_size, hidden, **kwargs)


def _reference(mode, data, bs, h0, c0, weights, bias, layers, bidirectional, mask=None):
    """torch._VF layer by layer (so that a dropout mask can be applied between layers)."""
    dirs = 2 if bidirectional else 1
    per = len(weights) // (layers * dirs)
    fn = getattr(torch._VF, VF[mode])
    x = data
    hns, cns = [], []
    for l in range(layers):
        if l > 0 and mask is not None:
            x = x * mask[l - 1]
        w = weights[l * dirs * per:(l + 1) * dirs * per]
        h = h0[l * dirs:(l + 1) * dirs]
        if mode == "LSTM":
            x, hn, cn = fn(x, bs, (h, c0[l * dirs:(l + 1) * dirs]), w, bias, 1, 0.0, False, bidirectional)
            cns.append(cn)
        else:
            x, hn = fn(x, bs, h, w, bias, 1, 0.0, False, bidirectional)
        hns.append(hn)
    return x, torch.cat(hns), (torch.cat(cns) if cns else None)


def _close(name, got, want, atol, rtol):
    assert got.shape == want.shape, (name, got.shape, want.shape)
    err = (got.double() - want.double()).abs()
    bound = atol + rtol * want.double().abs()
    if not bool((err <= bound).all()):
        i = int((err - bound).argmax())
        raise AssertionError(f"{name}: at flat index {i} got {got.flatten()[i].item()}, want "
                             f"{want.flatten()[i].item()} (max error {err.max().item():.3g})")


CASES = [
    # mode, layers, bidirectional, bias, proj, lengths, extra zero-length rows
    ("LSTM", 1, False, True, 0, [5, 3, 3, 1], 0),
    ("LSTM", 2, True, True, 0, [4, 4, 2, 1], 2),
    ("LSTM", 2, True, False, 0, [3, 1], 0),
    ("LSTM", 2, True, True, 3, [5, 2, 1], 1),
    ("LSTM", 1, False, True, 2, [1], 0),
    ("GRU", 1, False, True, 0, [5, 3, 3, 1], 1),
    ("GRU", 2, True, True, 0, [4, 2, 2], 0),
    ("GRU", 1, True, False, 0, [2, 2], 0),
    ("RNN_TANH", 2, True, True, 0, [4, 3, 1], 1),
    ("RNN_RELU", 1, False, True, 0, [3, 2, 2], 0),
    ("RNN_RELU", 2, True, False, 0, [2, 1], 0),
]


# The GEMM's 64-wide tile (the small cases above take the 32-wide one).
CASES_TILE_64 = [CASES[1], CASES[3], CASES[6], CASES[8]]


# (environment, whether torch runs the products that are not recurrent):
# None, torch's products and the library's recurrence (the default); "library",
# every product in the library (SEQPACK_CUDA_PRODUCTS=library), also with its
# GEMM's other tile; "persistent", the forward recurrence as one cooperative
# launch; "cluster", as one thread-block cluster (h gathered through the
# blocks' shared memory), of 4 blocks (the last without units: H = 5), of 3
# with every product in the library, of the default size (1 for H = 5), and
# of 4 exchanging h and the gates' gradients through global memory (what
# batches too large for the shared buffers take), and where W_hh's rows do not
# fit one cluster's blocks (the pretend GPU's shared memory cut to 90 bytes a
# block): the cooperative grid's forward and backward, a unit a block.
VARIANTS = {None: ({}, True), "library": ({}, False), "tile64": ({"SEQPACK_CUDA_GEMM_TILE": "64"}, False),
            "persistent": ({"SEQPACK_CUDA_KERNEL": "persistent"}, True),
            "cluster": ({"SEQPACK_CUDA_KERNEL": "cluster", "SEQPACK_CUDA_CLUSTER": "4"}, True),
            "cluster-library": ({"SEQPACK_CUDA_KERNEL": "cluster", "SEQPACK_CUDA_CLUSTER": "3"}, False),
            "cluster-one": ({"SEQPACK_CUDA_KERNEL": "cluster"}, True),
            "cluster-global": ({"SEQPACK_CUDA_KERNEL": "cluster", "SEQPACK_CUDA_CLUSTER": "4",
                                "SEQPACK_CUDA_CLUSTER_GATHER": "global"}, True),
            "cluster-cooperative": ({"SEQPACK_CUDA_KERNEL": "cluster", "SEQPACK_CUDA_EMULATE_SHARED_BYTES": "90"},
                                    True)}


@pytest.mark.parametrize("mode,layers,bidirectional,bias,proj,lengths,extra,variant",
                         [c + (None,) for c in CASES] + [c + ("library",) for c in CASES] +
                         [c + ("tile64",) for c in CASES_TILE_64] +
                         [c + ("persistent",) for c in CASES] +
                         [c + ("cluster",) for c in CASES] +
                         [c + ("cluster-library",) for c in CASES[:4]] +
                         [c + ("cluster-one",) for c in CASES[:2]] +
                         [c + ("cluster-global",) for c in CASES if c[4] == 0] +
                         [c + ("cluster-cooperative",) for c in CASES])
def test_emulated_library_matches_torch(emulated, setenv, mode, layers, bidirectional, bias, proj, lengths,
                                        extra, variant):
    environment, torch_products = VARIANTS[variant]
    for name, value in environment.items():
        setenv(name, value)
    input_size, hidden = 3, 5
    seed = 1234 + len(lengths) * 7 + layers
    rnn = _make(mode, input_size, hidden, layers, bidirectional, bias, proj, seed)
    dirs = 2 if bidirectional else 1
    hout = proj or hidden
    seqs = [torch.randn(n, input_size) for n in lengths]
    packed = torch.nn.utils.rnn.pack_sequence(seqs)
    data, bs = packed.data.detach(), packed.batch_sizes
    batch = len(lengths) + extra
    h0 = torch.randn(layers * dirs, batch, hout)
    c0 = torch.randn(layers * dirs, batch, hidden) if mode == "LSTM" else None
    weights = [w.detach().clone() for w in rnn._flat_weights]
    # Dropout between layers: the mask the kernels draw with the seed.
    dropout, mask = (0.4, emulated.mask(data, layers, dirs * hout, 0.4, seed)) if layers > 1 else (0.0, None)

    # The library, through the operators' autograd kernel.
    leaves = [t.clone().requires_grad_() for t in [data, h0] + ([c0] if c0 is not None else []) + weights]
    x_, h_ = leaves[0], leaves[1]
    c_ = leaves[2] if c0 is not None else None
    w_ = leaves[3 if c0 is not None else 2:]
    y, hn, cn = emulated.run(mode, x_, bs, h_, c_, w_, bias, layers, bidirectional, proj,
                             torch_products=torch_products, dropout=dropout, train=True, seed=seed)

    # torch, on the sequences of nonzero length.
    rleaves = [t.clone().requires_grad_() for t in [data, h0[:, :len(lengths)]] +
               ([c0[:, :len(lengths)]] if c0 is not None else []) + weights]
    rx, rh = rleaves[0], rleaves[1]
    rc = rleaves[2] if c0 is not None else None
    rw = rleaves[3 if c0 is not None else 2:]
    ry, rhn, rcn = _reference(mode, rx, bs, rh, rc, rw, bias, layers, bidirectional, mask)

    tol = dict(atol=2e-5, rtol=2e-4)
    _close("output", y, ry, **tol)
    _close("h_n", hn[:, :len(lengths)], rhn, **tol)
    assert torch.equal(hn[:, len(lengths):], h0[:, len(lengths):]), "zero-length sequences' h_n is not h0"
    if mode == "LSTM":
        _close("c_n", cn[:, :len(lengths)], rcn, **tol)
        assert torch.equal(cn[:, len(lengths):], c0[:, len(lengths):])

    torch.manual_seed(seed + 1)
    gy = torch.randn_like(ry)
    ghn = torch.randn_like(hn)
    gcn = torch.randn_like(cn) if mode == "LSTM" else None
    loss = (y * gy).sum() + (hn * ghn).sum() + ((cn * gcn).sum() if gcn is not None else 0)
    grads = torch.autograd.grad(loss, leaves)
    rloss = (ry * gy).sum() + (rhn * ghn[:, :len(lengths)]).sum() + (
        (rcn * gcn[:, :len(lengths)]).sum() if gcn is not None else 0)
    rgrads = torch.autograd.grad(rloss, rleaves, allow_unused=True)
    names = ["data", "h0"] + (["c0"] if c0 is not None else []) + [f"flat_weights[{i}]" for i in range(len(weights))]
    for name, g, r in zip(names, grads, rgrads):
        if name in ("h0", "c0"):
            _close("d" + name, g[:, :len(lengths)], r, **tol)
            # h_n = h0 for sequences of length zero: the gradient passes straight through.
            want = ghn if name == "h0" else gcn
            assert torch.equal(g[:, len(lengths):], want[:, len(lengths):]), name
        else:
            _close("d" + name, g, r if r is not None else torch.zeros_like(g), **tol)


@pytest.mark.parametrize("mode,layers,bidirectional,proj", [("LSTM", 2, True, 2), ("GRU", 1, False, 0),
                                                          ("RNN_TANH", 3, True, 0)])
@pytest.mark.parametrize("torch_products", [True, False])
def test_calls_without_a_graph_give_the_recorded_values(emulated, mode, layers, bidirectional, proj,
                                                        torch_products):
    """A call without a graph to record (no_grad, or nothing requires grad) runs
    the kernels below autograd, the workspace and one layer's reserve in one
    allocation; one with a graph to record goes through _rnn_train: the same
    values, torch's, and the backward works. h0 and c0 left out are zeros."""
    rnn = _make(mode, 3, 5, layers, bidirectional, True, proj, 77)
    packed = torch.nn.utils.rnn.pack_sequence([torch.randn(n, 3) for n in (6, 4, 4, 1)])
    dirs = 2 if bidirectional else 1
    h0 = torch.randn(layers * dirs, 4, proj or 5)
    c0 = torch.randn(layers * dirs, 4, 5) if mode == "LSTM" else None
    weights = [w.detach().clone() for w in rnn._flat_weights]

    def call(ws, h=h0, c=c0):
        return emulated.run(mode, packed.data, packed.batch_sizes, h, c, ws, True, layers, bidirectional, proj,
                            torch_products=torch_products)

    with torch.no_grad():
        direct = call(weights)
    direct_too = call(weights)  # grad mode on, nothing requires grad
    leaves = [w.clone().requires_grad_() for w in weights]
    recorded = call(leaves)
    want = _reference(mode, packed.data, packed.batch_sizes, h0, c0, weights, True, layers, bidirectional)
    for got in (direct, direct_too, recorded):
        _close("output", got[0].detach(), want[0], atol=2e-5, rtol=2e-4)
        _close("h_n", got[1].detach(), want[1], atol=2e-5, rtol=2e-4)
        assert torch.equal(got[0].detach(), direct[0]) and torch.equal(got[1].detach(), direct[1])
        if mode == "LSTM":
            _close("c_n", got[2].detach(), want[2], atol=2e-5, rtol=2e-4)
    grads = torch.autograd.grad(recorded[0].sum(), leaves)
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
    zeros = call(weights, torch.zeros_like(h0), torch.zeros_like(c0) if c0 is not None else None)
    for a, b in zip(call(weights, None, None), zeros):
        assert (a is None and b is None) or torch.equal(a, b)


@pytest.mark.parametrize("dtype,eps", [(torch.bfloat16, 2.0 ** -8), (torch.float16, 2.0 ** -11)])
@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
@pytest.mark.parametrize("torch_products,kernel", [(True, ""), (False, ""), (True, "cluster")])
def test_emulated_half_precision_close_to_float32(emulated, setenv, mode, dtype, eps, torch_products, kernel):
    setenv("SEQPACK_CUDA_KERNEL", kernel)
    setenv("SEQPACK_CUDA_CLUSTER", "2" if kernel else "")
    if torch_products:
        try:  # torch's products on the CPU tensors the emulation runs on
            torch.mm(torch.ones(1, 1, dtype=dtype), torch.ones(1, 1, dtype=dtype))
        except RuntimeError as e:
            pytest.skip(f"this torch has no CPU matrix product in {dtype}: {e}")
    rnn = _make(mode, 4, 6, 2, True, True, 0, 99)
    seqs = [torch.randn(n, 4) for n in (6, 4, 1)]
    packed = torch.nn.utils.rnn.pack_sequence(seqs)
    h0 = torch.randn(4, 3, 6) * 0.5
    c0 = torch.randn(4, 3, 6) * 0.5 if mode == "LSTM" else None
    w32 = [w.detach() for w in rnn._flat_weights]
    # Both runs use the data type's values, so the difference is the arithmetic alone.
    cast = [t.to(dtype) for t in [packed.data, h0] + w32 + ([c0] if c0 is not None else [])]
    x, h, *rest = cast
    w, c = (rest[:-1], rest[-1]) if c0 is not None else (rest, None)
    with torch.no_grad():
        y16, hn16, _ = emulated.run(mode, x, packed.batch_sizes, h, c, w, True, 2, True,
                                    torch_products=torch_products)
        y32, hn32, _ = emulated.run(mode, x.float(), packed.batch_sizes, h.float(),
                                    c.float() if c is not None else None, [t.float() for t in w], True, 2, True,
                                    torch_products=torch_products)
    # h is rounded to the data type at each step: a few ulps, growing slowly with T.
    _close("output", y16.float(), y32, atol=16 * eps, rtol=16 * eps)
    _close("h_n", hn16.float(), hn32, atol=16 * eps, rtol=16 * eps)


def test_emulated_library_reports_bad_values(emulated):
    lib = emulated.lib
    bs = (ctypes.c_int64 * 3)(3, 4, 1)
    a = cuda_emulated.RnnArgs(mode=0, dtype=0, rows=8, steps=3, batch_sizes=bs, batch=4, input_size=2, hidden_size=2,
                         num_layers=1, has_biases=1)
    assert lib.seqpack_cuda_rnn_forward(ctypes.byref(a)) == 1
    assert lib.seqpack_cuda_last_error() == b"seqpack_cuda: batch_sizes[1] = 4 exceeds batch_sizes[0] = 3 " \
                                            b"(they must not increase)"
    bs[1] = 2
    a.rows = 7  # 3 + 2 + 1 = 6
    assert lib.seqpack_cuda_rnn_forward(ctypes.byref(a)) == 1
    assert lib.seqpack_cuda_last_error() == b"seqpack_cuda: sum(batch_sizes) = 6 differs from the 7 rows of x"
    assert lib.seqpack_cuda_rnn_backward(ctypes.byref(a)) == 1
    assert lib.seqpack_cuda_last_error() == b"seqpack_cuda: sum(batch_sizes) = 6 differs from the 7 rows of x"
    assert lib.seqpack_cuda_rnn_forward(None) == 1
    assert b"args" in lib.seqpack_cuda_last_error()
    ws, rs = ctypes.c_size_t(), ctypes.c_size_t()
    assert lib.seqpack_cuda_rnn_buffer_sizes(1, 0, 10, 2, 3, 4, 2, 1, 0, ctypes.byref(ws), ctypes.byref(rs)) == 1
    assert b"proj_size = 2 is for LSTM only, not GRU" in lib.seqpack_cuda_last_error()
    # The reserve is linear in the rows (the fake tensor of torch.compile relies on it).
    one, ten = ctypes.c_size_t(), ctypes.c_size_t()
    assert lib.seqpack_cuda_rnn_buffer_sizes(0, 2, 1, 2, 3, 4, 2, 3, 1, ctypes.byref(ws), ctypes.byref(one)) == 0
    assert lib.seqpack_cuda_rnn_buffer_sizes(0, 2, 10, 2, 3, 4, 2, 3, 1, ctypes.byref(ws), ctypes.byref(ten)) == 0
    assert ten.value == 10 * one.value


def test_emulated_caller_products_refuse_bad_buffers(emulated):
    """caller_products = 1 (one layer, the products that are not recurrent the
    caller's): every buffer the pass needs is required, and one given that it
    would neither read nor write is refused by name, never ignored."""
    lib = emulated.lib
    H, rows, B = 3, 5, 2
    bs = torch.tensor([2, 2, 1])
    weights = [torch.randn(4 * H, 2), torch.randn(4 * H, H), torch.randn(4 * H), torch.randn(4 * H)]
    # Buffers of two layers: enough for the call that asks for two.
    ws_bytes, rs_bytes = emulated.buffer_sizes("LSTM", torch.float32, rows, B, 2, H, 0, 2, False)
    workspace, reserve = torch.empty(ws_bytes, dtype=torch.uint8), torch.empty(rs_bytes, dtype=torch.uint8)
    h0, c0 = torch.zeros(1, B, H), torch.zeros(1, B, H)
    y, hn, cn = torch.empty(rows, H), torch.empty(1, B, H), torch.empty(1, B, H)
    gates, spare = torch.randn(rows, 4 * H), torch.empty(rows, 4 * H)

    def call(backward=False, layer_weights=weights, **fields):
        a = cuda_emulated.RnnArgs(mode=0, dtype=0, has_biases=1, caller_products=1, rows=rows, steps=bs.numel(),
                                  batch_sizes=ctypes.cast(bs.data_ptr(), ctypes.POINTER(ctypes.c_int64)), batch=B,
                                  hidden_size=H, num_layers=1)
        w = (ctypes.c_void_p * len(layer_weights))(*[t.data_ptr() for t in layer_weights])
        a.weights = ctypes.cast(w, ctypes.POINTER(ctypes.c_void_p))
        a.input_size, a.h0, a.c0 = 2, h0.data_ptr(), c0.data_ptr()
        a.workspace, a.workspace_bytes, a.reserve, a.reserve_bytes = ws_ptr, ws_bytes, rs_ptr, rs_bytes
        a.y, a.hn, a.cn = y.data_ptr(), hn.data_ptr(), cn.data_ptr()
        a.dh0, a.dc0 = spare.data_ptr(), spare.data_ptr()
        if backward:
            a.dgates_x[0], a.hprev[0] = spare.data_ptr(), spare.data_ptr()
        else:
            a.input_gates[0] = gates.data_ptr()
        for name, value in fields.items():
            if isinstance(value, tuple):
                getattr(a, name)[value[0]] = value[1]
            else:
                setattr(a, name, value)
        run = lib.seqpack_cuda_rnn_backward if backward else lib.seqpack_cuda_rnn_forward
        status = run(ctypes.byref(a))
        return status, lib.seqpack_cuda_last_error().decode()

    ws_ptr, rs_ptr = workspace.data_ptr(), reserve.data_ptr()
    assert call() == (0, "")
    assert call(backward=True) == (0, "")
    p = spare.data_ptr()
    assert call(caller_products=2) == (1, "seqpack_cuda: caller_products = 2 is not 0 or 1")
    assert call(allow_tf32=-1) == (1, "seqpack_cuda: allow_tf32 = -1 is not 0 or 1")
    assert call(True, allow_tf32=2) == (1, "seqpack_cuda: allow_tf32 = 2 is not 0 or 1")
    assert call(allow_tf32=1) == (0, "")
    assert call(num_layers=2, layer_weights=weights * 2) == (
        1, "seqpack_cuda: caller_products = 1 runs one layer, not num_layers = 2")
    assert call(input_gates=(0, None)) == (1, "seqpack_cuda: input_gates[0] is NULL (caller_products = 1)")
    assert call(input_gates=(1, p)) == (
        1, "seqpack_cuda: input_gates[1] is given, but the layer has one direction")
    assert call(caller_products=0, x=p) == (
        1, "seqpack_cuda: input_gates[0] is given, but caller_products = 0")
    assert call(True, hprev=(0, None)) == (1, "seqpack_cuda: hprev[0] is NULL (caller_products = 1)")
    assert call(True, dgates_x=(0, None)) == (1, "seqpack_cuda: dgates_x[0] is NULL (caller_products = 1)")
    assert call(True, dgates_h=(0, p)) == (
        1, "seqpack_cuda: dgates_h[0] is given, but only a GRU's differs from dgates_x (pass NULL)")
    assert call(True, dh=(0, p)) == (1, "seqpack_cuda: dh[0] is given, but the layer has no projection")
    assert call(True, m=(0, p)) == (1, "seqpack_cuda: m[0] is given, but the layer has no projection")
    # Each pass reads only its own fields: the forward's input_gates left in a
    # struct reused for the backward are not an error.
    assert call(True, input_gates=(0, gates.data_ptr())) == (0, "")


def test_products_setting_is_checked(emulated, monkeypatch):
    """SEQPACK_CUDA_PRODUCTS is read at every call: a value that means nothing is
    refused by name."""
    rnn = _make("GRU", 3, 4, 1, False, True, 0, 3)
    packed = torch.nn.utils.rnn.pack_sequence([torch.randn(n, 3) for n in (3, 2)])
    args = (packed.data, packed.batch_sizes, None, None, None, None, list(rnn._flat_weights), "GRU", 4, 1, True,
            False, 0, 0.0, False, None, "fp32")
    monkeypatch.setenv("SEQPACK_CUDA_PRODUCTS", "cublas")
    with pytest.raises(ValueError, match=r"SEQPACK_CUDA_PRODUCTS = 'cublas' is not 'torch' or 'library'"):
        emulated.ops.rnn(*args)
    for value in ("", "torch", "library"):
        monkeypatch.setenv("SEQPACK_CUDA_PRODUCTS", value)
        emulated.ops.rnn(*args)


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_emulated_double_backward_is_refused_when_asked_for(emulated, mode):
    """The kernels' backward is not differentiable: a gradient taken with
    create_graph=True has the kernels' values, and differentiating it raises a
    clear error (as cuDNN's RNN does) instead of counting the RNN's second
    derivatives as zero beside another term that is differentiable."""
    rnn = _make(mode, 3, 4, 2, True, True, 0, 21)
    torch.manual_seed(22)
    packed = torch.nn.utils.rnn.pack_sequence([torch.randn(n, 3) for n in (3, 2, 1)])
    h0 = torch.randn(4, 4, 4)  # one sequence of length zero
    c0 = torch.randn(4, 4, 4) if mode == "LSTM" else None
    gy = torch.randn(packed.data.shape[0], 8)

    def first(create_graph):
        x = packed.data.clone().requires_grad_()
        w = [t.detach().clone().requires_grad_() for t in rnn._flat_weights]
        y, _, _ = emulated.run(mode, x, packed.batch_sizes, h0, c0, w, True, 2, True)
        grads = torch.autograd.grad((y * gy).pow(2).sum(), [x] + w, create_graph=create_graph)
        return w, grads

    _, plain = first(False)
    w, graph = first(True)
    for name, a, b in zip(["data"] + [f"flat_weights[{i}]" for i in range(len(w))], graph, plain):
        assert a.requires_grad, name
        # The same kernels on the same values: the graph changes nothing in them.
        assert torch.equal(a.detach(), b), name
    penalty = graph[0].norm() + w[0].pow(2).sum()
    with pytest.raises(RuntimeError, match=r"seqpack CUDA: double backward \(.*create_graph=True\).* is not "
                                           "supported"):
        torch.autograd.grad(penalty, w[0])


@pytest.mark.parametrize("mode,proj,dtype,eps", [
    ("LSTM", 0, torch.bfloat16, 2.0 ** -8), ("LSTM", 4, torch.float16, 2.0 ** -11),
    ("GRU", 0, torch.float16, 2.0 ** -11), ("RNN_TANH", 0, torch.bfloat16, 2.0 ** -8)])
def test_emulated_wmma_matches_simt(emulated, setenv, mode, proj, dtype, eps):
    """SEQPACK_CUDA_GEMM=wmma (tensor cores) against the SIMT GEMM, forward and backward.

    The wmma path rounds float32 operands (gate gradients, LSTM's m) to the data
    type before the product, hence a tolerance of a few eps of the largest value."""
    rnn = _make(mode, 5, 20, 2, True, True, proj, 7)
    torch.manual_seed(8)
    seqs = [torch.randn(n, 5) for n in (17, 17, 16, 16)]  # 66 rows: two 64-row tiles
    packed = torch.nn.utils.rnn.pack_sequence(seqs)
    hout = proj or 20
    h0 = torch.randn(4, 5, hout).to(dtype)  # one sequence of length zero
    c0 = torch.randn(4, 5, 20).to(dtype) if mode == "LSTM" else None
    weights = [w.detach().to(dtype) for w in rnn._flat_weights]
    x = packed.data.to(dtype)
    gy = torch.randn(x.shape[0], 2 * hout).to(dtype)

    # Every product in the library (SEQPACK_CUDA_PRODUCTS=library): its GEMM is what differs.
    simt = _library_run(emulated, mode, x, packed.batch_sizes, h0, c0, weights, proj, gy)
    setenv("SEQPACK_CUDA_GEMM", "wmma")
    wmma = _library_run(emulated, mode, x, packed.batch_sizes, h0, c0, weights, proj, gy)
    _close_within_eps(wmma, simt, eps)


def _library_run(emulated, mode, x, batch_sizes, h0, c0, weights, proj, gy):
    """A 2-layer bidirectional forward with every product in the library, then the
    gradients of (y gy) + h_n + c_n: [y, h_n, every input's gradient]."""
    leaves = [t.clone().requires_grad_() for t in [x, h0] + weights]
    c = c0.clone().requires_grad_() if c0 is not None else None
    y, hn, cn = emulated.run(mode, leaves[0], batch_sizes, leaves[1], c, leaves[2:], True, 2, True, proj,
                             torch_products=False)
    loss = (y.float() * gy.float()).sum() + hn.float().sum() + (cn.float().sum() if c is not None else 0)
    grads = torch.autograd.grad(loss, leaves + ([c] if c is not None else []))
    return [y, hn] + list(grads)


def _close_within_eps(got, want, eps):
    """Two runs of 16-bit data that differ in summation order: a few eps of each
    result's largest value (h's rounding to the data type carries the difference)."""
    for i, (a, b) in enumerate(zip(got, want)):
        scale = float(b.float().abs().max()) + 1e-3
        _close(f"result {i}", a.float(), b.float(), atol=16 * eps * scale, rtol=16 * eps)


@pytest.mark.parametrize("name,value,message", [
    ("SEQPACK_CUDA_CLUSTER", v, f"SEQPACK_CUDA_CLUSTER = '{v}' is not a block count from 1 to 16")
    for v in ("0", "17", "four", "2x")] + [
    ("SEQPACK_CUDA_CLUSTER_GATHER", "dsmem", "SEQPACK_CUDA_CLUSTER_GATHER = 'dsmem' is not 'shared' or 'global'"),
    ("SEQPACK_CUDA_CLUSTER_MMA", "yes", "SEQPACK_CUDA_CLUSTER_MMA = 'yes' is not 0 or 1")])
def test_cluster_settings_are_checked(emulated, setenv, name, value, message):
    setenv("SEQPACK_CUDA_KERNEL", "cluster")
    with pytest.raises(ValueError, match=message):
        setenv(name, value)


@pytest.mark.parametrize("mode,dtype,eps,cluster", [
    ("LSTM", torch.bfloat16, 2.0 ** -8, "2"), ("GRU", torch.float16, 2.0 ** -11, "4"),
    ("RNN_TANH", torch.bfloat16, 2.0 ** -8, "4")])
def test_emulated_cluster_tensor_cores_match_the_threads_products(emulated, setenv, mode, dtype, eps, cluster):
    """The cluster kernels' step products on tensor cores (16-bit data, H a
    multiple of 16: the forward's h_{t-1} W_hh^T, the backward's carry
    dG_h W_hh with dG_h rounded to the data type) against the threads' own
    float32 products (SEQPACK_CUDA_CLUSTER_MMA=0), forward and backward: the
    same values but for the summation order and dG_h's rounding, differences
    that h's rounding to the data type can carry, hence a few eps of the
    largest value. Clusters of 2 and 4 blocks: units of 16 and 8 (GRU's 24 gate
    rows padded to 32); a sequence of length zero; batch 6, padded to 16 rows."""
    setenv("SEQPACK_CUDA_KERNEL", "cluster")
    setenv("SEQPACK_CUDA_CLUSTER", cluster)
    rnn = _make(mode, 5, 32, 2, True, True, 0, 11)
    torch.manual_seed(12)
    seqs = [torch.randn(n, 5) for n in (9, 7, 7, 3, 1)]
    packed = torch.nn.utils.rnn.pack_sequence(seqs)
    h0 = (torch.randn(4, 6, 32) * 0.5).to(dtype)
    c0 = (torch.randn(4, 6, 32) * 0.5).to(dtype) if mode == "LSTM" else None
    weights = [w.detach().to(dtype) for w in rnn._flat_weights]
    x = packed.data.to(dtype)
    gy = torch.randn(x.shape[0], 64).to(dtype)

    setenv("SEQPACK_CUDA_CLUSTER_MMA", "0")
    threads = _library_run(emulated, mode, x, packed.batch_sizes, h0, c0, weights, 0, gy)
    setenv("SEQPACK_CUDA_CLUSTER_MMA", "1")
    cores = _library_run(emulated, mode, x, packed.batch_sizes, h0, c0, weights, 0, gy)
    _close_within_eps(cores, threads, eps)


@pytest.mark.parametrize("mode,lengths", [("LSTM", (3, 2, 2, 1)), ("GRU", (4, 4, 1)), ("RNN_TANH", (2, 1))])
def test_emulated_cluster_3xtf32_matches_torch_float32(emulated, setenv, mode, lengths):
    """float32 with TF32 allowed (torch.backends.cuda.matmul.allow_tf32): the
    cluster kernels' step products on tensor cores as 3xTF32, forward and
    backward, against torch._VF in float32 within float32's bound (the emulated
    tensor cores read only TF32's bits of each operand, as the GPU's do: one
    TF32 product instead of three exceeds it). H = 32 in clusters
    of 2 (16 units a block; the GRU's 48 gate rows, the LSTM's 64), both
    directions, a sequence of length zero (batch 5)."""
    setenv("SEQPACK_CUDA_KERNEL", "cluster")
    setenv("SEQPACK_CUDA_CLUSTER", "2")
    rnn = _make(mode, 5, 32, 1, True, True, 0, 31)
    torch.manual_seed(32)
    seqs = [torch.randn(n, 5) for n in lengths]
    packed = torch.nn.utils.rnn.pack_sequence(seqs)
    batch = len(lengths) + 1
    h0 = torch.randn(2, batch, 32)
    c0 = torch.randn(2, batch, 32) if mode == "LSTM" else None
    weights = [w.detach().clone() for w in rnn._flat_weights]
    states = [h0] + ([c0] if c0 is not None else [])
    leaves = [t.clone().requires_grad_() for t in [packed.data] + states + weights]
    c = leaves[2] if c0 is not None else None
    w = leaves[len(states) + 1:]
    y, hn, cn = emulated.run(mode, leaves[0], packed.batch_sizes, leaves[1], c, w, True, 1, True, 0,
                             allow_tf32=True)
    gy, ghn = torch.randn_like(y), torch.randn_like(hn)
    loss = (y * gy).sum() + (hn * ghn).sum() + (cn.sum() if cn is not None else 0)
    got = [y, hn[:, :len(lengths)]] + list(torch.autograd.grad(loss, leaves))

    k = len(lengths)
    rleaves = [t.clone().requires_grad_() for t in [packed.data] + [x[:, :k] for x in states] + weights]
    fn = {"LSTM": torch._VF.lstm, "GRU": torch._VF.gru, "RNN_TANH": torch._VF.rnn_tanh}[mode]
    rs = (rleaves[1], rleaves[2]) if mode == "LSTM" else rleaves[1]
    out = fn(rleaves[0], packed.batch_sizes, rs, rleaves[len(states) + 1:], True, 1, 0.0, False, True)
    ry, rhn = out[0], out[1]
    rloss = (ry * gy).sum() + (rhn * ghn[:, :k]).sum() + (out[2].sum() if mode == "LSTM" else 0)
    rgrads = list(torch.autograd.grad(rloss, rleaves))
    got[3:len(states) + 3] = [g[:, :k] for g in got[3:len(states) + 3]]
    want = [ry, rhn] + rgrads
    from tolerance import assert_fp_close, rnn_reduction_length
    n = rnn_reduction_length(5, 32, 1, True, steps=sum(lengths))
    for i, (a, b) in enumerate(zip(got, want)):
        assert_fp_close(a, b, n, what=f"result {i}")


def test_emulated_relu_keeps_nan_as_torch(emulated):
    """The cells' formulas are the CPU's (seqpack/detail/gate_math.h): relu of a
    NaN is NaN, as torch.relu (fmaxf would make it 0), and its gradient is
    torch's threshold_backward."""
    rnn = _make("RNN_RELU", 3, 4, 1, False, True, 0, 41)
    seqs = [torch.randn(3, 3), torch.randn(2, 3)]
    seqs[1][0, 1] = float("nan")
    packed = torch.nn.utils.rnn.pack_sequence(seqs)
    h0 = torch.zeros(1, 2, 4)
    weights = [w.detach().clone() for w in rnn._flat_weights]
    y, hn, _ = emulated.run("RNN_RELU", packed.data, packed.batch_sizes, h0, None, weights, True, 1, False)
    ry, rhn = torch._VF.rnn_relu(packed.data, packed.batch_sizes, h0, weights, True, 1, 0.0, False, False)
    assert torch.equal(torch.isnan(y), torch.isnan(ry)) and bool(torch.isnan(ry).any())
    assert torch.equal(torch.isnan(hn), torch.isnan(rhn))
    from tolerance import assert_fp_close, rnn_reduction_length
    ok = ~torch.isnan(ry)
    assert_fp_close(y[ok], ry[ok], rnn_reduction_length(3, 4, steps=5), what="output")


@pytest.mark.parametrize("kernel,torch_products,proj,expected", [
    # A cluster of 4 blocks a direction (H = 8: 2 units a block), both
    # directions in one launch of 8 blocks, forward and backward.
    ("cluster", True, 0, [(8, 4), (8, 4), (8, 4), (8, 4)]),
    # Every product in the library: its backward shares the gates' gradient
    # buffers between the directions, so one launch a direction there.
    ("cluster", False, 0, [(8, 4), (8, 4), (4, 4), (4, 4), (4, 4), (4, 4)]),
    # A cooperative grid: a unit a block, 8 blocks a direction.
    ("persistent", True, 0, [(16, 0), (16, 0), (16, 0), (16, 0)]),
    # A projection to 3 columns (a block's: 1; with a cooperative grid's 8
    # blocks, the last 5 own none).
    ("cluster", True, 3, [(8, 4), (8, 4), (8, 4), (8, 4)]),
    ("persistent", True, 3, [(16, 0), (16, 0), (16, 0), (16, 0)]),
])
def test_emulated_one_launch_runs_both_directions(emulated, setenv, kernel, torch_products, proj, expected):
    """SEQPACK_CUDA_KERNEL=cluster or persistent runs a bidirectional layer's two
    recurrences in one launch (each direction on its own blocks) where their
    buffers are apart, with or without a projection, and the results match
    torch._VF (2 layers: the forward launches of both, then the backward's from
    the top)."""
    setenv("SEQPACK_CUDA_KERNEL", kernel)
    setenv("SEQPACK_CUDA_CLUSTER", "4")
    rnn = _make("LSTM", 3, 8, 2, True, True, proj, 21)
    torch.manual_seed(22)
    seqs = [torch.randn(n, 3) for n in (6, 4, 4, 1)]
    packed = torch.nn.utils.rnn.pack_sequence(seqs)
    h0, c0 = torch.randn(4, 4, proj or 8), torch.randn(4, 4, 8)
    weights = [w.detach().clone() for w in rnn._flat_weights]
    leaves = [t.clone().requires_grad_() for t in [packed.data, h0, c0] + weights]
    emulated.grid_launches()
    y, hn, cn = emulated.run("LSTM", leaves[0], packed.batch_sizes, leaves[1], leaves[2], leaves[3:], True, 2, True,
                             proj, torch_products=torch_products)
    gy = torch.randn_like(y)
    got = [y, hn, cn] + list(torch.autograd.grad((y * gy).sum() + hn.sum() + cn.sum(), leaves))
    assert emulated.grid_launches() == expected

    rleaves = [t.clone().requires_grad_() for t in [packed.data, h0, c0] + weights]
    ry, rhn, rcn = torch._VF.lstm(rleaves[0], packed.batch_sizes, (rleaves[1], rleaves[2]), rleaves[3:], True, 2,
                                  0.0, False, True)
    want = [ry, rhn, rcn] + list(torch.autograd.grad((ry * gy).sum() + rhn.sum() + rcn.sum(), rleaves))
    from tolerance import assert_fp_close, rnn_reduction_length
    n = rnn_reduction_length(3, 8, 2, True, steps=sum(len(x) for x in seqs), proj_size=proj)
    for i, (a, b) in enumerate(zip(got, want)):
        assert_fp_close(a, b, n, what=f"result {i}")


# ---- the library's policy (seqpack_cuda_policy): built by the C++ front end
# (cuda_ops.cpp) from the SEQPACK_CUDA_* variables, checked and held by the
# library, which reads no environment.

POLICY_VARIABLES = ("SEQPACK_CUDA_KERNEL", "SEQPACK_CUDA_GEMM", "SEQPACK_CUDA_GEMM_TILE", "SEQPACK_CUDA_CLUSTER",
                    "SEQPACK_CUDA_CLUSTER_GATHER", "SEQPACK_CUDA_CLUSTER_MMA")
# (variables, the record's fields other than the defaults)
POLICY_ENVIRONMENTS = [
    ({}, {}),
    ({name: "" for name in POLICY_VARIABLES}, {}),  # empty: unset
    ({"SEQPACK_CUDA_KERNEL": "simple", "SEQPACK_CUDA_GEMM": "simt", "SEQPACK_CUDA_CLUSTER_GATHER": "shared",
      "SEQPACK_CUDA_CLUSTER_MMA": "1"}, {}),  # the defaults by name
    ({"SEQPACK_CUDA_KERNEL": "cluster", "SEQPACK_CUDA_CLUSTER": "4", "SEQPACK_CUDA_CLUSTER_GATHER": "global",
      "SEQPACK_CUDA_CLUSTER_MMA": "0", "SEQPACK_CUDA_GEMM": "wmma", "SEQPACK_CUDA_GEMM_TILE": "32"},
     {"kernel": 2, "cluster_size": 4, "cluster_gather": 1, "cluster_mma": 0, "gemm": 1, "gemm_tile": 32}),
    ({"SEQPACK_CUDA_KERNEL": "persistent", "SEQPACK_CUDA_GEMM_TILE": "64", "SEQPACK_CUDA_CLUSTER": " +16"},
     {"kernel": 1, "gemm_tile": 64, "cluster_size": 16}),
    ({"SEQPACK_CUDA_CLUSTER": "1"}, {"cluster_size": 1}),
]
POLICY_DEFAULTS = {"version": 1, "kernel": 0, "gemm": 0, "gemm_tile": 0, "cluster_size": 0, "cluster_gather": 0,
                   "cluster_mma": 1, "tf32": 1}
# (variable, value, the message naming them)
BAD_ENVIRONMENTS = [
    ("SEQPACK_CUDA_KERNEL", "fast", "SEQPACK_CUDA_KERNEL = 'fast' is not 'simple', 'persistent' or 'cluster'"),
    ("SEQPACK_CUDA_GEMM", "tensor", "SEQPACK_CUDA_GEMM = 'tensor' is not 'simt' or 'wmma'"),
    ("SEQPACK_CUDA_GEMM_TILE", "16", "SEQPACK_CUDA_GEMM_TILE = '16' is not 32 or 64"),
    ("SEQPACK_CUDA_GEMM_TILE", "0", "SEQPACK_CUDA_GEMM_TILE = '0' is not 32 or 64"),
    ("SEQPACK_CUDA_CLUSTER_GATHER", "dsmem", "SEQPACK_CUDA_CLUSTER_GATHER = 'dsmem' is not 'shared' or 'global'"),
    ("SEQPACK_CUDA_CLUSTER_MMA", "yes", "SEQPACK_CUDA_CLUSTER_MMA = 'yes' is not 0 or 1"),
] + [("SEQPACK_CUDA_CLUSTER", v, f"SEQPACK_CUDA_CLUSTER = '{v}' is not a block count from 1 to 16")
     for v in ("0", "17", "four", "2x", "4 ", " ", "0x4", "-2")]


@pytest.mark.parametrize("environ,fields", POLICY_ENVIRONMENTS)
def test_policy_from_environment(emulated, monkeypatch, environ, fields):
    for name in POLICY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    expected = dict(POLICY_DEFAULTS, **fields)
    assert list(emulated.ops._cuda_policy_from_environment()) == list(expected.values())


@pytest.mark.parametrize("name,value,message", BAD_ENVIRONMENTS)
def test_policy_from_environment_refuses_a_bad_value_by_name(emulated, monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=re.escape("seqpack CUDA: " + message)):
        emulated.ops._cuda_policy_from_environment()


def test_front_end_installs_its_policy(emulated, monkeypatch):
    """The operators installed the environment's policy in the library they
    loaded, and install it again when asked (_cuda_install_policy)."""
    assert list(emulated.installed_policy().values()) == list(emulated.ops._cuda_policy_from_environment())
    try:
        monkeypatch.setenv("SEQPACK_CUDA_KERNEL", "cluster")
        assert emulated.install_policy()["kernel"] == 2 == emulated.installed_policy()["kernel"]
    finally:
        monkeypatch.undo()
        emulated.install_policy()


BAD_POLICIES = [
    ("version", 2, "policy.version = 2 is not SEQPACK_CUDA_POLICY_VERSION (1)"),
    ("kernel", 3, "policy.kernel = 3 is not simple (0), persistent (1) or cluster (2)"),
    ("kernel", -1, "policy.kernel = -1 is not simple (0), persistent (1) or cluster (2)"),
    ("gemm", 2, "policy.gemm = 2 is not simt (0) or wmma (1)"),
    ("gemm_tile", 16, "policy.gemm_tile = 16 is not 0 (chosen per product), 32 or 64"),
    ("cluster_size", 17, "policy.cluster_size = 17 is not 0 (chosen from H) or a block count from 1 to 16"),
    ("cluster_size", -1, "policy.cluster_size = -1 is not 0 (chosen from H) or a block count from 1 to 16"),
    ("cluster_gather", 2, "policy.cluster_gather = 2 is not shared (0) or global (1)"),
    ("cluster_mma", 2, "policy.cluster_mma = 2 is not 0 or 1"),
    ("tf32", -1, "policy.tf32 = -1 is not 0 or 1"),
]


@pytest.mark.parametrize("field,value,message", BAD_POLICIES)
def test_library_refuses_a_bad_policy_value_by_name(emulated, field, value, message):
    """seqpack_cuda_set_policy checks every field: a value out of range is
    SEQPACK_CUDA_INVALID_ARGUMENT with a message naming the field and the value,
    and the policy installed stays (a good change beside the bad one too)."""
    lib = emulated.lib
    before = emulated.installed_policy()
    p = cuda_emulated.Policy.of(emulated.ops._cuda_policy_from_environment())
    p.kernel = 2
    setattr(p, field, value)
    assert lib.seqpack_cuda_set_policy(ctypes.byref(p)) == 1
    assert lib.seqpack_cuda_last_error().decode() == "seqpack_cuda: " + message
    assert emulated.installed_policy() == before
    assert lib.seqpack_cuda_set_policy(None) == 1
    assert lib.seqpack_cuda_last_error().decode() == "seqpack_cuda: policy is NULL"


def test_library_defaults_are_the_unset_variables(emulated, tmp_path):
    """A library no front end has given a policy holds the one the unset
    variables mean."""
    copy = tmp_path / "libseqpack_cuda.so"  # another file: another copy of the library's state
    shutil.copyfile(emulated.path, copy)
    lib = cuda_emulated.bind(ctypes.CDLL(str(copy)))
    p = cuda_emulated.Policy()
    assert lib.seqpack_cuda_get_policy(ctypes.byref(p)) == 0
    assert p.as_dict() == POLICY_DEFAULTS


def test_library_sources_read_no_environment():
    """No source of the library (cuda/src/) reads the environment: its policy is
    the front ends' to install."""
    sources = os.path.join(ROOT, "cuda", "src")
    for name in sorted(os.listdir(sources)):
        text = open(os.path.join(sources, name)).read()
        for word in ("getenv", "environ", "secure_getenv"):
            assert word not in text, f"cuda/src/{name} has {word}"


def test_library_reads_no_environment(emulated, monkeypatch):
    """The policy installed runs, whatever the variables say after it: with
    clusters of 4 installed, SEQPACK_CUDA_KERNEL=persistent, another cluster size
    and values that mean nothing change no launch and raise nothing, until the
    front end installs them again (_cuda_install_policy), which refuses the bad
    value by name."""
    emulated.set_policy(kernel=2, cluster_size=4)
    policy = emulated.installed_policy()
    try:
        for name, value in {"SEQPACK_CUDA_KERNEL": "persistent", "SEQPACK_CUDA_CLUSTER": "2",
                            "SEQPACK_CUDA_CLUSTER_GATHER": "nowhere", "SEQPACK_CUDA_GEMM_TILE": "16",
                            "SEQPACK_CUDA_CLUSTER_MMA": "maybe"}.items():
            monkeypatch.setenv(name, value)
        rnn = _make("LSTM", 3, 8, 1, True, True, 0, 41)
        packed = torch.nn.utils.rnn.pack_sequence([torch.randn(n, 3) for n in (5, 3, 2)])
        h0, c0 = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
        weights = [w.detach().clone() for w in rnn._flat_weights]
        emulated.grid_launches()
        with torch.no_grad():
            emulated.run("LSTM", packed.data, packed.batch_sizes, h0, c0, weights, True, 1, True)
        assert emulated.grid_launches() == [(8, 4)]  # both directions, a cluster of 4 each
        assert emulated.installed_policy() == policy
        with pytest.raises(ValueError, match="SEQPACK_CUDA_GEMM_TILE = '16' is not 32 or 64"):
            emulated.install_policy()
        assert emulated.installed_policy() == policy
    finally:
        monkeypatch.undo()
        emulated.install_policy()
    assert list(emulated.installed_policy().values()) == list(emulated.ops._cuda_policy_from_environment())


def test_policy_tf32_off_overrides_the_calls_allow_tf32(emulated):
    """The policy's tf32 = 0: a float32 call that allows TF32 runs the cluster
    kernels' threads' float32 products, the values of a call that does not
    allow it, bit for bit (H = 32, where tf32 = 1 takes tensor cores: other values)."""
    rnn = _make("GRU", 5, 32, 1, True, True, 0, 51)
    packed = torch.nn.utils.rnn.pack_sequence([torch.randn(n, 5) for n in (4, 3, 1)])
    h0 = torch.randn(2, 3, 32)
    weights = [w.detach().clone() for w in rnn._flat_weights]

    def run(allow_tf32):
        with torch.no_grad():
            return emulated.run("GRU", packed.data, packed.batch_sizes, h0, None, weights, True, 1, True,
                                allow_tf32=allow_tf32, torch_products=False)[:2]
    try:
        emulated.set_policy(kernel=2, cluster_size=2)
        exact = run(False)
        assert not all(torch.equal(g, w) for g, w in zip(run(True), exact))  # tf32 = 1: 3xTF32 here
        emulated.set_policy(kernel=2, cluster_size=2, tf32=0)
        for got, want in zip(run(True), exact):
            assert torch.equal(got, want)
    finally:
        emulated.install_policy()
