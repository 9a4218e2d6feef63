// One multi-layer recurrent forward on packed rows in torch's own recurrent
// operators (at::lstm, at::gru, at::rnn_tanh, at::rnn_relu with batch_sizes),
// with seqpack's semantics around them: states in the caller's batch order,
// zero-length sequences (their h_n/c_n are their h0/c0) and given dropout
// masks between layers. Differentiable wherever torch's operators are. Two
// callers: the CPU operator's double backward (ops.cpp: graph_backward) and the
// CUDA operator's choice of torch's kernels (cuda_ops.cpp).
#pragma once

#include <ATen/ATen.h>

#include <tuple>
#include <vector>

namespace seqpack::torch_ops {

struct TorchRnn {
  c10::string_view mode;  // "LSTM", "GRU", "RNN_TANH" or "RNN_RELU"
  bool bias = true;
  int64_t num_layers = 1;
  bool bidirectional = false;
  at::Tensor batch_sizes;                        // int64, on the CPU
  at::Tensor sorted_indices, unsorted_indices;   // undefined: none
  std::vector<at::Tensor> masks;  // masks[l] multiplies layer l's input (undefined or absent: none)
};

// (output, h_n, c_n), c_n undefined but for LSTM; h0 (and c0 for LSTM) are
// given, [layers * directions, batch, size], in the caller's order.
std::tuple<at::Tensor, at::Tensor, at::Tensor> torch_packed_rnn(
    const TorchRnn& r, const at::Tensor& data, const at::Tensor& h0, const at::Tensor& c0,
    const std::vector<at::Tensor>& weights);

}  // namespace seqpack::torch_ops
