// policy_from_environment (seqpack/policy.h): the policy of the SEQPACK_*
// variables, for the front ends to install. Nothing in the core calls it:
// the core reads no environment.
#include <cstdlib>
#include <string>

#include "policy_text.h"
#include "seqpack/policy.h"

namespace seqpack {

namespace {

std::string variable(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

// The count in variable `name`, from lo to 2^20, or 0 where it is unset or
// empty; other values throw, naming the variable, the value and what it counts.
int64_t count(const char* name, int64_t lo, const char* what) {
  const std::string v = variable(name);
  if (v.empty()) return 0;
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (*end != '\0' || n < lo || n > policy_text::kMaxCount) {
    throw policy_text::not_a_count(name, v, lo, what);
  }
  return static_cast<int64_t>(n);
}

}  // namespace

Policy policy_from_environment() {
  Policy p;
  p.max_cpu_isa = variable("SEQPACK_MAX_CPU_ISA");
  p.int8_kernel = variable("SEQPACK_INT8_KERNEL");
  p.step_split = variable("SEQPACK_STEP_SPLIT");
  p.step_units = count("SEQPACK_STEP_UNITS", 16, "hidden units");
  p.step_rows = count("SEQPACK_STEP_ROWS", 1, "rows");
  const std::string groups = variable("SEQPACK_STEP_GROUPS");
  if (!groups.empty() && groups != "0" && groups != "1") {
    throw std::invalid_argument("SEQPACK_STEP_GROUPS: '" + groups + "' is not 0 or 1");
  }
  p.step_groups = groups != "0";
  p.bf16 = variable("SEQPACK_BF16");
  policy_text::check(p);  // the words, as rnn_config checks them
  return p;
}

}  // namespace seqpack
