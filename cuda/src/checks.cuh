// The checks of a call's arguments, each failure a message naming the
// offending value (seqpack_cuda_last_error), and the sizes they give (Shape).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_compat.cuh"
#include "policy.cuh"
#include "seqpack/cuda.h"

namespace seqpack::cuda {

// The calling thread's last error (seqpack_cuda_last_error).
extern thread_local std::string g_last_error;

// Thrown by fail(); every entry point (capi.cu) catches it.
struct Failure {
  int status;
};

// Sets g_last_error to the printf-formatted message and throws Failure{status}.
[[noreturn]] void fail(int status, const char* format, ...);

// fail()s with SEQPACK_CUDA_RUNTIME_ERROR naming `what` where `error` is one.
void check_cuda(cudaError_t error, const char* what);

// fail()s where p is NULL, naming it.
void require(const void* p, const char* name);

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
  bool tf32 = false;  // allow_tf32 and the policy's tf32: float32 step products may run on
                      // tensor cores (3xTF32)
  Policy policy = default_policy();  // the call's copy of the installed policy
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

Shape check_shape(int mode, int dtype, int64_t rows, int64_t batch, int64_t input_size,
                  int64_t hidden_size, int64_t proj_size, int64_t num_layers, int bidirectional);

// Checks batch_sizes (positive, non-increasing, first <= batch) and returns
// the row offset of each step (offsets[steps] = rows).
std::vector<int64_t> check_batch_sizes(int64_t steps, const int64_t* batch_sizes, int64_t batch,
                                       int64_t rows);

void check_buffers(const Shape& s, size_t workspace_bytes, const void* workspace,
                   size_t reserve_bytes, const void* reserve);

void check_weights(const Shape& s, bool has_biases, const void* const* weights, const char* name);

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

// The shape with the caller's allow_tf32 (checked) under the policy's tf32.
Shape with_tf32(Shape s, int allow_tf32);

// The caller_products fields a pass reads (the forward: input_gates) or
// writes (the backward: the others), checked; the other pass's are not read.
CallerProducts caller_products(const Shape& s, const seqpack_cuda_rnn_args& a, bool backward);

}  // namespace seqpack::cuda
