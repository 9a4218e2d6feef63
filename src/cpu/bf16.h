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

// The float of bf16 bits (exact: bf16 is float's upper half).
inline float float_of_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

}  // namespace seqpack::cpu
