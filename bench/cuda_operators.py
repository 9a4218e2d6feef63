"""seqpack's CUDA kernels as the GPU machine's tools call them: the operators'
C++ CUDA kernels (seqpack_torch/cuda_ops.cpp), which are the only way to the
library, behind the interface of torch._VF's packed overloads (rnn_packed).

Loaded by file path (python/tests/test_cuda_gpu.py, bench/compare_torch_cuda.py,
bench/cuda_cpp_ops.py) on a machine where seqpack's CPU extension was never
built: it imports torch and the standard library only. The kernels are
libseqpack_torch's where it has CUDA kernels and is loaded; otherwise they are
built here with torch.utils.cpp_extension against the machine's torch (the
kernels, their CUDA registration and the operators' schemas: no CPU core), once
per machine (torch's extension cache). The library is the one
python/seqpack/_cuda.py finds (SEQPACK_CUDA_LIBRARY, or a build's).

    ops = load()                       # the operators' namespace (torch.ops.seqpack)
    available(), why_unavailable(), library_path()
    out, h_n, c_n = rnn_packed("LSTM", packed.data, packed.batch_sizes, (h0, c0),
                               lstm._flat_weights, True, lstm.num_layers,
                               lstm.dropout, lstm.training, lstm.bidirectional)
    install_policy()                   # the SEQPACK_CUDA_* variables' policy again
    layers("auto"); last_choice()      # the operators' choice, and what it chose

rnn_packed has the semantics of torch._VF.lstm/gru/rnn_tanh/rnn_relu's packed
overload (h0/c0 may have more columns than batch_sizes[0]: sequences of length
zero) and runs seqpack's kernels whatever SEQPACK_CUDA_LAYERS says (load sets
layers("seqpack"); compare_torch_cuda.py sets "auto" for its column).

load(on_cpu=True), or SEQPACK_CUDA_TEST_DEVICE=cpu: the kernels' CPU test
registration (cuda_emulated_ops.cpp, torch.ops.seqpack_cuda_emulated) over the
library compiled for the CPU (cuda/emulate/, named by SEQPACK_CUDA_LIBRARY),
for the tools' self-tests without a GPU (cuda_cpp_ops.py --cpu; the GPU tests
on the CPU through the real kernels).
"""
import importlib.util
import os
import pathlib
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = ROOT / "seqpack_torch"
GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
_STATE: dict = {}


def _python_module(name: str):
    """python/seqpack/<name>.py by file path (it imports only torch)."""
    if name not in _STATE:
        spec = importlib.util.spec_from_file_location("seqpack_tools" + name, ROOT / "python" / "seqpack" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _STATE[name] = module
    return _STATE[name]


def _finder():
    """python/seqpack/_cuda.py: where the library is."""
    return _python_module("_cuda")


def library_path():
    return _finder().library_path()


def build(on_cpu: bool, workdir=None):
    """Compiles and loads the kernels (torch.utils.cpp_extension); returns their namespace."""
    import torch.utils.cpp_extension as cpp
    sources = [SOURCES / f for f in ("cuda_ops.cpp", "cuda_library.cpp", "cuda_choice.cpp", "torch_rnn.cpp")]
    sources += [SOURCES / "cuda_emulated_ops.cpp"] if on_cpu else [
        SOURCES / "cuda_register.cpp", SOURCES / "cuda_schemas_standalone.cpp"]
    t0 = time.perf_counter()
    options = dict(build_directory=str(workdir)) if workdir is not None else {}
    cpp.load(name="seqpack_cuda_operators" + ("_cpu" if on_cpu else ""), sources=[str(s) for s in sources],
             extra_include_paths=[str(ROOT / "include"), str(SOURCES)],
             extra_cflags=["-O0" if on_cpu else "-O2"],  # the self-test's build: its code paths, fast
             extra_ldflags=["-ldl"], with_cuda=not on_cpu, is_python_module=False, verbose=False, **options)
    print(f"built the C++ kernels in {time.perf_counter() - t0:.0f} s (torch {torch.__version__})")
    return torch.ops.seqpack_cuda_emulated if on_cpu else torch.ops.seqpack


def load(on_cpu: bool = False, workdir=None):
    """The operators, with the library found handed to them; seqpack's kernels
    run every call. Raises RuntimeError saying why where they cannot."""
    on_cpu = on_cpu or os.environ.get("SEQPACK_CUDA_TEST_DEVICE") == "cpu"
    if "ops" not in _STATE:
        path, error = _finder().find_library()
        if path is None:
            raise RuntimeError(error)
        if not on_cpu and not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False (no GPU or a CPU-only torch build)")
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        if not on_cpu and has("seqpack::rnn", "CUDA"):
            ops = torch.ops.seqpack  # libseqpack_torch's own
        elif on_cpu and hasattr(torch.ops.seqpack_cuda_emulated, "rnn"):
            ops = torch.ops.seqpack_cuda_emulated
        else:
            ops = build(on_cpu, workdir)
        ops._cuda_library(path)
        ops._cuda_layers("seqpack")
        _python_module("_torch_fakes").register(ops.name)  # torch.compile traces the kernels
        _STATE["ops"] = ops
    return _STATE["ops"]


def why_unavailable() -> str:
    try:
        load()
    except Exception as e:  # noqa: BLE001 - the reason, whatever it is
        return f"{type(e).__name__}: {e}"
    return ""


def available() -> bool:
    return why_unavailable() == ""


def install_policy():
    """The SEQPACK_CUDA_* variables' policy installed in the library again
    (a bad value is a ValueError naming it); returns the policy's fields."""
    return load()._cuda_install_policy()


def layers(mode: str = "") -> str:
    """Who the operators run ("seqpack", "torch" or "auto": the faster of the two
    per configuration, decided at its first call and kept); "" leaves it."""
    return load()._cuda_layers(mode)


def last_choice():
    """(who ran, why) of this thread's last call."""
    return tuple(load()._cuda_last_choice())


def rnn_packed(mode, data, batch_sizes, hx, flat_weights, has_biases, num_layers, dropout, train, bidirectional,
               proj_size=0):
    """torch._VF.<mode>(data, batch_sizes, hx, flat_weights, ...) through the
    operator: (output, h_n, c_n) for LSTM, (output, h_n) otherwise."""
    h0, c0 = (None, None) if hx is None else (tuple(hx) if mode == "LSTM" else (hx, None))
    hidden = flat_weights[1].shape[0] // GATES.get(mode, 1)
    y, hn, cn = load().rnn(data, batch_sizes, None, None, h0, c0, list(flat_weights), mode, hidden, num_layers,
                           bool(has_biases), bool(bidirectional), int(proj_size), float(dropout), bool(train), None,
                           "fp32")
    return (y, hn, cn) if mode == "LSTM" else (y, hn)
