// The BLAS-backed engines: f64 (dgemm everywhere) and f32 (sgemm for the
// whole-batch products, the packed small-row kernel for the steps).
#include "cpu/gemm_engine.h"

#include <stdexcept>
#include <string_view>

#include "cpu/cpu_info.h"
#include "cpu/gemm.h"

namespace seqpack::cpu {

namespace {

// A matrix used in place by the BLAS: op(B) column j starts at b + j (or
// b + j * ldb when transposed).
template <typename T>
struct BlasOperand : StepOperand {
  const T* b = nullptr;
  bool trans = false;
  int64_t ldb = 0;
  std::vector<ColumnRange> ranges;
};

template <typename T>
class BlasEngine : public GemmEngine<T> {
 public:
  // `cap`: the ISA cap of cpu::gemm's own kernels (float's few-term products).
  explicit BlasEngine(IsaLevel cap) : cap_(cap) {}

  void gemm(const GemmProduct<T>& p) const override {
    cpu::gemm<T>(p.a.trans, p.b.trans, p.m, p.n, p.k, T(1), p.a.data, p.a.ld, p.b.data, p.b.ld,
                 p.beta, p.c, p.ldc, cap_, p.c_row);
  }

  std::unique_ptr<StepOperand> prepare(const T* b, bool trans_b, int64_t k, int64_t n,
                                       int64_t ldb,
                                       const std::vector<ColumnRange>& ranges,
                                       const WeightLayout*) const override {
    auto op = std::make_unique<BlasOperand<T>>();
    op->k = k;
    op->n = n;
    op->b = b;
    op->trans = trans_b;
    op->ldb = ldb;
    op->ranges = ranges;
    return op;
  }

  void step(int64_t m, const T* a, int64_t lda, const StepOperand& sb, std::size_t range, T beta,
            T* c, int64_t ldc, const T* const* init, const OperandRows*, int64_t) const override {
    const auto& op = static_cast<const BlasOperand<T>&>(sb);
    const auto [c0, c1] = op.ranges[range];
    if (m == 0 || c1 <= c0) return;
    const T* b = op.trans ? op.b + c0 * op.ldb : op.b + c0;
    cpu::gemm<T>(false, op.trans, m, c1 - c0, op.k, T(1), a, lda, b, op.ldb, beta, c + c0, ldc,
                 cap_);
  }

 protected:
  IsaLevel cap_;
};

// W laid out once into column panels for gemm_packed_small (cpu/gemm.h), or
// (in_place) read where it is by gemm_unpacked_small.
struct PackedOperand : StepOperand {
  PackedWeights packed;
  std::vector<ColumnRange> ranges;
  bool in_place = false;
  const float* b = nullptr;  // in place: op(b) is B
  bool trans = false;
  int64_t ldb = 0;
};

// A PackedOperand of B [k, n] for these column ranges, B not yet given.
std::unique_ptr<PackedOperand> operand(int64_t k, int64_t n, const std::vector<ColumnRange>& ranges) {
  auto op = std::make_unique<PackedOperand>();
  op->k = k;
  op->n = n;
  op->ranges = ranges;
  return op;
}

// Whether oneDNN dispatches to AVX-512 (its f32 kernels there give the same
// bits at any thread count, which tests/test_rnn_threads.cpp relies on).
bool onednn_avx512() {
  static const bool yes = std::string_view(isa_name()).rfind("avx512", 0) == 0;
  return yes;
}

class F32Engine : public BlasEngine<float> {
 public:
  // The kernels of `cap` (gemm_packed_small's panels are laid out for its target).
  explicit F32Engine(IsaLevel cap) : BlasEngine<float>(cap) {}

  void gemm(const GemmProduct<float>& p) const override {
    // The weight gradients (dGᵀ·X, op(A) = Aᵀ, k the batch's rows) ran at
    // half of OpenBLAS's rate in oneDNN 2.6's f32 matmul below AVX-512 (Zen
    // 3, one thread, bench_gemm BM_batch m 1024, n 128 and 256, k 1316: 36-37
    // GFLOP/s against OpenBLAS's 67-73), half of a dense LSTM's training
    // backward: there they run on OpenBLAS, split over the threads by
    // cpu::gemm. Every other product stays on oneDNN, as fast or faster.
    // So do products of a few terms (k <= kFewTerms: a decoder step's
    // weight gradients), which cpu::gemm writes in one pass over C.
    if (p.a.trans && (!onednn_avx512() || (p.k <= kFewTerms && !p.b.trans))) {
      BlasEngine<float>::gemm(p);
      return;
    }
    // One or two rows by weights as stored (a call of one step's input
    // projection x·W_ihᵀ, or its input gradient dG·W_ih, at batch 1 or 2):
    // the weights read once at the rate of their rows (gemm_dot_rows), where
    // oneDNN 2.6's f32 matmul took 2-2.6x as long at one row (bench_gemm
    // BM_dot_rows, Zen 4).
    if (!p.a.trans && p.m <= kDotRowsEngine && p.k > 0) {
      gemm_dot_rows(cap_, p.m, p.n, p.k, p.a.data, p.a.ld, p.b.data, p.b.trans, p.b.ld, p.beta,
                    p.c, p.ldc, p.c_row);
      return;
    }
    onednn_gemm_f32(p.a.trans, p.b.trans, p.m, p.n, p.k, p.a.data, p.a.ld, p.b.data, p.b.ld,
                    p.beta, p.c, p.ldc, p.c_row);
  }

  std::unique_ptr<StepOperand> prepare(const float* b, bool trans_b, int64_t k, int64_t n,
                                       int64_t ldb,
                                       const std::vector<ColumnRange>& ranges,
                                       const WeightLayout*) const override {
    auto op = operand(k, n, ranges);
    pack_weights(b, trans_b, k, n, ldb, op->packed, cap_);
    return op;
  }

  std::unique_ptr<StepOperand> prepare_in_place(const float* b, bool trans_b, int64_t k, int64_t n,
                                                int64_t ldb, const std::vector<ColumnRange>& ranges,
                                                const WeightLayout* = nullptr) const override {
    auto op = operand(k, n, ranges);
    op->in_place = true;
    op->b = b;
    op->trans = trans_b;
    op->ldb = ldb;
    return op;
  }

  void step(int64_t m, const float* a, int64_t lda, const StepOperand& sb, std::size_t range,
            float beta, float* c, int64_t ldc, const float* const* init, const OperandRows*,
            int64_t) const override {
    const auto& op = static_cast<const PackedOperand&>(sb);
    const auto [c0, c1] = op.ranges[range];
    if (m == 0) return;
    if (op.in_place) {
      gemm_unpacked_small(cap_, m, a, lda, op.b, op.trans, op.k, op.n, op.ldb, c0, c1, beta, c, ldc,
                          init);
    } else {
      gemm_packed_small(m, a, lda, op.packed, c0, c1, beta, c, ldc, init);
    }
  }

  bool takes_init() const override { return true; }

  // Forwards as the bf16 engine: whole sequences per thread while W_hh fits
  // half a core's L2 (each thread reads all of it, with no barrier in the
  // steps), columns above; the outputs are the same bits either way. On 2
  // vCPUs of a Skylake-SP class Xeon, 2 threads against 1 went from 1.2-1.5x
  // to about 1.9x (gru-chars, 196 KB), from 1.15x to 1.5x (lstm-long-seq,
  // 256 KB: the work rule gave its column split one thread) and from 1.0x to
  // 1.3x (rnn-tanh-tiny, 16 KB). Backwards by columns: fp32's gradients are
  // the same bits at every thread count, which a row split's per-thread bias
  // sums are not.
  bool steps_by_rows(int64_t k, int64_t n, bool backward) const override {
    return !backward && fits_row_split(k, n, sizeof(float));
  }
};

}  // namespace

const GemmEngine<float>& gemm_engine_f32(Precision precision, const Kernels& kernels) {
  static const F32Engine f32[] = {F32Engine(IsaLevel::sse4),      F32Engine(IsaLevel::avx2),
                                  F32Engine(IsaLevel::avx3),      F32Engine(IsaLevel::avx3_dl),
                                  F32Engine(IsaLevel::avx3_zen4), F32Engine(IsaLevel::avx512)};
  if (precision == Precision::bf16) {
    require_bf16_dot_products(kernels);
    return onednn_bf16_engine(kernels);
  }
  if (precision == Precision::int8) return int8_engine(kernels);
  return f32[static_cast<int>(kernels.isa_cap)];
}

const GemmEngine<double>& gemm_engine_f64() {
  // (float64's products run on BLAS and plain loops: no cap applies)
  static const BlasEngine<double> f64(IsaLevel::avx512);
  return f64;
}

}  // namespace seqpack::cpu
