// `seqpack predict --model DIR word...`: the top labels of each word with
// their probabilities, from a model saved by `seqpack train`.
// `seqpack predict --stream`: the same for each line of standard input, answered
// and flushed as it arrives, with the model loaded once.
#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
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
  bool stream = false;
};

// Prints the predictions for `texts` (UTF-8): "word: label p%, ..." lines, or
// with --json one JSON document (compact, on one line, when streaming).
void print_predictions(TrainedClassifier& tc, const std::vector<std::string>& texts,
                       const PredictArgs& a, bool one_line_json) {
  std::vector<std::u32string> words;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    words.push_back(decode_utf8(texts[i], "word " + std::to_string(i + 1)));
  }
  const Tensor logits = tc.logits(words);
  const auto scores = tc.scores(logits);
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
      out["predictions"].push_back({{"word", texts[i]},
                                    {"ids", tc.vocabulary.encode(words[i])},
                                    {"unknown_chars", unknown_chars(words[i])},
                                    {"logits", row},
                                    {"label", scores[i][0].label}});
    }
    fmt::print("{}\n", one_line_json ? out.dump() : out.dump(1));
    return;
  }
  for (std::size_t i = 0; i < words.size(); ++i) {
    fmt::print("{}:", texts[i].empty() ? "\"\"" : texts[i]);
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

void run_predict(const PredictArgs& a) {
  if (a.stream && !a.words.empty()) {
    throw std::invalid_argument("--stream reads the words from standard input, one per line; got " +
                                std::to_string(a.words.size()) + " on the command line too ('" +
                                a.words[0] + "'...)");
  }
  if (!a.stream && a.words.empty()) {
    throw std::invalid_argument("words is required: give words to classify, or --stream to read "
                                "them from standard input");
  }
  TrainedClassifier tc = load_classifier(a.model);
  if (!a.stream) {
    print_predictions(tc, a.words, a, /*one_line_json=*/false);
    return;
  }
  // The model stays loaded; each line is answered (and flushed) as it arrives,
  // so a pipe or a socket gets its answer before sending the next word.
  std::string line;
  int64_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    try {
      print_predictions(tc, {line}, a, /*one_line_json=*/true);
    } catch (const std::invalid_argument& e) {
      // One bad line (invalid UTF-8) must not end the service: say so and go on.
      fmt::print(stderr, "seqpack: line {}: {}\n", line_no, e.what());
      fmt::print("{}\n", a.json ? R"({"error": "invalid input"})" : "error: invalid input");
    }
    std::fflush(stdout);
    std::fflush(stderr);
  }
}

void setup(CLI::App& sub) {
  auto a = std::make_shared<PredictArgs>();
  sub.add_option("--model", a->model, "model directory written by seqpack train")->capture_default_str();
  sub.add_option("words", a->words, "words to classify");
  seqpack::cli::add_number<int64_t>(sub, "--top", a->top, "labels shown per word", 1);
  sub.add_flag("--json", a->json, "print logits and labels as JSON (with --stream: one line per word)");
  sub.add_flag("--stream", a->stream,
               "read words from standard input, one per line, and answer each line as it arrives "
               "(the model is loaded once)");
  sub.callback([a] { run_predict(*a); });
}

const bool registered = seqpack::cli::register_command(
    {"predict", "classify words with a model saved by seqpack train", setup});

}  // namespace
