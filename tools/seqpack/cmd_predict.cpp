// `seqpack predict --model DIR word...`: the top labels of each word with
// their probabilities, from a model saved by `seqpack train`.
// `seqpack predict --stream`: the same for each line of standard input, answered
// and flushed as it arrives, with the model loaded once. A line longer than
// --max-chars characters is answered with an error and skipped without being
// held in memory (the forward's workspace grows with the line: 0.53 GB at
// 100k characters), and the stream goes on.
#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "command.h"
#include "seqpack/classifier.h"
#include "seqpack/policy.h"
#include "seqpack/precision.h"
#include "seqpack/safetensors.h"
#include "seqpack/threading.h"
#include "seqpack/vocabulary.h"

namespace {

using namespace seqpack;

struct PredictArgs {
  seqpack::cli::ModelOption model;
  std::vector<std::string> words;
  int64_t top = 3;
  bool json = false;
  bool stream = false;
  int64_t max_chars = 10000;
  std::string precision = "fp32";
  std::string eval;
  int64_t batch_size = 64;
  int threads = 0;
};

// Reads one line of `in` (without its '\n') into `line`, keeping at most `cap`
// bytes; `overlong` says whether the line had more. The rest of a longer line
// is read and discarded (`skip_rest`, so the next call reads the next line),
// or left unread. False at the end of the input with nothing read. A read
// error ends the line like the end of the input; its errno is kept in
// `read_errno` (the reason, said after the line is dealt with).
bool read_line_bounded(std::FILE* in, std::string& line, std::size_t cap, bool& overlong,
                       int& read_errno, bool skip_rest = true) {
  line.clear();
  overlong = false;
  const auto next = [&] {
    errno = 0;
    const int c = std::getc(in);
    if (c == EOF && std::ferror(in) && read_errno == 0) read_errno = errno != 0 ? errno : EIO;
    return c;
  };
  int c = next();
  if (c == EOF) return false;
  for (; c != EOF && c != '\n'; c = next()) {
    if (line.size() < cap) {
      line.push_back(static_cast<char>(c));
    } else {
      overlong = true;
      if (!skip_rest) break;
    }
  }
  return true;
}

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

// The bytes a line of `--eval` may have: a word of --max-chars characters (at
// most 4 bytes each in UTF-8), a tab, the longest label or a label index, and
// a '\r'. A longer line cannot be valid, so it is refused after reading that
// many bytes, whatever its length.
std::size_t eval_line_cap(const TrainedClassifier& tc, int64_t max_chars) {
  std::size_t label = 20;  // the digits of any int64 index
  for (const std::string& l : tc.labels) label = std::max(label, l.size());
  return static_cast<std::size_t>(max_chars) * 4 + label + 2;
}

// "a directory", "a character device", ... for a message about `mode`.
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

// Opens --eval's file for reading: only a regular file (after following
// links). A directory, a device (/dev/zero would be read for ever) or a FIFO
// (opened without blocking, so one without a writer does not hang) is refused,
// naming the path and what it is.
std::FILE* open_eval_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    throw std::invalid_argument("--eval " + path + ": cannot open the file: " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string err = std::strerror(errno);
    ::close(fd);
    throw std::invalid_argument("--eval " + path + ": cannot stat the file: " + err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw std::invalid_argument("--eval " + path + " is " + file_kind(st.st_mode) +
                                ", not a regular file (give a file of label<TAB>word lines)");
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  std::FILE* f = ::fdopen(fd, "rb");
  if (f == nullptr) {
    ::close(fd);
    throw std::invalid_argument("--eval " + path + ": cannot open the file: " + std::strerror(errno));
  }
  return f;
}

// --eval FILE: accuracy and speed over a labelled file (`label<TAB>word`
// lines, the label a name of the model's or its index, as `seqpack data
// export` writes them), in batches of --batch-size words. 64 by default:
// the fastest of 64-512 for fp32 and int8 alike on the main job's model
// (a step's gate rows of 512 words, 1 MB at hidden 128, leave the L2).
// The file is read a batch at a time, so memory does not grow with it.
void run_eval(TrainedClassifier& tc, const PredictArgs& a) {
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> in(open_eval_file(a.eval), &std::fclose);
  const std::size_t cap = eval_line_cap(tc, a.max_chars);
  const auto kBatch = static_cast<std::size_t>(a.batch_size);
  std::vector<std::u32string> words;
  std::vector<int64_t> labels;
  int64_t total = 0, right = 0;
  double secs = 0;
  auto classify = [&] {
    if (words.empty()) return;
    const auto t0 = std::chrono::steady_clock::now();
    const Tensor logits = tc.logits(words);
    secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int64_t c = logits.size(1);
    for (std::size_t i = 0; i < words.size(); ++i) {
      int64_t best = 0;  // the first of equal maxima, as std::max_element
      for (int64_t k = 1; k < c; ++k) {
        const int64_t at = static_cast<int64_t>(i) * c;
        if (logits.item_as_double(at + k) > logits.item_as_double(at + best)) best = k;
      }
      right += best == labels[i];
    }
    total += static_cast<int64_t>(words.size());
    words.clear();
    labels.clear();
  };
  std::string line;
  bool overlong = false;
  int read_errno = 0;
  for (int64_t no = 1;
       read_line_bounded(in.get(), line, cap, overlong, read_errno, /*skip_rest=*/false); ++no) {
    const std::string where = "--eval " + a.eval + " line " + std::to_string(no);
    if (overlong) {
      throw std::invalid_argument(where + " is longer than " + std::to_string(cap) +
                                  " bytes, so its word has more than --max-chars " +
                                  std::to_string(a.max_chars) + " characters");
    }
    // A UTF-8 byte-order mark (as some Windows editors write) is not part of the first label.
    if (no == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const auto tab = line.find('\t');
    if (tab == std::string::npos) throw std::invalid_argument(where + ": no tab (label<TAB>word)");
    const std::string label = line.substr(0, tab);
    auto it = std::find(tc.labels.begin(), tc.labels.end(), label);
    int64_t index = it - tc.labels.begin();
    if (it == tc.labels.end()) {
      char* end = nullptr;
      errno = 0;
      index = std::strtoll(label.c_str(), &end, 10);
      if (label.empty() || *end != '\0' || errno != 0 || index < 0 ||
          index >= static_cast<int64_t>(tc.labels.size())) {
        throw std::invalid_argument(where + ": label '" + label +
                                    "' is neither one of the model's labels nor an index below " +
                                    std::to_string(tc.labels.size()));
      }
    }
    std::u32string word = decode_utf8(line.substr(tab + 1), where);
    if (static_cast<int64_t>(word.size()) > a.max_chars) {
      throw std::invalid_argument(where + " has " + std::to_string(word.size()) +
                                  " characters, more than --max-chars " +
                                  std::to_string(a.max_chars));
    }
    words.push_back(std::move(word));
    labels.push_back(index);
    if (words.size() == kBatch) classify();
  }
  if (std::ferror(in.get())) {
    throw std::invalid_argument("--eval " + a.eval + ": error reading the file: " +
                                std::strerror(read_errno != 0 ? read_errno : EIO));
  }
  classify();
  if (total == 0) {
    throw std::invalid_argument("--eval " + a.eval +
                                " has no words: it needs label<TAB>word lines (seqpack data "
                                "export writes them), and an accuracy over 0 words means nothing");
  }
  const double acc = 100.0 * static_cast<double>(right) / static_cast<double>(total);
  const char* prec = precision_name(tc.model->options().precision);
  if (a.json) {
    nlohmann::ordered_json j = {{"words", total},     {"accuracy", acc},   {"seconds", secs},
                                {"precision", prec},  {"threads", num_threads()}};
    fmt::print("{}\n", j.dump());
    return;
  }
  fmt::print("accuracy: {:.2f}% ({} words), {:.4f} s ({:.0f} words/s), precision {}, {} thread{}\n",
             acc, total, secs, secs > 0 ? static_cast<double>(total) / secs : 0.0, prec,
             num_threads(), num_threads() == 1 ? "" : "s");
}

void run_predict(const PredictArgs& a) {
  seqpack::cli::place_threads(a.threads);
  if (!a.eval.empty() && (a.stream || !a.words.empty())) {
    throw std::invalid_argument("--eval reads its words from " + a.eval +
                                "; give no words and no --stream with it");
  }
  if (a.stream && !a.words.empty()) {
    throw std::invalid_argument("--stream reads the words from standard input, one per line; got " +
                                std::to_string(a.words.size()) + " on the command line too ('" +
                                a.words[0] + "'...)");
  }
  if (!a.stream && a.words.empty() && a.eval.empty()) {
    throw std::invalid_argument("words is required: give words to classify, or --stream to read "
                                "them from standard input");
  }
  if (!a.stream) {
    // Words on the command line are bounded like lines of a stream (the
    // forward's memory grows with a word's length).
    for (std::size_t i = 0; i < a.words.size(); ++i) {
      const std::string where = "word " + std::to_string(i + 1);
      const int64_t chars = static_cast<int64_t>(decode_utf8(a.words[i], where).size());
      if (chars > a.max_chars) {
        throw std::invalid_argument(where + " has " + std::to_string(chars) +
                                    " characters, more than --max-chars " +
                                    std::to_string(a.max_chars));
      }
    }
  }
  const Precision precision = resolve_precision(a.precision, kernel_config(cli::tool_policy()));
  if (a.threads > 0) set_num_threads(a.threads);
  // Standard output appended to a file the command reads (`>> M/vocabulary.json`,
  // `>> EVAL`) would change it under the reader: refused, as cat refuses it.
  std::vector<InputPath> inputs;
  for (const char* f : {"model.safetensors", "vocabulary.json", "config.json"}) {
    inputs.push_back({"model file", a.model.model_dir() + "/" + f});
  }
  if (!a.eval.empty()) inputs.push_back({"--eval file", a.eval});
  check_descriptor_not_input(STDOUT_FILENO, "standard output", inputs);
  TrainedClassifier tc = load_classifier(a.model.model_dir());
  tc.model->set_precision(precision);
  tc.model->lstm().set_config(rnn_config(cli::tool_policy()));  // the tool's SEQPACK_* policy
  tc.model->fc().set_kernels(kernel_config(cli::tool_policy()));
  if (!a.eval.empty()) {
    run_eval(tc, a);
    return;
  }
  if (!a.stream) {
    print_predictions(tc, a.words, a, /*one_line_json=*/false);
    return;
  }
  // The model stays loaded; each line is answered (and flushed) as it arrives,
  // so a pipe or a socket gets its answer before sending the next word.
  // A character is at most 4 bytes of UTF-8, so a line of more than
  // 4 * max_chars bytes (+1 for a '\r') has more than max_chars characters
  // without being kept whole.
  const std::size_t cap = static_cast<std::size_t>(a.max_chars) * 4 + 1;
  std::string line;
  bool overlong = false;
  int read_errno = 0;
  int64_t line_no = 0;
  auto reject = [&](const std::string& why, const char* short_why) {
    fmt::print(stderr, "seqpack: error: line {}: {}\n", line_no, why);
    fmt::print("{}\n", a.json ? fmt::format(R"({{"error": "{}"}})", short_why)
                              : fmt::format("error: {}", short_why));
  };
  while (read_line_bounded(stdin, line, cap, overlong, read_errno)) {
    ++line_no;
    if (!overlong && !line.empty() && line.back() == '\r') line.pop_back();
    // One bad line must not end the service: say why, answer it with an error
    // line, and go on with the next.
    try {
      if (overlong) {
        throw std::length_error("more than " + std::to_string(cap) + " bytes, so more than " +
                                "--max-chars " + std::to_string(a.max_chars) +
                                " characters: skipped");
      }
      // No context: reject() says the line number once.
      const int64_t chars = static_cast<int64_t>(decode_utf8(line).size());
      if (chars > a.max_chars) {
        throw std::length_error(std::to_string(chars) + " characters, more than --max-chars " +
                                std::to_string(a.max_chars) + ": skipped");
      }
      print_predictions(tc, {line}, a, /*one_line_json=*/true);
    } catch (const std::length_error& e) {
      reject(e.what(), "line too long");
    } catch (const NonFiniteLogits& e) {
      reject(e.what(), "non-finite logits");
    } catch (const std::invalid_argument& e) {
      reject(e.what(), "invalid input");
    } catch (const std::bad_alloc& e) {
      reject(std::string("out of memory while classifying it (") + e.what() +
                 "): a smaller --max-chars bounds the memory a line may take",
             "out of memory");
    } catch (const std::system_error& e) {
      if (std::ferror(stdout)) throw;  // the answer could not be written: see below
      reject(e.what(), "failed");
    } catch (const std::exception& e) {
      reject(e.what(), "failed");
    }
    // A reader that is gone (a broken pipe, with SIGPIPE ignored), a full
    // disk or a closed standard output ends the stream: nobody reads the
    // answers any more.
    errno = 0;
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
      throw std::runtime_error("--stream: cannot write the answer to line " +
                               std::to_string(line_no) + " to standard output: " +
                               std::strerror(errno != 0 ? errno : EIO));
    }
    std::fflush(stderr);
  }
  if (std::ferror(stdin)) {
    throw std::runtime_error("--stream: error reading standard input after line " +
                             std::to_string(line_no) + ": " +
                             std::strerror(read_errno != 0 ? read_errno : EIO));
  }
}

void setup(CLI::App& sub) {
  auto a = std::make_shared<PredictArgs>();
  a->model.add(sub);
  sub.add_option("words", a->words, "words to classify");
  seqpack::cli::add_number<int64_t>(sub, "--top", a->top, "labels shown per word", 1);
  sub.add_flag("--json", a->json, "print logits and labels as JSON (with --stream: one line per word)");
  sub.add_flag("--stream", a->stream,
               "read words from standard input, one per line, and answer each line as it arrives "
               "(the model is loaded once)");
  seqpack::cli::add_number<int64_t>(
      sub, "--max-chars", a->max_chars,
      "the longest word, in characters (the memory a word takes grows with its length); with "
      "--stream a longer line is answered with an error and skipped, otherwise it is an error",
      1, 1'000'000);
  sub.add_option("--eval", a->eval,
                 "accuracy and speed over a file of label<TAB>word lines (the label a name or an "
                 "index, as seqpack data export writes test.tsv), in batches of --batch-size");
  seqpack::cli::add_number<int64_t>(sub, "--batch-size", a->batch_size,
                                    "words per forward with --eval", 1, 1'000'000);
  seqpack::cli::add_number(sub, "--threads", a->threads, "threads (0: the library default)", 0,
                           1024);
  sub.add_option("--precision", a->precision,
                 "the LSTM's products: fp32 (default, as trained), bf16 (needs native bf16), int8 "
                 "(weights quantized at load; any CPU), or auto (bf16 where native)")
      ->check(CLI::IsMember({"fp32", "bf16", "int8", "auto"}));
  sub.callback([a] { run_predict(*a); });
}

const bool registered = seqpack::cli::register_command(
    {"predict", "classify words with a model saved by seqpack train", setup});

}  // namespace
