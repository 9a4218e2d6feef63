// The schemas of seqpack's recurrent operators, shared by their definition
// (ops.cpp: TORCH_LIBRARY(seqpack, m)), the CUDA kernels' standalone build
// (cuda_schemas_standalone.cpp) and the test library that runs the CUDA
// kernels on CPU tensors under another namespace (cuda_emulated_ops.cpp).
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace seqpack::torch_ops {

// What a recurrent call passes besides its differentiable tensors (the CPU
// and CUDA autograd kernels keep it for their forward and backward).
struct RNNArgs {
  at::Tensor batch_sizes;  // undefined for a nested call
  c10::optional<at::Tensor> sorted_indices, unsorted_indices;
  std::string mode;
  int64_t hidden_size, num_layers;
  bool bias, bidirectional;
  int64_t proj_size;
  double dropout;
  bool train;
  c10::optional<int64_t> seed;
  std::string precision;
  at::Tensor offsets;  // a nested call's (rnn_nested), else undefined
};

constexpr const char* kRnnSchema =
    "rnn(Tensor data, Tensor batch_sizes, Tensor? sorted_indices, Tensor? unsorted_indices, "
    "Tensor? h0, Tensor? c0, Tensor[] weights, str mode, int hidden_size, int num_layers, "
    "bool bias, bool bidirectional, int proj_size, float dropout, bool train, int? seed=None, "
    "str precision=\"fp32\") -> (Tensor output, Tensor h_n, Tensor c_n)";

constexpr const char* kRnnPaddedSchema =
    "rnn_padded(Tensor input, Tensor? lengths, Tensor? h0, Tensor? c0, Tensor[] weights, "
    "str mode, int hidden_size, int num_layers, bool bias, bool batch_first, "
    "bool bidirectional, int proj_size, float dropout, bool train, int? seed=None, "
    "str precision=\"fp32\") -> (Tensor output, Tensor h_n, Tensor c_n)";

// rnn, plus the state its backward needs (a one-byte uint8 tensor on the
// data's device whose storage holds it), and that backward: what the operators'
// autograd kernels call, so that torch.compile traces forward and backward.
constexpr const char* kRnnTrainSchema =
    "_rnn_train(Tensor data, Tensor batch_sizes, Tensor? sorted_indices, "
    "Tensor? unsorted_indices, Tensor? h0, Tensor? c0, Tensor[] weights, str mode, "
    "int hidden_size, int num_layers, bool bias, bool bidirectional, int proj_size, "
    "float dropout, bool train, int? seed=None, str precision=\"fp32\") -> "
    "(Tensor output, Tensor h_n, Tensor c_n, Tensor saved)";

constexpr const char* kRnnBackwardSchema =
    "_rnn_backward(Tensor saved, Tensor? grad_output, Tensor? grad_h_n, Tensor? grad_c_n, "
    "Tensor data, Tensor? h0, Tensor? c0, Tensor[] weights, bool input_grad, "
    "bool state_grad) -> (Tensor grad_input, Tensor grad_h0, Tensor grad_c0, "
    "Tensor[] grad_weights)";

// Which libseqpack_cuda.so the CUDA kernels call: the one at `path`, loaded
// now (an error names the path and why), or with an empty path the one they
// find (cuda_ops.h); returns the loaded library's path.
constexpr const char* kCudaLibrarySchema = "_cuda_library(str path=\"\") -> str";

// Who runs the CUDA kernels' calls, seqpack or torch, and how it is chosen;
// the library's policy installed again (cuda_ops.h: layers, choice_times,
// last_choice, install_policy).
constexpr const char* kCudaLayersSchema = "_cuda_layers(str mode=\"\") -> str";
constexpr const char* kCudaChoiceTimesSchema =
    "_cuda_choice_times(float[] seconds=[], bool forget=True) -> ()";
constexpr const char* kCudaLastChoiceSchema = "_cuda_last_choice() -> (str impl, str why)";
constexpr const char* kCudaInstallPolicySchema = "_cuda_install_policy() -> int[]";

// seqpack's operators that the CUDA kernels implement, and the functions of
// their library, defined in `m` (ops.cpp, cuda_emulated_ops.cpp,
// cuda_schemas_standalone.cpp).
#define SEQPACK_CUDA_SCHEMAS(m)                                                   \
  m.def(::seqpack::torch_ops::kRnnSchema);                                        \
  m.def(::seqpack::torch_ops::kRnnPaddedSchema);                                  \
  m.def(::seqpack::torch_ops::kRnnTrainSchema);                                   \
  m.def(::seqpack::torch_ops::kRnnBackwardSchema);                                \
  m.def(::seqpack::torch_ops::kCudaLibrarySchema, &::seqpack::torch_cuda::use_library)
#define SEQPACK_CUDA_PROCESS_SCHEMAS(m)                                                      \
  m.def(::seqpack::torch_ops::kCudaLayersSchema, &::seqpack::torch_cuda::layers);            \
  m.def(::seqpack::torch_ops::kCudaChoiceTimesSchema, &::seqpack::torch_cuda::choice_times); \
  m.def(::seqpack::torch_ops::kCudaLastChoiceSchema, &::seqpack::torch_cuda::last_choice);   \
  m.def(::seqpack::torch_ops::kCudaInstallPolicySchema, &::seqpack::torch_cuda::install_policy)

}  // namespace seqpack::torch_ops
