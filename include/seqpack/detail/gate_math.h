// The gate formulas of the recurrent cells, written once for the CPU's scalar
// kernels (src/cpu/rnn_gates_scalar.h: float64, and float32's tails) and the
// CUDA kernels (cuda/src/kernels.cuh): one hidden unit of one row, from the
// gates' pre-activations (or the forward's activations, for the backward) to
// what the cell writes. Where the values live is the callers' business. M
// supplies the activations for T: M::sigmoid(x), M::tanh(x). Not part of the
// library's interface; C++17, and __host__ __device__ under nvcc.
#pragma once

#if defined(__CUDACC__)
#define SEQPACK_GATE_MATH __host__ __device__ __forceinline__
#else
#define SEQPACK_GATE_MATH inline
#endif

namespace seqpack::gate_math {

// LSTM: i = σ(a_i), f = σ(a_f), g = tanh(a_g), o = σ(a_o),
// c = f c_prev + i g, h = o tanh(c) (m, before a projection).
template <typename T>
struct LstmStep {
  T i, f, g, o, c, h;
};
template <typename M, typename T>
SEQPACK_GATE_MATH LstmStep<T> lstm_forward(T ai, T af, T ag, T ao, T c_prev) {
  LstmStep<T> s{};
  s.i = M::sigmoid(ai);
  s.f = M::sigmoid(af);
  s.g = M::tanh(ag);
  s.o = M::sigmoid(ao);
  s.c = s.f * c_prev + s.i * s.g;
  s.h = s.o * M::tanh(s.c);
  return s;
}

// The gradients of the pre-activations from the activations, tanh(c), c_prev,
// dh (of h = o tanh c) and dc (of c, carried from the step after):
//   dc_t = dc + dh o (1 - tanh^2 c), di = dc_t g, df = dc_t c_prev,
//   dg = dc_t i, do = dh tanh c (each times its activation's derivative),
// and the carry to the step before, dc_prev = dc_t f.
template <typename T>
struct LstmGrad {
  T i, f, g, o, dc_prev;
};
template <typename T>
SEQPACK_GATE_MATH LstmGrad<T> lstm_backward(T i, T f, T g, T o, T tanh_c, T c_prev, T dh, T dc) {
  const T dct = dc + dh * o * (T(1) - tanh_c * tanh_c);
  LstmGrad<T> d{};
  d.i = dct * g * i * (T(1) - i);
  d.f = dct * c_prev * f * (T(1) - f);
  d.g = dct * i * (T(1) - g * g);
  d.o = dh * tanh_c * o * (T(1) - o);
  d.dc_prev = dct * f;
  return d;
}

// GRU (linear before reset): r = σ(a_r), z = σ(a_z) (a_*: the input's and the
// state's parts, biases in), hn = W_hn h_prev + b_hn (the state's n part),
// n = tanh(x_n + r hn), h = (1 - z) n + z h_prev.
template <typename T>
struct GruStep {
  T r, z, n, h;
};
template <typename M, typename T>
SEQPACK_GATE_MATH GruStep<T> gru_forward(T ar, T az, T xn, T hn, T h_prev) {
  GruStep<T> s{};
  s.r = M::sigmoid(ar);
  s.z = M::sigmoid(az);
  s.n = M::tanh(xn + s.r * hn);
  s.h = (T(1) - s.z) * s.n + s.z * h_prev;
  return s;
}

// From the activations, hn, h_prev and dh: the gradients of the input's
// pre-activations (r, z, n), of the state's n part (n_h = dn r; its r and z
// parts are the input's), and the part of dh_prev that does not pass W_hh
// (dh z).
template <typename T>
struct GruGrad {
  T r, z, n, n_h, h_prev;
};
template <typename T>
SEQPACK_GATE_MATH GruGrad<T> gru_backward(T r, T z, T n, T hn, T h_prev, T dh) {
  GruGrad<T> d{};
  d.n = dh * (T(1) - z) * (T(1) - n * n);
  d.z = dh * (h_prev - n) * z * (T(1) - z);
  d.r = d.n * hn * r * (T(1) - r);
  d.n_h = d.n * r;
  d.h_prev = dh * z;
  return d;
}

// Elman: h = tanh(a), or max(a, 0) where a NaN stays NaN (as torch.relu).
template <typename M, typename T>
SEQPACK_GATE_MATH T rnn_forward(T a, bool relu) {
  return relu ? (a < T(0) ? T(0) : a) : M::tanh(a);
}

// The gradient of a from h and dh: dh (1 - h^2), or torch's threshold_backward
// for relu (0 where h <= 0, dh elsewhere, whatever dh is).
template <typename T>
SEQPACK_GATE_MATH T rnn_backward(T h, T dh, bool relu) {
  return relu ? (h <= T(0) ? T(0) : dh) : dh * (T(1) - h * h);
}

}  // namespace seqpack::gate_math
