// The fast path (rnn_forward / rnn_backward and the RNN, LSTM, GRU modules)
// against PyTorch 1.13 fixtures (tests/fixtures/gen_rnn.py): output, h_n, c_n
// and the gradients of the input, h0, c0 and every parameter.
// Every value is compared with fp_close (test_util.h, docs/testing.md) at
// n = case_n(c): the fixtures come from another CPU's summation order.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rnn_fixture.h"
#include "seqpack/packed_sequence.h"
#include "seqpack/rnn.h"
#include "test_util.h"

namespace {

using seqpack::DType;
using seqpack::PackedSequence;
using seqpack::PackingPlan;
using seqpack::RNNMode;
using seqpack::Tensor;
using seqpack::testing::all_close;
using seqpack::testing::fp_close;
using seqpack::testing::RNNCase;

const std::vector<RNNCase>& cases() {
  static const std::vector<RNNCase> c = seqpack::testing::load_rnn_cases();
  return c;
}

std::vector<const RNNCase*> cases_of(RNNMode mode) {
  std::vector<const RNNCase*> out;
  for (const RNNCase& c : cases()) {
    if (c.options.mode == mode) out.push_back(&c);
  }
  return out;
}

// Per-sequence rows -> packed rows in `order` (caller's index of the k-th
// longest), with plain loops so the test does not lean on PackingPlan::pack.
Tensor pack_rows(const std::vector<Tensor>& rows, const std::vector<int64_t>& lengths,
                 const std::vector<int64_t>& order, int64_t features, DType dtype) {
  int64_t total = 0, T = 0;
  for (int64_t n : lengths) total += n, T = std::max(T, n);
  Tensor out = Tensor::zeros({total, features}, DType::f64);
  int64_t r = 0;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b : order) {
      if (lengths[static_cast<std::size_t>(b)] <= t) continue;
      for (int64_t f = 0; f < features; ++f) {
        out.data<double>()[r * features + f] =
            rows[static_cast<std::size_t>(b)].item_as_double(t * features + f);
      }
      ++r;
    }
  }
  return out.to(dtype);
}

std::vector<Tensor> unpack_rows(const Tensor& packed, const std::vector<int64_t>& lengths,
                                const std::vector<int64_t>& order, int64_t features) {
  int64_t T = 0;
  for (int64_t n : lengths) T = std::max(T, n);
  std::vector<Tensor> rows;
  for (int64_t n : lengths) rows.push_back(Tensor::zeros({n, features}, DType::f64));
  int64_t r = 0;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b : order) {
      if (lengths[static_cast<std::size_t>(b)] <= t) continue;
      for (int64_t f = 0; f < features; ++f) {
        rows[static_cast<std::size_t>(b)].data<double>()[t * features + f] =
            packed.item_as_double(r * features + f);
      }
      ++r;
    }
  }
  return rows;
}

void expect_state_grads(const RNNCase& c, const Tensor& h0, const Tensor& c0) {
  const int64_t n = seqpack::testing::case_n(c);
  if (c.h0.defined()) {
    ASSERT_TRUE(h0.defined()) << c.name << ": no h0 gradient";
    EXPECT_TRUE(fp_close(h0.view(c.h0.shape()), c.grads.at("h0"), n, c.options.dtype, c.name + " grad h0"));
  }
  if (c.c0.defined()) {
    ASSERT_TRUE(c0.defined()) << c.name << ": no c0 gradient";
    EXPECT_TRUE(fp_close(c0.view(c.c0.shape()), c.grads.at("c0"), n, c.options.dtype, c.name + " grad c0"));
  }
}

void expect_weight_grads(const RNNCase& c, const std::vector<Tensor>& weights) {
  const int64_t n = seqpack::testing::case_n(c);
  ASSERT_EQ(weights.size(), c.parameter_names.size()) << c.name;
  for (size_t k = 0; k < weights.size(); ++k) {
    EXPECT_TRUE(seqpack::testing::parameter_grad_close(c, c.parameter_names[k], weights[k]));
  }
}

class RNNParity : public ::testing::TestWithParam<RNNMode> {};

// rnn_forward / rnn_backward on packed rows, every fixture reduced to its
// sequences: padded inputs are packed with every length T.
TEST_P(RNNParity, FunctionalMatchesPyTorch) {
  for (const RNNCase* cp : cases_of(GetParam())) {
    const RNNCase& c = *cp;
    SCOPED_TRACE(c.name);
    const auto& o = c.options;
    EXPECT_EQ(seqpack::rnn_parameter_names(o), c.parameter_names);
    const PackingPlan plan = PackingPlan::from_lengths(c.lengths, c.enforce_sorted);
    if (c.kind == "packed" && !c.sorted_indices.empty()) {
      EXPECT_EQ(plan.sorted_indices(), c.sorted_indices);
    }
    std::vector<int64_t> order = plan.sorted_indices();
    if (order.empty()) {
      for (int64_t b = 0; b < c.batch(); ++b) order.push_back(b);
    }
    const Tensor data = pack_rows(c.sequences, c.lengths, order, o.input_size, o.dtype);
    const Tensor h0 = batched_state(c, c.h0), c0 = batched_state(c, c.c0);
    const auto r = seqpack::rnn_forward(
        *rnn_make_plan(o, c.weights, /*in_place=*/true, seqpack::testing::config()), data, plan, h0,
        c0, /*training=*/false,
        /*save_for_backward=*/true);
    const int64_t n = seqpack::testing::case_n(c);
    const int64_t O = o.output_size();
    ASSERT_EQ(r.output.shape(), (seqpack::Shape{plan.total_rows(), O})) << c.name;
    EXPECT_EQ(r.output.dtype(), o.dtype);
    const auto out_rows = unpack_rows(r.output, c.lengths, order, O);
    EXPECT_TRUE(
        fp_close(rows_to_layout(c, out_rows, O), c.output, n, c.options.dtype, c.name + " output"));
    EXPECT_TRUE(fp_close(r.h_n.view(c.h_n.shape()), c.h_n, n, c.options.dtype, c.name + " h_n"));
    if (o.mode == RNNMode::lstm) {
      EXPECT_TRUE(fp_close(r.c_n.view(c.c_n.shape()), c.c_n, n, c.options.dtype, c.name + " c_n"));
    }
    ASSERT_TRUE(r.saved) << c.name;

    const Tensor grad_rows =
        pack_rows(layout_to_rows(c, c.grad_output, O), c.lengths, order, O, o.dtype);
    const auto g = seqpack::rnn_backward(*r.saved, grad_rows, batched_state(c, c.grad_h_n),
                                         batched_state(c, c.grad_c_n));
    ASSERT_EQ(g.input.shape(), data.shape()) << c.name;
    EXPECT_TRUE(fp_close(
        rows_to_layout(c, unpack_rows(g.input, c.lengths, order, o.input_size), o.input_size),
        c.grads.at("input"), n, c.options.dtype, c.name + " grad input"));
    expect_state_grads(c, g.h0, g.c0);
    expect_weight_grads(c, g.weights);
  }
}

std::unique_ptr<seqpack::RNNBase> make_module(const RNNCase& c) {
  std::unique_ptr<seqpack::RNNBase> m;
  switch (c.options.mode) {
    case RNNMode::lstm:
      m = std::make_unique<seqpack::LSTM>(c.options);
      break;
    case RNNMode::gru:
      m = std::make_unique<seqpack::GRU>(c.options);
      break;
    default:
      m = std::make_unique<seqpack::RNN>(c.options);
  }
  std::map<std::string, Tensor> state;
  for (size_t k = 0; k < c.weights.size(); ++k) state[c.parameter_names[k]] = c.weights[k];
  m->load_state_dict(state);
  m->eval();
  return m;
}

// The modules, each fixture through the entry point PyTorch's caller used:
// a PackedSequence, a plain tensor, a tensor with lengths, or an unbatched tensor.
TEST_P(RNNParity, ModuleMatchesPyTorch) {
  for (const RNNCase* cp : cases_of(GetParam())) {
    const RNNCase& c = *cp;
    SCOPED_TRACE(c.name);
    auto m = make_module(c);
    EXPECT_EQ(m->parameter_names(), c.parameter_names);
    seqpack::RNNOutput out;
    if (c.kind == "packed") {
      PackedSequence p;
      p.data = c.input;
      p.batch_sizes = c.batch_sizes;
      if (!c.sorted_indices.empty()) {
        p.sorted_indices = Tensor::from_vector<int64_t>(c.sorted_indices);
        std::vector<int64_t> inv(c.sorted_indices.size());
        for (size_t k = 0; k < inv.size(); ++k) {
          inv[static_cast<size_t>(c.sorted_indices[k])] = static_cast<int64_t>(k);
        }
        p.unsorted_indices = Tensor::from_vector<int64_t>(inv);
      }
      out = m->forward(p, c.h0, c.c0);
      ASSERT_TRUE(out.packed.data.defined()) << c.name;
      EXPECT_FALSE(out.padded.defined());
      EXPECT_EQ(out.packed.batch_sizes.to_vector<int64_t>(), c.batch_sizes.to_vector<int64_t>());
    } else if (c.kind == "padded_lengths") {
      out = m->forward(c.input, c.lengths, c.h0, c.c0);
    } else {
      out = m->forward(c.input, c.h0, c.c0);
    }
    const int64_t n = seqpack::testing::case_n(c);
    const Tensor& y = c.kind == "packed" ? out.packed.data : out.padded;
    EXPECT_TRUE(fp_close(y, c.output, n, c.options.dtype, c.name + " output"));
    EXPECT_TRUE(fp_close(out.h_n, c.h_n, n, c.options.dtype, c.name + " h_n"));
    if (c.options.mode == RNNMode::lstm) {
      EXPECT_TRUE(fp_close(out.c_n, c.c_n, n, c.options.dtype, c.name + " c_n"));
    } else {
      EXPECT_FALSE(out.c_n.defined()) << c.name;
    }

    const auto g = m->backward(out, c.grad_output, c.grad_h_n, c.grad_c_n);
    EXPECT_TRUE(fp_close(g.input, c.grads.at("input"), n, c.options.dtype, c.name + " grad input"));
    expect_state_grads(c, g.h0, g.c0);
    expect_weight_grads(c, g.weights);
    // backward accumulates into grads(): after one call they are this call's gradients.
    expect_weight_grads(c, m->grads());
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, RNNParity,
                         ::testing::Values(RNNMode::rnn_tanh, RNNMode::rnn_relu, RNNMode::lstm,
                                           RNNMode::gru),
                         [](const ::testing::TestParamInfo<RNNMode>& info) {
                           return std::string(seqpack::rnn_mode_name(info.param));
                         });

// The cases above compare the vector bodies of the gate kernels with PyTorch,
// not only their scalar tails: hidden sizes past one vector (16 floats with
// AVX-512) and past the 4-vector unrolled loops (H >= 128), for every mode,
// with 2 layers, both directions, mixed lengths, proj_size and float64. Guards
// against a generator change dropping them.
TEST(RNNParity, WideCasesReachTheVectorBodies) {
  for (RNNMode mode : {RNNMode::rnn_tanh, RNNMode::rnn_relu, RNNMode::lstm, RNNMode::gru}) {
    SCOPED_TRACE(seqpack::rnn_mode_name(mode));
    int wide_bi_2layer = 0, wide_128 = 0, wide_f64 = 0, wide_proj = 0, wide_mixed = 0;
    for (const RNNCase* c : cases_of(mode)) {
      const auto& o = c->options;
      if (o.hidden_size < 33) continue;
      const bool f32 = o.dtype == DType::f32;
      wide_bi_2layer += f32 && o.bidirectional && o.num_layers >= 2;
      wide_128 += f32 && o.hidden_size >= 128 && o.num_layers >= 2;
      wide_f64 += !f32;
      wide_proj += f32 && o.proj_size >= 33;
      wide_mixed += c->max_len() > *std::min_element(c->lengths.begin(), c->lengths.end());
    }
    EXPECT_GE(wide_bi_2layer, 1);
    EXPECT_GE(wide_128, 1);
    EXPECT_GE(wide_f64, 1);
    EXPECT_GE(wide_mixed, 2);
    if (mode == RNNMode::lstm) EXPECT_GE(wide_proj, 1);
  }
}

// A state dict moved from PyTorch loads unchanged and comes back identical.
TEST(RNNParity, StateDictRoundTripsPyTorchNames) {
  for (const RNNCase& c : cases()) {
    SCOPED_TRACE(c.name);
    auto m = make_module(c);
    const auto sd = m->state_dict();
    ASSERT_EQ(sd.size(), c.parameter_names.size());
    for (size_t k = 0; k < c.parameter_names.size(); ++k) {
      EXPECT_TRUE(all_close(sd.at(c.parameter_names[k]), c.weights[k], 0, 0, c.parameter_names[k]));
    }
  }
}

// RNNCell, LSTMCell and GRUCell against PyTorch: h, c and every gradient.
TEST(RNNParity, CellsMatchPyTorch) {
  for (const auto& c : seqpack::testing::load_rnn_cell_cases()) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<seqpack::RNNCellBase> cell;
    switch (c.mode) {
      case RNNMode::lstm:
        cell = std::make_unique<seqpack::LSTMCell>(c.input_size, c.hidden_size, c.bias, c.dtype);
        break;
      case RNNMode::gru:
        cell = std::make_unique<seqpack::GRUCell>(c.input_size, c.hidden_size, c.bias, c.dtype);
        break;
      default:
        cell = std::make_unique<seqpack::RNNCell>(c.input_size, c.hidden_size, c.bias,
                                                  c.mode == RNNMode::rnn_tanh ? "tanh" : "relu",
                                                  c.dtype);
    }
    EXPECT_EQ(cell->parameter_names(), c.parameter_names);
    std::map<std::string, Tensor> state;
    for (size_t k = 0; k < c.weights.size(); ++k) state[c.parameter_names[k]] = c.weights[k];
    cell->load_state_dict(state);
    const auto out = cell->forward(c.input, c.hx, c.cx);
    const int64_t n = seqpack::testing::rnn_reduction_length(c.input_size, c.hidden_size, 1,
                                                                 false, c.batch());
    EXPECT_TRUE(fp_close(out.h, c.h, n, c.dtype, c.name + " h"));
    if (c.mode == RNNMode::lstm) {
      EXPECT_TRUE(fp_close(out.c, c.c, n, c.dtype, c.name + " c"));
    } else {
      EXPECT_FALSE(out.c.defined()) << c.name;
    }
    const auto g = cell->backward(out, c.grad_h, c.grad_c);
    EXPECT_TRUE(fp_close(g.input, c.grads.at("input"), n, c.dtype, c.name + " grad input"));
    if (c.hx.defined()) EXPECT_TRUE(fp_close(g.h, c.grads.at("hx"), n, c.dtype, c.name + " grad hx"));
    if (c.cx.defined()) EXPECT_TRUE(fp_close(g.c, c.grads.at("cx"), n, c.dtype, c.name + " grad cx"));
    ASSERT_EQ(cell->grads().size(), c.parameter_names.size());
    for (size_t k = 0; k < c.parameter_names.size(); ++k) {
      EXPECT_TRUE(fp_close(cell->grads()[k], c.grads.at(c.parameter_names[k]), n, c.dtype,
                            c.name + " grad " + c.parameter_names[k]));
    }
  }
}

}  // namespace
