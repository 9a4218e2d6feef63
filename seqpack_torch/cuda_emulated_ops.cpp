// Test library (not installed): seqpack's CUDA kernels (cuda_ops.h) on CPU
// tensors, as the operators seqpack_cuda_emulated::rnn, rnn_padded, _rnn_train
// and _rnn_backward (the schemas of seqpack's), over a libseqpack_cuda.so
// compiled for the CPU (cuda/emulate/), so the tests run the C++ kernels, their
// autograd, the choice between them and torch's, and their errors against
// torch without a GPU (python/tests/test_cuda_cpp_ops.py).
#include <torch/library.h>

#include <vector>

#include "cuda_ops.h"
#include "schemas.h"

namespace seqpack::torch_cuda {
namespace {

void* no_stream(const at::Device&) { return nullptr; }
void no_wait(const at::Device&) {}

constexpr Backend kEmulated{"seqpack_cuda_emulated", &no_stream, &no_wait};

// policy_from_environment's record, field by field in seqpack/cuda.h's order.
std::vector<int64_t> environment_policy() { return policy_fields(policy_from_environment()); }

}  // namespace
}  // namespace seqpack::torch_cuda

TORCH_LIBRARY(seqpack_cuda_emulated, m) {
  SEQPACK_CUDA_SCHEMAS(m);
  SEQPACK_CUDA_PROCESS_SCHEMAS(m);
  m.def("_cuda_policy_from_environment() -> int[]", &seqpack::torch_cuda::environment_policy);
}

TORCH_LIBRARY_IMPL(seqpack_cuda_emulated, CPU, m) {
  SEQPACK_CUDA_KERNELS(m, seqpack::torch_cuda::kEmulated);
}

TORCH_LIBRARY_IMPL(seqpack_cuda_emulated, AutogradCPU, m) {
  SEQPACK_CUDA_AUTOGRAD_KERNELS(m, seqpack::torch_cuda::kEmulated);
}
