// The plain RNN/LSTM/GRU reference (src/reference/rnn_reference.cpp), in
// float64: what the tests compare the fast path with. It is built only with
// the tests (the seqpack_reference library, tests/CMakeLists.txt), never into
// the library users link, and this header is not installed.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "seqpack/rnn.h"

namespace seqpack {

// Plain reference: one sequence at a time, one step at a time, scalar loops,
// computed in double. `sequences[b]` is [len_b, input_size] (caller's order).
// Returns per-sequence outputs [len_b, output_size], h_n and c_n (dropout off).
// `relu_margin` (rnn_relu only, else infinity): the smallest |pre-activation|
// of any unit at any step, layer and direction. A ReLU's derivative jumps at 0,
// so a float32 computation may put a unit closer to 0 than its rounding on the
// other side, and its gradients then part from the reference's.
struct RNNReferenceResult {
  std::vector<Tensor> outputs;
  Tensor h_n;
  Tensor c_n;
  double relu_margin = std::numeric_limits<double>::infinity();
};
RNNReferenceResult rnn_reference_forward(const RNNOptions& options,
                                         const std::vector<Tensor>& weights,
                                         const std::vector<Tensor>& sequences, const Tensor& h0,
                                         const Tensor& c0);

}  // namespace seqpack

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
