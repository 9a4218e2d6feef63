// The packed-native functional core: rnn_forward and rnn_backward, and the
// grid of layers × directions they walk.
//
// Per layer and direction the forward does
//   1. ONE GEMM over all packed rows: G = X·W_ihᵀ + b (the input projection);
//   2. per step t, ONE GEMM of only its live rows (batch_sizes[t]) with W_hh,
//      accumulated into that step's rows of G;
//   3. the cell's step math over those rows (fused gate kernels, src/cpu/rnn_gates.h).
// The hidden state lives in a [batch, H] buffer in length-sorted order: the
// live rows of step t are its first batch_sizes[t] rows, so a sequence that
// ended keeps its final state in place and, in the reverse direction, a
// sequence that starts at step t still holds h0. That gives h_n at each
// sequence's own last step with no bookkeeping.
//
// The backward keeps per packed row what it needs (gate activations, c, c_prev,
// h_prev aligned with the gate rows), walks the steps only for the dh/dc
// recurrence (one GEMM of live rows per step), then computes dW_ih, dX, dW_hh
// and the biases each with ONE GEMM (or one pass) over all packed rows, so its
// cost is linear in the number of tokens.
//
// Shape of the code (src/rnn/): forward_impl/backward_impl here walk the
// layers and directions; rnn/time_loop.h's ForwardDirection/BackwardDirection
// hold one layer and direction and run its time loop, written once for every
// cell; rnn/grid.h shares a direction's steps between threads (two
// directions side by side, or one direction's columns split over threads, or
// its sequences where the engine prefers rows); rnn/cell_lstm.h,
// rnn/cell_gru.h and rnn/cell_rnn.h are the cells (traits, workspace, saved
// state and step math, rnn/cell.h). Every matrix product goes through the
// call's GEMM engine (cpu/gemm_engine.h), chosen from the dtype and
// RNNOptions::precision: a precision is an engine, and nothing here knows
// which one runs.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu/buffer_pool.h"
#include "cpu/gemm.h"
#include "cpu/gemm_engine.h"
#include "cpu/gemm_int8.h"
#include "rnn/cells.h"
#include "rnn/grid.h"
#include "rnn/plan.h"
#include "rnn/saved.h"
#include "rnn/time_loop.h"
#include "seqpack/rnn.h"

namespace seqpack {

namespace {

using rnn::BackwardDirection;
using rnn::BackwardWorkspace;
using rnn::DirWeights;
using rnn::ForwardDirection;
using rnn::ForwardWorkspace;
using rnn::dir_weights;
using rnn::direction_threads;
using rnn::has_cell_state;
using rnn::rows_split;
using rnn::run_teams;
using rnn::with_cell;

void check_state(const Tensor& s, const Shape& want, DType dtype, const char* what) {
  if (!s.defined()) return;
  if (s.shape() != want) {
    throw std::invalid_argument(std::string(what) + " has shape " + shape_str(s.shape()) +
                                ", expected " + shape_str(want));
  }
  if (s.dtype() != dtype) {
    throw std::invalid_argument(std::string(what) + " has dtype " + dtype_name(s.dtype()) +
                                ", expected " + dtype_name(dtype));
  }
}

void check_weights(const RNNOptions& o, const std::vector<Tensor>& weights) {
  const auto names = rnn_parameter_names(o);
  const auto shapes = rnn_parameter_shapes(o);
  if (weights.size() != names.size()) {
    throw std::invalid_argument("expected " + std::to_string(names.size()) +
                                " weight tensors for these options, got " +
                                std::to_string(weights.size()));
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    const Tensor& w = weights[i];
    if (!w.defined() || w.shape() != shapes[i]) {
      throw std::invalid_argument(names[i] + " has shape " +
                                  (w.defined() ? shape_str(w.shape()) : "undefined") +
                                  ", expected " + shape_str(shapes[i]));
    }
    if (w.dtype() != o.dtype) {
      throw std::invalid_argument(names[i] + " has dtype " + dtype_name(w.dtype()) + ", expected " +
                                  dtype_name(o.dtype));
    }
  }
}

// The GEMM engine of a call: its element type and precision decide it.
template <typename T>
const cpu::GemmEngine<T>& engine_for(const RNNOptions& o) {
  if constexpr (std::is_same_v<T, float>) {
    return cpu::gemm_engine_f32(o.precision);
  } else {
    return cpu::gemm_engine_f64();
  }
}

template <typename T>
Tensor dropout_mask(int64_t rows, int64_t cols, double p, uint64_t seed, int64_t layer) {
  Tensor mask = cpu::pooled_empty({rows, cols}, dtype_of<T>());
  // One stream per layer so masks do not depend on the other layers' sizes.
  std::mt19937_64 gen(seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(layer));
  std::bernoulli_distribution keep(1.0 - p);
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  T* m = mask.data<T>();
  for (int64_t i = 0; i < mask.numel(); ++i) m[i] = keep(gen) ? scale : T(0);
  return mask;
}

// Layer l's input after inter-layer dropout (training, l > 0): x * mask, the
// mask holding 0 or 1/(1-p).
template <typename T>
Tensor dropped_input(const RNNOptions& o, const Tensor& in, int64_t l, bool training,
                     uint64_t seed, Tensor& mask) {
  if (l == 0 || !training || o.dropout <= 0) return in;
  const int64_t N = in.size(0), F = in.size(1);
  mask = dropout_mask<T>(N, F, o.dropout, seed, l);
  Tensor x = cpu::pooled_empty({N, F}, o.dtype);
  const T* a = in.data<T>();
  const T* m = mask.data<T>();
  T* y = x.data<T>();
  for (int64_t i = 0; i < N * F; ++i) y[i] = a[i] * m[i];
  return x;
}

}  // namespace

// The public plan (include/seqpack/rnn.h): the weight matrices in the form
// the engine reads them, made with the plan (int8's quantized ones; none for
// the other engines), and the step operands of each thread split
// (rnn::RNNPlan, per element type) laid out at the first forward that asks
// for them, from those; the backward's (rnn::BackwardPlan) at the first
// backward of such a forward that asks for them.
struct RNNModelPlan : std::enable_shared_from_this<RNNModelPlan> {
  RNNOptions options;
  std::vector<Tensor> weights;       // shared, read where a layout is first made
  std::vector<const void*> sources;  // their data, rnn_parameter_names order
  rnn::WeightLayouts weight_layouts;  // float's engine (dtype f32)
  mutable std::mutex mutex;
  // Keyed by the split: threads a direction, and rows or columns.
  using Split = std::pair<int, bool>;
  mutable std::map<Split, std::shared_ptr<const rnn::RNNPlan<float>>> f32;
  mutable std::map<Split, std::shared_ptr<const rnn::RNNPlan<double>>> f64;
  // Keyed as the forward's: a layer's threads, and those sharing a step's
  // columns (1 under a row split).
  mutable std::map<Split, std::shared_ptr<const rnn::BackwardPlan<float>>> backward_f32;
  mutable std::map<Split, std::shared_ptr<const rnn::BackwardPlan<double>>> backward_f64;

  // Calls of few steps (rnn::in_place_steps) met so far, forwards and
  // backwards apart: the first of them reads the weights in place, and
  // later ones lay them out (weights that outlive one call are likely to
  // serve many: a decoder's steps between two optimizer steps, or serving).
  mutable int short_forwards = 0, short_backwards = 0;

  // Whether a call of `steps` steps reads its weights in place where the
  // plan has no layout for it (counted: call once per call).
  bool in_place(int64_t steps, bool backward) const {
    if (!rnn::in_place_steps(steps)) return false;
    const std::lock_guard<std::mutex> lock(mutex);
    return (backward ? short_backwards : short_forwards)++ == 0;
  }

  // The step operands for `nt` threads a direction, made on first use, or
  // (in_place, and none made yet) in place for this call only, W_hh's
  // finiteness checked where `check_finite`.
  template <typename T>
  std::shared_ptr<const rnn::RNNPlan<T>> steps(const cpu::GemmEngine<T>& eng, int nt,
                                               bool in_place, bool check_finite) const {
    auto& known = layouts<T>();
    const Split key{nt, rnn::rows_split(eng, options)};
    const std::lock_guard<std::mutex> lock(mutex);
    auto it = known.find(key);
    if (it == known.end()) {
      if (in_place) {
        return rnn::make_plan<T>(options, weights, eng, nt, &weight_layouts, /*in_place=*/true,
                                 check_finite);
      }
      it = known.emplace(key, rnn::make_plan<T>(options, weights, eng, nt, &weight_layouts)).first;
    }
    return it->second;
  }
  // The backward's step operands for a layer on `nt` threads, `columns` of
  // them sharing a step's columns, made on first use (or in place, as
  // steps()'s).
  template <typename T>
  std::shared_ptr<const rnn::BackwardPlan<T>> backward_steps(const cpu::GemmEngine<T>& eng, int nt,
                                                             int columns, bool in_place) const {
    auto& known = backward_layouts<T>();
    const Split key{nt, columns == 1 && nt > 1};
    const std::lock_guard<std::mutex> lock(mutex);
    auto it = known.find(key);
    if (it == known.end()) {
      if (in_place)
        return rnn::make_backward_plan<T>(options, weights, eng, columns, /*in_place=*/true);
      it = known.emplace(key, rnn::make_backward_plan<T>(options, weights, eng, columns)).first;
    }
    return it->second;
  }
  // The map of element type T of a float and a double pair.
  template <typename T, typename F, typename D>
  static auto& of_type(F& for_float, D& for_double) {
    if constexpr (std::is_same_v<T, float>) {
      return for_float;
    } else {
      return for_double;
    }
  }
  template <typename T>
  auto& layouts() const {
    return of_type<T>(f32, f64);
  }
  template <typename T>
  auto& backward_layouts() const {
    return of_type<T>(backward_f32, backward_f64);
  }
};

namespace {

// rnn_core_profile: the sums, and a call's clock that adds its parts to
// them when the call ends (nothing is read while profiling is off).
std::atomic<bool> profiling{false};
std::mutex profile_mu;
RNNCoreProfile profile_sums;

class PartClock {
 public:
  using Part = double RNNCoreProfile::*;
  explicit PartClock(int64_t RNNCoreProfile::*calls)
      : on_(profiling.load(std::memory_order_relaxed)), calls_(calls) {
    if (on_) last_ = Clock::now();
  }
  PartClock(const PartClock&) = delete;
  PartClock& operator=(const PartClock&) = delete;
  // Charges the time since the previous mark (or the start) to `part`.
  void mark(Part part) {
    if (!on_) return;
    const Clock::time_point now = Clock::now();
    mine_.*part += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }
  ~PartClock() {
    if (!on_) return;
    const std::lock_guard<std::mutex> lock(profile_mu);
    RNNCoreProfile& s = profile_sums;
    for (Part p : {&RNNCoreProfile::forward_inputs, &RNNCoreProfile::forward_steps,
                   &RNNCoreProfile::forward_states, &RNNCoreProfile::backward_prepare,
                   &RNNCoreProfile::backward_steps, &RNNCoreProfile::backward_weights,
                   &RNNCoreProfile::backward_inputs})
      s.*p += mine_.*p;
    ++(s.*calls_);
  }

 private:
  using Clock = std::chrono::steady_clock;
  const bool on_;
  int64_t RNNCoreProfile::*calls_;
  Clock::time_point last_;
  RNNCoreProfile mine_;
};

template <typename T>
std::shared_ptr<RNNSaved> make_saved(const RNNOptions& o, const std::vector<Tensor>& weights,
                                     const PackingPlan& plan,
                                     const std::vector<int64_t>* lookup) {
  auto saved = std::make_shared<RNNSaved>();
  saved->options = o;
  saved->weights = weights;
  saved->batch_sizes = plan.batch_sizes();
  saved->offsets = plan.offsets();
  saved->sorted_indices = plan.sorted_indices();
  saved->batch = plan.batch();
  saved->total_rows = plan.total_rows();
  if (lookup) saved->lookup = *lookup;
  return saved;
}

template <typename T, typename Cell>
RNNForwardResult forward_impl(const RNNOptions& o, const std::vector<Tensor>& weights,
                              const Tensor& data, const std::vector<int64_t>* lookup,
                              const PackingPlan& plan, const Tensor& h0, const Tensor& c0,
                              bool training, bool save, uint64_t seed,
                              const RNNModelPlan* mp) {
  const int64_t L = o.num_layers, D = o.num_directions(), H = o.hidden_size;
  const int64_t R = o.real_hidden_size();
  const int64_t B = plan.batch(), N = plan.total_rows();
  PartClock clock(&RNNCoreProfile::forwards);

  const cpu::BlasSingleThread one_pool;  // OpenMP's threads only (cpu/gemm.h)
  const cpu::GemmEngine<T>& eng = engine_for<T>(o);
  // The weights laid out once for the engine and the threads.
  const int nt = direction_threads(o, rows_split(eng, o), N,
                                  static_cast<int64_t>(plan.batch_sizes().size()));
  const auto steps = static_cast<int64_t>(plan.batch_sizes().size());
  const std::shared_ptr<const rnn::RNNPlan<T>> model =
      mp ? mp->steps<T>(eng, nt, mp->in_place(steps, /*backward=*/false), !h0.defined())
         : std::shared_ptr<const rnn::RNNPlan<T>>(
               rnn::make_plan<T>(o, weights, eng, nt, nullptr, rnn::in_place_steps(steps),
                                 !h0.defined()));
  RNNForwardResult res;
  res.h_n = cpu::pooled_empty({L * D, B, R}, o.dtype);
  if (Cell::cell_state) res.c_n = cpu::pooled_empty({L * D, B, H}, o.dtype);
  std::shared_ptr<RNNSaved> saved = save ? make_saved<T>(o, weights, plan, lookup) : nullptr;
  if (saved && mp) saved->model = mp->shared_from_this();

  std::vector<ForwardWorkspace<T, Cell>> wss(static_cast<std::size_t>(D));
  for (ForwardWorkspace<T, Cell>& ws : wss) ws.resize(o, B, save, lookup ? data.size(0) : 0);
  Tensor layer_in = data;
  for (int64_t l = 0; l < L; ++l) {
    RNNSaved::Layer sl;
    const Tensor x = dropped_input<T>(o, layer_in, l, training, seed, sl.mask);
    Tensor out = cpu::pooled_empty({N, D * R}, o.dtype);
    sl.dirs.resize(static_cast<std::size_t>(D));
    std::vector<std::unique_ptr<ForwardDirection<T, Cell>>> dirs;
    for (int64_t d = 0; d < D; ++d) {
      const auto k = static_cast<std::size_t>(d);
      // The products of rows holding the zero h0 are skipped only where they
      // are zero: a NaN or inf in W_hh makes them NaN, as in torch.
      const auto& laid_out = model->dir(l, d);
      dirs.push_back(std::make_unique<ForwardDirection<T, Cell>>(
          o, eng, plan, weights, lookup, wss[k], sl.dirs[k], laid_out, l, d, save,
          !h0.defined() && laid_out.whh_finite));
      dirs.back()->begin(nt, x, h0, c0, out);
    }
    clock.mark(&RNNCoreProfile::forward_inputs);
    run_teams(D, nt, [&](int64_t d, const rnn::Team& team) {
      dirs[static_cast<std::size_t>(d)]->steps(team);
    });
    clock.mark(&RNNCoreProfile::forward_steps);
    for (const auto& fd : dirs) fd->finish(res);
    clock.mark(&RNNCoreProfile::forward_states);
    if (save) {
      sl.input = x;
      saved->layers.push_back(std::move(sl));
    }
    layer_in = out;
  }
  res.output = layer_in;
  res.saved = saved;
  return res;
}

// The backward: the layers down, in each the directions (BackwardDirection
// walks the steps), then dX of both directions with one product each.
template <typename T, typename Cell>
RNNGradients backward_impl(const RNNSaved& sv, const Tensor& grad_output, const Tensor& grad_h_n,
                           const Tensor& grad_c_n, bool initial_state_grad, bool input_grad) {
  const RNNOptions& o = sv.options;
  const int64_t L = o.num_layers, D = o.num_directions(), H = o.hidden_size;
  const int64_t R = o.real_hidden_size(), G = o.gate_count() * H;
  const int64_t B = sv.batch, N = sv.total_rows;
  PartClock clock(&RNNCoreProfile::backwards);

  const cpu::BlasSingleThread one_pool;  // OpenMP's threads only (cpu/gemm.h)
  const cpu::GemmEngine<T>& eng = engine_for<T>(o);
  RNNGradients g;
  for (const Shape& s : rnn_parameter_shapes(o)) g.weights.push_back(cpu::pooled_empty(s, o.dtype));
  if (initial_state_grad) {
    g.h0 = cpu::pooled_empty({L * D, B, R}, o.dtype);
    if (Cell::cell_state) g.c0 = cpu::pooled_empty({L * D, B, H}, o.dtype);
  }
  std::vector<BackwardWorkspace<T, Cell>> wss(static_cast<std::size_t>(D));
  for (BackwardWorkspace<T, Cell>& ws : wss) ws.resize(sv);
  const int nt = direction_threads(o, rows_split(eng, o, /*backward=*/true), N,
                                  static_cast<int64_t>(sv.batch_sizes.size()));

  // Where the forward had a plan, whether this call reads the weights in
  // place (where the plan has no layout for a layer's split).
  const bool in_place =
      sv.model && sv.model->in_place(static_cast<int64_t>(sv.batch_sizes.size()), true);
  Tensor dout = grad_output;  // gradient of this layer's output rows, or undefined
  for (int64_t l = L - 1; l >= 0; --l) {
    const RNNSaved::Layer& sl = sv.layers[static_cast<std::size_t>(l)];
    const bool lookup_layer = l == 0 && !sv.lookup.empty();
    const int64_t in = sl.input.size(1), rows = lookup_layer ? sl.input.size(0) : N;
    const int ntl = BackwardDirection<T, Cell>::layer_threads(nt, eng, sv, lookup_layer);
    // The model plan's step operands for this layer's split, where the
    // forward had a plan.
    const int columns =
        BackwardDirection<T, Cell>::splits_rows(ntl, eng, sv, lookup_layer) ? 1 : ntl;
    const std::shared_ptr<const rnn::BackwardPlan<T>> laid_out =
        sv.model ? sv.model->backward_steps<T>(eng, ntl, columns, in_place) : nullptr;
    std::vector<std::unique_ptr<BackwardDirection<T, Cell>>> dirs;
    for (int64_t d = 0; d < D; ++d) {
      dirs.push_back(std::make_unique<BackwardDirection<T, Cell>>(
          sv, eng, wss[static_cast<std::size_t>(d)], g, l, d, initial_state_grad));
      dirs.back()->begin(ntl, dout, grad_h_n, grad_c_n, sl.input,
                         laid_out ? &laid_out->dir(l, d) : nullptr);
      assert(dirs.back()->columns(ntl) == columns);
    }
    clock.mark(&RNNCoreProfile::backward_prepare);
    run_teams(D, ntl, [&](int64_t d, const rnn::Team& team) {
      dirs[static_cast<std::size_t>(d)]->steps(team);
    });
    clock.mark(&RNNCoreProfile::backward_steps);
    for (const auto& bd : dirs) bd->finish(sl.input);
    clock.mark(&RNNCoreProfile::backward_weights);
    // The first layer's dX is only for the caller: skipped when not wanted.
    if (l == 0 && !input_grad) return g;
    // dX sums both directions' contributions, after both are done.
    Tensor dx = cpu::pooled_empty({rows, in}, o.dtype);
    for (int64_t d = 0; d < D; ++d) {
      const DirWeights<T> w = dir_weights<T>(o, sv.weights, l, d);
      const BackwardWorkspace<T, Cell>& ws = wss[static_cast<std::size_t>(d)];
      eng.gemm({.m = rows,
                .n = in,
                .k = G,
                .a = {.data = lookup_layer ? ws.dproj.data() : ws.dg,
                      .ld = G,
                      .kept = lookup_layer ? nullptr : ws.dg_kept()},
                .b = {.data = w.w_ih, .ld = in},
                .beta = d == 0 ? T(0) : T(1),
                .c = dx.data<T>(),
                .ldc = in});
    }
    if (sl.mask.defined()) {
      T* a = dx.data<T>();
      const T* m = sl.mask.data<T>();
      for (int64_t i = 0; i < N * in; ++i) a[i] *= m[i];
    }
    dout = dx;
    clock.mark(&RNNCoreProfile::backward_inputs);
  }
  g.input = dout;
  return g;
}

}  // namespace

namespace {

// Checks of h0/c0 shared by both forwards.
void check_initial_state(const RNNOptions& options, const PackingPlan& plan, const Tensor& h0,
                         const Tensor& c0) {
  const int64_t LD = options.num_layers * options.num_directions();
  check_state(h0, {LD, plan.batch(), options.real_hidden_size()}, options.dtype, "h0");
  if (has_cell_state(options.mode)) {
    check_state(c0, {LD, plan.batch(), options.hidden_size}, options.dtype, "c0");
  } else if (c0.defined()) {
    throw std::invalid_argument(std::string("c0 is only used by LSTM, not ") +
                                rnn_mode_name(options.mode));
  }
}

}  // namespace

namespace {

// A plan given to a forward: made for these options (precision and dtype
// included) from these tensors.
void check_model_plan(const RNNOptions& o, const std::vector<Tensor>& weights,
                      const RNNModelPlan* model) {
  if (!model) return;
  const RNNOptions& p = model->options;
  const auto differs = [](const char* what, const std::string& plan, const std::string& call) {
    throw std::invalid_argument(std::string("the model plan was made for ") + what + " " + plan +
                                ", this forward has " + call + " (make a plan for it: rnn_make_plan)");
  };
  if (p.mode != o.mode) differs("mode", rnn_mode_name(p.mode), rnn_mode_name(o.mode));
  if (p.precision != o.precision)
    differs("precision", precision_name(p.precision), precision_name(o.precision));
  if (p.dtype != o.dtype) differs("dtype", dtype_name(p.dtype), dtype_name(o.dtype));
  const std::vector<std::pair<const char*, std::pair<int64_t, int64_t>>> sizes{
      {"input_size", {p.input_size, o.input_size}},
      {"hidden_size", {p.hidden_size, o.hidden_size}},
      {"num_layers", {p.num_layers, o.num_layers}},
      {"proj_size", {p.proj_size, o.proj_size}},
      {"bias", {p.bias, o.bias}},
      {"bidirectional", {p.bidirectional, o.bidirectional}}};
  for (const auto& [name, v] : sizes)
    if (v.first != v.second) differs(name, std::to_string(v.first), std::to_string(v.second));
  const auto names = rnn_parameter_names(o);
  if (model->sources.size() != weights.size()) {
    throw std::invalid_argument("the model plan was made from " +
                                std::to_string(model->sources.size()) + " tensors, not these " +
                                std::to_string(weights.size()));
  }
  for (std::size_t i = 0; i < weights.size(); ++i) {
    if (model->sources[i] != weights[i].raw_data()) {
      throw std::invalid_argument("the model plan was made from another " + names[i] +
                                  " than this forward's (make a plan for it: rnn_make_plan)");
    }
  }
}

RNNForwardResult dispatch_forward(const RNNOptions& options, const std::vector<Tensor>& weights,
                                  const Tensor& data, const std::vector<int64_t>* lookup,
                                  const PackingPlan& plan, const Tensor& h0, const Tensor& c0,
                                  bool training, bool save_for_backward, uint64_t dropout_seed,
                                  const RNNModelPlan* model) {
  if (!precision_traits(options.precision).backward && (training || save_for_backward)) {
    const std::string p = precision_name(options.precision);
    throw std::invalid_argument(
        "precision " + p + " is for inference only, but this forward is " +
        (training ? "in training mode (call eval(), or pass training = false)"
                  : "saving for a backward (" + p + " has no gradient; use fp32 or bf16)"));
  }
  check_model_plan(options, weights, model);
  return with_cell(options.mode, [&]<typename Cell>(Cell) {
    if (options.dtype == DType::f32) {
      return forward_impl<float, Cell>(options, weights, data, lookup, plan, h0, c0, training,
                                       save_for_backward, dropout_seed, model);
    }
    return forward_impl<double, Cell>(options, weights, data, lookup, plan, h0, c0, training,
                                      save_for_backward, dropout_seed, model);
  });
}

}  // namespace

RNNForwardResult rnn_forward(const RNNOptions& options, const std::vector<Tensor>& weights,
                             const Tensor& data, const PackingPlan& plan, const Tensor& h0,
                             const Tensor& c0, bool training, bool save_for_backward,
                             uint64_t dropout_seed, const RNNModelPlan* model) {
  options.validate();
  check_weights(options, weights);
  if (!data.defined() || data.dim() != 2) {
    throw std::invalid_argument("packed input must be 2-D [rows, input_size], got shape " +
                                (data.defined() ? shape_str(data.shape()) : "undefined"));
  }
  if (data.size(1) != options.input_size) {
    throw std::invalid_argument(
        "input has " + std::to_string(data.size(1)) +
        " features, expected input_size = " + std::to_string(options.input_size));
  }
  if (data.size(0) != plan.total_rows()) {
    throw std::invalid_argument("packed input has " + std::to_string(data.size(0)) +
                                " rows but the batch sizes sum to " +
                                std::to_string(plan.total_rows()));
  }
  if (data.dtype() != options.dtype) {
    throw std::invalid_argument(std::string("input has dtype ") + dtype_name(data.dtype()) +
                                " but the weights are " + dtype_name(options.dtype));
  }
  check_initial_state(options, plan, h0, c0);
  return dispatch_forward(options, weights, data, nullptr, plan, h0, c0, training,
                          save_for_backward, dropout_seed, model);
}

RNNForwardResult rnn_forward_lookup(const RNNOptions& options, const std::vector<Tensor>& weights,
                                    const Tensor& table, const std::vector<int64_t>& ids,
                                    const PackingPlan& plan, const Tensor& h0, const Tensor& c0,
                                    bool training, bool save_for_backward,
                                    uint64_t dropout_seed, const RNNModelPlan* model) {
  options.validate();
  check_weights(options, weights);
  if (!table.defined() || table.dim() != 2 || table.size(1) != options.input_size) {
    throw std::invalid_argument(
        "lookup table must be 2-D [rows, input_size = " + std::to_string(options.input_size) +
        "], got shape " + (table.defined() ? shape_str(table.shape()) : "undefined"));
  }
  if (table.dtype() != options.dtype) {
    throw std::invalid_argument(std::string("lookup table has dtype ") + dtype_name(table.dtype()) +
                                " but the weights are " + dtype_name(options.dtype));
  }
  if (static_cast<int64_t>(ids.size()) != plan.total_rows()) {
    throw std::invalid_argument("lookup has " + std::to_string(ids.size()) +
                                " ids but the batch sizes sum to " +
                                std::to_string(plan.total_rows()));
  }
  const int64_t V = table.size(0);
  for (std::size_t r = 0; r < ids.size(); ++r) {
    if (ids[r] < 0 || ids[r] >= V) {
      throw std::invalid_argument("lookup ids[" + std::to_string(r) + "] = " +
                                  std::to_string(ids[r]) + " is outside the table's rows [0, " +
                                  std::to_string(V) + ")");
    }
  }
  check_initial_state(options, plan, h0, c0);
  return dispatch_forward(options, weights, table, &ids, plan, h0, c0, training,
                          save_for_backward, dropout_seed, model);
}

std::shared_ptr<const RNNModelPlan> rnn_make_plan(const RNNOptions& options,
                                                  const std::vector<Tensor>& weights) {
  options.validate();
  check_weights(options, weights);
  auto plan = std::make_shared<RNNModelPlan>();
  plan->options = options;
  plan->weights = weights;
  for (const Tensor& w : weights) plan->sources.push_back(w.raw_data());
  if (options.dtype == DType::f32)
    plan->weight_layouts = rnn::lay_out_weights<float>(options, weights, engine_for<float>(options));
  return plan;
}

RNNPlanInfo rnn_plan_info(const RNNModelPlan& plan) {
  RNNPlanInfo info;
  info.precision = plan.options.precision;
  info.backward = precision_traits(plan.options.precision).backward;
  info.quantized = !plan.weight_layouts.dirs.empty();
  const std::lock_guard<std::mutex> lock(plan.mutex);
  info.splits_laid_out = static_cast<int>(plan.f32.size() + plan.f64.size());
  info.backward_splits_laid_out =
      static_cast<int>(plan.backward_f32.size() + plan.backward_f64.size());
  return info;
}

const RNNOptions& rnn_saved_options(const RNNSaved& saved) { return saved.options; }

std::vector<Tensor> rnn_saved_dropout_masks(const RNNSaved& saved) {
  std::vector<Tensor> masks;
  masks.reserve(saved.layers.size());
  for (const RNNSaved::Layer& l : saved.layers) masks.push_back(l.mask);
  return masks;
}

RNNGradients rnn_backward(const RNNSaved& saved, const Tensor& grad_output, const Tensor& grad_h_n,
                          const Tensor& grad_c_n, bool initial_state_grad, bool input_grad) {
  const RNNOptions& o = saved.options;
  const int64_t LD = o.num_layers * o.num_directions();
  check_state(grad_output, {saved.total_rows, o.output_size()}, o.dtype, "grad_output");
  check_state(grad_h_n, {LD, saved.batch, o.real_hidden_size()}, o.dtype, "grad_h_n");
  if (has_cell_state(o.mode)) {
    check_state(grad_c_n, {LD, saved.batch, o.hidden_size}, o.dtype, "grad_c_n");
  } else if (grad_c_n.defined()) {
    throw std::invalid_argument(std::string("grad_c_n is only used by LSTM, not ") +
                                rnn_mode_name(o.mode));
  }
  return with_cell(o.mode, [&]<typename Cell>(Cell) {
    if (o.dtype == DType::f32) {
      return backward_impl<float, Cell>(saved, grad_output, grad_h_n, grad_c_n, initial_state_grad,
                                        input_grad);
    }
    return backward_impl<double, Cell>(saved, grad_output, grad_h_n, grad_c_n, initial_state_grad,
                                       input_grad);
  });
}

void rnn_core_profile_enable(bool on) {
  const std::lock_guard<std::mutex> lock(profile_mu);
  if (on) profile_sums = RNNCoreProfile{};
  profiling.store(on, std::memory_order_relaxed);
}

RNNCoreProfile rnn_core_profile(bool reset) {
  const std::lock_guard<std::mutex> lock(profile_mu);
  const RNNCoreProfile p = profile_sums;
  if (reset) profile_sums = RNNCoreProfile{};
  return p;
}

}  // namespace seqpack
