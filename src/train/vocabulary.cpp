#include "seqpack/vocabulary.h"

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "seqpack/json_limits.h"
#include "seqpack/safetensors.h"
#include "train/regular_file.h"

namespace seqpack {

namespace {

std::string hex_byte(unsigned char b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", b);
  return buf;
}

std::string code_point_str(char32_t c) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "U+%04X", static_cast<unsigned>(c));
  return buf;
}

}  // namespace

std::u32string decode_utf8(std::string_view bytes, std::string_view context) {
  std::u32string out;
  out.reserve(bytes.size());
  const std::size_t n = bytes.size();
  std::size_t i = 0;
  auto fail = [&](std::size_t at, const std::string& why) {
    std::string msg;
    if (!context.empty()) msg = std::string(context) + ": ";
    msg += "invalid UTF-8 at byte offset " + std::to_string(at) + " (byte " +
           hex_byte(static_cast<unsigned char>(bytes[at])) + "): " + why;
    throw std::invalid_argument(msg);
  };
  while (i < n) {
    const unsigned char b0 = static_cast<unsigned char>(bytes[i]);
    if (b0 < 0x80) {
      out.push_back(b0);
      ++i;
      continue;
    }
    // Initialised although every branch below sets them or throws: `fail` is a
    // lambda the compiler does not know never returns (clang -Wsometimes-uninitialized).
    int extra = 0;
    char32_t cp = 0;
    char32_t min = 0;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      extra = 1, cp = b0 & 0x1F, min = 0x80;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      extra = 2, cp = b0 & 0x0F, min = 0x800;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      extra = 3, cp = b0 & 0x07, min = 0x10000;
    } else if (b0 >= 0x80 && b0 <= 0xBF) {
      fail(i, "unexpected continuation byte");
    } else {
      // 0xC0, 0xC1 only start overlong forms; 0xF5..0xFF start values above U+10FFFF.
      fail(i, "byte cannot start a UTF-8 sequence");
    }
    if (i + static_cast<std::size_t>(extra) >= n) {
      fail(i, "truncated sequence: needs " + std::to_string(extra) + " continuation byte(s)");
    }
    for (int k = 1; k <= extra; ++k) {
      const unsigned char b = static_cast<unsigned char>(bytes[i + static_cast<std::size_t>(k)]);
      if ((b & 0xC0) != 0x80) {
        fail(i, "expected a continuation byte at offset " + std::to_string(i + k) + ", got " +
                    hex_byte(b));
      }
      cp = (cp << 6) | (b & 0x3F);
    }
    if (cp < min) fail(i, "overlong encoding of " + code_point_str(cp));
    if (cp >= 0xD800 && cp <= 0xDFFF) fail(i, "encodes the surrogate " + code_point_str(cp));
    if (cp > 0x10FFFF) fail(i, "encodes " + code_point_str(cp) + ", above U+10FFFF");
    out.push_back(cp);
    i += static_cast<std::size_t>(extra) + 1;
  }
  return out;
}

bool is_valid_utf8(std::string_view bytes) {
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  std::size_t i = 0;
  while (i < n) {
    // Word lists are mostly ASCII: skip 8 bytes at a time while no high bit is set.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    const unsigned char b0 = s[i];
    if (b0 < 0x80) {
      ++i;
      continue;
    }
    // The rules of decode_utf8: lead byte ranges, continuation bytes, then the
    // overlong, surrogate and U+10FFFF limits, checked on the second byte.
    std::size_t extra;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      extra = 1;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      extra = 2;
      if (b0 == 0xE0) lo = 0xA0;  // below: overlong
      if (b0 == 0xED) hi = 0x9F;  // above: surrogates
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      extra = 3;
      if (b0 == 0xF0) lo = 0x90;  // below: overlong
      if (b0 == 0xF4) hi = 0x8F;  // above: past U+10FFFF
    } else {
      return false;
    }
    if (i + extra >= n) return false;
    if (s[i + 1] < lo || s[i + 1] > hi) return false;
    for (std::size_t k = 2; k <= extra; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
    }
    i += extra + 1;
  }
  return true;
}

std::string encode_utf8(std::u32string_view code_points) {
  std::string out;
  out.reserve(code_points.size());
  for (std::size_t i = 0; i < code_points.size(); ++i) {
    const char32_t c = code_points[i];
    if ((c >= 0xD800 && c <= 0xDFFF) || c > 0x10FFFF) {
      throw std::invalid_argument("encode_utf8: code_points[" + std::to_string(i) +
                                  "] = " + code_point_str(c) + " is not a Unicode scalar value");
    }
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (c >> 12)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (c >> 18)));
      out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

Vocabulary::Vocabulary() = default;

Vocabulary Vocabulary::from_code_points(const std::vector<char32_t>& code_points) {
  Vocabulary v;
  for (std::size_t i = 0; i < code_points.size(); ++i) {
    const char32_t c = code_points[i];
    if ((c >= 0xD800 && c <= 0xDFFF) || c > 0x10FFFF) {
      throw std::invalid_argument("Vocabulary: code_points[" + std::to_string(i) +
                                  "] = " + code_point_str(c) + " is not a Unicode scalar value");
    }
    if (!v.index_.emplace(c, static_cast<int64_t>(i) + 2).second) {
      throw std::invalid_argument("Vocabulary: code_points[" + std::to_string(i) +
                                  "] = " + code_point_str(c) + " is a duplicate");
    }
    v.code_points_.push_back(c);
  }
  return v;
}

Vocabulary Vocabulary::build(const std::vector<std::u32string>& corpus, int64_t min_count) {
  if (min_count < 1) {
    throw std::invalid_argument("Vocabulary::build: min_count = " + std::to_string(min_count) +
                                " must be at least 1");
  }
  // std::map iterates in code point order, which is what makes the ids
  // independent of the corpus order.
  std::map<char32_t, int64_t> counts;
  for (const auto& text : corpus) {
    for (char32_t c : text) ++counts[c];
  }
  std::vector<char32_t> kept;
  for (const auto& [c, n] : counts) {
    if (n >= min_count) kept.push_back(c);
  }
  return from_code_points(kept);
}

int64_t Vocabulary::id(char32_t c) const {
  const auto it = index_.find(c);
  return it == index_.end() ? unk_id : it->second;
}

char32_t Vocabulary::code_point(int64_t id) const {
  if (id == pad_id || id == unk_id) {
    throw std::invalid_argument("Vocabulary::code_point: id " + std::to_string(id) + " is " +
                                (id == pad_id ? pad_token : unk_token) + ", not a character");
  }
  if (id < 0 || id >= size()) {
    throw std::invalid_argument("Vocabulary::code_point: id " + std::to_string(id) +
                                " is out of range [0, " + std::to_string(size()) + ")");
  }
  return code_points_[static_cast<std::size_t>(id - 2)];
}

std::vector<int64_t> Vocabulary::encode(std::u32string_view text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (char32_t c : text) ids.push_back(id(c));
  return ids;
}

std::vector<int64_t> Vocabulary::encode_utf8_text(std::string_view utf8) const {
  return encode(decode_utf8(utf8));
}

std::u32string Vocabulary::decode(const std::vector<int64_t>& ids) const {
  std::u32string out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    if (id < 0 || id >= size()) {
      throw std::invalid_argument("Vocabulary::decode: ids[" + std::to_string(i) +
                                  "] = " + std::to_string(id) + " is out of range [0, " +
                                  std::to_string(size()) + ")");
    }
    if (id == pad_id) continue;
    out.push_back(id == unk_id ? U'\uFFFD' : code_points_[static_cast<std::size_t>(id - 2)]);
  }
  return out;
}

std::string Vocabulary::to_json() const {
  nlohmann::ordered_json j;
  j["format"] = "seqpack-vocabulary";
  j["version"] = 1;
  j["special_tokens"] = {pad_token, unk_token};
  nlohmann::ordered_json tokens = nlohmann::ordered_json::array();
  for (char32_t c : code_points_) tokens.push_back(encode_utf8(std::u32string_view(&c, 1)));
  j["tokens"] = std::move(tokens);
  return j.dump(1) + "\n";
}

namespace {
// A JSON value for a message, cut short: a hostile file must not make a huge one.
std::string shown(const nlohmann::json& v) { return json_excerpt(v); }
}  // namespace

Vocabulary Vocabulary::from_json(std::string_view json, const std::string& source) {
  const auto fail = [&](const std::string& what) -> void {
    throw std::invalid_argument("vocabulary " + source + ": " + what);
  };
  check_json_depth(json, "vocabulary " + source);
  const nlohmann::json j = nlohmann::json::parse(json.begin(), json.end(), nullptr,
                                                 /*allow_exceptions=*/false);
  if (j.is_discarded()) fail("not valid JSON");
  if (!j.is_object()) fail("expected a JSON object");
  if (!j.contains("format") || j["format"] != "seqpack-vocabulary") {
    fail("\"format\" is " + (j.contains("format") ? shown(j["format"]) : std::string("missing")) +
         ", expected \"seqpack-vocabulary\"");
  }
  // An integer 1: 1.0 and true are not versions.
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"] != 1) {
    fail("\"version\" is " +
         (j.contains("version") ? shown(j["version"]) : std::string("missing")) + ", expected 1");
  }
  const nlohmann::json expected_specials = {pad_token, unk_token};
  if (!j.contains("special_tokens") || j["special_tokens"] != expected_specials) {
    fail("\"special_tokens\" is " +
         (j.contains("special_tokens") ? shown(j["special_tokens"]) : std::string("missing")) +
         ", expected [\"<pad>\",\"<unk>\"]");
  }
  if (!j.contains("tokens") || !j["tokens"].is_array()) fail("\"tokens\" is not an array");
  std::vector<char32_t> cps;
  const auto& tokens = j["tokens"];
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const auto where = [&] { return "tokens[" + std::to_string(i) + "] = " + shown(tokens[i]); };
    if (!tokens[i].is_string()) fail(where() + " is not a string");
    const std::u32string cp = decode_utf8(tokens[i].get_ref<const std::string&>(),
                                          "vocabulary " + source + " " + where());
    if (cp.size() != 1) fail(where() + " is not exactly one character");
    cps.push_back(cp[0]);
  }
  try {
    return from_code_points(cps);
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  return {};
}

void Vocabulary::save(const std::string& path) const { write_file_atomically(path, to_json()); }

Vocabulary Vocabulary::load(const std::string& path) {
  // Only a regular file: a directory, /dev/zero or a FIFO is refused by name.
  return from_json(detail::read_regular_file(path, "vocabulary file"), "'" + path + "'");
}

}  // namespace seqpack
