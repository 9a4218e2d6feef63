// The per-ISA pieces behind cpu/gemm_int8.h, one source each (their ISA by
// function attributes, so the library loads on any x86-64 CPU), called by
// gemm_int8.cpp only after its run-time checks:
//   gemm_int8_avx512vnni.cpp: the VNNI and AMX products, AVX-512 quantization;
//   gemm_int8_avx2.cpp: the AVX2 product and quantization;
//   gemm_int8.cpp: the scalar ones (the reference the others equal), the
//     kernel choice and the weights' quantization.
#pragma once

#include <cstdint>

#include "cpu/gemm_int8.h"

namespace seqpack::cpu::int8_impl {

// What gemm_u8s8_f32 hands a kernel: rows [a_row0, a_row0 + m) of a, the
// columns [col0, col1) of b (col1 <= b.n, col0 < col1).
struct Product {
  int64_t m;
  const QuantizedRows& a;
  int64_t a_row0;
  const QuantizedWeights& b;
  int64_t col0, col1;
  float beta;
  float* c;
  int64_t ldc;
  const float* const* init;
  const float* c_row;
};

// What a register block's epilogue reads: its rows' scales and zero points
// (row 0 of the block first), the columns' scales and weight sums from column
// j0 (a group's first), the range [col0, col1) it may write, and C's row 0 of
// the block at column 0.
struct Epilogue {
  const float* sa;
  const int32_t* za;
  const float* sb;
  const int32_t* wsum;
  int64_t j0, col0, col1;
  float beta;
  float* c;
  int64_t ldc;
  const float* const* init;
  const float* c_row;
};

// The epilogue of the block of p's rows from i (row a_row0 + i of a) and
// columns from group g.
inline Epilogue block_epilogue(const Product& p, int64_t i, int64_t g) {
  const int64_t r = p.a_row0 + i;
  return {p.a.scale.data() + r, p.a.zp.data() + r, p.b.scale.data() + g * 16,
          p.b.sum.data() + g * 16, g * 16, p.col0, p.col1, p.beta, p.c + i * p.ldc, p.ldc,
          p.init ? p.init + i : nullptr, p.c_row};
}

// Row x (k values) quantized over `levels` levels into q (ld bytes, the
// ones past k zero), its scale and zero point: the bits of
// quantize_row_scalar on every ISA.
void quantize_row_scalar(const float* x, int64_t k, int levels, uint8_t* q, int64_t ld,
                         float* scale, int32_t* zp);
void quantize_row_avx512(const float* x, int64_t k, int levels, uint8_t* q, int64_t ld,
                         float* scale, int32_t* zp);
void quantize_row_avx2(const float* x, int64_t k, int levels, uint8_t* q, int64_t ld,
                       float* scale, int32_t* zp);

// Column w (k contiguous values) quantized into its lane of a 16-column group
// (col: the lane's first byte, rows of 64 bytes), its scale and Σ q.
void quantize_column_avx512(const float* w, int64_t k, int64_t k4, int8_t* col, float* scale,
                            int32_t* sum);

void gemm_scalar(const Product& p);
void gemm_vnni(const Product& p);
void gemm_amx(const Product& p);
void gemm_avx2(const Product& p);

// The AMX-INT8 instructions in the CPU and the tile data granted by Linux.
bool amx_int8_usable();

}  // namespace seqpack::cpu::int8_impl
