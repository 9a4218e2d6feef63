// SEQPACK_MAX_CPU_ISA (src/cpu/isa_cap.h, docs/testing.md): the cap of the
// policy reaches Highway's dispatch and the int8 kernel, cpu_info(policy)
// reports it, and a value that names no level is an error naming it. CTest
// runs this program under each value (tests/CMakeLists.txt) and the test
// reads back what it was given; tests/test_policy.cpp gives other caps
// within a process.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <stdexcept>
#include <string>

#include "cli_run.h"
#include "seqpack/cpu_info.h"
#include "seqpack/policy.h"
#include "test_util.h"

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
  const seqpack::CpuInfo info = seqpack::cpu_info(seqpack::testing::policy());
  SCOPED_TRACE("SEQPACK_MAX_CPU_ISA='" + v + "', kernels " + info.kernels);
  EXPECT_FALSE(info.kernels.empty());
  if (v == "" || v == "avx512") {
    EXPECT_EQ(info.isa_cap, "avx512");
    return;
  }
  EXPECT_EQ(info.isa_cap, v);
  EXPECT_EQ(kAvx512.count(info.kernels), 0u) << "an AVX-512 target above the cap";
  EXPECT_FALSE(info.native_int8) << "the AVX512-VNNI int8 kernel above the cap";
  // int8 still runs: AVX2's kernel under avx2 (every CPU here has AVX2), the
  // scalar one under sse4.
  EXPECT_EQ(info.int8_kernel, v == "sse4" ? "scalar" : "avx2");
  if (v == "sse4") EXPECT_EQ(kAvx2.count(info.kernels), 0u) << "AVX2 above the cap";
}

TEST(IsaCap, InvalidValueIsAnErrorNamingIt) {
  const std::string before = cap_variable();
  ASSERT_EQ(setenv("SEQPACK_MAX_CPU_ISA", "avx9", 1), 0);
  try {
    (void)seqpack::policy_from_environment();
    ADD_FAILURE() << "SEQPACK_MAX_CPU_ISA = 'avx9' was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("SEQPACK_MAX_CPU_ISA = 'avx9'"), std::string::npos)
        << e.what();
  }
  ASSERT_EQ(setenv("SEQPACK_MAX_CPU_ISA", before.c_str(), 1), 0);
  // The cap in force is the one the program was given.
  EXPECT_EQ(seqpack::cpu_info(seqpack::testing::policy()).isa_cap,
            before.empty() ? "avx512" : before);
}

// seqpack info reports the cap and the kernels' target; a bad value is the
// CLI's error naming it.
TEST(IsaCap, InfoReportsItAndRefusesABadValue) {
  using seqpack::testing::run_cli;
  const auto capped = run_cli("info --json", "SEQPACK_MAX_CPU_ISA=sse4");
  ASSERT_EQ(capped.status, 0) << capped.err;
  EXPECT_NE(capped.out.find("\"isa_cap\":\"sse4\""), std::string::npos) << capped.out;
  EXPECT_EQ(capped.out.find("\"kernels\":\"AVX"), std::string::npos) << capped.out;
  const auto table = run_cli("info", "SEQPACK_MAX_CPU_ISA=avx2");
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_NE(table.out.find("SEQPACK_MAX_CPU_ISA cap: avx2"), std::string::npos) << table.out;
  const auto bad = run_cli("info", "SEQPACK_MAX_CPU_ISA=avx9");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("seqpack: error:"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("SEQPACK_MAX_CPU_ISA = 'avx9'"), std::string::npos) << bad.err;
}

}  // namespace
