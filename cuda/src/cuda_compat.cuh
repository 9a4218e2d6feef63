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
#include <cuda_pipeline.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <vector>

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
  extern __shared__ __align__(128) unsigned char seqpack_dynamic_shared[];
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

// Thread-block clusters (sm_90): the blocks in clusters of `cluster`
// consecutive blocks along x (more than 8 only where the GPU allows it: the
// non-portable size is asked for). Fails (nothing launched) where the GPU
// cannot run them so.
template <typename A>
cudaError_t launch_cluster(void (*kernel)(A), dim3 grid, dim3 block, unsigned cluster,
                           size_t shared_bytes, cudaStream_t stream, A arg) {
  if (cluster == 0 || grid.x % cluster != 0) return cudaErrorInvalidValue;
  const void* f = reinterpret_cast<const void*>(kernel);
  cudaError_t e = cudaSuccess;
  if (cluster > 8) e = cudaFuncSetAttribute(f, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (e == cudaSuccess && shared_bytes > 48 * 1024)
    e = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(shared_bytes));
  if (e != cudaSuccess) return e;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = cluster;
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, arg);
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
// The block's rank in its cluster, the cluster's blocks, the cluster's
// barrier, and a pointer into this block's shared memory mapped to the same
// place in block `rank` of the cluster (distributed shared memory).
__device__ __forceinline__ unsigned cluster_rank() {
  return cooperative_groups::this_cluster().block_rank();
}
__device__ __forceinline__ unsigned cluster_blocks() {
  return cooperative_groups::this_cluster().num_blocks();
}
__device__ __forceinline__ void cluster_sync() { cooperative_groups::this_cluster().sync(); }
template <typename T>
__device__ __forceinline__ T* peer_shared(T* local, unsigned rank) {
  return cooperative_groups::this_cluster().map_shared_rank(local, rank);
}
#else
// Below sm_90 there are no clusters: kernels that use them are never launched
// there (launch_cluster fails first), and trap if they are.
__device__ __forceinline__ unsigned cluster_rank() {
  __trap();
  return 0;
}
__device__ __forceinline__ unsigned cluster_blocks() {
  __trap();
  return 1;
}
__device__ __forceinline__ void cluster_sync() { __trap(); }
template <typename T>
__device__ __forceinline__ T* peer_shared(T* local, unsigned) {
  __trap();
  return local;
}
#endif

// A spin wait's pause.
__device__ __forceinline__ void spin_pause() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 700
  __nanosleep(32);
#endif
}

// Global memory read and written by several blocks while they run.
__device__ __forceinline__ unsigned atomic_add(unsigned* p, unsigned v) { return atomicAdd(p, v); }
__device__ __forceinline__ unsigned atomic_load(const unsigned* p) {
  return *reinterpret_cast<const volatile unsigned*>(p);
}
__device__ __forceinline__ void thread_fence() { __threadfence(); }

// Asynchronous copies of a float from global to shared memory (cp.async from
// sm_80; a plain copy before) in groups: commit closes the group of the
// thread's copies since the last, a wait returns once every group (all) or
// every group but the newest has landed. A thread waits for its own copies;
// a __syncthreads after makes them the block's.
__device__ __forceinline__ void copy_async(float* shared, const float* global) {
  __pipeline_memcpy_async(shared, global, sizeof(float));
}
__device__ __forceinline__ void copy_async_commit() { __pipeline_commit(); }
__device__ __forceinline__ void copy_async_wait_all() { __pipeline_wait_prior(0); }
__device__ __forceinline__ void copy_async_wait_all_but_newest() { __pipeline_wait_prior(1); }

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

// A second stream beside `stream`, for work independent of what `stream` runs
// meanwhile (a layer's reverse direction): fork() makes it start after what
// `stream` has queued so far, join() (or the destructor) makes `stream` wait
// for what it was given. Event-ordered, so it works under CUDA graph capture.
// One stream and two events per host thread and device, made at first use and
// kept (a thread's own: two threads never record each other's events). Where
// they cannot be made, or `wanted` is false, stream() is `stream` itself.
class SideStream {
 public:
  SideStream(cudaStream_t main, bool wanted) : main_(main) {
    if (!wanted) return;
    struct Entry {
      int device;
      cudaStream_t stream;
      cudaEvent_t fork, join;
    };
    thread_local std::vector<Entry> made;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    for (const Entry& e : made)
      if (e.device == device) {
        side_ = e.stream, fork_ = e.fork, join_ = e.join;
        return;
      }
    Entry e{device, nullptr, nullptr, nullptr};
    if (cudaStreamCreateWithFlags(&e.stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&e.fork, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&e.join, cudaEventDisableTiming) != cudaSuccess) {
      (void)cudaGetLastError();
      return;  // (what was made is left: a failure here is rare and small)
    }
    made.push_back(e);
    side_ = e.stream, fork_ = e.fork, join_ = e.join;
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  ~SideStream() { (void)join(); }

  cudaStream_t stream() const { return side_ ? side_ : main_; }

  cudaError_t fork() {
    if (!side_) return cudaSuccess;
    cudaError_t e = cudaEventRecord(fork_, main_);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(side_, fork_, 0);
    forked_ = e == cudaSuccess;
    return e;
  }
  cudaError_t join() {
    if (!forked_) return cudaSuccess;
    forked_ = false;
    cudaError_t e = cudaEventRecord(join_, side_);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(main_, join_, 0);
    return e;
  }

 private:
  cudaStream_t main_;
  cudaStream_t side_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  bool forked_ = false;
};

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
