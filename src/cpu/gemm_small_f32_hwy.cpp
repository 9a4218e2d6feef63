// The packed-weights GEMM of gemm.h (gemm_packed_small) in Highway SIMD,
// compiled per x86 target and chosen at run time like rnn_gates_f32_hwy.cpp.
//
// Each register block keeps MR rows x NP panels x 2 vectors of C in registers
// and walks k once: per k it loads the NP panels' two vectors of B and
// broadcasts one element of A per row. The accumulators start from beta * C
// (zero when beta == 0, C is then never read) and are stored back into C, so a
// column's sum is the same chain of FMAs whichever columns a call covers.
//
// Two drivers. Bulk (the rows up to a multiple of kMR) keeps a k block of one
// panel in L1 while every kMR-row block of A passes over it, BLIS's loop
// order: W is read from L2/L3 once per call, not once per few rows. Rows (the
// 3..8 rows left, and steps with fewer rows) streams all of W per MR <= 5
// rows, with 4, 3 and 2 panels side by side at MR = 1, 2 and 3 so that 8-12
// independent FMA chains hide the FMA latency (one panel would leave MR <= 3
// latency-bound at 2-6 chains).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/gemm_small_f32_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/aligned_allocator.h>
#include <hwy/cache_control.h>
#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/gemm.h"
#include "cpu/isa_cap.h"
#include "cpu/transpose_avx512.h"

HWY_BEFORE_NAMESPACE();
namespace seqpack::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

int64_t PanelWidth() { return 2 * static_cast<int64_t>(hn::Lanes(DF())); }

// Scratch for one register block that covers a panel only partly: up to 16
// (rows x panels) pairs of vectors (Bulk's 12 x 1 on AVX-512 included).
constexpr int64_t kTmpFloats = 4 * 4 * 2 * HWY_MAX_BYTES / sizeof(float);

// dst[i][jp * W + c] = beta * dst[i][jp * W + c] + A[i, :]·panel(jp)[:, c] for
// i < MR (row stride ldd), jp < NP (panel jp at p + jp * pstride). With
// `init`, row i starts from init[i][icol + jp * W + c] instead of beta * dst
// (dst is then only written).
template <int MR, int NP>
HWY_INLINE void Block(int64_t K, const float* HWY_RESTRICT a, int64_t lda,
                      const float* HWY_RESTRICT p, int64_t pstride, float beta, float* dst,
                      int64_t ldd, const float* const* init = nullptr, int64_t icol = 0) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  VF acc[MR][NP][2];
  if (init != nullptr) {
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NP; ++j)
        for (int v = 0; v < 2; ++v) acc[i][j][v] = hn::LoadU(d, init[i] + icol + (2 * j + v) * L);
  } else if (beta == 0.f) {
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NP; ++j) acc[i][j][0] = acc[i][j][1] = hn::Zero(d);
  } else {
    const VF vb = hn::Set(d, beta);
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NP; ++j)
        for (int v = 0; v < 2; ++v)
          acc[i][j][v] = hn::Mul(vb, hn::LoadU(d, dst + i * ldd + (2 * j + v) * L));
  }
  for (int64_t k = 0; k < K; ++k) {
    VF w[NP][2];
    for (int j = 0; j < NP; ++j) {
      w[j][0] = hn::Load(d, p + j * pstride + k * 2 * L);
      w[j][1] = hn::Load(d, p + j * pstride + k * 2 * L + L);
    }
    for (int i = 0; i < MR; ++i) {
      const VF ai = hn::Set(d, a[i * lda + k]);
      for (int j = 0; j < NP; ++j) {
        acc[i][j][0] = hn::MulAdd(ai, w[j][0], acc[i][j][0]);
        acc[i][j][1] = hn::MulAdd(ai, w[j][1], acc[i][j][1]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NP; ++j)
      for (int v = 0; v < 2; ++v) hn::StoreU(acc[i][j][v], d, dst + i * ldd + (2 * j + v) * L);
}

// Block on rows [0, MR) of C and panels [pb, pb + NP), writing only columns
// [col0, col1). Panels wholly in range accumulate in C itself; otherwise the
// in-range part of C (or of the init rows) goes through tmp (zeros
// elsewhere), the same FMA chains.
template <int MR, int NP>
HWY_INLINE void BlockC(int64_t K, const float* a, int64_t lda, const float* panel0,
                       int64_t pstride, int64_t W, int64_t pb, int64_t col0, int64_t col1,
                       float beta, float* c, int64_t ldc, const float* const* init) {
  const int64_t base = pb * W;
  if (col0 <= base && base + NP * W <= col1) {
    Block<MR, NP>(K, a, lda, panel0, pstride, beta, c + base, ldc, init, base);
    return;
  }
  HWY_ALIGN float tmp[kTmpFloats];
  const int64_t j0 = std::max(col0, base), j1 = std::min(col1, base + NP * W);
  for (int i = 0; i < MR; ++i) {
    float* t = tmp + i * NP * W;
    const float* cr = init != nullptr ? init[i] : c + i * ldc;
    const bool from = init != nullptr || beta != 0.f;
    for (int64_t j = 0; j < NP * W; ++j) {
      t[j] = from && base + j >= j0 && base + j < j1 ? cr[base + j] : 0.f;
    }
  }
  Block<MR, NP>(K, a, lda, panel0, pstride, init != nullptr ? 1.f : beta, tmp, NP * W);
  for (int i = 0; i < MR; ++i) {
    float* cr = c + i * ldc;
    for (int64_t j = j0; j < j1; ++j) cr[j] = tmp[i * NP * W + (j - base)];
  }
}

// Runs BlockC over panels [p0, p1) for rows [0, MR) of a/c, NP panels at a
// time; `panels` holds the panels from pfirst on.
template <int MR, int NP>
HWY_INLINE void Rows(int64_t K, const float* a, int64_t lda, const float* panels, int64_t pfirst,
                     int64_t W, int64_t p0, int64_t p1, int64_t col0, int64_t col1, float beta,
                     float* c, int64_t ldc, const float* const* init) {
  const int64_t pstride = K * W;
  int64_t p = p0;
  for (; p + NP <= p1; p += NP) {
    BlockC<MR, NP>(K, a, lda, panels + (p - pfirst) * pstride, pstride, W, p, col0, col1, beta, c,
                   ldc, init);
  }
  // The last few panels with as many side by side as are left.
  if constexpr (NP > 1) {
    constexpr int kNext = NP >= 3 ? 2 : 1;
    if (p < p1)
      Rows<MR, kNext>(K, a, lda, panels, pfirst, W, p, p1, col0, col1, beta, c, ldc, init);
  }
}

// Rows of the register block of Bulk: kMR x 2 vectors of accumulators plus two
// vectors of B and one broadcast of A must fit the vector registers (16 on
// AVX2/SSE4: 12 + 3 = 15; 32 on AVX-512: 24 + 3 = 27). Fewer rows would load
// B more often per FMA; more would spill.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kMR = 12;
#else
constexpr int kMR = 6;
#endif

// Rows [0, m) of C, m a multiple of kMR, with each (k block of) panel kept in
// L1 while every kMR-row block of A passes over it (BLIS's loop order with B
// as the resident operand). Rows<> instead streams all of B from L2/L3 per
// few rows, which at 128+ rows lost to sgemm (docs/performance.md, section
// 7). k is cut into blocks whose panel part is at most 16 KB (half of L1) and
// rows into blocks whose A part is at most 192 KB (stays in L2 across the
// panels); later k blocks accumulate onto C (beta 1).
void Bulk(int64_t m, int64_t K, const float* a, int64_t lda, const float* panels, int64_t pfirst,
          int64_t W, int64_t p0, int64_t p1, int64_t col0, int64_t col1, float beta, float* c, int64_t ldc,
          const float* const* init) {
  const int64_t pstride = K * W;
  const int64_t kc_max = std::max<int64_t>(16, 4096 / W);
  const int64_t kblocks = std::max<int64_t>(1, (K + kc_max - 1) / kc_max);
  const int64_t kc_even = (K + kblocks - 1) / kblocks;
  const int64_t mc = std::max<int64_t>(kMR, 49152 / std::max<int64_t>(kc_even, 1) / kMR * kMR);
  for (int64_t k0 = 0; k0 < K || k0 == 0; k0 += kc_even) {
    const int64_t kc = std::min(kc_even, K - k0);
    const float bk = k0 == 0 ? beta : 1.f;
    const float* const* ik = k0 == 0 ? init : nullptr;  // later k blocks add onto C
    for (int64_t i0 = 0; i0 < m; i0 += mc) {
      const int64_t i1 = std::min(m, i0 + mc);
      for (int64_t p = p0; p < p1; ++p) {
        const float* panel = panels + (p - pfirst) * pstride + k0 * W;
        for (int64_t i = i0; i < i1; i += kMR) {
          // C's lines of the next block come from L2 (C is too big for L1 at
          // 100+ rows); fetched now, they are there when its accumulators load.
          if (i + kMR < i1 && ik == nullptr) {
            for (int r = 0; r < kMR; ++r) hwy::Prefetch(c + (i + kMR + r) * ldc + p * W);
          }
          BlockC<kMR, 1>(kc, a + i * lda + k0, lda, panel, pstride, W, p, col0, col1, bk,
                         c + i * ldc, ldc, ik != nullptr ? ik + i : nullptr);
        }
      }
    }
    if (K == 0) break;
  }
}

// C[:m, col0:col1) from the panels that hold those columns, `panels` holding
// them from panel pfirst on.
void PanelsProduct(int64_t m, const float* a, int64_t lda, const float* panels, int64_t pfirst,
                   int64_t K, int64_t W, int64_t col0, int64_t col1, float beta, float* c,
                   int64_t ldc, const float* const* init) {
  const int64_t p0 = col0 / W, p1 = (col1 + W - 1) / W;
  auto at = [init](int64_t i) { return init != nullptr ? init + i : nullptr; };
  int64_t bulk = m / kMR * kMR;
  // One or two rows left over would stream W at 45-65% of the FMA rate (a
  // GEMV is bound by L2 bandwidth); kMR + 1 or kMR + 2 rows go faster as
  // 4 + 3 or 4 + 4 (on AVX2, 6 + 2 rows: 82 GFLOP/s, 4 + 4: 94).
  if (m - bulk <= 2 && m - bulk > 0 && bulk >= kMR && kMR == 6) bulk -= kMR;
  if (bulk > 0) Bulk(bulk, K, a, lda, panels, pfirst, W, p0, p1, col0, col1, beta, c, ldc, init);
  int64_t i = bulk;
  if (m - i == 5) {
    Rows<5, 1>(K, a + i * lda, lda, panels, pfirst, W, p0, p1, col0, col1, beta, c + i * ldc, ldc,
                 at(i));
    return;
  }
  for (; i + 4 <= m; i += 4)
    Rows<4, 1>(K, a + i * lda, lda, panels, pfirst, W, p0, p1, col0, col1, beta, c + i * ldc, ldc,
                 at(i));
  switch (m - i) {
    case 3:
      Rows<3, 2>(K, a + i * lda, lda, panels, pfirst, W, p0, p1, col0, col1, beta, c + i * ldc, ldc,
                 at(i));
      break;
    case 2:
      Rows<2, 3>(K, a + i * lda, lda, panels, pfirst, W, p0, p1, col0, col1, beta, c + i * ldc, ldc,
                 at(i));
      break;
    case 1:
      Rows<1, 4>(K, a + i * lda, lda, panels, pfirst, W, p0, p1, col0, col1, beta, c + i * ldc, ldc,
                 at(i));
      break;
    default:
      break;
  }
}

void GemmPackedSmall(int64_t m, const float* a, int64_t lda, const float* panels, int64_t K,
                     int64_t W, int64_t col0, int64_t col1, float beta, float* c, int64_t ldc,
                     const float* const* init) {
  if (W != PanelWidth()) {
    throw std::logic_error("gemm_packed_small: weights packed in panels of " + std::to_string(W) +
                           " columns, but this target's are " + std::to_string(PanelWidth()) +
                           " (packed before the ISA cap changed)");
  }
  PanelsProduct(m, a, lda, panels, 0, K, W, col0, col1, beta, c, ldc, init);
}

// Panel p of B = op(b) [k, n] into dst [k][W]: B[kk][p * W + j] at
// dst[kk * W + j], the columns past n zero.
void PackPanel(const float* HWY_RESTRICT b, bool trans_b, int64_t k, int64_t n, int64_t ldb,
               int64_t p, float* HWY_RESTRICT dst) {
  const int64_t W = PanelWidth();
  const int64_t cols = std::min(W, n - p * W);
  if (!trans_b) {
    if (cols == W) {  // two vectors a row (a std::copy of 16 floats is a memmove call)
      const DF d;
      const int64_t L = static_cast<int64_t>(hn::Lanes(d));
      for (int64_t kk = 0; kk < k; ++kk) {
        const float* src = b + kk * ldb + p * W;
        hn::Store(hn::LoadU(d, src), d, dst + kk * W);
        hn::Store(hn::LoadU(d, src + L), d, dst + kk * W + L);
      }
      return;
    }
    for (int64_t kk = 0; kk < k; ++kk) {
      float* row = dst + kk * W;
      const float* src = b + kk * ldb + p * W;
      std::copy(src, src + cols, row);
      std::fill(row + cols, row + W, 0.f);
    }
    return;
  }
  // Column j of B is row j of b: eight (then four) of b's rows at a time,
  // 8 x 8 (4 x 4) blocks transposed in registers (a scalar transpose stores
  // one element at a time, down the panel's columns).
  int64_t c = 0;
#if HWY_TARGET != HWY_SCALAR && HWY_MAX_BYTES >= 32
  {
    const hn::FixedTag<float, 8> d8;
    const hn::Repartition<double, decltype(d8)> dd;
    for (; c + 8 <= cols; c += 8) {
      const float* r = b + (p * W + c) * ldb;
      int64_t kk = 0;
      for (; kk + 8 <= k; kk += 8) {
        // Interleaved by 32 then 64 bits within each 128-bit half, the
        // halves then combined: column q of the block in its own vector.
        hn::Vec<decltype(dd)> u[8];
        for (int h = 0; h < 2; ++h) {
          const float* q = r + 4 * h * ldb + kk;
          const auto v0 = hn::LoadU(d8, q), v1 = hn::LoadU(d8, q + ldb);
          const auto v2 = hn::LoadU(d8, q + 2 * ldb), v3 = hn::LoadU(d8, q + 3 * ldb);
          const auto t0 = hn::BitCast(dd, hn::InterleaveLower(d8, v0, v1));
          const auto t1 = hn::BitCast(dd, hn::InterleaveUpper(d8, v0, v1));
          const auto t2 = hn::BitCast(dd, hn::InterleaveLower(d8, v2, v3));
          const auto t3 = hn::BitCast(dd, hn::InterleaveUpper(d8, v2, v3));
          u[4 * h + 0] = hn::InterleaveLower(dd, t0, t2);  // columns 0 | 4 of rows 4h..4h+3
          u[4 * h + 1] = hn::InterleaveUpper(dd, t0, t2);  // 1 | 5
          u[4 * h + 2] = hn::InterleaveLower(dd, t1, t3);  // 2 | 6
          u[4 * h + 3] = hn::InterleaveUpper(dd, t1, t3);  // 3 | 7
        }
        float* o = dst + kk * W + c;
        for (int j = 0; j < 4; ++j) {
          hn::StoreU(hn::BitCast(d8, hn::ConcatLowerLower(dd, u[4 + j], u[j])), d8, o + j * W);
          hn::StoreU(hn::BitCast(d8, hn::ConcatUpperUpper(dd, u[4 + j], u[j])), d8, o + (j + 4) * W);
        }
      }
      for (; kk < k; ++kk) {
        float* o = dst + kk * W + c;
        for (int64_t j = 0; j < 8; ++j) o[j] = r[j * ldb + kk];
      }
    }
  }
#endif
#if HWY_TARGET != HWY_SCALAR
  const hn::FixedTag<float, 4> d4;
  const hn::Repartition<double, decltype(d4)> d2;
  for (; c + 4 <= cols; c += 4) {
    const float* r0 = b + (p * W + c) * ldb;
    const float* r1 = r0 + ldb;
    const float* r2 = r1 + ldb;
    const float* r3 = r2 + ldb;
    int64_t kk = 0;
    for (; kk + 4 <= k; kk += 4) {
      const auto v0 = hn::LoadU(d4, r0 + kk), v1 = hn::LoadU(d4, r1 + kk);
      const auto v2 = hn::LoadU(d4, r2 + kk), v3 = hn::LoadU(d4, r3 + kk);
      const auto lo01 = hn::BitCast(d2, hn::InterleaveLower(d4, v0, v1));  // 0 0 1 1
      const auto lo23 = hn::BitCast(d2, hn::InterleaveLower(d4, v2, v3));
      const auto hi01 = hn::BitCast(d2, hn::InterleaveUpper(d4, v0, v1));  // 2 2 3 3
      const auto hi23 = hn::BitCast(d2, hn::InterleaveUpper(d4, v2, v3));
      float* o = dst + kk * W + c;
      hn::StoreU(hn::BitCast(d4, hn::InterleaveLower(d2, lo01, lo23)), d4, o);
      hn::StoreU(hn::BitCast(d4, hn::InterleaveUpper(d2, lo01, lo23)), d4, o + W);
      hn::StoreU(hn::BitCast(d4, hn::InterleaveLower(d2, hi01, hi23)), d4, o + 2 * W);
      hn::StoreU(hn::BitCast(d4, hn::InterleaveUpper(d2, hi01, hi23)), d4, o + 3 * W);
    }
    for (; kk < k; ++kk) {
      float* o = dst + kk * W + c;
      o[0] = r0[kk];
      o[1] = r1[kk];
      o[2] = r2[kk];
      o[3] = r3[kk];
    }
  }
#endif
  for (; c < cols; ++c) {
    const float* src = b + (p * W + c) * ldb;
    for (int64_t kk = 0; kk < k; ++kk) dst[kk * W + c] = src[kk];
  }
  if (cols < W) {
    for (int64_t kk = 0; kk < k; ++kk) std::fill(dst + kk * W + cols, dst + (kk + 1) * W, 0.f);
  }
}

// Panels packed per call into this thread's scratch, up to 4 at a time (side
// by side for the few-row blocks, which multiply up to 4 panels at once) as
// long as they take at most 128 KB: the scratch and A's rows, which every
// chunk reads again, stay in L2 (a 512 KB scratch, 4 panels of K = 2000,
// ran 64 rows at 39 GFLOP/s against 64 for sgemm on Zen 3).
constexpr int64_t kMaxChunk = 4;
constexpr int64_t kChunkBytes = 128 << 10;

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// Rows of b laid side by side in registers for the few-row products of
// gemm_unpacked_small: 16 rows of b (16 columns of B = bᵀ) times up to 4 rows
// of a, W never packed. Each block of 16 x 16 of b is loaded row by row and
// transposed in registers (cpu/transpose_avx512.h), so column j's vector
// lane holds b[j][k] for one k, and each output keeps the chain of Block above: its start
// (init, beta·C or zero), then one FMA per k in order. The same bits as the
// packed product, read at the speed of b's rows rather than through a copy
// (a call of one step: LSTM(500)'s W_hh is 4 MB).
// C[:M, j0:j0+16) of A·bᵀ, b's rows j0.. at stride ldb (see Transpose16).
template <int M>
HWY_INLINE void RowsOfB16(int64_t K, const float* HWY_RESTRICT a, int64_t lda,
                          const float* HWY_RESTRICT b, int64_t ldb, int64_t j0, float beta,
                          float* c, int64_t ldc, const float* const* init) {
  __m512 acc[M];
  for (int i = 0; i < M; ++i) {
    if (init != nullptr) {
      acc[i] = _mm512_loadu_ps(init[i] + j0);
    } else if (beta == 0.f) {
      acc[i] = _mm512_setzero_ps();
    } else {
      acc[i] = _mm512_mul_ps(_mm512_set1_ps(beta), _mm512_loadu_ps(c + i * ldc + j0));
    }
  }
  const float* r = b + j0 * ldb;
  for (int64_t k = 0; k < K; k += 16) {
    const int64_t kk = std::min<int64_t>(16, K - k);
    const __mmask16 live = static_cast<__mmask16>(kk == 16 ? 0xffff : (1u << kk) - 1);
    __m512 v[16];
    for (int q = 0; q < 16; ++q) v[q] = _mm512_maskz_loadu_ps(live, r + q * ldb + k);
    transpose_16x16(v);
    if (kk == 16) {
      for (int t = 0; t < 16; ++t)
        for (int i = 0; i < M; ++i)
          acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(a[i * lda + k + t]), v[t], acc[i]);
    } else {
      for (int64_t t = 0; t < kk; ++t)
        for (int i = 0; i < M; ++i)
          acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(a[i * lda + k + t]), v[t], acc[i]);
    }
  }
  for (int i = 0; i < M; ++i) _mm512_storeu_ps(c + i * ldc + j0, acc[i]);
}

// Columns [col0, col1) of the few-row product, 16 at a time from col0; the
// columns left past the last 16 are returned for the packed path.
template <int M>
int64_t RowsOfB(int64_t K, const float* a, int64_t lda, const float* b, int64_t ldb,
                int64_t col0, int64_t col1, float beta, float* c, int64_t ldc,
                const float* const* init) {
  int64_t j = col0;
  for (; j + 16 <= col1; j += 16) RowsOfB16<M>(K, a, lda, b, ldb, j, beta, c, ldc, init);
  return j;
}
#endif

void GemmUnpackedSmall(int64_t m, const float* a, int64_t lda, const float* b, bool trans_b,
                       int64_t K, int64_t n, int64_t ldb, int64_t col0, int64_t col1, float beta,
                       float* c, int64_t ldc, const float* const* init) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  // Up to 4 rows of a with B = bᵀ: b's rows read where they are, the columns
  // past the last 16 packed as below.
  if (trans_b && m <= 4) {
    switch (m) {
      case 1: col0 = RowsOfB<1>(K, a, lda, b, ldb, col0, col1, beta, c, ldc, init); break;
      case 2: col0 = RowsOfB<2>(K, a, lda, b, ldb, col0, col1, beta, c, ldc, init); break;
      case 3: col0 = RowsOfB<3>(K, a, lda, b, ldb, col0, col1, beta, c, ldc, init); break;
      default: col0 = RowsOfB<4>(K, a, lda, b, ldb, col0, col1, beta, c, ldc, init); break;
    }
    if (col0 >= col1) return;
  }
#endif
  const int64_t W = PanelWidth();
  const int64_t p0 = col0 / W, p1 = (col1 + W - 1) / W;
  const int64_t chunk = std::clamp<int64_t>(
      kChunkBytes / std::max<int64_t>(1, K * W * static_cast<int64_t>(sizeof(float))), 1,
      kMaxChunk);
  thread_local hwy::AlignedFreeUniquePtr<float[]> scratch;
  thread_local std::size_t capacity = 0;
  const auto need = static_cast<std::size_t>(chunk * K * W);
  if (capacity < need) {
    scratch = hwy::AllocateAligned<float>(need);
    if (!scratch) throw std::bad_alloc();
    capacity = need;
  }
  float* panels = scratch.get();
  for (int64_t q0 = p0; q0 < p1; q0 += chunk) {
    const int64_t q1 = std::min(p1, q0 + chunk);
    for (int64_t p = q0; p < q1; ++p)
      PackPanel(b, trans_b, K, n, ldb, p, panels + (p - q0) * K * W);
    PanelsProduct(m, a, lda, panels, q0, K, W, std::max(col0, q0 * W),
                  std::min(col1, q1 * W), beta, c, ldc, init);
  }
}

// 8 independent FMA chains: FMA latency (4 cycles) times 2 per cycle.
constexpr int kFewVectors = 8;

// C[i, j] = beta * C[i, j] + A[i, :]·b[j, :] (+ c_row[j]) for i < M and
// columns col0 <= j < col1, b row-major [n, K] (B = bᵀ): each output one dot
// product of two contiguous rows, a vector's lanes over k in order (k = l
// mod the lane count), their sum by SumOfLanes, the k past the last whole
// vector added one by one, then beta·C and the bias. Four rows of b at a
// time share the loads of A; an output's bits do not depend on which four
// (or where a split of the columns puts it). Streams b once at the rate of
// its rows, where oneDNN 2.6's f32 matmul of one row ran at a third of
// OpenBLAS's sgemv and the transposing few-row kernel (RowsOfB16) at half
// (tests: bench_gemm BM_dot_rows).
template <int M>
void DotRowsM(int64_t K, const float* HWY_RESTRICT a, int64_t lda, const float* HWY_RESTRICT b,
              int64_t ldb, int64_t col0, int64_t col1, float beta, float* c, int64_t ldc,
              const float* c_row) {
  const DF d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t Kv = K - K % N;
  const auto put = [&](int i, int64_t j, VF acc) {
    float s = hn::GetLane(hn::SumOfLanes(d, acc));
    const float* x = a + i * lda;
    const float* w = b + j * ldb;
    for (int64_t q = Kv; q < K; ++q) s = std::fma(x[q], w[q], s);
    float& out = c[i * ldc + j];
    float v = beta == 0.0f ? s : beta * out + s;
    if (c_row != nullptr) v += c_row[j];
    out = v;
  };
  int64_t j = col0;
  for (; j + 4 <= col1; j += 4) {
    VF acc[M][4];
    for (int i = 0; i < M; ++i)
      for (int q = 0; q < 4; ++q) acc[i][q] = hn::Zero(d);
    const float* HWY_RESTRICT r = b + j * ldb;
    for (int64_t k = 0; k < Kv; k += N) {
      const VF w0 = hn::LoadU(d, r + k), w1 = hn::LoadU(d, r + ldb + k),
               w2 = hn::LoadU(d, r + 2 * ldb + k), w3 = hn::LoadU(d, r + 3 * ldb + k);
      for (int i = 0; i < M; ++i) {
        const VF x = hn::LoadU(d, a + i * lda + k);
        acc[i][0] = hn::MulAdd(x, w0, acc[i][0]);
        acc[i][1] = hn::MulAdd(x, w1, acc[i][1]);
        acc[i][2] = hn::MulAdd(x, w2, acc[i][2]);
        acc[i][3] = hn::MulAdd(x, w3, acc[i][3]);
      }
    }
    for (int i = 0; i < M; ++i)
      for (int q = 0; q < 4; ++q) put(i, j + q, acc[i][q]);
  }
  for (; j < col1; ++j) {
    VF acc[M];
    for (int i = 0; i < M; ++i) acc[i] = hn::Zero(d);
    const float* HWY_RESTRICT r = b + j * ldb;
    for (int64_t k = 0; k < Kv; k += N) {
      const VF w0 = hn::LoadU(d, r + k);
      for (int i = 0; i < M; ++i) acc[i] = hn::MulAdd(hn::LoadU(d, a + i * lda + k), w0, acc[i]);
    }
    for (int i = 0; i < M; ++i) put(i, j, acc[i]);
  }
}

// C[i, :] = beta * C[i, :] + A[i, :]·B (+ c_row) for i < M, B [K, n] as
// stored (row stride ldb): each output one chain of FMAs over k in order
// (from zero), then beta·C and the bias, kFewVectors vectors of a row at a
// time in registers while B's rows stream past; the columns past the last
// whole chunk a vector at a time, the last few one by one with the same
// FMAs. An output's bits do not depend on where a split of the columns puts
// it.
template <int M>
void CombineRowsM(int64_t K, const float* HWY_RESTRICT a, int64_t lda,
                  const float* HWY_RESTRICT b, int64_t ldb, int64_t col0, int64_t col1,
                  float beta, float* c, int64_t ldc, const float* c_row) {
  const DF d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  const auto finish = [&](int i, int64_t j, VF acc) {
    VF v = acc;
    float* out = c + i * ldc + j;
    if (beta != 0.0f) v = hn::MulAdd(hn::Set(d, beta), hn::LoadU(d, out), v);
    if (c_row != nullptr) v = hn::Add(v, hn::LoadU(d, c_row + j));
    hn::StoreU(v, d, out);
  };
  int64_t j = col0;
  constexpr int V = M == 1 ? kFewVectors : kFewVectors / 2;
  for (; j + V * N <= col1; j += V * N) {
    VF acc[M][V];
    for (int i = 0; i < M; ++i)
      for (int v = 0; v < V; ++v) acc[i][v] = hn::Zero(d);
    for (int64_t k = 0; k < K; ++k) {
      const float* HWY_RESTRICT r = b + k * ldb + j;
      VF w[V];
      for (int v = 0; v < V; ++v) w[v] = hn::LoadU(d, r + v * N);
      for (int i = 0; i < M; ++i) {
        const VF s = hn::Set(d, a[i * lda + k]);
        for (int v = 0; v < V; ++v) acc[i][v] = hn::MulAdd(s, w[v], acc[i][v]);
      }
    }
    for (int i = 0; i < M; ++i)
      for (int v = 0; v < V; ++v) finish(i, j + v * N, acc[i][v]);
  }
  for (; j + N <= col1; j += N) {
    VF acc[M];
    for (int i = 0; i < M; ++i) acc[i] = hn::Zero(d);
    for (int64_t k = 0; k < K; ++k) {
      const VF w = hn::LoadU(d, b + k * ldb + j);
      for (int i = 0; i < M; ++i) acc[i] = hn::MulAdd(hn::Set(d, a[i * lda + k]), w, acc[i]);
    }
    for (int i = 0; i < M; ++i) finish(i, j, acc[i]);
  }
  for (; j < col1; ++j) {
    for (int i = 0; i < M; ++i) {
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k) s = std::fma(a[i * lda + k], b[k * ldb + j], s);
      float& out = c[i * ldc + j];
      if (beta != 0.0f) s = std::fma(beta, out, s);
      if (c_row != nullptr) s += c_row[j];
      out = s;
    }
  }
}

void DotRows(int64_t m, int64_t K, const float* a, int64_t lda, const float* b, bool trans_b,
             int64_t ldb, int64_t col0, int64_t col1, float beta, float* c, int64_t ldc,
             const float* c_row) {
  if (!trans_b) {
    if (m == 1) {
      CombineRowsM<1>(K, a, lda, b, ldb, col0, col1, beta, c, ldc, c_row);
    } else {
      CombineRowsM<2>(K, a, lda, b, ldb, col0, col1, beta, c, ldc, c_row);
    }
    return;
  }
  switch (m) {
    case 1: DotRowsM<1>(K, a, lda, b, ldb, col0, col1, beta, c, ldc, c_row); break;
    case 2: DotRowsM<2>(K, a, lda, b, ldb, col0, col1, beta, c, ldc, c_row); break;
    case 3: DotRowsM<3>(K, a, lda, b, ldb, col0, col1, beta, c, ldc, c_row); break;
    default: DotRowsM<4>(K, a, lda, b, ldb, col0, col1, beta, c, ldc, c_row); break;
  }
}

// C = alpha·op(A)·B + beta·C for k <= kFewTerms, B [k, n] (row stride ldb):
// each element's k FMAs in registers, 8 vectors of a row of C at a time, and
// C written once (read once where beta != 0; never where it is 0, BLAS's
// rule). A pass per term over C's rows instead (each row in L1) ran at half
// oneDNN's f32 rate at k = 4; this runs k = 1 and 4 at 2-5x that rate, but
// k = 8 only at about it and k = 16 at a third (B no longer in L1), hence
// kFewTerms (bench_gemm BM_batch m 1024, n 1024, Zen 5). The columns past
// the last whole chunk take the same FMAs, a vector at a time: an element's
// bits do not depend on where a split of the columns puts it.
void FewTerms(bool trans_a, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const DF d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t chunk = kFewVectors * N;
  // B copied with a row stride 64 bytes past a multiple of 64 (it is read
  // once per row of C): B's rows as stored often lie a multiple of 4 KB
  // apart (n = 1024), where all k of them fall in one of L1's 8- or 12-way
  // sets.
  const int64_t ldp = (n + 15) / 16 * 16 + 16;
  thread_local std::vector<float> copy;
  copy.resize(static_cast<std::size_t>(k * ldp));
  float* HWY_RESTRICT bp = copy.data();  // (thread_local: its address once)
  for (int64_t kk = 0; kk < k; ++kk) {
    std::copy(b + kk * ldb, b + kk * ldb + n, bp + kk * ldp);
    std::fill(bp + kk * ldp + n, bp + (kk + 1) * ldp, 0.0f);  // read by the tail's vectors
  }
  float coef[kFewTerms];
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t kk = 0; kk < k; ++kk)
      coef[kk] = alpha * (trans_a ? a[kk * lda + i] : a[i * lda + kk]);
    float* HWY_RESTRICT cr = c + i * ldc;
    int64_t j = 0;
    for (; j + chunk <= n; j += chunk) {
      VF acc[kFewVectors];
      for (int v = 0; v < kFewVectors; ++v)
        acc[v] =
            beta != 0.0f ? hn::Mul(hn::Set(d, beta), hn::LoadU(d, cr + j + v * N)) : hn::Zero(d);
      for (int64_t kk = 0; kk < k; ++kk) {
        const VF s = hn::Set(d, coef[kk]);
        const float* HWY_RESTRICT br = bp + kk * ldp + j;
        for (int v = 0; v < kFewVectors; ++v)
          acc[v] = hn::MulAdd(s, hn::LoadU(d, br + v * N), acc[v]);
      }
      for (int v = 0; v < kFewVectors; ++v) hn::StoreU(acc[v], d, cr + j + v * N);
    }
    // The columns past the last whole chunk, a vector at a time, and the
    // last few through a vector's worth of scratch (B's from its copy, zeros
    // past n; a masked load or store of Highway's SSE4 and AVX2 targets
    // touches the whole vector's memory).
    for (; j + N <= n; j += N) {
      VF acc = beta != 0.0f ? hn::Mul(hn::Set(d, beta), hn::LoadU(d, cr + j)) : hn::Zero(d);
      for (int64_t kk = 0; kk < k; ++kk)
        acc = hn::MulAdd(hn::Set(d, coef[kk]), hn::LoadU(d, bp + kk * ldp + j), acc);
      hn::StoreU(acc, d, cr + j);
    }
    if (j < n) {
      const int64_t live = n - j;
      alignas(64) float tail[HWY_MAX_BYTES / sizeof(float)] = {};
      VF acc = hn::Zero(d);
      if (beta != 0.0f) {
        std::copy(cr + j, cr + j + live, tail);
        acc = hn::Mul(hn::Set(d, beta), hn::Load(d, tail));
      }
      for (int64_t kk = 0; kk < k; ++kk)
        acc = hn::MulAdd(hn::Set(d, coef[kk]), hn::LoadU(d, bp + kk * ldp + j), acc);
      hn::Store(acc, d, tail);
      std::copy(tail, tail + live, cr + j);
    }
  }
}

}  // namespace seqpack::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace seqpack::cpu {

HWY_EXPORT(PanelWidth);
HWY_EXPORT(GemmPackedSmall);
HWY_EXPORT(GemmUnpackedSmall);
HWY_EXPORT(PackPanel);
HWY_EXPORT(FewTerms);
HWY_EXPORT(DotRows);

void gemm_dot_rows(IsaLevel cap, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                   const float* b, bool trans_b, int64_t ldb, float beta, float* c, int64_t ldc,
                   const float* c_row) {
  if (m <= 0 || n <= 0) return;
  if (m > (trans_b ? kDotRowsMax : kDotRowsEngine)) {
    throw std::invalid_argument("gemm_dot_rows: m = " + std::to_string(m) + " exceeds " +
                                std::to_string(trans_b ? kDotRowsMax : kDotRowsEngine));
  }
  const auto run = SEQPACK_HWY_DISPATCH(DotRows, cap);
  // Split over the threads by blocks of columns where the weights are large
  // enough to pay for a parallel region (the bits do not depend on it).
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const int64_t blocks = std::min<int64_t>(threads, n / 64);
  if (blocks > 1 && n * k >= kParallelDotElements) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < blocks; ++t) {
      const int64_t j0 = n * t / blocks / 4 * 4;
      const int64_t j1 = t + 1 == blocks ? n : n * (t + 1) / blocks / 4 * 4;
      run(m, k, a, lda, b, trans_b, ldb, j0, j1, beta, c, ldc, c_row);
    }
    return;
  }
  run(m, k, a, lda, b, trans_b, ldb, 0, n, beta, c, ldc, c_row);
}

void gemm_few_terms(IsaLevel cap, bool trans_a, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                    int64_t ldc) {
  if (k > kFewTerms) {
    throw std::invalid_argument("gemm_few_terms: k = " + std::to_string(k) + " exceeds " +
                                std::to_string(kFewTerms));
  }
  SEQPACK_HWY_DISPATCH(FewTerms, cap)(trans_a, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

constexpr int64_t kParallelPackElements = 1 << 17;  // 512 KB of weights

void pack_weights(const float* b, bool trans_b, int64_t k, int64_t n, int64_t ldb,
                  PackedWeights& out, IsaLevel cap) {
  const int64_t W = SEQPACK_HWY_DISPATCH(PanelWidth, cap)();
  const int64_t panels = (n + W - 1) / W;
  const std::size_t need = static_cast<std::size_t>(panels * k * W + 16);
  if (out.storage.size() < need) out.storage.resize_for_overwrite(need);
  const auto addr = reinterpret_cast<std::uintptr_t>(out.storage.data());
  out.offset = static_cast<int64_t>(((64 - addr % 64) % 64) / sizeof(float));
  out.k = k;
  out.n = n;
  out.width = W;
  out.cap = cap;
  float* dst = out.storage.data() + out.offset;
  // A large matrix packed outside a parallel region (one direction whose steps
  // are split over threads) is split over the threads by panels: done on one
  // thread, the other threads would wait for it.
  const bool split = k * n >= kParallelPackElements && !omp_in_parallel();
  const auto pack_panel = SEQPACK_HWY_DISPATCH(PackPanel, cap);
  if (split) {
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; ++p) pack_panel(b, trans_b, k, n, ldb, p, dst + p * k * W);
  } else {
    // No parallel region at all: opening one costs more than packing a small matrix.
    for (int64_t p = 0; p < panels; ++p) pack_panel(b, trans_b, k, n, ldb, p, dst + p * k * W);
  }
}

void gemm_packed_small(int64_t m, const float* a, int64_t lda, const PackedWeights& b, int64_t col0,
                       int64_t col1, float beta, float* c, int64_t ldc, const float* const* init) {
  if (m <= 0 || col1 <= col0) return;
  SEQPACK_HWY_DISPATCH(GemmPackedSmall, b.cap)
  (m, a, lda, b.panels(), b.k, b.width, col0, col1, beta, c, ldc, init);
}

void gemm_unpacked_small(IsaLevel cap, int64_t m, const float* a, int64_t lda, const float* b,
                         bool trans_b, int64_t k, int64_t n, int64_t ldb, int64_t col0,
                         int64_t col1, float beta, float* c, int64_t ldc,
                         const float* const* init) {
  if (m <= 0 || col1 <= col0) return;
  SEQPACK_HWY_DISPATCH(GemmUnpackedSmall, cap)
  (m, a, lda, b, trans_b, k, n, ldb, col0, col1, beta, c, ldc, init);
}

}  // namespace seqpack::cpu
#endif  // HWY_ONCE
