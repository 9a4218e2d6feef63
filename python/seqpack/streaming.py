"""Streaming inference on NumPy arrays: per-stream state of a unidirectional
seqpack.nn RNN/LSTM/GRU fed in chunks as data arrives.

    lstm = seqpack.nn.LSTM(40, 256, num_layers=2)
    streams = seqpack.streaming.StreamingRNN(lstm)     # shares lstm's parameters
    a, b = streams.open(), streams.open()
    y_a, y_b = streams.push([a, b], [chunk_a, chunk_b])  # [len, 40] each -> [len, 256]
    c = streams.open()                                 # a stream starting mid-flight
    y_c, y_a = streams.push([c, a], [chunk_c, next_a])
    h, c_state = streams.state(a)                      # [num_layers, 256] each
    streams.close(b)

Each push runs the chunks of all its streams as one packed batch in the C++
core (include/seqpack/streaming.h). Feeding a sequence in any split into
chunks, interleaved with other streams, gives the outputs and final state of
one forward over the whole sequence. Ids come from open() and are never reused;
unknown or closed ids, a stream twice in one push, and chunks of the wrong
feature size or dtype raise ValueError naming them; a bidirectional model
raises ValueError.
"""
from . import _seqpack
from ._checks import as_array, as_int
from .nn import RNNBase

__all__ = ["StreamingRNN"]


class StreamingRNN:
    """Per-stream (h, c) of `module`, a unidirectional seqpack.nn.RNN/LSTM/GRU."""

    def __init__(self, module):
        if not isinstance(module, RNNBase):
            raise TypeError("StreamingRNN expects a seqpack.nn.RNN, LSTM or GRU, got "
                            f"{type(module).__name__}")
        self.mode = module.mode
        self.dtype = module.dtype
        self._impl = _seqpack.StreamingRNN(module._impl)

    def _state_arrays(self, hx, name):
        if hx is None:
            return None, None
        if self.mode == "LSTM":
            if not isinstance(hx, tuple) or len(hx) != 2:
                raise TypeError(f"{name}: an LSTM stream's state is a tuple (h, c), got "
                                f"{type(hx).__name__}")
            return (as_array(hx[0], f"{name}[0]", float_only=True),
                    as_array(hx[1], f"{name}[1]", float_only=True))
        if isinstance(hx, tuple):
            raise TypeError(f"{name}: a {self.mode} stream's state is one array, got a tuple")
        return as_array(hx, name, float_only=True), None

    def open(self, hx=None):
        """A new stream starting from hx ([num_layers, hidden]; (h, c) for an LSTM) or
        zeros. Returns its id."""
        return self._impl.open(*self._state_arrays(hx, "hx"))

    def push(self, stream_ids, chunks):
        """Runs chunks[i] ([len_i, input_size], len_i >= 0) on stream stream_ids[i], all
        in one batch; returns each chunk's outputs [len_i, hidden] in the order given."""
        ids = [as_int(i, f"stream_ids[{k}]") for k, i in enumerate(stream_ids)]
        arrays = [as_array(c, f"chunks[{k}]", float_only=True) for k, c in enumerate(chunks)]
        return self._impl.push(ids, arrays)

    def reset(self, stream_id, hx=None):
        """Back to hx (zeros when None), as if the stream had just opened."""
        self._impl.reset(as_int(stream_id, "stream_id"), *self._state_arrays(hx, "hx"))

    def replan(self):
        """Lays out the weight matrices again from their current values: the streams
        read W_hh through the model's plan, made when they were made (quantized at
        'int8', laid out at the first push at fp32), so a change to the arrays is seen
        once this is called (the biases, and W_ih outside int8, are read at each push)."""
        self._impl.replan()

    def close(self, stream_id):
        """Forgets the stream; its id is rejected from now on."""
        self._impl.close(as_int(stream_id, "stream_id"))

    def state(self, stream_id):
        """A copy of the stream's state: h [num_layers, hidden], or (h, c) for an LSTM."""
        h, c = self._impl.state(as_int(stream_id, "stream_id"))
        return (h, c) if self.mode == "LSTM" else h

    def open_ids(self):
        return list(self._impl.open_ids())

    def __contains__(self, stream_id):
        return self._impl.is_open(as_int(stream_id, "stream_id"))

    def __len__(self):
        return self._impl.num_open
