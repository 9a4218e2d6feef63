// The policy's cap on the ISA of seqpack's own kernels (the Highway gate,
// small-GEMM and Adam kernels, and the int8 kernels; seqpack/policy.h's
// max_cpu_isa, variable SEQPACK_MAX_CPU_ISA), so that a test can run them on
// the code paths of a smaller CPU. oneDNN has its own
// cap, ONEDNN_MAX_CPU_ISA; PyTorch's is ATEN_CPU_CAPABILITY (docs/testing.md).
#pragma once

#include <hwy/highway.h>

#include <cstdint>

namespace seqpack::cpu {

enum class IsaLevel : int { sse4 = 0, avx2 = 1, avx512 = 2 };

// The cap (avx512, the widest, until set_isa_cap sets another).
IsaLevel isa_cap();
// Sets the cap and applies it to Highway's targets (set_policy).
void set_isa_cap(IsaLevel level);
// Counts the changes of the cap and of the bf16 emulation: what was laid out
// for one target's kernels (gemm_packed_small's panels, two vectors wide; the
// bf16 engine's blocked weights, bf16 or emulated f32) is not read after a
// change.
uint64_t isa_generation();
// Counts a change of the kernels other than the cap's (set_bf16_emulation).
void count_kernel_change();

// "avx512", "avx2", "sse4".
const char* isa_level_name(IsaLevel level);

}  // namespace seqpack::cpu

// Highway's dispatch, which set_isa_cap has capped.
#define SEQPACK_HWY_DISPATCH(FUNC) HWY_DYNAMIC_DISPATCH(FUNC)
