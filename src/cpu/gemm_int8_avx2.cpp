// The int8 kernel of cpu/gemm_int8.h for AVX2 (every x86-64 CPU this project
// meets): rows quantized over 127 levels, the u8·s8 products as FBGEMM runs
// them on AVX2. vpmaddubsw multiplies 32 u8 by 32 s8 and sums adjacent pairs
// into 16 signed 16-bit lanes, saturating: with A in [0, 127] and B in
// [-127, 127] a pair is at most 2 · 127 · 127 = 32258, so nothing saturates;
// vpmaddwd by ones then sums adjacent 16-bit pairs into 32 bits, which is
// vpdpbusd's 4-product sum per lane on the weights' layout as it stands (a
// 16-column group's 64-byte row is two 8-lane vectors). Three instructions
// per 32 multiply-adds against VNNI's one per 64.
//
// Register block: MR <= 4 rows x 2 vectors of 8 columns (one group), 8 int32
// accumulators, 2 weight vectors, ones, a broadcast and a temporary: 13 of
// the 16 ymm registers.
//
// Compiled for AVX2 by function attributes and called only where
// avx2_int8_supported() says the CPU has it.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu/gemm_int8_kernels.h"

#define SEQPACK_AVX2 __attribute__((target("avx2,fma")))

namespace seqpack::cpu::int8_impl {

namespace {

constexpr int kMR = 4;

// The lanes of an 8-float vector from element i of n (all-ones lanes: taken).
SEQPACK_AVX2 inline __m256i tail_mask8(int64_t n, int64_t i) {
  const int64_t left = std::clamp<int64_t>(n - i, 0, 8);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// ±inf read as ±FLT_MAX; NaN is left as it is (vminps/vmaxps return their
// second operand when one is NaN).
SEQPACK_AVX2 inline __m256 clamp_finite(__m256 v) {
  const __m256 big = _mm256_set1_ps(std::numeric_limits<float>::max());
  return _mm256_max_ps(_mm256_min_ps(v, big), _mm256_sub_ps(_mm256_setzero_ps(), big));
}

SEQPACK_AVX2 inline float reduce_min(__m256 v) {
  __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_min_ps(m, _mm_movehl_ps(m, m));
  m = _mm_min_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
SEQPACK_AVX2 inline float reduce_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// Row i of vector v of a block from its exact int32 sums acc: gemm_scalar's
// operations, lane by lane.
SEQPACK_AVX2 __attribute__((always_inline)) inline void epilogue_row(const Epilogue& e, int v,
                                                                      int i, __m256i acc) {
  const int64_t j = e.j0 + v * 8;
  const int64_t lo = std::max<int64_t>(e.col0 - j, 0), hi = std::min<int64_t>(e.col1 - j, 8);
  if (hi <= lo) return;
  const bool whole = lo == 0 && hi == 8;
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i mask = _mm256_and_si256(
      _mm256_cmpgt_epi32(lanes, _mm256_set1_epi32(static_cast<int>(lo) - 1)),
      _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(hi)), lanes));
  const __m256i ws = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(e.wsum + v * 8));
  const __m256 sb = _mm256_loadu_ps(e.sb + v * 8);
  const __m256i t = _mm256_sub_epi32(acc, _mm256_mullo_epi32(_mm256_set1_epi32(e.za[i]), ws));
  const __m256 sab = _mm256_min_ps(_mm256_set1_ps(std::numeric_limits<float>::max()),
                                   _mm256_mul_ps(sb, _mm256_set1_ps(e.sa[i])));
  __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(t), sab);
  float* dst = e.c + i * e.ldc + j;
  const float* base = e.init ? e.init[i] + j : e.c_row ? e.c_row + j : dst;
  if (e.init || e.c_row || e.beta != 0.f) {
    const __m256 before = whole ? _mm256_loadu_ps(base) : _mm256_maskload_ps(base, mask);
    f = e.init || e.c_row ? _mm256_add_ps(before, f)
                          : _mm256_fmadd_ps(_mm256_set1_ps(e.beta), before, f);
  }
  if (whole) {
    _mm256_storeu_ps(dst, f);
  } else {
    _mm256_maskstore_ps(dst, mask, f);
  }
}

// One register block of MR rows by one 16-column group, every loop unrolled
// so that the accumulators stay in registers.
template <int MR>
SEQPACK_AVX2 void block(int64_t k4, const uint8_t* a, int64_t lda, const int8_t* b,
                        const Epilogue& e) {
  __m256i acc[MR][2];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t kk = 0; kk < k4; ++kk) {
    const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b + kk * 64));
    const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b + kk * 64 + 32));
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      int32_t four;
      std::memcpy(&four, a + i * lda + kk * 4, sizeof four);
      const __m256i av = _mm256_set1_epi32(four);
      acc[i][0] = _mm256_add_epi32(
          acc[i][0], _mm256_madd_epi16(_mm256_maddubs_epi16(av, w0), ones));
      acc[i][1] = _mm256_add_epi32(
          acc[i][1], _mm256_madd_epi16(_mm256_maddubs_epi16(av, w1), ones));
    }
  }
#pragma GCC unroll 2
  for (int v = 0; v < 2; ++v)
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) epilogue_row(e, v, i, acc[i][v]);
}

using BlockFn = void (*)(int64_t, const uint8_t*, int64_t, const int8_t*, const Epilogue&);
constexpr BlockFn kBlocks[kMR + 1] = {nullptr, block<1>, block<2>, block<3>, block<4>};

}  // namespace

SEQPACK_AVX2 void quantize_row_avx2(const float* x, int64_t k, int levels, uint8_t* q,
                                    int64_t ld, float* scale, int32_t* zp) {
  __m256 vmin = _mm256_setzero_ps(), vmax = _mm256_setzero_ps();
  __m256 bad = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; i += 8) {
    const __m256i m = tail_mask8(k, i);
    const __m256 v = _mm256_maskload_ps(x + i, m);  // masked-off lanes read 0
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    vmin = _mm256_min_ps(vmin, clamp_finite(v));
    vmax = _mm256_max_ps(vmax, clamp_finite(v));
  }
  std::memset(q, 0, static_cast<std::size_t>(ld));
  if (_mm256_movemask_ps(bad)) {  // a NaN: the row's results are NaN, as fp32's
    *scale = std::numeric_limits<float>::quiet_NaN();
    *zp = 0;
    return;
  }
  const U8RowParams p = u8_row_params(reduce_min(vmin), reduce_max(vmax), levels);
  *scale = p.scale;
  *zp = p.zp;
  if (p.inv == 0.f) return;
  const __m256 vinv = _mm256_set1_ps(p.inv);
  const __m256i vz = _mm256_set1_epi32(p.zp), v0 = _mm256_setzero_si256(),
                vtop = _mm256_set1_epi32(levels);
  for (int64_t i = 0; i < k; i += 8) {
    const __m256i m = tail_mask8(k, i);
    const __m256 v = clamp_finite(_mm256_maskload_ps(x + i, m));
    __m256i t = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v, vinv)), vz);
    t = _mm256_min_epi32(_mm256_max_epi32(t, v0), vtop);
    // 8 int32 in [0, 255] to 8 bytes: pack to 16 bits (per 128-bit lane),
    // then to 8, then take bytes 0-3 of each lane.
    const __m256i w = _mm256_packus_epi32(t, t);
    const __m256i bytes = _mm256_packus_epi16(w, w);
    alignas(32) uint8_t out[32];
    _mm256_store_si256(reinterpret_cast<__m256i*>(out), bytes);
    const int64_t n = std::min<int64_t>(8, k - i);
    for (int64_t l = 0; l < n; ++l) q[i + l] = out[l < 4 ? l : l + 12];
  }
}

void gemm_avx2(const Product& p) {
  const QuantizedRows& a = p.a;
  const QuantizedWeights& b = p.b;
  const int64_t g0 = p.col0 / 16, g1 = (p.col1 + 15) / 16, gstride = b.k4p * 64;
  for (int64_t g = g0; g < g1; ++g) {
    const int8_t* bp = b.packed.data() + g * gstride;
    for (int64_t i = 0; i < p.m; i += kMR) {
      const int mr = static_cast<int>(std::min<int64_t>(kMR, p.m - i));
      const int64_t r = p.a_row0 + i;
      const Epilogue e = block_epilogue(p, i, g);
      kBlocks[mr](b.k4, a.q.data() + r * a.ld, a.ld, bp, e);
    }
  }
}

}  // namespace seqpack::cpu::int8_impl
