#include "cpu/gemm.h"

#include <cblas.h>

extern "C" {
// OpenBLAS extensions (declared in its cblas.h on most builds; repeated here
// so the wrapper does not depend on which variant of the header is found).
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
}

namespace seqpack::cpu {

namespace {
inline CBLAS_TRANSPOSE tr(bool t) { return t ? CblasTrans : CblasNoTrans; }
}  // namespace

template <>
void gemm<float>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // BLAS leaves C untouched when k = 0 only if beta = 1; scale by hand.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.f ? 0.f : beta * c[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, tr(trans_a), tr(trans_b), static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

template <>
void gemm<double>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                  const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                  double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0 ? 0.0 : beta * c[i * ldc + j];
    return;
  }
  cblas_dgemm(CblasRowMajor, tr(trans_a), tr(trans_b), static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

void set_blas_threads(int n) { openblas_set_num_threads(n); }
int blas_threads() { return openblas_get_num_threads(); }

}  // namespace seqpack::cpu
