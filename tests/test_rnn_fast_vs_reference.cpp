// The fast path against the plain reference on random configurations: every
// cell type, 1-3 layers, bidirectional, bias or not, proj_size, hidden sizes
// that are not multiples of the SIMD width, zero-length sequences mixed into
// unsorted batches, given or default h0/c0, float32 and float64; forward and
// backward (against the reference BPTT). The seed is printed; replay a failure
// with SEQPACK_TEST_SEED=<seed>.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "reference/rnn_reference.h"
#include "seqpack/packed_sequence.h"
#include "seqpack/rnn.h"
#include "test_util.h"

namespace {

using seqpack::DType;
using seqpack::PackingPlan;
using seqpack::RNNMode;
using seqpack::RNNOptions;
using seqpack::Shape;
using seqpack::Tensor;
using seqpack::testing::all_close;

struct Config {
  RNNOptions options;
  std::vector<int64_t> lengths;
  bool give_h0 = false, give_c0 = false;
};

std::string describe(const Config& c) {
  const RNNOptions& o = c.options;
  std::string s =
      std::string(seqpack::rnn_mode_name(o.mode)) + " I" + std::to_string(o.input_size) + " H" +
      std::to_string(o.hidden_size) + " L" + std::to_string(o.num_layers) +
      (o.bidirectional ? " bi" : "") + (o.bias ? "" : " nobias") +
      (o.proj_size ? " P" + std::to_string(o.proj_size) : "") + (c.give_h0 ? " h0" : "") +
      (c.give_c0 ? " c0" : "") + " " + seqpack::dtype_name(o.dtype) + " lengths [";
  for (size_t i = 0; i < c.lengths.size(); ++i) s += (i ? ", " : "") + std::to_string(c.lengths[i]);
  return s + "]";
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  int64_t integer(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen_);
  }
  bool coin(double p = 0.5) { return std::bernoulli_distribution(p)(gen_); }
  Tensor tensor(const Shape& s, DType dtype, double scale = 1.0) {
    Tensor t = Tensor::empty(s, DType::f64);
    std::uniform_real_distribution<double> u(-scale, scale);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = u(gen_);
    return t.to(dtype);
  }
  Config config() {
    Config c;
    RNNOptions& o = c.options;
    const RNNMode modes[] = {RNNMode::rnn_tanh, RNNMode::rnn_relu, RNNMode::lstm, RNNMode::gru};
    o.mode = modes[integer(0, 3)];
    o.input_size = integer(1, 9);
    // Around and between SIMD widths (4, 8, 16 floats): 1, 3, 7, 9, 13, 17, 19, ...
    const int64_t hidden[] = {1, 3, 5, 7, 8, 9, 13, 16, 17, 19, 23};
    o.hidden_size = hidden[integer(0, 10)];
    o.num_layers = integer(1, 3);
    o.bidirectional = coin();
    o.bias = coin(0.75);
    if (o.mode == RNNMode::lstm && o.hidden_size > 1 && coin()) {
      o.proj_size = integer(1, o.hidden_size - 1);
    }
    o.dtype = coin(0.7) ? DType::f32 : DType::f64;
    const int64_t B = integer(1, 6);
    for (int64_t b = 0; b < B; ++b) c.lengths.push_back(coin(0.2) ? 0 : integer(1, 8));
    c.give_h0 = coin();
    c.give_c0 = o.mode == RNNMode::lstm && coin();
    return c;
  }

 private:
  std::mt19937_64 gen_;
};

double fwd_tol(DType d) { return d == DType::f64 ? 1e-10 : 1e-5; }
double grad_tol(DType d) { return d == DType::f64 ? 1e-9 : 1e-4; }

using seqpack::testing::gather_rows;
using seqpack::testing::rows_of;

TEST(RNNFastVsReference, RandomConfigurationsForwardAndBackward) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with SEQPACK_TEST_SEED)");
  Rng rng(seed);
  for (int iter = 0; iter < 40; ++iter) {
    const Config c = rng.config();
    SCOPED_TRACE("config " + std::to_string(iter) + ": " + describe(c));
    const auto draw_and_compare = [&](double& margin) {
      const RNNOptions& o = c.options;
      const DType dt = o.dtype;
      const int64_t B = static_cast<int64_t>(c.lengths.size()),
                    N = o.num_layers * o.num_directions();
      const PackingPlan plan = PackingPlan::from_lengths(c.lengths, /*enforce_sorted=*/false);
      std::vector<Tensor> weights;
      for (const Shape& s : seqpack::rnn_parameter_shapes(o)) {
        weights.push_back(rng.tensor(s, dt, 1.0 / std::sqrt(static_cast<double>(o.hidden_size))));
      }
      const Tensor x = rng.tensor({plan.total_rows(), o.input_size}, dt);
      const Tensor h0 = c.give_h0 ? rng.tensor({N, B, o.real_hidden_size()}, dt) : Tensor();
      const Tensor c0 = c.give_c0 ? rng.tensor({N, B, o.hidden_size}, dt) : Tensor();

      const auto fast = seqpack::rnn_forward(
          *rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()), x, plan, h0,
          c0, /*training=*/false,
          /*save_for_backward=*/true);
      std::vector<Tensor> seqs;
      std::vector<std::vector<int64_t>> rows(static_cast<size_t>(B));
      for (int64_t b = 0; b < B; ++b) {
        rows[static_cast<size_t>(b)] = rows_of(plan, b);
        seqs.push_back(gather_rows(x, rows[static_cast<size_t>(b)]));
      }
      const auto ref = seqpack::rnn_reference_forward(o, weights, seqs, h0, c0);
      margin = ref.relu_margin;
      const double ft = fwd_tol(dt), gt = grad_tol(dt);
      ASSERT_EQ(fast.output.shape(), (Shape{plan.total_rows(), o.output_size()}));
      for (int64_t b = 0; b < B; ++b) {
        EXPECT_TRUE(all_close(gather_rows(fast.output, rows[static_cast<size_t>(b)]),
                              ref.outputs[static_cast<size_t>(b)], ft, ft,
                              "output of sequence " + std::to_string(b)));
      }
      EXPECT_TRUE(all_close(fast.h_n, ref.h_n, ft, ft, "h_n"));
      if (o.mode == RNNMode::lstm) {
        EXPECT_TRUE(all_close(fast.c_n, ref.c_n, ft, ft, "c_n"));
      } else {
        EXPECT_FALSE(fast.c_n.defined());
      }
      // Without saving, the forward keeps its states in other buffers (h_prev
      // alternating, c in place): the same bits.
      const auto unsaved = seqpack::rnn_forward(
          *rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()), x, plan, h0,
          c0, /*training=*/false,
          /*save_for_backward=*/false);
      EXPECT_TRUE(all_close(unsaved.output, fast.output, 0.0, 0.0, "output without save"));
      EXPECT_TRUE(all_close(unsaved.h_n, fast.h_n, 0.0, 0.0, "h_n without save"));
      if (o.mode == RNNMode::lstm) {
        EXPECT_TRUE(all_close(unsaved.c_n, fast.c_n, 0.0, 0.0, "c_n without save"));
      }

      // Backward with random upstream gradients; sometimes h_n's or c_n's is absent.
      const Tensor gy = rng.tensor({plan.total_rows(), o.output_size()}, dt);
      const Tensor gh = rng.coin(0.8) ? rng.tensor({N, B, o.real_hidden_size()}, dt) : Tensor();
      const Tensor gc = o.mode == RNNMode::lstm && rng.coin(0.8)
                            ? rng.tensor({N, B, o.hidden_size}, dt)
                            : Tensor();
      ASSERT_TRUE(fast.saved);
      const auto g = seqpack::rnn_backward(*fast.saved, gy, gh, gc);
      std::vector<Tensor> gy_rows;
      for (int64_t b = 0; b < B; ++b)
        gy_rows.push_back(gather_rows(gy, rows[static_cast<size_t>(b)]));
      const auto rg =
          seqpack::reference::rnn_reference_backward(o, weights, seqs, h0, c0, gy_rows, gh, gc);
      for (int64_t b = 0; b < B; ++b) {
        EXPECT_TRUE(all_close(gather_rows(g.input, rows[static_cast<size_t>(b)]),
                              rg.inputs[static_cast<size_t>(b)], gt, gt,
                              "grad input of sequence " + std::to_string(b)));
      }
      ASSERT_TRUE(g.h0.defined());
      EXPECT_TRUE(all_close(g.h0, rg.h0, gt, gt, "grad h0"));
      if (o.mode == RNNMode::lstm) {
        ASSERT_TRUE(g.c0.defined());
        EXPECT_TRUE(all_close(g.c0, rg.c0, gt, gt, "grad c0"));
      }
      const auto names = seqpack::rnn_parameter_names(o);
      ASSERT_EQ(g.weights.size(), names.size());
      for (size_t k = 0; k < names.size(); ++k) {
        EXPECT_TRUE(all_close(g.weights[k], rg.weights[k], gt, gt, "grad " + names[k]));
      }
    };
    seqpack::testing::compare_redrawing_near_relu_kinks(draw_and_compare);
  }
}

struct CallData {
  std::vector<Tensor> weights;
  Tensor x, h0, c0, gy, gh, gc;
  seqpack::RNNForwardResult fwd;
};

// Compares one forward result and its backward with the reference. Returns
// the reference's relu_margin.
double expect_matches_reference(const Config& c, const PackingPlan& plan, const CallData& run,
                                const seqpack::RNNForwardResult& fwd,
                                const seqpack::RNNGradients& g, const std::string& what) {
  const RNNOptions& o = c.options;
  const int64_t B = plan.batch();
  std::vector<Tensor> seqs, gy_rows;
  std::vector<std::vector<int64_t>> rows;
  for (int64_t b = 0; b < B; ++b) {
    rows.push_back(rows_of(plan, b));
    seqs.push_back(gather_rows(run.x, rows.back()));
    gy_rows.push_back(gather_rows(run.gy, rows.back()));
  }
  const auto ref = seqpack::rnn_reference_forward(o, run.weights, seqs, run.h0, run.c0);
  const auto rg = seqpack::reference::rnn_reference_backward(o, run.weights, seqs, run.h0, run.c0,
                                                             gy_rows, run.gh, run.gc);
  const double ft = fwd_tol(o.dtype), gt = grad_tol(o.dtype);
  for (int64_t b = 0; b < B; ++b) {
    const auto& r = rows[static_cast<size_t>(b)];
    EXPECT_TRUE(all_close(gather_rows(fwd.output, r), ref.outputs[static_cast<size_t>(b)], ft, ft,
                          what + " output of sequence " + std::to_string(b)));
    EXPECT_TRUE(all_close(gather_rows(g.input, r), rg.inputs[static_cast<size_t>(b)], gt, gt,
                          what + " grad input of sequence " + std::to_string(b)));
  }
  EXPECT_TRUE(all_close(fwd.h_n, ref.h_n, ft, ft, what + " h_n"));
  EXPECT_TRUE(all_close(g.h0, rg.h0, gt, gt, what + " grad h0"));
  if (o.mode == RNNMode::lstm) {
    EXPECT_TRUE(all_close(fwd.c_n, ref.c_n, ft, ft, what + " c_n"));
    EXPECT_TRUE(all_close(g.c0, rg.c0, gt, gt, what + " grad c0"));
  }
  const auto names = seqpack::rnn_parameter_names(o);
  for (size_t k = 0; k < names.size(); ++k) {
    EXPECT_TRUE(all_close(g.weights[k], rg.weights[k], gt, gt, what + " grad " + names[k]));
  }
  return ref.relu_margin;
}

// One draw of values for LargeShapesInterleavedCallsAndRecycledBuffers:
// returns the reference's relu_margin.
double run_and_compare(const Config& c, Rng& rng) {
  const RNNOptions& o = c.options;
  const DType dt = o.dtype;
  const int64_t B = static_cast<int64_t>(c.lengths.size()), N = o.num_layers * o.num_directions();
  const PackingPlan plan = PackingPlan::from_lengths(c.lengths, /*enforce_sorted=*/false);
  std::vector<Tensor> weights;
  for (const Shape& s : seqpack::rnn_parameter_shapes(o)) {
    weights.push_back(rng.tensor(s, dt, 1.0 / std::sqrt(static_cast<double>(o.hidden_size))));
  }
  CallData runs[2];
  for (CallData& r : runs) {
    r.weights = weights;
    r.x = rng.tensor({plan.total_rows(), o.input_size}, dt);
    if (c.give_h0) r.h0 = rng.tensor({N, B, o.real_hidden_size()}, dt);
    if (c.give_c0) r.c0 = rng.tensor({N, B, o.hidden_size}, dt);
    r.gy = rng.tensor({plan.total_rows(), o.output_size()}, dt);
    r.gh = rng.tensor({N, B, o.real_hidden_size()}, dt);
    if (o.mode == RNNMode::lstm) r.gc = rng.tensor({N, B, o.hidden_size}, dt);
  }
  for (CallData& r : runs) {
    r.fwd = seqpack::rnn_forward(
        *rnn_make_plan(o, r.weights, /*in_place=*/true, seqpack::testing::config()), r.x, plan,
        r.h0, r.c0, /*training=*/false,
        /*save_for_backward=*/true);
  }
  const Tensor out0 = runs[0].fwd.output.clone(), h0n = runs[0].fwd.h_n.clone();
  // Backward in the opposite order of the forwards.
  const auto g1 = seqpack::rnn_backward(*runs[1].fwd.saved, runs[1].gy, runs[1].gh, runs[1].gc);
  const auto g0 = seqpack::rnn_backward(*runs[0].fwd.saved, runs[0].gy, runs[0].gh, runs[0].gc);
  EXPECT_TRUE(all_close(runs[0].fwd.output, out0, 0, 0, "first output after later calls"));
  EXPECT_TRUE(all_close(runs[0].fwd.h_n, h0n, 0, 0, "first h_n after later calls"));
  return std::min(expect_matches_reference(c, plan, runs[0], runs[0].fwd, g0, "first call"),
                  expect_matches_reference(c, plan, runs[1], runs[1].fwd, g1, "second call"));
}

// Shapes big enough for the fast path's recycled buffers (64 KiB and up) and
// several SIMD blocks plus a tail. Two forwards run before either backward, and
// the whole thing runs twice, so recycled (stale) memory, a saved activation
// overwritten by a later forward, or a result aliased by a later call shows up.
TEST(RNNFastVsReference, LargeShapesInterleavedCallsAndRecycledBuffers) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with SEQPACK_TEST_SEED)");
  Rng rng(seed + 17);
  std::vector<Config> configs;
  configs.push_back({{.mode = RNNMode::lstm,
                      .input_size = 33,
                      .hidden_size = 130,
                      .num_layers = 2,
                      .bidirectional = true,
                      .proj_size = 0,
                      .dtype = DType::f32},
                     {12, 0, 9, 15, 3, 11, 15},
                     true,
                     true});
  configs.push_back({{.mode = RNNMode::gru,
                      .input_size = 20,
                      .hidden_size = 101,
                      .num_layers = 1,
                      .dtype = DType::f64},
                     {14, 7, 0, 14, 2, 9, 13, 5},
                     false,
                     false});
  configs.push_back({{.mode = RNNMode::rnn_relu,
                      .input_size = 9,
                      .hidden_size = 203,
                      .num_layers = 2,
                      .dtype = DType::f32},
                     {16, 16, 1, 12, 0, 15, 11, 9, 14},
                     true,
                     false});
  configs.push_back({{.mode = RNNMode::lstm,
                      .input_size = 17,
                      .hidden_size = 140,
                      .bidirectional = true,
                      .proj_size = 61,
                      .dtype = DType::f32},
                     {13, 6, 13, 0, 10, 12},
                     false,
                     true});
  for (int round = 0; round < 2; ++round) {
    for (const Config& c : configs) {
      SCOPED_TRACE("round " + std::to_string(round) + ": " + describe(c));
      seqpack::testing::compare_redrawing_near_relu_kinks(
          [&](double& margin) { margin = run_and_compare(c, rng); });
    }
  }
}

// Zero-length sequences change nothing for the others: the module's padded
// forward with lengths gives, for the non-empty sequences, what the same batch
// without the empty ones gives, and h_n = h0, c_n = c0, zero output rows for
// the empty ones; their gradients are zero except h0/c0 (= upstream h_n/c_n).
TEST(RNNFastVsReference, EmptySequencesAreInertInTheModule) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with SEQPACK_TEST_SEED)");
  Rng rng(seed ^ 0x9e3779b97f4a7c15ull);
  for (RNNMode mode : {RNNMode::rnn_tanh, RNNMode::rnn_relu, RNNMode::lstm, RNNMode::gru}) {
    RNNOptions o{.mode = mode,
                 .input_size = 3,
                 .hidden_size = 9,
                 .num_layers = 2,
                 .batch_first = rng.coin(),
                 .bidirectional = true,
                 .dtype = DType::f64};
    SCOPED_TRACE(std::string(seqpack::rnn_mode_name(mode)) + (o.batch_first ? " batch_first" : ""));
    const std::vector<int64_t> with_empty = {3, 0, 5, 0, 2}, kept_index = {0, 2, 4};
    const std::vector<int64_t> without = {3, 5, 2};
    const int64_t T = 5, B = 5, N = 4, P = o.real_hidden_size(), O = o.output_size();
    seqpack::RNNBase m(o, /*seed=*/seed);
    m.eval();
    const Tensor x = rng.tensor(o.batch_first ? Shape{B, T, 3} : Shape{T, B, 3}, DType::f64);
    const Tensor h0 = rng.tensor({N, B, P}, DType::f64);
    const Tensor c0 = mode == RNNMode::lstm ? rng.tensor({N, B, 9}, DType::f64) : Tensor();
    auto at = [&](int64_t b, int64_t s, int64_t batch, int64_t F) {
      // element index of (batch b, step s) in a padded [T, batch, F] / [batch, T, F]
      return (o.batch_first ? b * T + s : s * batch + b) * F;
    };
    // The same batch with the empty sequences removed.
    Tensor x2 = Tensor::zeros(o.batch_first ? Shape{3, T, 3} : Shape{T, 3, 3}, DType::f64);
    Tensor h02 = Tensor::zeros({N, 3, P}, DType::f64);
    Tensor c02 = c0.defined() ? Tensor::zeros({N, 3, 9}, DType::f64) : Tensor();
    for (int64_t k = 0; k < 3; ++k) {
      const int64_t b = kept_index[static_cast<size_t>(k)];
      for (int64_t s = 0; s < T; ++s) {
        for (int64_t f = 0; f < 3; ++f) {
          x2.data<double>()[at(k, s, 3, 3) + f] = x.item_as_double(at(b, s, B, 3) + f);
        }
      }
      for (int64_t r = 0; r < N; ++r) {
        for (int64_t j = 0; j < P; ++j) {
          h02.data<double>()[(r * 3 + k) * P + j] = h0.item_as_double((r * B + b) * P + j);
        }
        for (int64_t j = 0; c0.defined() && j < 9; ++j) {
          c02.data<double>()[(r * 3 + k) * 9 + j] = c0.item_as_double((r * B + b) * 9 + j);
        }
      }
    }
    const auto y = m.forward(x, with_empty, h0, c0);
    const auto y2 = m.forward(x2, without, h02, c02);
    const Tensor gy = rng.tensor(y.padded.shape(), DType::f64);
    const Tensor gh = rng.tensor({N, B, P}, DType::f64);
    const Tensor gc = c0.defined() ? rng.tensor({N, B, 9}, DType::f64) : Tensor();
    Tensor gy2 = Tensor::zeros(y2.padded.shape(), DType::f64);
    Tensor gh2 = Tensor::zeros({N, 3, P}, DType::f64);
    Tensor gc2 = c0.defined() ? Tensor::zeros({N, 3, 9}, DType::f64) : Tensor();
    for (int64_t k = 0; k < 3; ++k) {
      const int64_t b = kept_index[static_cast<size_t>(k)];
      for (int64_t s = 0; s < T; ++s) {
        for (int64_t f = 0; f < O; ++f) {
          gy2.data<double>()[at(k, s, 3, O) + f] = gy.item_as_double(at(b, s, B, O) + f);
        }
      }
      for (int64_t r = 0; r < N; ++r) {
        for (int64_t j = 0; j < P; ++j) {
          gh2.data<double>()[(r * 3 + k) * P + j] = gh.item_as_double((r * B + b) * P + j);
        }
        for (int64_t j = 0; gc.defined() && j < 9; ++j) {
          gc2.data<double>()[(r * 3 + k) * 9 + j] = gc.item_as_double((r * B + b) * 9 + j);
        }
      }
    }
    const auto g = m.backward(y, gy, gh, gc);
    const auto g2 = m.backward(y2, gy2, gh2, gc2);
    const double tol = 1e-12;
    for (int64_t b = 0; b < B; ++b) {
      const auto kit = std::find(kept_index.begin(), kept_index.end(), b);
      const bool empty = kit == kept_index.end();
      const int64_t k = empty ? -1 : kit - kept_index.begin();
      for (int64_t s = 0; s < T; ++s) {
        for (int64_t f = 0; f < O; ++f) {
          const double v = y.padded.item_as_double(at(b, s, B, O) + f);
          const double e = empty ? 0.0 : y2.padded.item_as_double(at(k, s, 3, O) + f);
          EXPECT_NEAR(v, e, tol) << "output b " << b << " step " << s << " feature " << f;
        }
        for (int64_t f = 0; f < 3; ++f) {
          const double v = g.input.item_as_double(at(b, s, B, 3) + f);
          const double e = empty ? 0.0 : g2.input.item_as_double(at(k, s, 3, 3) + f);
          EXPECT_NEAR(v, e, tol) << "grad input b " << b << " step " << s << " feature " << f;
        }
      }
      for (int64_t r = 0; r < N; ++r) {
        for (int64_t j = 0; j < P; ++j) {
          const int64_t i = (r * B + b) * P + j;
          const double eh =
              empty ? h0.item_as_double(i) : y2.h_n.item_as_double((r * 3 + k) * P + j);
          EXPECT_NEAR(y.h_n.item_as_double(i), eh, tol) << "h_n b " << b << " row " << r;
          const double eg =
              empty ? gh.item_as_double(i) : g2.h0.item_as_double((r * 3 + k) * P + j);
          EXPECT_NEAR(g.h0.item_as_double(i), eg, tol) << "grad h0 b " << b << " row " << r;
        }
        for (int64_t j = 0; c0.defined() && j < 9; ++j) {
          const int64_t i = (r * B + b) * 9 + j;
          const double ec =
              empty ? c0.item_as_double(i) : y2.c_n.item_as_double((r * 3 + k) * 9 + j);
          EXPECT_NEAR(y.c_n.item_as_double(i), ec, tol) << "c_n b " << b << " row " << r;
          const double eg =
              empty ? gc.item_as_double(i) : g2.c0.item_as_double((r * 3 + k) * 9 + j);
          EXPECT_NEAR(g.c0.item_as_double(i), eg, tol) << "grad c0 b " << b << " row " << r;
        }
      }
    }
    for (size_t w = 0; w < g.weights.size(); ++w) {
      EXPECT_TRUE(all_close(g.weights[w], g2.weights[w], 1e-12, 1e-12, m.parameter_names()[w]));
    }
  }
}

}  // namespace
