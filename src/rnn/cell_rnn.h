// The Elman RNN cell of the recurrent core (rnn/cell.h says what a cell is):
//   h_t = tanh or relu(W_ih x + b_ih + W_hh h_{t-1} + b_hh).
// It keeps nothing beyond the loop's own: its gate rows are h itself.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/rnn_gates.h"
#include "rnn/cell.h"

namespace seqpack::rnn {

struct RnnCell {
  static constexpr bool cell_state = false;
  static constexpr bool hidden_apart = false;
  static constexpr bool b_hh_in_projection = true;
  static constexpr bool reads_h_prev = false;
  static constexpr bool lookup_in_product = true;
  static constexpr bool lookup_in_kernel = false;
  static constexpr bool separate_db_hh = false;
  static constexpr bool dh_prev_in_kernel = false;

  struct Saved {};

  template <typename T>
  struct Workspace {
    void resize(const CellShape&) {}
  };

  template <typename T>
  class Forward {
   public:
    Forward(const CellShape& s, const T* /*b_hh*/, Workspace<T>&, Saved*)
        : H_(s.H), G_(s.G), relu_(s.relu) {}

    void start(const Tensor&, int64_t, const std::vector<int64_t>&) {}

    void step(const ForwardStep<T>& st) const {
      by_sink(st, 0, st.n, [&](int64_t r0, int64_t r1, cpu::RowSink h_next) {
        cpu::rnn_gates_forward<T>(st.cap, r1 - r0, H_, st.k0, st.k1, st.g + r0 * G_, relu_,
                                  st.h + r0 * st.ldh, st.ldh, h_next);
      });
    }

    template <typename F>
    void finish(F&&, Tensor&, int64_t, const std::vector<int64_t>&) {}

   private:
    int64_t H_, G_;
    bool relu_;
  };

  template <typename T>
  class Backward {
   public:
    Backward(const CellShape& s, const Saved&, Workspace<T>&) : H_(s.H), relu_(s.relu) {}

    void start(const Tensor&, int64_t, const std::vector<int64_t>&) {}

    // st.gates: the saved h (the activations).
    void step(const BackwardStep<T>& st) const {
      cpu::rnn_gates_backward<T>(st.cap, st.n, H_, st.k0, st.k1, st.gates, relu_, st.dh, st.ld_dh,
                                 st.dg, st.db_ih, st.dg_sink);
    }

    void finish(Tensor&, int64_t, const std::vector<int64_t>&) const {}

   private:
    int64_t H_;
    bool relu_;
  };
};

}  // namespace seqpack::rnn
