// Rows of a matrix in the form an engine's products read them (bf16 bits),
// kept by the time loop: the steps' A rows (h_prev forward, dG backward) and
// the matrices the whole-batch products read again (dW_hh = dGᵀ·H_prev, dW_ih
// and dX from dG). The engine names the form a product reads
// (GemmEngine::product_form, step_form); the time loop makes the rows in that
// form, the gate kernels write them beside their fp32 values while they are
// in a register (sink(), cpu/row_sink.h) or put() converts fp32 rows, and the
// products read them where they are given (GemmOperand::kept, step()'s rows)
// instead of converting their operands again.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cpu/row_sink.h"
#include "seqpack/tensor.h"

namespace seqpack::cpu {

class OperandRows {
 public:
  // [rows, cols] in `form`, or null where the form is none (the products
  // read the fp32 rows).
  static std::unique_ptr<OperandRows> make(SinkElement form, int64_t rows, int64_t cols);

  SinkElement form() const { return form_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }

  // Where the gate kernels write the rows (row stride cols()). From this call
  // on, the caller writes each row through it, or by put(), before a product
  // reads it.
  RowSink sink();

  // Rows [r, r + m) = a[:m] (row stride lda), in the form.
  void put(int64_t r, const float* a, int64_t lda, int64_t m);
  // float64 has no operand form (its engine reads rows as they are): the
  // time loop's float64 instantiation compiles, and never calls it.
  void put(int64_t r, const double* a, int64_t lda, int64_t m);

  // Rows [r, r + m) for a product: written through the sink, or every one of
  // them by put() (else std::logic_error: a product never reads rows nobody
  // wrote).
  const uint16_t* bf16_rows(int64_t r, int64_t m) const;

 private:
  uint16_t* row(int64_t r) const;

  SinkElement form_ = SinkElement::none;
  int64_t rows_ = 0, cols_ = 0;
  Tensor storage_;          // pooled (a fresh block per call would fault its pages in)
  std::vector<char> have_;  // per row: put() wrote it
  bool sunk_ = false;       // sink() handed out: the caller writes every row
};

}  // namespace seqpack::cpu
