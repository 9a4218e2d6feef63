// libseqpack_cuda.so for the CUDA kernels (cuda_library.h): found, loaded,
// given its policy; seqpack::_cuda_library and _cuda_install_policy.
#include "cuda_library.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda_ops.h"

namespace seqpack::torch_cuda {

namespace {

std::mutex library_mutex;
std::atomic<const Library*> loaded{nullptr};  // set once, never freed (the process's)

bool is_file(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Where libseqpack_cuda.so is looked for when none is named, as the Python
// glue (seqpack/_cuda.py) looks: beside the shared library that holds this
// code, then, from its folder up four levels, build/cuda/ and build-cuda/ (and
// cuda/ of a folder named build): a build tree's library.
std::vector<std::string> candidates() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&candidates), &info) == 0 || !info.dli_fname) return {};
  std::string dir(info.dli_fname);
  const auto slash = dir.rfind('/');
  dir = slash == std::string::npos ? std::string(".") : dir.substr(0, slash);
  const std::string name = "/libseqpack_cuda.so";
  std::vector<std::string> out = {dir + name};
  for (int up = 0; up < 4 && !dir.empty(); ++up) {
    out.push_back(dir + "/build/cuda" + name);
    out.push_back(dir + "/build-cuda" + name);
    const auto cut = dir.rfind('/');
    if (dir.substr(cut == std::string::npos ? 0 : cut + 1) == "build")
      out.push_back(dir + "/cuda" + name);
    if (cut == std::string::npos || cut == 0) break;
    dir = dir.substr(0, cut);
  }
  return out;
}

// Whether two paths name the same file.
bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  return stat(a.c_str(), &sa) == 0 && stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

// The value of one of the policy's variables: where `value` (unset or empty:
// `fallback`) is one of `names`, its index; else an error naming the variable.
int choice_of(const char* variable, const char* fallback,
              std::initializer_list<const char*> names) {
  const char* set = std::getenv(variable);
  const std::string value = set && *set ? set : fallback;
  int index = 0;
  std::string listed;
  for (const char* name : names) {
    if (value == name) return index;
    listed += (index == 0 ? "'" : index + 1 == static_cast<int>(names.size()) ? " or '" : ", '") +
              std::string(name) + "'";
    ++index;
  }
  C10_THROW_ERROR(ValueError, c10::str("seqpack CUDA: ", variable, " = '", value, "' is not ",
                                       listed));
}

}  // namespace

seqpack_cuda_policy policy_from_environment() {
  seqpack_cuda_policy p{};
  p.version = SEQPACK_CUDA_POLICY_VERSION;
  p.kernel = choice_of("SEQPACK_CUDA_KERNEL", "simple", {"simple", "persistent", "cluster"});
  p.gemm = choice_of("SEQPACK_CUDA_GEMM", "simt", {"simt", "wmma"});
  if (const char* tile = std::getenv("SEQPACK_CUDA_GEMM_TILE"); tile && *tile) {
    const std::string value = tile;
    TORCH_CHECK_VALUE(value == "32" || value == "64", "seqpack CUDA: SEQPACK_CUDA_GEMM_TILE = '",
                      value, "' is not 32 or 64");
    p.gemm_tile = value == "32" ? 32 : 64;
  }
  if (const char* cluster = std::getenv("SEQPACK_CUDA_CLUSTER"); cluster && *cluster) {
    char* end = nullptr;
    const long n = std::strtol(cluster, &end, 10);
    TORCH_CHECK_VALUE(end != cluster && *end == '\0' && n >= 1 && n <= 16,
                      "seqpack CUDA: SEQPACK_CUDA_CLUSTER = '", cluster,
                      "' is not a block count from 1 to 16");
    p.cluster_size = static_cast<int>(n);
  }
  p.cluster_gather = choice_of("SEQPACK_CUDA_CLUSTER_GATHER", "shared", {"shared", "global"});
  if (const char* mma = std::getenv("SEQPACK_CUDA_CLUSTER_MMA"); mma && *mma) {
    const std::string value = mma;
    TORCH_CHECK_VALUE(value == "0" || value == "1", "seqpack CUDA: SEQPACK_CUDA_CLUSTER_MMA = '",
                      value, "' is not 0 or 1");
    p.cluster_mma = value == "1";
  } else {
    p.cluster_mma = 1;
  }
  p.tf32 = 1;  // each call's allow_tf32 (torch's setting) decides
  return p;
}

namespace {

// Loads `path` (a file, or a bare name for the loader's search) and installs
// the policy of the environment in it; errors name it.
const Library* load(const std::string& path, const std::string& why) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  TORCH_CHECK(handle, "seqpack CUDA: cannot load ", path, " (", why, "): ", dlerror());
  auto lib = std::make_unique<Library>();
  lib->path = path;
  auto bind = [&](auto& f, const char* name) {
    f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(handle, name));
    TORCH_CHECK(f, "seqpack CUDA: ", path, " has no function ", name);
  };
  bind(lib->abi_version, "seqpack_cuda_abi_version");
  const int version = lib->abi_version();
  TORCH_CHECK(version == SEQPACK_CUDA_ABI_VERSION, "seqpack CUDA: ", path, " has ABI version ",
              version, ", these kernels need ", SEQPACK_CUDA_ABI_VERSION);
  bind(lib->last_error, "seqpack_cuda_last_error");
  bind(lib->buffer_sizes, "seqpack_cuda_rnn_buffer_sizes");
  bind(lib->forward, "seqpack_cuda_rnn_forward");
  bind(lib->backward, "seqpack_cuda_rnn_backward");
  bind(lib->set_policy, "seqpack_cuda_set_policy");
  bind(lib->get_policy, "seqpack_cuda_get_policy");
  const seqpack_cuda_policy policy = policy_from_environment();
  if (lib->set_policy(&policy) != SEQPACK_CUDA_OK)
    TORCH_CHECK(false, "seqpack CUDA: ", path, " refuses the policy: ", lib->last_error());
  return lib.release();
}

// The library to load when none was named, and why it is that one:
// SEQPACK_CUDA_LIBRARY (only it, where set: one that is not a file is an
// error naming it), else the first of candidates() there is, else the
// loader's search. The one place these operators read SEQPACK_CUDA_LIBRARY;
// python/seqpack/_cuda.py's find_library looks alike.
std::pair<std::string, std::string> find_library() {
  const char* named = std::getenv("SEQPACK_CUDA_LIBRARY");
  if (named && *named) {
    TORCH_CHECK(is_file(named), "seqpack CUDA: SEQPACK_CUDA_LIBRARY='", named,
                "' names no library file (missing, or not a regular file)");
    return {named, "SEQPACK_CUDA_LIBRARY"};
  }
  for (const std::string& path : candidates())
    if (is_file(path)) return {path, "found beside the seqpack operators or in their build"};
  return {"libseqpack_cuda.so", "the loader's search; SEQPACK_CUDA_LIBRARY names another"};
}

const Library* load_found() {
  const auto [path, why] = find_library();
  return load(path, why);
}

}  // namespace

const Library& library() {
  if (const Library* lib = loaded.load(std::memory_order_acquire)) return *lib;
  std::lock_guard<std::mutex> lock(library_mutex);
  if (!loaded.load(std::memory_order_relaxed)) loaded.store(load_found(), std::memory_order_release);
  return *loaded.load(std::memory_order_relaxed);
}

void check(const Library& lib, int status) {
  if (status == SEQPACK_CUDA_OK) return;
  const char* message = lib.last_error();
  if (message && *message) TORCH_CHECK(false, message);
  TORCH_CHECK(false, "seqpack CUDA: error ", status, " from ", lib.path);
}


std::vector<int64_t> install_policy() {
  const Library& lib = library();
  const seqpack_cuda_policy wanted = policy_from_environment();
  check(lib, lib.set_policy(&wanted));
  seqpack_cuda_policy p{};
  check(lib, lib.get_policy(&p));
  return policy_fields(p);
}

std::vector<int64_t> policy_fields(const seqpack_cuda_policy& p) {
  return {p.version,      p.kernel,         p.gemm,        p.gemm_tile,
          p.cluster_size, p.cluster_gather, p.cluster_mma, p.tf32};
}

std::string use_library(c10::string_view path) {
  if (path.empty()) return library().path;
  const std::string wanted(path);
  std::lock_guard<std::mutex> lock(library_mutex);
  if (const Library* lib = loaded.load(std::memory_order_relaxed)) {
    TORCH_CHECK_VALUE(lib->path == wanted || same_file(lib->path, wanted),
                      "seqpack::_cuda_library: '", wanted,
                      "' asked for, but the CUDA kernels already use '", lib->path, "'");
    return lib->path;
  }
  TORCH_CHECK_VALUE(is_file(wanted), "seqpack::_cuda_library: '", wanted,
                    "' names no library file (missing, or not a regular file)");
  loaded.store(load(wanted, "seqpack::_cuda_library"), std::memory_order_release);
  return wanted;
}

}  // namespace seqpack::torch_cuda
