// Scalar gate kernels: the float64 path, and the tail/fallback of float32.
// Same contracts as rnn_gates.h.
#pragma once

#include <cmath>
#include <cstdint>

namespace seqpack::cpu::scalar {

template <typename T>
inline T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

template <typename T>
void lstm_gates_forward(int64_t n, int64_t H, T* gates, const T* c_prev, int64_t ld_cprev, T* c,
                        int64_t ld_c, T* h, int64_t ld_h) {
  for (int64_t r = 0; r < n; ++r) {
    T* g = gates + r * 4 * H;
    const T* cp = c_prev + r * ld_cprev;
    T* cr = c + r * ld_c;
    T* hr = h + r * ld_h;
    for (int64_t k = 0; k < H; ++k) {
      const T ig = sigmoid(g[k]);
      const T fg = sigmoid(g[H + k]);
      const T gg = std::tanh(g[2 * H + k]);
      const T og = sigmoid(g[3 * H + k]);
      g[k] = ig;
      g[H + k] = fg;
      g[2 * H + k] = gg;
      g[3 * H + k] = og;
      const T cn = fg * cp[k] + ig * gg;
      cr[k] = cn;
      hr[k] = og * std::tanh(cn);
    }
  }
}

template <typename T>
void lstm_gates_backward(int64_t n, int64_t H, const T* gates, const T* c, const T* c_prev,
                         const T* dh, int64_t ld_dh, T* dc, T* dgates) {
  for (int64_t r = 0; r < n; ++r) {
    const T* g = gates + r * 4 * H;
    const T* cr = c + r * H;
    const T* cp = c_prev + r * H;
    const T* dhr = dh + r * ld_dh;
    T* dcr = dc + r * H;
    T* dg = dgates + r * 4 * H;
    for (int64_t k = 0; k < H; ++k) {
      const T ig = g[k], fg = g[H + k], gg = g[2 * H + k], og = g[3 * H + k];
      const T tc = std::tanh(cr[k]);
      // h = o * tanh(c): dc gets the path through tanh(c) plus the next step's dc.
      const T dct = dcr[k] + dhr[k] * og * (T(1) - tc * tc);
      dg[k] = dct * gg * ig * (T(1) - ig);
      dg[H + k] = dct * cp[k] * fg * (T(1) - fg);
      dg[2 * H + k] = dct * ig * (T(1) - gg * gg);
      dg[3 * H + k] = dhr[k] * tc * og * (T(1) - og);
      dcr[k] = dct * fg;
    }
  }
}

template <typename T>
void gru_gates_forward(int64_t n, int64_t H, T* gx, const T* gh, const T* b_hh, const T* h_prev,
                       int64_t ld_hprev, T* h, int64_t ld_h, T* ghn) {
  for (int64_t r = 0; r < n; ++r) {
    T* x = gx + r * 3 * H;
    const T* y = gh + r * 3 * H;
    const T* hp = h_prev + r * ld_hprev;
    T* hr = h + r * ld_h;
    for (int64_t k = 0; k < H; ++k) {
      const T bhr = b_hh ? b_hh[k] : T(0);
      const T bhz = b_hh ? b_hh[H + k] : T(0);
      const T bhn = b_hh ? b_hh[2 * H + k] : T(0);
      const T rg = sigmoid(x[k] + y[k] + bhr);
      const T zg = sigmoid(x[H + k] + y[H + k] + bhz);
      const T hn = y[2 * H + k] + bhn;
      const T ng = std::tanh(x[2 * H + k] + rg * hn);
      x[k] = rg;
      x[H + k] = zg;
      x[2 * H + k] = ng;
      if (ghn) ghn[r * H + k] = hn;
      hr[k] = (T(1) - zg) * ng + zg * hp[k];
    }
  }
}

template <typename T>
void gru_gates_backward(int64_t n, int64_t H, const T* gates, const T* ghn, const T* h_prev,
                        int64_t ld_hprev, const T* dh, int64_t ld_dh, T* dgx, T* dgh,
                        T* dh_prev) {
  for (int64_t r = 0; r < n; ++r) {
    const T* g = gates + r * 3 * H;
    const T* hn = ghn + r * H;
    const T* hp = h_prev + r * ld_hprev;
    const T* d = dh + r * ld_dh;
    T* dx = dgx + r * 3 * H;
    T* dy = dgh + r * 3 * H;
    T* dhp = dh_prev + r * H;
    for (int64_t k = 0; k < H; ++k) {
      const T rg = g[k], zg = g[H + k], ng = g[2 * H + k];
      // h' = (1 - z) * n + z * h_prev;  n = tanh(a_n + r * hn)
      const T dnp = d[k] * (T(1) - zg) * (T(1) - ng * ng);
      const T dzp = d[k] * (hp[k] - ng) * zg * (T(1) - zg);
      const T drp = dnp * hn[k] * rg * (T(1) - rg);
      dx[k] = drp;
      dx[H + k] = dzp;
      dx[2 * H + k] = dnp;
      dy[k] = drp;
      dy[H + k] = dzp;
      dy[2 * H + k] = dnp * rg;
      dhp[k] = d[k] * zg;
    }
  }
}

template <typename T>
void rnn_gates_forward(int64_t n, int64_t H, T* gates, bool relu, T* h, int64_t ld_h) {
  for (int64_t r = 0; r < n; ++r) {
    T* g = gates + r * H;
    T* hr = h + r * ld_h;
    for (int64_t k = 0; k < H; ++k) {
      const T v = relu ? (g[k] > T(0) ? g[k] : T(0)) : std::tanh(g[k]);
      g[k] = v;
      hr[k] = v;
    }
  }
}

template <typename T>
void rnn_gates_backward(int64_t n, int64_t H, const T* h_saved, bool relu, const T* dh,
                        int64_t ld_dh, T* dpre) {
  for (int64_t r = 0; r < n; ++r) {
    const T* hs = h_saved + r * H;
    const T* d = dh + r * ld_dh;
    T* o = dpre + r * H;
    for (int64_t k = 0; k < H; ++k) {
      o[k] = relu ? (hs[k] > T(0) ? d[k] : T(0)) : d[k] * (T(1) - hs[k] * hs[k]);
    }
  }
}

}  // namespace seqpack::cpu::scalar
