// The public model plan (seqpack::RNNModelPlan, include/seqpack/rnn.h), the
// prepared model: options, config and weights, the weights prepared once for
// the engine of their precision, and the step operands of each thread split
// the forwards and backwards meet, laid out on first use and kept
// (src/rnn/plan.h's RNNPlan and BackwardPlan); an in-place plan lays them out
// per call. Every layout of a model's weights is made here. Made by
// rnn_make_plan (src/rnn/model_plan.cpp), its one maker; read by
// rnn_core.cpp's forwards and backwards.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/gemm_engine.h"
#include "rnn/grid.h"
#include "rnn/plan.h"
#include "seqpack/rnn.h"

namespace seqpack {

namespace rnn {

// The GEMM engine of a call: its element type and precision, and its
// config's kernels, decide it.
template <typename T>
const cpu::GemmEngine<T>& engine_for(const RNNOptions& o, const RNNConfig& config) {
  if constexpr (std::is_same_v<T, float>) {
    return cpu::gemm_engine_f32(o.precision, config.kernels);
  } else {
    return cpu::gemm_engine_f64();
  }
}

}  // namespace rnn

// The public plan (include/seqpack/rnn.h): the weight matrices in the form
// the engine reads them, made with the plan (int8's quantized ones; none for
// the other engines), and the step operands of each thread split
// (rnn::RNNPlan, per element type) laid out at the first forward that asks
// for them, from those; the backward's (rnn::BackwardPlan) at the first
// backward of such a forward that asks for them.
struct RNNModelPlan : std::enable_shared_from_this<RNNModelPlan> {
  RNNOptions options;
  RNNConfig config;  // how its calls share their steps between threads
  // A copy of the weights it was made from, owned (rnn_parameter_names
  // order): every layout here is made from it, and nothing writes it, so a
  // layout made at a later call still has the values the plan was made from.
  // In an in-place plan, the caller's tensors themselves (held, not copied).
  std::vector<Tensor> weights;
  // Made with in_place (rnn_make_plan): no layout is kept, each forward lays
  // out what it needs for itself from `weights` (reading them where they are
  // where the engine can), and its backward reads `weights` as a forward
  // without a kept layout does. The maps below stay empty.
  bool in_place_only = false;
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

  // The step operands of a forward of `steps` steps on `nt` threads a
  // direction: an in-place plan's, laid out for this call alone (reading the
  // weights where they are at one step); a kept plan's, made on first use
  // and kept (the first call of few steps reads them in place: in_place()).
  template <typename T>
  std::shared_ptr<const rnn::RNNPlan<T>> forward_steps(const cpu::GemmEngine<T>& eng, int nt,
                                                       int64_t steps, bool check_finite) const {
    if (in_place_only) {
      return rnn::make_plan<T>(options, config, weights, eng, nt, nullptr,
                               rnn::in_place_steps(steps), check_finite);
    }
    return this->steps<T>(eng, nt, in_place(steps, /*backward=*/false), check_finite);
  }
  // The step operands for `nt` threads a direction, made on first use, or
  // (in_place, and none made yet) in place for this call only, W_hh's
  // finiteness checked where `check_finite`.
  template <typename T>
  std::shared_ptr<const rnn::RNNPlan<T>> steps(const cpu::GemmEngine<T>& eng, int nt,
                                               bool in_place, bool check_finite) const {
    return kept(layouts<T>(), Split{nt, rnn::rows_split(eng, options, config)}, in_place,
                [&](bool here) {
                  return rnn::make_plan<T>(options, config, weights, eng, nt, &weight_layouts, here,
                                           !here || check_finite);
                });
  }
  // The backward's step operands for a layer on `nt` threads, `columns` of
  // them sharing a step's columns, made on first use (or in place, as
  // steps()'s).
  template <typename T>
  std::shared_ptr<const rnn::BackwardPlan<T>> backward_steps(const cpu::GemmEngine<T>& eng, int nt,
                                                             int columns, bool in_place) const {
    return kept(backward_layouts<T>(), Split{nt, columns == 1 && nt > 1}, in_place,
                [&](bool here) {
                  return rnn::make_backward_plan<T>(options, weights, eng, columns, here);
                });
  }
  // known[key], made by make(false) and kept on first use; where there is
  // none yet and `in_place`, make(true), kept for no other call.
  template <typename Plan, typename Make>
  std::shared_ptr<const Plan> kept(std::map<Split, std::shared_ptr<const Plan>>& known, Split key,
                                   bool in_place, Make make) const {
    const std::lock_guard<std::mutex> lock(mutex);
    auto it = known.find(key);
    if (it != known.end()) return it->second;
    if (in_place) return make(true);
    return known.emplace(key, make(false)).first->second;
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

}  // namespace seqpack
