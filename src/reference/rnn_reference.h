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

// One step of one row of a cell, its element-wise math alone (what a fast
// cell's step computes after the products; rnn_reference_forward runs it for
// every row). gi = W_ih x + b_ih, gh = W_hh h_prev + b_hh ([G*H] each, apart
// because GRU needs them apart). Writes act: RNN the pre-activation [H],
// LSTM the activated gates i, f, g, o [4H], GRU r, z, n [3H]; c (LSTM) [H];
// h [H] (LSTM: o * tanh(c), before any projection); hn_lin (GRU) [H],
// W_hn h_prev + b_hn. c_prev (LSTM) and h_prev (GRU) are read; pointers a
// mode does not use may be null.
void cell_row_forward(RNNMode mode, int64_t H, const double* gi, const double* gh,
                      const double* h_prev, const double* c_prev, double* act, double* c,
                      double* h, double* hn_lin);
// Its backward: dh [H] is the gradient of h (LSTM: of o * tanh(c)), dc (LSTM)
// the gradient of c on entry and of c_prev on exit. Writes the gradients of
// gi and gh (dgi, dgh [G*H]) and adds GRU's direct part of dh_prev (dh * z)
// into dh_prev [H]; the others leave dh_prev alone.
void cell_row_backward(RNNMode mode, int64_t H, const double* act, const double* c,
                       const double* c_prev, const double* h_prev, const double* hn_lin,
                       const double* h, const double* dh, double* dc, double* dgi, double* dgh,
                       double* dh_prev);

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
