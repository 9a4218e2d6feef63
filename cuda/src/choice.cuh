// Which kernels run a call: the policy's choices (seqpack_cuda_policy) and
// the sizes of a launch that follow from them, the shape and the device.
#pragma once

#include <cstdint>

#include "checks.cuh"

namespace seqpack::cuda {

// The GEMM's tile: the policy's gemm_tile where it forces one, else 64 unless
// that gives fewer than kMinBlocks blocks (a step's few rows).
constexpr int64_t kMinBlocks = 264;  // twice an H100's 132 multiprocessors
int gemm_tile(const Policy& p, int64_t M, int64_t N);

// Products with 16-bit operands on tensor cores (SEQPACK_CUDA_GEMM_WMMA:
// opt-in until checked on a GPU); else the SIMT kernel.
inline bool use_wmma(const Policy& p) { return p.gemm == SEQPACK_CUDA_GEMM_WMMA; }

// The policy's kernel: "simple" (the default: a few launches per step),
// "persistent" (one cooperative launch per layer, where it fits the GPU; else
// simple) or "cluster" (thread-block clusters, sm_90, where they fit; else
// persistent, else simple).
inline bool persistent_requested(const Policy& p) {
  return p.kernel == SEQPACK_CUDA_KERNEL_PERSISTENT;
}
inline bool cluster_requested(const Policy& p) { return p.kernel == SEQPACK_CUDA_KERNEL_CLUSTER; }

// The cluster kernel's size: the largest power of two up to 16 that leaves
// every block 4 hidden units or more (1 for H < 8), unless the policy's
// cluster_size forces one (at most H).
int64_t cluster_size(const Policy& p, int64_t H);

// The shared memory a one-launch kernel's block keeps of the weights, owning
// `units` hidden units and `cols` output columns (element bytes an entry):
// the forward's W_hh rows of its units (every gate) and, with a projection,
// W_hr's rows of its columns; the backward's W_hh columns of its units (with
// a projection: of its columns, and W_hr's columns of its units).
size_t weight_bytes(const Shape& s, bool backward, int64_t units, int64_t cols, size_t element);

// Hidden units per block for a cooperative launch of `kernel` (`threads` a
// block) for `count`
// directions (the backward's if `backward`): from 1 up, the first whose
// weights fit a block's shared memory (weight_bytes, with the output columns
// shared out among the ceil(H / U) blocks: *cols) and whose count ceil(H / U)
// blocks are all resident at once (a cooperative launch needs that); 0 where
// none does.
template <typename A>
int64_t cooperative_units(void (*kernel)(A), int threads, const Shape& s, int count, bool backward,
                          size_t element, const DeviceLimits& limits, size_t* shared,
                          int64_t* cols) {
  const int64_t H = s.hidden;
  for (int64_t u = 1; u <= 64 && u <= H; u *= 2) {
    const int64_t blocks = (H + u - 1) / u, c = (s.hout() + blocks - 1) / blocks;
    const size_t bytes = weight_bytes(s, backward, u, c, element);
    if (bytes > static_cast<size_t>(limits.shared_optin)) break;
    const int per_sm = blocks_per_multiprocessor(kernel, threads, bytes);
    if (count * blocks <= static_cast<int64_t>(per_sm) * limits.multiprocessors) {
      *shared = bytes;
      *cols = c;
      return u;
    }
  }
  return 0;
}

// Launches `kernel` for one layer's `count` directions on one cooperative

// Where a cluster kernel runs one layer and direction (the backward's if
// `backward`): cluster_size(H) blocks of `units` hidden units and `cols`
// output columns, each block's shared memory holding its part of the weights
// (weight_bytes, `element` bytes an entry) and, where they fit beside it (and
// the policy's cluster_gather allows; never with a projection, whose kernels
// gather through global memory), the gather buffers of buffer_bytes. ok is
// false where the weights alone do not fit or the device's limits are
// unknown.
struct ClusterPlan {
  bool ok = false;
  int64_t n = 0, units = 0, cols = 0;
  size_t shared = 0;
  bool buffers = false;
};

ClusterPlan plan_cluster(const Shape& s, int64_t steps, bool backward, size_t buffer_bytes,
                         size_t element);

}  // namespace seqpack::cuda
