// seqpack's recurrent operators' schemas for a process without libseqpack_torch
// (whose ops.cpp defines them with their CPU kernels): the GPU machine, where
// bench/cuda_cpp_ops.py builds the CUDA kernels (cuda_ops.cpp,
// cuda_register.cpp, torch_rnn.cpp) with this file against the machine's own torch.
#include <torch/library.h>

#include "cuda_ops.h"
#include "schemas.h"

TORCH_LIBRARY(seqpack, m) {
  SEQPACK_CUDA_SCHEMAS(m);
  SEQPACK_CUDA_PROCESS_SCHEMAS(m);
}
