// The CUDA headers and the kernel launch, or, with SEQPACK_CUDA_EMULATE (the
// CPU test build, cuda/emulate/), a stand-in that runs each block's threads as
// std::threads so that the library's kernels and host code can be checked on
// a machine without a GPU (python/tests/test_cuda_glue.py).
#pragma once

#ifdef SEQPACK_CUDA_EMULATE
#include "cuda_emulate.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

namespace seqpack::cuda {

// kernel<<<grid, block, 0, stream>>>(args...), the arguments converted to the
// kernel's parameter types.
template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, cudaStream_t stream, Args... args) {
  // clang-format off
  kernel<<<grid, block, 0, stream>>>(static_cast<KArgs>(args)...);
  // clang-format on
}

}  // namespace seqpack::cuda
#endif
