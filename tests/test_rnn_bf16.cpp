// bf16 mixed precision of the recurrent core against the float64 reference:
// every cell, 1-2 layers, both directions, proj_size, hidden sizes across SIMD
// widths, zero-length sequences and a 1000-step sequence. The bounds checked
// here are the ones docs/performance.md documents:
//   outputs, h_n, c_n      |bf16 - reference| <= kForwardAbs
//   every gradient         cosine similarity with the reference >= kGradCosine
//                          and ||bf16 - reference|| <= kGradRel * ||reference||;
//                          ReLU RNNs: kGradCosineRelu and kGradRelRelu, since a
//                          pre-activation that bf16 moves across 0 flips relu's
//                          derivative for that unit and step
// The worst values seen are printed. Skipped on a CPU without native bf16 (the
// refusal there is test_precision's).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "forward_check.h"
#include "reference/rnn_reference.h"
#include "seqpack/classifier.h"
#include "seqpack/loss.h"
#include "seqpack/optim.h"
#include "seqpack/packed_sequence.h"
#include "seqpack/precision.h"
#include "seqpack/rnn.h"
#include "seqpack/threading.h"
#include "test_util.h"

namespace seqpack {
namespace {

constexpr double kForwardAbs = 0.03;
constexpr double kGradCosine = 0.999;
constexpr double kGradRel = 0.05;
constexpr double kGradCosineRelu = 0.97;
constexpr double kGradRelRelu = 0.25;

#define SKIP_WITHOUT_BF16()                                                        \
  if (!testing::bf16_runs()) GTEST_SKIP() << testing::no_bf16_here()

using testing::gather_rows;
using testing::max_abs_diff;
using testing::random_tensor;
using testing::rows_of;

struct Agreement {
  double cosine = 1, rel = 0;
};
Agreement agreement(const Tensor& got, const Tensor& ref) {
  double dot = 0, gg = 0, rr = 0, dd = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double g = got.item_as_double(i), r = ref.item_as_double(i);
    dot += g * r;
    gg += g * g;
    rr += r * r;
    dd += (g - r) * (g - r);
  }
  if (rr == 0 && gg == 0) return {};
  return {dot / std::sqrt(gg * rr), std::sqrt(dd / rr)};
}

struct Worst {
  double forward = 0, cosine = 1, rel = 0;
  std::string forward_at, cosine_at;
};

void check_config(const RNNOptions& base, const std::vector<int64_t>& lengths, bool give_h0,
                  uint64_t seed, Worst& worst) {
  RNNOptions o = base;
  o.precision = Precision::bf16;
  std::mt19937_64 gen(seed);
  const testing::RnnCase rc = testing::random_rnn_case(o, lengths, give_h0, seed, gen);
  const std::string& what = rc.name;
  SCOPED_TRACE(what);
  const PackingPlan& plan = rc.plan;
  const std::vector<Tensor>& weights = rc.weights;
  const Tensor &x = rc.x, &h0 = rc.h0, &c0 = rc.c0;
  const int64_t B = plan.batch(), LD = o.num_layers * o.num_directions();
  const auto fwd = rnn_forward(
      *rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()), x, plan, h0, c0,
      /*training=*/false, true);
  {  // without saving (other state buffers, the same bf16 rows): the same bits
    const auto unsaved = rnn_forward(
        *rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()), x, plan, h0, c0,
        /*training=*/false, false);
    EXPECT_EQ(std::memcmp(unsaved.output.raw_data(), fwd.output.raw_data(),
                          static_cast<std::size_t>(fwd.output.numel()) * sizeof(float)),
              0);
    EXPECT_EQ(std::memcmp(unsaved.h_n.raw_data(), fwd.h_n.raw_data(),
                          static_cast<std::size_t>(fwd.h_n.numel()) * sizeof(float)),
              0);
  }

  const Tensor gy = random_tensor({plan.total_rows(), o.output_size()}, 1.0, gen);
  const Tensor gh = random_tensor({LD, B, o.real_hidden_size()}, 1.0, gen);
  const testing::CaseSequences cs = testing::case_sequences(rc);
  const std::vector<std::vector<int64_t>>& rows = cs.rows;
  const std::vector<Tensor>& seqs = cs.inputs;
  std::vector<Tensor> gy_rows;
  for (const auto& r : rows) gy_rows.push_back(gather_rows(gy, r));
  testing::WorstForward w{worst.forward, worst.forward_at};
  testing::check_forward_against_reference(o, rc, cs, fwd, kForwardAbs, w);
  worst.forward = w.value;
  worst.forward_at = w.at;

  const auto g = rnn_backward(*fwd.saved, gy, gh, {});
  const auto rg =
      reference::rnn_reference_backward(o, weights, seqs, h0, c0, gy_rows, gh, Tensor());
  auto note_grad = [&](const Tensor& got, const Tensor& want, const std::string& name) {
    const Agreement a = agreement(got, want);
    const bool relu = o.mode == RNNMode::rnn_relu;
    EXPECT_GE(a.cosine, relu ? kGradCosineRelu : kGradCosine) << name;
    EXPECT_LE(a.rel, relu ? kGradRelRelu : kGradRel) << name;
    if (!(a.cosine >= worst.cosine)) {
      worst.cosine = a.cosine;
      worst.cosine_at = what + " " + name;
    }
    if (!(a.rel <= worst.rel)) worst.rel = a.rel;
  };
  Tensor gin = Tensor::empty({0, o.input_size}, DType::f64);
  for (int64_t b = 0; b < B; ++b)
    note_grad(gather_rows(g.input, rows[std::size_t(b)]), rg.inputs[std::size_t(b)],
              "grad input " + std::to_string(b));
  note_grad(g.h0, rg.h0, "grad h0");
  const auto names = rnn_parameter_names(o);
  for (std::size_t k = 0; k < names.size(); ++k)
    note_grad(g.weights[k], rg.weights[k], "grad " + names[k]);
}

TEST(RNNBf16, ParityGridAgainstFloat64Reference) {
  SKIP_WITHOUT_BF16();
  Worst worst, worst_relu;
  uint64_t seed = 1000;
  const std::vector<int64_t> lengths{12, 0, 9, 15, 3, 11, 1, 15};
  for (RNNMode mode : {RNNMode::lstm, RNNMode::gru, RNNMode::rnn_tanh, RNNMode::rnn_relu}) {
    for (int64_t layers : {1, 2}) {
      for (bool bi : {false, true}) {
        for (int64_t H : {37, 130}) {
          RNNOptions o{.mode = mode, .input_size = 29, .hidden_size = H, .num_layers = layers,
                       .bidirectional = bi};
          check_config(o, lengths, /*give_h0=*/(seed % 2) == 0, ++seed,
                       mode == RNNMode::rnn_relu ? worst_relu : worst);
          if (mode == RNNMode::lstm) {
            o.proj_size = H / 3;
            check_config(o, lengths, /*give_h0=*/true, ++seed, worst);
          }
        }
      }
    }
  }
  for (const Worst* w : {&worst, &worst_relu}) {
    std::printf("bf16 parity grid, %s: worst |forward error| %.4g (%s); worst gradient cosine "
                "%.6f (%s); worst relative gradient error %.4g\n",
                w == &worst ? "LSTM, GRU, RNN tanh" : "RNN relu", w->forward,
                w->forward_at.c_str(), w->cosine, w->cosine_at.c_str(), w->rel);
  }
}

// Batches big enough that every product runs in bf16 (the engine keeps
// products too small to pay in fp32: cpu::bf16_product, cpu::bf16_step).
TEST(RNNBf16, LargeBatchesEveryProductInBf16) {
  SKIP_WITHOUT_BF16();
  Worst worst;
  uint64_t seed = 2000;
  const std::vector<int64_t> lengths{200, 0, 150, 90, 37, 1};
  for (RNNMode mode : {RNNMode::lstm, RNNMode::gru, RNNMode::rnn_tanh}) {
    RNNOptions o{.mode = mode, .input_size = 64, .hidden_size = 130, .num_layers = 2,
                 .bidirectional = true};
    check_config(o, lengths, /*give_h0=*/true, ++seed, worst);
  }
  // fp32 products would agree with the reference to about 1e-6.
  EXPECT_GT(worst.forward, 1e-4) << "bf16 did not run";
  std::printf("bf16 large batches: worst |forward error| %.4g (%s); worst gradient cosine %.6f "
              "(%s); worst relative gradient error %.4g\n",
              worst.forward, worst.forward_at.c_str(), worst.cosine, worst.cosine_at.c_str(),
              worst.rel);
}

TEST(RNNBf16, ThousandStepSequence) {
  SKIP_WITHOUT_BF16();
  Worst worst;
  for (RNNMode mode : {RNNMode::lstm, RNNMode::gru}) {
    RNNOptions o{.mode = mode, .input_size = 16, .hidden_size = 48, .num_layers = 1,
                 .bidirectional = true};
    check_config(o, {1000, 7, 0, 300}, /*give_h0=*/false, mode == RNNMode::lstm ? 7 : 8, worst);
  }
  std::printf("bf16 T = 1000: worst |forward error| %.4g (%s); worst gradient cosine %.6f (%s)\n",
              worst.forward, worst.forward_at.c_str(), worst.cosine, worst.cosine_at.c_str());
}

// A NaN in one sequence reaches only that sequence's rows and state; the other
// sequences get exactly the values of a run without it.
TEST(RNNBf16, NanInOneSequenceLeavesTheOthersUntouched) {
  SKIP_WITHOUT_BF16();
  testing::check_nan_stays_in_its_sequence(Precision::bf16);
}

TEST(RNNBf16, FiveThousandStepsStayFinite) {
  SKIP_WITHOUT_BF16();
  RNNOptions o{.mode = RNNMode::lstm, .input_size = 8, .hidden_size = 64};
  o.precision = Precision::bf16;
  std::mt19937_64 gen(9);
  const PackingPlan plan = PackingPlan::from_lengths({5000, 17}, /*enforce_sorted=*/false);
  std::vector<Tensor> weights;
  for (const Shape& s : rnn_parameter_shapes(o)) weights.push_back(random_tensor(s, 0.5, gen));
  const Tensor x = random_tensor({plan.total_rows(), o.input_size}, 3.0, gen);
  const auto y =
      rnn_forward(*rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()), x,
                  plan, {}, {}, true, true);
  const Tensor ones = Tensor::full({plan.total_rows(), o.output_size()}, 1.0, DType::f32);
  const auto g = rnn_backward(*y.saved, ones, {}, {}, true);
  auto finite = [](const Tensor& t) {
    for (int64_t i = 0; i < t.numel(); ++i)
      if (!std::isfinite(t.item_as_double(i))) return false;
    return true;
  };
  EXPECT_TRUE(finite(y.output));
  EXPECT_TRUE(finite(y.h_n));
  EXPECT_TRUE(finite(y.c_n));
  EXPECT_TRUE(finite(g.input));
  for (const Tensor& w : g.weights) EXPECT_TRUE(finite(w));
}

// The embedding lookup fused into layer 0 (the main job's layer): the gate
// kernels add the projected table rows and accumulate their gradients, the
// backward takes c entering each step from the previous step's saved c or
// c0, and dW_hh reads dG as the steps' products converted it. Against the
// float64 reference on the gathered rows, with and without h0/c0, at sizes
// where every recurrent product runs in bf16: both directions side by side
// (H 130), and one direction with its steps split over two threads (H 256).
TEST(RNNBf16, LookupLayerAgainstFloat64Reference) {
  SKIP_WITHOUT_BF16();
  Worst worst;
  const int threads_before = num_threads();
  set_num_threads(2);
  for (const int config : {0, 1, 2}) {
    const bool give_h0 = config == 1, bi = config < 2;
    const uint64_t seed = 30 + static_cast<uint64_t>(config);
    RNNOptions o{.mode = RNNMode::lstm, .input_size = 24, .hidden_size = bi ? 130 : 256,
                 .num_layers = 1, .bidirectional = bi};
    o.precision = Precision::bf16;
    const int64_t D = o.num_directions();
    const std::string what = "lookup LSTM H" + std::to_string(o.hidden_size) +
                             (bi ? " bi" : "") + (give_h0 ? " h0" : "") + " seed " +
                             std::to_string(seed);
    SCOPED_TRACE(what);
    std::mt19937_64 gen(seed);
    const PackingPlan plan =
        PackingPlan::from_lengths({200, 0, 150, 90, 37, 1, 150}, /*enforce_sorted=*/false);
    const int64_t B = plan.batch(), N = plan.total_rows(), V = 11, F = o.input_size;
    std::vector<Tensor> weights;
    for (const Shape& sh : rnn_parameter_shapes(o))
      weights.push_back(random_tensor(sh, 1.0 / std::sqrt(double(o.hidden_size)), gen));
    const Tensor table = random_tensor({V, F}, 1.0, gen);
    std::vector<int64_t> ids(static_cast<std::size_t>(N));
    for (auto& id : ids) id = std::uniform_int_distribution<int64_t>(0, V - 1)(gen);
    Tensor x = Tensor::empty({N, F}, DType::f32);  // the gathered rows
    for (int64_t r = 0; r < N; ++r)
      for (int64_t f = 0; f < F; ++f)
        x.data<float>()[r * F + f] = table.data<float>()[ids[std::size_t(r)] * F + f];
    const Tensor h0 = give_h0 ? random_tensor({D, B, o.hidden_size}, 0.5, gen) : Tensor();
    const Tensor c0 = give_h0 ? random_tensor({D, B, o.hidden_size}, 0.5, gen) : Tensor();
    const auto fwd = rnn_forward_lookup(
        *rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()), table, ids, plan,
        h0, c0, true, true);
    const Tensor gh = random_tensor({D, B, o.hidden_size}, 1.0, gen);
    const auto g = rnn_backward(*fwd.saved, {}, gh, {}, /*initial_state_grad=*/give_h0);

    std::vector<Tensor> seqs, no_grad;
    std::vector<std::vector<int64_t>> rows;
    for (int64_t b = 0; b < B; ++b) {
      rows.push_back(rows_of(plan, b));
      seqs.push_back(gather_rows(x, rows.back()));
      no_grad.push_back(Tensor::zeros({static_cast<int64_t>(rows.back().size()), D * o.hidden_size},
                                      DType::f64));
    }
    const auto ref = rnn_reference_forward(o, weights, seqs, h0, c0);
    const auto rg =
        reference::rnn_reference_backward(o, weights, seqs, h0, c0, no_grad, gh, Tensor());
    const double d = std::max({max_abs_diff(fwd.h_n, ref.h_n), max_abs_diff(fwd.c_n, ref.c_n)});
    EXPECT_LE(d, kForwardAbs) << "h_n, c_n";
    worst.forward = std::max(worst.forward, d);
    for (int64_t b = 0; b < B; ++b) {
      const double db = max_abs_diff(gather_rows(fwd.output, rows[std::size_t(b)]),
                                     ref.outputs[std::size_t(b)]);
      EXPECT_LE(db, kForwardAbs) << "output " << b;
      worst.forward = std::max(worst.forward, db);
    }
    auto note_grad = [&](const Tensor& got, const Tensor& want, const std::string& name) {
      const Agreement a = agreement(got, want);
      EXPECT_GE(a.cosine, kGradCosine) << name;
      EXPECT_LE(a.rel, kGradRel) << name;
      worst.cosine = std::min(worst.cosine, a.cosine);
      worst.rel = std::max(worst.rel, a.rel);
    };
    const auto names = rnn_parameter_names(o);
    for (std::size_t k = 0; k < names.size(); ++k)
      note_grad(g.weights[k], rg.weights[k], "grad " + names[k]);
    if (give_h0) note_grad(g.h0, rg.h0, "grad h0");
    // The table's gradient: the reference's input gradients summed by id.
    Tensor gt = Tensor::zeros({V, F}, DType::f64);
    for (int64_t b = 0; b < B; ++b)
      for (std::size_t i = 0; i < rows[std::size_t(b)].size(); ++i)
        for (int64_t f = 0; f < F; ++f)
          gt.data<double>()[ids[std::size_t(rows[std::size_t(b)][i])] * F + f] +=
              rg.inputs[std::size_t(b)].item_as_double(static_cast<int64_t>(i) * F + f);
    note_grad(g.input, gt, "grad table");
  }
  set_num_threads(threads_before);
  EXPECT_GT(worst.forward, 1e-4) << "bf16 did not run";
  std::printf("bf16 lookup layer: worst |forward error| %.4g; worst gradient cosine %.6f; worst "
              "relative gradient error %.4g\n",
              worst.forward, worst.cosine, worst.rel);
}


// On two threads the bf16 engine splits the steps by rows (steps_by_rows):
// every thread owns whole sequences (about half of the tokens), multiplies
// its rows by all of W_hh and runs their gate math. Hidden sizes 256 and 40
// (whose step products the engine runs in fp32), and an LSTM of 512 whose
// W_hh (2 MB in bf16) the threads split by columns instead; one direction
// (two run side by side instead), steps of odd row counts and of one row,
// zero-length sequences, one sequence (a thread with no rows), and a lookup
// layer whose rows share table rows across threads. Checked: the results
// agree with one thread's (each row goes through the same products and gate
// math; only the bias gradients are summed in another order, per thread and
// then across), and with the float64 reference.
constexpr double kThreadsForwardAbs = 1e-5;
constexpr double kThreadsGradRel = 1e-4;
struct ThreadedRun {
  RNNForwardResult fwd;
  RNNGradients grad;
};

ThreadedRun run_on_threads(int threads, const RNNOptions& o, const std::vector<Tensor>& weights,
                           const Tensor& x, const std::vector<int64_t>* ids,
                           const PackingPlan& plan, const Tensor& h0, const Tensor& c0,
                           const Tensor& gy, const Tensor& gh) {
  const int before = num_threads();
  set_num_threads(threads);
  ThreadedRun r;
  r.fwd =
      ids ? rnn_forward_lookup(
                *rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()), x, *ids,
                plan, h0, c0, true, true)
          : rnn_forward(*rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()),
                        x, plan, h0, c0, true, true);
  r.grad = rnn_backward(*r.fwd.saved, gy, gh, {}, /*initial_state_grad=*/true);
  set_num_threads(before);
  return r;
}

// max |a - b| over outputs, states and gradients; the worst relative gradient difference.
void compare_runs(const ThreadedRun& one, const ThreadedRun& two, const std::string& what,
                  double& worst_abs, double& worst_rel) {
  SCOPED_TRACE(what);
  auto forward = [&](const Tensor& a, const Tensor& b, const char* name) {
    ASSERT_EQ(a.defined(), b.defined()) << name;
    if (!a.defined()) return;
    const double d = max_abs_diff(a, b);
    EXPECT_LE(d, kThreadsForwardAbs) << name;
    worst_abs = std::max(worst_abs, d);
  };
  forward(two.fwd.output, one.fwd.output, "output");
  forward(two.fwd.h_n, one.fwd.h_n, "h_n");
  forward(two.fwd.c_n, one.fwd.c_n, "c_n");
  auto grad = [&](const Tensor& a, const Tensor& b, const std::string& name) {
    const Agreement g = agreement(a, b);
    EXPECT_LE(g.rel, kThreadsGradRel) << name;
    worst_rel = std::max(worst_rel, g.rel);
    worst_abs = std::max(worst_abs, max_abs_diff(a, b));
  };
  grad(two.grad.input, one.grad.input, "grad input");
  grad(two.grad.h0, one.grad.h0, "grad h0");
  for (std::size_t k = 0; k < one.grad.weights.size(); ++k)
    grad(two.grad.weights[k], one.grad.weights[k], "grad weight " + std::to_string(k));
}

// The largest 2-thread against 1-thread differences, and the agreement
// with the reference at 2 threads.
struct ThreadWorst {
  double abs = 0, rel = 0;
  Worst parity;
};

// One cell and depth on `lengths`: plain and lookup input on 1 and 2 threads,
// then against the reference on 2.
void check_two_threads(RNNMode mode, int64_t layers, int64_t H,
                       const std::vector<int64_t>& lengths, uint64_t& seed, ThreadWorst& worst) {
  const PackingPlan plan = PackingPlan::from_lengths(lengths, /*enforce_sorted=*/false);
  RNNOptions o{.mode = mode, .input_size = 24, .hidden_size = H, .num_layers = layers};
  if (mode == RNNMode::lstm && layers == 2) o.proj_size = H / 2 - 3;
  const int64_t N = plan.total_rows(), B = plan.batch(), LD = o.num_layers;
  for (bool lookup : {false, true}) {
    o.precision = Precision::bf16;
    const std::string what = std::string(rnn_mode_name(mode)) + " H" + std::to_string(H) + " L" +
                             std::to_string(layers) + " B" + std::to_string(B) +
                             (lookup ? " lookup" : "") + " seed " + std::to_string(++seed);
    std::mt19937_64 gen(seed);
    std::vector<Tensor> weights;
    for (const Shape& s : rnn_parameter_shapes(o)) weights.push_back(random_tensor(s, 0.0625, gen));
    // A lookup reads 5 table rows, so the two threads' rows share them.
    std::vector<int64_t> ids(static_cast<std::size_t>(N));
    for (auto& id : ids) id = std::uniform_int_distribution<int64_t>(0, 4)(gen);
    const Tensor x = random_tensor({lookup ? 5 : N, o.input_size}, 1.0, gen);
    const Tensor h0 = random_tensor({LD, B, o.real_hidden_size()}, 0.5, gen);
    const Tensor c0 = mode == RNNMode::lstm ? random_tensor({LD, B, H}, 0.5, gen) : Tensor();
    const Tensor gy = random_tensor({N, o.output_size()}, 1.0, gen);
    const Tensor gh = random_tensor({LD, B, o.real_hidden_size()}, 1.0, gen);
    const auto* idp = lookup ? &ids : nullptr;
    const ThreadedRun one = run_on_threads(1, o, weights, x, idp, plan, h0, c0, gy, gh);
    const ThreadedRun two = run_on_threads(2, o, weights, x, idp, plan, h0, c0, gy, gh);
    compare_runs(one, two, what, worst.abs, worst.rel);
  }
  const int before = num_threads();
  set_num_threads(2);
  check_config(o, lengths, /*give_h0=*/(seed % 2) == 0, ++seed, worst.parity);
  set_num_threads(before);
}

TEST(RNNBf16, TwoThreadsSplitStepsByRows) {
  SKIP_WITHOUT_BF16();
  const int before = num_threads();
  set_num_threads(2);
  const int threads = num_threads();
  set_num_threads(before);
  if (threads < 2) GTEST_SKIP() << "OpenMP gives one thread";
  ThreadWorst worst;
  uint64_t seed = 3000;
  // Batch sizes 7 6 6 5 4 3 3 3 2 1: odd, even, one row.
  for (int64_t H : {256, 40})
    for (RNNMode mode : {RNNMode::lstm, RNNMode::gru, RNNMode::rnn_tanh})
      for (int64_t layers : {1, 2})
        check_two_threads(mode, layers, H, {9, 0, 4, 8, 1, 10, 3, 5}, seed, worst);
  check_two_threads(RNNMode::lstm, 1, 512, {9, 0, 4, 8, 1, 10, 3, 5}, seed, worst);
  // One sequence (the second thread has no rows); one beside a zero-length one.
  for (const std::vector<int64_t>& lengths : {std::vector<int64_t>{6}, std::vector<int64_t>{0, 5}})
    for (int64_t layers : {1, 2})
      check_two_threads(RNNMode::lstm, layers, 256, lengths, seed, worst);
  const Worst& p = worst.parity;
  std::printf("bf16, 2 threads against 1: worst |difference| %.4g, worst relative gradient "
              "difference %.3g; "
              "against the reference: worst |forward error| %.4g (%s), worst gradient cosine "
              "%.6f (%s)\n",
              worst.abs, worst.rel, p.forward, p.forward_at.c_str(), p.cosine,
              p.cosine_at.c_str());
}

// A small training run (the main job's model on a synthetic task: the class is
// the most frequent of 4 token groups in a random sequence) reaches in bf16 the
// loss it reaches in fp32, within kTrainLossMargin, from the same seed.
TEST(RNNBf16, TrainingReachesTheFp32Loss) {
  SKIP_WITHOUT_BF16();
  constexpr double kTrainLossMargin = 0.05;
  std::mt19937_64 gen(17);
  std::vector<std::vector<int64_t>> seqs;
  std::vector<int64_t> labels;
  for (int i = 0; i < 256; ++i) {
    std::vector<int64_t> s(static_cast<std::size_t>(std::uniform_int_distribution<int>(1, 14)(gen)));
    std::vector<int> count(4, 0);
    for (auto& t : s) {
      t = std::uniform_int_distribution<int>(1, 16)(gen);
      ++count[static_cast<std::size_t>((t - 1) / 4)];
    }
    seqs.push_back(s);
    labels.push_back(std::max_element(count.begin(), count.end()) - count.begin());
  }
  auto final_loss = [&](Precision p) {
    CharClassifier model({.vocab_size = 17, .embed_dim = 16, .hidden_size = 96, .num_classes = 4,
                          .dtype = DType::f32, .precision = p},
                         /*seed=*/3);
    model.lstm().set_config(testing::config());
    model.fc().set_kernels(testing::kernels());
    Adam opt(model.parameters(), {.lr = 3e-3, .kernels = testing::kernels()});
    CrossEntropyLoss ce;
    double loss = 0;
    for (int epoch = 0; epoch < 8; ++epoch) {
      for (std::size_t b = 0; b < seqs.size(); b += 64) {
        std::vector<std::vector<int64_t>> batch(seqs.begin() + b, seqs.begin() + b + 64);
        const Tensor y = Tensor::from_vector<int64_t>(
            std::vector<int64_t>(labels.begin() + b, labels.begin() + b + 64));
        opt.zero_grad();
        loss = ce.forward(model.forward(batch), y);
        model.backward(ce.backward());
        opt.step();
      }
    }
    return loss;
  };
  const double fp32 = final_loss(Precision::fp32), bf16 = final_loss(Precision::bf16);
  std::printf("training: final loss fp32 %.4f, bf16 %.4f\n", fp32, bf16);
  EXPECT_LT(fp32, 0.5) << "the task was not learnt; the comparison would say nothing";
  EXPECT_NEAR(bf16, fp32, kTrainLossMargin);
  EXPECT_NE(bf16, fp32) << "bf16 did not run";
}

}  // namespace
}  // namespace seqpack
