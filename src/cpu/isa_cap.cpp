#include "cpu/isa_cap.h"

#include <hwy/targets.h>

#include <atomic>
#include <cstdint>

namespace seqpack::cpu {

namespace {

std::atomic<int> cap{static_cast<int>(IsaLevel::avx512)};
std::atomic<uint64_t> generation{0};

// Every Highway target above `level` (those a Highway release does not know
// are simply absent).
int64_t targets_above(IsaLevel level) {
  int64_t disabled = 0;
#ifdef HWY_AVX3_SPR
  if (level < IsaLevel::avx512) disabled |= HWY_AVX3_SPR;
#endif
#ifdef HWY_AVX3_ZEN4
  if (level < IsaLevel::avx3_zen4) disabled |= HWY_AVX3_ZEN4;
#endif
  if (level < IsaLevel::avx3_dl) disabled |= HWY_AVX3_DL;
  if (level < IsaLevel::avx3) disabled |= HWY_AVX3;
  if (level < IsaLevel::avx2) disabled |= HWY_AVX2;
  return disabled;
}

}  // namespace

void set_isa_cap(IsaLevel level) {
  if (cap.exchange(static_cast<int>(level), std::memory_order_relaxed) == static_cast<int>(level))
    return;  // Highway's choice stands
  // Highway chooses its target again at the next dispatch (every target
  // again where nothing is above the cap).
  hwy::DisableTargets(targets_above(level));
  generation.fetch_add(1, std::memory_order_relaxed);
}

uint64_t isa_generation() { return generation.load(std::memory_order_relaxed); }

IsaLevel isa_cap() { return static_cast<IsaLevel>(cap.load(std::memory_order_relaxed)); }

const char* isa_level_name(IsaLevel level) {
  switch (level) {
    case IsaLevel::sse4:
      return "sse4";
    case IsaLevel::avx2:
      return "avx2";
    case IsaLevel::avx3:
      return "avx3";
    case IsaLevel::avx3_dl:
      return "avx3_dl";
    case IsaLevel::avx3_zen4:
      return "avx3_zen4";
    case IsaLevel::avx512:
      break;
  }
  return "avx512";
}

}  // namespace seqpack::cpu
