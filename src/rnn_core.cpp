// The packed-native functional core: rnn_forward and rnn_backward.
//
// Per layer and direction the forward does
//   1. ONE GEMM over all packed rows: G = X·W_ihᵀ + b (the input projection);
//   2. per step t, ONE GEMM of only its live rows (batch_sizes[t]) with W_hh,
//      accumulated into that step's rows of G;
//   3. one fused gate kernel over those rows (src/cpu/rnn_gates.h).
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
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cpu/buffer_pool.h"
#include "cpu/gemm.h"
#include "cpu/gemm_engine.h"
#include "cpu/rnn_gates.h"
#include "seqpack/rnn.h"

namespace seqpack {

struct RNNSaved {
  struct Direction {
    Tensor gates;   // [N, G] gate activations (RNN: h itself)
    Tensor h_prev;  // [N, R] h entering each row's step
    Tensor c;       // LSTM [N, H] c after the step
    Tensor c_prev;  // LSTM [N, H] c entering the step
    Tensor m;       // LSTM with projection [N, H]: o * tanh(c), before W_hr
    Tensor ghn;     // GRU [N, H]: W_hn h_prev + b_hn
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
// on two threads with 32 units each).
int step_threads(int64_t H) {
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
#pragma omp parallel num_threads(nt)
  {
    // The column split (and the engine's step ranges) were planned for nt
    // threads; a smaller team runs it all on one thread.
    if (omp_get_num_threads() == nt) {
      body(omp_get_thread_num(), nt);
    } else if (omp_get_thread_num() == 0) {
      body(0, 1);
    }
  }
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

template <typename T>
RNNForwardResult forward_impl(const RNNOptions& o, const std::vector<Tensor>& weights,
                              const Tensor& data, const std::vector<int64_t>* lookup,
                              const PackingPlan& plan, const Tensor& h0, const Tensor& c0,
                              bool training, bool save, uint64_t seed) {
  const int64_t L = o.num_layers, D = o.num_directions(), H = o.hidden_size;
  const int64_t R = o.real_hidden_size(), G = o.gate_count() * H;
  const int64_t B = plan.batch(), N = plan.total_rows(), TT = plan.max_len();
  const bool lstm = o.mode == RNNMode::lstm, gru = o.mode == RNNMode::gru;
  const bool relu = o.mode == RNNMode::rnn_relu, proj = o.proj_size > 0;
  const auto& bs = plan.batch_sizes();
  const auto& off = plan.offsets();
  const auto& si = plan.sorted_indices();

  const cpu::BlasSingleThread one_pool;  // OpenMP's threads only (cpu/gemm.h)
  const cpu::GemmEngine<T>& eng = engine_for<T>(o);
  RNNForwardResult res;
  res.h_n = cpu::pooled_empty({L * D, B, R}, o.dtype);
  if (lstm) res.c_n = cpu::pooled_empty({L * D, B, H}, o.dtype);

  std::shared_ptr<RNNSaved> saved;
  if (save) {
    saved = std::make_shared<RNNSaved>();
    saved->options = o;
    saved->weights = weights;
    saved->batch_sizes = bs;
    saved->offsets = off;
    saved->sorted_indices = si;
    saved->batch = B;
    saved->total_rows = N;
    saved->h0_zero = !h0.defined();
    if (lookup) saved->lookup = *lookup;
  }
  const bool h0_zero = !h0.defined();

  // The whole workspace of the call, allocated once: nothing is allocated
  // inside the time loop.
  struct Workspace {
    std::vector<T> hstate, hprev, cstate, gh, m, bias, proj;
    std::vector<const T*> proj_rows;  // lookup layer: the projection row of each packed row
  };
  std::vector<Workspace> wss(static_cast<std::size_t>(D));
  for (Workspace& ws : wss) {
    ws.hstate.resize(static_cast<std::size_t>(B * R));
    // Without save, h_prev of a step goes to one of two alternating buffers
    // (a thread may start the next step while another still reads this one).
    ws.hprev.resize(save ? 0 : static_cast<std::size_t>(2 * B * R));
    ws.cstate.resize(lstm ? static_cast<std::size_t>(B * H) : 0);
    ws.gh.resize(gru ? static_cast<std::size_t>(B * G) : 0);
    ws.m.resize(proj && !save ? static_cast<std::size_t>(B * H) : 0);
    ws.bias.resize(static_cast<std::size_t>(G));
    ws.proj.resize(lookup ? static_cast<std::size_t>(data.size(0) * G) : 0);
  }
  const int nt = step_threads(H);

  Tensor layer_in = data;
  for (int64_t l = 0; l < L; ++l) {
    const int64_t in = l == 0 ? o.input_size : D * R;
    Tensor x = layer_in;
    Tensor mask;
    if (l > 0 && training && o.dropout > 0) {
      mask = dropout_mask<T>(N, in, o.dropout, seed, l);
      x = cpu::pooled_empty({N, in}, o.dtype);
      const T* a = layer_in.data<T>();
      const T* m = mask.data<T>();
      T* y = x.data<T>();
      for (int64_t i = 0; i < N * in; ++i) y[i] = a[i] * m[i];
    }
    Tensor out = cpu::pooled_empty({N, D * R}, o.dtype);
    const int64_t ldo = D * R;
    RNNSaved::Layer sl;
    if (save) {
      sl.input = x;
      sl.mask = mask;
    }
    std::vector<RNNSaved::Direction> sds(static_cast<std::size_t>(D));
    auto direction = [&](int64_t d, int nt_steps) {
      Workspace& ws = wss[static_cast<std::size_t>(d)];
      const DirWeights<T> w = dir_weights<T>(o, weights, l, d);
      Tensor gates_t = cpu::pooled_empty({N, G}, o.dtype);
      T* gates = gates_t.data<T>();
      // G = X·W_ihᵀ + b, with b = b_ih, plus b_hh except for GRU, whose b_hn
      // must stay inside r * (W_hn h + b_hn).
      T* bias = ws.bias.data();
      for (int64_t k = 0; k < G; ++k) {
        bias[k] = !o.bias ? T(0) : gru ? w.b_ih[k] : w.b_ih[k] + w.b_hh[k];
      }
      const bool lookup_layer = l == 0 && lookup;
      if (lookup_layer) {
        // Project the V table rows once; each step copies its rows' own
        // projection just before its product (while the rows are in cache).
        const int64_t V = x.size(0);
        T* p = ws.proj.data();
        eng.gemm(false, true, V, G, in, x.data<T>(), in, w.w_ih, in, T(0), p, G);
        for (int64_t v = 0; v < V; ++v)
          for (int64_t k = 0; k < G; ++k) p[v * G + k] += bias[k];
      } else {
        eng.gemm(false, true, N, G, in, x.data<T>(), in, w.w_ih, in, T(0), gates, G,
                 o.bias ? bias : nullptr);
      }

      RNNSaved::Direction& sd = sds[static_cast<std::size_t>(d)];
      T *hprev = nullptr, *cs = nullptr, *cps = nullptr, *ms = nullptr, *ghn = nullptr;
      if (save) {
        sd.gates = gates_t;
        sd.h_prev = cpu::pooled_empty({N, R}, o.dtype);
        hprev = sd.h_prev.data<T>();
        if (lstm) {
          sd.c = cpu::pooled_empty({N, H}, o.dtype);
          sd.c_prev = cpu::pooled_empty({N, H}, o.dtype);
          cs = sd.c.data<T>();
          cps = sd.c_prev.data<T>();
        }
        if (proj) {
          sd.m = cpu::pooled_empty({N, H}, o.dtype);
          ms = sd.m.data<T>();
        }
        if (gru) {
          sd.ghn = cpu::pooled_empty({N, H}, o.dtype);
          ghn = sd.ghn.data<T>();
        }
      }
      // W_hhᵀ [R, G] (and W_hrᵀ [H, R]) laid out once for the steps' products.
      const auto whh = eng.prepare(w.w_hh, /*trans_b=*/true, R, G, R, step_ranges(H, G / H, nt_steps));
      std::unique_ptr<cpu::StepOperand> whr;
      if (proj) whr = eng.prepare(w.w_hr, /*trans_b=*/true, H, R, H, step_ranges(R, 1, nt_steps));
      // The lookup rows start the product's accumulators from their projection
      // (the engine's init rows, where it takes them) instead of a copy into G;
      // GRU keeps the copy (its product goes to a separate buffer).
      const bool fuse_lookup = lookup_layer && eng.takes_init() && !gru;
      if (fuse_lookup) {
        ws.proj_rows.resize(static_cast<std::size_t>(N));  // layer 0 only: once per direction
        for (int64_t r = 0; r < N; ++r)
          ws.proj_rows[static_cast<std::size_t>(r)] = ws.proj.data() + (*lookup)[static_cast<std::size_t>(r)] * G;
      }
      const int64_t ld = l * D + d;
      load_state(ws.hstate.data(), h0, ld, si, R);
      if (lstm) load_state(ws.cstate.data(), c0, ld, si, H);

      T* outp = out.data<T>() + d * R;
      // The time loop, run by `nth` threads that each own hidden units
      // [a, b) of every gate (and columns [ra, rb) of h): per step each thread
      // multiplies all of h_prev by its rows of W_hh and runs the gate kernel
      // on its columns, so one barrier per step suffices (two with a projection).
      auto time_loop = [&](int tid, int nth) {
        int64_t a, b, ra, rb;
        split_columns(H, nth, tid, a, b);
        split_columns(R, nth, tid, ra, rb);
        for (int64_t s = 0; s < TT; ++s) {
          // The reverse direction walks t down; rows bs[t+1]..bs[t]-1 begin
          // there and still hold h0 in the state buffer.
          const int64_t t = d == 0 ? s : TT - 1 - s;
          const int64_t n = bs[static_cast<std::size_t>(t)];
          const int64_t r0 = off[static_cast<std::size_t>(t)];
          T* grow = gates + r0 * G;
          T* orow = outp + r0 * ldo;
          T* hsrc = save ? hprev + r0 * R : ws.hprev.data() + (s % 2) * B * R;
          copy_rows(hsrc + ra, R, ws.hstate.data() + ra, R, n, rb - ra);
          if (nth > 1) {
#pragma omp barrier
          }
          // Rows past ng hold the zero h0: their product is zero.
          const int64_t ng = h0_zero ? rows_after_h0(bs, t, d) : n;
          const T* const* init = nullptr;
          if (lookup_layer) {
            // Fused: rows < ng take their projection inside the product.
            const int64_t copied = fuse_lookup ? ng : 0;
            if (fuse_lookup) init = ws.proj_rows.data() + r0;
            const T* p = ws.proj.data();
            for (int64_t j = copied; j < n; ++j) {
              const T* src = p + (*lookup)[static_cast<std::size_t>(r0 + j)] * G;
              for (int64_t q = 0; q < G / H; ++q) {
                std::memcpy(grow + j * G + q * H + a, src + q * H + a,
                            static_cast<std::size_t>(b - a) * sizeof(T));
              }
            }
          }
          // grow[:ng, q*H + a .. q*H + b) (+)= h_prev · W_hh[q*H + a .. q*H + b)ᵀ for each gate q.
          auto hidden_gemm = [&](T beta, T* dst) {
            if (ng == 0) return;
            for (int64_t q = 0; q < (nth == 1 ? 1 : G / H); ++q) {
              eng.step(ng, hsrc, R, *whh, step_range(nth, tid, G / H, q), beta, dst, G, init);
            }
          };
          if (lstm) {
            hidden_gemm(T(1), grow);
            T* cdst = ws.cstate.data();
            if (save) {
              copy_rows(cps + r0 * H + a, H, ws.cstate.data() + a, H, n, b - a);
              cdst = cs + r0 * H;
            }
            T* hdst = orow;
            int64_t ldh = ldo;
            if (proj) {
              hdst = save ? ms + r0 * H : ws.m.data();
              ldh = H;
            }
            cpu::lstm_gates_forward<T>(n, H, a, b, grow, ws.cstate.data(), H, cdst, H, hdst, ldh);
            if (save) copy_rows(ws.cstate.data() + a, H, cdst + a, H, n, b - a);
            if (proj) {
              if (nth > 1) {
#pragma omp barrier
              }
              eng.step(n, hdst, H, *whr, step_range(nth, tid, 1, 0), T(0), orow, ldo);
            }
          } else if (gru) {
            hidden_gemm(T(0), ws.gh.data());
            for (int64_t r = ng; r < n; ++r)
              for (int64_t q = 0; q < 3; ++q)
                std::fill(ws.gh.data() + r * G + q * H + a, ws.gh.data() + r * G + q * H + b, T(0));
            cpu::gru_gates_forward<T>(n, H, a, b, grow, ws.gh.data(), w.b_hh, hsrc, R, orow, ldo,
                                      save ? ghn + r0 * H : nullptr);
          } else {
            hidden_gemm(T(1), grow);
            cpu::rnn_gates_forward<T>(n, H, a, b, grow, relu, orow, ldo);
          }
          copy_rows(ws.hstate.data() + ra, R, orow + ra, ldo, n, rb - ra);
        }
      };
      run_threads(nt_steps, time_loop);
      store_state(res.h_n, ws.hstate.data(), ld, si, R);
      if (lstm) store_state(res.c_n, ws.cstate.data(), ld, si, H);
    };
    // Two directions run side by side on two threads (no synchronisation
    // until the layer ends); one direction splits its steps by columns.
    if (D == 2 && omp_get_max_threads() >= 2) {
      run_threads(2, [&](int tid, int nth) {
        for (int64_t d = tid; d < D; d += nth) direction(d, 1);
      });
    } else {
      for (int64_t d = 0; d < D; ++d) direction(d, nt);
    }
    if (save) sl.dirs = std::move(sds);
    if (save) saved->layers.push_back(std::move(sl));
    layer_in = out;
  }
  res.output = layer_in;
  res.saved = saved;
  return res;
}

template <typename T>
RNNGradients backward_impl(const RNNSaved& sv, const Tensor& grad_output, const Tensor& grad_h_n,
                           const Tensor& grad_c_n, bool initial_state_grad) {
  const RNNOptions& o = sv.options;
  const int64_t L = o.num_layers, D = o.num_directions(), H = o.hidden_size;
  const int64_t R = o.real_hidden_size(), G = o.gate_count() * H;
  const int64_t B = sv.batch, N = sv.total_rows;
  const int64_t TT = static_cast<int64_t>(sv.batch_sizes.size());
  const bool lstm = o.mode == RNNMode::lstm, gru = o.mode == RNNMode::gru;
  const bool relu = o.mode == RNNMode::rnn_relu, proj = o.proj_size > 0;
  const auto& bs = sv.batch_sizes;
  const auto& off = sv.offsets;
  const auto& si = sv.sorted_indices;

  const cpu::BlasSingleThread one_pool;  // OpenMP's threads only (cpu/gemm.h)
  const cpu::GemmEngine<T>& eng = engine_for<T>(o);
  RNNGradients g;
  for (const Shape& s : rnn_parameter_shapes(o)) g.weights.push_back(cpu::pooled_empty(s, o.dtype));
  if (initial_state_grad) {
    g.h0 = cpu::pooled_empty({L * D, B, R}, o.dtype);
    if (lstm) g.c0 = cpu::pooled_empty({L * D, B, H}, o.dtype);
  }
  const bool lookup = !sv.lookup.empty();

  struct Workspace {
    std::vector<T> dhstate, dcstate, dm, dhtot, dproj;
    Tensor dg_t, dgh_t;
    T* dg = nullptr;   // [N, G] gradient of the gate pre-activations (GRU: input side)
    T* dgh = nullptr;  // GRU: [N, G] gradient of W_h h_prev + b_h; else = dg
  };
  std::vector<Workspace> wss(static_cast<std::size_t>(D));
  for (Workspace& ws : wss) {
    ws.dhstate.resize(static_cast<std::size_t>(B * R));
    ws.dcstate.resize(lstm ? static_cast<std::size_t>(B * H) : 0);
    ws.dm.resize(proj ? static_cast<std::size_t>(B * H) : 0);
    // Under a projection dW_hr = dHᵀ·M needs dh of every row; otherwise one step's worth.
    ws.dhtot.resize(static_cast<std::size_t>((proj ? N : B) * R));
    ws.dg_t = cpu::pooled_empty({N, G}, o.dtype);
    ws.dg = ws.dg_t.template data<T>();
    if (gru) ws.dgh_t = cpu::pooled_empty({N, G}, o.dtype);
    ws.dgh = gru ? ws.dgh_t.template data<T>() : ws.dg;
    if (lookup) ws.dproj.resize(static_cast<std::size_t>(sv.layers[0].input.size(0) * G));
  }
  const int nt = step_threads(H);

  Tensor dout = grad_output;  // gradient of this layer's output rows, or undefined
  for (int64_t l = L - 1; l >= 0; --l) {
    const RNNSaved::Layer& sl = sv.layers[static_cast<std::size_t>(l)];
    const int64_t in = l == 0 ? o.input_size : D * R;
    const int64_t ldo = D * R;
    const bool lookup_layer = l == 0 && lookup;
    const int64_t V = lookup_layer ? sl.input.size(0) : 0;  // table rows
    Tensor dx = cpu::pooled_empty({lookup_layer ? V : N, in}, o.dtype);
    auto direction = [&](int64_t d, int nt_steps) {
      Workspace& ws = wss[static_cast<std::size_t>(d)];
      T* dg = ws.dg;
      T* dgh = ws.dgh;
      const RNNSaved::Direction& sd = sl.dirs[static_cast<std::size_t>(d)];
      const DirWeights<T> w = dir_weights<T>(o, sv.weights, l, d);
      const T* gates = sd.gates.data<T>();
      const T* hprev = sd.h_prev.data<T>();
      // Bias gradients, summed by the gate kernels step by step (saves a pass
      // over [N, G] after the loop). LSTM and RNN: db_hh == db_ih, copied after.
      T* db_ih = o.bias ? g.weights[static_cast<std::size_t>(w.first) + 2].data<T>() : nullptr;
      T* db_hh = o.bias ? g.weights[static_cast<std::size_t>(w.first) + 3].data<T>() : nullptr;
      if (db_ih) std::fill(db_ih, db_ih + G, T(0));
      if (db_hh) std::fill(db_hh, db_hh + G, T(0));
      // W_hh [G, R] (and W_hr [R, H]) laid out once for the steps' products.
      const auto whh = eng.prepare(w.w_hh, /*trans_b=*/false, G, R, R, step_ranges(R, 1, nt_steps));
      std::unique_ptr<cpu::StepOperand> whr;
      if (proj) whr = eng.prepare(w.w_hr, /*trans_b=*/false, R, H, H, step_ranges(H, 1, nt_steps));
      const int64_t ld = l * D + d;
      load_state(ws.dhstate.data(), grad_h_n, ld, si, R);
      if (lstm) load_state(ws.dcstate.data(), grad_c_n, ld, si, H);
      const T* doutp = dout.defined() ? dout.data<T>() + d * R : nullptr;
      // Layer 0 of a lookup: dP[v] sums dg over the rows that read table row v,
      // added step by step while the rows are in cache.
      if (lookup_layer) std::fill(ws.dproj.begin(), ws.dproj.end(), T(0));
      auto scatter_rows = [&](int64_t n, int64_t r0, const T* dgr, int64_t a, int64_t b) {
        if (!lookup_layer) return;
        for (int64_t j = 0; j < n; ++j) {
          T* dst = ws.dproj.data() + sv.lookup[static_cast<std::size_t>(r0 + j)] * G;
          const T* src = dgr + j * G;
          for (int64_t q = 0; q < G / H; ++q)
            for (int64_t c = q * H + a; c < q * H + b; ++c) dst[c] += src[c];
        }
      };

      // Same column split as the forward: each thread owns hidden units
      // [a, b) of the gate gradients and columns [ra, rb) of dh.
      auto time_loop = [&](int tid, int nth) {
        int64_t a, b, ra, rb;
        split_columns(H, nth, tid, a, b);
        split_columns(R, nth, tid, ra, rb);
        // dh_prev[:n, ra..rb) (+)= dgr · W_hh[:, ra..rb).
        auto hidden_gemm = [&](int64_t n, const T* dgr, T beta) {
          if (n == 0) return;
          eng.step(n, dgr, G, *whh, step_range(nth, tid, 1, 0), beta, ws.dhstate.data(), R);
        };
        for (int64_t s = 0; s < TT; ++s) {
          // Undo the forward's order: the forward direction walks t down here.
          const int64_t t = d == 0 ? TT - 1 - s : s;
          const int64_t n = bs[static_cast<std::size_t>(t)];
          const int64_t r0 = off[static_cast<std::size_t>(t)];
          T* dht = proj ? ws.dhtot.data() + r0 * R : ws.dhtot.data();
          // dh of this step = upstream gradient of the output row + what the
          // following step sent back through W_hh (or grad_h_n at the last step).
          // With no output gradient and no projection, the LSTM and RNN kernels
          // read it where it is (they only read dh; the product that overwrites
          // it comes after them, past the barrier). GRU writes its direct
          // dh_prev part into the state while it reads dh, so it reads a copy.
          if (!doutp && !proj && !gru) {
            dht = ws.dhstate.data();
          } else if (doutp) {
            for (int64_t j = 0; j < n; ++j) {
              const T* x = doutp + (r0 + j) * ldo;
              const T* y = ws.dhstate.data() + j * R;
              T* z = dht + j * R;
              for (int64_t k = ra; k < rb; ++k) z[k] = x[k] + y[k];
            }
          } else {
            copy_rows(dht + ra, R, ws.dhstate.data() + ra, R, n, rb - ra);
          }
          T* dgr = dg + r0 * G;
          // Without grad h0, rows past ng send dh_prev nowhere.
          const int64_t ng = initial_state_grad ? n : rows_after_h0(bs, t, d);
          if (lstm) {
            const T* dh_in = dht;
            int64_t ld_dh = R;
            if (proj) {
              if (nth > 1) {
#pragma omp barrier
              }
              eng.step(n, dht, R, *whr, step_range(nth, tid, 1, 0), T(0), ws.dm.data(), H);
              dh_in = ws.dm.data();
              ld_dh = H;
            }
            cpu::lstm_gates_backward<T>(n, H, a, b, gates + r0 * G, sd.c.data<T>() + r0 * H,
                                        sd.c_prev.data<T>() + r0 * H, dh_in, ld_dh,
                                        ws.dcstate.data(), dgr, db_ih);
            scatter_rows(n, r0, dgr, a, b);
            if (nth > 1) {
#pragma omp barrier
            }
            hidden_gemm(ng, dgr, T(0));
          } else if (gru) {
            T* dghr = dgh + r0 * G;
            cpu::gru_gates_backward<T>(n, H, a, b, gates + r0 * G, sd.ghn.data<T>() + r0 * H,
                                       hprev + r0 * R, R, dht, R, dgr, dghr, ws.dhstate.data(),
                                       db_ih, db_hh);
            scatter_rows(n, r0, dgr, a, b);
            if (nth > 1) {
#pragma omp barrier
            }
            hidden_gemm(ng, dghr, T(1));
          } else {
            cpu::rnn_gates_backward<T>(n, H, a, b, gates + r0 * G, relu, dht, R, dgr, db_ih);
            scatter_rows(n, r0, dgr, a, b);
            if (nth > 1) {
#pragma omp barrier
            }
            hidden_gemm(ng, dgr, T(0));
          }
        }
      };
      run_threads(nt_steps, time_loop);
      if (initial_state_grad) {
        store_state(g.h0, ws.dhstate.data(), ld, si, R);
        if (lstm) store_state(g.c0, ws.dcstate.data(), ld, si, H);
      }

      // Everything else is one GEMM (or one pass) over all packed rows.
      const std::size_t k = static_cast<std::size_t>(w.first);
      T* dwih = g.weights[k].data<T>();
      T* dwhh = g.weights[k + 1].data<T>();
      const T* x = sl.input.data<T>();
      if (lookup_layer) {
        // dW_ih = dPᵀ·table, dP summed during the steps.
        eng.gemm(true, false, G, in, V, ws.dproj.data(), G, x, in, T(0), dwih, in);
      } else {
        eng.gemm(true, false, G, in, N, dg, G, x, in, T(0), dwih, in);
      }
      // The forward direction's first rows saw the zero h0: they add nothing to dW_hh.
      const int64_t skip = sv.h0_zero && d == 0 && TT > 0 ? bs[0] : 0;
      eng.gemm(true, false, G, R, N - skip, dgh + skip * G, G, hprev + skip * R, R, T(0), dwhh, R);
      std::size_t next = k + 2;
      if (o.bias) {
        if (!gru) std::copy(db_ih, db_ih + G, db_hh);
        next += 2;
      }
      if (proj) {
        eng.gemm(true, false, R, H, N, ws.dhtot.data(), R, sd.m.data<T>(), H, T(0),
                 g.weights[next].data<T>(), H);
      }
    };
    if (D == 2 && omp_get_max_threads() >= 2) {
      run_threads(2, [&](int tid, int nth) {
        for (int64_t d = tid; d < D; d += nth) direction(d, 1);
      });
    } else {
      for (int64_t d = 0; d < D; ++d) direction(d, nt);
    }
    // dX sums both directions' contributions, after both are done.
    for (int64_t d = 0; d < D; ++d) {
      const DirWeights<T> w = dir_weights<T>(o, sv.weights, l, d);
      const Workspace& ws = wss[static_cast<std::size_t>(d)];
      eng.gemm(false, false, lookup_layer ? V : N, in, G, lookup_layer ? ws.dproj.data() : ws.dg, G,
               w.w_ih, in, d == 0 ? T(0) : T(1), dx.data<T>(), in);
    }
    if (l > 0 && sl.mask.defined()) {
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
  if (options.mode == RNNMode::lstm) {
    check_state(c0, {LD, plan.batch(), options.hidden_size}, options.dtype, "c0");
  } else if (c0.defined()) {
    throw std::invalid_argument(std::string("c0 is only used by LSTM, not ") +
                                rnn_mode_name(options.mode));
  }
}

RNNForwardResult dispatch_forward(const RNNOptions& options, const std::vector<Tensor>& weights,
                                  const Tensor& data, const std::vector<int64_t>* lookup,
                                  const PackingPlan& plan, const Tensor& h0, const Tensor& c0,
                                  bool training, bool save_for_backward, uint64_t dropout_seed) {
  if (options.dtype == DType::f32) {
    return forward_impl<float>(options, weights, data, lookup, plan, h0, c0, training,
                               save_for_backward, dropout_seed);
  }
  return forward_impl<double>(options, weights, data, lookup, plan, h0, c0, training,
                              save_for_backward, dropout_seed);
}

}  // namespace

RNNForwardResult rnn_forward(const RNNOptions& options, const std::vector<Tensor>& weights,
                             const Tensor& data, const PackingPlan& plan, const Tensor& h0,
                             const Tensor& c0, bool training, bool save_for_backward,
                             uint64_t dropout_seed) {
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
                          save_for_backward, dropout_seed);
}

RNNForwardResult rnn_forward_lookup(const RNNOptions& options, const std::vector<Tensor>& weights,
                                    const Tensor& table, const std::vector<int64_t>& ids,
                                    const PackingPlan& plan, const Tensor& h0, const Tensor& c0,
                                    bool training, bool save_for_backward,
                                    uint64_t dropout_seed) {
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
                          save_for_backward, dropout_seed);
}

RNNGradients rnn_backward(const RNNSaved& saved, const Tensor& grad_output, const Tensor& grad_h_n,
                          const Tensor& grad_c_n, bool initial_state_grad) {
  const RNNOptions& o = saved.options;
  const int64_t LD = o.num_layers * o.num_directions();
  check_state(grad_output, {saved.total_rows, o.output_size()}, o.dtype, "grad_output");
  check_state(grad_h_n, {LD, saved.batch, o.real_hidden_size()}, o.dtype, "grad_h_n");
  if (o.mode == RNNMode::lstm) {
    check_state(grad_c_n, {LD, saved.batch, o.hidden_size}, o.dtype, "grad_c_n");
  } else if (grad_c_n.defined()) {
    throw std::invalid_argument(std::string("grad_c_n is only used by LSTM, not ") +
                                rnn_mode_name(o.mode));
  }
  if (o.dtype == DType::f32) {
    return backward_impl<float>(saved, grad_output, grad_h_n, grad_c_n, initial_state_grad);
  }
  return backward_impl<double>(saved, grad_output, grad_h_n, grad_c_n, initial_state_grad);
}

}  // namespace seqpack
