// cpu/finite.h: an entry is NaN or infinite where its magnitude's bits (the
// sign cleared) are at least those of infinity, so the scan is an unsigned
// maximum over the magnitudes, which the compiler turns into one vector max
// per register. GCC's target_clones makes an AVX-512, an AVX2 and a baseline
// copy and picks one at load time (the answer is the same on each: no ISA
// cap applies).
#include "cpu/finite.h"

#include <cstring>

namespace seqpack::cpu {

namespace {

template <typename Bits>
__attribute__((always_inline)) inline bool magnitudes_below_infinity(const void* p, int64_t n) {
  constexpr Bits magnitude = static_cast<Bits>(sizeof(Bits) == 4 ? 0x7fffffffull
                                                                 : 0x7fffffffffffffffull);
  constexpr Bits infinity = static_cast<Bits>(sizeof(Bits) == 4 ? 0x7f800000ull
                                                                : 0x7ff0000000000000ull);
  const auto* b = static_cast<const unsigned char*>(p);
  Bits most = 0;
  for (int64_t i = 0; i < n; ++i) {
    Bits v;
    std::memcpy(&v, b + i * sizeof(Bits), sizeof v);
    v &= magnitude;
    most = v > most ? v : most;
  }
  return most < infinity;
}

}  // namespace

__attribute__((target_clones("avx512f", "avx2", "default"))) bool all_finite(const float* p,
                                                                            int64_t n) {
  return magnitudes_below_infinity<uint32_t>(p, n);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) bool all_finite(const double* p,
                                                                            int64_t n) {
  return magnitudes_below_infinity<uint64_t>(p, n);
}

}  // namespace seqpack::cpu
