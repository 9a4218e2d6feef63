// A model directory holds the whole old model or the whole new one under any
// single fault, and `train --resume` completes after it (seqpack/model_dir.h).
//
// The fault matrix: a run of `seqpack train` into a directory holding an
// earlier model is first run once under tests/fault_shim.c to list its
// file-system calls under the directory's parent; then, for each call in turn,
// the run is repeated with that one call killing the process (SIGKILL; a write
// tears first) or failing with ENOSPC. After each: the directory's four files
// are byte for byte the old model's or the new one's; then `train --resume DIR`
// exits 0 and leaves the new model when the run had staged a checkpoint before
// the fault (else the old one), the old model in DIR/previous-1 beside a new one,
// and no leftover beside or inside DIR. Then: --overwrite, a directory that does
// not exist yet, a file system without RENAME_EXCHANGE, two trainers at once,
// a full tmpfs, an unwritable or foreign --out, and a diverging run.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_run.h"
#include "seqpack/classifier.h"
#include "seqpack/vocabulary.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using seqpack::testing::CliResult;
using seqpack::testing::read_file;
using seqpack::testing::run_cli;
using seqpack::testing::tiny_tsv;
using seqpack::testing::work_dir;

const char* const kFiles[] = {"model.safetensors", "vocabulary.json", "config.json", "checkpoint.safetensors"};

using Model = std::map<std::string, std::string>;  // file -> bytes; a missing file is absent

Model read_model(const fs::path& dir) {
  Model m;
  for (const char* f : kFiles) {
    if (fs::exists(dir / f)) m[f] = read_file((dir / f).string());
  }
  return m;
}

// Run A (the old model) and run B (the new one) differ in seed and epochs.
std::string train_a(const fs::path& out) {
  return "train --quiet --threads 1 --data " + tiny_tsv().string() +
         " --epochs 1 --hidden 8 --embed 4 --batch-size 4 --seed 7 --out " + out.string();
}
std::string train_b(const fs::path& out, const std::string& extra = "") {
  return "train --quiet --threads 1 --data " + tiny_tsv().string() +
         " --epochs 2 --hidden 8 --embed 4 --batch-size 4 --seed 8 --out " + out.string() + extra;
}

const Model& old_model() {
  static const Model m = [] {
    const fs::path d = work_dir() / "ref-old" / "model";
    const CliResult r = run_cli(train_a(d));
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    return read_model(d);
  }();
  return m;
}

const Model& new_model() {
  static const Model m = [] {
    const fs::path d = work_dir() / "ref-new" / "model";
    const CliResult r = run_cli(train_b(d));
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    return read_model(d);
  }();
  return m;
}

std::string shim_env(const fs::path& dir, long at, const std::string& mode, const fs::path& log = {},
                     bool no_exchange = false) {
  std::string e = std::string("LD_PRELOAD=") + SEQPACK_FAULT_SHIM + " SEQPACK_FAULT_DIR=" + dir.string();
  if (at > 0) e += " SEQPACK_FAULT_AT=" + std::to_string(at) + " SEQPACK_FAULT_MODE=" + mode;
  if (!log.empty()) e += " SEQPACK_FAULT_LOG=" + log.string();
  if (no_exchange) e += " SEQPACK_FAULT_NO_EXCHANGE=1";
  return e;
}

// A fresh parent directory holding `model/` with the old model (or nothing).
fs::path fresh_case(const std::string& name, bool with_old) {
  const fs::path p = work_dir() / name;
  fs::remove_all(p);
  fs::create_directories(p);
  if (with_old) {
    fs::create_directories(p / "model");
    for (const auto& [f, bytes] : old_model()) {
      std::ofstream(p / "model" / f, std::ios::binary) << bytes;
    }
  }
  return p;
}

struct Calls {
  std::vector<std::string> lines;  // "call path", index i is call i + 1
  long first_checkpoint = 0;       // the call that put the first checkpoint in place
};

// The run under test, given the model directory.
using RunCommand = std::function<std::string(const fs::path&)>;

Calls list_calls(const std::string& name, bool with_old, const RunCommand& run, bool no_exchange) {
  const fs::path p = fresh_case(name, with_old);
  const fs::path log = work_dir() / (name + ".log");
  fs::remove(log);
  const CliResult r = run_cli(run(p / "model"), shim_env(p, 0, "", log, no_exchange));
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  Calls c;
  std::ifstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    const std::size_t sp = line.find(' ');
    c.lines.push_back(line.substr(sp + 1));
    const std::string& l = c.lines.back();
    if (c.first_checkpoint == 0 && l.rfind("rename ", 0) == 0 && l.find(".saving-") != std::string::npos &&
        l.size() >= 23 && l.compare(l.size() - 23, 23, "/checkpoint.safetensors") == 0) {
      c.first_checkpoint = static_cast<long>(c.lines.size());
    }
  }
  EXPECT_GT(c.first_checkpoint, 0) << "no checkpoint rename among the calls";
  return c;
}

// What may be beside the model directory once a run has finished: its lock file.
std::vector<std::string> leftovers(const fs::path& parent) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(parent)) {
    const std::string n = e.path().filename().string();
    if (n != "model" && n != ".model.lock") out.push_back(n);
  }
  if (fs::exists(parent / "model")) {
    for (const auto& e : fs::directory_iterator(parent / "model")) {
      const std::string n = e.path().filename().string();
      bool known = n.rfind("previous-", 0) == 0;
      for (const char* f : kFiles) known = known || n == f;
      if (!known) out.push_back("model/" + n);
    }
  }
  return out;
}

// Runs the matrix for one kind of run. keep_old: the old model must end in
// previous-1 when the new one is in place.
void fault_matrix(const std::string& name, const std::string& mode, bool with_old, const RunCommand& run,
                  const Model& expected, bool keep_old, bool no_exchange = false) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the LD_PRELOAD shim does not mix with AddressSanitizer's runtime";
#endif
  const Calls calls = list_calls(name + "-count", with_old, run, no_exchange);
  const Model& before = with_old ? old_model() : Model{};
  ASSERT_FALSE(expected.empty());
  for (long at = 1; at <= static_cast<long>(calls.lines.size()); ++at) {
    SCOPED_TRACE("fault " + mode + " at call " + std::to_string(at) + ": " + calls.lines[at - 1]);
    const fs::path p = fresh_case(name, with_old);
    const fs::path dir = p / "model";
    const CliResult r = run_cli(run(dir), shim_env(p, at, mode, {}, no_exchange));
    if (mode == "kill") {
      EXPECT_EQ(r.status, 128 + 9) << r.out << r.err;
    } else if (r.status != 0) {
      EXPECT_EQ(r.status, 1) << r.err;  // an error, not a crash
      EXPECT_NE(r.err.find(mode == "eio" ? "Input/output error" : "No space left on device"), std::string::npos)
          << r.err;
    }
    const Model after = read_model(dir);
    // Without RENAME_EXCHANGE the directory is missing between the two renames
    // of the swap (the one documented window); the next run finishes the swap.
    const std::string& call = calls.lines[at - 1];
    const bool in_window = no_exchange && call.rfind("rename ", 0) == 0 && call.size() > 6 &&
                           call.compare(call.size() - 6, 6, "/model") == 0;
    EXPECT_TRUE(after == before || after == expected || (in_window && after.empty()))
        << "a mix of old and new files";
    if (r.status == 0) EXPECT_TRUE(after == expected);

    const bool staged = at > calls.first_checkpoint || after == expected;
    const CliResult res = run_cli("train --quiet --threads 1 --resume " + dir.string());
    if (!with_old && !staged) {  // nothing was ever saved there: nothing to resume
      EXPECT_EQ(res.status, 1) << res.out << res.err;
      EXPECT_NE(res.err.find("no checkpoint at " + dir.string()), std::string::npos) << res.err;
      EXPECT_EQ(leftovers(p), std::vector<std::string>{}) << res.out;
      continue;
    }
    ASSERT_EQ(res.status, 0) << res.out << res.err;
    const Model resumed = read_model(dir);
    EXPECT_TRUE(resumed == (staged ? expected : before)) << res.out;
    if (keep_old && staged) {
      EXPECT_TRUE(read_model(dir / "previous-1") == old_model()) << "the old model is lost";
    }
    EXPECT_FALSE(fs::exists(dir / (keep_old ? "previous-2" : "previous-1")));
    EXPECT_EQ(leftovers(p), std::vector<std::string>{}) << res.out;
    if (::testing::Test::HasFailure()) break;  // one failing call is enough to read
  }
}

RunCommand run_b(const std::string& extra = "") {
  return [extra](const fs::path& dir) { return train_b(dir, extra); };
}

TEST(ModelDirFaults, KillAtEveryCallOfARunThatKeepsTheOldModel) {
  fault_matrix("keep-kill", "kill", /*with_old=*/true, run_b(), new_model(), /*keep_old=*/true);
}

TEST(ModelDirFaults, FullDiskAtEveryCallOfARunThatKeepsTheOldModel) {
  fault_matrix("keep-enospc", "enospc", /*with_old=*/true, run_b(), new_model(), /*keep_old=*/true);
}

TEST(ModelDirFaults, IoErrorAtEveryCallOfARunThatKeepsTheOldModel) {
  fault_matrix("keep-eio", "eio", /*with_old=*/true, run_b(), new_model(), /*keep_old=*/true);
}

TEST(ModelDirFaults, KillAtEveryCallOfAnOverwritingRun) {
  fault_matrix("overwrite-kill", "kill", /*with_old=*/true, run_b(" --overwrite"), new_model(),
               /*keep_old=*/false);
}

TEST(ModelDirFaults, KillAtEveryCallOfARunIntoANewDirectory) {
  fault_matrix("new-kill", "kill", /*with_old=*/false, run_b(), new_model(), /*keep_old=*/false);
}

TEST(ModelDirFaults, KillAtEveryCallWithoutRenameExchange) {
  fault_matrix("noexchange-kill", "kill", /*with_old=*/true, run_b(), new_model(), /*keep_old=*/true,
               /*no_exchange=*/true);
}

// A run that continues the directory's own checkpoint (run A, 1 epoch, to 3):
// killed anywhere, `--resume` still ends with the bytes of 3 epochs at once.
TEST(ModelDirFaults, KillAtEveryCallOfAResumedRun) {
  static const Model three = [] {
    const fs::path d = work_dir() / "ref-a3" / "model";
    std::string cmd = train_a(d);
    cmd.replace(cmd.find("--epochs 1"), 10, "--epochs 3");
    const CliResult r = run_cli(cmd);
    EXPECT_EQ(r.status, 0) << r.err;
    return read_model(d);
  }();
  const RunCommand resume = [](const fs::path& dir) {
    return "train --quiet --threads 1 --resume " + dir.string() + " --epochs 3";
  };
  fault_matrix("resume-kill", "kill", /*with_old=*/true, resume, three, /*keep_old=*/true);
}

TEST(ModelDirFaults, TheLockNamesItsHolderAndASecondWriterIsRefused) {
  const fs::path p = fresh_case("locked", /*with_old=*/true);
  const int fd = ::open((p / ".model.lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const std::string holder = "pid 4242, the test's own holder\n";
  ASSERT_EQ(::write(fd, holder.data(), holder.size()), static_cast<ssize_t>(holder.size()));
  const CliResult r = run_cli(train_b(p / "model"));
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("is in use by another process (pid 4242, the test's own holder"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("epoch 1/"), std::string::npos) << "refused only after training: " << r.out;
  EXPECT_TRUE(read_model(p / "model") == old_model());
  ::close(fd);
  // Released: the same run goes through.
  const CliResult ok = run_cli(train_b(p / "model"));
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_TRUE(read_model(p / "model") == new_model());
  EXPECT_TRUE(read_model(p / "model" / "previous-1") == old_model());
}

TEST(ModelDirFaults, TwoTrainersAtOnceLoseNoModel) {
  const fs::path p = fresh_case("concurrent", /*with_old=*/true);
  const fs::path dir = p / "model";
  // Long enough (many epochs) that the two overlap.
  const std::string base = std::string("'") + SEQPACK_CLI_PATH + "' train --quiet --threads 1 --data " +
                           tiny_tsv().string() + " --epochs 40 --hidden 8 --embed 4 --batch-size 4 --out " +
                           dir.string();
  const std::string cmd = "(" + base + " --seed 1 >" + (p / "o1").string() + " 2>" + (p / "e1").string() +
                          "; echo $? >" + (p / "s1").string() + ") & (" + base + " --seed 2 >" +
                          (p / "o2").string() + " 2>" + (p / "e2").string() + "; echo $? >" +
                          (p / "s2").string() + ") & wait";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  int saved = 0;
  for (const char* k : {"1", "2"}) {
    const std::string status = read_file((p / (std::string("s") + k)).string());
    const std::string out = read_file((p / (std::string("o") + k)).string());
    const std::string err = read_file((p / (std::string("e") + k)).string());
    if (status == "0\n") {
      ++saved;
      EXPECT_NE(out.find("saved the model to"), std::string::npos) << out;
    } else {
      EXPECT_EQ(status, "1\n") << err;
      EXPECT_NE(err.find("is in use by another process (pid "), std::string::npos) << err;
      EXPECT_NE(err.find("seqpack train, since"), std::string::npos) << err;
    }
  }
  EXPECT_GE(saved, 1);
  // Every model that was there or was saved is still somewhere: the old one in
  // previous-1, each saved one in the directory or a later previous-N.
  EXPECT_TRUE(read_model(dir / "previous-1") == old_model());
  EXPECT_EQ(read_model(dir).size(), 4u);
  EXPECT_EQ(fs::exists(dir / "previous-2"), saved == 2);
  EXPECT_FALSE(fs::exists(dir / "previous-3"));
}

// A trainer refused by a lock names its holder from the line the holder
// writes just after locking; it waits up to 100 ms for that line (a holder
// that locked a moment ago), and says "holder unknown" only past that.
TEST(ModelDirFaults, ABusyDirectoryNamesItsHolderOrSaysItIsUnknown) {
  const fs::path p = fresh_case("held", /*with_old=*/true);
  const fs::path lock = p / ".model.lock";
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const CliResult silent = run_cli(train_a(p / "model"));
  EXPECT_EQ(silent.status, 1);
  EXPECT_NE(silent.err.find("is in use by another process (holder unknown, lock "),
            std::string::npos)
      << silent.err;
  // The line arrives while the trainer waits for it: named, not unknown.
  std::thread late([fd] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const std::string line = "pid 4242, seqpack train, since 2026-11-27 12:00:00\n";
    EXPECT_EQ(::pwrite(fd, line.data(), line.size(), 0), static_cast<ssize_t>(line.size()));
  });
  const CliResult named = run_cli(train_a(p / "model"));
  late.join();
  EXPECT_EQ(named.status, 1);
  EXPECT_NE(named.err.find("(pid 4242, seqpack train, since 2026-11-27 12:00:00, lock "),
            std::string::npos)
      << named.err;
  ::close(fd);
  EXPECT_TRUE(read_model(p / "model") == old_model());
}

TEST(ModelDirFaults, AFullTmpfsLeavesTheOldModelAndResumeFinishesOnceThereIsRoom) {
  const fs::path p = work_dir() / "tmpfs";
  fs::create_directories(p);
  if (::mount("tmpfs", p.c_str(), "tmpfs", 0, "size=512k") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno)
                 << "); the shim's ENOSPC matrix covers the same calls";
  }
  struct Unmount {
    fs::path p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{p};
  const fs::path dir = p / "model";
  ASSERT_EQ(run_cli(train_a(dir)).status, 0);
  ASSERT_TRUE(read_model(dir) == old_model());
  {  // Fill it to the last few KiB: the old model and the lock fit, a new one does not.
    std::ofstream fill(p / "filler", std::ios::binary);
    const std::string block(4096, 'x');
    while (fill.write(block.data(), block.size())) {
    }
  }
  const CliResult r = run_cli(train_b(dir));
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_TRUE(read_model(dir) == old_model());
  fs::remove(p / "filler");
  const CliResult res = run_cli("train --quiet --threads 1 --resume " + dir.string() + " --epochs 2");
  EXPECT_EQ(res.status, 0) << res.out << res.err;
}

TEST(ModelDirFaults, AnUnwritableOrForeignOutIsRefusedBeforeTraining) {
  // /proc takes no new directories, even from root.
  CliResult r = run_cli(train_a("/proc/seqpack-no-such-dir/model"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("/proc/seqpack-no-such-dir"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("epoch 1/"), std::string::npos) << r.out;

  const fs::path p = fresh_case("foreign", /*with_old=*/false);
  fs::create_directories(p / "model");
  std::ofstream(p / "model" / "notes.txt") << "mine";
  r = run_cli(train_a(p / "model"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("holds files that are not part of a seqpack model ('notes.txt')"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("epoch 1/"), std::string::npos) << r.out;
  EXPECT_EQ(read_file((p / "model" / "notes.txt").string()), "mine");

  std::ofstream(p / "file") << "x";
  r = run_cli(train_a(p / "file"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("exists and is not a directory (it is a regular file)"), std::string::npos)
      << r.err;

  // A dangling link says so (it said "exists and is not a directory").
  fs::create_symlink(p / "nowhere", p / "dangling");
  r = run_cli(train_a(p / "dangling"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("model directory '" + (p / "dangling").string() +
                       "' is a dangling symbolic link (to '" + (p / "nowhere").string() +
                       "', which does not exist)"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(fs::is_symlink(p / "dangling"));
  EXPECT_FALSE(fs::exists(p / "nowhere"));
  // A link to a regular file names what it points to.
  fs::create_symlink(p / "file", p / "to-file");
  r = run_cli(train_a(p / "to-file"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("exists and is not a directory (it is a symbolic link to a regular file)"),
            std::string::npos)
      << r.err;
}

// A save renames the whole directory away: `--out .` moved the shell's working
// directory into previous-1. The working directory, any ancestor of it and any
// name of them (a link, "..", an absolute path) are refused before anything is
// created or locked.
TEST(ModelDirFaults, TheWorkingDirectoryOrAnAncestorIsRefusedAsOut) {
  const fs::path p = fresh_case("cwd", /*with_old=*/true);
  const fs::path here = p / "model";  // holds a model, as a user's project directory might
  fs::create_directories(here / "sub");
  fs::create_directory_symlink(here, p / "link-to-model");
  const struct {
    std::string out, says;
  } cases[] = {
      {".", "is the current working directory ('" + here.string() + "')"},
      {"./", "is the current working directory"},
      {here.string(), "is the current working directory"},
      {(p / "link-to-model").string(), "is the current working directory"},
      {"sub/..", "is the current working directory"},
      {"..", "is an ancestor of the current working directory ('" + here.string() + "')"},
      {"/", "name a directory below '/'"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.out);
    const CliResult r = run_cli(train_a(c.out), "cd '" + here.string() + "' &&");
    EXPECT_EQ(r.status, 1) << r.out << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("epoch 1/"), std::string::npos) << r.out;
    EXPECT_TRUE(read_model(here) == old_model());
    EXPECT_FALSE(fs::exists(here / "previous-1"));
    EXPECT_FALSE(fs::exists(p / ".model.lock"));
  }
  const CliResult r = run_cli(train_a("."), "cd '" + here.string() + "' &&");
  EXPECT_NE(
      r.err.find(
          ": a save replaces the whole directory, which would move the working directory away; "
          "give a directory below it, such as '" +
          (here / "model").string() + "'"),
      std::string::npos)
      << r.err;
  // The control: a directory below it is fine.
  const CliResult ok = run_cli(train_a("sub/model"), "cd '" + here.string() + "' &&");
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_TRUE(read_model(here / "sub" / "model") == old_model());
}

// A run that fails on a full disk removes what it staged, keeps only the
// checkpoint of its last finished epoch (for --resume) and says which is which;
// with no checkpoint yet, the whole staging directory goes. (It left everything
// staged and said nothing, and the disk stayed full.)
TEST(ModelDirFaults, AFullDiskRemovesTheStagedFilesAndSaysWhatItKept) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the LD_PRELOAD shim does not mix with AddressSanitizer's runtime";
#endif
  const Calls calls = list_calls("full-count", /*with_old=*/true, run_b(), /*no_exchange=*/false);
  long config_tmp = 0, first_ck_tmp = 0;
  for (long i = 1; i <= static_cast<long>(calls.lines.size()); ++i) {
    const std::string& l = calls.lines[i - 1];
    if (l.rfind("mkstemp ", 0) != 0 || l.find(".saving-") == std::string::npos) continue;
    if (first_ck_tmp == 0 && l.find("/.checkpoint.safetensors.tmp.") != std::string::npos)
      first_ck_tmp = i;
    if (l.find("/.config.json.tmp.") != std::string::npos) config_tmp = i;
  }
  ASSERT_GT(first_ck_tmp, 0);
  ASSERT_GT(config_tmp, calls.first_checkpoint);

  // Full while writing config.json: model.safetensors and vocabulary.json were staged.
  fs::path p = fresh_case("full-config", /*with_old=*/true);
  CliResult r = run_cli(train_b(p / "model"), shim_env(p, config_tmp, "enospc"));
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("seqpack train: " + (p / "model").string() +
                       "/ keeps the model it had; removed the run's "
                       "staged model.safetensors, vocabulary.json; kept its checkpoint " +
                       p.string() + "/.model.saving-"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("`seqpack train --resume " + (p / "model").string() + "` continues from it"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(read_model(p / "model") == old_model());
  std::vector<std::string> staged;
  for (const auto& e : fs::directory_iterator(p)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".model.saving-", 0) != 0) continue;
    for (const auto& f : fs::directory_iterator(e.path()))
      staged.push_back(f.path().filename().string());
  }
  std::sort(staged.begin(), staged.end());
  EXPECT_EQ(staged, (std::vector<std::string>{".seqpack-save", "checkpoint.safetensors"}));
  const CliResult res = run_cli("train --quiet --threads 1 --resume " + (p / "model").string());
  ASSERT_EQ(res.status, 0) << res.out << res.err;
  EXPECT_TRUE(read_model(p / "model") == new_model());
  EXPECT_EQ(leftovers(p), std::vector<std::string>{});

  // Full at the first checkpoint: nothing worth keeping, the staging directory goes.
  p = fresh_case("full-first", /*with_old=*/true);
  r = run_cli(train_b(p / "model"), shim_env(p, first_ck_tmp, "enospc"));
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("keeps the model it had; removed the run's staging directory " + p.string() +
                       "/.model.saving-"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(leftovers(p), std::vector<std::string>{});
  EXPECT_TRUE(read_model(p / "model") == old_model());
}

TEST(ModelDirFaults, LeftoverTemporaryFilesAreCleanedUpByTheNextRun) {
  const fs::path p = fresh_case("temps", /*with_old=*/true);
  std::ofstream(p / "model" / "checkpoint.safetensors.tmp-12345") << "old seqpack's leftover";
  std::ofstream(p / "model" / ".config.json.tmp.Ab12Cd") << "{";
  fs::create_directories(p / ".model.saving-0123456789abcdef");  // killed before its marker
  ASSERT_EQ(run_cli(train_b(p / "model")).status, 0);
  EXPECT_EQ(leftovers(p), std::vector<std::string>{});
  EXPECT_TRUE(read_model(p / "model") == new_model());
}

TEST(ModelDirFaults, ADivergingRunStopsNamingTheStepAndKeepsTheModel) {
  const fs::path p = fresh_case("nan", /*with_old=*/true);
  const CliResult r = run_cli(train_b(p / "model", " --lr 1e300"));
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.err.find("training diverged at epoch 1, batch "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Try a smaller --lr (now 1e+300)"), std::string::npos) << r.err;
  EXPECT_TRUE(read_model(p / "model") == old_model());
  EXPECT_EQ(r.out.find("saved the model"), std::string::npos);
  EXPECT_NE(r.err.find((p / "model").string() + "/ keeps the model it had"), std::string::npos)
      << r.err;
}

// A failed first run into a directory that never held a model does not say the
// directory "keeps the model it had".
TEST(ModelDirFaults, AFailedFirstRunDoesNotClaimAnOldModel) {
  const fs::path p = fresh_case("nan-first", /*with_old=*/false);
  const CliResult r = run_cli(train_b(p / "model", " --lr 1e300"));
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.err.find("training diverged at epoch 1, batch "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("keeps the model it had"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find((p / "model").string() + "/ holds no model (none was saved there before)"),
            std::string::npos)
      << r.err;
}

}  // namespace

namespace {

// Readers never see half of one model and half of another: load_classifier
// while another thread keeps replacing the directory with models of other
// sizes (a mix would fail the size checks or give other labels).
TEST(ModelDirReaders, LoadClassifierSeesOneWholeModelWhileAWriterSwaps) {
  using namespace seqpack;
  const fs::path dir = work_dir() / "swapping" / "model";
  const Vocabulary small = Vocabulary::build({U"ab"}), large = Vocabulary::build({U"abcdefgh"});
  CharClassifier a({.vocab_size = small.size(), .embed_dim = 2, .hidden_size = 3, .num_classes = 2}, 1);
  CharClassifier b({.vocab_size = large.size(), .embed_dim = 3, .hidden_size = 5, .num_classes = 3}, 2);
  // Every tensor of a loaded model must be the one of the model its labels say
  // (a or b, saved in float32): a mix of files of the two would not be.
  using State = std::map<std::string, std::vector<float>>;
  const auto state_of = [](CharClassifier& m) {
    State st;
    for (auto& [k, v] : m.state_dict()) st[k] = v.to(DType::f32).to_vector<float>();
    return st;
  };
  const State state_a = state_of(a), state_b = state_of(b);
  save_classifier(dir.string(), a, small, {"a1", "a2"});
  std::atomic<bool> stop{false};
  std::atomic<int> saves{0};
  std::thread writer([&] {
    for (int i = 0; !stop && i < 400; ++i) {
      if (i % 2) {
        save_classifier(dir.string(), a, small, {"a1", "a2"});
      } else {
        save_classifier(dir.string(), b, large, {"b1", "b2", "b3"});
      }
      ++saves;
    }
  });
  int loads = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (saves < 400 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2)) {
    TrainedClassifier tc;
    try {
      tc = load_classifier(dir.string());
    } catch (const std::exception& e) {
      ADD_FAILURE() << "after " << saves << " saves: " << e.what();
      break;
    }
    const std::vector<std::string> a_labels = {"a1", "a2"};
    const bool is_a = tc.labels == a_labels;
    const std::vector<std::string> b_labels = {"b1", "b2", "b3"};
    EXPECT_TRUE(is_a || tc.labels == b_labels);
    EXPECT_EQ(tc.vocabulary.size(), (is_a ? small : large).size());
    EXPECT_EQ(tc.model->options().hidden_size, is_a ? 3 : 5);
    EXPECT_TRUE(state_of(*tc.model) == (is_a ? state_a : state_b)) << "weights of the other model";
    ++loads;
    if (::testing::Test::HasFailure()) break;
  }
  stop = true;
  writer.join();
  EXPECT_GT(loads, 10);
  EXPECT_GT(saves.load(), 10);
}

// Reading again is for a directory that was replaced: a file missing from the
// directory the path still names is an error naming it, at once.
TEST(ModelDirReaders, AFileMissingFromAnUnchangedDirectoryIsNamed) {
  using namespace seqpack;
  const fs::path dir = work_dir() / "missing-file" / "model";
  const Vocabulary v = Vocabulary::build({U"ab"});
  CharClassifier m({.vocab_size = v.size(), .embed_dim = 2, .hidden_size = 3, .num_classes = 2}, 1);
  for (const char* name : {"config.json", "vocabulary.json", "model.safetensors"}) {
    SCOPED_TRACE(name);
    save_classifier(dir.string(), m, v, {"a1", "a2"});
    ASSERT_EQ(load_classifier(dir.string()).labels, (std::vector<std::string>{"a1", "a2"}));
    fs::remove(dir / name);
    try {
      load_classifier(dir.string());
      ADD_FAILURE() << "loaded without " << name;
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()),
                "load_classifier: model directory '" + dir.string() + "' has no " + name);
    }
  }
}

}  // namespace

namespace {

// `data export` writes one split in four files. Each was replaced in turn, so
// a full disk left a new train.tsv beside the old val.tsv and test.tsv. Now all
// four are written before any is renamed into place: every fault, at every
// call, leaves the old split whole, or names what was already replaced.
TEST(DataExportFaults, EveryFaultLeavesTheOldSplitOrNamesWhatWasReplaced) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the LD_PRELOAD shim does not mix with AddressSanitizer's runtime";
#endif
  const fs::path p = work_dir() / "export-faults";
  fs::remove_all(p);
  const fs::path dicts = p / "dicts", out = p / "split";
  fs::create_directories(dicts);
  fs::create_directories(out);
  for (const char* name :
       {"american-english", "french", "ngerman", "spanish", "italian", "portuguese", "dutch"}) {
    std::ofstream w(dicts / name);
    for (int i = 0; i < 10; ++i) w << std::string(name).substr(0, 3) << i << "\n";
  }
  const std::map<std::string, std::string> old = {{"train.tsv", "0\told train\n"},
                                                  {"val.tsv", "0\told val\n"},
                                                  {"test.tsv", "0\told test\n"},
                                                  {"labels.txt", "old\n"}};
  const auto put_old = [&] {
    for (const auto& [f, text] : old) std::ofstream(out / f, std::ios::trunc) << text;
  };
  const auto files = [&] {
    std::map<std::string, std::string> m;
    for (const auto& e : fs::directory_iterator(out))
      m[e.path().filename().string()] = read_file(e.path().string());
    return m;
  };
  const std::string cmd = "data export --dict-dir " + dicts.string() +
                          " --words-per-language 10 --out " + out.string();
  put_old();
  const fs::path log = p / "calls.log";
  const CliResult counted = run_cli(cmd, shim_env(out, 0, "", log));
  ASSERT_EQ(counted.status, 0) << counted.err;
  const std::map<std::string, std::string> fresh = files();
  ASSERT_EQ(fresh.size(), 4u);
  ASSERT_NE(fresh.at("train.tsv"), old.at("train.tsv"));
  long total = 0;
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) ++total;
  ASSERT_GT(total, 8);
  int staged_faults = 0;
  for (long at = 1; at <= total; ++at) {
    SCOPED_TRACE("ENOSPC at call " + std::to_string(at));
    put_old();
    const CliResult r = run_cli(cmd, shim_env(out, at, "enospc"));
    const auto now = files();  // also: no temporary file is left
    if (r.status == 0) {  // a call whose failure is not an error (the directory's fsync)
      EXPECT_EQ(now, fresh);
      continue;
    }
    if (now == old) {
      EXPECT_NE(r.err.find("nothing was replaced"), std::string::npos) << r.err;
      ++staged_faults;
      continue;
    }
    // A rename failed: the message names the files already replaced, and
    // each file is either the old or the new one.
    EXPECT_NE(r.err.find("already replaced: " + (out / "train.tsv").string()), std::string::npos)
        << r.err;
    ASSERT_EQ(now.size(), 4u);
    for (const auto& [f, text] : now) EXPECT_TRUE(text == old.at(f) || text == fresh.at(f)) << f;
  }
  EXPECT_GT(staged_faults, 4);
}

}  // namespace
