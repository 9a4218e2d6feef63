// The test programs' main: GoogleTest's, after checking the policy of the
// SEQPACK_* variables (the core reads no environment; CTest runs some
// programs under SEQPACK_MAX_CPU_ISA and SEQPACK_BF16, tests/CMakeLists.txt,
// and the tests give its settings to what they run: testing::kernels() and
// testing::config(), tests/test_util.h). A bad value fails the program,
// naming it.
#include <gtest/gtest.h>

#include <cstdio>
#include <stdexcept>

#include "seqpack/policy.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  try {
    (void)seqpack::policy_from_environment();
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return RUN_ALL_TESTS();
}
