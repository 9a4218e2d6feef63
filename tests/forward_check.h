// The recurrent forward against the float64 reference (src/reference/), for
// the parity grids of the lower precisions (test_rnn_bf16, test_rnn_int8):
// every sequence's outputs, h_n and c_n, each max |difference| within
// `bound`, the worst one kept with where it was.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reference/rnn_reference.h"
#include "test_util.h"

namespace seqpack::testing {

struct WorstForward {
  double value = 0;
  std::string at;
};

// The case's sequences, as the reference takes them, and their packed rows.
struct CaseSequences {
  std::vector<std::vector<int64_t>> rows;
  std::vector<Tensor> inputs;
};
inline CaseSequences case_sequences(const RnnCase& rc) {
  CaseSequences s;
  for (int64_t b = 0; b < rc.plan.batch(); ++b) {
    s.rows.push_back(rows_of(rc.plan, b));
    s.inputs.push_back(gather_rows(rc.x, s.rows.back()));
  }
  return s;
}

inline void check_forward_against_reference(const RNNOptions& o, const RnnCase& rc,
                                            const CaseSequences& seqs,
                                            const RNNForwardResult& fwd, double bound,
                                            WorstForward& worst) {
  const auto ref = rnn_reference_forward(o, rc.weights, seqs.inputs, rc.h0, rc.c0);
  auto note = [&](const Tensor& got, const Tensor& want, const std::string& name) {
    const double d = max_abs_diff(got, want);
    EXPECT_LE(d, bound) << name;
    if (!(d <= worst.value)) {
      worst.value = d;
      worst.at = rc.name + " " + name;
    }
  };
  for (std::size_t b = 0; b < seqs.rows.size(); ++b)
    note(gather_rows(fwd.output, seqs.rows[b]), ref.outputs[b], "output " + std::to_string(b));
  note(fwd.h_n, ref.h_n, "h_n");
  if (o.mode == RNNMode::lstm) note(fwd.c_n, ref.c_n, "c_n");
}

// A NaN in one sequence's input (sequence 1 of three, 2 layers, both
// directions, every cell) reaches that sequence's outputs and only them: the
// other sequences get exactly the values of a run without it.
inline void check_nan_stays_in_its_sequence(Precision precision) {
  for (RNNMode mode : {RNNMode::lstm, RNNMode::gru, RNNMode::rnn_tanh}) {
    SCOPED_TRACE(rnn_mode_name(mode));
    RNNOptions o{.mode = mode, .input_size = 8, .hidden_size = 40, .num_layers = 2,
                 .bidirectional = true};
    o.precision = precision;
    std::mt19937_64 gen(5);
    const PackingPlan plan = PackingPlan::from_lengths({6, 9, 4}, /*enforce_sorted=*/false);
    std::vector<Tensor> weights;
    for (const Shape& s : rnn_parameter_shapes(o)) weights.push_back(random_tensor(s, 0.2, gen));
    const Tensor x = random_tensor({plan.total_rows(), o.input_size}, 1.0, gen);
    const auto clean =
        rnn_forward(*rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()), x,
                    plan, {}, {}, false, false);
    const auto bad_rows = rows_of(plan, 1);
    Tensor xn = x.clone();
    xn.data<float>()[bad_rows[2] * o.input_size + 3] = std::numeric_limits<float>::quiet_NaN();
    const auto dirty =
        rnn_forward(*rnn_make_plan(o, weights, /*in_place=*/true, seqpack::testing::config()), xn,
                    plan, {}, {}, false, false);
    for (int64_t b : {0, 2}) {
      const auto r = rows_of(plan, b);
      const Tensor a = gather_rows(clean.output, r), c = gather_rows(dirty.output, r);
      for (int64_t i = 0; i < a.numel(); ++i)
        ASSERT_EQ(a.data<double>()[i], c.data<double>()[i]) << "sequence " << b << " element " << i;
    }
    bool nan_seen = false;
    const Tensor d = gather_rows(dirty.output, bad_rows);
    for (int64_t i = 0; i < d.numel(); ++i) nan_seen |= std::isnan(d.data<double>()[i]);
    EXPECT_TRUE(nan_seen) << "the NaN was lost (a conversion or quantization must keep it)";
  }
}

}  // namespace seqpack::testing
