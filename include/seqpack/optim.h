// Optimisers with the update formulas of PyTorch 1.13 (torch.optim.SGD and
// torch.optim.Adam, single-tensor path), and clip_grad_norm.
//
//   Adam opt(model.parameters(), {.lr = 2e-3});
//   ... forward, loss, backward ...
//   clip_grad_norm(opt.parameters(), /*max_norm=*/5.0);
//   opt.step();
//   opt.zero_grad();
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "seqpack/nn.h"
#include "seqpack/tensor.h"

namespace seqpack {

class Optimizer {
 public:
  explicit Optimizer(std::vector<Parameter> params);
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  // Sets every gradient to zero in place (the storage the modules accumulate into).
  void zero_grad();
  std::vector<Parameter>& parameters() { return params_; }

 protected:
  std::vector<Parameter> params_;
};

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

// g = grad + weight_decay * p
// buf = g at the first step, then momentum * buf + (1 - dampening) * g
// g = nesterov ? g + momentum * buf : buf          (when momentum != 0)
// p = p - lr * g
class SGD : public Optimizer {
 public:
  SGD(std::vector<Parameter> params, SGDOptions options);
  void step() override;
  SGDOptions& options() { return options_; }

 private:
  SGDOptions options_;
  std::vector<Tensor> momentum_buffer_;  // undefined until the first step
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // L2: added to the gradient, not decoupled (that is AdamW)
  bool amsgrad = false;
  // The kernels the float32 update runs on (its ISA cap: a policy's
  // kernel_config, seqpack/policy.h).
  KernelConfig kernels;
};

// t = t + 1;  g = grad + weight_decay * p
// m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g^2
// (amsgrad: vmax = max(vmax, v), used in place of v below)
// p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// float32 parameters take 1 - beta1, 1 - beta2 and the corrections from
// double, as torch's Python floats, and round the rest in float32.
class Adam : public Optimizer {
 public:
  Adam(std::vector<Parameter> params, AdamOptions options);
  void step() override;
  AdamOptions& options() { return options_; }
  int64_t step_count() const { return step_; }

  // The per-parameter moments, for checkpoints: "exp_avg.<param name>",
  // "exp_avg_sq.<param name>" (and "max_exp_avg_sq.<param name>" with amsgrad),
  // views of the optimiser's own tensors. Together with step_count() this is
  // everything a later step depends on (torch's optimizer.state_dict()).
  std::map<std::string, Tensor> state() const;
  // Restores state() and the step count; strict like load_state_dict: a missing,
  // unexpected or wrongly shaped key throws std::invalid_argument naming it.
  void load_state(const std::map<std::string, Tensor>& state, int64_t step_count);

 private:
  AdamOptions options_;
  int64_t step_ = 0;
  std::vector<Tensor> exp_avg_, exp_avg_sq_, max_exp_avg_sq_;
};

// Scales all gradients together so their joint norm is at most max_norm, as
// torch.nn.utils.clip_grad_norm_: coef = min(1, max_norm / (total + 1e-6)).
// norm_type may be infinity. Returns the total norm before clipping.
double clip_grad_norm(std::vector<Parameter>& params, double max_norm, double norm_type = 2.0);

// The name of the first parameter whose gradient holds a NaN or an infinity,
// or "" where every gradient is finite (absent gradients count as finite): a
// training loop's check that a step did not diverge.
std::string non_finite_grad(const std::vector<Parameter>& params);

}  // namespace seqpack
