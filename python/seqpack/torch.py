"""Drop-in replacements for torch.nn.LSTM, GRU and RNN running seqpack's kernels.

    from seqpack.torch import LSTM      # instead of torch.nn.LSTM
    lstm = LSTM(128, 256, batch_first=True)

The classes subclass torch's, so constructor arguments, parameter names,
initialisation (same RNG draws), state_dict, repr, optimisers and
DistributedDataParallel behave exactly as with torch's modules. Only forward
changes: it calls the operators of libseqpack_torch (torch.ops.seqpack.rnn,
rnn_padded), whose CPU kernels run seqpack's C++ core on the tensors' memory
and whose autograd is C++ (torch::autograd::Function), so forward and
backward never come back to Python. The modules script with torch.jit.script
and trace with torch.jit.trace; a saved script loads in any process that has
loaded the operator library (import seqpack.torch, torch.ops.load_library
(seqpack.torch.library_path()), or a LibTorch program linking it). In eager
mode, inputs seqpack cannot run (not on the CPU, or not float32/float64) go to
torch's own implementation.

Every public name of torch.nn.utils.rnn is here too (PackedSequence and any
other name seqpack does not implement are torch's own). The packing functions
are torch.nn.utils.rnn's (pack_padded_sequence,
pad_packed_sequence, pack_sequence, pad_sequence, unpack_sequence,
unpad_sequence, invert_permutation), on any device (CPU, CUDA, meta) and
dtype, with zero-length sequences accepted. CPU float32/float64 tensors go
through torch.ops.seqpack.*; anything else through plain torch operations
(seqpack/_torch_packing.py: a plan from the lengths on the CPU, then one
gather on the data's device). The cells (LSTMCell, GRUCell, RNNCell) are
drop-ins for torch.nn's and run a one-step seqpack::rnn where the layers would.

On PyTorch 2.4+ every operator has a fake implementation, so torch.compile
(fullgraph, dynamic shapes, forward and backward) and torch.export trace
models using the layers and the packing functions (docs/python.md,
"torch.compile, torch.export and autocast").

This module gathers what the modules below it define and adds optimize,
patch and unpatch; none of them imports it, so each imports alone (STYLE.md:
Python modules import downward only). seqpack/_torch_ops.py has the operator
library, the packing functions and the fake implementations;
seqpack/_torch_layers.py the layers and cells on them; torch_streaming,
torch_data, torch_classifier and torch_quantize the rest of what is exported
here.
"""
from typing import List

import torch

from . import _torch_orig
from ._torch_layers import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell
from ._torch_ops import (invert_permutation, library_path, pack_padded_sequence, pack_sequence,
                         pad_packed_sequence, pad_sequence, unpack_sequence, unpad_sequence)
# Jagged nested tensors <-> PackedSequence (seqpack/_torch_nested.py).
from ._torch_nested import pack_nested, to_nested
# Reached as seqpack.torch._cuda_backend (docs/gpu.md). To replace it, patch
# seqpack._torch_layers, where the layers look it up.
from ._torch_layers import _cuda_backend  # noqa: F401
# Which implementation a layer's last CUDA forward ran, and why (SEQPACK_CUDA_LAYERS,
# chosen by the operators' CUDA kernels, seqpack_torch/cuda_ops.cpp).
from ._torch_layers import CudaChoice, cuda_choice
# Per-stream state for chunked inference (seqpack/torch_streaming.py).
from .torch_streaming import StreamingRNN
# DataLoader collate functions to a PackedSequence (seqpack/torch_data.py).
from .torch_data import collate_packed, collate_padded
# A model saved by `seqpack train` as a torch module (seqpack/torch_classifier.py).
from .torch_classifier import CharClassifier, load_classifier
# int8 inference: quantize_dynamic and its layers (seqpack/torch_quantize.py).
from .torch_quantize import QuantizedGRU, QuantizedLSTM, QuantizedRNN, quantize_dynamic

__all__ = ["LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell", "pack_padded_sequence",
           "pad_packed_sequence", "pack_sequence", "pad_sequence", "unpack_sequence",
           "unpad_sequence", "invert_permutation", "library_path",
           "StreamingRNN", "collate_packed", "collate_padded", "CharClassifier", "load_classifier",
           "quantize_dynamic", "QuantizedLSTM", "QuantizedGRU", "QuantizedRNN",
           "optimize", "patch", "unpatch", "cuda_choice", "CudaChoice", "register_cuda_kernels",
           "pack_nested", "to_nested"]


def _torch_rnn_public_names():
    """The public names of the torch at hand's torch.nn.utils.rnn: its __all__, or
    without one the names it defines itself (not those it imports)."""
    rnn = torch.nn.utils.rnn
    names = getattr(rnn, "__all__", None)
    if names is None:
        names = [n for n, v in vars(rnn).items() if not n.startswith("_")
                 and getattr(v, "__module__", None) == rnn.__name__]
    return list(names)


# Code that imports from seqpack.torch where it imported from torch.nn.utils.rnn
# finds every name there: seqpack's own where it has one, torch's otherwise
# (PackedSequence, which seqpack's functions take and return, and whatever a
# later torch adds).
for _name in _torch_rnn_public_names():
    if _name not in globals():
        globals()[_name] = getattr(torch.nn.utils.rnn, _name)
    if _name not in __all__:
        __all__.append(_name)
del _name


def register_cuda_kernels() -> bool:
    """Hands the operators' C++ CUDA kernels (seqpack_torch/cuda_ops.cpp) the
    libseqpack_cuda.so seqpack finds, where seqpack's CUDA kernels can run: the
    library built and found, a GPU, a libseqpack_torch with CUDA kernels, and
    SEQPACK_CUDA_LAYERS not `torch`. Returns whether they can. A layer's first
    CUDA forward does it; a program that calls the operators otherwise (a
    TorchScript or LibTorch model run from Python) may call this first, else the
    kernels find the library themselves. A library named by SEQPACK_CUDA_LIBRARY
    that cannot load raises, naming it."""
    return _cuda_backend() is not None


# ---- a model written for torch.nn: optimize, patch, unpatch ---------------
# optimize changes the class of torch's recurrent modules in a model to
# seqpack's (same object, Parameter objects, buffers, hooks); patch points
# torch.nn's recurrent classes and torch.nn.utils.rnn's functions at seqpack's
# for code that builds its models or calls the functions later (docs/python.md,
# "A model someone else wrote"). torch's own objects are _torch_orig's.

# torch's class -> seqpack's, by exact type.
_SEQPACK_CLASS = {_torch_orig.CLASSES[name]: globals()[name] for name in _torch_orig.CLASS_NAMES}


def optimize(model: torch.nn.Module) -> torch.nn.Module:
    """Every torch.nn.LSTM/GRU/RNN/LSTMCell/GRUCell/RNNCell in `model` (the model
    itself included) becomes seqpack.torch's, in place; returns `model`.

    Only modules of exactly torch's class change (a subclass of torch.nn.LSTM may
    override forward, which seqpack's would bypass). The modules keep their
    Parameter objects under the same names, so state_dict keys and values are
    unchanged and an optimizer made before goes on updating them; training mode,
    device, dtype and hooks stay. Where seqpack has no kernel (a dtype other than
    float32/float64, a device without seqpack's operators, dropout=1) the layers
    run torch's, as seqpack.torch's layers do. A TorchScript module is refused
    (script after optimize)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"optimize: model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError("optimize: model is a TorchScript module, whose recurrent layers are "
                        "compiled already; call optimize on the nn.Module, then torch.jit.script")
    for module in model.modules():
        seqpack_class = _SEQPACK_CLASS.get(type(module))
        if seqpack_class is not None:
            # seqpack's classes subclass torch's and add no state of their own:
            # the module's __dict__ (parameters, _flat_weights, hooks) is theirs as is.
            module.__class__ = seqpack_class
            if "qconfig" in module.__dict__:  # seqpack's class keeps it behind a property
                module.__dict__["_seqpack_qconfig"] = module.__dict__.pop("qconfig")
    return model


def _targets():
    """(owner, owner's name, attribute, torch's value, seqpack's value) for every
    name patch() sets."""
    rnn = torch.nn.utils.rnn
    for name in _torch_orig.CLASS_NAMES:
        yield torch.nn, "torch.nn", name, _torch_orig.CLASSES[name], globals()[name]
    for name in _torch_orig.FUNCTION_NAMES:
        yield rnn, "torch.nn.utils.rnn", name, _torch_orig.FUNCTIONS[name], globals()[name]


def patch() -> List[str]:
    """Point torch.nn.LSTM, GRU, RNN, LSTMCell, GRUCell, RNNCell and
    torch.nn.utils.rnn's pack_padded_sequence, pad_packed_sequence,
    pack_sequence, pad_sequence, unpack_sequence, unpad_sequence and
    invert_permutation at seqpack.torch's. Returns what it changed, e.g.
    ["torch.nn.LSTM -> seqpack.torch.LSTM", ...]; a name already seqpack's, or
    set by someone else to neither torch's nor seqpack's, is left alone (a
    second patch() returns []).

    Models built after patch() hold seqpack's layers; isinstance(m, torch.nn.LSTM)
    is then a test for seqpack's LSTM (torch.nn.modules.rnn.LSTM, which patch()
    leaves, and torch.nn.RNNBase still match both: torch's class is seqpack's
    base). Names imported before patch() (``from torch.nn import LSTM``) stay
    torch's. unpatch() restores torch's."""
    changed = []
    for owner, where, name, torch_value, seqpack_value in _targets():
        if getattr(owner, name) is torch_value:
            setattr(owner, name, seqpack_value)
            changed.append(f"{where}.{name} -> seqpack.torch.{name}")
    return changed


def unpatch() -> List[str]:
    """Undo patch(): every name patch() set that is still seqpack's is torch's
    again. Returns what it restored, e.g. ["torch.nn.LSTM -> torch's LSTM", ...]."""
    restored = []
    for owner, where, name, torch_value, seqpack_value in _targets():
        if getattr(owner, name) is seqpack_value:
            setattr(owner, name, torch_value)
            restored.append(f"{where}.{name} -> torch's {name}")
    return restored
