// Who runs a CUDA call of seqpack's operators: seqpack's kernels or torch's
// (cuda_choice.cpp), for the autograd kernel of cuda_ops.cpp.
//
// SEQPACK_CUDA_LAYERS (read once) or seqpack::_cuda_layers: "seqpack", "torch",
// or "auto" (the default): per configuration (the caller's key: the cell,
// sizes, layers, directions, projection, bias, dtype and device, whether
// autograd records the call, the training flag and dropout, and the batch and
// the packed rows rounded up to powers of two), the first call runs each side
// once to warm it up and three times under no_grad, each call timed with the
// device synchronised before and after, remembers the faster (a side that
// raises is never chosen; where both do, seqpack's error) and leaves it to the
// caller to run. While torch.compile traces (fake tensors, nothing to time),
// seqpack's kernels, whose operators it traces. Private to seqpack_torch.
#pragma once

#include <c10/util/C++17.h>  // FunctionRef.h uses it without including it (PyTorch 1.13)
#include <c10/util/FunctionRef.h>

#include <string>

#include "cuda_ops.h"

namespace seqpack::torch_cuda {

struct Choice {
  std::string impl, why;  // impl: "seqpack" or "torch"
};

// Who runs a call (and, for _cuda_last_choice, this thread's last): `key` names
// its configuration, made only where a decision is looked up; `ours` and
// `theirs` run it on seqpack's kernels and on torch's (for the timing).
Choice choose(const Backend& backend, bool traced, const at::Device& device,
              c10::function_ref<std::string()> key, c10::function_ref<void()> ours,
              c10::function_ref<void()> theirs);

}  // namespace seqpack::torch_cuda
