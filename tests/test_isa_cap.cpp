// SEQPACK_MAX_CPU_ISA (src/cpu/isa_cap.h, docs/testing.md): the cap reaches
// Highway's dispatch and the int8 kernel, cpu_info() reports it, and a value
// that names no level is an error naming it. The variable is read once per
// process, so CTest runs this program under each value (tests/CMakeLists.txt)
// and the test reads back what it was given.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <stdexcept>
#include <string>

#include "seqpack/cpu_info.h"

namespace {

std::string cap_variable() {
  const char* v = std::getenv("SEQPACK_MAX_CPU_ISA");
  return v == nullptr ? "" : v;
}

// Highway's names of the x86 targets of each level and below.
const std::set<std::string> kAvx512 = {"AVX3", "AVX3_DL", "AVX3_ZEN4", "AVX3_SPR"};
const std::set<std::string> kAvx2 = {"AVX2"};

TEST(IsaCap, CpuInfoReportsTheCapAndKernelsWithinIt) {
  const std::string v = cap_variable();
  if (v != "" && v != "avx512" && v != "avx2" && v != "sse4") {
    GTEST_SKIP() << "SEQPACK_MAX_CPU_ISA = '" << v << "': InvalidValueIsAnErrorNamingIt covers it";
  }
  const seqpack::CpuInfo info = seqpack::cpu_info();
  SCOPED_TRACE("SEQPACK_MAX_CPU_ISA='" + v + "', kernels " + info.kernels);
  EXPECT_FALSE(info.kernels.empty());
  if (v == "" || v == "avx512") {
    EXPECT_EQ(info.isa_cap, "avx512");
    return;
  }
  EXPECT_EQ(info.isa_cap, v);
  EXPECT_EQ(kAvx512.count(info.kernels), 0u) << "an AVX-512 target above the cap";
  EXPECT_FALSE(info.native_int8) << "the AVX512-VNNI int8 kernel above the cap";
  if (v == "sse4") EXPECT_EQ(kAvx2.count(info.kernels), 0u) << "AVX2 above the cap";
}

TEST(IsaCap, InvalidValueIsAnErrorNamingIt) {
  const std::string v = cap_variable();
  if (v == "" || v == "avx512" || v == "avx2" || v == "sse4") {
    GTEST_SKIP() << "a valid cap: CpuInfoReportsTheCapAndKernelsWithinIt covers it";
  }
  try {
    (void)seqpack::cpu_info();
    FAIL() << "SEQPACK_MAX_CPU_ISA = '" << v << "' was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("SEQPACK_MAX_CPU_ISA = '" + v + "'"), std::string::npos)
        << e.what();
  }
}

}  // namespace
