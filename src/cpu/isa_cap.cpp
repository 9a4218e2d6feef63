#include "cpu/isa_cap.h"

#include <hwy/targets.h>

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace seqpack::cpu {

namespace {

struct Cap {
  IsaLevel level = IsaLevel::avx512;
  std::string error;  // non-empty: the variable's value is not a level
};

// Every Highway target above `level` (those a Highway release does not know
// are simply absent).
int64_t targets_above(IsaLevel level) {
  int64_t disabled = 0;
  if (level < IsaLevel::avx512) {
    disabled |= HWY_AVX3 | HWY_AVX3_DL;
#ifdef HWY_AVX3_ZEN4
    disabled |= HWY_AVX3_ZEN4;
#endif
#ifdef HWY_AVX3_SPR
    disabled |= HWY_AVX3_SPR;
#endif
  }
  if (level < IsaLevel::avx2) disabled |= HWY_AVX2;
  return disabled;
}

Cap read_cap() {
  Cap cap;
  const char* value = std::getenv("SEQPACK_MAX_CPU_ISA");
  if (value == nullptr || *value == '\0') return cap;
  std::string v(value);
  for (char& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (v == "avx512") {
    cap.level = IsaLevel::avx512;
  } else if (v == "avx2") {
    cap.level = IsaLevel::avx2;
  } else if (v == "sse4") {
    cap.level = IsaLevel::sse4;
  } else {
    cap.error = std::string("SEQPACK_MAX_CPU_ISA = '") + value +
                "' is not one of avx512, avx2, sse4 (or unset)";
    return cap;
  }
  if (const int64_t disabled = targets_above(cap.level)) hwy::DisableTargets(disabled);
  return cap;
}

}  // namespace

IsaLevel isa_cap() {
  static const Cap cap = read_cap();
  if (!cap.error.empty()) throw std::invalid_argument(cap.error);
  return cap.level;
}

const char* isa_level_name(IsaLevel level) {
  switch (level) {
    case IsaLevel::sse4:
      return "sse4";
    case IsaLevel::avx2:
      return "avx2";
    case IsaLevel::avx512:
      break;
  }
  return "avx512";
}

}  // namespace seqpack::cpu
