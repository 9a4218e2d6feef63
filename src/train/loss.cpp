#include "seqpack/loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace seqpack {

namespace {

template <typename T>
void softmax_rows(const T* x, int64_t n, int64_t c, T* p) {
  if (c == 0) return;  // rows without classes have no maximum to take
  for (int64_t i = 0; i < n; ++i) {
    const T* row = x + i * c;
    T* out = p + i * c;
    // Subtract the row maximum so exp never overflows.
    const T m = *std::max_element(row, row + c);
    T sum = 0;
    for (int64_t j = 0; j < c; ++j) {
      out[j] = std::exp(row[j] - m);
      sum += out[j];
    }
    for (int64_t j = 0; j < c; ++j) out[j] /= sum;
  }
}

void check_logits(const Tensor& logits, const char* who) {
  if (!logits.defined() || logits.dtype() == DType::i64) {
    throw std::invalid_argument(std::string(who) + ": logits must be a float32 or float64 tensor");
  }
  if (logits.dim() != 2) {
    throw std::invalid_argument(std::string(who) + ": logits have shape " +
                                shape_str(logits.shape()) + ", expected [N, C]");
  }
}

}  // namespace

Tensor softmax(const Tensor& logits) {
  check_logits(logits, "softmax");
  Tensor p = Tensor::empty(logits.shape(), logits.dtype());
  if (logits.dtype() == DType::f32) {
    softmax_rows<float>(logits.data<float>(), logits.size(0), logits.size(1), p.data<float>());
  } else {
    softmax_rows<double>(logits.data<double>(), logits.size(0), logits.size(1),
                         p.data<double>());
  }
  return p;
}

template <typename T>
static double cross_entropy(const T* x, const int64_t* y, int64_t n, int64_t c, int64_t ignore,
                            int64_t& kept) {
  double total = 0.0;
  kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (y[i] == ignore) continue;
    // -log softmax = logsumexp - x_y, computed from the shifted row for stability.
    const T* row = x + i * c;
    const double m = *std::max_element(row, row + c);
    double s = 0.0;
    for (int64_t j = 0; j < c; ++j) s += std::exp(static_cast<double>(row[j]) - m);
    total += m + std::log(s) - static_cast<double>(row[y[i]]);
    ++kept;
  }
  // 0 / 0 = NaN when everything is ignored, which is what torch returns.
  return total / static_cast<double>(kept);
}

double CrossEntropyLoss::forward(const Tensor& logits, const Tensor& targets) {
  check_logits(logits, "CrossEntropyLoss");
  if (!targets.defined() || targets.dtype() != DType::i64) {
    throw std::invalid_argument("CrossEntropyLoss: targets must be an int64 tensor");
  }
  const int64_t n = logits.size(0), c = logits.size(1);
  if (targets.dim() != 1 || targets.size(0) != n) {
    throw std::invalid_argument("CrossEntropyLoss: targets have shape " +
                                shape_str(targets.shape()) + ", expected [" + std::to_string(n) +
                                "] to match logits " + shape_str(logits.shape()));
  }
  const int64_t* y = targets.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (y[i] != ignore_index_ && (y[i] < 0 || y[i] >= c)) {
      throw std::invalid_argument("CrossEntropyLoss: targets[" + std::to_string(i) + "] = " +
                                  std::to_string(y[i]) + " is outside [0, " + std::to_string(c) +
                                  ")");
    }
  }
  probs_ = softmax(logits);
  targets_ = targets.clone();
  if (logits.dtype() == DType::f32) {
    return cross_entropy<float>(logits.data<float>(), y, n, c, ignore_index_, kept_);
  }
  return cross_entropy<double>(logits.data<double>(), y, n, c, ignore_index_, kept_);
}

template <typename T>
static void cross_entropy_backward(const T* p, const int64_t* y, int64_t n, int64_t c,
                                   int64_t ignore, double scale, T* g) {
  for (int64_t i = 0; i < n; ++i) {
    T* row = g + i * c;
    if (y[i] == ignore) {
      std::fill(row, row + c, T(0));
      continue;
    }
    for (int64_t j = 0; j < c; ++j) row[j] = static_cast<T>(p[i * c + j] * scale);
    row[y[i]] -= static_cast<T>(scale);
  }
}

Tensor CrossEntropyLoss::backward(double grad_loss) const {
  if (!probs_.defined()) throw std::logic_error("CrossEntropyLoss::backward called before forward");
  const int64_t n = probs_.size(0), c = probs_.size(1);
  Tensor g = Tensor::empty(probs_.shape(), probs_.dtype());
  // kept = 0 gives NaN gradients on no row at all (every row is ignored -> zeros).
  const double scale = kept_ > 0 ? grad_loss / static_cast<double>(kept_) : 0.0;
  if (probs_.dtype() == DType::f32) {
    cross_entropy_backward<float>(probs_.data<float>(), targets_.data<int64_t>(), n, c,
                                  ignore_index_, scale, g.data<float>());
  } else {
    cross_entropy_backward<double>(probs_.data<double>(), targets_.data<int64_t>(), n, c,
                                   ignore_index_, scale, g.data<double>());
  }
  return g;
}

}  // namespace seqpack
