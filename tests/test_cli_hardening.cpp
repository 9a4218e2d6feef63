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

#include <algorithm>
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

namespace {

// `script` run by bash with $S the tool, under a 120 s timeout of its own (a
// hang fails the test instead of stopping the suite); stdout and stderr of
// the script as the test's CliResult. The script does its own redirections.
CliResult run_script(const std::string& script) {
  const fs::path sh = work_dir() / "script.sh";
  std::ofstream(sh) << "S='" << SEQPACK_CLI_PATH << "'\n" << script << "\n";
  const std::string out = (work_dir() / "script.out").string();
  const std::string err = (work_dir() / "script.err").string();
  const std::string cmd = "timeout -k 5 120 bash '" + sh.string() + "' >'" + out + "' 2>'" + err + "'";
  const int raw = std::system(cmd.c_str());
  const int status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  return {status, read_file(out), read_file(err)};
}

const fs::path& small_model() {
  static const fs::path p = [] {
    const fs::path m = work_dir() / "small_model";
    const CliResult r = run_cli(train(m, 1));
    EXPECT_EQ(r.status, 0) << r.err;
    return m;
  }();
  return p;
}

// Every command's output reaches standard output or the command fails: on
// /dev/full (ENOSPC) and on a closed descriptor (EBADF) a short output used to
// stay in stdio's buffer and the command exited 0.
TEST(CliStdout, AFailedWriteIsAnErrorWithItsReason) {
  const std::string m = small_model().string(), tsv = tiny_tsv().string();
  const std::string words = (work_dir() / "words.txt").string();
  std::ofstream(words) << "house\nmaison\n";
  const std::vector<std::string> commands = {
      "info",
      "demo",
      "predict --model '" + m + "' house",
      "predict --model '" + m + "' --eval '" + tsv + "'",
      "predict --model '" + m + "' --stream < '" + words + "'",
      "data stats --data '" + tsv + "'",
      train(work_dir() / "stdout_train", 1),
  };
  for (const std::string& cmd : commands) {
    SCOPED_TRACE(cmd);
    const CliResult full = run_script("\"$S\" " + cmd + " > /dev/full");
    EXPECT_EQ(full.status, 1) << full.err;
    EXPECT_NE(full.err.find("seqpack: error: "), std::string::npos) << full.err;
    EXPECT_NE(full.err.find("No space left on device"), std::string::npos) << full.err;
    const CliResult closed = run_script("\"$S\" " + cmd + " >&-");
    EXPECT_EQ(closed.status, 1) << closed.err;
    EXPECT_NE(closed.err.find("Bad file descriptor"), std::string::npos) << closed.err;
  }
  // The control: the same commands succeed on a file.
  const CliResult ok = run_script("\"$S\" predict --model '" + m + "' house > /dev/null");
  EXPECT_EQ(ok.status, 0) << ok.err;
}

// With SIGPIPE ignored (as a parent may leave it), the stream ended only when
// its input did: `yes | seqpack predict --stream | head -1` never ended.
TEST(CliStdout, ABrokenPipeEndsTheStreamWithSigpipeIgnored) {
  const CliResult r = run_script("trap '' PIPE\nyes house | timeout 60 \"$S\" predict --model '" +
                                 small_model().string() +
                                 "' --stream | head -1\necho \"status ${PIPESTATUS[1]}\"");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.rfind("house: ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("status 1\n"), std::string::npos) << r.out << r.err;  // 124: timed out
  EXPECT_NE(r.err.find("seqpack: error: --stream: cannot write the answer to line "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("Broken pipe"), std::string::npos) << r.err;
}

// With standard output closed, train's lock file took descriptor 1 and the
// log was written into it (over the holder line another trainer quotes).
TEST(CliStdout, AClosedStdoutIsNeverTheLockFile) {
  const fs::path out = work_dir() / "closed_stdout_model";
  const CliResult r = run_script("\"$S\" " + train(out, 1) + " >&-");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("Bad file descriptor"), std::string::npos) << r.err;
  const std::string lock = read_file((work_dir() / ".closed_stdout_model.lock").string());
  EXPECT_EQ(lock.rfind("pid ", 0), 0u) << lock;
  EXPECT_EQ(lock.find("model:"), std::string::npos) << lock;
  EXPECT_EQ(std::count(lock.begin(), lock.end(), '\n'), 1) << lock;
}

// A read error on standard input says why; a bad line's number is said once.
TEST(CliStdout, StreamInputErrorsSayWhy) {
  const std::string m = small_model().string();
  const CliResult dir = run_script("\"$S\" predict --model '" + m + "' --stream < /");
  EXPECT_EQ(dir.status, 1);
  EXPECT_NE(dir.err.find("error reading standard input after line 0: Is a directory"),
            std::string::npos)
      << dir.err;
  const CliResult bad =
      run_script("printf 'house\\n\\377\\n' | \"$S\" predict --model '" + m + "' --stream");
  EXPECT_EQ(bad.status, 0) << bad.err;
  EXPECT_NE(bad.err.find("seqpack: error: line 2: invalid UTF-8"), std::string::npos) << bad.err;
  EXPECT_EQ(bad.err.find("line 2: line 2"), std::string::npos) << bad.err;
}

// --data lines are bounded (kMaxTsvLineBytes), as --eval's: a file of one
// huge line was read whole (2.1 GB for 2 GB) before anything was said.
TEST(CliData, ALineLongerThanTheBoundIsRefusedWithItsNumber) {
  const fs::path f = work_dir() / "long_line.tsv";
  {
    std::ofstream o(f, std::ios::binary);
    o << "english\tthe\nfrench\t" << std::string(std::size_t{1} << 20, 'a') << "\n";
  }
  const CliResult r = run_cli("data stats --data '" + f.string() + "'", "timeout 120");
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("seqpack: error: '" + f.string() +
                       "' line 2 is longer than 1048576 bytes, the longest line a TSV file may have"),
            std::string::npos)
      << r.err;
  const CliResult t = run_cli("train --threads 1 --epochs 1 --data '" + f.string() + "' --out '" +
                                  (work_dir() / "long_line_model").string() + "'",
                              "timeout 120");
  EXPECT_EQ(t.status, 1);
  EXPECT_NE(t.err.find("line 2 is longer than 1048576 bytes"), std::string::npos) << t.err;
}

// Memory that runs out while a line is read is the tool's out-of-memory
// error (getline swallowed the std::bad_alloc: "error reading TSV file").
TEST(CliData, MemoryRunningOutWhileReadingIsSaidAsSuch) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's allocator serves malloc itself and aborts on a failed "
                  "allocation: the fault shim's failing malloc cannot be tested under it";
#endif
  const fs::path f = work_dir() / "mid_line.tsv";
  {
    std::ofstream o(f, std::ios::binary);
    o << "english\tthe\nfrench\t" << std::string(600000, 'a') << "\n";
  }
  // Allocations above 256 KiB fail: the line's buffer does as it grows.
  const std::string env = std::string("timeout 120 env LD_PRELOAD='") + SEQPACK_FAULT_SHIM +
                          "' SEQPACK_FAULT_MALLOC_OVER=262144";
  const CliResult r = run_cli("data stats --data '" + f.string() + "'", env);
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("seqpack: error: out of memory while running 'seqpack data'"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("error reading"), std::string::npos) << r.err;
  // The control: a small file reads under the same limit.
  const CliResult ok = run_cli("data stats --data '" + tiny_tsv().string() + "'", env);
  EXPECT_EQ(ok.status, 0) << ok.err;
}

}  // namespace
