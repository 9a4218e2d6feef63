// Fused elementwise gate kernels of the recurrent layers, one call per time
// step over that step's live rows. The matrix products (X·W_ihᵀ, h·W_hhᵀ) are
// done by the caller through cpu::gemm; these kernels do everything between
// two GEMMs in one pass so each gate row is read and written once.
//
// float32 dispatches at run time to the best Highway target of the CPU under
// the call's ISA cap (`cap`, a plan's RNNConfig::kernels; rnn_gates_f32_hwy.cpp);
// float64 uses the scalar loops of rnn_gates_scalar.h (and ignores the cap).
//
// Each call covers hidden units (columns) [k0, k1) of every gate, so threads
// can split a step by columns; pass [0, H) for the whole step.
//
// Bias gradients: the backward kernels optionally add each row's gate
// gradients into `dbias` accumulators (the caller zeroes them once before the
// time loop), which saves the separate column-sum pass over the [N, G]
// gradient buffers after it. Only columns [k0, k1) are touched, so threads
// splitting a step by columns never share an accumulator element.
//
// Side-written rows (optional, the *_sink arguments, cpu/row_sink.h): the
// rows of the engine's next product in its operand form, row 0 of the sink
// being the kernel's row 0. The kernel also writes each value it writes to
// the matching fp32 rows in the sink's form (bf16: bf16_of, cpu/bf16.h), in
// the same layout (h: the sink's row stride; gate gradients: their own, G),
// while the value is in a register: the engine's next product reads them with
// no conversion pass of its own. Empty (fp32 and f64 engines): nothing else
// is written. float32 has an instantiation per sink element; float64 takes
// none.
//
// Row layouts (n rows, hidden size H):
//   LSTM gates [n, 4H] in the order i, f, g, o;  GRU gates [n, 3H] r, z, n;
//   RNN gates [n, H]. `ld_*` are row strides in elements.
#pragma once

#include <cstdint>

#include "cpu/isa_cap.h"
#include "cpu/row_sink.h"

namespace seqpack::cpu {

// gates: pre-activations in, activations (σ(i), σ(f), tanh(g), σ(o)) out.
// c = f * c_prev + i * g;  h = o * tanh(c). c_prev may alias c (same rows).
// x_rows (optional, n pointers to [4H] rows): row r's pre-activations are
// gates[r] + x_rows[r] (a lookup layer's projected input rows, read where
// they are instead of being copied into the gates first). next, next_len
// (optional): memory the caller writes next (the next step's gate rows),
// prefetched for writing while the kernel computes (a hint: the values are
// untouched).
template <typename T>
void lstm_gates_forward(IsaLevel cap, int64_t n, int64_t H, int64_t k0, int64_t k1, T* gates,
                        const T* c_prev, int64_t ld_cprev, T* c, int64_t ld_c, T* h, int64_t ld_h,
                        const T* const* x_rows = nullptr, const T* next = nullptr,
                        int64_t next_len = 0, RowSink h_sink = {});

// dh: gradient of h (or of o * tanh(c) under a projection). dc: gradient of c
// from the next step on entry, gradient of c_prev on exit. dgates: gradient of
// the gate pre-activations [n, 4H]. dbias (optional, [4H]): += the column
// sums of dgates, the gradient of both b_ih and b_hh. dx_rows (optional, n
// pointers to [4H] rows): dx_rows[r] += dgates[r], row by row in order (a
// lookup layer's gradient of the table row that row r read; rows may share
// a pointer).
template <typename T>
void lstm_gates_backward(IsaLevel cap, int64_t n, int64_t H, int64_t k0, int64_t k1, const T* gates,
                         const T* c, const T* c_prev, const T* dh, int64_t ld_dh, T* dc, T* dgates,
                         T* dbias = nullptr, T* const* dx_rows = nullptr, RowSink dgates_sink = {});

// gx: W_i x + b_i in, activations (r, z, n) out. gh: W_h h_prev without bias;
// b_hh may be null. ghn (optional, [n, H]) receives W_hn h_prev + b_hn, which
// the backward needs.
template <typename T>
void gru_gates_forward(IsaLevel cap, int64_t n, int64_t H, int64_t k0, int64_t k1, T* gx,
                       const T* gh, const T* b_hh, const T* h_prev, int64_t ld_hprev, T* h,
                       int64_t ld_h, T* ghn, RowSink h_sink = {});

// dgx: gradient of W_i x + b_i [n, 3H]; dgh: of W_h h_prev + b_h [n, 3H];
// dh_prev: the part of dL/dh_prev that bypasses W_hh (dh * z), ld H.
// db_ih, db_hh (optional, [3H] each, both or neither): += the column sums of
// dgx and dgh, the gradients of b_ih and b_hh.
template <typename T>
void gru_gates_backward(IsaLevel cap, int64_t n, int64_t H, int64_t k0, int64_t k1, const T* gates,
                        const T* ghn, const T* h_prev, int64_t ld_hprev, const T* dh, int64_t ld_dh,
                        T* dgx, T* dgh, T* dh_prev, T* db_ih = nullptr, T* db_hh = nullptr,
                        RowSink dgx_sink = {}, RowSink dgh_sink = {});

// gates: pre-activation in, h = tanh or relu out; h is also written to `h`.
template <typename T>
void rnn_gates_forward(IsaLevel cap, int64_t n, int64_t H, int64_t k0, int64_t k1, T* gates,
                       bool relu, T* h, int64_t ld_h, RowSink h_sink = {});

// dpre = dh * act'(pre), from the saved h. dbias (optional, [H]): += the
// column sums of dpre, the gradient of both b_ih and b_hh.
template <typename T>
void rnn_gates_backward(IsaLevel cap, int64_t n, int64_t H, int64_t k0, int64_t k1,
                        const T* h_saved, bool relu, const T* dh, int64_t ld_dh, T* dpre,
                        T* dbias = nullptr, RowSink dpre_sink = {});

// y[i] = σ(x[i]) / tanh(x[i]) for i < n with the float32 kernels' vector
// formulas (no scalar tail), so tests can sweep their accuracy. y may alias x.
void sigmoid_f32(IsaLevel cap, int64_t n, const float* x, float* y);
void tanh_f32(IsaLevel cap, int64_t n, const float* x, float* y);

// Name of the SIMD target the float32 kernels dispatch to under `cap`
// ("AVX2", "AVX3", ...).
const char* rnn_gates_f32_target(IsaLevel cap);

}  // namespace seqpack::cpu
