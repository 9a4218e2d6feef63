// Where the tool's OpenMP threads run (command.h: place_threads). libgomp reads
// OMP_PROC_BIND and OMP_PLACES once, as it loads, so a process cannot bind its
// own threads later through OpenMP; the tool runs itself again with them set.
// Binding our threads by hand (pthread_setaffinity_np per OpenMP thread) was
// tried and dropped: on the GPU machine's 16 vCPUs, 16 threads pinned that way
// took over 60 s for a main job that takes 2 s (docs/performance.md).
#include <fcntl.h>
#include <omp.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
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
// The run again starts with its standard error on /dev/null, so that what
// libgomp prints as it loads (a warning about a bad OMP_* value, which this
// process printed already) is not printed twice; this variable names the
// descriptor that holds the real one, which the run again takes back first thing.
constexpr const char* kStderrFd = "SEQPACK_THREADS_BOUND_STDERR_FD";

// Whether /proc/self/exe is the file this code was loaded from. Under the
// dynamic loader run by hand (`ld-linux-x86-64.so.2 seqpack info`) it is the
// loader, and running it again would load the first argument as a program.
// Compared by device and inode with the file mapped at this function's address.
bool exe_is_this_program() {
  struct stat exe {};
  if (::stat("/proc/self/exe", &exe) != 0) return false;
  const auto here = reinterpret_cast<uintptr_t>(&exe_is_this_program);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR, &lo, &hi) != 2) continue;
    if (here < lo || here >= hi) continue;
    const std::size_t slash = line.find('/');
    if (slash == std::string::npos) return false;
    struct stat code {};
    if (::stat(line.substr(slash).c_str(), &code) != 0) return false;
    return code.st_dev == exe.st_dev && code.st_ino == exe.st_ino;
  }
  return false;
}

// A value of the variable fit to be shown (in `info --json` too): what the tool
// itself writes there is short ASCII; anything else set by hand is not trusted.
std::string printable_reason(const char* why) {
  std::string s;
  for (const char* c = why; *c && s.size() < 200; ++c) {
    const auto u = static_cast<unsigned char>(*c);
    s += u >= 0x20 && u < 0x7f ? *c : '?';
  }
  return s;
}

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
  if (const char* fd = std::getenv(kStderrFd)) {
    char* end = nullptr;
    const long n = std::strtol(fd, &end, 10);
    if (end != fd && *end == '\0' && n > 2 && n < 1024 && ::fcntl(static_cast<int>(n), F_GETFD) != -1) {
      ::dup2(static_cast<int>(n), STDERR_FILENO);
      ::close(static_cast<int>(n));
    }
    unsetenv(kStderrFd);
  }
  if (const char* why = std::getenv(kBoundByTool)) {
    bound_why = printable_reason(why);
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
  if (!exe_is_this_program()) {
    return "not bound: /proc/self/exe is not this program (run through the dynamic loader?), "
           "so the tool cannot run itself again with OMP_PROC_BIND set";
  }
  std::fflush(nullptr);
  const int saved_stderr = ::dup(STDERR_FILENO);  // no FD_CLOEXEC: the run again takes it back
  const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (saved_stderr > 2 && devnull >= 0) {
    setenv(kStderrFd, std::to_string(saved_stderr).c_str(), 1);
    ::dup2(devnull, STDERR_FILENO);
  }
  if (devnull >= 0) ::close(devnull);
  setenv("OMP_PROC_BIND", "close", 1);
  setenv("OMP_PLACES", "cores", 1);
  setenv(kBoundByTool, p.why.c_str(), 1);
  execv("/proc/self/exe", program_argv);
  // Still here: the tool could not run itself again; its threads stay unbound.
  if (saved_stderr > 2) {
    ::dup2(saved_stderr, STDERR_FILENO);
    ::close(saved_stderr);
  }
  unsetenv(kStderrFd);
  unsetenv("OMP_PROC_BIND");
  unsetenv("OMP_PLACES");
  unsetenv(kBoundByTool);
  return "not bound: the tool could not run itself again with OMP_PROC_BIND set";
}

}  // namespace seqpack::cli
