// libFuzzer entry point; the checks live in fuzz_checks.h so that
// tests/test_regressions.cpp can replay inputs through them.
#include "fuzz_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  seqpack::fuzz::check_model_files(data, size);
  return 0;
}
