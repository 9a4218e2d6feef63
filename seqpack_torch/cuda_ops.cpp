// seqpack::rnn and rnn_padded on CUDA tensors over libseqpack_cuda (cuda_ops.h).
//
// GCC 14 sees an out-of-bounds memmove (-Warray-bounds, -Wstringop-overflow)
// in the std::vector<bool> that torch::autograd::Function::apply reserves (a
// false positive in that header, inlined into the backward below); the
// warning's location is the header's, after these lines.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 14
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif

#include "cuda_ops.h"

#include <torch/autograd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "cuda_choice.h"
#include "cuda_library.h"
#include "schemas.h"
#include "seqpack/cuda.h"
#include "torch_rnn.h"

namespace seqpack::torch_cuda {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- sizes and checks ------------------------------------------------------

struct Sizes {
  int mode = 0, dtype = 0;
  int64_t gates = 0, rows = 0, input = 0, batch = 0, hidden = 0, proj = 0, layers = 0, dirs = 1,
          hout = 0, width = 0, per = 0;
  bool biases = false, lstm = false, gru = false;
};

int mode_of(c10::string_view mode) {
  if (mode == "LSTM") return SEQPACK_CUDA_LSTM;
  if (mode == "GRU") return SEQPACK_CUDA_GRU;
  if (mode == "RNN_TANH") return SEQPACK_CUDA_RNN_TANH;
  if (mode == "RNN_RELU") return SEQPACK_CUDA_RNN_RELU;
  C10_THROW_ERROR(ValueError, c10::str("seqpack::rnn: mode = '", mode,
                                       "' is not one of 'LSTM', 'GRU', 'RNN_TANH', 'RNN_RELU'"));
}

int dtype_of(const Tensor& data) {
  switch (data.scalar_type()) {
    case at::kFloat:
      return SEQPACK_CUDA_FLOAT32;
    case at::kHalf:
      return SEQPACK_CUDA_FLOAT16;
    case at::kBFloat16:
      return SEQPACK_CUDA_BFLOAT16;
    default:
      C10_THROW_ERROR(TypeError, c10::str("seqpack::rnn on ", data.device(), ": data has dtype ",
                                          data.scalar_type(),
                                          "; float32, float16 or bfloat16 expected"));
  }
}

// The checks torch makes of the same call (the library checks batch_sizes and
// the buffers itself), with the offending value in each message.
Sizes checked_sizes(const Tensor& data, const Tensor& batch_sizes, const Tensor& h0,
                    const Tensor& c0, at::TensorList weights, c10::string_view mode,
                    int64_t hidden_size, int64_t num_layers, bool bias, bool bidirectional,
                    int64_t proj_size) {
  Sizes s;
  s.mode = mode_of(mode);
  s.dtype = dtype_of(data);
  s.lstm = s.mode == SEQPACK_CUDA_LSTM;
  s.gru = s.mode == SEQPACK_CUDA_GRU;
  s.gates = s.lstm ? 4 : s.gru ? 3 : 1;
  TORCH_CHECK(data.dim() == 2, "seqpack::rnn: data has shape ", data.sizes(),
              "; (rows, input_size) expected");
  TORCH_CHECK(batch_sizes.device().is_cpu() && batch_sizes.dim() == 1 &&
                  batch_sizes.scalar_type() == at::kLong,
              "seqpack::rnn: batch_sizes must be a 1-D int64 CPU tensor, got ",
              batch_sizes.scalar_type(), " of shape ", batch_sizes.sizes(), " on ",
              batch_sizes.device());
  TORCH_CHECK_VALUE(num_layers >= 1, "seqpack::rnn: num_layers = ", num_layers,
                    " must be positive");
  TORCH_CHECK_VALUE(hidden_size >= 1, "seqpack::rnn: hidden_size = ", hidden_size,
                    " must be positive");
  TORCH_CHECK_VALUE(proj_size >= 0 && (proj_size == 0 || s.lstm), "seqpack::rnn: proj_size = ",
                    proj_size, " (only LSTM takes a positive proj_size)");
  TORCH_CHECK_VALUE(proj_size < hidden_size || proj_size == 0, "seqpack::rnn: proj_size = ",
                    proj_size, " must be smaller than hidden_size = ", hidden_size);
  s.rows = data.size(0);
  s.input = data.size(1);
  s.hidden = hidden_size;
  s.proj = proj_size;
  s.layers = num_layers;
  s.dirs = bidirectional ? 2 : 1;
  s.hout = proj_size > 0 ? proj_size : hidden_size;
  s.width = s.dirs * s.hout;
  s.biases = bias;
  s.per = 2 + (bias ? 2 : 0) + (proj_size > 0 ? 1 : 0);
  const int64_t expected = num_layers * s.dirs * s.per;
  TORCH_CHECK_VALUE(static_cast<int64_t>(weights.size()) == expected, "seqpack::rnn: ",
                    weights.size(), " weights given, ", expected, " expected for num_layers=",
                    num_layers, ", bidirectional=", bidirectional, ", bias=", bias,
                    ", proj_size=", proj_size);
  const int64_t g = s.gates * hidden_size;
  int64_t i = 0;
  // weights[i] is a rows x cols matrix (cols < 0: a vector of rows).
  auto check_weight = [&](int64_t rows, int64_t cols) {
    const Tensor& w = weights[i];
    TORCH_CHECK(w.device() == data.device(), "seqpack::rnn: weights[", i, "] is on ", w.device(),
                ", data on ", data.device());
    TORCH_CHECK_TYPE(w.scalar_type() == data.scalar_type(), "seqpack::rnn: weights[", i,
                     "] has dtype ", w.scalar_type(), ", data ", data.scalar_type());
    const std::array<int64_t, 2> shape{rows, cols};
    const at::IntArrayRef expected(shape.data(), cols < 0 ? 1 : 2);
    TORCH_CHECK(w.sizes() == expected, "seqpack::rnn: weights[", i, "] has shape ", w.sizes(),
                ", expected ", expected,
                i == 0 ? " (input.size(-1) must be equal to input_size)" : "");
    ++i;
  };
  for (int64_t l = 0; l < num_layers; ++l) {
    for (int64_t d = 0; d < s.dirs; ++d) {
      check_weight(g, l == 0 ? s.input : s.width);
      check_weight(g, s.hout);
      if (bias) {
        check_weight(g, -1);
        check_weight(g, -1);
      }
      if (proj_size > 0) check_weight(proj_size, hidden_size);
    }
  }
  auto check_state = [&](const char* name, const Tensor& t, int64_t width) {
    TORCH_CHECK(t.device() == data.device(), "seqpack::rnn: ", name, " is on ", t.device(),
                ", data on ", data.device());
    TORCH_CHECK_TYPE(t.scalar_type() == data.scalar_type(), "seqpack::rnn: ", name,
                     " has dtype ", t.scalar_type(), ", data ", data.scalar_type());
    TORCH_CHECK(t.dim() == 3 && t.size(0) == num_layers * s.dirs && t.size(2) == width,
                "seqpack::rnn: Expected hidden size (", num_layers * s.dirs, ", batch, ", width,
                ") for ", name, ", got ", t.sizes());
  };
  check_state("h0", h0, s.hout);
  s.batch = h0.size(1);
  if (s.lstm) {
    check_state("c0", c0, hidden_size);
    TORCH_CHECK(c0.size(1) == s.batch, "seqpack::rnn: c0 has batch ", c0.size(1), ", h0 ",
                s.batch);
  }
  return s;
}

// ---- the passes ------------------------------------------------------------

constexpr int64_t kSavedAlign = 256;  // each piece of the saved buffer starts at a multiple

int64_t aligned(int64_t n) { return (n + kSavedAlign - 1) / kSavedAlign * kSavedAlign; }

const void* ptr(const Tensor& t) { return t.defined() && t.numel() > 0 ? t.data_ptr() : nullptr; }
void* mutable_ptr(const Tensor& t) {
  return t.defined() && t.numel() > 0 ? t.data_ptr() : nullptr;
}

// Layer l's slice of a contiguous (layers * dirs, batch, width) state.
template <typename P>
P layer_slice(const Tensor& t, int64_t l, int64_t dirs) {
  if (!t.defined() || t.numel() == 0) return nullptr;
  auto* base = static_cast<char*>(t.data_ptr());
  return reinterpret_cast<P>(base + l * dirs * t.size(1) * t.size(2) * t.element_size());
}

struct Buffers {
  size_t workspace = 0;  // bytes, the largest of the layers'
  int64_t layer_reserve = 0;
  std::vector<int64_t> reserve_at, output_at;
  int64_t saved = 0;  // bytes of the saved buffer
};

Buffers buffers(const Library& lib, const Sizes& s) {
  Buffers b;
  size_t reserve = 0;
  for (int64_t input : {s.input, s.width}) {
    size_t ws = 0;
    check(lib, lib.buffer_sizes(s.mode, s.dtype, s.rows, s.batch, input, s.hidden, s.proj, 1,
                                s.dirs == 2, &ws, &reserve));
    b.workspace = std::max(b.workspace, ws);
    if (s.layers == 1) break;
  }
  b.layer_reserve = static_cast<int64_t>(reserve);
  const int64_t element = c10::elementSize(s.dtype == SEQPACK_CUDA_FLOAT32 ? at::kFloat : at::kHalf);
  const int64_t reserve_step = aligned(b.layer_reserve), output = aligned(s.rows * s.width * element);
  for (int64_t l = 0; l < s.layers; ++l) b.reserve_at.push_back(l * reserve_step);
  for (int64_t l = 0; l + 1 < s.layers; ++l)
    b.output_at.push_back(s.layers * reserve_step + l * output);
  b.saved = s.layers * reserve_step + (s.layers - 1) * output;
  return b;
}

// The fields every call of a pass shares: with torch's products one call per
// layer (caller_products = 1, which sets each layer's input size), else one
// for the whole stack.
seqpack_cuda_rnn_args call_args(const Sizes& s, const Tensor& batch_sizes, bool allow_tf32,
                                void* stream, bool torch_products) {
  seqpack_cuda_rnn_args a{};
  a.mode = s.mode;
  a.dtype = s.dtype;
  a.bidirectional = s.dirs == 2;
  a.has_biases = s.biases;
  a.allow_tf32 = allow_tf32;
  a.caller_products = torch_products;
  a.rows = s.rows;
  a.steps = batch_sizes.numel();
  a.batch_sizes = batch_sizes.data_ptr<int64_t>();
  a.batch = s.batch;
  a.input_size = s.input;
  a.hidden_size = s.hidden;
  a.proj_size = s.proj;
  a.num_layers = torch_products ? 1 : s.layers;
  a.stream = stream;
  return a;
}

// SEQPACK_CUDA_PRODUCTS, read at every call: whether torch runs the products
// that are not recurrent ("torch", unset or empty: the default) or the library
// runs them all ("library": its own GEMM, one call for the whole stack).
bool torch_products() {
  const char* set = std::getenv("SEQPACK_CUDA_PRODUCTS");
  const std::string value = set && *set ? set : "torch";
  TORCH_CHECK_VALUE(value == "torch" || value == "library", "seqpack CUDA: SEQPACK_CUDA_PRODUCTS = '",
                    value, "' is not 'torch' or 'library'");
  return value == "torch";
}

std::vector<const void*> pointers(at::TensorList weights) {
  std::vector<const void*> out;
  out.reserve(weights.size());
  for (const Tensor& w : weights) out.push_back(w.data_ptr());
  return out;
}

Tensor bytes(int64_t n, const Tensor& like) {
  return at::empty({n}, like.options().dtype(at::kByte));
}

// The saved buffer's `bytes` at `at` as a (rows, width) tensor of `like`'s dtype.
Tensor piece(const Tensor& saved, int64_t at, const Sizes& s, const Tensor& like) {
  return saved.narrow(0, at, s.rows * s.width * like.element_size())
      .view(like.scalar_type())
      .view({s.rows, s.width});
}

Tensor layer_input(const Tensor& data, const std::vector<Tensor>& outputs, const Tensor& mask,
                   int64_t l) {
  if (l == 0) return data;
  return mask.defined() ? outputs[l - 1] * mask[l - 1] : outputs[l - 1];
}

struct Forward {
  Tensor y, hn, cn, saved;  // saved: empty without keep
};

// The forward, a library call per layer after torch's input projection. With
// `keep`, the saved buffer holds what the backward reads; without, one
// allocation holds the workspace and one layer's reserve that every layer uses.
Forward forward_layers(const Backend& backend, const Sizes& s, const Tensor& data,
                       const Tensor& batch_sizes, const Tensor& h0, const Tensor& c0,
                       at::TensorList weights, const Tensor& mask, bool allow_tf32, bool keep) {
  const Library& lib = library();
  Buffers b = buffers(lib, s);
  Forward f;
  f.y = at::empty({s.rows, s.width}, data.options());
  f.hn = at::empty_like(h0);
  if (s.lstm) f.cn = at::empty_like(c0);
  std::vector<Tensor> outputs;
  Tensor workspace;
  void* ws = nullptr;
  if (keep) {
    workspace = bytes(static_cast<int64_t>(b.workspace), data);
    ws = mutable_ptr(workspace);
    f.saved = bytes(b.saved, data);
    for (int64_t at : b.output_at) outputs.push_back(piece(f.saved, at, s, data));
  } else {
    const int64_t at = aligned(static_cast<int64_t>(b.workspace));
    f.saved = bytes(at + b.layer_reserve, data);
    ws = b.workspace ? f.saved.data_ptr() : nullptr;
    b.reserve_at.assign(static_cast<size_t>(s.layers), at);
    for (int64_t l = 0; l + 1 < s.layers; ++l)
      outputs.push_back(at::empty({s.rows, s.width}, data.options()));
  }
  seqpack_cuda_rnn_args a =
      call_args(s, batch_sizes, allow_tf32, backend.stream(data.device()), /*torch_products=*/true);
  a.workspace = ws;
  a.workspace_bytes = b.workspace;
  a.reserve_bytes = static_cast<size_t>(b.layer_reserve);
  const std::vector<const void*> w = pointers(weights);
  auto* base = static_cast<char*>(f.saved.data_ptr());
  std::array<Tensor, 2> gates;
  for (int64_t l = 0; l < s.layers; ++l) {
    const Tensor x = layer_input(data, outputs, mask, l);
    const int64_t first = l * s.dirs * s.per;
    for (int64_t d = 0; d < s.dirs; ++d) {
      const int64_t at = first + d * s.per;
      gates[d] = at::linear(x, weights[at], s.biases ? OptTensor(weights[at + 2]) : OptTensor());
      a.input_gates[d] = gates[d].data_ptr();
    }
    a.weights = w.data() + first;
    a.input_size = x.size(1);
    a.h0 = layer_slice<const void*>(h0, l, s.dirs);
    a.c0 = layer_slice<const void*>(c0, l, s.dirs);
    a.hn = layer_slice<void*>(f.hn, l, s.dirs);
    a.cn = layer_slice<void*>(f.cn, l, s.dirs);
    a.reserve = b.layer_reserve ? base + b.reserve_at[l] : nullptr;
    a.y = mutable_ptr(l + 1 == s.layers ? f.y : outputs[l]);
    check(lib, lib.forward(&a));
  }
  if (!keep) f.saved = f.saved.narrow(0, 0, 0);
  return f;
}

// One call for the whole stack, every product in the library: its buffers'
// sizes, its workspace and the inputs both passes share (the pass sets its
// reserve and outputs).
struct LibraryCall {
  size_t workspace_bytes = 0, reserve_bytes = 0;
  Tensor workspace;
  std::vector<const void*> weights;
  seqpack_cuda_rnn_args a{};
};

void library_call(LibraryCall& c, const Library& lib, const Backend& backend, const Sizes& s,
                  const Tensor& data, const Tensor& batch_sizes, const Tensor& h0,
                  const Tensor& c0, at::TensorList weights, const Tensor& mask, bool allow_tf32) {
  check(lib, lib.buffer_sizes(s.mode, s.dtype, s.rows, s.batch, s.input, s.hidden, s.proj,
                              s.layers, s.dirs == 2, &c.workspace_bytes, &c.reserve_bytes));
  c.workspace = bytes(static_cast<int64_t>(c.workspace_bytes), data);
  c.weights = pointers(weights);
  c.a = call_args(s, batch_sizes, allow_tf32, backend.stream(data.device()),
                  /*torch_products=*/false);
  c.a.weights = c.weights.data();
  c.a.x = ptr(data);
  c.a.h0 = ptr(h0);
  c.a.c0 = ptr(c0);
  c.a.dropout_mask = ptr(mask);
  c.a.workspace = mutable_ptr(c.workspace);
  c.a.workspace_bytes = c.workspace_bytes;
  c.a.reserve_bytes = c.reserve_bytes;
}

// The forward with every product in the library: one call for the whole
// stack, whose reserve is the saved buffer (empty without `keep`).
Forward forward_library(const Backend& backend, const Sizes& s, const Tensor& data,
                        const Tensor& batch_sizes, const Tensor& h0, const Tensor& c0,
                        at::TensorList weights, const Tensor& mask, bool allow_tf32, bool keep) {
  const Library& lib = library();
  LibraryCall c;
  library_call(c, lib, backend, s, data, batch_sizes, h0, c0, weights, mask, allow_tf32);
  Forward f;
  f.y = at::empty({s.rows, s.width}, data.options());
  f.hn = at::empty_like(h0);
  if (s.lstm) f.cn = at::empty_like(c0);
  f.saved = bytes(static_cast<int64_t>(c.reserve_bytes), data);
  c.a.reserve = mutable_ptr(f.saved);
  c.a.y = mutable_ptr(f.y);
  c.a.hn = mutable_ptr(f.hn);
  c.a.cn = mutable_ptr(f.cn);
  check(lib, lib.forward(&c.a));
  if (!keep) f.saved = f.saved.narrow(0, 0, 0);
  return f;
}

struct Gradients {
  Tensor dx, dh0, dc0;
  std::vector<Tensor> dweights;
};

Tensor as(const Tensor& t, const Tensor& like) {
  return t.defined() ? t.to(like.scalar_type()).contiguous() : t;
}

// The backward of forward_layers (keep = true): per layer from the top, the
// library's recurrence (the gates' gradients, h_{t-1} of each row), then the
// weight gradients, the bias sums and dX as torch products.
Gradients backward_layers(const Backend& backend, const Sizes& s, const Tensor& data,
                          const Tensor& batch_sizes, const Tensor& h0, const Tensor& c0,
                          at::TensorList weights, const Tensor& mask, const Tensor& saved,
                          const Tensor& dy, const Tensor& dhn, const Tensor& dcn,
                          bool allow_tf32) {
  const Library& lib = library();
  const Buffers b = buffers(lib, s);
  const at::ScalarType dtype = data.scalar_type();
  const int64_t G = s.gates * s.hidden;
  Tensor dY = as(dy, data);
  const Tensor dHn = as(dhn, data), dCn = s.lstm ? as(dcn, data) : Tensor();
  Gradients g;
  g.dh0 = at::empty_like(h0);
  if (s.lstm) g.dc0 = at::empty_like(c0);
  g.dweights.resize(weights.size());
  std::vector<Tensor> outputs;
  for (int64_t at : b.output_at) outputs.push_back(piece(saved, at, s, data));
  const Tensor workspace = bytes(static_cast<int64_t>(b.workspace), data);
  seqpack_cuda_rnn_args a =
      call_args(s, batch_sizes, allow_tf32, backend.stream(data.device()), /*torch_products=*/true);
  a.workspace = mutable_ptr(workspace);
  a.workspace_bytes = b.workspace;
  a.reserve_bytes = static_cast<size_t>(b.layer_reserve);
  // What the library writes for the products, per direction: the same buffers
  // for every layer (each layer's products read them before the next layer's
  // call, in stream order).
  const auto f32 = data.options().dtype(at::kFloat);
  std::array<Tensor, 2> dgx, dgh, hprev, dh, m;
  for (int64_t d = 0; d < s.dirs; ++d) {
    dgx[d] = at::empty({s.rows, G}, f32);
    dgh[d] = s.gru ? at::empty({s.rows, G}, f32) : dgx[d];
    hprev[d] = at::empty({s.rows, s.hout}, f32);
    a.dgates_x[d] = dgx[d].data_ptr<float>();
    a.hprev[d] = hprev[d].data_ptr<float>();
    if (s.gru) a.dgates_h[d] = dgh[d].data_ptr<float>();
    if (s.proj) {
      dh[d] = at::empty({s.rows, s.hout}, f32);
      m[d] = at::empty({s.rows, s.hidden}, f32);
      a.dh[d] = dh[d].data_ptr<float>();
      a.m[d] = m[d].data_ptr<float>();
    }
  }
  const std::vector<const void*> w = pointers(weights);
  auto* base = static_cast<char*>(saved.data_ptr());
  for (int64_t l = s.layers - 1; l >= 0; --l) {
    const Tensor x = layer_input(data, outputs, mask, l);
    const int64_t first = l * s.dirs * s.per;
    a.weights = w.data() + first;
    a.input_size = x.size(1);
    a.reserve = b.layer_reserve ? base + b.reserve_at[l] : nullptr;
    a.dy = ptr(dY);
    a.dhn = layer_slice<const void*>(dHn, l, s.dirs);
    a.dcn = layer_slice<const void*>(dCn, l, s.dirs);
    a.dh0 = layer_slice<void*>(g.dh0, l, s.dirs);
    a.dc0 = layer_slice<void*>(g.dc0, l, s.dirs);
    check(lib, lib.backward(&a));
    Tensor dX;
    for (int64_t d = 0; d < s.dirs; ++d) {
      const int64_t at = first + d * s.per;
      const Tensor gx = dgx[d].to(dtype), gh = dgh[d].to(dtype);
      g.dweights[at] = at::mm(gx.t(), x);
      g.dweights[at + 1] = at::mm(gh.t(), hprev[d].to(dtype));
      if (s.biases) {
        g.dweights[at + 2] = dgx[d].sum(0).to(dtype);
        g.dweights[at + 3] = dgh[d].sum(0).to(dtype);
      }
      if (s.proj) g.dweights[at + s.per - 1] = at::mm(dh[d].to(dtype).t(), m[d].to(dtype));
      dX = dX.defined() ? dX.addmm_(gx, weights[at]) : at::mm(gx, weights[at]);
    }
    if (l > 0) {
      dY = mask.defined() ? dX * mask[l - 1] : dX;
    } else {
      g.dx = dX;
    }
  }
  return g;
}

// The backward of forward_library (keep = true): one call.
Gradients backward_library(const Backend& backend, const Sizes& s, const Tensor& data,
                           const Tensor& batch_sizes, const Tensor& h0, const Tensor& c0,
                           at::TensorList weights, const Tensor& mask, const Tensor& saved,
                           const Tensor& dy, const Tensor& dhn, const Tensor& dcn,
                           bool allow_tf32) {
  const Library& lib = library();
  LibraryCall c;
  library_call(c, lib, backend, s, data, batch_sizes, h0, c0, weights, mask, allow_tf32);
  const Tensor dY = as(dy, data), dHn = as(dhn, data), dCn = s.lstm ? as(dcn, data) : Tensor();
  Gradients g;
  g.dx = at::empty_like(data);
  g.dh0 = at::empty_like(h0);
  if (s.lstm) g.dc0 = at::empty_like(c0);
  std::vector<void*> dw;
  for (const Tensor& w : weights) {
    g.dweights.push_back(at::empty_like(w));
    dw.push_back(g.dweights.back().data_ptr());
  }
  c.a.dweights = dw.data();
  c.a.reserve = mutable_ptr(saved);
  c.a.dy = ptr(dY);
  c.a.dhn = ptr(dHn);
  c.a.dcn = ptr(dCn);
  c.a.dx = mutable_ptr(g.dx);
  c.a.dh0 = mutable_ptr(g.dh0);
  c.a.dc0 = mutable_ptr(g.dc0);
  check(lib, lib.backward(&c.a));
  return g;
}

// ---- one call ----------------------------------------------------------------

// Everything of a call that is not differentiated, as the kernels below
// autograd find it.
struct Call {
  Sizes sizes;
  Tensor batch_sizes, mask, sorted, unsorted;  // sorted, unsorted: undefined where none
  bool allow_tf32 = false;
  bool torch_products = true;  // else every product in the library
};

Tensor index_or_none(const OptTensor& t) {
  return t.has_value() && t->defined() && t->numel() > 0 ? *t : Tensor();
}

bool given(const OptTensor& t) { return t.has_value() && t->defined(); }

// The values no kernel runs with, whoever would run the call.
void check_values(const Tensor& data, double dropout, c10::string_view precision) {
  TORCH_CHECK_VALUE(precision == "fp32" || precision == "auto", "seqpack::rnn on ", data.device(),
                    ": precision = '", precision,
                    "' is not one of ['fp32', 'auto']; seqpack's CUDA kernels compute in the "
                    "data's dtype (",
                    data.scalar_type(), "): pass bfloat16 or float16 tensors for those");
  TORCH_CHECK_VALUE(dropout >= 0.0 && dropout <= 1.0, "seqpack::rnn: dropout = ", dropout,
                    " must be in [0, 1]");
}

// The batch of a packed call: the indices' size, else the first batch size.
int64_t batch_of(const Tensor& batch_sizes, const Tensor& sorted) {
  if (sorted.defined()) return sorted.numel();
  if (batch_sizes.numel() == 0) return 0;
  TORCH_CHECK(batch_sizes.device().is_cpu() && batch_sizes.scalar_type() == at::kLong,
              "seqpack::rnn: batch_sizes must be a 1-D int64 CPU tensor, got ",
              batch_sizes.scalar_type(), " on ", batch_sizes.device());
  return batch_sizes.data_ptr<int64_t>()[0];
}

// A state as given (in the caller's order), or zeros where none is.
Tensor state_or_zeros(const OptTensor& t, int64_t states, int64_t batch, int64_t width,
                      const Tensor& like) {
  return given(t) ? *t : at::zeros({states, batch, width}, like.options());
}

// The mask between layers: (num_layers - 1, rows, width), 0 or 1/(1-p), drawn
// with torch's generator of the data's device (a copy seeded by `seed`).
Tensor dropout_mask(const Tensor& data, int64_t layers, int64_t width, double p,
                    c10::optional<int64_t> seed) {
  const std::vector<int64_t> shape = {layers - 1, data.size(0), width};
  if (p >= 1.0) return at::zeros(shape, data.options());
  c10::optional<at::Generator> gen;
  if (seed.has_value()) {
    at::Generator g = at::globalContext().defaultGenerator(data.device()).clone();
    g.set_current_seed(static_cast<uint64_t>(*seed));
    gen = g;
  }
  Tensor keep = at::empty(shape, data.options().dtype(at::kFloat)).bernoulli_(1.0 - p, gen);
  return (keep / (1.0 - p)).to(data.scalar_type());
}

// What the library runs a call with: the checked sizes, the states in its
// (sorted) order and everything contiguous.
struct Prepared {
  Call call;
  Tensor x, h0, c0;
  std::vector<Tensor> w;
};

Prepared prepare(SEQPACK_RNN_PARAMS) {
  check_values(data, dropout, precision);
  Prepared p;
  Call& call = p.call;
  call.sorted = index_or_none(sorted_indices);
  call.unsorted = index_or_none(unsorted_indices);
  const int64_t batch = batch_of(batch_sizes, call.sorted);
  const int64_t states = num_layers * (bidirectional ? 2 : 1);
  auto sorted_state = [&](const OptTensor& t, int64_t width) {
    const Tensor s = state_or_zeros(t, states, batch, width, data);
    return given(t) && call.sorted.defined() ? s.index_select(1, call.sorted.to(s.device())) : s;
  };
  p.h0 = sorted_state(h0, proj_size > 0 ? proj_size : hidden_size);
  if (mode == "LSTM") p.c0 = sorted_state(c0, hidden_size);
  call.sizes = checked_sizes(data, batch_sizes, p.h0, p.c0, weights, mode, hidden_size,
                             num_layers, bias, bidirectional, proj_size);
  call.batch_sizes = batch_sizes.contiguous();
  // torch's setting for float32 products (the emulation's CPU tensors follow it too).
  call.allow_tf32 = at::globalContext().allowTF32CuBLAS();
  call.torch_products = torch_products();
  if (train && dropout > 0 && num_layers > 1)
    call.mask = dropout_mask(data, num_layers, call.sizes.width, dropout, seed);
  p.x = data.contiguous();
  p.h0 = p.h0.contiguous();
  if (p.c0.defined()) p.c0 = p.c0.contiguous();
  p.w.reserve(weights.size());
  for (const Tensor& t : weights) p.w.push_back(t.contiguous());
  return p;
}

// The forward of a prepared call, the products in torch or in the library.
Forward forward(const Backend& backend, const Prepared& p, bool keep) {
  const Call& c = p.call;
  return (c.torch_products ? forward_layers : forward_library)(
      backend, c.sizes, p.x, c.batch_sizes, p.h0, p.c0, p.w, c.mask, c.allow_tf32, keep);
}

// The forward's results in the caller's order (c_n empty but for LSTM).
RnnResult finished(const Call& call, const Forward& f, const Tensor& data) {
  Tensor hn = f.hn, cn = f.cn.defined() ? f.cn : data.new_empty({0});
  if (call.unsorted.defined()) {
    hn = hn.index_select(1, call.unsorted.to(hn.device()));
    if (call.sizes.lstm) cn = cn.index_select(1, call.unsorted.to(cn.device()));
  }
  return {f.y, hn, cn};
}

// ---- the saved state between _rnn_train and _rnn_backward ----------------------
//
// A one-byte uint8 tensor on the data's device over the first byte of the saved
// buffer, whose storage's context holds the buffer and the call: it lives as
// long as that tensor, which autograd (or a compiled graph) keeps for the
// backward. (The CPU operator passes its saved state the same way, ops.cpp.)

struct Held {
  Tensor buffer;
  Call call;
  Tensor h0, c0;  // in the library's order
  Tensor byte;    // the handle's byte where the buffer has none
};

void delete_held(void* p) { delete static_cast<Held*>(p); }

Tensor make_handle(Held held) {
  if (held.buffer.numel() == 0) held.byte = bytes(1, held.h0);
  auto* h = new Held(std::move(held));
  const Tensor& over = h->byte.defined() ? h->byte : h->buffer;
  return at::for_blob(over.data_ptr(), {1})
      .context(h, &delete_held)
      .target_device(over.device())
      .options(over.options())
      .make_tensor();
}

const Held& from_handle(const Tensor& t) {
  TORCH_CHECK_VALUE(t.defined() && t.has_storage() &&
                        t.storage().data_ptr().get_deleter() == &delete_held,
                    "seqpack::rnn backward: saved is not the saved state of a seqpack::_rnn_train "
                    "call on ", t.defined() ? t.device() : at::Device(at::kCPU));
  return *static_cast<Held*>(t.storage().data_ptr().get_context());
}

// ---- autograd --------------------------------------------------------------

constexpr const char* kDoubleBackward =
    "seqpack CUDA: double backward (differentiating a gradient taken with create_graph=True) "
    "through seqpack's CUDA recurrent kernels is not supported: their backward is not made of "
    "differentiable operations (nor is cuDNN's). seqpack's CPU layers support it; on CUDA, "
    "torch's own non-cuDNN kernels do (SEQPACK_CUDA_LAYERS=torch, inside "
    "torch.backends.cudnn.flags(enabled=False))";

// The kernels' gradients in a graph recorded with create_graph=True: their
// values, and differentiating them raises kDoubleBackward (as torch's cuDNN
// RNN does) instead of counting the RNN's second derivatives as zero.
class NoDoubleBackward : public torch::autograd::Function<NoDoubleBackward> {
 public:
  static variable_list forward(AutogradContext* ctx, at::TensorList grads,
                               at::TensorList sources) {
    variable_list out;
    for (const Tensor& t : grads) out.push_back(t.clone());
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(false, kDoubleBackward);
  }
};

// Under grad mode (a backward with create_graph=True), the gradients with a
// node that refuses double backward, where anything they depend on wants a
// gradient.
variable_list refusing_double_backward(variable_list grads, const variable_list& saved,
                                       const variable_list& upstream) {
  variable_list sources;
  for (const variable_list* list : {&saved, &upstream})
    for (const Tensor& t : *list)
      if (t.defined() && t.requires_grad()) sources.push_back(t);
  std::vector<size_t> defined;
  variable_list values;
  for (size_t i = 0; i < grads.size(); ++i)
    if (grads[i].defined()) {
      defined.push_back(i);
      values.push_back(grads[i]);
    }
  if (sources.empty() || values.empty()) return grads;
  variable_list wrapped = NoDoubleBackward::apply(at::TensorList(values), at::TensorList(sources));
  for (size_t k = 0; k < defined.size(); ++k) grads[defined[k]] = wrapped[k];
  return grads;
}

using RnnSignature = RnnResult(SEQPACK_RNN_PARAMS);
using RnnTrainSignature = RnnTrainResult(SEQPACK_RNN_PARAMS);
using RnnBackwardSignature = RnnBackwardResult(const Tensor&, const OptTensor&, const OptTensor&,
                                               const OptTensor&, const Tensor&, const OptTensor&,
                                               const OptTensor&, at::TensorList, bool, bool);

// The backend's namespace's operator `name` (found once per namespace).
template <typename Signature>
const c10::TypedOperatorHandle<Signature>& op(const Backend& backend, const char* name) {
  static std::mutex mutex;
  static std::deque<std::pair<std::string, c10::TypedOperatorHandle<Signature>>> found;
  const std::string qualified = std::string(backend.ns) + "::" + name;
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto& [n, handle] : found)
    if (n == qualified) return handle;
  found.emplace_back(qualified, c10::Dispatcher::singleton()
                                    .findSchemaOrThrow(qualified.c_str(), "")
                                    .typed<Signature>());
  return found.back().second;
}

// What a call passes besides its differentiable tensors, and whose kernels run it.
struct Args {
  const Backend* backend;
  torch_ops::RNNArgs call;
};

class RnnFunction : public torch::autograd::Function<RnnFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& data, const OptTensor& h0,
                               const OptTensor& c0, at::TensorList weights, const Args& a) {
    Tensor y, hn, cn, saved;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      const torch_ops::RNNArgs& c = a.call;
      std::tie(y, hn, cn, saved) = op<RnnTrainSignature>(*a.backend, "_rnn_train")
                                       .call(data, c.batch_sizes, c.sorted_indices,
                                             c.unsorted_indices, h0, c0, weights, c.mode,
                                             c.hidden_size, c.num_layers, c.bias, c.bidirectional,
                                             c.proj_size, c.dropout, c.train, c.seed, c.precision);
    }
    variable_list to_save = {saved, data, given(h0) ? *h0 : Tensor(), given(c0) ? *c0 : Tensor()};
    to_save.insert(to_save.end(), weights.begin(), weights.end());
    ctx->save_for_backward(to_save);
    ctx->saved_data["backend"] = c10::IValue::make_capsule(c10::make_intrusive<BackendHolder>(a.backend));
    // Edge of each input: undefined optionals have none.
    int64_t edge = 1;
    ctx->saved_data["h0_edge"] = given(h0) ? edge++ : -1;
    ctx->saved_data["c0_edge"] = given(c0) ? edge++ : -1;
    ctx->saved_data["w_edge"] = edge;
    const bool lstm = a.call.mode == "LSTM";
    ctx->saved_data["lstm"] = lstm;
    if (!lstm) ctx->mark_non_differentiable({cn});
    ctx->set_materialize_grads(false);  // missing gradients are zeros to the library
    return {y, hn, cn};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Backend& backend =
        *static_cast<BackendHolder*>(ctx->saved_data.at("backend").toCapsule().get())->backend;
    const int64_t h0_edge = ctx->saved_data.at("h0_edge").toInt(),
                  c0_edge = ctx->saved_data.at("c0_edge").toInt(),
                  w_edge = ctx->saved_data.at("w_edge").toInt();
    const bool lstm = ctx->saved_data.at("lstm").toBool();
    const variable_list saved = ctx->get_saved_variables();  // throws if modified in place
    const std::vector<Tensor> weights(saved.begin() + 4, saved.end());
    auto opt = [](const Tensor& t) { return t.defined() ? OptTensor(t) : OptTensor(); };
    auto wanted = [&](int64_t edge) { return edge >= 0 && ctx->needs_input_grad(edge); };
    const bool input_grad = ctx->needs_input_grad(0), state_grad = wanted(h0_edge) || wanted(c0_edge);
    Tensor g_x, g_h0, g_c0;
    std::vector<Tensor> g_w;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      std::tie(g_x, g_h0, g_c0, g_w) = op<RnnBackwardSignature>(backend, "_rnn_backward")
                                           .call(saved[0], opt(grads[0]), opt(grads[1]),
                                                 lstm ? opt(grads[2]) : OptTensor(), saved[1],
                                                 opt(saved[2]), opt(saved[3]), weights,
                                                 input_grad, state_grad);
    }
    // One entry per forward argument: data, h0, c0, each weight, args.
    variable_list out = {input_grad ? g_x : Tensor(), wanted(h0_edge) ? g_h0 : Tensor(),
                         wanted(c0_edge) ? g_c0 : Tensor()};
    for (size_t w = 0; w < g_w.size(); ++w)
      out.push_back(ctx->needs_input_grad(w_edge + static_cast<int64_t>(w)) ? g_w[w] : Tensor());
    if (at::GradMode::is_enabled()) out = refusing_double_backward(out, saved, grads);
    out.emplace_back();  // args
    return out;
  }

 private:
  struct BackendHolder : torch::CustomClassHolder {
    explicit BackendHolder(const Backend* b) : backend(b) {}
    const Backend* backend;
  };
};

bool wants_graph(const Tensor& data, const OptTensor& h0, const OptTensor& c0,
                 at::TensorList weights) {
  if (!at::GradMode::is_enabled()) return false;
  if (data.requires_grad() || (given(h0) && h0->requires_grad()) ||
      (given(c0) && c0->requires_grad()))
    return true;
  return std::any_of(weights.begin(), weights.end(),
                     [](const Tensor& w) { return w.requires_grad(); });
}

int64_t pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}


// torch's side: torch's recurrent operators on the same call (torch_rnn.h),
// with a mask drawn as seqpack's side draws it.
RnnResult torch_side(SEQPACK_RNN_PARAMS) {
  const int64_t dirs = bidirectional ? 2 : 1, hout = proj_size > 0 ? proj_size : hidden_size;
  torch_ops::TorchRnn r;
  r.mode = mode;
  r.bias = bias;
  r.num_layers = num_layers;
  r.bidirectional = bidirectional;
  r.batch_sizes = batch_sizes;
  r.sorted_indices = index_or_none(sorted_indices);
  r.unsorted_indices = index_or_none(unsorted_indices);
  if (train && dropout > 0 && num_layers > 1) {
    const Tensor mask = dropout_mask(data, num_layers, dirs * hout, dropout, seed);
    r.masks.emplace_back();
    for (int64_t l = 1; l < num_layers; ++l) r.masks.push_back(mask[l - 1]);
  }
  const int64_t batch = batch_of(batch_sizes, r.sorted_indices), states = num_layers * dirs;
  const Tensor h = state_or_zeros(h0, states, batch, hout, data);
  const Tensor c = mode == "LSTM" ? state_or_zeros(c0, states, batch, hidden_size, data) : Tensor();
  auto [y, hn, cn] = torch_ops::torch_packed_rnn(r, data, h, c, weights.vec());
  return {y, hn, cn.defined() ? cn : data.new_empty({0})};
}

}  // namespace

RnnResult rnn(const Backend& backend, SEQPACK_RNN_PARAMS) {
  const Prepared p = prepare(SEQPACK_RNN_ARGS);
  c10::OptionalDeviceGuard guard(data.device());
  return finished(p.call, forward(backend, p, /*keep=*/false), data);
}

RnnTrainResult rnn_train(const Backend& backend, SEQPACK_RNN_PARAMS) {
  Prepared p = prepare(SEQPACK_RNN_ARGS);
  c10::OptionalDeviceGuard guard(data.device());
  const Forward f = forward(backend, p, /*keep=*/true);
  auto [y, hn, cn] = finished(p.call, f, data);
  return {y, hn, cn, make_handle(Held{f.saved, std::move(p.call), p.h0, p.c0, Tensor()})};
}

RnnBackwardResult rnn_backward(const Backend& backend, const Tensor& saved,
                               const OptTensor& grad_output, const OptTensor& grad_h_n,
                               const OptTensor& grad_c_n, const Tensor& data, const OptTensor& h0,
                               const OptTensor& c0, at::TensorList weights, bool input_grad,
                               bool state_grad) {
  const Held& held = from_handle(saved);
  const Call& call = held.call;
  // The states' gradients in the library's order, and back.
  auto sorted = [&](const OptTensor& g) {
    if (!given(g)) return Tensor();
    return call.sorted.defined() ? g->index_select(1, call.sorted.to(g->device())) : *g;
  };
  auto unsorted = [&](const Tensor& g) {
    return call.unsorted.defined() ? g.index_select(1, call.unsorted.to(g.device())) : g;
  };
  std::vector<Tensor> w;
  w.reserve(weights.size());
  for (const Tensor& t : weights) w.push_back(t.contiguous());
  c10::OptionalDeviceGuard guard(data.device());
  Gradients g = (call.torch_products ? backward_layers : backward_library)(
      backend, call.sizes, data.contiguous(), call.batch_sizes, held.h0, held.c0, w, call.mask,
      held.buffer, given(grad_output) ? *grad_output : Tensor(), sorted(grad_h_n),
      call.sizes.lstm ? sorted(grad_c_n) : Tensor(), call.allow_tf32);
  const Tensor empty = data.new_empty({0});
  return {input_grad ? g.dx : empty, state_grad && given(h0) ? unsorted(g.dh0) : empty,
          state_grad && given(c0) && g.dc0.defined() ? unsorted(g.dc0) : empty,
          std::move(g.dweights)};
}

RnnResult rnn_autograd(const Backend& backend, SEQPACK_RNN_PARAMS) {
  check_values(data, dropout, precision);
  const bool graph = wants_graph(data, h0, c0, weights);
  auto ours = [&]() -> RnnResult {
    if (!at::GradMode::is_enabled() || !graph) {
      at::AutoDispatchBelowADInplaceOrView below;
      return op<RnnSignature>(backend, "rnn").call(SEQPACK_RNN_ARGS);
    }
    const Args a{&backend,
                 {batch_sizes, sorted_indices, unsorted_indices, std::string(mode), hidden_size,
                  num_layers, bias, bidirectional, proj_size, dropout, train, seed,
                  std::string(precision), Tensor()}};
    const variable_list out = RnnFunction::apply(data, h0, c0, weights, a);
    return {out[0], out[1], out[2]};
  };
  auto theirs = [&]() { return torch_side(SEQPACK_RNN_ARGS); };
  // Fake tensors (torch.compile's tracer) carry the Python dispatch key.
  const bool traced = data.key_set().has(c10::DispatchKey::Python);
  auto key = [&] {
    return c10::str(backend.ns, mode, data.size(-1), hidden_size, num_layers, bidirectional,
                    proj_size, bias, data.scalar_type(), data.device(), graph, train, dropout,
                    "|", pow2(batch_of(batch_sizes, index_or_none(sorted_indices))), "|",
                    pow2(data.size(0)));
  };
  const Choice c = choose(backend, traced, data.device(), key, [&] { ours(); }, [&] { theirs(); });
  return c.impl == "torch" ? theirs() : ours();
}

RnnResult rnn_padded(const Backend& backend, const Tensor& input, const OptTensor& lengths,
                     const OptTensor& h0, const OptTensor& c0, at::TensorList weights,
                     c10::string_view mode, int64_t hidden_size, int64_t num_layers, bool bias,
                     bool batch_first, bool bidirectional, int64_t proj_size, double dropout,
                     bool train, c10::optional<int64_t> seed, c10::string_view precision) {
  TORCH_CHECK_VALUE(input.dim() == 3,
                    "seqpack::rnn_padded: input must be 3-D [T, B, input_size] (batch_first: ",
                    "[B, T, input_size]), got shape ", input.sizes());
  const int64_t T = input.size(batch_first ? 1 : 0), B = input.size(batch_first ? 0 : 1);
  const auto& rnn_op = op<RnnSignature>(backend, "rnn");
  if (!lengths.has_value() || !lengths->defined()) {
    // Every sequence has length T: the time-major rows are the packed rows.
    const Tensor time_major = batch_first ? input.transpose(0, 1) : input;
    const Tensor data = time_major.reshape({T * B, input.size(2)});
    // Batch 0 has no time steps in packed form.
    const Tensor batch_sizes = at::full({B > 0 ? T : 0}, B, at::TensorOptions().dtype(at::kLong));
    // The states default to zeros of the batch (with T = 0 the packed form
    // has no step to tell it).
    const int64_t states = num_layers * (bidirectional ? 2 : 1);
    auto state = [&](const OptTensor& given, int64_t width) -> OptTensor {
      if (given.has_value() && given->defined()) return given;
      return at::zeros({states, B, width}, input.options());
    };
    const OptTensor h = state(h0, proj_size > 0 ? proj_size : hidden_size);
    const OptTensor c = mode == "LSTM" ? state(c0, hidden_size) : c0;
    auto [out, h_n, c_n] =
        rnn_op.call(data, batch_sizes, c10::nullopt, c10::nullopt, h, c, weights, mode,
                    hidden_size, num_layers, bias, bidirectional, proj_size, dropout, train, seed,
                    precision);
    const Tensor output = out.view({T, B, out.size(1)});
    return {batch_first ? output.transpose(0, 1) : output, h_n, c_n};
  }
  // Packed by one gather of the rows in packed order, padded back by one
  // scatter: the plan of the lengths (length-descending, stable), as
  // pack_padded_sequence(enforce_sorted=False) makes it.
  const Tensor len = lengths->to(at::kCPU, at::kLong).contiguous();
  TORCH_CHECK(len.dim() == 1 && len.numel() == B, "seqpack::rnn_padded: lengths has shape ",
              len.sizes(), "; one length per sequence (", B, ") expected");
  const int64_t* l = len.data_ptr<int64_t>();
  std::vector<int64_t> order(static_cast<size_t>(B));
  std::iota(order.begin(), order.end(), 0);
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK_VALUE(l[b] >= 0 && l[b] <= T, "seqpack::rnn_padded: lengths[", b, "] = ", l[b],
                      " is outside [0, ", T, "] (the padded length)");
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return l[a] > l[b]; });
  const int64_t steps = B > 0 ? l[order[0]] : 0;
  Tensor batch_sizes = at::empty({steps}, at::TensorOptions().dtype(at::kLong));
  std::vector<int64_t> rows;
  for (int64_t t = 0; t < steps; ++t) {
    int64_t n = 0;
    while (n < B && l[order[static_cast<size_t>(n)]] > t) {
      const int64_t b = order[static_cast<size_t>(n++)];
      rows.push_back(batch_first ? b * T + t : t * B + b);
    }
    batch_sizes.data_ptr<int64_t>()[t] = n;
  }
  std::vector<int64_t> inverse(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i) inverse[static_cast<size_t>(order[i])] = i;
  const auto on_device = at::TensorOptions().dtype(at::kLong).device(input.device());
  const auto index_of = [&](const std::vector<int64_t>& v) {
    return at::tensor(v, at::TensorOptions().dtype(at::kLong)).to(on_device);
  };
  const Tensor gather = index_of(rows);
  const Tensor data = input.reshape({T * B, input.size(2)}).index_select(0, gather);
  auto [out, h_n, c_n] =
      rnn_op.call(data, batch_sizes, index_of(order), index_of(inverse), h0, c0, weights, mode,
                  hidden_size, num_layers, bias, bidirectional, proj_size, dropout, train, seed,
                  precision);
  const Tensor padded = at::zeros({T * B, out.size(1)}, out.options()).index_copy(0, gather, out);
  return {padded.view({batch_first ? B : T, batch_first ? T : B, out.size(1)}), h_n, c_n};
}

}  // namespace seqpack::torch_cuda
