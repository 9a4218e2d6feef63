// Output paths: every file seqpack writes (write_file_atomically: models,
// checkpoints, ONNX, exported data) goes to a regular file or a new path. A
// device node, a FIFO, a socket, a directory or a symbolic link (dangling or
// not) is refused with std::invalid_argument naming the path and what it is,
// and is left exactly as it was: through the library, `seqpack export --onnx`
// and `seqpack data export`. As root, /dev/full itself is passed and must still
// be a character device afterwards.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cli_run.h"
#include "seqpack/data.h"
#include "seqpack/safetensors.h"

namespace {

namespace fs = std::filesystem;
using seqpack::testing::CliResult;
using seqpack::testing::read_file;
using seqpack::testing::run_cli;
using seqpack::testing::TempDir;
using seqpack::testing::tiny_tsv;
using seqpack::testing::work_dir;

// The message of the std::invalid_argument `f` throws ("" and a failure if none).
std::string invalid_argument_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected std::invalid_argument, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected std::invalid_argument, nothing was thrown";
  return "";
}

#define EXPECT_CONTAINS(text, needle)               \
  EXPECT_NE((text).find(needle), std::string::npos) \
      << "message: " << (text) << "\nexpected: " << (needle)

// What is at a path, without following a link: its type and, for a link, its target.
struct Node {
  mode_t type = 0;  // S_IFMT bits; 0: nothing there
  std::string target;
  std::string bytes;  // a regular file's contents (a link's target's, when it is one)
  bool operator==(const Node&) const = default;
};

Node node_at(const fs::path& p) {
  Node n;
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0) return n;
  n.type = st.st_mode & S_IFMT;
  if (S_ISLNK(st.st_mode)) {
    n.target = fs::read_symlink(p).string();
    if (fs::is_regular_file(p)) n.bytes = read_file(p.string());
  } else if (S_ISREG(st.st_mode)) {
    n.bytes = read_file(p.string());
  }
  return n;
}

// The kinds of path the rule refuses, made fresh in `dir`, with the words the
// message must hold.
struct Refused {
  std::string name, expected;
};

std::vector<Refused> make_refused_paths(const TempDir& dir) {
  const std::string target = dir.write("target.bin", "the target's own bytes");
  EXPECT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  fs::create_symlink(target, dir.file("link"));
  fs::create_symlink(dir.file("nowhere"), dir.file("dangling"));
  fs::create_directory(dir.file("directory"));
  fs::create_symlink("/dev/null", dir.file("devnull-link"));
  // A Unix socket bound in the directory.
  const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string sock = dir.file("socket");
  bool have_socket = false;
  if (s >= 0 && sock.size() < sizeof addr.sun_path) {
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", sock.c_str());
    have_socket = ::bind(s, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
  }
  if (s >= 0) ::close(s);
  std::vector<Refused> out = {
      {"fifo", "' is a FIFO (named pipe): seqpack writes only to a regular file or a new path"},
      {"link", "' is a symbolic link (to '" + target + "')"},
      {"dangling", "' is a dangling symbolic link (to '" + dir.file("nowhere") + "')"},
      {"directory", "' is a directory: seqpack writes only to a regular file or a new path"},
      {"devnull-link", "' is a symbolic link (to '/dev/null')"},
  };
  if (have_socket) out.push_back({"socket", "' is a socket: seqpack writes only"});
  return out;
}

// The files of `dir` other than the ones the test made: a temporary file left behind.
std::vector<std::string> strays(const TempDir& dir, const std::vector<std::string>& made) {
  std::vector<std::string> out;
  for (const std::string& n : dir.entries()) {
    if (std::find(made.begin(), made.end(), n) == made.end()) out.push_back(n);
  }
  return out;
}

TEST(OutputFiles, TheWriterRefusesAnythingButARegularFileOrANewPath) {
  const TempDir dir;
  const std::vector<Refused> refused = make_refused_paths(dir);
  const std::vector<std::string> made = dir.entries();
  for (const Refused& r : refused) {
    SCOPED_TRACE(r.name);
    const fs::path p = dir.path / r.name;
    const Node before = node_at(p);
    const std::string m =
        invalid_argument_of([&] { seqpack::write_file_atomically(p.string(), "new bytes"); });
    EXPECT_CONTAINS(m, "output file '" + p.string() + r.expected);
    if (r.name == "link" || r.name == "dangling" || r.name == "devnull-link") {
      EXPECT_CONTAINS(
          m,
          "would replace the link rather than write to its target; give the target's path instead");
    }
    EXPECT_TRUE(node_at(p) == before) << "the path was changed";
    // save_safetensors and check_output_file apply the same rule.
    EXPECT_CONTAINS(invalid_argument_of([&] { seqpack::save_safetensors(p.string(), {}); }),
                    r.expected);
    EXPECT_CONTAINS(invalid_argument_of([&] { seqpack::check_output_file(p.string()); }),
                    r.expected);
    EXPECT_TRUE(node_at(p) == before) << "the path was changed";
  }
  EXPECT_EQ(read_file(dir.file("target.bin")), "the target's own bytes");
  EXPECT_EQ(strays(dir, made), std::vector<std::string>{}) << "a temporary file was left behind";

  // What the rule allows: a new path, and a regular file (replaced whole).
  seqpack::write_file_atomically(dir.file("new.bin"), "one");
  EXPECT_EQ(read_file(dir.file("new.bin")), "one");
  seqpack::write_file_atomically(dir.file("new.bin"), "two");
  EXPECT_EQ(read_file(dir.file("new.bin")), "two");
  EXPECT_NO_THROW(seqpack::check_output_file(dir.file("new.bin")));
  EXPECT_NO_THROW(seqpack::check_output_file(dir.file("absent.bin")));
}

// As root, the rename that used to replace /dev/full would succeed: the check
// is what keeps the device. (Not root: the device must survive all the same.)
TEST(OutputFiles, ADeviceNodeIsNeverReplaced) {
  struct stat st {};
  ASSERT_EQ(::stat("/dev/full", &st), 0);
  ASSERT_TRUE(S_ISCHR(st.st_mode));
  const std::string m =
      invalid_argument_of([] { seqpack::write_file_atomically("/dev/full", "x"); });
  EXPECT_CONTAINS(m, "output file '/dev/full' is a character device");
  ASSERT_EQ(::lstat("/dev/full", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << "/dev/full is no longer a character device";
  for (const auto& e : fs::directory_iterator("/dev")) {
    EXPECT_EQ(e.path().filename().string().rfind(".full.tmp.", 0), std::string::npos) << e.path();
  }
}

// The path is checked again just before the rename: a FIFO made at the path
// while the temporary file is being written is not replaced. The FIFO is made
// as soon as the temporary file appears; a run where the rename wins anyway
// (mkfifo then finds the new file) is repeated with more bytes.
TEST(OutputFiles, APathThatChangesWhileTheFileIsWrittenIsCheckedAgain) {
  for (std::size_t mb = 16; mb <= 256; mb *= 2) {
    const TempDir dir;
    const std::string path = dir.file("out.bin");
    const std::string bytes(mb << 20, 'x');
    std::string error;
    std::atomic<bool> done{false};
    std::thread writer([&] {
      try {
        seqpack::write_file_atomically(path, bytes);
      } catch (const std::invalid_argument& e) {
        error = e.what();
      }
      done = true;
    });
    bool fifo_made = false;
    while (!done && !fifo_made) {
      for (const std::string& n : dir.entries()) {
        if (n.rfind(".out.bin.tmp.", 0) == 0) fifo_made = ::mkfifo(path.c_str(), 0600) == 0;
        if (n.rfind(".out.bin.tmp.", 0) == 0) break;
      }
    }
    writer.join();
    if (!fifo_made) continue;  // the rename came first: try with more bytes
    EXPECT_NE(error.find("output file '" + path + "' is a FIFO (named pipe)"), std::string::npos)
        << "error: '" << error << "'";
    struct stat st {};
    ASSERT_EQ(::lstat(path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO was replaced";
    EXPECT_EQ(dir.entries(), std::vector<std::string>{"out.bin"}) << "the temporary file was left";
    return;
  }
  GTEST_SKIP() << "the rename always came before the FIFO could be made";
}

TEST(OutputFiles, DataExportChecksEveryFileBeforeWritingAny) {
  const TempDir dir;
  seqpack::DatasetSplit split;
  split.labels = {"a", "b"};
  split.train = {{"x", U"x", 0}, {"y", U"y", 1}};
  ::mkfifo(dir.file("test.tsv").c_str(), 0600);
  EXPECT_CONTAINS(invalid_argument_of([&] { seqpack::export_split(split, dir.path.string()); }),
                  "output file '" + dir.file("test.tsv") + "' is a FIFO (named pipe)");
  // train.tsv and val.tsv come first: neither was written.
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"test.tsv"});
  struct stat st {};
  ASSERT_EQ(::lstat(dir.file("test.tsv").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

// ------------------------------------------------------------ the command line

bool have_export_command() {
  static const bool have = run_cli("export --help").status == 0;
  return have;
}

const fs::path& tiny_model() {
  static const fs::path p = [] {
    const fs::path d = work_dir() / "model";
    const CliResult r =
        run_cli("train --quiet --threads 1 --data " + tiny_tsv().string() +
                " --epochs 1 --hidden 4 --embed 2 --batch-size 4 --out " + d.string());
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    return d;
  }();
  return p;
}

TEST(OutputFilesCli, ExportOnnxRefusesDevicesFifosLinksAndDirectories) {
  if (!have_export_command()) GTEST_SKIP() << "seqpack was built without ONNX export";
  const TempDir dir;
  const std::vector<Refused> refused = make_refused_paths(dir);
  const std::vector<std::string> made = dir.entries();
  for (const Refused& r : refused) {
    SCOPED_TRACE(r.name);
    const fs::path p = dir.path / r.name;
    const Node before = node_at(p);
    const CliResult res =
        run_cli("export --model " + tiny_model().string() + " --onnx " + p.string(), "timeout 60");
    EXPECT_EQ(res.status, 1) << res.out << res.err;
    EXPECT_CONTAINS(res.err, "seqpack: error: output file '" + p.string() + r.expected);
    EXPECT_EQ(res.out, "");
    EXPECT_TRUE(node_at(p) == before) << "the path was changed";
  }
  EXPECT_EQ(strays(dir, made), std::vector<std::string>{});
  // /dev/full: as root this replaced the device with a regular file of 8.5 KB.
  const CliResult full =
      run_cli("export --model " + tiny_model().string() + " --onnx /dev/full", "timeout 60");
  EXPECT_EQ(full.status, 1) << full.out << full.err;
  EXPECT_CONTAINS(full.err, "output file '/dev/full' is a character device");
  struct stat st {};
  ASSERT_EQ(::lstat("/dev/full", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << "/dev/full is no longer a character device";
  // The control: a regular file is written.
  const CliResult ok =
      run_cli("export --model " + tiny_model().string() + " --onnx " + dir.file("m.onnx"));
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_GT(fs::file_size(dir.file("m.onnx")), 0u);
}

TEST(OutputFilesCli, DataExportRefusesDevicesFifosLinksAndDirectories) {
  const TempDir dir;
  const std::vector<Refused> refused = make_refused_paths(dir);
  for (const Refused& r : refused) {
    SCOPED_TRACE(r.name);
    // Each kind in turn as OUT/val.tsv of an otherwise empty directory.
    const fs::path out = dir.path / ("out-" + r.name);
    fs::create_directory(out);
    fs::rename(dir.path / r.name, out / "val.tsv");
    const Node before = node_at(out / "val.tsv");
    // No word lists: the check comes before they are read.
    const CliResult res =
        run_cli("data export --dict-dir /nonexistent --out " + out.string(), "timeout 60");
    EXPECT_EQ(res.status, 1) << res.out << res.err;
    EXPECT_CONTAINS(res.err, "output file '" + (out / "val.tsv").string() + r.expected);
    EXPECT_TRUE(node_at(out / "val.tsv") == before) << "the path was changed";
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(out)) names.push_back(e.path().filename().string());
    EXPECT_EQ(names, std::vector<std::string>{"val.tsv"});
  }
  // A link to /dev/full among the outputs: refused, and the device stays one.
  const fs::path devdir = dir.path / "devdir";
  fs::create_directory(devdir);
  fs::create_symlink("/dev/full", devdir / "labels.txt");
  const CliResult res = run_cli("data export --dict-dir /nonexistent --out " + devdir.string());
  EXPECT_EQ(res.status, 1);
  EXPECT_CONTAINS(res.err, "output file '" + (devdir / "labels.txt").string() +
                               "' is a symbolic link (to '/dev/full')");
  struct stat st {};
  ASSERT_EQ(::lstat("/dev/full", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

// No command writes onto one of its own inputs: `export --onnx M/model.safetensors`
// replaced the model it exported and said "wrote", and the next predict failed.
// The output is refused by what it resolves to (.., a symbolic link to the
// directory, a hard link), before anything is written.
TEST(OutputFilesCli, ExportNeverWritesIntoTheModelItReads) {
  if (!have_export_command()) GTEST_SKIP() << "seqpack was built without ONNX export";
  const TempDir dir;
  const fs::path m = dir.path / "m";
  fs::copy(tiny_model(), m);
  fs::create_symlink(m, dir.path / "alias");
  fs::create_hard_link(m / "checkpoint.safetensors", dir.path / "hard");
  const std::vector<std::string> before = {read_file((m / "model.safetensors").string()),
                                           read_file((m / "vocabulary.json").string()),
                                           read_file((m / "checkpoint.safetensors").string())};
  const std::string inside = "' lies inside the --model directory '" + m.string() +
                             "' that this command reads: a command never writes onto its own input";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {(m / "model.safetensors").string(), inside},
      {(m / ".." / "m" / "vocabulary.json").string(), inside},
      {(dir.path / "alias" / "checkpoint.safetensors").string(), inside},
      {(m / "new.onnx").string(), inside},
      {(dir.path / "hard").string(), "' is a hard link to checkpoint.safetensors in the --model "
                                     "directory '" + m.string() + "'"},
  };
  for (const auto& [out, expected] : cases) {
    SCOPED_TRACE(out);
    const CliResult r = run_cli("export --model " + m.string() + " --onnx " + out, "timeout 60");
    EXPECT_EQ(r.status, 1) << r.out << r.err;
    EXPECT_CONTAINS(r.err, "seqpack: error: --onnx file '" + out + expected);
    EXPECT_EQ(r.out, "");
  }
  EXPECT_FALSE(fs::exists(m / "new.onnx"));
  EXPECT_EQ((std::vector<std::string>{read_file((m / "model.safetensors").string()),
                                      read_file((m / "vocabulary.json").string()),
                                      read_file((m / "checkpoint.safetensors").string())}),
            before);
  EXPECT_EQ(run_cli("predict --model " + m.string() + " maison").status, 0);
  // The control: a path outside the model is written.
  const CliResult ok = run_cli("export --model " + m.string() + " --onnx " + dir.file("m.onnx"));
  EXPECT_EQ(ok.status, 0) << ok.err;
}

// data export refuses an output that is one of the word lists it reads (a hard
// link here); train refuses a --data inside --out, which it swaps as one unit;
// predict refuses a standard output appended to its --eval file or a model file.
TEST(OutputFilesCli, DataExportTrainAndPredictNeverWriteOntoTheirInputs) {
  const TempDir dir;
  const fs::path dict = dir.path / "dict", out = dir.path / "out";
  fs::create_directories(dict);
  fs::create_directories(out);
  std::ofstream(dict / "american-english") << "house\nwater\n";
  fs::create_hard_link(dict / "american-english", out / "train.tsv");
  const CliResult d =
      run_cli("data export --dict-dir " + dict.string() + " --out " + out.string(), "timeout 60");
  EXPECT_EQ(d.status, 1) << d.err;
  EXPECT_CONTAINS(d.err, "output file '" + (out / "train.tsv").string() + "' is the word list '" +
                             (dict / "american-english").string() + "' that this command reads");
  EXPECT_EQ(read_file((dict / "american-english").string()), "house\nwater\n");

  const fs::path model = dir.path / "model";
  fs::create_directories(model);
  fs::copy_file(tiny_tsv(), model / "data.tsv");
  const CliResult t = run_cli("train --quiet --threads 1 --data " + (model / "data.tsv").string() +
                                  " --epochs 1 --hidden 4 --embed 2 --batch-size 4 --out " +
                                  (model / ".." / "model").string(),
                              "timeout 60");
  EXPECT_EQ(t.status, 1) << t.err;
  EXPECT_CONTAINS(t.err, "--out directory '" + (model / ".." / "model").string() +
                             "' holds the --data file '" + (model / "data.tsv").string() + "'");
  EXPECT_EQ(read_file((model / "data.tsv").string()), read_file(tiny_tsv().string()));

  const std::string eval = dir.write("eval.tsv", "english\thouse\nfrench\tmaison\n");
  const CliResult p = run_cli("predict --model " + tiny_model().string() + " --eval " + eval +
                              " >> " + eval + " #", "timeout 60");
  EXPECT_EQ(p.status, 1) << p.err;
  EXPECT_EQ(read_file(eval), "english\thouse\nfrench\tmaison\n");
  const std::string config = (tiny_model() / "config.json").string();
  const std::string config_before = read_file(config);
  const CliResult c =
      run_cli("predict --model " + tiny_model().string() + " house >> " + config + " #", "timeout 60");
  EXPECT_EQ(c.status, 1);
  EXPECT_EQ(read_file(config), config_before);
  // A new file beside the model is no input: predictions may be kept there.
  const CliResult ok = run_cli("predict --model " + tiny_model().string() + " house >> " +
                               (tiny_model() / "predictions.txt").string() + " #");
  EXPECT_EQ(ok.status, 0) << ok.err;
  fs::remove(tiny_model() / "predictions.txt");
}

// The library rule itself, for paths that do not exist yet and for directories.
TEST(OutputFiles, CheckOutputNotInputComparesWhatPathsResolveTo) {
  const TempDir dir;
  const std::string in = dir.write("in.tsv", "x\ty\n");
  fs::create_directories(dir.path / "d" / "sub");
  const std::vector<seqpack::InputPath> inputs = {{"input file", in},
                                                  {"input directory", dir.file("d")}};
  EXPECT_CONTAINS(invalid_argument_of([&] {
                    seqpack::check_output_not_input(dir.file("d") + "/../in.tsv", "output", inputs);
                  }),
                  "output '" + dir.file("d") + "/../in.tsv' is the input file '" + in + "'");
  EXPECT_CONTAINS(invalid_argument_of([&] {
                    seqpack::check_output_not_input(dir.file("d") + "/sub/new.bin", "output", inputs);
                  }),
                  "lies inside the input directory");
  EXPECT_CONTAINS(invalid_argument_of([&] {
                    seqpack::check_output_not_input(dir.path.string(), "output", inputs);
                  }),
                  "holds the input file");
  // Elsewhere, and inputs that do not exist: nothing to refuse.
  seqpack::check_output_not_input(dir.file("other.bin"), "output", inputs);
  seqpack::check_output_not_input(dir.file("d"), "output", {{"input", dir.file("missing")}});
}

}  // namespace
