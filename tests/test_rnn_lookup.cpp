// rnn_forward_lookup (an embedding lookup fused into layer 0) and
// rnn_backward without initial-state gradients, each against the plain path:
// rnn_forward on the gathered rows, and the full backward. Also the forward
// without h0, which skips the rows whose h_prev is zero, against an explicit
// zero h0. Float64, so the only differences are summation order.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "seqpack/packed_sequence.h"
#include "seqpack/rnn.h"
#include "seqpack/threading.h"
#include "test_util.h"

namespace seqpack {
namespace {

Tensor random_tensor(const Shape& shape, std::mt19937_64& gen) {
  Tensor t = Tensor::empty(shape, DType::f64);
  std::uniform_real_distribution<double> u(-0.6, 0.6);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = u(gen);
  return t;
}

std::vector<Tensor> random_weights(const RNNOptions& o, std::mt19937_64& gen) {
  std::vector<Tensor> w;
  for (const Shape& s : rnn_parameter_shapes(o)) w.push_back(random_tensor(s, gen));
  return w;
}

void expect_close(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_TRUE(a.defined()) << what;
  ASSERT_TRUE(b.defined()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  for (int64_t i = 0; i < a.numel(); ++i) {
    ASSERT_NEAR(a.data<double>()[i], b.data<double>()[i], 1e-11) << what << " at " << i;
  }
}

// A random table of V rows, an id per packed row, and the rows it gathers
// (what rnn_forward sees in place of the lookup).
struct Lookup {
  Tensor table;
  std::vector<int64_t> ids;
  Tensor rows;
};

Lookup random_lookup(int64_t V, int64_t N, int64_t width, std::mt19937_64& gen) {
  Lookup lk{random_tensor({V, width}, gen), std::vector<int64_t>(static_cast<std::size_t>(N)),
            Tensor::empty({N, width}, DType::f64)};
  std::uniform_int_distribution<int64_t> pick(0, V - 1);
  for (auto& id : lk.ids) id = pick(gen);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t k = 0; k < width; ++k)
      lk.rows.data<double>()[r * width + k] =
          lk.table.data<double>()[lk.ids[static_cast<std::size_t>(r)] * width + k];
  return lk;
}

// The table's gradient: the per-row input gradient summed by id.
Tensor sum_by_id(const Tensor& per_row, const std::vector<int64_t>& ids, int64_t V) {
  const int64_t width = per_row.size(1);
  Tensor out = Tensor::zeros({V, width}, DType::f64);
  for (std::size_t r = 0; r < ids.size(); ++r)
    for (int64_t k = 0; k < width; ++k)
      out.data<double>()[ids[r] * width + k] +=
          per_row.data<double>()[static_cast<int64_t>(r) * width + k];
  return out;
}

struct Config {
  RNNMode mode;
  bool bidirectional;
  int64_t layers;
  int64_t proj;
};

std::string describe(const Config& c) {
  return std::string(rnn_mode_name(c.mode)) + (c.bidirectional ? " bidirectional" : "") +
         " layers=" + std::to_string(c.layers) + " proj=" + std::to_string(c.proj);
}

RNNOptions options_for(const Config& c) {
  RNNOptions o;
  o.mode = c.mode;
  o.input_size = 3;
  o.hidden_size = 5;
  o.num_layers = c.layers;
  o.bidirectional = c.bidirectional;
  o.proj_size = c.proj;
  o.dtype = DType::f64;
  return o;
}

const std::vector<Config> kConfigs = {
    {RNNMode::lstm, true, 1, 0},      {RNNMode::lstm, false, 2, 0}, {RNNMode::lstm, true, 2, 2},
    {RNNMode::gru, true, 2, 0},       {RNNMode::gru, false, 1, 0},  {RNNMode::rnn_tanh, true, 1, 0},
    {RNNMode::rnn_relu, false, 2, 0},
};

TEST(RnnLookup, MatchesForwardAndBackwardOnGatheredRows) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 gen(seed);
  for (const Config& c : kConfigs) {
    SCOPED_TRACE(describe(c));
    const RNNOptions o = options_for(c);
    const auto w = random_weights(o, gen);
    // Lengths with a zero-length sequence and ties; the caller's order is unsorted.
    const std::vector<int64_t> lengths = {3, 0, 5, 3, 1};
    const PackingPlan plan = PackingPlan::from_lengths(lengths, /*enforce_sorted=*/false);
    const int64_t V = 4;
    const Lookup lk = random_lookup(V, plan.total_rows(), o.input_size, gen);

    const auto plain = rnn_forward(
        *rnn_make_plan(o, w, /*in_place=*/true, seqpack::testing::config()), lk.rows, plan, {}, {},
        /*training=*/true,
        /*save_for_backward=*/true);
    const auto fused =
        rnn_forward_lookup(*rnn_make_plan(o, w, /*in_place=*/true, seqpack::testing::config()),
                           lk.table, lk.ids, plan, {}, {}, /*training=*/true,
                           /*save_for_backward=*/true);
    expect_close(fused.output, plain.output, "output");
    expect_close(fused.h_n, plain.h_n, "h_n");
    if (o.mode == RNNMode::lstm) expect_close(fused.c_n, plain.c_n, "c_n");

    const Tensor gy = random_tensor(plain.output.shape(), gen);
    const Tensor gh = random_tensor(plain.h_n.shape(), gen);
    const Tensor gc = o.mode == RNNMode::lstm ? random_tensor(plain.c_n.shape(), gen) : Tensor();
    const auto gp = rnn_backward(*plain.saved, gy, gh, gc);
    const auto gf = rnn_backward(*fused.saved, gy, gh, gc);
    for (std::size_t i = 0; i < gp.weights.size(); ++i) {
      expect_close(gf.weights[i], gp.weights[i], rnn_parameter_names(o)[i]);
    }
    expect_close(gf.h0, gp.h0, "grad h0");
    expect_close(gf.input, sum_by_id(gp.input, lk.ids, V), "grad table");
  }
}

TEST(RnnLookup, SkippedInitialStateGradientChangesNothingElse) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 gen(seed);
  for (const Config& c : kConfigs) {
    SCOPED_TRACE(describe(c));
    const RNNOptions o = options_for(c);
    const auto w = random_weights(o, gen);
    const std::vector<int64_t> lengths = {2, 6, 0, 6, 1, 4};
    const PackingPlan plan = PackingPlan::from_lengths(lengths, /*enforce_sorted=*/false);
    const Tensor x = random_tensor({plan.total_rows(), o.input_size}, gen);
    const int64_t LD = o.num_layers * o.num_directions();
    const Tensor zero_h0 = Tensor::zeros({LD, plan.batch(), o.real_hidden_size()}, DType::f64);
    // Without h0 the forward skips the rows whose h_prev is zero; with an
    // explicit zero h0 it multiplies them.
    const auto skip =
        rnn_forward(*rnn_make_plan(o, w, /*in_place=*/true, seqpack::testing::config()), x, plan,
                    {}, {}, /*training=*/true,
                    /*save_for_backward=*/true);
    const auto full = rnn_forward(
        *rnn_make_plan(o, w, /*in_place=*/true, seqpack::testing::config()), x, plan, zero_h0, {},
        /*training=*/true,
        /*save_for_backward=*/true);
    expect_close(skip.output, full.output, "output");
    expect_close(skip.h_n, full.h_n, "h_n");

    const Tensor gy = random_tensor(full.output.shape(), gen);
    const Tensor gh = random_tensor(full.h_n.shape(), gen);
    const auto gfull = rnn_backward(*full.saved, gy, gh, {});
    const auto gskip = rnn_backward(*skip.saved, gy, gh, {}, /*initial_state_grad=*/false);
    EXPECT_FALSE(gskip.h0.defined());
    EXPECT_FALSE(gskip.c0.defined());
    ASSERT_TRUE(gfull.h0.defined());
    expect_close(gskip.input, gfull.input, "grad input");
    for (std::size_t i = 0; i < gfull.weights.size(); ++i) {
      expect_close(gskip.weights[i], gfull.weights[i], rnn_parameter_names(o)[i]);
    }
  }
}

// The float32 path: the lookup rows enter the per-step product as its starting
// accumulators (gemm_packed_small's init rows) and, with no output gradient, the
// LSTM/RNN backward reads dh in place. Against float64 on the gathered rows
// (the plain path, BLAS), at 1 and 2 threads; H = 256 so that two threads split
// each step's columns (one direction) and run the two directions side by side.
// Without h0 (the zero-h0 rows skip the product and copy their projection) and
// with a given h0 and its gradient (every row through the product).
TEST(RnnLookup, Float32MatchesFloat64WithoutOutputGradient) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 gen(seed);
  const int threads_before = num_threads();
  for (const RNNMode mode : {RNNMode::lstm, RNNMode::gru, RNNMode::rnn_tanh}) {
    for (const bool bidirectional : {false, true}) {
      for (const int threads : {1, 2}) {
        for (const bool with_h0 : {false, true}) {
          SCOPED_TRACE(std::string(rnn_mode_name(mode)) + (bidirectional ? " bidirectional" : "") +
                       " threads=" + std::to_string(threads) + (with_h0 ? " with h0" : ""));
          RNNOptions o64;
          o64.mode = mode;
          o64.input_size = 8;
          o64.hidden_size = 256;
          o64.bidirectional = bidirectional;
          o64.dtype = DType::f64;
          RNNOptions o32 = o64;
          o32.dtype = DType::f32;
          // Weights at PyTorch's initial scale, U(-1/sqrt(H), 1/sqrt(H)) (0.6 / 10 here).
          auto w64 = random_weights(o64, gen);
          std::vector<Tensor> w32;
          for (Tensor& t : w64) {
            for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] *= 0.1;
            w32.push_back(t.to(DType::f32));
          }
          // 20 sequences: steps of 20 live rows down to 1, and a zero-length one.
          std::vector<int64_t> lengths;
          for (int64_t i = 0; i < 20; ++i) lengths.push_back((i * 7) % 13);
          const PackingPlan plan = PackingPlan::from_lengths(lengths, /*enforce_sorted=*/false);
          const int64_t V = 11;
          const Lookup lk = random_lookup(V, plan.total_rows(), o64.input_size, gen);

          const int64_t LD = o64.num_layers * o64.num_directions();
          const Tensor h0 = with_h0 ? random_tensor({LD, plan.batch(), 256}, gen) : Tensor();
          const Tensor c0 = with_h0 && mode == RNNMode::lstm
                                ? random_tensor({LD, plan.batch(), 256}, gen)
                                : Tensor();
          auto f32 = [](const Tensor& t) { return t.defined() ? t.to(DType::f32) : Tensor(); };

          const auto want =
              rnn_forward(*rnn_make_plan(o64, w64, /*in_place=*/true, seqpack::testing::config()),
                          lk.rows, plan, h0, c0, /*training=*/true,
                          /*save_for_backward=*/true);
          set_num_threads(threads);
          const auto got = rnn_forward_lookup(
              *rnn_make_plan(o32, w32, /*in_place=*/true, seqpack::testing::config()),
              lk.table.to(DType::f32), lk.ids, plan, f32(h0), f32(c0), /*training=*/true,
              /*save_for_backward=*/true);
          const Tensor gh = random_tensor(want.h_n.shape(), gen);
          const auto ggot = rnn_backward(*got.saved, {}, gh.to(DType::f32), {},
                                         /*initial_state_grad=*/with_h0);
          set_num_threads(threads_before);
          const auto gwant = rnn_backward(*want.saved, {}, gh, {}, /*initial_state_grad=*/with_h0);

          // Relative to the value's size (float32 sums over up to 256 terms per element).
          auto near = [](const Tensor& a32, const Tensor& b64, double tol,
                         const std::string& what) {
            ASSERT_EQ(a32.shape(), b64.shape()) << what;
            const Tensor a = a32.to(DType::f64);
            for (int64_t i = 0; i < a.numel(); ++i) {
              const double want = b64.data<double>()[i];
              ASSERT_NEAR(a.data<double>()[i], want, tol * (1.0 + std::fabs(want)))
                  << what << " at " << i;
            }
          };
          near(got.output, want.output, 1e-5, "output");
          near(got.h_n, want.h_n, 1e-5, "h_n");
          for (std::size_t i = 0; i < gwant.weights.size(); ++i) {
            near(ggot.weights[i], gwant.weights[i], 1e-4, rnn_parameter_names(o64)[i]);
          }
          near(ggot.input, sum_by_id(gwant.input, lk.ids, V), 1e-4, "grad table");
          if (with_h0) {
            near(ggot.h0, gwant.h0, 1e-4, "grad h0");
            if (mode == RNNMode::lstm) near(ggot.c0, gwant.c0, 1e-4, "grad c0");
          }
        }
      }
    }
  }
}

TEST(RnnLookup, BadInputNamesTheValue) {
  RNNOptions o;
  o.mode = RNNMode::lstm;
  o.input_size = 2;
  o.hidden_size = 3;
  std::mt19937_64 gen(1);
  std::vector<Tensor> w;
  for (const Shape& s : rnn_parameter_shapes(o)) w.push_back(Tensor::zeros(s, DType::f32));
  const PackingPlan plan = PackingPlan::from_lengths({2, 1}, /*enforce_sorted=*/true);
  const Tensor table = Tensor::zeros({4, 2}, DType::f32);
  auto message = [&](const Tensor& t, const std::vector<int64_t>& ids) -> std::string {
    try {
      rnn_forward_lookup(*rnn_make_plan(o, w, /*in_place=*/true, seqpack::testing::config()), t,
                         ids, plan, {}, {},
                         /*training=*/false,
                         /*save_for_backward=*/false);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(message(table, {0, 4, 1}).find("ids[1] = 4"), std::string::npos)
      << message(table, {0, 4, 1});
  EXPECT_NE(message(table, {0, -1, 1}).find("ids[1] = -1"), std::string::npos);
  EXPECT_NE(message(table, {0, 1}).find("2 ids"), std::string::npos) << message(table, {0, 1});
  EXPECT_NE(message(Tensor::zeros({4, 3}, DType::f32), {0, 1, 2}).find("[4, 3]"), std::string::npos)
      << message(Tensor::zeros({4, 3}, DType::f32), {0, 1, 2});
  EXPECT_NE(message(Tensor::zeros({4, 2}, DType::f64), {0, 1, 2}).find("float64"),
            std::string::npos)
      << message(Tensor::zeros({4, 2}, DType::f64), {0, 1, 2});
  EXPECT_EQ(message(table, {3, 0, 2}), "no error");
}

}  // namespace
}  // namespace seqpack
