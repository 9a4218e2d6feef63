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
// state and step math, rnn/cell.h); rnn/model_plan.h is the model plan,
// rnn/checks.h the argument checks, rnn/dropout.h the masks between layers
// and rnn/profile.h rnn_core_profile's clock. Every matrix product goes through the
// call's GEMM engine (cpu/gemm_engine.h), chosen from the dtype and
// RNNOptions::precision: a precision is an engine, and nothing here knows
// which one runs.
#include <omp.h>

#include <cassert>
#include <memory>
#include <vector>

#include "cpu/buffer_pool.h"
#include "cpu/gemm.h"
#include "cpu/gemm_engine.h"
#include "rnn/cells.h"
#include "rnn/checks.h"
#include "rnn/dropout.h"
#include "rnn/grid.h"
#include "rnn/model_plan.h"
#include "rnn/plan.h"
#include "rnn/profile.h"
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
using rnn::dropped_input;
using rnn::engine_for;
using rnn::PartClock;
using rnn::rows_split;
using rnn::run_teams;
using rnn::with_cell;

}  // namespace



namespace {

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
RNNForwardResult forward_impl(const RNNModelPlan& mp, const Tensor& data,
                              const std::vector<int64_t>* lookup, const PackingPlan& plan,
                              const Tensor& h0, const Tensor& c0, bool training, bool save,
                              uint64_t seed) {
  const RNNOptions& o = mp.options;
  const std::vector<Tensor>& weights = mp.weights;
  const int64_t L = o.num_layers, D = o.num_directions(), H = o.hidden_size;
  const int64_t R = o.real_hidden_size();
  const int64_t B = plan.batch(), N = plan.total_rows();
  PartClock clock(&RNNCoreProfile::forwards);

  const cpu::BlasSingleThread one_pool;  // OpenMP's threads only (cpu/gemm.h)
  const cpu::GemmEngine<T>& eng = engine_for<T>(o, mp.config);
  // The weights laid out once for the engine and the threads (by an
  // in-place plan: for this call alone).
  const bool by_rows = rows_split(eng, o, mp.config);
  const auto steps = static_cast<int64_t>(plan.batch_sizes().size());
  const int nt = direction_threads(o, mp.config, by_rows, N, steps);
  const std::shared_ptr<const rnn::RNNPlan<T>> model =
      mp.forward_steps<T>(eng, nt, steps, !h0.defined());
  RNNForwardResult res;
  res.h_n = cpu::pooled_empty({L * D, B, R}, o.dtype);
  if (Cell::cell_state) res.c_n = cpu::pooled_empty({L * D, B, H}, o.dtype);
  std::shared_ptr<RNNSaved> saved = save ? make_saved<T>(o, weights, plan, lookup) : nullptr;
  if (saved) {
    saved->config = mp.config;
    saved->h0_zero = !h0.defined();
  }
  if (saved && !mp.in_place_only) saved->model = mp.shared_from_this();

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
          !h0.defined() && laid_out.whh_finite, mp.config));
      dirs.back()->begin(nt, by_rows, x, h0, c0, out);
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
  const cpu::GemmEngine<T>& eng = engine_for<T>(o, sv.config);
  RNNGradients g;
  for (const Shape& s : rnn_parameter_shapes(o)) g.weights.push_back(cpu::pooled_empty(s, o.dtype));
  if (initial_state_grad) {
    g.h0 = cpu::pooled_empty({L * D, B, R}, o.dtype);
    if (Cell::cell_state) g.c0 = cpu::pooled_empty({L * D, B, H}, o.dtype);
  }
  std::vector<BackwardWorkspace<T, Cell>> wss(static_cast<std::size_t>(D));
  for (BackwardWorkspace<T, Cell>& ws : wss) ws.resize(sv);
  const int nt = direction_threads(o, sv.config, rows_split(eng, o, sv.config, /*backward=*/true),
                                   N, static_cast<int64_t>(sv.batch_sizes.size()));

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
      // W_ih as the model's plan laid it out (bf16: blocked, one layout per
      // orientation; this product's is made by its first call).
      const cpu::WeightLayout* wih = nullptr;
      if (sv.model && !sv.model->weight_layouts.dirs.empty())
        wih = sv.model->weight_layouts.dirs[static_cast<std::size_t>(l * D + d)].wih.get();
      eng.gemm({.m = rows,
                .n = in,
                .k = G,
                .a = {.data = lookup_layer ? ws.dproj.data() : ws.dg,
                      .ld = G,
                      .kept = lookup_layer ? nullptr : ws.dg_kept()},
                .b = {.data = w.w_ih, .ld = in, .laid_out = wih, .in_place = in_place},
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

RNNForwardResult dispatch_forward(const RNNModelPlan& model, const Tensor& data,
                                  const std::vector<int64_t>* lookup, const PackingPlan& plan,
                                  const Tensor& h0, const Tensor& c0, bool training,
                                  bool save_for_backward, uint64_t dropout_seed) {
  const RNNOptions& options = model.options;
  rnn::check_forward_mode(options, training, save_for_backward);
  return with_cell(options.mode, [&]<typename Cell>(Cell) {
    if (options.dtype == DType::f32) {
      return forward_impl<float, Cell>(model, data, lookup, plan, h0, c0, training,
                                       save_for_backward, dropout_seed);
    }
    return forward_impl<double, Cell>(model, data, lookup, plan, h0, c0, training,
                                      save_for_backward, dropout_seed);
  });
}

}  // namespace

RNNForwardResult rnn_forward(const RNNModelPlan& model, const Tensor& data, const PackingPlan& plan,
                             const Tensor& h0, const Tensor& c0, bool training,
                             bool save_for_backward, uint64_t dropout_seed) {
  rnn::check_forward(model.options, data, plan, h0, c0);
  return dispatch_forward(model, data, nullptr, plan, h0, c0, training, save_for_backward,
                          dropout_seed);
}

RNNForwardResult rnn_forward_lookup(const RNNModelPlan& model, const Tensor& table,
                                    const std::vector<int64_t>& ids, const PackingPlan& plan,
                                    const Tensor& h0, const Tensor& c0, bool training,
                                    bool save_for_backward, uint64_t dropout_seed) {
  rnn::check_forward_lookup(model.options, table, ids, plan, h0, c0);
  return dispatch_forward(model, table, &ids, plan, h0, c0, training, save_for_backward,
                          dropout_seed);
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
  rnn::check_backward(saved, grad_output, grad_h_n, grad_c_n);
  const RNNOptions& o = saved.options;
  return with_cell(o.mode, [&]<typename Cell>(Cell) {
    if (o.dtype == DType::f32) {
      return backward_impl<float, Cell>(saved, grad_output, grad_h_n, grad_c_n, initial_state_grad,
                                        input_grad);
    }
    return backward_impl<double, Cell>(saved, grad_output, grad_h_n, grad_c_n, initial_state_grad,
                                       input_grad);
  });
}

}  // namespace seqpack
