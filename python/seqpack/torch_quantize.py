"""int8 inference for recurrent layers: seqpack.torch.quantize_dynamic.

    import seqpack.torch as st
    qmodel = st.quantize_dynamic(model)    # as torch.ao.quantization.quantize_dynamic
    with torch.no_grad():
        out = qmodel(tokens, lengths)

quantize_dynamic swaps every torch.nn.LSTM/GRU/RNN and seqpack.torch.LSTM/GRU/RNN
in a model for QuantizedLSTM/GRU/RNN, which run seqpack's operators at
precision "int8": weights int8 with one scale per gate unit, quantized once
per weight set (libseqpack_torch keeps them, and quantizes again after an
in-place change), the layer input and h quantized per row at run time, int32
products (AMX-INT8, AVX512-VNNI, AVX2 or scalar: every CPU), gate math and states fp32. A row's quantization
depends on that row only, so a sequence gives the same bits alone or in any
batch. The modules are for inference: a forward in training mode or with an
input that requires grad is an error. They keep the fp32 weights as their
parameters (requires_grad False), under torch's names, so state_dict and
load_state_dict round trip with the fp32 model's; they script with
torch.jit.script and compile with torch.compile (PyTorch 2.4+, as the fp32
layers). docs/python.md, "int8 inference", has the error bounds.
"""
import copy
from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence

from . import _torch_layers as _layers
from ._torch_ops import _traced

__all__ = ["quantize_dynamic", "QuantizedLSTM", "QuantizedGRU", "QuantizedRNN"]


class _Int8Layer:
    """What the three int8 layers share: _run (every forward goes through it)
    calls seqpack's operators with precision "int8", train=False."""

    def _run(self, input: Tensor, batch_sizes: Optional[Tensor], sorted_indices: Optional[Tensor],
             unsorted_indices: Optional[Tensor], lengths: Optional[Tensor],
             h0: Optional[Tensor], c0: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        name = self._int8_name()
        if self.training:
            raise ValueError(name + " is for inference only (int8 has no gradient), but it is in "
                               "training mode: call .eval() on it (quantize_dynamic returns the "
                               "model in eval mode), or train the fp32 model")
        if torch.is_grad_enabled():
            if input.requires_grad or (h0 is not None and h0.requires_grad) or \
                    (c0 is not None and c0.requires_grad):
                raise ValueError(name + " is for inference only (int8 has no gradient), but its "
                                   "input or initial state requires grad: detach it, or run under "
                                   "torch.no_grad()")
        # train=False: the operators neither apply dropout nor save for a
        # backward (the parameters require no grad, so no graph is recorded).
        return self._core_run(input, batch_sizes, sorted_indices, unsorted_indices, lengths, h0, c0,
                              "int8")

    def _int8_name(self) -> str:
        return "seqpack.torch.Quantized" + ("RNN" if self.mode.startswith("RNN") else self.mode)

    def _core_run(self, input: Tensor, batch_sizes: Optional[Tensor],
                  sorted_indices: Optional[Tensor], unsorted_indices: Optional[Tensor],
                  lengths: Optional[Tensor], h0: Optional[Tensor], c0: Optional[Tensor],
                  precision: str) -> Tuple[Tensor, Tensor, Tensor]:
        """_SeqpackLayer._core_run with train=False whatever self.training says
        (_run refuses training mode before it gets here)."""
        if batch_sizes is not None:
            return torch.ops.seqpack.rnn(
                input, batch_sizes, sorted_indices, unsorted_indices, h0, c0, self._flat_weights,
                self.mode, self.hidden_size, self.num_layers, self.bias, self.bidirectional,
                self.proj_size, self.dropout, False, None, precision)
        if not torch.jit.is_scripting() and _traced(input):
            return self._traced_padded(input, lengths, h0, c0, precision)
        return torch.ops.seqpack.rnn_padded(
            input, lengths, h0, c0, self._flat_weights, self.mode, self.hidden_size,
            self.num_layers, self.bias, self.batch_first, self.bidirectional, self.proj_size,
            self.dropout, False, None, precision)

    @torch.jit.unused
    def _quantization_notice(self) -> str:
        return ""  # already int8

    @classmethod
    def from_float(cls, mod: torch.nn.RNNBase, *args, **kwargs) -> "torch.nn.RNNBase":
        """The int8 layer of `mod` (a torch.nn or seqpack.torch LSTM/GRU/RNN):
        same configuration, a copy of its float32 weights, in eval mode. Also
        what torch.ao.quantization's convert calls (other arguments ignored);
        a qconfig of another weight dtype than qint8 (float16 dynamic
        quantization) is refused."""
        qconfig = getattr(mod, "qconfig", None)
        if qconfig is not None and getattr(qconfig, "weight", None) is not None:
            dtype = getattr(qconfig.weight(), "dtype", torch.qint8)
            if dtype != torch.qint8:
                raise ValueError(f"quantize_dynamic: {type(mod).__name__} has a qconfig with "
                                 f"{dtype} weights; seqpack's layers quantize to torch.qint8 "
                                 f"only (leave this layer out of qconfig_spec, or use "
                                 f"dtype=torch.qint8)")
        kwargs = dict(num_layers=mod.num_layers, bias=mod.bias, batch_first=mod.batch_first,
                      dropout=float(mod.dropout), bidirectional=mod.bidirectional)
        if mod.mode == "LSTM":
            kwargs["proj_size"] = mod.proj_size
        if mod.mode.startswith("RNN_"):
            kwargs["nonlinearity"] = mod.nonlinearity
        w = mod._flat_weights[0]
        if w.dtype != torch.float32:
            raise ValueError(f"quantize_dynamic: {type(mod).__name__} has {w.dtype} weights; "
                             f"int8 quantizes float32 layers (call .float() on the model first)")
        if w.device.type != "cpu":
            raise ValueError(f"quantize_dynamic: {type(mod).__name__} is on {w.device}; seqpack's "
                             f"int8 runs on the CPU")
        q = cls(mod.input_size, mod.hidden_size, **kwargs)
        with torch.no_grad():
            for name in q._flat_weights_names:
                getattr(q, name).copy_(getattr(mod, name))
        q.requires_grad_(False)
        return q.eval()


# Each declares its forward and overloads again, as the layers it subclasses do
# (seqpack/_torch_layers.py says why).
class QuantizedLSTM(_Int8Layer, _layers.LSTM):
    """seqpack.torch.LSTM at precision int8, for inference (quantize_dynamic
    makes it). Parameters, state_dict and forward arguments are the LSTM's."""

    @torch._jit_internal._overload_method  # noqa: F811
    def forward(self, input: Tensor, hx: Optional[Tuple[Tensor, Tensor]] = None,  # noqa: F811
                lengths: Optional[Tensor] = None) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        pass

    @torch._jit_internal._overload_method  # noqa: F811
    def forward(self, input: PackedSequence, hx: Optional[Tuple[Tensor, Tensor]] = None,  # noqa: F811
                lengths: Optional[Tensor] = None) -> Tuple[PackedSequence, Tuple[Tensor, Tensor]]:
        pass

    def forward(self, input, hx=None, lengths=None):  # noqa: F811
        h0: Optional[Tensor] = None
        c0: Optional[Tensor] = None
        if hx is not None:
            h0, c0 = hx[0], hx[1]
        if isinstance(input, PackedSequence):
            out, h_n, c_n = self._forward_packed(input, h0, c0, lengths)
            return out, (h_n, c_n)
        else:
            output, h_n, c_n = self._forward_padded(input, h0, c0, lengths)
            return output, (h_n, c_n)


class QuantizedGRU(_Int8Layer, _layers.GRU):
    """seqpack.torch.GRU at precision int8, for inference (see QuantizedLSTM)."""

    @torch._jit_internal._overload_method  # noqa: F811
    def forward(self, input: Tensor, hx: Optional[Tensor] = None,  # noqa: F811
                lengths: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        pass

    @torch._jit_internal._overload_method  # noqa: F811
    def forward(self, input: PackedSequence, hx: Optional[Tensor] = None,  # noqa: F811
                lengths: Optional[Tensor] = None) -> Tuple[PackedSequence, Tensor]:
        pass

    def forward(self, input, hx=None, lengths=None):  # noqa: F811
        if isinstance(input, PackedSequence):
            out, h_n, _ = self._forward_packed(input, hx, None, lengths)
            return out, h_n
        else:
            output, h_n, _ = self._forward_padded(input, hx, None, lengths)
            return output, h_n


class QuantizedRNN(_Int8Layer, _layers.RNN):
    """seqpack.torch.RNN (tanh or relu) at precision int8, for inference (see QuantizedLSTM)."""

    @torch._jit_internal._overload_method  # noqa: F811
    def forward(self, input: Tensor, hx: Optional[Tensor] = None,  # noqa: F811
                lengths: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        pass

    @torch._jit_internal._overload_method  # noqa: F811
    def forward(self, input: PackedSequence, hx: Optional[Tensor] = None,  # noqa: F811
                lengths: Optional[Tensor] = None) -> Tuple[PackedSequence, Tensor]:
        pass

    def forward(self, input, hx=None, lengths=None):  # noqa: F811
        if isinstance(input, PackedSequence):
            out, h_n, _ = self._forward_packed(input, hx, None, lengths)
            return out, h_n
        else:
            output, h_n, _ = self._forward_padded(input, hx, None, lengths)
            return output, h_n


# The layers quantize_dynamic swaps, and what each becomes. seqpack.torch's
# layers subclass torch.nn's; the int8 ones subclass seqpack.torch's, and are
# left as they are.
_SWAP = {torch.nn.LSTM: QuantizedLSTM, torch.nn.GRU: QuantizedGRU, torch.nn.RNN: QuantizedRNN,
         _layers.LSTM: QuantizedLSTM, _layers.GRU: QuantizedGRU, _layers.RNN: QuantizedRNN}
_SEQPACK_TWIN = {torch.nn.LSTM: _layers.LSTM, torch.nn.GRU: _layers.GRU, torch.nn.RNN: _layers.RNN}


def _register_with_torch() -> None:
    """seqpack's layers in torch.ao.quantization's default dynamic mapping, so that
    torch's quantize_dynamic (and convert) swaps a seqpack.torch.LSTM/GRU/RNN that
    its qconfig_spec selects (by type or name) for the int8 layer here. Only
    seqpack's own types are added; torch's entries are left as they are."""
    try:
        from torch.ao.quantization import quantization_mappings
    except ImportError:
        return
    mapping = getattr(quantization_mappings, "DEFAULT_DYNAMIC_QUANT_MODULE_MAPPINGS", None)
    if isinstance(mapping, dict):
        for float_type, int8_type in ((_layers.LSTM, QuantizedLSTM), (_layers.GRU, QuantizedGRU),
                                      (_layers.RNN, QuantizedRNN)):
            mapping.setdefault(float_type, int8_type)


_register_with_torch()


def _spec(qconfig_spec) -> dict:
    """qconfig_spec -> {type or submodule name: whether its subtree is quantized}.
    A set selects its entries; a dict its keys, except those whose qconfig is
    None, which exclude their subtree (as torch reads a None qconfig)."""
    if qconfig_spec is None:
        return {k: True for k in _SWAP}
    if isinstance(qconfig_spec, dict):
        spec = {k: v is not None for k, v in qconfig_spec.items()}
    elif isinstance(qconfig_spec, (set, frozenset, list, tuple)):
        spec = {k: True for k in qconfig_spec}
    else:
        raise TypeError(f"quantize_dynamic: qconfig_spec must be None, a set of module types "
                        f"and/or submodule names, or a dict keyed by them, got "
                        f"{type(qconfig_spec).__name__}")
    for key in spec:
        if not isinstance(key, (type, str)):
            raise TypeError(f"quantize_dynamic: qconfig_spec entry {key!r} is neither a module "
                            f"type nor a submodule name")
    # seqpack.torch's layers are drop-ins for torch's: naming torch.nn.LSTM
    # selects both (unless seqpack.torch.LSTM is named too).
    for k, twin in _SEQPACK_TWIN.items():
        if k in spec and twin not in spec:
            spec[twin] = spec[k]
    return spec


def quantize_dynamic(model: torch.nn.Module, qconfig_spec=None, dtype=torch.qint8,
                     inplace: bool = False) -> torch.nn.Module:
    """`model` with its recurrent layers at int8, shaped like
    torch.ao.quantization.quantize_dynamic.

    Every torch.nn.LSTM/GRU/RNN and seqpack.torch.LSTM/GRU/RNN (the model itself
    if it is one) becomes a QuantizedLSTM/GRU/RNN running seqpack's int8
    operators. qconfig_spec, as torch reads it: None (all those layers), a set
    of module types and/or submodule names, or a dict keyed by them (a key
    selects modules of exactly that type, or of that name, and everything
    inside them; a None value excludes a subtree; other values are not read).
    Only recurrent layers are quantized by seqpack: other selected types
    (torch.nn.Linear, torch.nn.LSTMCell, ...) are left as they are, where
    torch's quantize_dynamic would swap them for its int8 modules (run torch's
    on the result for those). dtype must be torch.qint8. Returns a deep copy in
    eval mode, unless inplace (then `model`, swapped in place, in eval mode).
    """
    if dtype is not torch.qint8:
        raise ValueError(f"quantize_dynamic: dtype = {dtype} is not supported; seqpack quantizes "
                         f"recurrent layers to torch.qint8 only (torch.float16 and the others are "
                         f"torch.ao.quantization.quantize_dynamic's)")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"quantize_dynamic: model must be a torch.nn.Module, got "
                        f"{type(model).__name__}")
    spec = _spec(qconfig_spec)
    if not inplace:
        model = copy.deepcopy(model)
    model.eval()
    return _convert(model, "", spec, False)


def _swappable(mod: torch.nn.Module) -> bool:
    return type(mod) in _SWAP


def _convert(mod: torch.nn.Module, name: str, spec: dict, inherited: bool) -> torch.nn.Module:
    """`mod` (at qualified name `name`) with its selected layers swapped; the
    children are swapped in place. As torch propagates qconfigs: a module's
    type overrides its parent's choice, its name overrides both."""
    on = spec.get(type(mod), inherited)
    on = spec.get(name, on) if name else on
    if on and _swappable(mod):
        return _SWAP[type(mod)].from_float(mod)
    for child_name, child in list(mod.named_children()):
        full = f"{name}.{child_name}" if name else child_name
        new = _convert(child, full, spec, on)
        if new is not child:
            setattr(mod, child_name, new)
    return mod
