// The profile's sums (rnn/profile.h).
#include "rnn/profile.h"

#include <atomic>
#include <mutex>

#include "seqpack/rnn.h"

namespace seqpack {

namespace {

std::atomic<bool> profiling{false};
std::mutex profile_mu;
RNNCoreProfile profile_sums;

}  // namespace

namespace rnn {

bool profiling_on() { return profiling.load(std::memory_order_relaxed); }

void add_to_profile(const RNNCoreProfile& parts, int64_t RNNCoreProfile::*calls) {
  const std::lock_guard<std::mutex> lock(profile_mu);
  RNNCoreProfile& s = profile_sums;
  for (double RNNCoreProfile::*p :
       {&RNNCoreProfile::forward_inputs, &RNNCoreProfile::forward_steps,
        &RNNCoreProfile::forward_states, &RNNCoreProfile::backward_prepare,
        &RNNCoreProfile::backward_steps, &RNNCoreProfile::backward_weights,
        &RNNCoreProfile::backward_inputs})
    s.*p += parts.*p;
  ++(s.*calls);
}

}  // namespace rnn

void rnn_core_profile_enable(bool on) {
  const std::lock_guard<std::mutex> lock(profile_mu);
  if (on) profile_sums = RNNCoreProfile{};
  profiling.store(on, std::memory_order_relaxed);
}

RNNCoreProfile rnn_core_profile(bool reset) {
  const std::lock_guard<std::mutex> lock(profile_mu);
  const RNNCoreProfile p = profile_sums;
  if (reset) profile_sums = RNNCoreProfile{};
  return p;
}

}  // namespace seqpack
