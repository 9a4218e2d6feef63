// The policy's cap on the ISA of seqpack's own kernels (the Highway gate,
// small-GEMM and Adam kernels, and the int8 kernels; seqpack/policy.h's
// max_cpu_isa, variable SEQPACK_MAX_CPU_ISA), so that a test can run them on
// the code paths of a smaller CPU. oneDNN has its own
// cap, ONEDNN_MAX_CPU_ISA; PyTorch's is ATEN_CPU_CAPABILITY (docs/testing.md).
#pragma once

#include <hwy/highway.h>

#include <cstdint>

#include "seqpack/precision.h"

namespace seqpack::cpu {

// The kernel settings of a call (seqpack::KernelConfig: a model plan's
// RNNConfig::kernels, or a front end's policy's kernel_config), given to the
// engines and kernels that read them.
using Kernels = KernelConfig;

// The cap (KernelConfig::Isa): sse4 and avx2 cap every kernel; avx3, avx3_dl
// and avx3_zen4 leave AVX-512 on and cap Highway's AVX-512 targets only (the
// gate, small-GEMM and Adam kernels: Highway's AVX3 target, then AVX3_DL,
// then AVX3_ZEN4), so a test can run each target the CPU offers; avx512 caps
// nothing.
using IsaLevel = KernelConfig::Isa;

// Whether the cap leaves AVX-512 on (the hand-written AVX-512 kernels: int8
// VNNI and AMX, the bf16 rows).
inline bool avx512_allowed(IsaLevel level) { return level >= IsaLevel::avx3; }

// The cap of Highway's dispatch (avx512, the widest, until set_isa_cap sets
// another).
IsaLevel isa_cap();
// Sets the cap and applies it to Highway's targets (set_policy).
void set_isa_cap(IsaLevel level);
// Counts the changes of the cap: what was laid out for one target's kernels
// (gemm_packed_small's panels, two vectors wide) is not read after a change.
uint64_t isa_generation();

// "avx512", "avx3_zen4", "avx3_dl", "avx3", "avx2", "sse4".
const char* isa_level_name(IsaLevel level);

}  // namespace seqpack::cpu

// Highway's dispatch, which set_isa_cap has capped.
#define SEQPACK_HWY_DISPATCH(FUNC) HWY_DYNAMIC_DISPATCH(FUNC)
