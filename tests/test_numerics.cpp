// Numerics under stress for the recurrent layers' fast path:
//  - forward + backward over T = 5000 steps in float32 with bounded inputs stays
//    finite, and stays close to the float64 reference (no drift over long runs);
//  - a NaN in one sequence's input reaches only that sequence's outputs, h_n,
//    c_n and input/h0/c0 gradients, never another sequence of the batch, packed
//    or padded. Weight and bias gradients sum over every row, so they do mix
//    sequences: that is expected and not checked.
//  - a NaN in the padding of a padded batch reaches nothing at all.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "reference/rnn_reference.h"
#include "seqpack/packed_sequence.h"
#include "seqpack/rnn.h"
#include "test_util.h"

namespace seqpack {
namespace {

Tensor uniform(Shape shape, DType dtype, std::mt19937_64& gen, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  Tensor t = Tensor::empty(std::move(shape), DType::f64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = dist(gen);
  return t.to(dtype);
}

// Flat index of the first non-finite element, or -1.
int64_t first_non_finite(const Tensor& t) {
  if (!t.defined()) return -1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!std::isfinite(t.item_as_double(i))) return i;
  }
  return -1;
}

#define EXPECT_FINITE(t, what)                                           \
  do {                                                                   \
    const int64_t bad_ = first_non_finite(t);                            \
    EXPECT_EQ(bad_, -1) << what << ": element " << bad_ << " = "         \
                        << (bad_ >= 0 ? (t).item_as_double(bad_) : 0.0); \
  } while (0)

RNNOptions options(RNNMode mode, int64_t input, int64_t hidden, int64_t layers, bool bidirectional,
                   DType dtype) {
  RNNOptions o;
  o.mode = mode;
  o.input_size = input;
  o.hidden_size = hidden;
  o.num_layers = layers;
  o.bidirectional = bidirectional;
  o.dtype = dtype;
  return o;
}

std::string mode_name(const ::testing::TestParamInfo<RNNMode>& info) {
  return rnn_mode_name(info.param);
}

// Packed rows [total_rows, *] of `plan` -> one tensor per sequence, caller's order.
std::vector<Tensor> per_sequence(const Tensor& rows, const PackingPlan& plan) {
  PackedSequence p;
  p.data = rows;
  p.batch_sizes = plan.batch_sizes_tensor();
  p.sorted_indices = Tensor::from_vector(plan.sorted_indices());
  p.unsorted_indices = Tensor::from_vector(plan.unsorted_indices());
  return unpack_sequence(p);
}

// State [layers * dirs, B, W] -> the [layers * dirs, W] slice of sequence b, as doubles.
std::vector<double> state_of(const Tensor& s, int64_t b) {
  std::vector<double> out;
  if (!s.defined()) return out;
  const int64_t LD = s.size(0), B = s.size(1), W = s.size(2);
  for (int64_t l = 0; l < LD; ++l)
    for (int64_t k = 0; k < W; ++k) out.push_back(s.item_as_double((l * B + b) * W + k));
  return out;
}

std::vector<double> values(const Tensor& t) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[static_cast<std::size_t>(i)] = t.item_as_double(i);
  return out;
}

bool any_nan(const std::vector<double>& v) {
  return std::any_of(v.begin(), v.end(), [](double x) { return std::isnan(x); });
}

// Identical element for element (the fast path is deterministic and rows of a
// GEMM do not interact, so a clean sequence must be bit-for-bit unchanged).
::testing::AssertionResult same_values(const std::vector<double>& got,
                                       const std::vector<double>& want, const std::string& what) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << what << ": " << got.size() << " values, expected " << want.size();
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!(got[i] == want[i])) {
      return ::testing::AssertionFailure()
             << what << ": [" << i << "] got " << got[i] << " expected " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------
// T = 5000 in float32.

class LongSequence : public ::testing::TestWithParam<RNNMode> {};

TEST_P(LongSequence, ForwardBackwardOver5000StepsStaysFiniteAndNearTheReference) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with SEQPACK_TEST_SEED)");
  std::mt19937_64 gen(seed);
  const RNNMode mode = GetParam();
  const bool lstm = mode == RNNMode::lstm;
  // Bidirectional so the reverse direction also walks all 5000 steps; a second
  // sequence of another length so the batch shrinks mid-way.
  const RNNOptions o = options(mode, 4, 16, 1, /*bidirectional=*/true, DType::f32);
  RNNBase m(o, seed);
  const std::vector<int64_t> lengths = {3000, 5000};
  const int64_t B = 2, I = o.input_size, H = o.hidden_size, D = 2;
  std::vector<Tensor> weights64;
  for (const Tensor& w : m.parameters()) weights64.push_back(w.to(DType::f64));
  // In most ReLU draws a pre-activation lies within 1e-6 of 0, and now and then
  // float32 rounding (2e-7 here) puts it on the other side (seed 1822615022:
  // 4e-9 at step 2913): such a draw is drawn again
  // (compare_redrawing_near_relu_kinks).
  const auto draw_and_compare = [&](double& margin) {
    std::vector<Tensor> seqs;
    for (int64_t len : lengths) seqs.push_back(uniform({len, I}, DType::f32, gen));
    const Tensor h0 = uniform({D, B, H}, DType::f32, gen);
    const Tensor c0 = lstm ? uniform({D, B, H}, DType::f32, gen) : Tensor();
    const RNNOutput y = m.forward(pack_sequence(seqs, /*enforce_sorted=*/false), h0, c0);
    EXPECT_FINITE(y.packed.data, "output");
    EXPECT_FINITE(y.h_n, "h_n");
    EXPECT_FINITE(y.c_n, "c_n");

    const Tensor gy = uniform(y.packed.data.shape(), DType::f32, gen);
    const Tensor gh = uniform(y.h_n.shape(), DType::f32, gen);
    const Tensor gc = lstm ? uniform(y.c_n.shape(), DType::f32, gen) : Tensor();
    RNNGradients g = m.backward(y, gy, gh, gc);
    EXPECT_FINITE(g.input, "grad input");
    EXPECT_FINITE(g.h0, "grad h0");
    EXPECT_FINITE(g.c0, "grad c0");
    for (std::size_t i = 0; i < g.weights.size(); ++i)
      EXPECT_FINITE(g.weights[i], m.parameter_names()[i]);

    // The same computation in float64, one sequence and one step at a time.
    // The dynamics are contracting, so float32 rounding must not accumulate
    // over the 5000 steps: outputs stay within 1e-4 of the reference.
    std::vector<Tensor> seqs64, gy64;
    for (const Tensor& s : seqs) seqs64.push_back(s.to(DType::f64));
    const RNNReferenceResult ref = rnn_reference_forward(o, weights64, seqs64, h0.to(DType::f64),
                                                         lstm ? c0.to(DType::f64) : Tensor());
    margin = ref.relu_margin;
    const std::vector<Tensor> out = per_sequence(y.packed.data, *y.plan);
    for (int64_t b = 0; b < B; ++b) {
      EXPECT_TRUE(seqpack::testing::all_close(out[b], ref.outputs[b], 1e-4, 1e-4,
                                              "output of sequence " + std::to_string(b)));
    }
    EXPECT_TRUE(seqpack::testing::all_close(y.h_n, ref.h_n, 1e-4, 1e-4, "h_n"));
    if (lstm) EXPECT_TRUE(seqpack::testing::all_close(y.c_n, ref.c_n, 1e-4, 1e-4, "c_n"));

    // Gradients: the weight gradients sum 5000 terms, so compare them relative
    // to their largest element.
    for (const Tensor& s : per_sequence(gy, *y.plan)) gy64.push_back(s.to(DType::f64));
    const reference::RNNReferenceGradients rg = reference::rnn_reference_backward(
        o, weights64, seqs64, h0.to(DType::f64), lstm ? c0.to(DType::f64) : Tensor(), gy64,
        gh.to(DType::f64), lstm ? gc.to(DType::f64) : Tensor());
    const std::vector<Tensor> gin = per_sequence(g.input, *y.plan);
    for (int64_t b = 0; b < B; ++b) {
      EXPECT_TRUE(seqpack::testing::all_close(gin[b], rg.inputs[b], 1e-3, 1e-4,
                                              "grad input of sequence " + std::to_string(b)));
    }
    EXPECT_TRUE(seqpack::testing::all_close(g.h0, rg.h0, 1e-3, 1e-4, "grad h0"));
    if (lstm) EXPECT_TRUE(seqpack::testing::all_close(g.c0, rg.c0, 1e-3, 1e-4, "grad c0"));
    for (std::size_t i = 0; i < g.weights.size(); ++i) {
      double scale = 0;
      for (double v : values(rg.weights[i])) scale = std::max(scale, std::fabs(v));
      EXPECT_TRUE(seqpack::testing::all_close(g.weights[i], rg.weights[i], 1e-3, 1e-4 * scale,
                                              m.parameter_names()[i]));
    }
  };
  seqpack::testing::compare_redrawing_near_relu_kinks(draw_and_compare);
}

INSTANTIATE_TEST_SUITE_P(Modes, LongSequence,
                         ::testing::Values(RNNMode::lstm, RNNMode::gru, RNNMode::rnn_tanh,
                                           RNNMode::rnn_relu),
                         mode_name);

// ---------------------------------------------------------------------------
// A NaN stays in its own sequence.

class NaNIsolation : public ::testing::TestWithParam<RNNMode> {
 protected:
  static constexpr int64_t kI = 3, kH = 5, kT = 6;
  const std::vector<int64_t> lengths_ = {6, 4, 5, 3};  // unsorted, so the rows get permuted
  static constexpr int64_t kB = 4;
  static constexpr int64_t kPoisoned = 1;  // sequence with the NaN
  static constexpr int64_t kStep = 2;      // its step with the NaN (a valid step)

  RNNOptions opts() const {
    // Two layers, so the NaN also crosses the layer boundary (layer 1's input
    // projection is one GEMM over all rows), and both directions.
    return options(GetParam(), kI, kH, 2, /*bidirectional=*/true, DType::f32);
  }
};

TEST_P(NaNIsolation, PackedNaNReachesOnlyItsOwnSequence) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with SEQPACK_TEST_SEED)");
  std::mt19937_64 gen(seed);
  const bool lstm = GetParam() == RNNMode::lstm;
  RNNBase m(opts(), seed);
  const int64_t LD = 4;
  std::vector<Tensor> clean;
  for (int64_t len : lengths_) clean.push_back(uniform({len, kI}, DType::f32, gen));
  std::vector<Tensor> poisoned = clean;
  poisoned[kPoisoned] = clean[kPoisoned].clone();
  poisoned[kPoisoned].data<float>()[kStep * kI + 1] = std::nanf("");
  const Tensor h0 = uniform({LD, kB, kH}, DType::f32, gen);
  const Tensor c0 = lstm ? uniform({LD, kB, kH}, DType::f32, gen) : Tensor();

  RNNOutput yc = m.forward(pack_sequence(clean, /*enforce_sorted=*/false), h0, c0);
  RNNOutput yp = m.forward(pack_sequence(poisoned, /*enforce_sorted=*/false), h0, c0);
  const Tensor gy = uniform(yc.packed.data.shape(), DType::f32, gen);
  const Tensor gh = uniform(yc.h_n.shape(), DType::f32, gen);
  const Tensor gc = lstm ? uniform(yc.c_n.shape(), DType::f32, gen) : Tensor();
  RNNGradients gcl = m.backward(yc, gy, gh, gc);
  RNNGradients gpo = m.backward(yp, gy, gh, gc);

  const auto oc = per_sequence(yc.packed.data, *yc.plan),
             op = per_sequence(yp.packed.data, *yp.plan);
  const auto ic = per_sequence(gcl.input, *yc.plan), ip = per_sequence(gpo.input, *yp.plan);
  for (int64_t b = 0; b < kB; ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    if (b == kPoisoned) {
      // The test must be able to fail: the NaN really propagates.
      EXPECT_TRUE(any_nan(values(op[b]))) << "the NaN vanished from its own outputs";
      EXPECT_TRUE(any_nan(state_of(yp.h_n, b))) << "the NaN vanished from its own h_n";
      if (GetParam() != RNNMode::rnn_relu) {
        // torch's relu backward (threshold_backward on the result) passes the
        // gradient where the result is NaN, so for relu the input gradient of
        // the poisoned sequence stays finite in PyTorch too.
        EXPECT_TRUE(any_nan(values(ip[b]))) << "the NaN vanished from its own input gradient";
      }
      continue;
    }
    EXPECT_TRUE(same_values(values(op[b]), values(oc[b]), "output"));
    EXPECT_TRUE(same_values(state_of(yp.h_n, b), state_of(yc.h_n, b), "h_n"));
    EXPECT_TRUE(same_values(state_of(yp.c_n, b), state_of(yc.c_n, b), "c_n"));
    EXPECT_TRUE(same_values(values(ip[b]), values(ic[b]), "grad input"));
    EXPECT_TRUE(same_values(state_of(gpo.h0, b), state_of(gcl.h0, b), "grad h0"));
    EXPECT_TRUE(same_values(state_of(gpo.c0, b), state_of(gcl.c0, b), "grad c0"));
  }
}

TEST_P(NaNIsolation, PaddedNaNReachesOnlyItsOwnSequence) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with SEQPACK_TEST_SEED)");
  std::mt19937_64 gen(seed);
  const bool lstm = GetParam() == RNNMode::lstm;
  for (bool batch_first : {false, true}) {
    SCOPED_TRACE(batch_first ? "batch_first" : "time-major");
    RNNOptions o = opts();
    o.batch_first = batch_first;
    RNNBase m(o, seed);
    const int64_t LD = 4, O = o.output_size();
    // Padded [T, B, I] (or [B, T, I]); the padding holds finite garbage.
    const Tensor clean =
        uniform(batch_first ? Shape{kB, kT, kI} : Shape{kT, kB, kI}, DType::f32, gen);
    auto at = [&](int64_t t, int64_t b, int64_t k, int64_t width) {
      return (batch_first ? b * kT + t : t * kB + b) * width + k;
    };
    Tensor poisoned = clean.clone();
    poisoned.data<float>()[at(kStep, kPoisoned, 1, kI)] = std::nanf("");
    const Tensor h0 = uniform({LD, kB, kH}, DType::f32, gen);
    const Tensor c0 = lstm ? uniform({LD, kB, kH}, DType::f32, gen) : Tensor();

    RNNOutput yc = m.forward(clean, lengths_, h0, c0);
    RNNOutput yp = m.forward(poisoned, lengths_, h0, c0);
    const Tensor gy = uniform(yc.padded.shape(), DType::f32, gen);
    const Tensor gh = uniform(yc.h_n.shape(), DType::f32, gen);
    const Tensor gc = lstm ? uniform(yc.c_n.shape(), DType::f32, gen) : Tensor();
    RNNGradients gcl = m.backward(yc, gy, gh, gc);
    RNNGradients gpo = m.backward(yp, gy, gh, gc);

    for (int64_t b = 0; b < kB; ++b) {
      SCOPED_TRACE("sequence " + std::to_string(b));
      auto column = [&](const Tensor& t, int64_t width) {
        std::vector<double> v;
        for (int64_t s = 0; s < kT; ++s)
          for (int64_t k = 0; k < width; ++k) v.push_back(t.item_as_double(at(s, b, k, width)));
        return v;
      };
      if (b == kPoisoned) {
        EXPECT_TRUE(any_nan(column(yp.padded, O))) << "the NaN vanished from its own outputs";
        EXPECT_TRUE(any_nan(state_of(yp.h_n, b))) << "the NaN vanished from its own h_n";
        if (GetParam() != RNNMode::rnn_relu) {  // see PackedNaNReachesOnlyItsOwnSequence
          EXPECT_TRUE(any_nan(column(gpo.input, kI)))
              << "the NaN vanished from its own input gradient";
        }
        // Padding stays padding: zero output and zero gradient past the length.
        for (int64_t s = lengths_[b]; s < kT; ++s) {
          for (int64_t k = 0; k < O; ++k) EXPECT_EQ(yp.padded.item_as_double(at(s, b, k, O)), 0.0);
          for (int64_t k = 0; k < kI; ++k)
            EXPECT_EQ(gpo.input.item_as_double(at(s, b, k, kI)), 0.0);
        }
        continue;
      }
      EXPECT_TRUE(same_values(column(yp.padded, O), column(yc.padded, O), "output"));
      EXPECT_TRUE(same_values(state_of(yp.h_n, b), state_of(yc.h_n, b), "h_n"));
      EXPECT_TRUE(same_values(state_of(yp.c_n, b), state_of(yc.c_n, b), "c_n"));
      EXPECT_TRUE(same_values(column(gpo.input, kI), column(gcl.input, kI), "grad input"));
      EXPECT_TRUE(same_values(state_of(gpo.h0, b), state_of(gcl.h0, b), "grad h0"));
      EXPECT_TRUE(same_values(state_of(gpo.c0, b), state_of(gcl.c0, b), "grad c0"));
    }
  }
}

// NaN (and infinity) in the padding of a padded batch must not reach anything,
// weight gradients included: padding is never read.
TEST_P(NaNIsolation, NonFinitePaddingIsNeverRead) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with SEQPACK_TEST_SEED)");
  std::mt19937_64 gen(seed);
  const bool lstm = GetParam() == RNNMode::lstm;
  RNNBase m(opts(), seed);
  const Tensor clean = uniform({kT, kB, kI}, DType::f32, gen);
  Tensor poisoned = clean.clone();
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t t = lengths_[b]; t < kT; ++t)
      for (int64_t k = 0; k < kI; ++k)
        poisoned.data<float>()[(t * kB + b) * kI + k] = (t + k) % 2 ? std::nanf("") : INFINITY;
  RNNOutput yc = m.forward(clean, lengths_);
  const Tensor gy = uniform(yc.padded.shape(), DType::f32, gen);
  const Tensor gh = uniform(yc.h_n.shape(), DType::f32, gen);
  const Tensor gc = lstm ? uniform(yc.c_n.shape(), DType::f32, gen) : Tensor();
  RNNGradients gcl = m.backward(yc, gy, gh, gc);
  RNNOutput yp = m.forward(poisoned, lengths_);
  RNNGradients gpo = m.backward(yp, gy, gh, gc);
  EXPECT_TRUE(same_values(values(yp.padded), values(yc.padded), "output"));
  EXPECT_TRUE(same_values(values(yp.h_n), values(yc.h_n), "h_n"));
  EXPECT_TRUE(same_values(values(gpo.input), values(gcl.input), "grad input"));
  for (std::size_t i = 0; i < gcl.weights.size(); ++i) {
    EXPECT_TRUE(
        same_values(values(gpo.weights[i]), values(gcl.weights[i]), m.parameter_names()[i]));
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, NaNIsolation,
                         ::testing::Values(RNNMode::lstm, RNNMode::gru, RNNMode::rnn_tanh,
                                           RNNMode::rnn_relu),
                         mode_name);

}  // namespace
}  // namespace seqpack
