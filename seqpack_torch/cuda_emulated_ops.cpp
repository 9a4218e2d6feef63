// Test library (not installed): seqpack's CUDA kernels (cuda_ops.h) on CPU
// tensors, as the operators seqpack_cuda_emulated::rnn and rnn_padded (the
// schemas of seqpack's), over a libseqpack_cuda.so compiled for the CPU
// (cuda/emulate/), so the tests run the C++ kernels, their autograd and their
// errors against torch without a GPU (python/tests/test_cuda_cpp_ops.py).
#include <torch/library.h>

#include <vector>

#include "cuda_ops.h"
#include "schemas.h"

namespace seqpack::torch_cuda {
namespace {

void* no_stream(const at::Device&) { return nullptr; }

constexpr Backend kEmulated{"seqpack_cuda_emulated", &no_stream};

// policy_from_environment's record, field by field in seqpack/cuda.h's order.
std::vector<int64_t> policy_fields() {
  const seqpack_cuda_policy p = policy_from_environment();
  return {p.version,      p.kernel,         p.gemm,        p.gemm_tile,
          p.cluster_size, p.cluster_gather, p.cluster_mma, p.tf32};
}

}  // namespace
}  // namespace seqpack::torch_cuda

TORCH_LIBRARY(seqpack_cuda_emulated, m) {
  using namespace seqpack::torch_ops;
  m.def(kRnnSchema);
  m.def(kRnnPaddedSchema);
  m.def(kCudaLibrarySchema, &seqpack::torch_cuda::use_library);
  m.def("_cuda_policy_from_environment() -> int[]", &seqpack::torch_cuda::policy_fields);
}

TORCH_LIBRARY_IMPL(seqpack_cuda_emulated, CPU, m) {
  using namespace seqpack::torch_cuda;
  m.impl("rnn", &rnn_kernel<kEmulated, false>);
  m.impl("rnn_padded", &rnn_padded_kernel<kEmulated>);
}

TORCH_LIBRARY_IMPL(seqpack_cuda_emulated, AutogradCPU, m) {
  using namespace seqpack::torch_cuda;
  m.impl("rnn", &rnn_kernel<kEmulated, true>);
  m.impl("rnn_padded", &rnn_padded_kernel<kEmulated>);
}
