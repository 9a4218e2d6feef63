// bf16 of one float, as AVX512-BF16's vcvtneps2bf16 converts it: round to
// nearest even, NaN kept NaN (quiet: rounding could carry a NaN's mantissa
// into infinity), subnormals flushed to zero of the same sign. The reference
// of every fp32 -> bf16 conversion (f32_to_bf16, the gate kernels' bf16 rows).
#pragma once

#include <cstdint>
#include <cstring>

namespace seqpack::cpu {

inline uint16_t bf16_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7F800000u) == 0) return static_cast<uint16_t>((u >> 16) & 0x8000u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Whether the CPU converts fp32 to bf16 itself (AVX512-BF16's vcvtneps2bf16,
// the same bits as bf16_of), which the conversions use where it does. The
// bf16 engine runs without it too (emulated: SEQPACK_BF16=emulated), on
// AVX-512 CPUs without BF16 among others, so every use of the instruction
// checks this first.
inline bool cpu_converts_bf16() {
  static const bool yes = __builtin_cpu_supports("avx512bf16");
  return yes;
}

// The float of bf16 bits (exact: bf16 is float's upper half).
inline float float_of_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

}  // namespace seqpack::cpu
