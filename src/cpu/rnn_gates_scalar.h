// Scalar gate kernels: the float64 path, and the tail/fallback of float32.
// Same contracts as rnn_gates.h.
#pragma once

#include <cmath>
#include <cstdint>

#include "seqpack/detail/gate_math.h"

namespace seqpack::cpu::scalar {

template <typename T>
inline T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// The activations gate_math's formulas take here: std::'s.
struct StdMath {
  template <typename T>
  static T sigmoid(T x) {
    return scalar::sigmoid(x);
  }
  template <typename T>
  static T tanh(T x) {
    return std::tanh(x);
  }
};

// One column k of one row: the formulas (seqpack/detail/gate_math.h, which
// the CUDA kernels share) on this layout, used by the row loops below and by
// the tails of the SIMD kernels.

// i = σ(a_i), f = σ(a_f), g = tanh(a_g), o = σ(a_o)
// c = f * c_prev + i * g;  h = o * tanh(c)
// x: optional input rows added to a first (rnn_gates.h), null to skip.
template <typename T>
inline void lstm_forward_at(int64_t H, int64_t k, T* g, const T* cp, T* c, T* h,
                            const T* x = nullptr) {
  if (x) {
    for (int64_t j = 0; j < 4; ++j) g[j * H + k] += x[j * H + k];
  }
  const auto s =
      gate_math::lstm_forward<StdMath>(g[k], g[H + k], g[2 * H + k], g[3 * H + k], cp[k]);
  g[k] = s.i;
  g[H + k] = s.f;
  g[2 * H + k] = s.g;
  g[3 * H + k] = s.o;
  c[k] = s.c;
  h[k] = s.h;
}

// db: optional bias-gradient accumulators, dx: optional input-row
// accumulators (rnn_gates.h), null to skip.
template <typename T>
inline void lstm_backward_at(int64_t H, int64_t k, const T* g, const T* c, const T* cp, const T* dh,
                             T* dc, T* dg, T* db, T* dx = nullptr) {
  // dc carries dc_{t+1}·f_{t+1} in, and out the same for the step before.
  const auto d = gate_math::lstm_backward(g[k], g[H + k], g[2 * H + k], g[3 * H + k],
                                          std::tanh(c[k]), cp[k], dh[k], dc[k]);
  dg[k] = d.i;
  dg[H + k] = d.f;
  dg[2 * H + k] = d.g;
  dg[3 * H + k] = d.o;
  dc[k] = d.dc_prev;
  if (db) {
    for (int64_t j = 0; j < 4; ++j) db[j * H + k] += dg[j * H + k];
  }
  if (dx) {
    for (int64_t j = 0; j < 4; ++j) dx[j * H + k] += dg[j * H + k];
  }
}

// r = σ(a_r + b_r), z = σ(a_z + b_z), n = tanh(a_n + r * (W_hn h + b_hn))
// h' = (1 - z) * n + z * h      (a_* = W_i* x + b_i* + W_h* h, b_* from b_hh)
template <typename T>
inline void gru_forward_at(int64_t H, int64_t k, T* x, const T* y, const T* b_hh, const T* hp, T* h,
                           T* ghn) {
  const T bhr = b_hh ? b_hh[k] : T(0);
  const T bhz = b_hh ? b_hh[H + k] : T(0);
  const T bhn = b_hh ? b_hh[2 * H + k] : T(0);
  const T hn = y[2 * H + k] + bhn;
  const auto s = gate_math::gru_forward<StdMath>(x[k] + y[k] + bhr, x[H + k] + y[H + k] + bhz,
                                                 x[2 * H + k], hn, hp[k]);
  x[k] = s.r;
  x[H + k] = s.z;
  x[2 * H + k] = s.n;
  if (ghn) ghn[k] = hn;
  h[k] = s.h;
}

template <typename T>
inline void gru_backward_at(int64_t H, int64_t k, const T* g, const T* hn, const T* hp, const T* d,
                            T* dx, T* dy, T* dhp, T* db_ih, T* db_hh) {
  const auto r = gate_math::gru_backward(g[k], g[H + k], g[2 * H + k], hn[k], hp[k], d[k]);
  dx[k] = r.r;
  dx[H + k] = r.z;
  dx[2 * H + k] = r.n;
  dy[k] = r.r;
  dy[H + k] = r.z;
  dy[2 * H + k] = r.n_h;
  dhp[k] = r.h_prev;
  if (db_ih && db_hh) {
    for (int64_t j = 0; j < 3; ++j) {
      db_ih[j * H + k] += dx[j * H + k];
      db_hh[j * H + k] += dy[j * H + k];
    }
  }
}

// h = tanh(a) or max(a, 0)
template <typename T>
inline void rnn_forward_at(int64_t k, T* g, bool relu, T* h) {
  const T v = gate_math::rnn_forward<StdMath>(g[k], relu);
  g[k] = v;
  h[k] = v;
}

template <typename T>
inline void rnn_backward_at(int64_t k, const T* hs, bool relu, const T* d, T* o, T* db) {
  o[k] = gate_math::rnn_backward(hs[k], d[k], relu);
  if (db) db[k] += o[k];
}

template <typename T>
void lstm_gates_forward(int64_t n, int64_t H, int64_t k0, int64_t k1, T* gates, const T* c_prev,
                        int64_t ld_cprev, T* c, int64_t ld_c, T* h, int64_t ld_h,
                        const T* const* x_rows = nullptr) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t k = k0; k < k1; ++k)
      lstm_forward_at(H, k, gates + r * 4 * H, c_prev + r * ld_cprev, c + r * ld_c, h + r * ld_h,
                      x_rows ? x_rows[r] : nullptr);
}

template <typename T>
void lstm_gates_backward(int64_t n, int64_t H, int64_t k0, int64_t k1, const T* gates, const T* c,
                         const T* c_prev, const T* dh, int64_t ld_dh, T* dc, T* dgates,
                         T* dbias, T* const* dx_rows = nullptr) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t k = k0; k < k1; ++k)
      lstm_backward_at(H, k, gates + r * 4 * H, c + r * H, c_prev + r * H, dh + r * ld_dh,
                       dc + r * H, dgates + r * 4 * H, dbias, dx_rows ? dx_rows[r] : nullptr);
}

template <typename T>
void gru_gates_forward(int64_t n, int64_t H, int64_t k0, int64_t k1, T* gx, const T* gh,
                       const T* b_hh, const T* h_prev, int64_t ld_hprev, T* h, int64_t ld_h,
                       T* ghn) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t k = k0; k < k1; ++k)
      gru_forward_at(H, k, gx + r * 3 * H, gh + r * 3 * H, b_hh, h_prev + r * ld_hprev,
                     h + r * ld_h, ghn ? ghn + r * H : nullptr);
}

template <typename T>
void gru_gates_backward(int64_t n, int64_t H, int64_t k0, int64_t k1, const T* gates, const T* ghn,
                        const T* h_prev, int64_t ld_hprev, const T* dh, int64_t ld_dh, T* dgx,
                        T* dgh, T* dh_prev, T* db_ih, T* db_hh) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t k = k0; k < k1; ++k)
      gru_backward_at(H, k, gates + r * 3 * H, ghn + r * H, h_prev + r * ld_hprev, dh + r * ld_dh,
                      dgx + r * 3 * H, dgh + r * 3 * H, dh_prev + r * H, db_ih, db_hh);
}

template <typename T>
void rnn_gates_forward(int64_t n, int64_t H, int64_t k0, int64_t k1, T* gates, bool relu, T* h,
                       int64_t ld_h) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t k = k0; k < k1; ++k) rnn_forward_at(k, gates + r * H, relu, h + r * ld_h);
}

template <typename T>
void rnn_gates_backward(int64_t n, int64_t H, int64_t k0, int64_t k1, const T* h_saved, bool relu,
                        const T* dh, int64_t ld_dh, T* dpre, T* dbias) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t k = k0; k < k1; ++k)
      rnn_backward_at(k, h_saved + r * H, relu, dh + r * ld_dh, dpre + r * H, dbias);
}

}  // namespace seqpack::cpu::scalar
