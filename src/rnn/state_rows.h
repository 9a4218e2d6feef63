// Row copies of the recurrent core: between a state tensor [L*D, B, W] in the
// caller's order and a direction's state buffer [B, W] in length-sorted order,
// and between strided blocks of rows.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "seqpack/tensor.h"

namespace seqpack::rnn {

template <typename T>
void copy_rows(T* dst, int64_t ld_dst, const T* src, int64_t ld_src, int64_t rows, int64_t cols) {
  if (ld_dst == cols && ld_src == cols) {
    std::memcpy(dst, src, static_cast<std::size_t>(rows * cols) * sizeof(T));
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + r * ld_dst, src + r * ld_src, static_cast<std::size_t>(cols) * sizeof(T));
  }
}

// state[j] = s[ld][sorted[j]] (sorted order), or zeros when s is undefined.
template <typename T>
void load_state(T* state, const Tensor& s, int64_t ld, const std::vector<int64_t>& sorted,
                int64_t width) {
  const int64_t B = static_cast<int64_t>(sorted.size());
  if (!s.defined()) {
    std::memset(state, 0, static_cast<std::size_t>(B * width) * sizeof(T));
    return;
  }
  const T* src = s.data<T>() + ld * B * width;
  for (int64_t j = 0; j < B; ++j) {
    std::memcpy(state + j * width, src + sorted[static_cast<std::size_t>(j)] * width,
                static_cast<std::size_t>(width) * sizeof(T));
  }
}

// s[ld][sorted[j]] = state[j].
template <typename T>
void store_state(Tensor& s, const T* state, int64_t ld, const std::vector<int64_t>& sorted,
                 int64_t width) {
  const int64_t B = static_cast<int64_t>(sorted.size());
  T* dst = s.data<T>() + ld * B * width;
  for (int64_t j = 0; j < B; ++j) {
    std::memcpy(dst + sorted[static_cast<std::size_t>(j)] * width, state + j * width,
                static_cast<std::size_t>(width) * sizeof(T));
  }
}

}  // namespace seqpack::rnn
