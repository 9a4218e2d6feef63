// A CPU stand-in for the little of CUDA that libseqpack_cuda uses, for tests
// only: each block of a launch runs its threads as fibers on the calling
// thread (so that __syncthreads is a real barrier and `static` shared arrays
// are the block's), blocks one after another; "device" pointers are host
// pointers. float16 is
// GCC's _Float16, bfloat16 rounds to nearest even like __float2bfloat16_rn.
#pragma once

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
inline dim3 threadIdx;
inline dim3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;

inline void emulated_syncthreads();
inline void __syncthreads() { emulated_syncthreads(); }

using cudaStream_t = void*;
using cudaError_t = int;
constexpr cudaError_t cudaSuccess = 0;
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1 };
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                                   cudaStream_t) {
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
inline const char* cudaGetErrorString(cudaError_t) { return "no error"; }
inline const char* cudaGetErrorName(cudaError_t) { return "cudaSuccess"; }

struct __half {
  _Float16 v;
};
struct __nv_bfloat16 {
  uint16_t bits;
};
inline float __half2float(__half h) { return static_cast<float>(h.v); }
inline __half __float2half_rn(float f) { return __half{static_cast<_Float16>(f)}; }
inline float __bfloat162float(__nv_bfloat16 b) {
  const uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (no NaNs in tests)
  return __nv_bfloat16{static_cast<uint16_t>(u >> 16)};
}

inline float emulated_to_float(float v) { return v; }
inline float emulated_to_float(__half v) { return __half2float(v); }
inline float emulated_to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// wmma: every thread of a warp holds the whole 16 x 16 fragment and does the
// whole product (the semantics of the warp-wide operations, not their layout).
namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "only 16x16x16 is emulated");
  float x[16][16];
};
template <typename F>
void fill_fragment(F& f, float v) {
  for (auto& row : f.x)
    for (auto& e : row) e = v;
}
template <typename Use, typename T>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, row_major>& f, const T* p, unsigned ldm) {
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.x[r][c] = emulated_to_float(p[r * ldm + c]);
}
template <typename T>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, T, row_major>& a,
              const fragment<matrix_b, 16, 16, 16, T, row_major>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  float out[16][16];
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float s = c.x[i][j];
      for (int k = 0; k < 16; ++k) s += a.x[i][k] * b.x[k][j];
      out[i][j] = s;
    }
  std::memcpy(d.x, out, sizeof out);
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t) {
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) p[r * ldm + c] = f.x[r][c];
}
}  // namespace nvcuda::wmma

namespace seqpack::cuda {

// A block's threads run as fibers (ucontext) on the calling thread, one after
// another: __syncthreads switches back to the scheduler, which resumes each
// fiber in turn, so every thread reaches the barrier before any passes it.
// Stacks are kept between launches.
struct Fiber {
  ucontext_t context;
  std::vector<char> stack;
  dim3 index;
  dim3 block_index;
  unsigned char* shared = nullptr;  // its block's dynamic shared memory
  bool done = false;
};

struct FiberScheduler {
  ucontext_t main;
  std::vector<Fiber> fibers;
  Fiber* current = nullptr;
  std::function<void()> job;
};

inline FiberScheduler& scheduler() {
  static FiberScheduler s;
  return s;
}

inline void fiber_entry() {
  FiberScheduler& s = scheduler();
  s.job();
  s.current->done = true;
  // Returning resumes uc_link, the scheduler.
}

inline void syncthreads_fiber() {
  FiberScheduler& s = scheduler();
  swapcontext(&s.current->context, &s.main);
}

// Runs job on every thread of the given blocks, all at once (a cooperative
// launch: __syncthreads and grid_sync wait for every thread of the grid,
// which is a valid schedule for a block barrier too).
template <typename F>
void run_blocks(const std::vector<dim3>& blocks, dim3 block, size_t shared_bytes, F&& job) {
  FiberScheduler& s = scheduler();
  const unsigned per_block = block.x * block.y * block.z;
  const size_t threads = per_block * blocks.size();
  if (s.fibers.size() < threads) s.fibers.resize(threads);
  std::vector<std::vector<unsigned char>> shared(blocks.size(),
                                                 std::vector<unsigned char>(shared_bytes + 16));
  s.job = std::forward<F>(job);
  for (size_t i = 0; i < threads; ++i) {
    Fiber& f = s.fibers[i];
    const unsigned t = static_cast<unsigned>(i % per_block);
    if (f.stack.empty()) f.stack.resize(256 * 1024);
    f.done = false;
    f.index = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
    f.block_index = blocks[i / per_block];
    f.shared = shared[i / per_block].data();
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack.data();
    f.context.uc_stack.ss_size = f.stack.size();
    f.context.uc_link = &s.main;
    makecontext(&f.context, fiber_entry, 0);
  }
  for (bool running = true; running;) {
    running = false;
    for (size_t i = 0; i < threads; ++i) {
      Fiber& f = s.fibers[i];
      if (f.done) continue;
      s.current = &f;
      threadIdx = f.index;
      blockIdx = f.block_index;
      swapcontext(&s.main, &f.context);
      running = running || !f.done;
    }
  }
}

template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, cudaStream_t, Args... args) {
  gridDim = grid;
  blockDim = block;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx)
        run_blocks({dim3(bx, by, bz)}, block, 0, [&] { kernel(static_cast<KArgs>(args)...); });
}

template <typename T>
T* dynamic_shared() {
  return reinterpret_cast<T*>(scheduler().current->shared);
}

inline void grid_sync() { syncthreads_fiber(); }

template <typename A>
cudaError_t launch_cooperative(void (*kernel)(A), dim3 grid, dim3 block, size_t shared_bytes,
                               cudaStream_t, A arg) {
  gridDim = grid;
  blockDim = block;
  std::vector<dim3> blocks;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) blocks.emplace_back(bx, by, bz);
  run_blocks(blocks, block, shared_bytes, [&] { kernel(arg); });
  return cudaSuccess;
}

struct DeviceLimits {
  int multiprocessors = 0;
  int shared_optin = 0;
  bool cooperative = false;
};

// A small pretend GPU: 4 multiprocessors, 8 resident blocks each.
inline cudaError_t device_limits(DeviceLimits* out) {
  out->multiprocessors = 4;
  out->shared_optin = 227 * 1024;
  out->cooperative = true;
  return cudaSuccess;
}

template <typename A>
int blocks_per_multiprocessor(void (*)(A), int, size_t) {
  return 8;
}

}  // namespace seqpack::cuda

inline void emulated_syncthreads() { seqpack::cuda::syncthreads_fiber(); }
