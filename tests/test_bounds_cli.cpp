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

#define EXPECT_CONTAINS(text, needle) \
  EXPECT_NE((text).find(needle), std::string::npos) << "'" << (text) << "' lacks '" << (needle) << "'"

// A model trained once for the tests that need one.
const fs::path& model() {
  static const fs::path dir = [] {
    const fs::path tsv = work_dir() / "tiny.tsv";
    {
      std::ofstream o(tsv);
      for (const char* w : {"the", "house", "water", "night", "light"}) o << "english\t" << w << "\n";
      for (const char* w : {"maison", "eau", "nuit", "été", "château"}) o << "french\t" << w << "\n";
    }
    const fs::path out = work_dir() / "model";
    const CliResult r = run_cli("train --threads 1 --data " + tsv.string() +
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
  for (const std::string cmd : {"predict --model " + dir.string() + " maison",
                                "export --model " + dir.string() + " --onnx " +
                                    (work_dir() / "huge.onnx").string()}) {
    const CliResult r = run_cli(cmd);
    EXPECT_NE(r.status, 0) << cmd;
    EXPECT_LT(r.status, 128) << cmd << " crashed: " << r.err;
    EXPECT_CONTAINS(r.err, "1152921504606846976");
  }
}

}  // namespace
