// The plain reference (src/reference/rnn_reference.cpp) against PyTorch fixtures,
// against recurrences worked by hand, and its backward against finite
// differences. Everything else about the recurrent layers is checked against
// this reference, so it is checked against the outside world here.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/rnn_reference.h"
#include "rnn_fixture.h"
#include "seqpack/rnn.h"
#include "test_util.h"

namespace {

using seqpack::DType;
using seqpack::RNNMode;
using seqpack::RNNOptions;
using seqpack::Tensor;
using seqpack::testing::all_close;
using seqpack::testing::fp_close;
using seqpack::testing::RNNCase;

const std::vector<RNNCase>& cases() {
  static const std::vector<RNNCase> c = seqpack::testing::load_rnn_cases();
  return c;
}

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

Tensor f64(std::vector<double> v, seqpack::Shape shape) {
  return Tensor::from_vector<double>(v, std::move(shape));
}

TEST(RNNReference, FixturesCoverTheGrid) {
  // Guards against a generator change silently dropping a whole dimension of the grid.
  int packed = 0, padded = 0, padded_lengths = 0, unbatched = 0, bi = 0, proj = 0, nobias = 0,
      f64cases = 0, unsorted = 0, layers3 = 0, batch_first = 0, h0 = 0, beyond = 0;
  for (const RNNCase& c : cases()) {
    packed += c.kind == "packed";
    padded += c.kind == "padded";
    padded_lengths += c.kind == "padded_lengths";
    unbatched += c.kind == "unbatched";
    bi += c.options.bidirectional;
    proj += c.options.proj_size > 0;
    nobias += !c.options.bias;
    f64cases += c.options.dtype == DType::f64;
    unsorted += !c.sorted_indices.empty() && c.sorted_indices != std::vector<int64_t>{0, 1} &&
                c.sorted_indices.size() > 1;
    layers3 += c.options.num_layers == 3;
    batch_first += c.options.batch_first;
    h0 += c.h0.defined();
    beyond += c.padded_len() > c.max_len();
  }
  EXPECT_GE(beyond, 4);
  EXPECT_GE(cases().size(), 60u);
  for (int n : {packed, padded, padded_lengths, unbatched, bi, proj, nobias, f64cases, unsorted,
                layers3, batch_first, h0}) {
    EXPECT_GE(n, 3);
  }
}

TEST(RNNReference, ParameterNamesMatchPyTorch) {
  for (const RNNCase& c : cases()) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(seqpack::reference::rnn_parameter_names(c.options), c.parameter_names);
    const auto shapes = seqpack::reference::rnn_parameter_shapes(c.options);
    ASSERT_EQ(shapes.size(), c.weights.size());
    for (size_t k = 0; k < shapes.size(); ++k) EXPECT_EQ(shapes[k], c.weights[k].shape());
  }
}

TEST(RNNReference, ForwardMatchesPyTorchFixtures) {
  for (const RNNCase& c : cases()) {
    SCOPED_TRACE(c.name);
    const auto r = seqpack::rnn_reference_forward(c.options, c.weights, c.sequences,
                                                  batched_state(c, c.h0), batched_state(c, c.c0));
    const int64_t n = seqpack::testing::case_n(c);
    EXPECT_TRUE(fp_close(rows_to_layout(c, r.outputs, c.options.output_size()), c.output, n, c.options.dtype,
                          c.name + " output"));
    EXPECT_TRUE(fp_close(r.h_n.view(c.h_n.shape()), c.h_n, n, c.options.dtype, c.name + " h_n"));
    if (c.options.mode == RNNMode::lstm) {
      EXPECT_TRUE(fp_close(r.c_n.view(c.c_n.shape()), c.c_n, n, c.options.dtype, c.name + " c_n"));
    } else {
      EXPECT_FALSE(r.c_n.defined());
    }
  }
}

TEST(RNNReference, BackwardMatchesPyTorchFixtures) {
  for (const RNNCase& c : cases()) {
    SCOPED_TRACE(c.name);
    const int64_t out_f = c.options.output_size();
    const auto grad_rows = layout_to_rows(c, c.grad_output, out_f);
    const auto g = seqpack::reference::rnn_reference_backward(
        c.options, c.weights, c.sequences, batched_state(c, c.h0), batched_state(c, c.c0),
        grad_rows, batched_state(c, c.grad_h_n), batched_state(c, c.grad_c_n));
    const int64_t n = seqpack::testing::case_n(c);
    EXPECT_TRUE(fp_close(rows_to_layout(c, g.inputs, c.options.input_size), c.grads.at("input"),
                          n, c.options.dtype, c.name + " grad input"));
    if (c.h0.defined()) {
      EXPECT_TRUE(
          fp_close(g.h0.view(c.h0.shape()), c.grads.at("h0"), n, c.options.dtype, c.name + " grad h0"));
    }
    if (c.c0.defined()) {
      EXPECT_TRUE(
          fp_close(g.c0.view(c.c0.shape()), c.grads.at("c0"), n, c.options.dtype, c.name + " grad c0"));
    }
    ASSERT_EQ(g.weights.size(), c.parameter_names.size());
    for (size_t k = 0; k < g.weights.size(); ++k) {
      EXPECT_TRUE(seqpack::testing::parameter_grad_close(c, c.parameter_names[k], g.weights[k]));
    }
  }
}

// A cell step is a one-layer, one-step RNN: the reference reproduces PyTorch's
// RNNCell / LSTMCell / GRUCell outputs and gradients run that way.
TEST(RNNReference, CellsMatchPyTorchFixtures) {
  for (const auto& c : seqpack::testing::load_rnn_cell_cases()) {
    SCOPED_TRACE(c.name);
    RNNOptions o{.mode = c.mode,
                 .input_size = c.input_size,
                 .hidden_size = c.hidden_size,
                 .bias = c.bias,
                 .dtype = c.dtype};
    const int64_t B = c.batch(), H = c.hidden_size;
    std::vector<Tensor> seqs;
    for (int64_t b = 0; b < B; ++b) {
      seqs.push_back(c.input.view({B, c.input_size}).slice0(b, b + 1));
    }
    auto state = [&](const Tensor& t) { return t.defined() ? t.view({1, B, H}) : Tensor(); };
    const auto r = seqpack::rnn_reference_forward(o, c.weights, seqs, state(c.hx), state(c.cx));
    const int64_t n = seqpack::testing::rnn_reduction_length(c.input_size, c.hidden_size, 1,
                                                                 false, c.batch());
    EXPECT_TRUE(fp_close(r.h_n.view(c.h.shape()), c.h, n, c.dtype, c.name + " h"));
    if (c.mode == RNNMode::lstm)
      EXPECT_TRUE(fp_close(r.c_n.view(c.c.shape()), c.c, n, c.dtype, c.name + " c"));
    const auto g = seqpack::reference::rnn_reference_backward(
        o, c.weights, seqs, state(c.hx), state(c.cx), {}, state(c.grad_h), state(c.grad_c));
    Tensor gx = Tensor::empty({B, c.input_size}, DType::f64);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t f = 0; f < c.input_size; ++f) {
        gx.data<double>()[b * c.input_size + f] =
            g.inputs[static_cast<size_t>(b)].item_as_double(f);
      }
    }
    EXPECT_TRUE(
        fp_close(gx.view(c.input.shape()), c.grads.at("input"), n, c.dtype, c.name + " grad input"));
    if (c.hx.defined()) {
      EXPECT_TRUE(
          fp_close(g.h0.view(c.hx.shape()), c.grads.at("hx"), n, c.dtype, c.name + " grad hx"));
    }
    if (c.cx.defined()) {
      EXPECT_TRUE(
          fp_close(g.c0.view(c.cx.shape()), c.grads.at("cx"), n, c.dtype, c.name + " grad cx"));
    }
    for (size_t k = 0; k < c.parameter_names.size(); ++k) {
      EXPECT_TRUE(fp_close(g.weights[k], c.grads.at(c.parameter_names[k]), n, c.dtype,
                            c.name + " grad " + c.parameter_names[k]));
    }
  }
}

// Tanh RNN, one unit: h_t = tanh(w x_t + b_ih + u h_{t-1} + b_hh), by hand.
TEST(RNNReference, HandWorkedTanhRNN) {
  RNNOptions o{.mode = RNNMode::rnn_tanh, .input_size = 1, .hidden_size = 1, .dtype = DType::f64};
  const double w = 0.5, u = -1.0, bi = 0.1, bh = 0.2;
  const std::vector<Tensor> weights = {f64({w}, {1, 1}), f64({u}, {1, 1}), f64({bi}, {1}),
                                       f64({bh}, {1})};
  const auto r = seqpack::rnn_reference_forward(o, weights, {f64({1, 2}, {2, 1})}, {}, {});
  const double h1 = std::tanh(0.5 + 0.3);           // h_0 = 0
  const double h2 = std::tanh(0.5 * 2 + 0.3 - h1);  // u = -1
  EXPECT_NEAR(r.outputs[0].item_as_double(0), h1, 1e-15);
  EXPECT_NEAR(r.outputs[0].item_as_double(1), h2, 1e-15);
  EXPECT_NEAR(r.h_n.item_as_double(0), h2, 1e-15);

  o.mode = RNNMode::rnn_relu;
  const auto q = seqpack::rnn_reference_forward(o, weights, {f64({1, 2}, {2, 1})}, {}, {});
  // relu: h1 = 0.8, h2 = max(0, 1.3 - 0.8) = 0.5
  EXPECT_NEAR(q.outputs[0].item_as_double(0), 0.8, 1e-15);
  EXPECT_NEAR(q.outputs[0].item_as_double(1), 0.5, 1e-15);
}

// LSTM, one unit, no bias, every weight 1 except W_hh = 0, h0 = 0, c0 = 1, x = 2:
// every gate pre-activation is 2, so i = f = o = s = sigmoid(2), g = tanh(2),
// c_1 = s * 1 + s * tanh(2), h_1 = s * tanh(c_1).
TEST(RNNReference, HandWorkedLSTMStep) {
  RNNOptions o{
      .mode = RNNMode::lstm, .input_size = 1, .hidden_size = 1, .bias = false, .dtype = DType::f64};
  const std::vector<Tensor> weights = {f64({1, 1, 1, 1}, {4, 1}), f64({0, 0, 0, 0}, {4, 1})};
  const Tensor c0 = f64({1}, {1, 1, 1});
  const auto r = seqpack::rnn_reference_forward(o, weights, {f64({2}, {1, 1})}, {}, c0);
  const double s = sigmoid(2), c1 = s + s * std::tanh(2), h1 = s * std::tanh(c1);
  EXPECT_NEAR(r.c_n.item_as_double(0), c1, 1e-15);
  EXPECT_NEAR(r.h_n.item_as_double(0), h1, 1e-15);
  EXPECT_NEAR(r.outputs[0].item_as_double(0), h1, 1e-15);

  // With proj_size 1 on hidden 2 (W_hr = [3, -1]) the output is the projection.
  RNNOptions p = o;
  p.hidden_size = 2;
  p.proj_size = 1;
  const std::vector<Tensor> pw = {f64({1, 1, 1, 1, 1, 1, 1, 1}, {8, 1}),
                                  f64(std::vector<double>(8, 0.0), {8, 1}), f64({3, -1}, {1, 2})};
  const auto rp = seqpack::rnn_reference_forward(p, pw, {f64({2}, {1, 1})}, {}, {});
  const double c1p = s * std::tanh(2), m = s * std::tanh(c1p);  // c0 = 0 here
  EXPECT_NEAR(rp.h_n.item_as_double(0), 3 * m - m, 1e-15);
  EXPECT_NEAR(rp.c_n.item_as_double(0), c1p, 1e-15);
  EXPECT_NEAR(rp.c_n.item_as_double(1), c1p, 1e-15);
}

// GRU, one unit: W_ih = [1, 2, 3] (r, z, n), W_hh = [0.5, -0.5, 2], b_ih = 0, b_hh = [0, 0, 1],
// h0 = 0.4, x = 1:
//   r = sigmoid(1 + 0.2), z = sigmoid(2 - 0.2), n = tanh(3 + r * (0.8 + 1)),
//   h = (1 - z) * n + z * 0.4.
TEST(RNNReference, HandWorkedGRUStepIsLinearBeforeReset) {
  RNNOptions o{.mode = RNNMode::gru, .input_size = 1, .hidden_size = 1, .dtype = DType::f64};
  const std::vector<Tensor> weights = {f64({1, 2, 3}, {3, 1}), f64({0.5, -0.5, 2}, {3, 1}),
                                       f64({0, 0, 0}, {3}), f64({0, 0, 1}, {3})};
  const auto r =
      seqpack::rnn_reference_forward(o, weights, {f64({1}, {1, 1})}, f64({0.4}, {1, 1, 1}), {});
  const double rr = sigmoid(1.2), z = sigmoid(1.8), n = std::tanh(3 + rr * 1.8);
  EXPECT_NEAR(r.h_n.item_as_double(0), (1 - z) * n + z * 0.4, 1e-15);
}

// Bidirectional, batch of lengths 3 and 2: the reverse direction of the short
// sequence starts at its own step 1, never at the padded step 2.
TEST(RNNReference, ReverseDirectionStartsAtEachSequencesOwnLastStep) {
  RNNOptions o{.mode = RNNMode::rnn_tanh,
               .input_size = 1,
               .hidden_size = 1,
               .bidirectional = true,
               .dtype = DType::f64};
  o.bias = false;
  const double w = 0.7, u = 0.3, wr = -0.4, ur = 0.9;
  const std::vector<Tensor> weights = {f64({w}, {1, 1}), f64({u}, {1, 1}), f64({wr}, {1, 1}),
                                       f64({ur}, {1, 1})};
  const auto r = seqpack::rnn_reference_forward(
      o, weights, {f64({1, 2, 3}, {3, 1}), f64({4, 5}, {2, 1})}, {}, {});
  // Short sequence, reverse: h_rev(1) = tanh(wr * 5), h_rev(0) = tanh(wr * 4 + ur * h_rev(1)).
  const double rev1 = std::tanh(wr * 5), rev0 = std::tanh(wr * 4 + ur * rev1);
  const double fwd0 = std::tanh(w * 4), fwd1 = std::tanh(w * 5 + u * fwd0);
  const Tensor& y = r.outputs[1];  // [2, 2]: (forward, reverse) per step
  EXPECT_NEAR(y.item_as_double(0), fwd0, 1e-15);
  EXPECT_NEAR(y.item_as_double(1), rev0, 1e-15);
  EXPECT_NEAR(y.item_as_double(2), fwd1, 1e-15);
  EXPECT_NEAR(y.item_as_double(3), rev1, 1e-15);
  // h_n: [dirs, batch, 1]; forward is the last step, reverse is step 0.
  EXPECT_NEAR(r.h_n.item_as_double(1), fwd1, 1e-15);
  EXPECT_NEAR(r.h_n.item_as_double(3), rev0, 1e-15);
}

TEST(RNNReference, ZeroLengthSequencesKeepTheirInitialState) {
  RNNOptions o{.mode = RNNMode::lstm,
               .input_size = 2,
               .hidden_size = 3,
               .num_layers = 2,
               .bidirectional = true,
               .dtype = DType::f64};
  std::mt19937_64 gen(5);
  std::uniform_real_distribution<double> u(-1, 1);
  auto rnd = [&](seqpack::Shape s) {
    Tensor t = Tensor::empty(s, DType::f64);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = u(gen);
    return t;
  };
  std::vector<Tensor> w;
  for (const auto& s : seqpack::reference::rnn_parameter_shapes(o)) w.push_back(rnd(s));
  const std::vector<Tensor> seqs = {rnd({3, 2}), rnd({0, 2}), rnd({2, 2})};
  const Tensor h0 = rnd({4, 3, 3}), c0 = rnd({4, 3, 3});
  const auto r = seqpack::rnn_reference_forward(o, w, seqs, h0, c0);
  EXPECT_EQ(r.outputs[1].shape(), (seqpack::Shape{0, 6}));
  for (int64_t row = 0; row < 4; ++row) {
    for (int64_t j = 0; j < 3; ++j) {
      EXPECT_EQ(r.h_n.item_as_double((row * 3 + 1) * 3 + j),
                h0.item_as_double((row * 3 + 1) * 3 + j));
      EXPECT_EQ(r.c_n.item_as_double((row * 3 + 1) * 3 + j),
                c0.item_as_double((row * 3 + 1) * 3 + j));
    }
  }
}

// The reference backward against central differences of the reference forward,
// for every cell type, with a zero-length sequence mixed in.
TEST(RNNReference, BackwardMatchesFiniteDifferences) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  auto rnd = [&](seqpack::Shape s) {
    Tensor t = Tensor::empty(s, DType::f64);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = u(gen);
    return t;
  };
  for (RNNMode mode : {RNNMode::rnn_tanh, RNNMode::rnn_relu, RNNMode::lstm, RNNMode::gru}) {
    RNNOptions o{.mode = mode,
                 .input_size = 2,
                 .hidden_size = 3,
                 .num_layers = 2,
                 .bidirectional = true,
                 .proj_size = mode == RNNMode::lstm ? 2 : 0,
                 .dtype = DType::f64};
    SCOPED_TRACE("mode " + std::to_string(static_cast<int>(mode)));
    std::vector<Tensor> w;
    for (const auto& s : seqpack::reference::rnn_parameter_shapes(o)) w.push_back(rnd(s));
    std::vector<Tensor> seqs = {rnd({3, 2}), rnd({0, 2}), rnd({2, 2})};
    const int64_t P = o.real_hidden_size(), N = 4;
    Tensor h0 = rnd({N, 3, P});
    Tensor c0 = mode == RNNMode::lstm ? rnd({N, 3, o.hidden_size}) : Tensor();
    std::vector<Tensor> gout = {rnd({3, 2 * P}), rnd({0, 2 * P}), rnd({2, 2 * P})};
    Tensor gh = rnd({N, 3, P});
    Tensor gc = mode == RNNMode::lstm ? rnd({N, 3, o.hidden_size}) : Tensor();
    auto loss = [&]() {
      const auto r = seqpack::rnn_reference_forward(o, w, seqs, h0, c0);
      double s = 0;
      for (size_t b = 0; b < seqs.size(); ++b) {
        for (int64_t i = 0; i < r.outputs[b].numel(); ++i) {
          s += r.outputs[b].item_as_double(i) * gout[b].item_as_double(i);
        }
      }
      for (int64_t i = 0; i < gh.numel(); ++i) s += r.h_n.item_as_double(i) * gh.item_as_double(i);
      if (gc.defined()) {
        for (int64_t i = 0; i < gc.numel(); ++i)
          s += r.c_n.item_as_double(i) * gc.item_as_double(i);
      }
      return s;
    };
    const auto g = seqpack::reference::rnn_reference_backward(o, w, seqs, h0, c0, gout, gh, gc);
    auto check = [&](Tensor& x, const Tensor& analytic, const std::string& what) {
      const double eps = 1e-6;
      for (int64_t i = 0; i < x.numel(); ++i) {
        double* p = x.data<double>() + i;
        const double keep = *p;
        *p = keep + eps;
        const double lp = loss();
        *p = keep - eps;
        const double lm = loss();
        *p = keep;
        const double fd = (lp - lm) / (2 * eps), an = analytic.item_as_double(i);
        EXPECT_NEAR(an, fd, 1e-6 + 1e-5 * std::fabs(fd)) << what << "[" << i << "]";
      }
    };
    const auto names = seqpack::reference::rnn_parameter_names(o);
    for (size_t k = 0; k < w.size(); ++k) check(w[k], g.weights[k], names[k]);
    for (size_t b = 0; b < seqs.size(); ++b)
      check(seqs[b], g.inputs[b], "input " + std::to_string(b));
    check(h0, g.h0, "h0");
    if (c0.defined()) check(c0, g.c0, "c0");
    // The zero-length sequence passes its upstream state gradient straight to h0/c0.
    for (int64_t row = 0; row < N; ++row) {
      for (int64_t j = 0; j < P; ++j) {
        EXPECT_EQ(g.h0.item_as_double((row * 3 + 1) * P + j),
                  gh.item_as_double((row * 3 + 1) * P + j));
      }
    }
  }
}

TEST(RNNReference, BadInputThrowsNamingTheValue) {
  RNNOptions o{.mode = RNNMode::gru, .input_size = 2, .hidden_size = 3, .dtype = DType::f64};
  std::vector<Tensor> w;
  for (const auto& s : seqpack::reference::rnn_parameter_shapes(o))
    w.push_back(Tensor::zeros(s, DType::f64));
  auto expect_throw = [](auto fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "expected std::invalid_argument mentioning " << needle;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const std::vector<Tensor> good = {Tensor::zeros({2, 2}, DType::f64)};
  expect_throw(
      [&] {
        seqpack::rnn_reference_forward(o, w, {Tensor::zeros({2, 5}, DType::f64)}, {}, {});
      },
      "[2, 5]");
  expect_throw([&] { seqpack::rnn_reference_forward(o, {w[0], w[1]}, good, {}, {}); }, "got 2");
  auto w_bad = w;
  w_bad[1] = Tensor::zeros({9, 2}, DType::f64);
  expect_throw([&] { seqpack::rnn_reference_forward(o, w_bad, good, {}, {}); }, "weight_hh_l0");
  expect_throw(
      [&] {
        seqpack::rnn_reference_forward(o, w, good, Tensor::zeros({1, 2, 3}, DType::f64), {});
      },
      "[1, 2, 3]");
  expect_throw(
      [&] {
        seqpack::rnn_reference_forward(o, w, good, {}, Tensor::zeros({1, 1, 3}, DType::f64));
      },
      "c0");
  RNNOptions p = o;
  p.proj_size = 2;
  expect_throw([&] { seqpack::reference::rnn_parameter_names(p); }, "proj_size = 2");
  p.mode = RNNMode::lstm;
  p.proj_size = 3;
  expect_throw([&] { seqpack::reference::rnn_parameter_names(p); }, "proj_size = 3");
  RNNOptions z = o;
  z.hidden_size = 0;
  expect_throw([&] { seqpack::reference::rnn_parameter_names(z); }, "hidden_size = 0");
}

}  // namespace
