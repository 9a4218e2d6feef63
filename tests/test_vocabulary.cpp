// UTF-8 decoding and the character vocabulary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>

#include "seqpack/vocabulary.h"
#include "test_util.h"

using seqpack::decode_utf8;
using seqpack::encode_utf8;
using seqpack::Vocabulary;

namespace {

using seqpack::testing::expect_invalid;

}  // namespace

TEST(Utf8, DecodesOneToFourByteSequences) {
  // Hand-encoded: 'a' 61, 'é' C3 A9, '€' E2 82 AC, U+1F600 F0 9F 98 80.
  EXPECT_EQ(decode_utf8("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"),
            (std::u32string{U'a', U'\u00E9', U'\u20AC', U'\U0001F600'}));
  EXPECT_EQ(decode_utf8(""), U"");
  EXPECT_EQ(decode_utf8(std::string("a\0b", 3)), (std::u32string{U'a', 0, U'b'}));
  // Boundaries: the largest of each length and U+10FFFF.
  EXPECT_EQ(decode_utf8("\x7F\xDF\xBF\xEF\xBF\xBF\xF4\x8F\xBF\xBF"),
            (std::u32string{0x7F, 0x7FF, 0xFFFF, 0x10FFFF}));
}

TEST(Utf8, EncodeIsTheInverseOfDecode) {
  const std::u32string s = U"Größe: 5 €, naïve 😀 ğ";
  EXPECT_EQ(decode_utf8(encode_utf8(s)), s);
  EXPECT_EQ(encode_utf8(U"\u00E9"), "\xC3\xA9");
  expect_invalid([] { encode_utf8(std::u32string(1, char32_t(0xD800))); },
                 {"U+D800", "code_points[0]"});
  expect_invalid(
      [] {
        encode_utf8(std::u32string{U'a', char32_t(0x110000)});
      },
      {"U+110000", "code_points[1]"});
}

TEST(Utf8, InvalidInputNamesTheByteOffset) {
  expect_invalid([] { decode_utf8("ab\x80", "words.txt line 3"); },
                 {"words.txt line 3", "byte offset 2", "0x80", "continuation"});
  expect_invalid([] { decode_utf8("caf\xC3"); }, {"byte offset 3", "0xC3", "truncated"});
  expect_invalid([] { decode_utf8("x\xC3(y"); }, {"byte offset 1", "offset 2", "0x28"});
  expect_invalid([] { decode_utf8("\xC0\xAF"); }, {"byte offset 0", "0xC0"});  // overlong '/'
  expect_invalid([] { decode_utf8("\xE0\x80\xAF"); }, {"byte offset 0", "overlong"});
  expect_invalid([] { decode_utf8("ok\xED\xA0\x80"); }, {"byte offset 2", "surrogate", "U+D800"});
  expect_invalid([] { decode_utf8("\xF4\x90\x80\x80"); }, {"U+110000"});
  expect_invalid([] { decode_utf8("\xFF"); }, {"0xFF", "cannot start"});
  // Latin-1 text fed as UTF-8, the usual real-world mistake.
  expect_invalid([] { decode_utf8("caf\xE9!", "f.tsv line 9"); },
                 {"f.tsv line 9", "byte offset 3", "0xE9"});
}

// is_valid_utf8 must accept exactly what decode_utf8 accepts: every sequence of
// up to 4 bytes drawn from the bytes where the rules change, then random
// strings, with ASCII runs around them (the 8-byte fast path).
TEST(Utf8, IsValidAgreesWithDecode) {
  const std::vector<unsigned char> edges = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0,
                                            0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xEC,
                                            0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF};
  auto decodes = [](const std::string& s) {
    try {
      decode_utf8(s);
      return true;
    } catch (const std::invalid_argument&) {
      return false;
    }
  };
  int64_t valid = 0, checked = 0;
  auto check = [&](const std::string& s) {
    const bool expected = decodes(s);
    ASSERT_EQ(seqpack::is_valid_utf8(s), expected) << "bytes " << ::testing::PrintToString(s);
    valid += expected;
    ++checked;
  };
  std::vector<std::string> cores = {""};
  for (int len = 1; len <= 4; ++len) {
    std::vector<std::string> next;
    for (const auto& c : cores) {
      if (static_cast<int>(c.size()) != len - 1) continue;
      // Only a lead byte of 0xF0 or more can make the fourth byte matter.
      if (len == 4 && static_cast<unsigned char>(c[0]) < 0xF0) continue;
      for (unsigned char b : edges) next.push_back(c + static_cast<char>(b));
    }
    cores.insert(cores.end(), next.begin(), next.end());
  }
  for (const auto& c : cores) {
    check(c);
    if (c.size() < 4) {
      check("abcdefghij" + c);
      check(c + "klmnopqrs");
    }
  }
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int k = 0; k < 20000; ++k) {
    std::string s(rng() % 24, 'x');
    for (auto& ch : s) {
      const uint64_t r = rng();
      ch = static_cast<char>(r % 3 == 0 ? edges[(r >> 8) % edges.size()] : (r % 3 == 1 ? 'a' : (r >> 16) & 0xFF));
    }
    check(s);
  }
  EXPECT_GT(valid, 1000);  // both outcomes are well represented
  EXPECT_GT(checked - valid, 1000);
}

TEST(Vocabulary, SpecialTokensComeFirst) {
  Vocabulary v;
  EXPECT_EQ(v.size(), 2);
  EXPECT_EQ(Vocabulary::pad_id, 0);
  EXPECT_EQ(Vocabulary::unk_id, 1);
  EXPECT_EQ(v.id(U'a'), Vocabulary::unk_id);
  EXPECT_EQ(v.encode(U"ab"), (std::vector<int64_t>{1, 1}));
}

TEST(Vocabulary, BuildSortsByCodePointIndependentlyOfCorpusOrder) {
  const Vocabulary v = Vocabulary::build({U"été", U"the"});
  // <pad> <unk> e h t é  (é = U+00E9 sorts after ASCII)
  EXPECT_EQ(v.size(), 6);
  EXPECT_EQ(v.code_points(), (std::vector<char32_t>{U'e', U'h', U't', U'\u00E9'}));
  EXPECT_EQ(v.encode(U"thé!"), (std::vector<int64_t>{4, 3, 5, 1}));
  EXPECT_EQ(Vocabulary::build({U"the", U"été"}), v);
  EXPECT_EQ(v.code_point(5), U'\u00E9');
  EXPECT_TRUE(v.contains(U'h'));
  EXPECT_FALSE(v.contains(U'!'));
}

TEST(Vocabulary, MinCountDropsRareCharacters) {
  const Vocabulary v = Vocabulary::build({U"aab", U"ac"}, /*min_count=*/2);
  EXPECT_EQ(v.code_points(), (std::vector<char32_t>{U'a'}));
  EXPECT_EQ(v.encode(U"abc"), (std::vector<int64_t>{2, 1, 1}));
  expect_invalid([] { Vocabulary::build({U"a"}, 0); }, {"min_count = 0"});
}

TEST(Vocabulary, DecodeSkipsPaddingAndMarksUnknown) {
  const Vocabulary v = Vocabulary::build({U"abc"});
  EXPECT_EQ(v.decode({2, 3, 1, 4, 0, 0}), U"ab\uFFFDc");
  EXPECT_EQ(v.decode(v.encode(U"cab")), U"cab");
  EXPECT_EQ(v.encode_utf8_text("c\xC3\xA9"), (std::vector<int64_t>{4, 1}));
  expect_invalid([&] { v.decode({2, 5}); }, {"ids[1] = 5", "[0, 5)"});
  expect_invalid([&] { v.decode({-1}); }, {"ids[0] = -1"});
  expect_invalid([&] { v.code_point(0); }, {"id 0", "<pad>"});
  expect_invalid([&] { v.code_point(1); }, {"id 1", "<unk>"});
  expect_invalid([&] { v.code_point(9); }, {"id 9", "out of range"});
}

TEST(Vocabulary, FromCodePointsRejectsDuplicatesAndNonScalars) {
  expect_invalid(
      [] {
        Vocabulary::from_code_points({U'a', U'b', U'a'});
      },
      {"code_points[2]", "U+0061", "duplicate"});
  expect_invalid([] { Vocabulary::from_code_points({char32_t(0xDC00)}); },
                 {"code_points[0]", "U+DC00"});
}

TEST(Vocabulary, JsonRoundTripAndFile) {
  const Vocabulary v = Vocabulary::build({U"naïve", U"Größe", U"😀"});
  const std::string json = v.to_json();
  EXPECT_NE(json.find("\"<pad>\""), std::string::npos);
  EXPECT_NE(json.find("\"ï\""), std::string::npos) << json;  // UTF-8, readable
  EXPECT_EQ(Vocabulary::from_json(json), v);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("seqpack_vocab_" + std::to_string(::getpid()) + ".json"))
                               .string();
  v.save(path);
  const Vocabulary back = Vocabulary::load(path);
  std::filesystem::remove(path);
  EXPECT_EQ(back, v);
  EXPECT_EQ(back.encode(U"Größe?"), v.encode(U"Größe?"));
  expect_invalid([&] { Vocabulary::load(path); }, {path});
}

TEST(Vocabulary, MalformedJsonIsRejectedNamingTheEntry) {
  const std::string head =
      R"({"format":"seqpack-vocabulary","version":1,"special_tokens":["<pad>","<unk>"],)";
  EXPECT_EQ(Vocabulary::from_json(head + R"("tokens":["a","b"]})").size(), 4);
  expect_invalid([] { Vocabulary::from_json("{", "v.json"); }, {"v.json", "not valid JSON"});
  expect_invalid([] { Vocabulary::from_json(R"({"format":"other"})"); }, {"\"other\""});
  expect_invalid([&] { Vocabulary::from_json(R"({"format":"seqpack-vocabulary","version":2})"); },
                 {"version", "2"});
  expect_invalid(
      [&] {
        Vocabulary::from_json(
            R"({"format":"seqpack-vocabulary","version":1,"special_tokens":["<unk>","<pad>"],"tokens":[]})");
      },
      {"special_tokens"});
  expect_invalid([&] { Vocabulary::from_json(head + R"("tokens":["a","bc"]})"); },
                 {"tokens[1]", "\"bc\"", "one character"});
  expect_invalid([&] { Vocabulary::from_json(head + R"("tokens":["a",7]})"); },
                 {"tokens[1]", "not a string"});
  expect_invalid([&] { Vocabulary::from_json(head + R"("tokens":["a","a"]})"); }, {"duplicate"});
  expect_invalid([&] { Vocabulary::from_json(head + R"("tokens":"ab"})"); }, {"tokens"});
}
