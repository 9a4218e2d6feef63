// Plain reference of the recurrent layers: one sequence at a time, one step at a
// time, scalar loops, everything in double whatever the input dtype. It shares
// no code with the fast path (src/rnn_modules.cpp, src/rnn_core.cpp, src/rnn/,
// src/cpu/) on purpose: it is the independent evidence that the fast path is
// right, so it favours being obviously correct over being fast.
#include "reference/rnn_reference.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace seqpack {
namespace {

using Vec = std::vector<double>;

const char* mode_str(RNNMode mode) {
  switch (mode) {
    case RNNMode::rnn_tanh:
      return "rnn_tanh";
    case RNNMode::rnn_relu:
      return "rnn_relu";
    case RNNMode::lstm:
      return "lstm";
    case RNNMode::gru:
      return "gru";
  }
  return "unknown";
}

int64_t gates_of(RNNMode mode) {
  switch (mode) {
    case RNNMode::lstm:
      return 4;
    case RNNMode::gru:
      return 3;
    default:
      return 1;
  }
}

void check_options(const RNNOptions& o) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("rnn_reference: " + what); };
  if (o.mode != RNNMode::rnn_tanh && o.mode != RNNMode::rnn_relu && o.mode != RNNMode::lstm &&
      o.mode != RNNMode::gru) {
    bad("unknown mode " + std::to_string(static_cast<int>(o.mode)));
  }
  if (o.dtype != DType::f32 && o.dtype != DType::f64) {
    bad(std::string("dtype ") + dtype_name(o.dtype) + " is not a floating-point dtype");
  }
  if (o.input_size <= 0) bad("input_size = " + std::to_string(o.input_size) + " must be positive");
  if (o.hidden_size <= 0) {
    bad("hidden_size = " + std::to_string(o.hidden_size) + " must be positive");
  }
  if (o.num_layers <= 0) bad("num_layers = " + std::to_string(o.num_layers) + " must be positive");
  if (o.proj_size < 0) bad("proj_size = " + std::to_string(o.proj_size) + " must be >= 0");
  if (o.proj_size > 0 && o.mode != RNNMode::lstm) {
    bad("proj_size = " + std::to_string(o.proj_size) + " is only supported by LSTM, not " +
        mode_str(o.mode));
  }
  if (o.proj_size >= o.hidden_size && o.proj_size > 0) {
    bad("proj_size = " + std::to_string(o.proj_size) +
        " must be smaller than hidden_size = " + std::to_string(o.hidden_size));
  }
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// y += W x for a row-major W [rows, cols].
void add_matvec(const Vec& w, int64_t rows, int64_t cols, const double* x, double* y) {
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t c = 0; c < cols; ++c) s += w[static_cast<std::size_t>(r * cols + c)] * x[c];
    y[r] += s;
  }
}

// y += W^T x for a row-major W [rows, cols] (x has `rows` elements).
void add_matvec_t(const Vec& w, int64_t rows, int64_t cols, const double* x, double* y) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) y[c] += w[static_cast<std::size_t>(r * cols + c)] * x[r];
  }
}

// dW += a b^T for dW [a.size(), b.size()].
void add_outer(Vec& dw, const double* a, int64_t rows, const double* b, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dw[static_cast<std::size_t>(r * cols + c)] += a[r] * b[c];
  }
}

// The parameters of one layer and direction, as doubles.
struct DirParams {
  int64_t in = 0;                    // input features of this layer
  Vec w_ih, w_hh, b_ih, b_hh, w_hr;  // biases empty without bias, w_hr empty without proj
  // Indices into the flat weight list, -1 when absent.
  int64_t i_w_ih = -1, i_w_hh = -1, i_b_ih = -1, i_b_hh = -1, i_w_hr = -1;
};

struct Dims {
  int64_t L, D, G, H, P, I;
};

Dims dims_of(const RNNOptions& o) {
  return {o.num_layers,
          o.bidirectional ? 2 : 1,
          gates_of(o.mode),
          o.hidden_size,
          o.proj_size > 0 ? o.proj_size : o.hidden_size,
          o.input_size};
}

std::vector<DirParams> load_params(const RNNOptions& o, const std::vector<Tensor>& weights) {
  const std::vector<std::string> names = reference::rnn_parameter_names(o);
  const std::vector<Shape> shapes = reference::rnn_parameter_shapes(o);
  if (weights.size() != names.size()) {
    throw std::invalid_argument("rnn_reference: expected " + std::to_string(names.size()) +
                                " weights for these options, got " +
                                std::to_string(weights.size()));
  }
  for (std::size_t k = 0; k < names.size(); ++k) {
    if (!weights[k].defined()) {
      throw std::invalid_argument("rnn_reference: weight " + names[k] + " is undefined");
    }
    if (weights[k].shape() != shapes[k]) {
      throw std::invalid_argument("rnn_reference: weight " + names[k] + " has shape " +
                                  shape_str(weights[k].shape()) + ", expected " +
                                  shape_str(shapes[k]));
    }
    if (weights[k].dtype() == DType::i64) {
      throw std::invalid_argument("rnn_reference: weight " + names[k] + " has dtype int64");
    }
  }
  const Dims d = dims_of(o);
  std::vector<DirParams> out;
  std::size_t k = 0;
  auto take = [&](int64_t& index) {
    index = static_cast<int64_t>(k);
    return weights[k++].to_vector<double>();
  };
  for (int64_t l = 0; l < d.L; ++l) {
    for (int64_t dir = 0; dir < d.D; ++dir) {
      DirParams p;
      p.in = l == 0 ? d.I : d.P * d.D;
      p.w_ih = take(p.i_w_ih);
      p.w_hh = take(p.i_w_hh);
      if (o.bias) {
        p.b_ih = take(p.i_b_ih);
        p.b_hh = take(p.i_b_hh);
      }
      if (o.proj_size > 0) p.w_hr = take(p.i_w_hr);
      out.push_back(std::move(p));
    }
  }
  return out;
}

// What one step saw and computed, kept for the reference backward.
struct StepCache {
  Vec x, h_prev, c_prev;
  Vec pre;     // RNN: pre-activation a; LSTM: activated gates i, f, g, o; GRU: r, z, n
  Vec c;       // LSTM: c_t
  Vec m;       // LSTM: o_t * tanh(c_t) (h_t before the projection)
  Vec hn_lin;  // GRU: W_hn h_{t-1} + b_hn
  Vec h;       // h_t (after the projection)
};

// One step of one direction. Reads x [in], h [P], c [H]; writes the new h and c
// into `step`.
void cell_step(RNNMode mode, const Dims& d, const DirParams& p, StepCache& s) {
  const int64_t H = d.H, G = d.G;
  Vec gi(static_cast<std::size_t>(G * H), 0.0), gh(static_cast<std::size_t>(G * H), 0.0);
  // gi = W_ih x + b_ih, gh = W_hh h_{t-1} + b_hh, kept apart because GRU needs them apart.
  add_matvec(p.w_ih, G * H, p.in, s.x.data(), gi.data());
  add_matvec(p.w_hh, G * H, d.P, s.h_prev.data(), gh.data());
  if (!p.b_ih.empty()) {
    for (int64_t j = 0; j < G * H; ++j) {
      gi[static_cast<std::size_t>(j)] += p.b_ih[static_cast<std::size_t>(j)];
      gh[static_cast<std::size_t>(j)] += p.b_hh[static_cast<std::size_t>(j)];
    }
  }
  const double* cp = s.c_prev.empty() ? nullptr : s.c_prev.data();
  switch (mode) {
    case RNNMode::rnn_tanh:
    case RNNMode::rnn_relu:
      s.pre.assign(static_cast<std::size_t>(H), 0.0);
      s.h.assign(static_cast<std::size_t>(H), 0.0);
      reference::cell_row_forward(mode, H, gi.data(), gh.data(), s.h_prev.data(), cp, s.pre.data(),
                                  nullptr, s.h.data(), nullptr);
      break;
    case RNNMode::lstm:
      s.pre.assign(static_cast<std::size_t>(4 * H), 0.0);
      s.c.assign(static_cast<std::size_t>(H), 0.0);
      s.m.assign(static_cast<std::size_t>(H), 0.0);
      reference::cell_row_forward(mode, H, gi.data(), gh.data(), s.h_prev.data(), cp, s.pre.data(),
                                  s.c.data(), s.m.data(), nullptr);
      if (p.w_hr.empty()) {
        s.h = s.m;
      } else {
        s.h.assign(static_cast<std::size_t>(d.P), 0.0);
        add_matvec(p.w_hr, d.P, H, s.m.data(), s.h.data());
      }
      break;
    case RNNMode::gru:
      s.pre.assign(static_cast<std::size_t>(3 * H), 0.0);
      s.hn_lin.assign(static_cast<std::size_t>(H), 0.0);
      s.h.assign(static_cast<std::size_t>(H), 0.0);
      reference::cell_row_forward(mode, H, gi.data(), gh.data(), s.h_prev.data(), cp, s.pre.data(),
                                  nullptr, s.h.data(), s.hn_lin.data());
      break;
  }
}

// Backward of cell_step. dh [P] and dc [H] are the gradients reaching h_t and
// c_t; on return they hold the gradients of h_{t-1} and c_{t-1}. dx [in] is
// accumulated; parameter gradients are accumulated into g.
void cell_step_backward(RNNMode mode, const Dims& d, const DirParams& p, const StepCache& s,
                        Vec& dh, Vec& dc, double* dx, DirParams& g) {
  const int64_t H = d.H, G = d.G;
  Vec dgi(static_cast<std::size_t>(G * H), 0.0), dgh(static_cast<std::size_t>(G * H), 0.0);
  Vec dh_prev(static_cast<std::size_t>(d.P), 0.0);
  auto at = [](auto& v, int64_t j) -> auto& { return v[static_cast<std::size_t>(j)]; };
  const double* dm = dh.data();
  Vec dm_proj;
  if (mode == RNNMode::lstm && !p.w_hr.empty()) {
    // h_t = W_hr m_t
    dm_proj.assign(static_cast<std::size_t>(H), 0.0);
    add_outer(g.w_hr, dh.data(), d.P, s.m.data(), H);
    add_matvec_t(p.w_hr, d.P, H, dh.data(), dm_proj.data());
    dm = dm_proj.data();
  }
  reference::cell_row_backward(mode, H, s.pre.data(), s.c.empty() ? nullptr : s.c.data(),
                               s.c_prev.empty() ? nullptr : s.c_prev.data(), s.h_prev.data(),
                               s.hn_lin.empty() ? nullptr : s.hn_lin.data(), s.h.data(), dm,
                               dc.empty() ? nullptr : dc.data(), dgi.data(), dgh.data(),
                               dh_prev.data());
  add_outer(g.w_ih, dgi.data(), G * H, s.x.data(), p.in);
  add_outer(g.w_hh, dgh.data(), G * H, s.h_prev.data(), d.P);
  if (!g.b_ih.empty()) {
    for (int64_t j = 0; j < G * H; ++j) {
      at(g.b_ih, j) += at(dgi, j);
      at(g.b_hh, j) += at(dgh, j);
    }
  }
  add_matvec_t(p.w_ih, G * H, p.in, dgi.data(), dx);
  add_matvec_t(p.w_hh, G * H, d.P, dgh.data(), dh_prev.data());
  dh = dh_prev;
}

// Reads row `row` of a [N, B, K] state tensor for sequence b (zeros when undefined).
Vec state_row(const Tensor& t, int64_t row, int64_t b, int64_t batch, int64_t k) {
  Vec v(static_cast<std::size_t>(k), 0.0);
  if (!t.defined()) return v;
  const int64_t base = (row * batch + b) * k;
  for (int64_t j = 0; j < k; ++j) v[static_cast<std::size_t>(j)] = t.item_as_double(base + j);
  return v;
}

void check_state(const Tensor& t, const char* name, const Shape& expected) {
  if (!t.defined()) return;
  if (t.shape() != expected) {
    throw std::invalid_argument(std::string("rnn_reference: ") + name + " has shape " +
                                shape_str(t.shape()) + ", expected " + shape_str(expected));
  }
  if (t.dtype() == DType::i64) {
    throw std::invalid_argument(std::string("rnn_reference: ") + name + " has dtype int64");
  }
}

// trace[b][l][dir][k] = cache of the k-th processed step (time order for the
// forward direction, reversed for the reverse one).
using Trace = std::vector<std::vector<std::vector<std::vector<StepCache>>>>;

struct RunResult {
  std::vector<std::vector<Vec>> outputs;  // [b][t] -> output_size values
  std::vector<Vec> h_n, c_n;              // [(l * D + dir) * B + b]
  double relu_margin = std::numeric_limits<double>::infinity();  // see RNNReferenceResult
};

RunResult run_forward(const RNNOptions& o, const std::vector<DirParams>& params,
                      const std::vector<Tensor>& sequences, const Tensor& h0, const Tensor& c0,
                      Trace* trace) {
  const Dims d = dims_of(o);
  const int64_t B = static_cast<int64_t>(sequences.size());
  for (int64_t b = 0; b < B; ++b) {
    const Tensor& s = sequences[static_cast<std::size_t>(b)];
    if (!s.defined() || s.dim() != 2 || s.size(1) != d.I) {
      throw std::invalid_argument(
          "rnn_reference: sequences[" + std::to_string(b) + "] has shape " +
          (s.defined() ? shape_str(s.shape()) : std::string("(undefined)")) +
          ", expected [length, input_size = " + std::to_string(d.I) + "]");
    }
    if (s.dtype() == DType::i64) {
      throw std::invalid_argument("rnn_reference: sequences[" + std::to_string(b) +
                                  "] has dtype int64");
    }
  }
  check_state(h0, "h0", {d.L * d.D, B, d.P});
  if (c0.defined() && o.mode != RNNMode::lstm) {
    throw std::invalid_argument(std::string("rnn_reference: c0 given to ") + mode_str(o.mode) +
                                ", which has no cell state");
  }
  check_state(c0, "c0", {d.L * d.D, B, d.H});

  RunResult res;
  res.outputs.resize(static_cast<std::size_t>(B));
  res.h_n.resize(static_cast<std::size_t>(d.L * d.D * B));
  res.c_n.resize(static_cast<std::size_t>(d.L * d.D * B));
  if (trace) {
    trace->assign(static_cast<std::size_t>(B), {});
  }
  for (int64_t b = 0; b < B; ++b) {
    const Tensor& seq = sequences[static_cast<std::size_t>(b)];
    const int64_t T = seq.size(0);
    // Layer input, one row per step.
    std::vector<Vec> layer_in(static_cast<std::size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      layer_in[static_cast<std::size_t>(t)].resize(static_cast<std::size_t>(d.I));
      for (int64_t j = 0; j < d.I; ++j) {
        layer_in[static_cast<std::size_t>(t)][static_cast<std::size_t>(j)] =
            seq.item_as_double(t * d.I + j);
      }
    }
    if (trace) (*trace)[static_cast<std::size_t>(b)].resize(static_cast<std::size_t>(d.L));
    for (int64_t l = 0; l < d.L; ++l) {
      std::vector<Vec> layer_out(static_cast<std::size_t>(T),
                                 Vec(static_cast<std::size_t>(d.P * d.D), 0.0));
      if (trace) {
        (*trace)[static_cast<std::size_t>(b)][static_cast<std::size_t>(l)].resize(
            static_cast<std::size_t>(d.D));
      }
      for (int64_t dir = 0; dir < d.D; ++dir) {
        const DirParams& p = params[static_cast<std::size_t>(l * d.D + dir)];
        const int64_t row = l * d.D + dir;
        Vec h = state_row(h0, row, b, B, d.P);
        Vec c = state_row(c0, row, b, B, d.H);
        // The reverse direction starts at this sequence's own last step, so
        // padding of other sequences never reaches it.
        for (int64_t k = 0; k < T; ++k) {
          const int64_t t = dir == 0 ? k : T - 1 - k;
          StepCache s;
          s.x = layer_in[static_cast<std::size_t>(t)];
          s.h_prev = h;
          s.c_prev = c;
          cell_step(o.mode, d, p, s);
          if (o.mode == RNNMode::rnn_relu) {
            for (double a : s.pre) res.relu_margin = std::min(res.relu_margin, std::fabs(a));
          }
          h = s.h;
          if (o.mode == RNNMode::lstm) c = s.c;
          for (int64_t j = 0; j < d.P; ++j) {
            layer_out[static_cast<std::size_t>(t)][static_cast<std::size_t>(dir * d.P + j)] =
                h[static_cast<std::size_t>(j)];
          }
          if (trace) {
            (*trace)[static_cast<std::size_t>(b)][static_cast<std::size_t>(l)]
                    [static_cast<std::size_t>(dir)]
                        .push_back(std::move(s));
          }
        }
        res.h_n[static_cast<std::size_t>(row * B + b)] = h;
        res.c_n[static_cast<std::size_t>(row * B + b)] = c;
      }
      // Dropout between layers is off in the reference (evaluation semantics).
      layer_in = std::move(layer_out);
    }
    res.outputs[static_cast<std::size_t>(b)] = std::move(layer_in);
  }
  return res;
}

Tensor to_tensor(const std::vector<Vec>& rows, int64_t cols, DType dtype) {
  Tensor t = Tensor::empty({static_cast<int64_t>(rows.size()), cols}, DType::f64);
  double* p = t.data<double>();
  for (std::size_t r = 0; r < rows.size(); ++r) {
    for (int64_t j = 0; j < cols; ++j)
      p[static_cast<int64_t>(r) * cols + j] = rows[r][static_cast<std::size_t>(j)];
  }
  return t.to(dtype);
}

Tensor state_tensor(const std::vector<Vec>& rows, int64_t n, int64_t batch, int64_t k,
                    DType dtype) {
  Tensor t = Tensor::empty({n, batch, k}, DType::f64);
  double* p = t.data<double>();
  for (int64_t r = 0; r < n * batch; ++r) {
    for (int64_t j = 0; j < k; ++j)
      p[r * k + j] = rows[static_cast<std::size_t>(r)][static_cast<std::size_t>(j)];
  }
  return t.to(dtype);
}

}  // namespace

namespace reference {

void cell_row_forward(RNNMode mode, int64_t H, const double* gi, const double* gh,
                      const double* h_prev, const double* c_prev, double* act, double* c,
                      double* h, double* hn_lin) {
  switch (mode) {
    case RNNMode::rnn_tanh:
    case RNNMode::rnn_relu: {
      // h_t = act(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh), act = tanh or relu
      for (int64_t j = 0; j < H; ++j) {
        const double a = gi[j] + gh[j];
        act[j] = a;
        h[j] = mode == RNNMode::rnn_tanh ? std::tanh(a) : (a > 0 ? a : 0.0);
      }
      break;
    }
    case RNNMode::lstm: {
      // i_t = sigmoid(W_ii x_t + b_ii + W_hi h_{t-1} + b_hi)
      // f_t = sigmoid(W_if x_t + b_if + W_hf h_{t-1} + b_hf)
      // g_t = tanh   (W_ig x_t + b_ig + W_hg h_{t-1} + b_hg)
      // o_t = sigmoid(W_io x_t + b_io + W_ho h_{t-1} + b_ho)
      // c_t = f_t * c_{t-1} + i_t * g_t
      // h_t = o_t * tanh(c_t)            (then h_t = W_hr h_t with proj_size)
      for (int64_t j = 0; j < H; ++j) {
        const double i = sigmoid(gi[j] + gh[j]);
        const double f = sigmoid(gi[H + j] + gh[H + j]);
        const double g = std::tanh(gi[2 * H + j] + gh[2 * H + j]);
        const double o = sigmoid(gi[3 * H + j] + gh[3 * H + j]);
        act[j] = i;
        act[H + j] = f;
        act[2 * H + j] = g;
        act[3 * H + j] = o;
        const double cj = f * c_prev[j] + i * g;
        c[j] = cj;
        h[j] = o * std::tanh(cj);
      }
      break;
    }
    case RNNMode::gru: {
      // r_t = sigmoid(W_ir x_t + b_ir + W_hr h_{t-1} + b_hr)
      // z_t = sigmoid(W_iz x_t + b_iz + W_hz h_{t-1} + b_hz)
      // n_t = tanh(W_in x_t + b_in + r_t * (W_hn h_{t-1} + b_hn))   (linear before reset)
      // h_t = (1 - z_t) * n_t + z_t * h_{t-1}
      for (int64_t j = 0; j < H; ++j) {
        const double r = sigmoid(gi[j] + gh[j]);
        const double z = sigmoid(gi[H + j] + gh[H + j]);
        const double hn = gh[2 * H + j];
        const double n = std::tanh(gi[2 * H + j] + r * hn);
        act[j] = r;
        act[H + j] = z;
        act[2 * H + j] = n;
        hn_lin[j] = hn;
        h[j] = (1 - z) * n + z * h_prev[j];
      }
      break;
    }
  }
}

void cell_row_backward(RNNMode mode, int64_t H, const double* act, const double* c,
                       const double* c_prev, const double* h_prev, const double* hn_lin,
                       const double* h, const double* dh, double* dc, double* dgi, double* dgh,
                       double* dh_prev) {
  switch (mode) {
    case RNNMode::rnn_tanh:
    case RNNMode::rnn_relu: {
      for (int64_t j = 0; j < H; ++j) {
        const double da = mode == RNNMode::rnn_tanh ? dh[j] * (1 - h[j] * h[j])
                                                    : (act[j] > 0 ? dh[j] : 0.0);
        dgi[j] = da;
        dgh[j] = da;
      }
      break;
    }
    case RNNMode::lstm: {
      for (int64_t j = 0; j < H; ++j) {
        const double i = act[j], f = act[H + j], gg = act[2 * H + j], o = act[3 * H + j];
        const double tc = std::tanh(c[j]);
        const double dct = dc[j] + dh[j] * o * (1 - tc * tc);
        const double di = dct * gg, df = dct * c_prev[j], dg = dct * i, d_o = dh[j] * tc;
        dc[j] = dct * f;
        dgi[j] = di * i * (1 - i);
        dgi[H + j] = df * f * (1 - f);
        dgi[2 * H + j] = dg * (1 - gg * gg);
        dgi[3 * H + j] = d_o * o * (1 - o);
      }
      for (int64_t j = 0; j < 4 * H; ++j) dgh[j] = dgi[j];
      break;
    }
    case RNNMode::gru: {
      for (int64_t j = 0; j < H; ++j) {
        const double r = act[j], z = act[H + j], n = act[2 * H + j];
        const double dn = dh[j] * (1 - z);
        const double dz = dh[j] * (h_prev[j] - n);
        dh_prev[j] += dh[j] * z;
        const double dan = dn * (1 - n * n);
        const double dr = dan * hn_lin[j];
        const double dar = dr * r * (1 - r), daz = dz * z * (1 - z);
        dgi[j] = dar;
        dgh[j] = dar;
        dgi[H + j] = daz;
        dgh[H + j] = daz;
        dgi[2 * H + j] = dan;
        dgh[2 * H + j] = dan * r;
      }
      break;
    }
  }
}

std::vector<std::string> rnn_parameter_names(const RNNOptions& o) {
  check_options(o);
  std::vector<std::string> names;
  for (int64_t l = 0; l < o.num_layers; ++l) {
    for (int64_t dir = 0; dir < (o.bidirectional ? 2 : 1); ++dir) {
      const std::string suffix = "_l" + std::to_string(l) + (dir == 1 ? "_reverse" : "");
      names.push_back("weight_ih" + suffix);
      names.push_back("weight_hh" + suffix);
      if (o.bias) {
        names.push_back("bias_ih" + suffix);
        names.push_back("bias_hh" + suffix);
      }
      if (o.proj_size > 0) names.push_back("weight_hr" + suffix);
    }
  }
  return names;
}

std::vector<Shape> rnn_parameter_shapes(const RNNOptions& o) {
  check_options(o);
  const Dims d = dims_of(o);
  std::vector<Shape> shapes;
  for (int64_t l = 0; l < d.L; ++l) {
    const int64_t in = l == 0 ? d.I : d.P * d.D;
    for (int64_t dir = 0; dir < d.D; ++dir) {
      shapes.push_back({d.G * d.H, in});
      shapes.push_back({d.G * d.H, d.P});
      if (o.bias) {
        shapes.push_back({d.G * d.H});
        shapes.push_back({d.G * d.H});
      }
      if (o.proj_size > 0) shapes.push_back({d.P, d.H});
    }
  }
  return shapes;
}

RNNReferenceGradients rnn_reference_backward(const RNNOptions& options,
                                             const std::vector<Tensor>& weights,
                                             const std::vector<Tensor>& sequences, const Tensor& h0,
                                             const Tensor& c0,
                                             const std::vector<Tensor>& grad_outputs,
                                             const Tensor& grad_h_n, const Tensor& grad_c_n) {
  check_options(options);
  const std::vector<DirParams> params = load_params(options, weights);
  const Dims d = dims_of(options);
  const int64_t B = static_cast<int64_t>(sequences.size());
  Trace trace;
  run_forward(options, params, sequences, h0, c0, &trace);
  if (!grad_outputs.empty() && static_cast<int64_t>(grad_outputs.size()) != B) {
    throw std::invalid_argument("rnn_reference_backward: " + std::to_string(grad_outputs.size()) +
                                " output gradients for " + std::to_string(B) + " sequences");
  }
  for (int64_t b = 0; b < static_cast<int64_t>(grad_outputs.size()); ++b) {
    const Tensor& g = grad_outputs[static_cast<std::size_t>(b)];
    const Shape expected{sequences[static_cast<std::size_t>(b)].size(0), d.P * d.D};
    if (g.defined() && g.shape() != expected) {
      throw std::invalid_argument("rnn_reference_backward: grad_outputs[" + std::to_string(b) +
                                  "] has shape " + shape_str(g.shape()) + ", expected " +
                                  shape_str(expected));
    }
  }
  check_state(grad_h_n, "grad_h_n", {d.L * d.D, B, d.P});
  check_state(grad_c_n, "grad_c_n", {d.L * d.D, B, d.H});

  // Gradient accumulators shaped like the parameters.
  std::vector<DirParams> grads = params;
  for (DirParams& g : grads) {
    for (Vec* v : {&g.w_ih, &g.w_hh, &g.b_ih, &g.b_hh, &g.w_hr}) v->assign(v->size(), 0.0);
  }
  std::vector<Vec> dh0(static_cast<std::size_t>(d.L * d.D * B)),
      dc0(static_cast<std::size_t>(d.L * d.D * B));
  RNNReferenceGradients out;

  for (int64_t b = 0; b < B; ++b) {
    const int64_t T = sequences[static_cast<std::size_t>(b)].size(0);
    // Gradient reaching the current layer's output rows.
    std::vector<Vec> dout(static_cast<std::size_t>(T),
                          Vec(static_cast<std::size_t>(d.P * d.D), 0.0));
    if (!grad_outputs.empty() && grad_outputs[static_cast<std::size_t>(b)].defined()) {
      const Tensor& g = grad_outputs[static_cast<std::size_t>(b)];
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t j = 0; j < d.P * d.D; ++j) {
          dout[static_cast<std::size_t>(t)][static_cast<std::size_t>(j)] =
              g.item_as_double(t * d.P * d.D + j);
        }
      }
    }
    for (int64_t l = d.L - 1; l >= 0; --l) {
      const int64_t in = l == 0 ? d.I : d.P * d.D;
      std::vector<Vec> din(static_cast<std::size_t>(T), Vec(static_cast<std::size_t>(in), 0.0));
      for (int64_t dir = 0; dir < d.D; ++dir) {
        const int64_t row = l * d.D + dir;
        const DirParams& p = params[static_cast<std::size_t>(row)];
        Vec dh = state_row(grad_h_n, row, b, B, d.P);
        Vec dc = state_row(grad_c_n, row, b, B, d.H);
        const auto& steps = trace[static_cast<std::size_t>(b)][static_cast<std::size_t>(l)]
                                 [static_cast<std::size_t>(dir)];
        for (int64_t k = T - 1; k >= 0; --k) {
          const int64_t t = dir == 0 ? k : T - 1 - k;
          for (int64_t j = 0; j < d.P; ++j) {
            dh[static_cast<std::size_t>(j)] +=
                dout[static_cast<std::size_t>(t)][static_cast<std::size_t>(dir * d.P + j)];
          }
          cell_step_backward(options.mode, d, p, steps[static_cast<std::size_t>(k)], dh, dc,
                             din[static_cast<std::size_t>(t)].data(),
                             grads[static_cast<std::size_t>(row)]);
        }
        dh0[static_cast<std::size_t>(row * B + b)] = dh;
        dc0[static_cast<std::size_t>(row * B + b)] = dc;
      }
      dout = std::move(din);
    }
    out.inputs.push_back(to_tensor(dout, d.I, DType::f64));
  }
  out.h0 = state_tensor(dh0, d.L * d.D, B, d.P, DType::f64);
  if (options.mode == RNNMode::lstm) out.c0 = state_tensor(dc0, d.L * d.D, B, d.H, DType::f64);
  const std::vector<Shape> shapes = reference::rnn_parameter_shapes(options);
  out.weights.resize(weights.size());
  for (const DirParams& g : grads) {
    const DirParams& idx = params[static_cast<std::size_t>(&g - grads.data())];
    auto put = [&](int64_t i, const Vec& v) {
      if (i >= 0) {
        out.weights[static_cast<std::size_t>(i)] =
            Tensor::from_vector<double>(v, shapes[static_cast<std::size_t>(i)]);
      }
    };
    put(idx.i_w_ih, g.w_ih);
    put(idx.i_w_hh, g.w_hh);
    put(idx.i_b_ih, g.b_ih);
    put(idx.i_b_hh, g.b_hh);
    put(idx.i_w_hr, g.w_hr);
  }
  return out;
}

}  // namespace reference

RNNReferenceResult rnn_reference_forward(const RNNOptions& options,
                                         const std::vector<Tensor>& weights,
                                         const std::vector<Tensor>& sequences, const Tensor& h0,
                                         const Tensor& c0) {
  check_options(options);
  const std::vector<DirParams> params = load_params(options, weights);
  const Dims d = dims_of(options);
  const int64_t B = static_cast<int64_t>(sequences.size());
  RunResult r = run_forward(options, params, sequences, h0, c0, nullptr);
  // Results come back in options.dtype, as the fast path returns them; the
  // arithmetic above was all double.
  RNNReferenceResult out;
  for (const auto& rows : r.outputs)
    out.outputs.push_back(to_tensor(rows, d.P * d.D, options.dtype));
  out.h_n = state_tensor(r.h_n, d.L * d.D, B, d.P, options.dtype);
  if (options.mode == RNNMode::lstm)
    out.c_n = state_tensor(r.c_n, d.L * d.D, B, d.H, options.dtype);
  out.relu_margin = r.relu_margin;
  return out;
}

}  // namespace seqpack
