"""seqpack.torch's layers (LSTM, GRU, RNN) and cells (LSTMCell, GRUCell,
RNNCell), and which kernels run CUDA tensors (seqpack's or torch's).

seqpack.torch re-exports the classes; they live here, below it, so that
torch_quantize (whose int8 layers subclass them) and torch_classifier (whose
model holds an LSTM) import them without importing seqpack.torch, which
re-exports those modules in turn (STYLE.md: Python modules import downward
only). Built on _torch_ops (the operators and packing functions); of the
public modules it imports only torch_onnx, lazily, under torch.onnx.export.
"""
import os
import warnings
import weakref
from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor, _VF
from torch.nn.utils.rnn import PackedSequence

from . import _torch_dynamo, _torch_nested, _torch_orig, _torch_packing
from ._torch_ops import _compiling, _lengths_tensor, _new_packed, _traced

# torch.get_autocast_dtype and the device-taking autocast queries (2.4+), looked
# up once: on torch 1.13 a hasattr per forward raises an AttributeError inside.
_AUTOCAST_BY_DEVICE = hasattr(torch, "get_autocast_dtype")

_CUDA_BACKEND: list = []  # [library path or None], once per process
_CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class CudaChoice(NamedTuple):
    """Who ran a layer's last forward on CUDA tensors ("seqpack" or "torch") and why."""
    impl: str
    why: str


_CUDA_LAST: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@torch.jit.unused
def _cuda_backend() -> Optional[str]:
    """The libseqpack_cuda.so the operators' C++ CUDA kernels run
    (seqpack_torch/cuda_ops.cpp, handed it here), or None where seqpack's CUDA
    kernels cannot run: SEQPACK_CUDA_LAYERS=torch, no library found, no GPU, or
    a libseqpack_torch built without CUDA kernels (seqpack/_cuda.py says why).
    Decided once per process. Where it is None, layers and cells run torch's
    implementation on CUDA tensors; where it is not, the layers' CUDA forwards
    call the operators, whose kernels run seqpack's kernels or torch's
    (SEQPACK_CUDA_LAYERS: auto, the default, the faster per configuration;
    docs/gpu.md "What runs on the GPU")."""
    if not _CUDA_BACKEND:
        path = None
        if torch.ops.seqpack._cuda_layers() != "torch":
            from . import _cuda
            if _cuda.available():
                path = _cuda.library_path()
            elif _cuda.named_library():
                # A library the user named and that cannot run is an error naming
                # it, not a silent fall-back to torch's kernels.
                raise RuntimeError("seqpack CUDA: " + _cuda.why_unavailable())
        _CUDA_BACKEND.append(path)
    return _CUDA_BACKEND[0]


@torch.jit.unused
def _cuda_operators():
    """What the layers' CUDA forwards call: torch.ops.seqpack, whose rnn and
    rnn_padded have C++ CUDA kernels (the tests put the same kernels' CPU
    registration here, to run them on CPU tensors)."""
    return torch.ops.seqpack


@torch.jit.unused
def cuda_choice(layer) -> Optional[CudaChoice]:
    """Who ran `layer`'s last forward on CUDA tensors and why, or None where no
    CUDA forward ran seqpack's operators (none yet, or seqpack's CUDA kernels
    cannot run: then torch's run, and seqpack._cuda.why_unavailable() says why)."""
    return _CUDA_LAST.get(layer)


@torch.jit.unused
def _cuda_runs(input: Tensor, weight: Tensor, h0: Optional[Tensor], c0: Optional[Tensor]) -> bool:
    """Whether seqpack runs this CUDA input (see _cuda_backend): float32, float16 or
    bfloat16 input, with weights and states of its dtype on its device, and at
    least one row (torch's implementation gives the errors and the empty cases)."""
    if _cuda_backend() is None or input.dtype not in _CUDA_DTYPES or input.numel() == 0:
        return False
    for t in (weight, h0, c0):
        if t is not None and (t.device != input.device or t.dtype != input.dtype):
            return False
    return True


class _QuantizationNotice:
    """torch.ao.quantization.quantize_dynamic selects modules by exact type: its
    default qconfig_spec names torch.nn.LSTM, ..., never a subclass, and gives
    every other module qconfig None, which leaves it float32. A seqpack layer
    named in qconfig_spec (type or submodule name) is swapped for seqpack's
    int8 layer (seqpack/torch_quantize.py registers the mapping); one left out
    says so, once per module, when torch sets its qconfig to None, instead of
    staying float32 without a word."""
    # Not compiled by TorchScript (torch.jit.script compiles properties); this
    # list replaces torch.nn.RNNBase's, whose all_weights it keeps.
    __jit_unused_properties__ = ["qconfig", "all_weights"]

    @property
    def qconfig(self):
        try:
            return self.__dict__["_seqpack_qconfig"]
        except KeyError:
            raise AttributeError("qconfig") from None

    @qconfig.setter
    def qconfig(self, value):
        if value is None and not self.__dict__.get("_seqpack_quantization_noticed", False):
            self.__dict__["_seqpack_quantization_noticed"] = True
            notice = self._quantization_notice()
            if notice:
                warnings.warn(notice, UserWarning, stacklevel=2)
        self.__dict__["_seqpack_qconfig"] = value

    @qconfig.deleter
    def qconfig(self):
        self.__dict__.pop("_seqpack_qconfig", None)

    @torch.jit.unused
    def _quantization_notice(self) -> str:
        name = type(self).__name__
        torch_type = next(c for c in type(self).__mro__ if c.__module__.startswith("torch.nn."))
        base = f"torch.nn.{torch_type.__name__}"
        if isinstance(self, _SeqpackCell):
            what = (f"seqpack has no int8 cell: for torch's int8 cell use a {base} there, or "
                    f"quantize the layers with seqpack.torch.quantize_dynamic")
        else:
            what = (f"name seqpack.torch.{name} (or this submodule) in qconfig_spec to swap it "
                    f"for seqpack's int8 Quantized{'RNN' if name == 'RNN' else name}, or use "
                    f"seqpack.torch.quantize_dynamic(model)")
        return (f"torch.ao.quantization leaves this seqpack.torch.{name} in float32: it selects "
                f"modules by exact type, and its qconfig_spec (by default {base}, ...) does not "
                f"name seqpack.torch.{name}; {what}")


class _SeqpackLayer(_QuantizationNotice):
    """What the three layers share. Every forward goes through _run, the one
    place that calls seqpack's operators."""

    def _run(self, input: Tensor, batch_sizes: Optional[Tensor], sorted_indices: Optional[Tensor],
             unsorted_indices: Optional[Tensor], lengths: Optional[Tensor],
             h0: Optional[Tensor], c0: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        """Packed rows (batch_sizes given) or a padded 3-D batch (optionally with
        lengths) -> (output, h_n, c_n), states in the caller's batch order; c_n
        is an empty tensor except for LSTM."""
        if self.dropout >= 1.0:
            # torch accepts dropout=1 (seqpack's operators do not): in training every
            # layer's output but the last is zeroed, in eval it is ignored. torch's
            # implementation gives those semantics.
            return self._torch_run(input, batch_sizes, sorted_indices, unsorted_indices, lengths,
                                   h0, c0)
        if not torch.jit.is_scripting() and self._autocast_bf16(input):
            # torch.autocast("cpu", dtype=torch.bfloat16): bf16 products with fp32
            # accumulation and fp32 state (seqpack's bf16 precision, where the CPU
            # has native bf16; "auto" keeps fp32 elsewhere), results in the input's dtype.
            dtype = input.dtype
            if (dtype == torch.float32 and (h0 is None or h0.dtype == torch.float32)
                    and (c0 is None or c0.dtype == torch.float32)):
                # fp32 in and out: no conversions (each a dispatch, ~0.2 us of a
                # small layer's ~12 us call).
                return self._core_run(input, batch_sizes, sorted_indices, unsorted_indices,
                                      lengths, h0, c0, "auto")
            out, h_n, c_n = self._core_run(input.float(), batch_sizes, sorted_indices,
                                           unsorted_indices, lengths,
                                           None if h0 is None else h0.float(),
                                           None if c0 is None else c0.float(), "auto")
            return out.to(dtype), h_n.to(dtype), c_n.to(dtype)
        if not self._seqpack_can_run(input, h0, c0):
            return self._torch_run(input, batch_sizes, sorted_indices, unsorted_indices, lengths,
                                   h0, c0)
        if not torch.jit.is_scripting() and input.is_cuda:
            return self._cuda_run(input, batch_sizes, sorted_indices, unsorted_indices, lengths,
                                  h0, c0)
        return self._core_run(input, batch_sizes, sorted_indices, unsorted_indices, lengths, h0,
                              c0, "fp32")

    @torch.jit.unused
    def _cuda_run(self, input: Tensor, batch_sizes: Optional[Tensor],
                  sorted_indices: Optional[Tensor], unsorted_indices: Optional[Tensor],
                  lengths: Optional[Tensor], h0: Optional[Tensor], c0: Optional[Tensor]
                  ) -> Tuple[Tensor, Tensor, Tensor]:
        """_run on CUDA tensors where seqpack's kernels can run them: the
        operators' C++ CUDA kernels, which run seqpack's kernels or torch's
        (SEQPACK_CUDA_LAYERS); cuda_choice(self) then says which ran."""
        ops = _cuda_operators()
        if batch_sizes is not None:
            out = ops.rnn(
                input, batch_sizes, sorted_indices, unsorted_indices, h0, c0, self._flat_weights,
                self.mode, self.hidden_size, self.num_layers, self.bias, self.bidirectional,
                self.proj_size, self.dropout, self.training, None, "fp32")
        elif _traced(input):
            return self._traced_padded(input, lengths, h0, c0, "fp32")
        else:
            out = ops.rnn_padded(
                input, lengths, h0, c0, self._flat_weights, self.mode, self.hidden_size,
                self.num_layers, self.bias, self.batch_first, self.bidirectional, self.proj_size,
                self.dropout, self.training, None, "fp32")
        if not _compiling():  # (torch.compile traces seqpack's kernels: nothing chosen)
            _CUDA_LAST[self] = CudaChoice(*torch.ops.seqpack._cuda_last_choice())
        return out

    def _core_run(self, input: Tensor, batch_sizes: Optional[Tensor],
                  sorted_indices: Optional[Tensor], unsorted_indices: Optional[Tensor],
                  lengths: Optional[Tensor], h0: Optional[Tensor], c0: Optional[Tensor],
                  precision: str) -> Tuple[Tensor, Tensor, Tensor]:
        if batch_sizes is not None:
            return torch.ops.seqpack.rnn(
                input, batch_sizes, sorted_indices, unsorted_indices, h0, c0, self._flat_weights,
                self.mode, self.hidden_size, self.num_layers, self.bias, self.bidirectional,
                self.proj_size, self.dropout, self.training, None, precision)
        if not torch.jit.is_scripting() and _traced(input):
            return self._traced_padded(input, lengths, h0, c0, precision)
        return torch.ops.seqpack.rnn_padded(
            input, lengths, h0, c0, self._flat_weights, self.mode, self.hidden_size,
            self.num_layers, self.bias, self.batch_first, self.bidirectional, self.proj_size,
            self.dropout, self.training, None, precision)

    @torch.jit.unused
    def _traced_padded(self, input: Tensor, lengths: Optional[Tensor], h0: Optional[Tensor],
                       c0: Optional[Tensor], precision: str) -> Tuple[Tensor, Tensor, Tensor]:
        """rnn_padded as torch.compile and torch.export trace it: the packed
        operators (rnn_padded's autograd kernel reads concrete sizes)."""
        bf = self.batch_first
        T, B = input.size(1 if bf else 0), input.size(0 if bf else 1)
        if lengths is not None:
            # seqpack's packing operators run on the CPU; torch's operators pack CUDA tensors.
            packing = _torch_packing if input.is_cuda else torch.ops.seqpack
            data, batch_sizes, sorted_indices, unsorted_indices = packing.pack_padded_sequence(
                input, lengths, bf, False)
            out, h_n, c_n = self._core_run(data, batch_sizes, sorted_indices, unsorted_indices,
                                           None, h0, c0, precision)
            if input.is_cuda:
                padded, _ = _torch_packing.pad_packed_sequence(
                    PackedSequence(out, batch_sizes, sorted_indices, unsorted_indices), bf, 0.0, T)
            else:
                padded, _ = torch.ops.seqpack.pad_packed_sequence(
                    out, batch_sizes, sorted_indices, unsorted_indices, bf, 0.0, T)
            return padded, h_n, c_n
        # Every sequence has length T. The identity permutation as indices keeps
        # the batch size a size the fake implementations know.
        time_major = input.transpose(0, 1) if bf else input
        data = time_major.reshape(T * B, input.size(2))
        index = torch.arange(B, dtype=torch.int64)
        batch_sizes = torch.full((T,), B, dtype=torch.int64)
        out, h_n, c_n = self._core_run(data, batch_sizes, index, index, None, h0, c0, precision)
        out = out.view(T, B, out.size(1))
        return out.transpose(0, 1) if bf else out, h_n, c_n

    @torch.jit.unused
    def _autocast_bf16(self, input: Tensor) -> bool:
        """Inside torch.autocast("cpu", dtype=torch.bfloat16), on CPU float32 or bfloat16
        input with float32 weights (the module itself is not converted under autocast)."""
        # The device-taking forms (2.4+) are what Dynamo traces without warnings.
        if _AUTOCAST_BY_DEVICE:
            if not (torch.is_autocast_enabled("cpu") and
                    torch.get_autocast_dtype("cpu") == torch.bfloat16):
                return False
        elif not (torch.is_autocast_cpu_enabled() and
                  torch.get_autocast_cpu_dtype() == torch.bfloat16):
            return False
        w = self._flat_weights[0]
        return (input.device.type == "cpu" and input.dtype in (torch.float32, torch.bfloat16)
                and w.device.type == "cpu" and w.dtype == torch.float32)

    @torch.jit.unused
    def _exporting_onnx(self) -> bool:
        return torch.onnx.is_in_onnx_export()

    @torch.jit.unused
    def _onnx_packed(self, input: PackedSequence, h0: Optional[Tensor], c0: Optional[Tensor]
                     ) -> Tuple[PackedSequence, Tensor, Tensor]:
        """_forward_packed under torch.onnx.export: ONNX's LSTM/GRU/RNN operators
        (seqpack/torch_onnx.py, which takes a layer's forward arguments)."""
        from . import torch_onnx
        out, hidden = torch_onnx.forward(self, input, self._hx(h0, c0))
        return (out,) + self._states(hidden, out.data)

    @torch.jit.unused
    def _onnx_padded(self, input: Tensor, h0: Optional[Tensor], c0: Optional[Tensor],
                     lengths: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        """_forward_padded under torch.onnx.export (see _onnx_packed)."""
        from . import torch_onnx
        if lengths is not None:
            raise ValueError("torch.onnx.export of a seqpack.torch layer called with lengths: "
                             "pack the input with pack_padded_sequence instead")
        out, hidden = torch_onnx.forward(self, input, self._hx(h0, c0))
        return (out,) + self._states(hidden, out)

    @torch.jit.unused
    def _hx(self, h0, c0):
        return None if h0 is None else ((h0, c0) if self.mode == "LSTM" else h0)

    @torch.jit.unused
    def _states(self, hidden, like):
        if self.mode == "LSTM":
            return hidden[0], hidden[1]
        return hidden, torch.empty(0, dtype=like.dtype)

    def _seqpack_can_run(self, input: Tensor, h0: Optional[Tensor], c0: Optional[Tensor]) -> bool:
        """The one place that decides who runs a forward: seqpack's operators for CPU
        float32/float64 input and states of the weights' dtype; anything else
        (CUDA, float16, bfloat16, ...) runs torch's implementation (_torch_run).
        (One weight stands for all: a module's parameters share a device and
        dtype unless set by hand, and then the operator names the odd one.)"""
        if input.is_cuda:
            # seqpack's CUDA kernels where they are built (_cuda_backend), else torch's.
            if torch.jit.is_scripting():
                return False
            return _cuda_runs(input, self._flat_weights[0], h0, c0)
        # is_cpu, not device.type: a torch.device per check costs more than the
        # rest of this method.
        dtype = input.dtype
        if not input.is_cpu or (dtype != torch.float32 and dtype != torch.float64):
            return False
        w = self._flat_weights[0]
        if not w.is_cpu or w.dtype != dtype:
            return False
        if h0 is not None and (not h0.is_cpu or h0.dtype != dtype):
            return False
        if c0 is not None and (not c0.is_cpu or c0.dtype != dtype):
            return False
        return True

    def _torch_run(self, input: Tensor, batch_sizes: Optional[Tensor],
                   sorted_indices: Optional[Tensor], unsorted_indices: Optional[Tensor],
                   lengths: Optional[Tensor], h0: Optional[Tensor], c0: Optional[Tensor]
                   ) -> Tuple[Tensor, Tensor, Tensor]:
        """_run through torch's kernels (torch's _VF calls, as torch.nn's forward makes them)."""
        total_length = 0
        if lengths is not None:
            total_length = input.size(1 if self.batch_first else 0)
            packed = _torch_orig.pack_padded_sequence(input, lengths.cpu(), self.batch_first,
                                                      enforce_sorted=False)
            input, batch_sizes = packed.data, packed.batch_sizes
            sorted_indices, unsorted_indices = packed.sorted_indices, packed.unsorted_indices
        if batch_sizes is not None:
            batch = int(batch_sizes[0])
        else:
            batch = input.size(0) if self.batch_first else input.size(1)
        layers = self.num_layers * (2 if self.bidirectional else 1)
        real_hidden = self.proj_size if self.proj_size > 0 else self.hidden_size
        if h0 is None:
            h0 = torch.zeros(layers, batch, real_hidden, dtype=input.dtype, device=input.device)
        elif sorted_indices is not None:
            h0 = h0.index_select(1, sorted_indices)
        c_n = torch.empty(0, dtype=input.dtype, device=input.device)
        w = self._flat_weights
        if self.mode == "LSTM":
            if c0 is None:
                c0 = torch.zeros(layers, batch, self.hidden_size, dtype=input.dtype,
                                 device=input.device)
            elif sorted_indices is not None:
                c0 = c0.index_select(1, sorted_indices)
            if batch_sizes is None:
                res3 = _VF.lstm(input, (h0, c0), w, self.bias, self.num_layers, self.dropout,
                              self.training, self.bidirectional, self.batch_first)
            else:
                res3 = _VF.lstm(input, batch_sizes, (h0, c0), w, self.bias, self.num_layers,
                              self.dropout, self.training, self.bidirectional)
            output, h_n, c_n = res3[0], res3[1], res3[2]
        else:
            if batch_sizes is None:
                if self.mode == "GRU":
                    res = _VF.gru(input, h0, w, self.bias, self.num_layers, self.dropout,
                              self.training, self.bidirectional, self.batch_first)
                elif self.mode == "RNN_TANH":
                    res = _VF.rnn_tanh(input, h0, w, self.bias, self.num_layers, self.dropout,
                              self.training, self.bidirectional, self.batch_first)
                else:
                    res = _VF.rnn_relu(input, h0, w, self.bias, self.num_layers, self.dropout,
                              self.training, self.bidirectional, self.batch_first)
            else:
                if self.mode == "GRU":
                    res = _VF.gru(input, batch_sizes, h0, w, self.bias, self.num_layers,
                              self.dropout, self.training, self.bidirectional)
                elif self.mode == "RNN_TANH":
                    res = _VF.rnn_tanh(input, batch_sizes, h0, w, self.bias, self.num_layers,
                              self.dropout, self.training, self.bidirectional)
                else:
                    res = _VF.rnn_relu(input, batch_sizes, h0, w, self.bias, self.num_layers,
                              self.dropout, self.training, self.bidirectional)
            output, h_n = res[0], res[1]
        if unsorted_indices is not None:
            h_n = h_n.index_select(1, unsorted_indices)
            if self.mode == "LSTM":
                c_n = c_n.index_select(1, unsorted_indices)
        if lengths is not None:
            assert batch_sizes is not None
            output, _ = _torch_orig.pad_packed_sequence(
                PackedSequence(output, batch_sizes, sorted_indices, unsorted_indices),
                self.batch_first, 0.0, total_length)
        return output, h_n, c_n

    def _check_packed(self, input: PackedSequence, h0: Optional[Tensor],
                      c0: Optional[Tensor], lengths: Optional[Tensor]) -> None:
        if lengths is not None:
            raise ValueError("lengths is for padded input; a PackedSequence has its own")
        if not torch.jit.is_scripting() and _traced(input.data):
            # torch.export does not trace torch.nn.RNNBase's check methods, and
            # the batch size may be known only when the graph runs: the
            # operator checks the shapes then.
            return
        self.check_input(input.data, input.batch_sizes)
        if h0 is None and c0 is None:
            return
        # The batch counts zero-length sequences, which have no packed rows.
        sorted_indices = input.sorted_indices
        if sorted_indices is not None:
            self._check_states(h0, c0, sorted_indices.size(0))
        else:
            self._check_states(h0, c0, int(input.batch_sizes[0]))

    def _padded_checks(self, input: Tensor, h0: Optional[Tensor], c0: Optional[Tensor],
                       lengths: Optional[Tensor]) -> Tuple[bool, Optional[Tensor], Optional[Tensor]]:
        """torch's checks of a padded input, with torch's messages; returns
        (is_batched, h0, c0) with unbatched states given a batch dimension."""
        if input.dim() not in (2, 3):
            # torch 2.x's message (torch 1.13 unsqueezes and fails in check_input)
            if self.mode == "LSTM" or self.mode == "GRU":
                torch_says = f"{self.mode}: Expected input to be 2D or 3D, got {input.dim()}D instead"
            else:
                torch_says = (f"RNN: Expected input to be 2D or 3D, got {input.dim()}D tensor "
                              f"instead")
            raise ValueError(f"{torch_says}; the input has shape {list(input.shape)}: (time, "
                             f"batch, input_size), (batch, time, input_size) with batch_first, "
                             f"or (time, input_size) for one sequence")
        is_batched = input.dim() == 3
        want = 3 if is_batched else 2
        kind = "batched 3-D" if is_batched else "unbatched 2-D"
        if h0 is not None:
            if c0 is not None:
                if h0.dim() != want or c0.dim() != want:
                    raise RuntimeError(f"For {kind} input, hx and cx should also be {want}-D but "
                                       f"got ({h0.dim()}-D, {c0.dim()}-D) tensors")
            elif h0.dim() != want:
                raise RuntimeError(f"For {kind} input, hx should also be {want}-D but got "
                                   f"{h0.dim()}-D tensor")
            if not is_batched:
                h0 = h0.unsqueeze(1)
                if c0 is not None:
                    c0 = c0.unsqueeze(1)
        batch_dim = 0 if self.batch_first else 1
        x = input if is_batched else input.unsqueeze(batch_dim)
        if not torch.jit.is_scripting() and _traced(x):
            return is_batched, h0, c0  # as in _check_packed
        self.check_input(x, None)
        if lengths is not None and (lengths.dim() != 1 or lengths.size(0) != x.size(batch_dim)):
            raise ValueError(f"lengths must be 1-D with one entry per sequence ({x.size(batch_dim)}), "
                             f"got shape {list(lengths.size())}")
        self._check_states(h0, c0, x.size(batch_dim))
        return is_batched, h0, c0

    def _check_states(self, h0: Optional[Tensor], c0: Optional[Tensor], batch: int) -> None:
        layers = self.num_layers * (2 if self.bidirectional else 1)
        real_hidden = self.proj_size if self.proj_size > 0 else self.hidden_size
        if h0 is not None:
            # torch's messages: LSTM names hidden[0] and hidden[1].
            msg = "Expected hidden[0] size {}, got {}" if c0 is not None else \
                "Expected hidden size {}, got {}"
            self.check_hidden_size(h0, (layers, batch, real_hidden), msg)
        if c0 is not None:
            self.check_hidden_size(c0, (layers, batch, self.hidden_size),
                                   "Expected hidden[1] size {}, got {}")

    def _forward_padded(self, input: Tensor, h0: Optional[Tensor], c0: Optional[Tensor],
                        lengths: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        if not torch.jit.is_scripting() and lengths is not None:
            lengths = _lengths_tensor(lengths, f"{type(self).__name__}.forward")
        if not torch.jit.is_scripting() and self._exporting_onnx():
            return self._onnx_padded(input, h0, c0, lengths)
        is_batched, h0, c0 = self._padded_checks(input, h0, c0, lengths)
        steps = input.size(1 if self.batch_first and is_batched else 0)
        if lengths is None and steps == 0:
            # torch's error (aten/src/ATen/native/RNN.cpp), rather than an
            # h_n for no sequence.
            raise RuntimeError(f"Expected sequence length to be larger than 0 in RNN; "
                               f"{self.mode}: the padded input of shape "
                               f"{list(input.shape)} has no time steps "
                               f"(batch_first={self.batch_first}); pass lengths to run "
                               f"zero-length sequences (h_n is then h0)")
        if is_batched:
            return self._run(input, None, None, None, lengths, h0, c0)
        batch_dim = 0 if self.batch_first else 1
        out, h_n, c_n = self._run(input.unsqueeze(batch_dim), None, None, None, lengths, h0, c0)
        return out.squeeze(batch_dim), h_n.squeeze(1), c_n.squeeze(1) if c_n.dim() == 3 else c_n

    @torch.jit.unused
    def _forward_nested(self, input: Tensor, h0: Optional[Tensor], c0: Optional[Tensor],
                        lengths: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        """A jagged nested tensor (batch, ragged steps, input_size) through
        _forward_packed, the output a nested tensor with the input's offsets
        (seqpack/_torch_nested.py)."""
        return _torch_nested.forward(self, input, h0, c0, lengths)

    def _forward_packed(self, input: PackedSequence, h0: Optional[Tensor],
                        c0: Optional[Tensor], lengths: Optional[Tensor]
                        ) -> Tuple[PackedSequence, Tensor, Tensor]:
        if not torch.jit.is_scripting() and self._exporting_onnx():
            return self._onnx_packed(input, h0, c0)
        self._check_packed(input, h0, c0, lengths)
        out, h_n, c_n = self._run(input.data, input.batch_sizes, input.sorted_indices,
                                  input.unsorted_indices, None, h0, c0)
        if not torch.jit.is_scripting():
            # The input's batch_sizes and indices, which PackedSequence's
            # constructor checked when the input was made: only the tuple is new.
            return _new_packed(out, input), h_n, c_n
        return PackedSequence(out, input.batch_sizes, input.sorted_indices,
                              input.unsorted_indices), h_n, c_n


# Each layer class declares its own forward and overloads, alike as they are:
# TorchScript finds a forward's overloads by the name of the class that
# declares them (torch._jit_internal._get_overloaded_methods), so a forward
# inherited from a shared base would compile without them.
class LSTM(_SeqpackLayer, torch.nn.LSTM):
    """torch.nn.LSTM with seqpack's forward and backward.

    forward(input, hx=None, lengths=None): as torch's; with `lengths` (int64,
    one per sequence) a padded input runs packed: the output has zeros at the
    padding and h_n, c_n are each sequence's state at its own last step. A
    jagged nested tensor (batch, ragged steps, input_size; PyTorch 2.6+) runs
    as its PackedSequence: the output is a nested tensor with its offsets, h_n,
    c_n in its batch order.
    """

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
            if not torch.jit.is_scripting() and input.is_nested:
                output, h_n, c_n = self._forward_nested(input, h0, c0, lengths)
                return output, (h_n, c_n)
            output, h_n, c_n = self._forward_padded(input, h0, c0, lengths)
            return output, (h_n, c_n)


class GRU(_SeqpackLayer, torch.nn.GRU):
    """torch.nn.GRU with seqpack's forward and backward (`lengths` and nested
    tensors as for LSTM)."""

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
            if not torch.jit.is_scripting() and input.is_nested:
                output, h_n, _ = self._forward_nested(input, hx, None, lengths)
                return output, h_n
            output, h_n, _ = self._forward_padded(input, hx, None, lengths)
            return output, h_n


class RNN(_SeqpackLayer, torch.nn.RNN):
    """torch.nn.RNN (tanh or relu) with seqpack's forward and backward (`lengths`
    and nested tensors as for LSTM)."""

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
            if not torch.jit.is_scripting() and input.is_nested:
                output, h_n, _ = self._forward_nested(input, hx, None, lengths)
                return output, h_n
            output, h_n, _ = self._forward_padded(input, hx, None, lengths)
            return output, h_n


class _SeqpackCell(_QuantizationNotice):
    """What the three cells share. A cell step is a packed batch of one step
    (batch_sizes [B]) through seqpack::rnn, the layers' operator, with the cell's
    weights as a one-layer layer's (torch's names and order: weight_ih, weight_hh,
    bias_ih, bias_hh); it runs where the layers run seqpack (CPU float32/float64,
    states of the weights' dtype and shape) and a batch is not empty. Anything
    else runs torch's cell, so torch's checks and errors apply unchanged."""

    def _cell_mode(self) -> str:
        return "LSTM"

    def _cell_runs(self, input: Tensor, h0: Optional[Tensor], c0: Optional[Tensor]) -> bool:
        if input.dim() != 1 and input.dim() != 2:
            return False
        batched = input.dim() == 2
        if (batched and input.size(0) == 0) or input.size(-1) != self.input_size:
            return False
        if self.hidden_size == 0:  # torch's cell gives the empty states
            return False
        if input.is_cuda:
            if torch.jit.is_scripting():
                return False
            if not _cuda_runs(input, self.weight_ih, h0, c0):
                return False
        elif not input.is_cpu:
            return False
        dtype = input.dtype
        if dtype != torch.float32 and dtype != torch.float64:
            return False
        w = self.weight_ih
        if w.dtype != dtype or w.device != input.device:
            return False
        if not torch.jit.is_scripting() and _autocast_cpu():
            return False
        shape = [input.size(0), self.hidden_size] if batched else [self.hidden_size]
        for s in (h0, c0):
            if s is not None and (s.dtype != dtype or s.device != input.device
                                  or list(s.shape) != shape):
                return False
        return True

    def _cell_step(self, input: Tensor, h0: Optional[Tensor], c0: Optional[Tensor]
                   ) -> Tuple[Tensor, Tensor]:
        """(h', c') by seqpack::rnn (c' empty but for LSTMCell)."""
        batched = input.dim() == 2
        x = input if batched else input.unsqueeze(0)
        # Zero states where none are given, as torch's cells make them: the
        # states give the operator's fake implementation the batch size under
        # torch.compile (without indices or states it is a value of batch_sizes).
        if h0 is None:
            h = x.new_zeros(1, x.size(0), self.hidden_size)
        else:
            h = (h0 if batched else h0.unsqueeze(0)).unsqueeze(0)
        c: Optional[Tensor] = None
        if self._cell_mode() == "LSTM":
            if c0 is None:
                c = x.new_zeros(1, x.size(0), self.hidden_size)
            else:
                c = (c0 if batched else c0.unsqueeze(0)).unsqueeze(0)
        weights = [self.weight_ih, self.weight_hh]
        if self.bias:
            weights = weights + [self.bias_ih, self.bias_hh]
        batch_sizes = torch.full([1], x.size(0), dtype=torch.int64)
        out, h_n, c_n = torch.ops.seqpack.rnn(
            x, batch_sizes, None, None, h, c, weights, self._cell_mode(), self.hidden_size, 1,
            self.bias, False, 0, 0.0, False, None, "fp32")
        if self._cell_mode() == "LSTM":
            c_n = c_n[0] if batched else c_n[0, 0]
        return (out if batched else out.squeeze(0)), c_n

    @torch.jit.unused
    def _torch_forward(self, input: Tensor, hx):
        """torch.nn's forward of this cell (the class after seqpack's in the MRO)."""
        return super(_SeqpackCell, self).forward(input, hx)


@torch.jit.unused
def _autocast_cpu() -> bool:
    if _AUTOCAST_BY_DEVICE:
        return torch.is_autocast_enabled("cpu")
    return torch.is_autocast_cpu_enabled()


def _torch_cell_input(input: Tensor, name: str) -> bool:
    """torch's check of a cell's input (TorchScript's path), -> whether batched."""
    if input.dim() != 1 and input.dim() != 2:
        raise ValueError(f"{name}: Expected input to be 1-D or 2-D but received "
                         f"{input.dim()}-D tensor")
    return input.dim() == 2


class LSTMCell(_SeqpackCell, torch.nn.LSTMCell):
    """torch.nn.LSTMCell running seqpack's kernels (a one-step seqpack::rnn) on CPU
    float32/float64, torch's cell elsewhere. forward(input, hx=None) -> (h', c'),
    input [B, input_size] or unbatched [input_size]."""

    def forward(self, input: Tensor, hx: Optional[Tuple[Tensor, Tensor]] = None
                ) -> Tuple[Tensor, Tensor]:
        h0: Optional[Tensor] = None
        c0: Optional[Tensor] = None
        if hx is not None:
            h0, c0 = hx[0], hx[1]
        if self._cell_runs(input, h0, c0):
            return self._cell_step(input, h0, c0)
        if not torch.jit.is_scripting():
            return self._torch_forward(input, hx)
        batched = _torch_cell_input(input, "LSTMCell")
        x = input if batched else input.unsqueeze(0)
        if h0 is None or c0 is None:
            zeros = torch.zeros(x.size(0), self.hidden_size, dtype=x.dtype, device=x.device)
            h0, c0 = zeros, zeros
        elif not batched:
            h0, c0 = h0.unsqueeze(0), c0.unsqueeze(0)
        h, c = _VF.lstm_cell(x, (h0, c0), self.weight_ih, self.weight_hh, self.bias_ih,
                             self.bias_hh)
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(_SeqpackCell, torch.nn.GRUCell):
    """torch.nn.GRUCell running seqpack's kernels on CPU float32/float64 (as
    LSTMCell), torch's cell elsewhere. forward(input, hx=None) -> h'."""

    def _cell_mode(self) -> str:
        return "GRU"

    def forward(self, input: Tensor, hx: Optional[Tensor] = None) -> Tensor:
        if self._cell_runs(input, hx, None):
            return self._cell_step(input, hx, None)[0]
        if not torch.jit.is_scripting():
            return self._torch_forward(input, hx)
        batched = _torch_cell_input(input, "GRUCell")
        x = input if batched else input.unsqueeze(0)
        if hx is None:
            h0 = torch.zeros(x.size(0), self.hidden_size, dtype=x.dtype, device=x.device)
        else:
            h0 = hx if batched else hx.unsqueeze(0)
        h = _VF.gru_cell(x, h0, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        return h if batched else h.squeeze(0)


class RNNCell(_SeqpackCell, torch.nn.RNNCell):
    """torch.nn.RNNCell (tanh or relu) running seqpack's kernels on CPU
    float32/float64 (as LSTMCell), torch's cell elsewhere. forward(input, hx=None) -> h'."""

    def _cell_mode(self) -> str:
        return "RNN_TANH" if self.nonlinearity == "tanh" else "RNN_RELU"

    def forward(self, input: Tensor, hx: Optional[Tensor] = None) -> Tensor:
        if self.nonlinearity in ("tanh", "relu") and self._cell_runs(input, hx, None):
            return self._cell_step(input, hx, None)[0]
        if not torch.jit.is_scripting():
            return self._torch_forward(input, hx)
        batched = _torch_cell_input(input, "RNNCell")
        x = input if batched else input.unsqueeze(0)
        if hx is None:
            h0 = torch.zeros(x.size(0), self.hidden_size, dtype=x.dtype, device=x.device)
        else:
            h0 = hx if batched else hx.unsqueeze(0)
        if self.nonlinearity == "tanh":
            h = _VF.rnn_tanh_cell(x, h0, self.weight_ih, self.weight_hh, self.bias_ih,
                                  self.bias_hh)
        elif self.nonlinearity == "relu":
            h = _VF.rnn_relu_cell(x, h0, self.weight_ih, self.weight_hh, self.bias_ih,
                                  self.bias_hh)
        else:
            raise RuntimeError(f"Unknown nonlinearity: {self.nonlinearity}")
        return h if batched else h.squeeze(0)


# torch.compile traces the layers without the user's allow_rnn (seqpack/_torch_dynamo.py).
_torch_dynamo.install(_SeqpackLayer)
