// RNNCell, LSTMCell and GRUCell: a hand-worked step for each, agreement with a
// one-step, one-layer module holding the same weights, backward, state dicts
// and bad inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>

#include "seqpack/rnn.h"
#include "test_util.h"

namespace seqpack {
namespace {

using seqpack::testing::all_close;

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Hidden 1, input 1, every weight and bias set by hand so each gate is easy to follow.
TEST(LSTMCell, HandWorkedStep) {
  LSTMCell cell(1, 1, /*bias=*/true, DType::f64);
  // Rows i, f, g, o.
  cell.state_dict()
      .at("weight_ih")
      .copy_from(Tensor::from_vector<double>({0.5, -0.25, 1.0, 0.75}, {4, 1}));
  cell.state_dict()
      .at("weight_hh")
      .copy_from(Tensor::from_vector<double>({0.1, 0.2, -0.3, 0.4}, {4, 1}));
  cell.state_dict().at("bias_ih").copy_from(Tensor::from_vector<double>({0.0, 1.0, 0.0, 0.0}, {4}));
  cell.state_dict().at("bias_hh").copy_from(
      Tensor::from_vector<double>({0.1, 0.0, 0.0, -0.1}, {4}));
  const double x = 2.0, h = 0.5, c = -1.0;
  CellOutput out = cell.forward(Tensor::from_vector<double>({x}, {1, 1}),
                                Tensor::from_vector<double>({h}, {1, 1}),
                                Tensor::from_vector<double>({c}, {1, 1}));
  const double i = sigmoid(0.5 * x + 0.1 * h + 0.1);
  const double f = sigmoid(-0.25 * x + 0.2 * h + 1.0);
  const double g = std::tanh(1.0 * x - 0.3 * h);
  const double o = sigmoid(0.75 * x + 0.4 * h - 0.1);
  const double c1 = f * c + i * g;      // c' = f * c + i * g
  const double h1 = o * std::tanh(c1);  // h' = o * tanh(c')
  EXPECT_NEAR(out.c.item_as_double(0), c1, 1e-12);
  EXPECT_NEAR(out.h.item_as_double(0), h1, 1e-12);

  // d h'/d c = o (1 - tanh² c') f; d c'/d c = f.
  CellGradients gr = cell.backward(out, Tensor::from_vector<double>({1.0}, {1, 1}),
                                   Tensor::from_vector<double>({1.0}, {1, 1}));
  const double tc = std::tanh(c1);
  EXPECT_NEAR(gr.c.item_as_double(0), (o * (1 - tc * tc) + 1.0) * f, 1e-12);
}

TEST(GRUCell, HandWorkedStep) {
  GRUCell cell(1, 1, /*bias=*/true, DType::f64);
  // Rows r, z, n.
  cell.state_dict()
      .at("weight_ih")
      .copy_from(Tensor::from_vector<double>({0.5, -1.0, 2.0}, {3, 1}));
  cell.state_dict()
      .at("weight_hh")
      .copy_from(Tensor::from_vector<double>({0.3, 0.6, -0.9}, {3, 1}));
  cell.state_dict().at("bias_ih").copy_from(Tensor::from_vector<double>({0.1, 0.2, 0.3}, {3}));
  cell.state_dict().at("bias_hh").copy_from(Tensor::from_vector<double>({-0.1, 0.05, 0.4}, {3}));
  const double x = 1.5, h = -0.5;
  CellOutput out =
      cell.forward(Tensor::from_vector<double>({x}, {1}), Tensor::from_vector<double>({h}, {1}));
  ASSERT_EQ(out.h.shape(), (Shape{1}));  // unbatched in, unbatched out
  const double r = sigmoid(0.5 * x + 0.1 + 0.3 * h - 0.1);
  const double z = sigmoid(-1.0 * x + 0.2 + 0.6 * h + 0.05);
  const double n = std::tanh(2.0 * x + 0.3 + r * (-0.9 * h + 0.4));  // b_hn inside r * (.)
  EXPECT_NEAR(out.h.item_as_double(0), (1 - z) * n + z * h, 1e-12);
}

TEST(RNNCell, HandWorkedStepTanhAndRelu) {
  for (const char* nl : {"tanh", "relu"}) {
    SCOPED_TRACE(nl);
    RNNCell cell(2, 1, /*bias=*/false, nl, DType::f64);
    cell.state_dict().at("weight_ih").copy_from(Tensor::from_vector<double>({1.0, -2.0}, {1, 2}));
    cell.state_dict().at("weight_hh").copy_from(Tensor::from_vector<double>({0.5}, {1, 1}));
    // Two rows: pre-activations 1 - 2·1 + 0.5·0.4 = -0.8 and 3 - 2·0.5 + 0.5·(-1) = 1.5.
    CellOutput out = cell.forward(Tensor::from_vector<double>({1.0, 1.0, 3.0, 0.5}, {2, 2}),
                                  Tensor::from_vector<double>({0.4, -1.0}, {2, 1}));
    const bool relu = std::string(nl) == "relu";
    EXPECT_NEAR(out.h.item_as_double(0), relu ? 0.0 : std::tanh(-0.8), 1e-12);
    EXPECT_NEAR(out.h.item_as_double(1), relu ? 1.5 : std::tanh(1.5), 1e-12);
  }
  EXPECT_THROW(RNNCell(2, 1, true, "sigmoid"), std::invalid_argument);
}

// A cell is one step of a one-layer module with the same weights, forward and backward.
TEST(Cells, MatchOneStepOfTheModule) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> nd;
  auto randn = [&](Shape s) {
    Tensor t = Tensor::empty(s, DType::f64);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = nd(gen);
    return t;
  };
  for (RNNMode mode : {RNNMode::rnn_tanh, RNNMode::lstm, RNNMode::gru}) {
    SCOPED_TRACE(rnn_mode_name(mode));
    std::unique_ptr<RNNCellBase> cell;
    if (mode == RNNMode::lstm) cell = std::make_unique<LSTMCell>(3, 17, true, DType::f64, seed);
    if (mode == RNNMode::gru) cell = std::make_unique<GRUCell>(3, 17, true, DType::f64, seed);
    if (mode == RNNMode::rnn_tanh)
      cell = std::make_unique<RNNCell>(3, 17, true, "tanh", DType::f64, seed);
    RNNOptions o;
    o.mode = mode;
    o.input_size = 3;
    o.hidden_size = 17;
    o.dtype = DType::f64;
    RNNBase m(o, seed + 1);
    for (const auto& [name, t] : cell->state_dict()) m.parameter(name + "_l0").copy_from(t);
    const bool lstm = mode == RNNMode::lstm;
    const Tensor x = randn({4, 3}), h = randn({4, 17}), c = lstm ? randn({4, 17}) : Tensor();
    CellOutput co = cell->forward(x, h, c);
    RNNOutput mo =
        m.forward(x.view({1, 4, 3}), h.view({1, 4, 17}), lstm ? c.view({1, 4, 17}) : Tensor());
    EXPECT_TRUE(all_close(co.h, mo.h_n.view({4, 17}), 1e-12, 1e-12, "h"));
    if (lstm) EXPECT_TRUE(all_close(co.c, mo.c_n.view({4, 17}), 1e-12, 1e-12, "c"));

    const Tensor gh = randn({4, 17}), gc = lstm ? randn({4, 17}) : Tensor();
    CellGradients cg = cell->backward(co, gh, gc);
    RNNGradients mg =
        m.backward(mo, Tensor(), gh.view({1, 4, 17}), lstm ? gc.view({1, 4, 17}) : Tensor());
    EXPECT_TRUE(all_close(cg.input, mg.input.view({4, 3}), 1e-12, 1e-12, "grad input"));
    EXPECT_TRUE(all_close(cg.h, mg.h0.view({4, 17}), 1e-12, 1e-12, "grad h"));
    if (lstm) EXPECT_TRUE(all_close(cg.c, mg.c0.view({4, 17}), 1e-12, 1e-12, "grad c"));
    for (std::size_t i = 0; i < cell->grads().size(); ++i)
      EXPECT_TRUE(
          all_close(cell->grads()[i], m.grads()[i], 1e-12, 1e-12, cell->parameter_names()[i]));
  }
}

TEST(Cells, StateDictAndBadInputs) {
  LSTMCell cell(3, 4, /*bias=*/true, DType::f32);
  EXPECT_EQ(cell.parameter_names(),
            (std::vector<std::string>{"weight_ih", "weight_hh", "bias_ih", "bias_hh"}));
  EXPECT_EQ(cell.state_dict().at("weight_hh").shape(), (Shape{16, 4}));
  auto sd = cell.state_dict();
  sd.erase("bias_ih");
  try {
    cell.load_state_dict(sd);
    ADD_FAILURE() << "expected a missing-key error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'bias_ih'"), std::string::npos) << e.what();
  }
  auto expect_msg = [](auto&& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "expected std::invalid_argument containing '" << needle << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_msg(
      [&] {
        cell.forward(Tensor::zeros({2, 5}, DType::f32));
      },
      "input has 5 features, expected input_size = 3");
  expect_msg(
      [&] {
        cell.forward(Tensor::zeros({2, 3}, DType::f32), Tensor::zeros({3, 4}, DType::f32));
      },
      "hx has shape [3, 4], expected [2, 4]");
  expect_msg([&] { cell.forward(Tensor::zeros({2, 3}, DType::f64)); }, "dtype float64");
  GRUCell gru(3, 4, true, DType::f32);
  expect_msg(
      [&] {
        gru.forward(Tensor::zeros({2, 3}, DType::f32), Tensor(), Tensor::zeros({2, 4}, DType::f32));
      },
      "cx is only accepted by LSTMCell");
}

}  // namespace
}  // namespace seqpack
