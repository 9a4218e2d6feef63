// The per-step floor of a persistent recurrence on thread-block clusters
// (issue 44's first measurement): a tanh RNN over a batch of equal lengths,
// run as the persistent kernels will run a layer. One cluster of n blocks;
// block r owns hidden units [r U, (r + 1) U), U = H / n, and keeps their rows
// of W_hh (U x H) in its shared memory for the whole sequence. Each step every
// block reads h_{t-1} (B x H) from its own shared memory, computes its units'
// h_t = tanh(xg_t + W_hh h_{t-1}) (the input gates xg computed beforehand, as
// torch's products give them; float32 accumulation, the product split over
// the threads of each output and summed through shared memory), writes them
// to y and into every block's shared memory (distributed shared memory: the
// all-gather of h_t), and meets the cluster barrier. h alternates between two
// shared buffers, so one barrier a step suffices: a block writes step t's h
// into the buffer its peers read at step t - 1, which all of them finished
// before that step's barrier.
//
// W_hh and h are float32 or bfloat16 (h rounded to it each step, as torch's
// bf16 layers keep it); xg and y are float32. bench/cuda_step_floor.py times
// it on the GPU (the device check's first measurement: launches of two step
// counts, the difference per step); python/tests/test_cuda_step_floor.py runs
// it through the CPU emulation; both check it with step_floor_check.py.
#include <cstdint>

#include "../src/kernels.cuh"

namespace seqpack::cuda {
namespace {

template <typename T>
struct FloorArgs {
  const T* w_hh;    // [H, H]
  const float* xg;  // [steps, B, H]
  const T* h0;      // [B, H]
  float* y;         // [steps, B, H]
  int64_t hidden;
  int64_t batch;
  int steps;
  int split;  // threads summing one output's product (a power of two dividing the block)
};

template <typename T>
__global__ void step_floor_kernel(FloorArgs<T> a) {
  const unsigned rank = cluster_rank(), n = cluster_blocks();
  const int64_t H = a.hidden, B = a.batch, U = H / n, outputs = U * B;
  const int64_t first = static_cast<int64_t>(rank) * U;  // this block's first unit
  float* part = dynamic_shared<float>();                 // [blockDim.x]: partial products
  T* w = reinterpret_cast<T*>(part + blockDim.x);        // [U, H]
  T* h[2] = {w + U * H, w + U * H + B * H};              // [B, H] each
  for (int64_t i = threadIdx.x; i < U * H; i += blockDim.x) w[i] = a.w_hh[first * H + i];
  for (int64_t i = threadIdx.x; i < B * H; i += blockDim.x) h[0][i] = a.h0[i];
  __syncthreads();
  const int split = a.split;
  const int64_t per_pass = blockDim.x / split;
  const int lane = static_cast<int>(threadIdx.x) % split;
  for (int t = 0; t < a.steps; ++t) {
    const T* hp = h[t & 1];
    T* hn = h[(t + 1) & 1];
    for (int64_t o0 = 0; o0 < outputs; o0 += per_pass) {
      const int64_t o = o0 + threadIdx.x / split;
      const int64_t b = o / U, j = o % U;
      float acc = 0.f;
      if (o < outputs)
        for (int64_t k = lane; k < H; k += split)
          acc += to_f32(w[j * H + k]) * to_f32(hp[b * H + k]);
      part[threadIdx.x] = acc;
      __syncthreads();
      if (lane == 0 && o < outputs) {
        float sum = a.xg[(static_cast<int64_t>(t) * B + b) * H + first + j];
        for (int s = 0; s < split; ++s) sum += part[threadIdx.x + s];
        const T v = from_f32<T>(tanhf(sum));
        a.y[(static_cast<int64_t>(t) * B + b) * H + first + j] = to_f32(v);
        for (unsigned p = 0; p < n; ++p) peer_shared(hn, p)[b * H + first + j] = v;
      }
      __syncthreads();
    }
    cluster_sync();
  }
}

template <typename T>
int run(const void* w_hh, const float* xg, const void* h0, float* y, int64_t hidden, int64_t batch,
        int steps, int cluster, int threads, void* stream) {
  // The product of each output is split over the threads a pass leaves it.
  const int64_t outputs = hidden / cluster * batch;
  int split = 1;
  while (split * 2 <= threads && outputs * split * 2 <= threads) split *= 2;
  const FloorArgs<T> a{
      static_cast<const T*>(w_hh), xg, static_cast<const T*>(h0), y, hidden, batch, steps, split};
  const size_t shared =
      static_cast<size_t>(hidden / cluster * hidden + 2 * batch * hidden) * sizeof(T) +
      static_cast<size_t>(threads) * sizeof(float);
  return static_cast<int>(launch_cluster(step_floor_kernel<T>, dim3(static_cast<unsigned>(cluster)),
                                         dim3(static_cast<unsigned>(threads)),
                                         static_cast<unsigned>(cluster), shared,
                                         static_cast<cudaStream_t>(stream), a));
}

}  // namespace
}  // namespace seqpack::cuda

#define SEQPACK_CUDA_EXPORT __attribute__((visibility("default")))

// Runs `steps` steps of the recurrence in one cluster of `cluster` blocks of
// `threads` threads; dtype 0: W_hh and h0 float32, 2: bfloat16 (seqpack/cuda.h's
// values). Returns 0; 1 for sizes it does not take (hidden not a multiple of
// cluster, threads not a multiple of 32 up to 1024, a size not positive);
// else the CUDA error of the launch (a cluster or shared memory the GPU
// refuses).
extern "C" SEQPACK_CUDA_EXPORT int seqpack_cuda_probe_step_floor(
    int dtype, const void* w_hh, const float* xg, const void* h0, float* y, int64_t hidden,
    int64_t batch, int steps, int cluster, int threads, void* stream) {
  using namespace seqpack::cuda;
  if (cluster <= 0 || hidden <= 0 || batch <= 0 || steps < 0 || hidden % cluster != 0 ||
      threads <= 0 || threads > 1024 || threads % 32 != 0)
    return 1;
  if (dtype == 0)
    return run<float>(w_hh, xg, h0, y, hidden, batch, steps, cluster, threads, stream);
  if (dtype == 2)
    return run<__nv_bfloat16>(w_hh, xg, h0, y, hidden, batch, steps, cluster, threads, stream);
  return 1;
}
