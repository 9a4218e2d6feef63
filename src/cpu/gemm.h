// The one GEMM entry point of seqpack, with the BLAS argument list (row-major).
// Every matrix product in the library goes through here, so the BLAS in use
// (OpenBLAS through CBLAS) and its threading are decided in one place.
//
//   C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C
//
// op(X) is X or its transpose. lda/ldb/ldc are row strides in elements.
//
// With `c_row` (n values), every row of C is set to c_row before the product is
// added (beta is then ignored): a bias broadcast over the rows, written by the
// thread that then computes those rows, right before it does. `cap`: the ISA
// cap of seqpack's own kernels among them (gemm_few_terms, float's products of
// few terms; a plan's or a front end's policy's, cpu/isa_cap.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cpu/isa_cap.h"
#include "cpu/scratch.h"

namespace seqpack::cpu {

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc, IsaLevel cap,
          const T* c_row = nullptr);

// Products of at most this many terms (k) with op(B) = B (a decoder step's
// weight gradients, dGᵀ·X with k the batch) run in gemm_few_terms instead of
// a BLAS call: each element's k multiply-adds in registers, C written once.
// Each element's sum is the same expression whatever the split, so the bits
// do not depend on the thread count.
constexpr int64_t kFewTerms = 4;

// C = alpha·op(A)·B + beta·C, k <= kFewTerms, B [k, n] as stored (row stride
// ldb); C is not read where beta is 0. Highway, on the target of `cap`.
void gemm_few_terms(IsaLevel cap, bool trans_a, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                    int64_t ldc);

// Products of a few rows of A by weights as stored, reading the weights once
// at the rate of their rows: C[i, :] = beta * C[i, :] + A[i, :]·op(b) (+ c_row
// where given), A [m, k] (row stride lda), op(b) [k, n]. With trans_b (b [n,
// k] row-major: a one-step call's input projection, x·W_ihᵀ) one dot product
// per output, for m <= kDotRowsMax; without (b [k, n]: its input gradient,
// dG·W_ih) one chain of FMAs over k per output, for m <= kDotRowsEngine. An
// output's bits do not depend on the thread count (a large product is split
// over the threads by columns). Highway, on the target of `cap`.
constexpr int64_t kDotRowsMax = 4;
// The rows up to which the fp32 engine runs such products here (faster than
// oneDNN's and the few-row kernels at 1 and 2 rows, not at 3 and 4: bench_gemm
// BM_dot_rows).
constexpr int64_t kDotRowsEngine = 2;
constexpr int64_t kParallelDotElements = 1 << 18;  // 1 MB of weights
void gemm_dot_rows(IsaLevel cap, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                   const float* b, bool trans_b, int64_t ldb, float beta, float* c, int64_t ldc,
                   const float* c_row);

// One thread pool: seqpack's threads are OpenMP's. gemm splits a large
// product over them itself (when called outside a parallel region), each
// part a single-threaded BLAS call. OpenBLAS's own pthreads pool is kept at
// one thread while seqpack works: two pools on the same cores oversubscribe
// them, each pool's idle threads spinning while the other's work.
//
// Keeps OpenBLAS at one thread for the guard's lifetime and restores the
// caller's setting after (a process that also runs torch keeps its own).
class BlasSingleThread {
 public:
  BlasSingleThread();
  ~BlasSingleThread();
  BlasSingleThread(const BlasSingleThread&) = delete;
  BlasSingleThread& operator=(const BlasSingleThread&) = delete;

 private:
  int saved_;
};

// OpenBLAS's own thread count (see BlasSingleThread).
void set_blas_threads(int n);
int blas_threads();
// The BLAS's description of itself (OpenBLAS: version, build and kernel).
std::string blas_config();

// A float32 right-hand matrix B [k, n] laid out once into column panels for
// gemm_packed_small. The per-step recurrent products multiply a step's live
// rows (1 to a few hundred) by the whole W_hh; sgemm re-packs all of W_hh at every
// call, which for a few rows costs more than the product itself. Packing once
// per call (layer and direction) removes that cost from every step.
//
// Layout: panels of `width` columns (two SIMD vectors of the target of
// `cap`, pack_weights'), each [k][width], columns past n zero-filled;
// gemm_packed_small dispatches to that target.
struct PackedWeights {
  int64_t k = 0, n = 0, width = 0;
  IsaLevel cap = IsaLevel::avx512;  // the ISA cap the panels are laid out for
  Scratch<float> storage;           // over-allocated so the panels start 64-byte aligned
  int64_t offset = 0;               // first element of the panels within storage
  const float* panels() const { return storage.data() + offset; }
};

// Lays B out for the target of `cap`: B[kk][j] = trans_b ? b[j * ldb + kk] :
// b[kk * ldb + j]. Reuses out's storage when it is large enough (no
// allocation when re-packing a matrix of the same size).
void pack_weights(const float* b, bool trans_b, int64_t k, int64_t n, int64_t ldb,
                  PackedWeights& out, IsaLevel cap);

// C[i, j] = A[i, :]·B[:, j] + beta * C[i, j] for rows i < m and columns
// col0 <= j < col1 of C (c points at column 0). A is [m, b.k] with row stride
// lda. At least as fast as sgemm for m = 1..256 on the recurrent layers'
// shapes (blocks of 6 rows over an L1-resident panel of B; fewer rows stream
// B once per <= 5 rows). For beta 0 (C never read) or 1, results do not
// depend on col0/col1, so splitting the columns between threads gives the
// bits of one call.
//
// With `init` (m row pointers), row i starts from init[i][j] instead of
// beta * C[i, j], and C is only written: a step whose gate rows are rows of a
// projected table (an embedding lookup) reads them straight from the table
// instead of copying them into C first. beta is then ignored.
void gemm_packed_small(int64_t m, const float* a, int64_t lda, const PackedWeights& b, int64_t col0,
                       int64_t col1, float beta, float* c, int64_t ldc,
                       const float* const* init = nullptr);

// gemm_packed_small on B = op(b) [k, n] as it is (the layout of pack_weights,
// trans_b and ldb as there), no layout kept: each call packs the panels of
// its columns into a per-thread scratch (in L2) a few at a time and
// multiplies all m rows by them. The same bits as pack_weights followed by
// gemm_packed_small; faster than the two where one product is all a layout
// would serve (a call of one step: the layout writes all of B out to memory
// and reads it back).
void gemm_unpacked_small(IsaLevel cap, int64_t m, const float* a, int64_t lda, const float* b,
                         bool trans_b, int64_t k, int64_t n, int64_t ldb, int64_t col0,
                         int64_t col1, float beta, float* c, int64_t ldc,
                         const float* const* init = nullptr);

}  // namespace seqpack::cpu
