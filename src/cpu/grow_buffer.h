// GrowBuffer<T>: a buffer that only grows, without initialising what it
// adds, 64-byte aligned: the staging of operands rewritten at every product
// (the bf16 engine's converted rows, the int8 engine's quantized rows). A
// std::vector's resize() would zero-fill every time a whole-batch operand
// (thousands of rows) follows a step's (one step's rows) in the same buffer, a
// memset as large as the conversion itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace seqpack::cpu {

template <typename T>
class GrowBuffer {
 public:
  // At least n elements, of unspecified value where they were not written.
  T* resize(std::size_t n) {
    if (n > capacity_) {
      storage_ = std::make_unique_for_overwrite<T[]>(n + 64 / sizeof(T));
      const auto addr = reinterpret_cast<std::uintptr_t>(storage_.get());
      data_ = storage_.get() + ((64 - addr % 64) % 64) / sizeof(T);
      capacity_ = n;
    }
    return data_;
  }
  T* data() const { return data_; }

 private:
  std::unique_ptr<T[]> storage_;
  T* data_ = nullptr;
  std::size_t capacity_ = 0;
};

}  // namespace seqpack::cpu
