// The policy's cap on the ISA of seqpack's own kernels (the Highway gate,
// small-GEMM and Adam kernels, and the int8 kernels; seqpack/policy.h's
// max_cpu_isa, variable SEQPACK_MAX_CPU_ISA), so that a test can run them on
// the code paths of a smaller CPU. oneDNN has its own
// cap, ONEDNN_MAX_CPU_ISA; PyTorch's is ATEN_CPU_CAPABILITY (docs/testing.md).
#pragma once

#include <hwy/highway.h>

#include <cstddef>
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

// The entry of a Highway dispatch table (HWY_EXPORT's) of the best target
// this CPU offers under `cap`: the index Highway's own dispatch computes from
// its chosen targets (hwy::ChosenTarget::GetIndex), here from the CPU's
// targets less those above the cap, so that each call dispatches to its own
// cap's target (nothing process-wide: Highway's chosen target is not read or
// set).
std::size_t hwy_target_index(IsaLevel cap);

// "avx512", "avx3_zen4", "avx3_dl", "avx3", "avx2", "sse4".
const char* isa_level_name(IsaLevel level);

}  // namespace seqpack::cpu

// Highway's dispatch of FUNC (HWY_EXPORTed) to the target of `cap`
// (hwy_target_index); with one target compiled in, that one.
#if HWY_IDE || ((HWY_TARGETS & (HWY_TARGETS - 1)) == 0)
#define SEQPACK_HWY_DISPATCH(FUNC, cap) HWY_STATIC_DISPATCH(FUNC)
#else
#define SEQPACK_HWY_DISPATCH(FUNC, cap) \
  (*(HWY_DISPATCH_TABLE(FUNC)[::seqpack::cpu::hwy_target_index(cap)]))
#endif
