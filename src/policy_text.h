// The words of the policy's errors (seqpack/policy.h), shared by rnn_config
// and kernel_config (src/policy.cpp) and policy_from_environment (src/policy_environment.cpp):
// each names the setting by its variable and quotes the value as given.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "seqpack/policy.h"

namespace seqpack::policy_text {

inline constexpr int64_t kMaxCount = int64_t{1} << 20;

inline std::invalid_argument not_a_count(const char* name, const std::string& value, int64_t lo,
                                         const char* what) {
  return std::invalid_argument(std::string(name) + ": '" + value + "' is not a count of " + what +
                               " from " + std::to_string(lo) + " to " + std::to_string(kMaxCount));
}

// Throws as rnn_config does where a setting of `policy` is not one of its
// values (src/policy.cpp).
void check(const Policy& policy);

}  // namespace seqpack::policy_text
