// Limits on the JSON that seqpack reads (config.json, vocabulary.json,
// safetensors headers, checkpoint metadata, bench workload files). Its own
// formats nest a few levels; a hostile file nested 100,000 levels deep made
// every recursive walk of the parsed value (copy, compare, dump) overflow the
// stack. So the text is checked before it is parsed, and a value shown in a
// message is cut short.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace seqpack {

// Deeper nesting of arrays and objects than this is refused.
inline constexpr int kMaxJsonDepth = 64;

// Throws std::invalid_argument "<what>: JSON nested deeper than 64 levels (at
// byte N)" when `text` opens more than kMaxJsonDepth arrays or objects at once
// (brackets inside strings do not count). Iterative: any text is safe to check.
void check_json_depth(std::string_view text, const std::string& what);

// A JSON value (nlohmann::json, checked by check_json_depth when read) as
// compact text for a message, at most `max_chars` characters ("..." marks a cut).
template <class Json>
std::string json_excerpt(const Json& v, std::size_t max_chars = 80) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > max_chars) s = s.substr(0, max_chars > 3 ? max_chars - 3 : 0) + "...";
  return s;
}

}  // namespace seqpack
