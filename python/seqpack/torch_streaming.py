"""Streaming inference for torch modules: per-stream state of a unidirectional
torch.nn (or seqpack.torch) LSTM/GRU/RNN, with torch tensors in and out.

    lstm = torch.nn.LSTM(40, 256, num_layers=2)         # or seqpack.torch.LSTM
    streams = StreamingRNN(lstm)
    a = streams.open()
    (y,) = streams.push([a], [chunk])                     # chunk [len, 40] -> y [len, 256]
    h, c = streams.state(a)                               # [num_layers, 256] each

The module's parameters are views (no copy), and their recurrent matrices are
read through the model's plan (quantized for an int8 layer, seqpack.torch.
quantize_dynamic's; laid out at fp32), made again at a push after an in-place
change to them (torch's version counter: training, load_state_dict), so such a
change is seen by the next push; a change through `.data` bumps no version and
is not seen by the recurrent matrices. The recurrence
runs in seqpack's C++ core (include/seqpack/streaming.h), one packed batch per
push, without autograd: it is for inference. Chunks are [len, input_size]
whatever the module's batch_first (a chunk is one stream's time steps).
"""

import torch

from . import _seqpack
from ._checks import as_int

__all__ = ["StreamingRNN"]

_CORE_MODES = {"RNN_TANH": _seqpack.RNNMode.rnn_tanh, "RNN_RELU": _seqpack.RNNMode.rnn_relu,
               "LSTM": _seqpack.RNNMode.lstm, "GRU": _seqpack.RNNMode.gru}
_CORE_DTYPES = {torch.float32: _seqpack.DType.float32, torch.float64: _seqpack.DType.float64}


def _np(t, name):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} is on {t.device}; seqpack streams on the CPU")
    if t.dtype not in _CORE_DTYPES:
        raise TypeError(f"{name} has dtype {t.dtype}; seqpack supports torch.float32 and "
                        "torch.float64")
    return t.detach().contiguous().numpy()


class StreamingRNN:
    """Per-stream (h, c) of a unidirectional torch.nn.LSTM/GRU/RNN `module`."""

    def __init__(self, module):
        if not isinstance(module, torch.nn.RNNBase) or module.mode not in _CORE_MODES:
            raise TypeError("StreamingRNN expects a torch.nn (or seqpack.torch) LSTM, GRU or "
                            f"RNN, got {type(module).__name__}")
        if module.bidirectional:
            raise ValueError("StreamingRNN: the module is bidirectional; a stream's reverse "
                             "direction would need inputs that have not arrived yet, so only "
                             "unidirectional modules can stream")
        self.module = module
        self.mode = module.mode
        # Imported here: torch_quantize loads libseqpack_torch, which streaming does without.
        from .torch_quantize import _Int8Layer  # noqa: PLC0415
        self.precision = "int8" if isinstance(module, _Int8Layer) else "fp32"
        self._impl = None
        self._key = None
        self._core()

    def _core(self):
        """The C++ streams over the module's parameter tensors (made at the first
        call; tensors replaced since are refused)."""
        weights = [getattr(self.module, n) for n in self.module._flat_weights_names]
        dtype = weights[0].dtype
        key = tuple(w.data_ptr() for w in weights)
        if self._impl is None:
            m = self.module
            options = _seqpack.RNNOptions(_CORE_MODES[m.mode], m.input_size, m.hidden_size,
                                          m.num_layers, m.bias, False, 0.0, False, m.proj_size,
                                          _CORE_DTYPES.get(dtype, _seqpack.DType.float32),
                                          getattr(_seqpack.Precision, self.precision))
            self._arrays = [_np(w, f"parameter {n}")
                            for w, n in zip(weights, self.module._flat_weights_names)]
            self._impl = _seqpack.StreamingRNN(options, self._arrays)
            self._key = key
        elif key != self._key:
            raise ValueError("StreamingRNN: the module's parameter tensors were replaced (for "
                             "example by .to() or .double()) after the streams were created; "
                             "create a new StreamingRNN")
        # A change of the values (in place, through .data, a NumPy view) needs
        # nothing here: each push compares the weights with its plan's copy.
        return self._impl

    def _state(self, hx, name):
        if hx is None:
            return None, None
        if self.mode == "LSTM":
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise TypeError(f"{name}: an LSTM stream's state is a tuple (h, c)")
            return _np(hx[0], f"{name}[0]"), _np(hx[1], f"{name}[1]")
        return _np(hx, name), None

    def open(self, hx=None):
        """A new stream from hx ([num_layers, hidden]; (h, c) for an LSTM) or zeros."""
        return self._core().open(*self._state(hx, "hx"))

    def push(self, stream_ids, chunks):
        """Runs chunks[i] ([len_i, input_size]) on stream stream_ids[i] in one batch;
        returns each chunk's outputs [len_i, hidden] as torch tensors."""
        core = self._core()
        # Ids past int64 are named here (pybind11 would say only "incompatible
        # function arguments"), as seqpack.streaming does.
        ids = [as_int(i, f"stream_ids[{k}]") for k, i in enumerate(stream_ids)]
        arrays = [_np(c, f"chunks[{k}]") for k, c in enumerate(chunks)]
        return [torch.from_numpy(y) for y in core.push(ids, arrays)]

    def reset(self, stream_id, hx=None):
        self._core().reset(as_int(stream_id, "stream_id"), *self._state(hx, "hx"))

    def close(self, stream_id):
        self._core().close(as_int(stream_id, "stream_id"))

    def state(self, stream_id):
        """h [num_layers, hidden], or (h, c) for an LSTM (copies)."""
        h, c = self._core().state(as_int(stream_id, "stream_id"))
        return (torch.from_numpy(h), torch.from_numpy(c)) if self.mode == "LSTM" \
            else torch.from_numpy(h)

    def open_ids(self):
        return list(self._core().open_ids())

    def __contains__(self, stream_id):
        return self._core().is_open(as_int(stream_id, "stream_id"))

    def __len__(self):
        return self._core().num_open
