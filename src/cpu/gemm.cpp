#include "cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <type_traits>

extern "C" {
// OpenBLAS extensions (declared in its cblas.h on most builds; repeated here
// so the wrapper does not depend on which variant of the header is found).
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
char* openblas_get_config(void);
}

namespace seqpack::cpu {

namespace {
inline CBLAS_TRANSPOSE tr(bool t) { return t ? CblasTrans : CblasNoTrans; }

inline void blas_call(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                      float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, tr(ta), tr(tb), static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}
inline void blas_call(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                      const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                      double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, tr(ta), tr(tb), static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

// C = alpha·op(A)·B + beta·C with k <= kFewTerms and B as it is: one pass
// over each row of C per term, none before them. BLAS's sgemm with beta 0
// zero-fills C first and then runs its kernel, two passes over C for a
// product of one multiply-add an element (a decoder step's weight gradients:
// dGᵀ·X with k = 1 row, GRU(500): 2 of the step's 6 MB written twice).
template <typename T>
void few_terms_call(bool trans_a, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                    int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    T* __restrict__ cr = c + i * ldc;
    for (int64_t kk = 0; kk < k; ++kk) {
      const T aik = alpha * (trans_a ? a[kk * lda + i] : a[i * lda + kk]);
      const T* __restrict__ br = b + kk * ldb;
      if (kk > 0) {
        for (int64_t j = 0; j < n; ++j) cr[j] += aik * br[j];
      } else if (beta == T(0)) {  // C is not read (BLAS's rule: a NaN there is dropped)
        for (int64_t j = 0; j < n; ++j) cr[j] = aik * br[j];
      } else {
        for (int64_t j = 0; j < n; ++j) cr[j] = beta * cr[j] + aik * br[j];
      }
    }
  }
}

// A BLAS call, or gemm_few_terms (float) / few_terms_call where it applies.
template <typename T>
void product_call(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                  int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc, IsaLevel cap) {
  if (k <= kFewTerms && !tb) {
    if constexpr (std::is_same_v<T, float>) {
      gemm_few_terms(cap, ta, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    } else {
      few_terms_call(ta, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
  } else {
    blas_call(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

// Below this many flops a product runs on one thread: the fork and join of
// a parallel region (a few microseconds) would cost more than it saves.
constexpr double kParallelFlops = 4.0e6;
constexpr int64_t kParallelFewTerms = 1 << 16;  // values of C

// Threads for a product of this size: OpenMP's count outside a parallel region
// (inside one the caller already splits the work), 1 for small products. A
// product of few terms (gemm_few_terms) writes C more than it multiplies:
// it splits by C's size, so that each thread writes its own rows (a decoder
// step's dW_ih of GRU(500) at batch 1, 1500 x 500 with k = 1, after a
// two-thread SGD step: its one-step train+SGD call went from 330 to 300 us,
// alternating runs, Zen 5, two threads).
int gemm_threads(int64_t m, int64_t n, int64_t k, bool few_terms) {
  if (omp_in_parallel()) return 1;
  const int nt = omp_get_max_threads();
  if (nt > 1 && few_terms && m * n >= kParallelFewTerms)
    return static_cast<int>(std::min<int64_t>(nt, std::max(m, n) / 32));
  if (nt <= 1 || 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) <
                     kParallelFlops) {
    return 1;
  }
  return static_cast<int>(std::min<int64_t>(nt, std::max(m, n) / 32));
}

// Rows [r0, r1) and columns [j0, j1) of C set to c_row.
template <typename T>
void fill_rows(T* c, int64_t ldc, const T* c_row, int64_t r0, int64_t r1, int64_t j0, int64_t j1) {
  for (int64_t i = r0; i < r1; ++i) {
    std::copy(c_row + j0, c_row + j1, c + i * ldc + j0);
  }
}

template <typename T>
void gemm_impl(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
               int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc, IsaLevel cap,
               const T* c_row) {
  if (m == 0 || n == 0) return;
  if (c_row) beta = T(1);
  if (k == 0) {
    // BLAS leaves C untouched when k = 0 only if beta = 1; scale by hand.
    if (c_row) {
      fill_rows(c, ldc, c_row, 0, m, 0, n);
      return;
    }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    return;
  }
  BlasSingleThread one;  // a no-op when the caller already holds one
  const int nt = gemm_threads(m, n, k, k <= kFewTerms && !trans_b);
  if (nt <= 1) {
    if (c_row) fill_rows(c, ldc, c_row, 0, m, 0, n);
    product_call(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, cap);
    return;
  }
  // Each thread computes a block of rows of C (or of columns, when C is
  // wider than tall) with a single-threaded BLAS call: the split depends only
  // on the sizes and the thread count, so results are deterministic for a
  // fixed count.
  const bool by_rows = m >= n;
#pragma omp parallel num_threads(nt)
  {
    const int64_t tid = omp_get_thread_num(), ways = omp_get_num_threads();
    const int64_t extent = by_rows ? m : n;
    // Blocks in multiples of 16 keep the BLAS kernels' full tiles.
    const int64_t units = (extent + 15) / 16;
    const int64_t lo = std::min(extent, units * tid / ways * 16);
    const int64_t hi = std::min(extent, units * (tid + 1) / ways * 16);
    if (hi > lo) {
      if (by_rows) {
        // Rows lo..hi of op(A): rows of A, or columns when A is transposed.
        const T* ab = trans_a ? a + lo : a + lo * lda;
        if (c_row) fill_rows(c, ldc, c_row, lo, hi, 0, n);
        product_call(trans_a, trans_b, hi - lo, n, k, alpha, ab, lda, b, ldb, beta, c + lo * ldc,
                     ldc, cap);
      } else {
        // Columns lo..hi of op(B): columns of B, or rows when B is transposed.
        const T* bb = trans_b ? b + lo * ldb : b + lo;
        if (c_row) fill_rows(c, ldc, c_row, 0, m, lo, hi);
        product_call(trans_a, trans_b, m, hi - lo, k, alpha, a, lda, bb, ldb, beta, c + lo, ldc,
                     cap);
      }
    }
  }
}
}  // namespace

BlasSingleThread::BlasSingleThread() : saved_(openblas_get_num_threads()) {
  if (saved_ != 1) openblas_set_num_threads(1);
}
BlasSingleThread::~BlasSingleThread() {
  if (saved_ != 1) openblas_set_num_threads(saved_);
}

template <>
void gemm<float>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc, IsaLevel cap, const float* c_row) {
  gemm_impl<float>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, cap, c_row);
}

template <>
void gemm<double>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                  const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                  double* c, int64_t ldc, IsaLevel cap, const double* c_row) {
  gemm_impl<double>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, cap, c_row);
}

void set_blas_threads(int n) { openblas_set_num_threads(n); }
int blas_threads() { return openblas_get_num_threads(); }
std::string blas_config() { return openblas_get_config(); }

}  // namespace seqpack::cpu
