// The step operands of one thread split: made once per (options, weights,
// threads, precision), it holds what the engine lays out from the weights
// before the time loop runs, as oneDNN's RNN weight reorders or cuDNN's
// weight space do: each layer and direction's step operands (W_hhᵀ, and W_hrᵀ
// with a projection) for the column ranges its threads will ask for. The
// public model plan (seqpack::RNNModelPlan, rnn_core.cpp) keeps one per split
// it meets; a forward without one makes one for itself.
#pragma once

#include <omp.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "cpu/gemm_engine.h"
#include "rnn/grid.h"
#include "rnn/saved.h"
#include "seqpack/rnn.h"

namespace seqpack::rnn {

template <typename T>
struct RNNPlan {
  struct Direction {
    std::unique_ptr<cpu::StepOperand> whh, whr;  // the forward's step operands
  };
  RNNOptions options;
  int threads = 1;                             // a direction's threads it was made for
  const cpu::GemmEngine<T>* engine = nullptr;  // the precision's engine
  std::vector<Direction> dirs;                 // layer by layer, then direction

  const Direction& dir(int64_t l, int64_t d) const {
    return dirs[static_cast<std::size_t>(l * options.num_directions() + d)];
  }
};

// Lays out every layer and direction's step operands with `eng` (the engine
// of options' dtype and precision) for `threads` a direction (the count the
// time loop splits its steps over: direction_threads).
template <typename T>
std::unique_ptr<const RNNPlan<T>> make_plan(const RNNOptions& o, const std::vector<Tensor>& weights,
                                            const cpu::GemmEngine<T>& eng, int threads) {
  auto plan = std::make_unique<RNNPlan<T>>();
  plan->options = o;
  plan->threads = threads;
  plan->engine = &eng;
  const int64_t D = o.num_directions(), H = o.hidden_size, R = o.real_hidden_size();
  const int64_t G = o.gate_count() * H;
  const bool by_rows = rows_split(eng, o);
  const int nc = by_rows ? 1 : threads;  // threads sharing the columns
  for (int64_t l = 0; l < o.num_layers; ++l) {
    for (int64_t d = 0; d < D; ++d) {
      const DirWeights<T> w = dir_weights<T>(o, weights, l, d);
      typename RNNPlan<T>::Direction& pd = plan->dirs.emplace_back();
      pd.whh = eng.prepare(w.w_hh, /*trans_b=*/true, R, G, R, step_ranges(H, G / H, nc));
      if (o.proj_size > 0) {
        pd.whr = eng.prepare(w.w_hr, /*trans_b=*/true, H, R, H, step_ranges(R, 1, nc));
      }
    }
  }
  return plan;
}

}  // namespace seqpack::rnn
