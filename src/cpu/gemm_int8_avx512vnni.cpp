// The int8 kernels of cpu/gemm_int8.h for AVX512-VNNI: quantization of the
// rows and the weights, and the u8·s8 product with its dequantizing epilogue.
// Compiled for that target by function attributes and called only after the
// run-time check (int8_kernels_supported), so the library still loads and
// runs fp32 on CPUs without it.
//
// Register block: MR <= 6 rows x NV <= 4 vectors of 16 columns, 24 int32
// accumulators. Per 4 k it loads NV vectors of B (one 64-byte row of each
// 16-column group) and broadcasts 4 bytes of each row of A; each vpdpbusd
// adds 4 u8·s8 products per lane. The column groups are the outer loop, so a
// block's B (k * 64 bytes per group) stays in L1 while every row passes.

// GCC 12's AVX-512 headers build some intrinsics (cvtps_epi32, reduce_min)
// on _mm512_undefined_*(), which its -Wuninitialized reports at every use.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu/cpu_info.h"
#include "cpu/gemm_int8.h"
#include "cpu/isa_cap.h"

#define SEQPACK_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

namespace seqpack::cpu {

namespace {

constexpr int kMR = 6;  // rows of a register block
constexpr int kNV = 4;  // 16-column groups of a register block

// The lanes of a 16-float vector from element i of n: all, the first n - i, or none.
inline __mmask16 tail_mask(int64_t n, int64_t i) {
  const int64_t left = n - i;
  return left >= 16 ? __mmask16(0xFFFF) : left <= 0 ? __mmask16(0) : __mmask16((1u << left) - 1);
}

// ±inf read as ±FLT_MAX (u8_row_params); NaN is left as it is.
SEQPACK_VNNI inline __m512 clamp_finite(__m512 v) {
  const __m512 big = _mm512_set1_ps(std::numeric_limits<float>::max());
  return _mm512_max_ps(_mm512_min_ps(v, big), _mm512_sub_ps(_mm512_setzero_ps(), big));
}

SEQPACK_VNNI void quantize_row(const float* x, int64_t k, uint8_t* q, int64_t ld, float* scale,
                               int32_t* zp) {
  __m512 vmin = _mm512_setzero_ps(), vmax = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (int64_t i = 0; i < k; i += 16) {
    const __mmask16 m = tail_mask(k, i);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    bad |= _mm512_mask_cmp_ps_mask(m, v, v, _CMP_UNORD_Q);
    vmin = _mm512_min_ps(vmin, clamp_finite(v));
    vmax = _mm512_max_ps(vmax, clamp_finite(v));
  }
  if (bad) {  // a NaN: the row's results are NaN, as fp32's
    std::memset(q, 0, static_cast<std::size_t>(ld));
    *scale = std::numeric_limits<float>::quiet_NaN();
    *zp = 0;
    return;
  }
  const U8RowParams p = u8_row_params(_mm512_reduce_min_ps(vmin), _mm512_reduce_max_ps(vmax));
  *scale = p.scale;
  *zp = p.zp;
  if (p.inv == 0.f) {
    std::memset(q, 0, static_cast<std::size_t>(ld));
    return;
  }
  const __m512 vinv = _mm512_set1_ps(p.inv);
  const __m512i vz = _mm512_set1_epi32(p.zp), v0 = _mm512_setzero_si512(),
                v255 = _mm512_set1_epi32(255);
  int64_t i = 0;
  for (; i < k; i += 16) {
    const __mmask16 m = tail_mask(k, i);
    const __m512 v = clamp_finite(_mm512_maskz_loadu_ps(m, x + i));
    __m512i t = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v, vinv)), vz);
    t = _mm512_min_epi32(_mm512_max_epi32(t, v0), v255);
    _mm_mask_storeu_epi8(q + i, m, _mm512_cvtusepi32_epi8(t));
  }
  for (int64_t p = k; p < ld; ++p) q[p] = 0;
}

// The epilogue of a block: rows i < MR, groups v < NV from column j0.
struct Epilogue {
  const float* sa;   // rows' scales
  const int32_t* za;  // rows' zero points
  const float* sb;   // columns' scales, from column j0
  const int32_t* wsum;
  int64_t j0, col0, col1;
  float beta;
  float* c;  // row 0, column 0
  int64_t ldc;
  const float* const* init;
  const float* c_row;
};

// One register block: acc[i][v] = Σ_k A[i]·B[group v] over k4 groups of 4 k,
// then the epilogue. One function with every loop unrolled, so that the
// accumulators stay in registers (split across functions, GCC 12 kept them
// in a stack array, a store and a reload around every vpdpbusd).
template <int MR, int NV>
SEQPACK_VNNI void block(int64_t k4, const uint8_t* a, int64_t lda, const int8_t* b,
                        int64_t gstride, const Epilogue& e) {
  __m512i acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_si512();
  for (int64_t kk = 0; kk < k4; ++kk) {
    __m512i w[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) w[v] = _mm512_load_si512(b + v * gstride + kk * 64);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      int32_t four;
      std::memcpy(&four, a + i * lda + kk * 4, sizeof four);
      const __m512i av = _mm512_set1_epi32(four);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbusd_epi32(acc[i][v], av, w[v]);
    }
  }
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const int64_t j = e.j0 + v * 16;
    const int64_t lo = std::max<int64_t>(e.col0 - j, 0), hi = std::min<int64_t>(e.col1 - j, 16);
    if (hi <= lo) continue;
    const __mmask16 mask = static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
    const __m512 sb = _mm512_loadu_ps(e.sb + v * 16);
    const __m512i ws = _mm512_loadu_si512(e.wsum + v * 16);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512i t =
          _mm512_sub_epi32(acc[i][v], _mm512_mullo_epi32(_mm512_set1_epi32(e.za[i]), ws));
      // The two scales' product, at most FLT_MAX (NaN kept): a row of huge
      // values times a unit of huge weights then overflows only where the
      // result does (an inf scale would make 0 · inf = NaN of a zero sum).
      const __m512 sab = _mm512_min_ps(_mm512_set1_ps(std::numeric_limits<float>::max()),
                                       _mm512_mul_ps(sb, _mm512_set1_ps(e.sa[i])));
      __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(t), sab);
      float* dst = e.c + i * e.ldc + j;
      if (e.init) {
        f = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, e.init[i] + j), f);
      } else if (e.c_row) {
        f = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, e.c_row + j), f);
      } else if (e.beta != 0.f) {
        f = _mm512_fmadd_ps(_mm512_set1_ps(e.beta), _mm512_maskz_loadu_ps(mask, dst), f);
      }
      // Masked stores only at a range's edges: AMD's Zen 4 and 5 run a
      // masked store far slower than a plain one (half of this kernel's
      // time when every store was masked, perf).
      if (mask == 0xFFFF) {
        _mm512_storeu_ps(dst, f);
      } else {
        _mm512_mask_storeu_ps(dst, mask, f);
      }
    }
  }
}

using BlockFn = void (*)(int64_t, const uint8_t*, int64_t, const int8_t*, int64_t,
                         const Epilogue&);

template <int MR>
constexpr BlockFn block_for(int nv) {
  return nv == 1 ? block<MR, 1> : nv == 2 ? block<MR, 2> : nv == 3 ? block<MR, 3> : block<MR, 4>;
}
BlockFn block_fn(int mr, int nv) {
  switch (mr) {
    case 1: return block_for<1>(nv);
    case 2: return block_for<2>(nv);
    case 3: return block_for<3>(nv);
    case 4: return block_for<4>(nv);
    case 5: return block_for<5>(nv);
    default: return block_for<6>(nv);
  }
}

}  // namespace

bool int8_kernels_supported() {
  static const bool cpu = __builtin_cpu_supports("avx512vnni") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  // SEQPACK_MAX_CPU_ISA below avx512 rules the kernel out like a smaller CPU.
  return cpu && has_int8_dot_products() && isa_cap() == IsaLevel::avx512;
}

void quantize_rows_u8(int64_t m, int64_t k, const float* x, int64_t ldx, QuantizedRows& out) {
  out.m = m;
  out.k = k;
  out.ld = (k + 3) / 4 * 4;
  uint8_t* q = out.q.resize(static_cast<std::size_t>(std::max<int64_t>(m * out.ld, 1)));
  float* s = out.scale.resize(static_cast<std::size_t>(std::max<int64_t>(m, 1)));
  int32_t* z = out.zp.resize(static_cast<std::size_t>(std::max<int64_t>(m, 1)));
  for (int64_t i = 0; i < m; ++i) quantize_row(x + i * ldx, k, q + i * out.ld, out.ld, s + i, z + i);
}

namespace {

std::atomic<int64_t> weight_quantizations{0};

// One column of B stored contiguously (a row of W: trans_b), quantized into
// its lane of a group: 16 values at a time, the scalar loop's rounding
// (cvtps rounds to nearest even, as nearbyint does in the default mode).
SEQPACK_VNNI void quantize_column(const float* w, int64_t k, int64_t k4, int8_t* col, float* scale,
                                  int32_t* sum) {
  __m512 vmax = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (int64_t i = 0; i < k; i += 16) {
    const __mmask16 m = tail_mask(k, i);
    const __m512 v = _mm512_maskz_loadu_ps(m, w + i);
    bad |= _mm512_mask_cmp_ps_mask(m, v, v, _CMP_UNORD_Q);
    vmax = _mm512_max_ps(vmax, _mm512_abs_ps(v));
  }
  const float mx = _mm512_reduce_max_ps(vmax);
  const bool finite = !bad && std::isfinite(mx);
  *scale = !finite ? std::numeric_limits<float>::quiet_NaN() : mx > 0.f ? mx / 127.f : 1.f;
  const float inv = finite && mx > 0.f ? 1.f / *scale : 0.f;
  __m512i total = _mm512_setzero_si512();
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  for (int64_t i = 0; i < k4 * 4; i += 16) {
    const __mmask16 m = tail_mask(k, i);
    __m512i q = _mm512_setzero_si512();
    if (inv != 0.f) {
      q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + i), vinv));
      q = _mm512_maskz_mov_epi32(m, _mm512_min_epi32(_mm512_max_epi32(q, lo), hi));
    }
    total = _mm512_add_epi32(total, q);
    alignas(16) int8_t bytes[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(bytes), _mm512_cvtsepi32_epi8(q));
    for (int64_t t = 0; t < 4 && i + 4 * t < k4 * 4; ++t)
      std::memcpy(col + (i / 4 + t) * 64, bytes + 4 * t, 4);
  }
  *sum = _mm512_reduce_add_epi32(total);
}

}  // namespace

int64_t int8_weight_quantizations() { return weight_quantizations.load(); }

void quantize_weights_s8(const float* b, bool trans_b, int64_t k, int64_t n, int64_t ldb,
                         QuantizedWeights& out) {
  ++weight_quantizations;
  out.k = k;
  out.n = n;
  out.k4 = (k + 3) / 4;
  out.groups = (n + 15) / 16;
  const int64_t np = out.groups * 16;
  int8_t* p = out.packed.resize(static_cast<std::size_t>(std::max<int64_t>(out.groups * out.k4 * 64, 1)));
  float* sc = out.scale.resize(static_cast<std::size_t>(std::max<int64_t>(np, 1)));
  int32_t* sum = out.sum.resize(static_cast<std::size_t>(std::max<int64_t>(np, 1)));
  const auto at = [&](int64_t kk, int64_t j) { return trans_b ? b[j * ldb + kk] : b[kk * ldb + j]; };
  const bool parallel = !omp_in_parallel() && k * n >= (1 << 16);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t j = 0; j < np; ++j) {
    const int64_t g = j / 16, lane = j % 16;
    int8_t* col = p + g * out.k4 * 64 + lane * 4;
    if (j >= n) {
      for (int64_t kk = 0; kk < out.k4 * 4; ++kk) col[kk / 4 * 64 + kk % 4] = 0;
      sc[j] = 0.f;
      sum[j] = 0;
      continue;
    }
    if (trans_b) {
      quantize_column(b + j * ldb, k, out.k4, col, sc + j, sum + j);
      continue;
    }
    float mx = 0.f;
    bool finite = true;
    for (int64_t kk = 0; kk < k; ++kk) {
      const float w = at(kk, j);
      finite = finite && std::isfinite(w);
      mx = std::max(mx, std::fabs(w));
    }
    const float s = !finite ? std::numeric_limits<float>::quiet_NaN() : mx > 0.f ? mx / 127.f : 1.f;
    const float inv = finite && mx > 0.f ? 1.f / s : 0.f;
    int32_t total = 0;
    for (int64_t kk = 0; kk < out.k4 * 4; ++kk) {
      int32_t q = 0;
      if (kk < k && inv != 0.f)
        q = std::clamp(static_cast<int32_t>(std::nearbyint(at(kk, j) * inv)), -127, 127);
      col[kk / 4 * 64 + kk % 4] = static_cast<int8_t>(q);
      total += q;
    }
    sc[j] = s;
    sum[j] = total;
  }
}

void gemm_u8s8_f32(int64_t m, const QuantizedRows& a, int64_t a_row0, const QuantizedWeights& b,
                   int64_t col0, int64_t col1, float beta, float* c, int64_t ldc,
                   const float* const* init, const float* c_row) {
  col1 = std::min(col1, b.n);
  if (m <= 0 || col1 <= col0) return;
  const int64_t g0 = col0 / 16, g1 = (col1 + 15) / 16, gstride = b.k4 * 64;
  for (int64_t g = g0; g < g1; g += kNV) {
    const int nv = static_cast<int>(std::min<int64_t>(kNV, g1 - g));
    const int8_t* bp = b.packed.data() + g * gstride;
    for (int64_t i = 0; i < m; i += kMR) {
      const int mr = static_cast<int>(std::min<int64_t>(kMR, m - i));
      const int64_t r = a_row0 + i;
      const Epilogue e{a.scale.data() + r, a.zp.data() + r, b.scale.data() + g * 16,
                       b.sum.data() + g * 16, g * 16, col0, col1, beta, c + i * ldc, ldc,
                       init ? init + i : nullptr, c_row};
      block_fn(mr, nv)(b.k4, a.q.data() + r * a.ld, a.ld, bp, gstride, e);
    }
  }
}

}  // namespace seqpack::cpu
