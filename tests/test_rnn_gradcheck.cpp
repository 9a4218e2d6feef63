// rnn_backward against central finite differences of rnn_forward, in float64:
// every parameter, the input, h0 and c0, for every cell type, bidirectional,
// several layers, proj_size, no bias, dropout with a fixed mask, and batches
// with zero-length sequences mixed in (which PyTorch cannot give fixtures for).
// Loss: L = <w_out, output> + <w_h, h_n> + <w_c, c_n> with random weights.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "seqpack/packed_sequence.h"
#include "seqpack/rnn.h"
#include "seqpack/threading.h"
#include "test_util.h"

namespace {

using seqpack::DType;
using seqpack::PackingPlan;
using seqpack::RNNMode;
using seqpack::RNNOptions;
using seqpack::Shape;
using seqpack::Tensor;

struct GradCase {
  std::string name;
  RNNOptions options;
  std::vector<int64_t> lengths;
  bool give_h0 = true;
  bool give_c0 = true;
  bool training = false;  // with options.dropout > 0: a fixed dropout mask
};

std::string describe(const GradCase& c) {
  std::string s = c.name + " lengths [";
  for (size_t i = 0; i < c.lengths.size(); ++i) s += (i ? ", " : "") + std::to_string(c.lengths[i]);
  return s + "]";
}

std::vector<GradCase> grad_cases() {
  std::vector<GradCase> out;
  for (RNNMode mode : {RNNMode::rnn_tanh, RNNMode::rnn_relu, RNNMode::lstm, RNNMode::gru}) {
    const std::string m = seqpack::rnn_mode_name(mode);
    // Two layers, bidirectional, unsorted lengths with a zero-length sequence
    // in the middle and one at the end.
    out.push_back({m + " L2 bi zero-length",
                   {.mode = mode,
                    .input_size = 3,
                    .hidden_size = 4,
                    .num_layers = 2,
                    .bidirectional = true,
                    .dtype = DType::f64},
                   {2, 0, 4, 3, 0}});
    // One layer, no bias, all lengths tied, no initial state given.
    out.push_back(
        {m + " L1 nobias tied no-h0",
         {.mode = mode, .input_size = 2, .hidden_size = 5, .bias = false, .dtype = DType::f64},
         {3, 3, 3},
         /*give_h0=*/false,
         /*give_c0=*/false});
    // Three layers, batch 1, T = 1, and a zero-length sequence.
    out.push_back(
        {m + " L3 T1",
         {.mode = mode, .input_size = 1, .hidden_size = 3, .num_layers = 3, .dtype = DType::f64},
         {1, 0}});
  }
  // LSTM with projections, bidirectional, two layers; c0 given without h0.
  out.push_back({"lstm proj L2 bi",
                 {.mode = RNNMode::lstm,
                  .input_size = 2,
                  .hidden_size = 5,
                  .num_layers = 2,
                  .bidirectional = true,
                  .proj_size = 3,
                  .dtype = DType::f64},
                 {4, 0, 1, 3},
                 /*give_h0=*/false,
                 /*give_c0=*/true});
  out.push_back({"lstm proj L1 nobias",
                 {.mode = RNNMode::lstm,
                  .input_size = 3,
                  .hidden_size = 4,
                  .bias = false,
                  .proj_size = 1,
                  .dtype = DType::f64},
                 {2, 5}});
  // Dropout between layers in training mode: the same seed gives the same mask
  // at every evaluation, so the loss stays a smooth function of the inputs.
  for (RNNMode mode : {RNNMode::lstm, RNNMode::gru}) {
    GradCase c{std::string(seqpack::rnn_mode_name(mode)) + " dropout training",
               {.mode = mode,
                .input_size = 2,
                .hidden_size = 3,
                .num_layers = 2,
                .dropout = 0.4,
                .bidirectional = true,
                .dtype = DType::f64},
               {3, 1, 0, 2}};
    c.training = true;
    out.push_back(c);
  }
  return out;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  Tensor tensor(const Shape& s) {
    Tensor t = Tensor::empty(s, DType::f64);
    std::uniform_real_distribution<double> u(-1, 1);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = u(gen_);
    return t;
  }

 private:
  std::mt19937_64 gen_;
};

double dot(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return 0;
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.item_as_double(i) * b.item_as_double(i);
  return s;
}

TEST(RNNGradcheck, BackwardMatchesCentralDifferences) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with SEQPACK_TEST_SEED)");
  Rng rng(seed);
  for (const GradCase& gc : grad_cases()) {
    SCOPED_TRACE(describe(gc));
    const RNNOptions& o = gc.options;
    const int64_t N = o.num_layers * o.num_directions(),
                  B = static_cast<int64_t>(gc.lengths.size());
    const PackingPlan plan = PackingPlan::from_lengths(gc.lengths, /*enforce_sorted=*/false);
    std::vector<Tensor> weights;
    for (const Shape& s : seqpack::rnn_parameter_shapes(o)) weights.push_back(rng.tensor(s));
    Tensor x = rng.tensor({plan.total_rows(), o.input_size});
    Tensor h0 = gc.give_h0 ? rng.tensor({N, B, o.real_hidden_size()}) : Tensor();
    Tensor c0 =
        (o.mode == RNNMode::lstm && gc.give_c0) ? rng.tensor({N, B, o.hidden_size}) : Tensor();
    const Tensor w_out = rng.tensor({plan.total_rows(), o.output_size()});
    const Tensor w_h = rng.tensor({N, B, o.real_hidden_size()});
    const Tensor w_c = o.mode == RNNMode::lstm ? rng.tensor({N, B, o.hidden_size}) : Tensor();
    const uint64_t dropout_seed = 1234;

    auto loss = [&] {
      const auto r = seqpack::rnn_forward(
          *rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()), x, plan, h0,
          c0, gc.training,
          /*save_for_backward=*/false, dropout_seed);
      return dot(r.output, w_out) + dot(r.h_n, w_h) + dot(r.c_n, w_c);
    };
    const auto fwd = seqpack::rnn_forward(
        *rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()), x, plan, h0, c0,
        gc.training,
        /*save_for_backward=*/true, dropout_seed);
    ASSERT_TRUE(fwd.saved);
    if (gc.training) {
      // The mask must really be there (else this case checks nothing beyond
      // eval) and be the same at every evaluation with the same seed.
      const auto eval = seqpack::rnn_forward(
          *rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()), x, plan, h0,
          c0, /*training=*/false,
          /*save_for_backward=*/false);
      EXPECT_FALSE(seqpack::testing::all_close(fwd.output, eval.output, 1e-9, 1e-9))
          << "dropout changed nothing in training mode";
      const auto again = seqpack::rnn_forward(
          *rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()), x, plan, h0,
          c0, gc.training,
          /*save_for_backward=*/false, dropout_seed);
      EXPECT_TRUE(seqpack::testing::all_close(again.output, fwd.output, 0, 0, "same seed"));
    }
    const auto g = seqpack::rnn_backward(*fwd.saved, w_out, w_h, w_c);

    // The finite differences run thousands of tiny forwards; one thread keeps
    // them from paying an OpenMP barrier per step (80x slower on a loaded
    // 2-core machine). The analytic gradients above ran with the default threads.
    const int threads = seqpack::num_threads();
    seqpack::set_num_threads(1);
    struct Restore {
      int n;
      ~Restore() { seqpack::set_num_threads(n); }
    } restore{threads};
    int failures = 0;
    auto check = [&](Tensor& t, const Tensor& analytic, const std::string& what) {
      ASSERT_TRUE(analytic.defined()) << what << ": no gradient";
      ASSERT_EQ(analytic.shape(), t.shape()) << what;
      const double eps = 1e-6;
      for (int64_t i = 0; i < t.numel(); ++i) {
        double* p = t.data<double>() + i;
        const double keep = *p;
        *p = keep + eps;
        const double lp = loss();
        *p = keep - eps;
        const double lm = loss();
        *p = keep;
        const double fd = (lp - lm) / (2 * eps), an = analytic.item_as_double(i);
        if (std::fabs(an - fd) > 1e-6 + 1e-5 * std::fabs(fd) && failures++ < 10) {
          ADD_FAILURE() << what << "[" << i << "]: backward " << an << ", finite difference " << fd;
        }
      }
    };
    const auto names = seqpack::rnn_parameter_names(o);
    ASSERT_EQ(g.weights.size(), names.size());
    for (size_t k = 0; k < weights.size(); ++k) check(weights[k], g.weights[k], names[k]);
    check(x, g.input, "input");
    // Without the input gradient: no dX, every other gradient bit-identical.
    {
      const auto ng = seqpack::rnn_backward(*fwd.saved, w_out, w_h, w_c,
                                            /*initial_state_grad=*/true, /*input_grad=*/false);
      EXPECT_FALSE(ng.input.defined()) << "input_grad=false still gave an input gradient";
      ASSERT_EQ(ng.weights.size(), g.weights.size());
      for (size_t k = 0; k < g.weights.size(); ++k) {
        EXPECT_TRUE(seqpack::testing::all_close(ng.weights[k], g.weights[k], 0, 0, names[k]));
      }
      if (h0.defined()) EXPECT_TRUE(seqpack::testing::all_close(ng.h0, g.h0, 0, 0, "h0"));
      if (c0.defined()) EXPECT_TRUE(seqpack::testing::all_close(ng.c0, g.c0, 0, 0, "c0"));
    }
    if (h0.defined()) check(h0, g.h0, "h0");
    if (c0.defined()) check(c0, g.c0, "c0");
    // Zero-length sequences: their h0/c0 gradient is exactly the upstream h_n/c_n one.
    for (int64_t b = 0; b < B; ++b) {
      if (gc.lengths[static_cast<size_t>(b)] != 0) continue;
      for (int64_t row = 0; row < N; ++row) {
        for (int64_t j = 0; h0.defined() && j < o.real_hidden_size(); ++j) {
          const int64_t i = (row * B + b) * o.real_hidden_size() + j;
          EXPECT_EQ(g.h0.item_as_double(i), w_h.item_as_double(i)) << "h0 of empty sequence " << b;
        }
        for (int64_t j = 0; c0.defined() && j < o.hidden_size; ++j) {
          const int64_t i = (row * B + b) * o.hidden_size + j;
          EXPECT_EQ(g.c0.item_as_double(i), w_c.item_as_double(i)) << "c0 of empty sequence " << b;
        }
      }
    }
  }
}

}  // namespace
