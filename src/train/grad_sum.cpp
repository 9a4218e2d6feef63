#include "train/grad_sum.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace seqpack::train {

namespace {

constexpr int64_t kChunk = 1 << 14;

template <typename T>
void add_range(Tensor& dst, const Tensor& src, int64_t a, int64_t b) {
  T* d = dst.data<T>();
  const T* s = src.data<T>();
  for (int64_t i = a; i < b; ++i) d[i] += s[i];
}

struct Chunk {
  std::size_t k;
  int64_t a, b;
};

}  // namespace

void add_grads(std::vector<Tensor>& dst, const std::vector<Tensor>& src) {
  if (dst.size() != src.size()) {
    throw std::logic_error("add_grads: " + std::to_string(src.size()) + " gradients for " +
                           std::to_string(dst.size()) + " tensors");
  }
  std::vector<Chunk> chunks;
  for (std::size_t k = 0; k < dst.size(); ++k) {
    if (dst[k].numel() != src[k].numel() || dst[k].dtype() != src[k].dtype()) {
      throw std::logic_error("add_grads: gradient " + std::to_string(k) +
                             " does not match its tensor");
    }
    const int64_t n = dst[k].numel();
    for (int64_t a = 0; a < n; a += kChunk) chunks.push_back({k, a, std::min(n, a + kChunk)});
  }
  const auto count = static_cast<int64_t>(chunks.size());
  const bool parallel = count >= 2 && omp_get_max_threads() > 1 && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t c = 0; c < count; ++c) {
    const Chunk& ch = chunks[static_cast<std::size_t>(c)];
    if (dst[ch.k].dtype() == DType::f32) {
      add_range<float>(dst[ch.k], src[ch.k], ch.a, ch.b);
    } else {
      add_range<double>(dst[ch.k], src[ch.k], ch.a, ch.b);
    }
  }
}

}  // namespace seqpack::train
