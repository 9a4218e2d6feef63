// Who runs a CUDA call: seqpack's kernels or torch's (cuda_choice.h);
// seqpack::_cuda_layers, _cuda_choice_times and _cuda_last_choice.
#include "cuda_choice.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace seqpack::torch_cuda {

namespace {

constexpr int kRepeats = 3;

struct Choices {
  std::mutex mutex;
  std::string mode;  // "" until read
  std::vector<double> injected;  // the tests' times: seqpack's, torch's
  std::map<std::string, Choice> decided;
};

Choices& choices() {
  static Choices* c = new Choices();  // the process's, never destroyed
  return *c;
}

thread_local Choice last;

std::string checked_mode(const std::string& value, const char* where) {
  const std::string mode = value.empty() ? "auto" : value;
  TORCH_CHECK_VALUE(mode == "auto" || mode == "seqpack" || mode == "torch", where, " = '", value,
                    "': use 'auto' (the faster of seqpack's CUDA kernels and torch's, per "
                    "configuration; the default), 'seqpack' (seqpack's) or 'torch' (torch's)");
  return mode;
}

// The mode in effect (Choices::mutex held).
const std::string& current_mode(Choices& c) {
  if (c.mode.empty()) {
    const char* set = std::getenv("SEQPACK_CUDA_LAYERS");
    c.mode = checked_mode(set ? set : "", "SEQPACK_CUDA_LAYERS");
  }
  return c.mode;
}

double seconds(const Backend& backend, const at::Device& device,
               c10::function_ref<void()> run) {
  backend.synchronize(device);
  const auto start = std::chrono::steady_clock::now();
  run();
  backend.synchronize(device);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Times both sides (cuda_choice.h) and remembers the faster for `key`.
Choice decide(const Backend& backend, const std::string& key, const at::Device& device,
              c10::function_ref<void()> ours, c10::function_ref<void()> theirs) {
  std::vector<double> injected;
  {
    std::lock_guard<std::mutex> lock(choices().mutex);
    injected = choices().injected;
  }
  const std::array<const char*, 2> names = {"seqpack", "torch"};
  std::array<double, 2> time = {-1, -1};
  std::array<std::string, 2> error;
  std::exception_ptr first;
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < 2; ++i) {
      const c10::function_ref<void()> run = i == 0 ? ours : theirs;
      try {
        run();  // warm-up: a first call's library loads and plans
        for (int r = 0; r < kRepeats; ++r) {
          const double t = seconds(backend, device, run);
          time[i] = time[i] < 0 ? t : std::min(time[i], t);
        }
        if (injected.size() == 2) time[i] = injected[i];
      } catch (const std::exception& e) {
        time[i] = -1;
        error[i] = e.what();
        if (!first) first = std::current_exception();
      }
    }
  }
  if (time[0] < 0 && time[1] < 0) std::rethrow_exception(first);
  const size_t fast = time[0] < 0 ? 1 : time[1] < 0 ? 0 : time[1] < time[0] ? 1 : 0;
  std::string why = std::string("SEQPACK_CUDA_LAYERS=auto: ") + names[fast] +
                    " was faster for this configuration (";
  for (size_t i = 0, n = 0; i < 2; ++i)
    if (time[i] >= 0)
      why += c10::str(n++ ? ", " : "", names[i], " ", std::llround(time[i] * 1e6), " us");
  for (size_t i = 0; i < 2; ++i)
    if (!error[i].empty()) why += c10::str("; ", names[i], " failed: ", error[i]);
  why += ")";
  std::lock_guard<std::mutex> lock(choices().mutex);
  return choices().decided.emplace(key, Choice{names[fast], why}).first->second;
}

}  // namespace

Choice choose(const Backend& backend, bool traced, const at::Device& device,
              c10::function_ref<std::string()> key, c10::function_ref<void()> ours,
              c10::function_ref<void()> theirs) {
  std::string mode;
  {
    std::lock_guard<std::mutex> lock(choices().mutex);
    mode = current_mode(choices());
  }
  if (mode != "auto") return last = {mode, "SEQPACK_CUDA_LAYERS=" + mode};
  if (traced) return last = {"seqpack", "SEQPACK_CUDA_LAYERS=auto: traced (torch.compile)"};
  const std::string k = key();
  {
    std::lock_guard<std::mutex> lock(choices().mutex);
    const auto it = choices().decided.find(k);
    if (it != choices().decided.end()) return last = it->second;
  }
  return last = decide(backend, k, device, ours, theirs);
}

std::string layers(c10::string_view mode) {
  std::lock_guard<std::mutex> lock(choices().mutex);
  if (!mode.empty()) choices().mode = checked_mode(std::string(mode), "seqpack::_cuda_layers: mode");
  return current_mode(choices());
}

void choice_times(at::ArrayRef<double> seconds, bool forget) {
  TORCH_CHECK_VALUE(seconds.empty() || seconds.size() == 2,
                    "seqpack::_cuda_choice_times: seconds has ", seconds.size(),
                    " values; two (seqpack's, torch's) or none expected");
  std::lock_guard<std::mutex> lock(choices().mutex);
  choices().injected = seconds.vec();
  if (forget) choices().decided.clear();
}

std::tuple<std::string, std::string> last_choice() { return {last.impl, last.why}; }

}  // namespace seqpack::torch_cuda
