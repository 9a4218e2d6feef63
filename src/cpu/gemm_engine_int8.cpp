// The int8 engine: forward products on u8 rows and s8 weights (cpu/gemm_int8.h).
//
// Each product quantizes its A rows itself, per row, into the calling
// thread's staging: the time loop's h rows stay fp32 (no sink), and a row's
// quantization needs all of its values, which a kernel writing a column range
// does not have. Two threads splitting a step's columns each quantize all of
// its rows: k values a row against k * n / threads multiply-adds, a fraction
// of a percent.
//
// Weights come quantized from the model's plan (lay_out_weights, once per
// model: rnn_make_plan), handed to each product (GemmOperand::laid_out,
// prepare()'s laid_out), or are quantized per product (prepare: once per
// call, layer and direction; gemm: per call) without one.
#include <omp.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "cpu/cpu_info.h"
#include "cpu/gemm_engine.h"
#include "cpu/gemm_int8.h"

namespace seqpack::cpu {

namespace {

// Weights quantized by lay_out_weights (the model's plan).
struct Int8Weights : WeightLayout {
  QuantizedWeights w;
};

struct Int8Operand : StepOperand {
  QuantizedWeights own;                 // when not laid out before
  const QuantizedWeights* w = nullptr;  // own or the laid-out ones
  std::vector<ColumnRange> ranges;
};

QuantizedRows& thread_rows() {
  thread_local QuantizedRows rows;
  return rows;
}

// Rows per task of a whole-batch product: enough to fill the register blocks
// and amortise a column block's trip through L1.
constexpr int64_t kRowsPerTask = 48;

// Column blocks of a whole-batch product on `threads` threads: B (k·n bytes)
// cut into slices of at most 256 KB, which stay in a core's L2 across its row
// tasks, at most one a thread and at least 512 columns each. Rows alone made
// every task read all of B for 48 rows: lstm-long-tail's input projection (B
// 1 MB, 910 rows) took 0.7 ms at 8 threads and 1.1-2.1 ms at 16 on the GPU
// machine's AMX Xeon, every thread streaming B from L3; in four blocks its
// forward went from 5.0 to 4.6 ms at 8 threads and 5.0 to 4.3 at 16. Each
// block quantizes its rows again (k values a row against k·n/blocks
// multiply-adds): lstm-bi-2layer's second layer (B 2 MB) in blocks of 256
// columns ran 15% slower at 8 threads, hence the 512.
int64_t column_blocks(int64_t k, int64_t n, int threads) {
  if (threads <= 1) return 1;
  const int64_t by_bytes = (k * n + (256 << 10) - 1) / (256 << 10);
  return std::clamp<int64_t>(std::min<int64_t>(by_bytes, threads), 1,
                             std::max<int64_t>(n / 512, 1));
}

class Int8Engine : public GemmEngine<float> {
 public:
  Int8Engine(Int8Kernel kernel, IsaLevel cap) : kernel_(kernel), cap_(cap) {}

  void gemm(const GemmProduct<float>& p) const override {
    if (p.a.trans || p.a.kept) {
      throw std::logic_error("the int8 engine runs forward products only, not op(A)ᵀ·op(B)");
    }
    if (p.m == 0 || p.n == 0) return;
    const auto* laid_out = static_cast<const Int8Weights*>(p.b.laid_out);
    if (laid_out && !p.b.trans) {
      throw std::logic_error("the int8 engine's weights are laid out for W transposed only");
    }
    QuantizedWeights own;
    if (!laid_out) quantize_weights_s8(p.b.data, p.b.trans, p.k, p.n, p.b.ld, own, cap_);
    const QuantizedWeights& w = laid_out ? laid_out->w : own;
    // Tasks of kRowsPerTask rows by column blocks, a block's row tasks
    // adjacent, so that a thread's static share is mostly one block of B.
    // The bits of C do not depend on the split (gemm_int8.h).
    const int64_t row_tasks = (p.m + kRowsPerTask - 1) / kRowsPerTask;
    const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    const int64_t blocks = column_blocks(p.k, p.n, threads);
    const int64_t tasks = row_tasks * blocks;
    const bool parallel = threads > 1 && tasks > 1;
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t block = t / row_tasks, r0 = (t % row_tasks) * kRowsPerTask;
      const int64_t rows = std::min(kRowsPerTask, p.m - r0);
      const int64_t c0 = block * p.n / blocks / 16 * 16;
      const int64_t c1 = block + 1 == blocks ? p.n : (block + 1) * p.n / blocks / 16 * 16;
      QuantizedRows& q = thread_rows();
      quantize_rows_u8(rows, p.k, p.a.data + r0 * p.a.ld, p.a.ld, q, kernel_);
      gemm_u8s8_f32(rows, q, 0, w, c0, c1, p.beta, p.c + r0 * p.ldc, p.ldc, nullptr, p.c_row);
    }
  }

  std::unique_ptr<WeightLayout> lay_out_weights(const float* b, bool trans_b, int64_t k,
                                                int64_t n, int64_t ldb) const override {
    auto q = std::make_unique<Int8Weights>();
    quantize_weights_s8(b, trans_b, k, n, ldb, q->w, cap_);
    return q;
  }

  std::unique_ptr<StepOperand> prepare(const float* b, bool trans_b, int64_t k, int64_t n,
                                       int64_t ldb, const std::vector<ColumnRange>& ranges,
                                       const WeightLayout* laid_out) const override {
    auto op = std::make_unique<Int8Operand>();
    op->k = k;
    op->n = n;
    op->ranges = ranges;
    if (laid_out) {
      op->w = &static_cast<const Int8Weights*>(laid_out)->w;
    } else {
      quantize_weights_s8(b, trans_b, k, n, ldb, op->own, cap_);
      op->w = &op->own;
    }
    return op;
  }

  void step(int64_t m, const float* a, int64_t lda, const StepOperand& sb, std::size_t range,
            float beta, float* c, int64_t ldc, const float* const* init, const OperandRows*,
            int64_t) const override {
    const auto& op = static_cast<const Int8Operand&>(sb);
    const auto [c0, c1] = op.ranges[range];
    if (m == 0 || c1 <= c0) return;
    QuantizedRows& q = thread_rows();
    quantize_rows_u8(m, op.k, a, lda, q, kernel_);
    gemm_u8s8_f32(m, q, 0, *op.w, c0, c1, beta, c, ldc, init);
  }

  // A thread's gate blocks: its rows quantized once for all of them (one
  // step() per block would quantize every row again for each).
  void step_blocks(int64_t m, const float* a, int64_t lda, const StepOperand& sb,
                   std::size_t first, std::size_t count, float beta, float* c, int64_t ldc,
                   const float* const* init, const OperandRows*, int64_t) const override {
    const auto& op = static_cast<const Int8Operand&>(sb);
    if (m == 0) return;
    QuantizedRows& q = thread_rows();
    quantize_rows_u8(m, op.k, a, lda, q, kernel_);
    for (std::size_t r = first; r < first + count; ++r) {
      const auto [c0, c1] = op.ranges[r];
      if (c1 > c0) gemm_u8s8_f32(m, q, 0, *op.w, c0, c1, beta, c, ldc, init);
    }
  }

  bool takes_init() const override { return true; }

  // A column split has each thread quantize all of a step's rows; a row
  // split, only its own, and one product per thread and step, while B stays
  // in a core's L2 (the bf16 engine's rule, at a byte a weight): lstm-
  // sentences' W_hh (256 x 1024) ran 3.2-3.6 ms by columns at 16 threads on
  // the GPU machine's AMX Xeon, against bf16's 1.3-2.0 by rows.
  bool steps_by_rows(int64_t k, int64_t n, bool) const override { return fits_row_split(k, n, 1); }

 private:
  Int8Kernel kernel_;  // the rows' quantization and the products' kernel
  IsaLevel cap_;       // the weights' quantization's
};

}  // namespace

const GemmEngine<float>& int8_engine(const Kernels& kernels) {
  // One per kernel and cap, made on first use and kept.
  static std::mutex mutex;
  static std::map<std::pair<Int8Kernel, IsaLevel>, std::unique_ptr<Int8Engine>> made;
  const auto key = std::make_pair(int8_kernel(kernels), kernels.isa_cap);
  const std::lock_guard<std::mutex> lock(mutex);
  auto& engine = made[key];
  if (!engine) engine = std::make_unique<Int8Engine>(key.first, key.second);
  return *engine;
}

}  // namespace seqpack::cpu
