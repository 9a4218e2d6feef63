// The LSTM cell of the recurrent core (rnn/cell.h says what a cell is):
//   i = σ(W_ii x + b_ii + W_hi h_{t-1} + b_hi)    f, o likewise with σ
//   g = tanh(W_ig x + b_ig + W_hg h_{t-1} + b_hg)
//   c_t = f * c_{t-1} + i * g
//   h_t = o * tanh(c_t)   (then h_t = W_hr h_t with a projection, a product
//                          the time loop runs after the cell)
// The cell owns c: its state rows (c0 before the first step, each row's last
// c after the loop), the c it saves per packed row, and dc in the backward.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/buffer_pool.h"
#include "cpu/rnn_gates.h"
#include "cpu/scratch.h"
#include "rnn/cell.h"
#include "rnn/state_rows.h"

namespace seqpack::rnn {

struct LstmCell {
  // c beside h: c0 and c_n, c saved per row, dc in the backward.
  static constexpr bool cell_state = true;
  // The step's product goes to a buffer of its own (the loop's gh) instead of
  // being added to the gate rows; in the backward the product's operand dG_h
  // is then apart from dG_x (W_ih's), each kept on its own.
  static constexpr bool hidden_apart = false;
  // The input projection carries b_hh with b_ih.
  static constexpr bool b_hh_in_projection = true;
  // The forward kernel reads h_prev's fp32 rows, so the loop writes them even
  // where the product reads the engine's rows.
  static constexpr bool reads_h_prev = false;
  // A lookup layer's rows may enter the product as its init rows.
  static constexpr bool lookup_in_product = true;
  // The kernels add a lookup layer's rows themselves (forward: into the
  // pre-activations; backward: dG into the rows of dP).
  static constexpr bool lookup_in_kernel = true;
  // db_hh summed apart from db_ih (else the same sums, copied after the steps).
  static constexpr bool separate_db_hh = false;
  // The backward kernel writes the part of dh_prev that bypasses W_hh, so dh
  // is read from a copy and the product adds to it (beta 1).
  static constexpr bool dh_prev_in_kernel = false;

  // Kept for the backward: c after each packed row's step [N, H], and c0 [B, H]
  // in length-sorted order (zeros without c0).
  struct Saved {
    Tensor c, c0;
  };

  // One direction's c [B, H] of each state row (forward), or dc (backward).
  template <typename T>
  struct Workspace {
    cpu::Scratch<T> c;
    void resize(const CellShape& s) { c.resize_for_overwrite(static_cast<std::size_t>(s.B * s.H)); }
  };

  template <typename T>
  class Forward {
   public:
    // With `saved`, c is written per packed row into saved->c (the state rows
    // are then only c0 and, after finish(), c_n); else updated in place.
    Forward(const CellShape& s, const T* /*b_hh*/, Workspace<T>& ws, Saved* saved)
        : H_(s.H), G_(s.G), B_(s.B), dtype_(s.dtype), cstate_(ws.c.data()), saved_(saved) {
      if (saved_) {
        saved_->c = cpu::pooled_empty({s.N, H_}, dtype_);
        cs_ = saved_->c.template data<T>();
      }
    }

    // c0 (layer and direction ld of it, or zeros) into the state rows.
    void start(const Tensor& c0, int64_t ld, const std::vector<int64_t>& sorted) {
      load_state(cstate_, c0, ld, sorted, H_);
      if (saved_) {
        saved_->c0 = cpu::pooled_empty({B_, H_}, dtype_);
        std::copy(cstate_, cstate_ + B_ * H_, saved_->c0.template data<T>());
      }
    }

    void step(const ForwardStep<T>& st) const {
      T* cstate = cstate_ + st.j0 * H_;
      T* cdst = cs_ ? cs_ + st.r0 * H_ : cstate;
      // Rows [lo, hi) with c_prev their c entering the step.
      auto rows = [&](int64_t lo, int64_t hi, const T* c_prev) {
        by_sink(st, lo, hi, [&](int64_t r0, int64_t r1, cpu::RowSink h_next) {
          cpu::lstm_gates_forward<T>(
              st.cap, r1 - r0, H_, st.k0, st.k1, st.g + r0 * G_, c_prev + (r0 - lo) * H_, H_,
              cdst + r0 * H_, H_, st.h + r0 * st.ldh, st.ldh, st.x_rows ? st.x_rows + r0 : nullptr,
              st.next_g, st.next_len, h_next);
        });
      };
      if (cs_) {  // c_prev: the previous step's saved c, or c0 (no copy back into the state)
        rows(0, st.cont, cs_ + st.r_prev * H_);
        rows(st.cont, st.n, cstate + st.cont * H_);
      } else {  // c updated in place in the state
        rows(0, st.n, cstate);
      }
    }

    // c_n from the state rows; final_rows(state, src, ld, width) first takes
    // each row's last c from the saved rows where they went there.
    template <typename F>
    void finish(F&& final_rows, Tensor& c_n, int64_t ld, const std::vector<int64_t>& sorted) {
      if (cs_) final_rows(cstate_, cs_, H_, H_);
      store_state(c_n, cstate_, ld, sorted, H_);
    }

    T* state() const { return cstate_; }

   private:
    int64_t H_, G_, B_;
    DType dtype_;
    T* cstate_;
    Saved* saved_;
    T* cs_ = nullptr;
  };

  template <typename T>
  class Backward {
   public:
    Backward(const CellShape& s, const Saved& saved, Workspace<T>& ws)
        : H_(s.H),
          G_(s.G),
          c_(saved.c.template data<T>()),
          c0_(saved.c0.template data<T>()),
          dc_(ws.c.data()) {}

    // dc of the last steps: grad_c_n (or zeros).
    void start(const Tensor& grad_c_n, int64_t ld, const std::vector<int64_t>& sorted) {
      load_state(dc_, grad_c_n, ld, sorted, H_);
    }

    // c entering the step: the previous step's c for the rows that continue
    // from it (its first rows, in length-sorted order), c0 for the others.
    void step(const BackwardStep<T>& st) const {
      if (st.cont > 0) rows(st, 0, st.cont, c_ + st.r_prev * H_);
      rows(st, st.cont, st.n, c0_ + (st.j0 + st.cont) * H_);
    }

    // grad c0 from the state rows.
    void finish(Tensor& grad_c0, int64_t ld, const std::vector<int64_t>& sorted) const {
      store_state(grad_c0, dc_, ld, sorted, H_);
    }

    T* state() const { return dc_; }

   private:
    // Rows [lo, hi) of a step through the backward kernel, c_prev being their
    // c entering the step.
    void rows(const BackwardStep<T>& st, int64_t lo, int64_t hi, const T* c_prev) const {
      if (hi <= lo) return;
      cpu::lstm_gates_backward<T>(st.cap, hi - lo, H_, st.k0, st.k1, st.gates + lo * G_,
                                  c_ + (st.r0 + lo) * H_, c_prev, st.dh + lo * st.ld_dh, st.ld_dh,
                                  dc_ + (st.j0 + lo) * H_, st.dg + lo * G_, st.db_ih,
                                  st.dx_rows ? st.dx_rows + lo : nullptr, st.dg_sink.from_row(lo));
    }

    int64_t H_, G_;
    const T* c_;
    const T* c0_;
    T* dc_;
  };
};

}  // namespace seqpack::rnn
