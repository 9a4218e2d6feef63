// What oneDNN dispatches to under a cap, from what this CPU has (CPUID through
// the compiler's builtins). A cap is an upper bound: ONEDNN_MAX_CPU_ISA=AVX512_CORE
// on an AVX2-only CPU leaves oneDNN at avx2. Tests that name an ISA take the
// expectation from here, never from the cap alone (docs/testing.md).
#pragma once

#include <string>

namespace seqpack::testing {

// oneDNN's avx512_core: AVX512F with BW, VL and DQ.
inline bool cpu_has_avx512_core() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

// oneDNN's avx2 level also needs FMA.
inline bool cpu_has_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// The ISA oneDNN reports (its lower-case name) when capped by `cap`, one of
// ONEDNN_MAX_CPU_ISA's "AVX2" and "AVX512_CORE": the cap where the CPU reaches
// it, else the CPU's own level below it.
inline std::string onednn_isa_under_cap(const std::string& cap) {
  if (cap == "AVX512_CORE" && cpu_has_avx512_core()) return "avx512_core";
  if (cpu_has_avx2()) return "avx2";
  if (__builtin_cpu_supports("avx")) return "avx";
  return "sse41";
}

}  // namespace seqpack::testing
