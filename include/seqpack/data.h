// Data for training on variable-length sequences: labelled text datasets, the
// default language-identification dataset built from Debian's word lists, a
// length-bucketing batch sampler with padding statistics (by count or by
// tokens, and split among processes with balanced tokens), and two helpers for
// padded batches (each sequence's last valid step; per-sequence reversal).
//
//   DatasetSplit split = load_language_id();              // 7 x 20,000 words, 80/10/10
//   Vocabulary vocab = Vocabulary::build(texts_of(split.train));
//   BucketingSampler sampler(lengths_of(split.train), /*batch_size=*/128, /*seed=*/0);
//   for (int64_t epoch = 0; epoch < 5; ++epoch)
//     for (const std::vector<int64_t>& batch : sampler.epoch(epoch)) {
//       TokenBatch b = make_token_batch(vocab, split.train, batch, /*batch_first=*/true);
//       // b.tokens [B, T] int64 padded with <pad>, b.lengths, b.labels [B]
//     }
//   // Rank 1 of 4, about 2048 padded tokens per batch, the same step count on every rank:
//   DistributedBucketingSampler mine(lengths_of(split.train), {.max_tokens = 2048}, 4, 1);
//
// Everything random here uses seqpack's own generator (Rng), so a seed gives the
// same sample, split and batches on every machine and standard library.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "seqpack/tensor.h"
#include "seqpack/vocabulary.h"

namespace seqpack {

// ---------------------------------------------------------------------------
// Deterministic random numbers.

// xoshiro256** seeded through splitmix64: fully specified, so results do not
// depend on the standard library (std::uniform_int_distribution is
// implementation-defined).
class Rng {
 public:
  explicit Rng(uint64_t seed);
  // Independent stream for (seed, stream), e.g. one per epoch.
  Rng(uint64_t seed, uint64_t stream);
  uint64_t next();
  // Uniform in [0, n) without modulo bias; n must be > 0.
  uint64_t below(uint64_t n);
  // Uniform in [0, 1) with 53 random bits.
  double uniform();
  // Fisher-Yates, deterministic for a given state.
  template <typename T>
  void shuffle(std::vector<T>& v) {
    for (std::size_t i = v.size(); i > 1; --i) {
      const std::size_t j = static_cast<std::size_t>(below(i));
      std::swap(v[i - 1], v[j]);
    }
  }

 private:
  uint64_t s_[4];
};

// ---------------------------------------------------------------------------
// Labelled text.

struct Example {
  std::string text;      // UTF-8 as read
  std::u32string chars;  // its code points
  int64_t label = 0;     // index into the dataset's label names
};

struct TextDataset {
  std::vector<std::string> labels;  // label names; Example::label indexes this
  std::vector<Example> examples;
  int64_t empty_lines = 0;  // blank lines skipped while reading
};

// Reads `label<TAB>text` lines (UTF-8; a trailing '\r' is dropped). Label names
// are strings, numbered in sorted (byte) order. Empty lines are skipped and
// counted. A line without a tab, with an empty label or empty text, or with
// invalid UTF-8 throws std::invalid_argument naming the file and line number;
// the text is everything after the first tab. A line longer than
// kMaxTsvLineBytes is refused with its number after that many bytes are read
// (a file of one huge line is never held whole); memory that runs out while
// reading throws std::bad_alloc.
inline constexpr std::size_t kMaxTsvLineBytes = std::size_t{1} << 20;
TextDataset load_tsv(const std::string& path);

struct DatasetSplit {
  std::vector<std::string> labels;
  std::vector<Example> train, val, test;
};

// Stratified deterministic split: within each label, examples are shuffled with
// `seed` and the first round(n * train_fraction) go to train, the next
// round(n * val_fraction) to val, the rest to test; each part is then shuffled.
DatasetSplit split_dataset(const TextDataset& dataset, double train_fraction, double val_fraction,
                           uint64_t seed);

// ---------------------------------------------------------------------------
// The default language-identification dataset.

struct WordList {
  std::string language;  // label name, e.g. "english"
  std::string file;      // file name under the dict directory, e.g. "american-english"
  std::string package;   // Debian package that installs it, e.g. "wamerican"
};

// english american-english wamerican, french french wfrench, german ngerman
// wngerman, spanish spanish wspanish, italian italian witalian, portuguese
// portuguese wportuguese, dutch dutch wdutch (label indices in this order).
const std::vector<WordList>& default_word_lists();

struct LanguageIdOptions {
  std::string dict_dir = "/usr/share/dict";
  std::vector<WordList> lists = default_word_lists();
  int64_t words_per_language = 20000;
  double train_fraction = 0.8;
  double val_fraction = 0.1;
  uint64_t seed = 20240229;
};

// Reads every list (one word per line, UTF-8), drops empty lines, words with an
// apostrophe (' or U+2019) and words present in more than one list, samples
// `words_per_language` distinct words per language with `seed`, and splits each
// language 80/10/10 (16000/2000/2000 by default). Labels follow `lists`.
// A missing list throws std::invalid_argument naming the file and the Debian
// package that provides it; a list with too few usable words names both counts.
DatasetSplit load_language_id(const LanguageIdOptions& options = {});

// Writes train.tsv, val.tsv, test.tsv (`label index<TAB>text` lines) and
// labels.txt (one label name per line, in index order) into `dir`, creating it.
// Each must be absent or a regular file (check_output_file in safetensors.h),
// all four checked before the first is written, and all four written in full
// before any replaces an older file (write_files_atomically): a failed export
// leaves the old split whole.
void export_split(const DatasetSplit& split, const std::string& dir);

// ---------------------------------------------------------------------------
// Batching.

std::vector<int64_t> lengths_of(const std::vector<Example>& examples);  // code points
std::vector<std::u32string> texts_of(const std::vector<Example>& examples);

struct TokenBatch {
  Tensor tokens;                 // int64 [B, T] (batch_first) or [T, B], padded with pad_id
  std::vector<int64_t> lengths;  // [B], in batch order
  Tensor labels;                 // int64 [B]
};

// Encodes examples[indices[i]] for each i; T is the longest of them (0 when all
// are empty). An index out of range throws, naming it.
TokenBatch make_token_batch(const Vocabulary& vocab, const std::vector<Example>& examples,
                            const std::vector<int64_t>& indices, bool batch_first);

// How BucketingSampler cuts batches. At least one of batch_size and
// max_tokens must be set (> 0).
struct BucketingOptions {
  int64_t batch_size = 0;  // most sequences in a batch (torchtext/AllenNLP); 0 = unbounded
  // Most padded tokens in a batch, count * max(longest, 1) (fairseq's
  // max_tokens); 0 = unbounded. A zero-length sequence counts as one token, so
  // a batch never holds more than max_tokens sequences.
  int64_t max_tokens = 0;
  uint64_t seed = 0;
  // Sort within pools of about this many batches (pool_batches * batch_size
  // sequences, or pool_batches * max_tokens tokens when max_tokens is set);
  // 0 = the whole dataset.
  int64_t pool_batches = 0;
  // Drop the last batch of each pool unless it is full (batch_size sequences,
  // or one more sequence of its longest length would exceed max_tokens).
  bool drop_last = false;
  // false: no shuffling at all (pools of consecutive indices, batches in
  // increasing length within each pool, the same every epoch).
  bool shuffle = true;
};

// Groups sequences of similar length into batches, so padded batches waste
// little. Each epoch: the indices are shuffled (seed, epoch), stably sorted by
// length within pools, cut greedily into consecutive batches bounded by
// batch_size and/or max_tokens, and the batch order is shuffled. Every index
// appears exactly once per epoch (unless drop_last).
class BucketingSampler {
 public:
  BucketingSampler(std::vector<int64_t> lengths, BucketingOptions options);
  BucketingSampler(std::vector<int64_t> lengths, int64_t batch_size, uint64_t seed,
                   int64_t pool_batches = 0, bool drop_last = false);
  std::vector<std::vector<int64_t>> epoch(int64_t epoch) const;
  // Batches in epoch `epoch`: the same for every epoch when batching by count
  // alone; with max_tokens and pools it may vary from epoch to epoch.
  int64_t num_batches(int64_t epoch = 0) const;
  int64_t size() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t batch_size() const { return options_.batch_size; }
  int64_t max_tokens() const { return options_.max_tokens; }
  uint64_t seed() const { return options_.seed; }
  bool drop_last() const { return options_.drop_last; }
  bool shuffle() const { return options_.shuffle; }
  const BucketingOptions& options() const { return options_; }
  const std::vector<int64_t>& lengths() const { return lengths_; }

 private:
  std::vector<int64_t> lengths_;
  BucketingOptions options_;
};

// Real tokens of each batch (sum of its lengths).
std::vector<int64_t> batch_tokens(const std::vector<int64_t>& lengths,
                                  const std::vector<std::vector<int64_t>>& batches);

// Splits one epoch's batches among `num_replicas` ranks so that every rank gets
// the same number of batches (no rank waits forever for the others) and the
// ranks' real-token counts at each step are close: batches are stably sorted by
// real tokens and consecutive runs of num_replicas form a step; the steps are
// shuffled and so is the rank order within each step (seed, epoch), so every
// rank computes the same plan from the shared seed. When the count is not a
// multiple of num_replicas, drop_last drops the batches with the fewest
// tokens; otherwise the batches with the most tokens are halved (by count)
// until it is, so every index still appears exactly once, and when no batch is
// left to halve std::invalid_argument names the counts. Returns out[rank][step].
std::vector<std::vector<std::vector<int64_t>>> distribute_batches(
    std::vector<std::vector<int64_t>> batches, const std::vector<int64_t>& lengths,
    int64_t num_replicas, uint64_t seed, int64_t epoch, bool shuffle, bool drop_last);

// BucketingSampler split among ranks with distribute_batches: each rank builds
// the whole epoch's plan from the shared seed and keeps its own share.
class DistributedBucketingSampler {
 public:
  DistributedBucketingSampler(std::vector<int64_t> lengths, BucketingOptions options,
                              int64_t num_replicas, int64_t rank);
  std::vector<std::vector<int64_t>> epoch(int64_t epoch) const;  // this rank's batches
  std::vector<std::vector<std::vector<int64_t>>> all_ranks(int64_t epoch) const;
  const BucketingSampler& sampler() const { return sampler_; }
  int64_t num_replicas() const { return num_replicas_; }
  int64_t rank() const { return rank_; }

 private:
  BucketingSampler sampler_;
  int64_t num_replicas_;
  int64_t rank_;
};

// Plain random batching (shuffle, cut), the baseline bucketing is compared with.
std::vector<std::vector<int64_t>> random_batches(int64_t n, int64_t batch_size, uint64_t seed,
                                                 bool drop_last = false);

// Real tokens versus slots computed when each batch is padded to its longest.
struct PaddingStats {
  int64_t real_tokens = 0;
  int64_t padded_slots = 0;   // sum over batches of batch size * longest length
  double efficiency() const;  // real / padded (1 when there is nothing)
};
PaddingStats padding_stats(const std::vector<int64_t>& lengths,
                           const std::vector<std::vector<int64_t>>& batches);

struct PaddingReport {
  PaddingStats random;    // random batches of the same size
  PaddingStats bucketed;  // the sampler's batches
  PaddingStats packed;    // packing computes real tokens only: efficiency 1
  int64_t num_batches = 0;
};
// Statistics of epoch `epoch` of `sampler` against random batching with the same seed.
// The random batches hold batch_size sequences, or, when batching by
// max_tokens alone, the sampler's mean batch size (rounded).
PaddingReport padding_report(const BucketingSampler& sampler, int64_t epoch = 0);

// ---------------------------------------------------------------------------
// Padded-batch helpers.

// out[b] = padded[lengths[b] - 1, b] (time-major [T, B, *f]) or padded[b,
// lengths[b] - 1] (batch_first [B, T, *f]): each sequence's output at its own
// last valid step, [B, *f]. Zero-length sequences give zeros. Any dtype.
Tensor last_valid_step(const Tensor& padded, const std::vector<int64_t>& lengths, bool batch_first);
// Scatters grad [B, *f] into zeros of the padded shape ([T, B, *f] or [B, T, *f]).
Tensor last_valid_step_backward(const Tensor& grad, const std::vector<int64_t>& lengths,
                                int64_t padded_length, bool batch_first);

// Reverses each sequence within its own length; padding stays in place. Its
// own inverse, so its backward is the same call on the gradient.
Tensor reverse_padded_sequence(const Tensor& padded, const std::vector<int64_t>& lengths,
                               bool batch_first);

}  // namespace seqpack
