// Every rejected input of the file formats and data loaders (safetensors, TSV
// datasets, Debian word lists, UTF-8, vocabularies), with the message it gives:
// the tests behind the table in docs/errors.md.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "seqpack/data.h"
#include "seqpack/safetensors.h"
#include "seqpack/vocabulary.h"

namespace seqpack {
namespace {

namespace fs = std::filesystem;

#define EXPECT_REJECTS_AS(type, expr, needle)                                               \
  do {                                                                                      \
    try {                                                                                   \
      (void)(expr);                                                                         \
      ADD_FAILURE() << #expr << " did not throw " #type;                                    \
    } catch (const type& e_) {                                                              \
      EXPECT_NE(std::string(e_.what()).find(needle), std::string::npos)                     \
          << "message '" << e_.what() << "' does not contain '" << (needle) << "'";         \
    }                                                                                       \
  } while (0)
#define EXPECT_REJECTS(expr, needle) EXPECT_REJECTS_AS(std::invalid_argument, expr, needle)
#define EXPECT_BAD_FILE(expr, needle) EXPECT_REJECTS_AS(SafetensorsError, expr, needle)

// A safetensors file: 8-byte little-endian length, header, buffer.
std::string st(const std::string& header, const std::string& buffer = "") {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + header + buffer;
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("seqpack_errors_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                                         "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name, const std::string& bytes) const {
    const fs::path p = path_ / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

// ---------------------------------------------------------------------------
// safetensors

TEST(ErrorsSafetensors, FileShorterThanTheLengthField) {
  EXPECT_BAD_FILE(parse_safetensors(std::string("\x05\0\0", 3)),
                  "file is 3 bytes, too short for the 8-byte header length");
}

TEST(ErrorsSafetensors, HeaderLengthHostileOrPastTheEnd) {
  std::string huge(8, '\xff');
  EXPECT_BAD_FILE(parse_safetensors(huge), "header length 18446744073709551615 is larger than the limit");
  std::string past = st("{}");
  past[0] = 40;
  EXPECT_BAD_FILE(parse_safetensors(past), "header length 40 runs past the end of the 10-byte file");
}

TEST(ErrorsSafetensors, HeaderNotAJsonObject) {
  EXPECT_BAD_FILE(parse_safetensors(st("{nope")), "header is not valid JSON");
  EXPECT_BAD_FILE(parse_safetensors(st("[1]")), "header is JSON array, expected an object");
}

TEST(ErrorsSafetensors, Metadata) {
  EXPECT_BAD_FILE(parse_safetensors(st(R"({"__metadata__": 3})")), "__metadata__ is not an object");
  EXPECT_BAD_FILE(parse_safetensors(st(R"({"__metadata__": {"k": 1}})")),
                  "__metadata__ value of 'k' is 1, expected a string");
}

TEST(ErrorsSafetensors, TensorEntryDtype) {
  EXPECT_BAD_FILE(parse_safetensors(st(R"({"w": 5})")), "tensor 'w' is 5, expected an object");
  EXPECT_BAD_FILE(parse_safetensors(st(R"({"w": {"shape": [], "data_offsets": [0, 0]}})")),
                  "tensor 'w' has no string dtype");
  EXPECT_BAD_FILE(parse_safetensors(st(R"({"w": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}})", "ab")),
                  "tensor 'w' has dtype 'F16', which seqpack does not support (F32, F64, I64)");
}

TEST(ErrorsSafetensors, TensorEntryShape) {
  EXPECT_BAD_FILE(parse_safetensors(st(R"({"w": {"dtype": "F32", "data_offsets": [0, 0]}})")),
                  "tensor 'w' has no shape array");
  EXPECT_BAD_FILE(parse_safetensors(st(R"({"w": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 0]}})")),
                  "tensor 'w' has shape [2,-1] with invalid size -1");
  EXPECT_BAD_FILE(
      parse_safetensors(st(R"({"w": {"dtype": "F64", "shape": [4611686018427387904, 4], "data_offsets": [0, 0]}})")),
      "whose byte size overflows 64 bits");
}

TEST(ErrorsSafetensors, TensorEntryDataOffsets) {
  EXPECT_BAD_FILE(parse_safetensors(st(R"({"w": {"dtype": "F32", "shape": [1]}})", "abcd")),
                  "tensor 'w' has data_offsets missing");
  EXPECT_BAD_FILE(parse_safetensors(st(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}})", "abcd")),
                  "tensor 'w' has data_offsets [0,8] outside the 4-byte data buffer");
  EXPECT_BAD_FILE(parse_safetensors(st(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", "abcd")),
                  "outside the 4-byte data buffer");
  EXPECT_BAD_FILE(parse_safetensors(st(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", "abcd")),
                  "tensor 'w' has data_offsets [0,4] spanning 4 bytes but shape [2] F32 needs 8");
}

TEST(ErrorsSafetensors, TensorsOverlapOrLeaveGaps) {
  const std::string two = R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                             "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}})";
  EXPECT_BAD_FILE(parse_safetensors(st(two, "abcdef")), "tensor 'b' data_offsets [2, 6] overlap tensor 'a' [0, 4]");
  const std::string gap = R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})";
  EXPECT_BAD_FILE(parse_safetensors(st(gap, "abcdefgh")), "bytes [0, 4) of the data buffer belong to no tensor");
  const std::string tail = R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
  EXPECT_BAD_FILE(parse_safetensors(st(tail, "abcdefgh")), "bytes [4, 8) of the data buffer belong to no tensor");
}

TEST(ErrorsSafetensors, MissingFileAndBadSaves) {
  TempDir dir;
  EXPECT_REJECTS(load_safetensors(dir.path() + "/nope.safetensors"), "cannot open safetensors file '");
  const std::string bad = dir.file("bad.safetensors", "xy");
  EXPECT_BAD_FILE(load_safetensors(bad), "safetensors '" + bad + "': file is 2 bytes");
  const Tensor t = Tensor::zeros({1}, DType::f32);
  EXPECT_REJECTS(save_safetensors(dir.path() + "/a.safetensors", {{"__metadata__", t}}),
                 "tensor name '__metadata__' is reserved");
  EXPECT_REJECTS(save_safetensors(dir.path() + "/a.safetensors", {{"w", Tensor()}}), "tensor 'w' is undefined");
  EXPECT_REJECTS_AS(std::runtime_error, save_safetensors(dir.path() + "/no/such/dir/a.safetensors", {{"w", t}}),
                    "cannot create a temporary file in '");
}

// ---------------------------------------------------------------------------
// TSV datasets and word lists

TEST(ErrorsTsv, MissingFile) {
  EXPECT_REJECTS(load_tsv("/nonexistent/data.tsv"), "cannot open TSV file '/nonexistent/data.tsv'");
}

TEST(ErrorsTsv, MalformedLinesNameTheLine) {
  TempDir dir;
  const std::string no_tab = dir.file("a.tsv", "en\tcat\n\nfr chat\n");
  EXPECT_REJECTS(load_tsv(no_tab), "line 3: no tab between label and text in \"fr chat\"");
  EXPECT_REJECTS(load_tsv(dir.file("b.tsv", "en\tcat\n\tchat\n")), "line 2: empty label");
  EXPECT_REJECTS(load_tsv(dir.file("c.tsv", "en\t\n")), "line 1: empty text");
  EXPECT_REJECTS(load_tsv(dir.file("d.tsv", "en\tok\nfr\tch\xC3(t\n")),
                 "line 2 (text): invalid UTF-8 at byte offset 2 (byte 0xC3)");
}

TEST(ErrorsTsv, SplitFractions) {
  TextDataset ds;
  EXPECT_REJECTS(split_dataset(ds, 0.8, 0.3, 1), "train_fraction = 0.800000 and val_fraction = 0.300000");
  EXPECT_REJECTS(split_dataset(ds, -0.1, 0.1, 1), "must be non-negative with a sum of at most 1");
}

TEST(ErrorsTsv, WordListMissingOrTooSmall) {
  TempDir dir;
  LanguageIdOptions o;
  o.dict_dir = dir.path();
  o.lists = {{"english", "american-english", "wamerican"}};
  EXPECT_REJECTS(load_language_id(o), "is missing: install the Debian package wamerican");
  dir.file("american-english", "cat\ndog\n");
  o.words_per_language = 5;
  EXPECT_REJECTS(load_language_id(o), "has only 2 usable words");
  o.words_per_language = 0;
  EXPECT_REJECTS(load_language_id(o), "words_per_language = 0 must be positive");
}

// ---------------------------------------------------------------------------
// UTF-8 and vocabularies

TEST(ErrorsUtf8, EveryKindOfInvalidSequence) {
  EXPECT_REJECTS(decode_utf8("a\x80"), "invalid UTF-8 at byte offset 1 (byte 0x80): unexpected continuation byte");
  EXPECT_REJECTS(decode_utf8("\xC0\xAF"), "byte cannot start a UTF-8 sequence");
  EXPECT_REJECTS(decode_utf8("\xE2\x82"), "truncated sequence: needs 2 continuation byte(s)");
  EXPECT_REJECTS(decode_utf8("\xC3(x"), "expected a continuation byte at offset 1, got 0x28");
  EXPECT_REJECTS(decode_utf8("\xE0\x80\xAF"), "overlong encoding of U+002F");
  EXPECT_REJECTS(decode_utf8("\xED\xA0\x80"), "encodes the surrogate U+D800");
  EXPECT_REJECTS(decode_utf8("\xF4\x90\x80\x80"), "encodes U+110000, above U+10FFFF");
  EXPECT_REJECTS(decode_utf8("\xFF", "words.tsv line 12"), "words.tsv line 12: invalid UTF-8");
  EXPECT_REJECTS(encode_utf8(std::u32string(1, char32_t{0xD800})), "code_points[0] = U+D800 is not a Unicode scalar value");
}

TEST(ErrorsVocabulary, CodePointsAndIds) {
  EXPECT_REJECTS(Vocabulary::from_code_points({U'a', U'a'}), "code_points[1] = U+0061 is a duplicate");
  EXPECT_REJECTS(Vocabulary::from_code_points({char32_t{0x110000}}), "U+110000 is not a Unicode scalar value");
  EXPECT_REJECTS(Vocabulary::build({U"ab"}, 0), "min_count = 0 must be at least 1");
  const Vocabulary v = Vocabulary::build({U"ab"});
  EXPECT_REJECTS(v.code_point(0), "id 0 is <pad>, not a character");
  EXPECT_REJECTS(v.code_point(1), "id 1 is <unk>, not a character");
  EXPECT_REJECTS(v.code_point(4), "id 4 is out of range [0, 4)");
  EXPECT_REJECTS(v.decode({2, -1}), "ids[1] = -1 is out of range [0, 4)");
}

TEST(ErrorsVocabulary, JsonFile) {
  auto json = [](const std::string& tokens) {
    return R"({"format": "seqpack-vocabulary", "version": 1, "special_tokens": ["<pad>", "<unk>"], "tokens": )" +
           tokens + "}";
  };
  EXPECT_REJECTS(Vocabulary::from_json("{", "v.json"), "vocabulary v.json: not valid JSON");
  EXPECT_REJECTS(Vocabulary::from_json("[]"), "expected a JSON object");
  EXPECT_REJECTS(Vocabulary::from_json(R"({"format": "x"})"), "\"format\" is \"x\", expected \"seqpack-vocabulary\"");
  EXPECT_REJECTS(Vocabulary::from_json(R"({"format": "seqpack-vocabulary", "version": 2})"),
                 "\"version\" is 2, expected 1");
  EXPECT_REJECTS(Vocabulary::from_json(R"({"format": "seqpack-vocabulary", "version": 1, "special_tokens": []})"),
                 "\"special_tokens\" is [], expected");
  EXPECT_REJECTS(Vocabulary::from_json(json("{}")), "\"tokens\" is not an array");
  EXPECT_REJECTS(Vocabulary::from_json(json("[\"a\", 3]")), "tokens[1] = 3 is not a string");
  EXPECT_REJECTS(Vocabulary::from_json(json("[\"ab\"]")), "tokens[0] = \"ab\" is not exactly one character");
  EXPECT_REJECTS(Vocabulary::from_json(json("[\"a\", \"a\"]")), "is a duplicate");
  EXPECT_REJECTS(Vocabulary::load("/nonexistent/vocabulary.json"), "cannot open vocabulary file '/nonexistent/vocabulary.json'");
}

}  // namespace
}  // namespace seqpack
