"""Drop-in replacements for torch.nn.LSTM, GRU and RNN running seqpack's kernels.

    from seqpack.torch import LSTM      # instead of torch.nn.LSTM
    lstm = LSTM(128, 256, batch_first=True)

The classes subclass torch's, so constructor arguments, parameter names,
initialisation (same RNG draws), state_dict, repr, optimisers and
DistributedDataParallel behave exactly as with torch's modules. Only forward
changes: the recurrence runs in seqpack's C++ core (rnn_forward/rnn_backward)
through a torch.autograd.Function, with torch tensors shared with the core
through NumPy views instead of copies. Inputs seqpack cannot run (not on the
CPU, or not float32/float64) go to torch's own implementation.
"""
import torch
from torch.nn.utils.rnn import PackedSequence

from . import _seqpack
from . import torch_onnx as _onnx

__all__ = ["LSTM", "GRU", "RNN", "RNNFunction"]

_CORE_MODES = {"RNN_TANH": _seqpack.RNNMode.rnn_tanh, "RNN_RELU": _seqpack.RNNMode.rnn_relu,
               "LSTM": _seqpack.RNNMode.lstm, "GRU": _seqpack.RNNMode.gru}
_CORE_DTYPES = {torch.float32: _seqpack.DType.float32, torch.float64: _seqpack.DType.float64}


def _np(t):
    """NumPy view of a CPU tensor (a copy only when it is not contiguous); None stays None."""
    if t is None:
        return None
    return t.detach().contiguous().numpy()


def _torch(a):
    return None if a is None else torch.from_numpy(a)


class RNNFunction(torch.autograd.Function):
    """Autograd node of one multi-layer recurrent forward on packed rows.

    apply(options, plan, training, dropout_seed, data, h0, c0, *weights) with
    `options` a _seqpack.RNNOptions, `plan` the _seqpack.PackingPlan of `data`
    ([plan.total_rows, input_size]) and weights in torch's _flat_weights order.
    Returns (output rows, h_n) plus c_n for an LSTM.
    """

    @staticmethod
    def forward(ctx, options, plan, training, dropout_seed, data, h0, c0, *weights):
        out, h_n, c_n, saved = _seqpack.rnn_forward(
            options, [_np(w) for w in weights], _np(data), plan, _np(h0), _np(c0), training,
            True, dropout_seed)
        ctx.core_saved = saved
        ctx.is_lstm = c_n is not None
        # Saved only so torch's version counters catch in-place changes of
        # what the core still points to.
        ctx.save_for_backward(data, h0, c0, *weights)
        # Unused outputs get None, not zero tensors: the core treats missing
        # upstream gradients as zeros without materialising them.
        ctx.set_materialize_grads(False)
        if ctx.is_lstm:
            return _torch(out), _torch(h_n), _torch(c_n)
        return _torch(out), _torch(h_n)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output, grad_h_n, grad_c_n=None):
        ctx.saved_tensors  # raises if an input was modified in place since forward
        need = ctx.needs_input_grad
        # Without a gradient for h0/c0 the core skips the products only they need.
        g_in, g_h0, g_c0, g_w = _seqpack.rnn_backward(ctx.core_saved, _np(grad_output),
                                                      _np(grad_h_n), _np(grad_c_n),
                                                      need[5] or need[6])
        grads = [None, None, None, None,
                 _torch(g_in) if need[4] else None,
                 _torch(g_h0) if need[5] else None,
                 _torch(g_c0) if need[6] else None]
        grads += [_torch(g) if n else None for g, n in zip(g_w, need[7:])]
        return tuple(grads)


class _SeqpackForward:
    """forward() of torch.nn.RNNBase subclasses, running seqpack's core."""

    def _seqpack_can_run(self, x, weights, hx_tensors):
        tensors = [x] + weights + hx_tensors
        return all(t.device.type == "cpu" and t.dtype == x.dtype for t in tensors) and \
            x.dtype in _CORE_DTYPES

    def _core_options(self, dtype):
        return _seqpack.RNNOptions(_CORE_MODES[self.mode], self.input_size, self.hidden_size,
                                   self.num_layers, self.bias, False, float(self.dropout),
                                   self.bidirectional, self.proj_size, _CORE_DTYPES[dtype])

    def forward(self, input, hx=None):  # noqa: C901 (mirrors torch's forward)
        if torch.onnx.is_in_onnx_export():  # torch.onnx.export: ONNX's LSTM/GRU/RNN operators
            return _onnx.forward(self, input, hx)
        is_lstm = self.mode == "LSTM"
        packed = isinstance(input, PackedSequence)
        if packed:
            x, batch_sizes, sorted_indices, unsorted_indices = input
            is_batched = True
        else:
            if not isinstance(input, torch.Tensor):
                raise TypeError(f"input must be a Tensor or a PackedSequence, got "
                                f"{type(input).__name__}")
            if input.dim() not in (2, 3):
                raise ValueError(f"{type(self).__name__}: Expected input to be 2-D or 3-D but "
                                 f"received {input.dim()}-D tensor")
            x, batch_sizes = input, None
            is_batched = input.dim() == 3
            batch_dim = 0 if self.batch_first else 1
            if not is_batched:
                x = x.unsqueeze(batch_dim)

        h0 = c0 = None
        if hx is not None:
            if is_lstm:
                if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                    raise TypeError("LSTM expects hx as a tuple (h_0, c_0)")
                h0, c0 = hx
            else:
                h0 = hx
            states = [h0, c0] if is_lstm else [h0]
            if not packed:
                want = 3 if is_batched else 2
                if any(s.dim() != want for s in states):
                    # torch's messages, word for word.
                    kind = "batched 3-D" if is_batched else "unbatched 2-D"
                    if is_lstm:
                        raise RuntimeError(f"For {kind} input, hx and cx should also be {want}-D "
                                           f"but got ({h0.dim()}-D, {c0.dim()}-D) tensors")
                    raise RuntimeError(f"For {kind} input, hx should also be {want}-D but got "
                                       f"{h0.dim()}-D tensor")
                if not is_batched:
                    h0 = h0.unsqueeze(1)
                    c0 = c0.unsqueeze(1) if c0 is not None else None
            # torch's checks, with torch's messages.
            self.check_forward_args(x, (h0, c0) if is_lstm else h0, batch_sizes)
        else:
            self.check_input(x, batch_sizes)

        weights = [getattr(self, n) for n in self._flat_weights_names]
        hx_tensors = [t for t in (h0, c0) if t is not None]
        if not self._seqpack_can_run(x, weights, hx_tensors):
            return super().forward(input, hx)

        if packed:
            plan = _seqpack.PackingPlan.from_packed(
                (_np(x), _np(batch_sizes), _np(sorted_indices), _np(unsorted_indices)))
            data = x
        else:
            # Sequences of equal length T: packed rows are the time-major
            # padded rows, so [T, B, I] is already packed data (a view).
            time_major = x.transpose(0, 1) if self.batch_first else x
            T, B = time_major.shape[0], time_major.shape[1]
            data = time_major.contiguous().view(T * B, self.input_size)
            plan = _seqpack.PackingPlan.from_lengths([T] * B, True)

        training = bool(self.training)
        seed = 0
        if training and self.dropout > 0 and self.num_layers > 1:
            # Drawn from torch's generator so torch.manual_seed replays the masks.
            seed = int(torch.randint(0, 2**62, (1,)).item())
        options = self._core_options(x.dtype)
        needs_grad = torch.is_grad_enabled() and any(
            t.requires_grad for t in [data] + hx_tensors + weights)
        if needs_grad:
            result = RNNFunction.apply(options, plan, training, seed, data, h0, c0, *weights)
        else:
            out, h_n, c_n, _ = _seqpack.rnn_forward(
                options, [_np(w) for w in weights], _np(data), plan, _np(h0), _np(c0), training,
                False, seed)
            result = (_torch(out), _torch(h_n)) + ((_torch(c_n),) if is_lstm else ())
        output, hidden = result[0], (result[1:] if is_lstm else result[1])
        if is_lstm:
            hidden = tuple(hidden)

        if packed:
            return PackedSequence(output, batch_sizes, sorted_indices, unsorted_indices), hidden
        output = output.view(T, B, output.shape[-1])
        if self.batch_first:
            output = output.transpose(0, 1)
        if not is_batched:
            output = output.squeeze(batch_dim)
            hidden = tuple(h.squeeze(1) for h in hidden) if is_lstm else hidden.squeeze(1)
        return output, hidden


class LSTM(_SeqpackForward, torch.nn.LSTM):
    """torch.nn.LSTM with seqpack's forward and backward."""


class GRU(_SeqpackForward, torch.nn.GRU):
    """torch.nn.GRU with seqpack's forward and backward."""


class RNN(_SeqpackForward, torch.nn.RNN):
    """torch.nn.RNN (tanh or relu) with seqpack's forward and backward."""
