"""torch's own recurrent classes and torch.nn.utils.rnn functions, held from
the moment seqpack.torch is imported.

Code that patches torch (``torch.nn.utils.rnn.pad_sequence =
seqpack.torch.pad_sequence``, ``torch.nn.LSTM = seqpack.torch.LSTM``, or
seqpack.torch.patch()) changes what ``torch.nn.utils.rnn.<name>`` finds at
call time; seqpack's fallbacks to torch call the functions held here, so
they never reach seqpack's own again. Imports nothing of seqpack's.
"""
import torch
import torch.nn.utils.rnn as _rnn

# torch.nn.utils.rnn's functions that seqpack.torch replaces (PyTorch 1.13 has them all).
FUNCTION_NAMES = ("pack_padded_sequence", "pad_packed_sequence", "pack_sequence", "pad_sequence",
                  "unpack_sequence", "unpad_sequence", "invert_permutation")
# torch.nn's classes that seqpack.torch replaces.
CLASS_NAMES = ("LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell")


def _held(owner, name: str):
    value = getattr(owner, name)
    if getattr(value, "__module__", "").startswith("seqpack"):
        raise ImportError(f"seqpack.torch: torch.{owner.__name__.split('torch.', 1)[-1]}.{name} is "
                          f"already seqpack's ({value.__module__}.{name}) when seqpack.torch is first "
                          f"imported; import seqpack.torch before patching torch")
    return value


FUNCTIONS = {name: _held(_rnn, name) for name in FUNCTION_NAMES}
CLASSES = {name: _held(torch.nn, name) for name in CLASS_NAMES}

pack_padded_sequence = FUNCTIONS["pack_padded_sequence"]
pad_packed_sequence = FUNCTIONS["pad_packed_sequence"]
pad_sequence = FUNCTIONS["pad_sequence"]
