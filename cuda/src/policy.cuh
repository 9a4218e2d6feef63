// The library's policy (seqpack_cuda_policy, seqpack/cuda.h): which kernels
// run. Installed by seqpack_cuda_set_policy, checked field by field; each call
// takes a copy when it starts, so a call sees one policy throughout.
#pragma once

#include "seqpack/cuda.h"

namespace seqpack::cuda {

using Policy = seqpack_cuda_policy;

// The defaults (seqpack/cuda.h): simple kernels, SIMT products, the chosen
// tile and cluster size, shared-memory gathers, tensor cores and TF32 where
// the call allows them.
Policy default_policy();

// `p` if every field is in range; else fail()s naming the field and its value.
Policy checked_policy(const Policy& p);

// The policy installed (default_policy() before any), and its replacement.
Policy installed_policy();
void install_policy(const Policy& p);

}  // namespace seqpack::cuda
