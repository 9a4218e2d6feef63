// The int8 kernels of cpu/gemm_int8.h for AVX512-VNNI and AMX-INT8:
// quantization of the rows and the weights, and the u8·s8 product with its
// dequantizing epilogue. Compiled for those targets by function attributes
// and called only after gemm_int8.cpp's run-time checks
// (vnni_int8_supported, amx_int8_supported), so the library still loads and
// runs on CPUs without them.
//
// VNNI:
// Register block: MR <= 6 rows x NV <= 4 vectors of 16 columns, 24 int32
// accumulators. Per 4 k it loads NV vectors of B (one 64-byte row of each
// 16-column group) and broadcasts 4 bytes of each row of A; each vpdpbusd
// adds 4 u8·s8 products per lane. The column groups are the outer loop, so a
// block's B (k * 64 bytes per group) stays in L1 while every row passes.
//
// AMX: tiles of 16 rows x 64 bytes. A block is 32 rows x 32 columns: two A
// tiles (16 rows, 64 k each), two B tiles (64 k of 16 columns: 16 rows of a
// group's layout, which is tdpbusd's B layout as it stands) and four int32
// C tiles; per 64 k, four tdpbusd (16 x 16 x 64 multiply-adds each). The C
// tiles go through a buffer into the same epilogue as VNNI's registers.

// GCC 12's AVX-512 headers build some intrinsics (cvtps_epi32, reduce_min)
// on _mm512_undefined_*(), which its -Wuninitialized reports at every use.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu/gemm_int8_kernels.h"

#define SEQPACK_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define SEQPACK_AMX \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")))

namespace seqpack::cpu::int8_impl {

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

}  // namespace

SEQPACK_VNNI void quantize_row_avx512(const float* x, int64_t k, int levels, uint8_t* q,
                                      int64_t ld, float* scale, int32_t* zp) {
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
  const U8RowParams p =
      u8_row_params(_mm512_reduce_min_ps(vmin), _mm512_reduce_max_ps(vmax), levels);
  *scale = p.scale;
  *zp = p.zp;
  if (p.inv == 0.f) {
    std::memset(q, 0, static_cast<std::size_t>(ld));
    return;
  }
  const __m512 vinv = _mm512_set1_ps(p.inv);
  const __m512i vz = _mm512_set1_epi32(p.zp), v0 = _mm512_setzero_si512(),
                vtop = _mm512_set1_epi32(levels);
  int64_t i = 0;
  for (; i < k; i += 16) {
    const __mmask16 m = tail_mask(k, i);
    const __m512 v = clamp_finite(_mm512_maskz_loadu_ps(m, x + i));
    __m512i t = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v, vinv)), vz);
    t = _mm512_min_epi32(_mm512_max_epi32(t, v0), vtop);
    _mm_mask_storeu_epi8(q + i, m, _mm512_cvtusepi32_epi8(t));
  }
  for (int64_t p = k; p < ld; ++p) q[p] = 0;
}

namespace {

// The epilogue of group v of a block (columns j0 + 16 v ...): its lanes in
// [col0, col1) (mask; 0: none), the columns' scales and weight sums.
struct GroupEpilogue {
  const Epilogue& e;
  int64_t j;
  __mmask16 mask;
  __m512 sb;
  __m512i ws;
  SEQPACK_VNNI __attribute__((always_inline)) GroupEpilogue(const Epilogue& e_, int v)
      : e(e_), j(e_.j0 + v * 16) {
    const int64_t lo = std::max<int64_t>(e.col0 - j, 0), hi = std::min<int64_t>(e.col1 - j, 16);
    mask = hi <= lo ? __mmask16(0)
                    : static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
    sb = _mm512_loadu_ps(e.sb + v * 16);
    ws = _mm512_loadu_si512(e.wsum + v * 16);
  }
  // Row i of the block from its exact int32 sums acc.
  SEQPACK_VNNI __attribute__((always_inline)) void row(__m512i acc, int i) const {
    const __m512i t = _mm512_sub_epi32(acc, _mm512_mullo_epi32(_mm512_set1_epi32(e.za[i]), ws));
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
    const GroupEpilogue ge(e, v);
    if (ge.mask == 0) continue;
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) ge.row(acc[i][v], i);
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

// AMX's tile configuration (ldtilecfg's 64 bytes, palette 1): tiles 0-3 C
// (16 rows of 16 int32), 4-5 A (16 rows of 64 u8), 6-7 B (16 rows of 16
// columns x 4 k).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// One AMX block: rows [0, MR16 * 16) of a (the caller's 32-row block: rows
// past m are computed and not stored), groups [0, NV) from b, k4p / 16
// chunks of 64 k, then the epilogue on rows < mr.
template <int MR16, int NV>
SEQPACK_AMX void amx_block(int64_t kc, const uint8_t* a, int64_t lda, const int8_t* b,
                           int64_t gstride, int mr, const Epilogue& e) {
  _tile_zero(0);
  if constexpr (NV > 1) _tile_zero(1);
  if constexpr (MR16 > 1) _tile_zero(2);
  if constexpr (MR16 > 1 && NV > 1) _tile_zero(3);
  const uint8_t* a1 = a + 16 * lda;
  const int8_t* b1 = b + gstride;
  for (int64_t kk = 0; kk < kc; ++kk) {
    _tile_loadd(4, a + kk * 64, lda);
    _tile_loadd(6, b + kk * 1024, 64);
    _tile_dpbusd(0, 4, 6);
    if constexpr (NV > 1) {
      _tile_loadd(7, b1 + kk * 1024, 64);
      _tile_dpbusd(1, 4, 7);
    }
    if constexpr (MR16 > 1) {
      _tile_loadd(5, a1 + kk * 64, lda);
      _tile_dpbusd(2, 5, 6);
      if constexpr (NV > 1) _tile_dpbusd(3, 5, 7);
    }
  }
  alignas(64) int32_t acc[32][32];
  _tile_stored(0, &acc[0][0], 128);
  if constexpr (NV > 1) _tile_stored(1, &acc[0][16], 128);
  if constexpr (MR16 > 1) _tile_stored(2, &acc[16][0], 128);
  if constexpr (MR16 > 1 && NV > 1) _tile_stored(3, &acc[16][16], 128);
  for (int v = 0; v < NV; ++v) {
    const GroupEpilogue ge(e, v);
    if (ge.mask == 0) continue;
    for (int i = 0; i < mr; ++i) ge.row(_mm512_load_si512(&acc[i][v * 16]), i);
  }
}

SEQPACK_AMX void amx_product(const Product& p) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  const QuantizedRows& a = p.a;
  const QuantizedWeights& b = p.b;
  const int64_t g0 = p.col0 / 16, g1 = (p.col1 + 15) / 16, gstride = b.k4p * 64, kc = b.k4p / 16;
  for (int64_t g = g0; g < g1; g += 2) {
    const bool two = g + 1 < g1;
    const int8_t* bp = b.packed.data() + g * gstride;
    for (int64_t i = 0; i < p.m; i += 32) {
      const int mr = static_cast<int>(std::min<int64_t>(32, p.m - i));
      const int64_t r = p.a_row0 + i;
      const Epilogue e = block_epilogue(p, i, g);
      const uint8_t* ap = a.q.data() + r * a.ld;
      if (mr > 16) {
        two ? amx_block<2, 2>(kc, ap, a.ld, bp, gstride, mr, e)
            : amx_block<2, 1>(kc, ap, a.ld, bp, gstride, mr, e);
      } else {
        two ? amx_block<1, 2>(kc, ap, a.ld, bp, gstride, mr, e)
            : amx_block<1, 1>(kc, ap, a.ld, bp, gstride, mr, e);
      }
    }
  }
  _tile_release();
}

// Linux gives a process AMX's tile data only when asked (arch_prctl
// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, Linux 5.16 and later).
bool amx_tile_data_granted() {
  static const bool granted = [] {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted;
}

bool cpu_has_amx_int8() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  return (edx >> 24 & 1) && (edx >> 25 & 1);  // AMX-TILE, AMX-INT8
}

}  // namespace

bool amx_int8_usable() { return cpu_has_amx_int8() && amx_tile_data_granted(); }

void gemm_amx(const Product& p) { amx_product(p); }

// One column of B stored contiguously (a row of W: trans_b), quantized into
// its lane of a group: 16 values at a time, the scalar loop's rounding
// (cvtps rounds to nearest even, as nearbyint does in the default mode).
SEQPACK_VNNI void quantize_column_avx512(const float* w, int64_t k, int64_t k4, int8_t* col,
                                         float* scale, int32_t* sum) {
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

void gemm_vnni(const Product& p) {
  const QuantizedRows& a = p.a;
  const QuantizedWeights& b = p.b;
  const int64_t g0 = p.col0 / 16, g1 = (p.col1 + 15) / 16, gstride = b.k4p * 64;
  for (int64_t g = g0; g < g1; g += kNV) {
    const int nv = static_cast<int>(std::min<int64_t>(kNV, g1 - g));
    const int8_t* bp = b.packed.data() + g * gstride;
    for (int64_t i = 0; i < p.m; i += kMR) {
      const int mr = static_cast<int>(std::min<int64_t>(kMR, p.m - i));
      const int64_t r = p.a_row0 + i;
      const Epilogue e = block_epilogue(p, i, g);
      block_fn(mr, nv)(b.k4, a.q.data() + r * a.ld, a.ld, bp, gstride, e);
    }
  }
}

}  // namespace seqpack::cpu::int8_impl
