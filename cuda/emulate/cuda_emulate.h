// A CPU stand-in for the little of CUDA that libseqpack_cuda uses, for tests
// only: each block of a launch runs its threads as fibers on the calling
// thread (so that __syncthreads is a real barrier and `static` shared arrays
// are the block's), blocks one after another; "device" pointers are host
// pointers. float16 is
// GCC's _Float16, bfloat16 rounds to nearest even like __float2bfloat16_rn.
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <type_traits>
#include <utility>
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

namespace seqpack::cuda {
// Streams: work runs when it is given, except between a SideStream's fork()
// and join(): then the side stream's work and every other stream's is queued,
// and join() runs the two queues alternately, one item of each in turn, as a
// GPU may interleave two streams, so that two streams' work sharing a buffer
// gives wrong results in the tests.
struct StreamQueues {
  bool open = false;
  std::vector<std::function<void()>> main, side;
};
inline StreamQueues& stream_queues() {
  thread_local StreamQueues queues;
  return queues;
}
inline cudaStream_t emulated_side_stream() {
  static char tag;
  return &tag;
}
inline void submit(cudaStream_t stream, std::function<void()> work) {
  StreamQueues& q = stream_queues();
  if (!q.open) {
    work();
    return;
  }
  (stream == emulated_side_stream() ? q.side : q.main).push_back(std::move(work));
}

class SideStream {
 public:
  SideStream(cudaStream_t main, bool wanted)
      : main_(main), side_(wanted ? emulated_side_stream() : nullptr) {}
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  ~SideStream() { (void)join(); }
  cudaStream_t stream() const { return side_ ? side_ : main_; }
  cudaError_t fork() {
    if (side_) stream_queues().open = forked_ = true;
    return cudaSuccess;
  }
  cudaError_t join() {
    if (!forked_) return cudaSuccess;
    forked_ = false;
    StreamQueues& q = stream_queues();
    q.open = false;
    std::vector<std::function<void()>> main = std::move(q.main), side = std::move(q.side);
    q.main.clear();
    q.side.clear();
    for (size_t i = 0; i < std::max(main.size(), side.size()); ++i) {
      if (i < main.size()) main[i]();
      if (i < side.size()) side[i]();
    }
    return cudaSuccess;
  }

 private:
  cudaStream_t main_, side_;
  bool forked_ = false;
};
}  // namespace seqpack::cuda

enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1 };
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                                   cudaStream_t stream) {
  seqpack::cuda::submit(stream, [=] { std::memcpy(dst, src, bytes); });
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

// wmma: every thread of a warp holds the whole fragment and does the whole
// product (the semantics of the warp-wide operations, not their layout):
// 16 x 16 x 16 for 16-bit operands, 16 x 16 x 8 for TF32's.
namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision {
struct tf32 {};
}  // namespace precision
enum layout_t { mem_row_major, mem_col_major };
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && (K == 16 || K == 8),
                "only 16x16x16 and 16x16x8 are emulated");
  static constexpr int rows = std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int cols = std::is_same_v<Use, matrix_a> ? K : N;
  static constexpr int num_elements = rows * cols;
  float x[num_elements];  // row-major
};
template <typename F>
void fill_fragment(F& f, float v) {
  for (auto& e : f.x) e = v;
}
// TF32 (8 bits of exponent, 10 of mantissa): __float_to_tf32 rounds to the
// nearest, ties away from zero (cvt.rna.tf32.f32); the tensor cores read
// only those bits of a float operand, the rest ignored (truncated).
inline float tf32_bits(float v, uint32_t add) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u = (u + add) & ~0x1fffu;
  std::memcpy(&v, &u, 4);
  return v;
}
inline float __float_to_tf32(float v) { return tf32_bits(v, 0x1000u); }
template <typename T>
float operand_value(float v) {
  return std::is_same_v<T, precision::tf32> ? tf32_bits(v, 0) : v;
}
// A fragment's element type in memory: T, or float for TF32.
template <typename T>
struct Stored {
  using type = T;
};
template <>
struct Stored<precision::tf32> {
  using type = float;
};
// CUDA's requirements of the operands (the GPU's result is undefined
// otherwise): a 256-bit aligned pointer, and ldm a multiple of 16 bytes.
// The emulation stops the process, naming the call.
inline void check_fragment_operand(const void* p, unsigned ldm, size_t element, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0 || (ldm * element) % 16 != 0) {
    std::fprintf(stderr,
                 "emulated wmma::%s: pointer %p is not 32-byte aligned or ldm %u is not a "
                 "multiple of 16 bytes\n",
                 what, p, ldm);
    std::abort();
  }
}
template <typename Use, int K, typename T>
void load_matrix_sync(fragment<Use, 16, 16, K, T, row_major>& f, const typename Stored<T>::type* p,
                      unsigned ldm) {
  using F = fragment<Use, 16, 16, K, T, row_major>;
  check_fragment_operand(p, ldm, sizeof(*p), "load_matrix_sync");
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c) f.x[r * F::cols + c] = emulated_to_float(p[r * ldm + c]);
}
template <int K, typename T>
void mma_sync(fragment<accumulator, 16, 16, K, float>& d,
              const fragment<matrix_a, 16, 16, K, T, row_major>& a,
              const fragment<matrix_b, 16, 16, K, T, row_major>& b,
              const fragment<accumulator, 16, 16, K, float>& c) {
  float out[256];
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float s = c.x[i * 16 + j];
      for (int k = 0; k < K; ++k)
        s += operand_value<T>(a.x[i * K + k]) * operand_value<T>(b.x[k * 16 + j]);
      out[i * 16 + j] = s;
    }
  std::memcpy(d.x, out, sizeof out);
}
template <int K>
void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, K, float>& f, unsigned ldm,
                       layout_t) {
  check_fragment_operand(p, ldm, sizeof(float), "store_matrix_sync");
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) p[r * ldm + c] = f.x[r * 16 + c];
}
}  // namespace nvcuda::wmma

namespace seqpack::cuda {

// A block's threads run as fibers (ucontext) on the calling thread, one after
// another. A barrier (__syncthreads, a cluster's, a cooperative grid's)
// counts the fibers that reached it and switches back to the scheduler until
// the last one has: every thread reaches it before any passes it, whatever
// the others did in between (spin waits that yield, other barriers). The
// scheduler resumes the unfinished fibers in rounds (run_blocks says which).
// Stacks are kept between launches.
struct Barrier {
  unsigned expected = 0, arrived = 0, generation = 0;
};

struct Fiber {
  ucontext_t context;
  std::vector<char> stack;
  dim3 index;
  dim3 block_index;
  unsigned char* shared = nullptr;  // its block's dynamic shared memory
  Barrier* block_barrier = nullptr;
  Barrier* group_barrier = nullptr;  // its cluster's, or a cooperative grid's
  unsigned cluster_rank = 0, cluster_blocks = 1;
  unsigned char* const* cluster_shared = nullptr;  // the cluster's blocks' shared memory, by rank
  // Asynchronous copies (copy_async): committed groups, oldest first, and
  // the group still open; none lands before a wait asks for it.
  std::vector<std::vector<std::pair<float*, const float*>>> copy_groups;
  std::vector<std::pair<float*, const float*>> copy_open;
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

// Lets the other fibers run (a spin wait's pause; a barrier's wait).
inline void yield_fiber() {
  FiberScheduler& s = scheduler();
  swapcontext(&s.current->context, &s.main);
}

inline void barrier_wait(Barrier& b) {
  const unsigned generation = b.generation;
  if (++b.arrived == b.expected) {
    b.arrived = 0;
    ++b.generation;
    return;
  }
  while (b.generation == generation) yield_fiber();
}

inline void syncthreads_fiber() { barrier_wait(*scheduler().current->block_barrier); }

// Runs job on every thread of the given blocks, all at once (a cooperative or
// a cluster launch: the blocks may wait for each other), in clusters of
// `cluster` consecutive blocks of the list (1: each block alone; 0: the whole
// list is one group, a cooperative grid).
template <typename F>
void run_blocks(const std::vector<dim3>& blocks, dim3 block, size_t shared_bytes, F&& job,
                unsigned cluster = 0) {
  FiberScheduler& s = scheduler();
  const unsigned per_block = block.x * block.y * block.z;
  const size_t threads = per_block * blocks.size();
  const size_t group = cluster == 0 ? blocks.size() : cluster;
  if (s.fibers.size() < threads) s.fibers.resize(threads);
  // Each block's dynamic shared memory starts 128-byte aligned, as the
  // kernels declare it (cuda_compat.cuh).
  std::vector<std::vector<unsigned char>> shared(
      blocks.size(), std::vector<unsigned char>(shared_bytes + 16 + 128));
  std::vector<unsigned char*> shared_of(blocks.size());
  for (size_t b = 0; b < blocks.size(); ++b) {
    const auto at = reinterpret_cast<uintptr_t>(shared[b].data());
    shared_of[b] = shared[b].data() + (128 - at % 128) % 128;
  }
  std::vector<Barrier> block_barriers(blocks.size()),
      group_barriers((blocks.size() + group - 1) / group);
  for (auto& b : block_barriers) b.expected = per_block;
  for (size_t g = 0; g < group_barriers.size(); ++g)
    group_barriers[g].expected =
        static_cast<unsigned>(per_block * std::min(group, blocks.size() - g * group));
  s.job = std::forward<F>(job);
  for (size_t i = 0; i < threads; ++i) {
    Fiber& f = s.fibers[i];
    const unsigned t = static_cast<unsigned>(i % per_block);
    const size_t b = i / per_block;
    if (f.stack.empty()) f.stack.resize(256 * 1024);
    f.done = false;
    f.copy_groups.clear();
    f.copy_open.clear();
    f.index = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
    f.block_index = blocks[b];
    f.shared = shared_of[b];
    f.block_barrier = &block_barriers[b];
    f.group_barrier = &group_barriers[b / group];
    f.cluster_rank = cluster == 0 ? 0 : static_cast<unsigned>(b % group);
    f.cluster_blocks = cluster == 0 ? 1 : static_cast<unsigned>(group);
    f.cluster_shared = shared_of.data() + (cluster == 0 ? b : b - b % group);
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack.data();
    f.context.uc_stack.ss_size = f.stack.size();
    f.context.uc_link = &s.main;
    makecontext(&f.context, fiber_entry, 0);
  }
  // Each round runs every unfinished fiber up to its next wait, except that
  // a pseudo-random half of the blocks sits the round out (all of them run
  // when none would): blocks drift apart as on a GPU, so that code relying on
  // an order that only a barrier would give (a missing cluster barrier, say)
  // shows its races here too. The sequence is the same in every run.
  std::vector<char> sits(blocks.size(), 0);
  uint64_t random = 0x9E3779B97F4A7C15ull;
  for (bool running = true; running;) {
    running = false;
    bool any = false;
    for (size_t b = 0; b < blocks.size(); ++b) {
      random ^= random << 13;
      random ^= random >> 7;
      random ^= random << 17;
      sits[b] = blocks.size() > 1 && (random >> 32) % 2 == 0;
      any = any || !sits[b];
    }
    for (size_t i = 0; i < threads; ++i) {
      Fiber& f = s.fibers[i];
      if (f.done) continue;
      if (any && sits[i / per_block]) {
        running = true;
        continue;
      }
      s.current = &f;
      threadIdx = f.index;
      blockIdx = f.block_index;
      swapcontext(&s.main, &f.context);
      running = running || !f.done;
    }
  }
}

template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, cudaStream_t stream, Args... args) {
  submit(stream, [=] {
    gridDim = grid;
    blockDim = block;
    for (unsigned bz = 0; bz < grid.z; ++bz)
      for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx)
          run_blocks(
              {dim3(bx, by, bz)}, block, 0, [&] { kernel(static_cast<KArgs>(args)...); }, 1);
  });
}

template <typename T>
T* dynamic_shared() {
  return reinterpret_cast<T*>(scheduler().current->shared);
}

inline void grid_sync() { barrier_wait(*scheduler().current->group_barrier); }

// Thread-block clusters (sm_90): the blocks of a launch in clusters of
// `cluster` consecutive blocks along x, every block of the grid resident at
// once (so that clusters may also wait for each other through global flags).
// Dynamic shared memory is each block's own; peer_shared maps a pointer into
// it to the same place in another block of the cluster.
// Every block of the grid at once, in clusters of `cluster` blocks (0: one
// group, a cooperative grid).
template <typename A>
void run_grid(void (*kernel)(A), dim3 grid, dim3 block, size_t shared_bytes, A arg,
              unsigned cluster) {
  gridDim = grid;
  blockDim = block;
  std::vector<dim3> blocks;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) blocks.emplace_back(bx, by, bz);
  run_blocks(
      blocks, block, shared_bytes, [&] { kernel(arg); }, cluster);
}

// The one-launch kernels' launches (cooperative and cluster) since the tests
// last read them (seqpack_cuda_emulated_grid_launches): the grid's blocks and
// the cluster's (0: a cooperative grid).
struct GridLaunch {
  unsigned blocks, cluster;
};
inline std::vector<GridLaunch>& grid_launches() {
  static std::vector<GridLaunch> launches;
  return launches;
}

template <typename A>
cudaError_t launch_cooperative(void (*kernel)(A), dim3 grid, dim3 block, size_t shared_bytes,
                               cudaStream_t stream, A arg) {
  grid_launches().push_back({grid.x, 0});
  submit(stream, [=] { run_grid(kernel, grid, block, shared_bytes, arg, 0); });
  return cudaSuccess;
}

template <typename A>
cudaError_t launch_cluster(void (*kernel)(A), dim3 grid, dim3 block, unsigned cluster,
                           size_t shared_bytes, cudaStream_t stream, A arg) {
  if (cluster == 0 || grid.x % cluster != 0) return 1;  // cudaErrorInvalidValue
  grid_launches().push_back({grid.x, cluster});
  submit(stream, [=] { run_grid(kernel, grid, block, shared_bytes, arg, cluster); });
  return cudaSuccess;
}

inline unsigned cluster_rank() { return scheduler().current->cluster_rank; }
inline unsigned cluster_blocks() { return scheduler().current->cluster_blocks; }
inline void cluster_sync() { barrier_wait(*scheduler().current->group_barrier); }

template <typename T>
T* peer_shared(T* local, unsigned rank) {
  const Fiber& f = *scheduler().current;
  const auto offset = reinterpret_cast<unsigned char*>(local) - f.shared;
  return reinterpret_cast<T*>(f.cluster_shared[rank] + offset);
}

// Asynchronous copies: each lands (reading its source then) only when a wait
// asks for its group, so that reading the destination before the wait sees
// what it held before, as on a GPU whose copy has not landed yet.
inline void copy_async(float* shared, const float* global) {
  scheduler().current->copy_open.emplace_back(shared, global);
}
inline void copy_async_commit() {
  Fiber& f = *scheduler().current;
  f.copy_groups.push_back(std::move(f.copy_open));
  f.copy_open.clear();
}
inline void copy_async_land(size_t newest_left) {
  Fiber& f = *scheduler().current;
  while (f.copy_groups.size() > newest_left) {
    for (const auto& [dst, src] : f.copy_groups.front()) *dst = *src;
    f.copy_groups.erase(f.copy_groups.begin());
  }
}
inline void copy_async_wait_all() { copy_async_land(0); }
inline void copy_async_wait_all_but_newest() { copy_async_land(1); }

// A spin wait's pause: the other threads run meanwhile.
inline void spin_pause() { yield_fiber(); }

// Global memory read and written by several blocks while they run.
inline unsigned atomic_add(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = old + v;
  return old;
}
inline unsigned atomic_load(const unsigned* p) { return *p; }
inline void thread_fence() {}

struct DeviceLimits {
  int multiprocessors = 0;
  int shared_optin = 0;
  bool cooperative = false;
};

// A small pretend GPU: 4 multiprocessors, 8 resident blocks each, 227 KB of
// shared memory a block may ask for (SEQPACK_CUDA_EMULATE_SHARED_BYTES sets
// another: the tests of what does not fit).
inline cudaError_t device_limits(DeviceLimits* out) {
  out->multiprocessors = 4;
  const char* shared = std::getenv("SEQPACK_CUDA_EMULATE_SHARED_BYTES");
  out->shared_optin = shared != nullptr && shared[0] != '\0' ? std::atoi(shared) : 227 * 1024;
  out->cooperative = true;
  return cudaSuccess;
}

template <typename A>
int blocks_per_multiprocessor(void (*)(A), int, size_t) {
  return 8;
}

}  // namespace seqpack::cuda

inline void emulated_syncthreads() { seqpack::cuda::syncthreads_fiber(); }
