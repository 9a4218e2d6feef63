// ONNX export (seqpack_onnx): graphs built with libonnx's protobuf classes,
// checked by the ONNX checker and strict shape inference before writing.
#include "seqpack/onnx_export.h"

#include <onnx/checker.h>
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <array>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "seqpack/safetensors.h"
#include "seqpack/vocabulary.h"

namespace seqpack {

void OnnxExportOptions::validate() const {
  if (opset < kOnnxMinOpset || opset > kOnnxMaxOpset) {
    throw std::invalid_argument(
        "ONNX export: opset = " + std::to_string(opset) + " is outside the supported range [" +
        std::to_string(kOnnxMinOpset) + ", " + std::to_string(kOnnxMaxOpset) + "]");
  }
}

namespace {

using onnx::TensorProto_DataType;

TensorProto_DataType onnx_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return onnx::TensorProto_DataType_FLOAT;
    case DType::f64:
      return onnx::TensorProto_DataType_DOUBLE;
    case DType::i64:
      return onnx::TensorProto_DataType_INT64;
  }
  throw std::invalid_argument("ONNX export: unknown dtype");
}

// A dimension of a graph input or output: a fixed size, a symbol ("batch"), or
// unknown (kUnknownDim).
inline constexpr int64_t kUnknownDim = -1;
struct Dim {
  Dim(int64_t v) : value(v) {}       // NOLINT: sizes read naturally at call sites
  Dim(const char* s) : symbol(s) {}  // NOLINT
  int64_t value = kUnknownDim;
  std::string symbol;
};

// Adds nodes, initializers and constants to one graph with unique names.
class GraphBuilder {
 public:
  explicit GraphBuilder(onnx::GraphProto* graph) : g_(graph), counter_(&own_counter_) {}
  GraphBuilder(const GraphBuilder&) = delete;
  GraphBuilder& operator=(const GraphBuilder&) = delete;
  // A builder for a subgraph (a branch of an If): its names come from the same
  // counter as the outer graph's, so they stay unique in the whole model.
  GraphBuilder(onnx::GraphProto* subgraph, GraphBuilder& outer)
      : g_(subgraph), counter_(outer.counter_) {}

  std::string fresh(const std::string& hint) { return hint + "_" + std::to_string((*counter_)++); }

  // A node with `outputs` names ("" = optional output left out); returns it so
  // the caller can add attributes.
  onnx::NodeProto* node(const std::string& op, std::initializer_list<std::string> inputs,
                        std::initializer_list<std::string> outputs) {
    onnx::NodeProto* n = g_->add_node();
    n->set_op_type(op);
    n->set_name(fresh(op));
    for (const auto& i : inputs) n->add_input(i);
    for (const auto& o : outputs) n->add_output(o);
    return n;
  }
  // One-output node with a fresh output name.
  std::string op(const std::string& op, std::initializer_list<std::string> inputs,
                 onnx::NodeProto** out_node = nullptr) {
    const std::string out = fresh(op + "_out");
    onnx::NodeProto* n = node(op, inputs, {out});
    if (out_node != nullptr) *out_node = n;
    return out;
  }

  std::string initializer(const std::string& name, DType dtype, const std::vector<int64_t>& dims,
                          const void* data, std::size_t bytes) {
    onnx::TensorProto* t = g_->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx_type(dtype));
    for (int64_t d : dims) t->add_dims(d);
    t->set_raw_data(data, bytes);
    return name;
  }
  std::string constant_i64(const std::vector<int64_t>& values, bool scalar = false) {
    std::vector<int64_t> dims;
    if (!scalar) dims.push_back(static_cast<int64_t>(values.size()));
    return initializer(fresh("const_i64"), DType::i64, dims, values.data(),
                       values.size() * sizeof(int64_t));
  }
  std::string constant_i32_scalar(int32_t value) {
    onnx::TensorProto* t = g_->add_initializer();
    t->set_name(fresh("const_i32"));
    t->set_data_type(onnx::TensorProto_DataType_INT32);
    t->add_int32_data(value);
    return t->name();
  }
  std::string constant_zero(DType dtype) {
    const double d = 0.0;
    const float f = 0.0f;
    return dtype == DType::f64 ? initializer(fresh("zero"), dtype, {}, &d, sizeof d)
                               : initializer(fresh("zero"), dtype, {}, &f, sizeof f);
  }

  void input(const std::string& name, TensorProto_DataType type, const std::vector<Dim>& dims) {
    describe(g_->add_input(), name, type, dims);
  }
  void output(const std::string& name, TensorProto_DataType type, const std::vector<Dim>& dims) {
    describe(g_->add_output(), name, type, dims);
  }

  std::string unsqueeze(const std::string& x, const std::vector<int64_t>& axes) {
    return op("Unsqueeze", {x, constant_i64(axes)});
  }
  std::string transpose(const std::string& x, const std::vector<int64_t>& perm) {
    onnx::NodeProto* n = nullptr;
    const std::string out = op("Transpose", {x}, &n);
    add_ints(n, "perm", perm);
    return out;
  }
  // The result of `op` renamed to `name` (a graph output).
  void rename_output(const std::string& from, const std::string& name) {
    for (auto& n : *g_->mutable_node()) {
      for (auto& o : *n.mutable_output()) {
        if (o == from) o = name;
      }
      for (auto& i : *n.mutable_input()) {
        if (i == from) i = name;
      }
    }
  }

  static void add_int(onnx::NodeProto* n, const char* name, int64_t v) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto_AttributeType_INT);
    a->set_i(v);
  }
  static void add_ints(onnx::NodeProto* n, const char* name, const std::vector<int64_t>& v) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto_AttributeType_INTS);
    for (int64_t x : v) a->add_ints(x);
  }
  static void add_string(onnx::NodeProto* n, const char* name, const std::string& v) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto_AttributeType_STRING);
    a->set_s(v);
  }
  // A GRAPH attribute (a branch of an If), returned empty for the caller to fill.
  onnx::GraphProto* add_graph(onnx::NodeProto* n, const char* name) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto_AttributeType_GRAPH);
    onnx::GraphProto* sub = a->mutable_g();
    sub->set_name(fresh(name));
    return sub;
  }
  // ConstantOfShape's `value`: one zero of `dtype`.
  static void add_zero_value(onnx::NodeProto* n, DType dtype) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto_AttributeType_TENSOR);
    onnx::TensorProto* t = a->mutable_t();
    t->set_data_type(onnx_type(dtype));
    t->add_dims(1);
    if (dtype == DType::f64) {
      t->add_double_data(0.0);
    } else {
      t->add_float_data(0.0f);
    }
  }
  static void add_strings(onnx::NodeProto* n, const char* name, const std::vector<std::string>& v) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto_AttributeType_STRINGS);
    for (const auto& x : v) a->add_strings(x);
  }

 private:
  static void describe(onnx::ValueInfoProto* v, const std::string& name, TensorProto_DataType type,
                       const std::vector<Dim>& dims) {
    v->set_name(name);
    onnx::TypeProto_Tensor* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(type);
    onnx::TensorShapeProto* shape = t->mutable_shape();
    for (const Dim& d : dims) {
      onnx::TensorShapeProto_Dimension* sd = shape->add_dim();
      if (d.symbol.empty()) {
        if (d.value != kUnknownDim) sd->set_dim_value(d.value);
      } else {
        sd->set_dim_param(d.symbol);
      }
    }
  }

  onnx::GraphProto* g_;
  int64_t own_counter_ = 0;
  int64_t* counter_;
};

// ONNX's gate blocks as indices into PyTorch's: LSTM torch i,f,g,o -> onnx
// i,o,f,c; GRU torch r,z,n -> onnx z,r,h; RNN has one block.
std::vector<int64_t> gate_order(RNNMode mode) {
  switch (mode) {
    case RNNMode::lstm:
      return {0, 3, 1, 2};
    case RNNMode::gru:
      return {1, 0, 2};
    default:
      return {0};
  }
}

// Rows [G * H, cols] of `w` (PyTorch's gate order) appended to `out` in ONNX's order.
void append_reordered(std::vector<char>& out, const Tensor& w, RNNMode mode, int64_t hidden) {
  const int64_t cols = w.dim() == 2 ? w.size(1) : 1;
  const std::size_t block = static_cast<std::size_t>(hidden * cols) * dtype_size(w.dtype());
  const char* src = static_cast<const char*>(w.raw_data());
  for (int64_t g : gate_order(mode)) {
    const char* p = src + static_cast<std::size_t>(g) * block;
    out.insert(out.end(), p, p + block);
  }
}

struct RnnGraph {
  std::string output;  // time-major [T, B, dirs * H], zeros at padding ("" if not asked)
  std::string h_n, c_n;
};

// The recurrent stack on time-major `x` [T, B, I] with int64 `lengths` [B].
// h0/c0 are graph values [layers * dirs, B, H] or "" for zeros.
RnnGraph add_rnn(GraphBuilder& gb, const RNNOptions& o, const std::vector<Tensor>& weights,
                 const std::string& x, const std::string& lengths, const std::string& h0,
                 const std::string& c0, bool want_output) {
  const bool lstm = o.mode == RNNMode::lstm;
  const int64_t H = o.hidden_size, D = o.num_directions(), G = o.gate_count();
  const std::size_t per_dir = (o.bias ? 4 : 2);
  const DType dt = o.dtype;

  // A zero length becomes 1 for the operator (ONNX Runtime returns zeros, not
  // the initial state, for a zero length), and Where puts h0 / zeros back.
  const std::string zero_i64 = gb.constant_i64({0}, /*scalar=*/true);
  const std::string empty = gb.op("Equal", {lengths, zero_i64});  // [B] bool
  onnx::NodeProto* cast = nullptr;
  const std::string len32 = gb.op("Cast", {lengths}, &cast);
  GraphBuilder::add_int(cast, "to", onnx::TensorProto_DataType_INT32);
  const std::string seq_lens =
      gb.op("Where", {empty, gb.constant_i32_scalar(1), len32});  // [B] int32
  const std::string empty_3d = gb.unsqueeze(empty, {0, 2});       // [1, B, 1]
  const std::string zero = gb.constant_zero(dt);

  // ONNX Runtime 1.20.1 crashes the process on an empty input: its LSTM and GRU
  // kernels at batch 0 (SIGSEGV with sequence_lens, std::terminate without), its
  // RNN at a padded length of 0 with a batch. So each operator runs inside an
  // If on "the input has elements" (T * B > 0); the else branch gives its
  // outputs' shapes filled with zeros (Y [T, dirs, B, H], Y_h/Y_c [dirs, B, H]:
  // empty at B = 0, and at T = 0 the zero-length sequences' Where below puts
  // h0/c0 in). The weights live in the then branch, as constants of the
  // operator's own graph (what ONNX Runtime prepacks).
  const std::string x_shape = gb.op("Shape", {x});  // [3]: T, B, I
  const std::string has_rows = gb.op("Greater", {gb.op("Size", {x}), zero_i64});
  const std::string t_dim = gb.constant_i64({0});
  const std::string b_dim = gb.constant_i64({1});
  const std::string dirs_dim = gb.constant_i64({D});
  const std::string hidden_dim = gb.constant_i64({H});
  const std::string zero_i64_1d = gb.constant_i64({0});

  std::string layer_in = x;
  std::vector<std::string> h_parts, c_parts;
  const std::string op_name = lstm ? "LSTM" : (o.mode == RNNMode::gru ? "GRU" : "RNN");
  for (int64_t l = 0; l < o.num_layers; ++l) {
    const int64_t in_size = l == 0 ? o.input_size : H * D;
    std::vector<char> W, R, B;
    for (int64_t d = 0; d < D; ++d) {
      const std::size_t base = static_cast<std::size_t>(l * D + d) * per_dir;
      append_reordered(W, weights[base + 0], o.mode, H);
      append_reordered(R, weights[base + 1], o.mode, H);
    }
    if (o.bias) {
      for (int64_t d = 0; d < D; ++d) {
        const std::size_t base = static_cast<std::size_t>(l * D + d) * per_dir;
        append_reordered(B, weights[base + 2], o.mode, H);  // Wb
        append_reordered(B, weights[base + 3], o.mode, H);  // Rb
      }
    }
    const std::string suffix = "_l" + std::to_string(l);
    auto layer_slice = [&](const std::string& s) -> std::string {
      if (s.empty()) return "";
      return gb.op("Slice", {s, gb.constant_i64({l * D}), gb.constant_i64({(l + 1) * D}),
                             gb.constant_i64({0})});
    };
    const std::string h0_l = layer_slice(h0);
    const std::string c0_l = lstm ? layer_slice(c0) : "";
    const bool last = l + 1 == o.num_layers;
    const std::string y = (!last || want_output) ? gb.fresh("Y" + suffix) : "";
    const std::string yh = gb.fresh("Y_h" + suffix);
    const std::string yc = lstm ? gb.fresh("Y_c" + suffix) : "";
    onnx::NodeProto* branch = gb.node("If", {has_rows}, {});
    for (const std::string* out : {&y, &yh, &yc}) {
      if (!out->empty()) branch->add_output(*out);
    }
    GraphBuilder run(gb.add_graph(branch, "then_branch"), gb);
    GraphBuilder skip(gb.add_graph(branch, "else_branch"), gb);

    const std::string w =
        run.initializer("W" + suffix, dt, {D, G * H, in_size}, W.data(), W.size());
    const std::string r = run.initializer("R" + suffix, dt, {D, G * H, H}, R.data(), R.size());
    const std::string b =
        o.bias ? run.initializer("B" + suffix, dt, {D, 2 * G * H}, B.data(), B.size()) : "";

    // Then: the operator. Its outputs get names of their own (the If's are y, yh, yc).
    const std::string ry = y.empty() ? "" : run.fresh("then_Y" + suffix);
    const std::string ryh = run.fresh("then_Y_h" + suffix);
    const std::string ryc = lstm ? run.fresh("then_Y_c" + suffix) : "";
    onnx::NodeProto* n =
        lstm ? run.node(op_name, {layer_in, w, r, b, seq_lens, h0_l, c0_l}, {ry, ryh, ryc})
             : run.node(op_name, {layer_in, w, r, b, seq_lens, h0_l}, {ry, ryh});
    // Else: zeros of the outputs' shapes.
    auto zeros = [&](std::initializer_list<std::string> dims) {
      onnx::NodeProto* shape = skip.node("Concat", {}, {skip.fresh("else_shape")});
      for (const auto& d : dims) shape->add_input(d);
      GraphBuilder::add_int(shape, "axis", 0);
      onnx::NodeProto* c = nullptr;
      const std::string out = skip.op("ConstantOfShape", {shape->output(0)}, &c);
      GraphBuilder::add_zero_value(c, dt);
      return out;
    };
    // At T = 0 every length must be 0. The operator, which rejects lengths
    // outside [0, T], does not run here, so the branch rejects them itself: a
    // Gather from one element at index max |length| fails for any length but 0
    // ("indices element out of data bounds, idx=<|length|>"); its 0 is added to
    // the batch size, so the check runs whenever the branch does.
    onnx::NodeProto* concat_node = nullptr;
    onnx::NodeProto* abs_max = skip.node(
        "ReduceMax", {skip.op("Concat", {skip.op("Abs", {lengths}), zero_i64_1d}, &concat_node)},
        {skip.fresh("max_abs_length")});
    GraphBuilder::add_int(concat_node, "axis", 0);
    GraphBuilder::add_int(abs_max, "keepdims", 1);
    const std::string batch_dim =
        skip.op("Add", {skip.op("Gather", {x_shape, b_dim}),
                        skip.op("Gather", {zero_i64_1d, abs_max->output(0)})});
    if (!y.empty()) {
      const std::string time_dim = skip.op("Gather", {x_shape, t_dim});
      run.output(ry, onnx_type(dt), {kUnknownDim, D, kUnknownDim, H});
      skip.output(zeros({time_dim, dirs_dim, batch_dim, hidden_dim}), onnx_type(dt),
                  {kUnknownDim, D, kUnknownDim, H});
    }
    run.output(ryh, onnx_type(dt), {D, kUnknownDim, H});
    skip.output(zeros({dirs_dim, batch_dim, hidden_dim}), onnx_type(dt), {D, kUnknownDim, H});
    if (lstm) {
      run.output(ryc, onnx_type(dt), {D, kUnknownDim, H});
      skip.output(zeros({dirs_dim, batch_dim, hidden_dim}), onnx_type(dt), {D, kUnknownDim, H});
    }
    GraphBuilder::add_int(n, "hidden_size", H);
    GraphBuilder::add_string(n, "direction", D == 2 ? "bidirectional" : "forward");
    if (o.mode == RNNMode::gru) GraphBuilder::add_int(n, "linear_before_reset", 1);
    if (o.mode == RNNMode::rnn_tanh || o.mode == RNNMode::rnn_relu) {
      const std::string act = o.mode == RNNMode::rnn_relu ? "Relu" : "Tanh";
      GraphBuilder::add_strings(n, "activations", std::vector<std::string>(D, act));
    }

    // Zero-length sequences: the initial state (zeros without one).
    h_parts.push_back(gb.op("Where", {empty_3d, h0_l.empty() ? zero : h0_l, yh}));
    if (lstm) c_parts.push_back(gb.op("Where", {empty_3d, c0_l.empty() ? zero : c0_l, yc}));
    if (!y.empty()) {
      // Y [T, dirs, B, H] -> [T, B, dirs * H], the next layer's input. (The size
      // is spelled out: Reshape cannot infer a -1 from an empty tensor.)
      layer_in = gb.op("Reshape", {gb.transpose(y, {0, 2, 1, 3}), gb.constant_i64({0, 0, D * H})});
    }
  }
  RnnGraph out;
  auto concat = [&gb](const std::vector<std::string>& parts) {
    if (parts.size() == 1) return parts[0];
    onnx::NodeProto* n = gb.node("Concat", {}, {gb.fresh("Concat_out")});
    for (const auto& p : parts) n->add_input(p);
    GraphBuilder::add_int(n, "axis", 0);
    return n->output(0);
  };
  out.h_n = concat(h_parts);
  if (lstm) out.c_n = concat(c_parts);
  if (want_output) {
    // Zeros at padding, and for the one step a zero-length sequence was run:
    // step t of sequence b is real when t < lengths[b].
    const std::string t_len =
        gb.op("Gather", {gb.op("Shape", {x}), gb.constant_i64({0}, /*scalar=*/true)});
    const std::string steps =
        gb.op("Range", {gb.constant_i64({0}, true), t_len, gb.constant_i64({1}, true)});  // [T]
    const std::string valid = gb.op("Less", {gb.unsqueeze(steps, {1}), gb.unsqueeze(lengths, {0})});
    out.output = gb.op("Where", {gb.unsqueeze(valid, {2}), layer_in, zero});
  }
  return out;
}

// An empty model of the given opset, with seqpack as producer.
onnx::ModelProto new_model(const OnnxExportOptions& options, const std::string& graph_name) {
  options.validate();
  onnx::ModelProto m;
  m.set_ir_version(onnx::IR_VERSION);
  m.set_producer_name("seqpack");
  m.set_producer_version("0.1.0");
  onnx::OperatorSetIdProto* opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(options.opset);
  m.mutable_graph()->set_name(graph_name);
  return m;
}

// The ONNX checker, then strict shape inference (type checks on, node errors
// thrown): a node whose inputs do not fit its schema, or an inferred output type
// or shape that contradicts the declared one, throws. Inferred shapes are kept
// in the model (value_info), and the result is checked once more.
std::string check_and_serialize(onnx::ModelProto& m) {
  try {
    onnx::checker::check_model(m);
    onnx::ShapeInferenceOptions strict(/*check_type_val=*/true, /*strict_mode_val=*/1,
                                       /*data_prop_val=*/true);
    onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(), strict);
    onnx::checker::check_model(m);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("ONNX export: the ONNX checker rejected the model: ") +
                             e.what());
  }
  std::string bytes;
  if (!m.SerializeToString(&bytes))
    throw std::runtime_error("ONNX export: cannot serialize the model");
  return bytes;
}

void write_model(const std::string& path, const std::string& bytes) {
  if (path.empty()) throw std::invalid_argument("ONNX export: the output path is empty");
  write_file_atomically(path, bytes);
}

}  // namespace

std::string rnn_to_onnx(const RNNBase& rnn, const OnnxExportOptions& options) {
  const RNNOptions& o = rnn.options();
  o.validate();
  if (o.proj_size > 0) {
    throw std::invalid_argument("ONNX export: proj_size = " + std::to_string(o.proj_size) +
                                ": ONNX's LSTM operator has no projection");
  }
  if (o.dtype == DType::i64) throw std::invalid_argument("ONNX export: the RNN's dtype is int64");
  onnx::ModelProto m = new_model(options, std::string("seqpack_") + rnn_mode_name(o.mode));
  GraphBuilder gb(m.mutable_graph());
  const TensorProto_DataType ft = onnx_type(o.dtype);
  const bool lstm = o.mode == RNNMode::lstm;
  const int64_t LD = o.num_layers * o.num_directions(), H = o.hidden_size;
  if (o.batch_first) {
    gb.input("input", ft, {"batch", "time", o.input_size});
  } else {
    gb.input("input", ft, {"time", "batch", o.input_size});
  }
  gb.input("lengths", onnx::TensorProto_DataType_INT64, {"batch"});
  std::string h0, c0;
  if (options.initial_state) {
    gb.input("h0", ft, {LD, "batch", H});
    h0 = "h0";
    if (lstm) {
      gb.input("c0", ft, {LD, "batch", H});
      c0 = "c0";
    }
  }
  const std::string x = o.batch_first ? gb.transpose("input", {1, 0, 2}) : "input";
  const RnnGraph r = add_rnn(gb, o, rnn.parameters(), x, "lengths", h0, c0, /*want_output=*/true);
  const std::string y = o.batch_first ? gb.transpose(r.output, {1, 0, 2}) : r.output;
  gb.rename_output(y, "output");
  gb.rename_output(r.h_n, "h_n");
  if (lstm) gb.rename_output(r.c_n, "c_n");
  const int64_t out_size = o.num_directions() * H;
  if (o.batch_first) {
    gb.output("output", ft, {"batch", "time", out_size});
  } else {
    gb.output("output", ft, {"time", "batch", out_size});
  }
  gb.output("h_n", ft, {LD, "batch", H});
  if (lstm) gb.output("c_n", ft, {LD, "batch", H});
  return check_and_serialize(m);
}

void export_rnn_onnx(const RNNBase& rnn, const std::string& path,
                     const OnnxExportOptions& options) {
  write_model(path, rnn_to_onnx(rnn, options));
}

std::string classifier_to_onnx(CharClassifier& model, const std::vector<std::string>& labels,
                               const std::string& vocabulary_json,
                               const OnnxExportOptions& options) {
  const CharClassifierOptions& co = model.options();
  co.validate();
  if (!labels.empty() && static_cast<int64_t>(labels.size()) != co.num_classes) {
    throw std::invalid_argument("ONNX export: " + std::to_string(labels.size()) +
                                " labels for a classifier of " + std::to_string(co.num_classes) +
                                " classes");
  }
  onnx::ModelProto m = new_model(options, "seqpack_char_classifier");
  if (!labels.empty()) {
    std::string json = "[";
    for (std::size_t i = 0; i < labels.size(); ++i) {
      json += (i ? ", \"" : "\"");
      for (char ch : labels[i]) {
        if (ch == '"' || ch == '\\') json += '\\';
        json += ch;
      }
      json += '"';
    }
    json += "]";
    onnx::StringStringEntryProto* e = m.add_metadata_props();
    e->set_key("labels");
    e->set_value(json);
  }
  if (!vocabulary_json.empty()) {
    onnx::StringStringEntryProto* e = m.add_metadata_props();
    e->set_key("vocabulary");
    e->set_value(vocabulary_json);
  }
  GraphBuilder gb(m.mutable_graph());
  const TensorProto_DataType ft = onnx_type(co.dtype);
  gb.input("tokens", onnx::TensorProto_DataType_INT64, {"batch", "time"});
  gb.input("lengths", onnx::TensorProto_DataType_INT64, {"batch"});

  const Tensor& table = model.embedding().weight();
  const std::string emb =
      gb.initializer("embedding.weight", co.dtype, {co.vocab_size, co.embed_dim}, table.raw_data(),
                     table.nbytes());
  // Gather reads a negative id as counted from the end of the table; seqpack
  // rejects it. Shifting negative ids by -V puts them below Gather's range
  // [-V, V), so the runtime rejects them as it rejects ids >= V.
  const std::string shifted = gb.op("Sub", {"tokens", gb.constant_i64({co.vocab_size}, true)});
  const std::string ids =
      gb.op("Where", {gb.op("Less", {"tokens", gb.constant_i64({0}, true)}), shifted, "tokens"});
  // [B, T, E] -> time-major [T, B, E]
  const std::string x = gb.transpose(gb.op("Gather", {emb, ids}), {1, 0, 2});
  const RnnGraph r = add_rnn(gb, model.lstm().options(), model.lstm().parameters(), x, "lengths",
                             "", "", /*want_output=*/false);
  // h_n [2, B, H] -> features [B, 2H] = [h_n[0, b] ; h_n[1, b]]
  const std::string feat =
      gb.op("Reshape", {gb.transpose(r.h_n, {1, 0, 2}), gb.constant_i64({0, 2 * co.hidden_size})});
  Linear& fc = model.fc();
  const std::string w = gb.initializer("fc.weight", co.dtype, {co.num_classes, 2 * co.hidden_size},
                                       fc.weight().raw_data(), fc.weight().nbytes());
  const std::string b = gb.initializer("fc.bias", co.dtype, {co.num_classes}, fc.bias().raw_data(),
                                       fc.bias().nbytes());
  onnx::NodeProto* gemm = gb.node("Gemm", {feat, w, b}, {"logits"});
  GraphBuilder::add_int(gemm, "transB", 1);
  gb.output("logits", ft, {"batch", co.num_classes});
  return check_and_serialize(m);
}

void export_classifier_onnx(const TrainedClassifier& classifier, const std::string& path,
                            const OnnxExportOptions& options) {
  if (!classifier.model) throw std::invalid_argument("ONNX export: the classifier has no model");
  write_model(path, classifier_to_onnx(*classifier.model, classifier.labels,
                                       classifier.vocabulary.to_json(), options));
}

}  // namespace seqpack
