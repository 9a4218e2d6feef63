// The small-row GEMM of gemm.h (gemm_packed_small) in Highway SIMD, compiled
// per x86 target and chosen at run time like rnn_gates_f32_hwy.cpp.
//
// Each block keeps MR rows x NP panels x 2 vectors of C in registers and walks
// k once: per k it loads the NP panels' two vectors of B and broadcasts one
// element of A per row. At MR = 1 four panels run side by side so that eight
// independent FMA chains hide the FMA latency (one panel would leave the
// kernel latency-bound at two chains).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/gemm_small_f32_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>

#include "cpu/gemm.h"

HWY_BEFORE_NAMESPACE();
namespace seqpack::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

int64_t PanelWidth() { return 2 * static_cast<int64_t>(hn::Lanes(DF())); }

// tmp[i][jp * W + c] = A[i, :]·panel(p0 + jp)[:, c] for i < MR, jp < NP.
template <int MR, int NP>
HWY_INLINE void Block(int64_t K, const float* a, int64_t lda, const float* p, int64_t pstride,
                      float* tmp) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  VF acc[MR][NP][2];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NP; ++j) acc[i][j][0] = acc[i][j][1] = hn::Zero(d);
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
    for (int j = 0; j < NP; ++j) {
      hn::StoreU(acc[i][j][0], d, tmp + (i * NP + j) * 2 * L);
      hn::StoreU(acc[i][j][1], d, tmp + (i * NP + j) * 2 * L + L);
    }
}

// Runs Block over panels [p0, p1) for rows [0, MR) of a/c, writing only
// columns [col0, col1) of C.
template <int MR, int NP>
HWY_INLINE void Rows(int64_t K, const float* a, int64_t lda, const float* panels, int64_t W,
                     int64_t p0, int64_t p1, int64_t col0, int64_t col1, float beta, float* c,
                     int64_t ldc) {
  HWY_ALIGN float tmp[4 * 4 * 2 * HWY_MAX_BYTES / sizeof(float)];
  const int64_t pstride = K * W;
  auto write = [&](int64_t pbeg, int np) {
    for (int i = 0; i < MR; ++i) {
      for (int jp = 0; jp < np; ++jp) {
        const int64_t j0 = std::max(col0, (pbeg + jp) * W);
        const int64_t j1 = std::min(col1, (pbeg + jp + 1) * W);
        const float* t = tmp + (i * np + jp) * W;
        const int64_t base = (pbeg + jp) * W;
        float* cr = c + i * ldc;
        if (beta == 0.f) {
          for (int64_t j = j0; j < j1; ++j) cr[j] = t[j - base];
        } else {
          for (int64_t j = j0; j < j1; ++j) cr[j] = t[j - base] + beta * cr[j];
        }
      }
    }
  };
  int64_t p = p0;
  for (; p + NP <= p1; p += NP) {
    Block<MR, NP>(K, a, lda, panels + p * pstride, pstride, tmp);
    write(p, NP);
  }
  for (; p < p1; ++p) {
    Block<MR, 1>(K, a, lda, panels + p * pstride, pstride, tmp);
    write(p, 1);
  }
}

void GemmPackedSmall(int64_t m, const float* a, int64_t lda, const float* panels, int64_t K,
                     int64_t W, int64_t col0, int64_t col1, float beta, float* c, int64_t ldc) {
  const int64_t p0 = col0 / W, p1 = (col1 + W - 1) / W;
  int64_t i = 0;
  for (; i + 4 <= m; i += 4)
    Rows<4, 1>(K, a + i * lda, lda, panels, W, p0, p1, col0, col1, beta, c + i * ldc, ldc);
  switch (m - i) {
    case 3:
      Rows<3, 1>(K, a + i * lda, lda, panels, W, p0, p1, col0, col1, beta, c + i * ldc, ldc);
      break;
    case 2:
      Rows<2, 2>(K, a + i * lda, lda, panels, W, p0, p1, col0, col1, beta, c + i * ldc, ldc);
      break;
    case 1:
      Rows<1, 4>(K, a + i * lda, lda, panels, W, p0, p1, col0, col1, beta, c + i * ldc, ldc);
      break;
    default:
      break;
  }
}

}  // namespace seqpack::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace seqpack::cpu {

HWY_EXPORT(PanelWidth);
HWY_EXPORT(GemmPackedSmall);

void pack_weights(const float* b, bool trans_b, int64_t k, int64_t n, int64_t ldb,
                  PackedWeights& out) {
  const int64_t W = HWY_DYNAMIC_DISPATCH(PanelWidth)();
  const int64_t panels = (n + W - 1) / W;
  const std::size_t need = static_cast<std::size_t>(panels * k * W + 16);
  if (out.storage.size() < need) out.storage.resize(need);
  const auto addr = reinterpret_cast<std::uintptr_t>(out.storage.data());
  out.offset = static_cast<int64_t>(((64 - addr % 64) % 64) / sizeof(float));
  out.k = k;
  out.n = n;
  out.width = W;
  float* dst = out.storage.data() + out.offset;
  for (int64_t p = 0; p < panels; ++p) {
    float* panel = dst + p * k * W;
    const int64_t cols = std::min(W, n - p * W);
    if (trans_b) {
      // Column j of B is row j of b: copy it down the panel's column c.
      for (int64_t kk = 0; kk < k; ++kk) {
        float* row = panel + kk * W;
        for (int64_t c = 0; c < cols; ++c) row[c] = b[(p * W + c) * ldb + kk];
        for (int64_t c = cols; c < W; ++c) row[c] = 0.f;
      }
    } else {
      for (int64_t kk = 0; kk < k; ++kk) {
        float* row = panel + kk * W;
        const float* src = b + kk * ldb + p * W;
        for (int64_t c = 0; c < cols; ++c) row[c] = src[c];
        for (int64_t c = cols; c < W; ++c) row[c] = 0.f;
      }
    }
  }
}

void gemm_packed_small(int64_t m, const float* a, int64_t lda, const PackedWeights& b, int64_t col0,
                       int64_t col1, float beta, float* c, int64_t ldc) {
  if (m <= 0 || col1 <= col0) return;
  HWY_DYNAMIC_DISPATCH(GemmPackedSmall)
  (m, a, lda, b.panels(), b.k, b.width, col0, col1, beta, c, ldc);
}

}  // namespace seqpack::cpu
#endif  // HWY_ONCE
