// Rejected command lines of the seqpack tool: each exits non-zero with a
// message on stderr naming the offending value, and never crashes (exit codes
// above 128 are signals). The tests behind the CLI rows of docs/errors.md.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_run.h"

namespace {

namespace fs = std::filesystem;
using seqpack::testing::CliResult;
using seqpack::testing::run_cli;
using seqpack::testing::work_dir;

#define EXPECT_CLI_REJECTS(args, needle)                                                   \
  do {                                                                                     \
    const seqpack::testing::CliResult r_ = seqpack::testing::run_cli(args);                \
    EXPECT_NE(r_.status, 0) << (args);                                                     \
    EXPECT_LT(r_.status, 128) << (args) << " crashed: " << r_.err;                         \
    EXPECT_NE(r_.err.find(needle), std::string::npos)                                      \
        << (args) << ": stderr '" << r_.err << "' does not contain '" << (needle) << "'";  \
  } while (0)

TEST(ErrorsCli, NoOrUnknownSubcommand) {
  EXPECT_CLI_REJECTS("frobnicate", "unknown command 'frobnicate' (commands: bench, data, demo");
  // A bare `seqpack` lists the commands, one line each with what it does.
  const CliResult bare = run_cli("");
  EXPECT_EQ(bare.status, 106);
  EXPECT_EQ(bare.err.rfind("seqpack: error: a command is required: seqpack COMMAND [OPTIONS]", 0), 0u)
      << bare.err;
  for (const char* line : {"\n  bench ", "\n  data ", "\n  demo ", "\n  info ", "\n  predict ",
                           "\n  train ", "classify words with a model saved by seqpack train\n"}) {
    EXPECT_NE(bare.err.find(line), std::string::npos) << "no '" << line << "' in " << bare.err;
  }
  const CliResult data = run_cli("data");
  EXPECT_EQ(data.status, 106);
  EXPECT_NE(data.err.find("seqpack: error: a command is required: seqpack data COMMAND"),
            std::string::npos)
      << data.err;
  EXPECT_NE(data.err.find("\n  export "), std::string::npos) << data.err;
  EXPECT_NE(data.err.find("\n  stats "), std::string::npos) << data.err;
}

// "did you mean" for an unknown option close to one the command has, and for
// a command close to a known one; unknown words are still named.
TEST(ErrorsCli, DidYouMean) {
  const std::string data = " --data " + seqpack::testing::tiny_tsv().string();
  CliResult r = run_cli("train --epoch 2" + data);
  EXPECT_EQ(r.status, 109) << r.err;
  // CLI11's message first (its order of the words varies between versions).
  EXPECT_EQ(r.err.rfind("seqpack: error: The following arguments were not expected: ", 0), 0u)
      << r.err;
  EXPECT_NE(r.err.find("seqpack train has no option --epoch: did you mean --epochs?"),
            std::string::npos)
      << r.err;
  r = run_cli("predict --modle m house");
  EXPECT_EQ(r.status, 109) << r.err;
  EXPECT_NE(r.err.find("seqpack predict has no option --modle: did you mean --model?"),
            std::string::npos)
      << r.err;
  r = run_cli("train --hiden=8" + data);  // --name=value
  EXPECT_NE(r.err.find("has no option --hiden: did you mean --hidden?"), std::string::npos) << r.err;
  r = run_cli("predict --frobnicate house");
  EXPECT_EQ(r.status, 109) << r.err;
  EXPECT_NE(r.err.find("seqpack predict has no option --frobnicate (see 'seqpack predict --help')"),
            std::string::npos)
      << r.err;
  r = run_cli("trian --epochs 1");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("seqpack: error: unknown command 'trian': did you mean train? (commands: "),
            std::string::npos)
      << r.err;
  r = run_cli("data exprot --out x");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("unknown command 'exprot': did you mean export?"), std::string::npos) << r.err;
}

// Every message the tool prints for a failure starts with "seqpack: error:",
// CLI11's own parse errors included.
TEST(ErrorsCli, EveryErrorStartsWithTheProgramName) {
  for (const std::string args :
       {"", "frobnicate", "train --epoch 2", "train --epochs 0", "train --epochs", "data export",
        "predict --precision fp16 house", "predict --model /nonexistent house", "--frob",
        "predict --json --json house"}) {
    const CliResult r = run_cli(args);
    EXPECT_NE(r.status, 0) << args;
    EXPECT_LT(r.status, 128) << args;
    EXPECT_EQ(r.err.rfind("seqpack: error: ", 0), 0u) << args << ": " << r.err;
  }
}

// The exit statuses are listed in --help's footer, each one the tool uses.
TEST(ErrorsCli, ExitCodesAreDocumentedAndUsed) {
  const CliResult help = run_cli("--help");
  ASSERT_EQ(help.status, 0);
  for (const char* code : {"\n  0 ", "\n  1 ", "\n  2 ", "\n  105 ", "\n  106 ", "\n  109 ", "\n  114 "}) {
    EXPECT_NE(help.out.find(code), std::string::npos) << "no exit status '" << code << "' in "
                                                      << help.out;
  }
  const std::string data = " --data " + seqpack::testing::tiny_tsv().string();
  EXPECT_EQ(run_cli("predict --model /nonexistent house").status, 1);
  EXPECT_EQ(run_cli("frobnicate").status, 2);
  EXPECT_EQ(run_cli("train --epochs 0" + data).status, 105);
  EXPECT_EQ(run_cli("predict --precision fp16 house").status, 105);
  EXPECT_EQ(run_cli("").status, 106);
  EXPECT_EQ(run_cli("data export").status, 106);
  EXPECT_EQ(run_cli("train --epoch 2" + data).status, 109);
  EXPECT_EQ(run_cli("predict --model").status, 114);
}


TEST(ErrorsCli, TrainFlagsOutOfRange) {
  // Every numeric option of every subcommand: tests/test_cli_options.cpp.
  EXPECT_CLI_REJECTS("train --epochs -1 --data x.tsv", "--epochs: -1 is out of range: must be >= 1");
  EXPECT_CLI_REJECTS("train --epochs 0 --data x.tsv", "--epochs: 0 is out of range: must be >= 1");
  EXPECT_CLI_REJECTS("train --batch-size 0 --data x.tsv", "--batch-size: 0 is out of range: must be >= 1");
  EXPECT_CLI_REJECTS("train --lr 0 --data x.tsv", "--lr: 0 is out of range: must be > 0");
  EXPECT_CLI_REJECTS("train --threads -1 --data x.tsv", "--threads: -1 is out of range: must be in [0, 1024]");
  EXPECT_CLI_REJECTS("train --epochs two", "--epochs: 'two' is not an integer");
}

TEST(ErrorsCli, TrainDataFileMissingOrMalformed) {
  EXPECT_CLI_REJECTS("train --data /nonexistent/data.tsv", "cannot open TSV file '/nonexistent/data.tsv'");
  const fs::path tsv = work_dir() / "bad.tsv";
  std::ofstream(tsv) << "en\tcat\nfr\n";
  EXPECT_CLI_REJECTS("train --epochs 1 --data " + tsv.string(), "line 2: no tab between label and text");
}

// A --data that does not exist is named before --out is locked: the run leaves
// nothing in the working directory (no lock file beside the default --out).
TEST(ErrorsCli, AMissingDataFileLeavesNothingBehind) {
  const fs::path dir = work_dir() / "missing-data-run";
  fs::create_directories(dir);
  const CliResult r = run_cli("train --data nosuch.tsv", "cd '" + dir.string() + "' &&");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("cannot open TSV file 'nosuch.tsv'"), std::string::npos) << r.err;
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  EXPECT_TRUE(left.empty()) << "left behind: " << (left.empty() ? "" : left.front());
}

TEST(ErrorsCli, PredictBadModelTopOrWord) {
  EXPECT_CLI_REJECTS("predict --model /nonexistent/model word", "/nonexistent/model");
  EXPECT_CLI_REJECTS("predict --top 0 word", "--top: 0 is out of range: must be >= 1");
  EXPECT_CLI_REJECTS("predict --stream word", "--stream reads the words from standard input");
  EXPECT_CLI_REJECTS("predict", "words is required");
}

// Without --model, predict and export read ./seqpack-model (train's default
// --out); when it is missing, the error says that this default was used and where.
TEST(ErrorsCli, MissingDefaultModelIsNamedAsTheDefault) {
  const fs::path empty = work_dir() / "no-model-here";
  fs::create_directories(empty);
  const std::string in_empty = "cd '" + empty.string() + "' &&";
  for (const std::string cmd : {"predict word", "export --onnx m.onnx"}) {
    const CliResult r = run_cli(cmd, in_empty);
    EXPECT_EQ(r.status, 1) << cmd;
    EXPECT_NE(r.err.find("no model: --model was not given and the default model directory "
                         "'seqpack-model' does not exist in " + empty.string()),
              std::string::npos)
        << cmd << ": " << r.err;
  }
  // Given explicitly, a missing directory is named as missing, not as a default.
  const CliResult r = run_cli("predict --model seqpack-model word", in_empty);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("model directory 'seqpack-model' does not exist"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("default"), std::string::npos) << r.err;
}

TEST(ErrorsCli, BenchWorkloads) {
  EXPECT_CLI_REJECTS("bench --workloads /nonexistent/w.json", "cannot open workloads file '/nonexistent/w.json'");
  const fs::path w = work_dir() / "w.json";
  std::ofstream(w) << R"({"workloads": [{"name": "a", "cell": "lstmm"}]})";
  EXPECT_CLI_REJECTS("bench --workloads " + w.string(), "workload 'a': key 'cell' = 'lstmm' is not one of");
  const fs::path ok = work_dir() / "ok.json";
  std::ofstream(ok) << R"({"workloads": [{"name": "a", "cell": "gru", "input_size": 2, "hidden_size": 2,
                                          "num_layers": 1, "lengths": [2]}]})";
  EXPECT_CLI_REJECTS("bench --workloads " + ok.string() + " --workload b", "--workload 'b' is not in");
  EXPECT_CLI_REJECTS("bench --workloads " + ok.string() + " --threads 0", "--threads");
}

TEST(ErrorsCli, DataExportNeedsOut) {
  EXPECT_CLI_REJECTS("data export", "--out is required");
  EXPECT_CLI_REJECTS("data export --out " + (work_dir() / "x").string() + " --dict-dir /nonexistent",
                     "install the Debian package wamerican");
}

}  // namespace
