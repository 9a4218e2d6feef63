"""The fake implementations of seqpack's operators (PyTorch 2.4+): what
torch.compile and torch.export run instead of the operators while they trace,
the outputs' shapes and dtypes, no computation, on any device (the CPU
operators' and the CUDA kernels' alike: seqpack_torch/ops.cpp, cuda_ops.cpp).
register(namespace) registers them; _torch_ops does for seqpack's operators,
and the CUDA kernels' standalone build for the GPU machine's tools
(bench/cuda_operators.py, which loads this file by path: it imports only torch).
"""
from typing import Optional

import torch
from torch import Tensor


# What torch.compile and torch.export run instead of the operators while they
# trace: the outputs' shapes and dtypes, no computation. The packed row count
# (the sum of the lengths) and the number of time steps (the longest length)
# depend on the lengths' values, so pack_padded_sequence's fake makes them
# unbacked sizes (ctx.new_dynamic_size()); the batch size is the lengths' size
# and stays a known (possibly symbolic) size through the indices. Autograd is
# the operators' C++ autograd kernels, whose forward and backward call
# operators (seqpack::_rnn_train, _rnn_backward, _*_backward) with fakes here.
# PyTorch before 2.4 has no torch.library.register_fake: nothing is registered
# and torch.compile cannot trace the operators.


def _is_unbacked(n) -> bool:
    if not isinstance(n, torch.SymInt):
        return False
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    return bool(free_unbacked_symbols(n))


def _dynamic_size(ctx):
    """A size known only when the graph runs (an unbacked symbol). Dynamo's
    ctx.new_dynamic_size() refuses unless torch._dynamo.config.
    capture_dynamic_output_shape_ops (a graph break at every operator with such
    outputs: torch's own pack_padded_sequence); seqpack's operators opt in on
    their own, with the same symbol from the same ShapeEnv, so a packed model
    compiles with fullgraph=True without changing that setting for other code."""
    try:
        return ctx.new_dynamic_size()
    except torch._subclasses.fake_tensor.DynamicOutputShapeException:
        shape_env = getattr(ctx, "_shape_env", None)
        if shape_env is None:
            raise
        n = shape_env.create_unbacked_symint()
        torch._check_is_size(n)
        return n


def _fake_batch(ctx, h0: Optional[Tensor], sorted_indices: Optional[Tensor]):
    """The batch size of a packed batch as the operators find it: the indices'
    size where there are indices (an empty index tensor stands for none), else
    the first batch size, a value."""
    if sorted_indices is not None:
        n = sorted_indices.size(0)
        if not _is_unbacked(n) and n != 0:
            return n
    if h0 is not None:
        return h0.size(1)
    return _dynamic_size(ctx)


def _fake_rnn(data, batch_sizes, sorted_indices, unsorted_indices, h0, c0, weights, mode,
              hidden_size, num_layers, bias, bidirectional, proj_size, dropout, train, seed=None,
              precision="fp32"):
    ctx = torch.library.get_ctx()
    directions = 2 if bidirectional else 1
    real_hidden = proj_size if proj_size > 0 else hidden_size
    batch = _fake_batch(ctx, h0, sorted_indices)
    output = data.new_empty((data.size(0), directions * real_hidden))
    return (output,) + _fake_states(data, mode, num_layers * directions, batch, hidden_size,
                                    real_hidden)


def _fake_states(like, mode, layers, batch, hidden_size, real_hidden):
    """h_n and c_n (empty but for LSTM) of the fake implementations."""
    h_n = like.new_empty((layers, batch, real_hidden))
    c_n = like.new_empty((layers, batch, hidden_size) if mode == "LSTM" else (0,))
    return h_n, c_n


def _fake_rnn_train(*args, **kwargs):
    output, h_n, c_n = _fake_rnn(*args, **kwargs)
    return output, h_n, c_n, output.new_empty((1,), dtype=torch.uint8)


def _fake_rnn_backward(saved, grad_output, grad_h_n, grad_c_n, data, h0, c0, weights, input_grad,
                       state_grad):
    empty = data.new_empty((0,))
    return (data.new_empty(data.shape) if input_grad else empty,
            h0.new_empty(h0.shape) if state_grad and h0 is not None else empty,
            c0.new_empty(c0.shape) if state_grad and c0 is not None else data.new_empty((0,)),
            [w.new_empty(w.shape) for w in weights])


def _fake_rnn_nested(values, offsets, h0, c0, weights, mode, hidden_size, num_layers, bias,
                     bidirectional, proj_size, dropout, train, seed=None, precision="fp32"):
    directions = 2 if bidirectional else 1
    real_hidden = proj_size if proj_size > 0 else hidden_size
    output = values.new_empty((values.size(0), directions * real_hidden))
    return (output,) + _fake_states(values, mode, num_layers * directions, offsets.size(0) - 1,
                                    hidden_size, real_hidden)


def _fake_rnn_nested_train(*args, **kwargs):
    output, h_n, c_n = _fake_rnn_nested(*args, **kwargs)
    return output, h_n, c_n, output.new_empty((1,), dtype=torch.uint8)


def _fake_rnn_nested_backward(saved, offsets, grad_output, grad_h_n, grad_c_n, values, h0, c0,
                              weights, input_grad, state_grad):
    return _fake_rnn_backward(saved, grad_output, grad_h_n, grad_c_n, values, h0, c0, weights,
                              input_grad, state_grad)


def _fake_rnn_padded(input, lengths, h0, c0, weights, mode, hidden_size, num_layers, bias,
                     batch_first, bidirectional, proj_size, dropout, train, seed=None,
                     precision="fp32"):
    directions = 2 if bidirectional else 1
    real_hidden = proj_size if proj_size > 0 else hidden_size
    T, B = (input.size(1), input.size(0)) if batch_first else (input.size(0), input.size(1))
    if lengths is not None or not batch_first:  # padded by pad_packed_sequence, or a view
        shape = (B, T) if batch_first else (T, B)
        output = input.new_empty(shape + (directions * real_hidden,))
    else:
        output = input.new_empty((T, B, directions * real_hidden)).transpose(0, 1)
    return (output,) + _fake_states(input, mode, num_layers * directions, B, hidden_size,
                                    real_hidden)


def _fake_pack(input, lengths, batch_first=False, enforce_sorted=True):
    ctx = torch.library.get_ctx()
    rows = _dynamic_size(ctx)  # sum(lengths)
    steps = _dynamic_size(ctx)  # max(lengths)
    # Without enforce_sorted the indices are the batch's; with it they are
    # there only when some sequence is empty.
    n = _dynamic_size(ctx) if enforce_sorted else lengths.size(0)
    index = lengths.new_empty((n,), dtype=torch.int64)
    return (input.new_empty((rows,) + tuple(input.shape[2:])),
            lengths.new_empty((steps,), dtype=torch.int64), index, index.new_empty((n,)))


def _fake_pad(data, batch_sizes, sorted_indices, unsorted_indices, batch_first=False,
              padding_value=0.0, total_length=None):
    ctx = torch.library.get_ctx()
    steps = batch_sizes.size(0) if total_length is None else total_length
    batch = _fake_batch(ctx, None, sorted_indices)
    shape = (batch, steps) if batch_first else (steps, batch)
    return (data.new_empty(shape + tuple(data.shape[1:])),
            batch_sizes.new_empty((batch,), dtype=torch.int64))


def _fake_sized(grad, batch_sizes, sorted_indices, unsorted_indices, size, batch_first):
    return grad.new_empty(tuple(size))


FAKES = {"rnn": _fake_rnn, "_rnn_train": _fake_rnn_train, "_rnn_backward": _fake_rnn_backward,
         "rnn_padded": _fake_rnn_padded, "rnn_nested": _fake_rnn_nested,
         "_rnn_nested_train": _fake_rnn_nested_train,
         "_rnn_nested_backward": _fake_rnn_nested_backward, "pack_padded_sequence": _fake_pack,
         "pad_packed_sequence": _fake_pad, "_pack_padded_sequence_backward": _fake_sized,
         "_pad_packed_sequence_backward": _fake_sized}


def register(namespace: str) -> None:
    """Registers the fakes of the operators `namespace` defines (seqpack's; the
    CUDA kernels' standalone and test builds define the recurrent ones only),
    once per process (a second call finds them registered: register_fake also
    registers a Meta kernel). Nothing on PyTorch before 2.4."""
    fake = getattr(torch.library, "register_fake", None)
    if fake is None or torch._C._dispatch_has_kernel_for_dispatch_key(namespace + "::rnn", "Meta"):
        return
    for name, function in FAKES.items():
        if hasattr(getattr(torch.ops, namespace), name):
            fake(f"{namespace}::{name}", function)
