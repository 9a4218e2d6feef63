// The GRU cell of the recurrent core (rnn/cell.h says what a cell is):
//   r = σ(W_ir x + b_ir + W_hr h_{t-1} + b_hr)
//   z = σ(W_iz x + b_iz + W_hz h_{t-1} + b_hz)
//   n = tanh(W_in x + b_in + r * (W_hn h_{t-1} + b_hn))   (linear before reset)
//   h_t = (1 - z) * n + z * h_{t-1}
// r multiplies part of the hidden product: the product has its own buffer
// (hidden_apart) and b_hh stays out of the input projection. The cell saves
// W_hn h_{t-1} + b_hn per packed row for the backward.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/buffer_pool.h"
#include "cpu/rnn_gates.h"
#include "rnn/cell.h"

namespace seqpack::rnn {

struct GruCell {
  static constexpr bool cell_state = false;
  static constexpr bool hidden_apart = true;
  static constexpr bool b_hh_in_projection = false;
  static constexpr bool reads_h_prev = true;
  static constexpr bool lookup_in_product = false;
  static constexpr bool lookup_in_kernel = false;
  static constexpr bool separate_db_hh = true;
  static constexpr bool dh_prev_in_kernel = true;

  // W_hn h_prev + b_hn of each packed row [N, H].
  struct Saved {
    Tensor ghn;
  };

  // Nothing beyond the loop's buffers (the product's own rows are the loop's).
  template <typename T>
  struct Workspace {
    void resize(const CellShape&) {}
  };

  template <typename T>
  class Forward {
   public:
    // b_hh: [3H] or null (no bias).
    Forward(const CellShape& s, const T* b_hh, Workspace<T>&, Saved* saved)
        : H_(s.H), R_(s.R), G_(s.G), b_hh_(b_hh) {
      if (saved) {
        saved->ghn = cpu::pooled_empty({s.N, H_}, s.dtype);
        ghn_ = saved->ghn.template data<T>();
      }
    }

    void start(const Tensor&, int64_t, const std::vector<int64_t>&) {}

    // st.g: W_i x + b_i in, activations (r, z, n) out; st.gh: W_h h_prev.
    void step(const ForwardStep<T>& st) const {
      by_sink(st, 0, st.n, [&](int64_t r0, int64_t r1, cpu::RowSink h_next) {
        cpu::gru_gates_forward<T>(st.cap, r1 - r0, H_, st.k0, st.k1, st.g + r0 * G_,
                                  st.gh + r0 * G_, b_hh_, st.h_prev + r0 * R_, R_,
                                  st.h + r0 * st.ldh, st.ldh,
                                  ghn_ ? ghn_ + (st.r0 + r0) * H_ : nullptr, h_next);
      });
    }

    template <typename F>
    void finish(F&&, Tensor&, int64_t, const std::vector<int64_t>&) {}

   private:
    int64_t H_, R_, G_;
    const T* b_hh_;
    T* ghn_ = nullptr;
  };

  template <typename T>
  class Backward {
   public:
    Backward(const CellShape& s, const Saved& saved, Workspace<T>&)
        : H_(s.H), R_(s.R), ghn_(saved.ghn.template data<T>()) {}

    void start(const Tensor&, int64_t, const std::vector<int64_t>&) {}

    // dG_x into st.dg, dG_h into st.dgh, dh * z (the part of dh_prev that
    // bypasses W_hh) into st.dh_prev.
    void step(const BackwardStep<T>& st) const {
      cpu::gru_gates_backward<T>(st.cap, st.n, H_, st.k0, st.k1, st.gates, ghn_ + st.r0 * H_,
                                 st.h_prev, R_, st.dh, st.ld_dh, st.dg, st.dgh, st.dh_prev,
                                 st.db_ih, st.db_hh, st.dgx_sink, st.dg_sink);
    }

    void finish(Tensor&, int64_t, const std::vector<int64_t>&) const {}

   private:
    int64_t H_, R_;
    const T* ghn_;
  };
};

}  // namespace seqpack::rnn
