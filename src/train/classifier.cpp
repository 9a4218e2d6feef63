#include "seqpack/classifier.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "seqpack/loss.h"
#include "seqpack/model_dir.h"
#include "seqpack/packed_sequence.h"
#include "seqpack/safetensors.h"

namespace seqpack {

void CharClassifierOptions::validate() const {
  auto positive = [](const char* name, int64_t v) {
    if (v <= 0) {
      throw std::invalid_argument(std::string("CharClassifier: ") + name + " = " +
                                  std::to_string(v) + " must be positive");
    }
  };
  positive("vocab_size", vocab_size);
  positive("embed_dim", embed_dim);
  positive("hidden_size", hidden_size);
  positive("num_classes", num_classes);
  if (dtype == DType::i64) throw std::invalid_argument("CharClassifier: dtype must be float32 or float64");
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

RNNOptions lstm_options(const CharClassifierOptions& o) {
  o.validate();
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
    : options_(options),
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
  RNNForwardResult r =
      rnn_forward_lookup(lstm_.options(), lstm_.parameters(), embedding_.weight(), ids, plan,
                         Tensor(), Tensor(), /*training=*/requires_grad,
                         /*save_for_backward=*/requires_grad);
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
  return fc_.forward(feat);
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
  std::vector<Tensor>& lg = lstm_.grads();
  for (std::size_t i = 0; i < lg.size(); ++i) add_into(lg[i], g.weights[i]);
  // g.input is the gradient of every embedding row; the padding row gets none.
  add_into(embedding_.grad(), g.input, embedding_.padding_idx().value_or(-1));
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

namespace {
std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("cannot open " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}
}  // namespace

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

TrainedClassifier load_classifier(const std::string& dir) {
  if (!std::filesystem::is_directory(dir)) {
    throw std::invalid_argument("load_classifier: " + dir + " is not a model directory");
  }
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(read_text(dir + "/config.json"));
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument("load_classifier: " + dir + "/config.json: " + e.what());
  }
  TrainedClassifier tc;
  CharClassifierOptions o;
  try {
    o.vocab_size = config.at("vocab_size").get<int64_t>();
    o.embed_dim = config.at("embed_dim").get<int64_t>();
    o.hidden_size = config.at("hidden_size").get<int64_t>();
    o.num_classes = config.at("num_classes").get<int64_t>();
    tc.labels = config.at("labels").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument("load_classifier: " + dir + "/config.json: " + e.what());
  }
  if (static_cast<int64_t>(tc.labels.size()) != o.num_classes) {
    throw std::invalid_argument("load_classifier: " + dir + "/config.json lists " +
                                std::to_string(tc.labels.size()) + " labels but num_classes = " +
                                std::to_string(o.num_classes));
  }
  tc.vocabulary = Vocabulary::load(dir + "/vocabulary.json");
  if (tc.vocabulary.size() != o.vocab_size) {
    throw std::invalid_argument("load_classifier: " + dir + "/vocabulary.json has " +
                                std::to_string(tc.vocabulary.size()) +
                                " entries but vocab_size = " + std::to_string(o.vocab_size));
  }
  tc.model = std::make_unique<CharClassifier>(o, 0);
  tc.model->load_state_dict(load_safetensors(dir + "/model.safetensors"));
  return tc;
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

TrainingCheckpoint load_training_checkpoint(const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) {
    throw std::invalid_argument("no checkpoint at " + path);
  }
  std::map<std::string, std::string> meta;
  std::map<std::string, Tensor> tensors;
  try {
    tensors = load_safetensors(path, &meta);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("checkpoint " + path + " is corrupt: " + e.what());
  }
  const auto field = [&](const char* key) -> const std::string& {
    auto it = meta.find(key);
    if (it == meta.end()) {
      throw std::invalid_argument("checkpoint " + path + " has no '" + key + "' metadata");
    }
    return it->second;
  };
  if (field("format") != kCheckpointFormat) {
    throw std::invalid_argument("checkpoint " + path + " has format '" + field("format") +
                                "', expected '" + kCheckpointFormat + "'");
  }
  if (field("version") != "1") {
    throw std::invalid_argument("checkpoint " + path + " has version " + field("version") +
                                ", this seqpack reads version 1");
  }
  TrainingCheckpoint ck;
  try {
    ck.epoch = std::stoll(field("epoch"));
    ck.adam_step = std::stoll(field("adam_step"));
    const auto mc = nlohmann::json::parse(field("model_config"));
    ck.model_options.vocab_size = mc.at("vocab_size").get<int64_t>();
    ck.model_options.embed_dim = mc.at("embed_dim").get<int64_t>();
    ck.model_options.hidden_size = mc.at("hidden_size").get<int64_t>();
    ck.model_options.num_classes = mc.at("num_classes").get<int64_t>();
    ck.model_options.dtype = mc.at("dtype").get<std::string>() == "F64" ? DType::f64 : DType::f32;
    ck.labels = nlohmann::json::parse(field("labels")).get<std::vector<std::string>>();
    ck.train_config = field("train_config");
    if (!nlohmann::json::parse(ck.train_config).is_object()) {
      throw std::invalid_argument("checkpoint " + path + ": train_config is not a JSON object");
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument("checkpoint " + path + ": bad metadata: " + e.what());
  } catch (const std::logic_error& e) {  // std::stoll
    throw std::invalid_argument("checkpoint " + path + ": bad epoch or adam_step metadata");
  }
  ck.vocabulary = Vocabulary::from_json(field("vocabulary"), path);
  if (ck.epoch < 0 || ck.adam_step < 0) {
    throw std::invalid_argument("checkpoint " + path + ": epoch " + std::to_string(ck.epoch) +
                                " or adam_step " + std::to_string(ck.adam_step) + " is negative");
  }
  if (static_cast<int64_t>(ck.labels.size()) != ck.model_options.num_classes ||
      ck.vocabulary.size() != ck.model_options.vocab_size) {
    throw std::invalid_argument("checkpoint " + path + ": " + std::to_string(ck.labels.size()) +
                                " labels and " + std::to_string(ck.vocabulary.size()) +
                                " vocabulary entries disagree with its model_config");
  }
  for (auto& [k, v] : tensors) {
    if (k.rfind("model.", 0) == 0) {
      ck.model_state[k.substr(6)] = v;
    } else if (k.rfind("adam.", 0) == 0) {
      ck.adam_state[k.substr(5)] = v;
    } else {
      throw std::invalid_argument("checkpoint " + path + ": unexpected tensor '" + k + "'");
    }
  }
  return ck;
}

Tensor TrainedClassifier::logits(const std::vector<std::u32string>& words) {
  std::vector<std::vector<int64_t>> seqs;
  for (const auto& w : words) seqs.push_back(vocabulary.encode(w));
  return model->forward(seqs, /*requires_grad=*/false);
}

std::vector<std::vector<LabelScore>> TrainedClassifier::predict(
    const std::vector<std::u32string>& words) {
  if (words.empty()) return {};
  return scores(logits(words));
}

std::vector<std::vector<LabelScore>> TrainedClassifier::scores(const Tensor& logits) const {
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
