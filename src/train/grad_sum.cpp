#include "train/grad_sum.h"

#include <cstdint>
#include <stdexcept>
#include <string>

#include "train/chunks.h"

namespace seqpack::train {

namespace {

template <typename T>
void add_range(Tensor& dst, const Tensor& src, int64_t a, int64_t b) {
  T* d = dst.data<T>();
  const T* s = src.data<T>();
  for (int64_t i = a; i < b; ++i) d[i] += s[i];
}

}  // namespace

void add_grads(std::vector<Tensor>& dst, const std::vector<Tensor>& src) {
  if (dst.size() != src.size()) {
    throw std::logic_error("add_grads: " + std::to_string(src.size()) + " gradients for " +
                           std::to_string(dst.size()) + " tensors");
  }
  std::vector<int64_t> sizes;
  for (std::size_t k = 0; k < dst.size(); ++k) {
    if (dst[k].numel() != src[k].numel() || dst[k].dtype() != src[k].dtype()) {
      throw std::logic_error("add_grads: gradient " + std::to_string(k) +
                             " does not match its tensor");
    }
    sizes.push_back(dst[k].numel());
  }
  for_chunks(chunks_of_sizes(sizes), [&](std::size_t k, int64_t a, int64_t b, int64_t) {
    if (dst[k].dtype() == DType::f32) {
      add_range<float>(dst[k], src[k], a, b);
    } else {
      add_range<double>(dst[k], src[k], a, b);
    }
  });
}

}  // namespace seqpack::train
