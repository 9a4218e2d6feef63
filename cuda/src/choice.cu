// Which kernels run a call (choice.cuh).
#include "choice.cuh"

namespace seqpack::cuda {

int gemm_tile(const Policy& p, int64_t M, int64_t N) {
  if (p.gemm_tile != 0) return p.gemm_tile;
  const int64_t blocks64 = ((M + 63) / 64) * ((N + 63) / 64);
  return blocks64 < kMinBlocks ? 32 : 64;
}

int64_t cluster_size(const Policy& p, int64_t H) {
  if (p.cluster_size > 0) return std::min<int64_t>(p.cluster_size, H);
  int64_t n = 1;
  while (n < 16 && 2 * n * 4 <= H) n *= 2;
  return n;
}

size_t weight_bytes(const Shape& s, bool backward, int64_t units, int64_t cols, size_t element) {
  const int64_t n = s.proj == 0 ? s.gates() * units
                    : backward  ? s.hout() * units + s.gates() * cols
                                : s.gates() / s.hidden * units * s.hout() + cols * s.hidden;
  return static_cast<size_t>(n) * element;
}

ClusterPlan plan_cluster(const Shape& s, int64_t steps, bool backward, size_t buffer_bytes,
                         size_t element) {
  ClusterPlan p;
  if (steps == 0) return p;
  DeviceLimits limits;
  if (device_limits(&limits) != cudaSuccess) {
    (void)cudaGetLastError();
    return p;
  }
  const auto limit = static_cast<size_t>(limits.shared_optin);
  p.n = cluster_size(s.policy, s.hidden);
  p.units = (s.hidden + p.n - 1) / p.n;
  p.cols = (s.hout() + p.n - 1) / p.n;
  const size_t rows = weight_bytes(s, backward, p.units, p.cols, element);
  p.buffers = s.proj == 0 && s.policy.cluster_gather == SEQPACK_CUDA_GATHER_SHARED &&
              rows + buffer_bytes <= limit;
  p.shared = rows + (p.buffers ? buffer_bytes : 0);
  p.ok = p.shared <= limit;
  return p;
}

}  // namespace seqpack::cuda
