// libseqpack_torch: seqpack's recurrent layers and packing utilities as PyTorch
// operators, registered with TORCH_LIBRARY(seqpack, m), so that eager Python
// (torch.ops.seqpack.*), TorchScript and LibTorch (torch::jit::load) run them.
//
//   seqpack::rnn(data, batch_sizes, sorted_indices?, unsorted_indices?, h0?, c0?, weights,
//                mode, hidden_size, num_layers, bias, bidirectional, proj_size, dropout,
//                train, seed?) -> (output, h_n, c_n)          packed rows in, packed rows out
//   seqpack::rnn_padded(input, lengths?, h0?, c0?, weights, mode, ..., batch_first, ...)
//                                                                padded in, padded out
//   seqpack::pack_padded_sequence(input, lengths, batch_first, enforce_sorted)
//       -> (data, batch_sizes, sorted_indices, unsorted_indices)   (indices empty: none)
//   seqpack::pad_packed_sequence(data, batch_sizes, sorted_indices?, unsorted_indices?,
//                                batch_first, padding_value, total_length?) -> (padded, lengths)
//
// The kernels call seqpack's functional core (include/seqpack/rnn.h,
// packed_sequence.h) on the torch tensors' memory: a contiguous CPU tensor is
// wrapped by seqpack::Tensor::wrap (the wrapper keeps the torch tensor alive),
// and the core's results come back through at::from_blob with a deleter that
// holds the seqpack tensor. Autograd is torch::autograd::Function in C++, so a
// forward and backward never return to Python. Zero-length sequences are
// accepted everywhere, as in the rest of seqpack; h0/c0 and h_n/c_n are in the
// caller's batch order.
//
// Errors: the core's std::invalid_argument arrives as c10::ValueError (Python
// ValueError), a wrong dtype as c10::TypeError, a wrong device as ValueError,
// each naming the operator, the argument and the value.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "seqpack/packed_sequence.h"
#include "seqpack/precision.h"
#include "seqpack/rnn.h"
#include "seqpack/tensor.h"

namespace seqpack::torch_ops {

namespace {

using at::Tensor;
using OptTensor = c10::optional<at::Tensor>;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using CoreTensor = seqpack::Tensor;

// ---- tensors: torch <-> seqpack without copies ----------------------------

DType core_dtype(const Tensor& t, const char* op, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return DType::f32;
    case at::kDouble:
      return DType::f64;
    case at::kLong:
      return DType::i64;
    default:
      C10_THROW_ERROR(
          TypeError,
          c10::str(op, ": ", what, " has dtype ", t.scalar_type(),
                   "; seqpack runs float32 and float64 (int64 for lengths and indices)"));
  }
}

at::ScalarType torch_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return at::kFloat;
    case DType::f64:
      return at::kDouble;
    case DType::i64:
      return at::kLong;
  }
  throw std::logic_error("unknown seqpack dtype");
}

void check_cpu(const Tensor& t, const char* op, const char* what) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), op, ": ", what, " is on device ", t.device(),
                    "; seqpack's operators run on the CPU");
}

// A seqpack view of `t` (a copy only when `t` is not contiguous). An undefined
// tensor maps to an undefined one (optional arguments).
CoreTensor to_core(const Tensor& t, const char* op, const char* what) {
  if (!t.defined()) return CoreTensor();
  check_cpu(t, op, what);
  const DType dtype = core_dtype(t, op, what);
  auto keep = std::make_shared<Tensor>(t.contiguous());
  Shape shape(keep->sizes().begin(), keep->sizes().end());
  void* data = keep->data_ptr();
  return CoreTensor::wrap(data, std::move(shape), dtype, std::move(keep));
}

CoreTensor to_core(const OptTensor& t, const char* op, const char* what) {
  return t.has_value() ? to_core(*t, op, what) : CoreTensor();
}

Tensor int64_tensor(const OptTensor& t, const char* op, const char* what) {
  if (!t.has_value() || !t->defined()) return Tensor();
  check_cpu(*t, op, what);
  TORCH_CHECK_TYPE(t->scalar_type() == at::kLong, op, ": ", what, " must be int64, got ",
                   t->scalar_type());
  return *t;
}

// A torch tensor viewing `t`'s storage, which a copy of `t` held as the data
// pointer's context keeps alive (a context, unlike a deleter, needs no
// std::function per tensor).
Tensor from_core(const CoreTensor& t) {
  if (!t.defined()) return Tensor();
  auto* keep = new CoreTensor(t);
  return at::for_blob(const_cast<void*>(keep->raw_data()), t.shape())
      .context(keep, [](void* p) { delete static_cast<CoreTensor*>(p); })
      .options(at::TensorOptions().dtype(torch_dtype(t.dtype())))
      .make_tensor();
}

std::vector<int64_t> to_vector(const Tensor& lengths, const char* op) {
  TORCH_CHECK_VALUE(lengths.dim() == 1, op, ": lengths must be 1-D, got shape ", lengths.sizes());
  const Tensor c = lengths.contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

// Runs `f`, turning the core's std::invalid_argument into a ValueError that
// names the operator.
template <typename F>
auto checked(const char* op, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::invalid_argument& e) {
    C10_THROW_ERROR(ValueError, c10::str(op, ": ", e.what()));
  }
}

// Keeps a C++ object in an AutogradContext's saved_data.
template <typename T>
struct Holder : torch::CustomClassHolder {
  explicit Holder(T v) : value(std::move(v)) {}
  T value;
};

template <typename T>
void stash(AutogradContext* ctx, const char* key, T value) {
  ctx->saved_data[key] =
      c10::IValue::make_capsule(c10::make_intrusive<Holder<T>>(std::move(value)));
}

template <typename T>
const T& unstash(AutogradContext* ctx, const char* key) {
  auto capsule = ctx->saved_data.at(key).toCapsule();
  return static_cast<Holder<T>*>(capsule.get())->value;
}

// True when autograd must record the call: grad mode on and some input
// requiring a gradient.
bool needs_graph(const Tensor& data, const OptTensor& h0, const OptTensor& c0,
                 at::TensorList weights) {
  if (!at::GradMode::is_enabled()) return false;
  auto wants = [](const OptTensor& t) { return t.has_value() && t->requires_grad(); };
  if (data.requires_grad() || wants(h0) || wants(c0)) return true;
  for (const Tensor& w : weights)
    if (w.requires_grad()) return true;
  return false;
}

// ---- the recurrent layers --------------------------------------------------

RNNMode parse_mode(c10::string_view mode) {
  if (mode == "LSTM") return RNNMode::lstm;
  if (mode == "GRU") return RNNMode::gru;
  if (mode == "RNN_TANH") return RNNMode::rnn_tanh;
  if (mode == "RNN_RELU") return RNNMode::rnn_relu;
  C10_THROW_ERROR(ValueError, c10::str("seqpack::rnn: mode = '", mode,
                                       "' is not one of 'LSTM', 'GRU', 'RNN_TANH', 'RNN_RELU'"));
}

// Everything of a recurrent call that is not a tensor.
struct RNNCall {
  RNNOptions options;
  std::shared_ptr<const PackingPlan> plan;
  bool train = false;
  uint64_t seed = 0;
};

RNNCall make_call(const char* op, const Tensor& x, int64_t input_size, c10::string_view mode,
                  int64_t hidden_size, int64_t num_layers, bool bias, bool bidirectional,
                  int64_t proj_size, double dropout, bool train, c10::optional<int64_t> seed,
                  c10::string_view precision) {
  check_cpu(x, op, "input");
  const DType dtype = core_dtype(x, op, "input");
  TORCH_CHECK_TYPE(dtype != DType::i64, op,
                   ": input has dtype Long; seqpack runs float32 and float64");
  RNNCall call;
  RNNOptions& o = call.options;
  o.mode = parse_mode(mode);
  o.input_size = input_size;
  o.hidden_size = hidden_size;
  o.num_layers = num_layers;
  o.bias = bias;
  o.dropout = dropout;
  o.bidirectional = bidirectional;
  o.proj_size = proj_size;
  o.dtype = dtype;
  // "fp32", "bf16" (an error naming the ISA where the CPU has no native bf16),
  // or "auto" (bf16 where native: what seqpack.torch passes under autocast).
  checked(op, [&] {
    // "fp32" (what every call outside autocast passes) needs no CPU query.
    o.precision = precision == "fp32" ? Precision::fp32 : resolve_precision(std::string(precision));
    o.validate();
  });
  call.train = train;
  if (seed.has_value()) {
    call.seed = static_cast<uint64_t>(*seed);
  } else if (train && dropout > 0 && num_layers > 1) {
    // From torch's generator, so torch.manual_seed replays the masks.
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    call.seed = at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
  }
  return call;
}

std::vector<CoreTensor> core_weights(at::TensorList weights, const char* op) {
  std::vector<CoreTensor> out;
  out.reserve(weights.size());
  for (const Tensor& w : weights) out.push_back(to_core(w, op, "a weight"));
  return out;
}

std::tuple<Tensor, Tensor, Tensor> outputs(const RNNForwardResult& r, const Tensor& like) {
  Tensor c_n = r.c_n.defined() ? from_core(r.c_n) : at::empty({0}, like.options());
  return {from_core(r.output), from_core(r.h_n), c_n};
}

RNNForwardResult run_forward(const RNNCall& call, const Tensor& data, const OptTensor& h0,
                             const OptTensor& c0, at::TensorList weights, bool save) {
  constexpr const char* op = "seqpack::rnn";
  std::vector<CoreTensor> w = core_weights(weights, op);
  CoreTensor x = to_core(data, op, "input"), h = to_core(h0, op, "h0"), c = to_core(c0, op, "c0");
  return checked(op, [&] {
    return rnn_forward(call.options, w, x, *call.plan, h, c, call.train, save, call.seed);
  });
}

// What the backward needs besides the saved tensors.
struct NodeState {
  std::shared_ptr<const RNNSaved> core;  // the core's saved activations
  int64_t h0_edge = -1, c0_edge = -1, w_edge = 1;
  bool lstm = false;  // c_n is a real output (else an empty placeholder)
};

// Autograd node of one multi-layer recurrent forward on packed rows.
class RNNFunction : public torch::autograd::Function<RNNFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& data, const OptTensor& h0,
                               const OptTensor& c0, at::TensorList weights, const RNNCall& call) {
    RNNForwardResult r = run_forward(call, data, h0, c0, weights, /*save=*/true);
    auto [output, h_n, c_n] = outputs(r, data);
    // Saved for torch's version counters: in-place changes of what the core
    // still reads (input, states, weights) are caught at backward. Its saved
    // activations do not share the outputs' memory (test_torch_ops.py checks),
    // so the outputs may be modified in place.
    variable_list saved = {data};
    if (h0.has_value() && h0->defined()) saved.push_back(*h0);
    if (c0.has_value() && c0->defined()) saved.push_back(*c0);
    saved.insert(saved.end(), weights.begin(), weights.end());
    ctx->save_for_backward(saved);
    // Everything else in one entry (one hash-map insert per call). Edge index
    // of each input: undefined optionals have no edge.
    NodeState st{r.saved};
    int64_t edge = 1;
    st.h0_edge = h0.has_value() && h0->defined() ? edge++ : -1;
    st.c0_edge = c0.has_value() && c0->defined() ? edge++ : -1;
    st.w_edge = edge;
    st.lstm = r.c_n.defined();
    stash(ctx, "state", std::move(st));
    if (!r.c_n.defined()) ctx->mark_non_differentiable({c_n});
    ctx->set_materialize_grads(false);  // the core treats missing gradients as zeros
    return {output, h_n, c_n};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    constexpr const char* op = "seqpack::rnn backward";
    TORCH_CHECK(!at::GradMode::is_enabled(), op, ": double backward is not supported");
    ctx->get_saved_variables();  // throws if something was modified in place
    const NodeState& st = unstash<NodeState>(ctx, "state");
    const RNNSaved& saved = *st.core;
    const int64_t h0_edge = st.h0_edge, c0_edge = st.c0_edge, w_edge = st.w_edge;
    const bool state_grad = (h0_edge >= 0 && ctx->needs_input_grad(h0_edge)) ||
                            (c0_edge >= 0 && ctx->needs_input_grad(c0_edge));
    CoreTensor g_out = to_core(grads[0], op, "grad_output");
    CoreTensor g_h = to_core(grads[1], op, "grad_h_n");
    // c_n of a non-LSTM is an empty placeholder: its gradient is not passed on.
    CoreTensor g_c = st.lstm ? to_core(grads[2], op, "grad_c_n") : CoreTensor();
    const bool input_grad = ctx->needs_input_grad(0);
    RNNGradients g = checked(
        op, [&] { return rnn_backward(saved, g_out, g_h, g_c, state_grad, input_grad); });
    // One entry per forward argument: data, h0, c0, each weight, call.
    variable_list result = {input_grad ? from_core(g.input) : Tensor(),
                            h0_edge >= 0 ? from_core(g.h0) : Tensor(),
                            c0_edge >= 0 ? from_core(g.c0) : Tensor()};
    for (size_t i = 0; i < g.weights.size(); ++i)
      result.push_back(ctx->needs_input_grad(w_edge + static_cast<int64_t>(i))
                           ? from_core(g.weights[i])
                           : Tensor());
    result.emplace_back();  // call
    return result;
  }
};

std::tuple<Tensor, Tensor, Tensor> run_rnn(const RNNCall& call, const Tensor& data,
                                           const OptTensor& h0, const OptTensor& c0,
                                           at::TensorList weights) {
  if (needs_graph(data, h0, c0, weights)) {
    variable_list out = RNNFunction::apply(data, h0, c0, weights, call);
    return {out[0], out[1], out[2]};
  }
  return outputs(run_forward(call, data, h0, c0, weights, /*save=*/false), data);
}

// The plan this thread made last, with the values it was made from. A batch
// reaches plan_of more than once (seqpack::rnn, then pad_packed_sequence; a
// stack of layers; an epoch's repeated shapes), and comparing its indices in
// full costs far less than deriving the plan again (O(rows) and several
// allocations), so an exact match reuses the plan.
struct PlanCache {
  std::vector<int64_t> batch_sizes, sorted_indices, unsorted_indices;
  bool indices = false;
  int64_t rows = -1;
  std::shared_ptr<const PackingPlan> plan;
};

bool holds(const CoreTensor& t, const std::vector<int64_t>& values) {
  return t.defined() && t.dtype() == DType::i64 && t.dim() == 1 &&
         t.size(0) == static_cast<int64_t>(values.size()) &&
         std::equal(values.begin(), values.end(), t.data<int64_t>());
}

std::shared_ptr<const PackingPlan> plan_of(const Tensor& data, const Tensor& batch_sizes,
                                           const OptTensor& sorted_indices,
                                           const OptTensor& unsorted_indices, const char* op) {
  PackedSequence p;
  p.batch_sizes = to_core(int64_tensor(batch_sizes, op, "batch_sizes"), op, "batch_sizes");
  p.sorted_indices =
      to_core(int64_tensor(sorted_indices, op, "sorted_indices"), op, "sorted_indices");
  p.unsorted_indices =
      to_core(int64_tensor(unsorted_indices, op, "unsorted_indices"), op, "unsorted_indices");
  thread_local PlanCache cache;
  const bool indices = p.sorted_indices.defined() || p.unsorted_indices.defined();
  if (cache.plan && data.dim() >= 1 && data.size(0) == cache.rows && indices == cache.indices &&
      holds(p.batch_sizes, cache.batch_sizes) &&
      (!indices || (holds(p.sorted_indices, cache.sorted_indices) &&
                    holds(p.unsorted_indices, cache.unsorted_indices)))) {
    return cache.plan;
  }
  // Only data's shape matters to the plan (its memory is never read): a
  // stand-in of that shape on no memory, rather than an allocation per call.
  static char no_memory;
  p.data = CoreTensor::wrap(&no_memory, Shape(data.sizes().begin(), data.sizes().end()),
                            DType::f32, nullptr);
  auto plan = checked(
      op, [&] { return std::make_shared<const PackingPlan>(PackingPlan::from_packed(p)); });
  // Valid from here on (from_packed validated all of it). Built apart and
  // moved in whole, so a throwing copy leaves the old entry intact.
  PlanCache entry;
  entry.batch_sizes = p.batch_sizes.to_vector<int64_t>();
  entry.indices = indices;
  if (indices) {
    entry.sorted_indices = p.sorted_indices.to_vector<int64_t>();
    entry.unsorted_indices = p.unsorted_indices.to_vector<int64_t>();
  }
  entry.rows = data.size(0);
  entry.plan = plan;
  cache = std::move(entry);
  return plan;
}

std::tuple<Tensor, Tensor, Tensor> rnn(const Tensor& data, const Tensor& batch_sizes,
                                       const OptTensor& sorted_indices,
                                       const OptTensor& unsorted_indices, const OptTensor& h0,
                                       const OptTensor& c0, at::TensorList weights,
                                       c10::string_view mode, int64_t hidden_size,
                                       int64_t num_layers, bool bias, bool bidirectional,
                                       int64_t proj_size, double dropout, bool train,
                                       c10::optional<int64_t> seed, c10::string_view precision) {
  constexpr const char* op = "seqpack::rnn";
  TORCH_CHECK_VALUE(data.dim() == 2, op, ": packed data must be 2-D [rows, input_size], got shape ",
                    data.sizes());
  RNNCall call = make_call(op, data, data.size(1), mode, hidden_size, num_layers, bias,
                           bidirectional, proj_size, dropout, train, seed, precision);
  call.plan = plan_of(data, batch_sizes, sorted_indices, unsorted_indices, op);
  return run_rnn(call, data, h0, c0, weights);
}

// ---- packing ---------------------------------------------------------------

struct PackIndices {
  Tensor batch_sizes, sorted_indices, unsorted_indices;
};

class PackFunction : public torch::autograd::Function<PackFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& input,
                               const std::vector<int64_t>& lengths, bool batch_first,
                               bool enforce_sorted, PackIndices* indices) {
    constexpr const char* op = "seqpack::pack_padded_sequence";
    CoreTensor x = to_core(input, op, "input");
    PackedSequence p =
        checked(op, [&] { return pack_padded_sequence(x, lengths, batch_first, enforce_sorted); });
    indices->batch_sizes = from_core(p.batch_sizes);
    indices->sorted_indices = from_core(p.sorted_indices);
    indices->unsorted_indices = from_core(p.unsorted_indices);
    stash(ctx, "plan",
          std::make_shared<const PackingPlan>(PackingPlan::from_lengths(lengths, enforce_sorted)));
    ctx->saved_data["padded_length"] = input.size(batch_first ? 1 : 0);
    ctx->saved_data["batch_first"] = batch_first;
    return {from_core(p.data)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    constexpr const char* op = "seqpack::pack_padded_sequence backward";
    const auto& plan = unstash<std::shared_ptr<const PackingPlan>>(ctx, "plan");
    CoreTensor g = to_core(grads[0], op, "grad_data");
    CoreTensor gi = checked(op, [&] {
      return pack_padded_sequence_backward(g, *plan, ctx->saved_data["padded_length"].toInt(),
                                           ctx->saved_data["batch_first"].toBool());
    });
    return {from_core(gi), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// The index tensors are empty where torch's would be None (enforce_sorted and
// no zero-length sequence): the tracer cannot record optional outputs.
std::tuple<Tensor, Tensor, Tensor, Tensor> pack_padded(const Tensor& input, const Tensor& lengths,
                                                       bool batch_first, bool enforce_sorted) {
  constexpr const char* op = "seqpack::pack_padded_sequence";
  std::vector<int64_t> len = to_vector(int64_tensor(lengths, op, "lengths"), op);
  PackIndices idx;
  Tensor data = PackFunction::apply(input, len, batch_first, enforce_sorted, &idx)[0];
  auto or_empty = [](const Tensor& t) { return t.defined() ? t : at::empty({0}, at::kLong); };
  return {data, idx.batch_sizes, or_empty(idx.sorted_indices), or_empty(idx.unsorted_indices)};
}

class PadFunction : public torch::autograd::Function<PadFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& data,
                               const std::shared_ptr<const PackingPlan>& plan, bool batch_first,
                               double padding_value, int64_t total_length) {
    constexpr const char* op = "seqpack::pad_packed_sequence";
    CoreTensor x = to_core(data, op, "data");
    CoreTensor out = checked(op, [&] {
      CoreTensor tm = plan->unpack(x, total_length, padding_value);
      return batch_first ? transpose01(tm) : tm;
    });
    stash(ctx, "plan", plan);
    ctx->saved_data["batch_first"] = batch_first;
    return {from_core(out)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    constexpr const char* op = "seqpack::pad_packed_sequence backward";
    const auto& plan = unstash<std::shared_ptr<const PackingPlan>>(ctx, "plan");
    CoreTensor g = to_core(grads[0], op, "grad_padded");
    CoreTensor gd = checked(op, [&] {
      return pad_packed_sequence_backward(g, *plan, ctx->saved_data["batch_first"].toBool());
    });
    return {from_core(gd), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

std::tuple<Tensor, Tensor> pad_packed(const Tensor& data, const Tensor& batch_sizes,
                                      const OptTensor& sorted_indices,
                                      const OptTensor& unsorted_indices, bool batch_first,
                                      double padding_value, c10::optional<int64_t> total_length) {
  constexpr const char* op = "seqpack::pad_packed_sequence";
  auto plan = plan_of(data, batch_sizes, sorted_indices, unsorted_indices, op);
  int64_t T = plan->max_len();
  if (total_length.has_value()) {
    TORCH_CHECK_VALUE(*total_length >= T, op, ": total_length = ", *total_length,
                      " is less than the longest sequence's length ", T);
    T = *total_length;
  }
  Tensor padded = PadFunction::apply(data, plan, batch_first, padding_value, T)[0];
  Tensor lengths = at::tensor(plan->lengths(), at::TensorOptions().dtype(at::kLong));
  return {padded, lengths};
}

// ---- padded input ----------------------------------------------------------

std::tuple<Tensor, Tensor, Tensor> rnn_padded(const Tensor& input, const OptTensor& lengths,
                                              const OptTensor& h0, const OptTensor& c0,
                                              at::TensorList weights, c10::string_view mode,
                                              int64_t hidden_size, int64_t num_layers, bool bias,
                                              bool batch_first, bool bidirectional,
                                              int64_t proj_size, double dropout, bool train,
                                              c10::optional<int64_t> seed,
                                              c10::string_view precision) {
  constexpr const char* op = "seqpack::rnn_padded";
  TORCH_CHECK_VALUE(input.dim() == 3, op, ": input must be 3-D [T, B, input_size] (batch_first: ",
                    "[B, T, input_size]), got shape ", input.sizes());
  const int64_t T = input.size(batch_first ? 1 : 0), B = input.size(batch_first ? 0 : 1);
  RNNCall call = make_call(op, input, input.size(2), mode, hidden_size, num_layers, bias,
                           bidirectional, proj_size, dropout, train, seed, precision);
  if (lengths.has_value() && lengths->defined()) {
    // Packed through the plan of the lengths; padding comes back as zeros and
    // h_n is each sequence's state at its own last step.
    auto [data, batch_sizes, sorted, unsorted] =
        pack_padded(input, *lengths, batch_first, /*enforce_sorted=*/false);
    call.plan = plan_of(data, batch_sizes, sorted, unsorted, op);
    auto [out, h_n, c_n] = run_rnn(call, data, h0, c0, weights);
    Tensor padded =
        std::get<0>(pad_packed(out, batch_sizes, sorted, unsorted, batch_first, 0.0, T));
    return {padded, h_n, c_n};
  }
  // Every sequence has length T: the time-major rows are already the packed
  // rows (a view when the input is time-major and contiguous).
  Tensor time_major = batch_first ? input.transpose(0, 1) : input;
  Tensor data = time_major.contiguous().view({T * B, input.size(2)});
  call.plan = std::make_shared<const PackingPlan>(
      PackingPlan::from_lengths(std::vector<int64_t>(B, T), /*enforce_sorted=*/true));
  auto [out, h_n, c_n] = run_rnn(call, data, h0, c0, weights);
  Tensor output = out.view({T, B, out.size(1)});
  return {batch_first ? output.transpose(0, 1) : output, h_n, c_n};
}

}  // namespace
}  // namespace seqpack::torch_ops

TORCH_LIBRARY(seqpack, m) {
  using namespace seqpack::torch_ops;
  m.def(
      "rnn(Tensor data, Tensor batch_sizes, Tensor? sorted_indices, Tensor? unsorted_indices, "
      "Tensor? h0, Tensor? c0, Tensor[] weights, str mode, int hidden_size, int num_layers, "
      "bool bias, bool bidirectional, int proj_size, float dropout, bool train, int? seed=None, "
      "str precision=\"fp32\") -> (Tensor output, Tensor h_n, Tensor c_n)",
      &rnn);
  m.def(
      "rnn_padded(Tensor input, Tensor? lengths, Tensor? h0, Tensor? c0, Tensor[] weights, "
      "str mode, int hidden_size, int num_layers, bool bias, bool batch_first, "
      "bool bidirectional, int proj_size, float dropout, bool train, int? seed=None, "
      "str precision=\"fp32\") -> (Tensor output, Tensor h_n, Tensor c_n)",
      &rnn_padded);
  m.def(
      "pack_padded_sequence(Tensor input, Tensor lengths, bool batch_first=False, "
      "bool enforce_sorted=True) -> (Tensor data, Tensor batch_sizes, Tensor sorted_indices, "
      "Tensor unsorted_indices)",
      &pack_padded);
  m.def(
      "pad_packed_sequence(Tensor data, Tensor batch_sizes, Tensor? sorted_indices, "
      "Tensor? unsorted_indices, bool batch_first=False, float padding_value=0.0, "
      "int? total_length=None) -> (Tensor padded, Tensor lengths)",
      &pad_packed);
}
