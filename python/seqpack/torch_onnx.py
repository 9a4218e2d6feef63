"""torch.onnx.export of seqpack.torch layers as ONNX's LSTM / GRU / RNN operators.

    model = MyModel()                      # uses seqpack.torch.LSTM on
                                           # pack_padded_sequence(x, lengths, enforce_sorted=False)
    torch.onnx.export(model, (x, lengths), "model.onnx", opset_version=17,
                      input_names=["x", "lengths"], output_names=["y", "h_n"],
                      dynamic_axes={"x": {0: "batch", 1: "time"}, "lengths": {0: "batch"},
                                    "y": {0: "batch", 1: "time"}, "h_n": {1: "batch"}})

While torch.onnx.export traces, the layers' forward hands over to `forward` here
(a hook of two lines in seqpack/_torch_layers.py). It calls one operator,
`seqpack_onnx::rnn` (defined here with torch.library; its kernel runs torch's
own recurrence for the values the tracer sees), and `_symbolic`, registered for
it with torch.onnx.register_custom_op_symbolic, writes the graph. Only public
torch.onnx API is used (g.op on the graph context torch gives a registered
symbolic, symbolic_helper.parse_args), on PyTorch 1.13 and on 2.x's TorchScript
exporter (`torch.onnx.export(..., dynamo=False)`, 2.6's default):

* seqpack.torch.pack_padded_sequence / pad_packed_sequence (the operators
  seqpack::pack_padded_sequence / pad_packed_sequence) get symbolics here too,
  `_pack_symbolic` / `_pad_symbolic`, which write the prim::PackPadded /
  prim::PadPacked that torch's symbolics write for its own functions.
* On packed input, torch's tracer has turned `pack_padded_sequence` into a
  `prim::PackPadded(padded, lengths)` node (symbolic_opset9._pack_padded_sequence).
  The symbolic reads the padded input and the lengths straight from that node and
  gives them to the ONNX operator as X and sequence_lens; the recurrence never
  sees packed rows. Its output goes through a new `prim::PackPadded`, which the
  `prim::PadPacked` of the model's `pad_packed_sequence` cancels (torch's
  removeNopPacking peephole), and the original PackPadded, left without users, is
  removed as dead code. This is how torch exports its own nn.LSTM, except that
  torch relies on pushPackingPastRnn, which only matches its own node pattern.
* h_n is the operator's Y_h: each sequence's state at its own last step (the
  reverse direction starts there), put back in the caller's order by the
  PackedSequence's unsorted_indices as torch does.
* Without hx no initial state is given to the operator (torch's own export
  builds a zero state of the traced batch size and Expands it, which fails at
  any other batch size), so batch size and padded length stay dynamic.
* Each operator runs in the then branch of an If on "the input has elements"
  (Size(X) > 0): ONNX Runtime 1.20.1 crashes the process on its LSTM and GRU at
  batch 0 and on its RNN at T = 0. The else branch gives zeros of the outputs'
  shapes, so an empty batch gives empty outputs (torch's shapes for it).
* A zero length is given to the operator as 1 and Where selects h0 (zeros
  without hx) and zero outputs for it: ONNX Runtime otherwise returns zeros, not
  the initial state, for such a sequence. torch itself rejects zero lengths in
  pack_padded_sequence, so this matters only for inputs fed to the exported
  model.

Limits (each raises a ValueError naming the value, or is a documented property):
proj_size > 0 (ONNX's LSTM has no projection); dropout > 0 on a layer exported in
training mode (TrainingMode.TRAINING, or PRESERVE of a model in training mode:
ONNX's operators have no dropout between layers); opset below 14; packed input not
produced by pack_padded_sequence / pack_sequence or another seqpack layer; the
exported torch.nn.utils.rnn.pad_packed_sequence pads with zeros to the longest
length (torch's symbolic for it drops padding_value and total_length; the
symbolics here for seqpack.torch's packing functions keep both).
"""
import dataclasses

import torch
from torch.nn.utils.rnn import PackedSequence
from torch.onnx import symbolic_helper

__all__ = ["forward", "MIN_OPSET", "OP_NAME"]

MIN_OPSET = 14

# ONNX's gate blocks as indices of PyTorch's: LSTM i,f,g,o -> i,o,f,c; GRU r,z,n -> z,r,h.
_GATE_ORDER = {"LSTM": [0, 3, 1, 2], "GRU": [1, 0, 2], "RNN_TANH": [0], "RNN_RELU": [0]}
_ONNX_OP = {"LSTM": "LSTM", "GRU": "GRU", "RNN_TANH": "RNN", "RNN_RELU": "RNN"}


def _const(g, values, dtype=torch.int64):
    return g.op("Constant", value_t=torch.tensor(values, dtype=dtype))


def _reorder(g, w, order, hidden):
    """Rows [G*H, ...] of a torch weight or bias in ONNX's gate order."""
    if order == [0]:
        return w
    blocks = [g.op("Slice", w, _const(g, [k * hidden]), _const(g, [(k + 1) * hidden]),
                   _const(g, [0])) for k in order]
    return g.op("Concat", *blocks, axis_i=0)


def _stack(g, tensors):
    """[D, ...] from D tensors of the same shape."""
    parts = [g.op("Unsqueeze", t, _const(g, [0])) for t in tensors]
    return parts[0] if len(parts) == 1 else g.op("Concat", *parts, axis_i=0)


def _guarded(g, op, has_rows, x_shape, lengths, inputs, n_out, dirs, hidden, float_type,
             **attrs):
    """`op` (LSTM, GRU or RNN) inside an If on "the input has elements".

    ONNX Runtime 1.20.1 crashes the process on an empty input (its LSTM and GRU at
    batch 0, its RNN at a padded length of 0), so the else branch gives the
    outputs' shapes filled with zeros: Y [T, dirs, B, H], Y_h / Y_c [dirs, B, H].
    With `lengths` (int32 [B]) it also rejects, as the operator would, a length
    other than 0 at T = 0: a Gather from one element at index max |length| fails
    ("indices element out of data bounds"), and its 0 is added to B so it runs.
    """
    outs = g.op("If", has_rows, outputs=n_out)
    node = (outs[0] if n_out > 1 else outs).node()
    # Ops go into the branches through copies of the symbolic's context `g` on the
    # If's blocks, as torch's own symbolics for If and Loop make them (g is a
    # dataclass whose `block` is where g.op inserts, on torch 1.13 and 2.x alike).
    then_g, else_g = (dataclasses.replace(g, block=node.addBlock()) for _ in range(2))
    # Absent optional inputs (None): trailing ones are left out, others are the
    # exporter's placeholder for "no input", an optional-typed prim::Constant.
    inputs = list(inputs)
    while inputs[-1] is None:
        inputs.pop()
    if None in inputs:
        absent = then_g.op("prim::Constant")
        absent.setType(torch._C.OptionalType.ofTensor())
        inputs = [absent if v is None else v for v in inputs]
    ran = then_g.op(op, *inputs, outputs=n_out, **attrs)
    for v in (ran if n_out > 1 else (ran,)):
        then_g.block.registerOutput(v)

    def dim(i):
        return else_g.op("Gather", x_shape, _const(else_g, [i]))

    batch = dim(1)
    if lengths is not None:
        abs_max = else_g.op("ReduceMax", else_g.op("Concat", else_g.op("Abs", lengths),
                                                   _const(else_g, [0], torch.int32), axis_i=0),
                            keepdims_i=1)
        batch = else_g.op("Add", batch, else_g.op("Gather", _const(else_g, [0]), abs_max))
    state = [_const(else_g, [dirs]), batch, _const(else_g, [hidden])]
    shapes = [[dim(0)] + state] + [state] * (n_out - 1)
    for shape in shapes:
        zeros = else_g.op("ConstantOfShape", else_g.op("Concat", *shape, axis_i=0),
                          value_t=torch.zeros(1, dtype=float_type))
        else_g.block.registerOutput(zeros)
    return outs if n_out > 1 else (outs,)


OP_NAME = "seqpack_onnx::rnn"

# The operator the layers call while torch.onnx.export traces them: a Python
# kernel (torch's own recurrences, for the values the tracer sees) and, for the
# exporter, `_symbolic` registered with torch.onnx.register_custom_op_symbolic.
# A registered symbolic gets torch's graph context, whose g.op is public on
# torch 1.13 and 2.x (an autograd Function's symbolic gets, on 1.13, the bare
# torch._C.Graph, whose op() is the deprecated torch.onnx._patch_torch._graph_op).
_LIB = torch.library.Library("seqpack_onnx", "DEF")
_LIB.define("rnn(Tensor data, Tensor? batch_sizes, Tensor? h0, Tensor? c0, Tensor[] weights, "
            "str mode, int hidden_size, int num_layers, bool bidirectional, bool bias, "
            "Tensor? sorted_indices) -> (Tensor, Tensor, Tensor, Tensor)")

_RECURRENCES = {"LSTM": torch.lstm, "GRU": torch.gru, "RNN_TANH": torch.rnn_tanh,
                "RNN_RELU": torch.rnn_relu}


def _rnn_kernel(data, batch_sizes, h0, c0, weights, mode, hidden, layers, bidirectional, bias,
                sorted_indices):
    """seqpack_onnx::rnn: one recurrent stack, as torch computes it.

    `data` packed rows with `batch_sizes` (sorted order, h0/c0 in that order) or,
    with batch_sizes None, a time-major padded [T, B, I] tensor. Returns (output,
    batch_sizes or an empty tensor, h_n, c_n or an empty tensor), h_n in the
    order of h0. The batch is that of `sorted_indices` when given: sequences of
    length 0 (seqpack.torch.pack_padded_sequence keeps them, last in sorted
    order, without rows) keep their initial state. The exported graph is
    `_symbolic`'s.
    """
    dirs = 2 if bidirectional else 1
    batch = int(batch_sizes[0]) if batch_sizes is not None and len(batch_sizes) else 0
    if batch_sizes is None:
        batch = data.shape[1]
    full = len(sorted_indices) if batch_sizes is not None and sorted_indices is not None else batch
    zeros = data.new_zeros(layers * dirs, full, hidden)
    h0 = zeros if h0 is None else h0
    c0 = zeros if c0 is None else c0
    hx = (h0[:, :batch], c0[:, :batch]) if mode == "LSTM" else h0[:, :batch]
    fn = _RECURRENCES[mode]
    if batch_sizes is not None:
        result = fn(data, batch_sizes, hx, list(weights), bias, layers, 0.0, False, bidirectional)
    else:
        result = fn(data, hx, list(weights), bias, layers, 0.0, False, bidirectional, False)
    empty = data.new_empty(0)
    sizes = batch_sizes.clone() if batch_sizes is not None else empty.long()
    h_n = torch.cat([result[1], h0[:, batch:]], 1)
    c_n = torch.cat([result[2], c0[:, batch:]], 1) if mode == "LSTM" else empty
    return result[0], sizes, h_n, c_n


_LIB.impl("rnn", _rnn_kernel, "CompositeExplicitAutograd")


@symbolic_helper.parse_args("v", "v", "v", "v", "v", "s", "i", "i", "b", "b", "v")
def _symbolic(g, data, batch_sizes, h0, c0, weights, mode, hidden, layers, bidirectional, bias,
              sorted_indices):
    """The ONNX graph of seqpack_onnx::rnn (see the module's docstring)."""
    opset = g.opset
    if opset < MIN_OPSET:
        raise ValueError(f"seqpack.torch ONNX export: opset_version = {opset} is below "
                         f"{MIN_OPSET}")
    batch_sizes, h0, c0 = (None if v.node().mustBeNone() else v for v in (batch_sizes, h0, c0))
    weights = list(weights.node().inputs())  # the prim::ListConstruct of the parameters
    is_lstm = mode == "LSTM"
    dirs = 2 if bidirectional else 1
    packed = batch_sizes is not None
    if packed:
        node = data.node()
        if node.kind() != "prim::PackPadded":
            raise ValueError(
                "seqpack.torch ONNX export: the PackedSequence must come straight from "
                "pack_padded_sequence / pack_sequence or from another seqpack layer (its data "
                f"is produced by {node.kind()}); apply element-wise layers before packing")
        x, lengths = list(node.inputs())
        lengths = g.op("Cast", lengths, to_i=6)  # INT32, as sequence_lens wants
    else:
        x = data
    order = _GATE_ORDER[mode]
    float_type = torch.float64 if weights[0].type().scalarType() == "Double" else torch.float32
    zero = g.op("Constant", value_t=torch.zeros((), dtype=float_type))
    if packed:
        empty = g.op("Equal", lengths, _const(g, 0, torch.int32))
        seq_lens = g.op("Where", empty, _const(g, 1, torch.int32), lengths)
        empty3 = g.op("Unsqueeze", empty, _const(g, [0, 2]))
    else:
        seq_lens = None  # absent (see _guarded)
    per_dir = 4 if bias else 2
    x_shape = g.op("Shape", x)
    has_rows = g.op("Greater", g.op("Size", x), _const(g, 0))
    layer_in = x
    h_parts, c_parts = [], []
    for layer in range(layers):
        ws = [weights[(layer * dirs + d) * per_dir:(layer * dirs + d + 1) * per_dir]
              for d in range(dirs)]
        W = _stack(g, [_reorder(g, w[0], order, hidden) for w in ws])
        R = _stack(g, [_reorder(g, w[1], order, hidden) for w in ws])
        # Without biases, zeros (ONNX's default for an absent B) rather than an
        # absent input before sequence_lens, which the exporter can only write
        # through an optional-typed placeholder.
        B = g.op("Constant", value_t=torch.zeros(dirs, 2 * len(order) * hidden,
                                                 dtype=float_type)) if packed else None
        if bias:
            B = _stack(g, [g.op("Concat", _reorder(g, w[2], order, hidden),
                                _reorder(g, w[3], order, hidden), axis_i=0) for w in ws])

        def layer_slice(state):
            if state is None:
                return None
            return g.op("Slice", state, _const(g, [layer * dirs]),
                        _const(g, [(layer + 1) * dirs]), _const(g, [0]))

        h0_l = layer_slice(h0)
        attrs = {"hidden_size_i": hidden,
                 "direction_s": "bidirectional" if bidirectional else "forward"}
        if mode == "GRU":
            attrs["linear_before_reset_i"] = 1
        if mode.startswith("RNN_"):
            attrs["activations_s"] = ["Relu" if mode == "RNN_RELU" else "Tanh"] * dirs
        if is_lstm:
            c0_l = layer_slice(c0)
            y, y_h, y_c = _guarded(g, "LSTM", has_rows, x_shape,
                                   lengths if packed else None,
                                   [layer_in, W, R, B, seq_lens, h0_l, c0_l], 3, dirs,
                                   hidden, float_type, **attrs)
        else:
            y, y_h = _guarded(g, _ONNX_OP[mode], has_rows, x_shape,
                              lengths if packed else None,
                              [layer_in, W, R, B, seq_lens, h0_l], 2, dirs, hidden,
                              float_type, **attrs)
        if packed:
            # Zero-length sequences keep their initial state.
            y_h = g.op("Where", empty3, zero if h0 is None else h0_l, y_h)
            if is_lstm:
                y_c = g.op("Where", empty3, zero if c0 is None else c0_l, y_c)
        h_parts.append(y_h)
        if is_lstm:
            c_parts.append(y_c)
        # Y [T, dirs, B, H] -> [T, B, dirs * H] (no -1: Reshape cannot infer it
        # from an empty tensor)
        layer_in = g.op("Reshape", g.op("Transpose", y, perm_i=[0, 2, 1, 3]),
                        _const(g, [0, 0, dirs * hidden]))
    h_n = h_parts[0] if layers == 1 else g.op("Concat", *h_parts, axis_i=0)
    states = [h_n]
    if is_lstm:
        states.append(c_parts[0] if layers == 1 else g.op("Concat", *c_parts, axis_i=0))
    # Placeholders for the outputs the graph does not use (batch_sizes on padded
    # input, c_n of a GRU/RNN): constants, removed with their users.
    unused = _const(g, [0])
    if not is_lstm:
        states.append(unused)
    if not packed:
        return tuple([layer_in, unused] + states)
    # Zeros at padding (and at the one step a zero-length sequence ran), cut
    # to the longest length as pad_packed_sequence does.
    t_len = g.op("Gather", g.op("Shape", layer_in), _const(g, 0))
    steps = g.op("Range", _const(g, 0, torch.int32), g.op("Cast", t_len, to_i=6),
                 _const(g, 1, torch.int32))
    valid = g.op("Less", g.op("Unsqueeze", steps, _const(g, [1])),
                 g.op("Unsqueeze", lengths, _const(g, [0])))
    y = g.op("Where", g.op("Unsqueeze", valid, _const(g, [2])), layer_in, zero)
    # The longest length: max(lengths, 0), as ReduceMax rejects an empty batch.
    with_zero = g.op("Concat", lengths, _const(g, [0], torch.int32), axis_i=0)
    longest = g.op("Cast", g.op("ReduceMax", with_zero, keepdims_i=1), to_i=7)
    y = g.op("Slice", y, _const(g, [0]), longest, _const(g, [0]))
    lengths64 = g.op("Cast", lengths, to_i=7)
    out_data, out_sizes = g.op("prim::PackPadded", y, lengths64, outputs=2)
    return tuple([out_data, out_sizes] + states)


torch.onnx.register_custom_op_symbolic(OP_NAME, _symbolic, 9)


@symbolic_helper.parse_args("v", "v", "b", "b")
def _pack_symbolic(g, input, lengths, batch_first, enforce_sorted):
    """seqpack::pack_padded_sequence (seqpack.torch.pack_padded_sequence) as torch's
    own symbolic writes torch's: a prim::PackPadded of the time-major padded input
    and the lengths, which _symbolic reads (the node itself is removed). Without
    enforce_sorted the batch is sorted by decreasing length first (TopK), and the
    inverse permutation is the ascending TopK of that order."""
    if batch_first:
        input = g.op("Transpose", input, perm_i=[1, 0, 2])
    lengths = g.op("Cast", lengths, to_i=7)  # INT64
    size = g.op("Shape", lengths)
    if enforce_sorted:
        order = g.op("Range", _const(g, 0), g.op("Squeeze", size, _const(g, [0])), _const(g, 1))
        inverse = order
    else:
        _, order = g.op("TopK", lengths, size, axis_i=0, largest_i=1, sorted_i=1, outputs=2)
        _, inverse = g.op("TopK", order, size, axis_i=0, largest_i=0, sorted_i=1, outputs=2)
        input = g.op("Gather", input, order, axis_i=1)
        lengths = g.op("Gather", lengths, order, axis_i=0)
    data, batch_sizes = g.op("prim::PackPadded", input, g.op("Cast", lengths, to_i=6), outputs=2)
    return data, batch_sizes, order, inverse


@symbolic_helper.parse_args("v", "v", "v", "v", "b", "f", "v")
def _pad_symbolic(g, data, batch_sizes, sorted_indices, unsorted_indices, batch_first,
                  padding_value, total_length):
    """seqpack::pad_packed_sequence (seqpack.torch.pad_packed_sequence): a
    prim::PadPacked, which cancels the prim::PackPadded of _symbolic's output,
    then the caller's order, padding_value at padding and total_length steps
    (torch's own symbolic for pad_packed_sequence drops the last two)."""
    # The padding value in the data's type: the traced node's (the converted
    # values of prim:: nodes carry no type).
    traced = next(g.original_node.outputs()).type().scalarType()
    fill = _const(g, padding_value, torch.float64 if traced == "Double" else torch.float32)
    padded, lengths = g.op("prim::PadPacked", data, batch_sizes, outputs=2)
    lengths = g.op("Cast", lengths, to_i=7)
    if not unsorted_indices.node().mustBeNone():
        padded = g.op("Gather", padded, unsorted_indices, axis_i=1)
        lengths = g.op("Gather", lengths, unsorted_indices, axis_i=0)
    if padding_value != 0.0:
        t_len = g.op("Gather", g.op("Shape", padded), _const(g, 0))
        steps = g.op("Range", _const(g, 0), t_len, _const(g, 1))
        valid = g.op("Less", g.op("Unsqueeze", steps, _const(g, [1])),
                     g.op("Unsqueeze", lengths, _const(g, [0])))
        padded = g.op("Where", g.op("Unsqueeze", valid, _const(g, [2])), padded, fill)
    if not total_length.node().mustBeNone():
        # Zero steps appended up to total_length (pads [0, 0, 0, total - T, 0, 0]).
        t_len = g.op("Gather", g.op("Shape", padded), _const(g, [0]))
        total = g.op("Reshape", g.op("Cast", total_length, to_i=7), _const(g, [1]))
        pads = g.op("Concat", _const(g, [0, 0, 0]), g.op("Sub", total, t_len), _const(g, [0, 0]),
                    axis_i=0)
        padded = g.op("Pad", padded, pads, fill)
    if batch_first:
        padded = g.op("Transpose", padded, perm_i=[1, 0, 2])
    return padded, lengths


torch.onnx.register_custom_op_symbolic("seqpack::pack_padded_sequence", _pack_symbolic, 9)
torch.onnx.register_custom_op_symbolic("seqpack::pad_packed_sequence", _pad_symbolic, 9)


def forward(module, input, hx=None):
    """forward() of a seqpack.torch layer while torch.onnx.export traces it."""
    mode = module.mode
    # torch.onnx.export puts the model in training mode for TrainingMode.TRAINING
    # and keeps its mode for PRESERVE; the operators written here are the eval
    # forward, so dropout in training would be silently dropped from the graph.
    # torch.nn's own layers are refused in the same case.
    if module.training and module.dropout > 0:
        raise ValueError(f"seqpack.torch ONNX export: dropout = {module.dropout} in training "
                         "mode: the exported LSTM/GRU/RNN operators have no dropout between "
                         "layers; export in eval mode (model.eval(), or "
                         "training=torch.onnx.TrainingMode.EVAL) or set dropout to 0")
    if getattr(module, "proj_size", 0) > 0:
        raise ValueError(f"seqpack.torch ONNX export: proj_size = {module.proj_size}: ONNX's LSTM "
                         "operator has no projection")
    is_lstm = mode == "LSTM"
    spec = (mode, module.hidden_size, module.num_layers, module.bidirectional, module.bias)
    weights = [getattr(module, n) for n in module._flat_weights_names]

    def run(data, batch_sizes, h0, c0, sorted_indices=None):
        output, sizes, h_n, c_n = torch.ops.seqpack_onnx.rnn(data, batch_sizes, h0, c0, weights,
                                                            *spec, sorted_indices)
        return output, sizes, ((h_n, c_n) if is_lstm else (h_n,))

    if is_lstm and hx is not None and not (isinstance(hx, (tuple, list)) and len(hx) == 2):
        raise TypeError("LSTM expects hx as a tuple (h_0, c_0)")
    h0, c0 = (None, None) if hx is None else (tuple(hx) if is_lstm else (hx, None))

    if isinstance(input, PackedSequence):
        data, batch_sizes, sorted_indices, unsorted_indices = input
        if sorted_indices is not None:
            h0 = None if h0 is None else h0.index_select(1, sorted_indices)
            c0 = None if c0 is None else c0.index_select(1, sorted_indices)
        output, sizes, states = run(data, batch_sizes, h0, c0, sorted_indices)
        if unsorted_indices is not None:
            states = tuple(s.index_select(1, unsorted_indices) for s in states)
        hidden = tuple(states) if is_lstm else states[0]
        return PackedSequence(output, sizes, sorted_indices, unsorted_indices), hidden

    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input must be a Tensor or a PackedSequence, got {type(input).__name__}")
    if input.dim() not in (2, 3):
        raise ValueError(f"{type(module).__name__}: Expected input to be 2-D or 3-D but received "
                         f"{input.dim()}-D tensor")
    batched = input.dim() == 3
    x = input if batched else input.unsqueeze(1 if not module.batch_first else 0)
    if not batched:
        h0 = None if h0 is None else h0.unsqueeze(1)
        c0 = None if c0 is None else c0.unsqueeze(1)
    time_major = x.transpose(0, 1) if module.batch_first else x
    y, _, states = run(time_major, None, h0, c0)
    if module.batch_first:
        y = y.transpose(0, 1)
    if not batched:
        y = y.squeeze(0 if module.batch_first else 1)
        states = tuple(s.squeeze(1) for s in states)
    hidden = tuple(states) if is_lstm else states[0]
    return y, hidden
