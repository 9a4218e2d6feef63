// safetensors: round trips, files written by an independent Python
// implementation from torch tensors, files read back by it, every kind of
// corruption, and atomic writes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "seqpack/safetensors.h"
#include "test_util.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using seqpack::DType;
using seqpack::SafetensorsError;
using seqpack::Tensor;

namespace {

using seqpack::testing::TempDir;
using seqpack::testing::read_file;

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

// Bitwise equality: dtype, shape and every byte (so -0.0 and NaN payloads count).
::testing::AssertionResult same_tensor(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) {
    return ::testing::AssertionFailure()
           << seqpack::dtype_name(a.dtype()) << " " << seqpack::shape_str(a.shape()) << " vs "
           << seqpack::dtype_name(b.dtype()) << " " << seqpack::shape_str(b.shape());
  }
  if (a.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) != 0) {
    return ::testing::AssertionFailure()
           << "values differ: " << a.to_string() << " vs " << b.to_string();
  }
  return ::testing::AssertionSuccess();
}

// A file from a hand-written header (padded like the writer does) and buffer.
std::string make_file(const std::string& header, const std::string& buffer) {
  std::string h = header;
  h.append((8 - h.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i)
    out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + h + buffer;
}

// Expects parse_safetensors(bytes) to throw SafetensorsError whose message
// contains every string in `needles`.
void expect_rejected(const std::string& bytes, std::vector<std::string> needles) {
  try {
    seqpack::parse_safetensors(bytes, nullptr, "'bad.safetensors'");
    ADD_FAILURE() << "accepted a malformed file; expected an error mentioning " << needles[0];
  } catch (const SafetensorsError& e) {
    const std::string msg = e.what();
    needles.push_back("'bad.safetensors'");
    for (const auto& n : needles) {
      EXPECT_NE(msg.find(n), std::string::npos)
          << "message \"" << msg << "\" lacks \"" << n << "\"";
    }
  }
}

Tensor expected_tensor(const nlohmann::json& j) {
  const std::string dt = j.at("dtype");
  const DType dtype = dt == "F32" ? DType::f32 : dt == "F64" ? DType::f64 : DType::i64;
  return seqpack::testing::tensor_from_json({{"shape", j.at("shape")}, {"values", j.at("values")}},
                                            dtype);
}

}  // namespace

TEST(Safetensors, RoundTripsEveryDtypeShapeAndMetadata) {
  TempDir dir;
  std::map<std::string, Tensor> tensors = {
      {"a.f32", Tensor::from_vector<float>({1.5f, -0.0f, 3e38f, 1e-45f, 7, 8}, {2, 3})},
      {"b.f64", Tensor::from_vector<double>({1.0 / 3.0, -2.5, 1e-300}, {3})},
      {"c.i64", Tensor::from_vector<int64_t>({INT64_MIN, -1, 0, INT64_MAX}, {2, 1, 2})},
      {"d.scalar", Tensor::from_vector<double>({42.0}, {})},
      {"e.empty", Tensor::zeros({0, 4}, DType::f32)},
      {"f.empty_i64", Tensor::zeros({3, 0}, DType::i64)},
  };
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"épreuve", "ünïcode ✓"}};
  const std::string path = dir.file("m.safetensors");
  seqpack::save_safetensors(path, tensors, meta);
  std::map<std::string, std::string> meta_back = {{"stale", "entry"}};
  auto back = seqpack::load_safetensors(path, &meta_back);
  EXPECT_EQ(meta_back, meta);
  ASSERT_EQ(back.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(back.count(name)) << name;
    EXPECT_TRUE(same_tensor(back.at(name), t)) << name;
  }
  // The data buffer starts 8-byte aligned and the header parses as plain JSON.
  const std::string bytes = read_file(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_TRUE(nlohmann::json::accept(bytes.substr(8, n)));
}

TEST(Safetensors, ViewsAreSavedAsTheirOwnElements) {
  Tensor big = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2});
  auto back =
      seqpack::parse_safetensors(seqpack::serialize_safetensors({{"rows", big.slice0(1, 3)}}));
  EXPECT_EQ(back.at("rows").to_vector<float>(), (std::vector<float>{2, 3, 4, 5}));
}

// The format allows any string as a tensor name, the empty one included (the
// reference writer does not refuse it): a file that has one loads and saves back.
TEST(Safetensors, EmptyTensorNameRoundTrips) {
  const std::string f = make_file(
      R"({"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I64","shape":[1],"data_offsets":[8,16]}})",
      std::string("\0\0\x80\x3f\0\0\0\x40", 8) + std::string("\x07\0\0\0\0\0\0\0", 8));
  const auto parsed = seqpack::parse_safetensors(f);
  ASSERT_EQ(parsed.size(), 2u);
  EXPECT_EQ(parsed.at("").to_vector<float>(), (std::vector<float>{1, 2}));
  EXPECT_EQ(parsed.at("b").to_vector<int64_t>(), (std::vector<int64_t>{7}));
  const auto back = seqpack::parse_safetensors(seqpack::serialize_safetensors(parsed));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back.at("").to_vector<float>(), (std::vector<float>{1, 2}));
  EXPECT_EQ(back.at("b").to_vector<int64_t>(), (std::vector<int64_t>{7}));
}

TEST(Safetensors, EmptyMapRoundTrips) {
  std::map<std::string, std::string> meta;
  EXPECT_TRUE(seqpack::parse_safetensors(seqpack::serialize_safetensors({}), &meta).empty());
  EXPECT_TRUE(meta.empty());
}

TEST(Safetensors, LoadsFilesWrittenFromTorchTensors) {
  const nlohmann::json expected = seqpack::testing::load_fixture("safetensors.json");
  ASSERT_GE(expected.size(), 4u);
  for (const auto& [fname, want] : expected.items()) {
    SCOPED_TRACE(fname);
    std::map<std::string, std::string> meta;
    auto got = seqpack::load_safetensors(std::string(SEQPACK_FIXTURES_DIR) + "/" + fname, &meta);
    EXPECT_EQ(meta, (want.at("metadata").get<std::map<std::string, std::string>>()));
    ASSERT_EQ(got.size(), want.at("tensors").size());
    for (const auto& [name, w] : want.at("tensors").items()) {
      ASSERT_TRUE(got.count(name)) << name;
      EXPECT_TRUE(same_tensor(got.at(name), expected_tensor(w))) << name;
    }
  }
}

TEST(Safetensors, TorchModelFileHasPyTorchStateDictNames) {
  auto got = seqpack::load_safetensors(std::string(SEQPACK_FIXTURES_DIR) +
                                       "/safetensors_model.safetensors");
  for (const char* name : {"embedding.weight", "lstm.weight_ih_l0", "lstm.weight_hh_l0",
                           "lstm.bias_ih_l0", "lstm.bias_hh_l0", "lstm.weight_ih_l0_reverse",
                           "lstm.bias_hh_l0_reverse", "fc.weight", "fc.bias"}) {
    EXPECT_TRUE(got.count(name)) << name;
  }
  EXPECT_EQ(got.at("lstm.weight_ih_l0").shape(), (seqpack::Shape{12, 4}));
  // padding_idx=0: PyTorch zeroes that row at construction.
  for (float v : got.at("embedding.weight").select0(0).to_vector<float>()) EXPECT_EQ(v, 0.f);
}

TEST(Safetensors, WriterMatchesTheIndependentPythonWriterByteForByte) {
  for (const char* fname :
       {"safetensors_basic.safetensors", "safetensors_model.safetensors",
        "safetensors_no_metadata.safetensors", "safetensors_empty_file.safetensors"}) {
    SCOPED_TRACE(fname);
    const std::string path = std::string(SEQPACK_FIXTURES_DIR) + "/" + fname;
    std::map<std::string, std::string> meta;
    auto tensors = seqpack::load_safetensors(path, &meta);
    EXPECT_EQ(seqpack::serialize_safetensors(tensors, meta), read_file(path));
  }
}

TEST(Safetensors, FileWrittenBySeqpackReadsBackInTorch) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 with torch (Debian package python3-torch) is not available";
  }
  TempDir dir;
  std::map<std::string, Tensor> tensors = {
      {"w", Tensor::from_vector<float>({0.1f, -0.2f, 1e-45f, -0.0f, 3.4e38f, 6}, {3, 2})},
      {"d", Tensor::from_vector<double>({1.0 / 3.0, -1e300}, {2, 1})},
      {"i", Tensor::from_vector<int64_t>({INT64_MIN, INT64_MAX, 0}, {3})},
      {"s", Tensor::from_vector<double>({2.5}, {})},
      {"z", Tensor::zeros({2, 0}, DType::f32)},
  };
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"by", "seqpack"}};
  const std::string path = dir.file("from_seqpack.safetensors");
  seqpack::save_safetensors(path, tensors, meta);
  nlohmann::json expected;
  expected["metadata"] = meta;
  for (const auto& [name, t] : tensors) {
    nlohmann::json values = nlohmann::json::array();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (t.dtype() == DType::i64) {
        values.push_back(t.data<int64_t>()[i]);
      } else {
        values.push_back(t.item_as_double(i));
      }
    }
    const char* dt = t.dtype() == DType::f32 ? "F32" : t.dtype() == DType::f64 ? "F64" : "I64";
    expected["tensors"][name] = {{"dtype", dt}, {"shape", t.shape()}, {"values", values}};
  }
  write_bytes(dir.file("expected.json"), expected.dump());
  const std::string cmd = "/usr/bin/python3 " + std::string(SEQPACK_FIXTURES_DIR) +
                          "/gen_safetensors.py --check " + path + " " + dir.file("expected.json");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  // The check can fail: a changed value is reported.
  expected["tensors"]["w"]["values"][0] = 0.5;
  write_bytes(dir.file("wrong.json"), expected.dump());
  const std::string bad = "/usr/bin/python3 " + std::string(SEQPACK_FIXTURES_DIR) +
                          "/gen_safetensors.py --check " + path + " " + dir.file("wrong.json") +
                          " 2>/dev/null";
  EXPECT_NE(std::system(bad.c_str()), 0);
}

// ---------------------------------------------------------------------------
// Corrupt, truncated and hostile files.

TEST(SafetensorsCorrupt, TooShortForTheHeaderLength) {
  expect_rejected("", {"0 bytes"});
  expect_rejected(std::string("\x05\0\0", 3), {"3 bytes"});
}

TEST(SafetensorsCorrupt, HeaderLengthPastTheEndOfTheFile) {
  std::string f = make_file("{}", "");
  f[0] = 100;  // claims 100 header bytes; the file has 8
  expect_rejected(f, {"header length 100", "16-byte file"});
}

TEST(SafetensorsCorrupt, AbsurdHeaderLength) {
  std::string f(16, ' ');
  for (int i = 0; i < 8; ++i) f[static_cast<std::size_t>(i)] = '\xff';
  expect_rejected(f, {"header length 18446744073709551615", "limit"});
  f[7] = '\x00';
  f[6] = '\x00';
  f[5] = '\x01';  // 2^40 + ...: beyond the 100 MB limit, not allocated
  expect_rejected(f, {"header length", "limit 100000000"});
}

TEST(SafetensorsCorrupt, InvalidJson) {
  expect_rejected(make_file("{\"a\": {\"dtype\": \"F32\",", ""), {"not valid JSON"});
  expect_rejected(make_file("[1, 2]", ""), {"array", "expected an object"});
  expect_rejected(make_file("{\"a\": 3}", ""), {"tensor 'a'", "3"});
}

TEST(SafetensorsCorrupt, UnknownDtypes) {
  for (const char* dt : {"F16", "BF16", "U8", "garbage", ""}) {
    SCOPED_TRACE(dt);
    expect_rejected(make_file(std::string("{\"t\":{\"dtype\":\"") + dt +
                                  "\",\"shape\":[1],\"data_offsets\":[0,2]}}",
                              "ab"),
                    {"tensor 't'", std::string("dtype '") + dt + "'"});
  }
  expect_rejected(make_file("{\"t\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", "abcd"),
                  {"tensor 't'", "dtype"});
  expect_rejected(make_file("{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", "abcd"),
                  {"tensor 't'", "dtype"});
}

TEST(SafetensorsCorrupt, InvalidShapes) {
  expect_rejected(
      make_file("{\"t\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", "abcd"),
      {"tensor 't'", "[-1]", "-1"});
  expect_rejected(
      make_file("{\"t\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,4]}}", "abcd"),
      {"tensor 't'", "2.5"});
  expect_rejected(
      make_file("{\"t\":{\"dtype\":\"F32\",\"shape\":\"x\",\"data_offsets\":[0,4]}}", "abcd"),
      {"tensor 't'", "shape"});
  // 2^62 * 2^62 wraps to 0 in 64-bit arithmetic: must be caught, not accepted as empty.
  expect_rejected(make_file("{\"t\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,"
                            "4611686018427387904],\"data_offsets\":[0,0]}}",
                            ""),
                  {"tensor 't'", "4611686018427387904", "overflows"});
}

TEST(SafetensorsCorrupt, OffsetsOutOfRange) {
  expect_rejected(
      make_file("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", "abcd"),
      {"tensor 't'", "[0,8]", "4-byte data buffer"});
  expect_rejected(
      make_file("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", "abcd"),
      {"tensor 't'", "[4,0]"});
  expect_rejected(
      make_file("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", "abcd"),
      {"tensor 't'", "[-4,0]"});
  expect_rejected(
      make_file("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", "abcd"),
      {"tensor 't'", "[0]"});
  expect_rejected(make_file("{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", "abcd"),
                  {"tensor 't'", "data_offsets missing"});
}

TEST(SafetensorsCorrupt, OffsetsNotMatchingShapeTimesDtype) {
  expect_rejected(
      make_file("{\"t\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,8]}}", "abcdefgh"),
      {"tensor 't'", "8 bytes", "needs 16"});
}

TEST(SafetensorsCorrupt, OverlappingTensors) {
  expect_rejected(make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                            "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                            std::string(12, 'x')),
                  {"'b'", "[4, 12]", "overlap", "'a'"});
}

TEST(SafetensorsCorrupt, GapsAndTrailingBytes) {
  expect_rejected(make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                            std::string(8, 'x')),
                  {"bytes [0, 4)", "no tensor"});
  expect_rejected(make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                            std::string(12, 'x')),
                  {"bytes [4, 12)", "no tensor"});
}

TEST(SafetensorsCorrupt, MetadataMustMapStringsToStrings) {
  expect_rejected(make_file("{\"__metadata__\":{\"epochs\":5}}", ""),
                  {"__metadata__", "epochs", "5"});
  expect_rejected(make_file("{\"__metadata__\":[]}", ""), {"__metadata__"});
}

TEST(SafetensorsCorrupt, TruncatedFileNamesTheTensor) {
  const std::string good =
      seqpack::serialize_safetensors({{"w", Tensor::from_vector<double>({1, 2, 3, 4}, {2, 2})}});
  expect_rejected(good.substr(0, good.size() - 3), {"tensor 'w'", "[0,32]", "29-byte data buffer"});
  expect_rejected(good.substr(0, 12), {"header length"});
}

TEST(SafetensorsCorrupt, LoadNamesTheFile) {
  TempDir dir;
  const std::string path = dir.file("broken.safetensors");
  write_bytes(path,
              make_file("{\"t\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]}}", "ab"));
  try {
    seqpack::load_safetensors(path);
    FAIL() << "accepted BF16";
  } catch (const std::invalid_argument& e) {  // SafetensorsError is one
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("BF16"), std::string::npos) << e.what();
  }
  try {
    seqpack::load_safetensors(dir.file("missing.safetensors"));
    FAIL() << "opened a missing file";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("missing.safetensors"), std::string::npos) << e.what();
  }
}

TEST(SafetensorsCorrupt, RandomDamageNeverCrashes) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::string good =
      read_file(std::string(SEQPACK_FIXTURES_DIR) + "/safetensors_basic.safetensors");
  std::mt19937_64 rng(seed);
  int rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string f = good;
    const int kind = static_cast<int>(rng() % 3);
    if (kind == 0) {
      f.resize(rng() % f.size());  // truncation
    } else {
      // Flip bytes: in the header (kind 1) or anywhere (kind 2).
      const std::size_t limit = kind == 1 ? std::min<std::size_t>(f.size(), 8 + 528) : f.size();
      for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) {
        f[rng() % limit] = static_cast<char>(rng());
      }
    }
    try {
      auto t = seqpack::parse_safetensors(f);
      for (auto& [name, x] : t) (void)x.to_string();
    } catch (const SafetensorsError&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 1000);
}

// ---------------------------------------------------------------------------
// Atomic writes.

TEST(SafetensorsAtomic, WriteLeavesNoTemporaryFileAndReplacesTheTarget) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  seqpack::save_safetensors(path, {{"x", Tensor::from_vector<float>({1, 2})}});
  seqpack::save_safetensors(path, {{"y", Tensor::from_vector<float>({3})}});
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"model.safetensors"}));
  auto back = seqpack::load_safetensors(path);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back.at("y").to_vector<float>(), (std::vector<float>{3}));
  // Readable by others, not mkstemp's 0600.
  EXPECT_EQ(fs::status(path).permissions() & fs::perms::others_read, fs::perms::others_read);
}

TEST(SafetensorsAtomic, FailedWriteKeepsTheOldFileAndLeavesNoTemporary) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  seqpack::save_safetensors(path, {{"x", Tensor::from_vector<float>({1, 2})}});
  const std::string before = read_file(path);
  // Invalid input fails before any byte is written.
  EXPECT_THROW(
      seqpack::save_safetensors(path, {{"a", Tensor::from_vector<float>({9})}, {"b", Tensor()}}),
      std::invalid_argument);
  EXPECT_THROW(seqpack::save_safetensors(path, {{"__metadata__", Tensor::from_vector<float>({9})}}),
               std::invalid_argument);
  EXPECT_EQ(read_file(path), before);
  // A directory at the path is refused before anything is written (the rule
  // for every output path, tests/test_output_files.cpp); a failed rename's
  // temporary is removed too (the fault matrices of test_model_dir_faults).
  fs::create_directory(dir.file("taken"));
  write_bytes(dir.file("taken/inside"), "x");
  try {
    seqpack::save_safetensors(dir.file("taken"), {{"x", Tensor::from_vector<float>({1})}});
    FAIL() << "renamed over a directory";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'" + dir.file("taken") + "' is a directory"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"model.safetensors", "taken"}));
  EXPECT_EQ(read_file(path), before);
  // A directory that does not exist.
  EXPECT_THROW(seqpack::save_safetensors(dir.file("no/such/dir.safetensors"), {}),
               std::runtime_error);
}
