// seqpack::pin_threads (include/seqpack/threading.h): which threads it pins,
// to which CPUs, and when it leaves them alone.
#include <gtest/gtest.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "seqpack/threading.h"

namespace seqpack {
namespace {

// Sets (or, with nullopt, unsets) an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// The CPUs of this thread's affinity mask, in order.
std::vector<int> mask_cpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  EXPECT_EQ(pthread_getaffinity_np(pthread_self(), sizeof(mask), &mask), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mask)) cpus.push_back(c);
  return cpus;
}

// Clears the variables that would make pin_threads step aside.
struct NoPlacement {
  ScopedEnv a{"OMP_PROC_BIND", std::nullopt}, b{"OMP_PLACES", std::nullopt},
      c{"GOMP_CPU_AFFINITY", std::nullopt}, d{"KMP_AFFINITY", std::nullopt};
};

// Runs first: the process's mask is still whole here (the test below pins
// this thread to one CPU of it).
TEST(Threading, ByDefaultPinsOnlyThreadsThatFillTheMask) {
  const NoPlacement none;
  const ScopedEnv pin("SEQPACK_PIN_THREADS", std::nullopt);
  const int before = num_threads();
  const std::vector<int> cpus = mask_cpus();
  const auto count = static_cast<int>(cpus.size());
  ASSERT_GE(count, 1);
  std::string why;
  set_num_threads(count + 1);
  EXPECT_EQ(pin_threads(&why), "");
  EXPECT_EQ(why, std::to_string(count + 1) + " threads on " + std::to_string(count) + " CPUs");
  if (count >= 2) {
    set_num_threads(count - 1);
    EXPECT_EQ(pin_threads(&why), "");
    EXPECT_NE(why.find("SEQPACK_PIN_THREADS=1 pins them"), std::string::npos) << why;
  }
  set_num_threads(before);
}

TEST(Threading, PinsEachThreadToOneCpuOfTheMaskInOrder) {
  const NoPlacement none;
  const ScopedEnv pin("SEQPACK_PIN_THREADS", "1");
  const int before = num_threads();
  const std::vector<int> cpus = mask_cpus();
  const int n = std::min<int>(4, static_cast<int>(cpus.size()));
  set_num_threads(n);
  std::string why = "unset";
  const std::string pinned = pin_threads(&why);
  // "0-3" style: the first n CPUs of the mask.
  std::string expect;
  for (int i = 0; i < n;) {
    int j = i;
    while (j + 1 < n && cpus[j + 1] == cpus[j] + 1) ++j;
    expect += (expect.empty() ? "" : ",") + std::to_string(cpus[i]) +
              (j > i ? "-" + std::to_string(cpus[j]) : "");
    i = j + 1;
  }
  EXPECT_EQ(pinned, expect);
  EXPECT_EQ(why, "");
  // Each thread of a later region (OpenMP's pool keeps its threads) runs on
  // its CPU alone, the calling thread on the first.
  std::vector<std::vector<int>> seen(static_cast<std::size_t>(n));
#pragma omp parallel num_threads(n)
  seen[static_cast<std::size_t>(omp_get_thread_num())] = mask_cpus();
  for (int t = 0; t < n; ++t) {
    EXPECT_EQ(seen[static_cast<std::size_t>(t)], std::vector<int>{cpus[static_cast<std::size_t>(t)]})
        << "thread " << t;
  }
  set_num_threads(before);
}

TEST(Threading, LeavesThreadsThatOpenMpPlacesAlone) {
  const ScopedEnv pin("SEQPACK_PIN_THREADS", "1");
  for (const char* placement : {"OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY"}) {
    const NoPlacement none;
    const ScopedEnv set(placement, "close");
    std::string why;
    EXPECT_EQ(pin_threads(&why), "") << placement;
    EXPECT_EQ(why, std::string(placement) + " places them");
  }
  const ScopedEnv off("SEQPACK_PIN_THREADS", "0");
  std::string why;
  EXPECT_EQ(pin_threads(&why), "");
  EXPECT_EQ(why, "SEQPACK_PIN_THREADS=0");
}

TEST(Threading, BadSettingsAreRefusedByName) {
  for (const char* bad : {"yes", "2", " 1"}) {
    const ScopedEnv pin("SEQPACK_PIN_THREADS", bad);
    try {
      pin_threads();
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "' is not 0 or 1"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(set_num_threads(0), std::invalid_argument);
}

}  // namespace
}  // namespace seqpack
