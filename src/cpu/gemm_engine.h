// GEMM engines of the recurrent core: every matrix product of a forward or
// backward goes through one engine, chosen once per call from the element type
// and the precision (RNNOptions::precision). The time loop does not know which
// engine it runs; adding a precision means adding an engine.
//
// Two kinds of product:
//   gemm()            whole-batch products (input projection, dX, dW): cpu::gemm's
//                     contract, C = op(A)·op(B) + beta·C, or c_row + op(A)·op(B);
//   prepare()/step()  the per-step products of a step's live rows with one weight
//                     matrix (W_hh, W_hr): the matrix is laid out once per call
//                     (layer and direction) for the column ranges the threads
//                     will ask for (one range, all columns, when the threads
//                     split the rows: steps_by_rows), then multiplied by
//                     1..batch rows per step.
//
// Engines:
//   f64        BLAS (dgemm) for everything: the float64 path the gradient checks use;
//   f32        oneDNN's f32 matmul for the whole-batch products (1.0-1.4x
//              OpenBLAS's sgemm on them: bench_gemm BM_batch),
//              cpu::gemm_packed_small for the steps (W_hh packed once per call;
//              faster than both on the steps' row counts: BM_step): PyTorch-exact;
//   bf16       oneDNN matmul, bf16 operands, fp32 accumulation and results,
//              primitives cached per shape and thread, weights laid out once
//              per model plan into the layout the primitive asks for;
//              products of a few rows on seqpack's kernels with oneDNN's
//              bits, on the fp32 weights in place (up to 64 rows, a call
//              that meets them first) or on that layout (one row)
//              (cpu/gemm_bf16_rows.h);
//   int8       inference: u8 rows (quantized per row) times s8 weights
//              (per column), int32 accumulation on AMX-INT8, AVX512-VNNI, AVX2 or
//              scalar (cpu/gemm_int8.h), fp32 results
//              (cpu/gemm_int8.h); forward products only.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "cpu/isa_cap.h"
#include "cpu/operand_rows.h"
#include "cpu/row_sink.h"
#include "seqpack/precision.h"

namespace seqpack::cpu {

// A weight matrix laid out by an engine for its step products (opaque).
struct StepOperand {
  virtual ~StepOperand() = default;
  int64_t k = 0, n = 0;
};

// A weight matrix laid out once per model by an engine that reads its
// weights in another form (int8: quantized), for every product that
// multiplies by it: whole-batch ones (GemmOperand::laid_out) and the steps'
// (prepare()'s `laid_out`). Engines that read weights as they are have none
// (opaque).
struct WeightLayout {
  virtual ~WeightLayout() = default;
};

using ColumnRange = std::pair<int64_t, int64_t>;  // [first, last) columns

// One operand of a whole-batch product: op(X), X row-major with row stride
// ld (transposed where trans). With `kept` (rows in the form product_form()
// names for this product, cpu/operand_rows.h), X's stored rows are its rows
// from kept_row on, and data is not read.
template <typename T>
struct GemmOperand {
  const T* data = nullptr;
  int64_t ld = 0;
  bool trans = false;
  const OperandRows* kept = nullptr;
  int64_t kept_row = 0;
  // B only: the matrix data points at as the engine's lay_out_weights() laid
  // it out for the model's forward products (data, ld and trans describe
  // this product's op(B) of it). An engine reads it where it serves the
  // product: bf16's serves op(B) transposed or not (a blocked layout per
  // orientation: the backward's dX reads W_ih's); int8's quantized weights,
  // which only forwards read, the forward's op(B).
  const WeightLayout* laid_out = nullptr;
  // B only: this product's call reads the weights where they are (a call
  // of few steps meeting them first: rnn::in_place_steps) where the engine
  // can; laid_out's layouts are then not made for it.
  bool in_place = false;
};

// A whole-batch product: C[m, n] = op(A)[m, k]·op(B)[k, n] + beta·C, or,
// with c_row, c_row (broadcast over the rows) + op(A)·op(B) (beta unused).
template <typename T>
struct GemmProduct {
  int64_t m = 0, n = 0, k = 0;
  GemmOperand<T> a, b;
  T beta = T(0);
  T* c = nullptr;
  int64_t ldc = 0;
  const T* c_row = nullptr;
};

template <typename T>
class GemmEngine {
 public:
  virtual ~GemmEngine() = default;

  // The product p (cpu::gemm's contract with alpha = 1). Called outside the
  // time loop's parallel regions (may use every thread).
  virtual void gemm(const GemmProduct<T>& p) const = 0;

  // The form in which gemm() of these sizes (op(A) [m, k]) reads A: where
  // the caller keeps A's rows in it (cpu/operand_rows.h, GemmOperand::kept),
  // the product reads them instead of converting A; none where the engine
  // reads A as it is (or would not convert that product's).
  virtual SinkElement product_form(int64_t m, int64_t n, int64_t k) const {
    return SinkElement::none;
  }

  // The form in which step() products with b read A where they are given
  // its rows (step()'s `rows`); none where they read A as it is (fp32, or a
  // product the engine runs in fp32).
  virtual SinkElement step_form(const StepOperand& b) const { return SinkElement::none; }

  // B = op(b) [k, n] in the form the engine's products read, once per model
  // (the model's plan), or null where it reads weights as they are.
  virtual std::unique_ptr<WeightLayout> lay_out_weights(const T* b, bool trans_b, int64_t k,
                                                        int64_t n, int64_t ldb) const {
    return nullptr;
  }

  // Lays out B = op(b) [k, n] for step() on each of `ranges` (columns of B);
  // from `laid_out` (lay_out_weights' of the same matrix) where given.
  virtual std::unique_ptr<StepOperand> prepare(const T* b, bool trans_b, int64_t k, int64_t n,
                                               int64_t ldb, const std::vector<ColumnRange>& ranges,
                                               const WeightLayout* laid_out = nullptr) const = 0;

  // prepare() for a call whose steps are too few to repay a layout (one
  // step: a decoder's or a sampler's call): B is read where it is, b must
  // outlive the operand, and the products give prepare()'s bits. Engines
  // whose steps read a layout they cannot make per product lay out as
  // prepare() does (from `laid_out` where given: int8's quantized weights).
  virtual std::unique_ptr<StepOperand> prepare_in_place(
      const T* b, bool trans_b, int64_t k, int64_t n, int64_t ldb,
      const std::vector<ColumnRange>& ranges, const WeightLayout* laid_out = nullptr) const {
    return prepare(b, trans_b, k, n, ldb, ranges, laid_out);
  }

  // C[:m, r) = A[:m, :k]·B[:, r) + beta·C[:m, r) for the range r = ranges[range]
  // given to prepare(); c points at column 0 of C. With `init` (m row
  // pointers; only when takes_init()), row i starts from init[i][r) instead.
  // With `rows` in step_form(b) (b.k columns), A's rows are its rows
  // row.., written before the call, and a is not read; otherwise (no rows,
  // or step_form(b) none) a is. Safe to call from several threads at once on
  // different ranges.
  virtual void step(int64_t m, const T* a, int64_t lda, const StepOperand& b, std::size_t range,
                    T beta, T* c, int64_t ldc, const T* const* init = nullptr,
                    const OperandRows* rows = nullptr, int64_t row = 0) const = 0;

  // step() over the `count` ranges first, first + 1, ... (one thread's
  // blocks of a column split: rnn::step_range of blocks 0..count-1), as one
  // product where the engine can (oneDNN: one call for the thread's columns
  // of every gate, laid out together on first use, instead of one call per
  // gate; the time loop calls step() per range instead where its model's
  // config says so: RNNConfig::step_groups). The same
  // contract as step() for each range.
  virtual void step_blocks(int64_t m, const T* a, int64_t lda, const StepOperand& b,
                           std::size_t first, std::size_t count, T beta, T* c, int64_t ldc,
                           const T* const* init = nullptr, const OperandRows* rows = nullptr,
                           int64_t row = 0) const {
    for (std::size_t q = 0; q < count; ++q)
      step(m, a, lda, b, first + q, beta, c, ldc, init, rows, row);
  }

  // Whether step() takes init rows (else the caller copies them into C).
  virtual bool takes_init() const { return false; }

  // How the time loop's threads share the steps' products with a [k, n]
  // weight matrix: false, by columns (each thread multiplies all of the
  // step's rows by its ranges of B, one per gate block); true, by rows (each
  // thread multiplies its rows by all of B, range 0, into dense rows of C).
  // An engine whose calls cost much more than their multiply-adds at a step's
  // sizes, or that needs a dense destination, prefers rows (one call per
  // thread and step instead of one per gate) while all of B stays in a
  // core's cache. `backward`: for a backward's steps, whose row split also
  // sums each thread's rows of the bias gradients apart (other bits than one
  // thread's).
  virtual bool steps_by_rows(int64_t k, int64_t n, bool backward) const { return false; }
};

// The engines' rule for preferring rows (steps_by_rows): a [k, n] B of
// `bytes` a weight takes at most half a core's L2 (Zen 4: 1 MB), since each
// thread of a row split reads all of it every step.
inline bool fits_row_split(int64_t k, int64_t n, int64_t bytes) {
  return k * n * bytes <= (512 << 10);
}

// The engine for this element type and precision on `kernels` (an instance
// per setting that changes its products: the ISA cap, bf16's emulation, the
// int8 kernel). bf16 requires float and bf16 dot products, native or
// emulated (require_bf16_dot_products); emulated (kernels.bf16_emulated),
// its bf16 operands are widened to fp32 (exactly) and multiplied in fp32,
// each product of two bf16 values exact in fp32, so that only the order of
// the fp32 sums differs from the bf16 units': bf16 then runs on any CPU
// (slower than fp32). int8 runs int8_kernel(kernels) (cpu/gemm_int8.h).
const GemmEngine<float>& gemm_engine_f32(Precision precision, const Kernels& kernels);
const GemmEngine<double>& gemm_engine_f64();

// The int8 engine (src/cpu/gemm_engine_int8.cpp): forward products only.
const GemmEngine<float>& int8_engine(const Kernels& kernels);

// oneDNN's bf16 engine (src/cpu/gemm_onednn.cpp).
const GemmEngine<float>& onednn_bf16_engine(const Kernels& kernels);

// Every product in oneDNN at this precision, steps included (blocked weights)
// and with no fp32 fall-back: oneDNN's own rate, which bench_gemm's
// BM_workload_gemms measures for compare_torch.py.
const GemmEngine<float>& onednn_engine(Precision precision, const Kernels& kernels);

// Where the bf16 engine really multiplies in bf16. Products too small for it
// to pay run in fp32 instead (more accurate, and faster there: a oneDNN call
// and the operand conversion cost more than the product): whole-batch
// products of under 2^21 multiply-adds, and step products whose weights
// (columns of one range) have at most 8192 elements (bench_gemm
// BM_engine_step: 64x64 weights run at 10-80 GFLOP/s in bf16 against 50-95
// in fp32).
bool bf16_product(int64_t m, int64_t n, int64_t k);
// The blocks of k (values) in which the bf16 engine's products of m rows
// (up to 64: those it reads weights in place for) by [k, n] weights sum on
// seqpack's kernels here
// (cpu/gemm_bf16_rows.h), oneDNN's, found once per shape and thread context;
// 0 where those kernels do not run it (not available, or none gives
// oneDNN's bits: oneDNN runs it).
int64_t bf16_few_rows_k_block(int64_t m, int64_t k, int64_t n, const Kernels& kernels);
// How many of the oneDNN primitives created so far run oneDNN's reference
// (unoptimised) kernel; tests check it stays 0.
int64_t onednn_reference_primitives();
// oneDNN matmul primitives made so far (each is kept per shape, calling
// thread and thread count), for the tests.
int64_t onednn_primitives_made();
bool bf16_step(int64_t k, int64_t n);

// op(b) [k, n] (b transposed where trans, row stride ld) in a blocked bf16
// layout, three ways, for the tests: by oneDNN's reorder, and, where the
// layout is a pair blocking (bf16_blocked.h), by write_pair_blocked_bf16 and
// by its plain loops. The layout: oneDNN's 16a<n_block>b2a (n_block 16, 32,
// 48 or 64; any CPU), or with n_block 0 the one oneDNN's bf16 matmul picks.
struct Bf16LayoutsForTest {
  bool pair_blocked = false;
  std::vector<uint16_t> onednn, written, reference;
};
Bf16LayoutsForTest bf16_layouts_for_test(const float* b, bool trans, int64_t k, int64_t n,
                                         int64_t ld, int64_t n_block);

// cpu::gemm's contract (alpha = 1) through oneDNN's f32 matmul, primitives
// cached per shape, strides and thread: the f32 engine's whole-batch products.
void onednn_gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                     int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                     const float* c_row);

// fp32 -> bf16, round to nearest even, NaN kept NaN (quiet), subnormals flushed
// to zero (as AVX512-BF16's vcvtneps2bf16 does).
void f32_to_bf16(const float* src, uint16_t* dst, int64_t n);

}  // namespace seqpack::cpu
