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
// holds the seqpack tensor. Autograd is torch::autograd::Function in C++ (the
// operators' Autograd kernels), so a forward and backward never return to
// Python; its forward and backward call operators of their own
// (seqpack::_rnn_train, _rnn_backward, _pack_padded_sequence_backward,
// _pad_packed_sequence_backward), which is what lets torch.compile trace them.
// The two packing backward operators have Autograd kernels too (each the
// other's adjoint), so packing has gradients of any order, and so have the
// recurrent operators: a backward asked for a graph (create_graph) recomputes
// the forward in torch's differentiable recurrent operators and differentiates
// that (graph_backward); the first-order backward is the core's. Zero-length
// sequences and a padded batch of size 0 are accepted everywhere, as in the
// rest of seqpack; h0/c0 and h_n/c_n are in the caller's batch order.
//
// Errors: the core's std::invalid_argument arrives as c10::ValueError (Python
// ValueError), a wrong dtype as c10::TypeError, a wrong device as ValueError,
// each naming the operator (once), the argument and the value. Where torch's
// pack_padded_sequence raises (unsorted lengths with enforce_sorted, a
// negative length, a count that is not the batch size, 2-D lengths, a 1-D
// input), the type is torch's: RuntimeError (IndexError for the input).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>
#include <torch/version.h>

#include <algorithm>
#include <cstring>
#include <list>
#include <mutex>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "seqpack/packed_sequence.h"
#include "seqpack/policy.h"
#include "seqpack/precision.h"
#include "seqpack/rnn.h"
#include "seqpack/tensor.h"
#include "seqpack/varlen.h"

#include "cuda_ops.h"
#include "schemas.h"
#include "torch_rnn.h"

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

// The core's message with the operator's name in front, once: the core's
// packing functions start their messages with their own name
// ("pack_padded_sequence: lengths[1] = ..."), which the operator
// ("seqpack::pack_padded_sequence") already says.
std::string with_op(const char* op, const char* message) {
  std::string bare(op);
  if (bare.rfind("seqpack::", 0) == 0) bare.erase(0, 9);
  std::replace(bare.begin(), bare.end(), ' ', '_');
  bare += ": ";
  std::string m(message);
  if (m.rfind(bare, 0) == 0) m.erase(0, bare.size());
  return c10::str(op, ": ", m);
}

// The core reads no environment: the operators read the SEQPACK_* policy at
// their first call (where a value is bad, every call refuses it by name),
// and make their plans with its config (operator_config).
struct InstalledPolicy {
  std::string error;
  RNNConfig config;
};

const InstalledPolicy& installed_policy() {
  static const InstalledPolicy installed = [] {
    InstalledPolicy i;
    try {
      const seqpack::Policy p = seqpack::policy_from_environment();
      i.config = seqpack::rnn_config(p);
    } catch (const std::invalid_argument& e) {
      i.error = e.what();
    }
    return i;
  }();
  return installed;
}

void install_policy() {
  const std::string& error = installed_policy().error;
  if (!error.empty()) throw std::invalid_argument(error);
}

// How the operators' plans share their steps between threads: the policy's.
const RNNConfig& operator_config() { return installed_policy().config; }

// Runs `f` under the policy, turning the core's std::invalid_argument into a
// ValueError that names the operator.
template <typename F>
auto checked(const char* op, F&& f) -> decltype(f()) {
  try {
    install_policy();
    return f();
  } catch (const std::invalid_argument& e) {
    C10_THROW_ERROR(ValueError, with_op(op, e.what()));
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
    o.precision = precision == "fp32"
                      ? Precision::fp32
                      : resolve_precision(std::string(precision), operator_config().kernels);
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

// ---- the model plan: weights laid out once, compared at every call --------
//
// Every forward (and the backward of one that saves) reads its weights
// through the model's plan (rnn_make_plan: a copy of the weights, quantized
// at int8, W_hh laid out at fp32 and bf16). Plans are kept in a small LRU
// shared by all threads, keyed by the layer's shape options and, per weight,
// its storage (held weakly: an entry never keeps a model's weights alive, and
// a freed storage whose address is reused never matches) and data pointer.
// Neither key nor torch's version counter decides whether a plan is current:
// at every call the weights' bytes are compared with the plan's copy
// (rnn_plan_holds; exact, at memory bandwidth: docs/performance.md), so
// whatever wrote them (an optimiser, a write through `.data` or a NumPy view,
// torch.distributed, another process through shared memory) the call computes
// with the values they hold then; a set that changed gets a new plan, which
// replaces the old one. A training loop lays its weights out once per
// optimiser step, a decoder run one step per call once for all of its steps.
//
// The call computes with the plan's copy, which is also what its backward
// reads (the saved state holds the plan): a parameter whose storage is
// replaced or freed after the forward (`p.data = ...`, share_memory())
// leaves the backward's weights the forward's, as torch's saved tensors do.
//
// Bounded: at most kEntries plans and kBytes of copied weights (the layouts
// made from a copy take at most as much again per thread split); the least
// recently used goes first, entries of freed weights at the next call. A
// weight set larger than kBytes, or with a non-contiguous weight, is not
// kept: its call copies the weights when it saves for a backward, and reads
// them in place when it does not.

struct PlanKey {
  RNNOptions options;
  struct Weight {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    const void* data;
  };
  std::vector<Weight> weights;
  std::size_t bytes = 0;  // of the plan's copy
};

bool same_tensors(const PlanKey& key, const RNNOptions& o, at::TensorList weights) {
  if (key.weights.size() != weights.size() || key.options != o) return false;
  for (size_t i = 0; i < weights.size(); ++i) {
    const PlanKey::Weight& k = key.weights[i];
    const Tensor& w = weights[i];
    if (k.data != w.data_ptr() || !w.has_storage() || k.storage.expired() ||
        k.storage.lock().get() != w.storage().unsafeGetStorageImpl()) {
      return false;
    }
  }
  return true;
}

bool freed(const PlanKey& key) {
  for (const auto& w : key.weights)
    if (w.storage.expired()) return true;
  return false;
}

class ModelPlanCache {
 public:
  // Up to this many weight sets (layers) keep their plans, holding copies of
  // at most kBytes of weights in all.
  static constexpr size_t kEntries = 16;
  static constexpr size_t kBytes = size_t{256} << 20;

  static size_t bytes_of(at::TensorList weights) {
    size_t n = 0;
    for (const Tensor& w : weights) n += w.nbytes();
    return n;
  }

  // The plan of these weights holding their present values: the kept one
  // where it still holds them (compared outside the lock), else a new one.
  std::shared_ptr<const RNNModelPlan> get(const RNNOptions& o, at::TensorList weights,
                                          const std::vector<CoreTensor>& core) {
    std::shared_ptr<const RNNModelPlan> kept;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (same_tensors(it->first, o, weights)) {
          entries_.splice(entries_.begin(), entries_, it);  // most recent first
          kept = entries_.front().second;
          break;
        }
      }
    }
    if (kept && rnn_plan_holds(*kept, core)) return kept;
    // Made outside the lock (int8 quantizes: a few ms for a large model): two
    // threads meeting a new weight set may both make one; they are the same.
    PlanKey key{o, {}, bytes_of(weights)};
    key.weights.reserve(weights.size());
    for (const Tensor& w : weights) key.weights.push_back({w.storage().getWeakStorageImpl(), w.data_ptr()});
    auto made = rnn_make_plan(o, core, /*in_place=*/false, operator_config());
    std::lock_guard<std::mutex> lock(mutex_);
    // The plan of the same tensors at other values (and entries of freed
    // weights) go: none can serve again.
    entries_.remove_if([&](const auto& e) {
      return freed(e.first) || same_tensors(e.first, o, weights);
    });
    entries_.emplace_front(std::move(key), made);
    size_t total = 0;
    for (const auto& e : entries_) total += e.first.bytes;
    while (entries_.size() > kEntries || total > kBytes) {
      total -= entries_.back().first.bytes;
      entries_.pop_back();
    }
    return made;
  }

  // What is kept (the tests' window on the bound).
  std::pair<size_t, size_t> size() {
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.remove_if([](const auto& e) { return freed(e.first); });
    size_t total = 0;
    for (const auto& e : entries_) total += e.first.bytes;
    return {entries_.size(), total};
  }

 private:
  std::mutex mutex_;
  std::list<std::pair<PlanKey, std::shared_ptr<const RNNModelPlan>>> entries_;
};

ModelPlanCache& model_plan_cache() {
  static ModelPlanCache cache;
  return cache;
}

// (entries, bytes of copied weights) the cache holds now, those of freed
// weights dropped first: seqpack::_plan_cache_size, for tests of its bound.
std::tuple<int64_t, int64_t> plan_cache_size() {
  const auto [entries, bytes] = model_plan_cache().size();
  return {static_cast<int64_t>(entries), static_cast<int64_t>(bytes)};
}

RNNForwardResult run_forward(const RNNCall& call, const Tensor& data, const OptTensor& h0,
                             const OptTensor& c0, at::TensorList weights, bool save) {
  constexpr const char* op = "seqpack::rnn";
  std::vector<CoreTensor> w = core_weights(weights, op);
  CoreTensor x = to_core(data, op, "input"), h = to_core(h0, op, "h0"), c = to_core(c0, op, "c0");
  return checked(op, [&] {
    // core_weights copied any non-contiguous weight: those have no stable
    // source to key on (and their copies are this call's own).
    bool contiguous = true;
    for (const Tensor& t : weights) contiguous = contiguous && t.is_contiguous() && t.has_storage();
    // A call of one step (a decoder's, a cell's) at fp32 or bf16 reads its
    // weights in place: comparing them with a plan's copy reads them twice,
    // more than its one product reads (fp32 one-step, LSTM(128, 256) at batch
    // 1: 0.06 ms a call against 0.14; bf16, LSTM(512, 512) at batch 1 to 64:
    // in place 1.1-1.4x faster than a kept bf16 layout compared each call,
    // Zen 5, docs/performance.md). Its backward reads the same tensors, held
    // by the saved state (w holds each), as torch's saved tensors are: a
    // parameter whose storage is replaced or freed leaves them the forward's.
    // int8's weights are quantized by its plan, which pays over many calls.
    const bool one_step = call.plan->batch_sizes().size() <= 1;
    if (one_step && call.options.precision != Precision::int8)
      return rnn_forward(*rnn_make_plan(call.options, w, /*in_place=*/true, operator_config()), x,
                         *call.plan, h, c, call.train, save, call.seed);
    if (contiguous && ModelPlanCache::bytes_of(weights) <= ModelPlanCache::kBytes) {
      const std::shared_ptr<const RNNModelPlan> model =
          model_plan_cache().get(call.options, weights, w);
      // The plan's copy: what it was made from, and what a backward reads.
      return rnn_forward(*model, x, *call.plan, h, c, call.train, save, call.seed);
    }
    // Not kept: a backward reads a copy of the forward's weights (the
    // parameters' storage may be replaced or freed before it runs), held by
    // the in-place plan.
    if (save && contiguous)
      for (CoreTensor& t : w) t = t.clone();
    return rnn_forward(*rnn_make_plan(call.options, w, /*in_place=*/true, operator_config()), x,
                       *call.plan, h, c, call.train, save, call.seed);
  });
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
  // An empty index tensor stands for none: pack_padded_sequence's are empty
  // where torch's would be None (enforce_sorted, no zero-length sequence).
  auto index = [&](const OptTensor& t, const char* what) {
    Tensor i = int64_tensor(t, op, what);
    return to_core(i.defined() && i.numel() == 0 ? Tensor() : i, op, what);
  };
  p.sorted_indices = index(sorted_indices, "sorted_indices");
  p.unsorted_indices = index(unsorted_indices, "unsorted_indices");
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


// ---- nested (jagged) input: the values read and written in place ----------
//
// A jagged nested tensor keeps sequence b's rows at values rows
// [offsets[b], offsets[b + 1]). Its plan is the packing plan of those lengths
// (stably sorted by decreasing length, as pack_sequence(enforce_sorted=False)
// sorts) and `ids`, the values row of each packed row. The operator takes the
// values and offsets as they are and moves rows between the two orders in
// C++ (one row copy each way, no torch operation, no plan in Python): the
// input into the packed order, the output back into the values' order; the
// backward the output gradient in, the input gradient out. (Reading the
// values in place through rnn_forward_lookup, the values as its table, was
// measured slower: its per-row projection pointers and its backward's table
// gradient cost more than the copies, up to 1.5x on a training step.)
struct NestedPlan {
  std::shared_ptr<const PackingPlan> plan;
  std::vector<int64_t> ids;  // packed row r is values row ids[r]
};

// The plan this thread made last, kept with the offsets it was made from (a
// batch's forward and backward, a stack of layers, an epoch's batches of one
// shape meet it again): an exact match of the offsets reuses it.
std::shared_ptr<const NestedPlan> nested_plan_of(const Tensor& values, const Tensor& offsets,
                                                 const char* op) {
  const Tensor off = int64_tensor(offsets, op, "offsets");
  TORCH_CHECK_VALUE(off.defined() && off.dim() == 1 && off.numel() >= 1, op,
                    ": offsets must be 1-D with one entry per sequence and one more, got shape ",
                    offsets.sizes());
  TORCH_CHECK_VALUE(values.dim() == 2, op,
                    ": values must be 2-D [rows, input_size], got shape ", values.sizes());
  const Tensor c = off.contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  const auto n = static_cast<std::size_t>(c.numel());
  thread_local std::vector<int64_t> kept_offsets;
  thread_local std::shared_ptr<const NestedPlan> kept;
  if (kept && kept_offsets.size() == n && std::equal(p, p + n, kept_offsets.begin())) {
    TORCH_CHECK_VALUE(p[n - 1] == values.size(0), op, ": offsets[", n - 1, "] = ", p[n - 1],
                      " does not match the ", values.size(0), " rows of the values");
    return kept;
  }
  std::vector<int64_t> cu(p, p + n);
  auto made = std::make_shared<NestedPlan>();
  checked(op, [&] {
    std::vector<int64_t> lengths;
    try {
      lengths = lengths_from_cu_seqlens(cu, values.size(0));
    } catch (const std::invalid_argument& e) {
      // The core's messages name its argument cu_seqlens: here they are the offsets.
      std::string m = e.what();
      for (std::size_t at; (at = m.find("cu_seqlens")) != std::string::npos;) m.replace(at, 10, "offsets");
      throw std::invalid_argument(m);
    }
    made->plan = std::make_shared<const PackingPlan>(
        PackingPlan::from_lengths(lengths, /*enforce_sorted=*/false));
    made->ids = packed_gather_from_varlen(*made->plan);
  });
  kept = made;
  kept_offsets = std::move(cu);
  return made;
}

// rows[ids[r]] = packed[r] (to_values) or packed[r] = rows[ids[r]]: one row
// copy each, on contiguous [rows, width] tensors, split over torch's threads.
Tensor reorder_rows(const Tensor& from, const std::vector<int64_t>& ids, bool to_values) {
  const Tensor src = from.contiguous();
  Tensor dst = at::empty_like(src);
  const int64_t bytes = src.dim() == 2 ? src.size(1) * static_cast<int64_t>(src.element_size()) : 0;
  const auto* s = static_cast<const char*>(src.data_ptr());
  auto* d = static_cast<char*>(dst.data_ptr());
  // A grain of 256 KiB: below it a thread's start costs more than its share.
  const int64_t grain = std::max<int64_t>(1, (int64_t{256} << 10) / std::max<int64_t>(bytes, 1));
  at::parallel_for(0, static_cast<int64_t>(ids.size()), grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t packed = r * bytes, values = ids[static_cast<std::size_t>(r)] * bytes;
      std::memcpy(d + (to_values ? values : packed), s + (to_values ? packed : values),
                  static_cast<std::size_t>(bytes));
    }
  });
  return dst;
}

// ---- kernels ---------------------------------------------------------------
//
// Each public operator has a CPU kernel (the computation, no autograd) and an
// Autograd kernel. The Autograd kernel calls the operator below autograd when
// nothing needs a gradient, and otherwise a torch::autograd::Function whose
// forward and backward call operators through the dispatcher (seqpack::_rnn_train
// and the *_backward operators): every computation is an operator call, so
// torch.compile and torch.export (PyTorch 2.4+) trace forward and backward with
// the fake implementations of python/seqpack/torch.py.

// The opaque state the core saves for a backward (activations, plan) travels
// between seqpack::_rnn_train and seqpack::_rnn_backward as a one-byte uint8
// tensor whose storage holds it: it lives as long as that tensor, which autograd
// (or a compiled graph) keeps for the backward.
struct SavedHandle {
  std::shared_ptr<const RNNSaved> saved;
  uint8_t byte = 0;
};

void delete_handle(void* p) { delete static_cast<SavedHandle*>(p); }

Tensor make_handle(std::shared_ptr<const RNNSaved> saved) {
  auto* h = new SavedHandle{std::move(saved)};
  return at::for_blob(&h->byte, {1})
      .context(h, &delete_handle)
      .options(at::TensorOptions().dtype(at::kByte))
      .make_tensor();
}

const RNNSaved& from_handle(const Tensor& t, const char* op) {
  TORCH_CHECK_VALUE(t.defined() && t.has_storage() &&
                        t.storage().data_ptr().get_deleter() == &delete_handle,
                    op, ": saved is not the saved state of a seqpack::_rnn_train call");
  return *static_cast<SavedHandle*>(t.storage().data_ptr().get_context())->saved;
}

Tensor or_empty(const Tensor& t, const at::TensorOptions& options) {
  return t.defined() ? t : at::empty({0}, options);
}

RNNCall rnn_call(const Tensor& data, const Tensor& batch_sizes, const OptTensor& sorted_indices,
                 const OptTensor& unsorted_indices, c10::string_view mode, int64_t hidden_size,
                 int64_t num_layers, bool bias, bool bidirectional, int64_t proj_size,
                 double dropout, bool train, c10::optional<int64_t> seed,
                 c10::string_view precision) {
  constexpr const char* op = "seqpack::rnn";
  TORCH_CHECK_VALUE(data.dim() == 2, op, ": packed data must be 2-D [rows, input_size], got shape ",
                    data.sizes());
  RNNCall call = make_call(op, data, data.size(1), mode, hidden_size, num_layers, bias,
                           bidirectional, proj_size, dropout, train, seed, precision);
  call.plan = plan_of(data, batch_sizes, sorted_indices, unsorted_indices, op);
  return call;
}

std::tuple<Tensor, Tensor, Tensor> rnn_cpu(const Tensor& data, const Tensor& batch_sizes,
                                           const OptTensor& sorted_indices,
                                           const OptTensor& unsorted_indices, const OptTensor& h0,
                                           const OptTensor& c0, at::TensorList weights,
                                           c10::string_view mode, int64_t hidden_size,
                                           int64_t num_layers, bool bias, bool bidirectional,
                                           int64_t proj_size, double dropout, bool train,
                                           c10::optional<int64_t> seed,
                                           c10::string_view precision) {
  RNNCall call = rnn_call(data, batch_sizes, sorted_indices, unsorted_indices, mode, hidden_size,
                          num_layers, bias, bidirectional, proj_size, dropout, train, seed,
                          precision);
  return outputs(run_forward(call, data, h0, c0, weights, /*save=*/false), data);
}

// rnn, plus the state its backward needs (a handle, see SavedHandle).
std::tuple<Tensor, Tensor, Tensor, Tensor> rnn_train_cpu(
    const Tensor& data, const Tensor& batch_sizes, const OptTensor& sorted_indices,
    const OptTensor& unsorted_indices, const OptTensor& h0, const OptTensor& c0,
    at::TensorList weights, c10::string_view mode, int64_t hidden_size, int64_t num_layers,
    bool bias, bool bidirectional, int64_t proj_size, double dropout, bool train,
    c10::optional<int64_t> seed, c10::string_view precision) {
  RNNCall call = rnn_call(data, batch_sizes, sorted_indices, unsorted_indices, mode, hidden_size,
                          num_layers, bias, bidirectional, proj_size, dropout, train, seed,
                          precision);
  RNNForwardResult r = run_forward(call, data, h0, c0, weights, /*save=*/true);
  auto [output, h_n, c_n] = outputs(r, data);
  return {output, h_n, c_n, make_handle(r.saved)};
}

// Gradients of one rnn call. data, h0, c0 and weights give the shapes (and
// are what autograd saved, so in-place changes were caught); a gradient not
// asked for is an empty tensor.
std::tuple<Tensor, Tensor, Tensor, std::vector<Tensor>> rnn_backward_cpu(
    const Tensor& saved, const OptTensor& grad_output, const OptTensor& grad_h_n,
    const OptTensor& grad_c_n, const Tensor& data, const OptTensor& h0, const OptTensor& c0,
    at::TensorList weights, bool input_grad, bool state_grad) {
  constexpr const char* op = "seqpack::rnn backward";
  const RNNSaved& core = from_handle(saved, op);
  CoreTensor g_out = to_core(grad_output, op, "grad_output");
  CoreTensor g_h = to_core(grad_h_n, op, "grad_h_n");
  CoreTensor g_c = to_core(grad_c_n, op, "grad_c_n");
  RNNGradients g =
      checked(op, [&] { return rnn_backward(core, g_out, g_h, g_c, state_grad, input_grad); });
  const auto options = data.options();
  const bool has_h0 = h0.has_value() && h0->defined(), has_c0 = c0.has_value() && c0->defined();
  std::vector<Tensor> gw;
  gw.reserve(g.weights.size());
  for (const CoreTensor& w : g.weights) gw.push_back(from_core(w));
  return {input_grad ? or_empty(from_core(g.input), options) : at::empty({0}, options),
          state_grad && has_h0 ? or_empty(from_core(g.h0), options) : at::empty({0}, options),
          state_grad && has_c0 ? or_empty(from_core(g.c0), options) : at::empty({0}, options),
          std::move(gw)};
}

// rnn on a jagged nested tensor's values and offsets (nested_plan_of): the
// output's rows in the values' order.
std::tuple<Tensor, Tensor, Tensor, Tensor> nested_forward(
    const Tensor& values, const Tensor& offsets, const OptTensor& h0, const OptTensor& c0,
    at::TensorList weights, c10::string_view mode, int64_t hidden_size, int64_t num_layers,
    bool bias, bool bidirectional, int64_t proj_size, double dropout, bool train,
    c10::optional<int64_t> seed, c10::string_view precision, bool save) {
  constexpr const char* op = "seqpack::rnn_nested";
  const std::shared_ptr<const NestedPlan> np = nested_plan_of(values, offsets, op);
  RNNCall call = make_call(op, values, values.size(1), mode, hidden_size, num_layers, bias,
                           bidirectional, proj_size, dropout, train, seed, precision);
  call.plan = np->plan;
  const Tensor data = reorder_rows(values, np->ids, /*to_values=*/false);
  RNNForwardResult r = run_forward(call, data, h0, c0, weights, save);
  auto [output, h_n, c_n] = outputs(r, data);
  return {reorder_rows(output, np->ids, /*to_values=*/true), h_n, c_n,
          save ? make_handle(r.saved) : Tensor()};
}

std::tuple<Tensor, Tensor, Tensor> rnn_nested_cpu(
    const Tensor& values, const Tensor& offsets, const OptTensor& h0, const OptTensor& c0,
    at::TensorList weights, c10::string_view mode, int64_t hidden_size, int64_t num_layers,
    bool bias, bool bidirectional, int64_t proj_size, double dropout, bool train,
    c10::optional<int64_t> seed, c10::string_view precision) {
  auto [output, h_n, c_n, saved] =
      nested_forward(values, offsets, h0, c0, weights, mode, hidden_size, num_layers, bias,
                     bidirectional, proj_size, dropout, train, seed, precision, /*save=*/false);
  return {output, h_n, c_n};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> rnn_nested_train_cpu(
    const Tensor& values, const Tensor& offsets, const OptTensor& h0, const OptTensor& c0,
    at::TensorList weights, c10::string_view mode, int64_t hidden_size, int64_t num_layers,
    bool bias, bool bidirectional, int64_t proj_size, double dropout, bool train,
    c10::optional<int64_t> seed, c10::string_view precision) {
  return nested_forward(values, offsets, h0, c0, weights, mode, hidden_size, num_layers, bias,
                        bidirectional, proj_size, dropout, train, seed, precision, /*save=*/true);
}

// Gradients of one rnn_nested call: the output gradient's rows taken into the
// packed order, rnn_backward_cpu, the input gradient's rows put back into the
// values' order.
std::tuple<Tensor, Tensor, Tensor, std::vector<Tensor>> rnn_nested_backward_cpu(
    const Tensor& saved, const Tensor& offsets, const OptTensor& grad_output,
    const OptTensor& grad_h_n, const OptTensor& grad_c_n, const Tensor& values,
    const OptTensor& h0, const OptTensor& c0, at::TensorList weights, bool input_grad,
    bool state_grad) {
  constexpr const char* op = "seqpack::rnn_nested backward";
  const std::vector<int64_t>& ids = nested_plan_of(values, offsets, op)->ids;
  OptTensor g_out;
  if (grad_output.has_value() && grad_output->defined()) {
    check_cpu(*grad_output, op, "grad_output");
    g_out = reorder_rows(*grad_output, ids, /*to_values=*/false);
  }
  auto grads = rnn_backward_cpu(saved, g_out, grad_h_n, grad_c_n, values, h0, c0, weights,
                                input_grad, state_grad);
  if (input_grad) std::get<0>(grads) = reorder_rows(std::get<0>(grads), ids, /*to_values=*/true);
  return grads;
}

// The operators as the autograd kernels call them (through the dispatcher).
#define SEQPACK_OP(name, overload, ...)                                            \
  static const auto handle = c10::Dispatcher::singleton()                          \
                                 .findSchemaOrThrow("seqpack::" name, overload)    \
                                 .typed<__VA_ARGS__>();                            \
  return handle

const auto& rnn_op() { SEQPACK_OP("rnn", "", decltype(rnn_cpu)); }
const auto& rnn_train_op() { SEQPACK_OP("_rnn_train", "", decltype(rnn_train_cpu)); }
const auto& rnn_backward_op() { SEQPACK_OP("_rnn_backward", "", decltype(rnn_backward_cpu)); }
const auto& rnn_nested_op() { SEQPACK_OP("rnn_nested", "", decltype(rnn_nested_cpu)); }
const auto& rnn_nested_train_op() {
  SEQPACK_OP("_rnn_nested_train", "", decltype(rnn_nested_train_cpu));
}
const auto& rnn_nested_backward_op() {
  SEQPACK_OP("_rnn_nested_backward", "", decltype(rnn_nested_backward_cpu));
}

// What the backward needs besides the saved tensors.
struct NodeState {
  int64_t h0_edge = -1, c0_edge = -1, w_edge = 1;
  size_t weights = 0;
  bool lstm = false;  // c_n is a real output (else an empty placeholder)
  // The call's batch sizes and indices: only a backward that records a graph
  // reads them (graph_backward; the options are the core's saved ones).
  Tensor batch_sizes;
  OptTensor sorted_indices, unsorted_indices;
  Tensor offsets;  // a nested call's (its batch sizes and indices are its plan's)
};

// ---- double backward: the forward again, in torch's differentiable operators
//
// A backward asked to record a graph (create_graph=True, gradgradcheck, a
// gradient penalty) does not run the core's backward, whose products autograd
// cannot see: it runs the forward again from the saved inputs in torch's own
// recurrent operators on packed rows (at::lstm, at::gru, at::rnn_tanh,
// at::rnn_relu with batch_sizes: on the CPU they are made of differentiable
// operators, so torch has gradients of any order through them) and takes the
// gradients of that graph with create_graph. The values are torch's, so they
// equal the core's backward within the rounding of two summation orders
// (docs/testing.md); their graph is torch's. The first-order backward (no
// graph asked for) is the core's, untouched.
//
// What the core does that torch's packed kernels do not is done around them:
// states in the caller's order (h0/c0 permuted into the sorted order, h_n/c_n
// back, as torch.nn.LSTM does), zero-length sequences (the last of the sorted
// order: torch's kernels run on the first batch_sizes[0] rows of the states,
// and the others keep h0/c0 as h_n/c_n), and dropout between layers: the layers
// run one at a time and each layer's input is multiplied by the very mask the
// forward applied (kept in the core's saved state). A bf16 forward
// (precision "bf16", or "auto" under autocast) is recomputed in fp32: its
// double backward is fp32's, within bf16's error bound of the bf16 forward's
// first-order gradients (docs/python.md).

// h0 or c0 as the recomputation starts from: zeros where none was given,
// [layers * dirs, batch, size].
Tensor initial_state(const OptTensor& t, int64_t layers, int64_t batch, int64_t size,
                     const Tensor& like) {
  if (t.has_value() && t->defined()) return *t;
  return at::zeros({layers, batch, size}, like.options());
}

// A tensor standing for `t` in the recomputed graph: a view, so the gradient
// taken with respect to it is what flows through this argument alone (an
// argument passed twice, h0 as c0 or a tied weight, gets each share once).
Tensor stand_in(const Tensor& t) { return t.view_as(t); }

// The forward of one rnn call in torch's operators (torch_rnn.h), with the
// masks the core's forward applied: (output, h_n, c_n), c_n undefined but for LSTM.
std::tuple<Tensor, Tensor, Tensor> torch_forward(const NodeState& st, const RNNSaved& core,
                                                 const Tensor& data, const Tensor& h0,
                                                 const Tensor& c0,
                                                 const std::vector<Tensor>& weights) {
  const RNNOptions& o = rnn_saved_options(core);
  auto index = [](const OptTensor& t) {
    return t.has_value() && t->defined() && t->numel() > 0 ? *t : Tensor();
  };
  TorchRnn r;
  r.mode = o.mode == RNNMode::lstm ? "LSTM" : o.mode == RNNMode::gru ? "GRU"
           : o.mode == RNNMode::rnn_tanh ? "RNN_TANH" : "RNN_RELU";
  r.bias = o.bias;
  r.num_layers = o.num_layers;
  r.bidirectional = o.bidirectional;
  r.batch_sizes = st.batch_sizes;
  r.sorted_indices = index(st.sorted_indices);
  r.unsorted_indices = index(st.unsorted_indices);
  for (const CoreTensor& m : rnn_saved_dropout_masks(core))
    r.masks.push_back(m.defined() ? from_core(m) : Tensor());
  return torch_packed_rnn(r, data, h0, c0, weights);
}

// The gradients of one rnn call as a graph (see above): one entry per forward
// argument, as RNNFunction::backward returns them.
variable_list graph_backward(AutogradContext* ctx, const NodeState& st, const RNNSaved& core,
                             const variable_list& grads, const Tensor& data, const OptTensor& h0,
                             const OptTensor& c0, const std::vector<Tensor>& weights) {
  const RNNOptions& o = rnn_saved_options(core);
  const int64_t LD = o.num_layers * o.num_directions();
  // A nested call is recomputed on its packed rows (a differentiable gather
  // of the values by its plan's ids), its output put back in the values' order.
  NodeState packed = st;
  Tensor to_packed, to_values;
  if (st.offsets.defined()) {
    const auto np = nested_plan_of(data, st.offsets, "seqpack::rnn_nested backward");
    auto index = [](const std::vector<int64_t>& v) {
      return at::tensor(c10::ArrayRef<int64_t>(v), at::TensorOptions().dtype(at::kLong));
    };
    packed.batch_sizes = index(np->plan->batch_sizes());
    packed.sorted_indices = index(np->plan->sorted_indices());
    packed.unsorted_indices = index(np->plan->unsorted_indices());
    to_packed = index(np->ids);
    to_values = index(varlen_gather_from_packed(*np->plan));
  }
  // The forward's batch: h0's where given, else the indices', else the packed
  // batch's first size (as the core's plan counts it).
  int64_t batch = 0;
  if (h0.has_value() && h0->defined()) {
    batch = h0->size(1);
  } else if (c0.has_value() && c0->defined()) {
    batch = c0->size(1);
  } else if (packed.sorted_indices.has_value() && packed.sorted_indices->defined() &&
             packed.sorted_indices->numel() > 0) {
    batch = packed.sorted_indices->numel();
  } else if (packed.batch_sizes.numel() > 0) {
    batch = packed.batch_sizes[0].item<int64_t>();
  }
  // Each argument autograd wants a gradient for gets a stand-in to take it
  // with respect to; the others enter as they are.
  variable_list inputs;
  std::vector<int64_t> slots;  // the result entry of each of inputs
  auto arg = [&](const Tensor& t, bool wanted, int64_t slot) {
    if (!wanted) return t;
    Tensor s = stand_in(t);
    inputs.push_back(s);
    slots.push_back(slot);
    return s;
  };
  const bool has_h0 = h0.has_value() && h0->defined(), has_c0 = c0.has_value() && c0->defined();
  Tensor x = arg(data, ctx->needs_input_grad(0), 0);
  Tensor h = initial_state(
      has_h0 ? OptTensor(arg(*h0, st.h0_edge >= 0 && ctx->needs_input_grad(st.h0_edge), 1))
             : OptTensor(),
      LD, batch, o.real_hidden_size(), data);
  Tensor c;
  if (st.lstm) {
    c = initial_state(
        has_c0 ? OptTensor(arg(*c0, st.c0_edge >= 0 && ctx->needs_input_grad(st.c0_edge), 2))
               : OptTensor(),
        LD, batch, o.hidden_size, data);
  }
  std::vector<Tensor> w;
  w.reserve(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    const int64_t e = st.w_edge + static_cast<int64_t>(i);
    w.push_back(arg(weights[i], ctx->needs_input_grad(e), 3 + static_cast<int64_t>(i)));
  }
  variable_list result(3 + weights.size() + 1);  // data, h0, c0, weights, args
  if (inputs.empty()) return result;

  // torch's operators and their backward in the input's dtype, whatever
  // autocast the caller is in.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
  auto [output, h_n, c_n] =
      torch_forward(packed, core, to_packed.defined() ? x.index_select(0, to_packed) : x, h, c, w);
  if (to_values.defined()) output = output.index_select(0, to_values);
  // Outputs with a gradient that depend on something (a missing gradient is zero).
  variable_list outs, gouts;
  auto take = [&](const Tensor& out, const Tensor& g) {
    if (g.defined() && out.defined() && out.requires_grad()) {
      outs.push_back(out);
      gouts.push_back(g);
    }
  };
  take(output, grads[0]);
  take(h_n, grads[1]);
  if (st.lstm) take(c_n, grads[2]);
  if (outs.empty()) return result;
  variable_list g = torch::autograd::grad(outs, inputs, gouts, /*retain_graph=*/true,
                                          /*create_graph=*/true, /*allow_unused=*/true);
  for (size_t i = 0; i < g.size(); ++i) result[static_cast<size_t>(slots[i])] = g[i];
  return result;
}

// Autograd node of one multi-layer recurrent forward on packed rows.
class RNNFunction : public torch::autograd::Function<RNNFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& data, const OptTensor& h0,
                               const OptTensor& c0, at::TensorList weights, const RNNArgs& a) {
    Tensor output, h_n, c_n, saved;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      if (a.offsets.defined()) {
        std::tie(output, h_n, c_n, saved) = rnn_nested_train_op().call(
            data, a.offsets, h0, c0, weights, a.mode, a.hidden_size, a.num_layers, a.bias,
            a.bidirectional, a.proj_size, a.dropout, a.train, a.seed, a.precision);
      } else {
        std::tie(output, h_n, c_n, saved) = rnn_train_op().call(
            data, a.batch_sizes, a.sorted_indices, a.unsorted_indices, h0, c0, weights, a.mode,
            a.hidden_size, a.num_layers, a.bias, a.bidirectional, a.proj_size, a.dropout,
            a.train, a.seed, a.precision);
      }
    }
    // Saved for torch's version counters: in-place changes of what the core
    // still reads (input, states, weights) are caught at backward. Its saved
    // activations do not share the outputs' memory (test_torch_ops.py checks),
    // so the outputs may be modified in place.
    const bool has_h0 = h0.has_value() && h0->defined(), has_c0 = c0.has_value() && c0->defined();
    variable_list to_save = {saved, data};
    if (has_h0) to_save.push_back(*h0);
    if (has_c0) to_save.push_back(*c0);
    to_save.insert(to_save.end(), weights.begin(), weights.end());
    ctx->save_for_backward(to_save);
    // Edge index of each input: undefined optionals have no edge.
    NodeState st;
    int64_t edge = 1;
    st.h0_edge = has_h0 ? edge++ : -1;
    st.c0_edge = has_c0 ? edge++ : -1;
    st.w_edge = edge;
    st.weights = weights.size();
    st.lstm = a.mode == "LSTM";
    st.batch_sizes = a.batch_sizes;
    st.sorted_indices = a.sorted_indices;
    st.unsorted_indices = a.unsorted_indices;
    st.offsets = a.offsets;
    stash(ctx, "state", st);
    if (!st.lstm) ctx->mark_non_differentiable({c_n});
    ctx->set_materialize_grads(false);  // the core treats missing gradients as zeros
    return {output, h_n, c_n};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const NodeState& st = unstash<NodeState>(ctx, "state");
    variable_list saved = ctx->get_saved_variables();  // throws if modified in place
    size_t i = 2;
    OptTensor h0, c0;
    if (st.h0_edge >= 0) h0 = saved[i++];
    if (st.c0_edge >= 0) c0 = saved[i++];
    std::vector<Tensor> weights(saved.begin() + static_cast<std::ptrdiff_t>(i), saved.end());
    // Grad mode is on in a backward only when a graph of it is asked for
    // (create_graph): the gradients through torch's differentiable operators.
    if (at::GradMode::is_enabled()) {
      return graph_backward(ctx, st, from_handle(saved[0], "seqpack::rnn backward"), grads,
                            saved[1], h0, c0, weights);
    }
    const bool state_grad = (st.h0_edge >= 0 && ctx->needs_input_grad(st.h0_edge)) ||
                            (st.c0_edge >= 0 && ctx->needs_input_grad(st.c0_edge));
    const bool input_grad = ctx->needs_input_grad(0);
    auto opt = [](const Tensor& t) { return t.defined() ? OptTensor(t) : OptTensor(); };
    // c_n of a non-LSTM is an empty placeholder: its gradient is not passed on.
    const OptTensor g_c_n = st.lstm ? opt(grads[2]) : OptTensor();
    auto [g_input, g_h0, g_c0, g_weights] =
        st.offsets.defined()
            ? rnn_nested_backward_op().call(saved[0], st.offsets, opt(grads[0]), opt(grads[1]),
                                            g_c_n, saved[1], h0, c0, weights, input_grad,
                                            state_grad)
            : rnn_backward_op().call(saved[0], opt(grads[0]), opt(grads[1]), g_c_n, saved[1], h0,
                                     c0, weights, input_grad, state_grad);
    // One entry per forward argument: data, h0, c0, each weight, args.
    variable_list result = {input_grad ? g_input : Tensor(),
                            st.h0_edge >= 0 && ctx->needs_input_grad(st.h0_edge) ? g_h0 : Tensor(),
                            st.c0_edge >= 0 && ctx->needs_input_grad(st.c0_edge) ? g_c0 : Tensor()};
    for (size_t w = 0; w < g_weights.size(); ++w)
      result.push_back(ctx->needs_input_grad(st.w_edge + static_cast<int64_t>(w)) ? g_weights[w]
                                                                                  : Tensor());
    result.emplace_back();  // args
    return result;
  }
};

std::tuple<Tensor, Tensor, Tensor> rnn_autograd(
    const Tensor& data, const Tensor& batch_sizes, const OptTensor& sorted_indices,
    const OptTensor& unsorted_indices, const OptTensor& h0, const OptTensor& c0,
    at::TensorList weights, c10::string_view mode, int64_t hidden_size, int64_t num_layers,
    bool bias, bool bidirectional, int64_t proj_size, double dropout, bool train,
    c10::optional<int64_t> seed, c10::string_view precision) {
  if (!needs_graph(data, h0, c0, weights)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return rnn_op().call(data, batch_sizes, sorted_indices, unsorted_indices, h0, c0, weights,
                         mode, hidden_size, num_layers, bias, bidirectional, proj_size, dropout,
                         train, seed, precision);
  }
  RNNArgs a{batch_sizes, sorted_indices, unsorted_indices, std::string(mode),
            hidden_size, num_layers, bias, bidirectional, proj_size, dropout, train, seed,
            std::string(precision), Tensor()};
  variable_list out = RNNFunction::apply(data, h0, c0, weights, a);
  return {out[0], out[1], out[2]};
}

std::tuple<Tensor, Tensor, Tensor> rnn_nested_autograd(
    const Tensor& values, const Tensor& offsets, const OptTensor& h0, const OptTensor& c0,
    at::TensorList weights, c10::string_view mode, int64_t hidden_size, int64_t num_layers,
    bool bias, bool bidirectional, int64_t proj_size, double dropout, bool train,
    c10::optional<int64_t> seed, c10::string_view precision) {
  if (!needs_graph(values, h0, c0, weights)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return rnn_nested_op().call(values, offsets, h0, c0, weights, mode, hidden_size, num_layers,
                                bias, bidirectional, proj_size, dropout, train, seed, precision);
  }
  RNNArgs a{Tensor(), c10::nullopt, c10::nullopt, std::string(mode), hidden_size,
            num_layers, bias, bidirectional, proj_size, dropout, train, seed,
            std::string(precision), offsets};
  variable_list out = RNNFunction::apply(values, h0, c0, weights, a);
  return {out[0], out[1], out[2]};
}

// ---- packing ---------------------------------------------------------------

// torch's messages (aten/src/ATen/native/PackedSequence.cpp), which seqpack's
// start with where torch raises for the same condition (docs/errors.md).
constexpr const char* kTorchLengthsSorted =
    "`lengths` array must be sorted in decreasing order when `enforce_sorted` is True. You can "
    "pass `enforce_sorted=False` to pack_padded_sequence and/or pack_sequence to sidestep this "
    "requirement if you do not need ONNX exportability.";
constexpr const char* kTorchLengthsPositive =
    "Length of all samples has to be greater than 0, but found an element in 'lengths' that "
    "is <= 0";

// The checks for which torch.nn.utils.rnn.pack_padded_sequence raises, with
// torch's exception types (IndexError for a 1-D input, RuntimeError for the
// lengths), so that code catching torch's catches seqpack's; the core checks
// the rest (a length beyond the padded length: a ValueError, where torch
// builds a broken batch). Zero lengths and an empty batch are accepted.
// seqpack/_torch_packing.py makes the same checks with the same messages.
void check_lengths_as_torch(const Tensor& input, const std::vector<int64_t>& lengths,
                            bool batch_first, bool enforce_sorted, const char* op) {
  // Each message starts with torch's own for the condition, then seqpack's detail.
  if (input.dim() < 2) {
    const int64_t d = std::max<int64_t>(input.dim(), 1);  // a 0-D tensor's range is a 1-D's
    TORCH_CHECK_INDEX(false, "Dimension out of range (expected to be in range of [", -d, ", ",
                      d - 1, "], but got 1); ", op,
                      ": input must have at least 2 dimensions (time and batch), got shape ",
                      input.sizes());
  }
  const int64_t batch = input.size(batch_first ? 0 : 1);
  const int64_t n = static_cast<int64_t>(lengths.size());
  TORCH_CHECK(n == batch, "Expected `len(lengths)` to be equal to batch_size, but got ", n,
              " (batch_size=", batch, "); ", op, ": got ", n, " lengths but the input of shape ",
              input.sizes(), " has batch size ", batch,
              batch_first ? " (batch_first=true)" : " (batch_first=false)");
  for (int64_t b = 0; b < n; ++b) {
    TORCH_CHECK(lengths[b] >= 0, kTorchLengthsPositive, "; ", op, ": lengths[", b, "] = ",
                lengths[b], " is negative (zero-length sequences are accepted)");
    TORCH_CHECK(!enforce_sorted || b == 0 || lengths[b] <= lengths[b - 1], kTorchLengthsSorted,
                "; ", op, ": lengths[", b, "] = ", lengths[b], " is greater than lengths[", b - 1,
                "] = ", lengths[b - 1],
                ": with enforce_sorted=true lengths must be sorted in decreasing order; pass "
                "enforce_sorted=false to accept unsorted lengths");
  }
}

// The index tensors are empty where torch's would be None (enforce_sorted and
// no zero-length sequence): the tracer cannot record optional outputs.
std::tuple<Tensor, Tensor, Tensor, Tensor> pack_cpu(const Tensor& input, const Tensor& lengths,
                                                    bool batch_first, bool enforce_sorted) {
  constexpr const char* op = "seqpack::pack_padded_sequence";
  const Tensor lengths64 = int64_tensor(lengths, op, "lengths");
  // RuntimeError, as torch's (to_vector's ValueError serves the layers' lengths).
  TORCH_CHECK(lengths64.dim() == 1, "'lengths' argument should be a 1D CPU int64 tensor, but got ",
              lengths64.dim(), "D cpu Long tensor; ", op, ": lengths must be 1-D, got shape ",
              lengths64.sizes());
  std::vector<int64_t> len = to_vector(lengths64, op);
  check_lengths_as_torch(input, len, batch_first, enforce_sorted, op);
  CoreTensor x = to_core(input, op, "input");
  PackedSequence p =
      checked(op, [&] { return pack_padded_sequence(x, len, batch_first, enforce_sorted); });
  const auto index = at::TensorOptions().dtype(at::kLong);
  return {from_core(p.data), from_core(p.batch_sizes),
          or_empty(from_core(p.sorted_indices), index),
          or_empty(from_core(p.unsorted_indices), index)};
}

// d(loss)/d(padded input) from d(loss)/d(packed data); size is the padded
// input's shape.
Tensor pack_backward_cpu(const Tensor& grad, const Tensor& batch_sizes,
                         const Tensor& sorted_indices, const Tensor& unsorted_indices,
                         at::IntArrayRef size, bool batch_first) {
  constexpr const char* op = "seqpack::pack_padded_sequence backward";
  TORCH_CHECK_VALUE(size.size() >= 2, op, ": input size must have 2 dimensions or more, got ",
                    size);
  auto plan = plan_of(grad, batch_sizes, sorted_indices, unsorted_indices, op);
  CoreTensor g = to_core(grad, op, "grad_data");
  return from_core(checked(op, [&] {
    return pack_padded_sequence_backward(g, *plan, size[batch_first ? 1 : 0], batch_first);
  }));
}

std::tuple<Tensor, Tensor> pad_cpu(const Tensor& data, const Tensor& batch_sizes,
                                   const OptTensor& sorted_indices,
                                   const OptTensor& unsorted_indices, bool batch_first,
                                   double padding_value, c10::optional<int64_t> total_length) {
  constexpr const char* op = "seqpack::pad_packed_sequence";
  auto plan = plan_of(data, batch_sizes, sorted_indices, unsorted_indices, op);
  int64_t T = plan->max_len();
  if (total_length.has_value()) {
    TORCH_CHECK_VALUE(*total_length >= T,
                      "Expected total_length to be at least the length of the longest sequence "
                      "in input, but got total_length=", *total_length,
                      " and max sequence length being ", T, "; ", op, ": total_length = ",
                      *total_length, " is less than the longest sequence's length ", T);
    T = *total_length;
  }
  CoreTensor x = to_core(data, op, "data");
  CoreTensor out = checked(op, [&] {
    CoreTensor tm = plan->unpack(x, T, padding_value);
    return batch_first ? transpose01(tm) : tm;
  });
  Tensor lengths = at::tensor(plan->lengths(), at::TensorOptions().dtype(at::kLong));
  return {from_core(out), lengths};
}

// d(loss)/d(packed data) from d(loss)/d(padded output); size is the packed
// data's shape.
Tensor pad_backward_cpu(const Tensor& grad, const Tensor& batch_sizes,
                        const OptTensor& sorted_indices, const OptTensor& unsorted_indices,
                        at::IntArrayRef size, bool batch_first) {
  constexpr const char* op = "seqpack::pad_packed_sequence backward";
  TORCH_CHECK_VALUE(!size.empty(), op, ": data size must have 1 dimension or more");
  // plan_of reads only the packed data's row count from its first argument.
  // plan_of reads only the packed data's shape: a stand-in of that shape on
  // one byte.
  auto plan = plan_of(at::empty({1}, at::TensorOptions().dtype(at::kByte)).expand(size),
                      batch_sizes, sorted_indices, unsorted_indices, op);
  CoreTensor g = to_core(grad, op, "grad_padded");
  return from_core(
      checked(op, [&] { return pad_packed_sequence_backward(g, *plan, batch_first); }));
}

#if TORCH_VERSION_MAJOR >= 2
// Sizes as the autograd kernels pass them: symbolic under torch.compile.
#define SEQPACK_SYMINT "SymInt"
using SymInt = c10::SymInt;
using SymIntList = c10::SymIntArrayRef;
SymInt sym_size(const Tensor& t, int64_t d) { return t.sym_size(d); }
std::vector<SymInt> sym_sizes(const Tensor& t) { return t.sym_sizes().vec(); }
#else
#define SEQPACK_SYMINT "int"
using SymInt = int64_t;
using SymIntList = at::IntArrayRef;
SymInt sym_size(const Tensor& t, int64_t d) { return t.size(d); }
std::vector<SymInt> sym_sizes(const Tensor& t) { return t.sizes().vec(); }
#endif

using PackFn = std::tuple<Tensor, Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, bool, bool);
using PackBackwardFn = Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              SymIntList, bool);
using PadFn = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const OptTensor&,
                                         const OptTensor&, bool, double, c10::optional<SymInt>);
using PadBackwardFn = Tensor(const Tensor&, const Tensor&, const OptTensor&, const OptTensor&,
                             SymIntList, bool);
const auto& pack_op() { SEQPACK_OP("pack_padded_sequence", "", PackFn); }
const auto& pack_backward_op() { SEQPACK_OP("_pack_padded_sequence_backward", "", PackBackwardFn); }
const auto& pad_op() { SEQPACK_OP("pad_packed_sequence", "", PadFn); }
const auto& pad_backward_op() { SEQPACK_OP("_pad_packed_sequence_backward", "", PadBackwardFn); }

struct PackArgs {
  Tensor lengths;
  bool batch_first, enforce_sorted;
};

class PackFunction : public torch::autograd::Function<PackFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& input, const PackArgs& a) {
    Tensor data, batch_sizes, sorted, unsorted;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      std::tie(data, batch_sizes, sorted, unsorted) =
          pack_op().call(input, a.lengths, a.batch_first, a.enforce_sorted);
    }
    ctx->save_for_backward({batch_sizes, sorted, unsorted});
    stash(ctx, "size", sym_sizes(input));
    ctx->saved_data["batch_first"] = a.batch_first;
    ctx->mark_non_differentiable({batch_sizes, sorted, unsorted});
    return {data, batch_sizes, sorted, unsorted};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const auto& size = unstash<std::vector<SymInt>>(ctx, "size");
    Tensor g = pack_backward_op().call(grads[0], saved[0], saved[1], saved[2], size,
                                       ctx->saved_data["batch_first"].toBool());
    return {g, Tensor()};
  }
};

std::tuple<Tensor, Tensor, Tensor, Tensor> pack_autograd(const Tensor& input,
                                                         const Tensor& lengths, bool batch_first,
                                                         bool enforce_sorted) {
  if (!(at::GradMode::is_enabled() && input.requires_grad())) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return pack_op().call(input, lengths, batch_first, enforce_sorted);
  }
  variable_list out = PackFunction::apply(input, PackArgs{lengths, batch_first, enforce_sorted});
  return {out[0], out[1], out[2], out[3]};
}

struct PadArgs {
  Tensor batch_sizes;
  OptTensor sorted_indices, unsorted_indices;
  bool batch_first;
  double padding_value;
  c10::optional<SymInt> total_length;
};

class PadFunction : public torch::autograd::Function<PadFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& data, const PadArgs& a) {
    Tensor padded, lengths;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      std::tie(padded, lengths) = pad_op().call(data, a.batch_sizes, a.sorted_indices,
                                                a.unsorted_indices, a.batch_first,
                                                a.padding_value, a.total_length);
    }
    variable_list to_save = {a.batch_sizes};
    const bool indices = a.sorted_indices.has_value() && a.sorted_indices->defined();
    if (indices) to_save.insert(to_save.end(), {*a.sorted_indices, *a.unsorted_indices});
    ctx->save_for_backward(to_save);
    stash(ctx, "size", sym_sizes(data));
    ctx->saved_data["batch_first"] = a.batch_first;
    ctx->mark_non_differentiable({lengths});
    return {padded, lengths};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    OptTensor sorted, unsorted;
    if (saved.size() == 3) sorted = saved[1], unsorted = saved[2];
    const auto& size = unstash<std::vector<SymInt>>(ctx, "size");
    Tensor g = pad_backward_op().call(grads[0], saved[0], sorted, unsorted, size,
                                      ctx->saved_data["batch_first"].toBool());
    return {g, Tensor()};
  }
};

std::tuple<Tensor, Tensor> pad_autograd(const Tensor& data, const Tensor& batch_sizes,
                                        const OptTensor& sorted_indices,
                                        const OptTensor& unsorted_indices, bool batch_first,
                                        double padding_value,
                                        c10::optional<SymInt> total_length) {
  if (!(at::GradMode::is_enabled() && data.requires_grad())) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return pad_op().call(data, batch_sizes, sorted_indices, unsorted_indices, batch_first,
                         padding_value, total_length);
  }
  variable_list out = PadFunction::apply(
      data, PadArgs{batch_sizes, sorted_indices, unsorted_indices, batch_first, padding_value,
                    total_length});
  return {out[0], out[1]};
}

// The backward operators are linear in their gradient and each other's
// adjoint: pack's backward scatters packed rows into a zero-padded tensor (a
// pad), pad's backward gathers them back out (a pack). Their autograd kernels
// say so, each backward calling the other operator through the dispatcher, so
// gradients of any order (create_graph, gradgradcheck) are recorded exactly.
struct SizedArgs {
  Tensor batch_sizes;
  OptTensor sorted_indices, unsorted_indices;
  std::vector<SymInt> size;
  bool batch_first;
};

// An index tensor as _pack_padded_sequence_backward's schema takes it: empty
// for none.
Tensor index_or_empty(const OptTensor& t) {
  if (t.has_value() && t->defined()) return *t;
  return at::empty({0}, at::TensorOptions().dtype(at::kLong));
}

// Saves (batch_sizes, sorted?, unsorted?) and the gradient's size.
void save_sized(AutogradContext* ctx, const Tensor& grad, const SizedArgs& a) {
  variable_list to_save = {a.batch_sizes};
  if (a.sorted_indices.has_value() && a.sorted_indices->defined()) {
    to_save.insert(to_save.end(), {*a.sorted_indices, index_or_empty(a.unsorted_indices)});
  }
  ctx->save_for_backward(to_save);
  stash(ctx, "grad_size", sym_sizes(grad));
  ctx->saved_data["batch_first"] = a.batch_first;
}

class PackBackwardFunction : public torch::autograd::Function<PackBackwardFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& grad, const SizedArgs& a) {
    Tensor out;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      out = pack_backward_op().call(grad, a.batch_sizes, index_or_empty(a.sorted_indices),
                                    index_or_empty(a.unsorted_indices), a.size, a.batch_first);
    }
    save_sized(ctx, grad, a);
    return {out};
  }

  // d/d(grad) of a scatter into padding: the gather, pad's backward.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    OptTensor sorted, unsorted;
    if (saved.size() == 3) sorted = saved[1], unsorted = saved[2];
    const auto& size = unstash<std::vector<SymInt>>(ctx, "grad_size");
    Tensor g = pad_backward_op().call(grads[0], saved[0], sorted, unsorted, size,
                                      ctx->saved_data["batch_first"].toBool());
    return {g, Tensor()};
  }
};

class PadBackwardFunction : public torch::autograd::Function<PadBackwardFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& grad, const SizedArgs& a) {
    Tensor out;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      out = pad_backward_op().call(grad, a.batch_sizes, a.sorted_indices, a.unsorted_indices,
                                   a.size, a.batch_first);
    }
    save_sized(ctx, grad, a);
    return {out};
  }

  // d/d(grad) of a gather of packed rows: the scatter, pack's backward.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    Tensor sorted = index_or_empty(c10::nullopt), unsorted = sorted;
    if (saved.size() == 3) sorted = saved[1], unsorted = saved[2];
    const auto& size = unstash<std::vector<SymInt>>(ctx, "grad_size");
    Tensor g = pack_backward_op().call(grads[0], saved[0], sorted, unsorted, size,
                                       ctx->saved_data["batch_first"].toBool());
    return {g, Tensor()};
  }
};

Tensor pack_backward_autograd(const Tensor& grad, const Tensor& batch_sizes,
                              const Tensor& sorted_indices, const Tensor& unsorted_indices,
                              SymIntList size, bool batch_first) {
  if (!(at::GradMode::is_enabled() && grad.requires_grad())) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return pack_backward_op().call(grad, batch_sizes, sorted_indices, unsorted_indices, size,
                                   batch_first);
  }
  OptTensor sorted, unsorted;
  if (sorted_indices.defined() && sorted_indices.numel() > 0) {
    sorted = sorted_indices, unsorted = unsorted_indices;
  }
  return PackBackwardFunction::apply(
      grad, SizedArgs{batch_sizes, sorted, unsorted, size.vec(), batch_first})[0];
}

Tensor pad_backward_autograd(const Tensor& grad, const Tensor& batch_sizes,
                             const OptTensor& sorted_indices, const OptTensor& unsorted_indices,
                             SymIntList size, bool batch_first) {
  if (!(at::GradMode::is_enabled() && grad.requires_grad())) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return pad_backward_op().call(grad, batch_sizes, sorted_indices, unsorted_indices, size,
                                  batch_first);
  }
  OptTensor sorted, unsorted;
  if (sorted_indices.has_value() && sorted_indices->defined() && sorted_indices->numel() > 0) {
    sorted = sorted_indices, unsorted = unsorted_indices;
  }
  return PadBackwardFunction::apply(
      grad, SizedArgs{batch_sizes, sorted, unsorted, size.vec(), batch_first})[0];
}

// ---- padded input ----------------------------------------------------------

// The shape checks and the all-sequences-of-length-T batch of rnn_padded.
struct Padded {
  int64_t T, B;
};

Padded padded_shape(const Tensor& input, bool batch_first) {
  TORCH_CHECK_VALUE(input.dim() == 3,
                    "seqpack::rnn_padded: input must be 3-D [T, B, input_size] (batch_first: ",
                    "[B, T, input_size]), got shape ", input.sizes());
  return {input.size(batch_first ? 1 : 0), input.size(batch_first ? 0 : 1)};
}

std::tuple<Tensor, Tensor, Tensor> rnn_padded_cpu(
    const Tensor& input, const OptTensor& lengths, const OptTensor& h0, const OptTensor& c0,
    at::TensorList weights, c10::string_view mode, int64_t hidden_size, int64_t num_layers,
    bool bias, bool batch_first, bool bidirectional, int64_t proj_size, double dropout,
    bool train, c10::optional<int64_t> seed, c10::string_view precision) {
  constexpr const char* op = "seqpack::rnn_padded";
  const auto [T, B] = padded_shape(input, batch_first);
  RNNCall call = make_call(op, input, input.size(2), mode, hidden_size, num_layers, bias,
                           bidirectional, proj_size, dropout, train, seed, precision);
  if (lengths.has_value() && lengths->defined()) {
    // Packed through the plan of the lengths; padding comes back as zeros and
    // h_n is each sequence's state at its own last step.
    auto [data, batch_sizes, sorted, unsorted] =
        pack_cpu(input, *lengths, batch_first, /*enforce_sorted=*/false);
    call.plan = plan_of(data, batch_sizes, sorted, unsorted, op);
    auto [out, h_n, c_n] = outputs(run_forward(call, data, h0, c0, weights, false), data);
    Tensor padded = std::get<0>(pad_cpu(out, batch_sizes, sorted, unsorted, batch_first, 0.0, T));
    return {padded, h_n, c_n};
  }
  // Every sequence has length T: the time-major rows are already the packed
  // rows (a view when the input is time-major and contiguous).
  Tensor time_major = batch_first ? input.transpose(0, 1) : input;
  Tensor data = time_major.contiguous().view({T * B, input.size(2)});
  call.plan = std::make_shared<const PackingPlan>(
      PackingPlan::from_lengths(std::vector<int64_t>(B, T), /*enforce_sorted=*/true));
  auto [out, h_n, c_n] = outputs(run_forward(call, data, h0, c0, weights, false), data);
  Tensor output = out.view({T, B, out.size(1)});
  return {batch_first ? output.transpose(0, 1) : output, h_n, c_n};
}

const auto& rnn_padded_op() { SEQPACK_OP("rnn_padded", "", decltype(rnn_padded_cpu)); }

// With a gradient to record: the composition of the packed operators (whose
// autograd kernels record it).
std::tuple<Tensor, Tensor, Tensor> rnn_padded_autograd(
    const Tensor& input, const OptTensor& lengths, const OptTensor& h0, const OptTensor& c0,
    at::TensorList weights, c10::string_view mode, int64_t hidden_size, int64_t num_layers,
    bool bias, bool batch_first, bool bidirectional, int64_t proj_size, double dropout,
    bool train, c10::optional<int64_t> seed, c10::string_view precision) {
  if (!needs_graph(input, h0, c0, weights)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return rnn_padded_op().call(input, lengths, h0, c0, weights, mode, hidden_size, num_layers,
                                bias, batch_first, bidirectional, proj_size, dropout, train, seed,
                                precision);
  }
  const auto [T, B] = padded_shape(input, batch_first);
  if (lengths.has_value() && lengths->defined()) {
    auto [data, batch_sizes, sorted, unsorted] =
        pack_op().call(input, *lengths, batch_first, /*enforce_sorted=*/false);
    auto [out, h_n, c_n] =
        rnn_op().call(data, batch_sizes, sorted, unsorted, h0, c0, weights, mode, hidden_size,
                      num_layers, bias, bidirectional, proj_size, dropout, train, seed, precision);
    Tensor padded = std::get<0>(
        pad_op().call(out, batch_sizes, sorted, unsorted, batch_first, 0.0, SymInt(T)));
    return {padded, h_n, c_n};
  }
  Tensor time_major = batch_first ? input.transpose(0, 1) : input;
  Tensor data = time_major.contiguous().view({T * B, input.size(2)});
  // Batch 0 (torch accepts it) has no time steps in packed form: a batch_sizes
  // of T zeros is not a packed batch.
  Tensor batch_sizes = at::full({B > 0 ? T : 0}, B, at::TensorOptions().dtype(at::kLong));
  // No step (T = 0): the batch's B sequences are of length zero, which only
  // the (identity) indices can say; their h_n/c_n are their h0/c0, as
  // rnn_padded_cpu's plan of B zero lengths gives.
  OptTensor order;
  if (T == 0 && B > 0) order = at::arange(B, input.options().dtype(at::kLong));
  auto [out, h_n, c_n] =
      rnn_op().call(data, batch_sizes, order, order, h0, c0, weights, mode, hidden_size,
                    num_layers, bias, bidirectional, proj_size, dropout, train, seed, precision);
  Tensor output = out.view({T, B, out.size(1)});
  return {batch_first ? output.transpose(0, 1) : output, h_n, c_n};
}

}  // namespace
}  // namespace seqpack::torch_ops

// Schemas: the public four, then the forward-with-saved-state and backward
// operators the autograd kernels call (names with a leading underscore: not
// for direct use; their fake implementations are in python/seqpack/torch.py).
TORCH_LIBRARY(seqpack, m) {
  // rnn, rnn_padded, _rnn_train, _rnn_backward and the CUDA kernels' library.
  SEQPACK_CUDA_SCHEMAS(m);
  SEQPACK_CUDA_PROCESS_SCHEMAS(m);
  m.def(
      "pack_padded_sequence(Tensor input, Tensor lengths, bool batch_first=False, "
      "bool enforce_sorted=True) -> (Tensor data, Tensor batch_sizes, Tensor sorted_indices, "
      "Tensor unsorted_indices)");
  m.def(
      "pad_packed_sequence(Tensor data, Tensor batch_sizes, Tensor? sorted_indices, "
      "Tensor? unsorted_indices, bool batch_first=False, float padding_value=0.0, " SEQPACK_SYMINT
      "? total_length=None) -> (Tensor padded, Tensor lengths)");
  // A jagged nested tensor's values [rows, input_size] (sequence b at rows
  // offsets[b]:offsets[b + 1]) in, the output's rows in the same order out.
  m.def(
      "rnn_nested(Tensor values, Tensor offsets, Tensor? h0, Tensor? c0, Tensor[] weights, "
      "str mode, int hidden_size, int num_layers, bool bias, bool bidirectional, "
      "int proj_size, float dropout, bool train, int? seed=None, str precision=\"fp32\") -> "
      "(Tensor output, Tensor h_n, Tensor c_n)");
  m.def(
      "_rnn_nested_train(Tensor values, Tensor offsets, Tensor? h0, Tensor? c0, "
      "Tensor[] weights, str mode, int hidden_size, int num_layers, bool bias, "
      "bool bidirectional, int proj_size, float dropout, bool train, int? seed=None, "
      "str precision=\"fp32\") -> (Tensor output, Tensor h_n, Tensor c_n, Tensor saved)");
  m.def(
      "_rnn_nested_backward(Tensor saved, Tensor offsets, Tensor? grad_output, "
      "Tensor? grad_h_n, Tensor? grad_c_n, Tensor values, Tensor? h0, Tensor? c0, "
      "Tensor[] weights, bool input_grad, bool state_grad) -> (Tensor grad_input, "
      "Tensor grad_h0, Tensor grad_c0, Tensor[] grad_weights)");
  m.def(
      "_pack_padded_sequence_backward(Tensor grad, Tensor batch_sizes, Tensor sorted_indices, "
      "Tensor unsorted_indices, " SEQPACK_SYMINT "[] size, bool batch_first) -> Tensor");
  m.def(
      "_pad_packed_sequence_backward(Tensor grad, Tensor batch_sizes, Tensor? sorted_indices, "
      "Tensor? unsorted_indices, " SEQPACK_SYMINT "[] size, bool batch_first) -> Tensor");
  // What the model plan cache holds (entries, bytes of copied weights).
  m.def("_plan_cache_size() -> (int, int)", &seqpack::torch_ops::plan_cache_size);
}

// The computations on any backend key, so a tensor on another device reaches
// them and gets their error naming the device (PyTorch 2.4+: the fake
// implementations also register Meta kernels, which run instead on meta tensors).
TORCH_LIBRARY_IMPL(seqpack, CompositeExplicitAutograd, m) {
  using namespace seqpack::torch_ops;
  m.impl("rnn", &rnn_cpu);
  m.impl("rnn_padded", &rnn_padded_cpu);
  m.impl("pack_padded_sequence", &pack_cpu);
  m.impl("pad_packed_sequence", &pad_cpu);
  m.impl("_rnn_train", &rnn_train_cpu);
  m.impl("_rnn_backward", &rnn_backward_cpu);
  m.impl("rnn_nested", &rnn_nested_cpu);
  m.impl("_rnn_nested_train", &rnn_nested_train_cpu);
  m.impl("_rnn_nested_backward", &rnn_nested_backward_cpu);
  m.impl("_pack_padded_sequence_backward", &pack_backward_cpu);
  m.impl("_pad_packed_sequence_backward", &pad_backward_cpu);
}

TORCH_LIBRARY_IMPL(seqpack, Autograd, m) {
  using namespace seqpack::torch_ops;
  m.impl("rnn", &rnn_autograd);
  m.impl("rnn_padded", &rnn_padded_autograd);
  m.impl("rnn_nested", &rnn_nested_autograd);
  m.impl("pack_padded_sequence", &pack_autograd);
  m.impl("pad_packed_sequence", &pad_autograd);
  m.impl("_pack_padded_sequence_backward", &pack_backward_autograd);
  m.impl("_pad_packed_sequence_backward", &pad_backward_autograd);
}
