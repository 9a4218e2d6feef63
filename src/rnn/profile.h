// rnn_core_profile (include/seqpack/rnn.h): where the forwards' and
// backwards' time goes, summed over calls while profiling is on. A call
// keeps a PartClock, marks the end of each part, and adds its parts to the
// sums when it ends; while profiling is off no clock is read.
#pragma once

#include <chrono>
#include <cstdint>

#include "seqpack/rnn.h"

namespace seqpack::rnn {

// Whether profiling is on (rnn_core_profile_enable).
bool profiling_on();
// Adds one call's parts to the sums and counts it in `calls`.
void add_to_profile(const RNNCoreProfile& parts, int64_t RNNCoreProfile::*calls);

class PartClock {
 public:
  using Part = double RNNCoreProfile::*;
  explicit PartClock(int64_t RNNCoreProfile::*calls)
      : on_(profiling_on()), calls_(calls) {
    if (on_) last_ = Clock::now();
  }
  PartClock(const PartClock&) = delete;
  PartClock& operator=(const PartClock&) = delete;
  // Charges the time since the previous mark (or the start) to `part`.
  void mark(Part part) {
    if (!on_) return;
    const Clock::time_point now = Clock::now();
    mine_.*part += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }
  ~PartClock() {
    if (on_) add_to_profile(mine_, calls_);
  }

 private:
  using Clock = std::chrono::steady_clock;
  const bool on_;
  int64_t RNNCoreProfile::*calls_;
  Clock::time_point last_;
  RNNCoreProfile mine_;
};

}  // namespace seqpack::rnn
