// `seqpack bench`: the JSON lines it prints for a tiny workloads file, its filters,
// and the messages of bad workload files. Timings themselves are never asserted.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_run.h"

namespace {

namespace fs = std::filesystem;

using RunResult = seqpack::testing::CliResult;

class BenchCli : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("seqpack_test_cli_bench_" + std::to_string(::getpid()) + "_" + info->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p;
  }

  static RunResult run(const std::string& args) { return seqpack::testing::run_cli("bench " + args); }

  // The tiny workloads (below) through `bench --json --min-time 0.001` and
  // `args`: the lines, parsed (none, with a failure, where the run fails).
  std::vector<nlohmann::json> tiny_json_lines(const std::string& args);

  static std::vector<nlohmann::json> json_lines(const std::string& text) {
    std::vector<nlohmann::json> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
    }
    return lines;
  }

  fs::path dir_;
};

// Two tiny workloads covering a bidirectional 2-layer LSTM with a zero-length
// sequence and a GRU, plus keys the tool must ignore.
const char* kTinyWorkloads = R"({
  "about": "tiny workloads for the CLI test",
  "workloads": [
    {"name": "tiny-lstm", "cell": "lstm", "input_size": 3, "hidden_size": 5, "num_layers": 2,
     "bidirectional": true, "lengths": [4, 0, 2, 3], "tokens": 9, "padding_fraction": 0.4},
    {"name": "tiny-gru", "cell": "gru", "input_size": 2, "hidden_size": 3, "num_layers": 1,
     "bidirectional": false, "lengths": [1, 3], "comment": "unknown keys are ignored"}
  ]
})";

TEST_F(BenchCli, JsonLinesHaveEveryKeyForEveryWorkloadAndMode) {
  const fs::path file = write("w.json", kTinyWorkloads);
  const RunResult r = run("--workloads '" + file.string() + "' --json --min-time 0.001");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 6u) << r.out;
  std::set<std::pair<std::string, std::string>> seen;
  for (const auto& j : lines) {
    SCOPED_TRACE(j.dump());
    for (const char* key :
         {"impl", "threads", "workload", "mode", "sec_per_batch", "tokens_per_s"}) {
      EXPECT_TRUE(j.contains(key)) << key;
    }
    EXPECT_EQ(j.at("impl"), "seqpack");
    EXPECT_EQ(j.at("threads"), 1);
    const double sec = j.at("sec_per_batch").get<double>();
    EXPECT_GT(sec, 0.0);
    EXPECT_GE(j.at("cpu_sec_per_batch").get<double>(), 0.0);
    // tokens = sum of the real lengths in every mode, padded included.
    const double tokens = j.at("workload") == "tiny-lstm" ? 9.0 : 4.0;
    EXPECT_NEAR(j.at("tokens_per_s").get<double>() * sec, tokens, 1e-6 * tokens);
    seen.insert({j.at("workload").get<std::string>(), j.at("mode").get<std::string>()});
  }
  const std::set<std::pair<std::string, std::string>> expected = {
      {"tiny-lstm", "forward_packed"}, {"tiny-lstm", "forward_padded"},
      {"tiny-lstm", "train_packed"},   {"tiny-gru", "forward_packed"},
      {"tiny-gru", "forward_padded"},  {"tiny-gru", "train_packed"}};
  EXPECT_EQ(seen, expected);
  // Progress goes to stderr, never into the JSON stream.
  EXPECT_NE(r.err.find("tiny-gru"), std::string::npos) << r.err;
}

std::vector<nlohmann::json> BenchCli::tiny_json_lines(const std::string& args) {
  const fs::path file = write("w.json", kTinyWorkloads);
  const RunResult r = run("--workloads '" + file.string() + "' --json --min-time 0.001 " + args);
  EXPECT_EQ(r.status, 0) << r.err;
  return r.status == 0 ? json_lines(r.out) : std::vector<nlohmann::json>{};
}

TEST_F(BenchCli, FiltersThreadsAndScale) {
  const auto lines = tiny_json_lines(
      "--workload tiny-gru --mode train_packed --mode forward_padded --threads 2 --scale 3");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].at("mode"), "train_packed");
  EXPECT_EQ(lines[1].at("mode"), "forward_padded");
  for (const auto& j : lines) {
    EXPECT_EQ(j.at("workload"), "tiny-gru");
    EXPECT_EQ(j.at("threads"), 2);
    // lengths [1, 3] scaled by 3: 12 tokens.
    EXPECT_NEAR(j.at("tokens_per_s").get<double>() * j.at("sec_per_batch").get<double>(), 12.0,
                1e-5);
  }
}

TEST_F(BenchCli, TableWithoutJson) {
  const fs::path file = write("w.json", kTinyWorkloads);
  const RunResult r =
      run("--workloads '" + file.string() + "' --min-time 0.001 --workload tiny-lstm");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("s/batch"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("forward_padded"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("tiny-gru"), std::string::npos) << r.out;
}

// --profile: the core's seven parts per call of the timed runs, each finite
// and non-negative, the forward's time loop there, the backward's only in
// training.
TEST_F(BenchCli, ProfileGivesTheCoreParts) {
  const auto lines =
      tiny_json_lines("--workload tiny-lstm --mode forward_packed --mode train_packed --profile");
  ASSERT_EQ(lines.size(), 2u);
  for (const auto& j : lines) {
    SCOPED_TRACE(j.dump());
    ASSERT_TRUE(j.contains("core_sec_per_call"));
    const auto& core = j.at("core_sec_per_call");
    ASSERT_EQ(core.size(), 7u);
    for (const auto& [name, sec] : core.items()) {
      EXPECT_TRUE(std::isfinite(sec.get<double>())) << name;
      EXPECT_GE(sec.get<double>(), 0.0) << name;
    }
    EXPECT_GT(core.at("forward_steps").get<double>(), 0.0);
    const bool train = j.at("mode") == "train_packed";
    EXPECT_EQ(core.at("backward_steps").get<double>() > 0.0, train);
  }
  // Without the flag, no such key; the table gets a line per row.
  const auto plain = tiny_json_lines("--workload tiny-gru --mode forward_packed");
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_FALSE(plain[0].contains("core_sec_per_call")) << plain[0].dump();
  const fs::path file = write("w.json", kTinyWorkloads);
  const RunResult table =
      run("--workloads '" + file.string() +
          "' --min-time 0.001 --workload tiny-gru --mode train_packed --profile");
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_NE(table.out.find("rnn core ms per call: forward_inputs "), std::string::npos)
      << table.out;
  EXPECT_NE(table.out.find(", backward_weights "), std::string::npos) << table.out;
}

// Each bad file must fail with a message naming the workload and the key or value.
TEST_F(BenchCli, BadFilesGiveClearErrors) {
  struct Case {
    std::string text;
    std::vector<std::string> expected;  // substrings of the error
  };
  const std::string head = R"({"workloads": [{"name": "w1", )";
  const std::vector<Case> cases = {
      {"{ not json", {"not valid JSON"}},
      {R"({"about": "no list"})", {"'workloads'"}},
      {R"({"workloads": []})", {"'workloads' is empty: give at least one workload"}},
      {R"({"workloads": [{"cell": "lstm"}]})", {"workloads[0]", "'name'"}},
      {head + R"("cell": "lstmx", "input_size": 2, "hidden_size": 3, "num_layers": 1, "lengths": [1]}]})",
       {"w1", "'cell'", "lstmx"}},
      {head + R"("cell": "lstm", "input_size": 2, "num_layers": 1, "lengths": [1]}]})",
       {"w1", "'hidden_size'", "missing"}},
      {head + R"("cell": "gru", "input_size": 0, "hidden_size": 3, "num_layers": 1, "lengths": [1]}]})",
       {"w1", "'input_size' = 0"}},
      {head + R"("cell": "gru", "input_size": 2, "hidden_size": "3", "num_layers": 1, "lengths": [1]}]})",
       {"w1", "'hidden_size' = \"3\""}},
      {head + R"("cell": "gru", "input_size": 2, "hidden_size": 3, "num_layers": 1, "bidirectional": 1, "lengths": [1]}]})",
       {"w1", "'bidirectional' = 1"}},
      {head + R"("cell": "rnn_tanh", "input_size": 2, "hidden_size": 3, "num_layers": 1, "lengths": [2, -3]}]})",
       {"w1", "lengths[1] = -3"}},
      {head + R"("cell": "rnn_relu", "input_size": 2, "hidden_size": 3, "num_layers": 1, "lengths": []}]})",
       {"w1", "'lengths'"}},
      {head + R"("cell": "rnn_relu", "input_size": 2, "hidden_size": 3, "num_layers": 1, "lengths": [0, 0]}]})",
       {"w1", "no positive length"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i) + ": " + cases[i].text);
    const fs::path file = write("bad" + std::to_string(i) + ".json", cases[i].text);
    const RunResult r = run("--workloads '" + file.string() + "' --min-time 0.001");
    EXPECT_NE(r.status, 0);
    EXPECT_TRUE(r.out.empty() || r.out.find("s/batch") != std::string::npos) << r.out;
    for (const auto& s : cases[i].expected) EXPECT_NE(r.err.find(s), std::string::npos) << r.err;
  }
}

TEST_F(BenchCli, BadArgumentsGiveClearErrors) {
  const fs::path file = write("w.json", kTinyWorkloads);
  RunResult r = run("--workloads '" + (dir_ / "missing.json").string() + "'");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("missing.json"), std::string::npos) << r.err;

  r = run("--workloads '" + file.string() + "' --workload nope --min-time 0.001");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("'nope'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tiny-gru"), std::string::npos) << r.err;  // lists what exists

  r = run("--workloads '" + file.string() + "' --mode backward_only");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("backward_only"), std::string::npos) << r.err;

  r = run("--workloads '" + file.string() + "' --threads 0");
  EXPECT_NE(r.status, 0);
}

}  // namespace

namespace {

// The workloads ship in the repository (bench/workloads.json); where the shared
// original exists next to the repository (../shared/workloads.json), they are
// the same bytes.
TEST(BenchWorkloadsFile, InRepoCopyIsTheSharedFile) {
  const fs::path repo = fs::path(SEQPACK_SOURCE_DIR) / "bench" / "workloads.json";
  ASSERT_TRUE(fs::exists(repo)) << repo;
  EXPECT_NO_THROW(nlohmann::json::parse(seqpack::testing::read_file(repo.string())));
  const fs::path shared = fs::path(SEQPACK_SOURCE_DIR) / ".." / "shared" / "workloads.json";
  if (!fs::exists(shared)) GTEST_SKIP() << shared << " does not exist here (a plain clone)";
  EXPECT_TRUE(seqpack::testing::read_file(repo.string()) == seqpack::testing::read_file(shared.string()))
      << repo << " differs from " << shared << ": copy the shared file into the repository";
}

// Without --workloads, from any directory: the in-repo file.
TEST(BenchWorkloadsFile, DefaultIsTheInRepoFile) {
  const seqpack::testing::TempDir elsewhere;
  const std::string cmd = "cd '" + elsewhere.path.string() + "' && '" + SEQPACK_CLI_PATH +
                          "' bench --workload rnn-tanh-tiny --mode forward_packed --min-time 0.001 --json > out.txt 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << seqpack::testing::read_file(elsewhere.file("out.txt"));
  const std::string out = seqpack::testing::read_file(elsewhere.file("out.txt"));
  EXPECT_NE(out.find("\"workload\":\"rnn-tanh-tiny\""), std::string::npos) << out;
}

}  // namespace
