// JSON read from files is checked for depth before it is parsed
// (seqpack/json_limits.h): a value nested 100,000 levels deep, where seqpack
// expects a number or a string, crashed predict, export, bench and
// load_classifier (the message dumped it recursively).
#include "seqpack/json_limits.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "cli_run.h"
#include "seqpack/classifier.h"
#include "seqpack/safetensors.h"
#include "seqpack/vocabulary.h"

namespace {

namespace fs = std::filesystem;
using seqpack::testing::CliResult;
using seqpack::testing::run_cli;
using seqpack::testing::tiny_tsv;
using seqpack::testing::work_dir;

constexpr int kHostileDepth = 100000;

// `depth` arrays one inside the other: "[[[...]]]".
std::string nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

TEST(JsonLimits, DepthIsCountedOutsideStringsOnly) {
  EXPECT_NO_THROW(seqpack::check_json_depth(nested(seqpack::kMaxJsonDepth), "t"));
  const std::string deep = nested(seqpack::kMaxJsonDepth + 1);
  EXPECT_EQ(what_of([&] { seqpack::check_json_depth(deep, "t"); }),
            "t: JSON nested deeper than 64 levels (at byte 64)");
  // Brackets inside strings, escaped quotes among them, do not nest.
  const std::string in_string = "{\"k\": \"" + std::string(500, '[') + "\\\"" +
                                std::string(500, '{') + "\", \"v\": [1, {\"x\": \"]]\"}]}";
  EXPECT_NO_THROW(seqpack::check_json_depth(in_string, "t"));
  EXPECT_TRUE(nlohmann::json::accept(in_string));
  EXPECT_NE(what_of([] { seqpack::check_json_depth(nested(kHostileDepth), "t"); })
                .find("deeper than 64"),
            std::string::npos);
}

TEST(JsonLimits, ExcerptIsCutShort) {
  const nlohmann::json big = nlohmann::json::array({std::string(1000, 'a')});
  const std::string s = seqpack::json_excerpt(big);
  EXPECT_EQ(s.size(), 80u);
  EXPECT_EQ(s.substr(0, 3), "[\"a");
  EXPECT_EQ(s.substr(77), "...");
  EXPECT_EQ(seqpack::json_excerpt(nlohmann::json(12)), "12");
}

TEST(JsonLimits, LibraryReadersRefuseDeepNesting) {
  const std::string vocab =
      "{\"format\": \"seqpack-vocabulary\", \"version\": " + nested(kHostileDepth) + "}";
  EXPECT_NE(what_of([&] { seqpack::Vocabulary::from_json(vocab, "v.json"); })
                .find("vocabulary v.json: JSON nested deeper than 64 levels"),
            std::string::npos);
  // A safetensors file whose header holds the nesting where a dtype belongs.
  const std::string header = "{\"w\": {\"dtype\": " + nested(kHostileDepth) +
                             ", \"shape\": [1], \"data_offsets\": [0, 4]}}";
  std::string bytes(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  bytes += header + std::string(4, '\0');
  EXPECT_NE(what_of([&] { seqpack::parse_safetensors(bytes, nullptr, "deep.safetensors"); })
                .find("JSON nested deeper than 64 levels"),
            std::string::npos);
}

// The tool on a model whose config.json or vocabulary.json is nested deep,
// and on a bench workloads file: a clear error, exit status 1, no crash.
TEST(JsonLimits, ToolRefusesDeepNestingWithoutCrashing) {
  const fs::path model = work_dir() / "json-limits-model";
  fs::remove_all(model);
  const CliResult t = run_cli("train --quiet --threads 1 --data " + tiny_tsv().string() +
                              " --epochs 1 --hidden 8 --embed 4 --out " + model.string());
  ASSERT_EQ(t.status, 0) << t.err;
  for (const char* file : {"config.json", "vocabulary.json"}) {
    const fs::path copy = work_dir() / (std::string("json-limits-") + file);
    fs::remove_all(copy);
    fs::copy(model, copy, fs::copy_options::recursive);
    nlohmann::json j = nlohmann::json::parse(std::ifstream(copy / file));
    const std::string key = j.begin().key();
    j[key] = "@DEEP@";
    std::string text = j.dump();
    text.replace(text.find("\"@DEEP@\""), 8, nested(kHostileDepth));
    std::ofstream(copy / file, std::ios::trunc) << text;
    for (const std::string& cmd :
         {"predict --model " + copy.string() + " maison",
          "export --model " + copy.string() + " --onnx " + (work_dir() / "deep.onnx").string()}) {
      const CliResult r = run_cli(cmd);
      EXPECT_EQ(r.status, 1) << cmd << ": " << r.err;
      EXPECT_NE(r.err.find("JSON nested deeper than 64 levels"), std::string::npos)
          << cmd << ": " << r.err;
    }
    EXPECT_THROW(seqpack::load_classifier(copy.string()), std::invalid_argument) << file;
  }
  const fs::path bench = work_dir() / "deep-workloads.json";
  std::ofstream(bench) << "{\"workloads\": [{\"name\": \"w\", \"cell\": \"lstm\", \"input_size\": "
                       << nested(kHostileDepth) << "}]}";
  const CliResult b = run_cli("bench --workloads " + bench.string());
  EXPECT_EQ(b.status, 1) << b.err;
  EXPECT_NE(b.err.find("workloads file '" + bench.string() + "': JSON nested deeper than 64"),
            std::string::npos)
      << b.err;
}

}  // namespace
