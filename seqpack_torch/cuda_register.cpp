// seqpack::rnn and rnn_padded's kernels for the CUDA and AutogradCUDA keys
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

constexpr Backend kCuda{"seqpack", &current_stream};

}  // namespace
}  // namespace seqpack::torch_cuda

TORCH_LIBRARY_IMPL(seqpack, CUDA, m) {
  using namespace seqpack::torch_cuda;
  m.impl("rnn", &rnn_kernel<kCuda, false>);
  m.impl("rnn_padded", &rnn_padded_kernel<kCuda>);
}

TORCH_LIBRARY_IMPL(seqpack, AutogradCUDA, m) {
  using namespace seqpack::torch_cuda;
  m.impl("rnn", &rnn_kernel<kCuda, true>);
  m.impl("rnn_padded", &rnn_padded_kernel<kCuda>);
}
