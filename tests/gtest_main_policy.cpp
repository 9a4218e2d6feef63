// The test programs' main: GoogleTest's, after installing the policy of the
// SEQPACK_* variables (the core reads no environment; CTest runs some
// programs under SEQPACK_MAX_CPU_ISA, tests/CMakeLists.txt). A bad value
// fails the program, naming it.
#include <gtest/gtest.h>

#include <cstdio>
#include <stdexcept>

#include "seqpack/policy.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  try {
    seqpack::set_policy(seqpack::policy_from_environment());
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return RUN_ALL_TESTS();
}
