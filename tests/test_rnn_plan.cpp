// The model plan (rnn_make_plan, include/seqpack/rnn.h): a forward given one
// computes what a forward without one does (the plan only keeps what the
// forward would lay out for itself, so the bits are the same), and so does
// the backward of such a forward, which reads the plan too; it keeps one
// layout per thread split it meets, it states what its precision can do, and
// it refuses a forward of other options or other tensors, naming what
// differs. The modules, the cells and StreamingRNN keep a plan for their
// inference forwards and drop it wherever the weights may change. At fp32, so
// on every CPU (the backward at bf16 too where the CPU has it); int8's plan
// is tested in test_rnn_int8.cpp, bf16's forward through the modules in
// test_rnn_bf16.cpp's CPUs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "rnn/grid.h"
#include "seqpack/cpu_info.h"
#include "seqpack/packed_sequence.h"
#include "seqpack/precision.h"
#include "seqpack/rnn.h"
#include "seqpack/streaming.h"
#include "seqpack/threading.h"
#include "test_util.h"

namespace seqpack {
namespace {

using testing::random_tensor;

using testing::bitwise_equal;

struct Model {
  RNNOptions o;
  std::vector<Tensor> weights;
  PackingPlan plan;
  Tensor x, h0, c0;
};

Model model(RNNMode mode, bool bi, int64_t proj, DType dtype, uint64_t seed,
            const std::vector<int64_t>& lengths = {6, 0, 9, 3, 9}, int64_t input = 7,
            int64_t hidden = 40) {
  Model m;
  m.o = RNNOptions{.mode = mode,
                   .input_size = input,
                   .hidden_size = hidden,
                   .num_layers = 2,
                   .bidirectional = bi,
                   .proj_size = proj,
                   .dtype = dtype};
  std::mt19937_64 gen(seed);
  for (const Shape& s : rnn_parameter_shapes(m.o))
    m.weights.push_back(random_tensor(s, 0.3, gen).to(dtype));
  m.plan = PackingPlan::from_lengths(lengths, /*enforce_sorted=*/false);
  m.x = random_tensor({m.plan.total_rows(), m.o.input_size}, 1.0, gen).to(dtype);
  const int64_t LD = m.o.num_layers * m.o.num_directions();
  m.h0 = random_tensor({LD, m.plan.batch(), m.o.real_hidden_size()}, 0.5, gen).to(dtype);
  if (mode == RNNMode::lstm)
    m.c0 = random_tensor({LD, m.plan.batch(), m.o.hidden_size}, 0.5, gen).to(dtype);
  return m;
}

// With a plan, at 1 to 3 threads (each thread count its own split, each kept
// by the plan), and saving for a backward: the same bits as without one,
// gradients included.
TEST(RNNPlan, AForwardWithAPlanIsAForwardWithoutOne) {
  const int before = num_threads();
  for (const RNNMode mode : {RNNMode::lstm, RNNMode::gru, RNNMode::rnn_tanh}) {
    for (const DType dtype : {DType::f32, DType::f64}) {
      const int64_t proj = mode == RNNMode::lstm ? 24 : 0;
      SCOPED_TRACE(std::string(rnn_mode_name(mode)) + " " + dtype_name(dtype));
      const Model m = model(mode, /*bi=*/true, proj, dtype, 3);
      const auto plan =
          rnn_make_plan(m.o, m.weights, /*in_place=*/false, seqpack::testing::config());
      EXPECT_EQ(rnn_plan_info(*plan).splits_laid_out, 0);
      for (int threads : {1, 2, 3, 1}) {
        set_num_threads(threads);
        for (const bool save : {false, true}) {
          const auto a = rnn_forward(
              *rnn_make_plan(m.o, m.weights, /*in_place=*/true, seqpack::testing::config()), m.x,
              m.plan, m.h0, m.c0, false, save);
          const auto b = rnn_forward(*plan, m.x, m.plan, m.h0, m.c0, false, save, 0);
          EXPECT_TRUE(bitwise_equal(a.output, b.output)) << threads << " threads";
          EXPECT_TRUE(bitwise_equal(a.h_n, b.h_n)) << threads << " threads";
          EXPECT_TRUE(bitwise_equal(a.c_n, b.c_n)) << threads << " threads";
          if (!save) continue;
          const Tensor gy = Tensor::full(a.output.shape(), 0.5, dtype);
          const auto ga = rnn_backward(*a.saved, gy, Tensor(), Tensor());
          const auto gb = rnn_backward(*b.saved, gy, Tensor(), Tensor());
          for (std::size_t i = 0; i < ga.weights.size(); ++i)
            EXPECT_TRUE(bitwise_equal(ga.weights[i], gb.weights[i])) << "weight gradient " << i;
          EXPECT_TRUE(bitwise_equal(ga.input, gb.input));
        }
      }
      // One split a thread count here (the layers are small: one thread a
      // direction past 2 threads).
      EXPECT_GE(rnn_plan_info(*plan).splits_laid_out, 1);
    }
  }
  set_num_threads(before);
}

// A call of one step (a decoder's) reads W_hh and W_hr where they are the
// first time a plan meets one, laying out nothing (the layout would cost
// more than the step's products), and lays them out from the second on:
// the same bits each time, and as a call without a plan, forward (with h0
// and without: the zero-h0 skip needs W_hh's finiteness, checked in place
// too) and backward, on a column split and a row split.
TEST(RNNPlan, CallsOfOneStepReadTheWeightsInPlaceOnce) {
  const int before = num_threads();
  for (const rnn::SplitChoice choice : {rnn::SplitChoice::columns, rnn::SplitChoice::rows}) {
    // 16 units a thread and no work rule: two threads share a direction.
    RNNConfig config = testing::config();
    config.split = choice;
    config.step_units = 16;
    config.work_rule = false;
    for (const RNNMode mode : {RNNMode::lstm, RNNMode::gru, RNNMode::rnn_relu}) {
      const int64_t proj = mode == RNNMode::lstm ? 24 : 0;
      SCOPED_TRACE(std::string(rnn_mode_name(mode)) + " split " +
                   std::to_string(static_cast<int>(choice)));
      const Model m = model(mode, /*bi=*/true, proj, DType::f32, 51, {1, 0, 1, 1});
      for (const int threads : {1, 2}) {
        set_num_threads(threads);
        for (const bool with_h0 : {true, false}) {
          const Tensor h0 = with_h0 ? m.h0 : Tensor(), c0 = with_h0 ? m.c0 : Tensor();
          const auto plan = rnn_make_plan(m.o, m.weights, /*in_place=*/false, config);
          const auto want = rnn_forward(*rnn_make_plan(m.o, m.weights, /*in_place=*/true, config),
                                        m.x, m.plan, h0, c0, false, true);
          const Tensor gy = Tensor::full(want.output.shape(), 0.25, DType::f32);
          const Tensor gh = Tensor::full(want.h_n.shape(), -0.5, DType::f32);
          const auto gwant = rnn_backward(*want.saved, gy, gh, Tensor(), true);
          for (const int call : {1, 2, 3}) {
            SCOPED_TRACE("call " + std::to_string(call) + ", " + std::to_string(threads) +
                         " threads, h0 " + std::to_string(with_h0));
            const auto got = rnn_forward(*plan, m.x, m.plan, h0, c0, false, true, 0);
            EXPECT_TRUE(bitwise_equal(got.output, want.output));
            EXPECT_TRUE(bitwise_equal(got.h_n, want.h_n));
            EXPECT_TRUE(bitwise_equal(got.c_n, want.c_n));
            EXPECT_EQ(rnn_plan_info(*plan).splits_laid_out, call == 1 ? 0 : 1);
            const auto g = rnn_backward(*got.saved, gy, gh, Tensor(), true);
            for (std::size_t i = 0; i < g.weights.size(); ++i)
              EXPECT_TRUE(bitwise_equal(g.weights[i], gwant.weights[i])) << "weight gradient " << i;
            EXPECT_TRUE(bitwise_equal(g.input, gwant.input));
            EXPECT_TRUE(bitwise_equal(g.h0, gwant.h0));
            EXPECT_TRUE(bitwise_equal(g.c0, gwant.c0));
            EXPECT_EQ(rnn_plan_info(*plan).backward_splits_laid_out, call == 1 ? 0 : 1);
          }
        }
      }
    }
  }
  set_num_threads(before);
}

// At bf16, a call of one step and a few rows (a decoder's at batch 3)
// reads every weight where it is the first time a plan meets one, W_ih's
// products too, and the laid-out forms from the second call on: the same
// bits each call (on a CPU with AVX512-BF16 the few-row kernels,
// cpu/gemm_bf16_rows.h, read both), forward and backward, at 1 and 2
// threads; the outputs within bf16's bound (docs/performance.md, 0.03) of
// fp32's. Sizes where every product pays in bf16 (64 x 256 weights and up).
TEST(RNNPlan, Bf16CallsOfAFewRowsGiveTheSameBitsInPlaceAndLaidOut) {
  if (!testing::bf16_runs()) GTEST_SKIP() << testing::no_bf16_here();
  const int before = num_threads();
  for (const RNNMode mode : {RNNMode::lstm, RNNMode::gru, RNNMode::rnn_tanh}) {
    SCOPED_TRACE(rnn_mode_name(mode));
    Model m = model(mode, /*bi=*/true, /*proj=*/0, DType::f32, 71, {1, 0, 1, 1}, 64, 64);
    const auto fp32 =
        rnn_forward(*rnn_make_plan(m.o, m.weights, /*in_place=*/true, seqpack::testing::config()),
                    m.x, m.plan, m.h0, m.c0, false, false);
    m.o.precision = Precision::bf16;
    for (const int threads : {1, 2}) {
      set_num_threads(threads);
      const auto plan =
          rnn_make_plan(m.o, m.weights, /*in_place=*/false, seqpack::testing::config());
      RNNForwardResult first;
      RNNGradients gfirst;
      for (const int call : {1, 2, 3}) {
        SCOPED_TRACE("call " + std::to_string(call) + ", " + std::to_string(threads) + " threads");
        auto got = rnn_forward(*plan, m.x, m.plan, m.h0, m.c0, false, true, 0);
        EXPECT_EQ(rnn_plan_info(*plan).splits_laid_out, call == 1 ? 0 : 1);
        const Tensor gy = Tensor::full(got.output.shape(), 0.25, DType::f32);
        const Tensor gh = Tensor::full(got.h_n.shape(), -0.5, DType::f32);
        auto g = rnn_backward(*got.saved, gy, gh, Tensor(), true);
        EXPECT_EQ(rnn_plan_info(*plan).backward_splits_laid_out, call == 1 ? 0 : 1);
        if (call == 1) {
          const float* a = got.output.data<float>();
          const float* b = fp32.output.data<float>();
          for (int64_t i = 0; i < got.output.numel(); ++i)
            ASSERT_LE(std::abs(a[i] - b[i]), 0.03f)
                << "output " << i << ": " << a[i] << " at bf16, " << b[i] << " at fp32";
          first = std::move(got);
          gfirst = std::move(g);
          continue;
        }
        EXPECT_TRUE(bitwise_equal(got.output, first.output));
        EXPECT_TRUE(bitwise_equal(got.h_n, first.h_n));
        EXPECT_TRUE(bitwise_equal(got.c_n, first.c_n));
        for (std::size_t i = 0; i < g.weights.size(); ++i)
          EXPECT_TRUE(bitwise_equal(g.weights[i], gfirst.weights[i])) << "weight gradient " << i;
        EXPECT_TRUE(bitwise_equal(g.input, gfirst.input));
        EXPECT_TRUE(bitwise_equal(g.h0, gfirst.h0));
        EXPECT_TRUE(bitwise_equal(g.c0, gfirst.c0));
      }
    }
  }
  set_num_threads(before);
}

// A backward whose forward was given the plan reads its step operands (W_hh
// and W_hr as they are) through the plan: one layout per split its
// backwards meet, kept, and the same bits as a backward without a plan. At
// fp32 on a column split (min step units 16: two threads share a direction's
// 40 columns, at 2 and 3 threads) and on a row split (every thread its own
// sequences); at bf16, on a CPU with native bf16, on the engine's choice.
TEST(RNNPlan, ABackwardReadsThePlanOfItsForward) {
  const int before = num_threads();
  struct Case {
    Precision precision;
    rnn::SplitChoice split;
    int layouts;  // splits met at 1, 2, 3, 1, 2 threads (0: at least 2)
  };
  for (const Case& c : {Case{Precision::fp32, rnn::SplitChoice::columns, 2},
                        Case{Precision::fp32, rnn::SplitChoice::rows, 3},
                        Case{Precision::bf16, rnn::SplitChoice::engine, 0}}) {
    if (c.precision == Precision::bf16 && !testing::bf16_runs()) continue;
    RNNConfig config = testing::config();
    config.split = c.split;
    config.step_units = 16;
    config.work_rule = false;
    for (const RNNMode mode : {RNNMode::lstm, RNNMode::gru}) {
      const int64_t proj = mode == RNNMode::lstm ? 24 : 0;
      SCOPED_TRACE(std::string(rnn_mode_name(mode)) + " " + precision_name(c.precision) +
                   " split " + std::to_string(static_cast<int>(c.split)));
      Model m = model(mode, /*bi=*/false, proj, DType::f32, 31);
      m.o.precision = c.precision;
      const auto plan = rnn_make_plan(m.o, m.weights, /*in_place=*/false, config);
      set_num_threads(2);
      const auto unplanned = rnn_forward(*rnn_make_plan(m.o, m.weights, /*in_place=*/true, config),
                                         m.x, m.plan, m.h0, m.c0, false, true);
      const Tensor gy = Tensor::full(unplanned.output.shape(), 0.25, DType::f32);
      const Tensor gh = Tensor::full(unplanned.h_n.shape(), -0.5, DType::f32);
      rnn_backward(*unplanned.saved, gy, gh, Tensor());
      EXPECT_EQ(rnn_plan_info(*plan).backward_splits_laid_out, 0);
      for (const int threads : {1, 2, 3, 1, 2}) {
        set_num_threads(threads);
        const auto a = rnn_forward(*rnn_make_plan(m.o, m.weights, /*in_place=*/true, config), m.x,
                                   m.plan, m.h0, m.c0, false, true);
        const auto b = rnn_forward(*plan, m.x, m.plan, m.h0, m.c0, false, true, 0);
        const auto ga = rnn_backward(*a.saved, gy, gh, Tensor());
        const auto gb = rnn_backward(*b.saved, gy, gh, Tensor());
        for (std::size_t i = 0; i < ga.weights.size(); ++i)
          EXPECT_TRUE(bitwise_equal(ga.weights[i], gb.weights[i]))
              << "weight gradient " << i << ", " << threads << " threads";
        EXPECT_TRUE(bitwise_equal(ga.input, gb.input)) << threads << " threads";
        EXPECT_TRUE(bitwise_equal(ga.h0, gb.h0)) << threads << " threads";
        EXPECT_TRUE(bitwise_equal(ga.c0, gb.c0)) << threads << " threads";
      }
      // Columns: 1 and 2 threads (3 threads: still 2 a step); rows: 1, 2
      // and 3 threads.
      if (c.layouts > 0) {
        EXPECT_EQ(rnn_plan_info(*plan).backward_splits_laid_out, c.layouts);
      } else {
        EXPECT_GE(rnn_plan_info(*plan).backward_splits_laid_out, 2);
      }
    }
  }
  set_num_threads(before);
}

TEST(RNNPlan, InfoSaysWhatThePrecisionCanDo) {
  const Model m = model(RNNMode::lstm, false, 0, DType::f32, 4);
  const RNNPlanInfo info =
      rnn_plan_info(*rnn_make_plan(m.o, m.weights, /*in_place=*/false, seqpack::testing::config()));
  EXPECT_EQ(info.precision, Precision::fp32);
  EXPECT_TRUE(info.backward);
  EXPECT_FALSE(info.quantized);
}

// A kept plan computes with its own copy of the weights: the caller's
// tensors written after it was made change none of its results, and
// rnn_current_plan keeps it for equal values and options and makes a new one
// for others. What a forward can still get wrong is an input the plan's
// options do not take, refused naming it; a plan of wrong weights is refused
// when made.
TEST(RNNPlan, AKeptPlanHoldsItsValuesAndIsRefreshedByThem) {
  Model m = model(RNNMode::lstm, true, 0, DType::f32, 5);
  const auto plan = rnn_make_plan(m.o, m.weights, /*in_place=*/false, seqpack::testing::config());
  const auto in_place = [&](const std::vector<Tensor>& w) {
    return rnn_forward(*rnn_make_plan(m.o, w, /*in_place=*/true, seqpack::testing::config()), m.x,
                       m.plan, {}, {}, false, false)
        .output;
  };
  const Tensor want = in_place(m.weights);
  EXPECT_TRUE(bitwise_equal(rnn_forward(*plan, m.x, m.plan, {}, {}, false, false).output, want));
  // Other tensors holding the same values keep the plan (compared byte for
  // byte); one value changed anywhere makes a new one.
  std::vector<Tensor> copies;
  for (const Tensor& w : m.weights) copies.push_back(w.clone());
  EXPECT_EQ(rnn_current_plan(plan, m.o, copies, seqpack::testing::config()), plan);
  copies[1].data<float>()[copies[1].numel() - 1] += 1.f;
  EXPECT_NE(rnn_current_plan(plan, m.o, copies, seqpack::testing::config()), plan);
  // The caller's own tensors, written after the plan was made: the plan
  // computes as before; the refreshed one with the new values.
  m.weights[0].data<float>()[0] += 1.f;
  EXPECT_TRUE(bitwise_equal(rnn_forward(*plan, m.x, m.plan, {}, {}, false, false).output, want));
  const auto fresh = rnn_current_plan(plan, m.o, m.weights, seqpack::testing::config());
  ASSERT_NE(fresh, plan);
  EXPECT_TRUE(bitwise_equal(rnn_forward(*fresh, m.x, m.plan, {}, {}, false, false).output,
                            in_place(m.weights)));
  // Other options (the forward runs with the plan's): a new plan. Another
  // config: a new plan, made with it, and kept for it.
  RNNOptions dropped = m.o;
  dropped.dropout = 0.5;
  EXPECT_NE(rnn_current_plan(fresh, dropped, m.weights, seqpack::testing::config()), fresh);
  RNNConfig rows = testing::config();
  rows.split = RNNConfig::Split::rows;
  rows.step_rows = 2;
  const auto by_rows = rnn_current_plan(fresh, m.o, m.weights, rows);
  ASSERT_NE(by_rows, fresh);
  EXPECT_EQ(rnn_plan_config(*by_rows), rows);
  EXPECT_EQ(rnn_current_plan(by_rows, m.o, m.weights, rows), by_rows);
  // An in-place plan keeps nothing to reuse: a holder gets a kept one. It
  // reads the caller's tensors as they are at each call.
  const auto in_place_plan =
      rnn_make_plan(m.o, m.weights, /*in_place=*/true, seqpack::testing::config());
  EXPECT_NE(rnn_current_plan(in_place_plan, m.o, m.weights, seqpack::testing::config()),
            in_place_plan);
  const Tensor before = rnn_forward(*in_place_plan, m.x, m.plan, {}, {}, false, false).output;
  m.weights[1].data<float>()[0] += 1.f;
  const Tensor after = rnn_forward(*in_place_plan, m.x, m.plan, {}, {}, false, false).output;
  EXPECT_FALSE(bitwise_equal(before, after));
  EXPECT_TRUE(bitwise_equal(after, in_place(m.weights)));
  std::mt19937_64 gen(6);
  const Tensor wide = random_tensor({m.plan.total_rows(), m.o.input_size + 1}, 1.0, gen);
  try {
    rnn_forward(*plan, wide, m.plan, {}, {}, false, false);
    ADD_FAILURE() << "an input of input_size + 1 features was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("expected input_size = " + std::to_string(m.o.input_size)),
              std::string::npos)
        << e.what();
  }
  std::vector<Tensor> wrong = m.weights;
  wrong.pop_back();
  EXPECT_THROW(rnn_make_plan(m.o, wrong, /*in_place=*/false, seqpack::testing::config()),
               std::invalid_argument);
  EXPECT_THROW(rnn_make_plan(m.o, wrong, /*in_place=*/true, seqpack::testing::config()),
               std::invalid_argument);
}

// A module's inference forwards use its plan; a change through parameters()
// or through a tensor taken before is seen by the next one, as after
// load_state_dict; a training forward drops it too.
TEST(RNNPlan, ModulesDropTheirPlanWhereTheWeightsMayChange) {
  LSTM lstm({.input_size = 5, .hidden_size = 16, .num_layers = 2}, 11);
  lstm.set_config(testing::config());
  lstm.eval();
  std::mt19937_64 gen(12);
  const Tensor x = random_tensor({4, 3, 5}, 1.0, gen);
  auto functional = [&] {
    const PackingPlan p = PackingPlan::from_lengths({4, 4, 4}, true);
    return rnn_forward(*rnn_make_plan(lstm.options(), std::as_const(lstm).parameters(),
                                      /*in_place=*/true, seqpack::testing::config()),
                       p.pack(x), p, {}, {}, false, false)
        .h_n;
  };
  const RNNOutput y1 = lstm.forward(x, {}, {}, /*requires_grad=*/false);
  EXPECT_TRUE(bitwise_equal(y1.h_n, functional()));
  // Through parameters(): the next forward sees it.
  Tensor& whh = lstm.parameters()[1];
  for (int64_t i = 0; i < whh.numel(); ++i) whh.data<float>()[i] *= -1.f;
  const RNNOutput y2 = lstm.forward(x, {}, {}, false);
  EXPECT_FALSE(bitwise_equal(y2.h_n, y1.h_n));
  EXPECT_TRUE(bitwise_equal(y2.h_n, functional()));
  // Through a tensor taken before the plan was made: seen after replan().
  Tensor held = lstm.parameter("weight_hh_l1");
  (void)lstm.forward(x, {}, {}, false);  // the plan, made from the current values
  for (int64_t i = 0; i < held.numel(); ++i) held.data<float>()[i] *= 0.5f;
  // Seen with no replan(): the plan is compared with the values at each forward.
  EXPECT_TRUE(bitwise_equal(lstm.forward(x, {}, {}, false).h_n, functional()));
  // load_state_dict.
  LSTM other({.input_size = 5, .hidden_size = 16, .num_layers = 2}, 13);
  lstm.load_state_dict(other.state_dict());
  EXPECT_TRUE(bitwise_equal(lstm.forward(x, {}, {}, false).h_n, functional()));
  // A forward that saves for a backward drops it (an optimizer step may follow).
  (void)lstm.forward(x, {}, {}, /*requires_grad=*/true);
  for (int64_t i = 0; i < held.numel(); ++i) held.data<float>()[i] *= 0.5f;
  EXPECT_TRUE(bitwise_equal(lstm.forward(x, {}, {}, false).h_n, functional()));
}

// Inference forwards on several threads at once share the module's plan
// (made once, under its lock), while another thread drops it again and
// again: every result is the functional forward's.
TEST(RNNPlan, ConcurrentInferenceForwardsShareThePlan) {
  GRU gru({.input_size = 5, .hidden_size = 24, .num_layers = 2}, 17);
  gru.set_config(testing::config());
  gru.eval();
  std::mt19937_64 gen(18);
  const Tensor x = random_tensor({7, 2, 5}, 1.0, gen);
  const PackingPlan p = PackingPlan::from_lengths({7, 7}, true);
  const Tensor want = rnn_forward(*rnn_make_plan(gru.options(), std::as_const(gru).parameters(),
                                                 /*in_place=*/true, seqpack::testing::config()),
                                  p.pack(x), p, {}, {}, false, false)
                          .h_n;
  std::vector<int> wrong(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i)
        if (!bitwise_equal(gru.forward(x, {}, {}, false).h_n, want)) ++wrong[static_cast<std::size_t>(t)];
    });
  }
  threads.emplace_back([&] {
    for (int i = 0; i < 25; ++i) gru.replan();
  });
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(wrong[static_cast<std::size_t>(t)], 0) << "thread " << t;
}

// Backwards on several threads at once through one plan, each thread's
// first one asking for the plan's backward layouts at the same time: every
// gradient is the one of a backward without the plan, and the plan holds one
// layout for the split they share.
TEST(RNNPlan, ConcurrentBackwardsShareThePlan) {
  const int before = num_threads();
  set_num_threads(1);  // each std::thread's forwards and backwards on itself alone
  const Model m = model(RNNMode::lstm, /*bi=*/true, 0, DType::f32, 41);
  const auto want_fwd =
      rnn_forward(*rnn_make_plan(m.o, m.weights, /*in_place=*/true, seqpack::testing::config()),
                  m.x, m.plan, m.h0, m.c0, false, true);
  const Tensor gy = Tensor::full(want_fwd.output.shape(), 0.25, DType::f32);
  const auto want = rnn_backward(*want_fwd.saved, gy, Tensor(), Tensor());
  const auto plan = rnn_make_plan(m.o, m.weights, /*in_place=*/false, seqpack::testing::config());
  std::vector<int> wrong(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        const auto f = rnn_forward(*plan, m.x, m.plan, m.h0, m.c0, false, true, 0);
        const auto g = rnn_backward(*f.saved, gy, Tensor(), Tensor());
        bool same = bitwise_equal(g.input, want.input) && bitwise_equal(g.h0, want.h0);
        for (std::size_t w = 0; w < g.weights.size(); ++w)
          same = same && bitwise_equal(g.weights[w], want.weights[w]);
        if (!same) ++wrong[static_cast<std::size_t>(t)];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(wrong[static_cast<std::size_t>(t)], 0) << "thread " << t;
  EXPECT_EQ(rnn_plan_info(*plan).backward_splits_laid_out, 1);
  set_num_threads(before);
}

// A cell's steps without requires_grad (a decoding loop) through its plan:
// the values of the cell's own forward, and a change seen after replan().
// (A cell's fp32 inference steps read the weights in place: the same bits.)
TEST(RNNPlan, CellsKeepAPlanForTheirInferenceSteps) {
  GRUCell cell(6, 12, true, DType::f32, 21);
  cell.set_config(testing::config());
  std::mt19937_64 gen(22);
  const Tensor x = random_tensor({3, 6}, 1.0, gen), h = random_tensor({3, 12}, 0.5, gen);
  const CellOutput a = cell.forward(x, h, {}, /*requires_grad=*/true);
  const CellOutput b = cell.forward(x, h, {}, false);
  const CellOutput c = cell.forward(x, h, {}, false);
  EXPECT_TRUE(bitwise_equal(a.h, b.h));
  EXPECT_TRUE(bitwise_equal(b.h, c.h));
  Tensor& w = cell.parameters()[1];
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] *= -1.f;
  const CellOutput d = cell.forward(x, h, {}, false);
  EXPECT_FALSE(bitwise_equal(d.h, c.h));
  EXPECT_TRUE(bitwise_equal(d.h, cell.forward(x, h, {}, true).h));
}

// StreamingRNN at fp32: pushes read W_hh through the plan made at
// construction; a change to the shared weights is seen by the next push.
TEST(RNNPlan, StreamingSeesAChangeOfItsWeights) {
  RNNOptions o{.mode = RNNMode::lstm, .input_size = 4, .hidden_size = 10, .num_layers = 2};
  std::mt19937_64 gen(31);
  std::vector<Tensor> weights;
  for (const Shape& s : rnn_parameter_shapes(o)) weights.push_back(random_tensor(s, 0.3, gen));
  const Tensor x = random_tensor({6, 4}, 1.0, gen);
  const PackingPlan p = PackingPlan::from_lengths({6}, true);
  // A push gathers the streams' states as h0/c0 (zeros here): the forward it
  // is compared with takes them too, so both run the same products.
  const Tensor h0 = Tensor::zeros({2, 1, 10}, DType::f32), c0 = Tensor::zeros({2, 1, 10}, DType::f32);
  StreamingRNN streams(o, weights, testing::config());
  const Tensor first = streams.push({streams.open()}, {x})[0].clone();
  EXPECT_TRUE(bitwise_equal(
      first, rnn_forward(*rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()),
                         x, p, h0, c0, false, false)
                 .output));
  for (Tensor& w : weights)
    if (w.dim() == 2)
      for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] *= 0.5f;
  // Seen with no replan(): each push compares the plan with the weights.
  const Tensor after = streams.push({streams.open()}, {x})[0].clone();
  EXPECT_TRUE(bitwise_equal(
      after, rnn_forward(*rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()),
                         x, p, h0, c0, false, false)
                 .output));
}

}  // namespace
}  // namespace seqpack
