// What a cell of the recurrent core sees: one step's rows of one thread
// (ForwardStep, BackwardStep: row ranges and pointers, nothing of the time
// loop), and the shape of its direction (CellShape). Each cell
// (rnn/cell_lstm.h, rnn/cell_gru.h, rnn/cell_rnn.h) is a type with
//   - traits (static constexpr bool), read by the time loop (rnn/time_loop.h)
//     and the workspaces: the loop never asks which cell it runs;
//   - Saved: what it keeps for the backward beyond the loop's own (the
//     gates, h_prev), held in RNNSaved::Direction::cell;
//   - Workspace<T>: its buffers of one direction, allocated once per call;
//   - Forward<T>, Backward<T>: one direction's step math, built on its
//     workspace and saved state, with a step(st) that runs the gate kernels
//     (cpu/rnn_gates.h) over the step's rows and columns. A cell never waits
//     for a thread and never decides which rows are its thread's.
// The CellTester (tests/cell_tester.h) runs each step alone against the
// float64 reference's row math (src/reference/rnn_reference.h).
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu/row_sink.h"
#include "seqpack/rnn.h"

namespace seqpack::rnn {

// A direction's sizes, as a cell needs them.
struct CellShape {
  int64_t H = 0;  // hidden units
  int64_t R = 0;  // width of h (proj_size, or H)
  int64_t G = 0;  // gate columns (gates × H)
  int64_t B = 0;  // state rows (the batch)
  int64_t N = 0;  // packed rows
  DType dtype = DType::f32;
  bool relu = false;  // RNN: relu, else tanh

  static CellShape of(const RNNOptions& o, int64_t batch, int64_t rows) {
    return {o.hidden_size, o.real_hidden_size(),       o.gate_count() * o.hidden_size, batch, rows,
            o.dtype,       o.mode == RNNMode::rnn_relu};
  }
};

// The rows of one forward step of one thread, as the cells see them.
template <typename T>
struct ForwardStep {
  int64_t n = 0;           // live rows (of this thread, under a row split)
  int64_t ng = 0;          // rows whose h_prev is not the zero h0 (the product's rows)
  int64_t cont = 0;        // rows that continue from the previous step (the others begin here)
  int64_t r_prev = 0;      // first packed row of those rows at the previous step
  int64_t r0 = 0;          // first packed row
  int64_t j0 = 0;          // first state row (row split: > 0 past the first thread)
  int64_t k0 = 0, k1 = 0;  // hidden units [k0, k1) of every gate: this thread's columns
  T* g = nullptr;          // gate rows [n, G]: X·W_ihᵀ + b (+ W_hh h_prev) on entry
  T* gh = nullptr;         // a hidden_apart cell's product rows [n, G] (else g)
  T* out = nullptr;        // output rows, stride ldo
  T* h = nullptr;          // where the cell writes h (out, or before a projection m), stride ldh
  int64_t ldh = 0;
  const T* h_prev = nullptr;         // [n, R]
  const T* const* init = nullptr;    // lookup rows fed into the product (engine's init)
  const T* const* x_rows = nullptr;  // lookup rows the gate kernel adds to g (lookup_in_kernel)
  const T* next_g = nullptr;         // the next step's gate rows (a prefetch hint)
  int64_t next_len = 0;              // their elements
  int64_t h_row = 0;                 // row of h_prev's rows in the engine's store
  cpu::RowSink h_next;               // where the kernel writes h's rows for the next
                                     // step's product (the engine's sink, or empty)
  int64_t n_next = 0;                // rows that have one there (they continue)
  cpu::IsaLevel cap = cpu::IsaLevel::avx512;  // the gate kernels' (the plan's config's)
};

// f(r0, r1, h_next) over rows [lo, hi) of a step, split where the rows with a
// row in the sink (the first n_next) end: h_next is the sink from their row
// r0 on, empty for the others.
template <typename T, typename F>
void by_sink(const ForwardStep<T>& st, int64_t lo, int64_t hi, F&& f) {
  const int64_t mid = std::clamp(st.n_next, lo, hi);
  if (mid > lo) f(lo, mid, st.h_next.from_row(lo));
  if (hi > mid) f(mid, hi, cpu::RowSink{});
}

// The rows of one backward step of one thread, as the cells see them.
template <typename T>
struct BackwardStep {
  int64_t n = 0;              // live rows (of this thread, under a row split)
  int64_t ng = 0;             // rows whose dh_prev is needed (not the h0 rows without grad h0)
  int64_t cont = 0;           // rows that continued from the forward's previous step
  int64_t r_prev = 0;         // first packed row of those rows at that step
  int64_t r0 = 0;             // first packed row
  int64_t j0 = 0;             // first state row (row split: > 0 past the first thread)
  int64_t k0 = 0, k1 = 0;     // hidden units [k0, k1) of every gate: this thread's columns
  const T* gates = nullptr;   // the saved gate activations of the rows [n, G]
  const T* h_prev = nullptr;  // the saved h_prev of the rows [n, R] (where saved)
  const T* dh = nullptr;      // dh of the step's output rows [n, R] (under a projection,
                              // once through W_hr: dm [n, H]), stride ld_dh
  int64_t ld_dh = 0;
  T* dg = nullptr;              // gate-gradient rows [n, G] (a hidden_apart cell: dG_x)
  T* dgh = nullptr;             // a hidden_apart cell's dG_h rows [n, G] (else dg)
  T* dh_prev = nullptr;         // a dh_prev_in_kernel cell's direct part of dh_prev [n, R]
  T* db_ih = nullptr;           // where the step adds the bias gradients (or null)
  T* db_hh = nullptr;           // (a separate_db_hh cell's)
  T* const* dx_rows = nullptr;  // a lookup layer's dP row of each row (lookup_in_kernel)
  cpu::RowSink dg_sink;         // where the kernel writes dG_h's rows in the engine's form
  cpu::RowSink dgx_sink;        // a hidden_apart cell's dG_x rows in the engine's form
  cpu::IsaLevel cap = cpu::IsaLevel::avx512;  // the gate kernels' (the plan's config's)
};

}  // namespace seqpack::rnn
