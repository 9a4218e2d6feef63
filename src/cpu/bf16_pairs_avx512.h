// AVX-512 pieces shared by the writers and readers of bf16 weights in pairs
// of rows (oneDNN's 16a<N>b2a layouts, cpu/bf16_blocked.h; the few-row
// products, cpu/gemm_bf16_rows.h). Every function is compiled for
// AVX512-BF16 only: callers check cpu_converts_bf16() first.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "cpu/transpose_avx512.h"

#define SEQPACK_BF16_PAIRS_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))

namespace seqpack::cpu::bf16_pairs {

// The first `count` of 16 lanes (count clamped to [0, 16]).
inline __mmask16 first_lanes(int64_t count) {
  return static_cast<__mmask16>((1u << std::clamp<int64_t>(count, 0, 16)) - 1u);
}

// Lane 2t takes the first register's 16-bit value t, lane 2t + 1 the second's.
alignas(64) inline constexpr uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                         21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                         11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

// lo's 16 values then hi's, rounded to bf16 (vcvtne2ps2bf16: bf16_of's bits).
SEQPACK_BF16_PAIRS_TARGET inline __m512i rounded(__m512 lo, __m512 hi) {
  const __m512bh h = _mm512_cvtne2ps_pbh(hi, lo);
  return reinterpret_cast<const __m512i&>(h);
}

// Columns [j, j + 16) (those of `cols`) of rows i and i + 1 of src [k, n]
// (row stride ld), rounded and interleaved: lane 2t row i's column j + t,
// lane 2t + 1 row i + 1's; zero past k and outside cols.
SEQPACK_BF16_PAIRS_TARGET inline __m512i row_pair(const float* src, int64_t ld, int64_t k,
                                                  int64_t i, int64_t j, __mmask16 cols) {
  const float* lo_row = src + i * ld + j;
  const __m512 lo = i < k && cols ? _mm512_maskz_loadu_ps(cols, lo_row) : _mm512_setzero_ps();
  const __m512 hi =
      i + 1 < k && cols ? _mm512_maskz_loadu_ps(cols, lo_row + ld) : _mm512_setzero_ps();
  return _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), rounded(lo, hi));
}

// 32 values from k0 of 16 stored rows (row j0 + t of src, row stride ld;
// rows outside `rows` and values past k zero) rounded, then transposed:
// r[q], lane t = row j0 + t's values k0 + 2q and k0 + 2q + 1, the pair q of
// 16 columns of op(src) = srcᵀ.
SEQPACK_BF16_PAIRS_TARGET inline void column_pairs(const float* src, int64_t ld, int64_t k,
                                                   int64_t j0, int64_t k0, __mmask16 rows,
                                                   __m512i r[16]) {
  const __mmask16 low = first_lanes(k - k0), high = first_lanes(k - k0 - 16);
  for (int t = 0; t < 16; ++t) {
    const float* row = src + (j0 + t) * ld + k0;
    const bool in = (rows >> t) & 1u;
    const __m512 lo = in && low ? _mm512_maskz_loadu_ps(low, row) : _mm512_setzero_ps();
    const __m512 hi = in && high ? _mm512_maskz_loadu_ps(high, row + 16) : _mm512_setzero_ps();
    r[t] = rounded(lo, hi);
  }
  transpose_16x16(r);
}

}  // namespace seqpack::cpu::bf16_pairs
