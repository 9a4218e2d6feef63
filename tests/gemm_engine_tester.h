// GemmEngineTester: one GEMM engine (src/cpu/gemm_engine.h) against a plain
// float64 GEMM, in XNNPACK's style: a builder that names the product, and
// TestGemm() / TestStep() that draw random operands, run the engine and the
// reference and compare every element of C.
//
//   GemmEngineTester().precision(Precision::fp32).m(17).n(33).k(129)
//       .trans_b(true).beta(1).TestGemm();
//   GemmEngineTester().precision(Precision::bf16).m(3).width(129).blocks(4)
//       .k(33).threads(3).TestStep();
//
// The reference rounds what the engine rounds, with its own plain code: bf16
// operands to nearest even where the engine multiplies in bf16
// (cpu::bf16_product / bf16_step); int8 rows and weights are compared with
// the float product within the quantisation's own error (cpu/gemm_int8.h's
// scheme: a full step of each operand, per row and per column). The bound of
// an element is then 2 * u(fp32) * (k + 2) * Σ|a·b| (+ |beta·c|): a sum of k
// products accumulated in fp32, in any order.
//
// TestStep() lays the weights out once for the column ranges the time loop's
// threads ask for (rnn/grid.h's step_ranges over `threads` threads, `blocks`
// gate blocks of `width` columns each) and runs every thread's ranges from
// its own OpenMP thread (rnn::run_threads), as a step does; engines whose
// steps split by rows (steps_by_rows) get each thread's rows against range 0.
// With in_place, the weights are read where they are (prepare_in_place),
// and the products must also give the laid-out weights' bits.
// A failure names the element, both values, the bound and the seed.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_info.h"
#include "cpu/gemm_engine.h"
#include "rnn/grid.h"
#include "seqpack/precision.h"
#include "test_util.h"

namespace seqpack::testing {

class GemmEngineTester {
 public:
  GemmEngineTester& precision(Precision p) {
    precision_ = p;
    return *this;
  }
  GemmEngineTester& m(int64_t v) {
    m_ = v;
    return *this;
  }
  GemmEngineTester& n(int64_t v) {
    width_ = v;
    blocks_ = 1;
    return *this;
  }
  GemmEngineTester& k(int64_t v) {
    k_ = v;
    return *this;
  }
  // TestStep: B has blocks × width columns (the gates of W_hh), split per block.
  GemmEngineTester& width(int64_t v) {
    width_ = v;
    return *this;
  }
  GemmEngineTester& blocks(int64_t v) {
    blocks_ = v;
    return *this;
  }
  GemmEngineTester& trans_a(bool v) {
    trans_a_ = v;
    return *this;
  }
  GemmEngineTester& trans_b(bool v) {
    trans_b_ = v;
    return *this;
  }
  GemmEngineTester& beta(float v) {
    beta_ = v;
    return *this;
  }
  // TestGemm: c_row (a bias row broadcast over the rows) instead of beta·C.
  GemmEngineTester& bias(bool v) {
    bias_ = v;
    return *this;
  }
  GemmEngineTester& threads(int v) {
    threads_ = v;
    return *this;
  }
  GemmEngineTester& iterations(int v) {
    iterations_ = v;
    return *this;
  }
  GemmEngineTester& seed(uint64_t v) {
    seed_ = v;
    return *this;
  }
  // A thread's blocks as one step_blocks() call (else one step() per block).
  GemmEngineTester& grouped(bool v) {
    grouped_ = v;
    return *this;
  }
  // TestStep: the weights read in place (GemmEngine::prepare_in_place), and
  // the products' bits those of the laid-out weights' (prepare()).
  GemmEngineTester& in_place(bool v) {
    in_place_ = v;
    return *this;
  }
  // oneDNN for every product (cpu::onednn_engine), steps included.
  GemmEngineTester& onednn(bool v) {
    onednn_ = v;
    return *this;
  }

  // Whether this CPU runs the precision's engine; else the reason to skip.
  static bool Supported(Precision p, std::string* why) {
    if (p == Precision::bf16 && !cpu::has_bf16_dot_products(seqpack::testing::kernels())) {
      *why = std::string("no native bf16 dot products on ") + cpu::isa_name();
      return false;
    }
    return true;
  }

  void TestGemm() const {
    const int64_t n = width_ * blocks_;
    for (int it = 0; it < iterations_; ++it) {
      const uint64_t seed = seed_ + static_cast<uint64_t>(it);
      Operands p = draw(m_, n, trans_a_, seed);
      std::vector<float> c = p.c;
      engine().gemm({.m = m_,
                     .n = n,
                     .k = k_,
                     .a = {.data = p.a.data(), .ld = p.lda, .trans = trans_a_},
                     .b = {.data = p.b.data(), .ld = p.ldb, .trans = trans_b_},
                     .beta = beta_,
                     .c = c.data(),
                     .ldc = p.ldc,
                     .c_row = bias_ ? p.bias.data() : nullptr});
      const bool bf16 = precision_ == Precision::bf16 && cpu::bf16_product(m_, n, k_);
      ASSERT_TRUE(compare(p, c, 0, m_, bias_, bf16, seed)) << describe("TestGemm");
    }
  }

  void TestStep() const {
    const int64_t n = width_ * blocks_;
    const cpu::GemmEngine<float>& eng = engine();
    const bool by_rows = !grouped_ && eng.steps_by_rows(k_, n, /*backward=*/false);  // grouped: columns
    const int nc = by_rows ? 1 : threads_;  // threads sharing the columns
    for (int it = 0; it < iterations_; ++it) {
      const uint64_t seed = seed_ + static_cast<uint64_t>(it);
      Operands p = draw(m_, n, /*ta=*/false, seed);
      const auto ranges = rnn::step_ranges(width_, blocks_, nc);
      const auto op = in_place_ ? eng.prepare_in_place(p.b.data(), trans_b_, k_, n, p.ldb, ranges)
                                : eng.prepare(p.b.data(), trans_b_, k_, n, p.ldb, ranges);
      const std::vector<float> c = run_step(eng, *op, p, by_rows);
      const bool bf16 = precision_ == Precision::bf16 && (onednn_ || cpu::bf16_step(k_, n));
      ASSERT_TRUE(compare(p, c, 0, m_, false, bf16, seed))
          << describe("TestStep") << (by_rows ? " (by rows)" : " (by columns)");
      if (!in_place_) continue;
      const auto laid_out = eng.prepare(p.b.data(), trans_b_, k_, n, p.ldb, ranges);
      const std::vector<float> want = run_step(eng, *laid_out, p, by_rows);
      ASSERT_EQ(0, std::memcmp(c.data(), want.data(), c.size() * sizeof(float)))
          << describe("TestStep") << ": in place, not the bits of the laid-out weights";
    }
  }

 private:
  struct Operands {
    std::vector<float> a, b, c, bias;
    int64_t lda = 0, ldb = 0, ldc = 0;
    bool ta = false;
  };

  // One step of every thread's ranges (or rows) from its own OpenMP thread.
  std::vector<float> run_step(const cpu::GemmEngine<float>& eng, const cpu::StepOperand& op,
                              const Operands& p, bool by_rows) const {
    std::vector<float> c = p.c;
    // OpenMP's count exactly the threads asked for (run_threads never
    // takes more; and oneDNN picks a blocked layout by the count it sees,
    // which a row split's threads must not depend on), restored after.
    const int omp_before = omp_get_max_threads();
    omp_set_num_threads(threads_);
    rnn::run_threads(threads_, [&](int tid, int nth) {
      if (by_rows) {  // this thread's rows, all columns
        const int64_t r0 = m_ * tid / nth, r1 = m_ * (tid + 1) / nth;
        eng.step(r1 - r0, p.a.data() + r0 * p.lda, p.lda, op, 0, beta_, c.data() + r0 * p.ldc,
                 p.ldc);
        return;
      }
      const int64_t count = nth == 1 ? 1 : blocks_;
      if (grouped_) {
        eng.step_blocks(m_, p.a.data(), p.lda, op, rnn::step_range(nth, tid, blocks_, 0),
                        static_cast<std::size_t>(count), beta_, c.data(), p.ldc);
        return;
      }
      for (int64_t q = 0; q < count; ++q) {
        eng.step(m_, p.a.data(), p.lda, op, rnn::step_range(nth, tid, blocks_, q), beta_,
                 c.data(), p.ldc);
      }
    });
    omp_set_num_threads(omp_before);
    return c;
  }

  const cpu::GemmEngine<float>& engine() const {
    if (onednn_ && precision_ != Precision::int8)
      return cpu::onednn_engine(precision_, seqpack::testing::kernels());
    return precision_ == Precision::int8
               ? cpu::int8_engine(seqpack::testing::kernels())
               : cpu::gemm_engine_f32(precision_, seqpack::testing::kernels());
  }

  // Row strides past the rows, as the core's sub-matrices have; C's extra
  // columns must come back untouched.
  Operands draw(int64_t m, int64_t n, bool ta, uint64_t seed) const {
    Operands p;
    p.ta = ta;
    std::mt19937_64 gen(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    p.lda = (ta ? m : k_) + 3;
    p.ldb = (trans_b_ ? k_ : n) + 5;
    p.ldc = n + 2;
    p.a.resize(static_cast<std::size_t>((ta ? k_ : m) * p.lda));
    p.b.resize(static_cast<std::size_t>((trans_b_ ? n : k_) * p.ldb));
    p.c.resize(static_cast<std::size_t>(m * p.ldc));
    p.bias.resize(static_cast<std::size_t>(n));
    for (float& x : p.a) x = u(gen);
    for (float& x : p.b) x = u(gen);
    for (float& x : p.c) x = u(gen);
    for (float& x : p.bias) x = u(gen);
    return p;
  }

  float at_a(const Operands& p, int64_t i, int64_t kk) const {
    return p.ta ? p.a[static_cast<std::size_t>(kk * p.lda + i)]
                : p.a[static_cast<std::size_t>(i * p.lda + kk)];
  }
  float at_b(const Operands& p, int64_t kk, int64_t j) const {
    return trans_b_ ? p.b[static_cast<std::size_t>(j * p.ldb + kk)]
                    : p.b[static_cast<std::size_t>(kk * p.ldb + j)];
  }

  // x rounded to bf16 (8 significant bits, ties to even) in double.
  static double bf16_round(float x) {
    if (std::isnan(x) || std::isinf(x) || x == 0.0f) return x;
    int e;
    const double mant = std::frexp(static_cast<double>(x), &e);
    return std::ldexp(std::nearbyint(std::ldexp(mant, 8)), e - 8);
  }

  ::testing::AssertionResult compare(const Operands& p, const std::vector<float>& c, int64_t row0,
                                     int64_t row1, bool bias, bool bf16, uint64_t seed) const {
    const int64_t n = width_ * blocks_;
    const bool int8 = precision_ == Precision::int8;
    for (int64_t i = row0; i < row1; ++i) {
      // int8: a full quantisation step of row i (u8, asymmetric, 0 exact).
      double lo = 0, hi = 0;
      for (int64_t kk = 0; kk < k_ && int8; ++kk) {
        lo = std::min<double>(lo, at_a(p, i, kk));
        hi = std::max<double>(hi, at_a(p, i, kk));
      }
      const double step_a = (hi - lo) / 255;
      for (int64_t j = 0; j < p.ldc; ++j) {
        const std::size_t idx = static_cast<std::size_t>(i * p.ldc + j);
        if (j >= n) {  // past C's columns: untouched
          if (std::memcmp(&c[idx], &p.c[idx], sizeof(float)) != 0) {
            return ::testing::AssertionFailure()
                   << "C[" << i << "][" << j << "] past n = " << n << " was written, seed " << seed;
          }
          continue;
        }
        double ref = bias ? p.bias[static_cast<std::size_t>(j)] : beta_ * p.c[idx];
        double mag = std::fabs(ref), quant = 0;
        double wmax = 0;
        for (int64_t kk = 0; kk < k_ && int8; ++kk)
          wmax = std::max(wmax, std::fabs(double(at_b(p, kk, j))));
        const double step_w = wmax / 127;
        for (int64_t kk = 0; kk < k_; ++kk) {
          const double x = bf16 ? bf16_round(at_a(p, i, kk)) : at_a(p, i, kk);
          const double y = bf16 ? bf16_round(at_b(p, kk, j)) : at_b(p, kk, j);
          ref += x * y;
          mag += std::fabs(x * y);
          if (int8) quant += std::fabs(x) * step_w + std::fabs(y) * step_a + step_a * step_w;
        }
        const double bound = 2 * 0x1p-24 * static_cast<double>(k_ + 2) * mag + quant + 1e-30;
        if (!(std::fabs(c[idx] - ref) <= bound)) {
          return ::testing::AssertionFailure()
                 << "C[" << i << "][" << j << "] = " << c[idx] << ", expected " << ref << " (bound "
                 << bound << "), seed " << seed;
        }
      }
    }
    return ::testing::AssertionSuccess();
  }

  std::string describe(const char* what) const {
    return std::string(what) + " " + precision_name(precision_) + " m=" + std::to_string(m_) +
           " n=" + std::to_string(width_) + "x" + std::to_string(blocks_) +
           " k=" + std::to_string(k_) + " ta=" + std::to_string(trans_a_) +
           " tb=" + std::to_string(trans_b_) + " beta=" + std::to_string(beta_) +
           " bias=" + std::to_string(bias_) + " threads=" + std::to_string(threads_) +
           (grouped_ ? " grouped" : "") + (onednn_ ? " onednn" : "") +
           (in_place_ ? " in place" : "");
  }

  Precision precision_ = Precision::fp32;
  int64_t m_ = 1, width_ = 1, blocks_ = 1, k_ = 1;
  bool trans_a_ = false, trans_b_ = false, bias_ = false;
  bool grouped_ = false, onednn_ = false, in_place_ = false;
  float beta_ = 0;
  int threads_ = 1;
  int iterations_ = 1;
  uint64_t seed_ = 1;
};

}  // namespace seqpack::testing
