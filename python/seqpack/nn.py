"""Recurrent layers on NumPy arrays with torch.nn's constructor arguments,
forward signature, parameter names and state dicts, plus an explicit backward.

    lstm = seqpack.nn.LSTM(2, 3)
    lstm.load_state_dict({k: v.numpy() for k, v in torch_lstm.state_dict().items()})
    out, (h_n, c_n) = lstm(seqpack.pack_sequence([a, b]))
    grad_input, (grad_h0, grad_c0) = lstm.backward(grad_out, grad_h_n, grad_c_n)
    lstm.grads["weight_ih_l0"]   # accumulated, like torch's .grad; zero_grad() clears

Parameters are NumPy arrays viewing the layer's own storage: writing into
them (``lstm.weight_hh_l0[...] = w``) changes the layer.
"""
from collections import OrderedDict, namedtuple

import numpy as np

from . import _seqpack
from ._checks import as_array, as_bool, as_float_dtype, as_int, as_optional_array
from .packing import PackedSequence

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]

_DTYPES = {np.dtype(np.float32): _seqpack.DType.float32,
           np.dtype(np.float64): _seqpack.DType.float64}

IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


_PRECISIONS = {"fp32": _seqpack.Precision.fp32, "bf16": _seqpack.Precision.bf16,
               "int8": _seqpack.Precision.int8}


def _precision(precision):
    """'fp32', 'bf16', 'int8' or 'auto' (bf16 where the CPU has native bf16) -> the
    name. An explicit 'bf16' or 'int8' on a CPU without its dot products raises
    ValueError naming its ISA. 'int8' is for inference: forwards in eval() mode,
    saving nothing for backward() (docs/performance.md, "int8 numerics")."""
    if precision not in ("fp32", "bf16", "int8", "auto"):
        raise ValueError(f"precision must be 'fp32', 'bf16', 'int8' or 'auto', got {precision!r}")
    return _seqpack.resolve_precision(precision).name


def _seed(seed):
    # Without a seed, draw one from NumPy's global generator so that
    # np.random.seed makes initialisation reproducible.
    if seed is None:
        return int(np.random.randint(0, 2**62, dtype=np.int64))
    return as_int(seed, "seed", 0, 2**64 - 1)


class _Parameters:
    """Torch-like parameter access over a C++ module `self._impl`."""

    def named_parameters(self):
        return zip(self._impl.parameter_names, self._impl.parameters)

    def parameters(self):
        return iter(self._impl.parameters)

    @property
    def grads(self):
        """Accumulated gradients by parameter name (views; zero_grad() clears them)."""
        return OrderedDict(zip(self._impl.parameter_names, self._impl.grads))

    def zero_grad(self):
        self._impl.zero_grad()

    def __getattr__(self, name):
        # Only called when normal lookup fails: parameters by their torch names.
        impl = self.__dict__.get("_impl")
        if impl is not None and name in impl.parameter_names:
            return impl.parameters[impl.parameter_names.index(name)]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __setattr__(self, name, value):
        impl = self.__dict__.get("_impl")
        if impl is not None and name in impl.parameter_names:
            self._load({name: value}, strict=False)
        else:
            super().__setattr__(name, value)

    def state_dict(self):
        """OrderedDict name -> array viewing the parameter (as torch's state_dict)."""
        return OrderedDict(zip(self._impl.parameter_names, self._impl.parameters))

    def load_state_dict(self, state_dict, strict=True):
        """Copies arrays (e.g. ``{k: v.numpy() for k, v in torch_module.state_dict().items()}``).

        strict: a missing, unexpected or wrongly shaped key raises ValueError naming it.
        Otherwise missing keys keep their values and unexpected ones are reported.
        """
        return self._load(state_dict, strict)

    def _load(self, state_dict, strict):
        if not hasattr(state_dict, "items"):
            raise TypeError(f"state_dict must be a dict of arrays, got {type(state_dict).__name__}")
        names = self._impl.parameter_names
        state = {}
        for key, value in state_dict.items():
            if not isinstance(key, str):
                raise TypeError(f"state_dict keys must be str, got {key!r}")
            if hasattr(value, "detach"):  # a torch tensor
                value = value.detach().cpu().numpy()
            a = np.asarray(value)
            if a.dtype.kind not in "fiu" or a.dtype == np.bool_:
                raise TypeError(f"state_dict[{key!r}] has dtype {a.dtype}; expected a float array")
            state[key] = np.ascontiguousarray(a, dtype=self.dtype)
        unexpected = [k for k in state if k not in names]
        missing = [k for k in names if k not in state]
        if not strict:
            current = self.state_dict()
            state = {k: state.get(k, current[k]) for k in names}
        self._impl.load_state_dict(state)
        return IncompatibleKeys(missing, unexpected)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


class RNNBase(_Parameters):
    """Multi-layer RNN/LSTM/GRU. mode: 'RNN_TANH', 'RNN_RELU', 'LSTM' or 'GRU' (torch's)."""

    _MODES = {"RNN_TANH": _seqpack.RNNMode.rnn_tanh, "RNN_RELU": _seqpack.RNNMode.rnn_relu,
              "LSTM": _seqpack.RNNMode.lstm, "GRU": _seqpack.RNNMode.gru}

    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, proj_size=0, device=None, dtype=None, seed=None,
                 precision="fp32"):
        if mode not in self._MODES:
            raise ValueError(f"Unrecognized RNN mode: {mode!r}")
        if device not in (None, "cpu"):
            raise ValueError(f"seqpack runs on the CPU only, got device={device!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
            raise TypeError(f"dropout should be a number, got {type(dropout).__name__}")
        self.mode = mode
        self.input_size = as_int(input_size, "input_size")
        self.hidden_size = as_int(hidden_size, "hidden_size")
        self.num_layers = as_int(num_layers, "num_layers")
        self.bias = as_bool(bias, "bias")
        self.batch_first = as_bool(batch_first, "batch_first")
        self.dropout = float(dropout)
        self.bidirectional = as_bool(bidirectional, "bidirectional")
        self.proj_size = as_int(proj_size, "proj_size")
        self.dtype = as_float_dtype(dtype)
        self.precision = _precision(precision)
        options = _seqpack.RNNOptions(
            self._MODES[mode], self.input_size, self.hidden_size, self.num_layers, self.bias,
            self.batch_first, self.dropout, self.bidirectional, self.proj_size,
            _DTYPES[self.dtype], _PRECISIONS[self.precision])
        options.validate()
        self._impl = _seqpack.RNNBase(options, _seed(seed))
        self._last = None

    # torch.nn.Module-like switches.
    @property
    def training(self):
        return self._impl.training

    def train(self, mode=True):
        self._impl.train(as_bool(mode, "mode"))
        return self

    def eval(self):
        return self.train(False)

    def reset_parameters(self, seed=None):
        self._impl.reset_parameters(_seed(seed))

    def replan(self):
        """Forgets the model's plan: the weight matrices as the forwards without
        requires_grad read them (quantized at 'int8', laid out at fp32), made at the
        first such forward and kept until a training forward, a forward with
        requires_grad or an access to the parameters. Call it after changing the
        parameter arrays in place through references taken before."""
        self._impl.replan()

    def _hx(self, hx):
        if hx is None:
            return None, None
        if self.mode == "LSTM":
            if not isinstance(hx, tuple) or len(hx) != 2:
                raise TypeError("LSTM expects hx as a tuple (h_0, c_0), got "
                                f"{type(hx).__name__}")
            return (as_array(hx[0], "h_0", float_only=True),
                    as_array(hx[1], "c_0", float_only=True))
        if isinstance(hx, tuple):
            raise TypeError(f"{self.mode} expects hx as one array, got a tuple")
        return as_array(hx, "hx", float_only=True), None

    def forward(self, input, hx=None, requires_grad=True):
        """input: a PackedSequence or a padded array [T, B, I] ([B, T, I] if batch_first;
        [T, I] unbatched). Returns (output, h_n), or (output, (h_n, c_n)) for an LSTM.
        With requires_grad, keeps what backward() needs."""
        h0, c0 = self._hx(hx)
        if isinstance(input, PackedSequence):
            out = self._impl.forward_packed(tuple(input), h0, c0, requires_grad)
            output = PackedSequence._from_core(out.packed)
        elif isinstance(input, tuple) and len(input) == 4:
            packed = PackedSequence(*input)
            out = self._impl.forward_packed(tuple(packed), h0, c0, requires_grad)
            output = PackedSequence._from_core(out.packed)
        else:
            out = self._impl.forward_padded(as_array(input, "input", float_only=True), h0, c0,
                                            requires_grad)
            output = out.padded
        self._last = (out, output) if requires_grad else None
        if self.mode == "LSTM":
            return output, (out.h_n, out.c_n)
        return output, out.h_n

    def backward(self, grad_output, grad_h_n=None, grad_c_n=None):
        """Gradients for the last forward, given those of its results (None = zeros).

        For an LSTM grad_h_n may be the tuple (grad_h_n, grad_c_n). Adds into
        .grads and returns (grad_input, grad_h_0), or (grad_input, (grad_h_0,
        grad_c_0)) for an LSTM; grad_input is a PackedSequence for packed input.
        """
        if self._last is None:
            raise ValueError("backward() needs a forward(..., requires_grad=True) first")
        out, output = self._last
        if isinstance(grad_h_n, tuple):
            if self.mode != "LSTM" or grad_c_n is not None:
                raise TypeError("grad_h_n may be a tuple (grad_h_n, grad_c_n) for an LSTM only")
            grad_h_n, grad_c_n = grad_h_n
        if isinstance(grad_output, PackedSequence):
            grad_output = grad_output.data
        if grad_c_n is not None and self.mode != "LSTM":
            raise ValueError(f"grad_c_n given to a {self.mode}, which has no cell state")
        g_in, g_h0, g_c0, _ = self._impl.backward(
            out, as_optional_array(grad_output, "grad_output", float_only=True),
            as_optional_array(grad_h_n, "grad_h_n", float_only=True),
            as_optional_array(grad_c_n, "grad_c_n", float_only=True))
        if isinstance(output, PackedSequence):
            g_in = PackedSequence._from_core((g_in,) + tuple(output)[1:])
        if self.mode == "LSTM":
            return g_in, (g_h0, g_c0)
        return g_in, g_h0

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size != 0:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.mode == "RNN_RELU":
            s += ", nonlinearity='relu'"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s

    def __repr__(self):
        return f"{type(self).__name__}({self.extra_repr()})"


class RNN(RNNBase):
    """Elman RNN: h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh) (or relu)."""

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, device=None, dtype=None,
                 seed=None, precision="fp32"):
        if nonlinearity == "tanh":
            mode = "RNN_TANH"
        elif nonlinearity == "relu":
            mode = "RNN_RELU"
        else:
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'")
        self.nonlinearity = nonlinearity
        super().__init__(mode, input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, 0, device, dtype, seed, precision)


class LSTM(RNNBase):
    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, proj_size=0, device=None, dtype=None,
                 seed=None, precision="fp32"):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, proj_size, device, dtype, seed, precision)


class GRU(RNNBase):
    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, device=None, dtype=None, seed=None,
                 precision="fp32"):
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, 0, device, dtype, seed, precision)


class RNNCellBase(_Parameters):
    """One step of an RNN/LSTM/GRU: parameters weight_ih, weight_hh, bias_ih, bias_hh."""

    def __init__(self, mode, input_size, hidden_size, bias=True, device=None, dtype=None,
                 seed=None):
        if device not in (None, "cpu"):
            raise ValueError(f"seqpack runs on the CPU only, got device={device!r}")
        self.mode = mode
        self.input_size = as_int(input_size, "input_size")
        self.hidden_size = as_int(hidden_size, "hidden_size")
        self.bias = as_bool(bias, "bias")
        self.dtype = as_float_dtype(dtype)
        self._impl = _seqpack.RNNCellBase(RNNBase._MODES[mode], self.input_size,
                                          self.hidden_size, self.bias, _DTYPES[self.dtype],
                                          _seed(seed))
        self._last = None

    def forward(self, input, hx=None, requires_grad=True):
        """input [B, I] or [I]; returns h' (LSTMCell: (h', c'))."""
        input = as_array(input, "input", float_only=True)
        if self.mode == "LSTM":
            if hx is not None and (not isinstance(hx, tuple) or len(hx) != 2):
                raise TypeError("LSTMCell expects hx as a tuple (h, c)")
            h, c = (None, None) if hx is None else hx
            out = self._impl.forward(input, as_optional_array(h, "h", float_only=True),
                                     as_optional_array(c, "c", float_only=True), requires_grad)
        else:
            if isinstance(hx, tuple):
                raise TypeError(f"{type(self).__name__} expects hx as one array, got a tuple")
            out = self._impl.forward(input, as_optional_array(hx, "hx", float_only=True), None,
                                     requires_grad)
        self._last = out if requires_grad else None
        return (out.h, out.c) if self.mode == "LSTM" else out.h

    def backward(self, grad_h, grad_c=None):
        """Returns (grad_input, grad_hx), or (grad_input, (grad_h, grad_c)) for LSTMCell;
        parameter gradients are added into .grads."""
        if self._last is None:
            raise ValueError("backward() needs a forward(..., requires_grad=True) first")
        if isinstance(grad_h, tuple):
            grad_h, grad_c = grad_h
        g_in, g_h, g_c = self._impl.backward(
            self._last, as_optional_array(grad_h, "grad_h", float_only=True),
            as_optional_array(grad_c, "grad_c", float_only=True))
        return (g_in, (g_h, g_c)) if self.mode == "LSTM" else (g_in, g_h)

    def __repr__(self):
        s = f"{type(self).__name__}({self.input_size}, {self.hidden_size}"
        if not self.bias:
            s += ", bias=False"
        if self.mode == "RNN_RELU":
            s += ", nonlinearity='relu'"
        return s + ")"


class RNNCell(RNNCellBase):
    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh", device=None,
                 dtype=None, seed=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity: {nonlinearity}")
        self.nonlinearity = nonlinearity
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size,
                         hidden_size, bias, device, dtype, seed)


class LSTMCell(RNNCellBase):
    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None, seed=None):
        super().__init__("LSTM", input_size, hidden_size, bias, device, dtype, seed)


class GRUCell(RNNCellBase):
    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None, seed=None):
        super().__init__("GRU", input_size, hidden_size, bias, device, dtype, seed)
