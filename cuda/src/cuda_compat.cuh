// The CUDA headers and the kernel launch, or, with SEQPACK_CUDA_EMULATE (the
// CPU test build, cuda/emulate/), a stand-in that runs each block's threads as
// std::threads so that the library's kernels and host code can be checked on
// a machine without a GPU (python/tests/test_cuda_glue.py).
#pragma once

#ifdef SEQPACK_CUDA_EMULATE
#include "cuda_emulate.h"
#else
#include <cooperative_groups.h>
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

// The kernel's dynamic shared memory.
template <typename T>
__device__ __forceinline__ T* dynamic_shared() {
  extern __shared__ __align__(16) unsigned char seqpack_dynamic_shared[];
  return reinterpret_cast<T*>(seqpack_dynamic_shared);
}

// Every thread of a cooperative launch waits for all the others.
__device__ __forceinline__ void grid_sync() { cooperative_groups::this_grid().sync(); }

// A cooperative launch of a kernel with one parameter.
template <typename A>
cudaError_t launch_cooperative(void (*kernel)(A), dim3 grid, dim3 block, size_t shared_bytes,
                               cudaStream_t stream, A arg) {
  void* args[] = {&arg};
  return cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), grid, block, args,
                                     shared_bytes, stream);
}

struct DeviceLimits {
  int multiprocessors = 0;
  int shared_optin = 0;  // bytes of shared memory a block may ask for
  bool cooperative = false;
};

inline cudaError_t device_limits(DeviceLimits* out) {
  int device = 0, coop = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&out->multiprocessors, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&out->shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device);
  out->cooperative = coop != 0;
  return e;
}

// Blocks of `kernel` that fit on one multiprocessor with this much dynamic
// shared memory (0 when it cannot be launched so).
template <typename A>
int blocks_per_multiprocessor(void (*kernel)(A), int threads, size_t shared_bytes) {
  if (cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(shared_bytes)) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, reinterpret_cast<const void*>(kernel),
                                                    threads, shared_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return blocks;
}

}  // namespace seqpack::cuda
#endif
