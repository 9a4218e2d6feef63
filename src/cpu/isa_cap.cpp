#include "cpu/isa_cap.h"

#include <hwy/targets.h>

#include <array>
#include <cstdint>

namespace seqpack::cpu {

namespace {

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

std::size_t hwy_target_index(IsaLevel cap) {
  // Per cap, once: the CPU's targets (Highway's SupportedTargets, which
  // nothing here narrows) less those above the cap, turned into the table
  // index as Highway's ChosenTarget::Update and GetIndex do.
  static const std::array<std::size_t, 6> index = [] {
    std::array<std::size_t, 6> r{};
    const int64_t supported = hwy::SupportedTargets();
    for (std::size_t l = 0; l < r.size(); ++l) {
      const int64_t targets = supported & ~targets_above(static_cast<IsaLevel>(l));
      const int64_t mask = (HWY_CHOSEN_TARGET_SHIFT(targets) | HWY_CHOSEN_TARGET_MASK_SCALAR) &
                           HWY_CHOSEN_TARGET_MASK_TARGETS;
      r[l] = hwy::Num0BitsBelowLS1Bit_Nonzero64(static_cast<uint64_t>(mask));
    }
    return r;
  }();
  return index[static_cast<std::size_t>(cap)];
}

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
