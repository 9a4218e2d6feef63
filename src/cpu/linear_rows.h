// A linear layer's forward, y = x·Wᵀ + b, row by row in a fixed order of
// summation, for inference heads whose output must not depend on the batch:
// a BLAS sgemm picks its blocking (and so the order in which it adds the
// products of a dot product) by the number of rows, so a row's logits can
// differ in the last bit between a batch of 1 and a batch of 64.
//
// Here every output is
//   y[i][j] = b[j] + reduce(acc),  acc[l] = Σ_{k ≡ l mod 8} x[i][k]·W[j][k]
// accumulated in k order per lane, the 8 lanes added as a fixed tree, the
// same for every row whatever n is. The lanes are independent, so the
// compiler vectorizes them without reassociating anything.
#pragma once

#include <cstdint>

namespace seqpack::cpu {

// x [n, in] (row stride in), w [out, in], b [out] or null, y [n, out].
template <typename T>
void linear_rows_fixed_order(const T* x, const T* w, const T* b, int64_t n, int64_t in,
                             int64_t out, T* y) {
  constexpr int64_t kLanes = 8;
  const int64_t in8 = in / kLanes * kLanes;
  for (int64_t i = 0; i < n; ++i) {
    const T* xi = x + i * in;
    for (int64_t j = 0; j < out; ++j) {
      const T* wj = w + j * in;
      T acc[kLanes] = {};
      for (int64_t k = 0; k < in8; k += kLanes) {
        for (int64_t l = 0; l < kLanes; ++l) acc[l] += xi[k + l] * wj[k + l];
      }
      for (int64_t k = in8; k < in; ++k) acc[k - in8] += xi[k] * wj[k];
      const T sum = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
      y[i * out + j] = b ? sum + b[j] : sum;
    }
  }
}

}  // namespace seqpack::cpu
