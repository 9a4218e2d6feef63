// The policy record: its defaults, its checks and the installed copy.
#include "policy.cuh"

#include <mutex>

#include "checks.cuh"

namespace seqpack::cuda {
namespace {

std::mutex g_policy_mutex;
Policy g_policy = default_policy();

}  // namespace

Policy default_policy() {
  Policy p{};
  p.version = SEQPACK_CUDA_POLICY_VERSION;
  p.kernel = SEQPACK_CUDA_KERNEL_SIMPLE;
  p.gemm = SEQPACK_CUDA_GEMM_SIMT;
  p.gemm_tile = 0;
  p.cluster_size = 0;
  p.cluster_gather = SEQPACK_CUDA_GATHER_SHARED;
  p.cluster_mma = 1;
  p.tf32 = 1;
  return p;
}

Policy checked_policy(const Policy& p) {
  if (p.version != SEQPACK_CUDA_POLICY_VERSION)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT,
         "seqpack_cuda: policy.version = %d is not SEQPACK_CUDA_POLICY_VERSION (%d)", p.version,
         SEQPACK_CUDA_POLICY_VERSION);
  if (p.kernel < SEQPACK_CUDA_KERNEL_SIMPLE || p.kernel > SEQPACK_CUDA_KERNEL_CLUSTER)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT,
         "seqpack_cuda: policy.kernel = %d is not simple (0), persistent (1) or cluster (2)",
         p.kernel);
  if (p.gemm != SEQPACK_CUDA_GEMM_SIMT && p.gemm != SEQPACK_CUDA_GEMM_WMMA)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT,
         "seqpack_cuda: policy.gemm = %d is not simt (0) or wmma (1)", p.gemm);
  if (p.gemm_tile != 0 && p.gemm_tile != 32 && p.gemm_tile != 64)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT,
         "seqpack_cuda: policy.gemm_tile = %d is not 0 (chosen per product), 32 or 64",
         p.gemm_tile);
  if (p.cluster_size < 0 || p.cluster_size > 16)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT,
         "seqpack_cuda: policy.cluster_size = %d is not 0 (chosen from H) or a block count from 1 "
         "to 16",
         p.cluster_size);
  if (p.cluster_gather != SEQPACK_CUDA_GATHER_SHARED &&
      p.cluster_gather != SEQPACK_CUDA_GATHER_GLOBAL)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT,
         "seqpack_cuda: policy.cluster_gather = %d is not shared (0) or global (1)",
         p.cluster_gather);
  if (p.cluster_mma != 0 && p.cluster_mma != 1)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT, "seqpack_cuda: policy.cluster_mma = %d is not 0 or 1",
         p.cluster_mma);
  if (p.tf32 != 0 && p.tf32 != 1)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT, "seqpack_cuda: policy.tf32 = %d is not 0 or 1", p.tf32);
  return p;
}

Policy installed_policy() {
  std::lock_guard<std::mutex> lock(g_policy_mutex);
  return g_policy;
}

void install_policy(const Policy& p) {
  const Policy checked = checked_policy(p);
  std::lock_guard<std::mutex> lock(g_policy_mutex);
  g_policy = checked;
}

}  // namespace seqpack::cuda
