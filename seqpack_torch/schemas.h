// The schemas of seqpack's recurrent operators, shared by their definition
// (ops.cpp: TORCH_LIBRARY(seqpack, m)) and the test library that runs the
// CUDA kernels on CPU tensors under another namespace (cuda_emulated_ops.cpp).
#pragma once

namespace seqpack::torch_ops {

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

// Which libseqpack_cuda.so the CUDA kernels call: the one at `path`, loaded
// now (an error names the path and why), or with an empty path the one they
// find (cuda_ops.h); returns the loaded library's path.
constexpr const char* kCudaLibrarySchema = "_cuda_library(str path=\"\") -> str";

}  // namespace seqpack::torch_ops
