// The checks of a call's arguments (checks.cuh).
#include "checks.cuh"

#include <cstdarg>
#include <cstdio>

namespace seqpack::cuda {

thread_local std::string g_last_error;

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

namespace {

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

}  // namespace

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

// are rows), NULL elsewhere: a buffer given that the pass would neither read
// nor write is an error, never ignored.
namespace {

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

}  // namespace

Shape with_tf32(Shape s, int allow_tf32) {
  if (allow_tf32 != 0 && allow_tf32 != 1)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT, "seqpack_cuda: allow_tf32 = %d is not 0 or 1", allow_tf32);
  s.tf32 = allow_tf32 == 1 && s.policy.tf32 == 1;
  return s;
}

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

}  // namespace seqpack::cuda
