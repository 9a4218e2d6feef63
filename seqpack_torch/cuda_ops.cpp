// seqpack::rnn and rnn_padded on CUDA tensors over libseqpack_cuda (cuda_ops.h).
//
// GCC 14 sees an out-of-bounds memmove (-Warray-bounds, -Wstringop-overflow)
// in the std::vector<bool> that torch::autograd::Function::apply reserves (a
// false positive in that header, inlined into the backward below); the
// warning's location is the header's, after these lines.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 14
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif

#include "cuda_ops.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <torch/autograd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <initializer_list>
#include <mutex>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "seqpack/cuda.h"

namespace seqpack::torch_cuda {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- the library -----------------------------------------------------------

struct Library {
  std::string path;
  int (*abi_version)() = nullptr;
  const char* (*last_error)() = nullptr;
  int (*buffer_sizes)(int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int,
                      size_t*, size_t*) = nullptr;
  int (*forward)(const seqpack_cuda_rnn_args*) = nullptr;
  int (*backward)(const seqpack_cuda_rnn_args*) = nullptr;
  int (*set_policy)(const seqpack_cuda_policy*) = nullptr;
  int (*get_policy)(seqpack_cuda_policy*) = nullptr;
};

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

// ---- sizes and checks ------------------------------------------------------

struct Sizes {
  int mode = 0, dtype = 0;
  int64_t gates = 0, rows = 0, input = 0, batch = 0, hidden = 0, proj = 0, layers = 0, dirs = 1,
          hout = 0, width = 0, per = 0;
  bool biases = false, lstm = false, gru = false;
};

int mode_of(c10::string_view mode) {
  if (mode == "LSTM") return SEQPACK_CUDA_LSTM;
  if (mode == "GRU") return SEQPACK_CUDA_GRU;
  if (mode == "RNN_TANH") return SEQPACK_CUDA_RNN_TANH;
  if (mode == "RNN_RELU") return SEQPACK_CUDA_RNN_RELU;
  C10_THROW_ERROR(ValueError, c10::str("seqpack::rnn: mode = '", mode,
                                       "' is not one of 'LSTM', 'GRU', 'RNN_TANH', 'RNN_RELU'"));
}

int dtype_of(const Tensor& data) {
  switch (data.scalar_type()) {
    case at::kFloat:
      return SEQPACK_CUDA_FLOAT32;
    case at::kHalf:
      return SEQPACK_CUDA_FLOAT16;
    case at::kBFloat16:
      return SEQPACK_CUDA_BFLOAT16;
    default:
      C10_THROW_ERROR(TypeError, c10::str("seqpack::rnn on ", data.device(), ": data has dtype ",
                                          data.scalar_type(),
                                          "; float32, float16 or bfloat16 expected"));
  }
}

// The checks torch makes of the same call (the library checks batch_sizes and
// the buffers itself), with the offending value in each message.
Sizes checked_sizes(const Tensor& data, const Tensor& batch_sizes, const Tensor& h0,
                    const Tensor& c0, at::TensorList weights, c10::string_view mode,
                    int64_t hidden_size, int64_t num_layers, bool bias, bool bidirectional,
                    int64_t proj_size) {
  Sizes s;
  s.mode = mode_of(mode);
  s.dtype = dtype_of(data);
  s.lstm = s.mode == SEQPACK_CUDA_LSTM;
  s.gru = s.mode == SEQPACK_CUDA_GRU;
  s.gates = s.lstm ? 4 : s.gru ? 3 : 1;
  TORCH_CHECK(data.dim() == 2, "seqpack::rnn: data has shape ", data.sizes(),
              "; (rows, input_size) expected");
  TORCH_CHECK(batch_sizes.device().is_cpu() && batch_sizes.dim() == 1 &&
                  batch_sizes.scalar_type() == at::kLong,
              "seqpack::rnn: batch_sizes must be a 1-D int64 CPU tensor, got ",
              batch_sizes.scalar_type(), " of shape ", batch_sizes.sizes(), " on ",
              batch_sizes.device());
  TORCH_CHECK_VALUE(num_layers >= 1, "seqpack::rnn: num_layers = ", num_layers,
                    " must be positive");
  TORCH_CHECK_VALUE(hidden_size >= 1, "seqpack::rnn: hidden_size = ", hidden_size,
                    " must be positive");
  TORCH_CHECK_VALUE(proj_size >= 0 && (proj_size == 0 || s.lstm), "seqpack::rnn: proj_size = ",
                    proj_size, " (only LSTM takes a positive proj_size)");
  TORCH_CHECK_VALUE(proj_size < hidden_size || proj_size == 0, "seqpack::rnn: proj_size = ",
                    proj_size, " must be smaller than hidden_size = ", hidden_size);
  s.rows = data.size(0);
  s.input = data.size(1);
  s.hidden = hidden_size;
  s.proj = proj_size;
  s.layers = num_layers;
  s.dirs = bidirectional ? 2 : 1;
  s.hout = proj_size > 0 ? proj_size : hidden_size;
  s.width = s.dirs * s.hout;
  s.biases = bias;
  s.per = 2 + (bias ? 2 : 0) + (proj_size > 0 ? 1 : 0);
  const int64_t expected = num_layers * s.dirs * s.per;
  TORCH_CHECK_VALUE(static_cast<int64_t>(weights.size()) == expected, "seqpack::rnn: ",
                    weights.size(), " weights given, ", expected, " expected for num_layers=",
                    num_layers, ", bidirectional=", bidirectional, ", bias=", bias,
                    ", proj_size=", proj_size);
  const int64_t g = s.gates * hidden_size;
  int64_t i = 0;
  // weights[i] is a rows x cols matrix (cols < 0: a vector of rows).
  auto check_weight = [&](int64_t rows, int64_t cols) {
    const Tensor& w = weights[i];
    TORCH_CHECK(w.device() == data.device(), "seqpack::rnn: weights[", i, "] is on ", w.device(),
                ", data on ", data.device());
    TORCH_CHECK_TYPE(w.scalar_type() == data.scalar_type(), "seqpack::rnn: weights[", i,
                     "] has dtype ", w.scalar_type(), ", data ", data.scalar_type());
    const std::array<int64_t, 2> shape{rows, cols};
    const at::IntArrayRef expected(shape.data(), cols < 0 ? 1 : 2);
    TORCH_CHECK(w.sizes() == expected, "seqpack::rnn: weights[", i, "] has shape ", w.sizes(),
                ", expected ", expected,
                i == 0 ? " (input.size(-1) must be equal to input_size)" : "");
    ++i;
  };
  for (int64_t l = 0; l < num_layers; ++l) {
    for (int64_t d = 0; d < s.dirs; ++d) {
      check_weight(g, l == 0 ? s.input : s.width);
      check_weight(g, s.hout);
      if (bias) {
        check_weight(g, -1);
        check_weight(g, -1);
      }
      if (proj_size > 0) check_weight(proj_size, hidden_size);
    }
  }
  auto check_state = [&](const char* name, const Tensor& t, int64_t width) {
    TORCH_CHECK(t.device() == data.device(), "seqpack::rnn: ", name, " is on ", t.device(),
                ", data on ", data.device());
    TORCH_CHECK_TYPE(t.scalar_type() == data.scalar_type(), "seqpack::rnn: ", name,
                     " has dtype ", t.scalar_type(), ", data ", data.scalar_type());
    TORCH_CHECK(t.dim() == 3 && t.size(0) == num_layers * s.dirs && t.size(2) == width,
                "seqpack::rnn: Expected hidden size (", num_layers * s.dirs, ", batch, ", width,
                ") for ", name, ", got ", t.sizes());
  };
  check_state("h0", h0, s.hout);
  s.batch = h0.size(1);
  if (s.lstm) {
    check_state("c0", c0, hidden_size);
    TORCH_CHECK(c0.size(1) == s.batch, "seqpack::rnn: c0 has batch ", c0.size(1), ", h0 ",
                s.batch);
  }
  return s;
}

// ---- the passes ------------------------------------------------------------

constexpr int64_t kSavedAlign = 256;  // each piece of the saved buffer starts at a multiple

int64_t aligned(int64_t n) { return (n + kSavedAlign - 1) / kSavedAlign * kSavedAlign; }

const void* ptr(const Tensor& t) { return t.defined() && t.numel() > 0 ? t.data_ptr() : nullptr; }
void* mutable_ptr(const Tensor& t) {
  return t.defined() && t.numel() > 0 ? t.data_ptr() : nullptr;
}

// Layer l's slice of a contiguous (layers * dirs, batch, width) state.
template <typename P>
P layer_slice(const Tensor& t, int64_t l, int64_t dirs) {
  if (!t.defined() || t.numel() == 0) return nullptr;
  auto* base = static_cast<char*>(t.data_ptr());
  return reinterpret_cast<P>(base + l * dirs * t.size(1) * t.size(2) * t.element_size());
}

struct Buffers {
  size_t workspace = 0;  // bytes, the largest of the layers'
  int64_t layer_reserve = 0;
  std::vector<int64_t> reserve_at, output_at;
  int64_t saved = 0;  // bytes of the saved buffer
};

Buffers buffers(const Library& lib, const Sizes& s) {
  Buffers b;
  size_t reserve = 0;
  for (int64_t input : {s.input, s.width}) {
    size_t ws = 0;
    check(lib, lib.buffer_sizes(s.mode, s.dtype, s.rows, s.batch, input, s.hidden, s.proj, 1,
                                s.dirs == 2, &ws, &reserve));
    b.workspace = std::max(b.workspace, ws);
    if (s.layers == 1) break;
  }
  b.layer_reserve = static_cast<int64_t>(reserve);
  const int64_t element = c10::elementSize(s.dtype == SEQPACK_CUDA_FLOAT32 ? at::kFloat : at::kHalf);
  const int64_t reserve_step = aligned(b.layer_reserve), output = aligned(s.rows * s.width * element);
  for (int64_t l = 0; l < s.layers; ++l) b.reserve_at.push_back(l * reserve_step);
  for (int64_t l = 0; l + 1 < s.layers; ++l)
    b.output_at.push_back(s.layers * reserve_step + l * output);
  b.saved = s.layers * reserve_step + (s.layers - 1) * output;
  return b;
}

// The fields every layer's call shares (caller_products = 1).
seqpack_cuda_rnn_args layer_args(const Sizes& s, const Tensor& batch_sizes, bool allow_tf32,
                                 void* stream) {
  seqpack_cuda_rnn_args a{};
  a.mode = s.mode;
  a.dtype = s.dtype;
  a.bidirectional = s.dirs == 2;
  a.has_biases = s.biases;
  a.allow_tf32 = allow_tf32;
  a.caller_products = 1;
  a.rows = s.rows;
  a.steps = batch_sizes.numel();
  a.batch_sizes = batch_sizes.data_ptr<int64_t>();
  a.batch = s.batch;
  a.hidden_size = s.hidden;
  a.proj_size = s.proj;
  a.num_layers = 1;
  a.stream = stream;
  return a;
}

std::vector<const void*> pointers(at::TensorList weights) {
  std::vector<const void*> out;
  out.reserve(weights.size());
  for (const Tensor& w : weights) out.push_back(w.data_ptr());
  return out;
}

Tensor bytes(int64_t n, const Tensor& like) {
  return at::empty({n}, like.options().dtype(at::kByte));
}

// The saved buffer's `bytes` at `at` as a (rows, width) tensor of `like`'s dtype.
Tensor piece(const Tensor& saved, int64_t at, const Sizes& s, const Tensor& like) {
  return saved.narrow(0, at, s.rows * s.width * like.element_size())
      .view(like.scalar_type())
      .view({s.rows, s.width});
}

Tensor layer_input(const Tensor& data, const std::vector<Tensor>& outputs, const Tensor& mask,
                   int64_t l) {
  if (l == 0) return data;
  return mask.defined() ? outputs[l - 1] * mask[l - 1] : outputs[l - 1];
}

struct Forward {
  Tensor y, hn, cn, saved;  // saved: empty without keep
};

// The forward, a library call per layer after torch's input projection. With
// `keep`, the saved buffer holds what the backward reads; without, one
// allocation holds the workspace and one layer's reserve that every layer uses.
Forward forward_layers(const Backend& backend, const Sizes& s, const Tensor& data,
                       const Tensor& batch_sizes, const Tensor& h0, const Tensor& c0,
                       at::TensorList weights, const Tensor& mask, bool allow_tf32, bool keep) {
  const Library& lib = library();
  Buffers b = buffers(lib, s);
  Forward f;
  f.y = at::empty({s.rows, s.width}, data.options());
  f.hn = at::empty_like(h0);
  if (s.lstm) f.cn = at::empty_like(c0);
  std::vector<Tensor> outputs;
  Tensor workspace;
  void* ws = nullptr;
  if (keep) {
    workspace = bytes(static_cast<int64_t>(b.workspace), data);
    ws = mutable_ptr(workspace);
    f.saved = bytes(b.saved, data);
    for (int64_t at : b.output_at) outputs.push_back(piece(f.saved, at, s, data));
  } else {
    const int64_t at = aligned(static_cast<int64_t>(b.workspace));
    f.saved = bytes(at + b.layer_reserve, data);
    ws = b.workspace ? f.saved.data_ptr() : nullptr;
    b.reserve_at.assign(static_cast<size_t>(s.layers), at);
    for (int64_t l = 0; l + 1 < s.layers; ++l)
      outputs.push_back(at::empty({s.rows, s.width}, data.options()));
  }
  seqpack_cuda_rnn_args a = layer_args(s, batch_sizes, allow_tf32, backend.stream(data.device()));
  a.workspace = ws;
  a.workspace_bytes = b.workspace;
  a.reserve_bytes = static_cast<size_t>(b.layer_reserve);
  const std::vector<const void*> w = pointers(weights);
  auto* base = static_cast<char*>(f.saved.data_ptr());
  std::array<Tensor, 2> gates;
  for (int64_t l = 0; l < s.layers; ++l) {
    const Tensor x = layer_input(data, outputs, mask, l);
    const int64_t first = l * s.dirs * s.per;
    for (int64_t d = 0; d < s.dirs; ++d) {
      const int64_t at = first + d * s.per;
      gates[d] = at::linear(x, weights[at], s.biases ? OptTensor(weights[at + 2]) : OptTensor());
      a.input_gates[d] = gates[d].data_ptr();
    }
    a.weights = w.data() + first;
    a.input_size = x.size(1);
    a.h0 = layer_slice<const void*>(h0, l, s.dirs);
    a.c0 = layer_slice<const void*>(c0, l, s.dirs);
    a.hn = layer_slice<void*>(f.hn, l, s.dirs);
    a.cn = layer_slice<void*>(f.cn, l, s.dirs);
    a.reserve = b.layer_reserve ? base + b.reserve_at[l] : nullptr;
    a.y = mutable_ptr(l + 1 == s.layers ? f.y : outputs[l]);
    check(lib, lib.forward(&a));
  }
  if (!keep) f.saved = f.saved.narrow(0, 0, 0);
  return f;
}

struct Gradients {
  Tensor dx, dh0, dc0;
  std::vector<Tensor> dweights;
};

Tensor as(const Tensor& t, const Tensor& like) {
  return t.defined() ? t.to(like.scalar_type()).contiguous() : t;
}

// The backward of forward_layers (keep = true): per layer from the top, the
// library's recurrence (the gates' gradients, h_{t-1} of each row), then the
// weight gradients, the bias sums and dX as torch products.
Gradients backward_layers(const Backend& backend, const Sizes& s, const Tensor& data,
                          const Tensor& batch_sizes, const Tensor& h0, const Tensor& c0,
                          at::TensorList weights, const Tensor& mask, const Tensor& saved,
                          const Tensor& dy, const Tensor& dhn, const Tensor& dcn,
                          bool allow_tf32) {
  const Library& lib = library();
  const Buffers b = buffers(lib, s);
  const at::ScalarType dtype = data.scalar_type();
  const int64_t G = s.gates * s.hidden;
  Tensor dY = as(dy, data);
  const Tensor dHn = as(dhn, data), dCn = s.lstm ? as(dcn, data) : Tensor();
  Gradients g;
  g.dh0 = at::empty_like(h0);
  if (s.lstm) g.dc0 = at::empty_like(c0);
  g.dweights.resize(weights.size());
  std::vector<Tensor> outputs;
  for (int64_t at : b.output_at) outputs.push_back(piece(saved, at, s, data));
  const Tensor workspace = bytes(static_cast<int64_t>(b.workspace), data);
  seqpack_cuda_rnn_args a = layer_args(s, batch_sizes, allow_tf32, backend.stream(data.device()));
  a.workspace = mutable_ptr(workspace);
  a.workspace_bytes = b.workspace;
  a.reserve_bytes = static_cast<size_t>(b.layer_reserve);
  // What the library writes for the products, per direction: the same buffers
  // for every layer (each layer's products read them before the next layer's
  // call, in stream order).
  const auto f32 = data.options().dtype(at::kFloat);
  std::array<Tensor, 2> dgx, dgh, hprev, dh, m;
  for (int64_t d = 0; d < s.dirs; ++d) {
    dgx[d] = at::empty({s.rows, G}, f32);
    dgh[d] = s.gru ? at::empty({s.rows, G}, f32) : dgx[d];
    hprev[d] = at::empty({s.rows, s.hout}, f32);
    a.dgates_x[d] = dgx[d].data_ptr<float>();
    a.hprev[d] = hprev[d].data_ptr<float>();
    if (s.gru) a.dgates_h[d] = dgh[d].data_ptr<float>();
    if (s.proj) {
      dh[d] = at::empty({s.rows, s.hout}, f32);
      m[d] = at::empty({s.rows, s.hidden}, f32);
      a.dh[d] = dh[d].data_ptr<float>();
      a.m[d] = m[d].data_ptr<float>();
    }
  }
  const std::vector<const void*> w = pointers(weights);
  auto* base = static_cast<char*>(saved.data_ptr());
  for (int64_t l = s.layers - 1; l >= 0; --l) {
    const Tensor x = layer_input(data, outputs, mask, l);
    const int64_t first = l * s.dirs * s.per;
    a.weights = w.data() + first;
    a.input_size = x.size(1);
    a.reserve = b.layer_reserve ? base + b.reserve_at[l] : nullptr;
    a.dy = ptr(dY);
    a.dhn = layer_slice<const void*>(dHn, l, s.dirs);
    a.dcn = layer_slice<const void*>(dCn, l, s.dirs);
    a.dh0 = layer_slice<void*>(g.dh0, l, s.dirs);
    a.dc0 = layer_slice<void*>(g.dc0, l, s.dirs);
    check(lib, lib.backward(&a));
    Tensor dX;
    for (int64_t d = 0; d < s.dirs; ++d) {
      const int64_t at = first + d * s.per;
      const Tensor gx = dgx[d].to(dtype), gh = dgh[d].to(dtype);
      g.dweights[at] = at::mm(gx.t(), x);
      g.dweights[at + 1] = at::mm(gh.t(), hprev[d].to(dtype));
      if (s.biases) {
        g.dweights[at + 2] = dgx[d].sum(0).to(dtype);
        g.dweights[at + 3] = dgh[d].sum(0).to(dtype);
      }
      if (s.proj) g.dweights[at + s.per - 1] = at::mm(dh[d].to(dtype).t(), m[d].to(dtype));
      dX = dX.defined() ? dX.addmm_(gx, weights[at]) : at::mm(gx, weights[at]);
    }
    if (l > 0) {
      dY = mask.defined() ? dX * mask[l - 1] : dX;
    } else {
      g.dx = dX;
    }
  }
  return g;
}

// ---- autograd --------------------------------------------------------------

constexpr const char* kDoubleBackward =
    "seqpack CUDA: double backward (differentiating a gradient taken with create_graph=True) "
    "through seqpack's CUDA recurrent kernels is not supported: their backward is not made of "
    "differentiable operations (nor is cuDNN's). seqpack's CPU layers support it; on CUDA, "
    "torch's own non-cuDNN kernels do (SEQPACK_CUDA_LAYERS=torch, inside "
    "torch.backends.cudnn.flags(enabled=False))";

// The kernels' gradients in a graph recorded with create_graph=True: their
// values, and differentiating them raises kDoubleBackward (as torch's cuDNN
// RNN does) instead of counting the RNN's second derivatives as zero.
class NoDoubleBackward : public torch::autograd::Function<NoDoubleBackward> {
 public:
  static variable_list forward(AutogradContext* ctx, at::TensorList grads,
                               at::TensorList sources) {
    variable_list out;
    for (const Tensor& t : grads) out.push_back(t.clone());
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(false, kDoubleBackward);
  }
};

// Everything of a call that is not differentiated.
struct Call {
  Sizes sizes;
  Tensor batch_sizes, mask;
  bool allow_tf32 = false;
  const Backend* backend = nullptr;
};

class RnnFunction : public torch::autograd::Function<RnnFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& data, const Tensor& h0,
                               const OptTensor& c0, at::TensorList weights, const Call& call) {
    const Tensor c = c0.has_value() ? *c0 : Tensor();
    Forward f = forward_layers(*call.backend, call.sizes, data, call.batch_sizes, h0, c, weights,
                               call.mask, call.allow_tf32, /*keep=*/true);
    variable_list to_save = {data, h0, c.defined() ? c : Tensor(), f.saved};
    to_save.insert(to_save.end(), weights.begin(), weights.end());
    ctx->save_for_backward(to_save);
    ctx->saved_data["call"] = c10::IValue::make_capsule(
        c10::make_intrusive<CallHolder>(call));
    const Tensor cn = f.cn.defined() ? f.cn : data.new_empty({0});
    if (!call.sizes.lstm) ctx->mark_non_differentiable({cn});
    ctx->set_materialize_grads(false);  // missing gradients are zeros to the library
    return {f.y, f.hn, cn};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Call& call =
        static_cast<CallHolder*>(ctx->saved_data.at("call").toCapsule().get())->value;
    const variable_list saved = ctx->get_saved_variables();  // throws if modified in place
    const Tensor &data = saved[0], &h0 = saved[1], &c0 = saved[2], &buffer = saved[3];
    const std::vector<Tensor> weights(saved.begin() + 4, saved.end());
    const Tensor dcn = call.sizes.lstm ? grads[2] : Tensor();
    Gradients g = [&] {
      at::AutoGradMode no_graph(false);
      return backward_layers(*call.backend, call.sizes, data, call.batch_sizes, h0, c0, weights,
                             call.mask, buffer, grads[0], grads[1], dcn, call.allow_tf32);
    }();
    variable_list out = {g.dx, g.dh0, c0.defined() ? g.dc0 : Tensor()};
    out.insert(out.end(), g.dweights.begin(), g.dweights.end());
    if (at::GradMode::is_enabled()) out = refusing_double_backward(out, saved, grads);
    out.emplace_back();  // call
    return out;
  }

 private:
  struct CallHolder : torch::CustomClassHolder {
    explicit CallHolder(Call c) : value(std::move(c)) {}
    Call value;
  };

  // Under grad mode (a backward with create_graph=True), the gradients with a
  // node that refuses double backward, where anything they depend on wants a
  // gradient.
  static variable_list refusing_double_backward(variable_list grads, const variable_list& saved,
                                                const variable_list& upstream) {
    variable_list sources;
    for (const variable_list* list : {&saved, &upstream})
      for (const Tensor& t : *list)
        if (t.defined() && t.requires_grad()) sources.push_back(t);
    std::vector<size_t> defined;
    variable_list values;
    for (size_t i = 0; i < grads.size(); ++i)
      if (grads[i].defined()) {
        defined.push_back(i);
        values.push_back(grads[i]);
      }
    if (sources.empty() || values.empty()) return grads;
    variable_list wrapped = NoDoubleBackward::apply(at::TensorList(values), at::TensorList(sources));
    for (size_t k = 0; k < defined.size(); ++k) grads[defined[k]] = wrapped[k];
    return grads;
  }
};

bool wants_graph(const Tensor& data, const Tensor& h0, const Tensor& c0, at::TensorList weights) {
  if (!at::GradMode::is_enabled()) return false;
  if (data.requires_grad() || h0.requires_grad() || (c0.defined() && c0.requires_grad()))
    return true;
  return std::any_of(weights.begin(), weights.end(),
                     [](const Tensor& w) { return w.requires_grad(); });
}

Tensor index_or_none(const OptTensor& t) {
  return t.has_value() && t->defined() && t->numel() > 0 ? *t : Tensor();
}

// The mask between layers: (num_layers - 1, rows, width), 0 or 1/(1-p), drawn
// with torch's generator of the data's device (a copy seeded by `seed`).
Tensor dropout_mask(const Tensor& data, const Sizes& s, double p, c10::optional<int64_t> seed) {
  const std::vector<int64_t> shape = {s.layers - 1, s.rows, s.width};
  if (p >= 1.0) return at::zeros(shape, data.options());
  c10::optional<at::Generator> gen;
  if (seed.has_value()) {
    at::Generator g = at::globalContext().defaultGenerator(data.device()).clone();
    g.set_current_seed(static_cast<uint64_t>(*seed));
    gen = g;
  }
  Tensor keep = at::empty(shape, data.options().dtype(at::kFloat)).bernoulli_(1.0 - p, gen);
  return (keep / (1.0 - p)).to(data.scalar_type());
}

using RnnSignature = std::tuple<Tensor, Tensor, Tensor>(
    const Tensor&, const Tensor&, const OptTensor&, const OptTensor&, const OptTensor&,
    const OptTensor&, at::TensorList, c10::string_view, int64_t, int64_t, bool, bool, int64_t,
    double, bool, c10::optional<int64_t>, c10::string_view);

// The backend's namespace's rnn operator (found once per namespace).
const c10::TypedOperatorHandle<RnnSignature>& rnn_operator(const Backend& backend) {
  static std::mutex mutex;
  static std::deque<std::pair<const Backend*, c10::TypedOperatorHandle<RnnSignature>>> found;
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto& [b, op] : found)
    if (b == &backend) return op;
  found.emplace_back(&backend, c10::Dispatcher::singleton()
                                   .findSchemaOrThrow((std::string(backend.ns) + "::rnn").c_str(), "")
                                   .typed<RnnSignature>());
  return found.back().second;
}

}  // namespace

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

std::tuple<Tensor, Tensor, Tensor> rnn(const Backend& backend, bool record, const Tensor& data,
                                       const Tensor& batch_sizes, const OptTensor& sorted_indices,
                                       const OptTensor& unsorted_indices, const OptTensor& h0_in,
                                       const OptTensor& c0_in, at::TensorList weights,
                                       c10::string_view mode, int64_t hidden_size,
                                       int64_t num_layers, bool bias, bool bidirectional,
                                       int64_t proj_size, double dropout, bool train,
                                       c10::optional<int64_t> seed, c10::string_view precision) {
  TORCH_CHECK_VALUE(precision == "fp32" || precision == "auto", "seqpack::rnn on ", data.device(),
                    ": precision = '", precision,
                    "' is not one of ['fp32', 'auto']; seqpack's CUDA kernels compute in the "
                    "data's dtype (",
                    data.scalar_type(), "): pass bfloat16 or float16 tensors for those");
  TORCH_CHECK_VALUE(dropout >= 0.0 && dropout <= 1.0, "seqpack::rnn: dropout = ", dropout,
                    " must be in [0, 1]");
  const bool lstm = mode == "LSTM";
  const Tensor sorted = index_or_none(sorted_indices), unsorted = index_or_none(unsorted_indices);
  const int64_t dirs = bidirectional ? 2 : 1, states = num_layers * dirs;
  int64_t batch = 0;
  if (sorted.defined()) {
    batch = sorted.numel();
  } else if (batch_sizes.numel() > 0) {
    TORCH_CHECK(batch_sizes.device().is_cpu() && batch_sizes.scalar_type() == at::kLong,
                "seqpack::rnn: batch_sizes must be a 1-D int64 CPU tensor, got ",
                batch_sizes.scalar_type(), " on ", batch_sizes.device());
    batch = batch_sizes.data_ptr<int64_t>()[0];
  }
  // States in the library's (sorted) order: differentiable gathers, recorded
  // by autograd where it records.
  auto sorted_state = [&](const OptTensor& given, int64_t width) {
    if (!given.has_value() || !given->defined())
      return at::zeros({states, batch, width}, data.options());
    return sorted.defined() ? given->index_select(1, sorted.to(given->device())) : *given;
  };
  Tensor h0 = sorted_state(h0_in, proj_size > 0 ? proj_size : hidden_size);
  Tensor c0 = lstm ? sorted_state(c0_in, hidden_size) : Tensor();
  const Sizes s = checked_sizes(data, batch_sizes, h0, c0, weights, mode, hidden_size,
                                num_layers, bias, bidirectional, proj_size);
  c10::OptionalDeviceGuard guard(data.device());
  Call call;
  call.sizes = s;
  call.backend = &backend;
  call.batch_sizes = batch_sizes.contiguous();
  call.allow_tf32 = data.is_cuda() && at::globalContext().allowTF32CuBLAS();
  if (train && dropout > 0 && num_layers > 1) call.mask = dropout_mask(data, s, dropout, seed);
  const Tensor x = data.contiguous();
  h0 = h0.contiguous();
  if (c0.defined()) c0 = c0.contiguous();
  std::vector<Tensor> w;
  w.reserve(weights.size());
  for (const Tensor& t : weights) w.push_back(t.contiguous());
  Tensor y, hn, cn;
  if (record && wants_graph(x, h0, c0, w)) {
    variable_list out =
        RnnFunction::apply(x, h0, c0.defined() ? OptTensor(c0) : OptTensor(), at::TensorList(w), call);
    y = out[0], hn = out[1], cn = out[2];
  } else {
    at::AutoDispatchBelowADInplaceOrView below;
    Forward f = forward_layers(backend, s, x, call.batch_sizes, h0, c0, w, call.mask,
                               call.allow_tf32, /*keep=*/false);
    y = f.y, hn = f.hn, cn = f.cn.defined() ? f.cn : data.new_empty({0});
  }
  if (unsorted.defined()) {
    hn = hn.index_select(1, unsorted.to(hn.device()));
    if (lstm) cn = cn.index_select(1, unsorted.to(cn.device()));
  }
  return {y, hn, cn};
}

std::tuple<Tensor, Tensor, Tensor> rnn_padded(
    const Backend& backend, const Tensor& input, const OptTensor& lengths, const OptTensor& h0,
    const OptTensor& c0, at::TensorList weights, c10::string_view mode, int64_t hidden_size,
    int64_t num_layers, bool bias, bool batch_first, bool bidirectional, int64_t proj_size,
    double dropout, bool train, c10::optional<int64_t> seed, c10::string_view precision) {
  TORCH_CHECK_VALUE(input.dim() == 3,
                    "seqpack::rnn_padded: input must be 3-D [T, B, input_size] (batch_first: ",
                    "[B, T, input_size]), got shape ", input.sizes());
  const int64_t T = input.size(batch_first ? 1 : 0), B = input.size(batch_first ? 0 : 1);
  const auto& rnn_op = rnn_operator(backend);
  if (!lengths.has_value() || !lengths->defined()) {
    // Every sequence has length T: the time-major rows are the packed rows.
    const Tensor time_major = batch_first ? input.transpose(0, 1) : input;
    const Tensor data = time_major.reshape({T * B, input.size(2)});
    // Batch 0 has no time steps in packed form.
    const Tensor batch_sizes = at::full({B > 0 ? T : 0}, B, at::TensorOptions().dtype(at::kLong));
    // The states default to zeros of the batch (with T = 0 the packed form
    // has no step to tell it).
    const int64_t states = num_layers * (bidirectional ? 2 : 1);
    auto state = [&](const OptTensor& given, int64_t width) -> OptTensor {
      if (given.has_value() && given->defined()) return given;
      return at::zeros({states, B, width}, input.options());
    };
    const OptTensor h = state(h0, proj_size > 0 ? proj_size : hidden_size);
    const OptTensor c = mode == "LSTM" ? state(c0, hidden_size) : c0;
    auto [out, h_n, c_n] =
        rnn_op.call(data, batch_sizes, c10::nullopt, c10::nullopt, h, c, weights, mode,
                    hidden_size, num_layers, bias, bidirectional, proj_size, dropout, train, seed,
                    precision);
    const Tensor output = out.view({T, B, out.size(1)});
    return {batch_first ? output.transpose(0, 1) : output, h_n, c_n};
  }
  // Packed by one gather of the rows in packed order, padded back by one
  // scatter: the plan of the lengths (length-descending, stable), as
  // pack_padded_sequence(enforce_sorted=False) makes it.
  const Tensor len = lengths->to(at::kCPU, at::kLong).contiguous();
  TORCH_CHECK(len.dim() == 1 && len.numel() == B, "seqpack::rnn_padded: lengths has shape ",
              len.sizes(), "; one length per sequence (", B, ") expected");
  const int64_t* l = len.data_ptr<int64_t>();
  std::vector<int64_t> order(static_cast<size_t>(B));
  std::iota(order.begin(), order.end(), 0);
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK_VALUE(l[b] >= 0 && l[b] <= T, "seqpack::rnn_padded: lengths[", b, "] = ", l[b],
                      " is outside [0, ", T, "] (the padded length)");
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return l[a] > l[b]; });
  const int64_t steps = B > 0 ? l[order[0]] : 0;
  Tensor batch_sizes = at::empty({steps}, at::TensorOptions().dtype(at::kLong));
  std::vector<int64_t> rows;
  for (int64_t t = 0; t < steps; ++t) {
    int64_t n = 0;
    while (n < B && l[order[static_cast<size_t>(n)]] > t) {
      const int64_t b = order[static_cast<size_t>(n++)];
      rows.push_back(batch_first ? b * T + t : t * B + b);
    }
    batch_sizes.data_ptr<int64_t>()[t] = n;
  }
  std::vector<int64_t> inverse(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i) inverse[static_cast<size_t>(order[i])] = i;
  const auto on_device = at::TensorOptions().dtype(at::kLong).device(input.device());
  const auto index_of = [&](const std::vector<int64_t>& v) {
    return at::tensor(v, at::TensorOptions().dtype(at::kLong)).to(on_device);
  };
  const Tensor gather = index_of(rows);
  const Tensor data = input.reshape({T * B, input.size(2)}).index_select(0, gather);
  auto [out, h_n, c_n] =
      rnn_op.call(data, batch_sizes, index_of(order), index_of(inverse), h0, c0, weights, mode,
                  hidden_size, num_layers, bias, bidirectional, proj_size, dropout, train, seed,
                  precision);
  const Tensor padded = at::zeros({T * B, out.size(1)}, out.options()).index_copy(0, gather, out);
  return {padded.view({batch_first ? B : T, batch_first ? T : B, out.size(1)}), h_n, c_n};
}

}  // namespace seqpack::torch_cuda
