#include "seqpack/classifier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <string_view>
#include <unordered_map>

#include "cpu/linear_rows.h"
#include "seqpack/json_limits.h"
#include "seqpack/loss.h"
#include "seqpack/model_dir.h"
#include "seqpack/packed_sequence.h"
#include "seqpack/safetensors.h"
#include "train/grad_sum.h"
#include "train/regular_file.h"

namespace seqpack {

void CharClassifierOptions::validate() const {
  auto in_range = [](const char* name, int64_t v, int64_t max) {
    if (v < 1 || v > max) {
      throw std::invalid_argument(std::string("CharClassifier: ") + name + " = " +
                                  std::to_string(v) + " is out of range [1, " +
                                  std::to_string(max) + "]");
    }
  };
  in_range("vocab_size", vocab_size, max_vocab_size);
  in_range("embed_dim", embed_dim, max_embed_dim);
  in_range("hidden_size", hidden_size, max_hidden_size);
  in_range("num_classes", num_classes, max_num_classes);
  if (dtype == DType::i64) throw std::invalid_argument("CharClassifier: dtype must be float32 or float64");
}

// ------------------------------------------------------------ model files: validation

namespace {
using json = nlohmann::json;

// A JSON value for a message, cut short: a hostile file must not make a huge one.
// Numbers with a fraction or exponent in their shortest form ("1e+23", where
// nlohmann's dump gives 9.999999999999999e+22), always marked as not integral ("16.0").
std::string shown(const json& v) {
  if (v.is_number_float()) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, v.get<double>());
    std::string s(buf, r.ptr);
    if (s.find_first_of(".en") == std::string::npos) s += ".0";
    return s;
  }
  return json_excerpt(v);
}

[[noreturn]] void schema_error(const std::string& where, const std::string& what) {
  throw std::invalid_argument(where + ": " + what);
}

std::string quoted(const std::string& key) { return "\"" + key + "\""; }

const json& field_of(const json& obj, const std::string& key, const std::string& where) {
  const auto it = obj.find(key);
  if (it == obj.end()) schema_error(where, quoted(key) + " is missing");
  return *it;
}

// obj[key] as an integer in [lo, hi]. Only a JSON integer is one: 16.5 and
// 1e3 are rejected rather than truncated or converted.
int64_t integer_field(const json& obj, const std::string& key, int64_t lo, int64_t hi,
                      const std::string& where) {
  const json& v = field_of(obj, key, where);
  if (!v.is_number_integer())
    schema_error(where, quoted(key) + " = " + shown(v) + " is not an integer");
  // Compared in the value's own type: 2^64 - 1 must not wrap to -1 on the way.
  const bool in_range = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(hi) &&
                                                     static_cast<int64_t>(v.get<uint64_t>()) >= lo
                                               : v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
  if (!in_range) {
    schema_error(where, quoted(key) + " = " + shown(v) + " is out of range [" + std::to_string(lo) +
                            ", " + std::to_string(hi) + "]");
  }
  return v.get<int64_t>();
}

// The sizes shared by config.json and a checkpoint's model_config.
CharClassifierOptions sizes_from(const json& obj, const std::string& where) {
  using O = CharClassifierOptions;
  CharClassifierOptions o;
  o.vocab_size = integer_field(obj, "vocab_size", 1, O::max_vocab_size, where);
  o.embed_dim = integer_field(obj, "embed_dim", 1, O::max_embed_dim, where);
  o.hidden_size = integer_field(obj, "hidden_size", 1, O::max_hidden_size, where);
  o.num_classes = integer_field(obj, "num_classes", 1, O::max_num_classes, where);
  return o;
}

// A label list: an array of num_classes distinct non-empty strings.
std::vector<std::string> labels_from(const json& v, const std::string& name, int64_t num_classes,
                                     const std::string& where) {
  if (!v.is_array()) schema_error(where, name + " = " + shown(v) + " is not an array");
  std::vector<std::string> labels;
  std::unordered_map<std::string, std::size_t> first;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string at = name + "[" + std::to_string(i) + "]";
    if (!v[i].is_string()) schema_error(where, at + " = " + shown(v[i]) + " is not a string");
    const std::string& label = v[i].get_ref<const std::string&>();
    if (label.empty()) schema_error(where, at + " is an empty label");
    const auto [it, fresh] = first.emplace(label, i);
    if (!fresh) {
      schema_error(where, at + " = " + shown(v[i]) + " repeats " + name + "[" +
                              std::to_string(it->second) + "]");
    }
    labels.push_back(label);
  }
  if (static_cast<int64_t>(labels.size()) != num_classes) {
    schema_error(where, name + " has " + std::to_string(labels.size()) +
                            " entries but \"num_classes\" = " + std::to_string(num_classes));
  }
  return labels;
}

json parse_json(std::string_view text, const std::string& where) {
  check_json_depth(text, where);
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    // nlohmann's message says where in the text; ours says which text.
    schema_error(where, std::string("not valid JSON (") + e.what() + ")");
  }
}

// The parameter shapes of a CharClassifier with these sizes, by torch name
// (tests compare this with CharClassifier::state_dict()). Computed before any
// model is built, so a file is checked without allocating what its config says.
std::map<std::string, Shape> state_shapes(const CharClassifierOptions& o) {
  const int64_t V = o.vocab_size, E = o.embed_dim, H = o.hidden_size, C = o.num_classes;
  std::map<std::string, Shape> s = {
      {"embedding.weight", {V, E}}, {"fc.weight", {C, 2 * H}}, {"fc.bias", {C}}};
  for (const std::string suffix : {"", "_reverse"}) {
    s["lstm.weight_ih_l0" + suffix] = {4 * H, E};
    s["lstm.weight_hh_l0" + suffix] = {4 * H, H};
    s["lstm.bias_ih_l0" + suffix] = {4 * H};
    s["lstm.bias_hh_l0" + suffix] = {4 * H};
  }
  return s;
}


// A floating-point tensor holding only finite values (and, with
// non_negative, none below zero); throws naming the tensor and the first bad element.
void check_values(const Tensor& t, const std::string& name, bool non_negative,
                  const std::string& where) {
  auto scan = [&](const auto* p) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double v = static_cast<double>(p[i]);
      if (!std::isfinite(v) || (non_negative && v < 0)) {
        schema_error(where, "tensor '" + name + "' holds " + std::to_string(v) + " at index " +
                                std::to_string(i) +
                                (std::isfinite(v) ? " (it must be non-negative)"
                                                  : " (only finite values are loaded)"));
      }
    }
  };
  if (t.dtype() == DType::f32) scan(t.data<float>());
  if (t.dtype() == DType::f64) scan(t.data<double>());
}

// A tensor of a model's state: the expected shape, a floating-point dtype
// (exactly `dtype` when given), finite values.
void check_tensor(const Tensor& t, const std::string& name, const Shape& shape,
                  std::optional<DType> dtype, bool non_negative, const std::string& where) {
  if (t.dtype() == DType::i64 || (dtype && t.dtype() != *dtype)) {
    schema_error(where, "tensor '" + name + "' has dtype " + dtype_name(t.dtype()) +
                            ", expected " + (dtype ? dtype_name(*dtype) : "float32 or float64"));
  }
  if (t.shape() != shape) {
    schema_error(where, "tensor '" + name + "' has shape " + shape_str(t.shape()) + ", expected " +
                            shape_str(shape) + " from the model's sizes");
  }
  check_values(t, name, non_negative, where);
}

// `state` holds exactly the parameters of a model with `o`'s sizes.
void check_state(const std::map<std::string, Tensor>& state, const CharClassifierOptions& o,
                 std::optional<DType> dtype, const std::string& prefix, const std::string& where) {
  const std::map<std::string, Shape> shapes = state_shapes(o);
  for (const auto& [name, t] : state) {
    if (!shapes.count(name)) schema_error(where, "unexpected tensor '" + prefix + name + "'");
  }
  for (const auto& [name, shape] : shapes) {
    const auto it = state.find(name);
    if (it == state.end()) schema_error(where, "tensor '" + prefix + name + "' is missing");
    check_tensor(it->second, prefix + name, shape, dtype, /*non_negative=*/false, where);
  }
}

}  // namespace

CharClassifierOptions parse_classifier_config(const std::string& json_text,
                                              const std::string& where,
                                              std::vector<std::string>* labels) {
  const json config = parse_json(json_text, where);
  if (!config.is_object()) schema_error(where, "expected a JSON object, got " + shown(config));
  const json& format = field_of(config, "format", where);
  if (format != "seqpack-char-classifier") {
    schema_error(where,
                 "\"format\" is " + shown(format) + ", expected \"seqpack-char-classifier\"");
  }
  const json& version = field_of(config, "version", where);
  if (!version.is_number_integer() || version != 1) {
    schema_error(where, "\"version\" is " + shown(version) + ", this seqpack reads version 1");
  }
  const CharClassifierOptions o = sizes_from(config, where);
  std::vector<std::string> l =
      labels_from(field_of(config, "labels", where), "\"labels\"", o.num_classes, where);
  if (labels != nullptr) *labels = std::move(l);
  return o;
}

namespace {
// dst += src (same shape and dtype), skipping row `skip_row` of a 2-D tensor.
void add_into(Tensor& dst, const Tensor& src, int64_t skip_row = -1) {
  const int64_t cols = dst.dim() == 2 ? dst.size(1) : dst.numel();
  const int64_t rows = dst.numel() / std::max<int64_t>(1, cols);
  auto run = [&](auto* d, const auto* s) {
    for (int64_t r = 0; r < rows; ++r) {
      if (r == skip_row) continue;
      for (int64_t c = 0; c < cols; ++c) d[r * cols + c] += s[r * cols + c];
    }
  };
  if (dst.dtype() == DType::f32) {
    run(dst.data<float>(), src.data<float>());
  } else {
    run(dst.data<double>(), src.data<double>());
  }
}

// Runs before any member is built, so bad sizes never reach an allocation.
const CharClassifierOptions& validated(const CharClassifierOptions& o) {
  o.validate();
  return o;
}

RNNOptions lstm_options(const CharClassifierOptions& o) {
  RNNOptions r;
  r.mode = RNNMode::lstm;
  r.input_size = o.embed_dim;
  r.hidden_size = o.hidden_size;
  r.bidirectional = true;
  r.dtype = o.dtype;
  r.precision = o.precision;
  return r;
}
}  // namespace

// Each module gets its own seed derived from `seed`, so changing one size does
// not reshuffle the others' initial values.
CharClassifier::CharClassifier(CharClassifierOptions options, uint64_t seed)
    : options_(validated(options)),
      embedding_(options.vocab_size, options.embed_dim, /*padding_idx=*/0, options.dtype,
                 seed * 3 + 1),
      lstm_(lstm_options(options), seed * 3 + 2),
      fc_(2 * options.hidden_size, options.num_classes, /*bias=*/true, options.dtype,
          seed * 3 + 3) {}

Tensor CharClassifier::forward(const Tensor& tokens, const std::vector<int64_t>& lengths,
                               bool batch_first, bool requires_grad) {
  if (!tokens.defined() || tokens.dtype() != DType::i64 || tokens.dim() != 2) {
    throw std::invalid_argument("CharClassifier: tokens must be an int64 [B, T] or [T, B] tensor");
  }
  const int64_t B = batch_first ? tokens.size(0) : tokens.size(1);
  const int64_t T = batch_first ? tokens.size(1) : tokens.size(0);
  if (static_cast<int64_t>(lengths.size()) != B) {
    throw std::invalid_argument("CharClassifier: " + std::to_string(lengths.size()) +
                                " lengths for a batch of " + std::to_string(B));
  }
  for (int64_t b = 0; b < B; ++b) {
    if (lengths[b] < 0 || lengths[b] > T) {
      throw std::invalid_argument("CharClassifier: lengths[" + std::to_string(b) + "] = " +
                                  std::to_string(lengths[b]) + " is outside [0, " +
                                  std::to_string(T) + "]");
    }
  }
  const PackingPlan plan = PackingPlan::from_lengths(lengths, /*enforce_sorted=*/false);
  // The real tokens in packed order (time-major, longest first): padding is
  // never looked up.
  const int64_t rows = plan.total_rows();
  const int64_t V = options_.vocab_size;
  std::vector<int64_t> ids(static_cast<std::size_t>(rows));
  const int64_t* tok = tokens.data<int64_t>();
  const std::vector<int64_t>& where = plan.padded_index();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = where[r] / B, b = where[r] % B;
    const int64_t id = batch_first ? tok[b * T + t] : tok[t * B + b];
    if (id < 0 || id >= V) {
      throw std::invalid_argument("CharClassifier: token id " + std::to_string(id) +
                                  " of sequence " + std::to_string(b) + " at step " +
                                  std::to_string(t) + " is outside the vocabulary [0, " +
                                  std::to_string(V) + ")");
    }
    ids[static_cast<std::size_t>(r)] = id;
  }
  // The embedding is fused into the LSTM: its input projection runs over the
  // V embedding rows instead of every token (rnn_forward_lookup), which is the
  // same model as Embedding then LSTM.
  // (lstm_'s const parameters: its non-const access would drop its own plan)
  const std::vector<Tensor>& weights = std::as_const(lstm_).parameters();
  // One plan per set of weight values (compared at each forward: exact): the
  // forwards and backwards between two optimizer steps share its layouts, so
  // the weights are laid out once per step, not at every call.
  plan_ = rnn_current_plan(plan_, lstm_.options(), weights, lstm_.config());
  RNNForwardResult r = rnn_forward_lookup(*plan_, embedding_.weight(), ids, plan, Tensor(),
                                          Tensor(), /*training=*/requires_grad,
                                          /*save_for_backward=*/requires_grad, 0);
  saved_ = requires_grad ? r.saved : nullptr;
  batch_ = B;
  // h_n is [2, B, H] in the caller's order: features = [h_n[0, b] ; h_n[1, b]].
  const int64_t H = options_.hidden_size;
  Tensor feat = Tensor::empty({B, 2 * H}, options_.dtype);
  const Tensor& h = r.h_n;
  for (int64_t d = 0; d < 2; ++d) {
    for (int64_t b = 0; b < B; ++b) {
      const std::size_t bytes = static_cast<std::size_t>(H) * dtype_size(options_.dtype);
      std::memcpy(static_cast<char*>(feat.raw_data()) + (b * 2 * H + d * H) * dtype_size(options_.dtype),
                  static_cast<const char*>(h.raw_data()) + ((d * B + b) * H) * dtype_size(options_.dtype),
                  bytes);
    }
  }
  if (requires_grad) return fc_.forward(feat);
  // Inference: the head in a fixed order of summation (cpu/linear_rows.h),
  // so that a word's logits are the same bits alone or in any batch, as the
  // LSTM's h_n are (BLAS would round a row differently with the row count).
  Tensor logits = Tensor::empty({B, options_.num_classes}, options_.dtype);
  const Tensor& w = fc_.weight();
  const Tensor& bias = fc_.bias();
  if (options_.dtype == DType::f32) {
    cpu::linear_rows_fixed_order<float>(feat.data<float>(), w.data<float>(),
                                        bias.defined() ? bias.data<float>() : nullptr, B, 2 * H,
                                        options_.num_classes, logits.data<float>());
  } else {
    cpu::linear_rows_fixed_order<double>(feat.data<double>(), w.data<double>(),
                                         bias.defined() ? bias.data<double>() : nullptr, B, 2 * H,
                                         options_.num_classes, logits.data<double>());
  }
  return logits;
}

Tensor CharClassifier::forward(const std::vector<std::vector<int64_t>>& sequences,
                               bool requires_grad) {
  const int64_t B = static_cast<int64_t>(sequences.size());
  int64_t T = 0;
  std::vector<int64_t> lengths(B);
  for (int64_t b = 0; b < B; ++b) {
    lengths[b] = static_cast<int64_t>(sequences[b].size());
    T = std::max(T, lengths[b]);
  }
  Tensor tokens = Tensor::zeros({B, T}, DType::i64);
  for (int64_t b = 0; b < B; ++b) {
    std::copy(sequences[b].begin(), sequences[b].end(), tokens.data<int64_t>() + b * T);
  }
  return forward(tokens, lengths, /*batch_first=*/true, requires_grad);
}

void CharClassifier::backward(const Tensor& grad_logits) {
  if (!saved_) {
    throw std::logic_error("CharClassifier::backward: the last forward ran without requires_grad");
  }
  const Tensor grad_feat = fc_.backward(grad_logits);
  const int64_t B = batch_, H = options_.hidden_size;
  const std::size_t es = dtype_size(options_.dtype);
  Tensor grad_h = Tensor::empty({2, B, H}, options_.dtype);
  for (int64_t d = 0; d < 2; ++d) {
    for (int64_t b = 0; b < B; ++b) {
      std::memcpy(static_cast<char*>(grad_h.raw_data()) + ((d * B + b) * H) * es,
                  static_cast<const char*>(grad_feat.raw_data()) + (b * 2 * H + d * H) * es,
                  static_cast<std::size_t>(H) * es);
    }
  }
  // Only h_n feeds the head, so the per-step outputs get no gradient, and
  // the zero initial state needs none.
  RNNGradients g = rnn_backward(*saved_, Tensor(), grad_h, Tensor(), /*initial_state_grad=*/false);
  saved_ = nullptr;
  train::add_grads(lstm_.grads(), g.weights);
  // g.input is the gradient of every embedding row; the padding row gets none.
  add_into(embedding_.grad(), g.input, embedding_.padding_idx().value_or(-1));
}

void CharClassifier::set_precision(Precision p) {
  lstm_.set_precision(p);
  options_.precision = p;
  plan_.reset();
}

std::vector<Parameter> CharClassifier::parameters() {
  std::vector<Parameter> ps = embedding_.parameters("embedding.");
  for (std::size_t i = 0; i < lstm_.parameters().size(); ++i) {
    ps.push_back({"lstm." + lstm_.parameter_names()[i], lstm_.parameters()[i], lstm_.grads()[i]});
  }
  for (auto& p : fc_.parameters("fc.")) ps.push_back(p);
  return ps;
}

void CharClassifier::zero_grad() {
  embedding_.zero_grad();
  lstm_.zero_grad();
  fc_.zero_grad();
}

std::map<std::string, Tensor> CharClassifier::state_dict() {
  std::map<std::string, Tensor> sd;
  for (auto& p : parameters()) sd[p.name] = p.value;
  return sd;
}

void CharClassifier::load_state_dict(const std::map<std::string, Tensor>& state) {
  auto mine = parameters();
  for (const auto& [name, t] : state) {
    if (std::none_of(mine.begin(), mine.end(), [&key = name](const Parameter& p) { return p.name == key; })) {
      throw std::invalid_argument("load_state_dict: unexpected key '" + name + "'");
    }
  }
  for (auto& p : mine) {
    auto it = state.find(p.name);
    if (it == state.end()) throw std::invalid_argument("load_state_dict: missing key '" + p.name + "'");
    if (it->second.shape() != p.value.shape()) {
      throw std::invalid_argument("load_state_dict: '" + p.name + "' has shape " +
                                  shape_str(it->second.shape()) + ", expected " +
                                  shape_str(p.value.shape()));
    }
    if (it->second.dtype() == DType::i64) {
      throw std::invalid_argument("load_state_dict: '" + p.name + "' has dtype int64");
    }
    p.value.copy_from(it->second.to(p.value.dtype()));
  }
}

// ------------------------------------------------------------ saving, loading

void write_classifier_files(const std::string& dir, CharClassifier& model, const Vocabulary& vocabulary,
                            const std::vector<std::string>& labels) {
  const auto& o = model.options();
  if (static_cast<int64_t>(labels.size()) != o.num_classes) {
    throw std::invalid_argument("save_classifier: " + std::to_string(labels.size()) +
                                " labels for a model with " + std::to_string(o.num_classes) +
                                " classes");
  }
  if (vocabulary.size() != o.vocab_size) {
    throw std::invalid_argument("save_classifier: a vocabulary of " +
                                std::to_string(vocabulary.size()) + " for a model with " +
                                std::to_string(o.vocab_size) + " embeddings");
  }
  std::filesystem::create_directories(dir);
  // Saved in float32 whatever the training dtype, as torch models usually are.
  std::map<std::string, Tensor> sd;
  for (auto& [k, v] : model.state_dict()) sd[k] = v.to(DType::f32);
  save_safetensors(dir + "/model.safetensors", sd, {{"format", "pt"}});
  vocabulary.save(dir + "/vocabulary.json");
  nlohmann::json config = {{"format", "seqpack-char-classifier"},
                           {"version", 1},
                           {"vocab_size", o.vocab_size},
                           {"embed_dim", o.embed_dim},
                           {"hidden_size", o.hidden_size},
                           {"num_classes", o.num_classes},
                           {"labels", labels}};
  write_file_atomically(dir + "/config.json", config.dump(2) + "\n");
}

void save_classifier(const std::string& dir, CharClassifier& model, const Vocabulary& vocabulary,
                     const std::vector<std::string>& labels) {
  ModelDirWriter w(dir, "save_classifier");
  w.discard_interrupted();
  w.begin(/*keep_previous=*/false);
  try {
    write_classifier_files(w.staging(), model, vocabulary, labels);
  } catch (...) {
    w.abandon();
    throw;
  }
  w.commit();
}

namespace {
// config.json and vocabulary.json are read whole: far above any real one (a
// vocabulary of every Unicode scalar value is about 9 MB), far below memory.
constexpr uint64_t kMaxJsonBytes = uint64_t{1} << 30;

// The model directory, opened once: every file is read relative to this
// descriptor, which keeps naming the same directory when a writer swaps a new
// one in under the path (seqpack/model_dir.h).
struct ModelDirFd {
  int fd = -1;
  explicit ModelDirFd(const std::string& dir) {
    const std::string where = "load_classifier";
    fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) return;
    const int e = errno;
    struct stat st {};
    if (e == ENOTDIR && ::stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
      throw std::invalid_argument(where + ": '" + dir + "' is not a model directory: it is " +
                                  detail::file_kind(st.st_mode) + ", not a directory");
    }
    if (e == ENOENT || e == ENOTDIR) {
      throw std::invalid_argument(where + ": model directory '" + dir + "' does not exist");
    }
    throw std::invalid_argument(where + ": cannot open model directory '" + dir +
                                "': " + std::strerror(e));
  }
  ~ModelDirFd() { ::close(fd); }
  ModelDirFd(const ModelDirFd&) = delete;
  ModelDirFd& operator=(const ModelDirFd&) = delete;

  // Whether `dir` no longer names this directory. The open descriptor pins the
  // directory's inode, so its number cannot have been reused by another one.
  bool replaced(const std::string& dir) const {
    struct stat mine {};
    struct stat now {};
    if (::fstat(fd, &mine) != 0) return false;
    if (::stat(dir.c_str(), &now) != 0) return true;
    return mine.st_dev != now.st_dev || mine.st_ino != now.st_ino;
  }
};

// The files of one model directory, all read through one descriptor. Returns
// std::nullopt only when a file is missing because a writer replaced the
// directory and is removing the old one (a save with keep_previous = false):
// then there is a new whole model under the path to read instead.
std::optional<TrainedClassifier> load_classifier_at(const ModelDirFd& d, const std::string& dir) {
  const std::string where = "load_classifier";
  bool gone = false;
  const auto read = [&](const char* name, const char* what, uint64_t max_bytes) -> std::string {
    const std::string path = dir + "/" + name;
    std::optional<std::string> bytes;
    try {
      bytes = detail::read_regular_file_at(d.fd, name, path, what, max_bytes);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(where + ": " + e.what());
    }
    if (bytes) return std::move(*bytes);
    if (d.replaced(dir)) {
      gone = true;
      return {};
    }
    throw std::invalid_argument(where + ": model directory '" + dir + "' has no " + name);
  };
  const std::string config_path = dir + "/config.json";
  const std::string model_path = dir + "/model.safetensors";
  const std::string text = read("config.json", "model config", kMaxJsonBytes);
  if (gone) return std::nullopt;
  TrainedClassifier tc;
  const CharClassifierOptions o =
      parse_classifier_config(text, where + ": '" + config_path + "'", &tc.labels);
  const std::string vocab_text = read("vocabulary.json", "vocabulary file", kMaxJsonBytes);
  if (gone) return std::nullopt;
  tc.vocabulary = Vocabulary::from_json(vocab_text, "'" + dir + "/vocabulary.json'");
  if (tc.vocabulary.size() != o.vocab_size) {
    throw std::invalid_argument(where + ": " + dir + "/vocabulary.json has " +
                                std::to_string(tc.vocabulary.size()) +
                                " entries but vocab_size = " + std::to_string(o.vocab_size));
  }
  const std::string weights =
      read("model.safetensors", "safetensors file", static_cast<uint64_t>(kMaxTensorBytes));
  if (gone) return std::nullopt;
  const std::map<std::string, Tensor> state =
      parse_safetensors(weights, nullptr, "'" + model_path + "'");
  // Checked before the model is built: its sizes come from config.json, and
  // only tensors that exist in the file are allocated for them.
  check_state(state, o, std::nullopt, "", where + ": '" + model_path + "'");
  tc.model = std::make_unique<CharClassifier>(o, 0);
  tc.model->load_state_dict(state);
  return tc;
}
}  // namespace

TrainedClassifier load_classifier(const std::string& dir) {
  // A model directory never changes in place: a save swaps in a new directory
  // (seqpack/model_dir.h). Its files are read through one descriptor of the
  // directory, so they are all of one model whatever is swapped in meanwhile.
  // The one case that opens the path again is a file removed with the directory
  // that held it (proven by the path naming another directory now): the path
  // then holds a newer whole model.
  constexpr int kMaxReopens = 1000;
  for (int opened = 1;; ++opened) {
    const ModelDirFd d(dir);
    std::optional<TrainedClassifier> tc = load_classifier_at(d, dir);
    if (tc) return std::move(*tc);
    if (opened == kMaxReopens) {
      throw std::runtime_error("load_classifier: model directory '" + dir + "' was replaced " +
                               std::to_string(kMaxReopens) +
                               " times while being read; try again when no save is running");
    }
  }
}

// ------------------------------------------------------------ checkpoints

namespace {
const char kCheckpointFormat[] = "seqpack-train-checkpoint";

nlohmann::json options_json(const CharClassifierOptions& o) {
  return {{"vocab_size", o.vocab_size},
          {"embed_dim", o.embed_dim},
          {"hidden_size", o.hidden_size},
          {"num_classes", o.num_classes},
          {"dtype", o.dtype == DType::f64 ? "F64" : "F32"}};
}

std::string parent_dir(const std::string& path) {
  const std::string p = std::filesystem::path(path).parent_path().string();
  return p.empty() ? "." : p;
}
}  // namespace

void save_training_checkpoint(const std::string& path, CharClassifier& model, const Adam& optimizer,
                              const Vocabulary& vocabulary, const std::vector<std::string>& labels,
                              int64_t epoch, const std::string& train_config) {
  const auto& o = model.options();
  if (static_cast<int64_t>(labels.size()) != o.num_classes || vocabulary.size() != o.vocab_size) {
    throw std::invalid_argument("save_training_checkpoint: " + std::to_string(labels.size()) +
                                " labels and a vocabulary of " + std::to_string(vocabulary.size()) +
                                " for a model of " + std::to_string(o.num_classes) + " classes and " +
                                std::to_string(o.vocab_size) + " embeddings");
  }
  std::map<std::string, Tensor> tensors;
  // Kept in the training dtype (unlike model.safetensors): a float64 run must
  // resume from its own bits.
  for (auto& [k, v] : model.state_dict()) tensors["model." + k] = v;
  for (auto& [k, v] : optimizer.state()) tensors["adam." + k] = v;
  const std::map<std::string, std::string> meta = {
      {"format", kCheckpointFormat},
      {"version", "1"},
      {"epoch", std::to_string(epoch)},
      {"adam_step", std::to_string(optimizer.step_count())},
      {"model_config", options_json(o).dump()},
      {"vocabulary", vocabulary.to_json()},
      {"labels", nlohmann::json(labels).dump()},
      {"train_config", train_config}};
  std::filesystem::create_directories(parent_dir(path));
  write_file_atomically(path, serialize_safetensors(tensors, meta));
}

namespace {
// A non-negative decimal integer, digits only ("12", not "+12", " 12" or "12abc").
int64_t metadata_count(const std::string& text, const std::string& key, const std::string& where) {
  const std::string shown_text = text.size() > 40 ? text.substr(0, 37) + "..." : text;
  const auto bad = [&](const std::string& why) {
    schema_error(where, "metadata \"" + key + "\" = '" + shown_text + "' " + why);
  };
  if (text.empty() ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    bad("is not a non-negative integer");
  }
  int64_t v = 0;
  for (char c : text) {
    if (v > (std::numeric_limits<int64_t>::max() - (c - '0')) / 10) bad("is too large");
    v = v * 10 + (c - '0');
  }
  return v;
}
}  // namespace

TrainingCheckpoint parse_training_checkpoint(const std::map<std::string, std::string>& meta,
                                             const std::map<std::string, Tensor>& tensors,
                                             const std::string& source) {
  // "<source> has ..." reads better than "<source>: has ...".
  const auto whole = [&](const std::string& what) {
    throw std::invalid_argument(source + " " + what);
  };
  const auto field = [&](const char* key) -> const std::string& {
    auto it = meta.find(key);
    if (it == meta.end()) whole(std::string("has no '") + key + "' metadata");
    return it->second;
  };
  if (field("format") != kCheckpointFormat) {
    whole("has format '" + field("format").substr(0, 80) + "', expected '" + kCheckpointFormat +
          "'");
  }
  if (field("version") != "1") {
    whole("has version '" + field("version").substr(0, 80) + "', this seqpack reads version 1");
  }
  TrainingCheckpoint ck;
  ck.epoch = metadata_count(field("epoch"), "epoch", source);
  ck.adam_step = metadata_count(field("adam_step"), "adam_step", source);

  const std::string mc_where = source + ": metadata \"model_config\"";
  const json mc = parse_json(field("model_config"), mc_where);
  if (!mc.is_object()) schema_error(mc_where, "expected a JSON object, got " + shown(mc));
  const CharClassifierOptions sizes = sizes_from(mc, mc_where);
  ck.model_options.vocab_size = sizes.vocab_size;
  ck.model_options.embed_dim = sizes.embed_dim;
  ck.model_options.hidden_size = sizes.hidden_size;
  ck.model_options.num_classes = sizes.num_classes;
  const json& dtype = field_of(mc, "dtype", mc_where);
  if (dtype != "F32" && dtype != "F64") {
    schema_error(mc_where, "\"dtype\" = " + shown(dtype) + " is not \"F32\" or \"F64\"");
  }
  ck.model_options.dtype = dtype == "F64" ? DType::f64 : DType::f32;

  const std::string labels_where = source + ": metadata \"labels\"";
  ck.labels = labels_from(parse_json(field("labels"), labels_where), "labels",
                          ck.model_options.num_classes, labels_where);
  ck.train_config = field("train_config");
  const std::string tc_where = source + ": metadata \"train_config\"";
  const json tc = parse_json(ck.train_config, tc_where);
  if (!tc.is_object()) schema_error(tc_where, "expected a JSON object, got " + shown(tc));
  ck.vocabulary = Vocabulary::from_json(field("vocabulary"), source + " (metadata \"vocabulary\")");
  if (ck.vocabulary.size() != ck.model_options.vocab_size) {
    schema_error(source, "the vocabulary has " + std::to_string(ck.vocabulary.size()) +
                             " entries but model_config's vocab_size = " +
                             std::to_string(ck.model_options.vocab_size));
  }

  for (const auto& [k, v] : tensors) {
    if (k.rfind("model.", 0) == 0) {
      ck.model_state[k.substr(6)] = v;
    } else if (k.rfind("adam.", 0) == 0) {
      ck.adam_state[k.substr(5)] = v;
    } else {
      schema_error(source, "unexpected tensor '" + k + "'");
    }
  }
  // Parameters in the training dtype with model_config's shapes; Adam's moments
  // shaped like their parameter (exp_avg_sq, a mean of squares, never negative).
  check_state(ck.model_state, ck.model_options, ck.model_options.dtype, "model.", source);
  const std::map<std::string, Shape> shapes = state_shapes(ck.model_options);
  const bool amsgrad = std::any_of(ck.adam_state.begin(), ck.adam_state.end(), [](const auto& kv) {
    return kv.first.rfind("max_exp_avg_sq.", 0) == 0;
  });
  std::map<std::string, std::pair<Shape, bool>> adam;  // key -> (shape, non-negative)
  for (const auto& [name, shape] : shapes) {
    adam["exp_avg." + name] = {shape, false};
    adam["exp_avg_sq." + name] = {shape, true};
    if (amsgrad) adam["max_exp_avg_sq." + name] = {shape, true};
  }
  for (const auto& [k, v] : ck.adam_state) {
    if (!adam.count(k)) schema_error(source, "unexpected tensor 'adam." + k + "'");
  }
  for (const auto& [k, spec] : adam) {
    const auto it = ck.adam_state.find(k);
    if (it == ck.adam_state.end()) schema_error(source, "tensor 'adam." + k + "' is missing");
    check_tensor(it->second, "adam." + k, spec.first, ck.model_options.dtype, spec.second, source);
  }
  return ck;
}

TrainingCheckpoint load_training_checkpoint(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw std::invalid_argument("no checkpoint at " + path);
  if (!S_ISREG(st.st_mode)) {
    throw std::invalid_argument("checkpoint " + path + " is not a regular file (it is " +
                                detail::file_kind(st.st_mode) + ")");
  }
  std::map<std::string, std::string> meta;
  std::map<std::string, Tensor> tensors;
  try {
    tensors = load_safetensors(path, &meta);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("checkpoint " + path + " is corrupt: " + e.what());
  }
  return parse_training_checkpoint(meta, tensors, "checkpoint " + path);
}

namespace {

// The first non-finite value of `logits` [n, c]: its row and column, or {-1, -1}.
std::pair<int64_t, int64_t> first_non_finite(const Tensor& logits) {
  const int64_t n = logits.size(0), c = logits.size(1);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < c; ++k) {
      if (!std::isfinite(logits.item_as_double(i * c + k))) return {i, k};
    }
  }
  return {-1, -1};
}

// " (label 'french')" for column k, when the labels are known.
std::string label_of(const std::vector<std::string>& labels, int64_t k) {
  return k < static_cast<int64_t>(labels.size()) ? " (label '" + labels[k] + "')" : "";
}

std::string value_name(double v) { return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf"; }

}  // namespace

Tensor TrainedClassifier::logits(const std::vector<std::u32string>& words) {
  std::vector<std::vector<int64_t>> seqs;
  for (const auto& w : words) seqs.push_back(vocabulary.encode(w));
  Tensor out = model->forward(seqs, /*requires_grad=*/false);
  // A model with finite weights can still overflow (weights near 3.4e38):
  // such a logit has no probability, and serving one would be a silent lie.
  const auto [i, k] = first_non_finite(out);
  if (i >= 0) {
    const std::u32string& word = words[static_cast<std::size_t>(i)];
    constexpr std::size_t kShown = 40;  // characters of the word quoted
    throw NonFiniteLogits("word " + std::to_string(i + 1) + " ('" +
                          encode_utf8(word.substr(0, kShown)) + (word.size() > kShown ? "..." : "") +
                          "'): logit " + std::to_string(k) + label_of(labels, k) + " is " +
                          value_name(out.item_as_double(i * out.size(1) + k)) +
                          ": the model's weights are finite but its output overflows, so no "
                          "probability can be given");
  }
  return out;
}

std::vector<std::vector<LabelScore>> TrainedClassifier::predict(
    const std::vector<std::u32string>& words) {
  if (words.empty()) return {};
  return scores(logits(words));
}

std::vector<std::vector<LabelScore>> TrainedClassifier::scores(const Tensor& logits) const {
  if (!logits.defined() || logits.dim() != 2 ||
      logits.size(1) != static_cast<int64_t>(labels.size())) {
    throw std::invalid_argument(
        "scores: logits must be [words, " + std::to_string(labels.size()) + "], got " +
        (logits.defined() ? shape_str(logits.shape()) : std::string("an undefined tensor")));
  }
  const auto [row, k] = first_non_finite(logits);
  if (row >= 0) {
    throw std::invalid_argument("scores: logits[" + std::to_string(row) + "][" +
                                std::to_string(k) + "]" + label_of(labels, k) + " is " +
                                value_name(logits.item_as_double(row * logits.size(1) + k)) +
                                ": a non-finite logit has no probability");
  }
  const Tensor p = softmax(logits);
  const std::size_t n = static_cast<std::size_t>(logits.size(0));
  std::vector<std::vector<LabelScore>> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t c = 0; c < labels.size(); ++c) {
      out[i].push_back({labels[c], p.item_as_double(static_cast<int64_t>(i * labels.size() + c))});
    }
    std::stable_sort(out[i].begin(), out[i].end(),
                     [](const LabelScore& a, const LabelScore& b) { return a.probability > b.probability; });
  }
  return out;
}

}  // namespace seqpack
