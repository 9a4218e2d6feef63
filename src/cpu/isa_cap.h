// SEQPACK_MAX_CPU_ISA: a cap on the ISA of seqpack's own kernels (the Highway
// gate, small-GEMM and Adam kernels, and the int8 kernels), so that
// a test can run them on the code paths of a smaller CPU. oneDNN has its own
// cap, ONEDNN_MAX_CPU_ISA; PyTorch's is ATEN_CPU_CAPABILITY (docs/testing.md).
#pragma once

#include <hwy/highway.h>

namespace seqpack::cpu {

enum class IsaLevel : int { sse4 = 0, avx2 = 1, avx512 = 2 };

// The cap (avx512, the widest, when SEQPACK_MAX_CPU_ISA is unset or empty),
// applied to Highway's targets at the first call. Throws std::invalid_argument
// naming the variable's value when it is not one of avx512, avx2, sse4.
IsaLevel isa_cap();

// "avx512", "avx2", "sse4".
const char* isa_level_name(IsaLevel level);

}  // namespace seqpack::cpu

// HWY_DYNAMIC_DISPATCH with the cap applied first (one static load after the
// first call).
#define SEQPACK_HWY_DISPATCH(FUNC) (::seqpack::cpu::isa_cap(), HWY_DYNAMIC_DISPATCH(FUNC))
