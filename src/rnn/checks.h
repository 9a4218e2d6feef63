// The checks of the recurrent core's arguments (rnn_forward,
// rnn_forward_lookup, rnn_backward, rnn_make_plan): each throws
// std::invalid_argument naming the argument, the value it has and the one
// expected, before anything is computed.
#pragma once

#include <cstdint>
#include <vector>

#include "seqpack/packed_sequence.h"
#include "seqpack/rnn.h"
#include "seqpack/tensor.h"

namespace seqpack::rnn {

// `s` (where defined) has shape `want` and `dtype`; `what` names it.
void check_state(const Tensor& s, const Shape& want, DType dtype, const char* what);
// The tensors rnn_parameter_names(o) lists, with their shapes and o's dtype.
void check_weights(const RNNOptions& o, const std::vector<Tensor>& weights);
// h0 and c0 (where defined) for these options and this batch.
void check_initial_state(const RNNOptions& options, const PackingPlan& plan, const Tensor& h0,
                         const Tensor& c0);
// Whether `a` and `b` hold the same values: same dtype and shape, the same
// bytes (exact; at once where they share their data).
bool same_values(const Tensor& a, const Tensor& b);
// An inference-only precision neither trains nor saves for a backward.
void check_forward_mode(const RNNOptions& options, bool training, bool save_for_backward);
// rnn_forward's arguments (the plan's options and weights were checked when
// it was made).
void check_forward(const RNNOptions& options, const Tensor& data, const PackingPlan& plan,
                   const Tensor& h0, const Tensor& c0);
// rnn_forward_lookup's arguments.
void check_forward_lookup(const RNNOptions& options, const Tensor& table,
                          const std::vector<int64_t>& ids, const PackingPlan& plan,
                          const Tensor& h0, const Tensor& c0);
// rnn_backward's gradients for what `saved` holds.
void check_backward(const RNNSaved& saved, const Tensor& grad_output, const Tensor& grad_h_n,
                    const Tensor& grad_c_n);

}  // namespace seqpack::rnn
