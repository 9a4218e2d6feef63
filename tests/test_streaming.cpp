// StreamingRNN: random schedules (streams opening mid-flight, chunks of random
// lengths including 0, random interleaving) give the outputs and final state of
// one forward over each whole sequence: within 1e-6 in float32, bit for bit in
// float64; the float64 path is also checked against the plain reference.
// Bad ids, shapes, dtypes and models are errors that leave every state as it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "reference/rnn_reference.h"
#include "seqpack/packed_sequence.h"
#include "seqpack/rnn.h"
#include "seqpack/streaming.h"
#include "test_util.h"

namespace {

using namespace seqpack;
using seqpack::testing::all_close;
using seqpack::testing::bitwise_equal;
using seqpack::testing::random_tensor;
using seqpack::testing::expect_invalid;

// Rows [start, stop) of a 2-D tensor, as its own tensor.
Tensor rows(const Tensor& t, int64_t start, int64_t stop) { return t.slice0(start, stop).clone(); }

// Concatenates 2-D tensors along dim 0.
Tensor concat(const std::vector<Tensor>& parts, int64_t width, DType dtype) {
  int64_t n = 0;
  for (const auto& p : parts) n += p.size(0);
  Tensor out = Tensor::empty({n, width}, dtype);
  int64_t at = 0;
  for (const auto& p : parts) {
    if (p.size(0) > 0) out.slice0(at, at + p.size(0)).copy_from(p);
    at += p.size(0);
  }
  return out;
}

struct Case {
  RNNMode mode;
  int64_t layers;
  int64_t proj;
  DType dtype;
};

std::string case_name(const Case& c) {
  return std::string(rnn_mode_name(c.mode)) + " layers=" + std::to_string(c.layers) +
         " proj=" + std::to_string(c.proj) + " " + dtype_name(c.dtype);
}

// One random schedule for `c`: every sequence fed in random chunks, streams
// opened at random times, some with a given initial state, each push a random
// subset of the open streams. Checks the contract against one forward per
// whole sequence.
void run_schedule(const Case& c, uint64_t seed) {
  SCOPED_TRACE(case_name(c) + ", schedule seed " + std::to_string(seed) +
               " (derived from the printed test seed; replay with SEQPACK_TEST_SEED=<test seed>)");
  std::mt19937_64 rng(seed);
  RNNOptions o;
  o.mode = c.mode;
  o.input_size = 3;
  o.hidden_size = 5;  // not a multiple of any SIMD width
  o.num_layers = c.layers;
  o.proj_size = c.proj;
  o.dtype = c.dtype;
  RNNBase model(o, seed);
  model.eval();
  StreamingRNN streams(model);
  const bool lstm = c.mode == RNNMode::lstm;
  const int64_t H = o.real_hidden_size();

  const int n_seq = 9;
  std::vector<Tensor> seqs, h0s, c0s;
  for (int s = 0; s < n_seq; ++s) {
    const int64_t len = std::uniform_int_distribution<int64_t>(0, 17)(rng);
    seqs.push_back(random_tensor({len, o.input_size}, c.dtype, rng));
    const bool given = rng() % 3 == 0;
    h0s.push_back(given ? random_tensor({c.layers, H}, c.dtype, rng) : Tensor());
    c0s.push_back(given && lstm ? random_tensor({c.layers, o.hidden_size}, c.dtype, rng)
                                : Tensor());
  }

  // Schedule: sequence s is opened at a random push; each push feeds a random
  // subset of the open, unfinished streams a random piece (0..remaining).
  std::vector<int64_t> id(n_seq, -1), fed(n_seq, 0);
  std::vector<std::vector<Tensor>> outs(n_seq);
  int next_to_open = 0, pushes = 0;
  auto finished = [&] {
    for (int s = 0; s < n_seq; ++s) {
      if (id[s] < 0 || fed[s] < seqs[s].size(0)) return false;
    }
    return true;
  };
  while (!finished()) {
    ASSERT_LT(++pushes, 1000);
    if (next_to_open < n_seq && (rng() % 2 == 0 || next_to_open == 0)) {
      id[next_to_open] = streams.open(h0s[next_to_open], c0s[next_to_open]);
      ++next_to_open;
      if (next_to_open < n_seq && rng() % 2) continue;
    }
    std::vector<int64_t> ids;
    std::vector<Tensor> chunks;
    std::vector<int> which;
    for (int s = 0; s < next_to_open; ++s) {
      const int64_t left = seqs[s].size(0) - fed[s];
      if (rng() % 3 == 0) continue;  // not ready this time
      if (left == 0 && rng() % 2) continue;
      const int64_t n = left == 0 ? 0 : std::uniform_int_distribution<int64_t>(0, left)(rng);
      ids.push_back(id[s]);
      chunks.push_back(rows(seqs[s], fed[s], fed[s] + n));
      which.push_back(s);
      fed[s] += n;
    }
    // A random order of the streams inside the push.
    std::vector<size_t> perm(ids.size());
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int64_t> p_ids;
    std::vector<Tensor> p_chunks;
    for (size_t i : perm) {
      p_ids.push_back(ids[i]);
      p_chunks.push_back(chunks[i]);
    }
    const std::vector<Tensor> y = streams.push(p_ids, p_chunks);
    ASSERT_EQ(y.size(), p_ids.size());
    for (size_t k = 0; k < perm.size(); ++k) {
      ASSERT_EQ(y[k].shape(), (Shape{p_chunks[k].size(0), H}));
      outs[which[perm[k]]].push_back(y[k]);
    }
  }

  for (int s = 0; s < n_seq; ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s) + " of length " + std::to_string(seqs[s].size(0)) +
                 " in " + std::to_string(outs[s].size()) + " chunks");
    // One forward over the whole sequence, batch of one.
    const int64_t len = seqs[s].size(0);
    const PackingPlan plan = PackingPlan::from_lengths({len}, /*enforce_sorted=*/true);
    const Tensor h0 = h0s[s].defined() ? h0s[s].view({c.layers, 1, H}) : Tensor();
    const Tensor c0 = c0s[s].defined() ? c0s[s].view({c.layers, 1, o.hidden_size}) : Tensor();
    const RNNForwardResult whole = rnn_forward(
        *rnn_make_plan(o, model.parameters(), /*in_place=*/true, seqpack::testing::config()),
        seqs[s], plan, h0, c0, false, false);
    const Tensor streamed = concat(outs[s], H, c.dtype);
    const StreamState st = streams.state(id[s]);
    const Tensor whole_h = whole.h_n.view({c.layers, H});
    if (c.dtype == DType::f64) {
      EXPECT_TRUE(bitwise_equal(streamed, whole.output))
          << all_close(streamed, whole.output, 0, 0, "output");
      EXPECT_TRUE(bitwise_equal(st.h, whole_h)) << all_close(st.h, whole_h, 0, 0, "h");
      if (lstm) {
        const Tensor whole_c = whole.c_n.view({c.layers, o.hidden_size});
        EXPECT_TRUE(bitwise_equal(st.c, whole_c)) << all_close(st.c, whole_c, 0, 0, "c");
      }
      // And the plain reference agrees, so the whole forward is not wrong itself.
      const RNNReferenceResult ref =
          rnn_reference_forward(o, model.parameters(), {seqs[s]}, h0, c0);
      EXPECT_TRUE(all_close(streamed, ref.outputs[0], 1e-12, 1e-12, "reference output"));
    } else {
      EXPECT_TRUE(all_close(streamed, whole.output, 1e-6, 1e-6, "output"));
      EXPECT_TRUE(all_close(st.h, whole_h, 1e-6, 1e-6, "h"));
      if (lstm) {
        EXPECT_TRUE(all_close(st.c, whole.c_n.view({c.layers, o.hidden_size}), 1e-6, 1e-6, "c"));
      }
    }
  }
}

TEST(Streaming, RandomSchedulesMatchOneForwardOverTheWholeSequence) {
  const uint64_t seed = seqpack::testing::test_seed();
  std::printf("Streaming seed: %llu\n", static_cast<unsigned long long>(seed));
  const std::vector<Case> cases = {
      {RNNMode::lstm, 1, 0, DType::f32},     {RNNMode::lstm, 2, 0, DType::f64},
      {RNNMode::lstm, 3, 0, DType::f32},     {RNNMode::lstm, 2, 2, DType::f32},
      {RNNMode::lstm, 2, 2, DType::f64},     {RNNMode::gru, 1, 0, DType::f64},
      {RNNMode::gru, 2, 0, DType::f32},      {RNNMode::rnn_tanh, 2, 0, DType::f32},
      {RNNMode::rnn_tanh, 1, 0, DType::f64}, {RNNMode::rnn_relu, 3, 0, DType::f64},
      {RNNMode::rnn_relu, 2, 0, DType::f32},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    for (uint64_t k = 0; k < 4; ++k) run_schedule(cases[i], seed + 1000 * i + k);
  }
}

TEST(Streaming, ChunksOfOneStepAndOneWholeChunkAgree) {
  RNNOptions o{.mode = RNNMode::gru, .input_size = 2, .hidden_size = 4, .dtype = DType::f64};
  GRU gru(o, 3);
  std::mt19937_64 rng(11);
  const Tensor x = random_tensor({6, 2}, DType::f64, rng);
  StreamingRNN s(gru);
  const int64_t a = s.open(), b = s.open();
  std::vector<Tensor> steps;
  for (int64_t t = 0; t < 6; ++t) steps.push_back(s.push({a}, {rows(x, t, t + 1)})[0]);
  const Tensor whole = s.push({b}, {x})[0];
  EXPECT_TRUE(bitwise_equal(concat(steps, 4, DType::f64), whole));
  EXPECT_TRUE(bitwise_equal(s.state(a).h, s.state(b).h));
  EXPECT_FALSE(s.state(a).c.defined());
}

TEST(Streaming, ResetAndCloseAndIds) {
  LSTM lstm({.input_size = 2, .hidden_size = 3, .num_layers = 2}, 5);
  StreamingRNN s(lstm);
  std::mt19937_64 rng(1);
  const Tensor x = random_tensor({4, 2}, DType::f32, rng);
  const int64_t a = s.open(), b = s.open();
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  const Tensor first = s.push({a}, {x})[0];
  s.reset(a);
  EXPECT_TRUE(bitwise_equal(s.push({a}, {x})[0], first));  // as if just opened
  const Tensor h0 = random_tensor({2, 3}, DType::f32, rng),
               c0 = random_tensor({2, 3}, DType::f32, rng);
  s.reset(a, h0, c0);
  EXPECT_TRUE(bitwise_equal(s.state(a).h, h0));
  EXPECT_TRUE(bitwise_equal(s.state(a).c, c0));
  s.close(a);
  EXPECT_FALSE(s.is_open(a));
  EXPECT_EQ(s.open_ids(), (std::vector<int64_t>{b}));
  EXPECT_EQ(s.open(), 2);  // ids are never reused
  EXPECT_EQ(s.num_open(), 2);
  // An empty push and an all-empty push run nothing and change nothing.
  EXPECT_TRUE(s.push({}, {}).empty());
  const Tensor hb = s.state(b).h;
  const auto y = s.push({b}, {Tensor::zeros({0, 2})});
  EXPECT_EQ(y[0].shape(), (Shape{0, 3}));
  EXPECT_TRUE(bitwise_equal(s.state(b).h, hb));
}

TEST(Streaming, BadInputIsAnErrorAndChangesNoState) {
  LSTM lstm({.input_size = 2, .hidden_size = 3}, 5);
  StreamingRNN s(lstm);
  const int64_t a = s.open(), b = s.open(), c = s.open();
  s.close(c);
  const Tensor ok = Tensor::full({2, 2}, 0.5);
  s.push({a, b}, {ok, ok});
  const Tensor ha = s.state(a).h, hb = s.state(b).h;
  expect_invalid(
      [&] {
        s.push({a, 7}, {ok, ok});
      },
      {"stream_ids[1] = 7", "no stream 7 was opened", "ids 0..2"});
  expect_invalid([&] { s.push({a, c}, {ok, ok}); }, {"stream_ids[1] = 2", "stream 2 was closed"});
  expect_invalid([&] { s.push({a, -1}, {ok, ok}); }, {"stream_ids[1] = -1"});
  expect_invalid(
      [&] {
        s.push({b, a, b}, {ok, ok, ok});
      },
      {"stream_ids[2] = 1 repeats stream_ids[0]"});
  expect_invalid(
      [&] {
        s.push({a, b}, {ok, Tensor::zeros({2, 5})});
      },
      {"chunks[1] has shape [2, 5]", "input_size = 2"});
  expect_invalid([&] { s.push({a}, {Tensor::zeros({2})}); }, {"chunks[0] has shape [2]"});
  expect_invalid(
      [&] {
        s.push({a}, {Tensor::zeros({2, 2}, DType::f64)});
      },
      {"chunks[0] has dtype float64", "float32"});
  expect_invalid([&] { s.push({a, b}, {ok}); }, {"2 stream ids for 1 chunks"});
  EXPECT_TRUE(bitwise_equal(s.state(a).h, ha));  // nothing ran
  EXPECT_TRUE(bitwise_equal(s.state(b).h, hb));
  expect_invalid([&] { s.reset(c); }, {"stream 2 was closed"});
  expect_invalid([&] { s.close(c); }, {"stream 2 was closed"});
  expect_invalid([&] { s.state(9); }, {"no stream 9"});
  expect_invalid(
      [&] {
        s.open(Tensor::zeros({2, 3}));
      },
      {"h0 is float32 [2, 3]", "expected float32 [1, 3]"});
  expect_invalid(
      [&] {
        s.reset(a, Tensor::zeros({1, 3}), Tensor::zeros({1, 4}));
      },
      {"c0", "[1, 4]"});

  GRU gru({.input_size = 2, .hidden_size = 3});
  StreamingRNN g(gru);
  expect_invalid(
      [&] {
        g.open(Tensor::zeros({1, 3}), Tensor::zeros({1, 3}));
      },
      {"c0 given to a gru"});

  LSTM bi({.input_size = 2, .hidden_size = 3, .bidirectional = true});
  expect_invalid([&] { StreamingRNN x(bi); }, {"bidirectional"});
  RNNOptions o{.mode = RNNMode::gru, .input_size = 2, .hidden_size = 3};
  expect_invalid([&] { StreamingRNN x(o, {}); }, {"0 weights given", "4 parameters"});
  std::vector<Tensor> w = gru.parameters();
  w[1] = Tensor::zeros({9, 4});
  expect_invalid([&] { StreamingRNN x(o, w); }, {"weight_hh_l0 has shape [9, 4]", "[9, 3]"});
  w = gru.parameters();
  w[0] = w[0].to(DType::f64);
  expect_invalid([&] { StreamingRNN x(o, w); }, {"weight_ih_l0 has dtype float64"});
}

TEST(Streaming, SharesTheModulesParameters) {
  RNN rnn({.mode = RNNMode::rnn_tanh, .input_size = 1, .hidden_size = 2}, 0);
  StreamingRNN s(rnn);
  const int64_t a = s.open();
  for (Tensor& p : rnn.parameters()) p.fill(0.0);
  // All weights and biases zero: every output is tanh(0) = 0.
  const Tensor y = s.push({a}, {Tensor::full({3, 1}, 1.0)})[0];
  for (int64_t i = 0; i < y.numel(); ++i) EXPECT_EQ(y.item_as_double(i), 0.0);
}

}  // namespace
