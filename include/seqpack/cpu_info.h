// What this CPU offers the recurrent core, as read at run time.
//
//   CpuInfo cpu = cpu_info(policy_from_environment());   // cpu.isa, cpu.native_bf16, ...
//
// The ISA is the one oneDNN dispatches to: the CPU's, capped by
// ONEDNN_MAX_CPU_ISA. seqpack/precision.h decides from it which precisions
// can run. The kernel settings reported (bf16, int8_kernel, kernels,
// isa_cap) are those of the policy given (seqpack/policy.h).
#pragma once

#include <string>

namespace seqpack {

struct CpuInfo {
  std::string isa;             // the ISA oneDNN dispatches to, e.g. "avx512_core_bf16"
  bool native_bf16 = false;    // bf16 dot products in hardware (AVX512-BF16 or AMX)
  // How precision bf16 multiplies under the policy: "native", "emulated"
  // (its bf16 setting, seqpack/policy.h; SEQPACK_BF16 for the front ends) or
  // "none" (no native bf16 and no emulation: bf16 is refused).
  std::string bf16;
  bool native_int8 = false;    // native int8 dot products (AVX512-VNNI; AMX CPUs have it)
  bool amx = false;            // AMX tiles (bf16/int8 matrix units)
  // The kernel of the int8 products (int8 runs on every CPU): "amx"
  // (AMX-INT8), "vnni" (AVX512-VNNI), "avx2" (AVX2's 16-bit pair sums, rows
  // quantized over 127 levels instead of 255), "scalar" (below AVX2).
  // The policy's int8_kernel (seqpack/policy.h; SEQPACK_INT8_KERNEL for the
  // front ends) picks one (one this CPU cannot run makes cpu_info() throw
  // naming it; a value that is none makes it throw as policy_from_environment
  // does).
  std::string int8_kernel;
  std::string onednn_version;  // e.g. "2.6.3"
  std::string blas;            // the BLAS's own description (OpenBLAS: version and kernel)
  int threads = 1;             // seqpack's thread count (num_threads())
  std::string kernels;         // the target of seqpack's own SIMD kernels (Highway), e.g. "AVX3"
  std::string isa_cap;         // the policy's max_cpu_isa: "avx512" (no cap), "avx2", "sse4"
};
struct Policy;
// What this CPU offers, and what the kernel settings of `policy` run on it.
CpuInfo cpu_info(const Policy& policy);

}  // namespace seqpack
