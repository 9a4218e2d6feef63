// Where the tool's OpenMP threads run (command.h: place_threads). libgomp reads
// OMP_PROC_BIND and OMP_PLACES once, as it loads, so a process cannot bind its
// own threads later through OpenMP; the tool runs itself again with them set.
// Binding our threads by hand (pthread_setaffinity_np per OpenMP thread) was
// tried and dropped: on the GPU machine's 16 vCPUs, 16 threads pinned that way
// took over 60 s for a main job that takes 2 s (docs/performance.md).
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "command.h"

namespace seqpack::cli {
namespace {

char** program_argv = nullptr;
std::string bound_why;  // why the tool bound the threads of this process, if it did

// Set in the environment of the process the tool runs again, so that it can
// say the binding was its own; cleared there at once.
constexpr const char* kBoundByTool = "SEQPACK_THREADS_BOUND_BY_TOOL";

int affinity_cpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) return 0;
  return CPU_COUNT(&mask);
}

}  // namespace

ThreadPlacement placement_for(int threads, int cpus, const EnvLookup& env) {
  const char* knob = env("SEQPACK_BIND_THREADS");
  const std::string mode = knob ? knob : "";
  if (!mode.empty() && mode != "0" && mode != "1") {
    throw std::invalid_argument("SEQPACK_BIND_THREADS: '" + mode + "' is not 0 or 1");
  }
  for (const char* var : kPlacementVariables) {
    const char* v = env(var);
    if (v && *v) return {false, std::string(var) + " is set: OpenMP places the threads as it says"};
  }
  if (mode == "0") return {false, "SEQPACK_BIND_THREADS=0"};
  if (mode == "1") return {true, "as SEQPACK_BIND_THREADS=1 asks"};
  if (cpus <= 0) return {false, "the CPUs this process may use are unknown"};
  if (threads != cpus) {
    return {false, std::to_string(threads) + (threads == 1 ? " thread" : " threads") + " on " +
                       std::to_string(cpus) + " CPUs (SEQPACK_BIND_THREADS=1 binds them)"};
  }
  return {true, "as the threads fill the " + std::to_string(cpus) + " CPUs"};
}

void set_program_args(char** argv) {
  program_argv = argv;
  if (const char* why = std::getenv(kBoundByTool)) {
    bound_why = why;
    unsetenv(kBoundByTool);
  }
}

std::string place_threads(int threads) {
  if (threads <= 0) threads = omp_get_max_threads();
  const ThreadPlacement p = placement_for(threads, affinity_cpus(), [](const char* name) {
    return static_cast<const char*>(std::getenv(name));
  });
  if (omp_get_proc_bind() != omp_proc_bind_false) {
    return bound_why.empty() ? std::string("bound by OpenMP's settings in the environment")
                             : "bound to cores by seqpack, " + bound_why +
                                   " (OMP_PROC_BIND=close OMP_PLACES=cores)";
  }
  if (!p.bind || !program_argv) return "not bound: " + p.why;
  std::fflush(nullptr);
  setenv("OMP_PROC_BIND", "close", 1);
  setenv("OMP_PLACES", "cores", 1);
  setenv(kBoundByTool, p.why.c_str(), 1);
  execv("/proc/self/exe", program_argv);
  // Still here: the tool could not run itself again; its threads stay unbound.
  unsetenv("OMP_PROC_BIND");
  unsetenv("OMP_PLACES");
  unsetenv(kBoundByTool);
  return "not bound: the tool could not run itself again with OMP_PROC_BIND set";
}

}  // namespace seqpack::cli
