// The CUDA kernels of seqpack's recurrent operators (seqpack::rnn, rnn_padded,
// _rnn_train, _rnn_backward on CUDA tensors), in C++ over libseqpack_cuda's C
// header (include/seqpack/cuda.h): the one way eager Python, TorchScript,
// torch.compile and LibTorch programs reach seqpack's GPU recurrence, through
// the same operators as on the CPU, with autograd, without Python in the call.
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
// As on the CPU, the autograd kernel calls the operators below it through the
// dispatcher: rnn where no gradient is wanted, else _rnn_train (the forward,
// and the state its backward needs as a one-byte tensor on the data's device)
// and _rnn_backward, whose fake implementations (python/seqpack/_torch_ops.py)
// let torch.compile trace forward and backward. Its backward is first-order:
// differentiating its gradients raises, as cuDNN's does.
//
// The autograd kernel also chooses who runs the call (SEQPACK_CUDA_LAYERS, read
// once, or _cuda_layers): "seqpack" these kernels, "torch" torch's recurrent
// operators (torch_rnn.h), "auto" (the default) the faster of the two for the
// configuration, timed at its first call and remembered (cuda_choice.h).
//
// Nothing here includes a CUDA header: the kernels get the current stream
// through a Backend. cuda_register.cpp registers them for the CUDA and
// AutogradCUDA keys where torch is a CUDA build; the tests register the same
// kernels for CPU tensors under another namespace (cuda_emulated_ops.cpp) and
// run them against the CUDA code compiled for the CPU (cuda/emulate/).
//
// The library (cuda_library.h): the one given to seqpack::_cuda_library
// (seqpack.torch passes the one it found), else SEQPACK_CUDA_LIBRARY, else
// libseqpack_cuda.so beside the library holding these kernels or in its build
// tree, else the loader's search; one per process.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <string>
#include <tuple>
#include <vector>

#include "seqpack/cuda.h"

namespace seqpack::torch_cuda {

using at::Tensor;
using OptTensor = c10::optional<at::Tensor>;

// What differs between the registrations: the namespace of the operators
// (the autograd and padded kernels call that namespace's), the stream the
// library runs on, and how the choice waits for the device.
struct Backend {
  const char* ns;
  void* (*stream)(const at::Device& device);  // a cudaStream_t (nullptr: the legacy default)
  void (*synchronize)(const at::Device& device);
};

// seqpack::rnn's arguments, as its schema has them.
#define SEQPACK_RNN_PARAMS                                                                     \
  const Tensor &data, const Tensor &batch_sizes, const OptTensor &sorted_indices,              \
      const OptTensor &unsorted_indices, const OptTensor &h0, const OptTensor &c0,             \
      at::TensorList weights, c10::string_view mode, int64_t hidden_size, int64_t num_layers, \
      bool bias, bool bidirectional, int64_t proj_size, double dropout, bool train,            \
      c10::optional<int64_t> seed, c10::string_view precision
#define SEQPACK_RNN_ARGS                                                                 \
  data, batch_sizes, sorted_indices, unsorted_indices, h0, c0, weights, mode, hidden_size, \
      num_layers, bias, bidirectional, proj_size, dropout, train, seed, precision

using RnnResult = std::tuple<Tensor, Tensor, Tensor>;
using RnnTrainResult = std::tuple<Tensor, Tensor, Tensor, Tensor>;
using RnnBackwardResult = std::tuple<Tensor, Tensor, Tensor, std::vector<Tensor>>;

// The kernels of Backend `backend`'s operators: rnn below autograd (no
// graph), _rnn_train and _rnn_backward, and rnn's autograd kernel.
RnnResult rnn(const Backend& backend, SEQPACK_RNN_PARAMS);
RnnTrainResult rnn_train(const Backend& backend, SEQPACK_RNN_PARAMS);
RnnBackwardResult rnn_backward(const Backend& backend, const Tensor& saved,
                               const OptTensor& grad_output, const OptTensor& grad_h_n,
                               const OptTensor& grad_c_n, const Tensor& data, const OptTensor& h0,
                               const OptTensor& c0, at::TensorList weights, bool input_grad,
                               bool state_grad);
RnnResult rnn_autograd(const Backend& backend, SEQPACK_RNN_PARAMS);

// seqpack::rnn_padded's kernel for both keys: input with lengths is packed
// (one gather), run through the backend's rnn and padded back to its own
// length (one scatter); without lengths it is a batch of equal lengths. Made
// of differentiable operators, so autograd records it through them.
RnnResult rnn_padded(const Backend& backend, const Tensor& input, const OptTensor& lengths,
                     const OptTensor& h0, const OptTensor& c0, at::TensorList weights,
                     c10::string_view mode, int64_t hidden_size, int64_t num_layers, bool bias,
                     bool batch_first, bool bidirectional, int64_t proj_size, double dropout,
                     bool train, c10::optional<int64_t> seed, c10::string_view precision);

// seqpack::_cuda_library's kernel (schemas.h).
std::string use_library(c10::string_view path);

// seqpack::_cuda_layers: who runs the CUDA calls ("auto", "seqpack" or
// "torch"; "" leaves it, else it is set, the decisions made kept); returns the
// one in effect (SEQPACK_CUDA_LAYERS until set: unset or empty is "auto",
// another value a ValueError naming it).
std::string layers(c10::string_view mode);
// seqpack::_cuda_choice_times: the seconds the choice takes as the times of
// seqpack's and torch's calls instead of measuring them, at the decisions to
// come (the tests' timings; empty: measured); with `forget`, every decision
// made is forgotten.
void choice_times(at::ArrayRef<double> seconds, bool forget);
// seqpack::_cuda_last_choice: (who ran, why) of this thread's last CUDA call
// (empty strings before the first).
std::tuple<std::string, std::string> last_choice();

// The library's policy (seqpack_cuda_policy) that the SEQPACK_CUDA_* variables
// ask for (docs/gpu-build.md), unset or empty ones the defaults; a value that
// means none is a ValueError naming the variable. Installed in the library
// when it is loaded.
seqpack_cuda_policy policy_from_environment();
// seqpack::_cuda_install_policy: the variables' policy installed in the
// library (loaded first where it is not), for a program that changed them
// since; returns the library's policy, field by field in seqpack/cuda.h's order.
std::vector<int64_t> install_policy();
// A policy's fields in seqpack/cuda.h's order.
std::vector<int64_t> policy_fields(const seqpack_cuda_policy& p);

// The kernels with the operators' signatures, for m.impl: Backend B's.
template <const Backend& B>
RnnResult rnn_kernel(SEQPACK_RNN_PARAMS) {
  return rnn(B, SEQPACK_RNN_ARGS);
}
template <const Backend& B>
RnnTrainResult rnn_train_kernel(SEQPACK_RNN_PARAMS) {
  return rnn_train(B, SEQPACK_RNN_ARGS);
}
template <const Backend& B>
RnnResult rnn_autograd_kernel(SEQPACK_RNN_PARAMS) {
  return rnn_autograd(B, SEQPACK_RNN_ARGS);
}
template <const Backend& B>
RnnBackwardResult rnn_backward_kernel(const Tensor& saved, const OptTensor& grad_output,
                                      const OptTensor& grad_h_n, const OptTensor& grad_c_n,
                                      const Tensor& data, const OptTensor& h0, const OptTensor& c0,
                                      at::TensorList weights, bool input_grad, bool state_grad) {
  return rnn_backward(B, saved, grad_output, grad_h_n, grad_c_n, data, h0, c0, weights,
                      input_grad, state_grad);
}
template <const Backend& B>
RnnResult rnn_padded_kernel(const Tensor& input, const OptTensor& lengths, const OptTensor& h0,
                            const OptTensor& c0, at::TensorList weights, c10::string_view mode,
                            int64_t hidden_size, int64_t num_layers, bool bias, bool batch_first,
                            bool bidirectional, int64_t proj_size, double dropout, bool train,
                            c10::optional<int64_t> seed, c10::string_view precision) {
  return rnn_padded(B, input, lengths, h0, c0, weights, mode, hidden_size, num_layers, bias,
                    batch_first, bidirectional, proj_size, dropout, train, seed, precision);
}

// Registers Backend B's kernels in `m`: for the backend's key, and for its
// autograd key (cuda_register.cpp, cuda_emulated_ops.cpp).
#define SEQPACK_CUDA_KERNELS(m, B)                                         \
  m.impl("rnn", &::seqpack::torch_cuda::rnn_kernel<B>);                    \
  m.impl("_rnn_train", &::seqpack::torch_cuda::rnn_train_kernel<B>);       \
  m.impl("_rnn_backward", &::seqpack::torch_cuda::rnn_backward_kernel<B>); \
  m.impl("rnn_padded", &::seqpack::torch_cuda::rnn_padded_kernel<B>)
#define SEQPACK_CUDA_AUTOGRAD_KERNELS(m, B)                           \
  m.impl("rnn", &::seqpack::torch_cuda::rnn_autograd_kernel<B>);      \
  m.impl("rnn_padded", &::seqpack::torch_cuda::rnn_padded_kernel<B>)

}  // namespace seqpack::torch_cuda
