// cpu::gemm_packed_small (the per-step recurrent products, every float32 step)
// against a plain triple loop in double: every row count 1..260 on odd sizes
// that are not multiples of the SIMD width or of the panel width, the shapes
// of the workloads (k blocks, row blocks) at the row counts around the
// kernel's block boundaries, both packing forms (B and Bᵀ), beta 0 and 1, and
// column ranges starting mid-panel (how threads split a step), plus the bits
// of a split call against one call.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/bf16.h"
#include "cpu/bf16_blocked.h"
#include "cpu/finite.h"
#include "cpu/gemm.h"
#include "cpu/gemm_bf16_rows.h"
#include "cpu/linear_rows.h"
#include "seqpack/packed_sequence.h"
#include "seqpack/rnn.h"
#include "seqpack/threading.h"
#include "test_util.h"

namespace {

using seqpack::cpu::gemm_packed_small;
using seqpack::cpu::pack_weights;
using seqpack::cpu::PackedWeights;

struct Case {
  int64_t m, k, n;
};

// Checks rows `rows` of C (all rows when empty) against the double triple loop.
// With `with_init`, each row starts from a row of a separate table (rows taken
// in a scrambled order, as an embedding lookup takes them) instead of beta * C.
void check_case(const Case& cs, bool trans_b, float beta, int64_t col0, int64_t col1,
                std::mt19937& gen, std::vector<int64_t> rows = {}, bool with_init = false) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int64_t lda = cs.k + 3, ldc = cs.n + 5;
  const int64_t ldb = trans_b ? cs.k + 2 : cs.n + 2;
  std::vector<float> a(static_cast<std::size_t>(cs.m * lda));
  std::vector<float> b(static_cast<std::size_t>((trans_b ? cs.n : cs.k) * ldb));
  std::vector<float> c(static_cast<std::size_t>(cs.m * ldc));
  for (float& x : a) x = u(gen);
  for (float& x : b) x = u(gen);
  for (float& x : c) x = u(gen);
  const std::vector<float> c0 = c;
  const int64_t table_rows = cs.m + 7, ldt = cs.n + 1;
  std::vector<float> table(static_cast<std::size_t>(table_rows * ldt));
  for (float& x : table) x = u(gen);
  std::vector<const float*> init;
  for (int64_t i = 0; with_init && i < cs.m; ++i) init.push_back(table.data() + (i * 5 + 3) % table_rows * ldt);
  auto bat = [&](int64_t kk, int64_t j) {
    return trans_b ? b[static_cast<std::size_t>(j * ldb + kk)]
                   : b[static_cast<std::size_t>(kk * ldb + j)];
  };
  PackedWeights pw;
  pack_weights(b.data(), trans_b, cs.k, cs.n, ldb, pw, seqpack::testing::kernels().isa_cap);
  gemm_packed_small(cs.m, a.data(), lda, pw, col0, col1, beta, c.data(), ldc,
                    with_init ? init.data() : nullptr);
  if (rows.empty()) {
    for (int64_t i = 0; i < cs.m; ++i) rows.push_back(i);
  }
  for (int64_t i : rows) {
    for (int64_t j = 0; j < ldc; ++j) {
      const std::size_t at = static_cast<std::size_t>(i * ldc + j);
      if (j < col0 || j >= col1) {
        // Outside the range (and in the row padding) C is untouched.
        ASSERT_EQ(c[at], c0[at]) << "i=" << i << " j=" << j;
        continue;
      }
      double want = with_init ? static_cast<double>(init[static_cast<std::size_t>(i)][j])
                              : beta * static_cast<double>(c0[at]);
      double mag = std::fabs(want);
      for (int64_t kk = 0; kk < cs.k; ++kk) {
        const double p = static_cast<double>(a[static_cast<std::size_t>(i * lda + kk)]) * bat(kk, j);
        want += p;
        mag += std::fabs(p);
      }
      ASSERT_NEAR(c[at], want, 1e-6 * mag + 1e-6)
          << "m=" << cs.m << " k=" << cs.k << " n=" << cs.n << " i=" << i << " j=" << j;
    }
  }
}

std::string describe(const Case& cs, bool trans_b, float beta) {
  return "m=" + std::to_string(cs.m) + " k=" + std::to_string(cs.k) + " n=" +
         std::to_string(cs.n) + " trans_b=" + std::to_string(trans_b) +
         " beta=" + std::to_string(beta);
}

TEST(GemmPackedSmall, MatchesTripleLoopEveryRowCount) {
  const auto seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 gen(static_cast<std::mt19937::result_type>(seed));
  // Every m up to 260 covers each remainder of every register block height
  // (4 and 6 rows on AVX2, 12 on AVX-512) and several row blocks.
  for (int64_t m = 1; m <= 260; ++m) {
    for (const Case& base : {Case{0, 37, 53}, Case{0, 7, 37}}) {
      const Case cs{m, base.k, base.n};
      for (bool trans_b : {false, true}) {
        for (float beta : {0.f, 1.f}) {
          SCOPED_TRACE(describe(cs, trans_b, beta));
          check_case(cs, trans_b, beta, 0, cs.n, gen);
          // A range starting and ending inside panels.
          check_case(cs, trans_b, beta, cs.n / 3, cs.n - cs.n / 5, gen);
        }
        // Rows starting from init rows (beta is then ignored: pass 1 to show it).
        check_case(cs, trans_b, 1.f, 0, cs.n, gen, {}, /*with_init=*/true);
        check_case(cs, trans_b, 1.f, cs.n / 3, cs.n - cs.n / 5, gen, {}, /*with_init=*/true);
      }
    }
  }
  for (int64_t m = 1; m <= 9; ++m) {
    for (const Case& base : {Case{0, 1, 7}, Case{0, 64, 96}, Case{0, 13, 131}}) {
      const Case cs{m, base.k, base.n};
      for (bool trans_b : {false, true}) {
        for (float beta : {0.f, 1.f}) {
          SCOPED_TRACE(describe(cs, trans_b, beta));
          check_case(cs, trans_b, beta, 0, cs.n, gen);
          check_case(cs, trans_b, beta, cs.n / 3, cs.n - cs.n / 5, gen);
        }
      }
    }
  }
}

TEST(GemmPackedSmall, MatchesTripleLoopOnWorkloadShapes) {
  const auto seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 gen(static_cast<std::mt19937::result_type>(seed));
  // The per-step shapes of the workloads (forward K = R, N = G, packed from
  // W_hhᵀ; backward K = G, N = R, packed from W_hh) and one with k just past a
  // k block. K > 256 is cut into k blocks, and rows into blocks of up to
  // 49152 / k_block rows, so m = 200 and 256 cross a row block at K >= 384.
  struct Shape {
    int64_t k, n;
    bool trans_b;
  };
  for (const Shape& s : {Shape{128, 512, true}, Shape{512, 128, false}, Shape{128, 384, true},
                         Shape{384, 128, false}, Shape{256, 1024, true}, Shape{1024, 256, false},
                         Shape{512, 2048, true}, Shape{2048, 512, false}, Shape{64, 64, true},
                         Shape{257, 37, false}}) {
    for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 11, 12, 13, 64, 129, 200, 256}) {
      const Case cs{m, s.k, s.n};
      // The big ones check a sample of rows: the first and last of every
      // kind of block and a few in between.
      std::vector<int64_t> rows;
      if (m * s.k * s.n > (1 << 22)) {
        for (int64_t i : {int64_t{0}, int64_t{5}, int64_t{6}, int64_t{11}, int64_t{12}, m / 2,
                          m - 13, m - 1}) {
          if (i >= 0 && i < m) rows.push_back(i);
        }
      }
      for (float beta : {0.f, 1.f}) {
        SCOPED_TRACE(describe(cs, s.trans_b, beta));
        check_case(cs, s.trans_b, beta, 0, cs.n, gen, rows);
        if (m % 4 == 1) check_case(cs, s.trans_b, beta, 5, cs.n - 27, gen, rows);
      }
      // Init rows over k blocks (K > 256: only the first block starts from them).
      check_case(cs, s.trans_b, 0.f, 0, cs.n, gen, rows, /*with_init=*/true);
      if (m % 4 == 1) check_case(cs, s.trans_b, 0.f, 5, cs.n - 27, gen, rows, /*with_init=*/true);
    }
  }
}

TEST(GemmPackedSmall, ColumnSplitGivesTheSameBits) {
  // rnn_core splits a step's columns between threads (per gate, at any
  // column): the pieces must give exactly the bits of one call.
  const auto seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 gen(static_cast<std::mt19937::result_type>(seed));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (const Case& cs : {Case{130, 512, 128}, Case{67, 128, 512}, Case{13, 37, 53}}) {
    for (float beta : {0.f, 1.f}) {
      SCOPED_TRACE(describe(cs, false, beta));
      std::vector<float> a(static_cast<std::size_t>(cs.m * cs.k)),
          b(static_cast<std::size_t>(cs.k * cs.n)), c(static_cast<std::size_t>(cs.m * cs.n));
      for (float& x : a) x = u(gen);
      for (float& x : b) x = u(gen);
      for (float& x : c) x = u(gen);
      PackedWeights pw;
      pack_weights(b.data(), /*trans_b=*/false, cs.k, cs.n, cs.n, pw,
                   seqpack::testing::kernels().isa_cap);
      std::vector<float> whole = c;
      gemm_packed_small(cs.m, a.data(), cs.k, pw, 0, cs.n, beta, whole.data(), cs.n);
      for (int64_t cut : {int64_t{1}, int64_t{16}, cs.n / 2 + 3, cs.n - 1}) {
        std::vector<float> split = c;
        gemm_packed_small(cs.m, a.data(), cs.k, pw, 0, cut, beta, split.data(), cs.n);
        gemm_packed_small(cs.m, a.data(), cs.k, pw, cut, cs.n, beta, split.data(), cs.n);
        for (std::size_t i = 0; i < whole.size(); ++i) {
          ASSERT_EQ(split[i], whole[i]) << "cut=" << cut << " at " << i;
        }
      }
    }
  }
}

TEST(GemmPackedSmall, BetaZeroNeverReadsC) {
  // beta = 0 overwrites C, whatever it held (rnn_core hands it recycled buffers).
  const int64_t m = 20, k = 300, n = 40;
  std::vector<float> a(static_cast<std::size_t>(m * k), 0.5f);
  std::vector<float> b(static_cast<std::size_t>(k * n), 2.f);
  std::vector<float> c(static_cast<std::size_t>(m * n), std::numeric_limits<float>::quiet_NaN());
  PackedWeights pw;
  pack_weights(b.data(), /*trans_b=*/false, k, n, n, pw, seqpack::testing::kernels().isa_cap);
  gemm_packed_small(m, a.data(), k, pw, 0, n, 0.f, c.data(), n);
  for (float x : c) ASSERT_EQ(x, 300.f);  // 300 * 0.5 * 2, exact in float
}

TEST(GemmPackedSmall, EmptyCasesLeaveCUntouched) {
  std::vector<float> b(12, 1.f), a(8, 1.f), c(6, 7.f);
  PackedWeights pw;
  pack_weights(b.data(), /*trans_b=*/false, 4, 3, 3, pw, seqpack::testing::kernels().isa_cap);
  gemm_packed_small(0, a.data(), 4, pw, 0, 3, 0.f, c.data(), 3);
  gemm_packed_small(2, a.data(), 4, pw, 2, 2, 0.f, c.data(), 3);
  for (float x : c) EXPECT_EQ(x, 7.f);
  // k = 0: the product is empty, C = beta * C.
  PackedWeights empty;
  pack_weights(b.data(), /*trans_b=*/false, 0, 3, 3, empty, seqpack::testing::kernels().isa_cap);
  gemm_packed_small(2, a.data(), 4, empty, 0, 3, 0.f, c.data(), 3);
  for (float x : c) EXPECT_EQ(x, 0.f);
}

TEST(GemmPackedSmall, RepackingReusesStorage) {
  // Re-packing a matrix of the same size (every layer of a call) must not
  // reallocate, and must replace the old values.
  std::vector<float> b1(20, 1.f), b2(20, 2.f), a(5, 1.f), c(4, 0.f);
  PackedWeights pw;
  pack_weights(b1.data(), /*trans_b=*/false, 5, 4, 4, pw, seqpack::testing::kernels().isa_cap);
  const float* first = pw.storage.data();
  pack_weights(b2.data(), /*trans_b=*/false, 5, 4, 4, pw, seqpack::testing::kernels().isa_cap);
  EXPECT_EQ(pw.storage.data(), first);
  gemm_packed_small(1, a.data(), 5, pw, 0, 4, 0.f, c.data(), 4);
  for (float x : c) EXPECT_EQ(x, 10.f);  // 5 * 1 * 2
}

// gemm_unpacked_small (a call of one step reads W_hh where it is, packing
// panels per call) gives the bits of pack_weights + gemm_packed_small: the
// same FMA chains, so a sequence's results do not depend on which of the two
// its call took (batch invariance across a call of one step and a longer
// one). Both forms of B, tails of every size past the 4 x 4 transposes and
// the panels (and past the 16 x 16 blocks of b's rows that up to 4 rows read
// in place on AVX-512), column ranges starting and ending mid-panel, beta 0
// (C not read) and 1, and init rows.
TEST(GemmUnpackedSmall, GivesThePackedProductsBits) {
  const auto seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 gen(static_cast<std::mt19937::result_type>(seed));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const Case cases[] = {{1, 500, 1500}, {1, 37, 53},  {2, 3, 5},     {3, 64, 130}, {5, 129, 67},
                        {7, 40, 160},   {13, 1, 17}, {64, 500, 96},  {130, 33, 70}, {4, 500, 100},
                        {2, 16, 48},    {1, 17, 33}, {4, 1, 16},     {3, 31, 47}};
  for (const Case& cs : cases) {
    for (const bool trans_b : {true, false}) {
      for (const float beta : {0.f, 1.f}) {
        for (const bool with_init : {false, true}) {
          SCOPED_TRACE(describe(cs, trans_b, beta) + " init=" + std::to_string(with_init));
          const int64_t lda = cs.k + 3, ldc = cs.n + 5, ldb = trans_b ? cs.k + 2 : cs.n + 2;
          std::vector<float> a(static_cast<std::size_t>(cs.m * lda));
          std::vector<float> b(static_cast<std::size_t>((trans_b ? cs.n : cs.k) * ldb));
          std::vector<float> c(static_cast<std::size_t>(cs.m * ldc));
          for (float& x : a) x = u(gen);
          for (float& x : b) x = u(gen);
          for (float& x : c) x = beta == 0.f ? std::numeric_limits<float>::quiet_NaN() : u(gen);
          std::vector<float> table(static_cast<std::size_t>((cs.m + 3) * cs.n));
          for (float& x : table) x = u(gen);
          std::vector<const float*> init;
          for (int64_t i = 0; with_init && i < cs.m; ++i)
            init.push_back(table.data() + (i * 2 + 1) % (cs.m + 3) * cs.n);
          const float* const* rows = with_init ? init.data() : nullptr;
          PackedWeights pw;
          pack_weights(b.data(), trans_b, cs.k, cs.n, ldb, pw, seqpack::testing::kernels().isa_cap);
          for (const auto& [col0, col1] :
               {std::pair<int64_t, int64_t>{0, cs.n}, {cs.n / 3, cs.n - cs.n / 4}, {1, 2},
                {2, cs.n - 1}, {std::max<int64_t>(0, cs.n - 16), cs.n}}) {
            if (col1 <= col0) continue;
            std::vector<float> want = c, got = c;
            gemm_packed_small(cs.m, a.data(), lda, pw, col0, col1, beta, want.data(), ldc, rows);
            seqpack::cpu::gemm_unpacked_small(seqpack::testing::kernels().isa_cap, cs.m, a.data(),
                                              lda, b.data(), trans_b, cs.k, cs.n, ldb, col0, col1,
                                              beta, got.data(), ldc, rows);
            for (std::size_t i = 0; i < want.size(); ++i) {
              ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
                  << "columns [" << col0 << ", " << col1 << ") at " << i;
            }
          }
        }
      }
    }
  }
}

// cpu::gemm's products of at most kFewTerms terms with op(B) = B (the weight
// gradients of a call of one step, op(A) = Aᵀ) run outside the BLAS: against
// the triple loop in double, both forms of A, beta 0 (C holding NaN, never
// read) and 0.5, on one thread and split over two, float and double.
template <typename T>
void check_few_terms(int64_t m, int64_t n, int64_t k, bool trans_a, T beta, int threads,
                     std::mt19937& gen) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  const int64_t lda = (trans_a ? m : k) + 2, ldb = n + 3, ldc = n + 1;
  std::vector<T> a(static_cast<std::size_t>((trans_a ? k : m) * lda));
  std::vector<T> b(static_cast<std::size_t>(k * ldb)), c(static_cast<std::size_t>(m * ldc));
  for (T& x : a) x = static_cast<T>(u(gen));
  for (T& x : b) x = static_cast<T>(u(gen));
  for (T& x : c) x = beta == T(0) ? std::numeric_limits<T>::quiet_NaN() : static_cast<T>(u(gen));
  const std::vector<T> c0 = c;
  seqpack::set_num_threads(threads);
  seqpack::cpu::gemm<T>(trans_a, false, m, n, k, T(1), a.data(), lda, b.data(), ldb, beta, c.data(),
                        ldc, seqpack::testing::kernels().isa_cap);
  seqpack::set_num_threads(1);
  const double eps = std::numeric_limits<T>::epsilon();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const auto at = static_cast<std::size_t>(i * ldc + j);
      if (j >= n) {
        ASSERT_EQ(std::isnan(c[at]), std::isnan(c0[at])) << "padding written";
        continue;
      }
      double want = beta == T(0) ? 0.0 : static_cast<double>(beta) * c0[at];
      double mag = std::fabs(want);
      for (int64_t kk = 0; kk < k; ++kk) {
        const double ai = trans_a ? a[static_cast<std::size_t>(kk * lda + i)]
                                  : a[static_cast<std::size_t>(i * lda + kk)];
        const double p = ai * static_cast<double>(b[static_cast<std::size_t>(kk * ldb + j)]);
        want += p;
        mag += std::fabs(p);
      }
      // k + 1 roundings of terms no larger than mag.
      ASSERT_NEAR(c[at], want, static_cast<double>(k + 1) * eps * mag)
          << "m=" << m << " n=" << n << " k=" << k << " trans_a=" << trans_a << " i=" << i
          << " j=" << j;
    }
  }
}

TEST(Gemm, ProductsOfFewTermsMatchTheTripleLoop) {
  const auto seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 gen(static_cast<std::mt19937::result_type>(seed));
  // 1500 x 800 x 4 is past the size that splits over threads.
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1500, 800, 4},
                                {37, 19, 1}, {5, 7, 2}, {3, 1, 3}}) {
    for (const bool trans_a : {true, false}) {
      for (int threads : {1, 2}) {
        check_few_terms<float>(m, n, k, trans_a, 0.f, threads, gen);
        check_few_terms<float>(m, n, k, trans_a, 0.5f, threads, gen);
        check_few_terms<double>(m, n, k, trans_a, 0.0, threads, gen);
        check_few_terms<double>(m, n, k, trans_a, 0.5, threads, gen);
      }
    }
  }
}

// A product of few terms gives the same bits split over two threads as on
// one (each element the same chain of FMAs wherever the split puts it: in
// a whole chunk of columns or in the masked tail), at every k up to
// kFewTerms, beta 0 and 1, and with 1500 x 1000 large enough to split by
// rows and 600 x 1900 by columns.
TEST(Gemm, ProductsOfFewTermsGiveTheSameBitsOnAnySplit) {
  std::mt19937 gen(77);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const auto& [m, n] : {std::pair<int64_t, int64_t>{1500, 1000}, {600, 1900}}) {
    for (int64_t k = 1; k <= seqpack::cpu::kFewTerms; ++k) {
      for (const float beta : {0.0f, 1.0f}) {
        std::vector<float> a(static_cast<std::size_t>(k * m)), b(static_cast<std::size_t>(k * n));
        std::vector<float> c(static_cast<std::size_t>(m * n));
        for (float& x : a) x = u(gen);
        for (float& x : b) x = u(gen);
        for (float& x : c) x = u(gen);
        std::vector<float> one = c, two = c;
        seqpack::set_num_threads(1);
        seqpack::cpu::gemm<float>(true, false, m, n, k, 1.0f, a.data(), m, b.data(), n, beta,
                                  one.data(), n, seqpack::testing::kernels().isa_cap);
        seqpack::set_num_threads(2);
        seqpack::cpu::gemm<float>(true, false, m, n, k, 1.0f, a.data(), m, b.data(), n, beta,
                                  two.data(), n, seqpack::testing::kernels().isa_cap);
        seqpack::set_num_threads(1);
        ASSERT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0)
            << "m " << m << " n " << n << " k " << k << " beta " << beta;
      }
    }
  }
}

// cpu::gemm_dot_rows (a few rows by weights as stored: the input projection
// x·W_ihᵀ and its gradient dG·W_ih of a one-step call at batch 1 or 2)
// against the triple loop in double: both forms of B, every row count it
// takes, sizes that are not multiples of the lane count or of its 4 rows of
// b, strides past the widths, beta 0 (C holding NaN, never read) and 0.5,
// with and without a bias row, the padding of C untouched; and the same bits
// on one thread as split over two (a product past 1 MB of weights splits).
TEST(Gemm, DotRowsMatchTheTripleLoopAndGiveTheSameBitsOnAnySplit) {
  const auto seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 gen(static_cast<std::mt19937::result_type>(seed));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const double eps = std::numeric_limits<float>::epsilon();
  for (const bool trans_b : {true, false}) {
    const int64_t max_rows = trans_b ? seqpack::cpu::kDotRowsMax : seqpack::cpu::kDotRowsEngine;
    for (const auto& [n, k] : {std::pair<int64_t, int64_t>{1, 1}, {3, 5}, {7, 17}, {37, 100},
                               {130, 33}, {1030, 515}}) {
      for (int64_t m = 1; m <= max_rows; ++m) {
        for (const float beta : {0.0f, 0.5f}) {
          for (const bool bias : {false, true}) {
            const int64_t lda = k + 3, ldb = (trans_b ? k : n) + 2, ldc = n + 5;
            std::vector<float> a(static_cast<std::size_t>(m * lda));
            std::vector<float> b(static_cast<std::size_t>((trans_b ? n : k) * ldb));
            std::vector<float> row(static_cast<std::size_t>(n));
            std::vector<float> c(static_cast<std::size_t>(m * ldc));
            for (float& x : a) x = u(gen);
            for (float& x : b) x = u(gen);
            for (float& x : row) x = u(gen);
            for (float& x : c) x = beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : u(gen);
            const std::vector<float> c0 = c;
            std::vector<float> two = c;
            seqpack::set_num_threads(1);
            seqpack::cpu::gemm_dot_rows(seqpack::testing::kernels().isa_cap, m, n, k, a.data(), lda,
                                        b.data(), trans_b, ldb, beta, c.data(), ldc,
                                        bias ? row.data() : nullptr);
            seqpack::set_num_threads(2);
            seqpack::cpu::gemm_dot_rows(seqpack::testing::kernels().isa_cap, m, n, k, a.data(), lda,
                                        b.data(), trans_b, ldb, beta, two.data(), ldc,
                                        bias ? row.data() : nullptr);
            seqpack::set_num_threads(1);
            const std::string what = "m=" + std::to_string(m) + " n=" + std::to_string(n) +
                                     " k=" + std::to_string(k) + " trans_b=" +
                                     std::to_string(trans_b) + " beta=" + std::to_string(beta) +
                                     " bias=" + std::to_string(bias);
            ASSERT_EQ(std::memcmp(c.data(), two.data(), c.size() * sizeof(float)), 0)
                << what << ": two threads gave other bits";
            for (int64_t i = 0; i < m; ++i) {
              for (int64_t j = 0; j < ldc; ++j) {
                const auto at = static_cast<std::size_t>(i * ldc + j);
                if (j >= n) {
                  ASSERT_EQ(std::isnan(c[at]), std::isnan(c0[at])) << what << ": padding written";
                  if (!std::isnan(c0[at])) ASSERT_EQ(c[at], c0[at]) << what << ": padding written";
                  continue;
                }
                double want = beta == 0.0f ? 0.0 : static_cast<double>(beta) * c0[at];
                if (bias) want += row[static_cast<std::size_t>(j)];
                double mag = std::fabs(want);
                for (int64_t q = 0; q < k; ++q) {
                  const double w = trans_b ? b[static_cast<std::size_t>(j * ldb + q)]
                                           : b[static_cast<std::size_t>(q * ldb + j)];
                  const double p =
                      static_cast<double>(a[static_cast<std::size_t>(i * lda + q)]) * w;
                  want += p;
                  mag += std::fabs(p);
                }
                // k products summed, then beta·C and the bias: k + 2 roundings
                // of terms no larger than mag.
                ASSERT_NEAR(c[at], want, static_cast<double>(k + 2) * eps * mag)
                    << what << " i=" << i << " j=" << j;
              }
            }
          }
        }
      }
    }
  }
  // More rows than the kernel takes: refused, naming the count.
  std::vector<float> x(64, 1.0f), y(64);
  EXPECT_THROW(seqpack::cpu::gemm_dot_rows(seqpack::testing::kernels().isa_cap,
                                           seqpack::cpu::kDotRowsMax + 1, 2, 2, x.data(), 2,
                                           x.data(), true, 2, 0.0f, y.data(), 2, nullptr),
               std::invalid_argument);
  EXPECT_THROW(seqpack::cpu::gemm_dot_rows(seqpack::testing::kernels().isa_cap,
                                           seqpack::cpu::kDotRowsEngine + 1, 2, 2, x.data(), 2,
                                           x.data(), false, 2, 0.0f, y.data(), 2, nullptr),
               std::invalid_argument);
}

// cpu::gemm with c_row: C = c_row (every row) + A·Bᵀ, whatever C held, on one
// thread and split over two (by rows when C is taller than wide, by columns
// otherwise), float32 and float64, and with k = 0 (C = c_row).
template <typename T>
void check_gemm_row_init(int64_t m, int64_t n, int64_t k, int threads, std::mt19937& gen) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<T> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(n * k));
  std::vector<T> row(static_cast<std::size_t>(n));
  std::vector<T> c(static_cast<std::size_t>(m * (n + 3)), std::numeric_limits<T>::quiet_NaN());
  for (T& x : a) x = static_cast<T>(u(gen));
  for (T& x : b) x = static_cast<T>(u(gen));
  for (T& x : row) x = static_cast<T>(u(gen));
  seqpack::set_num_threads(threads);
  seqpack::cpu::gemm<T>(false, true, m, n, k, T(1), a.data(), k, b.data(), k, T(0), c.data(), n + 3,
                        seqpack::testing::kernels().isa_cap, row.data());
  seqpack::set_num_threads(1);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want = row[static_cast<std::size_t>(j)], mag = std::fabs(want);
      for (int64_t kk = 0; kk < k; ++kk) {
        const double p = static_cast<double>(a[static_cast<std::size_t>(i * k + kk)]) *
                         static_cast<double>(b[static_cast<std::size_t>(j * k + kk)]);
        want += p;
        mag += std::fabs(p);
      }
      ASSERT_NEAR(c[static_cast<std::size_t>(i * (n + 3) + j)], want,
                  (std::is_same_v<T, float> ? 1e-6 : 1e-14) * mag + 1e-12)
          << "m=" << m << " n=" << n << " k=" << k << " threads=" << threads << " i=" << i
          << " j=" << j;
    }
    for (int64_t j = n; j < n + 3; ++j) {
      ASSERT_TRUE(std::isnan(c[static_cast<std::size_t>(i * (n + 3) + j)])) << "padding written";
    }
  }
}

TEST(Gemm, RowInitIsAddedToTheProduct) {
  const auto seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 gen(static_cast<std::mt19937::result_type>(seed));
  // 300 x 200 x 40 is past the size that splits over threads; 37 x 400 splits by columns.
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{300, 200, 40},
                                {37, 400, 150}, {5, 7, 3}, {4, 6, 0}}) {
    for (int threads : {1, 2}) {
      check_gemm_row_init<float>(m, n, k, threads, gen);
      check_gemm_row_init<double>(m, n, k, threads, gen);
    }
  }
}

// The recurrent layers multiply every float32 step by W_hh through
// gemm_packed_small (forward and backward; src/rnn_core.cpp) and float64
// steps through the BLAS: the two must agree to float precision.
void check_float_vs_double(seqpack::RNNOptions o, int threads, std::mt19937& gen,
                           const std::vector<int64_t>& lengths = {7, 5, 5, 2, 1}) {
  using seqpack::DType;
  using seqpack::Tensor;
  const auto plan = seqpack::PackingPlan::from_lengths(lengths, /*enforce_sorted=*/true);
  const double bound = 1.0 / std::sqrt(static_cast<double>(o.hidden_size));
  std::uniform_real_distribution<double> u(-bound, bound);
  auto random_f64 = [&](seqpack::Shape shape) {
    Tensor t = Tensor::empty(std::move(shape), DType::f64);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = u(gen);
    return t;
  };
  o.dtype = DType::f64;
  std::vector<Tensor> w64, w32;
  for (const auto& s : seqpack::rnn_parameter_shapes(o)) {
    w64.push_back(random_f64(s));
    w32.push_back(w64.back().to(DType::f32));
  }
  const Tensor x64 = random_f64({plan.total_rows(), o.input_size});
  const Tensor gout64 = random_f64({plan.total_rows(), o.output_size()});
  seqpack::set_num_threads(threads);
  const auto f64 =
      seqpack::rnn_forward(*rnn_make_plan(o, w64, /*in_place=*/true, seqpack::testing::config()),
                           x64, plan, {}, {}, /*training=*/true,
                           /*save_for_backward=*/true);
  const auto g64 = seqpack::rnn_backward(*f64.saved, gout64, {}, {});
  o.dtype = DType::f32;
  const auto f32 =
      seqpack::rnn_forward(*rnn_make_plan(o, w32, /*in_place=*/true, seqpack::testing::config()),
                           x64.to(DType::f32), plan, {}, {},
                           /*training=*/true, /*save_for_backward=*/true);
  const auto g32 = seqpack::rnn_backward(*f32.saved, gout64.to(DType::f32), {}, {});
  seqpack::set_num_threads(1);
  auto close = [](const Tensor& got32, const Tensor& want64, const std::string& what) {
    ASSERT_EQ(got32.numel(), want64.numel()) << what;
    const Tensor got = got32.to(DType::f64);
    for (int64_t i = 0; i < got.numel(); ++i) {
      const double a = got.data<double>()[i], b = want64.data<double>()[i];
      ASSERT_NEAR(a, b, 2e-5 + 2e-4 * std::fabs(b)) << what << "[" << i << "]";
    }
  };
  close(f32.output, f64.output, "output");
  close(f32.h_n, f64.h_n, "h_n");
  close(g32.input, g64.input, "grad input");
  close(g32.h0, g64.h0, "grad h0");
  for (std::size_t k = 0; k < g64.weights.size(); ++k) {
    close(g32.weights[k], g64.weights[k], "grad weight " + std::to_string(k));
  }
}

TEST(SmallRowPath, RecurrentLayersFloatMatchDouble) {
  const auto seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 gen(static_cast<std::mt19937::result_type>(seed));
  seqpack::RNNOptions lstm;
  lstm.mode = seqpack::RNNMode::lstm;
  lstm.input_size = 9;
  lstm.hidden_size = 256;  // W_hh 1024 x 256
  lstm.bidirectional = true;
  for (int threads : {1, 2}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    check_float_vs_double(lstm, threads, gen);
  }
  seqpack::RNNOptions proj = lstm;
  proj.hidden_size = 272;  // W_hh 1088 x 136: columns not a multiple of the panel width
  proj.proj_size = 136;
  proj.bidirectional = false;
  check_float_vs_double(proj, 1, gen);
  seqpack::RNNOptions gru = lstm;
  gru.mode = seqpack::RNNMode::gru;
  gru.hidden_size = 272;  // W_hh 816 x 272; two threads split 272 columns unevenly
  gru.bidirectional = false;
  for (int threads : {1, 2}) {
    SCOPED_TRACE("gru threads " + std::to_string(threads));
    check_float_vs_double(gru, threads, gen);
  }
}

TEST(SmallRowPath, ManyRowStepsFloatMatchDouble) {
  // Steps of 130 down to 1 live rows: the 6-row blocks over an L1-resident
  // panel, k blocks (GRU backward: K = 3 * 272 = 816) and every remainder,
  // with the columns split between 2 threads.
  const auto seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 gen(static_cast<std::mt19937::result_type>(seed));
  std::vector<int64_t> lengths;
  for (int64_t i = 0; i < 130; ++i) lengths.push_back(6 - i * 5 / 130);
  seqpack::RNNOptions lstm;
  lstm.mode = seqpack::RNNMode::lstm;
  lstm.input_size = 5;
  lstm.hidden_size = 64;
  lstm.bidirectional = true;
  seqpack::RNNOptions gru = lstm;
  gru.mode = seqpack::RNNMode::gru;
  gru.hidden_size = 272;
  gru.bidirectional = false;
  for (int threads : {1, 2}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    check_float_vs_double(lstm, threads, gen, lengths);
    check_float_vs_double(gru, threads, gen, lengths);
  }
}

// The classifier head's fixed-order linear rows: within rounding of the
// float64 product, and each row's bits independent of how many rows are
// computed with it (and of where it sits among them).
TEST(LinearRowsFixedOrder, MatchesFloat64AndARowIsTheSameBitsInAnyBatch) {
  std::mt19937 gen(17);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (const int64_t in : {1, 7, 8, 9, 74, 256, 257}) {
    for (const int64_t out : {1, 3, 20}) {
      const int64_t n = 13;
      std::vector<float> x(static_cast<std::size_t>(n * in)), w(static_cast<std::size_t>(out * in)),
          b(static_cast<std::size_t>(out)), y(static_cast<std::size_t>(n * out));
      for (auto* v : {&x, &w, &b})
        for (float& e : *v) e = u(gen);
      seqpack::cpu::linear_rows_fixed_order<float>(x.data(), w.data(), b.data(), n, in, out, y.data());
      for (int64_t i = 0; i < n; ++i) {
        std::vector<float> one(static_cast<std::size_t>(out));
        seqpack::cpu::linear_rows_fixed_order<float>(x.data() + i * in, w.data(), b.data(), 1, in,
                                                     out, one.data());
        for (int64_t j = 0; j < out; ++j) {
          double want = b[static_cast<std::size_t>(j)], mag = std::fabs(want);
          for (int64_t k = 0; k < in; ++k) {
            const double t = double(x[static_cast<std::size_t>(i * in + k)]) * w[static_cast<std::size_t>(j * in + k)];
            want += t;
            mag += std::fabs(t);
          }
          const float got = y[static_cast<std::size_t>(i * out + j)];
          ASSERT_NEAR(got, want, 1e-6 * mag + 1e-7)
              << "in " << in << " out " << out << " row " << i << " column " << j;
          ASSERT_EQ(std::bit_cast<uint32_t>(one[static_cast<std::size_t>(j)]), std::bit_cast<uint32_t>(got))
              << "in " << in << " out " << out << " row " << i << " column " << j
              << ": alone " << one[static_cast<std::size_t>(j)] << ", among " << n << " rows " << got;
        }
      }
    }
  }
  // Without a bias: the sum alone.
  const float x[3] = {1.f, 2.f, 3.f}, w[3] = {0.5f, -1.f, 2.f};
  float y = 0;
  seqpack::cpu::linear_rows_fixed_order<float>(x, w, nullptr, 1, 3, 1, &y);
  EXPECT_EQ(y, 4.5f);
}

}  // namespace

// The bf16 products of a few rows (cpu/gemm_bf16_rows.h): weights read where
// they are in fp32 give the bits of the same weights in oneDNN's blocked
// layouts (written by write_pair_blocked_bf16, 16 and 64 columns a tile),
// for both forms of B, ranges of columns (a column's bits do not depend on
// the range), beta 0 (C holding NaN, never read) and 1, and a bias row;
// against the double sums of the bf16-rounded operands within fp32's bound
// for the sums (k + 4 roundings of the sum of |products|); C outside the
// range and the rows past m untouched. (Their bits against oneDNN's own
// products: test_gemm_engine's GemmEngine.Bf16FewRowsGiveOnednnsBits.)
TEST(GemmBf16Rows, InPlaceGivesTheLaidOutBitsAndTheRoundedProducts) {
  using seqpack::cpu::bf16_of;
  using seqpack::cpu::float_of_bf16;
  if (!seqpack::cpu::bf16_rows_available(seqpack::testing::kernels()))
    GTEST_SKIP() << "no native AVX512-BF16 without AMX here (or capped, or emulated)";
  const auto seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 gen(static_cast<std::mt19937::result_type>(seed));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  // Past kFewRows (in place only): 5 rows, 13 (a chunk of 12 and one), 40.
  const Case cases[] = {{1, 500, 2000}, {1, 1, 1},      {2, 2, 5},     {3, 31, 17},   {4, 33, 64},
                        {4, 65, 130},   {1, 2000, 500}, {2, 7, 63},    {3, 1100, 65}, {4, 600, 16},
                        {5, 31, 17},    {13, 1100, 47}, {40, 65, 130}, {13, 2, 33}};
  seqpack::cpu::GrowBuffer<uint16_t> abuf;
  for (const Case& cs : cases) {
    for (const bool trans : {true, false}) {
      for (const int mode : {0, 1, 2}) {  // beta 0, beta 1, bias row
        const float beta = mode == 1 ? 1.f : 0.f;
        SCOPED_TRACE(describe(cs, trans, beta) + " bias=" + std::to_string(mode == 2));
        const int64_t lda = cs.k + 3, ldc = cs.n + 5, ldw = (trans ? cs.k : cs.n) + 2;
        std::vector<float> a(static_cast<std::size_t>(cs.m * lda));
        std::vector<float> w(static_cast<std::size_t>((trans ? cs.n : cs.k) * ldw));
        std::vector<float> c(static_cast<std::size_t>((cs.m + 1) * ldc)), bias(cs.n);
        for (float& x : a) x = u(gen);
        for (float& x : w) x = u(gen);
        for (float& x : bias) x = u(gen);
        for (float& x : c) x = mode == 1 ? u(gen) : std::numeric_limits<float>::quiet_NaN();
        const uint16_t* a16 =
            seqpack::cpu::bf16_rows_operand(cs.m, cs.k, a.data(), lda, nullptr, abuf);
        const int64_t k_block = cs.k > 1024 ? 1024 : 512;  // both orders of oneDNN 2.6's
        const seqpack::cpu::Bf16RowsB in_place{
            .k = cs.k, .n = cs.n, .k_block = k_block, .w = w.data(), .ld = ldw, .trans = trans};
        const float* c_row = mode == 2 ? bias.data() : nullptr;
        std::vector<float> whole = c;
        seqpack::cpu::bf16_rows_product(cs.m, a16, in_place, 0, cs.n, beta, whole.data(), ldc,
                                        c_row);
        // A row's bits are those of the row alone (on the few-row kernels
        // where there are more).
        for (int64_t i = 0; i < cs.m && cs.m > 1; ++i) {
          std::vector<float> alone = c;
          seqpack::cpu::bf16_rows_product(1, a16 + i * ((cs.k + 31) / 32 * 32), in_place, 0, cs.n,
                                          beta, alone.data() + i * ldc, ldc, c_row);
          for (int64_t j = 0; j < cs.n; ++j) {
            ASSERT_EQ(std::bit_cast<uint32_t>(alone[i * ldc + j]),
                      std::bit_cast<uint32_t>(whole[i * ldc + j]))
                << "row " << i << " column " << j << " alone and among " << cs.m;
          }
        }
        for (int64_t i = 0; i < cs.m; ++i) {
          for (int64_t j = 0; j < cs.n; ++j) {
            double want = 0, mag = 0;
            for (int64_t q = 0; q < cs.k; ++q) {
              const double x = float_of_bf16(bf16_of(a[i * lda + q]));
              const double y = float_of_bf16(bf16_of(trans ? w[j * ldw + q] : w[q * ldw + j]));
              want += x * y;
              mag += std::fabs(x * y);
            }
            const double add = mode == 2 ? bias[j] : mode == 1 ? c[i * ldc + j] : 0.0;
            const double bound = (cs.k + 4) * std::ldexp(mag + std::fabs(add), -24) + 1e-30;
            const float got = whole[i * ldc + j];
            ASSERT_LE(std::fabs(got - (want + add)), bound)
                << "C[" << i << "][" << j << "] = " << got << ", want " << want + add;
          }
        }
        for (const int64_t n_block : {16, 64}) {
          const int64_t tiles_k = (cs.k + 31) / 32, tiles_n = (cs.n + n_block - 1) / n_block;
          const seqpack::cpu::PairBlocking blocking{.n_block = n_block,
                                                    .tile_k_stride = 32 * n_block,
                                                    .tile_n_stride = tiles_k * 32 * n_block};
          std::vector<uint16_t> laid(static_cast<std::size_t>(tiles_k * tiles_n * 32 * n_block));
          seqpack::cpu::write_pair_blocked_bf16(w.data(), trans, ldw, cs.k, cs.n, blocking,
                                                laid.data());
          const seqpack::cpu::Bf16RowsB laid_out{
              .k = cs.k, .n = cs.n, .k_block = k_block, .laid = laid.data(), .blocking = blocking};
          for (const auto& [col0, col1] : {std::pair<int64_t, int64_t>{0, cs.n},
                                           {cs.n / 3, cs.n - cs.n / 4},
                                           {1, 2},
                                           {cs.n - 1, cs.n}}) {
            if (col0 < 0 || col1 <= col0 || col1 > cs.n) continue;
            for (const auto* b : {&in_place, &laid_out}) {
              if (b == &laid_out && cs.m > seqpack::cpu::kFewRows) continue;  // in place only
              std::vector<float> got = c;
              seqpack::cpu::bf16_rows_product(cs.m, a16, *b, col0, col1, beta, got.data(), ldc,
                                              c_row);
              for (int64_t i = 0; i <= cs.m; ++i) {
                for (int64_t j = 0; j < ldc; ++j) {
                  const std::size_t at = static_cast<std::size_t>(i * ldc + j);
                  const bool inside = i < cs.m && j >= col0 && j < col1;
                  ASSERT_EQ(std::bit_cast<uint32_t>(got[at]),
                            std::bit_cast<uint32_t>(inside ? whole[at] : c[at]))
                      << (b == &in_place ? "in place" : "laid out") << " (tiles of " << n_block
                      << " columns), columns [" << col0 << ", " << col1 << ") at C[" << i << "]["
                      << j << "]";
                }
              }
            }
          }
        }
      }
    }
  }
}

// The few-row products refuse a row count below 1, or above kFewRows on
// laid-out weights, and blocks of k that are not whole registers, naming
// the value.
TEST(GemmBf16Rows, RefusesRowCountsAndBlocksItCannotRun) {
  if (!seqpack::cpu::bf16_rows_available(seqpack::testing::kernels()))
    GTEST_SKIP() << "no native AVX512-BF16 without AMX here (or capped, or emulated)";
  std::vector<float> w(64 * 16, 0.5f), c(5 * 16);
  std::vector<uint16_t> a(5 * 64, 0);
  const seqpack::cpu::Bf16RowsB b{.k = 64, .n = 16, .k_block = 512, .w = w.data(), .ld = 16};
  const auto refused = [&](int64_t m, const seqpack::cpu::Bf16RowsB& bb) {
    try {
      seqpack::cpu::bf16_rows_product(m, a.data(), bb, 0, 16, 0.f, c.data(), 16);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::vector<uint16_t> tiles(2 * 32 * 16, 0);  // 64 x 16 in tiles of 32 x 16
  seqpack::cpu::Bf16RowsB laid{.k = 64, .n = 16, .k_block = 512};
  laid.laid = tiles.data();
  laid.blocking = {.n_block = 16, .tile_k_stride = 32 * 16, .tile_n_stride = 2 * 32 * 16};
  EXPECT_NE(refused(5, laid).find("m = 5 rows"), std::string::npos) << refused(5, laid);
  EXPECT_EQ(refused(4, laid), "accepted");
  EXPECT_EQ(refused(5, b), "accepted");  // in place
  EXPECT_NE(refused(0, b).find("m = 0 rows"), std::string::npos) << refused(0, b);
  seqpack::cpu::Bf16RowsB odd = b;
  odd.k_block = 100;
  EXPECT_NE(refused(1, odd).find("k_block = 100"), std::string::npos) << refused(1, odd);
  EXPECT_EQ(refused(1, b), "accepted");
}

// cpu::all_finite against a plain scan with std::isfinite: every length up
// to a few blocks, one non-finite entry (NaN with either sign and any
// payload, +-inf) at every position, and the finite extremes (largest,
// smallest subnormal, -0) that must not count.
template <typename T>
void check_all_finite() {
  const T specials[] = {std::numeric_limits<T>::quiet_NaN(), -std::numeric_limits<T>::quiet_NaN(),
                        std::numeric_limits<T>::signaling_NaN(),
                        std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity()};
  const T finite[] = {std::numeric_limits<T>::max(), -std::numeric_limits<T>::max(),
                      std::numeric_limits<T>::denorm_min(), T(-0.0), T(1)};
  for (int64_t n = 0; n <= 70; ++n) {
    std::vector<T> v(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = finite[i % 5];
    EXPECT_TRUE(seqpack::cpu::all_finite(v.data(), n)) << "n " << n;
    for (int64_t at = 0; at < n; ++at) {
      for (T s : specials) {
        std::vector<T> w = v;
        w[static_cast<std::size_t>(at)] = s;
        EXPECT_FALSE(seqpack::cpu::all_finite(w.data(), n)) << "n " << n << " at " << at;
        // A prefix that stops before it is finite.
        EXPECT_TRUE(seqpack::cpu::all_finite(w.data(), at)) << "n " << at;
      }
    }
  }
}

TEST(CpuKernels, AllFiniteFindsEveryNanAndInfinityWherever) {
  check_all_finite<float>();
  check_all_finite<double>();
}
