// What a forward keeps for rnn_backward (RNNSaved, opaque in the public
// header), and each layer and direction's weights within the flat list.
#pragma once

#include <cstdint>
#include <memory>
#include <variant>
#include <vector>

#include "cpu/gemm_engine.h"
#include "rnn/cells.h"
#include "seqpack/packed_sequence.h"
#include "seqpack/rnn.h"

namespace seqpack {

struct RNNSaved {
  struct Direction {
    Tensor gates;   // [N, G] gate activations (RNN: h itself)
    Tensor h_prev;  // [N, R] h entering each row's step
    Tensor m;       // LSTM with projection [N, H]: o * tanh(c), before W_hr
    // What the cell keeps (its Saved: LSTM's c and c0, GRU's W_hn h + b_hn).
    std::variant<rnn::LstmCell::Saved, rnn::GruCell::Saved, rnn::RnnCell::Saved> cell;
    // h_prev's rows in the form dW_hh's product reads them (product_form:
    // the bf16 engine's, where it multiplies dW_hh in bf16; else null). With
    // them, h_prev is undefined where only dW_hh would read it (LSTM, RNN,
    // steps that read these rows).
    std::shared_ptr<cpu::OperandRows> h_prev_kept;
  };
  struct Layer {
    Tensor input;  // [N, in] what W_ih saw (after dropout); layer 0 of a lookup: the table
    Tensor mask;   // dropout mask (0 or 1/(1-p)) applied to the input, or undefined
    std::vector<Direction> dirs;
  };
  RNNOptions options;
  RNNConfig config;  // the forward's plan's
  std::vector<Tensor> weights;
  // The model plan the forward was given (or null): the backward reads its
  // step operands through it too.
  std::shared_ptr<const RNNModelPlan> model;
  std::vector<int64_t> lookup;  // rnn_forward_lookup: table row of each packed row
  std::vector<int64_t> batch_sizes, offsets, sorted_indices;
  int64_t batch = 0, total_rows = 0;
  // The forward had no h0: the rows that read it read zeros.
  bool h0_zero = false;
  std::vector<Layer> layers;
};

namespace rnn {

// One layer and direction's weights in the flat list (rnn_parameter_names order).
template <typename T>
struct DirWeights {
  const T* w_ih = nullptr;
  const T* w_hh = nullptr;
  const T* b_ih = nullptr;
  const T* b_hh = nullptr;
  const T* w_hr = nullptr;
  int64_t first = 0;  // index of w_ih in the flat weight list
};

inline int64_t params_per_direction(const RNNOptions& o) {
  return 2 + (o.bias ? 2 : 0) + (o.proj_size > 0 ? 1 : 0);
}

template <typename T>
DirWeights<T> dir_weights(const RNNOptions& o, const std::vector<Tensor>& w, int64_t l, int64_t d) {
  DirWeights<T> dw;
  const int64_t k = (l * o.num_directions() + d) * params_per_direction(o);
  dw.first = k;
  dw.w_ih = w[static_cast<std::size_t>(k)].data<T>();
  dw.w_hh = w[static_cast<std::size_t>(k + 1)].data<T>();
  int64_t next = k + 2;
  if (o.bias) {
    dw.b_ih = w[static_cast<std::size_t>(next)].data<T>();
    dw.b_hh = w[static_cast<std::size_t>(next + 1)].data<T>();
    next += 2;
  }
  if (o.proj_size > 0) dw.w_hr = w[static_cast<std::size_t>(next)].data<T>();
  return dw;
}

}  // namespace rnn
}  // namespace seqpack
