// A 16 x 16 transpose of 32-bit values in AVX-512 registers, shared by the
// bf16 pair writers (cpu/bf16_pairs_avx512.h) and the few-row product that
// reads W's rows in place (cpu/gemm_small_f32_hwy.cpp). Compiled for
// AVX-512F: callers check the CPU first.
#pragma once

#include <immintrin.h>

namespace seqpack::cpu {

// Every lane: the masked forms of the shuffles below take their pass-through
// operand explicitly (the unmasked ones start from an undefined register,
// which GCC 12 reports as maybe uninitialized where they are inlined).
inline constexpr __mmask16 kAll16 = 0xFFFF;
inline constexpr __mmask8 kAll8 = 0xFF;

// r[i][j] -> r[j][i] for a 16 x 16 table of 32-bit values, one row a
// register: pairs of rows interleaved by 32 then 64 bits, then 128-bit lanes
// exchanged between the registers four rows apart.
__attribute__((target("avx512f"))) inline void transpose_16x16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_mask_unpacklo_epi32(r[2 * i], kAll16, r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_mask_unpackhi_epi32(r[2 * i], kAll16, r[2 * i], r[2 * i + 1]);
  }
  // u[4i + c], lane L: column 4L + c of rows 4i .. 4i + 3.
  for (int i = 0; i < 4; ++i) {
    u[4 * i] = _mm512_mask_unpacklo_epi64(t[4 * i], kAll8, t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_mask_unpackhi_epi64(t[4 * i], kAll8, t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_mask_unpacklo_epi64(t[4 * i + 1], kAll8, t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_mask_unpackhi_epi64(t[4 * i + 1], kAll8, t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i x0 = _mm512_mask_shuffle_i32x4(u[c], kAll16, u[c], u[4 + c], 0x44);
    const __m512i x1 = _mm512_mask_shuffle_i32x4(u[c], kAll16, u[c], u[4 + c], 0xEE);
    const __m512i x2 = _mm512_mask_shuffle_i32x4(u[8 + c], kAll16, u[8 + c], u[12 + c], 0x44);
    const __m512i x3 = _mm512_mask_shuffle_i32x4(u[8 + c], kAll16, u[8 + c], u[12 + c], 0xEE);
    r[c] = _mm512_mask_shuffle_i32x4(x0, kAll16, x0, x2, 0x88);
    r[4 + c] = _mm512_mask_shuffle_i32x4(x0, kAll16, x0, x2, 0xDD);
    r[8 + c] = _mm512_mask_shuffle_i32x4(x1, kAll16, x1, x3, 0x88);
    r[12 + c] = _mm512_mask_shuffle_i32x4(x1, kAll16, x1, x3, 0xDD);
  }
}

// The same for float values.
__attribute__((target("avx512f"))) inline void transpose_16x16(__m512 r[16]) {
  __m512i q[16];
  for (int i = 0; i < 16; ++i) q[i] = _mm512_castps_si512(r[i]);
  transpose_16x16(q);
  for (int i = 0; i < 16; ++i) r[i] = _mm512_castsi512_ps(q[i]);
}

}  // namespace seqpack::cpu
