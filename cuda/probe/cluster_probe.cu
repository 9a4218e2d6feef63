// A probe of the thread-block cluster primitives (cuda_compat.cuh:
// launch_cluster, cluster_rank, cluster_sync, peer_shared, spin_pause and the
// global flags), the pieces of a persistent recurrence over several blocks:
// each step every block of a cluster writes its slice of a vector into every
// block's shared memory (the all-gather of h_{t-1}), meets the cluster
// barrier, and copies what it gathered out; block 0 of each cluster then
// sums the gathered vector, and the clusters meet at a flag barrier in global
// memory and each reads every cluster's sum. python/tests/test_cuda_cluster.py
// runs it through the CPU emulation (cuda/emulate/), test_cuda_gpu.py on a GPU
// (sm_90: launch_cluster fails before that), both checked by
// python/tests/cluster_probe_check.py.
#include <cstdint>

#include "../src/cuda_compat.cuh"

namespace seqpack::cuda {
namespace {

struct ProbeArgs {
  const float* in;      // [blocks, width]: block b's slice
  float* gathered;      // [steps, blocks, cluster * width]
  float* sums;          // [steps, clusters]: each cluster's gathered sum
  float* totals;        // [steps, clusters]: every cluster's sums added, as each cluster read them
  unsigned* arrivals;   // one counter, zero before the launch
  int64_t width;
  int steps;
};

__global__ void cluster_allgather_kernel(ProbeArgs a) {
  const unsigned rank = cluster_rank(), n = cluster_blocks();
  const unsigned clusters = gridDim.x / n, c = blockIdx.x / n;
  const int64_t all = static_cast<int64_t>(n) * a.width;
  float* buf = dynamic_shared<float>();  // the cluster's gathered vector
  const float* mine = a.in + static_cast<int64_t>(blockIdx.x) * a.width;
  for (int step = 0; step < a.steps; ++step) {
    for (int64_t i = threadIdx.x; i < a.width; i += blockDim.x) {
      const float v = mine[i] * static_cast<float>(step + 1);
      for (unsigned p = 0; p < n; ++p) peer_shared(buf, p)[rank * a.width + i] = v;
    }
    cluster_sync();
    float* out = a.gathered + (static_cast<int64_t>(step) * gridDim.x + blockIdx.x) * all;
    for (int64_t i = threadIdx.x; i < all; i += blockDim.x) out[i] = buf[i];
    if (rank == 0 && threadIdx.x == 0) {
      float s = 0.f;
      for (int64_t i = 0; i < all; ++i) s += buf[i];
      a.sums[step * clusters + c] = s;
      thread_fence();  // the sum before the arrival
      atomic_add(a.arrivals, 1u);
      while (atomic_load(a.arrivals) < static_cast<unsigned>(step + 1) * clusters) spin_pause();
      thread_fence();
      float t = 0.f;
      for (unsigned k = 0; k < clusters; ++k)
        t += *reinterpret_cast<const volatile float*>(a.sums + step * clusters + k);
      a.totals[step * clusters + c] = t;
    }
    cluster_sync();  // no block writes the next step's slices before all have read this one's
  }
}

}  // namespace
}  // namespace seqpack::cuda

#define SEQPACK_CUDA_EXPORT __attribute__((visibility("default")))

// Runs the probe: `clusters` clusters of `cluster` blocks of `threads`
// threads, `steps` steps. Returns 0, or the CUDA error of the launch.
extern "C" SEQPACK_CUDA_EXPORT int seqpack_cuda_probe_cluster_allgather(
    const float* in, float* gathered, float* sums, float* totals, unsigned* arrivals,
    int64_t width, int cluster, int clusters, int steps, int threads, void* stream) {
  using namespace seqpack::cuda;
  if (cluster <= 0 || clusters <= 0 || threads <= 0 || width <= 0 || steps < 0) return 1;
  const ProbeArgs a{in, gathered, sums, totals, arrivals, width, steps};
  const size_t shared = static_cast<size_t>(cluster) * static_cast<size_t>(width) * sizeof(float);
  return static_cast<int>(launch_cluster(cluster_allgather_kernel,
                                         dim3(static_cast<unsigned>(cluster * clusters)),
                                         dim3(static_cast<unsigned>(threads)),
                                         static_cast<unsigned>(cluster), shared,
                                         static_cast<cudaStream_t>(stream), a));
}
