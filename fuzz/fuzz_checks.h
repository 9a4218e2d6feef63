// The bodies of seqpack's fuzz targets, shared by the libFuzzer programs
// (fuzz/fuzz_*.cpp, clang only) and by tests/test_regressions.cpp, which
// replays the seed corpus and every input that once crashed through the same
// checks with any compiler, so a fixed crash stays fixed.
//
// Contract under test: bad input is rejected with std::invalid_argument (or its
// subclass SafetensorsError), and whatever is accepted satisfies the documented
// invariants. A check that fails throws fuzz::Finding, which is deliberately NOT
// an invalid_argument: it escapes the target and libFuzzer reports it as a crash.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "seqpack/classifier.h"
#include "seqpack/data.h"
#include "seqpack/optim.h"
#include "seqpack/packed_sequence.h"
#include "seqpack/safetensors.h"
#include "seqpack/tensor.h"
#include "seqpack/vocabulary.h"

namespace seqpack::fuzz {

// A broken invariant: a bug in seqpack, never a rejected input.
class Finding : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

inline void require(bool ok, const std::string& what) {
  if (!ok) throw Finding(what);
}

// Reads small integers and flags from the fuzzer's bytes; past the end it
// returns zeros, so every input (including the empty one) is a valid program.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  bool flag() { return byte() & 1; }
  // Uniform-ish in [lo, hi] (hi - lo < 256).
  int64_t range(int64_t lo, int64_t hi) { return lo + byte() % (hi - lo + 1); }
  bool empty() const { return pos_ >= size_; }

 private:
  const uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

// ---------------------------------------------------------------------------
// safetensors: parse arbitrary bytes; whatever parses must serialize and parse
// back to the same tensors and metadata.

inline void check_safetensors(const uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string> meta;
  std::map<std::string, Tensor> tensors;
  try {
    tensors = parse_safetensors(bytes, &meta, "<fuzz>");
  } catch (const SafetensorsError& e) {
    require(std::strlen(e.what()) > 0, "SafetensorsError with an empty message");
    return;
  }
  uint64_t total = 0;
  for (const auto& [name, t] : tensors) {
    require(t.defined(), "parsed tensor '" + name + "' is undefined");
    total += t.nbytes();
  }
  // The tensors tile the data buffer, so their bytes can never exceed the input.
  require(total <= size, "parsed tensors hold " + std::to_string(total) + " bytes from a " +
                             std::to_string(size) + "-byte input");
  std::string again;
  try {
    again = serialize_safetensors(tensors, meta);
  } catch (const std::invalid_argument& e) {
    throw Finding(std::string("a parsed file cannot be written back: ") + e.what());
  }
  std::map<std::string, std::string> meta2;
  const std::map<std::string, Tensor> back = parse_safetensors(again, &meta2, "<round trip>");
  require(meta2 == meta, "metadata changed in a serialize/parse round trip");
  require(back.size() == tensors.size(), "tensor count changed in a round trip");
  for (const auto& [name, t] : tensors) {
    const auto it = back.find(name);
    require(it != back.end(), "tensor '" + name + "' lost in a round trip");
    require(same_bytes(it->second, t), "tensor '" + name + "' changed in a round trip");
  }
}

// ---------------------------------------------------------------------------
// TSV datasets, UTF-8 and vocabularies on arbitrary bytes.

// A per-process scratch file: load_tsv reads paths, not memory. Removed when
// the process exits.
inline const std::string& scratch_path() {
  struct Scratch {
    std::string path;
    ~Scratch() { std::remove(path.c_str()); }
  };
  static const Scratch scratch{[] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir && *dir ? dir : "/tmp") + "/seqpack_fuzz_" +
           std::to_string(static_cast<long>(getpid())) + ".tsv";
  }()};
  return scratch.path;
}

inline void check_utf8(std::string_view bytes) {
  std::u32string cps;
  try {
    cps = decode_utf8(bytes, "fuzz");
  } catch (const std::invalid_argument&) {
    return;
  }
  // Strict UTF-8 is a bijection with sequences of scalar values.
  require(encode_utf8(cps) == bytes, "decode_utf8 then encode_utf8 changed the bytes");
}

inline void check_vocabulary_json(std::string_view bytes) {
  Vocabulary v;
  try {
    v = Vocabulary::from_json(bytes, "<fuzz>");
  } catch (const std::invalid_argument& e) {
    require(std::string(e.what()).find("<fuzz>") != std::string::npos,
            std::string("vocabulary error does not name its source: ") + e.what());
    return;
  }
  const Vocabulary back = Vocabulary::from_json(v.to_json(), "<round trip>");
  require(back == v, "vocabulary changed in a to_json/from_json round trip");
  for (std::size_t i = 0; i < v.code_points().size(); ++i) {
    const char32_t c = v.code_points()[i];
    require(v.id(c) == static_cast<int64_t>(i) + 2, "vocabulary id of a code point is not index + 2");
    require(v.code_point(static_cast<int64_t>(i) + 2) == c, "code_point(id(c)) != c");
  }
}

inline void check_tsv(std::string_view bytes) {
  const std::string& path = scratch_path();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw std::runtime_error("fuzz: cannot write " + path);
  }
  TextDataset ds;
  try {
    ds = load_tsv(path);
  } catch (const std::invalid_argument& e) {
    // Errors about a line must say which one.
    require(std::string(e.what()).find(path) != std::string::npos,
            std::string("load_tsv error does not name the file: ") + e.what());
    return;
  }
  require(std::is_sorted(ds.labels.begin(), ds.labels.end()) &&
              std::adjacent_find(ds.labels.begin(), ds.labels.end()) == ds.labels.end(),
          "labels are not sorted and unique");
  std::vector<std::u32string> texts;
  for (const Example& e : ds.examples) {
    require(e.label >= 0 && e.label < static_cast<int64_t>(ds.labels.size()), "label out of range");
    require(!e.text.empty() && !ds.labels[static_cast<std::size_t>(e.label)].empty(),
            "an accepted line has an empty label or text");
    require(e.text.find('\n') == std::string::npos, "text holds a newline");
    require(decode_utf8(e.text) == e.chars, "Example::chars differs from its decoded text");
    texts.push_back(e.chars);
  }
  const Vocabulary vocab = Vocabulary::build(texts);
  for (const std::u32string& t : texts) {
    const std::vector<int64_t> ids = vocab.encode(t);
    for (int64_t id : ids) require(id >= 2 && id < vocab.size(), "a corpus character maps to a special id");
    require(vocab.decode(ids) == t, "vocabulary decode(encode(text)) != text");
  }
  require(Vocabulary::from_json(vocab.to_json()) == vocab, "vocabulary JSON round trip");
  if (!ds.examples.empty()) {
    std::vector<int64_t> all(ds.examples.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
    const TokenBatch b = make_token_batch(vocab, ds.examples, all, /*batch_first=*/true);
    require(b.tokens.dim() == 2 && b.tokens.size(0) == static_cast<int64_t>(all.size()),
            "token batch has the wrong shape");
    const DatasetSplit split = split_dataset(ds, 0.8, 0.1, /*seed=*/1);
    require(split.train.size() + split.val.size() + split.test.size() == ds.examples.size(),
            "split_dataset lost or duplicated examples");
  }
}

inline void check_tsv_vocabulary(const uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  check_utf8(bytes);
  check_vocabulary_json(bytes);
  check_tsv(bytes);
}

// ---------------------------------------------------------------------------
// Model files: config.json, vocabulary.json and a training checkpoint's
// metadata. The first byte picks the file, the rest is its text (for a
// checkpoint: edits of a valid one, see check_checkpoint_edits). Rejection is
// only std::invalid_argument naming the source; whatever is accepted satisfies
// the documented limits, and an accepted checkpoint really loads into a model
// and an optimiser.

namespace detail {

inline bool labels_ok(const std::vector<std::string>& labels, int64_t num_classes) {
  std::vector<std::string> sorted = labels;
  std::sort(sorted.begin(), sorted.end());
  return static_cast<int64_t>(labels.size()) == num_classes &&
         std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end() &&
         std::none_of(labels.begin(), labels.end(), [](const std::string& l) { return l.empty(); });
}

inline bool sizes_ok(const CharClassifierOptions& o) {
  using O = CharClassifierOptions;
  return o.vocab_size >= 1 && o.vocab_size <= O::max_vocab_size && o.embed_dim >= 1 &&
         o.embed_dim <= O::max_embed_dim && o.hidden_size >= 1 &&
         o.hidden_size <= O::max_hidden_size && o.num_classes >= 1 &&
         o.num_classes <= O::max_num_classes;
}

inline bool mentions(const std::exception& e, const std::string& source) {
  return std::string(e.what()).find(source) != std::string::npos;
}

// A small valid checkpoint, written by save_training_checkpoint itself (once per
// process) and read back: its metadata and tensors are what the fuzzer edits.
struct BaseCheckpoint {
  std::map<std::string, std::string> meta;
  std::map<std::string, Tensor> tensors;
};

inline const BaseCheckpoint& base_checkpoint() {
  static const BaseCheckpoint base = [] {
    const Vocabulary vocab = Vocabulary::build({U"ab\u00e9"});
    CharClassifier model(
        {.vocab_size = vocab.size(), .embed_dim = 2, .hidden_size = 2, .num_classes = 2}, 1);
    Adam opt(model.parameters(), {.lr = 1e-3});
    const char* dir = std::getenv("TMPDIR");
    const std::string path = std::string(dir && *dir ? dir : "/tmp") + "/seqpack_fuzz_ckpt_" +
                             std::to_string(static_cast<long>(getpid())) + ".safetensors";
    save_training_checkpoint(path, model, opt, vocab, {"x", "y"}, 3, R"({"epochs": 5})");
    BaseCheckpoint b;
    b.tensors = load_safetensors(path, &b.meta);
    std::remove(path.c_str());
    return b;
  }();
  return base;
}

}  // namespace detail

// Each returns whether the input was accepted (so tests can tell), and throws
// Finding for a broken invariant.
inline bool check_classifier_config(std::string_view bytes) {
  const std::string source = "<fuzz config.json>";
  std::vector<std::string> labels;
  CharClassifierOptions o;
  try {
    o = parse_classifier_config(std::string(bytes), source, &labels);
  } catch (const std::invalid_argument& e) {
    require(detail::mentions(e, source),
            std::string("config error does not name its source: ") + e.what());
    return false;
  }
  require(detail::sizes_ok(o), "an accepted config.json has a size outside the limits");
  require(detail::labels_ok(labels, o.num_classes), "an accepted config.json has bad labels");
  // What it says, written back canonically, reads the same.
  const nlohmann::json again = {{"format", "seqpack-char-classifier"},
                                {"version", 1},
                                {"vocab_size", o.vocab_size},
                                {"embed_dim", o.embed_dim},
                                {"hidden_size", o.hidden_size},
                                {"num_classes", o.num_classes},
                                {"labels", labels}};
  std::vector<std::string> labels2;
  const CharClassifierOptions o2 = parse_classifier_config(again.dump(), "<round trip>", &labels2);
  require(o2.vocab_size == o.vocab_size && o2.embed_dim == o.embed_dim &&
              o2.hidden_size == o.hidden_size && o2.num_classes == o.num_classes &&
              labels2 == labels,
          "config.json changed in a write/read round trip");
  return true;
}

// `edits`: '\n'-separated lines applied to a valid checkpoint:
//   key=value      sets metadata `key` (any key, any bytes)
//   key            removes metadata `key`
//   @nan:T  @inf:T  @neg:T  put NaN / +Inf / -1 in tensor T's first element
//   @drop:T  @grow:T  @f64:T  remove T, give it one more element, convert it to float64
//   @add:T         adds a float32 tensor T of one zero
inline bool check_checkpoint_edits(std::string_view edits) {
  const std::string source = "<fuzz checkpoint>";
  std::map<std::string, std::string> meta = detail::base_checkpoint().meta;
  std::map<std::string, Tensor> tensors;
  for (const auto& [k, v] : detail::base_checkpoint().tensors) tensors[k] = v.clone();
  std::size_t pos = 0;
  while (pos <= edits.size()) {
    std::size_t end = edits.find('\n', pos);
    if (end == std::string_view::npos) end = edits.size();
    const std::string line(edits.substr(pos, end - pos));
    pos = end + 1;
    if (line.empty()) continue;
    if (line[0] == '@') {
      const std::size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      const std::string op = line.substr(1, colon - 1), name = line.substr(colon + 1);
      if (op == "add") {
        tensors[name] = Tensor::zeros({1});
        continue;
      }
      const auto it = tensors.find(name);
      if (it == tensors.end()) continue;
      Tensor& t = it->second;
      if (op == "drop") {
        tensors.erase(it);
      } else if (op == "grow") {
        Shape shape = t.shape();
        shape.push_back(1);
        if (!shape.empty()) shape[0] += 1;
        t = Tensor::zeros(shape, t.dtype());
      } else if (op == "f64") {
        t = t.to(DType::f64);
      } else if (t.numel() > 0 && (op == "nan" || op == "inf" || op == "neg")) {
        const double v = op == "nan" ? std::nan("") : op == "inf" ? INFINITY : -1.0;
        if (t.dtype() == DType::f32) t.data<float>()[0] = static_cast<float>(v);
        if (t.dtype() == DType::f64) t.data<double>()[0] = v;
      }
    } else {
      const std::size_t eq = line.find('=');
      if (eq == std::string::npos) {
        meta.erase(line);
      } else {
        meta[line.substr(0, eq)] = line.substr(eq + 1);
      }
    }
  }
  TrainingCheckpoint ck;
  try {
    ck = parse_training_checkpoint(meta, tensors, source);
  } catch (const std::invalid_argument& e) {
    require(detail::mentions(e, source),
            std::string("checkpoint error does not name its source: ") + e.what());
    return false;
  }
  const CharClassifierOptions& o = ck.model_options;
  require(detail::sizes_ok(o), "an accepted checkpoint has a size outside the limits");
  require(o.dtype == DType::f32 || o.dtype == DType::f64,
          "an accepted checkpoint has an integer dtype");
  require(detail::labels_ok(ck.labels, o.num_classes), "an accepted checkpoint has bad labels");
  require(ck.vocabulary.size() == o.vocab_size,
          "an accepted checkpoint's vocabulary disagrees with its sizes");
  require(ck.epoch >= 0 && ck.adam_step >= 0, "an accepted checkpoint has a negative count");
  // Its tensors match model_config, so this allocates no more than the input holds.
  CharClassifier model(o, 0);
  bool amsgrad = false;
  for (const auto& [k, v] : ck.adam_state) amsgrad = amsgrad || k.rfind("max_exp_avg_sq.", 0) == 0;
  Adam opt(model.parameters(), {.lr = 1e-3, .amsgrad = amsgrad});
  try {
    model.load_state_dict(ck.model_state);
    opt.load_state(ck.adam_state, ck.adam_step);
  } catch (const std::invalid_argument& e) {
    throw Finding(std::string("an accepted checkpoint does not load: ") + e.what());
  }
  for (const Parameter& p : model.parameters()) {
    for (int64_t i = 0; i < p.value.numel(); ++i) {
      require(std::isfinite(p.value.item_as_double(i)),
              "an accepted checkpoint holds a non-finite weight");
    }
  }
  return true;
}

inline void check_model_files(const uint8_t* data, std::size_t size) {
  if (size == 0) return;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      check_classifier_config(text);
      break;
    case 1:
      check_vocabulary_json(text);
      break;
    default:
      check_checkpoint_edits(text);
      break;
  }
}

// ---------------------------------------------------------------------------
// Packing, driven by fuzzed shapes, lengths and flags. The expected outcome is
// computed here independently of the library: which inputs must be rejected,
// and where every element must land.

namespace detail {

// A value that cannot come out of the library by accident: distinct per element.
inline double element_value(int64_t i) { return static_cast<double>(i + 1); }

inline double padding_value_from(uint8_t code) {
  // Includes values a dtype cannot hold (NaN and 1e300 for int64, 1e300 for
  // float32): those must be rejected or converted, never undefined behaviour.
  static const double table[] = {0.0, -1.0, 7.5, -0.0, 1e300, std::nan(""), 42.0, -3.0};
  return table[code % 8];
}

// PyTorch 1.13 (at::full) rejects a padding value the dtype cannot hold
// ("value cannot be converted to type int64_t without overflow") and truncates
// a fractional one for int64: NaN and 1e300 for int64, 1e300 for float32.
inline bool padding_fits(double v, DType dtype) {
  switch (dtype) {
    case DType::f64:
      return true;
    case DType::f32:
      return !std::isfinite(v) || std::fabs(v) <= std::numeric_limits<float>::max();
    case DType::i64:
      return !std::isnan(v) && v >= -9.2e18 && v <= 9.2e18;
  }
  return false;
}

// The padding element as the library must store it.
inline double stored_padding(double v, DType dtype) {
  switch (dtype) {
    case DType::f32:
      return static_cast<double>(static_cast<float>(v));
    case DType::i64:
      return std::trunc(v);
    case DType::f64:
      break;
  }
  return v;
}

// Element `k` of padded position (t, b) with a trailing feature size F.
inline int64_t flat_index(int64_t t, int64_t b, int64_t k, int64_t T, int64_t B, int64_t F,
                          bool batch_first) {
  return ((batch_first ? b * T + t : t * B + b) * F) + k;
}

inline bool equal_value(double a, double e) { return a == e || (std::isnan(a) && std::isnan(e)); }

}  // namespace detail

inline void check_packing(const uint8_t* data, std::size_t size) {
  using detail::flat_index;
  ByteReader in(data, size);
  const DType dtype = static_cast<DType>(in.range(0, 2));
  const bool batch_first = in.flag();
  const bool enforce_sorted = in.flag();
  const int64_t B = in.range(0, 6);
  const int64_t T = in.range(0, 7);
  Shape tail;
  for (int64_t d = in.range(0, 3); d > 0; --d) tail.push_back(in.range(0, 3));
  int64_t F = 1;
  for (int64_t s : tail) F *= s;
  // Usually one length per sequence, sometimes one too few or too many.
  const uint8_t count_code = in.byte();
  const int64_t nlen = count_code < 240 ? B : std::max<int64_t>(0, B + (count_code & 1 ? 1 : -1));
  std::vector<int64_t> lengths;
  for (int64_t i = 0; i < nlen; ++i) {
    const uint8_t c = in.byte();
    // Mostly valid lengths, sometimes negative or too long.
    lengths.push_back(c < 230 ? c % (T + 1) : (c & 1 ? -1 - (c % 3) : T + 1 + (c % 3)));
  }
  const double padding_value = detail::padding_value_from(in.byte());
  const uint8_t total_code = in.byte();
  std::optional<int64_t> total_length;
  if (total_code & 1) total_length = static_cast<int64_t>(total_code >> 1) % 12 - 2;

  Shape shape = batch_first ? Shape{B, T} : Shape{T, B};
  shape.insert(shape.end(), tail.begin(), tail.end());
  Tensor input = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < input.numel(); ++i) {
    switch (dtype) {
      case DType::f32: input.data<float>()[i] = static_cast<float>(detail::element_value(i)); break;
      case DType::f64: input.data<double>()[i] = detail::element_value(i); break;
      case DType::i64: input.data<int64_t>()[i] = static_cast<int64_t>(detail::element_value(i)); break;
    }
  }
  const Tensor input_copy = input.clone();

  // Which inputs must be rejected, decided here from the documented rules.
  std::string must_reject;
  if (static_cast<int64_t>(lengths.size()) != B) must_reject = "number of lengths != batch";
  for (std::size_t b = 0; b < lengths.size() && must_reject.empty(); ++b) {
    if (lengths[b] < 0) must_reject = "negative length";
    if (lengths[b] > T) must_reject = "length > padded length";
  }
  if (must_reject.empty() && enforce_sorted) {
    for (std::size_t b = 1; b < lengths.size(); ++b) {
      if (lengths[b] > lengths[b - 1]) must_reject = "unsorted lengths with enforce_sorted";
    }
  }

  PackedSequence packed;
  try {
    packed = pack_padded_sequence(input, lengths, batch_first, enforce_sorted);
  } catch (const std::invalid_argument& e) {
    require(!must_reject.empty(), std::string("valid input rejected: ") + e.what());
    require(same_bytes(input, input_copy), "a rejected pack_padded_sequence modified its input");
    return;
  }
  require(must_reject.empty(), "pack_padded_sequence accepted bad input: " + must_reject);
  require(same_bytes(input, input_copy), "pack_padded_sequence modified its input");
  packed.validate();

  // batch_sizes[t] = number of sequences longer than t.
  const int64_t max_len = lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
  const std::vector<int64_t> bs = packed.batch_sizes.to_vector<int64_t>();
  require(static_cast<int64_t>(bs.size()) == max_len, "batch_sizes has the wrong length");
  int64_t rows = 0;
  for (int64_t t = 0; t < max_len; ++t) {
    const int64_t expect = std::count_if(lengths.begin(), lengths.end(), [&](int64_t l) { return l > t; });
    require(bs[t] == expect, "batch_sizes[" + std::to_string(t) + "] is wrong");
    rows += expect;
  }
  require(packed.data.size(0) == rows, "packed data has the wrong number of rows");
  // Zero-length sequences keep their indices, so the batch size survives packing.
  require(packed.batch_size() == B, "PackedSequence::batch_size() is " +
                                        std::to_string(packed.batch_size()) + ", expected " + std::to_string(B));

  // pad_packed_sequence: values at valid steps, padding elsewhere, lengths back.
  const bool total_ok = !total_length || *total_length >= max_len;
  const bool pad_ok = detail::padding_fits(padding_value, dtype);
  std::pair<Tensor, Tensor> padded;
  bool padded_done = false;
  try {
    padded = pad_packed_sequence(packed, batch_first, padding_value, total_length);
    padded_done = true;
  } catch (const std::invalid_argument& e) {
    require(!total_ok || !pad_ok, std::string("pad_packed_sequence rejected valid input: ") + e.what());
  }
  if (padded_done) {
    require(total_ok, "pad_packed_sequence accepted total_length < longest length");
    require(pad_ok, "pad_packed_sequence accepted a padding value its dtype cannot hold");
    const int64_t Tp = total_length.value_or(max_len);
    {
      require(padded.second.to_vector<int64_t>() == lengths, "pad_packed_sequence lengths differ");
      const Tensor& out = padded.first;
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t t = 0; t < Tp; ++t) {
          for (int64_t k = 0; k < F; ++k) {
            const double got = out.item_as_double(flat_index(t, b, k, Tp, B, F, batch_first));
            const double want = t < lengths[b]
                                    ? input.item_as_double(flat_index(t, b, k, T, B, F, batch_first))
                                    : detail::stored_padding(padding_value, dtype);
            require(detail::equal_value(got, want), "pad_packed_sequence put a wrong value at (t=" +
                                                        std::to_string(t) + ", b=" + std::to_string(b) + ")");
          }
        }
      }
    }
  }

  // unpack_sequence and unpad_sequence give each sequence's valid steps.
  const std::vector<Tensor> unpacked = unpack_sequence(packed);
  const std::vector<Tensor> unpadded = unpad_sequence(input, lengths, batch_first);
  require(same_bytes(input, input_copy), "unpad_sequence modified its input");
  {
    require(unpacked.size() == static_cast<std::size_t>(B), "unpack_sequence lost sequences");
    for (int64_t b = 0; b < B; ++b) {
      require(same_bytes(unpacked[b], unpadded[b]), "unpack_sequence and unpad_sequence differ at " +
                                                        std::to_string(b));
    }
  }
  for (int64_t b = 0; b < B; ++b) {
    require(unpadded[b].size(0) == lengths[b], "unpad_sequence returned the wrong length");
    for (int64_t t = 0; t < lengths[b]; ++t) {
      for (int64_t k = 0; k < F; ++k) {
        require(unpadded[b].item_as_double(t * F + k) ==
                    input.item_as_double(flat_index(t, b, k, T, B, F, batch_first)),
                "unpad_sequence put a wrong value");
      }
    }
  }

  // pack_sequence of the unpadded sequences packs exactly the same.
  if (B > 0) {
    const PackedSequence again = pack_sequence(unpadded, enforce_sorted);
    require(same_bytes(again.data, packed.data), "pack_sequence and pack_padded_sequence differ");
    require(same_bytes(again.batch_sizes, packed.batch_sizes), "pack_sequence batch_sizes differ");
    const PaddingSide side = in.flag() ? PaddingSide::left : PaddingSide::right;
    try {
      const Tensor side_padded = pad_sequence(unpadded, batch_first, padding_value, side);
      require(pad_ok, "pad_sequence accepted a padding value its dtype cannot hold");
      require(side_padded.size(batch_first ? 1 : 0) == max_len, "pad_sequence has the wrong length");
      for (int64_t b = 0; b < B; ++b) {
        const int64_t start = side == PaddingSide::left ? max_len - lengths[b] : 0;
        for (int64_t t = 0; t < max_len; ++t) {
          for (int64_t k = 0; k < F; ++k) {
            const bool valid = t >= start && t < start + lengths[b];
            const double want = valid ? unpadded[b].item_as_double((t - start) * F + k)
                                      : detail::stored_padding(padding_value, dtype);
            require(detail::equal_value(
                        side_padded.item_as_double(flat_index(t, b, k, max_len, B, F, batch_first)), want),
                    "pad_sequence put a wrong value");
          }
        }
      }
    } catch (const std::invalid_argument& e) {
      require(!pad_ok, std::string("pad_sequence rejected valid input: ") + e.what());
    }
  }

  // The two backward functions are the adjoint scatter/gather of the plan.
  const PackingPlan plan = PackingPlan::from_lengths(lengths, enforce_sorted);
  const Tensor grad_in = pack_padded_sequence_backward(packed.data, plan, T, batch_first);
  require(grad_in.shape() == input.shape(), "pack_padded_sequence_backward has the wrong shape");
  const Tensor regathered = pad_packed_sequence_backward(grad_in, plan, batch_first);
  require(same_bytes(regathered, packed.data), "backward gather(scatter(rows)) != rows");

  // A hand-built PackedSequence with one fuzzed change: either rejected
  // cleanly, or valid by the documented rules and then padded consistently.
  if (!in.empty()) {
    PackedSequence bad = packed;
    bad.batch_sizes = packed.batch_sizes.clone();
    bad.sorted_indices = packed.sorted_indices.defined() ? packed.sorted_indices.clone() : Tensor();
    bad.unsorted_indices = packed.unsorted_indices.defined() ? packed.unsorted_indices.clone() : Tensor();
    const uint8_t what = in.byte() % 5;
    const int64_t value = in.range(-2, 8);
    auto poke = [&](Tensor& t) {
      if (t.defined() && t.numel() > 0) t.data<int64_t>()[in.range(0, 255) % t.numel()] = value;
    };
    if (what == 0) poke(bad.batch_sizes);
    if (what == 1) poke(bad.sorted_indices);
    if (what == 2) poke(bad.unsorted_indices);
    if (what == 3) bad.unsorted_indices = Tensor();
    if (what == 4) bad.data = packed.data.slice0(0, std::max<int64_t>(0, packed.data.size(0) - 1));
    try {
      const auto [p, l] = pad_packed_sequence(bad, batch_first, 0.0);
      // Accepted: it must be a valid layout, so packing its padding reproduces it.
      const std::vector<int64_t> got_lengths = l.to_vector<int64_t>();
      const PackedSequence repacked =
          pack_padded_sequence(p, got_lengths, batch_first, /*enforce_sorted=*/false);
      require(same_bytes(repacked.data, bad.data), "an accepted hand-built PackedSequence does not repack");
    } catch (const std::invalid_argument&) {
    }
  }

  // invert_permutation on fuzzed vectors.
  std::vector<int64_t> perm;
  for (int64_t n = in.range(0, 6), i = 0; i < n; ++i) perm.push_back(in.range(-1, 6));
  std::vector<bool> seen(perm.size(), false);
  bool is_perm = true;
  for (int64_t v : perm) {
    if (v < 0 || v >= static_cast<int64_t>(perm.size()) || seen[v]) {
      is_perm = false;
      break;
    }
    seen[v] = true;
  }
  try {
    const std::vector<int64_t> inv = invert_permutation(Tensor::from_vector(perm)).to_vector<int64_t>();
    require(is_perm, "invert_permutation accepted a non-permutation");
    for (std::size_t i = 0; i < perm.size(); ++i) require(inv[perm[i]] == static_cast<int64_t>(i), "inverse wrong");
  } catch (const std::invalid_argument&) {
    require(!is_perm, "invert_permutation rejected a permutation");
  }
}

}  // namespace seqpack::fuzz
