// Batching: token batches, the length-bucketing sampler, padding statistics and
// the padded-batch helpers.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "seqpack/data.h"

namespace seqpack {

std::vector<int64_t> lengths_of(const std::vector<Example>& examples) {
  std::vector<int64_t> out;
  out.reserve(examples.size());
  for (const Example& e : examples) out.push_back(static_cast<int64_t>(e.chars.size()));
  return out;
}

std::vector<std::u32string> texts_of(const std::vector<Example>& examples) {
  std::vector<std::u32string> out;
  out.reserve(examples.size());
  for (const Example& e : examples) out.push_back(e.chars);
  return out;
}

TokenBatch make_token_batch(const Vocabulary& vocab, const std::vector<Example>& examples,
                            const std::vector<int64_t>& indices, bool batch_first) {
  const int64_t n = static_cast<int64_t>(examples.size());
  const int64_t batch = static_cast<int64_t>(indices.size());
  TokenBatch out;
  int64_t longest = 0;
  for (std::size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] < 0 || indices[i] >= n) {
      throw std::invalid_argument("make_token_batch: indices[" + std::to_string(i) +
                                  "] = " + std::to_string(indices[i]) + " is out of range [0, " +
                                  std::to_string(n) + ")");
    }
    const int64_t len =
        static_cast<int64_t>(examples[static_cast<std::size_t>(indices[i])].chars.size());
    out.lengths.push_back(len);
    longest = std::max(longest, len);
  }
  out.tokens = batch_first ? Tensor::full({batch, longest}, Vocabulary::pad_id, DType::i64)
                           : Tensor::full({longest, batch}, Vocabulary::pad_id, DType::i64);
  out.labels = Tensor::empty({batch}, DType::i64);
  int64_t* tok = out.tokens.data<int64_t>();
  int64_t* lab = out.labels.data<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const Example& e = examples[static_cast<std::size_t>(indices[static_cast<std::size_t>(b)])];
    lab[b] = e.label;
    for (std::size_t t = 0; t < e.chars.size(); ++t) {
      const int64_t ti = static_cast<int64_t>(t);
      tok[batch_first ? b * longest + ti : ti * batch + b] = vocab.id(e.chars[t]);
    }
  }
  return out;
}

BucketingSampler::BucketingSampler(std::vector<int64_t> lengths, int64_t batch_size, uint64_t seed,
                                   int64_t pool_batches, bool drop_last)
    : BucketingSampler(std::move(lengths), [&] {
        if (batch_size < 1) {
          throw std::invalid_argument("BucketingSampler: batch_size = " +
                                      std::to_string(batch_size) + " must be at least 1");
        }
        BucketingOptions o;
        o.batch_size = batch_size;
        o.seed = seed;
        o.pool_batches = pool_batches;
        o.drop_last = drop_last;
        return o;
      }()) {}

BucketingSampler::BucketingSampler(std::vector<int64_t> lengths, BucketingOptions options)
    : lengths_(std::move(lengths)), options_(options) {
  if (options_.batch_size < 0) {
    throw std::invalid_argument("BucketingSampler: batch_size = " +
                                std::to_string(options_.batch_size) + " must be at least 1");
  }
  if (options_.max_tokens < 0) {
    throw std::invalid_argument("BucketingSampler: max_tokens = " +
                                std::to_string(options_.max_tokens) + " must be at least 1");
  }
  if (options_.batch_size == 0 && options_.max_tokens == 0) {
    throw std::invalid_argument(
        "BucketingSampler: batch_size = 0 and max_tokens = 0; set at least one of them");
  }
  if (options_.pool_batches < 0) {
    throw std::invalid_argument("BucketingSampler: pool_batches = " +
                                std::to_string(options_.pool_batches) + " must be non-negative");
  }
  for (std::size_t i = 0; i < lengths_.size(); ++i) {
    if (lengths_[i] < 0) {
      throw std::invalid_argument("BucketingSampler: lengths[" + std::to_string(i) +
                                  "] = " + std::to_string(lengths_[i]) + " is negative");
    }
    // fairseq's batch_by_size refuses such a sequence too.
    if (options_.max_tokens > 0 && lengths_[i] > options_.max_tokens) {
      throw std::invalid_argument("BucketingSampler: lengths[" + std::to_string(i) +
                                  "] = " + std::to_string(lengths_[i]) +
                                  " exceeds max_tokens = " + std::to_string(options_.max_tokens));
    }
  }
}

namespace {
// Cuts `order[begin, end)` into batches of `batch_size` (the last one shorter
// unless dropped).
void cut(const std::vector<int64_t>& order, std::size_t begin, std::size_t end, int64_t batch_size,
         bool drop_last, std::vector<std::vector<int64_t>>& out) {
  const std::size_t bs = static_cast<std::size_t>(batch_size);
  for (std::size_t s = begin; s < end; s += bs) {
    const std::size_t e = std::min(end, s + bs);
    if (drop_last && e - s < bs) break;
    out.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(s),
                     order.begin() + static_cast<std::ptrdiff_t>(e));
  }
}

// Token cost of one sequence against max_tokens.
int64_t token_cost(int64_t length) { return std::max<int64_t>(length, 1); }

// The greedy cut leaves a pool's last batch with whatever remains, often a
// few sequences: a rank given it would idle while the others work. Moves the
// boundary between the last two batches (both sorted by length, the second
// holding the longer sequences) to where their real tokens are closest,
// keeping both within the bounds.
void even_out_last_two(const std::vector<int64_t>& lengths, const BucketingOptions& o,
                       std::vector<std::vector<int64_t>>& out) {
  std::vector<int64_t> both = out[out.size() - 2];
  both.insert(both.end(), out.back().begin(), out.back().end());
  const std::size_t n = both.size();
  const auto len = [&](std::size_t i) { return lengths[static_cast<std::size_t>(both[i])]; };
  const auto fits = [&](std::size_t size, int64_t longest) {
    const int64_t sz = static_cast<int64_t>(size);
    return (o.batch_size == 0 || sz <= o.batch_size) && token_cost(longest) <= o.max_tokens / sz;
  };
  int64_t total = 0, head = 0;
  std::size_t best = out[out.size() - 2].size();
  for (std::size_t i = 0; i < n; ++i) {
    total += len(i);
    if (i < best) head += len(i);
  }
  // Ties keep the greedy cut.
  int64_t prefix = 0, best_gap = std::abs(total - 2 * head);
  for (std::size_t split = 1; split < n; ++split) {
    prefix += len(split - 1);
    if (!fits(split, len(split - 1)) || !fits(n - split, len(n - 1))) continue;
    const int64_t gap = std::abs(total - 2 * prefix);
    if (gap < best_gap) best_gap = gap, best = split;
  }
  out[out.size() - 2].assign(both.begin(), both.begin() + static_cast<std::ptrdiff_t>(best));
  out.back().assign(both.begin() + static_cast<std::ptrdiff_t>(best), both.end());
}

// Greedy cut of `order[begin, end)`, sorted by increasing length, under both
// bounds (fairseq's batch_by_size rule: size * longest <= max_tokens).
void cut_bounded(const std::vector<int64_t>& order, std::size_t begin, std::size_t end,
                 const std::vector<int64_t>& lengths, const BucketingOptions& o,
                 std::vector<std::vector<int64_t>>& out) {
  const auto fits = [&](int64_t size, int64_t longest) {
    return (o.batch_size == 0 || size <= o.batch_size) &&
           (o.max_tokens == 0 || token_cost(longest) <= o.max_tokens / size);
  };
  const std::size_t first = out.size();
  std::size_t s = begin;
  while (s < end) {
    std::size_t e = s + 1;
    while (e < end &&
           fits(static_cast<int64_t>(e - s + 1), lengths[static_cast<std::size_t>(order[e])]))
      ++e;
    const int64_t size = static_cast<int64_t>(e - s);
    const int64_t longest = lengths[static_cast<std::size_t>(order[e - 1])];
    // Only a pool's last batch can be short: every other one stopped at a bound.
    if (e == end && o.drop_last && fits(size + 1, longest)) break;
    out.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(s),
                     order.begin() + static_cast<std::ptrdiff_t>(e));
    s = e;
  }
  if (!o.drop_last && out.size() >= first + 2) even_out_last_two(lengths, o, out);
}

// a * b for positive a and b, capped at INT64_MAX (huge bounds mean "everything").
int64_t saturating_product(int64_t a, int64_t b) {
  return a > std::numeric_limits<int64_t>::max() / b ? std::numeric_limits<int64_t>::max() : a * b;
}

// End of the pool starting at `p` in `order`.
std::size_t pool_end(const std::vector<int64_t>& order, std::size_t p,
                     const std::vector<int64_t>& lengths, const BucketingOptions& o) {
  const std::size_t n = order.size();
  if (o.pool_batches == 0) return n;
  if (o.max_tokens == 0) {
    return std::min(n,
                    p + static_cast<std::size_t>(saturating_product(o.pool_batches, o.batch_size)));
  }
  const int64_t budget = saturating_product(o.pool_batches, o.max_tokens);
  int64_t tokens = 0;
  std::size_t e = p;
  while (e < n && tokens < budget)
    tokens += token_cost(lengths[static_cast<std::size_t>(order[e++])]);
  return e;
}
}  // namespace

std::vector<std::vector<int64_t>> BucketingSampler::epoch(int64_t epoch) const {
  if (epoch < 0) {
    throw std::invalid_argument("BucketingSampler::epoch: epoch = " + std::to_string(epoch) +
                                " is negative");
  }
  const BucketingOptions& o = options_;
  const std::size_t n = lengths_.size();
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  // Shuffling before the stable sort randomises which equal-length sequences
  // share a batch, so batches differ from epoch to epoch.
  if (o.shuffle) Rng(o.seed, 2 * static_cast<uint64_t>(epoch)).shuffle(order);
  std::vector<std::vector<int64_t>> batches;
  for (std::size_t p = 0; p < n;) {
    const std::size_t end = pool_end(order, p, lengths_, o);
    std::stable_sort(order.begin() + static_cast<std::ptrdiff_t>(p),
                     order.begin() + static_cast<std::ptrdiff_t>(end), [&](int64_t a, int64_t b) {
                       return lengths_[static_cast<std::size_t>(a)] <
                              lengths_[static_cast<std::size_t>(b)];
                     });
    if (o.max_tokens == 0) {
      cut(order, p, end, o.batch_size, o.drop_last, batches);
    } else {
      cut_bounded(order, p, end, lengths_, o, batches);
    }
    p = end;
  }
  // Without this the model would see short words first and long words last.
  if (o.shuffle) Rng(o.seed, 2 * static_cast<uint64_t>(epoch) + 1).shuffle(batches);
  return batches;
}

int64_t BucketingSampler::num_batches(int64_t epoch_index) const {
  if (options_.max_tokens > 0) return static_cast<int64_t>(epoch(epoch_index).size());
  const int64_t n = size();
  const int64_t batch_size = options_.batch_size;
  const int64_t pool = options_.pool_batches > 0
                           ? saturating_product(options_.pool_batches, batch_size)
                           : std::max<int64_t>(n, 1);
  int64_t count = 0;
  for (int64_t p = 0; p < n;) {
    const int64_t m = std::min(n - p, pool);
    count += m / batch_size + (!options_.drop_last && m % batch_size != 0 ? 1 : 0);
    p += m;
  }
  return count;
}

namespace {
// Calls f(b, length) for each index of each batch, after checking the index.
template <typename F>
void for_each_batch_length(const char* fn, const std::vector<int64_t>& lengths,
                           const std::vector<std::vector<int64_t>>& batches, F&& f) {
  const int64_t n = static_cast<int64_t>(lengths.size());
  for (std::size_t b = 0; b < batches.size(); ++b) {
    for (std::size_t i = 0; i < batches[b].size(); ++i) {
      const int64_t idx = batches[b][i];
      if (idx < 0 || idx >= n) {
        throw std::invalid_argument(std::string(fn) + ": batches[" + std::to_string(b) + "][" +
                                    std::to_string(i) + "] = " + std::to_string(idx) +
                                    " is out of range [0, " + std::to_string(n) + ")");
      }
      f(b, lengths[static_cast<std::size_t>(idx)]);
    }
  }
}
}  // namespace

std::vector<int64_t> batch_tokens(const std::vector<int64_t>& lengths,
                                  const std::vector<std::vector<int64_t>>& batches) {
  std::vector<int64_t> out(batches.size(), 0);
  for_each_batch_length("batch_tokens", lengths, batches,
                        [&](std::size_t b, int64_t len) { out[b] += len; });
  return out;
}

std::vector<std::vector<std::vector<int64_t>>> distribute_batches(
    std::vector<std::vector<int64_t>> batches, const std::vector<int64_t>& lengths,
    int64_t num_replicas, uint64_t seed, int64_t epoch, bool shuffle, bool drop_last) {
  if (num_replicas < 1) {
    throw std::invalid_argument("distribute_batches: num_replicas = " +
                                std::to_string(num_replicas) + " must be at least 1");
  }
  if (epoch < 0) {
    throw std::invalid_argument("distribute_batches: epoch = " + std::to_string(epoch) +
                                " is negative");
  }
  const std::size_t R = static_cast<std::size_t>(num_replicas);
  std::vector<int64_t> tokens = batch_tokens(lengths, batches);
  // Ascending by real tokens (stable: ties keep the sampler's shuffled order).
  std::vector<std::size_t> by_tokens(batches.size());
  std::iota(by_tokens.begin(), by_tokens.end(), std::size_t{0});
  std::stable_sort(by_tokens.begin(), by_tokens.end(),
                   [&](std::size_t a, std::size_t b) { return tokens[a] < tokens[b]; });
  const std::size_t extra = batches.size() % R;
  if (extra != 0 && drop_last) {
    by_tokens.erase(by_tokens.begin(), by_tokens.begin() + static_cast<std::ptrdiff_t>(extra));
  } else if (extra != 0) {
    // Halve the heaviest batches; the halves go back into the sorted order.
    for (std::size_t k = 0; k < R - extra; ++k) {
      std::size_t pos = by_tokens.size();
      while (pos > 0 && batches[by_tokens[pos - 1]].size() < 2) --pos;
      if (pos == 0) {
        throw std::invalid_argument(
            "distribute_batches: " + std::to_string(batches.size() - k) + " batches of " +
            std::to_string(lengths.size()) + " sequences cannot be split evenly among " +
            std::to_string(num_replicas) +
            " ranks without repeating a sequence; use drop_last or fewer ranks");
      }
      const std::size_t victim = by_tokens[pos - 1];
      by_tokens.erase(by_tokens.begin() + static_cast<std::ptrdiff_t>(pos - 1));
      const std::size_t half = batches[victim].size() / 2;
      std::vector<int64_t> tail(batches[victim].begin() + static_cast<std::ptrdiff_t>(half),
                                batches[victim].end());
      batches[victim].resize(half);
      batches.push_back(std::move(tail));
      const std::vector<int64_t> t = batch_tokens(lengths, {batches[victim], batches.back()});
      tokens[victim] = t[0];
      tokens.push_back(t[1]);
      for (std::size_t id : {victim, batches.size() - 1}) {
        const auto at = std::upper_bound(by_tokens.begin(), by_tokens.end(), tokens[id],
                                         [&](int64_t v, std::size_t b) { return v < tokens[b]; });
        by_tokens.insert(at, id);
      }
    }
  }
  const std::size_t steps = by_tokens.size() / R;
  std::vector<std::size_t> step_order(steps);
  std::iota(step_order.begin(), step_order.end(), std::size_t{0});
  // Streams apart from the sampler's (2 * epoch and 2 * epoch + 1).
  Rng rng(seed, (uint64_t{1} << 63) | static_cast<uint64_t>(epoch));
  if (shuffle) rng.shuffle(step_order);
  std::vector<std::vector<std::vector<int64_t>>> out(R);
  for (auto& r : out) r.reserve(steps);
  std::vector<std::size_t> ranks(R);
  for (std::size_t s : step_order) {
    std::iota(ranks.begin(), ranks.end(), std::size_t{0});
    // Otherwise one rank would always get the heaviest batch of a step.
    if (shuffle) rng.shuffle(ranks);
    for (std::size_t j = 0; j < R; ++j) {
      out[ranks[j]].push_back(std::move(batches[by_tokens[s * R + j]]));
    }
  }
  return out;
}

DistributedBucketingSampler::DistributedBucketingSampler(std::vector<int64_t> lengths,
                                                         BucketingOptions options,
                                                         int64_t num_replicas, int64_t rank)
    : sampler_(std::move(lengths), options), num_replicas_(num_replicas), rank_(rank) {
  if (num_replicas < 1) {
    throw std::invalid_argument("DistributedBucketingSampler: num_replicas = " +
                                std::to_string(num_replicas) + " must be at least 1");
  }
  if (rank < 0 || rank >= num_replicas) {
    throw std::invalid_argument("DistributedBucketingSampler: rank = " + std::to_string(rank) +
                                " is out of range [0, " + std::to_string(num_replicas) + ")");
  }
}

std::vector<std::vector<std::vector<int64_t>>> DistributedBucketingSampler::all_ranks(
    int64_t epoch) const {
  return distribute_batches(sampler_.epoch(epoch), sampler_.lengths(), num_replicas_,
                            sampler_.seed(), epoch, sampler_.shuffle(), sampler_.drop_last());
}

std::vector<std::vector<int64_t>> DistributedBucketingSampler::epoch(int64_t epoch) const {
  return std::move(all_ranks(epoch)[static_cast<std::size_t>(rank_)]);
}

std::vector<std::vector<int64_t>> random_batches(int64_t n, int64_t batch_size, uint64_t seed,
                                                 bool drop_last) {
  if (n < 0)
    throw std::invalid_argument("random_batches: n = " + std::to_string(n) + " is negative");
  if (batch_size < 1) {
    throw std::invalid_argument("random_batches: batch_size = " + std::to_string(batch_size) +
                                " must be at least 1");
  }
  std::vector<int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  Rng(seed).shuffle(order);
  std::vector<std::vector<int64_t>> batches;
  cut(order, 0, order.size(), batch_size, drop_last, batches);
  return batches;
}

double PaddingStats::efficiency() const {
  return padded_slots == 0 ? 1.0
                           : static_cast<double>(real_tokens) / static_cast<double>(padded_slots);
}

PaddingStats padding_stats(const std::vector<int64_t>& lengths,
                           const std::vector<std::vector<int64_t>>& batches) {
  PaddingStats s;
  std::vector<int64_t> longest(batches.size(), 0);
  for_each_batch_length("padding_stats", lengths, batches, [&](std::size_t b, int64_t len) {
    s.real_tokens += len;
    longest[b] = std::max(longest[b], len);
  });
  for (std::size_t b = 0; b < batches.size(); ++b)
    s.padded_slots += longest[b] * static_cast<int64_t>(batches[b].size());
  return s;
}

PaddingReport padding_report(const BucketingSampler& sampler, int64_t epoch) {
  PaddingReport r;
  const auto batches = sampler.epoch(epoch);
  r.num_batches = static_cast<int64_t>(batches.size());
  r.bucketed = padding_stats(sampler.lengths(), batches);
  int64_t random_size = sampler.batch_size();
  if (random_size == 0) {
    random_size = r.num_batches == 0
                      ? 1
                      : std::max<int64_t>(1, (sampler.size() + r.num_batches / 2) / r.num_batches);
  }
  r.random =
      padding_stats(sampler.lengths(), random_batches(sampler.size(), random_size,
                                                      sampler.seed() + static_cast<uint64_t>(epoch),
                                                      sampler.drop_last()));
  r.packed.real_tokens = r.bucketed.real_tokens;
  r.packed.padded_slots = r.bucketed.real_tokens;
  return r;
}

namespace {

struct PaddedLayout {
  int64_t T = 0, B = 0;
  std::size_t row_bytes = 0;  // bytes of one [*f] row
  Shape features;
};

PaddedLayout check_padded(const char* fn, const Tensor& padded, const std::vector<int64_t>& lengths,
                          bool batch_first) {
  if (!padded.defined()) throw std::invalid_argument(std::string(fn) + ": input is undefined");
  if (padded.dim() < 2) {
    throw std::invalid_argument(std::string(fn) + ": input of shape " + shape_str(padded.shape()) +
                                " needs at least 2 dimensions (time and batch)");
  }
  PaddedLayout l;
  l.T = padded.size(batch_first ? 1 : 0);
  l.B = padded.size(batch_first ? 0 : 1);
  l.features.assign(padded.shape().begin() + 2, padded.shape().end());
  l.row_bytes = static_cast<std::size_t>(shape_numel(l.features)) * dtype_size(padded.dtype());
  if (static_cast<int64_t>(lengths.size()) != l.B) {
    throw std::invalid_argument(std::string(fn) + ": " + std::to_string(lengths.size()) +
                                " lengths for a batch of " + std::to_string(l.B) +
                                " (input shape " + shape_str(padded.shape()) + ")");
  }
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    if (lengths[b] < 0) {
      throw std::invalid_argument(std::string(fn) + ": lengths[" + std::to_string(b) +
                                  "] = " + std::to_string(lengths[b]) + " is negative");
    }
    if (lengths[b] > l.T) {
      throw std::invalid_argument(std::string(fn) + ": lengths[" + std::to_string(b) +
                                  "] = " + std::to_string(lengths[b]) +
                                  " exceeds the padded length " + std::to_string(l.T));
    }
  }
  return l;
}

// Byte offset of row (t, b) in a padded tensor.
std::size_t row_offset(const PaddedLayout& l, int64_t t, int64_t b, bool batch_first) {
  const int64_t row = batch_first ? b * l.T + t : t * l.B + b;
  return static_cast<std::size_t>(row) * l.row_bytes;
}

}  // namespace

Tensor last_valid_step(const Tensor& padded, const std::vector<int64_t>& lengths,
                       bool batch_first) {
  const PaddedLayout l = check_padded("last_valid_step", padded, lengths, batch_first);
  Shape out_shape{l.B};
  out_shape.insert(out_shape.end(), l.features.begin(), l.features.end());
  Tensor out = Tensor::zeros(out_shape, padded.dtype());
  const char* src = static_cast<const char*>(padded.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t b = 0; b < l.B; ++b) {
    const int64_t len = lengths[static_cast<std::size_t>(b)];
    if (len == 0 || l.row_bytes == 0) continue;
    std::memcpy(dst + static_cast<std::size_t>(b) * l.row_bytes,
                src + row_offset(l, len - 1, b, batch_first), l.row_bytes);
  }
  return out;
}

Tensor last_valid_step_backward(const Tensor& grad, const std::vector<int64_t>& lengths,
                                int64_t padded_length, bool batch_first) {
  if (!grad.defined() || grad.dim() < 1) {
    throw std::invalid_argument("last_valid_step_backward: grad must have a batch dimension");
  }
  if (padded_length < 0) {
    throw std::invalid_argument("last_valid_step_backward: padded_length = " +
                                std::to_string(padded_length) + " is negative");
  }
  const int64_t B = grad.size(0);
  Shape shape = batch_first ? Shape{B, padded_length} : Shape{padded_length, B};
  shape.insert(shape.end(), grad.shape().begin() + 1, grad.shape().end());
  Tensor out = Tensor::zeros(shape, grad.dtype());
  const PaddedLayout l = check_padded("last_valid_step_backward", out, lengths, batch_first);
  const char* src = static_cast<const char*>(grad.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = lengths[static_cast<std::size_t>(b)];
    if (len == 0 || l.row_bytes == 0) continue;
    std::memcpy(dst + row_offset(l, len - 1, b, batch_first),
                src + static_cast<std::size_t>(b) * l.row_bytes, l.row_bytes);
  }
  return out;
}

Tensor reverse_padded_sequence(const Tensor& padded, const std::vector<int64_t>& lengths,
                               bool batch_first) {
  const PaddedLayout l = check_padded("reverse_padded_sequence", padded, lengths, batch_first);
  Tensor out = padded.clone();
  if (l.row_bytes == 0) return out;
  const char* src = static_cast<const char*>(padded.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t b = 0; b < l.B; ++b) {
    const int64_t len = lengths[static_cast<std::size_t>(b)];
    for (int64_t t = 0; t < len; ++t) {
      std::memcpy(dst + row_offset(l, t, b, batch_first),
                  src + row_offset(l, len - 1 - t, b, batch_first), l.row_bytes);
    }
  }
  return out;
}

}  // namespace seqpack
