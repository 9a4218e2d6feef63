#include "seqpack/nn.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "cpu/gemm.h"

namespace seqpack {

namespace {

void require_float(const Tensor& t, const char* who, const char* what) {
  if (!t.defined()) throw std::invalid_argument(std::string(who) + ": " + what + " is undefined");
  if (t.dtype() == DType::i64) {
    throw std::invalid_argument(std::string(who) + ": " + what + " must be float32 or float64, got int64");
  }
}

// Constructor arguments shared by the modules: sizes and the parameter dtype.
void require_positive(int64_t v, const char* who, const char* what) {
  if (v <= 0) {
    throw std::invalid_argument(std::string(who) + ": " + what + " = " + std::to_string(v) +
                                " must be positive");
  }
}

// A parameter's shape, checked (int64 overflow, kMaxTensorBytes) before any
// allocation, with the module and its sizes in the message.
void require_allocatable(const Shape& shape, DType dtype, const char* who,
                         const std::string& sizes) {
  try {
    shape_nbytes(shape, dtype);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string(who) + ": " + sizes + ": " + e.what());
  }
}

void require_float_dtype(DType dtype, const char* who) {
  if (dtype == DType::i64) throw std::invalid_argument(std::string(who) + ": dtype must be float32 or float64");
}

void require_same(const Tensor& a, const Tensor& b, const char* who, const char* what) {
  if (a.dtype() != b.dtype()) {
    throw std::invalid_argument(std::string(who) + ": " + what + " has dtype " +
                                dtype_name(a.dtype()) + ", expected " + dtype_name(b.dtype()));
  }
}

// Fills `t` from U(-bound, bound) drawn in double and rounded to t's dtype, so
// f32 and f64 modules built from one seed hold the same values up to rounding.
void fill_uniform(Tensor& t, double bound, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> dist(-bound, bound);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (t.dtype() == DType::f32) {
      t.data<float>()[i] = static_cast<float>(dist(rng));
    } else {
      t.data<double>()[i] = dist(rng);
    }
  }
}

}  // namespace

// ---------------------------------------------------------------- Embedding

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim,
                     std::optional<int64_t> padding_idx, DType dtype, uint64_t seed) {
  require_positive(num_embeddings, "Embedding", "num_embeddings");
  require_positive(embedding_dim, "Embedding", "embedding_dim");
  require_float_dtype(dtype, "Embedding");
  if (padding_idx) {
    // torch accepts a negative padding_idx counting from the end.
    int64_t p = *padding_idx;
    if (p < -num_embeddings || p >= num_embeddings) {
      throw std::invalid_argument("Embedding: padding_idx = " + std::to_string(p) +
                                  " is outside [-" + std::to_string(num_embeddings) + ", " +
                                  std::to_string(num_embeddings) + ")");
    }
    if (p < 0) p += num_embeddings;
    padding_idx_ = p;
  }
  require_allocatable({num_embeddings, embedding_dim}, dtype, "Embedding",
                      "num_embeddings = " + std::to_string(num_embeddings) +
                          ", embedding_dim = " + std::to_string(embedding_dim));
  weight_ = Tensor::empty({num_embeddings, embedding_dim}, dtype);
  grad_ = Tensor::zeros({num_embeddings, embedding_dim}, dtype);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int64_t i = 0; i < weight_.numel(); ++i) {
    const double v = normal(rng);
    if (dtype == DType::f32) {
      weight_.data<float>()[i] = static_cast<float>(v);
    } else {
      weight_.data<double>()[i] = v;
    }
  }
  if (padding_idx_) weight_.select0(*padding_idx_).fill(0.0);
}

template <typename T>
static void embedding_gather(const Tensor& weight, const int64_t* idx, int64_t n, T* out) {
  const int64_t d = weight.size(1);
  const T* w = weight.data<T>();
  for (int64_t i = 0; i < n; ++i) {
    const T* row = w + idx[i] * d;
    for (int64_t j = 0; j < d; ++j) out[i * d + j] = row[j];
  }
}

Tensor Embedding::forward(const Tensor& indices) {
  if (!indices.defined() || indices.dtype() != DType::i64) {
    throw std::invalid_argument("Embedding: indices must be an int64 tensor");
  }
  const int64_t v = num_embeddings();
  const int64_t* idx = indices.data<int64_t>();
  for (int64_t i = 0; i < indices.numel(); ++i) {
    if (idx[i] < 0 || idx[i] >= v) {
      throw std::invalid_argument("Embedding: indices[" + std::to_string(i) + "] = " +
                                  std::to_string(idx[i]) + " is outside [0, " +
                                  std::to_string(v) + ")");
    }
  }
  Shape shape = indices.shape();
  shape.push_back(embedding_dim());
  Tensor out = Tensor::empty(shape, weight_.dtype());
  if (weight_.dtype() == DType::f32) {
    embedding_gather<float>(weight_, idx, indices.numel(), out.data<float>());
  } else {
    embedding_gather<double>(weight_, idx, indices.numel(), out.data<double>());
  }
  last_indices_ = indices;
  return out;
}

template <typename T>
static void embedding_scatter(const int64_t* idx, int64_t n, int64_t d, int64_t pad,
                              const T* g, T* gw) {
  for (int64_t i = 0; i < n; ++i) {
    if (idx[i] == pad) continue;
    T* row = gw + idx[i] * d;
    for (int64_t j = 0; j < d; ++j) row[j] += g[i * d + j];
  }
}

void Embedding::backward(const Tensor& grad_output) {
  if (!last_indices_.defined()) throw std::logic_error("Embedding::backward called before forward");
  require_float(grad_output, "Embedding::backward", "grad_output");
  require_same(grad_output, weight_, "Embedding::backward", "grad_output");
  if (grad_output.numel() != last_indices_.numel() * embedding_dim()) {
    throw std::invalid_argument("Embedding::backward: grad_output has shape " +
                                shape_str(grad_output.shape()) + ", expected " +
                                shape_str(last_indices_.shape()) + " + [" +
                                std::to_string(embedding_dim()) + "]");
  }
  const int64_t pad = padding_idx_.value_or(-1);
  if (weight_.dtype() == DType::f32) {
    embedding_scatter<float>(last_indices_.data<int64_t>(), last_indices_.numel(),
                             embedding_dim(), pad, grad_output.data<float>(), grad_.data<float>());
  } else {
    embedding_scatter<double>(last_indices_.data<int64_t>(), last_indices_.numel(),
                              embedding_dim(), pad, grad_output.data<double>(),
                              grad_.data<double>());
  }
}

std::vector<Parameter> Embedding::parameters(const std::string& prefix) {
  return {{prefix + "weight", weight_, grad_}};
}

void Embedding::zero_grad() { grad_.fill(0.0); }

// ------------------------------------------------------------------- Linear

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, DType dtype, uint64_t seed) {
  require_positive(in_features, "Linear", "in_features");
  require_positive(out_features, "Linear", "out_features");
  require_float_dtype(dtype, "Linear");
  require_allocatable({out_features, in_features}, dtype, "Linear",
                      "in_features = " + std::to_string(in_features) +
                          ", out_features = " + std::to_string(out_features));
  std::mt19937_64 rng(seed);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  weight_ = Tensor::empty({out_features, in_features}, dtype);
  weight_grad_ = Tensor::zeros({out_features, in_features}, dtype);
  fill_uniform(weight_, bound, rng);
  if (bias) {
    bias_ = Tensor::empty({out_features}, dtype);
    bias_grad_ = Tensor::zeros({out_features}, dtype);
    fill_uniform(bias_, bound, rng);
  }
}

template <typename T>
static void linear_forward(const T* x, const T* w, const T* b, int64_t n, int64_t in, int64_t out,
                           T* y, cpu::IsaLevel cap) {
  cpu::gemm<T>(false, true, n, out, in, T(1), x, in, w, in, T(0), y, out, cap);
  if (b) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < out; ++j) y[i * out + j] += b[j];
  }
}

Tensor Linear::forward(const Tensor& input) {
  require_float(input, "Linear", "input");
  require_same(input, weight_, "Linear", "input");
  if (input.dim() < 1 || input.size(-1) != in_features()) {
    throw std::invalid_argument("Linear: input has shape " + shape_str(input.shape()) +
                                ", expected last dimension " + std::to_string(in_features()));
  }
  const int64_t n = input.numel() / in_features();
  Shape shape = input.shape();
  shape.back() = out_features();
  Tensor out = Tensor::empty(shape, weight_.dtype());
  if (weight_.dtype() == DType::f32) {
    linear_forward<float>(input.data<float>(), weight_.data<float>(),
                          bias_.defined() ? bias_.data<float>() : nullptr, n, in_features(),
                          out_features(), out.data<float>(), kernels_.isa_cap);
  } else {
    linear_forward<double>(input.data<double>(), weight_.data<double>(),
                           bias_.defined() ? bias_.data<double>() : nullptr, n, in_features(),
                           out_features(), out.data<double>(), kernels_.isa_cap);
  }
  last_input_ = input;
  return out;
}

template <typename T>
static void linear_backward(const T* x, const T* w, const T* gy, int64_t n, int64_t in, int64_t out,
                            T* gx, T* gw, T* gb, cpu::IsaLevel cap) {
  // dx = dy W;  dW += dy^T x;  db += sum over rows of dy.
  cpu::gemm<T>(false, false, n, in, out, T(1), gy, out, w, in, T(0), gx, in, cap);
  cpu::gemm<T>(true, false, out, in, n, T(1), gy, out, x, in, T(1), gw, in, cap);
  if (gb) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < out; ++j) gb[j] += gy[i * out + j];
  }
}

Tensor Linear::backward(const Tensor& grad_output) {
  if (!last_input_.defined()) throw std::logic_error("Linear::backward called before forward");
  require_float(grad_output, "Linear::backward", "grad_output");
  require_same(grad_output, weight_, "Linear::backward", "grad_output");
  Shape expected = last_input_.shape();
  expected.back() = out_features();
  if (grad_output.shape() != expected) {
    throw std::invalid_argument("Linear::backward: grad_output has shape " +
                                shape_str(grad_output.shape()) + ", expected " +
                                shape_str(expected));
  }
  const int64_t n = last_input_.numel() / in_features();
  Tensor gx = Tensor::empty(last_input_.shape(), weight_.dtype());
  if (weight_.dtype() == DType::f32) {
    linear_backward<float>(
        last_input_.data<float>(), weight_.data<float>(), grad_output.data<float>(), n,
        in_features(), out_features(), gx.data<float>(), weight_grad_.data<float>(),
        bias_grad_.defined() ? bias_grad_.data<float>() : nullptr, kernels_.isa_cap);
  } else {
    linear_backward<double>(
        last_input_.data<double>(), weight_.data<double>(), grad_output.data<double>(), n,
        in_features(), out_features(), gx.data<double>(), weight_grad_.data<double>(),
        bias_grad_.defined() ? bias_grad_.data<double>() : nullptr, kernels_.isa_cap);
  }
  return gx;
}

std::vector<Parameter> Linear::parameters(const std::string& prefix) {
  std::vector<Parameter> ps = {{prefix + "weight", weight_, weight_grad_}};
  if (bias_.defined()) ps.push_back({prefix + "bias", bias_, bias_grad_});
  return ps;
}

void Linear::zero_grad() {
  weight_grad_.fill(0.0);
  if (bias_grad_.defined()) bias_grad_.fill(0.0);
}

// ------------------------------------------------------------------ Dropout

Dropout::Dropout(double p, uint64_t seed) : p_(p), rng_(seed) {
  if (!(p >= 0.0 && p <= 1.0)) {
    throw std::invalid_argument("Dropout: p = " + std::to_string(p) +
                                " must be between 0 and 1");
  }
}

template <typename T>
static Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty(a.shape(), a.dtype());
  const T* x = a.data<T>();
  const T* y = b.data<T>();
  T* o = out.data<T>();
  for (int64_t i = 0; i < a.numel(); ++i) o[i] = x[i] * y[i];
  return out;
}

static Tensor mul_any(const Tensor& a, const Tensor& b) {
  return a.dtype() == DType::f32 ? mul<float>(a, b) : mul<double>(a, b);
}

Tensor Dropout::forward(const Tensor& input) {
  require_float(input, "Dropout", "input");
  if (!training_ || p_ == 0.0) {
    scale_ = Tensor();
    return input;
  }
  // p = 1 drops everything (torch returns zeros rather than dividing by zero).
  const double keep_scale = p_ == 1.0 ? 0.0 : 1.0 / (1.0 - p_);
  std::bernoulli_distribution keep(1.0 - p_);
  Tensor scale = Tensor::empty(input.shape(), input.dtype());
  for (int64_t i = 0; i < scale.numel(); ++i) {
    const double s = keep(rng_) ? keep_scale : 0.0;
    if (scale.dtype() == DType::f32) {
      scale.data<float>()[i] = static_cast<float>(s);
    } else {
      scale.data<double>()[i] = s;
    }
  }
  scale_ = scale;
  return mul_any(input, scale_);
}

Tensor Dropout::forward_with_mask(const Tensor& input, const Tensor& mask) {
  require_float(input, "Dropout", "input");
  if (!mask.defined() || mask.shape() != input.shape()) {
    throw std::invalid_argument("Dropout: mask has shape " +
                                (mask.defined() ? shape_str(mask.shape()) : "undefined") +
                                ", expected " + shape_str(input.shape()));
  }
  const double keep_scale = p_ == 1.0 ? 0.0 : 1.0 / (1.0 - p_);
  Tensor scale = Tensor::empty(input.shape(), input.dtype());
  for (int64_t i = 0; i < scale.numel(); ++i) {
    const double m = mask.item_as_double(i);
    if (m != 0.0 && m != 1.0) {
      throw std::invalid_argument("Dropout: mask[" + std::to_string(i) + "] = " +
                                  std::to_string(m) + " is neither 0 nor 1");
    }
    const double s = m * keep_scale;
    if (scale.dtype() == DType::f32) {
      scale.data<float>()[i] = static_cast<float>(s);
    } else {
      scale.data<double>()[i] = s;
    }
  }
  scale_ = scale;
  return mul_any(input, scale_);
}

Tensor Dropout::backward(const Tensor& grad_output) {
  if (!scale_.defined()) return grad_output;
  require_float(grad_output, "Dropout::backward", "grad_output");
  if (grad_output.shape() != scale_.shape() || grad_output.dtype() != scale_.dtype()) {
    throw std::invalid_argument("Dropout::backward: grad_output has shape " +
                                shape_str(grad_output.shape()) + ", expected " +
                                shape_str(scale_.shape()));
  }
  return mul_any(grad_output, scale_);
}

}  // namespace seqpack
