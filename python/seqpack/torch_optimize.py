"""seqpack's layers in models written for torch.nn: seqpack.torch.optimize,
patch and unpatch.

    model = seqpack.torch.optimize(model)   # in place: torch's recurrent modules -> seqpack's
    seqpack.torch.patch()                   # torch.nn.LSTM, ..., torch.nn.utils.rnn.* -> seqpack's
    seqpack.torch.unpatch()                 # torch's again

optimize changes the class of every module whose type is exactly torch's
LSTM, GRU, RNN, LSTMCell, GRUCell or RNNCell to seqpack's (the module object,
its Parameter objects, buffers, hooks, training mode, device and dtype stay):
an optimizer made before keeps working and state_dict is unchanged. patch
points torch.nn's recurrent classes and torch.nn.utils.rnn's functions at
seqpack's, for code that builds its models or calls the functions later; a
module that did ``from torch.nn.utils.rnn import pad_sequence`` (or ``from
torch.nn import LSTM``) before patch() keeps torch's.
"""
from typing import List

import torch

from . import _torch_orig
from . import torch as _st

__all__ = ["optimize", "patch", "unpatch"]

# torch's class -> seqpack's, by exact type.
_SEQPACK_CLASS = {_torch_orig.CLASSES[name]: getattr(_st, name) for name in _torch_orig.CLASS_NAMES}


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
        yield torch.nn, "torch.nn", name, _torch_orig.CLASSES[name], getattr(_st, name)
    for name in _torch_orig.FUNCTION_NAMES:
        yield rnn, "torch.nn.utils.rnn", name, _torch_orig.FUNCTIONS[name], getattr(_st, name)


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
    leaves, and torch.nn.RNNBase still match both: torch's class is seqpack's base). Names imported before patch() (``from torch.nn import LSTM``) stay
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

