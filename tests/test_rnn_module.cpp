// The RNN/LSTM/GRU modules and the functional core's fast path: options,
// parameter names, state dicts, bad inputs, zero-length sequences, a
// hand-worked example, layout consistency (packed / padded / batch-first /
// unbatched / one sequence at a time) and determinism. Parity with PyTorch
// and finite differences live in test_rnn_parity*.cpp and test_rnn_gradcheck.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>

#include "seqpack/packed_sequence.h"
#include "seqpack/rnn.h"
#include "seqpack/threading.h"
#include "test_util.h"

namespace seqpack {
namespace {

using seqpack::testing::all_close;

// Runs `f`, expects std::invalid_argument whose message contains `needle`.
template <typename F>
void expect_invalid(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected std::invalid_argument containing '" << needle << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' does not contain '" << needle << "'";
  }
}

Tensor randn(Shape shape, DType dtype, std::mt19937_64& gen) {
  std::normal_distribution<double> dist;
  Tensor t = Tensor::empty(shape, DType::f64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = dist(gen);
  return t.to(dtype);
}

RNNOptions opts(RNNMode mode, int64_t in, int64_t hidden, int64_t layers = 1,
                bool bidirectional = false, int64_t proj = 0, DType dtype = DType::f64) {
  RNNOptions o;
  o.mode = mode;
  o.input_size = in;
  o.hidden_size = hidden;
  o.num_layers = layers;
  o.bidirectional = bidirectional;
  o.proj_size = proj;
  o.dtype = dtype;
  return o;
}

TEST(RNNOptions, ValidateNamesTheOffendingOption) {
  expect_invalid([] { opts(RNNMode::lstm, 0, 3).validate(); },
                 "input_size must be positive, got 0");
  expect_invalid([] { opts(RNNMode::lstm, 2, -1).validate(); },
                 "hidden_size must be positive, got -1");
  expect_invalid([] { opts(RNNMode::gru, 2, 3, 0).validate(); },
                 "num_layers must be positive, got 0");
  auto o = opts(RNNMode::lstm, 2, 3);
  o.dropout = 1.0;
  expect_invalid([&] { o.validate(); }, "dropout must be in [0, 1), got 1.0");
  o.dropout = -0.5;
  expect_invalid([&] { o.validate(); }, "got -0.5");
  expect_invalid([] { opts(RNNMode::lstm, 2, 3, 1, false, 3).validate(); },
                 "proj_size = 3 must be smaller than hidden_size = 3");
  expect_invalid([] { opts(RNNMode::gru, 2, 3, 1, false, 2).validate(); },
                 "proj_size = 2 is only supported for LSTM, not gru");
  expect_invalid([] { opts(RNNMode::lstm, 2, 3, 1, false, -1).validate(); }, "proj_size");
  EXPECT_NO_THROW(opts(RNNMode::lstm, 2, 3, 1, false, 2).validate());
  expect_invalid([] { parse_rnn_mode("lstmm"); }, "'lstmm'");
  EXPECT_EQ(parse_rnn_mode("rnn_relu"), RNNMode::rnn_relu);
  EXPECT_STREQ(rnn_mode_name(RNNMode::gru), "gru");
  expect_invalid([] { RNN(opts(RNNMode::lstm, 2, 3)); }, "rnn_tanh or rnn_relu");
}

TEST(RNNParameters, NamesAndShapesInPyTorchOrder) {
  // nn.LSTM(4, 6, num_layers=2, bidirectional=True, proj_size=3)._flat_weights_names
  // and the shapes of those parameters.
  const auto o = opts(RNNMode::lstm, 4, 6, 2, true, 3);
  const std::vector<std::string> want = {
      "weight_ih_l0",         "weight_hh_l0",         "bias_ih_l0",
      "bias_hh_l0",           "weight_hr_l0",         "weight_ih_l0_reverse",
      "weight_hh_l0_reverse", "bias_ih_l0_reverse",   "bias_hh_l0_reverse",
      "weight_hr_l0_reverse", "weight_ih_l1",         "weight_hh_l1",
      "bias_ih_l1",           "bias_hh_l1",           "weight_hr_l1",
      "weight_ih_l1_reverse", "weight_hh_l1_reverse", "bias_ih_l1_reverse",
      "bias_hh_l1_reverse",   "weight_hr_l1_reverse"};
  EXPECT_EQ(rnn_parameter_names(o), want);
  const auto shapes = rnn_parameter_shapes(o);
  ASSERT_EQ(shapes.size(), want.size());
  EXPECT_EQ(shapes[0], (Shape{24, 4}));
  EXPECT_EQ(shapes[1], (Shape{24, 3}));
  EXPECT_EQ(shapes[2], (Shape{24}));
  EXPECT_EQ(shapes[4], (Shape{3, 6}));
  EXPECT_EQ(shapes[10], (Shape{24, 6}));  // layer 1 input = 2 directions * proj 3

  auto g = opts(RNNMode::gru, 5, 7, 2);
  g.bias = false;
  EXPECT_EQ(rnn_parameter_names(g), (std::vector<std::string>{"weight_ih_l0", "weight_hh_l0",
                                                              "weight_ih_l1", "weight_hh_l1"}));
  EXPECT_EQ(rnn_parameter_shapes(g)[2], (Shape{21, 7}));
}

TEST(RNNModule, InitIsUniformWithinOneOverSqrtHidden) {
  LSTM m(opts(RNNMode::lstm, 3, 16), /*seed=*/7);
  double lo = 1, hi = -1;
  for (const Tensor& p : m.parameters())
    for (int64_t i = 0; i < p.numel(); ++i) {
      lo = std::min(lo, p.item_as_double(i));
      hi = std::max(hi, p.item_as_double(i));
    }
  EXPECT_GE(lo, -0.25);
  EXPECT_LE(hi, 0.25);
  EXPECT_LT(lo, -0.2);  // spread over the whole range, not all zeros
  EXPECT_GT(hi, 0.2);
  LSTM same(opts(RNNMode::lstm, 3, 16), /*seed=*/7);
  EXPECT_TRUE(all_close(same.parameters()[1], m.parameters()[1], 0, 0, "same seed"));
}

TEST(RNNModule, StateDictRoundTripAndStrictErrors) {
  GRU a(opts(RNNMode::gru, 3, 4, 2, true), 1);
  GRU b(opts(RNNMode::gru, 3, 4, 2, true), 2);
  b.load_state_dict(a.state_dict());
  for (const auto& [name, t] : a.state_dict()) {
    EXPECT_TRUE(all_close(b.state_dict().at(name), t, 0, 0, name));
  }
  auto sd = a.state_dict();
  sd.erase("bias_hh_l1_reverse");
  expect_invalid([&] { b.load_state_dict(sd); }, "missing key 'bias_hh_l1_reverse'");
  sd = a.state_dict();
  sd["weight_hr_l0"] = Tensor::zeros({2, 4}, DType::f64);
  expect_invalid([&] { b.load_state_dict(sd); }, "unexpected key 'weight_hr_l0'");
  sd = a.state_dict();
  sd["weight_hh_l1"] = Tensor::zeros({12, 5}, DType::f64);
  expect_invalid([&] { b.load_state_dict(sd); },
                 "'weight_hh_l1' has shape [12, 5], expected [12, 4]");
  expect_invalid([&] { b.parameter("weight_xx"); }, "'weight_xx'");
}

// RNN tanh, input 1, hidden 1, w_ih = 0.5, w_hh = -1, b_ih = 0.1, b_hh = 0.2,
// one sequence x = [1, 2], h0 = 0:
//   h1 = tanh(0.5 * 1 + 0.3) = tanh(0.8)
//   h2 = tanh(0.5 * 2 + 0.3 - h1)
// and with loss = h2: dh2/dx2 = 0.5 (1 - h2²), dh2/dx1 = -(1 - h2²)(1 - h1²) 0.5,
// dh2/dw_hh = (1 - h2²) h1, dh2/db = (1 - h2²)(1 + (-1)(1 - h1²)).
TEST(RNNModule, HandWorkedTinyRNN) {
  RNN m(opts(RNNMode::rnn_tanh, 1, 1));
  m.parameter("weight_ih_l0").fill(0.5);
  m.parameter("weight_hh_l0").fill(-1.0);
  m.parameter("bias_ih_l0").fill(0.1);
  m.parameter("bias_hh_l0").fill(0.2);
  const Tensor x = Tensor::from_vector<double>({1.0, 2.0}, {2, 1, 1});
  RNNOutput y = m.forward(x);
  const double h1 = std::tanh(0.8), h2 = std::tanh(1.3 - h1);
  EXPECT_NEAR(y.padded.item_as_double(0), h1, 1e-12);
  EXPECT_NEAR(y.padded.item_as_double(1), h2, 1e-12);
  EXPECT_NEAR(y.h_n.item_as_double(0), h2, 1e-12);

  RNNGradients g = m.backward(y, Tensor(), Tensor::from_vector<double>({1.0}, {1, 1, 1}));
  const double a2 = 1 - h2 * h2, a1 = 1 - h1 * h1;
  EXPECT_NEAR(g.input.item_as_double(1), 0.5 * a2, 1e-12);
  EXPECT_NEAR(g.input.item_as_double(0), -a2 * a1 * 0.5, 1e-12);
  EXPECT_NEAR(g.h0.item_as_double(0), a2 * (-1) * a1 * (-1), 1e-12);
  EXPECT_NEAR(m.grads()[1].item_as_double(0), a2 * h1, 1e-12);        // weight_hh
  EXPECT_NEAR(m.grads()[2].item_as_double(0), a2 * (1 - a1), 1e-12);  // bias_ih
  EXPECT_NEAR(m.grads()[3].item_as_double(0), a2 * (1 - a1), 1e-12);  // bias_hh
  EXPECT_NEAR(m.grads()[0].item_as_double(0), a2 * (2 - a1), 1e-12);  // weight_ih
  // backward accumulates into grads().
  m.backward(y, Tensor(), Tensor::from_vector<double>({1.0}, {1, 1, 1}));
  EXPECT_NEAR(m.grads()[1].item_as_double(0), 2 * a2 * h1, 1e-12);
  m.zero_grad();
  EXPECT_EQ(m.grads()[1].item_as_double(0), 0.0);
}

// Every sequence of a packed, unsorted batch must get exactly what it gets when
// run alone: in particular the reverse direction starts at its own last step
// and h_n is taken at its own last step.
class RNNModes : public ::testing::TestWithParam<RNNMode> {};

TEST_P(RNNModes, BatchEqualsOneSequenceAtATime) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 gen(seed);
  const RNNMode mode = GetParam();
  const int64_t proj = mode == RNNMode::lstm ? 3 : 0;
  RNNBase m(opts(mode, 3, 5, 2, true, proj), seed);
  const int64_t R = m.options().real_hidden_size(), LD = 4, H = 5;
  const std::vector<int64_t> lengths = {2, 5, 0, 5, 1, 3};
  const int64_t B = static_cast<int64_t>(lengths.size()), T = 5;
  const Tensor x = randn({T, B, 3}, DType::f64, gen);
  const Tensor h0 = randn({LD, B, R}, DType::f64, gen);
  const Tensor c0 = mode == RNNMode::lstm ? randn({LD, B, H}, DType::f64, gen) : Tensor();
  RNNOutput y = m.forward(x, lengths, h0, c0);
  for (int64_t b = 0; b < B; ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    const int64_t len = lengths[static_cast<std::size_t>(b)];
    Tensor xb = Tensor::zeros({len, 1, 3}, DType::f64);
    for (int64_t t = 0; t < len; ++t)
      for (int64_t k = 0; k < 3; ++k)
        xb.data<double>()[t * 3 + k] = x.data<double>()[(t * B + b) * 3 + k];
    auto state_of = [&](const Tensor& s, int64_t w) {
      if (!s.defined()) return Tensor();
      Tensor o = Tensor::empty({LD, 1, w}, DType::f64);
      for (int64_t l = 0; l < LD; ++l)
        for (int64_t k = 0; k < w; ++k)
          o.data<double>()[l * w + k] = s.data<double>()[(l * B + b) * w + k];
      return o;
    };
    RNNOutput yb = m.forward(xb, std::vector<int64_t>{len}, state_of(h0, R), state_of(c0, H));
    const int64_t O = m.options().output_size();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < O; ++k) {
        const double got = y.padded.data<double>()[(t * B + b) * O + k];
        const double want = t < len ? yb.padded.data<double>()[t * O + k] : 0.0;
        ASSERT_NEAR(got, want, 1e-12) << "t " << t << " k " << k;
      }
    EXPECT_TRUE(all_close(state_of(y.h_n, R), yb.h_n, 1e-12, 1e-12, "h_n"));
    if (len == 0) EXPECT_TRUE(all_close(yb.h_n, state_of(h0, R), 0, 0, "h_n = h0"));
    if (c0.defined()) EXPECT_TRUE(all_close(state_of(y.c_n, H), yb.c_n, 1e-12, 1e-12, "c_n"));
  }
}

TEST_P(RNNModes, PackedPaddedBatchFirstAndUnbatchedAgree) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 gen(seed);
  const RNNMode mode = GetParam();
  RNNOptions o = opts(mode, 4, 6, 2, true, 0, DType::f32);
  RNNBase m(o, seed);
  const std::vector<int64_t> lengths = {3, 4, 1, 4};
  const Tensor x = randn({4, 4, 4}, DType::f32, gen);
  RNNOutput padded = m.forward(x, lengths);
  PackedSequence p = pack_padded_sequence(x, lengths, /*batch_first=*/false,
                                          /*enforce_sorted=*/false);
  RNNOutput packed = m.forward(p);
  auto [unpacked, lens] = pad_packed_sequence(packed.packed);
  EXPECT_TRUE(all_close(padded.padded, unpacked, 0, 0, "padded vs packed"));
  EXPECT_TRUE(all_close(padded.h_n, packed.h_n, 0, 0, "h_n"));

  o.batch_first = true;
  RNNBase mb(o, seed);
  RNNOutput bf = mb.forward(transpose01(x), lengths);
  EXPECT_TRUE(all_close(transpose01(bf.padded), padded.padded, 0, 0, "batch_first"));

  // All full length: the padded form and the unbatched form of one sequence.
  RNNOutput full = m.forward(x);
  RNNOutput full_packed = m.forward(x, std::vector<int64_t>(4, 4));
  EXPECT_TRUE(all_close(full.padded, full_packed.padded, 0, 0, "full length"));
  const Tensor x1 = x.view({4, 4, 4}).clone();  // take sequence 0 of the batch
  Tensor seq0 = Tensor::empty({4, 4}, DType::f32);
  for (int64_t t = 0; t < 4; ++t)
    for (int64_t k = 0; k < 4; ++k) seq0.data<float>()[t * 4 + k] = x1.data<float>()[t * 16 + k];
  RNNOutput un = m.forward(seq0);
  ASSERT_EQ(un.padded.shape(), (Shape{4, 12}));
  ASSERT_EQ(un.h_n.shape(), (Shape{4, 6}));
  for (int64_t t = 0; t < 4; ++t)
    for (int64_t k = 0; k < 12; ++k)
      ASSERT_NEAR(un.padded.data<float>()[t * 12 + k], full.padded.data<float>()[t * 48 + k], 1e-6);
  // Gradients through the padded and the packed forms agree as well.
  const Tensor gy = randn(padded.padded.shape(), DType::f32, gen);
  RNNGradients gp = m.backward(padded, gy);
  const Tensor gy_packed = pack_padded_sequence(gy, lengths, false, false).data;
  RNNGradients gk = m.backward(packed, gy_packed);
  EXPECT_TRUE(all_close(gp.input, pack_padded_sequence_backward(gk.input, *packed.plan, 4, false),
                        0, 0, "grad input"));
  for (int64_t t = 0; t < 4; ++t)  // padding gets no gradient
    for (int64_t b = 0; b < 4; ++b)
      if (t >= lengths[static_cast<std::size_t>(b)])
        for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(gp.input.data<float>()[(t * 4 + b) * 4 + k], 0.f);
}

TEST_P(RNNModes, DeterministicAcrossRuns) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 gen(seed);
  RNNBase m(opts(GetParam(), 8, 33, 2, true, 0, DType::f32), seed);
  const Tensor x = randn({9, 5, 8}, DType::f32, gen);
  const std::vector<int64_t> lengths = {9, 3, 7, 0, 9};
  RNNOutput a = m.forward(x, lengths), b = m.forward(x, lengths);
  EXPECT_TRUE(all_close(a.padded, b.padded, 0, 0, "output"));
  const Tensor gy = randn(a.padded.shape(), DType::f32, gen);
  RNNGradients ga = m.backward(a, gy), gb = m.backward(b, gy);
  EXPECT_TRUE(all_close(ga.input, gb.input, 0, 0, "grad input"));
  for (std::size_t i = 0; i < ga.weights.size(); ++i)
    EXPECT_TRUE(all_close(ga.weights[i], gb.weights[i], 0, 0, m.parameter_names()[i]));
}

// Zero-length sequences produce no rows; their h_n = h0, c_n = c0, and in the
// backward their h0/c0 gradients are grad_h_n/grad_c_n unchanged.
TEST_P(RNNModes, ZeroLengthSequencesForwardAndBackward) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 gen(seed);
  const RNNMode mode = GetParam();
  RNNBase m(opts(mode, 2, 3, 1, true), seed);
  const bool lstm = mode == RNNMode::lstm;
  const std::vector<int64_t> lengths = {0, 2, 0};
  const Tensor x = randn({2, 3, 2}, DType::f64, gen);
  const Tensor h0 = randn({2, 3, 3}, DType::f64, gen);
  const Tensor c0 = lstm ? randn({2, 3, 3}, DType::f64, gen) : Tensor();
  RNNOutput y = m.forward(x, lengths, h0, c0);
  const Tensor gh = randn({2, 3, 3}, DType::f64, gen);
  const Tensor gc = lstm ? randn({2, 3, 3}, DType::f64, gen) : Tensor();
  RNNGradients g = m.backward(y, Tensor(), gh, gc);
  for (int64_t l = 0; l < 2; ++l)
    for (int64_t b : {0, 2})
      for (int64_t k = 0; k < 3; ++k) {
        const int64_t i = (l * 3 + b) * 3 + k;
        EXPECT_EQ(y.h_n.item_as_double(i), h0.item_as_double(i));
        EXPECT_EQ(g.h0.item_as_double(i), gh.item_as_double(i));
        if (lstm) {
          EXPECT_EQ(y.c_n.item_as_double(i), c0.item_as_double(i));
          EXPECT_EQ(g.c0.item_as_double(i), gc.item_as_double(i));
        }
      }
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t k = 0; k < 6; ++k) {
      EXPECT_EQ(y.padded.data<double>()[(t * 3 + 0) * 6 + k], 0.0);
      EXPECT_EQ(y.padded.data<double>()[(t * 3 + 2) * 6 + k], 0.0);
    }
  // An all-empty batch: no rows at all.
  RNNOutput e = m.forward(Tensor::zeros({0, 2, 2}, DType::f64), std::vector<int64_t>{0, 0});
  EXPECT_EQ(e.padded.shape(), (Shape{0, 2, 6}));
  EXPECT_EQ(e.h_n.shape(), (Shape{2, 2, 3}));
  RNNGradients ge = m.backward(e, Tensor::zeros({0, 2, 6}, DType::f64));
  EXPECT_EQ(ge.input.shape(), (Shape{0, 2, 2}));
}

// Threads split a step by hidden-unit columns (one direction) or run the two
// directions side by side; either way the results match one thread to float
// rounding and are bitwise repeatable for a fixed thread count.
TEST_P(RNNModes, TwoThreadsMatchOneAndRepeat) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 gen(seed);
  const RNNMode mode = GetParam();
  for (bool bidirectional : {false, true}) {
    SCOPED_TRACE(bidirectional ? "bidirectional" : "one direction");
    RNNBase m(opts(mode, 6, 260, 2, bidirectional, mode == RNNMode::lstm ? 70 : 0, DType::f32),
              seed);
    const std::vector<int64_t> lengths = {7, 2, 0, 7, 5};
    const Tensor x = randn({7, 5, 6}, DType::f32, gen);
    const Tensor gy = randn({7, 5, m.options().output_size()}, DType::f32, gen);
    auto run = [&](int threads) {
      set_num_threads(threads);
      RNNOutput y = m.forward(x, lengths);
      RNNGradients g = m.backward(y, gy);
      set_num_threads(1);
      return std::make_pair(y, g);
    };
    auto [y1, g1] = run(1);
    auto [y2, g2] = run(2);
    auto [y2b, g2b] = run(2);
    EXPECT_TRUE(all_close(y2.padded, y1.padded, 1e-5, 1e-6, "output"));
    EXPECT_TRUE(all_close(y2.h_n, y1.h_n, 1e-5, 1e-6, "h_n"));
    EXPECT_TRUE(all_close(g2.input, g1.input, 1e-4, 1e-5, "grad input"));
    for (std::size_t i = 0; i < g1.weights.size(); ++i)
      EXPECT_TRUE(all_close(g2.weights[i], g1.weights[i], 1e-4, 1e-5, m.parameter_names()[i]));
    EXPECT_TRUE(all_close(y2b.padded, y2.padded, 0, 0, "repeat output"));
    EXPECT_TRUE(all_close(g2b.input, g2.input, 0, 0, "repeat grad input"));
  }
}

INSTANTIATE_TEST_SUITE_P(AllModes, RNNModes,
                         ::testing::Values(RNNMode::rnn_tanh, RNNMode::rnn_relu, RNNMode::lstm,
                                           RNNMode::gru),
                         [](const auto& info) { return std::string(rnn_mode_name(info.param)); });

TEST(RNNModule, BadInputsNameTheValue) {
  LSTM m(opts(RNNMode::lstm, 3, 4, 2, false, 0, DType::f32));
  expect_invalid(
      [&] {
        m.forward(Tensor::zeros({5, 2, 7}, DType::f32));
      },
      "input has 7 features, expected input_size = 3");
  expect_invalid(
      [&] {
        m.forward(Tensor::zeros({5, 2, 3}, DType::f64));
      },
      "input has dtype float64 but the module's parameters are float32");
  expect_invalid(
      [&] {
        m.forward(Tensor::zeros({5, 2, 3}, DType::f32), Tensor::zeros({1, 2, 4}, DType::f32));
      },
      "h0 has shape [1, 2, 4], expected [2, 2, 4]");
  expect_invalid(
      [&] {
        m.forward(Tensor::zeros({5, 2, 3}, DType::f32), Tensor(),
                  Tensor::zeros({2, 3, 4}, DType::f32));
      },
      "c0 has shape [2, 3, 4], expected [2, 2, 4]");
  expect_invalid(
      [&] {
        m.forward(Tensor::zeros({5, 2, 3}, DType::f32), std::vector<int64_t>{5, 6});
      },
      "lengths[1] = 6");
  expect_invalid([&] { m.forward(Tensor::zeros({5}, DType::f32)); }, "shape [5]");

  const RNNOptions o = m.options();
  const PackingPlan plan = PackingPlan::from_lengths({2, 1}, /*enforce_sorted=*/true);
  const Tensor data = Tensor::zeros({3, 3}, DType::f32);
  std::vector<Tensor> w = m.parameters();
  w.pop_back();
  expect_invalid(
      [&] {
        rnn_forward(*rnn_make_plan(o, w, /*in_place=*/true, seqpack::testing::config()), data, plan,
                    {}, {}, false, false);
      },
      "expected 8 weight tensors for these options, got 7");
  w = m.parameters();
  w[5] = Tensor::zeros({16, 5}, DType::f32);
  expect_invalid(
      [&] {
        rnn_forward(*rnn_make_plan(o, w, /*in_place=*/true, seqpack::testing::config()), data, plan,
                    {}, {}, false, false);
      },
      "weight_hh_l1 has shape [16, 5], expected [16, 4]");
  w = m.parameters();
  w[2] = Tensor::zeros({16}, DType::f64);
  expect_invalid(
      [&] {
        rnn_forward(*rnn_make_plan(o, w, /*in_place=*/true, seqpack::testing::config()), data, plan,
                    {}, {}, false, false);
      },
      "bias_ih_l0 has dtype float64, expected float32");
  expect_invalid(
      [&] {
        rnn_forward(
            *rnn_make_plan(o, m.parameters(), /*in_place=*/true, seqpack::testing::config()),
            Tensor::zeros({4, 3}, DType::f32), plan, {}, {}, false, false);
      },
      "packed input has 4 rows but the batch sizes sum to 3");

  RNNOutput nograd = m.forward(Tensor::zeros({2, 2, 3}, DType::f32), Tensor(), Tensor(),
                               /*requires_grad=*/false);
  expect_invalid([&] { m.backward(nograd, Tensor()); }, "without requires_grad");
  RNNOutput y = m.forward(Tensor::zeros({2, 2, 3}, DType::f32));
  expect_invalid(
      [&] {
        m.backward(y, Tensor::zeros({2, 2, 5}, DType::f32));
      },
      "grad_output has shape [2, 2, 5], expected the output's shape [2, 2, 4]");
}

TEST(RNNModule, DropoutOnlyWhenTrainingSeededAndDifferentiable) {
  RNNOptions o = opts(RNNMode::gru, 3, 4, 3);
  o.dropout = 0.5;
  GRU m(o, 3);
  std::mt19937_64 gen(5);
  const Tensor x = randn({4, 2, 3}, DType::f64, gen);
  m.eval();
  RNNOutput e1 = m.forward(x), e2 = m.forward(x);
  EXPECT_TRUE(all_close(e1.padded, e2.padded, 0, 0, "eval is deterministic"));
  m.train();
  m.set_dropout_seed(11);
  RNNOutput t1 = m.forward(x);
  m.set_dropout_seed(11);
  RNNOutput t2 = m.forward(x);
  RNNOutput t3 = m.forward(x);  // the seed advanced
  EXPECT_TRUE(all_close(t1.padded, t2.padded, 0, 0, "same seed"));
  EXPECT_FALSE(all_close(t1.padded, e1.padded, 1e-6, 1e-6, "dropout changes the output"));
  EXPECT_FALSE(all_close(t1.padded, t3.padded, 1e-6, 1e-6, "next mask differs"));

  // With the mask fixed by the seed the forward is a smooth function of x:
  // check one input gradient against a central difference.
  const Tensor gy = randn(t1.padded.shape(), DType::f64, gen);
  m.set_dropout_seed(11);
  RNNOutput y = m.forward(x);
  RNNGradients g = m.backward(y, gy);
  auto loss = [&](const Tensor& xi) {
    m.set_dropout_seed(11);
    RNNOutput yy = m.forward(xi, Tensor(), Tensor(), false);
    double s = 0;
    for (int64_t i = 0; i < gy.numel(); ++i)
      s += yy.padded.item_as_double(i) * gy.item_as_double(i);
    return s;
  };
  for (int64_t i : {0, 7, 20}) {
    Tensor xp = x.clone(), xm = x.clone();
    xp.data<double>()[i] += 1e-6;
    xm.data<double>()[i] -= 1e-6;
    EXPECT_NEAR(g.input.item_as_double(i), (loss(xp) - loss(xm)) / 2e-6, 1e-6) << "index " << i;
  }
}

}  // namespace
}  // namespace seqpack
