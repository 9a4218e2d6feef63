// GEMM engines (src/cpu/gemm_engine.h): every engine against a triple loop in
// double, for every transpose combination, beta 0 and 1, bias rows and the
// per-step column ranges. The bf16 engine is held to the product of the
// bf16-rounded operands (rounded here by a plain reference, not the engine's
// converter), with fp32 accumulation error only; on a CPU without native bf16
// those tests are skipped and the engine must refuse with the ISA's name.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/gemm_bf16_rows.h"
#include "cpu/gemm_engine.h"
#include "seqpack/precision.h"
#include "test_util.h"

namespace seqpack::cpu {
namespace {

// x rounded to bf16 (8 significant bits, ties to even) in double arithmetic.
double bf16_reference(float x) {
  if (std::isnan(x) || std::isinf(x) || x == 0.0f) return x;
  int e;
  const double m = std::frexp(static_cast<double>(x), &e);  // x = m * 2^e, 0.5 <= |m| < 1
  const double scaled = std::ldexp(m, 8);                    // 8 significant bits
  const double r = std::nearbyint(scaled);                   // default mode: ties to even
  return std::ldexp(r, e - 8);
}

double bf16_bits_to_double(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

struct Problem {
  bool ta, tb;
  int64_t m, n, k;
  std::vector<float> a, b, c, bias;
  int64_t lda, ldb, ldc;
};

Problem make_problem(bool ta, bool tb, int64_t m, int64_t n, int64_t k, uint64_t seed) {
  Problem p{ta, tb, m, n, k, {}, {}, {}, {}, 0, 0, 0};
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  // Row strides larger than the rows, as the core's sub-matrices have.
  p.lda = (ta ? m : k) + 3;
  p.ldb = (tb ? k : n) + 5;
  p.ldc = n + 2;
  p.a.resize(static_cast<std::size_t>((ta ? k : m) * p.lda));
  p.b.resize(static_cast<std::size_t>((tb ? n : k) * p.ldb));
  p.c.resize(static_cast<std::size_t>(m * p.ldc));
  p.bias.resize(static_cast<std::size_t>(n));
  for (float& x : p.a) x = u(gen);
  for (float& x : p.b) x = u(gen);
  for (float& x : p.c) x = u(gen);
  for (float& x : p.bias) x = u(gen);
  return p;
}

float at_a(const Problem& p, int64_t i, int64_t kk) {
  return p.ta ? p.a[static_cast<std::size_t>(kk * p.lda + i)]
              : p.a[static_cast<std::size_t>(i * p.lda + kk)];
}
float at_b(const Problem& p, int64_t kk, int64_t j) {
  return p.tb ? p.b[static_cast<std::size_t>(j * p.ldb + kk)]
              : p.b[static_cast<std::size_t>(kk * p.ldb + j)];
}

// Checks c against start + sum_k f(a) f(b), f = identity (fp32) or the bf16
// reference rounding, within the fp32 accumulation bound k * 2^-23 * sum|.|.
::testing::AssertionResult check(const Problem& p, const std::vector<float>& c,
                                 const std::vector<float>& c_start, bool bias, float beta,
                                 bool bf16, int64_t col0, int64_t col1) {
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      const std::size_t idx = static_cast<std::size_t>(i * p.ldc + j);
      double ref, mag;
      if (j < col0 || j >= col1) {
        ref = c_start[idx];  // outside the range: untouched
        mag = 0.0;
      } else {
        ref = bias ? p.bias[static_cast<std::size_t>(j)] : beta * c_start[idx];
        mag = std::fabs(ref);
        for (int64_t kk = 0; kk < p.k; ++kk) {
          const double x = bf16 ? bf16_reference(at_a(p, i, kk)) : at_a(p, i, kk);
          const double y = bf16 ? bf16_reference(at_b(p, kk, j)) : at_b(p, kk, j);
          ref += x * y;
          mag += std::fabs(x * y);
        }
      }
      const double tol = (static_cast<double>(p.k) + 2) * 1.2e-7 * mag + 1e-30;
      if (!(std::fabs(c[idx] - ref) <= tol)) {
        return ::testing::AssertionFailure()
               << "C[" << i << "][" << j << "] = " << c[idx] << ", expected " << ref
               << " (tol " << tol << ") for ta=" << p.ta << " tb=" << p.tb << " m=" << p.m
               << " n=" << p.n << " k=" << p.k << " beta=" << beta << " bias=" << bias;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// How an engine multiplies: fp32; bf16 where bf16_product/bf16_step say it
// pays (the core's bf16 engine); bf16 always (onednn_engine(bf16)).
enum class Rounding { none, where_it_pays, always };

void sweep_gemm(const GemmEngine<float>& eng, Rounding bf16) {
  const int64_t shapes[][3] = {{1, 1, 1}, {1, 7, 5}, {3, 17, 33}, {13, 64, 40}, {70, 130, 37},
                               {70, 300, 131}, {3, 1000, 800}};
  uint64_t seed = 11;
  for (const auto& s : shapes) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (int mode = 0; mode < 3; ++mode) {  // beta 0, beta 1, bias row
          Problem p = make_problem(ta, tb, s[0], s[1], s[2], ++seed);
          const std::vector<float> start = p.c;
          const float beta = mode == 1 ? 1.0f : 0.0f;
          eng.gemm({.m = p.m,
                    .n = p.n,
                    .k = p.k,
                    .a = {.data = p.a.data(), .ld = p.lda, .trans = ta},
                    .b = {.data = p.b.data(), .ld = p.ldb, .trans = tb},
                    .beta = beta,
                    .c = p.c.data(),
                    .ldc = p.ldc,
                    .c_row = mode == 2 ? p.bias.data() : nullptr});
          const bool rounded = bf16 == Rounding::always ||
                               (bf16 == Rounding::where_it_pays && bf16_product(p.m, p.n, p.k));
          ASSERT_TRUE(check(p, p.c, start, mode == 2, beta, rounded, 0, p.n)) << "seed " << seed;
        }
      }
    }
  }
}

void sweep_steps(const GemmEngine<float>& eng, Rounding bf16) {
  // A weight matrix used by column ranges, as the time loop's threads do.
  uint64_t seed = 101;
  for (bool tb : {false, true}) {
    for (const auto& [k, n] :
         std::vector<std::pair<int64_t, int64_t>>{{37, 4 * 37}, {64, 512}, {130, 3 * 130}}) {
      Problem p = make_problem(false, tb, 1, n, k, ++seed);
      const std::vector<ColumnRange> ranges{{0, n}, {0, n / 2}, {n / 2, n}, {5, 21}};
      const auto op = eng.prepare(p.b.data(), tb, k, n, p.ldb, ranges);
      for (int64_t m : {1, 2, 5, 6, 7, 13, 64}) {
        Problem q = make_problem(false, tb, m, n, k, ++seed);
        q.b = p.b;  // same weights, new rows
        q.ldb = p.ldb;
        for (std::size_t r = 0; r < ranges.size(); ++r) {
          for (float beta : {0.0f, 1.0f}) {
            std::vector<float> c = q.c;
            eng.step(m, q.a.data(), q.lda, *op, r, beta, c.data(), q.ldc);
            const bool rounded = bf16 == Rounding::always ||
                                 (bf16 == Rounding::where_it_pays && bf16_step(k, n));
            ASSERT_TRUE(check(q, c, q.c, false, beta, rounded, ranges[r].first, ranges[r].second))
                << "range " << r << " m " << m << " seed " << seed;
          }
        }
      }
    }
  }
}

TEST(GemmEngine, F32MatchesTripleLoop) {
  sweep_gemm(gemm_engine_f32(Precision::fp32, seqpack::testing::kernels()), Rounding::none);
  sweep_steps(gemm_engine_f32(Precision::fp32, seqpack::testing::kernels()), Rounding::none);
  EXPECT_EQ(onednn_reference_primitives(), 0) << "oneDNN fell back to its reference kernel";
}

TEST(GemmEngine, OnednnF32EverywhereMatchesTripleLoop) {
  sweep_gemm(onednn_engine(Precision::fp32, seqpack::testing::kernels()), Rounding::none);
  sweep_steps(onednn_engine(Precision::fp32, seqpack::testing::kernels()), Rounding::none);
  EXPECT_EQ(onednn_reference_primitives(), 0) << "oneDNN fell back to its reference kernel";
}

TEST(GemmEngine, OnednnBf16EverywhereRoundsEveryProduct) {
  if (!testing::bf16_runs()) GTEST_SKIP() << testing::no_bf16_here();
  sweep_gemm(onednn_engine(Precision::bf16, seqpack::testing::kernels()), Rounding::always);
  sweep_steps(onednn_engine(Precision::bf16, seqpack::testing::kernels()), Rounding::always);
  EXPECT_EQ(onednn_reference_primitives(), 0) << "oneDNN fell back to its reference kernel";
}

TEST(GemmEngine, F32StepTakesInitRows) {
  const GemmEngine<float>& eng = gemm_engine_f32(Precision::fp32, seqpack::testing::kernels());
  ASSERT_TRUE(eng.takes_init());
  Problem p = make_problem(false, true, 9, 48, 20, 7);
  const auto op = eng.prepare(p.b.data(), true, p.k, p.n, p.ldb, {{0, p.n}});
  std::vector<std::vector<float>> rows(9, std::vector<float>(48));
  std::vector<const float*> init;
  for (int i = 0; i < 9; ++i) {
    for (int j = 0; j < 48; ++j) rows[i][j] = static_cast<float>(i - j) * 0.125f;
    init.push_back(rows[i].data());
  }
  eng.step(p.m, p.a.data(), p.lda, *op, 0, 0.0f, p.c.data(), p.ldc, init.data());
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      double ref = rows[i][j], mag = std::fabs(rows[i][j]);
      for (int64_t kk = 0; kk < p.k; ++kk) {
        ref += double(at_a(p, i, kk)) * at_b(p, kk, j);
        mag += std::fabs(double(at_a(p, i, kk)) * at_b(p, kk, j));
      }
      // fp32 rounding of a sum of k + 1 terms, in any order (FMA or not).
      const double bound = 2.0 * double(p.k + 1) * std::numeric_limits<float>::epsilon() * mag;
      ASSERT_NEAR(p.c[i * p.ldc + j], ref, bound) << i << "," << j;
    }
  }
}

TEST(GemmEngine, Bf16MatchesTheProductOfRoundedOperands) {
  if (!testing::bf16_runs()) GTEST_SKIP() << testing::no_bf16_here();
  const GemmEngine<float>& eng = gemm_engine_f32(Precision::bf16, seqpack::testing::kernels());
  EXPECT_FALSE(eng.takes_init());
  sweep_gemm(eng, Rounding::where_it_pays);
  sweep_steps(eng, Rounding::where_it_pays);
  EXPECT_EQ(onednn_reference_primitives(), 0) << "oneDNN fell back to its reference kernel";
}

// The steps of every engine, column shares of a wider C included (they once
// fell back to oneDNN's reference kernel, ~1000x slower), find optimised kernels.
TEST(GemmEngine, NoOnednnReferenceKernel) {
  const bool bf16 = testing::bf16_runs();
  sweep_steps(onednn_engine(Precision::fp32, seqpack::testing::kernels()), Rounding::none);
  if (bf16)
    sweep_steps(onednn_engine(Precision::bf16, seqpack::testing::kernels()), Rounding::always);
  const GemmEngine<float>& eng =
      gemm_engine_f32(bf16 ? Precision::bf16 : Precision::fp32, seqpack::testing::kernels());
  Problem p = make_problem(false, true, 24, 1024, 256, 9);
  const auto op = eng.prepare(p.b.data(), true, p.k, p.n, p.ldb, {{0, 1024}, {0, 512}, {512, 1024}});
  for (std::size_t r = 0; r < 3; ++r) eng.step(p.m, p.a.data(), p.lda, *op, r, 1.0f, p.c.data(), p.ldc);
  EXPECT_EQ(onednn_reference_primitives(), 0);
}

// A primitive is made for the thread count it runs at: oneDNN fixes its
// split of the work when it makes one, so one made at 1 thread and run after
// set_num_threads(2) would leave the second thread idle. The same product at
// 1, 2 and again 1 thread: two primitives, the same values. A small product
// (under 2^20 multiply-adds and 256 KB of B) runs on one thread at any count:
// one primitive, the same bits.
TEST(GemmEngine, PrimitivesPerThreadCount) {
  const int before = omp_get_max_threads();
  // (m, n, k): 2.1M multiply-adds, then 8 x 64 x 64 (a decoder step of RNN(64)).
  for (const auto& [m, n, k, primitives] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t>{64, 256, 128, 2}, {8, 64, 64, 1}}) {
    SCOPED_TRACE("m " + std::to_string(m) + " n " + std::to_string(n) + " k " + std::to_string(k));
    Problem p = make_problem(false, true, m, n, k, 31);
    std::vector<std::vector<float>> out;
    const int64_t made = onednn_primitives_made();
    for (const int threads : {1, 2, 1}) {
      omp_set_num_threads(threads);
      std::vector<float> c = p.c;
      onednn_gemm_f32(false, true, p.m, p.n, p.k, p.a.data(), p.lda, p.b.data(), p.ldb, 0.0f,
                      c.data(), p.ldc, nullptr);
      out.push_back(c);
    }
    omp_set_num_threads(before);
    EXPECT_EQ(onednn_primitives_made() - made, primitives);
    EXPECT_EQ(omp_get_max_threads(), before);
    for (std::size_t i = 0; i < out[0].size(); ++i) {
      // |a|, |b| <= 1: a sum of k products in any order, within 2u(k + 2)k.
      ASSERT_NEAR(out[1][i], out[0][i],
                  std::numeric_limits<float>::epsilon() * static_cast<float>((k + 2) * k))
          << "element " << i;
    }
    EXPECT_EQ(std::memcmp(out[0].data(), out[2].data(), out[0].size() * sizeof(float)), 0);
    if (primitives == 1)
      EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)), 0);
  }
}

TEST(GemmEngine, Bf16WhereItPays) {
  // The thresholds the sweeps rely on: both sides of each are exercised there.
  EXPECT_FALSE(bf16_product(70, 130, 37));
  EXPECT_TRUE(bf16_product(70, 300, 131));
  EXPECT_FALSE(bf16_step(37, 148));
  EXPECT_TRUE(bf16_step(64, 512));
}

TEST(GemmEngine, Bf16StepsFromTwoThreadsAtOnce) {
  if (!testing::bf16_runs()) GTEST_SKIP() << testing::no_bf16_here();
  const GemmEngine<float>& eng = gemm_engine_f32(Precision::bf16, seqpack::testing::kernels());
  Problem p = make_problem(false, true, 24, 256, 64, 5);
  const std::vector<ColumnRange> ranges{{0, 256}, {0, 128}, {128, 256}};
  const auto op = eng.prepare(p.b.data(), true, p.k, p.n, p.ldb, ranges);
  std::vector<float> one = p.c, two = p.c;
  eng.step(p.m, p.a.data(), p.lda, *op, 0, 0.0f, one.data(), p.ldc);
  for (int rep = 0; rep < 50; ++rep) {
#pragma omp parallel num_threads(2)
    {
      // Each thread its half, as the time loop splits a direction's columns.
#pragma omp for
      for (int r = 1; r <= 2; ++r) eng.step(p.m, p.a.data(), p.lda, *op, r, 0.0f, two.data(), p.ldc);
    }
    ASSERT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0) << "rep " << rep;
  }
}

// Weights written into the blocked bf16 layout in one pass (bf16_blocked.h)
// hold the bits oneDNN's own reorder gives, padding included: each pair
// blocking on any CPU, and the layout the matmul picks where bf16 is
// native; both orientations, tails in k and n, strided rows, and values
// that tie, carry into the exponent, overflow, are NaN, infinite, subnormal
// or zero of either sign.
TEST(GemmEngine, Bf16BlockedWeightsAsOnednnLaysThemOut) {
  const int64_t shapes[][2] = {{1, 1},     {3, 47},    {16, 64},   {17, 65},    {37, 148},
                               {130, 390}, {300, 131}, {131, 300}, {500, 2000}, {2000, 500}};
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min(),
                            -1e-39f,
                            std::numeric_limits<float>::max(),
                            std::bit_cast<float>(0x3F808000u),  // a tie, to even (down)
                            std::bit_cast<float>(0x3F818000u),  // a tie, to even (up)
                            std::bit_cast<float>(0x3FFFFFFFu),  // rounds into the exponent
                            -0.0f};
  const bool native = seqpack::cpu_info(seqpack::testing::policy()).bf16 == "native";
  int pair_blocked_choices = 0;
  uint64_t seed = 900;
  for (const auto& [k, n] : shapes) {
    for (const bool trans : {false, true}) {
      for (const int64_t n_block : {0, 16, 32, 48, 64}) {
        if (n_block == 0 && !native) continue;  // the matmul's choice: native bf16 only
        const int64_t rows = trans ? n : k, cols = trans ? k : n, ld = cols + 3;
        std::mt19937_64 rng(++seed);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> b(static_cast<std::size_t>(rows * ld));
        for (float& v : b) v = normal(rng);
        for (std::size_t i = 0; i < std::size(specials); ++i)
          b[(i * 7919) % b.size()] = specials[i];
        SCOPED_TRACE("k " + std::to_string(k) + " n " + std::to_string(n) + " trans " +
                     std::to_string(trans) + " n_block " + std::to_string(n_block) + " seed " +
                     std::to_string(seed));
        const Bf16LayoutsForTest got = bf16_layouts_for_test(b.data(), trans, k, n, ld, n_block);
        if (n_block != 0) ASSERT_TRUE(got.pair_blocked);
        if (!got.pair_blocked) continue;
        pair_blocked_choices += n_block == 0;
        for (const auto* written : {&got.written, &got.reference}) {
          ASSERT_EQ(written->size(), got.onednn.size());
          for (std::size_t i = 0; i < written->size(); ++i) {
            // Zero's sign aside: oneDNN's reorder under an AVX2 cap writes
            // bf16 -0 as +0 (as the same value, in a product).
            const auto value = [](uint16_t h) { return h == 0x8000 ? uint16_t{0} : h; };
            ASSERT_EQ(value((*written)[i]), value(got.onednn[i]))
                << (written == &got.written ? "fast path" : "plain loops") << ", element " << i;
          }
        }
      }
    }
  }
  if (native) {
    // Every layout oneDNN's bf16 matmul picked here is one the writer
    // handles (else the weights take oneDNN's slower reorder: not wrong).
    std::printf("pair-blocked layouts picked by oneDNN's bf16 matmul: %d of %zu\n",
                pair_blocked_choices, 2 * std::size(shapes));
  }
}

// A model's weight matrix as the engine lays it out for the whole-batch
// products (lay_out_weights: bf16's blocked layout per orientation, made by
// the first product that reads it): for op(B) transposed (the forward's
// W_ihᵀ) and not (the backward's dX reads the same matrix), at one row and
// at 80, the products that read it are bf16 products (held to the bound of
// the rounded operands: a product of fp32 operands misses it) at any size,
// and give the same bits again once the layout is made. fp32 lays out
// nothing.
TEST(GemmEngine, LaidOutWeightsGiveTheSameProducts) {
  EXPECT_EQ(gemm_engine_f32(Precision::fp32, seqpack::testing::kernels())
                .lay_out_weights(nullptr, true, 4, 4, 4),
            nullptr);
  if (!testing::bf16_runs()) GTEST_SKIP() << testing::no_bf16_here();
  const GemmEngine<float>& eng = gemm_engine_f32(Precision::bf16, seqpack::testing::kernels());
  uint64_t seed = 700;
  ASSERT_FALSE(bf16_product(1, 300, 131));
  ASSERT_TRUE(bf16_product(80, 300, 131));
  ASSERT_TRUE(bf16_step(131, 300));
  for (const int64_t m : {1, 80}) {
    // W stored [rows, cols] (row stride cols + 5); the forward multiplies by
    // Wᵀ (k = cols, n = rows), the backward by W (k = rows, n = cols).
    const int64_t rows = 300, cols = 131, ld = cols + 5;
    Problem fwd = make_problem(false, true, m, rows, cols, ++seed);
    ASSERT_EQ(fwd.ldb, ld);
    const auto copy = eng.lay_out_weights(fwd.b.data(), true, cols, rows, ld);
    ASSERT_NE(copy, nullptr);
    Problem bwd = make_problem(false, false, m, cols, rows, ++seed);
    bwd.b = fwd.b;  // the same values, read as op(B) = W (for check())
    bwd.ldb = ld;
    for (Problem* p : {&fwd, &bwd}) {
      const float* stored = fwd.b.data();  // the matrix laid out
      SCOPED_TRACE("m " + std::to_string(m) + (p->tb ? " Wᵀ" : " W"));
      std::vector<float> first;
      for (int pass = 0; pass < 2; ++pass) {
        SCOPED_TRACE("pass " + std::to_string(pass));
        std::vector<float> got = p->c;
        eng.gemm({.m = p->m,
                  .n = p->n,
                  .k = p->k,
                  .a = {.data = p->a.data(), .ld = p->lda},
                  .b = {.data = stored, .ld = p->ldb, .trans = p->tb, .laid_out = copy.get()},
                  .c = got.data(),
                  .ldc = p->ldc});
        ASSERT_TRUE(check(*p, got, p->c, false, 0.0f, /*bf16=*/true, 0, p->n));
        if (pass == 0) first = got;
        EXPECT_EQ(std::memcmp(got.data(), first.data(), got.size() * sizeof(float)), 0);
      }
    }
  }
  EXPECT_EQ(onednn_reference_primitives(), 0) << "oneDNN fell back to its reference kernel";
  // A copy of another matrix (another source) is not read: the product
  // converts its own B.
  Problem p = make_problem(false, true, 80, 300, 131, ++seed);
  Problem other = make_problem(false, true, 80, 300, 131, ++seed);
  const auto copy = eng.lay_out_weights(other.b.data(), true, 131, 300, other.ldb);
  std::vector<float> want = p.c, got = p.c;
  GemmProduct<float> q{.m = p.m,
                       .n = p.n,
                       .k = p.k,
                       .a = {.data = p.a.data(), .ld = p.lda},
                       .b = {.data = p.b.data(), .ld = p.ldb, .trans = true},
                       .c = want.data(),
                       .ldc = p.ldc};
  eng.gemm(q);
  q.b.laid_out = copy.get();
  q.c = got.data();
  eng.gemm(q);
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
}

// A matrix whose rows step() products read a few at a time and a whole-batch
// product reads again (the backward's dG), kept in the form the engine names
// (OperandRows::put, a step's rows before its product): the products that
// read the kept rows give exactly what they give converting the matrix
// themselves, with rows no step multiplies put too, steps on one thread or
// two column shares, and the fp32 rows overwritten after their step.
TEST(GemmEngine, KeptRowsGiveTheSameProducts) {
  for (const Precision precision : {Precision::fp32, Precision::bf16}) {
    if (precision == Precision::bf16 && !testing::bf16_runs()) continue;
    SCOPED_TRACE(precision_name(precision));
    const GemmEngine<float>& eng = gemm_engine_f32(precision, seqpack::testing::kernels());
    const int64_t N = 300, G = 256, R = 64, ld = G + 3, skip = 10;
    // dG [N, G] with row stride ld, W [G, R] for the steps, H_prev [N, R].
    const Problem p = make_problem(false, false, N, R, G, 11);  // p.a: dG, p.b: W
    ASSERT_EQ(p.lda, ld);
    const Problem q = make_problem(false, false, N, 1, R, 12);  // q.a: H_prev, stride R + 3
    const std::vector<float>& dg = p.a;
    const std::vector<float>& hp = q.a;
    const std::vector<ColumnRange> ranges{{0, R}, {0, 32}, {32, R}};
    const auto op = eng.prepare(p.b.data(), false, G, R, p.ldb, ranges);
    const auto kept = OperandRows::make(eng.product_form(G, R, N - skip), N, G);
    EXPECT_EQ(kept == nullptr, precision == Precision::fp32);
    EXPECT_EQ(eng.step_form(*op) == SinkElement::none, precision == Precision::fp32);
    std::vector<float> plain(static_cast<std::size_t>(N * R)), with(plain.size());
    // Steps over rows [0, 40), [40, 100) (two column shares), [120, 300),
    // each from a copy of its rows that the next step overwrites; rows
    // [100, 120) are kept without a product.
    std::vector<float> rows(dg.size());
    const std::vector<std::pair<int64_t, int64_t>> steps{{0, 40}, {40, 100}, {120, 300}};
    for (const auto& [r0, r1] : steps) {
      const float* a = dg.data() + r0 * ld;
      std::copy(a, a + (r1 - r0) * ld, rows.begin());
      if (kept) kept->put(r0, rows.data(), ld, r1 - r0);
      eng.step(r1 - r0, a, ld, *op, 0, 0.0f, plain.data() + r0 * R, R);
      if (r0 == 40) {
        for (std::size_t r : {1, 2})
          eng.step(r1 - r0, rows.data(), ld, *op, r, 0.0f, with.data() + r0 * R, R, nullptr,
                   kept.get(), r0);
      } else {
        eng.step(r1 - r0, rows.data(), ld, *op, 0, 0.0f, with.data() + r0 * R, R, nullptr,
                 kept.get(), r0);
      }
      std::fill(rows.begin(), rows.end(), std::numeric_limits<float>::quiet_NaN());
    }
    if (kept) kept->put(100, dg.data() + 100 * ld, ld, 20);
    ASSERT_EQ(std::memcmp(plain.data(), with.data(), plain.size() * sizeof(float)), 0);
    // dW = dG[skip:]ᵀ·H_prev[skip:], as the backward's dW_hh; with the kept
    // rows, A is not read.
    std::vector<float> dw_plain(static_cast<std::size_t>(G * R)), dw_kept(dw_plain.size());
    eng.gemm({.m = G,
              .n = R,
              .k = N - skip,
              .a = {.data = dg.data() + skip * ld, .ld = ld, .trans = true},
              .b = {.data = hp.data() + skip * q.lda, .ld = q.lda},
              .c = dw_plain.data(),
              .ldc = R});
    eng.gemm({.m = G,
              .n = R,
              .k = N - skip,
              .a = {.data = kept ? nullptr : dg.data() + skip * ld,
                    .ld = ld,
                    .trans = true,
                    .kept = kept.get(),
                    .kept_row = skip},
              .b = {.data = hp.data() + skip * q.lda, .ld = q.lda},
              .c = dw_kept.data(),
              .ldc = R});
    ASSERT_EQ(std::memcmp(dw_plain.data(), dw_kept.data(), dw_plain.size() * sizeof(float)), 0);
  }
}

// Rows the caller writes itself through their sink (as the gate kernels do):
// the products that read them give exactly what they give converting the
// fp32 rows, with a's rows never read (NaN here), on one thread or two
// column shares; step_form() names a form only where the step product is
// bf16.
TEST(GemmEngine, SunkRowsGiveTheSameProducts) {
  for (const Precision precision : {Precision::fp32, Precision::bf16}) {
    if (precision == Precision::bf16 && !testing::bf16_runs()) continue;
    SCOPED_TRACE(precision_name(precision));
    const GemmEngine<float>& eng = gemm_engine_f32(precision, seqpack::testing::kernels());
    const int64_t N = 300, G = 256, R = 64, ld = G + 3, skip = 10;
    const Problem p = make_problem(false, false, N, R, G, 21);  // p.a: dG, p.b: W
    const Problem q = make_problem(false, false, N, 1, R, 22);  // q.a: H_prev
    const std::vector<float>& dg = p.a;
    const std::vector<ColumnRange> ranges{{0, R}, {0, 32}, {32, R}};
    const auto op = eng.prepare(p.b.data(), false, G, R, p.ldb, ranges);
    const auto kept = OperandRows::make(eng.product_form(G, R, N - skip), N, G);
    if (!kept) {  // fp32: nothing to sink
      EXPECT_EQ(precision, Precision::fp32);
      EXPECT_EQ(eng.step_form(*op), SinkElement::none);
      continue;
    }
    const RowSink sink = kept->sink();
    ASSERT_NE(sink.data, nullptr);
    ASSERT_EQ(sink.ld, G);
    for (int64_t r = 0; r < N; ++r) f32_to_bf16(dg.data() + r * ld, sink.bf16_row(r), G);
    const std::vector<float> nans(dg.size(), std::numeric_limits<float>::quiet_NaN());
    std::vector<float> plain(static_cast<std::size_t>(N * R)), with(plain.size());
    const std::vector<std::pair<int64_t, int64_t>> steps{{0, 40}, {40, 100}, {120, 300}};
    for (const auto& [r0, r1] : steps) {
      eng.step(r1 - r0, dg.data() + r0 * ld, ld, *op, 0, 0.0f, plain.data() + r0 * R, R);
      for (std::size_t r : r0 == 40 ? std::vector<std::size_t>{2, 1} : std::vector<std::size_t>{0})
        eng.step(r1 - r0, nans.data(), ld, *op, r, 0.0f, with.data() + r0 * R, R, nullptr,
                 kept.get(), r0);
    }
    ASSERT_EQ(std::memcmp(plain.data(), with.data(), plain.size() * sizeof(float)), 0);
    std::vector<float> dw_plain(static_cast<std::size_t>(G * R)), dw_kept(dw_plain.size());
    eng.gemm({.m = G,
              .n = R,
              .k = N - skip,
              .a = {.data = dg.data() + skip * ld, .ld = ld, .trans = true},
              .b = {.data = q.a.data() + skip * q.lda, .ld = q.lda},
              .c = dw_plain.data(),
              .ldc = R});
    eng.gemm({.m = G,
              .n = R,
              .k = N - skip,
              .a = {.data = nullptr, .ld = ld, .trans = true, .kept = kept.get(), .kept_row = skip},
              .b = {.data = q.a.data() + skip * q.lda, .ld = q.lda},
              .c = dw_kept.data(),
              .ldc = R});
    ASSERT_EQ(std::memcmp(dw_plain.data(), dw_kept.data(), dw_plain.size() * sizeof(float)), 0);

    // A step product's own rows (the forward's h_prev): a store where the
    // product is bf16, none where it runs in fp32 (bf16_step).
    const Problem h = make_problem(false, true, 24, 256, 64, 23);  // h.a: h_prev, h.b: W_hhᵀ
    const auto wop = eng.prepare(h.b.data(), true, 64, 256, h.ldb, {{0, 256}});
    const auto hstore = OperandRows::make(eng.step_form(*wop), 2 * 24, 64);
    ASSERT_NE(hstore, nullptr);
    const RowSink hs = hstore->sink();
    // Rows 24..35 through the sink, 36..47 converted by put() (the rows
    // that begin with h0).
    for (int64_t r = 0; r < 12; ++r) f32_to_bf16(h.a.data() + r * h.lda, hs.bf16_row(24 + r), 64);
    hstore->put(36, h.a.data() + 12 * h.lda, h.lda, 12);
    std::vector<float> c_plain = h.c, c_sunk = h.c;
    eng.step(24, h.a.data(), h.lda, *wop, 0, 1.0f, c_plain.data(), h.ldc);
    eng.step(24, nans.data(), h.lda, *wop, 0, 1.0f, c_sunk.data(), h.ldc, nullptr, hstore.get(),
             24);
    ASSERT_EQ(std::memcmp(c_plain.data(), c_sunk.data(), c_plain.size() * sizeof(float)), 0);
    const Problem small = make_problem(false, true, 4, 64, 64, 24);
    const auto sop = eng.prepare(small.b.data(), true, 64, 64, small.ldb, {{0, 64}});
    EXPECT_FALSE(bf16_step(64, 64));
    EXPECT_EQ(eng.step_form(*sop), SinkElement::none);
  }
}

// A product that reads rows nobody wrote is refused, not computed from garbage.
TEST(GemmEngine, RowsNeverKeptAreRefused) {
  if (!testing::bf16_runs()) GTEST_SKIP() << testing::no_bf16_here();
  const GemmEngine<float>& eng = gemm_engine_f32(Precision::bf16, seqpack::testing::kernels());
  const Problem q = make_problem(false, false, 200, 1, 64, 13);
  const auto kept = OperandRows::make(eng.product_form(256, 64, 200), 200, 256);
  ASSERT_NE(kept, nullptr);
  std::vector<float> rows(static_cast<std::size_t>(150 * 256), 0.5f), dw(256 * 64);
  kept->put(0, rows.data(), 256, 150);
  EXPECT_THROW(eng.gemm({.m = 256,
                         .n = 64,
                         .k = 200,
                         .a = {.data = nullptr, .ld = 256, .trans = true, .kept = kept.get()},
                         .b = {.data = q.a.data(), .ld = q.lda},
                         .c = dw.data(),
                         .ldc = 64}),
               std::logic_error);
}

// The bf16 engine's products of a few rows run on seqpack's kernels
// (cpu/gemm_bf16_rows.h) where the CPU has AVX512-BF16 without AMX, reading
// the weights in place the first time a plan meets them: the bits of
// oneDNN's products (onednn_engine: every product in oneDNN) at every k
// blocking of oneDNN's (one block, blocks of 512, blocks of 1024), so that
// a row's bits do not depend on how many rows share its step. Steps (both
// forms of B, beta 0 and 1, laid out and in place) and whole-batch products
// of laid-out weights (a bias row; beta 1), 1 to 5 rows (the register
// kernels and past them), 13 (a chunk of 12 rows and one) and 64 (the most
// read in place); weights of more than 8192 values (bf16_step: the core
// engine's smaller ones run in fp32).
TEST(GemmEngine, Bf16FewRowsGiveOnednnsBits) {
  if (!bf16_rows_available(seqpack::testing::kernels()))
    GTEST_SKIP() << "no native AVX512-BF16 without AMX here";
  // Every oneDNN blocking seen (2.6, 3.7) sums weights of 500 rows in one block.
  EXPECT_GT(bf16_few_rows_k_block(1, 500, 500, seqpack::testing::kernels()), 0)
      << "the few-row kernels never run here";
  const GemmEngine<float>& core = gemm_engine_f32(Precision::bf16, seqpack::testing::kernels());
  const GemmEngine<float>& onednn = onednn_engine(Precision::bf16, seqpack::testing::kernels());
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (const int64_t k : {31, 64, 500, 512, 514, 1000, 1024, 1026, 2000, 3000}) {
    for (const int64_t n : {64, 500}) {
      if (!bf16_step(k, n)) continue;  // the core engine's are fp32 products there
      for (const bool trans : {true, false}) {
        const int64_t ldb = (trans ? k : n) + 3;
        std::vector<float> w(static_cast<std::size_t>((trans ? n : k) * ldb)), bias(n);
        std::vector<float> a(static_cast<std::size_t>(64 * k)),
            c0(static_cast<std::size_t>(64 * n));
        for (float& x : w) x = u(gen);
        for (float& x : a) x = u(gen);
        for (float& x : c0) x = u(gen);
        for (float& x : bias) x = u(gen);
        const std::vector<ColumnRange> all{{0, n}};
        const auto want_op = onednn.prepare(w.data(), trans, k, n, ldb, all);
        const auto laid_op = core.prepare(w.data(), trans, k, n, ldb, all);
        const auto here_op = core.prepare_in_place(w.data(), trans, k, n, ldb, all);
        const auto want_w = onednn.lay_out_weights(w.data(), trans, k, n, ldb);
        const auto core_w = core.lay_out_weights(w.data(), trans, k, n, ldb);
        for (const int64_t m : {1, 2, 3, 4, 5, 13, 64}) {
          for (const float beta : {0.f, 1.f}) {
            SCOPED_TRACE("k " + std::to_string(k) + " n " + std::to_string(n) + " trans " +
                         std::to_string(trans) + " m " + std::to_string(m) + " beta " +
                         std::to_string(beta));
            std::vector<float> want = c0, laid = c0, here = c0;
            if (trans && beta == 0.f) {  // which order ran: oneDNN's blocks of k, or 0
              std::printf(
                  "m %ld k %ld n %ld: few-row blocks of %ld\n", static_cast<long>(m),
                  static_cast<long>(k), static_cast<long>(n),
                  static_cast<long>(bf16_few_rows_k_block(m, k, n, seqpack::testing::kernels())));
            }
            onednn.step(m, a.data(), k, *want_op, 0, beta, want.data(), n);
            core.step(m, a.data(), k, *laid_op, 0, beta, laid.data(), n);
            core.step(m, a.data(), k, *here_op, 0, beta, here.data(), n);
            ASSERT_EQ(std::memcmp(want.data(), laid.data(), want.size() * sizeof(float)), 0);
            ASSERT_EQ(std::memcmp(want.data(), here.data(), want.size() * sizeof(float)), 0);
            for (const bool in_place : {false, true}) {
              const auto product = [&](const GemmEngine<float>& eng, const WeightLayout* laid_out,
                                       std::vector<float>& c) {
                eng.gemm({.m = m,
                          .n = n,
                          .k = k,
                          .a = {.data = a.data(), .ld = k},
                          .b = {.data = w.data(),
                                .ld = ldb,
                                .trans = trans,
                                .laid_out = laid_out,
                                .in_place = in_place},
                          .beta = beta,
                          .c = c.data(),
                          .ldc = n,
                          .c_row = beta == 0.f ? bias.data() : nullptr});
              };
              std::vector<float> gwant = c0, ggot = c0;
              product(onednn, want_w.get(), gwant);
              product(core, core_w.get(), ggot);
              ASSERT_EQ(std::memcmp(gwant.data(), ggot.data(), gwant.size() * sizeof(float)), 0)
                  << "whole-batch product, in place " << in_place;
            }
          }
        }
      }
    }
  }
}

TEST(GemmEngine, Bf16RefusedWithoutNativeBf16) {
  if (testing::bf16_runs())
    GTEST_SKIP() << "bf16 runs here (" << cpu_info(seqpack::testing::policy()).bf16
                 << "); the capped run tests this";
  try {
    gemm_engine_f32(Precision::bf16, seqpack::testing::kernels());
    FAIL() << "bf16 accepted on " << cpu_info(seqpack::testing::policy()).isa;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(cpu_info(seqpack::testing::policy()).isa),
              std::string::npos)
        << e.what();
  }
}

TEST(F32ToBf16, RoundsToNearestEvenAndKeepsSpecials) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> xs{0.0f, -0.0f, 1.0f, -1.0f, inf, -inf, 3.0e38f, 3.4e38f,
                        1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 1.0f + 1.0f / 512, 65504.0f};
  std::mt19937_64 gen(3);
  std::uniform_real_distribution<float> u(-100.0f, 100.0f);
  for (int i = 0; i < 1000; ++i) xs.push_back(u(gen));
  std::vector<uint16_t> out(xs.size());
  f32_to_bf16(xs.data(), out.data(), static_cast<int64_t>(xs.size()));
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double got = bf16_bits_to_double(out[i]);
    // Values past bf16's largest finite round to infinity, as the reference's
    // 8-bit rounding of 3.4e38 gives 2^128.
    EXPECT_EQ(got, static_cast<double>(static_cast<float>(bf16_reference(xs[i]))))
        << "x = " << xs[i];
    EXPECT_EQ(std::signbit(got), std::signbit(xs[i])) << "x = " << xs[i];
  }
  const float nans[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                        std::bit_cast<float>(0x7FFFFFFFu), std::bit_cast<float>(0x7F800001u)};
  uint16_t nan_out[4];
  f32_to_bf16(nans, nan_out, 4);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(std::isnan(bf16_bits_to_double(nan_out[i]))) << i;
  // Subnormals flush to a zero of their sign, in the vector body and the tail.
  std::vector<float> tiny(37, 1e-40f);
  tiny[3] = tiny[36] = -3e-39f;
  std::vector<uint16_t> tiny_out(tiny.size());
  f32_to_bf16(tiny.data(), tiny_out.data(), static_cast<int64_t>(tiny.size()));
  for (std::size_t i = 0; i < tiny.size(); ++i) {
    EXPECT_EQ(tiny_out[i], tiny[i] < 0 ? 0x8000 : 0x0000) << "element " << i;
  }
}

}  // namespace
}  // namespace seqpack::cpu
