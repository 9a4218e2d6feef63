// Characters as tokens: strict UTF-8 decoding to Unicode code points, and a
// character vocabulary with PyTorch-style special tokens.
//
//   std::u32string w = decode_utf8("été");                // U+00E9 U+0074 U+00E9
//   Vocabulary vocab = Vocabulary::build({w, U"the"});     // <pad> <unk> e h t é
//   std::vector<int64_t> ids = vocab.encode(U"thé!");      // {4, 3, 5, 1}: '!' is <unk>
//   vocab.save("model/vocabulary.json");
//
// Ids: <pad> = 0 (use it as Embedding's padding_idx), <unk> = 1, then the
// corpus's code points in increasing code point order, so a vocabulary depends
// only on the set of characters kept, never on the order of the corpus.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace seqpack {

// Strict UTF-8 -> code points. Rejects truncated and stray continuation bytes,
// overlong forms, surrogates (U+D800..U+DFFF) and values above U+10FFFF with
// std::invalid_argument: "<context>: invalid UTF-8 at byte offset 3 (byte 0xC3): ...".
// `context` (e.g. "words.tsv line 12") starts the message when not empty.
std::u32string decode_utf8(std::string_view bytes, std::string_view context = {});
// True exactly when decode_utf8(bytes) would not throw; allocates nothing, so a
// whole file can be checked at once (call decode_utf8 to get the message).
bool is_valid_utf8(std::string_view bytes);
// Code points -> UTF-8; throws std::invalid_argument for a surrogate or a value
// above U+10FFFF, naming it.
std::string encode_utf8(std::u32string_view code_points);

class Vocabulary {
 public:
  static constexpr int64_t pad_id = 0;
  static constexpr int64_t unk_id = 1;
  static constexpr const char* pad_token = "<pad>";
  static constexpr const char* unk_token = "<unk>";

  // Only the two special tokens.
  Vocabulary();
  // Every code point occurring at least `min_count` times in `corpus` (>= 1).
  static Vocabulary build(const std::vector<std::u32string>& corpus, int64_t min_count = 1);
  // Exactly these code points, in this order, after the specials (duplicates throw).
  static Vocabulary from_code_points(const std::vector<char32_t>& code_points);

  // Number of ids including the two specials.
  int64_t size() const { return static_cast<int64_t>(code_points_.size()) + 2; }
  bool contains(char32_t c) const { return index_.count(c) != 0; }
  // The id of `c`, unk_id when unknown.
  int64_t id(char32_t c) const;
  // The code point of a regular id; throws std::invalid_argument for the
  // specials and ids out of [0, size()), naming the id.
  char32_t code_point(int64_t id) const;
  // Regular code points in id order (id = index + 2).
  const std::vector<char32_t>& code_points() const { return code_points_; }

  std::vector<int64_t> encode(std::u32string_view text) const;
  // Convenience: decode_utf8 then encode.
  std::vector<int64_t> encode_utf8_text(std::string_view utf8) const;
  // Ids -> text: <pad> ids are skipped, <unk> becomes U+FFFD (the replacement
  // character); an id out of range throws, naming it.
  std::u32string decode(const std::vector<int64_t>& ids) const;

  // JSON: {"format": "seqpack-vocabulary", "version": 1,
  //        "special_tokens": ["<pad>", "<unk>"], "tokens": ["a", "b", ...]}
  // where tokens[i] (UTF-8, one code point each) has id i + 2.
  std::string to_json() const;
  // Throws std::invalid_argument naming the offending entry; `source` names
  // the input in messages.
  static Vocabulary from_json(std::string_view json, const std::string& source = "<memory>");
  // Atomic write (see write_file_atomically) / read of the JSON form.
  void save(const std::string& path) const;
  static Vocabulary load(const std::string& path);

  bool operator==(const Vocabulary& other) const { return code_points_ == other.code_points_; }

 private:
  std::vector<char32_t> code_points_;
  std::unordered_map<char32_t, int64_t> index_;
};

}  // namespace seqpack
