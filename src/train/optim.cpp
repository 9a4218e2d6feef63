#include "seqpack/optim.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "cpu/adam.h"

namespace seqpack {

Optimizer::Optimizer(std::vector<Parameter> params) : params_(std::move(params)) {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = params_[i];
    if (!p.value.defined() || !p.grad.defined() || p.value.dtype() == DType::i64) {
      throw std::invalid_argument("optimizer: parameter " + std::to_string(i) + " (" + p.name +
                                  ") needs a defined float value and grad");
    }
    if (p.value.shape() != p.grad.shape() || p.value.dtype() != p.grad.dtype()) {
      throw std::invalid_argument("optimizer: parameter " + p.name + " has shape " +
                                  shape_str(p.value.shape()) + " but its grad has shape " +
                                  shape_str(p.grad.shape()));
    }
  }
}

void Optimizer::zero_grad() {
  for (auto& p : params_) p.grad.fill(0.0);
}

// ---------------------------------------------------------------------- SGD

SGD::SGD(std::vector<Parameter> params, SGDOptions options)
    : Optimizer(std::move(params)), options_(options), momentum_buffer_(params_.size()) {
  if (options.lr < 0) throw std::invalid_argument("SGD: lr = " + std::to_string(options.lr) + " is negative");
  if (options.momentum < 0) {
    throw std::invalid_argument("SGD: momentum = " + std::to_string(options.momentum) + " is negative");
  }
  if (options.weight_decay < 0) {
    throw std::invalid_argument("SGD: weight_decay = " + std::to_string(options.weight_decay) +
                                " is negative");
  }
  if (options.nesterov && (options.momentum <= 0 || options.dampening != 0)) {
    throw std::invalid_argument("SGD: nesterov needs momentum > 0 and dampening = 0");
  }
}

template <typename T>
static void sgd_update(T* p, const T* grad, T* buf, bool first, int64_t n, const SGDOptions& o) {
  const T lr = static_cast<T>(o.lr), wd = static_cast<T>(o.weight_decay),
          mom = static_cast<T>(o.momentum), damp = static_cast<T>(1.0 - o.dampening);
  for (int64_t i = 0; i < n; ++i) {
    T g = grad[i];
    if (o.weight_decay != 0) g += wd * p[i];
    if (o.momentum != 0) {
      buf[i] = first ? g : mom * buf[i] + damp * g;
      g = o.nesterov ? g + mom * buf[i] : buf[i];
    }
    p[i] -= lr * g;
  }
}

void SGD::step() {
  for (std::size_t k = 0; k < params_.size(); ++k) {
    Parameter& p = params_[k];
    bool first = false;
    if (options_.momentum != 0 && !momentum_buffer_[k].defined()) {
      momentum_buffer_[k] = Tensor::zeros(p.value.shape(), p.value.dtype());
      first = true;
    }
    if (p.value.dtype() == DType::f32) {
      sgd_update<float>(p.value.data<float>(), p.grad.data<float>(),
                        options_.momentum != 0 ? momentum_buffer_[k].data<float>() : nullptr,
                        first, p.value.numel(), options_);
    } else {
      sgd_update<double>(p.value.data<double>(), p.grad.data<double>(),
                         options_.momentum != 0 ? momentum_buffer_[k].data<double>() : nullptr,
                         first, p.value.numel(), options_);
    }
  }
}

// --------------------------------------------------------------------- Adam

Adam::Adam(std::vector<Parameter> params, AdamOptions options)
    : Optimizer(std::move(params)), options_(options) {
  if (options.lr < 0) throw std::invalid_argument("Adam: lr = " + std::to_string(options.lr) + " is negative");
  if (options.eps < 0) throw std::invalid_argument("Adam: eps = " + std::to_string(options.eps) + " is negative");
  if (!(options.beta1 >= 0 && options.beta1 < 1)) {
    throw std::invalid_argument("Adam: beta1 = " + std::to_string(options.beta1) + " is outside [0, 1)");
  }
  if (!(options.beta2 >= 0 && options.beta2 < 1)) {
    throw std::invalid_argument("Adam: beta2 = " + std::to_string(options.beta2) + " is outside [0, 1)");
  }
  if (options.weight_decay < 0) {
    throw std::invalid_argument("Adam: weight_decay = " + std::to_string(options.weight_decay) +
                                " is negative");
  }
  for (auto& p : params_) {
    exp_avg_.push_back(Tensor::zeros(p.value.shape(), p.value.dtype()));
    exp_avg_sq_.push_back(Tensor::zeros(p.value.shape(), p.value.dtype()));
    max_exp_avg_sq_.push_back(options.amsgrad ? Tensor::zeros(p.value.shape(), p.value.dtype())
                                              : Tensor());
  }
}

// One loop per option combination, so the per-element body has no option tests.
template <typename T, bool kAmsgrad, bool kWeightDecay>
static void adam_update_loop(
    T* __restrict p, const T* __restrict grad, T* __restrict m, T* __restrict v,
    T* __restrict vmax, int64_t n, T b1, T b2, T eps, T wd, T step_size, T bc2_sqrt) {
  for (int64_t i = 0; i < n; ++i) {
    T g = grad[i];
    if constexpr (kWeightDecay) g += wd * p[i];
    // torch: exp_avg.lerp_(g, 1 - beta1), i.e. m + (1 - beta1) * (g - m).
    const T mi = m[i] + (T(1) - b1) * (g - m[i]);
    const T vi = v[i] * b2 + (T(1) - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    T vv = vi;
    if constexpr (kAmsgrad) {
      vv = vmax[i] > vi ? vmax[i] : vi;
      vmax[i] = vv;
    }
    const T denom = std::sqrt(vv) / bc2_sqrt + eps;
    p[i] -= step_size * mi / denom;
  }
}

template <typename T>
static void adam_update(T* p, const T* grad, T* m, T* v, T* vmax, int64_t n, const AdamOptions& o,
                        int64_t step) {
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(step));
  const T step_size = static_cast<T>(o.lr / bc1);
  const T bc2_sqrt = static_cast<T>(std::sqrt(bc2));
  const T b1 = static_cast<T>(o.beta1), b2 = static_cast<T>(o.beta2), eps = static_cast<T>(o.eps),
          wd = static_cast<T>(o.weight_decay);
  const bool decay = o.weight_decay != 0;
  if (vmax) {
    if (decay) {
      adam_update_loop<T, true, true>(p, grad, m, v, vmax, n, b1, b2, eps, wd, step_size, bc2_sqrt);
    } else {
      adam_update_loop<T, true, false>(p, grad, m, v, vmax, n, b1, b2, eps, wd, step_size, bc2_sqrt);
    }
  } else if (decay) {
    adam_update_loop<T, false, true>(p, grad, m, v, vmax, n, b1, b2, eps, wd, step_size, bc2_sqrt);
  } else {
    adam_update_loop<T, false, false>(p, grad, m, v, vmax, n, b1, b2, eps, wd, step_size, bc2_sqrt);
  }
}

std::map<std::string, Tensor> Adam::state() const {
  std::map<std::string, Tensor> st;
  for (std::size_t k = 0; k < params_.size(); ++k) {
    st["exp_avg." + params_[k].name] = exp_avg_[k];
    st["exp_avg_sq." + params_[k].name] = exp_avg_sq_[k];
    if (options_.amsgrad) st["max_exp_avg_sq." + params_[k].name] = max_exp_avg_sq_[k];
  }
  return st;
}

void Adam::load_state(const std::map<std::string, Tensor>& state, int64_t step_count) {
  if (step_count < 0) {
    throw std::invalid_argument("Adam::load_state: step count " + std::to_string(step_count) +
                                " is negative");
  }
  std::map<std::string, Tensor> mine = this->state();
  for (const auto& [name, t] : state) {
    if (!mine.count(name)) throw std::invalid_argument("Adam::load_state: unexpected key '" + name + "'");
  }
  // Validate every key before copying any, so a bad state leaves the optimiser untouched.
  for (const auto& [name, dst] : mine) {
    auto it = state.find(name);
    if (it == state.end()) throw std::invalid_argument("Adam::load_state: missing key '" + name + "'");
    if (!it->second.defined() || it->second.shape() != dst.shape() || it->second.dtype() != dst.dtype()) {
      throw std::invalid_argument("Adam::load_state: '" + name + "' has shape " +
                                  (it->second.defined() ? shape_str(it->second.shape()) : "undefined") +
                                  " or a different dtype, expected " + shape_str(dst.shape()));
    }
  }
  for (auto& [name, dst] : mine) {
    Tensor d = dst;
    d.copy_from(state.at(name));
  }
  step_ = step_count;
}

void Adam::step() {
  ++step_;
  // The bias corrections once per step, in double as for the float64 path.
  const double bc1 = 1.0 - std::pow(options_.beta1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(options_.beta2, static_cast<double>(step_));
  const cpu::AdamScalars f32{static_cast<float>(options_.beta1),
                             static_cast<float>(options_.beta2),
                             static_cast<float>(options_.eps),
                             static_cast<float>(options_.weight_decay),
                             static_cast<float>(options_.lr / bc1),
                             static_cast<float>(std::sqrt(bc2))};
  for (std::size_t k = 0; k < params_.size(); ++k) {
    Parameter& p = params_[k];
    if (p.value.dtype() == DType::f32) {
      cpu::adam_update_f32(p.value.data<float>(), p.grad.data<float>(), exp_avg_[k].data<float>(),
                           exp_avg_sq_[k].data<float>(),
                           options_.amsgrad ? max_exp_avg_sq_[k].data<float>() : nullptr,
                           p.value.numel(), f32);
    } else {
      adam_update<double>(p.value.data<double>(), p.grad.data<double>(),
                          exp_avg_[k].data<double>(), exp_avg_sq_[k].data<double>(),
                          options_.amsgrad ? max_exp_avg_sq_[k].data<double>() : nullptr,
                          p.value.numel(), options_, step_);
    }
  }
}

// ------------------------------------------------------------ clip_grad_norm

double clip_grad_norm(std::vector<Parameter>& params, double max_norm, double norm_type) {
  if (!(norm_type > 0)) {
    throw std::invalid_argument("clip_grad_norm: norm_type = " + std::to_string(norm_type) +
                                " must be positive");
  }
  const bool inf = std::isinf(norm_type);
  // Accumulated in double; torch takes the norm of the per-tensor norms, which
  // is the same quantity.
  double acc = 0.0;
  auto reduce = [&](const auto* g, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const double a = std::fabs(static_cast<double>(g[i]));
      if (inf) {
        acc = std::max(acc, a);
      } else if (norm_type == 2.0) {
        acc += a * a;  // the common case, without pow
      } else {
        acc += std::pow(a, norm_type);
      }
    }
  };
  for (auto& p : params) {
    if (p.grad.dtype() == DType::f32) {
      reduce(p.grad.data<float>(), p.grad.numel());
    } else {
      reduce(p.grad.data<double>(), p.grad.numel());
    }
  }
  const double total = inf ? acc : std::pow(acc, 1.0 / norm_type);
  const double coef = std::min(1.0, max_norm / (total + 1e-6));
  if (coef < 1.0) {
    for (auto& p : params) {
      if (p.grad.dtype() == DType::f32) {
        float* g = p.grad.data<float>();
        for (int64_t i = 0; i < p.grad.numel(); ++i) g[i] *= static_cast<float>(coef);
      } else {
        double* g = p.grad.data<double>();
        for (int64_t i = 0; i < p.grad.numel(); ++i) g[i] *= coef;
      }
    }
  }
  return total;
}

}  // namespace seqpack
