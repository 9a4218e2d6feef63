// seqpack's recurrent operators' kernels for the CUDA and AutogradCUDA keys
// (cuda_ops.h), built where torch is a CUDA build: the stream is torch's
// current stream of the data's device.
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "cuda_ops.h"

namespace seqpack::torch_cuda {
namespace {

void* current_stream(const at::Device& device) {
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
}

void synchronize(const at::Device& device) {
  c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
}

constexpr Backend kCuda{"seqpack", &current_stream, &synchronize};

}  // namespace
}  // namespace seqpack::torch_cuda

TORCH_LIBRARY_IMPL(seqpack, CUDA, m) { SEQPACK_CUDA_KERNELS(m, seqpack::torch_cuda::kCuda); }

TORCH_LIBRARY_IMPL(seqpack, AutogradCUDA, m) {
  SEQPACK_CUDA_AUTOGRAD_KERNELS(m, seqpack::torch_cuda::kCuda);
}
