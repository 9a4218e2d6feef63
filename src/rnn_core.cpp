// The packed-native functional core: rnn_forward and rnn_backward.
//
// Per layer and direction the forward does
//   1. ONE GEMM over all packed rows: G = X·W_ihᵀ + b (the input projection);
//   2. per step t, ONE GEMM of only its live rows (batch_sizes[t]) with W_hh,
//      accumulated into that step's rows of G;
//   3. the cell's step math over those rows (fused gate kernels, src/cpu/rnn_gates.h).
// The hidden state lives in a [batch, H] buffer in length-sorted order: the
// live rows of step t are its first batch_sizes[t] rows, so a sequence that
// ended keeps its final state in place and, in the reverse direction, a
// sequence that starts at step t still holds h0. That gives h_n at each
// sequence's own last step with no bookkeeping.
//
// The backward keeps per packed row what it needs (gate activations, c, c_prev,
// h_prev aligned with the gate rows), walks the steps only for the dh/dc
// recurrence (one GEMM of live rows per step), then computes dW_ih, dX, dW_hh
// and the biases each with ONE GEMM (or one pass) over all packed rows, so its
// cost is linear in the number of tokens.
//
// Shape of the code: forward_impl/backward_impl are the grid (layers ×
// directions); ForwardDirection/BackwardDirection hold one layer and
// direction and run the time loop, written once for every cell: each step
// runs its phases (before the product, the product, after it) with the
// barriers between them, and hands its rows to the cell's step math
// (LstmCell, GruCell, RnnCell: each cell's traits and kernels in one place).
// Every matrix product goes through the call's GEMM engine (cpu/gemm_engine.h), chosen
// from the dtype and RNNOptions::precision: a precision is an engine, and
// nothing here knows which one runs. Threading (two directions side by side,
// or one direction's columns split over threads, or its sequences where the
// engine prefers rows: rows_split) and the embedding-lookup
// fusion are properties of the loop, not of the cells.
#include <omp.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cpu/buffer_pool.h"
#include "cpu/gemm.h"
#include "cpu/gemm_engine.h"
#include "cpu/gemm_int8.h"
#include "cpu/omp_errors.h"
#include "cpu/rnn_gates.h"
#include "cpu/scratch.h"
#include "seqpack/rnn.h"

namespace seqpack {

struct RNNSaved {
  struct Direction {
    Tensor gates;   // [N, G] gate activations (RNN: h itself)
    Tensor h_prev;  // [N, R] h entering each row's step
    Tensor c;       // LSTM [N, H] c after the step (c entering a step is the
                    // previous step's, or c0 for a row that begins there)
    Tensor c0;      // LSTM [B, H] c0 in length-sorted order (zeros without c0)
    Tensor m;       // LSTM with projection [N, H]: o * tanh(c), before W_hr
    Tensor ghn;     // GRU [N, H]: W_hn h_prev + b_hn
    // h_prev's rows in the engine's form for dW_hh (the bf16 engine's, where
    // it multiplies dW_hh in bf16; else null). With it, h_prev is undefined
    // where only dW_hh would read it (LSTM, RNN, steps read from the store).
    std::shared_ptr<cpu::RowStore> h_prev_kept;
  };
  struct Layer {
    Tensor input;  // [N, in] what W_ih saw (after dropout); layer 0 of a lookup: the table
    Tensor mask;   // dropout mask (0 or 1/(1-p)) applied to the input, or undefined
    std::vector<Direction> dirs;
  };
  RNNOptions options;
  std::vector<Tensor> weights;
  bool h0_zero = false;          // the forward ran without h0
  std::vector<int64_t> lookup;   // rnn_forward_lookup: table row of each packed row
  std::vector<int64_t> batch_sizes, offsets, sorted_indices;
  int64_t batch = 0, total_rows = 0;
  std::vector<Layer> layers;
};

namespace {

template <typename T>
struct DirWeights {
  const T* w_ih = nullptr;
  const T* w_hh = nullptr;
  const T* b_ih = nullptr;
  const T* b_hh = nullptr;
  const T* w_hr = nullptr;
  int64_t first = 0;  // index of w_ih in the flat weight list
};

int64_t params_per_direction(const RNNOptions& o) {
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

void check_state(const Tensor& s, const Shape& want, DType dtype, const char* what) {
  if (!s.defined()) return;
  if (s.shape() != want) {
    throw std::invalid_argument(std::string(what) + " has shape " + shape_str(s.shape()) +
                                ", expected " + shape_str(want));
  }
  if (s.dtype() != dtype) {
    throw std::invalid_argument(std::string(what) + " has dtype " + dtype_name(s.dtype()) +
                                ", expected " + dtype_name(dtype));
  }
}

void check_weights(const RNNOptions& o, const std::vector<Tensor>& weights) {
  const auto names = rnn_parameter_names(o);
  const auto shapes = rnn_parameter_shapes(o);
  if (weights.size() != names.size()) {
    throw std::invalid_argument("expected " + std::to_string(names.size()) +
                                " weight tensors for these options, got " +
                                std::to_string(weights.size()));
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    const Tensor& w = weights[i];
    if (!w.defined() || w.shape() != shapes[i]) {
      throw std::invalid_argument(names[i] + " has shape " +
                                  (w.defined() ? shape_str(w.shape()) : "undefined") +
                                  ", expected " + shape_str(shapes[i]));
    }
    if (w.dtype() != o.dtype) {
      throw std::invalid_argument(names[i] + " has dtype " + dtype_name(w.dtype()) + ", expected " +
                                  dtype_name(o.dtype));
    }
  }
}

// Threads for the splitting of one direction's steps: OpenMP's count, but at
// least 128 hidden units per thread. Below that the per-step barriers cost more
// than the split saves (and on a loaded machine a barrier waiting for a
// descheduled thread costs far more: rnn-tanh-tiny, H = 64, ran 2000x slower
// on two threads with 32 units each). A row split (by_rows) has no barrier
// in its steps: every thread.
int step_threads(int64_t H, bool by_rows) {
  if (by_rows) return omp_get_max_threads();
  const int64_t by_width = std::max<int64_t>(1, H / 128);
  return static_cast<int>(std::min<int64_t>(omp_get_max_threads(), by_width));
}

// Columns [a, b) of [0, width) owned by thread `tid` of `nth`, in blocks of 16
// so that each thread's SIMD vectors stay whole.
void split_columns(int64_t width, int nth, int tid, int64_t& a, int64_t& b) {
  const int64_t blocks = (width + 15) / 16;
  a = std::min(width, blocks * tid / nth * 16);
  b = std::min(width, blocks * (tid + 1) / nth * 16);
}

// Runs body(tid, nth) on `nt` threads. The caller holds a
// cpu::BlasSingleThread, so each thread's BLAS calls stay on that thread.
template <typename F>
void run_threads(int nt, F&& body) {
  if (nt <= 1) {
    body(0, 1);
    return;
  }
  // No exception may leave the region (std::terminate): kept, rethrown after it.
  cpu::OmpErrors errors;
  // The caller's int8 weights (a thread's own) go with it to every thread.
  const std::vector<cpu::PreparedInt8>* prepared = cpu::prepared_int8_in_scope();
#pragma omp parallel num_threads(nt)
  errors.run([&] {
    const cpu::PreparedInt8Scope scope(prepared);
    // The column split (and the engine's step ranges) were planned for nt
    // threads; a smaller team runs it all on one thread.
    if (omp_get_num_threads() == nt) {
      body(omp_get_thread_num(), nt);
    } else if (omp_get_thread_num() == 0) {
      body(0, 1);
    }
  });
  errors.rethrow();
}

// The GEMM engine of a call: its element type and precision decide it.
template <typename T>
const cpu::GemmEngine<T>& engine_for(const RNNOptions& o) {
  if constexpr (std::is_same_v<T, float>) {
    return cpu::gemm_engine_f32(o.precision);
  } else {
    return cpu::gemm_engine_f64();
  }
}

// Whether a direction's threads split its steps by rows (whole sequences per
// thread) rather than by columns: the engine's choice for W_hh [R, G].
template <typename T>
bool rows_split(const cpu::GemmEngine<T>& eng, const RNNOptions& o) {
  return eng.steps_by_rows(o.real_hidden_size(), o.gate_count() * o.hidden_size);
}

// Column ranges of a per-step product over `blocks` blocks of `width`
// columns: index 0 is all of them (one thread); then, for each thread of
// `nt`, its share [a, b) of every block (split_columns), so that thread tid's
// range of block q is step_range(nth, tid, blocks, q).
std::vector<cpu::ColumnRange> step_ranges(int64_t width, int64_t blocks, int nt) {
  std::vector<cpu::ColumnRange> r{{0, width * blocks}};
  if (nt <= 1) return r;
  for (int tid = 0; tid < nt; ++tid) {
    int64_t a, b;
    split_columns(width, nt, tid, a, b);
    for (int64_t q = 0; q < blocks; ++q) r.emplace_back(q * width + a, q * width + b);
  }
  return r;
}
std::size_t step_range(int nth, int tid, int64_t blocks, int64_t q) {
  return nth == 1 ? 0 : static_cast<std::size_t>(1 + tid * blocks + q);
}

// Rows of step t (of `bs`, `TT` steps) whose h_prev is not h0: the forward
// direction's steps after the first continue every live row; in the reverse
// direction rows bs[t+1].. begin at step t. With a zero h0 the product of the
// other rows with W_hh is zero, and in the backward it only feeds grad h0.
int64_t rows_after_h0(const std::vector<int64_t>& bs, int64_t t, int64_t d) {
  const int64_t TT = static_cast<int64_t>(bs.size());
  if (d == 0) return t == 0 ? 0 : bs[static_cast<std::size_t>(t)];
  return t + 1 < TT ? bs[static_cast<std::size_t>(t + 1)] : 0;
}

template <typename T>
void copy_rows(T* dst, int64_t ld_dst, const T* src, int64_t ld_src, int64_t rows, int64_t cols) {
  if (ld_dst == cols && ld_src == cols) {
    std::memcpy(dst, src, static_cast<std::size_t>(rows * cols) * sizeof(T));
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + r * ld_dst, src + r * ld_src, static_cast<std::size_t>(cols) * sizeof(T));
  }
}

// state[j] = s[ld][sorted[j]] (sorted order), or zeros when s is undefined.
template <typename T>
void load_state(T* state, const Tensor& s, int64_t ld, const std::vector<int64_t>& sorted,
                int64_t width) {
  const int64_t B = static_cast<int64_t>(sorted.size());
  if (!s.defined()) {
    std::memset(state, 0, static_cast<std::size_t>(B * width) * sizeof(T));
    return;
  }
  const T* src = s.data<T>() + ld * B * width;
  for (int64_t j = 0; j < B; ++j) {
    std::memcpy(state + j * width, src + sorted[static_cast<std::size_t>(j)] * width,
                static_cast<std::size_t>(width) * sizeof(T));
  }
}

template <typename T>
void store_state(Tensor& s, const T* state, int64_t ld, const std::vector<int64_t>& sorted,
                 int64_t width) {
  const int64_t B = static_cast<int64_t>(sorted.size());
  T* dst = s.data<T>() + ld * B * width;
  for (int64_t j = 0; j < B; ++j) {
    std::memcpy(dst + sorted[static_cast<std::size_t>(j)] * width, state + j * width,
                static_cast<std::size_t>(width) * sizeof(T));
  }
}

template <typename T>
Tensor dropout_mask(int64_t rows, int64_t cols, double p, uint64_t seed, int64_t layer) {
  Tensor mask = cpu::pooled_empty({rows, cols}, dtype_of<T>());
  // One stream per layer so masks do not depend on the other layers' sizes.
  std::mt19937_64 gen(seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(layer));
  std::bernoulli_distribution keep(1.0 - p);
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  T* m = mask.data<T>();
  for (int64_t i = 0; i < mask.numel(); ++i) m[i] = keep(gen) ? scale : T(0);
  return mask;
}

// ---------------------------------------------------------------------------
// The forward. forward_impl is the grid (layers, directions); ForwardDirection
// holds one layer and direction: its input projection, its step operands and
// its time loop, whose body hands each step's rows to the cell's step math.
// ---------------------------------------------------------------------------

// Rows [bounds[i], bounds[i + 1]) for thread i of nt under a row split:
// contiguous in the length-sorted order, each holding about 1/nt of the
// tokens (row j lives in the steps t with j < bs[t]). A row is one sequence
// from its first step to its last, so its thread owns it for the whole loop.
std::vector<int64_t> row_bounds(const std::vector<int64_t>& bs, int64_t B, int nt) {
  std::vector<int64_t> ending(static_cast<std::size_t>(B + 1), 0);  // steps with bs[t] = v
  for (int64_t n : bs) ++ending[static_cast<std::size_t>(n)];
  std::vector<int64_t> tokens(static_cast<std::size_t>(B + 1), 0);  // in rows [0, r)
  int64_t len = static_cast<int64_t>(bs.size());                    // length of row r
  for (int64_t r = 0; r < B; ++r) {
    len -= ending[static_cast<std::size_t>(r)];
    tokens[static_cast<std::size_t>(r + 1)] = tokens[static_cast<std::size_t>(r)] + len;
  }
  std::vector<int64_t> bounds{0};
  for (int i = 1; i < nt; ++i) {
    int64_t r = bounds.back();
    while (r < B && tokens[static_cast<std::size_t>(r)] * nt < tokens.back() * i) ++r;
    bounds.push_back(r);
  }
  bounds.push_back(B);
  return bounds;
}

// This thread's share of a step among nth threads. By columns (the
// default): hidden units [a, b) of every gate and columns [ra, rb) of h
// (split_columns), for all of the step's rows. By rows (engines whose
// rows_split, on several threads; `bounds` from row_bounds): every
// column, for this thread's rows of each step, the same rows all along.
struct Split {
  int tid = 0, nth = 1;
  bool by_rows = false;
  int64_t a = 0, b = 0, ra = 0, rb = 0;
  int64_t row0 = 0, row1 = 0;  // a row split's rows
  Split(int tid_, int nth_, int64_t H, int64_t R, const std::vector<int64_t>& bounds)
      : tid(tid_), nth(nth_), by_rows(!bounds.empty() && nth_ > 1) {
    split_columns(H, by_rows ? 1 : nth, by_rows ? 0 : tid, a, b);
    split_columns(R, by_rows ? 1 : nth, by_rows ? 0 : tid, ra, rb);
    if (by_rows) {
      row0 = bounds[static_cast<std::size_t>(tid)];
      row1 = bounds[static_cast<std::size_t>(tid + 1)];
    }
  }
  // This thread's rows [first, last) of a step of n rows.
  std::pair<int64_t, int64_t> rows(int64_t n) const {
    if (!by_rows) return {0, n};
    return {std::min(n, row0), std::min(n, row1)};
  }
  // The engine's range (step_ranges) of this thread's columns of block q of `blocks`.
  std::size_t range(int64_t blocks, int64_t q) const {
    return by_rows ? 0 : step_range(nth, tid, blocks, q);
  }
};

// The threads of a column split meet inside a step (a product reads every
// column of its rows). Those of a row split never meet in the loop: each
// row's state is read and written by its thread alone.
inline void columns_barrier(const Split& sp) {
  if (sp.nth > 1 && !sp.by_rows) {
#pragma omp barrier
  }
}

// ---------------------------------------------------------------------------
// The cells. Each says in one place what the time loop needs to know of it
// (its traits, read by the loop and the workspaces: the loop never asks which
// cell it runs) and holds its step math: the gate kernels over a step's rows,
// forward after the step's product, backward before it. The loop runs the
// phases (before the product, the product, after it), the barriers between
// them and the rows each thread owns; a cell sees its rows (ForwardStep,
// BackwardStep) and its direction's buffers, and never waits for a thread.
// ---------------------------------------------------------------------------

// LSTM: c_t = f * c_{t-1} + i * g, h_t = o * tanh(c_t) (then h_t = W_hr h_t
// with a projection, a product the loop runs after the cell).
struct LstmCell {
  // c beside h: c0 and c_n, c saved per row, dc in the backward.
  static constexpr bool cell_state = true;
  // The step's product goes to a buffer of its own (ws.gh) instead of being
  // added to the gate rows; in the backward the product's operand dG_h is then
  // apart from dG_x (W_ih's), each kept on its own.
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
  // W_hn h_prev + b_hn saved per row (ghn).
  static constexpr bool saves_ghn = false;

  static void forward(auto& fd, const auto& st, const Split& sp) {
    using T = typename std::remove_reference_t<decltype(fd)>::Scalar;
    const int64_t H = fd.H, G = fd.G;
    T* cstate = fd.ws.cstate.data() + st.j0 * H;
    T* cdst = fd.save ? fd.cs + st.r0 * H : cstate;
    // Rows [lo, hi) with c_prev their c entering the step.
    auto rows = [&](int64_t lo, int64_t hi, const T* c_prev) {
      fd.by_sink(st, lo, hi, [&](int64_t r0, int64_t r1, cpu::RowSink h_next) {
        cpu::lstm_gates_forward<T>(r1 - r0, H, sp.a, sp.b, st.g + r0 * G, c_prev + (r0 - lo) * H, H,
                                   cdst + r0 * H, H, st.h + r0 * st.ldh, st.ldh,
                                   st.x_rows ? st.x_rows + r0 : nullptr, st.next_g, st.next_len,
                                   h_next);
      });
    };
    if (fd.save) {  // c_prev: the previous step's saved c, or c0 (no copy back into the state)
      rows(0, st.cont, fd.cs + st.r_prev * H);
      rows(st.cont, st.n, cstate + st.cont * H);
    } else {  // c updated in place in the state
      rows(0, st.n, cstate);
    }
  }

  static void backward(auto& bd, const auto& st, const Split& sp) {
    // c entering the step: the previous step's c for the rows that continue
    // from it (its first rows, in length-sorted order), c0 for the others;
    // under a row split, of this thread's rows.
    using T = typename std::remove_reference_t<decltype(bd)>::Scalar;
    const int64_t H = bd.H, d = bd.d;
    const auto& sv = bd.sv;
    const int64_t cont =
        std::clamp<int64_t>(rows_after_h0(sv.batch_sizes, st.t, d) - st.j0, 0, st.n);
    const int64_t prev = d == 0 ? st.t - 1 : st.t + 1;
    if (cont > 0) {
      rows_backward(bd, st, 0, cont,
                    bd.sd.c.template data<T>() + (sv.offsets[std::size_t(prev)] + st.j0) * H, sp);
    }
    rows_backward(bd, st, cont, st.n, bd.sd.c0.template data<T>() + (st.j0 + cont) * H, sp);
  }

  // Rows [lo, hi) of a step through the backward kernel, c_prev being their
  // c entering the step.
  template <typename T>
  static void rows_backward(auto& bd, const auto& st, int64_t lo, int64_t hi, const T* c_prev,
                            const Split& sp) {
    if (hi <= lo) return;
    const int64_t H = bd.H, G = bd.G;
    const int64_t r = st.r0 + lo;
    cpu::lstm_gates_backward<T>(
        hi - lo, H, sp.a, sp.b, bd.sd.gates.template data<T>() + r * G,
        bd.sd.c.template data<T>() + r * H, c_prev, st.dh + lo * st.ld_dh, st.ld_dh,
        bd.ws.dcstate.data() + (st.j0 + lo) * H, st.dg + lo * G, bd.bias_sums(sp, bd.db_ih),
        bd.lookup_layer ? bd.ws.dproj_rows.data() + r : nullptr, bd.dgh_sink.from_row(r));
  }
};

// GRU: n = tanh(W_in x + b_in + r * (W_hn h + b_hn)), h_t = (1 - z) * n + z * h_{t-1}.
// r multiplies part of the hidden product: it has its own buffer, with b_hn.
struct GruCell {
  static constexpr bool cell_state = false;
  static constexpr bool hidden_apart = true;
  static constexpr bool b_hh_in_projection = false;
  static constexpr bool reads_h_prev = true;
  static constexpr bool lookup_in_product = false;
  static constexpr bool lookup_in_kernel = false;
  static constexpr bool separate_db_hh = true;
  static constexpr bool dh_prev_in_kernel = true;
  static constexpr bool saves_ghn = true;

  static void forward(auto& fd, const auto& st, const Split& sp) {
    using T = typename std::remove_reference_t<decltype(fd)>::Scalar;
    const int64_t H = fd.H, G = fd.G, R = fd.R;
    fd.by_sink(st, 0, st.n, [&](int64_t r0, int64_t r1, cpu::RowSink h_next) {
      cpu::gru_gates_forward<T>(r1 - r0, H, sp.a, sp.b, st.g + r0 * G, st.gh + r0 * G, fd.w.b_hh,
                                st.h_prev + r0 * R, R, st.h + r0 * st.ldh, st.ldh,
                                fd.save ? fd.ghn + (st.r0 + r0) * H : nullptr, h_next);
    });
  }

  static void backward(auto& bd, const auto& st, const Split& sp) {
    using T = typename std::remove_reference_t<decltype(bd)>::Scalar;
    const int64_t H = bd.H, G = bd.G, R = bd.R;
    cpu::gru_gates_backward<T>(st.n, H, sp.a, sp.b, bd.sd.gates.template data<T>() + st.r0 * G,
                               bd.sd.ghn.template data<T>() + st.r0 * H,
                               bd.sd.h_prev.template data<T>() + st.r0 * R, R, st.dh, st.ld_dh,
                               st.dg, bd.ws.dgh + st.r0 * G, bd.ws.dhstate.data() + st.j0 * R,
                               bd.bias_sums(sp, bd.db_ih), bd.bias_sums(sp, bd.db_hh),
                               bd.dgx_sink.from_row(st.r0), bd.dgh_sink.from_row(st.r0));
  }
};

// RNN: h_t = tanh or relu(W_ih x + b_ih + W_hh h_{t-1} + b_hh).
struct RnnCell {
  static constexpr bool cell_state = false;
  static constexpr bool hidden_apart = false;
  static constexpr bool b_hh_in_projection = true;
  static constexpr bool reads_h_prev = false;
  static constexpr bool lookup_in_product = true;
  static constexpr bool lookup_in_kernel = false;
  static constexpr bool separate_db_hh = false;
  static constexpr bool dh_prev_in_kernel = false;
  static constexpr bool saves_ghn = false;

  static bool relu(const RNNOptions& o) { return o.mode == RNNMode::rnn_relu; }

  static void forward(auto& fd, const auto& st, const Split& sp) {
    using T = typename std::remove_reference_t<decltype(fd)>::Scalar;
    const bool relu_ = relu(fd.o);
    fd.by_sink(st, 0, st.n, [&](int64_t r0, int64_t r1, cpu::RowSink h_next) {
      cpu::rnn_gates_forward<T>(r1 - r0, fd.H, sp.a, sp.b, st.g + r0 * fd.G, relu_,
                                st.h + r0 * st.ldh, st.ldh, h_next);
    });
  }

  static void backward(auto& bd, const auto& st, const Split& sp) {
    using T = typename std::remove_reference_t<decltype(bd)>::Scalar;
    cpu::rnn_gates_backward<T>(
        st.n, bd.H, sp.a, sp.b, bd.sd.gates.template data<T>() + st.r0 * bd.G, relu(bd.o), st.dh,
        st.ld_dh, st.dg, bd.bias_sums(sp, bd.db_ih), bd.dgh_sink.from_row(st.r0));
  }
};

// f(cell) with the cell of this mode: the one place that maps a mode to its cell.
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
bool has_cell_state(RNNMode mode) {
  return with_cell(mode, [](auto cell) { return decltype(cell)::cell_state; });
}

// The whole forward workspace of one direction, allocated once per call:
// nothing is allocated inside the time loop.
template <typename T>
struct ForwardWorkspace {
  cpu::Scratch<T> hstate, hprev, cstate, gh, m, bias, proj;
  std::vector<const T*> proj_rows;  // lookup layer: the projection row of each packed row
};

// The rows of one step, as the cells see them.
template <typename T>
struct ForwardStep {
  int64_t n = 0;      // live rows (of this thread, under a row split)
  int64_t ng = 0;     // rows whose h_prev is not the zero h0 (the product's rows)
  int64_t cont = 0;   // rows that continue from the previous step (the others begin here)
  int64_t r_prev = 0;  // first packed row of those rows at the previous step
  int64_t r0 = 0;     // first packed row
  int64_t j0 = 0;     // first state row (row split: > 0 past the first thread)
  T* g = nullptr;     // gate rows [n, G]: X·W_ihᵀ + b on entry
  T* gh = nullptr;    // a hidden_apart cell's product rows [n, G] (else g)
  T* out = nullptr;   // output rows, stride ldo
  T* h = nullptr;     // where the cell writes h (out, or before a projection m), stride ldh
  int64_t ldh = 0;
  const T* h_prev = nullptr;            // [n, R]
  const T* const* init = nullptr;       // lookup rows fed into the product (engine's init)
  const T* const* x_rows = nullptr;     // lookup rows the gate kernel adds to g (lookup_in_kernel)
  const T* next_g = nullptr;            // the next step's gate rows (a prefetch hint)
  int64_t next_len = 0;                 // their elements
  int64_t h_row = 0;                    // row of h_prev's rows in the engine's store
  cpu::RowSink h_next;                  // where the kernel writes h's rows for the next
                                        // step's product (the engine's sink, or empty)
  int64_t n_next = 0;                   // rows that have one there (they continue)
};

template <typename T, typename Cell>
struct ForwardDirection {
  using Scalar = T;
  const RNNOptions& o;
  const cpu::GemmEngine<T>& eng;
  const PackingPlan& plan;
  const std::vector<int64_t>* lookup;  // layer 0 of rnn_forward_lookup, else null
  ForwardWorkspace<T>& ws;
  RNNSaved::Direction& sd;
  const int64_t l, d, H, R, G, B, N, TT, ldo;
  const bool save, h0_zero, proj;
  DirWeights<T> w;
  T* gates = nullptr;  // [N, G]
  T* outp = nullptr;   // this direction's columns of the layer output
  T *hprev = nullptr, *cs = nullptr, *ms = nullptr, *ghn = nullptr;  // saved
  std::unique_ptr<cpu::StepOperand> whh, whr;
  // The engine's form of h_prev for the steps' products (null where it reads
  // them as they are): two halves of [B, R], the steps alternating between
  // them (a thread may write a step's h while another still multiplies the
  // previous one's), filled by the gate kernels through hsink.
  std::unique_ptr<cpu::RowStore> hkept;
  cpu::RowSink hsink;
  // Saving for a backward whose dW_hh the engine multiplies in bf16: h_prev's
  // rows in its form in packed row order instead (row r: h entering row r's
  // step), kept for dW_hh; the kernels write each step's rows that continue
  // into the next step's rows, h0 is kept for the rows that begin.
  std::shared_ptr<cpu::RowStore> hp_kept;
  bool fp32_hprev = true;  // whether h_prev's fp32 rows are written (GRU reads them, or a step)
  // A lookup layer's projected rows: fed into the product where the engine
  // takes init rows (and the cell lets it), else added by the gate kernel
  // (lookup_in_kernel), else copied into G.
  bool fuse_lookup = false, lookup_in_gates = false;

  ForwardDirection(const RNNOptions& o_, const cpu::GemmEngine<T>& eng_, const PackingPlan& plan_,
                   const std::vector<Tensor>& weights, const std::vector<int64_t>* lookup_,
                   ForwardWorkspace<T>& ws_, RNNSaved::Direction& sd_, int64_t l_, int64_t d_,
                   bool save_, bool h0_zero_)
      : o(o_),
        eng(eng_),
        plan(plan_),
        lookup(l_ == 0 ? lookup_ : nullptr),
        ws(ws_),
        sd(sd_),
        l(l_),
        d(d_),
        H(o.hidden_size),
        R(o.real_hidden_size()),
        G(o.gate_count() * H),
        B(plan.batch()),
        N(plan.total_rows()),
        TT(plan.max_len()),
        ldo(o.output_size()),
        save(save_),
        h0_zero(h0_zero_),
        proj(o.proj_size > 0),
        w(dir_weights<T>(o, weights, l_, d_)) {}

  // G = X·W_ihᵀ + b, with b = b_ih, plus b_hh where the cell has it there
  // (b_hh_in_projection; GRU's b_hn stays inside r * (W_hn h + b_hn)). A
  // lookup layer projects the V table rows once instead; each step takes its
  // rows' projection (fused into the product where the engine takes init
  // rows, into the gate kernel otherwise, else copied into G).
  void project_inputs(const Tensor& x) {
    Tensor gates_t = cpu::pooled_empty({N, G}, o.dtype);
    gates = gates_t.data<T>();
    if (save) sd.gates = gates_t;
    else ws_gates_ = gates_t;
    T* bias = ws.bias.data();
    for (int64_t k = 0; k < G; ++k) {
      bias[k] = !o.bias ? T(0) : !Cell::b_hh_in_projection ? w.b_ih[k] : w.b_ih[k] + w.b_hh[k];
    }
    const int64_t in = x.size(1);
    if (!lookup) {
      eng.gemm({.m = N,
                .n = G,
                .k = in,
                .a = {.data = x.data<T>(), .ld = in},
                .b = {.data = w.w_ih, .ld = in, .trans = true},
                .c = gates,
                .ldc = G,
                .c_row = o.bias ? bias : nullptr});
      return;
    }
    const int64_t V = x.size(0);
    T* p = ws.proj.data();
    eng.gemm({.m = V,
              .n = G,
              .k = in,
              .a = {.data = x.data<T>(), .ld = in},
              .b = {.data = w.w_ih, .ld = in, .trans = true},
              .c = p,
              .ldc = G});
    for (int64_t v = 0; v < V; ++v)
      for (int64_t k = 0; k < G; ++k) p[v * G + k] += bias[k];
    fuse_lookup = eng.takes_init() && Cell::lookup_in_product;
    lookup_in_gates = !fuse_lookup && Cell::lookup_in_kernel;
    if (fuse_lookup || lookup_in_gates) {
      ws.proj_rows.resize(static_cast<std::size_t>(N));
      for (int64_t r = 0; r < N; ++r)
        ws.proj_rows[static_cast<std::size_t>(r)] = p + (*lookup)[static_cast<std::size_t>(r)] * G;
    }
  }

  // The saved activations, the steps' operands (W_hhᵀ [R, G], W_hrᵀ [H, R])
  // and the initial state.
  void prepare(int nt, const Tensor& h0, const Tensor& c0, Tensor& out) {
    const int nc = rows_split(eng, o) ? 1 : nt;  // threads sharing the columns
    whh = eng.prepare(w.w_hh, /*trans_b=*/true, R, G, R, step_ranges(H, G / H, nc));
    if (proj) whr = eng.prepare(w.w_hr, /*trans_b=*/true, H, R, H, step_ranges(R, 1, nc));
    // Under a projection h_prev is W_hr's product, not a kernel's output.
    if (save && !proj) {
      const int64_t skip = h0_zero && d == 0 && TT > 0 ? plan.batch_sizes()[0] : 0;
      hp_kept = eng.keep_rows(N, R, G, N - skip);  // dW_hh = dGᵀ·H_prev[skip:]
    }
    if (hp_kept) {
      hsink = eng.sink(*hp_kept);
      sd.h_prev_kept = hp_kept;
    }
    fp32_hprev = !hp_kept || Cell::reads_h_prev || !eng.step_reads_rows(*whh);
    if (save) {
      if (fp32_hprev) {
        sd.h_prev = cpu::pooled_empty({N, R}, o.dtype);
        hprev = sd.h_prev.data<T>();
      }
      if (Cell::cell_state) {
        sd.c = cpu::pooled_empty({N, H}, o.dtype);
        cs = sd.c.data<T>();
      }
      if (proj) {
        sd.m = cpu::pooled_empty({N, H}, o.dtype);
        ms = sd.m.data<T>();
      }
      if (Cell::saves_ghn) {
        sd.ghn = cpu::pooled_empty({N, H}, o.dtype);
        ghn = sd.ghn.data<T>();
      }
    }
    const int64_t ld = l * o.num_directions() + d;
    load_state(ws.hstate.data(), h0, ld, plan.sorted_indices(), R);
    if (Cell::cell_state) load_state(ws.cstate.data(), c0, ld, plan.sorted_indices(), H);
    if (Cell::cell_state && save) {
      sd.c0 = cpu::pooled_empty({B, H}, o.dtype);
      std::copy(ws.cstate.begin(), ws.cstate.end(), sd.c0.data<T>());
    }
    outp = out.data<T>() + d * R;
    hkept = proj || hp_kept ? nullptr : eng.step_rows(*whh, 2 * B);
    if (hkept) {
      if (!h0_zero) {  // rows that begin later read h0 from either half
        eng.keep(*hkept, 0, ws.hstate.data(), R, B);
        eng.keep(*hkept, B, ws.hstate.data(), R, B);
      }
      hsink = eng.sink(*hkept);
    }
  }

  // One step, walked by every thread on its share, in phases: before the
  // product (the step's rows, h_prev), the product, after it (the cell's
  // math, then a projection). By columns, one barrier per step (two with a
  // projection), since each thread multiplies all of h_prev by its rows of
  // W_hh and runs the gate math on its columns; by rows, none: each thread's
  // rows go through the product and the gate math on that thread alone.
  void step(int64_t s, const Split& sp) {
    ForwardStep<T> st = before_product(s, sp);
    columns_barrier(sp);  // the product reads every column of h_prev
    product(st, sp);
    after_product(st, sp);
  }

  // This thread's rows of step s, where their h goes in the engine's form,
  // and their h_prev.
  ForwardStep<T> before_product(int64_t s, const Split& sp) {
    // The reverse direction walks t down; rows bs[t+1]..bs[t]-1 begin there
    // and take h0 (and c0) from the state buffers, which hold nothing else.
    const auto& bs = plan.batch_sizes();
    const int64_t t = d == 0 ? s : TT - 1 - s;
    const auto [j0, j1] = sp.rows(bs[static_cast<std::size_t>(t)]);
    ForwardStep<T> st;
    st.n = j1 - j0;
    st.j0 = j0;
    st.r0 = plan.offsets()[static_cast<std::size_t>(t)] + j0;
    st.g = gates + st.r0 * G;
    if (s + 1 < TT) {  // this thread's rows of the next step
      const auto tn = static_cast<std::size_t>(d == 0 ? t + 1 : t - 1);
      const auto [n0, n1] = sp.rows(bs[tn]);
      st.next_g = gates + (plan.offsets()[tn] + n0) * G;
      st.next_len = (n1 - n0) * G;
    }
    st.out = outp + st.r0 * ldo;
    st.cont = std::clamp<int64_t>(rows_after_h0(bs, t, d) - j0, 0, st.n);
    if (st.cont > 0)
      st.r_prev = plan.offsets()[static_cast<std::size_t>(d == 0 ? t - 1 : t + 1)] + j0;
    if (hp_kept) {  // packed rows: the next step's are where this step's h goes
      st.h_row = st.r0;
      if (s + 1 < TT) {
        const auto tn = static_cast<std::size_t>(d == 0 ? t + 1 : t - 1);
        st.n_next = std::clamp<int64_t>(bs[tn] - j0, 0, st.n);
        // (a row split's j0 may lie past the next step's rows: no sink row then)
        if (st.n_next > 0) st.h_next = hsink.from_row(plan.offsets()[tn] + j0);
      }
      // The rows that begin here take h0 (before the barrier: every thread's
      // product reads them).
      if ((sp.by_rows || sp.tid == 0) && st.cont < st.n)
        eng.keep(*hp_kept, st.r0 + st.cont, ws.hstate.data() + (j0 + st.cont) * R, R,
                 st.n - st.cont);
    } else {
      st.h_row = (s % 2) * B + j0;
      st.h_next = hsink.from_row(((s + 1) % 2) * B + j0);
      st.n_next = st.n;
    }
    // h_prev: the previous step's output rows for the rows that continue
    // from it (read where the kernel wrote them: no copy into a state
    // buffer), h0 for the others.
    if (fp32_hprev) {
      T* hsrc = save ? hprev + st.r0 * R : ws.hprev.data() + ((s % 2) * B + j0) * R;
      if (st.cont > 0)
        copy_rows(hsrc + sp.ra, R, outp + st.r_prev * ldo + sp.ra, ldo, st.cont, sp.rb - sp.ra);
      copy_rows(hsrc + st.cont * R + sp.ra, R, ws.hstate.data() + (j0 + st.cont) * R + sp.ra, R,
                st.n - st.cont, sp.rb - sp.ra);
      st.h_prev = hsrc;
    }
    // Rows past ng hold the zero h0: their product is zero.
    const int64_t ng = h0_zero ? rows_after_h0(bs, t, d) : bs[static_cast<std::size_t>(t)];
    st.ng = std::clamp<int64_t>(ng - j0, 0, st.n);
    return st;
  }

  // The product: h_prev · W_hhᵀ into the gate rows, or into the cell's own
  // buffer (hidden_apart), whose rows without a product read zeros; a lookup
  // layer's rows go in with it, or into G, or to the kernel.
  void product(ForwardStep<T>& st, const Split& sp) {
    if (lookup) take_lookup_rows(st, sp);
    if constexpr (Cell::hidden_apart) {
      st.gh = ws.gh.data() + st.j0 * G;
      hidden_product(st, sp, T(0), st.gh);
      for (int64_t r = st.ng; r < st.n; ++r)
        for (int64_t q = 0; q < G / H; ++q)
          std::fill(st.gh + r * G + q * H + sp.a, st.gh + r * G + q * H + sp.b, T(0));
    } else {
      st.gh = st.g;
      hidden_product(st, sp, st.x_rows ? T(0) : T(1), st.g);
    }
  }

  // After the product: the cell's math on this thread's columns and rows,
  // writing h (before a projection: m), then h = W_hr m.
  void after_product(ForwardStep<T>& st, const Split& sp) {
    st.h = st.out;
    st.ldh = ldo;
    if (proj) {
      st.h = save ? ms + st.r0 * H : ws.m.data() + st.j0 * H;
      st.ldh = H;
    }
    Cell::forward(*this, st, sp);
    if (proj) {
      columns_barrier(sp);  // the projection reads every column of m
      eng.step(st.n, st.h, H, *whr, sp.range(1, 0), T(0), st.out, ldo);
    }
  }

  // A lookup layer's step: rows < ng take their projection inside the product
  // (fused), the others (all of them, unfused) are copied into G; or the gate
  // kernel adds every row's, and rows past ng, which get no product, start
  // from zero.
  void take_lookup_rows(ForwardStep<T>& st, const Split& sp) {
    if (lookup_in_gates) {
      st.x_rows = ws.proj_rows.data() + st.r0;
      for (int64_t j = st.ng; j < st.n; ++j)
        for (int64_t q = 0; q < G / H; ++q)
          std::fill(st.g + j * G + q * H + sp.a, st.g + j * G + q * H + sp.b, T(0));
      return;
    }
    const int64_t copied = fuse_lookup ? st.ng : 0;
    if (fuse_lookup) st.init = ws.proj_rows.data() + st.r0;
    const T* p = ws.proj.data();
    for (int64_t j = copied; j < st.n; ++j) {
      const T* src = p + (*lookup)[static_cast<std::size_t>(st.r0 + j)] * G;
      for (int64_t q = 0; q < G / H; ++q) {
        std::memcpy(st.g + j * G + q * H + sp.a, src + q * H + sp.a,
                    static_cast<std::size_t>(sp.b - sp.a) * sizeof(T));
      }
    }
  }

  // dst[:ng, q*H + a .. q*H + b) (+)= h_prev · W_hh[q*H + a .. q*H + b)ᵀ for each gate q.
  void hidden_product(const ForwardStep<T>& st, const Split& sp, T beta, T* dst) {
    if (st.ng == 0) return;
    const int64_t blocks = sp.nth == 1 || sp.by_rows ? 1 : G / H;
    for (int64_t q = 0; q < blocks; ++q) {
      eng.step(st.ng, st.h_prev, R, *whh, sp.range(G / H, q), beta, dst, G, st.init,
               hp_kept ? hp_kept.get() : hkept.get(), st.h_row);
    }
  }

  // f(r0, r1, h_next) over rows [lo, hi) split where the rows with a row in
  // the sink (the first n_next) end: h_next is the sink from their row r0 on,
  // empty for the others.
  template <typename F>
  void by_sink(const ForwardStep<T>& st, int64_t lo, int64_t hi, F&& f) {
    const int64_t mid = std::clamp(st.n_next, lo, hi);
    if (mid > lo) f(lo, mid, st.h_next.from_row(lo));
    if (hi > mid) f(mid, hi, cpu::RowSink{});
  }

  void run(int nt, const Tensor& x, const Tensor& h0, const Tensor& c0, Tensor& out,
           RNNForwardResult& res) {
    project_inputs(x);
    prepare(nt, h0, c0, out);
    const std::vector<int64_t> bounds = rows_split(eng, o) && nt > 1
                                            ? row_bounds(plan.batch_sizes(), B, nt)
                                            : std::vector<int64_t>{};
    run_threads(nt, [&](int tid, int nth) {
      const Split sp(tid, nth, H, R, bounds);
      for (int64_t s = 0; s < TT; ++s) step(s, sp);
    });
    const int64_t ld = l * o.num_directions() + d;
    final_rows(ws.hstate.data(), outp, ldo, R);
    store_state(res.h_n, ws.hstate.data(), ld, plan.sorted_indices(), R);
    if (Cell::cell_state && save) final_rows(ws.cstate.data(), cs, H, H);
    if (Cell::cell_state) store_state(res.c_n, ws.cstate.data(), ld, plan.sorted_indices(), H);
  }

  // state[j] = row j's values (packed rows src, stride ld) at its last step:
  // the forward direction's rows [bs[t+1], bs[t]) end at step t, the reverse
  // direction's all at step 0. A row never live keeps the state's h0 or c0.
  void final_rows(T* state, const T* src, int64_t ld, int64_t width) {
    const auto& bs = plan.batch_sizes();
    const auto& off = plan.offsets();
    for (int64_t t = 0; t < TT; ++t) {
      const int64_t hi = bs[static_cast<std::size_t>(t)];
      int64_t lo = t + 1 < TT ? bs[static_cast<std::size_t>(t + 1)] : 0;
      if (d != 0) lo = t == 0 ? 0 : hi;
      copy_rows(state + lo * width, width, src + (off[static_cast<std::size_t>(t)] + lo) * ld, ld,
                hi - lo, width);
    }
  }

 private:
  Tensor ws_gates_;  // G when nothing is saved
};

// Runs body(d, nt_steps) for every direction: two directions side by side on
// two threads (no synchronisation until the layer ends), or one after the
// other, each splitting its steps by columns over `nt` threads.
template <typename F>
void for_directions(int64_t D, int nt, F&& body) {
  if (D == 2 && omp_get_max_threads() >= 2) {
    run_threads(2, [&](int tid, int nth) {
      for (int64_t d = tid; d < D; d += nth) body(d, 1);
    });
  } else {
    for (int64_t d = 0; d < D; ++d) body(d, nt);
  }
}

// Layer l's input after inter-layer dropout (training, l > 0): x * mask, the
// mask holding 0 or 1/(1-p).
template <typename T>
Tensor dropped_input(const RNNOptions& o, const Tensor& in, int64_t l, bool training,
                     uint64_t seed, Tensor& mask) {
  if (l == 0 || !training || o.dropout <= 0) return in;
  const int64_t N = in.size(0), F = in.size(1);
  mask = dropout_mask<T>(N, F, o.dropout, seed, l);
  Tensor x = cpu::pooled_empty({N, F}, o.dtype);
  const T* a = in.data<T>();
  const T* m = mask.data<T>();
  T* y = x.data<T>();
  for (int64_t i = 0; i < N * F; ++i) y[i] = a[i] * m[i];
  return x;
}

template <typename T>
std::shared_ptr<RNNSaved> make_saved(const RNNOptions& o, const std::vector<Tensor>& weights,
                                     const PackingPlan& plan, const Tensor& h0,
                                     const std::vector<int64_t>* lookup) {
  auto saved = std::make_shared<RNNSaved>();
  saved->options = o;
  saved->weights = weights;
  saved->batch_sizes = plan.batch_sizes();
  saved->offsets = plan.offsets();
  saved->sorted_indices = plan.sorted_indices();
  saved->batch = plan.batch();
  saved->total_rows = plan.total_rows();
  saved->h0_zero = !h0.defined();
  if (lookup) saved->lookup = *lookup;
  return saved;
}

template <typename T, typename Cell>
RNNForwardResult forward_impl(const RNNOptions& o, const std::vector<Tensor>& weights,
                              const Tensor& data, const std::vector<int64_t>* lookup,
                              const PackingPlan& plan, const Tensor& h0, const Tensor& c0,
                              bool training, bool save, uint64_t seed) {
  const int64_t L = o.num_layers, D = o.num_directions(), H = o.hidden_size;
  const int64_t R = o.real_hidden_size(), G = o.gate_count() * H;
  const int64_t B = plan.batch(), N = plan.total_rows();

  const cpu::BlasSingleThread one_pool;  // OpenMP's threads only (cpu/gemm.h)
  const cpu::GemmEngine<T>& eng = engine_for<T>(o);
  RNNForwardResult res;
  res.h_n = cpu::pooled_empty({L * D, B, R}, o.dtype);
  if (Cell::cell_state) res.c_n = cpu::pooled_empty({L * D, B, H}, o.dtype);
  std::shared_ptr<RNNSaved> saved = save ? make_saved<T>(o, weights, plan, h0, lookup) : nullptr;

  // Every workspace is written before it is read (load_state, the products
  // with beta 0, the kernels): none is zero-filled.
  std::vector<ForwardWorkspace<T>> wss(static_cast<std::size_t>(D));
  for (ForwardWorkspace<T>& ws : wss) {
    ws.hstate.resize_for_overwrite(static_cast<std::size_t>(B * R));
    // Without save, h_prev of a step goes to one of two alternating buffers
    // (a thread may start the next step while another still reads this one).
    ws.hprev.resize_for_overwrite(save ? 0 : static_cast<std::size_t>(2 * B * R));
    ws.cstate.resize_for_overwrite(Cell::cell_state ? static_cast<std::size_t>(B * H) : 0);
    ws.gh.resize_for_overwrite(Cell::hidden_apart ? static_cast<std::size_t>(B * G) : 0);
    ws.m.resize_for_overwrite(o.proj_size > 0 && !save ? static_cast<std::size_t>(B * H) : 0);
    ws.bias.resize_for_overwrite(static_cast<std::size_t>(G));
    ws.proj.resize_for_overwrite(lookup ? static_cast<std::size_t>(data.size(0) * G) : 0);
  }
  const int nt = step_threads(H, rows_split(eng, o));
  Tensor layer_in = data;
  for (int64_t l = 0; l < L; ++l) {
    RNNSaved::Layer sl;
    const Tensor x = dropped_input<T>(o, layer_in, l, training, seed, sl.mask);
    Tensor out = cpu::pooled_empty({N, D * R}, o.dtype);
    sl.dirs.resize(static_cast<std::size_t>(D));
    for_directions(D, nt, [&](int64_t d, int nt_steps) {
      ForwardDirection<T, Cell> fd(o, eng, plan, weights, lookup, wss[static_cast<std::size_t>(d)],
                                   sl.dirs[static_cast<std::size_t>(d)], l, d, save, !h0.defined());
      fd.run(nt_steps, x, h0, c0, out, res);
    });
    if (save) {
      sl.input = x;
      saved->layers.push_back(std::move(sl));
    }
    layer_in = out;
  }
  res.output = layer_in;
  res.saved = saved;
  return res;
}

// ---------------------------------------------------------------------------
// The backward. backward_impl is the grid (layers down, directions);
// BackwardDirection walks one layer and direction's steps for the dh/dc
// recurrence (one product of live rows per step), handing each step's rows to
// the cell's step math, then computes dW_ih, dW_hh and dW_hr each with one
// product over all packed rows.
// ---------------------------------------------------------------------------

template <typename T>
struct BackwardWorkspace {
  cpu::Scratch<T> dhstate, dcstate, dm, dhtot, dproj;
  std::vector<T*> dproj_rows;  // LSTM lookup layer: the dP row of each packed row
  cpu::Scratch<T> dg_step;     // two steps' dG rows, where nothing reads them past the step
  std::vector<T> db_parts;     // a row split: threads 1.. sum their bias gradients here
  Tensor dg_t, dgh_t;
  T* dg = nullptr;   // [N, G] gradient of the gate pre-activations (GRU: input side)
  T* dgh = nullptr;  // GRU: [N, G] gradient of W_h h_prev + b_h; else = dg
  // The engine's stores of dG's rows (null where it reads operands as they
  // are): dgh_kept as the steps' products took them, for dW_hh (and, where dG
  // is dG_h, for dW_ih and dX); GRU's dgx_kept, kept step by step while the
  // rows are in cache, for dW_ih and dX. Without them, each of those products
  // would convert all of dG again, streaming it from memory.
  std::unique_ptr<cpu::RowStore> dgh_kept, dgx_kept;
  const cpu::RowStore* dg_kept() const { return dgh == dg ? dgh_kept.get() : dgx_kept.get(); }
};

// The rows of one backward step, as the cells see them.
template <typename T>
struct BackwardStep {
  int64_t t = 0;   // the step
  int64_t n = 0;   // live rows (of this thread, under a row split)
  int64_t ng = 0;  // rows whose dh_prev is needed (not the h0 rows without grad h0)
  int64_t r0 = 0;  // first packed row
  int64_t j0 = 0;  // first state row (row split: > 0 past the first thread)
  const T* dh = nullptr;  // dh of the step's output rows [n, R] (under a projection,
                          // once through W_hr: dm [n, H]), stride ld_dh
  int64_t ld_dh = 0;
  T* dg = nullptr;        // gate-gradient rows [n, G]
};

template <typename T, typename Cell>
struct BackwardDirection {
  using Scalar = T;
  const RNNSaved& sv;
  const RNNOptions& o;
  const cpu::GemmEngine<T>& eng;
  BackwardWorkspace<T>& ws;
  const RNNSaved::Direction& sd;
  RNNGradients& g;
  const int64_t l, d, H, R, G, N, TT, ldo;
  const bool proj, lookup_layer, initial_state_grad;
  DirWeights<T> w;
  const T* dout = nullptr;  // this direction's columns of the output gradient, or null
  T *db_ih = nullptr, *db_hh = nullptr;
  std::unique_ptr<cpu::StepOperand> whh, whr;
  // Whether dG lives one step at a time (ws.dg_step): a lookup layer's dW_ih
  // and dX read dP instead, and dW_hh the kept rows. Its rows stay in cache
  // instead of streaming [N, G] through memory.
  bool dg_per_step = false;
  bool row_split = false;  // the steps split by rows (else by columns)
  // Where the gate kernels write dG_h's and GRU's dG_x's rows in the engine's
  // form (its sinks into ws.dgh_kept and ws.dgx_kept, or empty).
  cpu::RowSink dgh_sink, dgx_sink;

  BackwardDirection(const RNNSaved& sv_, const cpu::GemmEngine<T>& eng_, BackwardWorkspace<T>& ws_,
                    RNNGradients& g_, int64_t l_, int64_t d_, bool initial_state_grad_)
      : sv(sv_),
        o(sv_.options),
        eng(eng_),
        ws(ws_),
        sd(sv_.layers[static_cast<std::size_t>(l_)].dirs[static_cast<std::size_t>(d_)]),
        g(g_),
        l(l_),
        d(d_),
        H(o.hidden_size),
        R(o.real_hidden_size()),
        G(o.gate_count() * H),
        N(sv_.total_rows),
        TT(static_cast<int64_t>(sv_.batch_sizes.size())),
        ldo(o.output_size()),
        proj(o.proj_size > 0),
        lookup_layer(l_ == 0 && !sv_.lookup.empty()),
        initial_state_grad(initial_state_grad_),
        w(dir_weights<T>(o, sv_.weights, l_, d_)) {}

  // Bias gradients are summed by the gate kernels step by step (LSTM and RNN:
  // db_hh == db_ih, copied after); W_hh [G, R] and W_hr [R, H] are laid out
  // once for the steps' products; dh and dc start from grad_h_n and grad_c_n.
  void prepare(int nt, const Tensor& dout_t, const Tensor& grad_h_n, const Tensor& grad_c_n,
               int64_t in) {
    if (o.bias) {
      db_ih = g.weights[static_cast<std::size_t>(w.first) + 2].data<T>();
      db_hh = g.weights[static_cast<std::size_t>(w.first) + 3].data<T>();
      std::fill(db_ih, db_ih + G, T(0));
      std::fill(db_hh, db_hh + G, T(0));
    }
    const int nc = row_split ? 1 : nt;  // threads sharing the columns
    whh = eng.prepare(w.w_hh, /*trans_b=*/false, G, R, R, step_ranges(R, 1, nc));
    if (proj) whr = eng.prepare(w.w_hr, /*trans_b=*/false, R, H, H, step_ranges(H, 1, nc));
    ws.dgh_kept = eng.keep_rows(N, G, R, N - dw_hh_skip());
    // A lookup layer's dW_ih and dX read dP, not dG.
    ws.dgx_kept = Cell::hidden_apart && !lookup_layer ? eng.keep_rows(N, G, in, N) : nullptr;
    dg_per_step = ws.dgh_kept && lookup_layer && !Cell::hidden_apart;
    dgh_sink = ws.dgh_kept ? eng.sink(*ws.dgh_kept) : cpu::RowSink{};
    dgx_sink = ws.dgx_kept ? eng.sink(*ws.dgx_kept) : cpu::RowSink{};
    assert(!dgh_sink.data || dgh_sink.ld == G);  // the kernels write dG's layout
    assert(!dgx_sink.data || dgx_sink.ld == G);
    if (dg_per_step) ws.dg_step.resize_for_overwrite(static_cast<std::size_t>(2 * sv.batch * G));
    const int64_t ld = l * o.num_directions() + d;
    load_state(ws.dhstate.data(), grad_h_n, ld, sv.sorted_indices, R);
    if (Cell::cell_state) load_state(ws.dcstate.data(), grad_c_n, ld, sv.sorted_indices, H);
    dout = dout_t.defined() ? dout_t.data<T>() + d * R : nullptr;
    // Layer 0 of a lookup: dP[v] sums dg over the rows that read table row v
    // (where the gate kernel adds each row into its dP row: lookup_in_kernel;
    // else scatter_rows).
    if (lookup_layer) {
      std::fill(ws.dproj.begin(), ws.dproj.end(), T(0));
      ws.dproj_rows.resize(Cell::lookup_in_kernel ? static_cast<std::size_t>(N) : 0);
      for (std::size_t r = 0; r < ws.dproj_rows.size(); ++r)
        ws.dproj_rows[r] = ws.dproj.data() + sv.lookup[r] * G;
    }
  }

  // dh of this step = upstream gradient of the output rows + what the
  // following step sent back through W_hh (or grad_h_n at the last step).
  // With no output gradient and no projection, the kernels read it where it
  // is (they only read dh; the product that overwrites it comes after them,
  // past the barrier), except a kernel that writes its direct dh_prev part
  // into the state while it reads dh (dh_prev_in_kernel): it reads a copy.
  const T* gather_dh(const BackwardStep<T>& st, const Split& sp) {
    const int64_t n = st.n, r0 = st.r0;
    const T* dhstate = ws.dhstate.data() + st.j0 * R;
    T* dht = proj ? ws.dhtot.data() + r0 * R : ws.dhtot.data() + st.j0 * R;
    if (!dout && !proj && !Cell::dh_prev_in_kernel) return dhstate;
    if (dout) {
      for (int64_t j = 0; j < n; ++j) {
        const T* x = dout + (r0 + j) * ldo;
        const T* y = dhstate + j * R;
        T* z = dht + j * R;
        for (int64_t k = sp.ra; k < sp.rb; ++k) z[k] = x[k] + y[k];
      }
    } else {
      copy_rows(dht + sp.ra, R, dhstate + sp.ra, R, n, sp.rb - sp.ra);
    }
    return dht;
  }

  // Undoes the forward's order: the forward direction walks t down here.
  void step(int64_t s, const Split& sp) {
    const int64_t t = d == 0 ? TT - 1 - s : s;
    const int64_t n = sv.batch_sizes[static_cast<std::size_t>(t)];
    const auto [j0, j1] = sp.rows(n);
    BackwardStep<T> st;
    st.t = t;
    st.n = j1 - j0;
    st.j0 = j0;
    st.r0 = sv.offsets[static_cast<std::size_t>(t)] + j0;
    st.dh = gather_dh(st, sp);
    // One step's dG alternates between two buffers: a thread may start the
    // next step's kernel while another still multiplies this step's rows.
    st.dg = dg_per_step ? ws.dg_step.data() + ((s % 2) * sv.batch + j0) * G : ws.dg + st.r0 * G;
    // Without grad h0, rows past ng send dh_prev nowhere.
    const int64_t ng = initial_state_grad ? n : rows_after_h0(sv.batch_sizes, t, d);
    st.ng = std::clamp<int64_t>(ng - j0, 0, st.n);
    st.ld_dh = R;
    before_product(st, sp);
    columns_barrier(sp);  // the product reads every column of dG
    product(st, sp);
  }

  // Before the product: dh through the projection (dm = dh · W_hr), then the
  // cell's math, which writes dG (and a lookup layer's dP rows).
  void before_product(BackwardStep<T>& st, const Split& sp) {
    if (proj) {
      columns_barrier(sp);  // the product reads every column of dh
      T* dm = ws.dm.data() + st.j0 * H;
      eng.step(st.n, st.dh, R, *whr, sp.range(1, 0), T(0), dm, H);
      st.dh = dm;
      st.ld_dh = H;
    }
    Cell::backward(*this, st, sp);
    if constexpr (!Cell::lookup_in_kernel) scatter_rows(st, sp);
  }

  // The product: dh_prev = dG_h · W_hh (added to the cell's direct part
  // where its kernel wrote one); an apart dG_x is kept for dW_ih and dX.
  // (After it, nothing: the next step's dh is this product.)
  void product(const BackwardStep<T>& st, const Split& sp) {
    if (ws.dgx_kept && (sp.by_rows || sp.tid == 0))
      eng.keep(*ws.dgx_kept, st.r0, dgx_sink.data ? nullptr : st.dg, G, st.n);
    hidden_product(st, Cell::hidden_apart ? ws.dgh + st.r0 * G : st.dg,
                   Cell::dh_prev_in_kernel ? T(1) : T(0), sp);
  }

  // dh_prev[:ng, ra..rb) (+)= dgr · W_hh[:, ra..rb). The engine keeps dgr's
  // rows for dW_hh (rows past ng too, which the product skips): under a
  // column split those of thread 0, under a row split each thread its own.
  void hidden_product(const BackwardStep<T>& st, const T* dgr, T beta, const Split& sp) {
    if (ws.dgh_kept && (sp.by_rows || sp.tid == 0) && st.ng < st.n) {
      eng.keep(*ws.dgh_kept, st.r0 + st.ng, dgh_sink.data ? nullptr : dgr + st.ng * G, G,
               st.n - st.ng);
    }
    if (st.ng == 0) return;
    eng.step(st.ng, dgr, G, *whh, sp.range(1, 0), beta, ws.dhstate.data() + st.j0 * R, R, nullptr,
             ws.dgh_kept.get(), st.r0);
  }

  // The forward direction's first rows saw the zero h0: they add nothing to dW_hh.
  int64_t dw_hh_skip() const { return sv.h0_zero && d == 0 && TT > 0 ? sv.batch_sizes[0] : 0; }

  // Layer 0 of a lookup: dP[v] += dg of the rows that read table row v, added
  // step by step while the rows are in cache (a lookup layer is never split by
  // rows: two threads' rows may share a table row).
  void scatter_rows(const BackwardStep<T>& st, const Split& sp) {
    if (!lookup_layer) return;
    for (int64_t j = 0; j < st.n; ++j) {
      T* dst = ws.dproj.data() + sv.lookup[static_cast<std::size_t>(st.r0 + j)] * G;
      const T* src = st.dg + j * G;
      for (int64_t q = 0; q < G / H; ++q)
        for (int64_t c = q * H + sp.a; c < q * H + sp.b; ++c) dst[c] += src[c];
    }
  }

  // Where the gate kernels add the bias gradients (db_ih or db_hh): a column
  // split's threads own their columns of db; a row split's threads past the
  // first sum their rows apart (db_parts), added after the steps.
  T* bias_sums(const Split& sp, T* db) {
    if (!sp.by_rows || sp.tid == 0 || !db) return db;
    const int64_t which = db == db_hh ? 1 : 0;
    return ws.db_parts.data() + ((sp.tid - 1) * 2 + which) * G;
  }
  void add_bias_parts(int nt) {
    for (int i = 0; i + 1 < nt && o.bias; ++i) {
      const T* part = ws.db_parts.data() + i * 2 * G;
      for (int64_t c = 0; c < G; ++c) db_ih[c] += part[c];
      for (int64_t c = 0; c < G && Cell::separate_db_hh; ++c) db_hh[c] += part[G + c];
    }
  }

  // Everything after the steps is one product (or one pass) over all rows.
  void weight_gradients(const Tensor& input) {
    const std::size_t k = static_cast<std::size_t>(w.first);
    T* dwih = g.weights[k].data<T>();
    const T* x = input.data<T>();
    const int64_t in = input.size(1);
    if (lookup_layer) {  // dW_ih = dPᵀ·table, dP summed during the steps
      eng.gemm({.m = G,
                .n = in,
                .k = input.size(0),
                .a = {.data = ws.dproj.data(), .ld = G, .trans = true},
                .b = {.data = x, .ld = in},
                .c = dwih,
                .ldc = in});
    } else {
      eng.gemm({.m = G,
                .n = in,
                .k = N,
                .a = {.data = ws.dg, .ld = G, .trans = true, .kept = ws.dg_kept()},
                .b = {.data = x, .ld = in},
                .c = dwih,
                .ldc = in});
    }
    const int64_t skip = dw_hh_skip();
    eng.gemm({.m = G,
              .n = R,
              .k = N - skip,
              .a = {.data = ws.dgh + skip * G,
                    .ld = G,
                    .trans = true,
                    .kept = ws.dgh_kept.get(),
                    .kept_row = skip},
              .b = {.data = sd.h_prev.defined() ? sd.h_prev.data<T>() + skip * R : nullptr,
                    .ld = R,
                    .kept = sd.h_prev_kept.get(),
                    .kept_row = skip},
              .c = g.weights[k + 1].data<T>(),
              .ldc = R});
    std::size_t next = k + 2;
    if (o.bias) {
      if (!Cell::separate_db_hh) std::copy(db_ih, db_ih + G, db_hh);
      next += 2;
    }
    if (proj) {
      eng.gemm({.m = R,
                .n = H,
                .k = N,
                .a = {.data = ws.dhtot.data(), .ld = R, .trans = true},
                .b = {.data = sd.m.data<T>(), .ld = H},
                .c = g.weights[next].data<T>(),
                .ldc = H});
    }
  }

  void run(int nt, const Tensor& dout_t, const Tensor& grad_h_n, const Tensor& grad_c_n,
           const Tensor& input) {
    // A lookup layer's threads would share dP rows under a row split (the
    // LSTM kernel adds each row into its dP row): it keeps the column split,
    // and the column split's thread count.
    if (lookup_layer && rows_split(eng, o)) nt = std::min(nt, step_threads(H, false));
    row_split = rows_split(eng, o) && nt > 1 && !lookup_layer;
    prepare(nt, dout_t, grad_h_n, grad_c_n, input.size(1));
    const std::vector<int64_t> bounds =
        row_split ? row_bounds(sv.batch_sizes, sv.batch, nt) : std::vector<int64_t>{};
    if (row_split) ws.db_parts.assign(static_cast<std::size_t>((nt - 1) * 2 * G), T(0));
    run_threads(nt, [&](int tid, int nth) {
      const Split sp(tid, nth, H, o.real_hidden_size(), bounds);
      for (int64_t s = 0; s < TT; ++s) step(s, sp);
    });
    if (row_split) add_bias_parts(nt);
    if (initial_state_grad) {
      const int64_t ld = l * o.num_directions() + d;
      store_state(g.h0, ws.dhstate.data(), ld, sv.sorted_indices, R);
      if (Cell::cell_state) store_state(g.c0, ws.dcstate.data(), ld, sv.sorted_indices, H);
    }
    weight_gradients(input);
  }
};

template <typename T, typename Cell>
std::vector<BackwardWorkspace<T>> backward_workspaces(const RNNSaved& sv) {
  const RNNOptions& o = sv.options;
  const int64_t B = sv.batch, N = sv.total_rows, H = o.hidden_size;
  const int64_t R = o.real_hidden_size(), G = o.gate_count() * H;
  const bool proj = o.proj_size > 0;
  // Written before read, as the forward's (dP is zeroed where its sums begin).
  std::vector<BackwardWorkspace<T>> wss(static_cast<std::size_t>(o.num_directions()));
  for (BackwardWorkspace<T>& ws : wss) {
    ws.dhstate.resize_for_overwrite(static_cast<std::size_t>(B * R));
    ws.dcstate.resize_for_overwrite(Cell::cell_state ? static_cast<std::size_t>(B * H) : 0);
    ws.dm.resize_for_overwrite(proj ? static_cast<std::size_t>(B * H) : 0);
    // Under a projection dW_hr = dHᵀ·M needs dh of every row; otherwise one step's worth.
    ws.dhtot.resize_for_overwrite(static_cast<std::size_t>((proj ? N : B) * R));
    ws.dg_t = cpu::pooled_empty({N, G}, o.dtype);
    ws.dg = ws.dg_t.template data<T>();
    if (Cell::hidden_apart) ws.dgh_t = cpu::pooled_empty({N, G}, o.dtype);
    ws.dgh = Cell::hidden_apart ? ws.dgh_t.template data<T>() : ws.dg;
    if (!sv.lookup.empty()) {
      ws.dproj.resize_for_overwrite(static_cast<std::size_t>(sv.layers[0].input.size(0) * G));
    }
  }
  return wss;
}

template <typename T, typename Cell>
RNNGradients backward_impl(const RNNSaved& sv, const Tensor& grad_output, const Tensor& grad_h_n,
                           const Tensor& grad_c_n, bool initial_state_grad, bool input_grad) {
  const RNNOptions& o = sv.options;
  const int64_t L = o.num_layers, D = o.num_directions(), H = o.hidden_size;
  const int64_t R = o.real_hidden_size(), G = o.gate_count() * H;
  const int64_t B = sv.batch, N = sv.total_rows;

  const cpu::BlasSingleThread one_pool;  // OpenMP's threads only (cpu/gemm.h)
  const cpu::GemmEngine<T>& eng = engine_for<T>(o);
  RNNGradients g;
  for (const Shape& s : rnn_parameter_shapes(o)) g.weights.push_back(cpu::pooled_empty(s, o.dtype));
  if (initial_state_grad) {
    g.h0 = cpu::pooled_empty({L * D, B, R}, o.dtype);
    if (Cell::cell_state) g.c0 = cpu::pooled_empty({L * D, B, H}, o.dtype);
  }
  std::vector<BackwardWorkspace<T>> wss = backward_workspaces<T, Cell>(sv);
  const int nt = step_threads(H, rows_split(eng, o));

  Tensor dout = grad_output;  // gradient of this layer's output rows, or undefined
  for (int64_t l = L - 1; l >= 0; --l) {
    const RNNSaved::Layer& sl = sv.layers[static_cast<std::size_t>(l)];
    const bool lookup_layer = l == 0 && !sv.lookup.empty();
    const int64_t in = sl.input.size(1), rows = lookup_layer ? sl.input.size(0) : N;
    for_directions(D, nt, [&](int64_t d, int nt_steps) {
      BackwardDirection<T, Cell> bd(sv, eng, wss[static_cast<std::size_t>(d)], g, l, d,
                                    initial_state_grad);
      bd.run(nt_steps, dout, grad_h_n, grad_c_n, sl.input);
    });
    // The first layer's dX is only for the caller: skipped when not wanted.
    if (l == 0 && !input_grad) return g;
    // dX sums both directions' contributions, after both are done.
    Tensor dx = cpu::pooled_empty({rows, in}, o.dtype);
    for (int64_t d = 0; d < D; ++d) {
      const DirWeights<T> w = dir_weights<T>(o, sv.weights, l, d);
      const BackwardWorkspace<T>& ws = wss[static_cast<std::size_t>(d)];
      eng.gemm({.m = rows,
                .n = in,
                .k = G,
                .a = {.data = lookup_layer ? ws.dproj.data() : ws.dg,
                      .ld = G,
                      .kept = lookup_layer ? nullptr : ws.dg_kept()},
                .b = {.data = w.w_ih, .ld = in},
                .beta = d == 0 ? T(0) : T(1),
                .c = dx.data<T>(),
                .ldc = in});
    }
    if (sl.mask.defined()) {
      T* a = dx.data<T>();
      const T* m = sl.mask.data<T>();
      for (int64_t i = 0; i < N * in; ++i) a[i] *= m[i];
    }
    dout = dx;
  }
  g.input = dout;
  return g;
}

}  // namespace

namespace {

// Checks of h0/c0 shared by both forwards.
void check_initial_state(const RNNOptions& options, const PackingPlan& plan, const Tensor& h0,
                         const Tensor& c0) {
  const int64_t LD = options.num_layers * options.num_directions();
  check_state(h0, {LD, plan.batch(), options.real_hidden_size()}, options.dtype, "h0");
  if (has_cell_state(options.mode)) {
    check_state(c0, {LD, plan.batch(), options.hidden_size}, options.dtype, "c0");
  } else if (c0.defined()) {
    throw std::invalid_argument(std::string("c0 is only used by LSTM, not ") +
                                rnn_mode_name(options.mode));
  }
}

}  // namespace

struct RNNInt8Weights {
  std::vector<const void*> sources;  // the tensors' data, rnn_parameter_names order
  std::vector<cpu::PreparedInt8> prepared;
};

namespace {

// Each matrix of the forward's products, as the loop hands it to the engine:
// W_ih [G, in] and W_hh [G, R] as op(B) = Wᵀ, W_hr [R, H] likewise.
std::vector<cpu::PreparedInt8> int8_operands(const RNNOptions& o, const std::vector<Tensor>& w) {
  std::vector<cpu::PreparedInt8> out;
  const int64_t G = o.gate_count() * o.hidden_size, R = o.real_hidden_size(), H = o.hidden_size;
  for (int64_t l = 0; l < o.num_layers; ++l) {
    const int64_t in = l == 0 ? o.input_size : o.output_size();
    for (int64_t d = 0; d < o.num_directions(); ++d) {
      const DirWeights<float> dw = dir_weights<float>(o, w, l, d);
      const std::vector<std::tuple<const float*, int64_t, int64_t>> mats{
          {dw.w_ih, in, G}, {dw.w_hh, R, G}, {dw.w_hr, H, R}};
      for (const auto& [m, k, n] : mats) {
        if (!m) continue;
        cpu::PreparedInt8& p = out.emplace_back();
        p.source = m;
        p.trans = true;
        p.k = k;
        p.n = n;
        p.ld = k;
        cpu::quantize_weights_s8(m, /*trans_b=*/true, k, n, k, p.w);
      }
    }
  }
  return out;
}

void check_int8_weights(const RNNOptions& o, const std::vector<Tensor>& weights,
                        const RNNInt8Weights* int8) {
  if (!int8) return;
  if (o.precision != Precision::int8) {
    throw std::invalid_argument(std::string("int8 weights were given to a forward at precision ") +
                                precision_name(o.precision));
  }
  const auto names = rnn_parameter_names(o);
  if (int8->sources.size() != weights.size()) {
    throw std::invalid_argument("int8 weights were quantized from " +
                                std::to_string(int8->sources.size()) + " tensors, not these " +
                                std::to_string(weights.size()));
  }
  for (std::size_t i = 0; i < weights.size(); ++i) {
    if (int8->sources[i] != weights[i].raw_data()) {
      throw std::invalid_argument("int8 weights were quantized from another " + names[i] +
                                  " than this forward's (quantize again: rnn_quantize_int8)");
    }
  }
}

RNNForwardResult dispatch_forward(const RNNOptions& options, const std::vector<Tensor>& weights,
                                  const Tensor& data, const std::vector<int64_t>* lookup,
                                  const PackingPlan& plan, const Tensor& h0, const Tensor& c0,
                                  bool training, bool save_for_backward, uint64_t dropout_seed,
                                  const RNNInt8Weights* int8) {
  if (options.precision == Precision::int8 && (training || save_for_backward)) {
    throw std::invalid_argument(
        std::string("precision int8 is for inference only, but this forward is ") +
        (training ? "in training mode (call eval(), or pass training = false)"
                  : "saving for a backward (int8 has no gradient; use fp32 or bf16)"));
  }
  check_int8_weights(options, weights, int8);
  const cpu::PreparedInt8Scope scope(int8 ? &int8->prepared : nullptr);
  return with_cell(options.mode, [&]<typename Cell>(Cell) {
    if (options.dtype == DType::f32) {
      return forward_impl<float, Cell>(options, weights, data, lookup, plan, h0, c0, training,
                                       save_for_backward, dropout_seed);
    }
    return forward_impl<double, Cell>(options, weights, data, lookup, plan, h0, c0, training,
                                      save_for_backward, dropout_seed);
  });
}

}  // namespace

RNNForwardResult rnn_forward(const RNNOptions& options, const std::vector<Tensor>& weights,
                             const Tensor& data, const PackingPlan& plan, const Tensor& h0,
                             const Tensor& c0, bool training, bool save_for_backward,
                             uint64_t dropout_seed, const RNNInt8Weights* int8) {
  options.validate();
  check_weights(options, weights);
  if (!data.defined() || data.dim() != 2) {
    throw std::invalid_argument("packed input must be 2-D [rows, input_size], got shape " +
                                (data.defined() ? shape_str(data.shape()) : "undefined"));
  }
  if (data.size(1) != options.input_size) {
    throw std::invalid_argument(
        "input has " + std::to_string(data.size(1)) +
        " features, expected input_size = " + std::to_string(options.input_size));
  }
  if (data.size(0) != plan.total_rows()) {
    throw std::invalid_argument("packed input has " + std::to_string(data.size(0)) +
                                " rows but the batch sizes sum to " +
                                std::to_string(plan.total_rows()));
  }
  if (data.dtype() != options.dtype) {
    throw std::invalid_argument(std::string("input has dtype ") + dtype_name(data.dtype()) +
                                " but the weights are " + dtype_name(options.dtype));
  }
  check_initial_state(options, plan, h0, c0);
  return dispatch_forward(options, weights, data, nullptr, plan, h0, c0, training,
                          save_for_backward, dropout_seed, int8);
}

RNNForwardResult rnn_forward_lookup(const RNNOptions& options, const std::vector<Tensor>& weights,
                                    const Tensor& table, const std::vector<int64_t>& ids,
                                    const PackingPlan& plan, const Tensor& h0, const Tensor& c0,
                                    bool training, bool save_for_backward,
                                    uint64_t dropout_seed, const RNNInt8Weights* int8) {
  options.validate();
  check_weights(options, weights);
  if (!table.defined() || table.dim() != 2 || table.size(1) != options.input_size) {
    throw std::invalid_argument(
        "lookup table must be 2-D [rows, input_size = " + std::to_string(options.input_size) +
        "], got shape " + (table.defined() ? shape_str(table.shape()) : "undefined"));
  }
  if (table.dtype() != options.dtype) {
    throw std::invalid_argument(std::string("lookup table has dtype ") + dtype_name(table.dtype()) +
                                " but the weights are " + dtype_name(options.dtype));
  }
  if (static_cast<int64_t>(ids.size()) != plan.total_rows()) {
    throw std::invalid_argument("lookup has " + std::to_string(ids.size()) +
                                " ids but the batch sizes sum to " +
                                std::to_string(plan.total_rows()));
  }
  const int64_t V = table.size(0);
  for (std::size_t r = 0; r < ids.size(); ++r) {
    if (ids[r] < 0 || ids[r] >= V) {
      throw std::invalid_argument("lookup ids[" + std::to_string(r) + "] = " +
                                  std::to_string(ids[r]) + " is outside the table's rows [0, " +
                                  std::to_string(V) + ")");
    }
  }
  check_initial_state(options, plan, h0, c0);
  return dispatch_forward(options, weights, table, &ids, plan, h0, c0, training,
                          save_for_backward, dropout_seed, int8);
}

std::shared_ptr<const RNNInt8Weights> rnn_quantize_int8(const RNNOptions& options,
                                                        const std::vector<Tensor>& weights) {
  options.validate();
  if (options.precision != Precision::int8) {
    throw std::invalid_argument(std::string("rnn_quantize_int8 needs options at precision int8, "
                                            "got ") +
                                precision_name(options.precision));
  }
  check_weights(options, weights);
  auto q = std::make_shared<RNNInt8Weights>();
  for (const Tensor& w : weights) q->sources.push_back(w.raw_data());
  q->prepared = int8_operands(options, weights);
  return q;
}

RNNGradients rnn_backward(const RNNSaved& saved, const Tensor& grad_output, const Tensor& grad_h_n,
                          const Tensor& grad_c_n, bool initial_state_grad, bool input_grad) {
  const RNNOptions& o = saved.options;
  const int64_t LD = o.num_layers * o.num_directions();
  check_state(grad_output, {saved.total_rows, o.output_size()}, o.dtype, "grad_output");
  check_state(grad_h_n, {LD, saved.batch, o.real_hidden_size()}, o.dtype, "grad_h_n");
  if (has_cell_state(o.mode)) {
    check_state(grad_c_n, {LD, saved.batch, o.hidden_size}, o.dtype, "grad_c_n");
  } else if (grad_c_n.defined()) {
    throw std::invalid_argument(std::string("grad_c_n is only used by LSTM, not ") +
                                rnn_mode_name(o.mode));
  }
  return with_cell(o.mode, [&]<typename Cell>(Cell) {
    if (o.dtype == DType::f32) {
      return backward_impl<float, Cell>(saved, grad_output, grad_h_n, grad_c_n, initial_state_grad,
                                        input_grad);
    }
    return backward_impl<double, Cell>(saved, grad_output, grad_h_n, grad_c_n, initial_state_grad,
                                       input_grad);
  });
}

}  // namespace seqpack
