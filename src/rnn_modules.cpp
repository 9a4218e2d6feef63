// Options, parameter names, and the RNN/LSTM/GRU modules and cells. The maths
// lives in rnn_core.cpp (rnn_forward / rnn_backward); modules only convert
// between the user's layouts (packed, padded, batch-first, unbatched) and
// packed rows.
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "seqpack/rnn.h"
#include "train/grad_sum.h"

namespace seqpack {

namespace {
std::string num(double v) {
  std::string s = std::to_string(v);
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.push_back('0');
  return s;
}
}  // namespace

const char* rnn_mode_name(RNNMode mode) {
  switch (mode) {
    case RNNMode::rnn_tanh:
      return "rnn_tanh";
    case RNNMode::rnn_relu:
      return "rnn_relu";
    case RNNMode::lstm:
      return "lstm";
    case RNNMode::gru:
      return "gru";
  }
  return "unknown";
}

RNNMode parse_rnn_mode(const std::string& name) {
  if (name == "rnn_tanh") return RNNMode::rnn_tanh;
  if (name == "rnn_relu") return RNNMode::rnn_relu;
  if (name == "lstm") return RNNMode::lstm;
  if (name == "gru") return RNNMode::gru;
  throw std::invalid_argument("unknown RNN mode '" + name +
                              "' (expected rnn_tanh, rnn_relu, lstm or gru)");
}

namespace {

// Limits per size, far above any trained network, so that a product of sizes
// fits in int64_t and every parameter's bytes can be checked before anything
// is allocated ("hidden_size": 2^60 in a config.json once wrapped 4 * H * I
// around to a small buffer that init_uniform then overran).
constexpr int64_t kMaxRnnSize = int64_t{1} << 24;    // input_size, hidden_size, proj_size
constexpr int64_t kMaxRnnLayers = int64_t{1} << 16;  // num_layers

void check_sizes(const RNNOptions& o) {
  const std::pair<const char*, int64_t> sizes[] = {
      {"input_size", o.input_size}, {"hidden_size", o.hidden_size}, {"proj_size", o.proj_size}};
  for (const auto& [name, v] : sizes) {
    if (v > kMaxRnnSize) {
      throw std::invalid_argument(std::string(name) + " = " + std::to_string(v) +
                                  " is too large: seqpack allows at most " +
                                  std::to_string(kMaxRnnSize) + " (2^24)");
    }
  }
  if (o.num_layers > kMaxRnnLayers) {
    throw std::invalid_argument("num_layers = " + std::to_string(o.num_layers) +
                                " is too large: seqpack allows at most " +
                                std::to_string(kMaxRnnLayers) + " (2^16)");
  }
  // Every size is now at most 2^24, so each shape's product fits in int64_t;
  // the bytes are checked per parameter and in total (stopping at the first
  // excess, so the sum cannot overflow either).
  const std::vector<std::string> names = rnn_parameter_names(o);
  const std::vector<Shape> shapes = rnn_parameter_shapes(o);
  const std::string sizes_text = "input_size = " + std::to_string(o.input_size) +
                                 ", hidden_size = " + std::to_string(o.hidden_size) +
                                 ", num_layers = " + std::to_string(o.num_layers);
  int64_t total = 0;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    try {
      total += static_cast<int64_t>(shape_nbytes(shapes[i], o.dtype));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(sizes_text + ": parameter " + names[i] + ": " + e.what());
    }
    if (total > kMaxTensorBytes) {
      throw std::invalid_argument(sizes_text +
                                  ": the parameters would take more than seqpack's "
                                  "limit of " +
                                  std::to_string(kMaxTensorBytes) + " bytes (2^46)");
    }
  }
}

}  // namespace

void RNNOptions::validate() const {
  if (input_size <= 0) {
    throw std::invalid_argument("input_size must be positive, got " + std::to_string(input_size));
  }
  if (hidden_size <= 0) {
    throw std::invalid_argument("hidden_size must be positive, got " +
                                std::to_string(hidden_size));
  }
  if (num_layers <= 0) {
    throw std::invalid_argument("num_layers must be positive, got " + std::to_string(num_layers));
  }
  if (!(dropout >= 0.0 && dropout < 1.0)) {
    throw std::invalid_argument("dropout must be in [0, 1), got " + num(dropout));
  }
  if (proj_size < 0) {
    throw std::invalid_argument("proj_size must be non-negative, got " +
                                std::to_string(proj_size));
  }
  if (proj_size > 0 && mode != RNNMode::lstm) {
    throw std::invalid_argument("proj_size = " + std::to_string(proj_size) +
                                " is only supported for LSTM, not " + rnn_mode_name(mode));
  }
  if (proj_size >= hidden_size && proj_size > 0) {
    throw std::invalid_argument("proj_size = " + std::to_string(proj_size) +
                                " must be smaller than hidden_size = " +
                                std::to_string(hidden_size));
  }
  if (dtype != DType::f32 && dtype != DType::f64) {
    throw std::invalid_argument(std::string("dtype must be float32 or float64, got ") +
                                dtype_name(dtype));
  }
  if (precision != Precision::fp32 && dtype != DType::f32) {
    throw std::invalid_argument(std::string("precision ") + precision_name(precision) +
                                " needs dtype float32, got " + dtype_name(dtype));
  }
  check_sizes(*this);
}

int64_t RNNOptions::gate_count() const {
  switch (mode) {
    case RNNMode::lstm:
      return 4;
    case RNNMode::gru:
      return 3;
    default:
      return 1;
  }
}

std::vector<std::string> rnn_parameter_names(const RNNOptions& o) {
  std::vector<std::string> names;
  for (int64_t l = 0; l < o.num_layers; ++l) {
    for (int64_t d = 0; d < o.num_directions(); ++d) {
      const std::string sfx = "_l" + std::to_string(l) + (d == 1 ? "_reverse" : "");
      names.push_back("weight_ih" + sfx);
      names.push_back("weight_hh" + sfx);
      if (o.bias) {
        names.push_back("bias_ih" + sfx);
        names.push_back("bias_hh" + sfx);
      }
      if (o.proj_size > 0) names.push_back("weight_hr" + sfx);
    }
  }
  return names;
}

std::vector<Shape> rnn_parameter_shapes(const RNNOptions& o) {
  std::vector<Shape> shapes;
  const int64_t gh = o.gate_count() * o.hidden_size;
  for (int64_t l = 0; l < o.num_layers; ++l) {
    const int64_t in = l == 0 ? o.input_size : o.output_size();
    for (int64_t d = 0; d < o.num_directions(); ++d) {
      shapes.push_back({gh, in});
      shapes.push_back({gh, o.real_hidden_size()});
      if (o.bias) {
        shapes.push_back({gh});
        shapes.push_back({gh});
      }
      if (o.proj_size > 0) shapes.push_back({o.proj_size, o.hidden_size});
    }
  }
  return shapes;
}

// ---------------------------------------------------------------------------
// Modules

namespace {

void init_uniform(std::vector<Tensor>& params, int64_t hidden_size, uint64_t seed) {
  // PyTorch's reset_parameters: every parameter ~ U(-k, k), k = 1/sqrt(hidden).
  // The generator differs from torch's, so values differ; the distribution does not.
  const double k = 1.0 / std::sqrt(static_cast<double>(hidden_size));
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(-k, k);
  for (Tensor& p : params) {
    for (int64_t i = 0; i < p.numel(); ++i) {
      const double v = dist(gen);
      if (p.dtype() == DType::f32) {
        p.data<float>()[i] = static_cast<float>(v);
      } else {
        p.data<double>()[i] = v;
      }
    }
  }
}

std::map<std::string, Tensor> make_state_dict(const std::vector<std::string>& names,
                                              const std::vector<Tensor>& params) {
  std::map<std::string, Tensor> out;
  for (std::size_t i = 0; i < names.size(); ++i) out[names[i]] = params[i];
  return out;
}

void load_into(const std::vector<std::string>& names, std::vector<Tensor>& params,
               const std::map<std::string, Tensor>& state) {
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (!state.count(names[i])) {
      throw std::invalid_argument("load_state_dict: missing key '" + names[i] + "'");
    }
  }
  for (const auto& [key, value] : state) {
    std::size_t i = 0;
    while (i < names.size() && names[i] != key) ++i;
    if (i == names.size()) {
      throw std::invalid_argument("load_state_dict: unexpected key '" + key + "'");
    }
    if (!value.defined() || value.shape() != params[i].shape()) {
      throw std::invalid_argument("load_state_dict: '" + key + "' has shape " +
                                  (value.defined() ? shape_str(value.shape()) : "undefined") +
                                  ", expected " + shape_str(params[i].shape()));
    }
  }
  // Checked everything first, so a failed load leaves the parameters unchanged.
  for (std::size_t i = 0; i < names.size(); ++i) {
    const Tensor& v = state.at(names[i]);
    params[i].copy_from(v.dtype() == params[i].dtype() ? v : v.to(params[i].dtype()));
  }
}

std::vector<Tensor> zeros_like_all(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) out.push_back(Tensor::zeros(p.shape(), p.dtype()));
  return out;
}

void check_input_dtype(const Tensor& input, DType dtype, const char* what) {
  if (input.defined() && input.dtype() != dtype) {
    throw std::invalid_argument(std::string(what) + " has dtype " + dtype_name(input.dtype()) +
                                " but the module's parameters are " + dtype_name(dtype));
  }
}

}  // namespace

RNNBase::RNNBase(RNNOptions options, uint64_t seed) : options_(options) {
  options_.validate();
  names_ = rnn_parameter_names(options_);
  for (const Shape& s : rnn_parameter_shapes(options_)) {
    params_.push_back(Tensor::zeros(s, options_.dtype));
  }
  grads_ = zeros_like_all(params_);
  reset_parameters(seed);
}

Tensor& RNNBase::parameter(const std::string& name) {
  plan_.reset();
  for (std::size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return params_[i];
  }
  throw std::invalid_argument("unknown parameter '" + name + "'");
}

void RNNBase::zero_grad() {
  for (Tensor& g : grads_) g.fill(0.0);
}

void RNNBase::reset_parameters(uint64_t seed) {
  plan_.reset();
  init_uniform(params_, options_.hidden_size, seed);
}

std::map<std::string, Tensor> RNNBase::state_dict() const {
  plan_.reset();  // views: the caller may change them
  return make_state_dict(names_, params_);
}

void RNNBase::load_state_dict(const std::map<std::string, Tensor>& state) {
  plan_.reset();
  load_into(names_, params_, state);
}

namespace {
// h0/c0 of an unbatched input are 2-D [layers*dirs, H]; the core wants 3-D.
Tensor batched_state(const Tensor& s, bool unbatched, const char* what) {
  if (!s.defined() || !unbatched) return s;
  if (s.dim() != 2) {
    throw std::invalid_argument(std::string("for unbatched input ") + what +
                                " must be 2-D, got shape " + shape_str(s.shape()));
  }
  return s.view({s.size(0), 1, s.size(1)});
}
Tensor unbatched_state(const Tensor& s, bool unbatched) {
  if (!s.defined() || !unbatched) return s;
  return s.view({s.size(0), s.size(2)});
}
// Whether a module's forward saves for a backward: an int8 module's never
// does (int8 has no gradient), whatever requires_grad says, so that eval()
// is all an int8 module needs.
bool saves(const RNNOptions& o, bool requires_grad) {
  return requires_grad && precision_traits(o.precision).backward;
}

std::string no_saved_message(const RNNOptions& o) {
  return !precision_traits(o.precision).backward
             ? std::string("backward: precision ") + precision_name(o.precision) +
                   " is for inference only (its forwards save nothing)"
             : "backward: the forward ran without requires_grad";
}

}  // namespace

std::shared_ptr<const RNNModelPlan> ModulePlan::for_forward(const RNNOptions& options,
                                                            const std::vector<Tensor>& weights,
                                                            const RNNConfig& config,
                                                            bool inference) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (!inference) {
    plan_.reset();
    return rnn_make_plan(options, weights, /*in_place=*/true, config);
  }
  // Made under the lock: two threads meeting no plan make one, not two.
  // Compared with the weights at every forward (exact: their bytes), so a
  // change through any tensor or pointer is seen by the next forward.
  plan_ = rnn_current_plan(plan_, options, weights, config);
  return plan_;
}

void ModulePlan::reset() {
  const std::lock_guard<std::mutex> lock(mutex_);
  plan_.reset();
}

void RNNBase::set_precision(Precision p) {
  RNNOptions o = options_;
  o.precision = p;
  o.validate();
  options_ = o;
  plan_.reset();
}

RNNOutput RNNBase::forward(const PackedSequence& input, const Tensor& h0, const Tensor& c0,
                           bool requires_grad) {
  check_input_dtype(input.data, options_.dtype, "input");
  auto plan = std::make_shared<PackingPlan>(PackingPlan::from_packed(input));
  const uint64_t seed = dropout_seed_;
  if (training_ && options_.dropout > 0) ++dropout_seed_;
  const auto model =
      plan_.for_forward(options_, params_, config_, !training_ && !saves(options_, requires_grad));
  RNNForwardResult r = rnn_forward(*model, input.data, *plan, h0, c0, training_,
                                   saves(options_, requires_grad), seed);
  RNNOutput out;
  out.packed.data = r.output;
  out.packed.batch_sizes = input.batch_sizes;
  out.packed.sorted_indices = input.sorted_indices;
  out.packed.unsorted_indices = input.unsorted_indices;
  out.h_n = r.h_n;
  out.c_n = r.c_n;
  out.saved = r.saved;
  out.plan = plan;
  return out;
}

RNNOutput RNNBase::forward(const Tensor& input, const Tensor& h0, const Tensor& c0,
                           bool requires_grad) {
  if (!input.defined() || (input.dim() != 2 && input.dim() != 3)) {
    throw std::invalid_argument("RNN input must be 2-D (unbatched) or 3-D, got shape " +
                                (input.defined() ? shape_str(input.shape()) : "undefined"));
  }
  const bool unbatched = input.dim() == 2;
  const int64_t T = unbatched ? input.size(0) : input.size(options_.batch_first ? 1 : 0);
  const int64_t B = unbatched ? 1 : input.size(options_.batch_first ? 0 : 1);
  return forward(input, std::vector<int64_t>(static_cast<std::size_t>(B), T), h0, c0,
                 requires_grad);
}

RNNOutput RNNBase::forward(const Tensor& input, const std::vector<int64_t>& lengths,
                           const Tensor& h0, const Tensor& c0, bool requires_grad) {
  if (!input.defined() || (input.dim() != 2 && input.dim() != 3)) {
    throw std::invalid_argument("RNN input must be 2-D (unbatched) or 3-D, got shape " +
                                (input.defined() ? shape_str(input.shape()) : "undefined"));
  }
  check_input_dtype(input, options_.dtype, "input");
  const bool unbatched = input.dim() == 2;
  Tensor tm = unbatched ? input.view({input.size(0), 1, input.size(1)})
                        : (options_.batch_first ? transpose01(input) : input);
  const int64_t T = tm.size(0), B = tm.size(1);
  if (static_cast<int64_t>(lengths.size()) != B) {
    throw std::invalid_argument("got " + std::to_string(lengths.size()) +
                                " lengths for a batch of " + std::to_string(B));
  }
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    if (lengths[b] < 0 || lengths[b] > T) {
      throw std::invalid_argument("lengths[" + std::to_string(b) + "] = " +
                                  std::to_string(lengths[b]) + " is outside [0, " +
                                  std::to_string(T) + "], the padded length");
    }
  }
  if (tm.size(2) != options_.input_size) {
    throw std::invalid_argument("input has " + std::to_string(tm.size(2)) +
                                " features, expected input_size = " +
                                std::to_string(options_.input_size));
  }
  auto plan =
      std::make_shared<PackingPlan>(PackingPlan::from_lengths(lengths, /*enforce_sorted=*/false));
  const Tensor data = plan->pack(tm);
  const uint64_t seed = dropout_seed_;
  if (training_ && options_.dropout > 0) ++dropout_seed_;
  const auto model =
      plan_.for_forward(options_, params_, config_, !training_ && !saves(options_, requires_grad));
  RNNForwardResult r = rnn_forward(*model, data, *plan, batched_state(h0, unbatched, "h0"),
                                   batched_state(c0, unbatched, "c0"), training_,
                                   saves(options_, requires_grad), seed);
  RNNOutput out;
  Tensor padded = plan->unpack(r.output, T, 0.0);  // [T, B, O]
  if (unbatched) {
    out.padded = padded.view({T, options_.output_size()});
  } else {
    out.padded = options_.batch_first ? transpose01(padded) : padded;
  }
  out.h_n = unbatched_state(r.h_n, unbatched);
  out.c_n = unbatched_state(r.c_n, unbatched);
  out.saved = r.saved;
  out.plan = plan;
  out.padded_length = T;
  return out;
}

RNNGradients RNNBase::backward(const RNNOutput& out, const Tensor& grad_output,
                               const Tensor& grad_h_n, const Tensor& grad_c_n) {
  if (!out.saved || !out.plan) {
    throw std::invalid_argument(no_saved_message(options_));
  }
  const bool padded = out.padded.defined();
  const bool unbatched = padded && out.padded.dim() == 2;
  Tensor grad_rows;
  if (grad_output.defined()) {
    const Tensor& ref = padded ? out.padded : out.packed.data;
    if (grad_output.shape() != ref.shape()) {
      throw std::invalid_argument("grad_output has shape " + shape_str(grad_output.shape()) +
                                  ", expected the output's shape " + shape_str(ref.shape()));
    }
    check_input_dtype(grad_output, options_.dtype, "grad_output");
    if (padded) {
      Tensor tm = unbatched ? grad_output.view({grad_output.size(0), 1, grad_output.size(1)})
                            : (options_.batch_first ? transpose01(grad_output) : grad_output);
      grad_rows = out.plan->pack(tm);
    } else {
      grad_rows = grad_output;
    }
  }
  RNNGradients g = rnn_backward(*out.saved, grad_rows, batched_state(grad_h_n, unbatched, "grad_h_n"),
                                batched_state(grad_c_n, unbatched, "grad_c_n"));
  train::add_grads(grads_, g.weights);
  if (padded) {
    Tensor p = out.plan->unpack(g.input, out.padded_length, 0.0);
    if (unbatched) {
      g.input = p.view({p.size(0), p.size(2)});
    } else {
      g.input = options_.batch_first ? transpose01(p) : p;
    }
  }
  g.h0 = unbatched_state(g.h0, unbatched);
  g.c0 = unbatched_state(g.c0, unbatched);
  return g;
}

namespace {
RNNOptions rnn_options(RNNOptions o) {
  if (o.mode != RNNMode::rnn_tanh && o.mode != RNNMode::rnn_relu) {
    throw std::invalid_argument(std::string("RNN needs mode rnn_tanh or rnn_relu, got ") +
                                rnn_mode_name(o.mode));
  }
  return o;
}
RNNOptions with_mode(RNNOptions o, RNNMode m) {
  o.mode = m;
  return o;
}
}  // namespace

RNN::RNN(RNNOptions options, uint64_t seed) : RNNBase(rnn_options(options), seed) {}
LSTM::LSTM(RNNOptions options, uint64_t seed) : RNNBase(with_mode(options, RNNMode::lstm), seed) {}
GRU::GRU(RNNOptions options, uint64_t seed) : RNNBase(with_mode(options, RNNMode::gru), seed) {}

// ---------------------------------------------------------------------------
// Cells: one step of a one-layer network, run through the same core with T = 1.

RNNCellBase::RNNCellBase(RNNMode mode, int64_t input_size, int64_t hidden_size, bool bias,
                         DType dtype, uint64_t seed) {
  options_.mode = mode;
  options_.input_size = input_size;
  options_.hidden_size = hidden_size;
  options_.bias = bias;
  options_.dtype = dtype;
  options_.validate();
  names_ = {"weight_ih", "weight_hh"};
  if (bias) {
    names_.push_back("bias_ih");
    names_.push_back("bias_hh");
  }
  for (const Shape& s : rnn_parameter_shapes(options_)) params_.push_back(Tensor::zeros(s, dtype));
  grads_ = zeros_like_all(params_);
  init_uniform(params_, hidden_size, seed);
}

std::map<std::string, Tensor> RNNCellBase::state_dict() const {
  plan_.reset();  // views: the caller may change them
  return make_state_dict(names_, params_);
}
void RNNCellBase::load_state_dict(const std::map<std::string, Tensor>& state) {
  plan_.reset();
  load_into(names_, params_, state);
}
void RNNCellBase::zero_grad() {
  for (Tensor& g : grads_) g.fill(0.0);
}

namespace {
// A cell state [B, H] (or [H] unbatched) as the core's [1, B, H].
Tensor cell_state(const Tensor& s, int64_t B, int64_t H, bool unbatched, const char* what) {
  if (!s.defined()) return s;
  const Shape want = unbatched ? Shape{H} : Shape{B, H};
  if (s.shape() != want) {
    throw std::invalid_argument(std::string(what) + " has shape " + shape_str(s.shape()) +
                                ", expected " + shape_str(want));
  }
  return s.view({1, B, H});
}
}  // namespace

CellOutput RNNCellBase::forward(const Tensor& input, const Tensor& hx, const Tensor& cx,
                                bool requires_grad) {
  if (!input.defined() || (input.dim() != 1 && input.dim() != 2)) {
    throw std::invalid_argument("cell input must be 1-D or 2-D, got shape " +
                                (input.defined() ? shape_str(input.shape()) : "undefined"));
  }
  check_input_dtype(input, options_.dtype, "input");
  const bool unbatched = input.dim() == 1;
  const int64_t B = unbatched ? 1 : input.size(0);
  const int64_t I = input.size(-1), H = options_.hidden_size;
  if (I != options_.input_size) {
    throw std::invalid_argument("input has " + std::to_string(I) +
                                " features, expected input_size = " +
                                std::to_string(options_.input_size));
  }
  if (cx.defined() && options_.mode != RNNMode::lstm) {
    throw std::invalid_argument("cx is only accepted by LSTMCell");
  }
  const PackingPlan plan = PackingPlan::from_lengths(std::vector<int64_t>(static_cast<std::size_t>(B), 1),
                                                     /*enforce_sorted=*/true);
  // A cell's step is one step: at fp32 it reads its weights in place (a
  // plan would have to be compared with them at every step, reading them
  // twice); bf16 and int8 steps keep the plan their engine needs.
  const auto model =
      plan_.for_forward(options_, params_, config_,
                        !saves(options_, requires_grad) && options_.precision != Precision::fp32);
  RNNForwardResult r = rnn_forward(
      *model, input.view({B, I}), plan, cell_state(hx, B, H, unbatched, "hx"),
      cell_state(cx, B, H, unbatched, "cx"), /*training=*/false, saves(options_, requires_grad), 0);
  CellOutput out;
  out.unbatched = unbatched;
  const Shape s = unbatched ? Shape{H} : Shape{B, H};
  out.h = r.h_n.view(s);
  if (r.c_n.defined()) out.c = r.c_n.view(s);
  out.saved = r.saved;
  return out;
}

CellGradients RNNCellBase::backward(const CellOutput& out, const Tensor& grad_h,
                                    const Tensor& grad_c) {
  if (!out.saved) throw std::invalid_argument(no_saved_message(options_));
  const int64_t H = options_.hidden_size;
  const int64_t B = out.unbatched ? 1 : out.h.size(0);
  RNNGradients g = rnn_backward(*out.saved, Tensor(),
                                cell_state(grad_h, B, H, out.unbatched, "grad_h"),
                                cell_state(grad_c, B, H, out.unbatched, "grad_c"));
  train::add_grads(grads_, g.weights);
  CellGradients cg;
  const Shape s = out.unbatched ? Shape{H} : Shape{B, H};
  cg.input = out.unbatched ? g.input.view({options_.input_size}) : g.input;
  cg.h = g.h0.view(s);
  if (g.c0.defined()) cg.c = g.c0.view(s);
  return cg;
}

namespace {
RNNMode cell_mode(const std::string& nonlinearity) {
  if (nonlinearity == "tanh") return RNNMode::rnn_tanh;
  if (nonlinearity == "relu") return RNNMode::rnn_relu;
  throw std::invalid_argument("unknown nonlinearity '" + nonlinearity +
                              "' (expected tanh or relu)");
}
}  // namespace

RNNCell::RNNCell(int64_t input_size, int64_t hidden_size, bool bias,
                 const std::string& nonlinearity, DType dtype, uint64_t seed)
    : RNNCellBase(cell_mode(nonlinearity), input_size, hidden_size, bias, dtype, seed) {}
LSTMCell::LSTMCell(int64_t input_size, int64_t hidden_size, bool bias, DType dtype,
                   uint64_t seed)
    : RNNCellBase(RNNMode::lstm, input_size, hidden_size, bias, dtype, seed) {}
GRUCell::GRUCell(int64_t input_size, int64_t hidden_size, bool bias, DType dtype, uint64_t seed)
    : RNNCellBase(RNNMode::gru, input_size, hidden_size, bias, dtype, seed) {}

}  // namespace seqpack
