// The library the CUDA kernels call (libseqpack_cuda.so, include/seqpack/cuda.h):
// found, loaded once per process with the SEQPACK_CUDA_* variables' policy
// installed, and its errors (cuda_library.cpp). Private to seqpack_torch.
#pragma once

#include <string>

#include "seqpack/cuda.h"

namespace seqpack::torch_cuda {

// The C interface's functions, bound by name.
struct Library {
  std::string path;
  int (*abi_version)() = nullptr;
  const char* (*last_error)() = nullptr;
  int (*buffer_sizes)(int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int,
                      size_t*, size_t*) = nullptr;
  int (*forward)(const seqpack_cuda_rnn_args*) = nullptr;
  int (*backward)(const seqpack_cuda_rnn_args*) = nullptr;
  int (*set_policy)(const seqpack_cuda_policy*) = nullptr;
  int (*get_policy)(seqpack_cuda_policy*) = nullptr;
};

// The library: the one seqpack::_cuda_library loaded, else the one found
// (cuda_ops.h); loaded at the first call. An error names it and why.
const Library& library();

// Raises the library's error message where `status` is not SEQPACK_CUDA_OK.
void check(const Library& lib, int status);

}  // namespace seqpack::torch_cuda
