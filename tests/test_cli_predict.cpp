// seqpack predict's inputs and answers: --eval reads only regular files, with
// bounded lines, and 0 words is an error; a model whose output overflows is
// an error, never a NaN probability, on the command line, with --json, in
// --stream (per line) and with --eval; a word's logits are the same bits
// alone and in a batch at every precision the CPU has; --threads.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_run.h"
#include "seqpack/cpu_info.h"
#include "seqpack/safetensors.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using seqpack::testing::CliResult;
using seqpack::testing::run_cli;
using seqpack::testing::work_dir;

#define EXPECT_CONTAINS(text, needle)               \
  EXPECT_NE((text).find(needle), std::string::npos) \
      << "'" << (text) << "' lacks '" << (needle) << "'"

// A model trained in well under a second on 20 words (labels english, french).
const fs::path& tiny_model() {
  static const fs::path model = [] {
    const fs::path m = work_dir() / "tiny_model";
    const CliResult t = run_cli("train --threads 1 --data " + seqpack::testing::tiny_tsv().string() +
                                " --epochs 2 --hidden 12 --embed 4 --batch-size 4 --out " +
                                m.string());
    EXPECT_EQ(t.status, 0) << t.out << t.err;
    return m;
  }();
  return model;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// ------------------------------------------------------------------ --eval

TEST(CliPredictEval, OnlyRegularFilesAreRead) {
  // /dev/zero grew to 2.1 GB, then gave "accuracy: 0.00% (0 words)" and exit 0.
  CliResult r = run_cli("predict --model " + tiny_model().string() + " --eval /dev/zero",
                        "timeout 60");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_CONTAINS(r.err, "seqpack: error: --eval /dev/zero is a character device, not a regular file");
  EXPECT_EQ(r.out, "");
  r = run_cli("predict --model " + tiny_model().string() + " --eval " + work_dir().string(),
              "timeout 60");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_CONTAINS(r.err, "--eval " + work_dir().string() + " is a directory, not a regular file");
  // A FIFO without a writer blocked for ever.
  const fs::path fifo = work_dir() / "eval.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  r = run_cli("predict --model " + tiny_model().string() + " --eval " + fifo.string(),
              "timeout 60");
  EXPECT_EQ(r.status, 1) << r.err;  // 124: timed out, blocked on the FIFO
  EXPECT_CONTAINS(r.err, "--eval " + fifo.string() + " is a FIFO (named pipe), not a regular file");
  // A link is followed: to a regular file it is read.
  const fs::path tsv = work_dir() / "eval_ok.tsv";
  std::ofstream(tsv) << "english\thouse\nfrench\tmaison\n";
  const fs::path link = work_dir() / "eval_link.tsv";
  fs::create_symlink(tsv, link);
  r = run_cli("predict --json --model " + tiny_model().string() + " --eval " + link.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("words").get<int64_t>(), 2) << r.out;
}

TEST(CliPredictEval, NoWordsIsAnError) {
  const fs::path empty = work_dir() / "empty.tsv";
  std::ofstream(empty).close();
  CliResult r = run_cli("predict --model " + tiny_model().string() + " --eval " + empty.string());
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_CONTAINS(r.err, "--eval " + empty.string() + " has no words");
  EXPECT_EQ(r.out.find("accuracy"), std::string::npos) << r.out;
  const fs::path blank = work_dir() / "blank.tsv";
  std::ofstream(blank) << "\n\r\n\n";
  r = run_cli("predict --json --model " + tiny_model().string() + " --eval " + blank.string());
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_CONTAINS(r.err, "has no words");
}

TEST(CliPredictEval, LinesAreBoundedAndWordsCounted) {
  // A 1 GiB line (a sparse file: no newline) under a 2 GB address-space limit:
  // refused after --max-chars' worth of bytes, never read into memory.
  CliResult r;
#if !defined(__SANITIZE_ADDRESS__)
  const fs::path huge = work_dir() / "huge_line.tsv";
  {
    std::ofstream(huge) << "english\t";
    fs::resize_file(huge, std::uintmax_t{1} << 30);
  }
  r = run_cli("predict --model " + tiny_model().string() + " --eval " + huge.string(),
                        "ulimit -v 2000000; timeout 120");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_CONTAINS(r.err, "--eval " + huge.string() +
                             " line 1 is longer than 40022 bytes, so its word has more than "
                             "--max-chars 10000 characters");
  fs::remove(huge);
#endif
  // Below the byte bound, the character count decides; the words of a file
  // longer than a batch are all counted (a UTF-8 BOM and CRLF endings too).
  const fs::path tsv = work_dir() / "many.tsv";
  {
    std::ofstream o(tsv, std::ios::binary);
    o << "\xEF\xBB\xBF";
    for (int i = 0; i < 70; ++i) o << (i % 2 ? "french\tmaison\r\n" : "0\thouse\r\n");
  }
  r = run_cli("predict --json --batch-size 8 --model " + tiny_model().string() + " --eval " +
              tsv.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("words").get<int64_t>(), 70) << r.out;
  r = run_cli("predict --max-chars 5 --model " + tiny_model().string() + " --eval " + tsv.string());
  EXPECT_EQ(r.status, 1);
  EXPECT_CONTAINS(r.err, "line 2 has 6 characters, more than --max-chars 5");
}

// ------------------------------------------------------------------ non-finite logits

// tiny_model with weights that are all finite but make every non-empty word's
// logits +inf: the LSTM's weights 0 and its g-gate bias 1 (so h = σ(0)·tanh(σ(0)·tanh(1)) > 0),
// the output layer's weights and biases 3.4e38 (as a hostile trial set them).
const fs::path& overflowing_model() {
  static const fs::path model = [] {
    const fs::path m = work_dir() / "overflowing_model";
    fs::remove_all(m);
    fs::copy(tiny_model(), m, fs::copy_options::recursive);
    const std::string file = (m / "model.safetensors").string();
    std::map<std::string, std::string> meta;
    std::map<std::string, seqpack::Tensor> t = seqpack::load_safetensors(file, &meta);
    for (auto& [name, tensor] : t) {
      if (name.rfind("lstm.", 0) == 0) tensor.fill(0.0);
      if (name.rfind("fc.", 0) == 0) tensor.fill(3.4e38);
    }
    for (const char* bias : {"lstm.bias_ih_l0", "lstm.bias_ih_l0_reverse"}) {
      seqpack::Tensor& b = t.at(bias);
      const int64_t H = b.size(0) / 4;
      for (int64_t k = 2 * H; k < 3 * H; ++k) b.data<float>()[k] = 1.f;  // gates i, f, g, o
    }
    seqpack::save_safetensors(file, t, meta);
    return m;
  }();
  return model;
}

TEST(CliPredictNonFinite, AnOverflowingModelIsAnErrorNeverANanProbability) {
  const std::string m = " --model " + overflowing_model().string();
  CliResult r = run_cli("predict" + m + " house");
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_CONTAINS(r.err, "seqpack: error: word 1 ('house'): logit 0 (label 'english') is inf");
  EXPECT_EQ(r.out.find("nan"), std::string::npos) << r.out;
  r = run_cli("predict --json" + m + " maison house");
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_CONTAINS(r.err, "word 1 ('maison'): logit 0");
  EXPECT_EQ(r.out, "");  // no "logits":[null,...] with a label
  for (const std::string& precision : {"fp32", "int8", "bf16"}) {
    if (precision == "bf16" && !seqpack::testing::bf16_runs()) continue;
    const fs::path tsv = work_dir() / "nonfinite.tsv";
    std::ofstream(tsv) << "english\thouse\n";
    r = run_cli("predict --precision " + precision + m + " --eval " + tsv.string());
    EXPECT_EQ(r.status, 1) << precision << ": " << r.out;
    EXPECT_CONTAINS(r.err, "word 1 ('house'): logit 0 (label 'english') is inf");
  }
  // --stream: that line's error, and the stream goes on (an empty word's
  // logits are the biases alone: finite).
  const fs::path in = work_dir() / "stream.txt";
  std::ofstream(in) << "house\n\nmaison\n";
  r = run_cli("predict --stream --top 1" + m + " < " + in.string());
  EXPECT_EQ(r.status, 0) << r.err;
  const auto out = lines_of(r.out);
  ASSERT_EQ(out.size(), 3u) << r.out;
  EXPECT_EQ(out[0], "error: non-finite logits");
  EXPECT_EQ(out[1].rfind("\"\": ", 0), 0u) << out[1];
  EXPECT_EQ(out[2], "error: non-finite logits");
  EXPECT_CONTAINS(r.err, "seqpack: error: line 1: word 1 ('house'): logit 0 (label 'english') is inf");
  EXPECT_CONTAINS(r.err, "seqpack: error: line 3: word 1 ('maison')");
  r = run_cli("predict --stream --json" + m + " < " + in.string());
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(lines_of(r.out).at(0), R"({"error": "non-finite logits"})") << r.out;
}

// ------------------------------------------------------------------ batch invariance

// A word's logits are the same bits alone (--stream answers one word per
// forward) and among others, at every precision this CPU has. (Hidden 64:
// OpenBLAS's sgemm rounded 17 of these 40 logits differently in a batch of 20.)
TEST(CliPredictBatch, LogitsAreTheSameBitsAloneAndInABatch) {
  const fs::path model = work_dir() / "wide_model";
  const CliResult t = run_cli("train --threads 1 --data " + seqpack::testing::tiny_tsv().string() +
                              " --epochs 1 --hidden 64 --embed 8 --batch-size 4 --out " +
                              model.string());
  ASSERT_EQ(t.status, 0) << t.out << t.err;
  const std::vector<std::string> words = {
      "maison", "Haus",    "house",  "the",   "été",   "x",     "waterfall", "water", "nuit",  "eau",
      "château", "quelle", "chose", "année", "which", "there", "would",     "about", "think", "light"};
  std::string args, lines;
  for (const auto& w : words) {
    args += " " + w;
    lines += w + "\n";
  }
  const fs::path in = work_dir() / "batch_words.txt";
  std::ofstream(in) << lines;
  for (const std::string& precision : {"fp32", "bf16", "int8"}) {
    if (precision == "bf16" && !seqpack::testing::bf16_runs()) continue;
    SCOPED_TRACE(precision);
    const std::string common = " --json --precision " + precision + " --model " + model.string();
    const CliResult b = run_cli("predict" + common + args);
    ASSERT_EQ(b.status, 0) << b.err;
    const CliResult s = run_cli("predict --stream" + common + " < " + in.string());
    ASSERT_EQ(s.status, 0) << s.err;
    const auto batch = nlohmann::json::parse(b.out).at("predictions");
    const auto one = lines_of(s.out);
    ASSERT_EQ(one.size(), words.size()) << s.out;
    for (std::size_t i = 0; i < words.size(); ++i) {
      const auto alone = nlohmann::json::parse(one[i]).at("predictions").at(0).at("logits");
      const auto among = batch.at(i).at("logits");
      ASSERT_EQ(alone.size(), among.size());
      for (std::size_t k = 0; k < alone.size(); ++k) {
        // JSON prints a double to the shortest text that reads back the same,
        // so equal text is equal bits.
        EXPECT_EQ(alone.at(k).get<double>(), among.at(k).get<double>())
            << words[i] << " logit " << k;
      }
    }
  }
}

// ------------------------------------------------------------------ --threads

TEST(CliPredictThreads, ThreadsIsRangeCheckedAndUsed) {
  const fs::path tsv = work_dir() / "threads.tsv";
  std::ofstream(tsv) << "english\thouse\n";
  CliResult r = run_cli("predict --threads 1 --json --model " + tiny_model().string() + " --eval " +
                        tsv.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("threads").get<int>(), 1) << r.out;
  r = run_cli("predict --threads 2 --json --model " + tiny_model().string() + " --eval " +
              tsv.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("threads").get<int>(), 2) << r.out;
  r = run_cli("predict --threads -1 --model " + tiny_model().string() + " house");
  EXPECT_EQ(r.status, 105) << r.err;
  EXPECT_CONTAINS(r.err, "seqpack: error: --threads: -1 is out of range: must be in [0, 1024]");
  r = run_cli("predict --threads 1025 --model " + tiny_model().string() + " house");
  EXPECT_EQ(r.status, 105) << r.err;
}

}  // namespace
