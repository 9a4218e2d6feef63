// int8 inference (Precision::int8, cpu/gemm_int8.h):
//   - the kernels against a plain scalar implementation of the quantization
//     scheme (the same rounding, computed element by element, products in
//     int64): quantized rows and weights equal, products within float rounding;
//   - the recurrent forward against the float64 reference over the parity
//     grid, within the bounds docs/performance.md documents:
//       outputs, h_n, c_n   |int8 - reference| <= kForwardAbs
//   - batch invariance: a sequence gives the same bits alone, in any batch,
//     at 1 and 2 threads;
//   - refusals: training, saving for a backward, float64.
// int8 runs on every CPU: the kernel tests run each kernel this CPU has
// (scalar everywhere, AVX2, AVX512-VNNI, AMX-INT8), the forward tests the
// one int8_kernel() picks (SEQPACK_INT8_KERNEL or the caps choose another).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/gemm_int8.h"
#include "forward_check.h"
#include "reference/rnn_reference.h"
#include "seqpack/packed_sequence.h"
#include "seqpack/precision.h"
#include "seqpack/rnn.h"
#include "seqpack/streaming.h"
#include "seqpack/threading.h"
#include "test_util.h"

namespace seqpack {
namespace {

constexpr double kForwardAbs = 0.03;

// ---- the kernels against a plain implementation of the scheme ----

struct PlainRow {
  std::vector<int32_t> q;
  float scale = 1;
  int32_t zp = 0;
};
// ±inf is read as ±FLT_MAX; a range that overflows a float is taken in double.
PlainRow plain_quantize_row(const float* x, int64_t k, int levels) {
  constexpr float kMax = std::numeric_limits<float>::max();
  PlainRow r;
  float lo = 0, hi = 0;
  bool nan = false;
  for (int64_t i = 0; i < k; ++i) {
    nan |= std::isnan(x[i]);
    if (std::isnan(x[i])) continue;
    lo = std::min(lo, std::clamp(x[i], -kMax, kMax));
    hi = std::max(hi, std::clamp(x[i], -kMax, kMax));
  }
  r.q.assign(static_cast<std::size_t>(k), 0);
  if (nan) {
    r.scale = std::numeric_limits<float>::quiet_NaN();
    return r;
  }
  const float spread = hi - lo;
  if (spread < 1e-30f) return r;
  r.scale = std::isfinite(spread) ? spread / float(levels)
                                  : static_cast<float>((double(hi) - double(lo)) / levels);
  const float inv = 1.f / r.scale;
  r.zp = std::clamp(static_cast<int32_t>(std::nearbyint(-lo * inv)), 0, levels);
  for (int64_t i = 0; i < k; ++i)
    r.q[static_cast<std::size_t>(i)] = std::clamp(
        static_cast<int32_t>(std::nearbyint(std::clamp(x[i], -kMax, kMax) * inv)) + r.zp, 0,
        levels);
  return r;
}

// The row parameters (pure C++: runs on any CPU) against hand-worked values.
TEST(Int8RowParams, HandWorkedRangesAndFiniteScalesForHugeRanges) {
  constexpr float kMax = std::numeric_limits<float>::max();
  // [-0.5, 2]: scale 2.5 / 255, zero point round(0.5 / scale) = round(51) = 51.
  cpu::U8RowParams p = cpu::u8_row_params(-0.5f, 2.f);
  EXPECT_EQ(p.scale, 2.5f / 255.f);
  EXPECT_EQ(p.inv, 1.f / (2.5f / 255.f));
  EXPECT_EQ(p.zp, 51);
  // Over 127 levels (the AVX2 and scalar kernels): scale 2.5 / 127, zero point
  // round(0.5 / scale) = round(25.4) = 25.
  p = cpu::u8_row_params(-0.5f, 2.f, 127);
  EXPECT_EQ(p.scale, 2.5f / 127.f);
  EXPECT_EQ(p.zp, 25);
  p = cpu::u8_row_params(-kMax, 0.f, 127);
  EXPECT_EQ(p.zp, 127);
  // An all-zero row and one under the smallest spread: q = 0, scale 1.
  for (const auto& [lo, hi] : {std::pair{0.f, 0.f}, {-1e-31f, 0.f}, {0.f, 5e-31f}}) {
    p = cpu::u8_row_params(lo, hi);
    EXPECT_EQ(p.scale, 1.f) << lo << " " << hi;
    EXPECT_EQ(p.inv, 0.f) << lo << " " << hi;
    EXPECT_EQ(p.zp, 0) << lo << " " << hi;
  }
  // [-FLT_MAX, 0]: scale FLT_MAX / 255, zero point 255 (FLT_MAX is q = 255, x = 0 is q = zp).
  p = cpu::u8_row_params(-kMax, 0.f);
  EXPECT_EQ(p.scale, kMax / 255.f);
  EXPECT_EQ(p.zp, 255);
  // Ranges whose width overflows a float (3e38 - (-3e38) = 6e38 > FLT_MAX):
  // the scale is the double width / 255, finite, and the extremes come back
  // within one step of themselves.
  for (const auto& [lo, hi] : {std::pair{-3e38f, 3e38f}, {-kMax, kMax}, {-kMax, 2e38f},
                               {-1.5e38f, kMax}}) {
    SCOPED_TRACE(std::to_string(lo) + ", " + std::to_string(hi));
    p = cpu::u8_row_params(lo, hi);
    const double want = (double(hi) - double(lo)) / 255.0;
    ASSERT_TRUE(std::isfinite(p.scale));
    ASSERT_TRUE(std::isfinite(p.inv) && p.inv > 0);
    EXPECT_NEAR(p.scale, want, want * 1e-7);
    EXPECT_NEAR(p.zp, -double(lo) / want, 0.5 + 1e-6);
    for (const float x : {lo, hi, 0.f}) {
      const int32_t q = std::clamp(static_cast<int32_t>(std::nearbyint(x * p.inv)) + p.zp, 0, 255);
      const double back = double(p.scale) * (q - p.zp);
      EXPECT_NEAR(back, x, want * 1.01) << "x " << x << " q " << q;
    }
  }
  // A finite width keeps the float arithmetic: 1e38 - (-2e38) in float.
  p = cpu::u8_row_params(-2e38f, 1e38f);
  EXPECT_EQ(p.scale, (1e38f - -2e38f) / 255.f);
}

PlainRow plain_quantize_column(const std::vector<float>& w) {
  PlainRow r;
  float mx = 0;
  for (float v : w) mx = std::max(mx, std::fabs(v));
  r.scale = mx > 0 ? mx / 127.f : 1.f;
  const float inv = mx > 0 ? 1.f / r.scale : 0.f;
  for (float v : w) r.q.push_back(std::clamp(static_cast<int32_t>(std::nearbyint(v * inv)), -127, 127));
  return r;
}

// The product kernels this CPU runs under the program's ISA cap (scalar
// everywhere; AVX2, VNNI and AMX-INT8 where it has them).
std::vector<cpu::Int8Kernel> int8_kernels() {
  const cpu::IsaLevel cap = testing::kernels().isa_cap;
  std::vector<cpu::Int8Kernel> kernels{cpu::Int8Kernel::scalar};
  if (cpu::avx2_int8_supported(cap)) kernels.push_back(cpu::Int8Kernel::avx2);
  if (cpu::vnni_int8_supported(cap)) kernels.push_back(cpu::Int8Kernel::vnni);
  if (cpu::amx_int8_supported(cap)) kernels.push_back(cpu::Int8Kernel::amx);
  return kernels;
}

TEST(Int8Kernels, QuantizationAndProductsMatchThePlainScheme) {
  for (const cpu::Int8Kernel kernel : int8_kernels()) {
  const int levels = cpu::int8_row_levels(kernel);
  SCOPED_TRACE(std::string("kernel ") + cpu::int8_kernel_name(kernel));
  std::mt19937_64 gen(77);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (const int64_t k : {1, 3, 4, 17, 64, 130}) {
    for (const int64_t n : {1, 15, 16, 33, 70}) {
      for (const bool trans_b : {false, true}) {
        // (past 32 rows: the AMX kernel's second row block)
        const int64_t m = 1 + static_cast<int64_t>(gen() % 13) + (n == 33 ? 30 : 0);
        SCOPED_TRACE("k " + std::to_string(k) + " n " + std::to_string(n) + " m " +
                     std::to_string(m) + (trans_b ? " trans_b" : ""));
        std::vector<float> a(static_cast<std::size_t>(m * (k + 2))), b(static_cast<std::size_t>(k * n));
        for (auto& v : a) v = u(gen);
        for (auto& v : b) v = u(gen);
        if (m > 2) {  // an all-zero row and a non-negative row
          std::fill_n(a.begin() + (k + 2), k, 0.f);
          for (int64_t i = 0; i < k; ++i) a[static_cast<std::size_t>(2 * (k + 2) + i)] = std::fabs(a[static_cast<std::size_t>(2 * (k + 2) + i)]);
        }
        const int64_t ldb = trans_b ? k : n;
        auto bat = [&](int64_t kk, int64_t j) {
          return trans_b ? b[static_cast<std::size_t>(j * k + kk)] : b[static_cast<std::size_t>(kk * n + j)];
        };
        cpu::QuantizedRows qa;
        cpu::quantize_rows_u8(m, k, a.data(), k + 2, qa, kernel);
        ASSERT_EQ(qa.kernel, kernel);
        ASSERT_EQ(qa.levels, levels);
        cpu::QuantizedWeights qb;
        cpu::quantize_weights_s8(b.data(), trans_b, k, n, ldb, qb, testing::kernels().isa_cap);
        std::vector<PlainRow> rows, cols;
        for (int64_t i = 0; i < m; ++i) {
          rows.push_back(plain_quantize_row(a.data() + i * (k + 2), k, levels));
          ASSERT_EQ(qa.scale.data()[i], rows.back().scale) << "row " << i;
          ASSERT_EQ(qa.zp.data()[i], rows.back().zp) << "row " << i;
          for (int64_t kk = 0; kk < k; ++kk)
            ASSERT_EQ(qa.q.data()[i * qa.ld + kk], rows.back().q[static_cast<std::size_t>(kk)])
                << "row " << i << " k " << kk;
        }
        for (int64_t j = 0; j < n; ++j) {
          std::vector<float> col;
          for (int64_t kk = 0; kk < k; ++kk) col.push_back(bat(kk, j));
          cols.push_back(plain_quantize_column(col));
          ASSERT_EQ(qb.scale.data()[j], cols.back().scale) << "column " << j;
        }
        // C = init + P on a column range not aligned to 16, and c_row + P, and P + C.
        const int64_t col0 = n > 2 ? 1 : 0, col1 = n > 3 ? n - 1 : n;
        std::vector<float> init(static_cast<std::size_t>(m * n)), c(static_cast<std::size_t>(m * n), 7.f);
        for (auto& v : init) v = u(gen);
        std::vector<const float*> init_rows;
        for (int64_t i = 0; i < m; ++i) init_rows.push_back(init.data() + i * n);
        for (const int variant : {0, 1, 2}) {
          std::fill(c.begin(), c.end(), 7.f);
          cpu::gemm_u8s8_f32(m, qa, 0, qb, col0, col1, variant == 2 ? 1.f : 0.f, c.data(), n,
                             variant == 0 ? init_rows.data() : nullptr,
                             variant == 1 ? init.data() : nullptr);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              const float got = c[static_cast<std::size_t>(i * n + j)];
              if (j < col0 || j >= col1) {
                ASSERT_EQ(got, 7.f) << "column " << j << " outside the range was written";
                continue;
              }
              int64_t acc = 0;
              for (int64_t kk = 0; kk < k; ++kk)
                acc += int64_t(rows[std::size_t(i)].q[std::size_t(kk)] - rows[std::size_t(i)].zp) *
                       cols[std::size_t(j)].q[std::size_t(kk)];
              const double p = double(acc) * rows[std::size_t(i)].scale * cols[std::size_t(j)].scale;
              const double base = variant == 0 ? init[std::size_t(i * n + j)]
                                  : variant == 1 ? init[std::size_t(j)]
                                                 : 7.0;
              const double want = base + p;
              ASSERT_NEAR(got, want, 1e-5 * (1 + std::fabs(want)))
                  << "variant " << variant << " row " << i << " column " << j;
            }
          }
        }
      }
    }
  }
  }
}

// Every kernel computes the exact int32 sums and the scalar kernel's
// epilogue, so on the same quantized rows it gives the scalar kernel's bits,
// not merely close values (the AMX kernel's too, and products of fewer than
// kAmxMinRows rows on amx run on VNNI: which one runs must not change a
// result, the int8 results' batch invariance rests on it). Odd shapes: tails
// of rows (AVX2's 4-row blocks, VNNI's 6, AMX's 16-row tiles and 32-row
// blocks), of k (64 k a tile) and of columns, a row offset, every variant;
// rows with values near the top of the range, where AVX2's 16-bit pair sums
// would saturate over 255 levels.
TEST(Int8Kernels, EveryKernelGivesTheScalarKernelsBits) {
  if (int8_kernels().size() == 1) GTEST_SKIP() << "only the scalar kernel runs here";
  std::mt19937_64 gen(78);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (const cpu::Int8Kernel kernel : int8_kernels()) {
    if (kernel == cpu::Int8Kernel::scalar) continue;
    SCOPED_TRACE(std::string("kernel ") + cpu::int8_kernel_name(kernel));
    for (const int64_t k : {1, 5, 64, 65, 130, 512}) {
      for (const int64_t n : {1, 16, 17, 47, 64, 70}) {
        for (const int64_t m : {1, 3, 4, 16, 17, 32, 33, 71}) {
          const int64_t row0 = static_cast<int64_t>(gen() % 3), rows = m + row0;
          SCOPED_TRACE("k " + std::to_string(k) + " n " + std::to_string(n) + " m " +
                       std::to_string(m) + " row0 " + std::to_string(row0));
          std::vector<float> a(static_cast<std::size_t>(rows * k)), b(static_cast<std::size_t>(n * k));
          for (auto& v : a) v = u(gen);
          for (auto& v : b) v = u(gen);
          // A row of the largest values against a unit of the largest
          // weights of one sign: every product at its top.
          for (int64_t i = 0; i < k; ++i) a[static_cast<std::size_t>(row0 * k + i)] = 2.f;
          a[static_cast<std::size_t>(row0 * k)] = -0.001f;  // lo < 0: zp > 0
          for (int64_t i = 0; i < k; ++i) b[static_cast<std::size_t>(i)] = -1.5f;
          cpu::QuantizedRows qa;
          cpu::quantize_rows_u8(rows, k, a.data(), k, qa, kernel);
          cpu::QuantizedWeights qb;
          cpu::quantize_weights_s8(b.data(), /*trans_b=*/true, k, n, k, qb,
                                   testing::kernels().isa_cap);
          std::vector<float> init(static_cast<std::size_t>(m * n));
          for (auto& v : init) v = u(gen);
          std::vector<const float*> init_rows;
          for (int64_t i = 0; i < m; ++i) init_rows.push_back(init.data() + i * n);
          const int64_t col0 = n > 17 ? 3 : 0, col1 = n > 17 ? n - 2 : n;
          for (const int variant : {0, 1, 2, 3}) {
            std::vector<float> got[2];
            for (int which = 0; which < 2; ++which) {
              qa.kernel = which == 0 ? kernel : cpu::Int8Kernel::scalar;
              got[which].assign(static_cast<std::size_t>(m * n), 0.5f);
              cpu::gemm_u8s8_f32(m, qa, row0, qb, col0, col1, variant == 2 ? 1.f : 0.f,
                                 got[which].data(), n, variant == 0 ? init_rows.data() : nullptr,
                                 variant == 1 ? init.data() : nullptr);
            }
            for (std::size_t i = 0; i < got[0].size(); ++i)
              ASSERT_EQ(std::memcmp(&got[0][i], &got[1][i], sizeof(float)), 0)
                  << "variant " << variant << " element " << i << ": "
                  << cpu::int8_kernel_name(kernel) << " " << got[0][i] << ", scalar "
                  << got[1][i];
          }
        }
      }
    }
  }
}

// The kernel choice: SEQPACK_INT8_KERNEL's values are checked where it is read
// (tests/test_cli_int8.cpp); here, asking for a kernel this CPU cannot run is
// refused by name, one it can run is taken, and the scalar kernel runs
// everywhere.
TEST(Int8Kernels, AKernelThisCpuCannotRunIsRefusedByName) {
  const std::vector<cpu::Int8Kernel> here = int8_kernels();
  for (const cpu::Int8Kernel kernel : {cpu::Int8Kernel::amx, cpu::Int8Kernel::vnni,
                                       cpu::Int8Kernel::avx2, cpu::Int8Kernel::scalar}) {
    const std::string name = cpu::int8_kernel_name(kernel);
    cpu::Kernels asked = testing::kernels();
    asked.int8 = kernel;
    if (std::find(here.begin(), here.end(), kernel) != here.end()) {
      EXPECT_EQ(cpu::int8_kernel(asked), kernel) << name;
      continue;
    }
    try {
      cpu::int8_kernel(asked);
      FAIL() << name << " was accepted on " << cpu_info(seqpack::testing::policy()).isa;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'" + name + "'"), std::string::npos) << e.what();
    }
  }
}

// Rows with huge and infinite values quantize as the plain scheme says, with
// finite scales, and their products are finite and close to the products of
// the values (±inf read as ±FLT_MAX).
TEST(Int8Kernels, HugeAndInfiniteRowsHaveFiniteScalesAndProducts) {
  constexpr float kMax = std::numeric_limits<float>::max();
  const float inf = std::numeric_limits<float>::infinity();
  const int64_t k = 21, n = 19;
  std::mt19937_64 gen(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> b(static_cast<std::size_t>(n * k));
  for (auto& v : b) v = u(gen) * 0.2f;
  cpu::QuantizedWeights qb;
  cpu::quantize_weights_s8(b.data(), /*trans_b=*/true, k, n, k, qb, testing::kernels().isa_cap);
  const std::vector<std::vector<std::pair<int64_t, float>>> specials = {
      {{0, 3e38f}}, {{0, -3e38f}}, {{5, inf}}, {{20, -inf}}, {{3, kMax}, {4, -kMax}},
      {{0, 3e38f}, {1, -3e38f}}, {{2, inf}, {7, -inf}}};
  for (const cpu::Int8Kernel kernel : int8_kernels())
  for (const auto& special : specials) {
    SCOPED_TRACE(std::string("kernel ") + cpu::int8_kernel_name(kernel));
    std::vector<float> a(static_cast<std::size_t>(k));
    for (auto& v : a) v = u(gen);
    for (const auto& [at, v] : special) a[static_cast<std::size_t>(at)] = v;
    SCOPED_TRACE("a[" + std::to_string(special[0].first) + "] = " + std::to_string(special[0].second));
    cpu::QuantizedRows qa;
    cpu::quantize_rows_u8(1, k, a.data(), k, qa, kernel);
    const PlainRow plain = plain_quantize_row(a.data(), k, cpu::int8_row_levels(kernel));
    ASSERT_TRUE(std::isfinite(qa.scale.data()[0]));
    ASSERT_EQ(qa.scale.data()[0], plain.scale);
    ASSERT_EQ(qa.zp.data()[0], plain.zp);
    for (int64_t kk = 0; kk < k; ++kk)
      ASSERT_EQ(qa.q.data()[kk], plain.q[static_cast<std::size_t>(kk)]) << "k " << kk;
    std::vector<float> c(static_cast<std::size_t>(n));
    cpu::gemm_u8s8_f32(1, qa, 0, qb, 0, n, 0.f, c.data(), n);
    for (int64_t j = 0; j < n; ++j) {
      double want = 0, scale = 0;  // Σ w·x with ±inf as ±FLT_MAX, and Σ |w|·max|x|
      for (int64_t kk = 0; kk < k; ++kk) {
        const double x = std::clamp(a[static_cast<std::size_t>(kk)], -kMax, kMax);
        want += double(b[static_cast<std::size_t>(j * k + kk)]) * x;
        scale += std::fabs(double(b[static_cast<std::size_t>(j * k + kk)])) * kMax;
      }
      const float got = c[static_cast<std::size_t>(j)];
      if (std::fabs(want) <= kMax * 0.99) {
        ASSERT_TRUE(std::isfinite(got)) << "column " << j << ": " << got << ", want " << want;
      } else {
        ASSERT_FALSE(std::isnan(got)) << "column " << j << ", want " << want;
      }
      // One quantum of the row's and of the unit's scale per term, at most.
      if (std::isfinite(got)) EXPECT_NEAR(got, want, scale * 0.02) << "column " << j;
    }
  }
}

// ---- the recurrent forward ----

using testing::gather_rows;
using testing::max_abs_diff;
using testing::random_tensor;
using testing::rows_of;

struct Worst {
  double forward = 0;
  std::string at;
};

void check_config(RNNOptions o, const std::vector<int64_t>& lengths, bool give_h0, uint64_t seed,
                  Worst& worst) {
  o.precision = Precision::int8;
  std::mt19937_64 gen(seed);
  const testing::RnnCase rc = testing::random_rnn_case(o, lengths, give_h0, seed, gen);
  const std::string& what = rc.name;
  SCOPED_TRACE(what);
  const PackingPlan& plan = rc.plan;
  const std::vector<Tensor>& weights = rc.weights;
  const Tensor &x = rc.x, &h0 = rc.h0, &c0 = rc.c0;
  const int64_t B = plan.batch(), LD = o.num_layers * o.num_directions();
  const auto fwd = rnn_forward(
      *rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()), x, plan, h0, c0,
      /*training=*/false, false);
  testing::WorstForward w{worst.forward, worst.at};
  testing::check_forward_against_reference(o, rc, testing::case_sequences(rc), fwd, kForwardAbs, w);
  worst.forward = w.value;
  worst.at = w.at;
}

TEST(RNNInt8, ParityGridAgainstFloat64Reference) {
  Worst worst;
  uint64_t seed = 3000;
  const std::vector<int64_t> lengths{12, 0, 9, 15, 3, 11, 1, 15};
  for (RNNMode mode : {RNNMode::lstm, RNNMode::gru, RNNMode::rnn_tanh, RNNMode::rnn_relu}) {
    for (int64_t layers : {1, 2}) {
      for (bool bi : {false, true}) {
        for (int64_t H : {37, 130}) {
          RNNOptions o{.mode = mode, .input_size = 29, .hidden_size = H, .num_layers = layers,
                       .bidirectional = bi};
          check_config(o, lengths, /*give_h0=*/(seed % 2) == 0, ++seed, worst);
          if (mode == RNNMode::lstm) {
            o.proj_size = H / 3;
            check_config(o, lengths, /*give_h0=*/true, ++seed, worst);
          }
        }
      }
    }
  }
  std::printf("int8 parity grid: worst |forward error| %.4g (%s)\n", worst.forward,
              worst.at.c_str());
}

TEST(RNNInt8, LongSequencesAndLargeBatches) {
  Worst worst;
  uint64_t seed = 4000;
  for (RNNMode mode : {RNNMode::lstm, RNNMode::gru, RNNMode::rnn_tanh}) {
    RNNOptions o{.mode = mode, .input_size = 64, .hidden_size = 256, .num_layers = 2,
                 .bidirectional = true};
    check_config(o, {300, 0, 150, 90, 37, 1, 64, 64, 12, 200}, /*give_h0=*/true, ++seed, worst);
  }
  std::printf("int8 long sequences: worst |forward error| %.4g (%s)\n", worst.forward,
              worst.at.c_str());
}

// Sequence b's output rows and final state, as raw bits.
std::vector<float> sequence_bits(const RNNForwardResult& r, const PackingPlan& plan, int64_t b) {
  std::vector<float> bits;
  const int64_t F = r.output.size(1);
  for (int64_t row : rows_of(plan, b))
    for (int64_t f = 0; f < F; ++f) bits.push_back(r.output.data<float>()[row * F + f]);
  for (const Tensor* s : {&r.h_n, &r.c_n}) {
    if (!s->defined()) continue;
    const int64_t LD = s->size(0), B = s->size(1), W = s->size(2);
    for (int64_t l = 0; l < LD; ++l)
      for (int64_t w = 0; w < W; ++w) bits.push_back(s->data<float>()[(l * B + b) * W + w]);
  }
  return bits;
}

// A sequence alone, then inside batches of different company, sizes and
// order, at 1 and 2 threads (by columns and with the steps' rows split):
// the same bits every time, for its outputs, h_n and c_n.
TEST(RNNInt8, ResultsDoNotDependOnTheBatch) {
  const int threads_before = num_threads();
  for (RNNMode mode : {RNNMode::lstm, RNNMode::gru, RNNMode::rnn_tanh}) {
    RNNOptions o{.mode = mode, .input_size = 24, .hidden_size = 96, .num_layers = 2,
                 .bidirectional = true};
    o.precision = Precision::int8;
    SCOPED_TRACE(rnn_mode_name(mode));
    std::mt19937_64 gen(11);
    std::vector<Tensor> weights;
    for (const Shape& s : rnn_parameter_shapes(o)) weights.push_back(random_tensor(s, 0.2, gen));
    const int64_t len = 17;
    const Tensor mine = random_tensor({len, o.input_size}, 1.5, gen);
    const Tensor h0_mine = random_tensor({4, 1, o.hidden_size}, 0.5, gen);
    const Tensor c0_mine = random_tensor({4, 1, o.hidden_size}, 0.5, gen);
    for (const bool with_h0 : {false, true}) {  // the zero-h0 skip, and a given h0
      std::vector<float> alone;
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        for (const std::vector<int64_t>& company :
             {std::vector<int64_t>{}, {40, 3}, {17, 17, 17}, {1}, {5, 60, 2, 17, 9, 33, 12}}) {
          std::vector<int64_t> lengths = company;
          const auto at = static_cast<int64_t>(company.size() / 2);  // where mine goes
          lengths.insert(lengths.begin() + at, len);
          std::vector<Tensor> seqs;
          for (int64_t L : lengths) seqs.push_back(random_tensor({L, o.input_size}, 3.0, gen));
          seqs[static_cast<std::size_t>(at)] = mine;
          const PackedSequence p = pack_sequence(seqs, /*enforce_sorted=*/false);
          const PackingPlan plan = PackingPlan::from_packed(p);
          const int64_t B = plan.batch(), W = o.hidden_size;
          Tensor h0, c0;
          if (with_h0) {
            h0 = random_tensor({4, B, W}, 0.9, gen);
            c0 = random_tensor({4, B, W}, 0.9, gen);
            for (int64_t l = 0; l < 4; ++l)
              for (int64_t w = 0; w < W; ++w) {
                h0.data<float>()[(l * B + at) * W + w] = h0_mine.data<float>()[l * W + w];
                c0.data<float>()[(l * B + at) * W + w] = c0_mine.data<float>()[l * W + w];
              }
            if (mode != RNNMode::lstm) c0 = Tensor();
          }
          const auto r =
              rnn_forward(*rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()),
                          p.data, plan, h0, c0, false, false);
          const std::vector<float> bits = sequence_bits(r, plan, at);
          if (alone.empty()) {  // alone, one thread: the reference
            alone = bits;
            continue;
          }
          ASSERT_EQ(bits.size(), alone.size());
          for (std::size_t i = 0; i < bits.size(); ++i)
            ASSERT_EQ(std::memcmp(&bits[i], &alone[i], sizeof(float)), 0)
                << "company of " << company.size() << ", " << threads << " threads, h0 "
                << with_h0 << ", value " << i << ": " << bits[i] << " alone " << alone[i];
        }
      }
    }
  }
  set_num_threads(threads_before);
}

// An input projection large enough to be split by columns as well as rows
// (W_ih 512 x 1024 bytes, two blocks of half a core's L2 from 2 threads on):
// the same bits at every thread count.
TEST(RNNInt8, AProjectionSplitByColumnsKeepsTheBits) {
  const int threads_before = num_threads();
  RNNOptions o{.mode = RNNMode::lstm, .input_size = 512, .hidden_size = 256, .num_layers = 2};
  o.precision = Precision::int8;
  std::mt19937_64 gen(12);
  std::vector<Tensor> weights;
  for (const Shape& s : rnn_parameter_shapes(o)) weights.push_back(random_tensor(s, 0.05, gen));
  std::vector<Tensor> seqs;
  for (int64_t L : {130, 7, 96, 64, 1, 120})
    seqs.push_back(random_tensor({L, o.input_size}, 1.0, gen));
  const PackedSequence p = pack_sequence(seqs, /*enforce_sorted=*/false);
  const PackingPlan plan = PackingPlan::from_packed(p);
  std::vector<float> one;
  for (int threads : {1, 2, 3, 8, 16}) {
    set_num_threads(threads);
    const auto r =
        rnn_forward(*rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()),
                    p.data, plan, Tensor(), Tensor(), false, false);
    std::vector<float> bits(r.output.data<float>(), r.output.data<float>() + r.output.numel());
    if (one.empty()) {
      one = bits;
      continue;
    }
    ASSERT_EQ(bits.size(), one.size());
    for (std::size_t i = 0; i < bits.size(); ++i)
      ASSERT_EQ(std::memcmp(&bits[i], &one[i], sizeof(float)), 0)
          << threads << " threads, value " << i << ": " << bits[i] << ", 1 thread " << one[i];
  }
  set_num_threads(threads_before);
}

TEST(RNNInt8, TrainingAndSavingForBackwardAreRefused) {
  RNNOptions o{.mode = RNNMode::lstm, .input_size = 3, .hidden_size = 4};
  o.precision = Precision::int8;
  std::mt19937_64 gen(1);
  std::vector<Tensor> weights;
  for (const Shape& s : rnn_parameter_shapes(o)) weights.push_back(random_tensor(s, 0.2, gen));
  const PackingPlan plan = PackingPlan::from_lengths({2, 1}, true);
  const Tensor x = random_tensor({3, 3}, 1.0, gen);
  for (const auto& [training, save, says] :
       {std::tuple{true, false, "training mode"}, {false, true, "saving for a backward"},
        {true, true, "training mode"}}) {
    try {
      rnn_forward(*rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()), x,
                  plan, {}, {}, training, save);
      FAIL() << "int8 ran training " << training << " save " << save;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("int8 is for inference only"), std::string::npos)
          << e.what();
    }
  }
  LSTM rnn(o);
  rnn.set_config(testing::config());
  rnn.train();
  EXPECT_THROW(rnn.forward(pack_sequence({x}, false)), std::invalid_argument);
  rnn.eval();
  const RNNOutput y = rnn.forward(pack_sequence({x}, false));  // requires_grad's default: saves nothing
  try {
    rnn.backward(y, Tensor::full(y.packed.data.shape(), 1.0, DType::f32));
    FAIL() << "an int8 forward had a backward";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("int8 is for inference only"), std::string::npos)
        << e.what();
  }
}

// A huge finite or infinite value in one sequence's input: that sequence's
// int8 outputs stay finite and close to fp32's, whose gates it saturates
// (int8 reads ±inf as ±FLT_MAX), and the other sequences' bits are those of
// the clean run. W_ih's magnitudes lie in [0.05, 0.2], so no weight of a unit
// quantizes to 0 (the gate a huge input reaches saturates in int8 as in fp32).
TEST(RNNInt8, HugeAndInfiniteInputsSaturateAsFp32Does) {
  constexpr float kMax = std::numeric_limits<float>::max();
  const float inf = std::numeric_limits<float>::infinity();
  RNNOptions o{.mode = RNNMode::lstm, .input_size = 6, .hidden_size = 20, .bidirectional = true};
  std::mt19937_64 gen(41);
  std::vector<Tensor> weights;
  for (const Shape& s : rnn_parameter_shapes(o)) weights.push_back(random_tensor(s, 0.2, gen));
  std::uniform_real_distribution<float> mag(0.05f, 0.2f);
  for (const std::size_t w_ih : {std::size_t{0}, std::size_t{4}}) {  // w_ih_l0 and its reverse
    ASSERT_EQ(weights[w_ih].shape(), (Shape{4 * o.hidden_size, o.input_size}));
    for (int64_t i = 0; i < weights[w_ih].numel(); ++i)
      weights[w_ih].data<float>()[i] = (gen() % 2 ? 1.f : -1.f) * mag(gen);
  }
  std::vector<Tensor> seqs;
  for (int64_t L : {5, 4, 3}) seqs.push_back(random_tensor({L, o.input_size}, 1.0, gen));
  const PackedSequence clean = pack_sequence(seqs, /*enforce_sorted=*/false);
  const PackingPlan plan = PackingPlan::from_packed(clean);
  RNNOptions o8 = o;
  o8.precision = Precision::int8;
  const auto clean8 =
      rnn_forward(*rnn_make_plan(o8, weights, /*in_place=*/true, seqpack::testing::config()),
                  clean.data, plan, {}, {}, false, false);
  const std::vector<std::vector<std::pair<int64_t, float>>> specials = {
      {{0, 3e38f}}, {{0, -3e38f}}, {{0, inf}}, {{3, -inf}}, {{5, kMax}},
      {{0, 3e38f}, {1, -3e38f}}};  // (inf and -inf in one row: fp32's inf - inf is NaN)
  for (const auto& special : specials) {
    SCOPED_TRACE("x[1][2][" + std::to_string(special[0].first) + "] = " +
                 std::to_string(special[0].second) + (special.size() > 1 ? " and another" : ""));
    std::vector<Tensor> s2 = seqs;
    s2[1] = seqs[1].clone();
    for (const auto& [at, v] : special) s2[1].data<float>()[2 * o.input_size + at] = v;
    const PackedSequence p = pack_sequence(s2, /*enforce_sorted=*/false);
    const auto f32 =
        rnn_forward(*rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()),
                    p.data, plan, {}, {}, false, false);
    const auto i8 =
        rnn_forward(*rnn_make_plan(o8, weights, /*in_place=*/true, seqpack::testing::config()),
                    p.data, plan, {}, {}, false, false);
    // Two huge values of opposite signs in one row: a unit's sum is then
    // 3e38 * (w0 - w1), whose sign fp32 resolves to the last bit of the
    // weights and 8-bit weights only to 1/127 of their largest: a unit whose
    // two weights share a quantization step saturates either way
    // (docs/performance.md). Only finiteness and the other sequences are
    // checked there.
    const bool both_signs = special.size() > 1;
    for (int64_t b = 0; b < 3; ++b) {
      const std::vector<float> got = sequence_bits(i8, plan, b);
      const std::vector<float> ref = sequence_bits(f32, plan, b);
      ASSERT_EQ(got.size(), ref.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_TRUE(std::isfinite(ref[i])) << "fp32 is not finite: sequence " << b << " value " << i;
        ASSERT_TRUE(std::isfinite(got[i])) << "sequence " << b << " value " << i;
        if (!(both_signs && b == 1)) {
          EXPECT_NEAR(got[i], ref[i], kForwardAbs) << "sequence " << b << " value " << i;
        }
      }
      if (b == 1) continue;
      const std::vector<float> before = sequence_bits(clean8, plan, b);
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(std::memcmp(&got[i], &before[i], sizeof(float)), 0)
            << "sequence " << b << " changed: value " << i;
    }
  }
}

// A NaN in one sequence reaches only that sequence (its rows' scales are NaN).
TEST(RNNInt8, NanInOneSequenceLeavesTheOthersUntouched) {
  testing::check_nan_stays_in_its_sequence(Precision::int8);
}

// The streaming API at int8: a sequence fed in chunks, interleaved with other
// streams, gives the values of one forward over it (equal; a zero's sign
// aside), and the weights are the ones quantized at construction until
// replan().
TEST(RNNInt8, StreamingChunksEqualOneForward) {
  for (RNNMode mode : {RNNMode::lstm, RNNMode::gru, RNNMode::rnn_tanh}) {
    SCOPED_TRACE(rnn_mode_name(mode));
    RNNOptions o{.mode = mode, .input_size = 12, .hidden_size = 48, .num_layers = 2};
    o.precision = Precision::int8;
    std::mt19937_64 gen(21);
    std::vector<Tensor> weights;
    for (const Shape& s : rnn_parameter_shapes(o)) weights.push_back(random_tensor(s, 0.3, gen));
    const Tensor xa = random_tensor({23, o.input_size}, 1.0, gen),
                 xb = random_tensor({9, o.input_size}, 1.0, gen);
    const PackingPlan plan = PackingPlan::from_lengths({23}, true);
    const auto whole =
        rnn_forward(*rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()), xa,
                    plan, {}, {}, false, false);
    StreamingRNN streams(o, weights, testing::config());
    const int64_t a = streams.open(), b = streams.open();
    std::vector<float> got;
    int64_t at = 0, bt = 0;
    for (const int64_t len : {1, 7, 0, 10, 5}) {
      const int64_t lb = std::min<int64_t>(3, 9 - bt);
      const auto y = streams.push({b, a}, {xb.slice0(bt, bt + lb), xa.slice0(at, at + len)});
      bt += lb;
      for (int64_t i = 0; i < y[1].numel(); ++i) got.push_back(y[1].data<float>()[i]);
      at += len;
    }
    ASSERT_EQ(at, 23);
    ASSERT_EQ(static_cast<int64_t>(got.size()), whole.output.numel());
    for (std::size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], whole.output.data<float>()[i]) << "value " << i;
    const StreamState st = streams.state(a);
    for (int64_t i = 0; i < st.h.numel(); ++i) ASSERT_EQ(st.h.data<float>()[i], whole.h_n.data<float>()[i]);

    // The weight matrices change in place: the next push quantizes them
    // again (its plan is compared with the weights), replan() or not.
    for (Tensor& w : weights)
      if (w.dim() == 2)
        for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] *= 0.5f;
    const auto halved =
        rnn_forward(*rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()), xa,
                    plan, {}, {}, false, false);
    const int64_t c = streams.open();
    const auto before = streams.push({c}, {xa})[0].clone();
    streams.replan();
    const int64_t d = streams.open();
    const auto after = streams.push({d}, {xa})[0];
    for (int64_t i = 0; i < after.numel(); ++i) {
      ASSERT_EQ(before.data<float>()[i], halved.output.data<float>()[i]) << i;
      ASSERT_EQ(after.data<float>()[i], halved.output.data<float>()[i]) << i;
    }
  }
}

// A plan (rnn_make_plan: quantized once), then forwards with it: the results
// of quantizing at each call; given with other tensors or at another
// precision, refused.
TEST(RNNInt8, QuantizedOnceEqualsQuantizedPerCallAndIsRefreshedByValue) {
  RNNOptions o{.mode = RNNMode::lstm, .input_size = 10, .hidden_size = 33, .num_layers = 2,
               .bidirectional = true, .proj_size = 20};
  o.precision = Precision::int8;
  std::mt19937_64 gen(8);
  std::vector<Tensor> weights;
  for (const Shape& s : rnn_parameter_shapes(o)) weights.push_back(random_tensor(s, 0.3, gen));
  const PackingPlan plan = PackingPlan::from_lengths({5, 8, 0, 3}, false);
  const Tensor x = random_tensor({plan.total_rows(), o.input_size}, 1.0, gen);
  const auto q = rnn_make_plan(o, weights, /*in_place=*/false, seqpack::testing::config());
  const RNNPlanInfo info = rnn_plan_info(*q);
  EXPECT_TRUE(info.quantized);
  EXPECT_FALSE(info.backward);
  EXPECT_EQ(info.precision, Precision::int8);
  // Every thread of the call (two directions side by side at 2 threads)
  // uses the quantized weights: none is quantized again.
  const int threads_before = num_threads();
  set_num_threads(2);
  const int64_t quantized_before = cpu::int8_weight_quantizations();
  const auto once = rnn_forward(*q, x, plan, {}, {}, false, false, 0);
  EXPECT_EQ(cpu::int8_weight_quantizations(), quantized_before);
  set_num_threads(threads_before);
  const auto each =
      rnn_forward(*rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()), x,
                  plan, {}, {}, false, false);
  ASSERT_EQ(std::memcmp(once.output.raw_data(), each.output.raw_data(),
                        static_cast<std::size_t>(each.output.numel()) * sizeof(float)),
            0);
  // Equal copies keep the plan (rnn_current_plan: compared byte for byte);
  // other values make a new one, quantized from them.
  std::vector<Tensor> copies;
  for (const Tensor& w : weights) copies.push_back(w.clone());
  EXPECT_EQ(rnn_current_plan(q, o, copies, seqpack::testing::config()), q);
  copies[0].data<float>()[0] += 0.5f;
  const auto requantized = rnn_current_plan(q, o, copies, seqpack::testing::config());
  EXPECT_NE(requantized, q);
  EXPECT_TRUE(rnn_plan_info(*requantized).quantized);
}

}  // namespace
}  // namespace seqpack
