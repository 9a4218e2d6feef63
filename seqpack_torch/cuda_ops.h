// The CUDA kernels of seqpack's recurrent operators (seqpack::rnn and
// seqpack::rnn_padded on CUDA tensors), in C++ over libseqpack_cuda's C
// header (include/seqpack/cuda.h), so that eager Python, TorchScript and
// LibTorch programs reach seqpack's GPU recurrence through the same operator
// as on the CPU, with autograd, and without Python in the call.
//
// Per layer: torch's input projection (at::linear, one per direction: cuBLAS
// on the GPU), then the library's recurrence (caller_products = 1); the
// backward runs the library's recurrence per layer from the top and the
// weight gradients, bias sums and dX as torch products. One saved byte buffer
// holds every layer's reserve and the outputs of the layers below the last.
// Dropout between layers multiplies by a mask drawn with torch's generator of
// the data's device (seeded by `seed` where given). The semantics are those
// of the CPU kernels: states in the caller's batch order, zero-length
// sequences keep their h0/c0, precision "fp32" and "auto" run in the data's
// dtype (float32, bfloat16, float16), any other is refused by name.
//
// Nothing here includes a CUDA header: the kernels get the current stream
// through a Backend. cuda_register.cpp registers them for the CUDA and
// AutogradCUDA keys where torch is a CUDA build; the tests register the same
// kernels for CPU tensors under another namespace (cuda_emulated_ops.cpp) and
// run them against the CUDA code compiled for the CPU (cuda/emulate/).
//
// The library: the one given to seqpack::_cuda_library (seqpack.torch passes
// the one its glue found), else SEQPACK_CUDA_LIBRARY, else libseqpack_cuda.so
// beside the library holding these kernels or in its build tree (where the
// glue looks), else the loader's search; one per process.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <string>
#include <tuple>

#include "seqpack/cuda.h"

namespace seqpack::torch_cuda {

using at::Tensor;
using OptTensor = c10::optional<at::Tensor>;

// What differs between the registrations: the namespace of the operators
// (rnn_padded calls that namespace's rnn) and the stream the library runs on.
struct Backend {
  const char* ns;
  void* (*stream)(const at::Device& device);  // a cudaStream_t (nullptr: the legacy default)
};

// seqpack::rnn's kernels: below autograd (`record` false: the CUDA key) and
// the autograd kernel (`record` true), which records a node where a gradient
// is wanted.
std::tuple<Tensor, Tensor, Tensor> rnn(const Backend& backend, bool record, const Tensor& data,
                                       const Tensor& batch_sizes, const OptTensor& sorted_indices,
                                       const OptTensor& unsorted_indices, const OptTensor& h0,
                                       const OptTensor& c0, at::TensorList weights,
                                       c10::string_view mode, int64_t hidden_size,
                                       int64_t num_layers, bool bias, bool bidirectional,
                                       int64_t proj_size, double dropout, bool train,
                                       c10::optional<int64_t> seed, c10::string_view precision);

// seqpack::rnn_padded's kernel for both keys: input with lengths is packed
// (one gather), run through the backend's rnn and padded back to its own
// length (one scatter); without lengths it is a batch of equal lengths. Made
// of differentiable operators, so autograd records it through them.
std::tuple<Tensor, Tensor, Tensor> rnn_padded(
    const Backend& backend, const Tensor& input, const OptTensor& lengths, const OptTensor& h0,
    const OptTensor& c0, at::TensorList weights, c10::string_view mode, int64_t hidden_size,
    int64_t num_layers, bool bias, bool batch_first, bool bidirectional, int64_t proj_size,
    double dropout, bool train, c10::optional<int64_t> seed, c10::string_view precision);

// seqpack::_cuda_library's kernel (schemas.h).
std::string use_library(c10::string_view path);

// The library's policy (seqpack_cuda_policy) that the SEQPACK_CUDA_* variables
// ask for (docs/gpu-build.md), unset or empty ones the defaults; a value that
// means none is a ValueError naming the variable. Installed in the library
// when it is loaded; python/seqpack/_cuda.py's policy_from_environment reads
// the variables alike (test_cuda_cpp_ops.py compares the two).
seqpack_cuda_policy policy_from_environment();

// The kernels with the operators' signatures, for m.impl: Backend B's.
template <const Backend& B, bool Record>
std::tuple<Tensor, Tensor, Tensor> rnn_kernel(
    const Tensor& data, const Tensor& batch_sizes, const OptTensor& sorted_indices,
    const OptTensor& unsorted_indices, const OptTensor& h0, const OptTensor& c0,
    at::TensorList weights, c10::string_view mode, int64_t hidden_size, int64_t num_layers,
    bool bias, bool bidirectional, int64_t proj_size, double dropout, bool train,
    c10::optional<int64_t> seed, c10::string_view precision) {
  return rnn(B, Record, data, batch_sizes, sorted_indices, unsorted_indices, h0, c0, weights,
             mode, hidden_size, num_layers, bias, bidirectional, proj_size, dropout, train, seed,
             precision);
}

template <const Backend& B>
std::tuple<Tensor, Tensor, Tensor> rnn_padded_kernel(
    const Tensor& input, const OptTensor& lengths, const OptTensor& h0, const OptTensor& c0,
    at::TensorList weights, c10::string_view mode, int64_t hidden_size, int64_t num_layers,
    bool bias, bool batch_first, bool bidirectional, int64_t proj_size, double dropout, bool train,
    c10::optional<int64_t> seed, c10::string_view precision) {
  return rnn_padded(B, input, lengths, h0, c0, weights, mode, hidden_size, num_layers, bias,
                    batch_first, bidirectional, proj_size, dropout, train, seed, precision);
}

}  // namespace seqpack::torch_cuda
