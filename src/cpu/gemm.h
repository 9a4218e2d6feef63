// The one GEMM entry point of seqpack, with the BLAS argument list (row-major).
// Every matrix product in the library goes through here, so the BLAS in use
// (OpenBLAS through CBLAS) and its threading are decided in one place.
//
//   C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C
//
// op(X) is X or its transpose. lda/ldb/ldc are row strides in elements.
#pragma once

#include <cstdint>

namespace seqpack::cpu {

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// Number of threads OpenBLAS may use inside one gemm call. seqpack sets it to 1
// inside its own OpenMP regions so the two never oversubscribe the cores.
void set_blas_threads(int n);
int blas_threads();

}  // namespace seqpack::cpu
