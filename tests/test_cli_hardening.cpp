// `seqpack train` as a new user runs it twice: an earlier model is moved to
// OUT/previous-N (never destroyed) and the run says so, --overwrite replaces
// it; --epochs 0 touches nothing; the progress bar only on a terminal (a pty
// from script(1)), one line per epoch otherwise. `seqpack predict --stream`
// answers each line of a pipe before the next one is written.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_run.h"

namespace {

namespace fs = std::filesystem;
using seqpack::testing::CliResult;
using seqpack::testing::read_file;
using seqpack::testing::run_cli;
using seqpack::testing::work_dir;

const fs::path& tiny_tsv() {
  static const fs::path p = [] {
    const fs::path f = work_dir() / "tiny.tsv";
    const char* en[] = {"the", "house", "water", "night", "light", "which", "there", "would"};
    const char* fr[] = {"maison", "eau", "nuit", "été", "château", "être", "très", "quelle"};
    std::ofstream o(f);
    for (int i = 0; i < 8; ++i) o << "english\t" << en[i] << "\nfrench\t" << fr[i] << "\n";
    return f;
  }();
  return p;
}

std::string train(const fs::path& out, int seed, const std::string& extra = "") {
  return "train --threads 1 --data " + tiny_tsv().string() +
         " --epochs 2 --hidden 8 --embed 4 --batch-size 4 --seed " + std::to_string(seed) +
         " --out " + out.string() + extra;
}

TEST(CliTrainTwice, AnEarlierModelIsKeptAsideAndTheRunSaysSo) {
  const fs::path out = work_dir() / "model";
  ASSERT_EQ(run_cli(train(out, 1)).status, 0);
  const std::string first = read_file((out / "model.safetensors").string());
  const std::string first_ck = read_file((out / "checkpoint.safetensors").string());
  ASSERT_FALSE(first.empty());

  CliResult r = run_cli(train(out, 2));
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find(out.string() + "/ held a model from an earlier run: moved it to " +
                       (out / "previous-1").string() + "/"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(read_file((out / "previous-1" / "model.safetensors").string()), first);
  EXPECT_EQ(read_file((out / "previous-1" / "checkpoint.safetensors").string()), first_ck);
  for (const char* f : {"vocabulary.json", "config.json"})
    EXPECT_TRUE(fs::exists(out / "previous-1" / f)) << f;
  const std::string second = read_file((out / "model.safetensors").string());
  EXPECT_NE(second, first);  // seed 2 trained another model, now in place
  // The kept model still predicts.
  EXPECT_EQ(run_cli("predict --model " + (out / "previous-1").string() + " maison").status, 0);

  ASSERT_EQ(run_cli(train(out, 3)).status, 0);  // a third run: previous-2, previous-1 untouched
  EXPECT_EQ(read_file((out / "previous-2" / "model.safetensors").string()), second);
  EXPECT_EQ(read_file((out / "previous-1" / "model.safetensors").string()), first);

  CliResult o = run_cli(train(out, 1, " --overwrite"));
  ASSERT_EQ(o.status, 0) << o.err;
  EXPECT_NE(o.out.find("--overwrite, so this run replaces it"), std::string::npos) << o.out;
  EXPECT_FALSE(fs::exists(out / "previous-3"));
  EXPECT_EQ(read_file((out / "model.safetensors").string()), first);  // seed 1 again, same bytes

  // A fresh directory: nothing to keep, nothing said.
  CliResult n = run_cli(train(work_dir() / "fresh", 1));
  EXPECT_EQ(n.out.find("earlier run"), std::string::npos) << n.out;
}

TEST(CliTrainTwice, EpochsZeroIsRejectedAndTouchesNothing) {
  const fs::path out = work_dir() / "zero";
  ASSERT_EQ(run_cli(train(out, 1)).status, 0);
  const std::string before = read_file((out / "model.safetensors").string());
  CliResult r =
      run_cli("train --data " + tiny_tsv().string() + " --epochs 0 --out " + out.string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--epochs: 0 is out of range: must be >= 1"), std::string::npos) << r.err;
  EXPECT_EQ(read_file((out / "model.safetensors").string()), before);
  EXPECT_FALSE(fs::exists(out / "previous-1"));
}

TEST(CliTrainProgress, BarOnATerminalOnly) {
  // script(1) gives the tool a pseudo-terminal for both stdout and stderr.
  if (std::system("script -qec true /dev/null >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "script(1) cannot give a pseudo-terminal here";
  }
  const fs::path log = work_dir() / "tty.log";
  const std::string cmd = "script -qec \"'" + std::string(SEQPACK_CLI_PATH) + "' " +
                          train(work_dir() / "tty", 1) + "\" /dev/null > '" + log.string() +
                          "' 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(log.string());
  const std::string tty = read_file(log.string());
  EXPECT_NE(tty.find("\repoch 1/2 ["), std::string::npos) << tty;
  // The same run into a file: no bar, one summary line per epoch.
  const CliResult r = run_cli(train(work_dir() / "file", 1));
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ((r.out + r.err).find('\r'), std::string::npos);
  EXPECT_EQ((r.out + r.err).find("batches |"), std::string::npos);
  EXPECT_NE(r.out.find("epoch 1/2: train loss"), std::string::npos);
  EXPECT_NE(r.out.find("epoch 2/2: train loss"), std::string::npos);
}

// Reads one line from `fd`, waiting at most `ms`; "" on timeout or EOF.
std::string read_line(int fd, int ms) {
  std::string line;
  char c;
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, ms) <= 0) return "<timeout: " + line + ">";
    if (::read(fd, &c, 1) != 1) return line;
    if (c == '\n') return line;
    line += c;
  }
}

TEST(CliPredictStream, AnswersEachLineOfAPipeAsItArrives) {
  const fs::path model = work_dir() / "stream_model";
  ASSERT_EQ(run_cli(train(model, 1)).status, 0);
  int to_child[2], from_child[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(from_child), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(to_child[0], 0);
    ::dup2(from_child[1], 1);
    ::close(to_child[1]);
    ::close(from_child[0]);
    ::execl(SEQPACK_CLI_PATH, "seqpack", "predict", "--stream", "--top", "1", "--model",
            model.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  // Each word is written only after the previous answer came back: a tool that
  // buffered its output, or read all of stdin first, would time out here.
  std::string answers;
  for (const std::string word : {"maison", "house", "", "zzz"}) {
    const std::string line = word + "\n";
    ASSERT_EQ(::write(to_child[1], line.data(), line.size()), static_cast<ssize_t>(line.size()));
    const std::string got = read_line(from_child[0], 60000);
    EXPECT_EQ(got.rfind((word.empty() ? "\"\"" : word) + ": ", 0), 0u) << word << " -> " << got;
    EXPECT_TRUE(got.find("english") != std::string::npos || got.find("french") != std::string::npos)
        << got;
    answers += got + "\n";
  }
  // The same answers as `seqpack predict word...` gives for the four words at once.
  ::close(to_child[1]);
  EXPECT_EQ(read_line(from_child[0], 60000), "");  // EOF: the tool ends with its input
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const CliResult batch =
      run_cli("predict --top 1 --model " + model.string() + " maison house '' zzz");
  EXPECT_EQ(answers, batch.out);
  ::close(from_child[0]);
}

}  // namespace

namespace {

// --json gives one JSON object per line; a line that is not UTF-8 is answered
// with an error line (and a message naming the line on stderr), and the stream goes on.
TEST(CliPredictStream, JsonLinesAndABadLineDoesNotEndTheStream) {
  const fs::path model = work_dir() / "stream_model_json";
  ASSERT_EQ(run_cli(train(model, 1)).status, 0);
  const fs::path in = work_dir() / "stream_in.txt";
  std::ofstream(in, std::ios::binary) << "maison\n\xff\xfe\nhouse\n";
  const CliResult r =
      run_cli("predict --stream --json --model " + model.string() + " < '" + in.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  std::vector<nlohmann::json> docs;
  while (std::getline(lines, line)) docs.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(docs.size(), 3u) << r.out;
  EXPECT_EQ(docs[0].at("predictions").at(0).at("word"), "maison");
  EXPECT_EQ(docs[1].at("error"), "invalid input");
  EXPECT_EQ(docs[2].at("predictions").at(0).at("word"), "house");
  EXPECT_NE(r.err.find("seqpack: error: line 2: "), std::string::npos) << r.err;
}

}  // namespace
