// libseqpack_cuda: the C entry points of seqpack/cuda.h. The grid of the
// computation (layers x directions x steps) is written once here; the cells'
// element-wise math is in kernels.cuh. Per layer and direction:
//   forward:  gates = X W_ih^T + b_ih for all packed rows (one GEMM), then per
//             step t: h_prev/c_prev gathered, gh = h_prev W_hh^T (GEMM on the
//             step's rows), the cell kernel, [h = m W_hr^T], finished rows to
//             h_n/c_n;
//   backward: per step in the opposite order: dh = dy + carry, [dm = dh W_hr],
//             the cell's backward kernel, carry = dG_h W_hh; then the weight
//             gradients as GEMMs over all rows, and dX += dG_x W_ih.
// With caller_products = 1 (one layer) the caller runs the products over all
// rows (the input projection, the weight gradients, dX): the forward takes the
// input gates, the backward gives the gates' gradients and h_{t-1} instead.
#include "kernels.cuh"
#include "seqpack/cuda.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace seqpack::cuda {
namespace {

thread_local std::string g_last_error;

// Thrown inside this file only; every entry point catches it.
struct Failure {
  int status;
};

[[noreturn]] void fail(int status, const char* format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof buffer, format, args);
  va_end(args);
  g_last_error = buffer;
  throw Failure{status};
}

void check_cuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess)
    fail(SEQPACK_CUDA_RUNTIME_ERROR, "seqpack_cuda: %s failed: %s (%s)", what,
         cudaGetErrorString(error), cudaGetErrorName(error));
}

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(b, 1), 65535 * 8));
}

// Sizes of one call, checked once.
struct Shape {
  int mode = 0;
  int dtype = 0;
  int64_t rows = 0;
  int64_t batch = 0;
  int64_t input = 0;
  int64_t hidden = 0;
  int64_t proj = 0;
  int64_t layers = 0;
  int64_t dirs = 1;
  bool tf32 = false;  // allow_tf32: float32 step products may run on tensor cores (3xTF32)
  int64_t hout() const { return proj > 0 ? proj : hidden; }
  int64_t gates() const {
    return (mode == SEQPACK_CUDA_LSTM ? 4 : mode == SEQPACK_CUDA_GRU ? 3 : 1) * hidden;
  }
  int64_t width() const { return dirs * hout(); }  // a layer's output row
  int64_t in_width(int64_t layer) const { return layer == 0 ? input : width(); }
  bool lstm() const { return mode == SEQPACK_CUDA_LSTM; }
  bool gru() const { return mode == SEQPACK_CUDA_GRU; }
  int64_t element_size() const { return dtype == SEQPACK_CUDA_FLOAT32 ? 4 : 2; }
  // float32 elements per row of one (layer, direction) in the reserve.
  int64_t reserve_floats_per_row() const {
    return gates() + hout() + (lstm() ? 2 * hidden : 0) + (proj > 0 ? hidden : 0) +
           (gru() ? hidden : 0);
  }
  // The byte counts below are products of sizes within check_shape's limits
  // that can still pass 2^63 (rows 2^40, hidden 2^20, layers 2^16): each step
  // is checked, and a sum that does not fit is an error, never a wrapped size.
  [[noreturn]] void too_large() const {
    fail(SEQPACK_CUDA_INVALID_ARGUMENT,
         "seqpack_cuda: the buffers of rows %lld, batch %lld, input %lld, hidden %lld, layers "
         "%lld%s need more than 2^63 bytes",
         static_cast<long long>(rows), static_cast<long long>(batch), static_cast<long long>(input),
         static_cast<long long>(hidden), static_cast<long long>(layers),
         dirs == 2 ? ", bidirectional" : "");
  }
  int64_t mul(int64_t a, int64_t b) const {
    int64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) too_large();
    return r;
  }
  int64_t add(int64_t a, int64_t b) const {
    int64_t r = 0;
    if (__builtin_add_overflow(a, b, &r)) too_large();
    return r;
  }
  // A reserve row: the float32 values of each (layer, direction), then the
  // data-type elements of the outputs and dropped-out inputs of the layers
  // below the last.
  int64_t reserve_bytes_per_row() const {
    return add(mul(mul(4 * dirs, layers), reserve_floats_per_row()),
               mul(element_size(), mul(2 * (layers - 1), width())));
  }
  int64_t reserve_bytes() const { return mul(rows, reserve_bytes_per_row()); }
  int64_t dy_width() const { return std::max(width(), input); }
  // layout_workspace's bytes: what both directions share, and each
  // direction's own (so that the two may run at once).
  int64_t workspace_bytes() const {
    const int64_t per_row = gates() * (gru() ? 2 : 1) + 2 * dy_width() + dirs * hout();
    const int64_t per_batch = dirs * (gates() + (proj > 0 ? hidden : 0) + hout() + hidden);
    // + each direction's device copy of batch_sizes (steps <= rows).
    return add(mul(8 * dirs, rows), mul(4, add(mul(rows, per_row), mul(batch, per_batch))));
  }
  int64_t weights_per_layer_dir(bool has_biases) const {
    return 2 + (has_biases ? 2 : 0) + (proj > 0 ? 1 : 0);
  }
};

const char* mode_name(int mode) {
  switch (mode) {
    case SEQPACK_CUDA_LSTM:
      return "LSTM";
    case SEQPACK_CUDA_GRU:
      return "GRU";
    case SEQPACK_CUDA_RNN_TANH:
      return "RNN_TANH";
    default:
      return "RNN_RELU";
  }
}

Shape check_shape(int mode, int dtype, int64_t rows, int64_t batch, int64_t input_size,
                  int64_t hidden_size, int64_t proj_size, int64_t num_layers, int bidirectional) {
  if (mode < SEQPACK_CUDA_LSTM || mode > SEQPACK_CUDA_RNN_RELU)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT,
         "seqpack_cuda: mode = %d is not LSTM (0), GRU (1), RNN_TANH (2) or RNN_RELU (3)", mode);
  if (dtype < SEQPACK_CUDA_FLOAT32 || dtype > SEQPACK_CUDA_BFLOAT16)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT,
         "seqpack_cuda: dtype = %d is not float32 (0), float16 (1) or bfloat16 (2)", dtype);
  if (rows < 0)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT, "seqpack_cuda: rows = %lld is negative",
         static_cast<long long>(rows));
  if (batch < 0)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT, "seqpack_cuda: batch = %lld is negative",
         static_cast<long long>(batch));
  if (input_size <= 0)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT, "seqpack_cuda: input_size = %lld is not positive",
         static_cast<long long>(input_size));
  if (hidden_size <= 0)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT, "seqpack_cuda: hidden_size = %lld is not positive",
         static_cast<long long>(hidden_size));
  if (proj_size < 0)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT, "seqpack_cuda: proj_size = %lld is negative",
         static_cast<long long>(proj_size));
  if (proj_size > 0 && mode != SEQPACK_CUDA_LSTM)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT, "seqpack_cuda: proj_size = %lld is for LSTM only, not %s",
         static_cast<long long>(proj_size), mode_name(mode));
  if (proj_size >= hidden_size && proj_size > 0)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT,
         "seqpack_cuda: proj_size = %lld must be smaller than hidden_size = %lld",
         static_cast<long long>(proj_size), static_cast<long long>(hidden_size));
  if (num_layers <= 0)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT, "seqpack_cuda: num_layers = %lld is not positive",
         static_cast<long long>(num_layers));
  if (bidirectional != 0 && bidirectional != 1)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT, "seqpack_cuda: bidirectional = %d is not 0 or 1",
         bidirectional);
  const int64_t limit = int64_t{1} << 40;
  if (input_size > limit || hidden_size > limit || num_layers > (1 << 20) || rows > limit ||
      batch > limit)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT,
         "seqpack_cuda: sizes too large (rows %lld, batch %lld, input %lld, hidden %lld, layers "
         "%lld)",
         static_cast<long long>(rows), static_cast<long long>(batch),
         static_cast<long long>(input_size), static_cast<long long>(hidden_size),
         static_cast<long long>(num_layers));
  Shape s;
  s.mode = mode;
  s.dtype = dtype;
  s.rows = rows;
  s.batch = batch;
  s.input = input_size;
  s.hidden = hidden_size;
  s.proj = proj_size;
  s.layers = num_layers;
  s.dirs = bidirectional ? 2 : 1;
  return s;
}

// Checks batch_sizes (positive, non-increasing, first <= batch) and returns
// the row offset of each step (offsets[steps] = rows).
std::vector<int64_t> check_batch_sizes(int64_t steps, const int64_t* batch_sizes, int64_t batch,
                                       int64_t rows) {
  if (steps < 0)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT, "seqpack_cuda: steps = %lld is negative",
         static_cast<long long>(steps));
  if (steps > 0 && batch_sizes == nullptr)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT, "seqpack_cuda: batch_sizes is NULL with steps = %lld",
         static_cast<long long>(steps));
  std::vector<int64_t> offsets(static_cast<size_t>(steps) + 1, 0);
  for (int64_t t = 0; t < steps; ++t) {
    const int64_t bs = batch_sizes[t];
    if (bs <= 0)
      fail(SEQPACK_CUDA_INVALID_ARGUMENT, "seqpack_cuda: batch_sizes[%lld] = %lld is not positive",
           static_cast<long long>(t), static_cast<long long>(bs));
    if (t == 0 && bs > batch)
      fail(SEQPACK_CUDA_INVALID_ARGUMENT,
           "seqpack_cuda: batch_sizes[0] = %lld exceeds the batch of h0, %lld",
           static_cast<long long>(bs), static_cast<long long>(batch));
    if (t > 0 && bs > batch_sizes[t - 1])
      fail(SEQPACK_CUDA_INVALID_ARGUMENT,
           "seqpack_cuda: batch_sizes[%lld] = %lld exceeds batch_sizes[%lld] = %lld (they must not "
           "increase)",
           static_cast<long long>(t), static_cast<long long>(bs), static_cast<long long>(t - 1),
           static_cast<long long>(batch_sizes[t - 1]));
    offsets[t + 1] = offsets[t] + bs;
  }
  if (offsets.back() != rows)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT,
         "seqpack_cuda: sum(batch_sizes) = %lld differs from the %lld rows of x",
         static_cast<long long>(offsets.back()), static_cast<long long>(rows));
  return offsets;
}

void require(const void* p, const char* name) {
  if (p == nullptr) fail(SEQPACK_CUDA_INVALID_ARGUMENT, "seqpack_cuda: %s is NULL", name);
}

void check_buffers(const Shape& s, size_t workspace_bytes, const void* workspace,
                   size_t reserve_bytes, const void* reserve) {
  const auto need_ws = static_cast<size_t>(s.workspace_bytes());
  const auto need_rs = static_cast<size_t>(s.reserve_bytes());
  if (workspace_bytes < need_ws)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT,
         "seqpack_cuda: workspace_bytes = %zu is less than the %zu bytes needed", workspace_bytes,
         need_ws);
  if (reserve_bytes < need_rs)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT,
         "seqpack_cuda: reserve_bytes = %zu is less than the %zu bytes needed", reserve_bytes,
         need_rs);
  if (need_ws > 0) require(workspace, "workspace");
  if (need_rs > 0) require(reserve, "reserve");
}

void check_weights(const Shape& s, bool has_biases, const void* const* weights, const char* name) {
  require(weights, name);
  const int64_t per = s.weights_per_layer_dir(has_biases);
  for (int64_t i = 0; i < s.layers * s.dirs * per; ++i)
    if (weights[i] == nullptr)
      fail(SEQPACK_CUDA_INVALID_ARGUMENT, "seqpack_cuda: %s[%lld] is NULL", name,
           static_cast<long long>(i));
}

// caller_products = 1 (seqpack/cuda.h): the caller's buffers of one layer,
// per direction; `on` is false when the library runs every product.
struct CallerProducts {
  bool on = false;
  const void* input_gates[2] = {nullptr, nullptr};
  float* dgates_x[2] = {nullptr, nullptr};
  float* dgates_h[2] = {nullptr, nullptr};
  float* hprev[2] = {nullptr, nullptr};
  float* dh[2] = {nullptr, nullptr};
  float* m[2] = {nullptr, nullptr};
};

// name[d] for d < dirs where the pass uses it (`used`; required when there
// are rows), NULL elsewhere: a buffer given that the pass would neither read
// nor write is an error, never ignored.
void check_per_direction(const Shape& s, const void* const* p, const char* name, bool used,
                         const char* why_not) {
  for (int d = 0; d < 2; ++d) {
    if (p[d] != nullptr && !used)
      fail(SEQPACK_CUDA_INVALID_ARGUMENT, "seqpack_cuda: %s[%d] is given, but %s", name, d,
           why_not);
    if (p[d] != nullptr && d >= s.dirs)
      fail(SEQPACK_CUDA_INVALID_ARGUMENT,
           "seqpack_cuda: %s[%d] is given, but the layer has one direction", name, d);
    if (p[d] == nullptr && used && d < s.dirs && s.rows > 0)
      fail(SEQPACK_CUDA_INVALID_ARGUMENT, "seqpack_cuda: %s[%d] is NULL (caller_products = 1)",
           name, d);
  }
}

// The shape with the caller's allow_tf32 (checked).
Shape with_tf32(Shape s, int allow_tf32) {
  if (allow_tf32 != 0 && allow_tf32 != 1)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT, "seqpack_cuda: allow_tf32 = %d is not 0 or 1", allow_tf32);
  s.tf32 = allow_tf32 == 1;
  return s;
}

// The caller_products fields a pass reads (the forward: input_gates) or
// writes (the backward: the others), checked; the other pass's are not read.
CallerProducts caller_products(const Shape& s, const seqpack_cuda_rnn_args& a, bool backward) {
  CallerProducts c;
  if (a.caller_products != 0 && a.caller_products != 1)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT, "seqpack_cuda: caller_products = %d is not 0 or 1",
         a.caller_products);
  const bool on = a.caller_products == 1;
  if (on && s.layers != 1)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT,
         "seqpack_cuda: caller_products = 1 runs one layer, not num_layers = %lld",
         static_cast<long long>(s.layers));
  const char* off = "caller_products = 0";
  const auto as_void = [](float* const* p) { return reinterpret_cast<const void* const*>(p); };
  if (!backward) {
    check_per_direction(s, a.input_gates, "input_gates", on, off);
  } else {
    check_per_direction(s, as_void(a.dgates_x), "dgates_x", on, off);
    check_per_direction(s, as_void(a.hprev), "hprev", on, off);
    const char* not_gru = on ? "only a GRU's differs from dgates_x (pass NULL)" : off;
    const char* no_proj = on ? "the layer has no projection" : off;
    check_per_direction(s, as_void(a.dgates_h), "dgates_h", on && s.gru(), not_gru);
    check_per_direction(s, as_void(a.dh), "dh", on && s.proj > 0, no_proj);
    check_per_direction(s, as_void(a.m), "m", on && s.proj > 0, no_proj);
  }
  c.on = on;
  for (int d = 0; d < 2; ++d) {
    c.input_gates[d] = a.input_gates[d];
    c.dgates_x[d] = a.dgates_x[d];
    c.dgates_h[d] = a.dgates_h[d];
    c.hprev[d] = a.hprev[d];
    c.dh[d] = a.dh[d];
    c.m[d] = a.m[d];
  }
  return c;
}

// The pointers of one (layer, direction) in the _flat_weights order.
template <typename P>
struct LayerWeights {
  P w_ih = nullptr, w_hh = nullptr, b_ih = nullptr, b_hh = nullptr, w_hr = nullptr;
};

template <typename P>
LayerWeights<P> weights_of(const Shape& s, bool has_biases, P const* weights, int64_t layer,
                           int64_t dir) {
  const int64_t per = s.weights_per_layer_dir(has_biases);
  P const* w = weights + (layer * s.dirs + dir) * per;
  LayerWeights<P> out;
  out.w_ih = w[0];
  out.w_hh = w[1];
  int64_t k = 2;
  if (has_biases) {
    out.b_ih = w[2];
    out.b_hh = w[3];
    k = 4;
  }
  if (s.proj > 0) out.w_hr = w[k];
  return out;
}

// Carves consecutive buffers out of one allocation; float32 ones first, so
// every buffer is aligned for its type.
class Arena {
 public:
  explicit Arena(void* base) : base_(static_cast<char*>(base)) {}
  template <typename T>
  T* take(int64_t count) {
    T* p = reinterpret_cast<T*>(base_ + offset_);
    offset_ += count * static_cast<int64_t>(sizeof(T));
    return p;
  }

 private:
  char* base_;
  int64_t offset_ = 0;
};

// The reserve's buffers of one (layer, direction), rows x width each.
struct Saved {
  float* gates;  // activations (LSTM i,f,g,o; GRU r,z,n; RNN h)
  float* hprev;  // h_{t-1} of each row
  float* c;      // LSTM c_t
  float* cprev;  // LSTM c_{t-1}
  float* m;      // LSTM with projection: o * tanh(c)
  float* ghn;    // GRU: W_hn h_{t-1} + b_hn
};

template <typename T>
struct ReserveLayout {
  std::vector<Saved> saved;       // [layer * dirs + dir]
  std::vector<T*> layer_output;   // [layer], layers below the last
  std::vector<T*> dropped_input;  // [layer], layers above the first
};

template <typename T>
ReserveLayout<T> layout_reserve(const Shape& s, void* reserve) {
  Arena arena(reserve);
  ReserveLayout<T> r;
  const int64_t n = s.rows;
  for (int64_t i = 0; i < s.layers * s.dirs; ++i) {
    Saved v{};
    v.gates = arena.take<float>(n * s.gates());
    v.hprev = arena.take<float>(n * s.hout());
    if (s.lstm()) {
      v.c = arena.take<float>(n * s.hidden);
      v.cprev = arena.take<float>(n * s.hidden);
    }
    if (s.proj > 0) v.m = arena.take<float>(n * s.hidden);
    if (s.gru()) v.ghn = arena.take<float>(n * s.hidden);
    r.saved.push_back(v);
  }
  r.layer_output.assign(static_cast<size_t>(s.layers), nullptr);
  r.dropped_input.assign(static_cast<size_t>(s.layers), nullptr);
  for (int64_t l = 0; l + 1 < s.layers; ++l) r.layer_output[l] = arena.take<T>(n * s.width());
  for (int64_t l = 1; l < s.layers; ++l) r.dropped_input[l] = arena.take<T>(n * s.width());
  return r;
}

struct Workspace {
  int64_t* batch_sizes;  // rows entries: a device copy of batch_sizes
  float* gh;             // batch x gates: h_{t-1} W_hh^T of one step
  float* dgx;            // rows x gates
  float* dgh;            // rows x gates (GRU; else dgx)
  float* dh;             // rows x hout: gradient of each row's h
  float* dm;             // batch x hidden (projection)
  float* dh_carry;       // batch x hout
  float* dc_carry;       // batch x hidden
  float* dy[2];          // rows x dy_width, ping-pong between layers
};

// The workspace as direction d sees it: dgx, dgh and dy are shared (the
// backward on the library's own products, which uses them, runs a layer's
// directions one after the other), the rest is direction d's own (a layer's
// directions run at once otherwise: SideStream).
Workspace layout_workspace(const Shape& s, void* workspace, int64_t d = 0) {
  Arena arena(workspace);
  Workspace w{};
  const int64_t n = s.rows;
  w.batch_sizes = arena.take<int64_t>(n * s.dirs) + d * n;
  w.dgx = arena.take<float>(n * s.gates());
  w.dgh = s.gru() ? arena.take<float>(n * s.gates()) : w.dgx;
  w.dy[0] = arena.take<float>(n * s.dy_width());
  w.dy[1] = arena.take<float>(n * s.dy_width());
  for (int64_t k = 0; k < s.dirs; ++k) {  // each direction's part, d's kept
    Workspace own = w;
    own.dh = arena.take<float>(n * s.hout());
    own.gh = arena.take<float>(s.batch * s.gates());
    own.dm = s.proj > 0 ? arena.take<float>(s.batch * s.hidden) : nullptr;
    own.dh_carry = arena.take<float>(s.batch * s.hout());
    own.dc_carry = arena.take<float>(s.batch * s.hidden);
    if (k == d) w = own;
  }
  return w;
}

// The GEMM's tile: 64 unless that gives fewer than kMinBlocks blocks (a step's
// few rows); SEQPACK_CUDA_GEMM_TILE=32 or 64 forces one (tests).
constexpr int64_t kMinBlocks = 264;  // twice an H100's 132 multiprocessors

int gemm_tile(int64_t M, int64_t N) {
  const char* forced = std::getenv("SEQPACK_CUDA_GEMM_TILE");
  if (forced != nullptr && std::strcmp(forced, "32") == 0) return 32;
  if (forced != nullptr && std::strcmp(forced, "64") == 0) return 64;
  const int64_t blocks64 = ((M + 63) / 64) * ((N + 63) / 64);
  return blocks64 < kMinBlocks ? 32 : 64;
}

// The 16-bit data type among a GEMM's operand types (float if none).
template <typename... Ts>
struct HalfType {
  using type = float;
};
template <typename T, typename... Ts>
struct HalfType<T, Ts...> {
  using type = std::conditional_t<std::is_same_v<T, float>, typename HalfType<Ts...>::type, T>;
};

// SEQPACK_CUDA_GEMM=wmma: tensor cores for bfloat16/float16 data (opt-in until
// checked on a GPU); unset or "simt": the SIMT kernel.
bool use_wmma() {
  const char* choice = std::getenv("SEQPACK_CUDA_GEMM");
  return choice != nullptr && std::strcmp(choice, "wmma") == 0;
}

template <typename TA, typename TB, typename TC>
void gemm(cudaStream_t stream, int64_t M, int64_t N, int64_t K, const TA* A, int64_t lda,
          bool trans_a, const TB* B, int64_t ldb, bool trans_b, const TB* bias, TC* C, int64_t ldc,
          bool accumulate) {
  if (M <= 0 || N <= 0) return;
  using TH = typename HalfType<TA, TB, TC>::type;
  if constexpr (!std::is_same_v<TH, float>) {
    if (use_wmma()) {
      const int64_t wx = (M + kWmmaTile - 1) / kWmmaTile;
      const int64_t wy = (N + kWmmaTile - 1) / kWmmaTile;
      if (wx > 0x7fffffff || wy > 65535)
        fail(SEQPACK_CUDA_INVALID_ARGUMENT,
             "seqpack_cuda: a product of %lld x %lld is too large for one launch",
             static_cast<long long>(M), static_cast<long long>(N));
      launch(gemm_wmma_kernel<TH, TA, TB, TC>,
             dim3(static_cast<unsigned>(wx), static_cast<unsigned>(wy)), kWmmaThreads, stream, M, N,
             K, A, lda, trans_a, B, ldb, trans_b, bias, C, ldc, accumulate);
      return;
    }
  }
  const int tile = gemm_tile(M, N);
  const int64_t gx = (M + tile - 1) / tile;
  const int64_t gy = (N + tile - 1) / tile;
  if (gx > 0x7fffffff || gy > 65535)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT,
         "seqpack_cuda: a product of %lld x %lld is too large for one launch",
         static_cast<long long>(M), static_cast<long long>(N));
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
  if (tile == 32)
    launch(gemm_kernel<32, TA, TB, TC>, grid, kGemmThreads, stream, M, N, K, A, lda, trans_a, B,
           ldb, trans_b, bias, C, ldc, accumulate);
  else
    launch(gemm_kernel<64, TA, TB, TC>, grid, kGemmThreads, stream, M, N, K, A, lda, trans_a, B,
           ldb, trans_b, bias, C, ldc, accumulate);
}

template <typename TO>
void column_sum(cudaStream_t stream, int64_t M, int64_t N, const float* a, int64_t lda, TO* out) {
  if (N <= 0) return;
  const int64_t blocks = (N + kSumColumns - 1) / kSumColumns;
  launch(column_sum_kernel<TO>, dim3(static_cast<unsigned>(blocks)), dim3(kSumColumns, kSumLanes),
         stream, M, N, a, lda, out);
}

template <typename TS, typename TD>
void convert(cudaStream_t stream, int64_t rows, int64_t cols, const TS* src, int64_t lds, TD* dst,
             int64_t ldd) {
  if (rows <= 0 || cols <= 0) return;
  launch(convert_kernel<TS, TD>, blocks_for(rows * cols), kThreads, stream, rows, cols, src, lds,
         dst, ldd);
}

template <typename T>
void zero(cudaStream_t stream, int64_t n, T* dst) {
  if (n <= 0) return;
  launch(fill_zero_kernel<T>, blocks_for(n), kThreads, stream, n, dst);
}

// SEQPACK_CUDA_KERNEL picks the forward recurrence's kernels: "simple" (the
// default: a few launches per step), "persistent" (one cooperative launch per
// layer and direction, where it fits the GPU; else simple) or "cluster" (one
// thread-block cluster per layer and direction, sm_90, where it fits; else
// simple).
bool kernel_requested(const char* name) {
  const char* choice = std::getenv("SEQPACK_CUDA_KERNEL");
  return choice != nullptr && std::strcmp(choice, name) == 0;
}
bool persistent_requested() { return kernel_requested("persistent"); }
bool cluster_requested() { return kernel_requested("cluster"); }

// One layer and direction's forward recurrence: what a one-launch kernel
// reads and writes (the gates hold the input's part already).
template <typename T>
struct ForwardRun {
  bool reverse = false;
  LayerWeights<const T*> w;
  const Saved* sv = nullptr;
  Workspace ws{};
  const T* h0 = nullptr;
  const T* c0 = nullptr;
  T* y = nullptr;
  T* hn = nullptr;
  T* cn = nullptr;
};

// The persistent forward kernels' arguments of one layer and direction.
template <typename T>
PersistentArgs<T> persistent_args(const Shape& s, int64_t steps, int64_t units,
                                  const ForwardRun<T>& r) {
  PersistentArgs<T> a{};
  a.mode = s.mode;
  a.reverse = r.reverse;
  a.steps = steps;
  a.batch = s.batch;
  a.batch_sizes = r.ws.batch_sizes;
  a.H = s.hidden;
  a.ldy = s.width();
  a.units = units;
  a.gates = r.sv->gates;
  a.gh = r.ws.gh;
  a.w_hh = r.w.w_hh;
  a.b_hh = r.w.b_hh;
  a.h0 = r.h0;
  a.c0 = r.c0;
  a.y = r.y;
  a.hprev = r.sv->hprev;
  a.c = r.sv->c;
  a.cprev = r.sv->cprev;
  a.ghn = r.sv->ghn;
  a.hn = r.hn;
  a.cn = r.cn;
  a.P = s.hout();
  a.cols = s.hout();
  a.w_hr = r.w.w_hr;
  a.m = r.sv->m;
  return a;
}

// The shared memory a one-launch kernel's block keeps of the weights, owning
// `units` hidden units and `cols` output columns (element bytes an entry):
// the forward's W_hh rows of its units (every gate) and, with a projection,
// W_hr's rows of its columns; the backward's W_hh columns of its units (with
// a projection: of its columns, and W_hr's columns of its units).
size_t weight_bytes(const Shape& s, bool backward, int64_t units, int64_t cols, size_t element) {
  const int64_t n = s.proj == 0 ? s.gates() * units
                    : backward  ? s.hout() * units + s.gates() * cols
                                : s.gates() / s.hidden * units * s.hout() + cols * s.hidden;
  return static_cast<size_t>(n) * element;
}

// Copies batch_sizes to the first direction's device copy, which every
// direction of p then reads.
template <typename A>
void share_batch_sizes(Directions<A>& p, int count, const int64_t* batch_sizes, int64_t steps,
                       cudaStream_t stream) {
  check_cuda(cudaMemcpyAsync(const_cast<int64_t*>(p.dir[0].batch_sizes), batch_sizes,
                             static_cast<size_t>(steps) * 8, cudaMemcpyHostToDevice, stream),
             "copying batch_sizes to the device");
  for (int d = 1; d < count; ++d) p.dir[d].batch_sizes = p.dir[0].batch_sizes;
}

// Hidden units per block for a cooperative launch of `kernel` for `count`
// directions (the backward's if `backward`): from 1 up, the first whose
// weights fit a block's shared memory (weight_bytes, with the output columns
// shared out among the ceil(H / U) blocks: *cols) and whose count ceil(H / U)
// blocks are all resident at once (a cooperative launch needs that); 0 where
// none does.
template <typename A>
int64_t cooperative_units(void (*kernel)(A), const Shape& s, int count, bool backward,
                          size_t element, const DeviceLimits& limits, size_t* shared,
                          int64_t* cols) {
  const int64_t H = s.hidden;
  for (int64_t u = 1; u <= 64 && u <= H; u *= 2) {
    const int64_t blocks = (H + u - 1) / u, c = (s.hout() + blocks - 1) / blocks;
    const size_t bytes = weight_bytes(s, backward, u, c, element);
    if (bytes > static_cast<size_t>(limits.shared_optin)) break;
    const int per_sm = blocks_per_multiprocessor(kernel, kPersistentThreads, bytes);
    if (count * blocks <= static_cast<int64_t>(per_sm) * limits.multiprocessors) {
      *shared = bytes;
      *cols = c;
      return u;
    }
  }
  return 0;
}

// Launches `kernel` for one layer's `count` directions on one cooperative
// grid of ceil(H / U) blocks a direction (cooperative_units: each block's
// part of the weights, `element` bytes an entry, in its shared memory), with
// direction d's arguments make(U, d) and the block's output columns; false
// (nothing run) where it does not fit or where the GPU refuses the launch
// (too many blocks resident elsewhere, say): the steps are then another
// launch's.
template <typename A, typename Make>
bool start_cooperative(void (*kernel)(Directions<A>), const Shape& s, bool backward, size_t element,
                       const int64_t* batch_sizes, int64_t steps, int count, cudaStream_t stream,
                       Make make) {
  if (steps == 0) return false;
  DeviceLimits limits;
  if (device_limits(&limits) != cudaSuccess || !limits.cooperative) {
    (void)cudaGetLastError();
    return false;
  }
  size_t shared = 0;
  int64_t cols = 0;
  const int64_t units =
      cooperative_units(kernel, s, count, backward, element, limits, &shared, &cols);
  if (units == 0) return false;
  Directions<A> p{};
  for (int d = 0; d < count; ++d) {
    p.dir[d] = make(units, d);
    p.dir[d].cols = cols;
  }
  p.blocks = static_cast<unsigned>((s.hidden + units - 1) / units);
  share_batch_sizes(p, count, batch_sizes, steps, stream);
  if (launch_cooperative(kernel, dim3(static_cast<unsigned>(count) * p.blocks),
                         dim3(kPersistentThreads), shared, stream, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

// The persistent kernel for one layer's `count` directions, if it fits: units
// per block U from 1 up, the first whose W_hh rows fit in shared memory and
// whose blocks are all resident at once (a cooperative launch needs that).
// Returns false (nothing launched) where none does.
template <typename T>
bool try_persistent(const Shape& s, const int64_t* batch_sizes, int64_t steps,
                    const ForwardRun<T>* runs, int count, cudaStream_t stream) {
  return start_cooperative(
      s.proj > 0 ? persistent_forward_kernel<T, true> : persistent_forward_kernel<T, false>, s,
      false, sizeof(T), batch_sizes, steps, count, stream,
      [&](int64_t units, int d) { return persistent_args<T>(s, steps, units, runs[d]); });
}

// The cluster kernel's size: the largest power of two up to 16 that leaves
// every block 4 hidden units or more (1 for H < 8); SEQPACK_CUDA_CLUSTER=n
// (1 to 16, tests) forces one.
int64_t cluster_size(int64_t H) {
  const char* forced = std::getenv("SEQPACK_CUDA_CLUSTER");
  if (forced != nullptr && forced[0] != '\0') {
    char* end = nullptr;
    const long n = std::strtol(forced, &end, 10);
    if (*end != '\0' || n < 1 || n > 16)
      fail(SEQPACK_CUDA_INVALID_ARGUMENT,
           "seqpack_cuda: SEQPACK_CUDA_CLUSTER = '%s' is not a block count from 1 to 16", forced);
    return std::min<int64_t>(n, H);
  }
  int64_t n = 1;
  while (n < 16 && 2 * n * 4 <= H) n *= 2;
  return n;
}

// Whether the cluster kernels gather through shared memory where their
// buffers fit (the default) or always through global memory
// (SEQPACK_CUDA_CLUSTER_GATHER=global, tests; "shared" is the default's name).
bool cluster_gather_global() {
  const char* choice = std::getenv("SEQPACK_CUDA_CLUSTER_GATHER");
  if (choice == nullptr || choice[0] == '\0' || std::strcmp(choice, "shared") == 0) return false;
  if (std::strcmp(choice, "global") == 0) return true;
  fail(SEQPACK_CUDA_INVALID_ARGUMENT,
       "seqpack_cuda: SEQPACK_CUDA_CLUSTER_GATHER = '%s' is not 'shared' or 'global'", choice);
}

// SEQPACK_CUDA_CLUSTER_MMA: unset, empty or 1 lets the cluster forward kernel
// use tensor cores where it can (16-bit data); 0 keeps the threads' products.
bool cluster_mma_allowed() {
  const char* choice = std::getenv("SEQPACK_CUDA_CLUSTER_MMA");
  if (choice == nullptr || choice[0] == '\0' || std::strcmp(choice, "1") == 0) return true;
  if (std::strcmp(choice, "0") == 0) return false;
  fail(SEQPACK_CUDA_INVALID_ARGUMENT, "seqpack_cuda: SEQPACK_CUDA_CLUSTER_MMA = '%s' is not 0 or 1",
       choice);
}

// Where a cluster kernel runs one layer and direction (the backward's if
// `backward`): cluster_size(H) blocks of `units` hidden units and `cols`
// output columns, each block's shared memory holding its part of the weights
// (weight_bytes) and, where they fit beside it (and
// SEQPACK_CUDA_CLUSTER_GATHER allows; never with a projection, whose kernels
// gather through global memory), the gather buffers of buffer_bytes. ok is
// false where the weights alone do not fit or the device's limits are
// unknown.
struct ClusterPlan {
  bool ok = false;
  int64_t n = 0, units = 0, cols = 0;
  size_t shared = 0;
  bool buffers = false;
};

template <typename T>
ClusterPlan plan_cluster(const Shape& s, int64_t steps, bool backward, size_t buffer_bytes) {
  ClusterPlan p;
  if (steps == 0) return p;
  DeviceLimits limits;
  if (device_limits(&limits) != cudaSuccess) {
    (void)cudaGetLastError();
    return p;
  }
  const auto limit = static_cast<size_t>(limits.shared_optin);
  p.n = cluster_size(s.hidden);
  p.units = (s.hidden + p.n - 1) / p.n;
  p.cols = (s.hout() + p.n - 1) / p.n;
  const size_t rows = weight_bytes(s, backward, p.units, p.cols, sizeof(T));
  p.buffers = s.proj == 0 && !cluster_gather_global() && rows + buffer_bytes <= limit;
  p.shared = rows + (p.buffers ? buffer_bytes : 0);
  p.ok = p.shared <= limit;
  return p;
}

// Launches `kernel` for one layer's `count` directions, a cluster of the
// plan's each, with the arguments a (batch_sizes copied to the device first);
// false (nothing run) where the GPU refuses the launch.
template <typename A>
bool start_cluster(void (*kernel)(Directions<A>), const ClusterPlan& p, const int64_t* batch_sizes,
                   int64_t steps, int count, cudaStream_t stream, Directions<A> a) {
  a.blocks = static_cast<unsigned>(p.n);
  share_batch_sizes(a, count, batch_sizes, steps, stream);
  if (launch_cluster(kernel, dim3(static_cast<unsigned>(count * p.n)), dim3(kPersistentThreads),
                     static_cast<unsigned>(p.n), p.shared, stream, a) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

// The cluster kernel for one layer's `count` directions, if it fits: a
// cluster of cluster_size(H) blocks a direction, each holding its units' rows
// of W_hh in shared memory, and the two h buffers (batch x H each) where they
// fit too (else h_{t-1} is read from y). Returns false (nothing launched)
// where the rows do not fit or the GPU refuses the launch (before sm_90: no
// clusters).
template <typename T>
bool try_cluster(const Shape& s, const int64_t* batch_sizes, int64_t steps,
                 const ForwardRun<T>* runs, int count, cudaStream_t stream) {
  ClusterPlan p =
      plan_cluster<T>(s, steps, false, static_cast<size_t>(2 * s.batch * s.hidden) * sizeof(T));
  if (!p.ok) return false;
  // 16-bit data, or float32 with TF32 allowed (3xTF32), with H a multiple of
  // 16 and the h buffers in shared memory: the step's product on tensor cores
  // where that layout fits too (SEQPACK_CUDA_CLUSTER_MMA=0 keeps the threads'
  // own products).
  bool mma = false;
  DeviceLimits limits;
  if (device_limits(&limits) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const auto limit = static_cast<size_t>(limits.shared_optin);
  if ((sizeof(T) == 2 || s.tf32) && s.hidden % 16 == 0 && p.buffers && cluster_mma_allowed()) {
    const size_t bytes =
        cluster_mma_shared_bytes<T>(s.gates() / s.hidden, p.units, s.hidden, s.batch);
    if (bytes <= limit) {
      mma = true;
      p.shared = bytes;
    }
  }
  // The input gates prefetched a step ahead, two batch x (the block's gate
  // rows) float buffers after the rest, where they fit (not with a
  // projection, whose kernel reads them in place).
  const size_t xg_offset = (p.shared + 15) / 16 * 16;
  const size_t xg_bytes = static_cast<size_t>(2 * s.batch * s.gates() / s.hidden * p.units) * 4;
  const bool prefetch = s.proj == 0 && xg_offset + xg_bytes <= limit;
  if (prefetch) p.shared = xg_offset + xg_bytes;
  Directions<PersistentArgs<T>> a{};
  for (int d = 0; d < count; ++d) {
    a.dir[d] = persistent_args<T>(s, steps, p.units, runs[d]);
    a.dir[d].cols = p.cols;
    a.dir[d].shared_h = p.buffers;
    a.dir[d].mma = mma;
    a.dir[d].xg_offset = prefetch ? static_cast<int64_t>(xg_offset) : 0;
  }
  return start_cluster(
      s.proj > 0 ? cluster_forward_kernel<T, true> : cluster_forward_kernel<T, false>, p,
      batch_sizes, steps, count, stream, a);
}

// One layer's forward recurrence for `count` directions in one launch, where
// SEQPACK_CUDA_KERNEL asks for one and it fits: "persistent" a cooperative
// grid's; "cluster" a cluster a direction, else (W_hh too large for one
// cluster) the cooperative grid's. False (nothing run) otherwise.
template <typename T>
bool try_one_launch(const Shape& s, const int64_t* batch_sizes, int64_t steps,
                    const ForwardRun<T>* runs, int count, cudaStream_t stream) {
  if (persistent_requested()) return try_persistent<T>(s, batch_sizes, steps, runs, count, stream);
  return cluster_requested() && (try_cluster<T>(s, batch_sizes, steps, runs, count, stream) ||
                                 try_persistent<T>(s, batch_sizes, steps, runs, count, stream));
}

// One layer and direction's backward recurrence: what a one-launch kernel
// reads and writes (the carries hold dh_n, dc_n when it starts and dh0, dc0
// when it ends).
struct BackwardRun {
  bool reverse = false;
  const void* w_hh = nullptr;
  const void* w_hr = nullptr;
  const Saved* sv = nullptr;
  Workspace ws{};
  const float* dy = nullptr;  // the direction's first column of row 0 of dY
  float* dgx = nullptr;
  float* dgh = nullptr;
  float* dh = nullptr;  // with a projection: rows x P, the gradient of h
};

// The arguments of both backward kernels (dG_h through global memory until
// the caller says otherwise).
template <typename T>
ClusterBackwardArgs<T> cluster_backward_args(const Shape& s, int64_t steps, int64_t units,
                                             const BackwardRun& r) {
  ClusterBackwardArgs<T> a{};
  a.mode = s.mode;
  a.reverse = r.reverse;
  a.steps = steps;
  a.batch = s.batch;
  a.batch_sizes = r.ws.batch_sizes;
  a.H = s.hidden;
  a.units = units;
  a.dy = r.dy;
  a.ldy = s.width();
  a.gates = r.sv->gates;
  a.c = r.sv->c;
  a.cprev = r.sv->cprev;
  a.ghn = r.sv->ghn;
  a.hprev = r.sv->hprev;
  a.dgx = r.dgx;
  a.dgh = r.dgh;
  a.dh_carry = r.ws.dh_carry;
  a.dc_carry = r.ws.dc_carry;
  a.w_hh = static_cast<const T*>(r.w_hh);
  a.P = s.hout();
  a.cols = s.hout();
  a.w_hr = static_cast<const T*>(r.w_hr);
  a.dh = r.dh;
  return a;
}

// The backward's cluster kernel for one layer's `count` directions, if it
// fits (as try_cluster: the same cluster size, W_hh's columns of each block's
// units and two batch x gates buffers of dG_h in its shared memory).
template <typename T>
bool try_cluster_backward(const Shape& s, const int64_t* batch_sizes, int64_t steps,
                          const BackwardRun* runs, int count, cudaStream_t stream) {
  ClusterPlan p =
      plan_cluster<T>(s, steps, true, static_cast<size_t>(2 * s.batch * s.gates()) * sizeof(float));
  if (!p.ok) return false;
  // 16-bit data, or float32 with TF32 allowed (3xTF32), with H a multiple of
  // 16 and dG_h gathered in shared memory: the carry's product on tensor cores
  // (dG_h rounded to T, float32 accumulation) where that layout fits
  // (SEQPACK_CUDA_CLUSTER_MMA=0: the threads' float32 products).
  bool mma = false;
  if ((sizeof(T) == 2 || s.tf32) && s.hidden % 16 == 0 && p.buffers && cluster_mma_allowed()) {
    DeviceLimits limits;
    const size_t bytes = cluster_backward_mma_shared_bytes<T>(s.gates(), p.units, s.batch);
    if (device_limits(&limits) == cudaSuccess &&
        bytes <= static_cast<size_t>(limits.shared_optin)) {
      mma = true;
      p.shared = bytes;
    }
  }
  Directions<ClusterBackwardArgs<T>> a{};
  for (int d = 0; d < count; ++d) {
    a.dir[d] = cluster_backward_args<T>(s, steps, p.units, runs[d]);
    a.dir[d].cols = p.cols;
    a.dir[d].shared_dg = p.buffers;
    a.dir[d].mma = mma;
  }
  return start_cluster(
      s.proj > 0 ? cluster_backward_kernel<T, true> : cluster_backward_kernel<T, false>, p,
      batch_sizes, steps, count, stream, a);
}

// The backward's kernel on a cooperative grid, for W_hh's columns too large
// for one cluster (as try_persistent for the forward): dG_h through global
// memory, the grid's barrier each step.
template <typename T>
bool try_persistent_backward(const Shape& s, const int64_t* batch_sizes, int64_t steps,
                             const BackwardRun* runs, int count, cudaStream_t stream) {
  return start_cooperative(
      s.proj > 0 ? persistent_backward_kernel<T, true> : persistent_backward_kernel<T, false>, s,
      true, sizeof(T), batch_sizes, steps, count, stream,
      [&](int64_t units, int d) { return cluster_backward_args<T>(s, steps, units, runs[d]); });
}

// One layer's backward recurrence for `count` directions in one launch (as
// try_one_launch: a cluster a direction, else a cooperative grid); false
// (nothing run) where none is requested or fits.
template <typename T>
bool try_one_launch_backward(const Shape& s, const int64_t* batch_sizes, int64_t steps,
                             const BackwardRun* runs, int count, cudaStream_t stream) {
  return (cluster_requested() &&
          try_cluster_backward<T>(s, batch_sizes, steps, runs, count, stream)) ||
         ((cluster_requested() || persistent_requested()) &&
          try_persistent_backward<T>(s, batch_sizes, steps, runs, count, stream));
}

// ---------------------------------------------------------------------------

template <typename T>
void forward(const Shape& s, const int64_t* batch_sizes, const std::vector<int64_t>& off,
             bool has_biases, const void* const* weights_v, const T* x, const T* h0, const T* c0,
             const T* mask, T* y, T* hn, T* cn, void* workspace, void* reserve,
             const CallerProducts& cp, cudaStream_t main_stream) {
  cudaStream_t const stream = main_stream;
  const int64_t steps = static_cast<int64_t>(off.size()) - 1;
  const int64_t n = s.rows, B = s.batch, H = s.hidden, P = s.hout(), G = s.gates(), W = s.width();
  const int64_t bs0 = steps > 0 ? batch_sizes[0] : 0;
  const auto* weights = reinterpret_cast<const T* const*>(weights_v);
  ReserveLayout<T> rs = layout_reserve<T>(s, reserve);
  // A layer's two directions run at once, the reverse one on a second stream:
  // they read the layer's input and write their own columns of its output,
  // reserve and workspace; the next layer starts after both.
  SideStream side(stream, s.dirs == 2);
  const T* input = x;
  for (int64_t l = 0; l < s.layers; ++l) {
    const int64_t in = s.in_width(l);
    if (l > 0) {
      const T* below = rs.layer_output[l - 1];
      if (mask != nullptr && n > 0) {
        launch(mask_kernel<T, T, T>, blocks_for(n * W), kThreads, stream, n * W, below,
               mask + (l - 1) * n * W, rs.dropped_input[l]);
        input = rs.dropped_input[l];
      } else {
        input = below;
      }
    }
    check_cuda(side.fork(), "the reverse direction's stream");
    T* out = l + 1 < s.layers ? rs.layer_output[l] : y;
    ForwardRun<T> runs[2];
    for (int64_t d = 0; d < s.dirs; ++d) {
      const int64_t ld_index = l * s.dirs + d;
      ForwardRun<T>& r = runs[d];
      r.reverse = d == 1;
      r.w = weights_of(s, has_biases, weights, l, d);
      r.sv = &rs.saved[ld_index];
      r.ws = layout_workspace(s, workspace, d);
      r.h0 = h0 + ld_index * B * P;
      r.c0 = s.lstm() ? c0 + ld_index * B * H : nullptr;
      r.hn = hn + ld_index * B * P;
      r.cn = s.lstm() ? cn + ld_index * B * H : nullptr;
      r.y = out + d * P;
      cudaStream_t const stream = d == 1 ? side.stream() : main_stream;
      // Sequences of length zero keep their initial state.
      if (B > bs0) {
        convert(stream, B - bs0, P, r.h0 + bs0 * P, P, r.hn + bs0 * P, P);
        if (s.lstm()) convert(stream, B - bs0, H, r.c0 + bs0 * H, H, r.cn + bs0 * H, H);
      }
      // gates = input W_ih^T + b_ih for every row (the caller's, or here).
      if (cp.on)
        convert(stream, n, G, static_cast<const T*>(cp.input_gates[d]), G, r.sv->gates, G);
      else
        gemm<T, T, float>(stream, n, G, in, input, in, false, r.w.w_ih, in, true, r.w.b_ih,
                          r.sv->gates, G, false);
    }
    // The recurrence: both directions in one launch where SEQPACK_CUDA_KERNEL
    // asks for a one-launch kernel and it fits (after both directions' gates),
    // else such a launch a direction, else the per-step kernels.
    bool both = false;
    if (s.dirs == 2 && (persistent_requested() || cluster_requested())) {
      check_cuda(side.join(), "the reverse direction's stream");
      both = try_one_launch<T>(s, batch_sizes, steps, runs, 2, main_stream);
      if (!both) check_cuda(side.fork(), "the reverse direction's stream");
    }
    for (int64_t d = 0; !both && d < s.dirs; ++d) {
      const ForwardRun<T>& r = runs[d];
      const LayerWeights<const T*>& w = r.w;
      const Saved& sv = *r.sv;
      const Workspace& ws = r.ws;
      cudaStream_t const stream = d == 1 ? side.stream() : main_stream;
      if (try_one_launch<T>(s, batch_sizes, steps, &r, 1, stream)) continue;
      for (int64_t k = 0; k < steps; ++k) {
        const bool reverse = d == 1;
        const int64_t t = reverse ? steps - 1 - k : k;
        const int64_t bs = batch_sizes[t];
        const int64_t r0 = off[t];
        // The rows that continue a previous step, and where that step's rows begin.
        int64_t prev_rows = 0, prev_off = 0;
        if (!reverse && t > 0) {
          prev_rows = bs;
          prev_off = off[t - 1];
        } else if (reverse && t + 1 < steps) {
          prev_rows = batch_sizes[t + 1];
          prev_off = off[t + 1];
        }
        launch(gather_prev_kernel<T>, blocks_for(bs * std::max(P, H)), kThreads, stream, bs, P, H,
               prev_rows, r.y + prev_off * W, W, r.h0, sv.hprev + r0 * P,
               s.lstm() ? sv.c + prev_off * H : nullptr, r.c0,
               s.lstm() ? sv.cprev + r0 * H : nullptr);
        // gh = h_{t-1} W_hh^T for the step's rows.
        gemm<float, T, float>(stream, bs, G, P, sv.hprev + r0 * P, P, false, w.w_hh, P, true,
                              nullptr, ws.gh, G, false);
        float* gates = sv.gates + r0 * G;
        T* y_t = r.y + r0 * W;
        if (s.lstm()) {
          launch(lstm_forward_kernel<T>, blocks_for(bs * H), kThreads, stream, bs, H, gates, ws.gh,
                 w.b_hh, sv.cprev + r0 * H, sv.c + r0 * H, s.proj > 0 ? sv.m + r0 * H : nullptr,
                 y_t, W);
          if (s.proj > 0)  // h = m W_hr^T
            gemm<float, T, T>(stream, bs, P, H, sv.m + r0 * H, H, false, w.w_hr, H, true, nullptr,
                              y_t, W, false);
        } else if (s.gru()) {
          launch(gru_forward_kernel<T>, blocks_for(bs * H), kThreads, stream, bs, H, gates, ws.gh,
                 w.b_hh, sv.hprev + r0 * P, sv.ghn + r0 * H, y_t, W);
        } else {
          launch(rnn_forward_kernel<T>, blocks_for(bs * H), kThreads, stream, bs, H,
                 s.mode == SEQPACK_CUDA_RNN_RELU, gates, ws.gh, w.b_hh, y_t, W);
        }
        // Rows whose sequence ends here: forward, those beyond the next
        // step's batch; reverse, every row at t = 0.
        const int64_t lo = reverse ? (t == 0 ? 0 : bs) : (t + 1 < steps ? batch_sizes[t + 1] : 0);
        if (lo < bs)
          launch(finish_kernel<T>, blocks_for((bs - lo) * std::max(P, H)), kThreads, stream, lo, bs,
                 P, H, y_t, W, r.hn, s.lstm() ? sv.c + r0 * H : nullptr, r.cn);
      }
    }
    check_cuda(side.join(), "the reverse direction's stream");
  }
}

template <typename T>
void backward(const Shape& s, const int64_t* batch_sizes, const std::vector<int64_t>& off,
              bool has_biases, const void* const* weights_v, const T* x, const T* mask, const T* dy,
              const T* dhn, const T* dcn, T* dx, T* dh0, T* dc0, void* const* dweights_v,
              void* workspace, const void* reserve, const CallerProducts& cp,
              cudaStream_t main_stream) {
  cudaStream_t const stream = main_stream;
  const int64_t steps = static_cast<int64_t>(off.size()) - 1;
  const int64_t n = s.rows, B = s.batch, H = s.hidden, P = s.hout(), G = s.gates(), W = s.width();
  const auto* weights = reinterpret_cast<const T* const*>(weights_v);
  auto* dweights = reinterpret_cast<T* const*>(dweights_v);
  ReserveLayout<T> rs = layout_reserve<T>(s, const_cast<void*>(reserve));
  const Workspace shared = layout_workspace(s, workspace);
  // dY of the current layer (float32, rows x W).
  float* dY = shared.dy[0];
  float* dX = shared.dy[1];
  if (dy != nullptr)
    convert(stream, n, W, dy, W, dY, W);
  else
    zero(stream, n * W, dY);
  for (int64_t l = s.layers - 1; l >= 0; --l) {
    const int64_t in = s.in_width(l);
    const T* input = l == 0 ? x : (mask != nullptr ? rs.dropped_input[l] : rs.layer_output[l - 1]);
    // One layer's two directions run at once where the caller runs the
    // products (nothing of the directions' own follows), the reverse one on a
    // second stream; they read dY and write their own buffers.
    SideStream side(main_stream, cp.on && s.dirs == 2);
    check_cuda(side.fork(), "the reverse direction's stream");
    // Each direction's recurrence: its buffers (the caller's take the
    // gradients they read: caller_products), and the carries, which start as
    // the gradients of h_n, c_n (rows of every sequence are untouched until
    // its last step).
    BackwardRun runs[2];
    for (int64_t d = 0; d < s.dirs; ++d) {
      const int64_t ld_index = l * s.dirs + d;
      BackwardRun& r = runs[d];
      r.reverse = d == 1;
      const LayerWeights<const T*> w = weights_of(s, has_biases, weights, l, d);
      r.w_hh = w.w_hh;
      r.w_hr = w.w_hr;
      r.sv = &rs.saved[ld_index];
      r.ws = layout_workspace(s, workspace, d);
      r.dy = dY + d * P;
      r.dgx = cp.on ? cp.dgates_x[d] : r.ws.dgx;
      r.dgh = cp.on ? (s.gru() ? cp.dgates_h[d] : r.dgx) : r.ws.dgh;
      r.dh = cp.on && s.proj > 0 ? cp.dh[d] : r.ws.dh;
      cudaStream_t const stream = d == 1 ? side.stream() : main_stream;
      if (dhn != nullptr)
        convert(stream, B, P, dhn + ld_index * B * P, P, r.ws.dh_carry, P);
      else
        zero(stream, B * P, r.ws.dh_carry);
      if (s.lstm()) {
        if (dcn != nullptr)
          convert(stream, B, H, dcn + ld_index * B * H, H, r.ws.dc_carry, H);
        else
          zero(stream, B * H, r.ws.dc_carry);
      }
    }
    // The recurrence in one launch (a cluster's, else a cooperative grid's)
    // where SEQPACK_CUDA_KERNEL asks for it: both directions in one where
    // their buffers are apart (the caller's products), else one a direction;
    // else the per-step kernels.
    bool both = false;
    if (cp.on && s.dirs == 2 && (persistent_requested() || cluster_requested())) {
      check_cuda(side.join(), "the reverse direction's stream");
      both = try_one_launch_backward<T>(s, batch_sizes, steps, runs, 2, main_stream);
      check_cuda(side.fork(), "the reverse direction's stream");
    }
    for (int64_t d = 0; d < s.dirs; ++d) {
      const int64_t ld_index = l * s.dirs + d;
      const BackwardRun& r = runs[d];
      const Workspace& ws = r.ws;
      cudaStream_t const stream = d == 1 ? side.stream() : main_stream;
      const LayerWeights<const T*> w = weights_of(s, has_biases, weights, l, d);
      const LayerWeights<T*> dw =
          cp.on ? LayerWeights<T*>{} : weights_of(s, has_biases, dweights, l, d);
      float* const dgx_all = r.dgx;
      float* const dgh_all = r.dgh;
      float* const dh_all = r.dh;
      const Saved& sv = *r.sv;
      const bool clustered =
          both || try_one_launch_backward<T>(s, batch_sizes, steps, &r, 1, stream);
      for (int64_t k = 0; !clustered && k < steps; ++k) {
        const bool reverse = d == 1;
        // The opposite order of the forward pass.
        const int64_t t = reverse ? k : steps - 1 - k;
        const int64_t bs = batch_sizes[t];
        const int64_t r0 = off[t];
        float* dh = dh_all + r0 * P;
        launch(dh_total_kernel, blocks_for(bs * P), kThreads, stream, bs, P, dY + r0 * W + d * P, W,
               ws.dh_carry, dh);
        const float* dm = dh;
        int64_t ldm = P;
        if (s.proj > 0) {  // dm = dh W_hr
          gemm<float, T, float>(stream, bs, H, P, dh, P, false, w.w_hr, H, false, nullptr, ws.dm, H,
                                false);
          dm = ws.dm;
          ldm = H;
        }
        float* dgx = dgx_all + r0 * G;
        float* dgh = dgh_all + r0 * G;
        if (s.lstm()) {
          launch(lstm_backward_kernel, blocks_for(bs * H), kThreads, stream, bs, H,
                 sv.gates + r0 * G, sv.c + r0 * H, sv.cprev + r0 * H, dm, ldm, ws.dc_carry, dgx);
        } else if (s.gru()) {
          launch(gru_backward_kernel, blocks_for(bs * H), kThreads, stream, bs, H,
                 sv.gates + r0 * G, sv.ghn + r0 * H, sv.hprev + r0 * P, dh, dgx, dgh, ws.dh_carry);
        } else {
          launch(rnn_backward_kernel, blocks_for(bs * H), kThreads, stream, bs, H,
                 s.mode == SEQPACK_CUDA_RNN_RELU, sv.gates + r0 * G, dh, dgx);
        }
        // dh_{t-1} (+)= dG_h W_hh; the GRU's kernel wrote its direct part dh z.
        gemm<float, T, float>(stream, bs, P, G, dgh, G, false, w.w_hh, P, false, nullptr,
                              ws.dh_carry, P, s.gru());
      }
      // Gradients of the initial state: what the carries hold now.
      convert(stream, B, P, ws.dh_carry, P, dh0 + ld_index * B * P, P);
      if (s.lstm()) convert(stream, B, H, ws.dc_carry, H, dc0 + ld_index * B * H, H);
      if (cp.on) {  // what the caller's products read besides the gradients
        convert(stream, n, P, sv.hprev, P, cp.hprev[d], P);
        if (s.proj > 0) convert(stream, n, H, sv.m, H, cp.m[d], H);
        continue;
      }
      // Weight gradients over all rows.
      gemm<float, T, T>(stream, G, in, n, ws.dgx, G, true, input, in, false, nullptr, dw.w_ih, in,
                        false);
      gemm<float, float, T>(stream, G, P, n, ws.dgh, G, true, sv.hprev, P, false, nullptr, dw.w_hh,
                            P, false);
      if (has_biases) {
        column_sum(stream, n, G, ws.dgx, G, dw.b_ih);
        column_sum(stream, n, G, ws.dgh, G, dw.b_hh);
      }
      if (s.proj > 0)
        gemm<float, float, T>(stream, P, H, n, ws.dh, P, true, sv.m, H, false, nullptr, dw.w_hr, H,
                              false);
      // dX (+)= dG_x W_ih, both directions summed.
      gemm<float, T, float>(stream, n, in, G, ws.dgx, G, false, w.w_ih, in, false, nullptr, dX, in,
                            d > 0);
    }
    check_cuda(side.join(), "the reverse direction's stream");
    if (cp.on) break;  // one layer; dx is the caller's
    if (l > 0) {
      if (mask != nullptr && n > 0)
        launch(mask_kernel<float, T, float>, blocks_for(n * W), kThreads, stream, n * W, dX,
               mask + (l - 1) * n * W, dX);
      std::swap(dY, dX);
    } else {
      convert(stream, n, in, dX, in, dx, in);
    }
  }
}

void check_kernel_choice() {
  const char* choice = std::getenv("SEQPACK_CUDA_KERNEL");
  const char* gemm = std::getenv("SEQPACK_CUDA_GEMM");
  if (gemm != nullptr && gemm[0] != '\0' && std::strcmp(gemm, "simt") != 0 &&
      std::strcmp(gemm, "wmma") != 0)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT,
         "seqpack_cuda: SEQPACK_CUDA_GEMM = '%s' is not 'simt' or 'wmma'", gemm);
  if (choice != nullptr && choice[0] != '\0' && std::strcmp(choice, "simple") != 0 &&
      std::strcmp(choice, "persistent") != 0 && std::strcmp(choice, "cluster") != 0)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT,
         "seqpack_cuda: SEQPACK_CUDA_KERNEL = '%s' is not 'simple', 'persistent' or 'cluster'",
         choice);
}

template <typename F>
int guarded(F&& body) {
  try {
    g_last_error.clear();
    body();
    return SEQPACK_CUDA_OK;
  } catch (const Failure& f) {
    return f.status;
  } catch (const std::exception& e) {
    g_last_error = std::string("seqpack_cuda: ") + e.what();
    return SEQPACK_CUDA_RUNTIME_ERROR;
  }
}

}  // namespace
}  // namespace seqpack::cuda

using namespace seqpack::cuda;

// The library is built with hidden visibility; these are its whole interface.
#define SEQPACK_CUDA_EXPORT __attribute__((visibility("default")))

extern "C" {

SEQPACK_CUDA_EXPORT int seqpack_cuda_abi_version(void) { return SEQPACK_CUDA_ABI_VERSION; }

SEQPACK_CUDA_EXPORT const char* seqpack_cuda_last_error(void) { return g_last_error.c_str(); }

SEQPACK_CUDA_EXPORT int seqpack_cuda_rnn_buffer_sizes(int mode, int dtype, int64_t rows,
                                                      int64_t batch, int64_t input_size,
                                                      int64_t hidden_size, int64_t proj_size,
                                                      int64_t num_layers, int bidirectional,
                                                      size_t* workspace_bytes,
                                                      size_t* reserve_bytes) {
  return guarded([&] {
    require(workspace_bytes, "workspace_bytes");
    require(reserve_bytes, "reserve_bytes");
    const Shape s = check_shape(mode, dtype, rows, batch, input_size, hidden_size, proj_size,
                                num_layers, bidirectional);
    *workspace_bytes = static_cast<size_t>(s.workspace_bytes());
    *reserve_bytes = static_cast<size_t>(s.reserve_bytes());
  });
}

SEQPACK_CUDA_EXPORT int seqpack_cuda_rnn_forward(const seqpack_cuda_rnn_args* args) {
  return guarded([&] {
    require(args, "args");
    const seqpack_cuda_rnn_args& a = *args;
    const int mode = a.mode, dtype = a.dtype, has_biases = a.has_biases;
    const auto* batch_sizes = a.batch_sizes;
    const void* const* weights = a.weights;
    const void *x = a.x, *h0 = a.h0, *c0 = a.c0, *dropout_mask = a.dropout_mask;
    void *y = a.y, *hn = a.hn, *cn = a.cn, *workspace = a.workspace, *reserve = a.reserve;
    check_kernel_choice();
    const std::vector<int64_t> off = check_batch_sizes(a.steps, batch_sizes, a.batch, a.rows);
    const Shape s =
        with_tf32(check_shape(mode, dtype, off.back(), a.batch, a.input_size, a.hidden_size,
                              a.proj_size, a.num_layers, a.bidirectional),
                  a.allow_tf32);
    check_weights(s, has_biases != 0, weights, "weights");
    check_buffers(s, a.workspace_bytes, workspace, a.reserve_bytes, reserve);
    const CallerProducts cp = caller_products(s, a, false);
    if (s.rows > 0) {
      if (!cp.on) require(x, "x");
      require(y, "y");
    }
    if (s.batch > 0) {
      require(h0, "h0");
      require(hn, "hn");
      if (s.lstm()) {
        require(c0, "c0");
        require(cn, "cn");
      }
    }
    auto st = static_cast<cudaStream_t>(a.stream);
    (void)cudaGetLastError();  // clears a launch error left by others, not ours to report
    switch (dtype) {
      case SEQPACK_CUDA_FLOAT32:
        forward<float>(s, batch_sizes, off, has_biases != 0, weights, static_cast<const float*>(x),
                       static_cast<const float*>(h0), static_cast<const float*>(c0),
                       static_cast<const float*>(dropout_mask), static_cast<float*>(y),
                       static_cast<float*>(hn), static_cast<float*>(cn), workspace, reserve, cp,
                       st);
        break;
      case SEQPACK_CUDA_FLOAT16:
        forward<__half>(s, batch_sizes, off, has_biases != 0, weights,
                        static_cast<const __half*>(x), static_cast<const __half*>(h0),
                        static_cast<const __half*>(c0), static_cast<const __half*>(dropout_mask),
                        static_cast<__half*>(y), static_cast<__half*>(hn), static_cast<__half*>(cn),
                        workspace, reserve, cp, st);
        break;
      default:
        forward<__nv_bfloat16>(
            s, batch_sizes, off, has_biases != 0, weights, static_cast<const __nv_bfloat16*>(x),
            static_cast<const __nv_bfloat16*>(h0), static_cast<const __nv_bfloat16*>(c0),
            static_cast<const __nv_bfloat16*>(dropout_mask), static_cast<__nv_bfloat16*>(y),
            static_cast<__nv_bfloat16*>(hn), static_cast<__nv_bfloat16*>(cn), workspace, reserve,
            cp, st);
        break;
    }
    check_cuda(cudaGetLastError(), "a kernel launch of the forward pass");
  });
}

SEQPACK_CUDA_EXPORT int seqpack_cuda_rnn_backward(const seqpack_cuda_rnn_args* args) {
  // h0 and c0 are not read (the reserve holds every row's h_{t-1} and
  // c_{t-1}).
  return guarded([&] {
    require(args, "args");
    const seqpack_cuda_rnn_args& a = *args;
    const int mode = a.mode, dtype = a.dtype, has_biases = a.has_biases;
    const auto* batch_sizes = a.batch_sizes;
    const void* const* weights = a.weights;
    void* const* dweights = a.dweights;
    const void *x = a.x, *dropout_mask = a.dropout_mask, *dy = a.dy, *dhn = a.dhn, *dcn = a.dcn;
    const void* reserve = a.reserve;
    void *dx = a.dx, *dh0 = a.dh0, *dc0 = a.dc0, *workspace = a.workspace;
    check_kernel_choice();
    const std::vector<int64_t> off = check_batch_sizes(a.steps, batch_sizes, a.batch, a.rows);
    const Shape s =
        with_tf32(check_shape(mode, dtype, off.back(), a.batch, a.input_size, a.hidden_size,
                              a.proj_size, a.num_layers, a.bidirectional),
                  a.allow_tf32);
    check_weights(s, has_biases != 0, weights, "weights");
    const CallerProducts cp = caller_products(s, a, true);
    if (!cp.on) check_weights(s, has_biases != 0, dweights, "dweights");
    check_buffers(s, a.workspace_bytes, workspace, a.reserve_bytes, reserve);
    if (s.rows > 0 && !cp.on) {
      require(x, "x");
      require(dx, "dx");
    }
    if (s.batch > 0) {
      require(dh0, "dh0");
      if (s.lstm()) require(dc0, "dc0");
    }
    auto st = static_cast<cudaStream_t>(a.stream);
    (void)cudaGetLastError();  // clears a launch error left by others, not ours to report
    switch (dtype) {
      case SEQPACK_CUDA_FLOAT32:
        backward<float>(s, batch_sizes, off, has_biases != 0, weights, static_cast<const float*>(x),
                        static_cast<const float*>(dropout_mask), static_cast<const float*>(dy),
                        static_cast<const float*>(dhn), static_cast<const float*>(dcn),
                        static_cast<float*>(dx), static_cast<float*>(dh0), static_cast<float*>(dc0),
                        dweights, workspace, reserve, cp, st);
        break;
      case SEQPACK_CUDA_FLOAT16:
        backward<__half>(s, batch_sizes, off, has_biases != 0, weights,
                         static_cast<const __half*>(x), static_cast<const __half*>(dropout_mask),
                         static_cast<const __half*>(dy), static_cast<const __half*>(dhn),
                         static_cast<const __half*>(dcn), static_cast<__half*>(dx),
                         static_cast<__half*>(dh0), static_cast<__half*>(dc0), dweights, workspace,
                         reserve, cp, st);
        break;
      default:
        backward<__nv_bfloat16>(
            s, batch_sizes, off, has_biases != 0, weights, static_cast<const __nv_bfloat16*>(x),
            static_cast<const __nv_bfloat16*>(dropout_mask), static_cast<const __nv_bfloat16*>(dy),
            static_cast<const __nv_bfloat16*>(dhn), static_cast<const __nv_bfloat16*>(dcn),
            static_cast<__nv_bfloat16*>(dx), static_cast<__nv_bfloat16*>(dh0),
            static_cast<__nv_bfloat16*>(dc0), dweights, workspace, reserve, cp, st);
        break;
    }
    check_cuda(cudaGetLastError(), "a kernel launch of the backward pass");
  });
}

#ifdef SEQPACK_CUDA_EMULATE
// The emulated library only (tests): the one-launch kernels' launches since
// the last call, as (grid blocks, cluster blocks; 0 for a cooperative grid)
// pairs in blocks[0..2n) for the first n <= capacity of them; returns how many
// there were, and forgets them.
SEQPACK_CUDA_EXPORT int seqpack_cuda_emulated_grid_launches(unsigned* blocks, int capacity) {
  std::vector<GridLaunch>& launches = grid_launches();
  const int n = static_cast<int>(launches.size());
  for (int i = 0; i < n && i < capacity; ++i) {
    blocks[2 * i] = launches[i].blocks;
    blocks[2 * i + 1] = launches[i].cluster;
  }
  launches.clear();
  return n;
}
#endif

}  // extern "C"
