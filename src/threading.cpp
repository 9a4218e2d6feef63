#include "seqpack/threading.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>


namespace seqpack {

void set_num_threads(int n) {
  if (n < 1) throw std::invalid_argument("set_num_threads: n = " + std::to_string(n) + " must be >= 1");
  // seqpack's threads are OpenMP's: its GEMMs split large products over them
  // and keep OpenBLAS's own pool at one thread while they run (cpu/gemm.h).
  omp_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

namespace {

// "0-3,8,10-11" for sorted CPU numbers.
std::string cpu_ranges(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace

std::string pin_threads(std::string* why) {
  const auto no = [why](const std::string& reason) {
    if (why) *why = reason;
    return std::string();
  };
  const char* env = std::getenv("SEQPACK_PIN_THREADS");
  const std::string mode = env ? env : "";
  if (!mode.empty() && mode != "0" && mode != "1") {
    throw std::invalid_argument("SEQPACK_PIN_THREADS: '" + mode + "' is not 0 or 1");
  }
  if (mode == "0") return no("SEQPACK_PIN_THREADS=0");
  for (const char* placement : {"OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY"}) {
    const char* v = std::getenv(placement);
    if (v && *v) return no(std::string(placement) + " places them");
  }
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) return no("the affinity mask is unreadable");
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mask)) cpus.push_back(c);
  const int n = omp_get_max_threads();
  const auto count = static_cast<int>(cpus.size());
  if (n > count) {
    return no(std::to_string(n) + " threads on " + std::to_string(count) + " CPUs");
  }
  if (mode.empty() && n != count) {
    return no(std::to_string(n) + (n == 1 ? " thread of " : " threads of ") + std::to_string(count) +
              " CPUs (SEQPACK_PIN_THREADS=1 pins them)");
  }
  std::atomic<int> failed{0};
#pragma omp parallel num_threads(n)
  {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[static_cast<std::size_t>(omp_get_thread_num())], &one);
    if (omp_get_num_threads() != n || pthread_setaffinity_np(pthread_self(), sizeof(one), &one) != 0)
      failed.fetch_add(1, std::memory_order_relaxed);
  }
  if (failed.load() != 0) {
    return no(std::to_string(failed.load()) + " of " + std::to_string(n) + " threads could not be pinned");
  }
  cpus.resize(static_cast<std::size_t>(n));
  if (why) why->clear();
  return cpu_ranges(cpus);
}

}  // namespace seqpack
