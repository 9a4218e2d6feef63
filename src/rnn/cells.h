// The cells of the recurrent core, and the one place that maps a mode to its cell.
#pragma once

#include "rnn/cell_gru.h"
#include "rnn/cell_lstm.h"
#include "rnn/cell_rnn.h"
#include "seqpack/rnn.h"

namespace seqpack::rnn {

// f(cell) with the cell of this mode.
template <typename F>
decltype(auto) with_cell(RNNMode mode, F&& f) {
  switch (mode) {
    case RNNMode::lstm:
      return f(LstmCell{});
    case RNNMode::gru:
      return f(GruCell{});
    case RNNMode::rnn_tanh:
    case RNNMode::rnn_relu:
      break;
  }
  return f(RnnCell{});
}

// Whether the mode's cell has a cell state (c0, c_n, grad_c_n).
inline bool has_cell_state(RNNMode mode) {
  return with_cell(mode, [](auto cell) { return decltype(cell)::cell_state; });
}

}  // namespace seqpack::rnn
