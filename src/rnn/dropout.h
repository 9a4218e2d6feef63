// Dropout between layers (RNNOptions::dropout, training only): a layer's
// input times a mask of 0 and 1/(1-p), drawn from the call's seed, one
// stream per layer; the forward keeps the mask for the backward, which
// multiplies the input gradient by it (rnn_core.cpp).
#pragma once

#include <cstdint>
#include <random>

#include "cpu/buffer_pool.h"
#include "seqpack/rnn.h"
#include "seqpack/tensor.h"

namespace seqpack::rnn {

template <typename T>
Tensor dropout_mask(int64_t rows, int64_t cols, double p, uint64_t seed, int64_t layer) {
  Tensor mask = cpu::pooled_empty({rows, cols}, dtype_of<T>());
  // One stream per layer so masks do not depend on the other layers' sizes.
  std::mt19937_64 gen(seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(layer));
  std::bernoulli_distribution keep(1.0 - p);
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  T* m = mask.data<T>();
  for (int64_t i = 0; i < mask.numel(); ++i) m[i] = keep(gen) ? scale : T(0);
  return mask;
}

// Layer l's input after inter-layer dropout (training, l > 0): x * mask, the
// mask holding 0 or 1/(1-p).
template <typename T>
Tensor dropped_input(const RNNOptions& o, const Tensor& in, int64_t l, bool training,
                     uint64_t seed, Tensor& mask) {
  if (l == 0 || !training || o.dropout <= 0) return in;
  const int64_t N = in.size(0), F = in.size(1);
  mask = dropout_mask<T>(N, F, o.dropout, seed, l);
  Tensor x = cpu::pooled_empty({N, F}, o.dtype);
  const T* a = in.data<T>();
  const T* m = mask.data<T>();
  T* y = x.data<T>();
  for (int64_t i = 0; i < N * F; ++i) y[i] = a[i] * m[i];
  return x;
}

}  // namespace seqpack::rnn
