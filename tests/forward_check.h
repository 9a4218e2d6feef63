// The recurrent forward against the float64 reference (src/reference/), for
// the parity grids of the lower precisions (test_rnn_bf16, test_rnn_int8):
// every sequence's outputs, h_n and c_n, each max |difference| within
// `bound`, the worst one kept with where it was.
#pragma once

#include <gtest/gtest.h>

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

}  // namespace seqpack::testing
