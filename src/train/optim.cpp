#include "seqpack/optim.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/adam.h"
#include "train/chunks.h"
#include "train/param_memory.h"

namespace seqpack {

namespace {

// Adam, the gradient norm and zero_grad pass over every parameter in chunks
// (train/chunks.h) on OpenMP's threads: the main job's 205k parameters take
// Adam and the gradient norm 0.1 ms each a step on one thread, a tenth of a
// 16-thread step.
using train::Chunks;
using train::for_chunks;

// Whether the byte ranges of these tensors overlap anywhere.
bool any_overlap(std::vector<std::pair<const char*, const char*>> ranges) {
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) return true;
  return false;
}

Chunks chunks_of(const std::vector<Parameter>& params) {
  std::vector<int64_t> sizes;
  // the optimisers' values have their grads' shapes; no grad, no chunk
  for (const Parameter& p : params) sizes.push_back(p.grad.defined() ? p.grad.numel() : 0);
  Chunks c = train::chunks_of_sizes(sizes);
  // A parameter listed twice (or two views of one tensor) is updated twice,
  // one after the other, as on one thread: never from two threads at once.
  c.disjoint = !train::parameters_share_memory(params);
  return c;
}

}  // namespace

bool train::parameters_share_memory(const std::vector<Parameter>& params) {
  std::vector<std::pair<const char*, const char*>> values, grads;
  const auto range = [](const Tensor& t) {
    const char* at = static_cast<const char*>(t.raw_data());
    return std::make_pair(at, at + t.numel() * static_cast<int64_t>(dtype_size(t.dtype())));
  };
  for (const Parameter& p : params) {
    if (p.grad.defined() && p.grad.numel() > 0) grads.push_back(range(p.grad));
    if (p.value.defined() && p.value.numel() > 0) values.push_back(range(p.value));
  }
  return any_overlap(std::move(values)) || any_overlap(std::move(grads));
}

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

// In Adam's chunks, on its threads (for_chunks' static schedule): each chunk
// is zeroed by the thread whose cache holds it from the step before. Zeroed
// on the calling thread, every line another core last wrote was fetched to
// be overwritten: the main job's gradients took 0.008-0.010 s an epoch at two
// threads on a Zen 4 (0.002-0.004 at one), and 0.003 s this way.
void Optimizer::zero_grad() {
  for_chunks(chunks_of(params_), [&](std::size_t k, int64_t a, int64_t b, int64_t) {
    Tensor& g = params_[k].grad;
    const std::size_t es = dtype_size(g.dtype());
    std::memset(static_cast<char*>(g.raw_data()) + a * static_cast<int64_t>(es), 0,
                static_cast<std::size_t>(b - a) * es);
  });
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
  const cpu::AdamScalars f32{static_cast<float>(1.0 - options_.beta1),
                             static_cast<float>(options_.beta2),
                             static_cast<float>(1.0 - options_.beta2),
                             static_cast<float>(options_.eps),
                             static_cast<float>(options_.weight_decay),
                             static_cast<float>(options_.lr / bc1),
                             static_cast<float>(std::sqrt(bc2))};
  // Element by element: the same bits in chunks, on any number of threads.
  for_chunks(chunks_of(params_), [&](std::size_t k, int64_t a, int64_t b, int64_t) {
    Parameter& p = params_[k];
    if (p.value.dtype() == DType::f32) {
      cpu::adam_update_f32(p.value.data<float>() + a, p.grad.data<float>() + a,
                           exp_avg_[k].data<float>() + a, exp_avg_sq_[k].data<float>() + a,
                           options_.amsgrad ? max_exp_avg_sq_[k].data<float>() + a : nullptr, b - a,
                           f32, options_.kernels.isa_cap);
    } else {
      adam_update<double>(p.value.data<double>() + a, p.grad.data<double>() + a,
                          exp_avg_[k].data<double>() + a, exp_avg_sq_[k].data<double>() + a,
                          options_.amsgrad ? max_exp_avg_sq_[k].data<double>() + a : nullptr, b - a,
                          options_, step_);
    }
  });
}

// ------------------------------------------------------------ clip_grad_norm

double clip_grad_norm(std::vector<Parameter>& params, double max_norm, double norm_type) {
  if (!(norm_type > 0)) {
    throw std::invalid_argument("clip_grad_norm: norm_type = " + std::to_string(norm_type) +
                                " must be positive");
  }
  // Checked before the threads start: nothing may throw inside their region.
  for (std::size_t k = 0; k < params.size(); ++k) {
    const Tensor& g = params[k].grad;
    if (g.defined() && g.dtype() != DType::f32 && g.dtype() != DType::f64) {
      throw std::invalid_argument("clip_grad_norm: the gradient of parameter " + std::to_string(k) +
                                  " (" + params[k].name + ") is " + dtype_name(g.dtype()) +
                                  ", not float32 or float64");
    }
  }
  const bool inf = std::isinf(norm_type);
  // Accumulated in double, each chunk in order and then the chunks' sums in
  // order: the same bits on any number of threads. torch takes the norm of
  // the per-tensor norms, which is the same quantity.
  const Chunks chunks = chunks_of(params);
  std::vector<double> sums(chunks.list.size(), 0.0);
  auto reduce = [&](const auto* g, int64_t n) {
    double acc = 0.0;
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
    return acc;
  };
  for_chunks(chunks, [&](std::size_t k, int64_t a, int64_t b, int64_t c) {
    const Tensor& grad = params[k].grad;
    sums[static_cast<std::size_t>(c)] = grad.dtype() == DType::f32
                                            ? reduce(grad.data<float>() + a, b - a)
                                            : reduce(grad.data<double>() + a, b - a);
  });
  double acc = 0.0;
  for (double v : sums) acc = inf ? std::max(acc, v) : acc + v;
  const double total = inf ? acc : std::pow(acc, 1.0 / norm_type);
  const double coef = std::min(1.0, max_norm / (total + 1e-6));
  if (coef < 1.0) {
    for_chunks(chunks, [&](std::size_t k, int64_t a, int64_t b, int64_t) {
      Tensor& grad = params[k].grad;
      if (grad.dtype() == DType::f32) {
        float* g = grad.data<float>();
        for (int64_t i = a; i < b; ++i) g[i] *= static_cast<float>(coef);
      } else {
        double* g = grad.data<double>();
        for (int64_t i = a; i < b; ++i) g[i] *= coef;
      }
    });
  }
  return total;
}

std::string non_finite_grad(const std::vector<Parameter>& params) {
  // A value is not finite where its exponent bits are all ones: tested on the
  // bits without a branch, so the loop vectorises (a scalar isfinite loop
  // with an exit per element took 0.14 ms a step of the main job, as long
  // as Adam).
  const auto any_non_finite = [](const auto* bits, int64_t n, auto exponent) {
    using U = std::remove_cv_t<std::remove_pointer_t<decltype(bits)>>;
    U bad = 0;  // all ones once a lane met one
    for (int64_t i = 0; i < n; ++i) bad |= (bits[i] & exponent) == exponent ? ~U{0} : U{0};
    return bad != 0;
  };
  for (const Parameter& p : params) {
    if (!p.grad.defined()) continue;
    const int64_t n = p.grad.numel();
    bool bad = false;
    if (p.grad.dtype() == DType::f32) {
      bad =
          any_non_finite(static_cast<const uint32_t*>(p.grad.raw_data()), n, uint32_t{0x7f800000});
    } else if (p.grad.dtype() == DType::f64) {
      bad = any_non_finite(static_cast<const uint64_t*>(p.grad.raw_data()), n,
                           uint64_t{0x7ff0000000000000});
    }
    if (bad) return p.name;
  }
  return "";
}

}  // namespace seqpack
