// Private helpers of the plain RNN/LSTM/GRU reference (src/reference/rnn_reference.cpp).
// The forward is public (seqpack/rnn.h: rnn_reference_forward); the reference
// backward and the local parameter naming live here so tests can use them
// without making them part of the installed API.
#pragma once

#include <string>
#include <vector>

#include "seqpack/rnn.h"

namespace seqpack::reference {

// PyTorch's parameter names and shapes in _flat_weights_names order, computed
// independently of the fast path's rnn_parameter_names so the two can be
// checked against each other.
std::vector<std::string> rnn_parameter_names(const RNNOptions& options);
std::vector<Shape> rnn_parameter_shapes(const RNNOptions& options);

// Gradients of  L = sum_b <grad_outputs[b], outputs[b]> + <grad_h_n, h_n> + <grad_c_n, c_n>
// by back-propagation through time, one sequence at a time, in double.
// grad_outputs[b] is [len_b, output_size]; undefined gradients count as zeros.
// Returned tensors are float64: input[b] per sequence (RNNGradients::input is
// unused), h0, c0 (LSTM) and weights in rnn_parameter_names order.
struct RNNReferenceGradients {
  std::vector<Tensor> inputs;
  Tensor h0;
  Tensor c0;
  std::vector<Tensor> weights;
};
RNNReferenceGradients rnn_reference_backward(const RNNOptions& options,
                                             const std::vector<Tensor>& weights,
                                             const std::vector<Tensor>& sequences, const Tensor& h0,
                                             const Tensor& c0,
                                             const std::vector<Tensor>& grad_outputs,
                                             const Tensor& grad_h_n, const Tensor& grad_c_n);

}  // namespace seqpack::reference
