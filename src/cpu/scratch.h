// Scratch<T>: the per-call workspaces of the recurrent core (recurrent states,
// GRU's hidden-side gates, packed weights), a zero-filled array like
// std::vector<T> but with its storage from the buffer pool (buffer_pool.h).
// Allocated and freed on every call as std::vector, a workspace of a few
// hundred KB was faulted in page by page and trimmed back to the OS each time:
// about 7% of a gru-chars forward in the kernel (perf). From the pool, a
// steady loop reuses the same pages.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cpu/buffer_pool.h"
#include "seqpack/tensor.h"

namespace seqpack::cpu {

template <typename T>
class Scratch {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "Scratch holds float or double");

 public:
  Scratch() = default;
  // Move-only: a copy would share the block (std::vector copies its elements).
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Scratch(Scratch&&) noexcept = default;
  Scratch& operator=(Scratch&&) noexcept = default;

  // n zeros (what std::vector<T>::resize gives an empty vector); the previous
  // contents are dropped.
  void resize(std::size_t n) {
    resize_for_overwrite(n);
    std::fill_n(data_, n, T(0));
  }
  // n elements of unspecified value (a recycled block's old contents): for a
  // workspace every element of which is written before it is read, where the
  // zero-fill would be a pass over it for nothing (the main job's backward
  // zero-filled 512 KB of dG rows per direction and batch that way).
  void resize_for_overwrite(std::size_t n) {
    size_ = n;
    if (n == 0) {
      storage_ = Tensor();
      data_ = nullptr;
      return;
    }
    storage_ = pooled_empty({static_cast<int64_t>(n)},
                            std::is_same_v<T, float> ? DType::f32 : DType::f64);
    data_ = storage_.data<T>();
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }

 private:
  Tensor storage_;  // keeps the pooled block; returns it to the pool when dropped
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace seqpack::cpu
