// Bounded inputs through the seqpack tool (docs/reliability.md, "Bounded
// inputs"): predict --stream answers an over-long line with an error and goes
// on, in bounded memory; sizes from a config.json or a bench workload are
// checked before anything is allocated; only regular files are read as data
// and models; numeric options say why a value is refused; an allocation
// failure says what it was for and in which command.
#include <gtest/gtest.h>
#include <sys/stat.h>

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

#define EXPECT_CONTAINS(text, needle)               \
  EXPECT_NE((text).find(needle), std::string::npos) \
      << "'" << (text) << "' lacks '" << (needle) << "'"

// A model trained once for the tests that need one.
const fs::path& model() {
  static const fs::path dir = [] {
    const fs::path tsv = work_dir() / "tiny.tsv";
    {
      std::ofstream o(tsv);
      // 8 words a label: the 80/10/10 split leaves one for the test split.
      for (const char* w : {"the", "house", "water", "night", "light", "which", "there", "would"})
        o << "english\t" << w << "\n";
      for (const char* w : {"maison", "eau", "nuit", "été", "château", "être", "très", "quelle"})
        o << "french\t" << w << "\n";
    }
    const fs::path out = work_dir() / "model";
    const CliResult r =
        run_cli("train --threads 1 --data " + tsv.string() +
                " --epochs 1 --hidden 8 --embed 4 --batch-size 4 --out " + out.string());
    EXPECT_EQ(r.status, 0) << r.err;
    return out;
  }();
  return dir;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// ------------------------------------------------------------ sizes in a model's config

TEST(BoundsCliSizes, AHugeHiddenSizeInConfigIsAnErrorNotACrash) {
  const fs::path dir = work_dir() / "huge_hidden";
  fs::remove_all(dir);
  fs::copy(model(), dir, fs::copy_options::recursive);
  nlohmann::json config = nlohmann::json::parse(read_file((dir / "config.json").string()));
  config["hidden_size"] = uint64_t{1} << 60;  // 1152921504606846976: segfaulted in init_uniform
  std::ofstream(dir / "config.json") << config.dump(1);
  for (const std::string cmd :
       {"predict --model " + dir.string() + " maison",
        "export --model " + dir.string() + " --onnx " + (work_dir() / "huge.onnx").string()}) {
    const CliResult r = run_cli(cmd);
    EXPECT_NE(r.status, 0) << cmd;
    EXPECT_LT(r.status, 128) << cmd << " crashed: " << r.err;
    EXPECT_CONTAINS(r.err, "1152921504606846976");
  }
}

// ------------------------------------------------------------ predict --stream

TEST(BoundsCliStream, AnOverLongLineIsAnsweredWithAnErrorAndTheStreamGoesOn) {
  const fs::path in = work_dir() / "long_line.txt";
  std::ofstream(in, std::ios::binary) << "maison\n" << std::string(20000, 'a') << "\nhouse\n";
  const CliResult r =
      run_cli("predict --stream --top 1 --model " + model().string() + " < '" + in.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto out = lines_of(r.out);
  ASSERT_EQ(out.size(), 3u) << r.out;
  EXPECT_EQ(out[0].rfind("maison: ", 0), 0u) << out[0];
  EXPECT_EQ(out[1], "error: line too long");
  EXPECT_EQ(out[2].rfind("house: ", 0), 0u) << out[2];
  EXPECT_CONTAINS(r.err, "seqpack: error: line 2: 20000 characters, more than --max-chars 10000: skipped");

  // --json: the error is a JSON line too.
  const CliResult j =
      run_cli("predict --stream --json --model " + model().string() + " < '" + in.string() + "'");
  ASSERT_EQ(j.status, 0) << j.err;
  const auto docs = lines_of(j.out);
  ASSERT_EQ(docs.size(), 3u) << j.out;
  EXPECT_EQ(nlohmann::json::parse(docs[1]), nlohmann::json({{"error", "line too long"}}));
  EXPECT_EQ(nlohmann::json::parse(docs[2]).at("predictions").at(0).at("word"), "house");
}

// --max-chars counts characters, not bytes: "été" is 3 characters in 5 bytes.
TEST(BoundsCliStream, MaxCharsCountsCharacters) {
  const fs::path in = work_dir() / "chars.txt";
  std::ofstream(in, std::ios::binary) << "été\r\nmaison\neau\n\xff\n";
  const CliResult r = run_cli("predict --stream --top 1 --max-chars 3 --model " + model().string() +
                              " < '" + in.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto out = lines_of(r.out);
  ASSERT_EQ(out.size(), 4u) << r.out;
  EXPECT_EQ(out[0].rfind("été: ", 0), 0u) << out[0];  // the '\r' is not a character
  EXPECT_EQ(out[1], "error: line too long");
  EXPECT_EQ(out[2].rfind("eau: ", 0), 0u) << out[2];
  EXPECT_EQ(out[3], "error: invalid input");  // not UTF-8: as before, the stream goes on
  EXPECT_CONTAINS(r.err, "seqpack: error: line 2: 6 characters, more than --max-chars 3: skipped");
  EXPECT_CONTAINS(r.err, "seqpack: error: line 4: ");
  EXPECT_CONTAINS(run_cli("predict --stream --max-chars 0").err,
                  "--max-chars: 0 is out of range: must be in [1, 1000000]");
}

// Words on the command line are bounded the same way (an error: there is no next line).
TEST(BoundsCliStream, WordsOnTheCommandLineAreBoundedToo) {
  CliResult r = run_cli("predict --max-chars 3 --model " + model().string() + " eau maison");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_CONTAINS(r.err, "seqpack: error: word 2 has 6 characters, more than --max-chars 3");
  EXPECT_EQ(r.out, "");
  r = run_cli("predict --top 1 --max-chars 3 --model " + model().string() + " été");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.rfind("été: ", 0), 0u) << r.out;
}

// A 64 MB line under a 2 GB address-space limit: once it was buffered whole,
// decoded and run through the network (gigabytes), and the std::bad_alloc from
// an OpenMP worker aborted the process (exit 134) with the next line unanswered.
TEST(BoundsCliStream, AHugeLineTakesBoundedMemory) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves its shadow memory up front and aborts on a failed "
                  "allocation: an address-space limit cannot be tested under it";
#endif
  const fs::path in = work_dir() / "huge_line.txt";
  {
    std::ofstream o(in, std::ios::binary);
    o << "eau\n";
    const std::string block(1 << 20, 'a');
    for (int i = 0; i < 64; ++i) o << block;
    o << "\nnuit\n";
  }
  const CliResult r =
      run_cli("predict --stream --top 1 --model " + model().string() + " < '" + in.string() + "'",
              "ulimit -v 2000000;");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto out = lines_of(r.out);
  ASSERT_EQ(out.size(), 3u) << r.out;
  EXPECT_EQ(out[1], "error: line too long");
  EXPECT_EQ(out[2].rfind("nuit: ", 0), 0u) << out[2];
  EXPECT_CONTAINS(r.err,
                  "line 2: more than 40001 bytes, so more than --max-chars 10000 characters");
}

// ------------------------------------------------------------ regular files only

TEST(BoundsCliFiles, DataAndModelFilesMustBeRegularFiles) {
  // `train --data /dev/zero` read forever; now refused at once, naming the path.
  CliResult r = run_cli("train --epochs 1 --data /dev/zero --out " + (work_dir() / "z").string(),
                        "timeout 60");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_CONTAINS(r.err, "TSV file '/dev/zero' is a character device, not a regular file");
  r = run_cli(
      "train --epochs 1 --data " + work_dir().string() + " --out " + (work_dir() / "z").string(),
      "timeout 60");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_CONTAINS(r.err, "TSV file '" + work_dir().string() + "' is a directory");
  const fs::path fifo = work_dir() / "data.fifo";
  ::mkfifo(fifo.c_str(), 0600);
  r = run_cli("train --epochs 1 --data " + fifo.string() + " --out " + (work_dir() / "z").string(),
              "timeout 60");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_CONTAINS(r.err, "'" + fifo.string() + "' is a FIFO (named pipe)");

  // A model whose weights file is a link to /dev/zero (predict hung) or a directory.
  const fs::path dir = work_dir() / "zero_model";
  fs::remove_all(dir);
  fs::copy(model(), dir, fs::copy_options::recursive);
  fs::remove(dir / "model.safetensors");
  fs::create_symlink("/dev/zero", dir / "model.safetensors");
  r = run_cli("predict --model " + dir.string() + " maison", "timeout 60");
  EXPECT_EQ(r.status, 1) << r.err;
  // load_classifier checks the directory's files before load_safetensors would.
  EXPECT_CONTAINS(r.err, "'" + (dir / "model.safetensors").string() +
                             "' is not a regular file (it is a character device)");
  fs::remove(dir / "model.safetensors");
  fs::create_directory(dir / "model.safetensors");
  r = run_cli("predict --model " + dir.string() + " maison", "timeout 60");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_CONTAINS(r.err, "'" + (dir / "model.safetensors").string() +
                             "' is not a regular file (it is a directory)");
}

// A byte-order mark does not become part of the first label: two labels, not three.
TEST(BoundsCliFiles, AByteOrderMarkInTheDataIsSkipped) {
  const fs::path tsv = work_dir() / "bom.tsv";
  {
    std::ofstream o(tsv, std::ios::binary);
    o << "\xEF\xBB\xBF";
    for (const char* w : {"the", "house", "water", "night"}) o << "english\t" << w << "\n";
    for (const char* w : {"maison", "eau", "nuit", "soir"}) o << "french\t" << w << "\n";
  }
  const fs::path out = work_dir() / "bom_model";
  const CliResult r = run_cli("train --threads 1 --data " + tsv.string() +
                              " --epochs 1 --hidden 4 --embed 2 --out " + out.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const auto config = nlohmann::json::parse(read_file((out / "config.json").string()));
  EXPECT_EQ(config.at("labels"), nlohmann::json({"english", "french"}));
}

// ------------------------------------------------------------ bench workloads

TEST(BoundsCliBench, WorkloadsAreCappedBeforeAnythingIsAllocated) {
  struct Case {
    std::string workload, message;
  };
  const std::vector<Case> cases = {
      // 3e9 tokens once grew to 23 GB before std::bad_alloc.
      {R"("input_size": 8, "hidden_size": 8, "num_layers": 1, "lengths": [3000000000])",
       "workload 'w': lengths[0] = 3000000000 is larger than the bench's cap of 100000000 tokens"},
      {R"("input_size": 8, "hidden_size": 8, "num_layers": 1, "lengths": [60000000, 60000000])",
       "workload 'w': 120000000 tokens (the sum of its lengths) is more than the bench's cap of "
       "100000000"},
      {R"("input_size": 8, "hidden_size": 100000, "num_layers": 1, "lengths": [4])",
       "workload 'w': key 'hidden_size' = 100000 is larger than the bench's cap of 16384"},
      {R"("input_size": 8, "hidden_size": 8, "num_layers": 1000, "lengths": [4])",
       "key 'num_layers' = 1000 is larger than the bench's cap of 64"},
      {R"("input_size": 8, "hidden_size": 18446744073709551615, "num_layers": 1, "lengths": [4])",
       "key 'hidden_size' = 18446744073709551615 must be an integer >= 1"},
      {R"("input_size": 16384, "hidden_size": 16384, "num_layers": 1, "lengths": [100000])",
       "is more than the bench's cap of 17179869184 bytes (16 GiB)"},
      // One token, but about 43 GB of weights: it passed every check, then filled ~40 GiB.
      {R"("input_size": 16384, "hidden_size": 16384, "num_layers": 2, "bidirectional": true, "lengths": [1])",
       "10737942528 parameters, input_size 16384, hidden_size 16384, num_layers 2, bidirectional) "
       "is more than the bench's cap of 17179869184 bytes (16 GiB)"},
  };
  for (const auto& c : cases) {
    const fs::path w = work_dir() / "capped.json";
    std::ofstream(w) << R"({"workloads": [{"name": "w", "cell": "lstm", )" << c.workload << "}]}";
    const CliResult r = run_cli("bench --min-time 0.01 --workloads " + w.string(), "timeout 60");
    EXPECT_EQ(r.status, 1) << c.workload << ": " << r.err;
    EXPECT_CONTAINS(r.err, c.message);
  }
  // A directory as the workloads file names the path (it failed in the stream library).
  CliResult d = run_cli("bench --workloads " + work_dir().string());
  EXPECT_EQ(d.status, 1) << d.err;
  EXPECT_CONTAINS(d.err, "workloads file '" + work_dir().string() + "' is not a regular file");
  // --scale multiplies the lengths before the cap applies.
  const fs::path w = work_dir() / "scaled.json";
  std::ofstream(w) << R"({"workloads": [{"name": "w", "cell": "gru", "input_size": 4, )"
                   << R"("hidden_size": 4, "num_layers": 1, "lengths": [200000]}]})";
  const CliResult r = run_cli("bench --scale 1000 --workloads " + w.string(), "timeout 60");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_CONTAINS(r.err, "200000000 tokens (the sum of its lengths, times --scale 1000)");
}

// An allocation that fails (here under an address-space limit, within the
// caps) names the bytes, the shape and the command, not a bare std::bad_alloc.
TEST(BoundsCliBench, OutOfMemoryNamesTheCommandAndTheTensor) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves its shadow memory up front and aborts on a failed "
                  "allocation: an address-space limit cannot be tested under it";
#endif
  const fs::path w = work_dir() / "big.json";
  std::ofstream(w) << R"({"workloads": [{"name": "big", "cell": "rnn_tanh", "input_size": 256, )"
                   << R"("hidden_size": 1, "num_layers": 1, "lengths": [5000000]}]})";
  const CliResult r = run_cli("bench --mode forward_packed --workloads " + w.string(),
                              "ulimit -v 2000000; timeout 120");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_CONTAINS(r.err,
                  "seqpack: error: out of memory while running 'seqpack bench' (cannot "
                  "allocate 5120000000 bytes for a float32 tensor of shape [5000000, 256]");
}

// ------------------------------------------------------------ numeric options

TEST(BoundsCliOptions, MessagesDoNotContradictTheirValue) {
  // Past int64: not "must be >= 1", which the value satisfies.
  CliResult r = run_cli("train --epochs 99999999999999999999 --data x.tsv");
  EXPECT_NE(r.status, 0);
  EXPECT_LT(r.status, 128) << r.err;
  EXPECT_CONTAINS(r.err,
                  "--epochs: 99999999999999999999 is out of range: larger than the largest "
                  "64-bit integer, 9223372036854775807 (must be >= 1)");
  r = run_cli("train --seed 99999999999999999999 --data x.tsv");
  EXPECT_CONTAINS(r.err, "larger than the largest 64-bit unsigned integer, 18446744073709551615");
  r = run_cli("train --hidden -99999999999999999999 --data x.tsv");
  EXPECT_CONTAINS(r.err,
                  "--hidden: -99999999999999999999 is out of range: smaller than the "
                  "smallest 64-bit integer, -9223372036854775808 (must be in [1, 16384])");
  r = run_cli("train --lr 1e999 --data x.tsv");
  EXPECT_CONTAINS(r.err,
                  "--lr: 1e999 is out of range: above the largest finite double (must be > 0)");
  r = run_cli("train --lr 1e-999 --data x.tsv");
  EXPECT_CONTAINS(r.err, "--lr: 1e-999 is out of range: too close to 0 to be represented");
  // "-0" is 0, for an unsigned option as for a signed one; a negative value is not.
  r = run_cli("train --seed -0 --data /nonexistent/x.tsv");
  EXPECT_EQ(r.err.find("--seed"), std::string::npos) << r.err;
  EXPECT_CONTAINS(r.err, "cannot open TSV file '/nonexistent/x.tsv'");
  r = run_cli("train --threads -0 --data /nonexistent/x.tsv");
  EXPECT_EQ(r.err.find("--threads"), std::string::npos) << r.err;
  r = run_cli("train --seed -3 --data x.tsv");
  EXPECT_CONTAINS(r.err, "--seed: -3 is out of range: must be >= 0");
  r = run_cli("train --seed -00 --data /nonexistent/x.tsv");
  EXPECT_EQ(r.err.find("--seed"), std::string::npos) << r.err;
}

}  // namespace
