#include "cpu/operand_rows.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "cpu/buffer_pool.h"
#include "cpu/gemm_engine.h"

namespace seqpack::cpu {

std::unique_ptr<OperandRows> OperandRows::make(SinkElement form, int64_t rows, int64_t cols) {
  if (form == SinkElement::none) return nullptr;
  auto r = std::make_unique<OperandRows>();
  r->form_ = form;
  r->rows_ = rows;
  r->cols_ = cols;
  // bf16 pairs in f32 elements (Tensor has no 16-bit type).
  r->storage_ = pooled_empty({(rows * cols + 1) / 2}, DType::f32);
  r->have_.assign(static_cast<std::size_t>(rows), 0);
  return r;
}

uint16_t* OperandRows::row(int64_t r) const {
  return static_cast<uint16_t*>(const_cast<void*>(storage_.raw_data())) + r * cols_;
}

RowSink OperandRows::sink() {
  sunk_ = true;
  return RowSink::bf16(row(0), cols_);
}

void OperandRows::put(int64_t r, const float* a, int64_t lda, int64_t m) {
  if (r < 0 || r + m > rows_) {
    throw std::logic_error("operand rows [" + std::to_string(r) + ", " + std::to_string(r + m) +
                           ") outside the matrix's " + std::to_string(rows_));
  }
  for (int64_t i = 0; i < m; ++i) f32_to_bf16(a + i * lda, row(r + i), cols_);
  std::fill(have_.begin() + r, have_.begin() + r + m, char(1));
}

void OperandRows::put(int64_t, const double*, int64_t, int64_t) {
  throw std::logic_error("float64 rows have no operand form");
}

const uint16_t* OperandRows::bf16_rows(int64_t r, int64_t m) const {
  if (r < 0 || r + m > rows_ ||
      (!sunk_ &&
       std::find(have_.begin() + r, have_.begin() + r + m, char(0)) != have_.begin() + r + m)) {
    throw std::logic_error("a product read operand rows that were never written");
  }
  return row(r);
}

}  // namespace seqpack::cpu
