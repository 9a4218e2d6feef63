// Datasets, the default language-identification data, and splitting.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <queue>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>

#include "seqpack/data.h"
#include "seqpack/safetensors.h"
#include "train/regular_file.h"

namespace seqpack {

namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// A line quoted for an error message, cut so a huge line cannot flood the terminal.
std::string quote_line(const std::string& line) {
  constexpr std::size_t kMax = 60;
  return "\"" + (line.size() > kMax ? line.substr(0, kMax) + "..." : line) + "\"";
}

// Sorts in byte order and drops duplicates. Most comparisons of a word list are
// settled by the first 8 bytes, so those are compared as one big-endian integer
// (zero-padded: a shorter prefix sorts first, as in byte order) and the full
// strings only on a tie: several times faster than memcmp on every comparison.
void sort_unique_bytewise(std::vector<std::string_view>& words) {
  struct Keyed {
    uint64_t prefix;
    std::string_view word;
  };
  std::vector<Keyed> keyed;
  keyed.reserve(words.size());
  for (std::string_view w : words) {
    uint64_t prefix = 0;
    for (std::size_t i = 0; i < 8; ++i) {
      prefix = (prefix << 8) | (i < w.size() ? static_cast<unsigned char>(w[i]) : 0u);
    }
    keyed.push_back({prefix, w});
  }
  std::sort(keyed.begin(), keyed.end(), [](const Keyed& a, const Keyed& b) {
    return a.prefix != b.prefix ? a.prefix < b.prefix : a.word < b.word;
  });
  words.clear();
  for (const Keyed& k : keyed) {
    if (words.empty() || words.back() != k.word) words.push_back(k.word);
  }
}

}  // namespace

Rng::Rng(uint64_t seed) : Rng(seed, 0) {}

Rng::Rng(uint64_t seed, uint64_t stream) {
  // Mixing the stream through splitmix64 first keeps (seed, stream) pairs with
  // small differences from producing overlapping sequences.
  uint64_t t = stream;
  uint64_t x = seed ^ splitmix64(t);
  for (uint64_t& s : s_) s = splitmix64(x);
}

uint64_t Rng::next() {
  // xoshiro256** (Blackman and Vigna).
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

uint64_t Rng::below(uint64_t n) {
  if (n == 0) throw std::invalid_argument("Rng::below: n = 0, the range [0, 0) is empty");
  // Rejecting the lowest (2^64 mod n) values leaves a multiple of n, so r % n is unbiased.
  const uint64_t threshold = (0 - n) % n;
  for (;;) {
    const uint64_t r = next();
    if (r >= threshold) return r % n;
  }
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

TextDataset load_tsv(const std::string& path) {
  detail::require_regular_file(path, "TSV file");
  // Read with stdio, not std::getline: getline swallows the std::bad_alloc of
  // a line that does not fit in memory (it sets badbit), and its line has no
  // bound. Here a line longer than kMaxTsvLineBytes is refused after that many
  // bytes, and an allocation that fails is the tool's out-of-memory error.
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> in(std::fopen(path.c_str(), "rb"),
                                                           &std::fclose);
  if (!in) {
    throw std::invalid_argument("cannot open TSV file '" + path + "': " + std::strerror(errno));
  }
  int read_errno = 0;
  // One line into `line` (without its '\n'); false at the end with nothing read.
  const auto next_line = [&](std::string& line, int64_t line_no) {
    line.clear();
    errno = 0;
    int c = getc_unlocked(in.get());
    if (c == EOF) {
      read_errno = errno;
      return false;
    }
    for (; c != EOF && c != '\n'; c = getc_unlocked(in.get())) {
      if (line.size() == kMaxTsvLineBytes) {
        throw std::invalid_argument("'" + path + "' line " + std::to_string(line_no) +
                                    " is longer than " + std::to_string(kMaxTsvLineBytes) +
                                    " bytes, the longest line a TSV file may have");
      }
      line.push_back(static_cast<char>(c));
      errno = 0;
    }
    if (c == EOF) read_errno = errno;
    return true;
  };
  struct Raw {
    std::string label, text;
    std::u32string chars;
  };
  std::vector<Raw> rows;
  TextDataset ds;
  std::string line;
  int64_t line_no = 0;
  while (next_line(line, line_no + 1)) {
    ++line_no;
    // A UTF-8 byte-order mark (as some Windows editors write) is not part of the first label.
    if (line_no == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) {
      ++ds.empty_lines;
      continue;
    }
    const std::string where = "'" + path + "' line " + std::to_string(line_no);
    const std::size_t tab = line.find('\t');
    if (tab == std::string::npos) {
      throw std::invalid_argument(where + ": no tab between label and text in " + quote_line(line));
    }
    Raw r{line.substr(0, tab), line.substr(tab + 1), {}};
    if (r.label.empty())
      throw std::invalid_argument(where + ": empty label in " + quote_line(line));
    if (r.text.empty()) throw std::invalid_argument(where + ": empty text in " + quote_line(line));
    decode_utf8(r.label, where + " (label)");
    r.chars = decode_utf8(r.text, where + " (text)");
    rows.push_back(std::move(r));
  }
  if (std::ferror(in.get())) {
    throw std::invalid_argument("error reading TSV file '" + path + "' after line " +
                                std::to_string(line_no) + ": " +
                                std::strerror(read_errno != 0 ? read_errno : EIO));
  }
  std::set<std::string> names;
  for (const Raw& r : rows) names.insert(r.label);
  ds.labels.assign(names.begin(), names.end());
  std::map<std::string, int64_t> index;
  for (std::size_t i = 0; i < ds.labels.size(); ++i) index[ds.labels[i]] = static_cast<int64_t>(i);
  ds.examples.reserve(rows.size());
  for (Raw& r : rows)
    ds.examples.push_back({std::move(r.text), std::move(r.chars), index[r.label]});
  return ds;
}

DatasetSplit split_dataset(const TextDataset& dataset, double train_fraction, double val_fraction,
                           uint64_t seed) {
  if (!(train_fraction >= 0 && val_fraction >= 0 && train_fraction + val_fraction <= 1.0 + 1e-12)) {
    throw std::invalid_argument(
        "split_dataset: train_fraction = " + std::to_string(train_fraction) +
        " and val_fraction = " + std::to_string(val_fraction) +
        " must be non-negative with a sum of at most 1");
  }
  const int64_t num_labels = static_cast<int64_t>(dataset.labels.size());
  std::vector<std::vector<std::size_t>> by_label(static_cast<std::size_t>(num_labels));
  for (std::size_t i = 0; i < dataset.examples.size(); ++i) {
    const int64_t l = dataset.examples[i].label;
    if (l < 0 || l >= num_labels) {
      throw std::invalid_argument("split_dataset: examples[" + std::to_string(i) +
                                  "].label = " + std::to_string(l) + " is out of range [0, " +
                                  std::to_string(num_labels) + ")");
    }
    by_label[static_cast<std::size_t>(l)].push_back(i);
  }
  DatasetSplit split;
  split.labels = dataset.labels;
  for (std::size_t l = 0; l < by_label.size(); ++l) {
    std::vector<std::size_t>& idx = by_label[l];
    Rng rng(seed, l);
    rng.shuffle(idx);
    const std::size_t n = idx.size();
    const std::size_t n_train = std::min(
        n, static_cast<std::size_t>(std::llround(static_cast<double>(n) * train_fraction)));
    const std::size_t n_val = std::min(
        n - n_train, static_cast<std::size_t>(std::llround(static_cast<double>(n) * val_fraction)));
    for (std::size_t k = 0; k < n; ++k) {
      auto& part = k < n_train ? split.train : (k < n_train + n_val ? split.val : split.test);
      part.push_back(dataset.examples[idx[k]]);
    }
  }
  // Streams past the label streams, so the final order does not repeat any of them.
  Rng(seed, 1'000'001).shuffle(split.train);
  Rng(seed, 1'000'002).shuffle(split.val);
  Rng(seed, 1'000'003).shuffle(split.test);
  return split;
}

const std::vector<WordList>& default_word_lists() {
  static const std::vector<WordList> lists = {
      {"english", "american-english", "wamerican"},
      {"french", "french", "wfrench"},
      {"german", "ngerman", "wngerman"},
      {"spanish", "spanish", "wspanish"},
      {"italian", "italian", "witalian"},
      {"portuguese", "portuguese", "wportuguese"},
      {"dutch", "dutch", "wdutch"},
  };
  return lists;
}

DatasetSplit load_language_id(const LanguageIdOptions& options) {
  if (options.lists.empty()) throw std::invalid_argument("load_language_id: no word lists given");
  if (options.words_per_language < 1) {
    throw std::invalid_argument("load_language_id: words_per_language = " +
                                std::to_string(options.words_per_language) + " must be positive");
  }
  // One sorted, duplicate-free vector per list: duplicates inside a list count
  // once, and byte order makes the sample independent of the file's
  // (locale-dependent) order. The words are views into the file contents, read
  // whole: the seven lists hold 1.85M words, and a std::string per word (and a
  // hash map over all of them, as this once used) made startup take seconds.
  std::vector<std::string> contents(options.lists.size());
  std::vector<std::vector<std::string_view>> words(options.lists.size());
  for (std::size_t l = 0; l < options.lists.size(); ++l) {
    const WordList& wl = options.lists[l];
    const std::string path = options.dict_dir + "/" + wl.file;
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      throw std::invalid_argument("word list '" + path + "' (" + wl.language +
                                  ") is missing: install the Debian package " + wl.package +
                                  " (apt-get install " + wl.package + ")");
    }
    std::string& text = contents[l];
    in.seekg(0, std::ios::end);
    const std::streamoff size = in.tellg();
    in.seekg(0, std::ios::beg);
    if (size > 0) {
      text.resize(static_cast<std::size_t>(size));
      in.read(text.data(), size);
      text.resize(static_cast<std::size_t>(in.gcount()));
    } else {  // not seekable (a pipe): read it as a stream
      in.clear();
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    if (in.bad()) throw std::invalid_argument("error reading word list '" + path + "'");
    // Newlines are ASCII, so the file is valid UTF-8 exactly when every line
    // is; only a bad file is walked line by line, to name the line.
    const bool valid = is_valid_utf8(text);
    std::vector<std::string_view>& list = words[l];
    int64_t line_no = 0;
    for (std::size_t pos = 0; pos < text.size();) {
      std::size_t eol = text.find('\n', pos);
      if (eol == std::string::npos) eol = text.size();
      std::string_view line(text.data() + pos, eol - pos);
      pos = eol + 1;
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty()) continue;
      if (!valid && !is_valid_utf8(line)) {
        decode_utf8(line,
                    "'" + path + "' line " + std::to_string(line_no));  // throws, naming the byte
      }
      // Apostrophes mark possessives and elisions ("dog's", "l'eau"), which
      // identify the language by punctuation rather than by its letters.
      if (line.find('\'') != std::string_view::npos ||
          line.find("\u2019") != std::string_view::npos) {
        continue;
      }
      list.push_back(line);
    }
    sort_unique_bytewise(list);
  }
  // A word in several lists ("art", "bank") has no single right answer. The
  // lists are sorted, so one k-way merge finds every word that is in more than
  // one of them.
  std::vector<std::vector<char>> shared(words.size());
  for (std::size_t l = 0; l < words.size(); ++l) shared[l].assign(words[l].size(), 0);
  {
    struct Head {
      std::string_view word;
      std::size_t list, index;
      bool operator>(const Head& o) const { return word > o.word; }
    };
    std::priority_queue<Head, std::vector<Head>, std::greater<Head>> heads;
    for (std::size_t l = 0; l < words.size(); ++l) {
      if (!words[l].empty()) heads.push({words[l][0], l, 0});
    }
    std::vector<Head> group;
    while (!heads.empty()) {
      group.clear();
      const std::string_view w = heads.top().word;
      while (!heads.empty() && heads.top().word == w) {
        group.push_back(heads.top());
        heads.pop();
      }
      for (const Head& h : group) {
        if (group.size() > 1) shared[h.list][h.index] = 1;
        if (h.index + 1 < words[h.list].size()) heads.push({words[h.list][h.index + 1], h.list, h.index + 1});
      }
    }
  }
  TextDataset ds;
  for (const WordList& wl : options.lists) ds.labels.push_back(wl.language);
  const std::size_t k = static_cast<std::size_t>(options.words_per_language);
  for (std::size_t l = 0; l < words.size(); ++l) {
    std::vector<std::string_view> usable;
    for (std::size_t i = 0; i < words[l].size(); ++i) {
      if (!shared[l][i]) usable.push_back(words[l][i]);
    }
    if (usable.size() < k) {
      throw std::invalid_argument(
          "word list '" + options.dict_dir + "/" + options.lists[l].file + "' has only " +
          std::to_string(usable.size()) + " usable words (after dropping apostrophes and words " +
          "shared with other lists), fewer than words_per_language = " + std::to_string(k));
    }
    // Partial Fisher-Yates: the first k positions are a uniform sample.
    Rng rng(options.seed, 100 + l);
    for (std::size_t i = 0; i < k; ++i) {
      std::swap(usable[i], usable[i + static_cast<std::size_t>(rng.below(usable.size() - i))]);
    }
    for (std::size_t i = 0; i < k; ++i) {
      ds.examples.push_back({std::string(usable[i]), decode_utf8(usable[i]), static_cast<int64_t>(l)});
    }
  }
  return split_dataset(ds, options.train_fraction, options.val_fraction, options.seed);
}

void export_split(const DatasetSplit& split, const std::string& dir) {
  // Every output checked before the first is written: a refused path (a device,
  // a FIFO, a link) leaves no partial export behind.
  for (const char* name : {"train.tsv", "val.tsv", "test.tsv", "labels.txt"}) {
    detail::require_output_path(dir + "/" + name);
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create directory '" + dir + "': " + ec.message());
  const auto tsv = [](const std::vector<Example>& part) {
    std::string out;
    for (const Example& e : part) {
      out += std::to_string(e.label);
      out += '\t';
      out += e.text;
      out += '\n';
    }
    return out;
  };
  const std::string train = tsv(split.train), val = tsv(split.val), test = tsv(split.test);
  std::string labels;
  for (const auto& l : split.labels) labels += l + "\n";
  // The four are one split: all written before any replaces an older one, so a
  // full disk never leaves a new train.tsv beside an old val.tsv.
  write_files_atomically({{dir + "/train.tsv", train},
                          {dir + "/val.tsv", val},
                          {dir + "/test.tsv", test},
                          {dir + "/labels.txt", labels}});
}

}  // namespace seqpack
