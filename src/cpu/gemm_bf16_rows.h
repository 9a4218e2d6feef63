// bf16 products of a few rows (m <= kFewRows: a decoder's or a sampler's
// step, a batch of one) by a weight matrix on AVX512-BF16's dot products,
// with the bits of oneDNN's bf16 matmul: each output lane sums pair after
// pair of rows (vdpbf16ps) from zero within blocks of k (Bf16RowsB::k_block:
// oneDNN's, which the engine finds per shape), the blocks' sums added in
// order, then the bias or beta·C. The weights are
// read either in oneDNN's blocked layout (cpu/bf16_blocked.h, the one the
// engine lays out for its other products) or where they are in fp32,
// rounded as they are read: the same vectors reach the same chain either
// way. A call that meets its weights once (an optimizer step changes them
// before every call) then neither writes a layout nor reads one back:
// laying LSTM(500)'s four weight operands out took 290 us of a 700 us
// one-step training call at batch 1 (perf, Zen 5), the products 47.
// Products of more rows (up to the engine's 64) read their weights in place
// only: rounded once per panel of columns and block of k, for every row.
#pragma once

#include <cstdint>

#include "cpu/bf16_blocked.h"
#include "cpu/grow_buffer.h"
#include "cpu/isa_cap.h"

namespace seqpack::cpu {

constexpr int64_t kFewRows = 4;

// Whether the few-row products may run on `kernels`: native AVX512-BF16 dot
// products (not bf16's emulation, whose products are widened to fp32), no
// AMX (whose kernels sum in another order), under an ISA cap
// (cpu/isa_cap.h) that leaves AVX-512 on.
bool bf16_rows_available(const Kernels& kernels);

// op(B) [k, n] of a few-row product: fp32 W where it is (w, row stride ld;
// op(B) = Wᵀ where trans), or op(B) laid out as `blocking` says (laid); the
// values of k each partial sum covers (a multiple of 32).
struct Bf16RowsB {
  int64_t k = 0, n = 0, k_block = 512;
  const float* w = nullptr;
  int64_t ld = 0;
  bool trans = false;
  const uint16_t* laid = nullptr;
  PairBlocking blocking;
};

// A's m rows [m, k] (fp32 with row stride lda, or bf16 rows `a16` with row
// stride k where given) rounded to bf16 into buf, each padded with zeros to
// a whole number of 32 values: the A operand of bf16_rows_product.
const uint16_t* bf16_rows_operand(int64_t m, int64_t k, const float* a, int64_t lda,
                                  const uint16_t* a16, GrowBuffer<uint16_t>& buf);

// C[:m, j0:j1) = A·op(B)[:, j0:j1) (+ c_row[j0:j1) where given, else
// + beta·C), A from bf16_rows_operand, 1 <= m (at most kFewRows on laid-out
// weights); c points at column 0 of C. A column's bits depend on its own
// row and column only.
void bf16_rows_product(int64_t m, const uint16_t* a, const Bf16RowsB& b, int64_t j0, int64_t j1,
                       float beta, float* c, int64_t ldc, const float* c_row = nullptr);

}  // namespace seqpack::cpu
