// rnn_make_plan and rnn_plan_info (include/seqpack/rnn.h).
#include "rnn/model_plan.h"

#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "rnn/checks.h"
#include "rnn/plan.h"
#include "seqpack/precision.h"
#include "seqpack/rnn.h"

namespace seqpack {

std::shared_ptr<const RNNModelPlan> rnn_make_plan(const RNNOptions& options,
                                                  const std::vector<Tensor>& weights, bool in_place,
                                                  const RNNConfig& config) {
  options.validate();
  check_precision_supported(options.precision, config.kernels);
  rnn::check_weights(options, weights);
  auto plan = std::make_shared<RNNModelPlan>();
  plan->options = options;
  plan->config = config;
  if (in_place) {
    // The caller's tensors, held: nothing is copied or laid out here (a
    // one-step call's product reads W_hh once, which no layout repays).
    plan->weights = weights;
    plan->in_place_only = true;
    return plan;
  }
  plan->weights.reserve(weights.size());
  for (const Tensor& w : weights) plan->weights.push_back(w.clone());
  if (options.dtype == DType::f32) {
    plan->weight_layouts = rnn::lay_out_weights<float>(options, plan->weights,
                                                       rnn::engine_for<float>(options, config));
  }
  return plan;
}

const std::vector<Tensor>& rnn_plan_weights(const RNNModelPlan& plan) { return plan.weights; }

bool rnn_plan_holds(const RNNModelPlan& plan, const std::vector<Tensor>& weights) {
  if (weights.size() != plan.weights.size()) return false;
  for (std::size_t i = 0; i < weights.size(); ++i)
    if (!rnn::same_values(plan.weights[i], weights[i])) return false;
  return true;
}

std::shared_ptr<const RNNModelPlan> rnn_current_plan(std::shared_ptr<const RNNModelPlan> plan,
                                                     const RNNOptions& options,
                                                     const std::vector<Tensor>& weights,
                                                     const RNNConfig& config) {
  if (plan && !plan->in_place_only && plan->config == config &&
      plan->options == options && rnn_plan_holds(*plan, weights))
    return plan;
  return rnn_make_plan(options, weights, /*in_place=*/false, config);
}

const RNNConfig& rnn_plan_config(const RNNModelPlan& plan) { return plan.config; }

RNNPlanInfo rnn_plan_info(const RNNModelPlan& plan) {
  RNNPlanInfo info;
  info.precision = plan.options.precision;
  info.backward = precision_traits(plan.options.precision).backward;
  info.quantized = plan.options.precision == Precision::int8 && !plan.weight_layouts.dirs.empty();
  const std::lock_guard<std::mutex> lock(plan.mutex);
  info.splits_laid_out = static_cast<int>(plan.f32.size() + plan.f64.size());
  info.backward_splits_laid_out =
      static_cast<int>(plan.backward_f32.size() + plan.backward_f64.size());
  return info;
}

}  // namespace seqpack
