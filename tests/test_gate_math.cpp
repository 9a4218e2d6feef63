// The float32 gate kernels' own σ and tanh (rnn_gates_f32_hwy.cpp: no
// division, no libm) against std:: in double over a dense sweep and the
// special values; and every gate kernel, float32 SIMD, against the scalar
// formulas run in double, including the optional bias-gradient accumulators.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <hwy/targets.h>

#include "cpu/bf16.h"
#include "cpu/gemm_engine.h"
#include "cpu/rnn_gates.h"
#include "cpu/rnn_gates_scalar.h"
#include "test_util.h"

namespace {

using seqpack::cpu::RowSink;
using seqpack::cpu::sigmoid_f32;
using seqpack::cpu::tanh_f32;

double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Distance to the reference in units of the float spacing at the reference.
// Below float's smallest normal (σ(x) for x < -87.3) the SIMD kernels return 0
// on every CPU (the scalar tail columns, std::exp, return the subnormal, as
// torch does); near it (below 1e-37) the measure is the absolute error in units
// of 1e-37 instead.
double ulps(float got, double want) {
  if (std::fabs(want) < 1e-37) return std::fabs(static_cast<double>(got) - want) / 1e-37;
  const float w = static_cast<float>(std::fabs(want));
  const float up = std::nextafter(std::max(w, std::numeric_limits<float>::min()),
                                  std::numeric_limits<float>::infinity());
  const double spacing = static_cast<double>(up) - std::max(w, std::numeric_limits<float>::min());
  return std::fabs(static_cast<double>(got) - want) / spacing;
}

// Every float in [-100, 100] at a step of 1e-3, every power-of-1.001 magnitude
// from 1e-38 to 1e30 of either sign, and the denormal range.
std::vector<float> sweep() {
  std::vector<float> xs;
  for (int64_t i = -100000; i <= 100000; ++i) xs.push_back(static_cast<float>(i) * 1e-3f);
  for (double m = 1e-38; m < 1e30; m *= 1.001) {
    xs.push_back(static_cast<float>(m));
    xs.push_back(-static_cast<float>(m));
  }
  for (float m = std::numeric_limits<float>::denorm_min(); m < std::numeric_limits<float>::min();
       m *= 1.5f) {
    xs.push_back(m);
    xs.push_back(-m);
  }
  return xs;
}

struct Accuracy {
  double max_ulps = 0, max_abs = 0;
  float worst_x = 0;
};

template <typename Fn, typename Ref>
Accuracy measure(Fn fn, Ref ref) {
  const std::vector<float> xs = sweep();
  std::vector<float> ys(xs.size());
  fn(seqpack::testing::kernels().isa_cap, static_cast<int64_t>(xs.size()), xs.data(), ys.data());
  Accuracy a;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double want = ref(static_cast<double>(xs[i]));
    const double u = ulps(ys[i], want);
    a.max_abs = std::max(a.max_abs, std::fabs(ys[i] - want));
    if (u > a.max_ulps) {
      a.max_ulps = u;
      a.worst_x = xs[i];
    }
  }
  return a;
}

TEST(GateMath, SigmoidWithinThreeUlpOverTheSweep) {
  const Accuracy a = measure(sigmoid_f32, sigmoid_ref);
  RecordProperty("max_ulps", std::to_string(a.max_ulps));
  EXPECT_LE(a.max_ulps, 3.0) << "worst at x = " << a.worst_x;
  EXPECT_LE(a.max_abs, 2e-7) << "worst ulp at x = " << a.worst_x;
}

TEST(GateMath, TanhWithinThreeUlpOverTheSweep) {
  const Accuracy a = measure(tanh_f32, [](double x) { return std::tanh(x); });
  RecordProperty("max_ulps", std::to_string(a.max_ulps));
  EXPECT_LE(a.max_ulps, 3.0) << "worst at x = " << a.worst_x;
  EXPECT_LE(a.max_abs, 2e-7) << "worst ulp at x = " << a.worst_x;
}

// Monotone up to one float spacing: a step backwards of one ulp between
// neighbouring inputs is the most rounding can explain; more would be a seam
// between the formula's ranges.
TEST(GateMath, MonotoneToWithinOneUlp) {
  std::vector<float> xs;
  for (int64_t i = -2000000; i <= 2000000; ++i) xs.push_back(static_cast<float>(i) * 1e-5f);
  std::vector<float> s(xs.size()), t(xs.size());
  sigmoid_f32(seqpack::testing::kernels().isa_cap, static_cast<int64_t>(xs.size()), xs.data(),
              s.data());
  tanh_f32(seqpack::testing::kernels().isa_cap, static_cast<int64_t>(xs.size()), xs.data(),
           t.data());
  for (std::size_t i = 1; i < xs.size(); ++i) {
    ASSERT_GE(std::nextafter(s[i], 2.f), s[i - 1]) << "sigmoid at x = " << xs[i];
    ASSERT_GE(std::nextafter(t[i], 2.f), t[i - 1]) << "tanh at x = " << xs[i];
  }
}

TEST(GateMath, SigmoidNeverReturnsASubnormal) {
  // Whether the hardware reciprocal estimate returns subnormals differs between
  // CPUs (Intel flushes them, AMD Zen 4 does not); the kernel flushes them
  // itself, so the results are the same on both.
  std::vector<float> xs;
  for (int64_t i = -10000; i <= -8000; ++i) xs.push_back(static_cast<float>(i) * 1e-2f);
  std::vector<float> s(xs.size());
  sigmoid_f32(seqpack::testing::kernels().isa_cap, static_cast<int64_t>(xs.size()), xs.data(),
              s.data());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    ASSERT_TRUE(s[i] == 0.f || s[i] >= std::numeric_limits<float>::min())
        << "sigmoid(" << xs[i] << ") = " << s[i];
    const double want = 1.0 / (1.0 + std::exp(-static_cast<double>(xs[i])));
    if (want >= 2.0 * std::numeric_limits<float>::min()) ASSERT_GT(s[i], 0.f) << xs[i];
  }
}

TEST(GateMath, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float tiny = std::numeric_limits<float>::denorm_min() * 7;
  const std::vector<float> xs = {0.f, -0.f, tiny, -tiny, 88.f, -88.f, 1e30f, -1e30f, inf, -inf, nan};
  std::vector<float> s(xs.size()), t(xs.size());
  sigmoid_f32(seqpack::testing::kernels().isa_cap, static_cast<int64_t>(xs.size()), xs.data(),
              s.data());
  tanh_f32(seqpack::testing::kernels().isa_cap, static_cast<int64_t>(xs.size()), xs.data(),
           t.data());
  EXPECT_EQ(s[0], 0.5f);
  EXPECT_EQ(s[1], 0.5f);
  EXPECT_EQ(s[2], 0.5f);
  EXPECT_EQ(s[3], 0.5f);
  // Saturation is exact, as torch's: a forget gate of 1 - 2^-24 instead of 1
  // would decay a long sequence's cell state.
  EXPECT_EQ(s[4], 1.f);
  EXPECT_EQ(s[5], 0.f);  // σ(-88) ≈ 6e-39 is below float's normal range: flushed
  EXPECT_EQ(s[6], 1.f);
  EXPECT_EQ(s[7], 0.f);
  EXPECT_EQ(s[8], 1.f);
  EXPECT_EQ(s[9], 0.f);
  EXPECT_TRUE(std::isnan(s[10]));

  EXPECT_EQ(t[0], 0.f);
  EXPECT_FALSE(std::signbit(t[0]));
  EXPECT_EQ(t[1], 0.f);
  EXPECT_TRUE(std::signbit(t[1])) << "tanh(-0) is -0";
  EXPECT_EQ(t[2], tiny);  // tanh x = x to float precision for tiny x
  EXPECT_EQ(t[3], -tiny);
  EXPECT_EQ(t[4], 1.f);
  EXPECT_EQ(t[5], -1.f);
  EXPECT_EQ(t[6], 1.f);
  EXPECT_EQ(t[7], -1.f);
  EXPECT_EQ(t[8], 1.f);
  EXPECT_EQ(t[9], -1.f);
  EXPECT_TRUE(std::isnan(t[10]));
}

// In place (y aliasing x) and every length up to a few vectors: the padded
// last vector must not read or write past n.
TEST(GateMath, InPlaceAndEveryTailLength) {
  for (int64_t n = 0; n <= 40; ++n) {
    std::vector<float> x(static_cast<std::size_t>(n) + 1, 7.f);
    for (int64_t i = 0; i < n; ++i) x[static_cast<std::size_t>(i)] = 0.25f * static_cast<float>(i - 20);
    std::vector<float> want(x.begin(), x.end() - 1);
    tanh_f32(seqpack::testing::kernels().isa_cap, n, want.data(), want.data());
    tanh_f32(seqpack::testing::kernels().isa_cap, n, x.data(), x.data());
    for (int64_t i = 0; i < n; ++i) {
      const auto u = static_cast<std::size_t>(i);
      EXPECT_EQ(x[u], want[u]);
      EXPECT_LE(ulps(x[u], std::tanh(0.25 * static_cast<double>(i - 20))), 3.0) << "n " << n;
    }
    EXPECT_EQ(x.back(), 7.f) << "wrote past n = " << n;
  }
}

// ---- kernels: float32 SIMD against the scalar formulas in double ----------

struct Buffers {
  std::vector<float> f;
  std::vector<double> d;
};

Buffers random_buffer(std::size_t size, double bound, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-bound, bound);
  Buffers b;
  for (std::size_t i = 0; i < size; ++i) {
    b.f.push_back(static_cast<float>(u(rng)));
    b.d.push_back(static_cast<double>(b.f.back()));
  }
  return b;
}

::testing::AssertionResult close(const Buffers& b, const char* what, double tol = 2e-6) {
  for (std::size_t i = 0; i < b.f.size(); ++i) {
    const double err = std::fabs(b.f[i] - b.d[i]);
    if (!(err <= tol * (1 + std::fabs(b.d[i])))) {
      return ::testing::AssertionFailure() << what << "[" << i << "]: float32 " << b.f[i]
                                           << " vs float64 " << b.d[i] << ", tolerance " << tol;
    }
  }
  return ::testing::AssertionSuccess();
}

// How far a float32 kernel's sum may be from the float64 one: its terms are
// float32 results within close()'s tolerance of the float64 terms t (2e-6
// (1 + |t|) each), added in float32 (at most (terms + 1) eps of the sum of
// magnitudes, init included).
struct SumBound {
  double slack = 0, magnitude = 0;
  int64_t terms = 0;
  void add(double t) {
    slack += 2e-6 * (1 + std::fabs(t));
    magnitude += std::fabs(t);
    ++terms;
  }
  double bound(double init) const {
    return slack + static_cast<double>(terms + 1) * std::numeric_limits<float>::epsilon() *
                       (std::fabs(init) + magnitude);
  }
};

// Column sums of rows [n, G] of `rows` (in double) plus the initial value,
// and each one's bound (SumBound).
struct ColumnSums {
  std::vector<double> sum, bound;
};
ColumnSums plus_column_sums(const std::vector<double>& init, const std::vector<double>& rows,
                            int64_t n, int64_t G) {
  ColumnSums out{init, std::vector<double>(init.size())};
  for (int64_t k = 0; k < G; ++k) {
    SumBound b;
    for (int64_t r = 0; r < n; ++r) {
      const double t = rows[static_cast<std::size_t>(r * G + k)];
      out.sum[static_cast<std::size_t>(k)] += t;
      b.add(t);
    }
    out.bound[static_cast<std::size_t>(k)] = b.bound(init[static_cast<std::size_t>(k)]);
  }
  return out;
}

::testing::AssertionResult close(const std::vector<float>& got, const std::vector<double>& want,
                                 const char* what) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= 1e-5 * (1 + std::fabs(want[i])))) {
      return ::testing::AssertionFailure() << what << "[" << i << "]: " << got[i] << " vs "
                                           << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

struct KernelShape {
  int64_t n, H, k0, k1;
};

// Whole rows, a column range starting mid-vector, H below one vector, H not
// a multiple of the vector width.
std::vector<KernelShape> shapes() {
  return {{1, 1, 0, 1},   {3, 8, 0, 8},    {2, 13, 0, 13}, {4, 37, 5, 30},
          {2, 64, 0, 64}, {3, 64, 17, 64}, {1, 100, 0, 100}};
}

class GateKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = seqpack::testing::test_seed();
    rng_.seed(seed_);
  }
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

TEST_F(GateKernels, LstmForward) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (const KernelShape& s : shapes()) {
    SCOPED_TRACE("n " + std::to_string(s.n) + " H " + std::to_string(s.H));
    const auto nH = static_cast<std::size_t>(s.n * s.H);
    Buffers g = random_buffer(4 * nH, 8.0, rng_), cp = random_buffer(nH, 3.0, rng_);
    Buffers c = random_buffer(nH, 1.0, rng_), h = random_buffer(nH, 1.0, rng_);
    seqpack::cpu::lstm_gates_forward<float>(seqpack::testing::kernels().isa_cap, s.n, s.H, s.k0,
                                            s.k1, g.f.data(), cp.f.data(), s.H, c.f.data(), s.H,
                                            h.f.data(), s.H);
    seqpack::cpu::scalar::lstm_gates_forward<double>(s.n, s.H, s.k0, s.k1, g.d.data(),
                                                     cp.d.data(), s.H, c.d.data(), s.H,
                                                     h.d.data(), s.H);
    EXPECT_TRUE(close(g, "gates"));
    EXPECT_TRUE(close(c, "c"));
    EXPECT_TRUE(close(h, "h"));
  }
}

// Input rows added by the kernel (a lookup layer's projected rows, shared by
// several rows): exactly the kernel on gates + x summed in float first, and
// the float64 formulas on the same sums.
TEST_F(GateKernels, LstmForwardAddsInputRows) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (const KernelShape& s : shapes()) {
    SCOPED_TRACE("n " + std::to_string(s.n) + " H " + std::to_string(s.H));
    const auto nH = static_cast<std::size_t>(s.n * s.H);
    Buffers g = random_buffer(4 * nH, 4.0, rng_), cp = random_buffer(nH, 3.0, rng_);
    const Buffers table = random_buffer(static_cast<std::size_t>(2 * 4 * s.H), 4.0, rng_);
    std::vector<const float*> rows;
    std::vector<float> summed = g.f;
    for (int64_t r = 0; r < s.n; ++r) {
      const std::size_t v = static_cast<std::size_t>(r % 3 == 1) * static_cast<std::size_t>(4 * s.H);
      rows.push_back(table.f.data() + v);
      for (int64_t k = 0; k < 4 * s.H; ++k) {
        const auto i = static_cast<std::size_t>(r * 4 * s.H + k);
        summed[i] += table.f[v + static_cast<std::size_t>(k)];
        g.d[i] += static_cast<double>(table.f[v + static_cast<std::size_t>(k)]);
      }
    }
    std::vector<float> c(nH), h(nH), c_sum(nH), h_sum(nH);
    Buffers cd = random_buffer(nH, 1.0, rng_), hd = random_buffer(nH, 1.0, rng_);
    seqpack::cpu::lstm_gates_forward<float>(seqpack::testing::kernels().isa_cap, s.n, s.H, s.k0,
                                            s.k1, g.f.data(), cp.f.data(), s.H, c.data(), s.H,
                                            h.data(), s.H, rows.data());
    seqpack::cpu::lstm_gates_forward<float>(seqpack::testing::kernels().isa_cap, s.n, s.H, s.k0,
                                            s.k1, summed.data(), cp.f.data(), s.H, c_sum.data(),
                                            s.H, h_sum.data(), s.H);
    seqpack::cpu::scalar::lstm_gates_forward<double>(s.n, s.H, s.k0, s.k1, g.d.data(),
                                                     cp.d.data(), s.H, cd.d.data(), s.H,
                                                     hd.d.data(), s.H);
    for (int64_t r = 0; r < s.n; ++r) {
      for (int64_t k = s.k0; k < s.k1; ++k) {
        const auto i = static_cast<std::size_t>(r * s.H + k);
        ASSERT_EQ(c[i], c_sum[i]) << "c[" << i << "]";
        ASSERT_EQ(h[i], h_sum[i]) << "h[" << i << "]";
        for (int64_t j = 0; j < 4; ++j) {
          const auto gi = static_cast<std::size_t>(r * 4 * s.H + j * s.H + k);
          ASSERT_EQ(g.f[gi], summed[gi]) << "gates[" << gi << "]";
        }
        cd.f[i] = c[i];
        hd.f[i] = h[i];
      }
    }
    for (int64_t r = 0; r < s.n; ++r) {  // outside [k0, k1) neither kernel wrote
      for (int64_t k = 0; k < s.H; ++k) {
        if (k >= s.k0 && k < s.k1) continue;
        const auto i = static_cast<std::size_t>(r * s.H + k);
        cd.f[i] = static_cast<float>(cd.d[i]);
        hd.f[i] = static_cast<float>(hd.d[i]);
      }
    }
    EXPECT_TRUE(close(cd, "c"));
    EXPECT_TRUE(close(hd, "h"));
  }
}

// Input-row gradients accumulated by the kernel, rows sharing an
// accumulator: the accumulator gains the sum of its rows' gate gradients.
TEST_F(GateKernels, LstmBackwardAccumulatesInputRows) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (const KernelShape& s : shapes()) {
    SCOPED_TRACE("n " + std::to_string(s.n) + " H " + std::to_string(s.H));
    const auto nH = static_cast<std::size_t>(s.n * s.H);
    const auto G = static_cast<std::size_t>(4 * s.H);
    Buffers g = random_buffer(4 * nH, 1.0, rng_), c = random_buffer(nH, 4.0, rng_);
    Buffers cp = random_buffer(nH, 4.0, rng_), dh = random_buffer(nH, 1.0, rng_);
    Buffers dc = random_buffer(nH, 1.0, rng_), dg = random_buffer(4 * nH, 1.0, rng_);
    Buffers dx = random_buffer(2 * G, 1.0, rng_);
    std::vector<float*> rows_f;
    std::vector<double*> rows_d;
    std::vector<std::size_t> ids;
    for (int64_t r = 0; r < s.n; ++r) {
      ids.push_back(static_cast<std::size_t>(r % 3 == 1));
      rows_f.push_back(dx.f.data() + ids.back() * G);
      rows_d.push_back(dx.d.data() + ids.back() * G);
    }
    const std::vector<double> dx0 = dx.d;
    seqpack::cpu::lstm_gates_backward<float>(seqpack::testing::kernels().isa_cap, s.n, s.H, s.k0,
                                             s.k1, g.f.data(), c.f.data(), cp.f.data(), dh.f.data(),
                                             s.H, dc.f.data(), dg.f.data(), nullptr, rows_f.data());
    seqpack::cpu::scalar::lstm_gates_backward<double>(
        s.n, s.H, s.k0, s.k1, g.d.data(), c.d.data(), cp.d.data(), dh.d.data(), s.H, dc.d.data(),
        dg.d.data(), nullptr, rows_d.data());
    EXPECT_TRUE(close(dg, "dgates"));
    EXPECT_TRUE(close(dx, "dx"));
    // Independently of both kernels: each accumulator gained its rows' dgates.
    for (std::size_t v = 0; v < 2; ++v) {
      for (int64_t j = 0; j < 4; ++j) {
        for (int64_t k = 0; k < s.H; ++k) {
          const auto i = v * G + static_cast<std::size_t>(j * s.H + k);
          double want = dx0[i];
          SumBound b;
          for (int64_t r = 0; r < s.n; ++r) {
            if (ids[static_cast<std::size_t>(r)] == v && k >= s.k0 && k < s.k1) {
              const double t =
                  dg.d[static_cast<std::size_t>(r) * G + static_cast<std::size_t>(j * s.H + k)];
              want += t;
              b.add(t);
            }
          }
          EXPECT_NEAR(dx.f[i], want, b.bound(dx0[i])) << "dx[" << i << "]";
        }
      }
    }
  }
}

TEST_F(GateKernels, LstmBackwardWithAndWithoutBiasSums) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (const KernelShape& s : shapes()) {
    for (bool bias : {false, true}) {
      SCOPED_TRACE("n " + std::to_string(s.n) + " H " + std::to_string(s.H) + " bias " +
                   std::to_string(bias));
      const auto nH = static_cast<std::size_t>(s.n * s.H);
      Buffers g = random_buffer(4 * nH, 1.0, rng_), c = random_buffer(nH, 4.0, rng_);
      Buffers cp = random_buffer(nH, 4.0, rng_), dh = random_buffer(nH, 1.0, rng_);
      Buffers dc = random_buffer(nH, 1.0, rng_), dg = random_buffer(4 * nH, 1.0, rng_);
      Buffers db = random_buffer(static_cast<std::size_t>(4 * s.H), 1.0, rng_);
      const std::vector<double> db0 = db.d;
      seqpack::cpu::lstm_gates_backward<float>(
          seqpack::testing::kernels().isa_cap, s.n, s.H, s.k0, s.k1, g.f.data(), c.f.data(),
          cp.f.data(), dh.f.data(), s.H, dc.f.data(), dg.f.data(), bias ? db.f.data() : nullptr);
      seqpack::cpu::scalar::lstm_gates_backward<double>(
          s.n, s.H, s.k0, s.k1, g.d.data(), c.d.data(), cp.d.data(), dh.d.data(), s.H,
          dc.d.data(), dg.d.data(), bias ? db.d.data() : nullptr);
      EXPECT_TRUE(close(dc, "dc"));
      EXPECT_TRUE(close(dg, "dgates"));
      EXPECT_TRUE(close(db, "dbias"));
      // Independently of both kernels: dbias gained exactly the column sums
      // of dgates (columns outside [k0, k1) are untouched in dgates, so
      // compare only inside).
      const ColumnSums sums = plus_column_sums(db0, dg.d, s.n, 4 * s.H);
      for (int64_t j = 0; j < 4; ++j) {
        for (int64_t k = 0; k < s.H; ++k) {
          const auto i = static_cast<std::size_t>(j * s.H + k);
          const bool in = bias && k >= s.k0 && k < s.k1;
          EXPECT_NEAR(db.f[i], in ? sums.sum[i] : db0[i], in ? sums.bound[i] : 0.0)
              << "dbias[" << i << "]";
        }
      }
    }
  }
}

TEST_F(GateKernels, GruForward) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (const KernelShape& s : shapes()) {
    for (bool with_bhh : {false, true}) {
      SCOPED_TRACE("n " + std::to_string(s.n) + " H " + std::to_string(s.H));
      const auto nH = static_cast<std::size_t>(s.n * s.H);
      Buffers x = random_buffer(3 * nH, 5.0, rng_), y = random_buffer(3 * nH, 5.0, rng_);
      Buffers b = random_buffer(static_cast<std::size_t>(3 * s.H), 1.0, rng_);
      Buffers hp = random_buffer(nH, 1.0, rng_), h = random_buffer(nH, 1.0, rng_);
      Buffers ghn = random_buffer(nH, 1.0, rng_);
      seqpack::cpu::gru_gates_forward<float>(
          seqpack::testing::kernels().isa_cap, s.n, s.H, s.k0, s.k1, x.f.data(), y.f.data(),
          with_bhh ? b.f.data() : nullptr, hp.f.data(), s.H, h.f.data(), s.H, ghn.f.data());
      seqpack::cpu::scalar::gru_gates_forward<double>(s.n, s.H, s.k0, s.k1, x.d.data(),
                                                      y.d.data(), with_bhh ? b.d.data() : nullptr,
                                                      hp.d.data(), s.H, h.d.data(), s.H,
                                                      ghn.d.data());
      EXPECT_TRUE(close(x, "gates"));
      EXPECT_TRUE(close(h, "h"));
      EXPECT_TRUE(close(ghn, "ghn"));
    }
  }
}

TEST_F(GateKernels, GruBackwardWithAndWithoutBiasSums) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (const KernelShape& s : shapes()) {
    for (bool bias : {false, true}) {
      SCOPED_TRACE("n " + std::to_string(s.n) + " H " + std::to_string(s.H) + " bias " +
                   std::to_string(bias));
      const auto nH = static_cast<std::size_t>(s.n * s.H);
      const auto G = static_cast<std::size_t>(3 * s.H);
      Buffers g = random_buffer(3 * nH, 1.0, rng_), ghn = random_buffer(nH, 2.0, rng_);
      Buffers hp = random_buffer(nH, 1.0, rng_), dh = random_buffer(nH, 1.0, rng_);
      Buffers dgx = random_buffer(3 * nH, 1.0, rng_), dgh = random_buffer(3 * nH, 1.0, rng_);
      Buffers dhp = random_buffer(nH, 1.0, rng_);
      Buffers dbi = random_buffer(G, 1.0, rng_), dbh = random_buffer(G, 1.0, rng_);
      const std::vector<double> dbi0 = dbi.d, dbh0 = dbh.d;
      seqpack::cpu::gru_gates_backward<float>(
          seqpack::testing::kernels().isa_cap, s.n, s.H, s.k0, s.k1, g.f.data(), ghn.f.data(),
          hp.f.data(), s.H, dh.f.data(), s.H, dgx.f.data(), dgh.f.data(), dhp.f.data(),
          bias ? dbi.f.data() : nullptr, bias ? dbh.f.data() : nullptr);
      seqpack::cpu::scalar::gru_gates_backward<double>(
          s.n, s.H, s.k0, s.k1, g.d.data(), ghn.d.data(), hp.d.data(), s.H, dh.d.data(), s.H,
          dgx.d.data(), dgh.d.data(), dhp.d.data(), bias ? dbi.d.data() : nullptr,
          bias ? dbh.d.data() : nullptr);
      EXPECT_TRUE(close(dgx, "dgx"));
      EXPECT_TRUE(close(dgh, "dgh"));
      EXPECT_TRUE(close(dhp, "dh_prev"));
      EXPECT_TRUE(close(dbi, "db_ih"));
      EXPECT_TRUE(close(dbh, "db_hh"));
      const ColumnSums si = plus_column_sums(dbi0, dgx.d, s.n, 3 * s.H);
      const ColumnSums sh = plus_column_sums(dbh0, dgh.d, s.n, 3 * s.H);
      for (std::size_t i = 0; i < G; ++i) {
        const auto k = static_cast<int64_t>(i) % s.H;
        const bool in = bias && k >= s.k0 && k < s.k1;
        EXPECT_NEAR(dbi.f[i], in ? si.sum[i] : dbi0[i], in ? si.bound[i] : 0.0)
            << "db_ih[" << i << "]";
        EXPECT_NEAR(dbh.f[i], in ? sh.sum[i] : dbh0[i], in ? sh.bound[i] : 0.0)
            << "db_hh[" << i << "]";
      }
    }
  }
}

TEST_F(GateKernels, RnnForwardAndBackward) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (const KernelShape& s : shapes()) {
    for (bool relu : {false, true}) {
      SCOPED_TRACE("n " + std::to_string(s.n) + " H " + std::to_string(s.H) + " relu " +
                   std::to_string(relu));
      const auto nH = static_cast<std::size_t>(s.n * s.H);
      Buffers g = random_buffer(nH, 6.0, rng_), h = random_buffer(nH, 1.0, rng_);
      seqpack::cpu::rnn_gates_forward<float>(seqpack::testing::kernels().isa_cap, s.n, s.H, s.k0,
                                             s.k1, g.f.data(), relu, h.f.data(), s.H);
      seqpack::cpu::scalar::rnn_gates_forward<double>(s.n, s.H, s.k0, s.k1, g.d.data(), relu,
                                                      h.d.data(), s.H);
      EXPECT_TRUE(close(g, "gates"));
      EXPECT_TRUE(close(h, "h"));
      // Backward from the float32 forward's h, so both see the same input.
      Buffers hs{g.f, std::vector<double>(g.f.begin(), g.f.end())};
      Buffers dh = random_buffer(nH, 1.0, rng_), dpre = random_buffer(nH, 1.0, rng_);
      Buffers db = random_buffer(static_cast<std::size_t>(s.H), 1.0, rng_);
      const std::vector<double> db0 = db.d;
      seqpack::cpu::rnn_gates_backward<float>(seqpack::testing::kernels().isa_cap, s.n, s.H, s.k0,
                                              s.k1, hs.f.data(), relu, dh.f.data(), s.H,
                                              dpre.f.data(), db.f.data());
      seqpack::cpu::scalar::rnn_gates_backward<double>(s.n, s.H, s.k0, s.k1, hs.d.data(), relu,
                                                       dh.d.data(), s.H, dpre.d.data(),
                                                       db.d.data());
      EXPECT_TRUE(close(dpre, "dpre"));
      EXPECT_TRUE(close(db, "dbias"));
      const ColumnSums sums = plus_column_sums(db0, dpre.d, s.n, s.H);
      for (int64_t k = 0; k < s.H; ++k) {
        const auto i = static_cast<std::size_t>(k);
        const bool in = k >= s.k0 && k < s.k1;
        EXPECT_NEAR(db.f[i], in ? sums.sum[i] : db0[i], in ? sums.bound[i] : 0.0)
            << "dbias[" << k << "]";
      }
    }
  }
}

// The bf16 copies the kernels write for a bf16 engine's row sink
// (h16, dgates16, dgx16/dgh16, dpre16): exactly bf16_of (the hardware's
// rounding, cpu/bf16.h) of each fp32 value the kernel writes, in the same
// layout (h16 with its own row stride), nothing outside [k0, k1) of a row, and
// the fp32 outputs the same bits as a call without the copies. A NaN row
// (NaN in a pre-activation or in dh) stays NaN in bf16. On every SIMD target
// Highway built that this CPU runs: AVX-512 converts with vcvtneps2bf16, the
// others with the scalar reference.
constexpr uint16_t kUntouched = 0xABCD;

// got [n, ld16] (bf16 bits) against bf16_of(vals [n, ld]) in columns [k0, k1)
// of each of the `blocks` blocks of H, kUntouched elsewhere.
::testing::AssertionResult bf16_copy_of(const std::vector<uint16_t>& got, int64_t ld16,
                                        const std::vector<float>& vals, int64_t ld, int64_t n,
                                        int64_t H, int64_t blocks, int64_t k0, int64_t k1,
                                        const char* what) {
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < ld16; ++c) {
      const bool in = c < blocks * H && c % H >= k0 && c % H < k1;
      const uint16_t want =
          in ? seqpack::cpu::bf16_of(vals[static_cast<std::size_t>(r * ld + c)]) : kUntouched;
      const uint16_t have = got[static_cast<std::size_t>(r * ld16 + c)];
      if (have != want) {
        return ::testing::AssertionFailure()
               << what << "[" << r << ", " << c << "]: 0x" << std::hex << have << " want 0x" << want
               << std::dec << (in ? " (bf16 of the fp32 value)" : " (untouched)");
      }
    }
  }
  return ::testing::AssertionSuccess();
}

bool bf16_is_nan(uint16_t h) { return (h & 0x7F80u) == 0x7F80u && (h & 0x7Fu) != 0; }

// The NaN row's value at `at`: NaN in fp32 (on a SIMD target: its formulas
// propagate NaN, Highway's SCALAR target's clamps need not) and then NaN in
// bf16 too.
::testing::AssertionResult nan_stays_nan(const std::vector<uint16_t>& copy,
                                         const std::vector<float>& vals, int64_t at) {
  const float v = vals[static_cast<std::size_t>(at)];
  const uint16_t c = copy[static_cast<std::size_t>(at)];
  const bool simd =
      std::string(seqpack::cpu::rnn_gates_f32_target(seqpack::testing::kernels().isa_cap)) !=
      "SCALAR";
  if (std::isnan(v) == bf16_is_nan(c) && (std::isnan(v) || !simd))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "value " << v << " at " << at << ", bf16 copy 0x" << std::hex << c;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

std::vector<float> uniform(std::size_t size, float bound, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-bound, bound);
  std::vector<float> v(size);
  for (float& x : v) x = u(rng);
  return v;
}

TEST_F(GateKernels, Bf16CopiesAreTheFp32ValuesRounded) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    // The AVX-512 targets write the copies with vcvtneps2bf16 (AVX512-BF16):
    // the bf16 engine, the only caller with a sink, runs only where the CPU
    // has it. Elsewhere (an AVX-512 Xeon without it) the other targets are
    // tested.
    if ((target & (HWY_AVX3 | HWY_AVX3_DL)) != 0 && !__builtin_cpu_supports("avx512bf16")) {
      continue;
    }
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(std::string("target ") +
                 seqpack::cpu::rnn_gates_f32_target(seqpack::testing::kernels().isa_cap));
    for (const KernelShape& s : shapes()) {
      SCOPED_TRACE("n " + std::to_string(s.n) + " H " + std::to_string(s.H) + " columns [" +
                   std::to_string(s.k0) + ", " + std::to_string(s.k1) + ")");
      const int64_t n = s.n, H = s.H, k0 = s.k0, k1 = s.k1, ld16 = H + 3;
      const auto nH = static_cast<std::size_t>(n * H);
      // Row 0 is a NaN row: NaN in column k0 of a pre-activation or of dh.
      auto with_nan = [&](std::vector<float> v, int64_t at) {
        v[static_cast<std::size_t>(at)] = nan;
        return v;
      };
      auto copies = [](std::size_t size) { return std::vector<uint16_t>(size, kUntouched); };
      {  // LSTM forward
        const std::vector<float> g0 = with_nan(uniform(4 * nH, 6.0f, rng_), 2 * H + k0);
        const std::vector<float> cp = uniform(nH, 2.0f, rng_);
        std::vector<float> g1 = g0, c1(nH), h1(nH), g2 = g0, c2(nH), h2(nH);
        std::vector<uint16_t> h16 = copies(static_cast<std::size_t>(n * ld16));
        seqpack::cpu::lstm_gates_forward<float>(seqpack::testing::kernels().isa_cap, n, H, k0, k1,
                                                g1.data(), cp.data(), H, c1.data(), H, h1.data(),
                                                H);
        seqpack::cpu::lstm_gates_forward<float>(
            seqpack::testing::kernels().isa_cap, n, H, k0, k1, g2.data(), cp.data(), H, c2.data(),
            H, h2.data(), H, nullptr, nullptr, 0, RowSink::bf16(h16.data(), ld16));
        EXPECT_TRUE(same_bits(g1, g2) && same_bits(c1, c2) && same_bits(h1, h2));
        EXPECT_TRUE(bf16_copy_of(h16, ld16, h2, H, n, H, 1, k0, k1, "lstm h16"));
        EXPECT_TRUE(nan_stays_nan(h16, h2, k0));
      }
      {  // LSTM backward
        const std::vector<float> g = uniform(4 * nH, 1.0f, rng_), c = uniform(nH, 2.0f, rng_);
        const std::vector<float> cp = uniform(nH, 2.0f, rng_);
        const std::vector<float> dh = with_nan(uniform(nH, 1.0f, rng_), k0);
        const std::vector<float> dc0 = uniform(nH, 1.0f, rng_);
        std::vector<float> dc1 = dc0, dg1(4 * nH), dc2 = dc0, dg2(4 * nH);
        std::vector<uint16_t> dg16 = copies(4 * nH);
        seqpack::cpu::lstm_gates_backward<float>(seqpack::testing::kernels().isa_cap, n, H, k0, k1,
                                                 g.data(), c.data(), cp.data(), dh.data(), H,
                                                 dc1.data(), dg1.data());
        seqpack::cpu::lstm_gates_backward<float>(seqpack::testing::kernels().isa_cap, n, H, k0, k1,
                                                 g.data(), c.data(), cp.data(), dh.data(), H,
                                                 dc2.data(), dg2.data(), nullptr, nullptr,
                                                 RowSink::bf16(dg16.data(), 4 * H));
        EXPECT_TRUE(same_bits(dc1, dc2) && same_bits(dg1, dg2));
        EXPECT_TRUE(bf16_copy_of(dg16, 4 * H, dg2, 4 * H, n, H, 4, k0, k1, "lstm dgates16"));
        EXPECT_TRUE(nan_stays_nan(dg16, dg2, 3 * H + k0));
      }
      {  // GRU forward
        const std::vector<float> x0 = with_nan(uniform(3 * nH, 5.0f, rng_), 2 * H + k0);
        const std::vector<float> y = uniform(3 * nH, 5.0f, rng_);
        const std::vector<float> b = uniform(static_cast<std::size_t>(3 * H), 1.0f, rng_);
        const std::vector<float> hp = uniform(nH, 1.0f, rng_);
        std::vector<float> x1 = x0, h1(nH), ghn1(nH), x2 = x0, h2(nH), ghn2(nH);
        std::vector<uint16_t> h16 = copies(static_cast<std::size_t>(n * ld16));
        seqpack::cpu::gru_gates_forward<float>(seqpack::testing::kernels().isa_cap, n, H, k0, k1,
                                               x1.data(), y.data(), b.data(), hp.data(), H,
                                               h1.data(), H, ghn1.data());
        seqpack::cpu::gru_gates_forward<float>(
            seqpack::testing::kernels().isa_cap, n, H, k0, k1, x2.data(), y.data(), b.data(),
            hp.data(), H, h2.data(), H, ghn2.data(), RowSink::bf16(h16.data(), ld16));
        EXPECT_TRUE(same_bits(x1, x2) && same_bits(h1, h2) && same_bits(ghn1, ghn2));
        EXPECT_TRUE(bf16_copy_of(h16, ld16, h2, H, n, H, 1, k0, k1, "gru h16"));
        EXPECT_TRUE(nan_stays_nan(h16, h2, k0));
      }
      {  // GRU backward
        const std::vector<float> g = uniform(3 * nH, 1.0f, rng_), ghn = uniform(nH, 2.0f, rng_);
        const std::vector<float> hp = uniform(nH, 1.0f, rng_);
        const std::vector<float> dh = with_nan(uniform(nH, 1.0f, rng_), k0);
        std::vector<float> dx1(3 * nH), dy1(3 * nH), dhp1(nH), dx2(3 * nH), dy2(3 * nH), dhp2(nH);
        std::vector<uint16_t> dx16 = copies(3 * nH), dy16 = copies(3 * nH);
        seqpack::cpu::gru_gates_backward<float>(seqpack::testing::kernels().isa_cap, n, H, k0, k1,
                                                g.data(), ghn.data(), hp.data(), H, dh.data(), H,
                                                dx1.data(), dy1.data(), dhp1.data());
        seqpack::cpu::gru_gates_backward<float>(
            seqpack::testing::kernels().isa_cap, n, H, k0, k1, g.data(), ghn.data(), hp.data(), H,
            dh.data(), H, dx2.data(), dy2.data(), dhp2.data(), nullptr, nullptr,
            RowSink::bf16(dx16.data(), 3 * H), RowSink::bf16(dy16.data(), 3 * H));
        EXPECT_TRUE(same_bits(dx1, dx2) && same_bits(dy1, dy2) && same_bits(dhp1, dhp2));
        EXPECT_TRUE(bf16_copy_of(dx16, 3 * H, dx2, 3 * H, n, H, 3, k0, k1, "gru dgx16"));
        EXPECT_TRUE(bf16_copy_of(dy16, 3 * H, dy2, 3 * H, n, H, 3, k0, k1, "gru dgh16"));
        EXPECT_TRUE(nan_stays_nan(dx16, dx2, 2 * H + k0));
        EXPECT_TRUE(nan_stays_nan(dy16, dy2, 2 * H + k0));
      }
      for (const bool relu : {false, true}) {  // RNN forward and backward
        const std::vector<float> g0 = with_nan(uniform(nH, 6.0f, rng_), k0);
        std::vector<float> g1 = g0, h1(nH), g2 = g0, h2(nH);
        std::vector<uint16_t> h16 = copies(static_cast<std::size_t>(n * ld16));
        seqpack::cpu::rnn_gates_forward<float>(seqpack::testing::kernels().isa_cap, n, H, k0, k1,
                                               g1.data(), relu, h1.data(), H);
        seqpack::cpu::rnn_gates_forward<float>(seqpack::testing::kernels().isa_cap, n, H, k0, k1,
                                               g2.data(), relu, h2.data(), H,
                                               RowSink::bf16(h16.data(), ld16));
        EXPECT_TRUE(same_bits(g1, g2) && same_bits(h1, h2));
        EXPECT_TRUE(bf16_copy_of(h16, ld16, h2, H, n, H, 1, k0, k1, "rnn h16"));
        EXPECT_TRUE(nan_stays_nan(h16, h2, k0));
        const std::vector<float> hs = uniform(nH, 1.0f, rng_);
        const std::vector<float> dh = with_nan(uniform(nH, 1.0f, rng_), k0);
        std::vector<float> d1(nH), d2(nH);
        std::vector<uint16_t> d16 = copies(nH);
        seqpack::cpu::rnn_gates_backward<float>(seqpack::testing::kernels().isa_cap, n, H, k0, k1,
                                                hs.data(), relu, dh.data(), H, d1.data());
        seqpack::cpu::rnn_gates_backward<float>(seqpack::testing::kernels().isa_cap, n, H, k0, k1,
                                                hs.data(), relu, dh.data(), H, d2.data(), nullptr,
                                                RowSink::bf16(d16.data(), H));
        EXPECT_TRUE(same_bits(d1, d2));
        EXPECT_TRUE(bf16_copy_of(d16, H, d2, H, n, H, 1, k0, k1, "rnn dpre16"));
        // relu passes dh only where h > 0
        if (!relu || hs[static_cast<std::size_t>(k0)] > 0.0f) {
          EXPECT_TRUE(nan_stays_nan(d16, d2, k0));
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);  // back to what the CPU supports
}

// bf16_of, the reference the kernels' copies are held to, is the engine's
// converter bit for bit, specials included.
TEST(Bf16Of, IsTheEngineConverter) {
  std::mt19937_64 rng(7);
  std::vector<float> xs = uniform(4096, 1e4f, rng);
  for (float x : {0.0f, -0.0f, 1e-40f, -1e-40f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::max(), 1.00390625f, 1.01171875f})
    xs.push_back(x);
  std::vector<uint16_t> got(xs.size());
  seqpack::cpu::f32_to_bf16(xs.data(), got.data(), static_cast<int64_t>(xs.size()));
  for (std::size_t i = 0; i < xs.size(); ++i)
    ASSERT_EQ(got[i], seqpack::cpu::bf16_of(xs[i])) << "x = " << xs[i];
}

// NaN in a pre-activation comes out as NaN in every output it feeds, as in
// torch (no clamp or max swallows it).
TEST(GateKernelsNaN, LstmForwardPropagatesNaN) {
  const int64_t H = 16;
  std::vector<float> g(4 * H, 0.5f), cp(H, 0.25f), c(H), h(H);
  g[3] = std::numeric_limits<float>::quiet_NaN();          // i of column 3
  g[2 * H + 9] = std::numeric_limits<float>::quiet_NaN();  // g of column 9
  seqpack::cpu::lstm_gates_forward<float>(seqpack::testing::kernels().isa_cap, 1, H, 0, H, g.data(),
                                          cp.data(), H, c.data(), H, h.data(), H);
  for (int64_t k = 0; k < H; ++k) {
    const bool bad = k == 3 || k == 9;
    EXPECT_EQ(std::isnan(c[static_cast<std::size_t>(k)]), bad) << "c[" << k << "]";
    EXPECT_EQ(std::isnan(h[static_cast<std::size_t>(k)]), bad) << "h[" << k << "]";
  }
}

}  // namespace
