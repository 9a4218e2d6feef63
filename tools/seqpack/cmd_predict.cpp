// `seqpack predict --model DIR word...`: the top labels of each word with
// their probabilities, from a model saved by `seqpack train`.
#include <fmt/core.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.h"
#include "seqpack/classifier.h"
#include "seqpack/vocabulary.h"

namespace {

using namespace seqpack;

struct PredictArgs {
  std::string model = "seqpack-model";
  std::vector<std::string> words;
  int64_t top = 3;
  bool json = false;
};

void run_predict(const PredictArgs& a) {
  if (a.top <= 0) throw std::invalid_argument("--top = " + std::to_string(a.top) + " must be positive");
  TrainedClassifier tc = load_classifier(a.model);
  std::vector<std::u32string> words;
  for (std::size_t i = 0; i < a.words.size(); ++i) {
    words.push_back(decode_utf8(a.words[i], "word " + std::to_string(i + 1)));
  }
  const Tensor logits = tc.logits(words);
  const auto scores = tc.predict(words);
  auto unknown_chars = [&tc](const std::u32string& w) {
    int64_t n = 0;
    for (char32_t ch : w) n += tc.vocabulary.contains(ch) ? 0 : 1;
    return n;
  };
  if (a.json) {
    // Machine-readable, for tests/check_model_in_torch.py: raw logits in label order.
    nlohmann::json out = {{"labels", tc.labels}, {"predictions", nlohmann::json::array()}};
    const int64_t c = static_cast<int64_t>(tc.labels.size());
    for (std::size_t i = 0; i < words.size(); ++i) {
      std::vector<double> row;
      for (int64_t k = 0; k < c; ++k) row.push_back(logits.item_as_double(static_cast<int64_t>(i) * c + k));
      out["predictions"].push_back({{"word", a.words[i]},
                                    {"ids", tc.vocabulary.encode(words[i])},
                                    {"unknown_chars", unknown_chars(words[i])},
                                    {"logits", row},
                                    {"label", scores[i][0].label}});
    }
    fmt::print("{}\n", out.dump(1));
    return;
  }
  for (std::size_t i = 0; i < words.size(); ++i) {
    fmt::print("{}:", a.words[i].empty() ? "\"\"" : a.words[i]);
    const std::size_t k = std::min<std::size_t>(static_cast<std::size_t>(a.top), scores[i].size());
    for (std::size_t j = 0; j < k; ++j) {
      fmt::print("{} {} {:.1f}%", j ? "," : "", scores[i][j].label, 100.0 * scores[i][j].probability);
    }
    const int64_t unknown = unknown_chars(words[i]);
    if (unknown > 0) fmt::print("  ({} unknown character{} read as <unk>)", unknown, unknown > 1 ? "s" : "");
    // A zero-length sequence leaves the LSTM at its zero initial state.
    if (words[i].empty()) fmt::print("  (empty word: no characters, only the output layer's bias decides)");
    fmt::print("\n");
  }
}

void setup(CLI::App& sub) {
  auto a = std::make_shared<PredictArgs>();
  sub.add_option("--model", a->model, "model directory written by seqpack train")->capture_default_str();
  sub.add_option("words", a->words, "words to classify")->required();
  sub.add_option("--top", a->top, "labels shown per word")->capture_default_str();
  sub.add_flag("--json", a->json, "print logits and labels as JSON");
  sub.callback([a] { run_predict(*a); });
}

const bool registered = seqpack::cli::register_command(
    {"predict", "classify words with a model saved by seqpack train", setup});

}  // namespace
