// `seqpack train` and `seqpack predict` end to end on a tiny TSV: the report,
// the saved model, and bad input (malformed line, empty lines, unknown
// characters, missing word lists).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "cli_run.h"

namespace {

namespace fs = std::filesystem;
using seqpack::testing::CliResult;
using seqpack::testing::run_cli;
using seqpack::testing::work_dir;

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
}

std::string tiny_tsv() {
  std::string s;
  const char* en[] = {"the", "house", "water", "night", "light", "which", "there", "would", "about", "think"};
  const char* fr[] = {"maison", "eau", "nuit", "été", "château", "être", "très", "quelle", "chose", "année"};
  for (int i = 0; i < 10; ++i) {
    s += std::string("english\t") + en[i] + "\n";
    if (i == 4) s += "\n\n";  // two empty lines, skipped and counted
    s += std::string("french\t") + fr[i] + "\n";
  }
  return s;
}

TEST(CliTrain, TrainsOnATsvReportsAndSavesAModelThatPredicts) {
  const fs::path tsv = work_dir() / "tiny.tsv", model = work_dir() / "model";
  write(tsv, tiny_tsv());
  CliResult r = run_cli("train --data " + tsv.string() + " --epochs 2 --hidden 8 --embed 4 --batch-size 4 --out " +
              model.string());
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("20 examples, 2 labels, 2 empty lines skipped"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("split: 16 train, 2 validation, 2 test"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("epoch 2/2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("validation accuracy"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("test accuracy"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("confusion matrix"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("padding"), std::string::npos) << r.out;
  // Not a terminal: no carriage-return progress bar, one line per epoch instead.
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find('\r'), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("epoch 1/2: train loss"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("epoch 2/2: train loss"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(model / "model.safetensors"));
  EXPECT_TRUE(fs::exists(model / "vocabulary.json"));
  EXPECT_TRUE(fs::exists(model / "config.json"));

  CliResult p = run_cli("predict --model " + model.string() + " --top 2 maison zzz");
  ASSERT_EQ(p.status, 0) << p.out << p.err;
  EXPECT_NE(p.out.find("maison:"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("%"), std::string::npos) << p.out;
  // 'z' never occurs in the training words: read as <unk>, and said so.
  EXPECT_NE(p.out.find("zzz:"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("3 unknown characters read as <unk>"), std::string::npos) << p.out;

  // An empty word is a zero-length sequence: predicted from the bias alone, and said so.
  CliResult e = run_cli("predict --model " + model.string() + " --top 1 ''");
  ASSERT_EQ(e.status, 0) << e.out << e.err;
  EXPECT_EQ(e.out.rfind("\"\": ", 0), 0u) << e.out;
  EXPECT_NE(e.out.find("empty word: no characters"), std::string::npos) << e.out;

  CliResult j = run_cli("predict --json --model " + model.string() + " zz");
  ASSERT_EQ(j.status, 0) << j.err;
  const auto js = nlohmann::json::parse(j.out);
  EXPECT_EQ(js.at("predictions").at(0).at("ids"), nlohmann::json::parse("[1, 1]")) << j.out;
  EXPECT_EQ(js.at("predictions").at(0).at("unknown_chars"), 2) << j.out;
}

TEST(CliTrain, ProfilePrintsEveryPhaseOfTheStepPerEpoch) {
  const fs::path tsv = work_dir() / "tiny_profile.tsv";
  write(tsv, tiny_tsv());
  CliResult r = run_cli("train --data " + tsv.string() +
                        " --epochs 2 --hidden 8 --embed 4 --batch-size 4 --quiet --profile --clip 1 --out " +
                        (work_dir() / "m_profile").string());
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("profile: data and vocabulary"), std::string::npos) << r.out;
  std::size_t lines = 0;
  for (std::size_t at = r.out.find("step profile (cpu s): total "); at != std::string::npos;
       at = r.out.find("step profile (cpu s): total ", at + 1)) {
    ++lines;
    const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
    for (const char* phase : {", batch ", ", forward ", ", loss ", ", backward ", ", clip ", ", step ",
                              ", zero_grad ", ", other ", "; validation "}) {
      EXPECT_NE(line.find(phase), std::string::npos) << phase << " missing in " << line;
    }
  }
  EXPECT_EQ(lines, 2u) << r.out;  // one per epoch
  // The same phases in wall-clock seconds, which sum to no more than the
  // epoch's own time (printed to 0.01 s; the phases' total to 0.001 s).
  const std::regex wall_total(R"(step profile \(wall s\): total ([0-9.]+))");
  const std::regex epoch_secs(R"(epoch \d+/2: .*, ([0-9.]+) s, cpu)");
  std::vector<double> walls, epochs;
  const std::regex share(R"(\(([0-9.]+)%\))");
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), wall_total); it != std::sregex_iterator();
       ++it) {
    walls.push_back(std::stod((*it)[1]));
    const std::size_t at = static_cast<std::size_t>(it->position());
    const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
    for (const char* phase : {", batch ", ", forward ", ", loss ", ", backward ", ", clip ", ", step ",
                              ", zero_grad ", ", other "}) {
      EXPECT_NE(line.find(phase), std::string::npos) << phase << " missing in " << line;
    }
    // Some time was measured: the eight shares (each printed to 0.05%) add up
    // to 100%, which they do only for a positive total (an epoch of this tiny
    // data can print its total as 0.000 s on a fast CPU).
    double shares = 0;
    for (auto s = std::sregex_iterator(line.begin(), line.end(), share);
         s != std::sregex_iterator(); ++s)
      shares += std::stod((*s)[1]);
    EXPECT_NEAR(shares, 100.0, 8 * 0.05 + 1e-9) << line;
  }
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), epoch_secs); it != std::sregex_iterator();
       ++it) {
    epochs.push_back(std::stod((*it)[1]));
  }
  ASSERT_EQ(walls.size(), 2u) << r.out;
  ASSERT_EQ(epochs.size(), 2u) << r.out;
  for (std::size_t e = 0; e < 2; ++e) {
    EXPECT_GE(walls[e], 0.0) << r.out;
    EXPECT_LE(walls[e], epochs[e] + 0.0055) << r.out;
  }
  // The recurrent core's parts of the forward and the backward (each
  // printed to 0.001 s): within the phase's wall time, the rest what the
  // other layers took.
  const std::regex core(
      R"(rnn core profile \(wall s\): forward ([0-9.]+): inputs ([0-9.]+) \([0-9.]+%\), )"
      R"(steps ([0-9.]+) \([0-9.]+%\), states ([0-9.]+) \([0-9.]+%\), rest (-?[0-9.]+) \(-?[0-9.]+%\); )"
      R"(backward ([0-9.]+): prepare ([0-9.]+) \([0-9.]+%\), steps ([0-9.]+) \([0-9.]+%\), )"
      R"(weights ([0-9.]+) \([0-9.]+%\), inputs ([0-9.]+) \([0-9.]+%\), rest (-?[0-9.]+) \(-?[0-9.]+%\))");
  std::size_t core_lines = 0;
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), core);
       it != std::sregex_iterator(); ++it, ++core_lines) {
    const auto v = [&](int i) { return std::stod((*it)[i]); };
    EXPECT_LE(v(2) + v(3) + v(4), v(1) + 0.002) << it->str();
    EXPECT_NEAR(v(2) + v(3) + v(4) + v(5), v(1), 0.003) << it->str();
    EXPECT_LE(v(7) + v(8) + v(9) + v(10), v(6) + 0.0025) << it->str();
    EXPECT_NEAR(v(7) + v(8) + v(9) + v(10) + v(11), v(6), 0.0035) << it->str();
  }
  EXPECT_EQ(core_lines, 2u) << r.out;
  // Without the flag, no profile.
  CliResult q = run_cli("train --data " + tsv.string() + " --epochs 1 --hidden 8 --embed 4 --quiet --out " +
                        (work_dir() / "m_noprofile").string());
  ASSERT_EQ(q.status, 0) << q.out << q.err;
  EXPECT_EQ(q.out.find("step profile"), std::string::npos) << q.out;
  EXPECT_EQ(q.out.find("rnn core profile"), std::string::npos) << q.out;
  EXPECT_EQ(q.out.find("profile: data"), std::string::npos) << q.out;
}

TEST(CliTrain, MalformedTsvLineIsReportedWithItsNumber) {
  const fs::path tsv = work_dir() / "bad.tsv";
  write(tsv, "english\tthe\nfrench\tla\nno tab here\n");
  CliResult r = run_cli("train --data " + tsv.string() + " --epochs 1 --out " + (work_dir() / "m2").string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("line 3"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(work_dir() / "m2"));
}

TEST(CliTrain, MissingWordListNamesTheDebianPackage) {
  const fs::path empty = work_dir() / "no-dicts";
  fs::create_directories(empty);
  CliResult r = run_cli("train --dict-dir " + empty.string() + " --epochs 1 --out " + (work_dir() / "m3").string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("wamerican"), std::string::npos) << r.err;
}

TEST(CliTrain, BadFlagsAndMissingModelAreErrors) {
  CliResult r = run_cli("train --data /nonexistent.tsv --epochs 1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("/nonexistent.tsv"), std::string::npos) << r.err;
  CliResult b = run_cli("train --batch-size 0 --data x.tsv");
  EXPECT_NE(b.status, 0);
  EXPECT_NE(b.err.find("--batch-size: 0"), std::string::npos) << b.err;
  CliResult p = run_cli("predict --model " + (work_dir() / "nope").string() + " word");
  EXPECT_NE(p.status, 0);
  EXPECT_NE(p.err.find("nope"), std::string::npos) << p.err;
}

// Data a classifier cannot be trained and tested on is refused before training,
// naming the counts: it reported "test accuracy: 0.00% (0 words)" and exit 0.
TEST(CliTrain, DataTooSmallToSplitIsAnErrorNamingTheCounts) {
  const fs::path one_label = work_dir() / "one-label.tsv";
  write(one_label, "en\tcat\nen\tdog\n");
  const fs::path out = work_dir() / "m-small";
  CliResult r =
      run_cli("train --quiet --data " + one_label.string() + " --epochs 1 --out " + out.string());
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("seqpack: error: " + one_label.string() +
                       ": 2 examples with 1 label ('en'): a classifier needs at least 2 labels"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("epoch 1/"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out));

  // Two labels of two examples each: 80% of 2 rounds to 2, so no test example.
  const fs::path two_each = work_dir() / "two-each.tsv";
  write(two_each, "en\tcat\nen\tdog\nfr\tchat\nfr\tchien\n");
  r = run_cli("train --quiet --data " + two_each.string() + " --epochs 1 --out " + out.string());
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(
      r.err.find(two_each.string() + ": 4 examples are too few to split: they give 4 training, "
                                     "0 validation and 0 test examples"),
      std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("test accuracy"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out));

  // The control: three of each give 2 training and 1 test example per label
  // (no validation example, which the report says rather than printing 0%).
  const fs::path three_each = work_dir() / "three-each.tsv";
  write(three_each, "en\tcat\nen\tdog\nen\tcow\nfr\tchat\nfr\tchien\nfr\tvache\n");
  r = run_cli("train --quiet --data " + three_each.string() +
              " --epochs 1 --hidden 4 --embed 2 --out " + out.string());
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("split: 4 train, 0 validation, 2 test"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("validation accuracy n/a (the validation split is empty)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("(2 words)"), std::string::npos) << r.out;
}

}  // namespace
