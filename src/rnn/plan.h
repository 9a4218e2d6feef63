// The step operands of one thread split: made once per (options, weights,
// threads, precision), it holds what the engine lays out from the weights
// before the time loop runs, as oneDNN's RNN weight reorders or cuDNN's
// weight space do: each layer and direction's step operands (W_hhᵀ, and W_hrᵀ
// with a projection) for the column ranges its threads will ask for. The
// public model plan (seqpack::RNNModelPlan, rnn/model_plan.h) keeps one per
// split it meets; an in-place plan makes one for each call.
#pragma once

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <memory>
#include <vector>

#include "cpu/finite.h"
#include "cpu/gemm_engine.h"
#include "rnn/grid.h"
#include "rnn/saved.h"
#include "seqpack/rnn.h"

namespace seqpack::rnn {

// Each layer and direction's weight matrices in the form the engine's
// products read them (GemmEngine::lay_out_weights: int8's quantized ones,
// made here; bf16's rounded copies, made by their first bf16 product), once
// per model, as op(B) of the forward's products (W_ih and W_hh and W_hr
// transposed); null where the engine reads weights as they are.
struct WeightLayouts {
  struct Direction {
    std::unique_ptr<cpu::WeightLayout> wih, whh, whr;
  };
  std::vector<Direction> dirs;  // layer by layer, then direction; empty: none
};

template <typename T>
WeightLayouts lay_out_weights(const RNNOptions& o, const std::vector<Tensor>& weights,
                              const cpu::GemmEngine<T>& eng) {
  WeightLayouts out;
  const int64_t G = o.gate_count() * o.hidden_size, R = o.real_hidden_size(), H = o.hidden_size;
  bool any = false;
  for (int64_t l = 0; l < o.num_layers; ++l) {
    const int64_t in = l == 0 ? o.input_size : o.output_size();
    for (int64_t d = 0; d < o.num_directions(); ++d) {
      const DirWeights<T> w = dir_weights<T>(o, weights, l, d);
      WeightLayouts::Direction& wd = out.dirs.emplace_back();
      wd.wih = eng.lay_out_weights(w.w_ih, /*trans_b=*/true, in, G, in);
      wd.whh = eng.lay_out_weights(w.w_hh, /*trans_b=*/true, R, G, R);
      if (w.w_hr) wd.whr = eng.lay_out_weights(w.w_hr, /*trans_b=*/true, H, R, H);
      any = any || wd.wih || wd.whh || wd.whr;
    }
  }
  if (!any) out.dirs.clear();
  return out;
}

template <typename T>
struct RNNPlan {
  struct Direction {
    std::unique_ptr<cpu::StepOperand> whh, whr;  // the forward's step operands
    const cpu::WeightLayout* wih = nullptr;      // W_ih as laid out for the model, or null
    // Made for one call of few steps (in_place_steps): its products read
    // the weights where they are where the engine can (W_ih's too).
    bool in_place = false;
    // Whether every entry of W_hh is finite: only then is W_hh·0 zero, and
    // may the steps skip the product of rows that hold a zero h0 (a NaN or
    // inf in W_hh makes it NaN, as torch's product does).
    bool whh_finite = true;
  };
  RNNOptions options;
  int threads = 1;                             // a direction's threads it was made for
  const cpu::GemmEngine<T>* engine = nullptr;  // the precision's engine
  std::vector<Direction> dirs;                 // layer by layer, then direction

  const Direction& dir(int64_t l, int64_t d) const {
    return dirs[static_cast<std::size_t>(l * options.num_directions() + d)];
  }
};

// Whether a call of `steps` steps reads its step weights where they are
// (GemmEngine::prepare_in_place) rather than laying them out: a layout
// writes all of W_hh out and reads it back, which one step's product does
// not repay (GRU(500), batch 1, a training step whose optimizer changes the
// weights at every call: the layouts were 2 of its 6 ms).
inline bool in_place_steps(int64_t steps) { return steps <= 1; }

// Lays out every layer and direction's step operands with `eng` (the engine
// of options' dtype and precision) for `threads` a direction (the count the
// time loop splits its steps over: direction_threads), from the model's
// weight layouts where given (which must outlive the plan). With `in_place`
// (in_place_steps), the operands read the weights where they are (which
// must outlive the plan), and W_hh is checked for finite entries only where
// `check_finite` (else whh_finite is false: no skip).
template <typename T>
std::unique_ptr<const RNNPlan<T>> make_plan(const RNNOptions& o, const RNNConfig& config,
                                            const std::vector<Tensor>& weights,
                                            const cpu::GemmEngine<T>& eng, int threads,
                                            const WeightLayouts* layouts = nullptr,
                                            bool in_place = false, bool check_finite = true) {
  auto plan = std::make_unique<RNNPlan<T>>();
  plan->options = o;
  plan->threads = threads;
  plan->engine = &eng;
  const int64_t D = o.num_directions(), H = o.hidden_size, R = o.real_hidden_size();
  const int64_t G = o.gate_count() * H;
  const bool by_rows = rows_split(eng, o, config);
  const int nc = by_rows ? 1 : threads;  // threads sharing the columns
  for (int64_t l = 0; l < o.num_layers; ++l) {
    for (int64_t d = 0; d < D; ++d) {
      const DirWeights<T> w = dir_weights<T>(o, weights, l, d);
      const WeightLayouts::Direction* wl =
          layouts && !layouts->dirs.empty()
              ? &layouts->dirs[static_cast<std::size_t>(l * D + d)]
              : nullptr;
      typename RNNPlan<T>::Direction& pd = plan->dirs.emplace_back();
      // In place where the engine reads the weights as they are (from the
      // model's layout where it needs one, as int8's quantized weights).
      const auto prepare = [&](const T* b, int64_t k, int64_t n,
                               const std::vector<cpu::ColumnRange>& ranges,
                               const cpu::WeightLayout* laid_out) {
        return in_place ? eng.prepare_in_place(b, /*trans_b=*/true, k, n, k, ranges, laid_out)
                        : eng.prepare(b, /*trans_b=*/true, k, n, k, ranges, laid_out);
      };
      pd.whh = prepare(w.w_hh, R, G, step_ranges(H, G / H, nc), wl ? wl->whh.get() : nullptr);
      if (o.proj_size > 0)
        pd.whr = prepare(w.w_hr, H, R, step_ranges(R, 1, nc), wl ? wl->whr.get() : nullptr);
      pd.wih = wl ? wl->wih.get() : nullptr;
      pd.in_place = in_place;
      pd.whh_finite = check_finite && cpu::all_finite(w.w_hh, G * R);
    }
  }
  return plan;
}

// The backward's step operands of one column split: W_hh and W_hr as they
// are (the backward's per-step products are dh·W_hh and dh·W_hr), laid out
// for `columns` threads sharing a step's columns (1: a row split or one
// thread). The public model plan keeps one per split its backwards meet; a
// backward whose forward had no plan makes its own.
template <typename T>
struct BackwardPlan {
  struct Direction {
    std::unique_ptr<cpu::StepOperand> whh, whr;
  };
  RNNOptions options;
  std::vector<Direction> dirs;  // layer by layer, then direction

  const Direction& dir(int64_t l, int64_t d) const {
    return dirs[static_cast<std::size_t>(l * options.num_directions() + d)];
  }
};

// One layer and direction's backward step operands for `columns` threads.
// With `in_place` (in_place_steps), read where they are.
template <typename T>
typename BackwardPlan<T>::Direction backward_step_operands(const RNNOptions& o,
                                                           const DirWeights<T>& w,
                                                           const cpu::GemmEngine<T>& eng,
                                                           int columns, bool in_place = false) {
  const int64_t H = o.hidden_size, R = o.real_hidden_size(), G = o.gate_count() * H;
  const auto prepare = [&](const T* b, int64_t k, int64_t n, int64_t ld,
                           const std::vector<cpu::ColumnRange>& ranges) {
    return in_place ? eng.prepare_in_place(b, /*trans_b=*/false, k, n, ld, ranges)
                    : eng.prepare(b, /*trans_b=*/false, k, n, ld, ranges);
  };
  typename BackwardPlan<T>::Direction out;
  out.whh = prepare(w.w_hh, G, R, R, step_ranges(R, 1, columns));
  if (o.proj_size > 0) out.whr = prepare(w.w_hr, R, H, H, step_ranges(H, 1, columns));
  return out;
}

template <typename T>
std::unique_ptr<const BackwardPlan<T>> make_backward_plan(const RNNOptions& o,
                                                          const std::vector<Tensor>& weights,
                                                          const cpu::GemmEngine<T>& eng,
                                                          int columns, bool in_place = false) {
  auto plan = std::make_unique<BackwardPlan<T>>();
  plan->options = o;
  for (int64_t l = 0; l < o.num_layers; ++l) {
    for (int64_t d = 0; d < o.num_directions(); ++d) {
      const DirWeights<T> w = dir_weights<T>(o, weights, l, d);
      plan->dirs.push_back(backward_step_operands<T>(o, w, eng, columns, in_place));
    }
  }
  return plan;
}

}  // namespace seqpack::rnn
