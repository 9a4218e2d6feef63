// Batching: token batches, the length-bucketing sampler, padding statistics and
// the padded-batch helpers.
#include <algorithm>
#include <cstring>
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
    : lengths_(std::move(lengths)),
      batch_size_(batch_size),
      seed_(seed),
      pool_batches_(pool_batches),
      drop_last_(drop_last) {
  if (batch_size < 1) {
    throw std::invalid_argument("BucketingSampler: batch_size = " + std::to_string(batch_size) +
                                " must be at least 1");
  }
  if (pool_batches < 0) {
    throw std::invalid_argument("BucketingSampler: pool_batches = " + std::to_string(pool_batches) +
                                " must be non-negative");
  }
  for (std::size_t i = 0; i < lengths_.size(); ++i) {
    if (lengths_[i] < 0) {
      throw std::invalid_argument("BucketingSampler: lengths[" + std::to_string(i) +
                                  "] = " + std::to_string(lengths_[i]) + " is negative");
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
}  // namespace

std::vector<std::vector<int64_t>> BucketingSampler::epoch(int64_t epoch) const {
  if (epoch < 0) {
    throw std::invalid_argument("BucketingSampler::epoch: epoch = " + std::to_string(epoch) +
                                " is negative");
  }
  const std::size_t n = lengths_.size();
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  // Shuffling before the stable sort randomises which equal-length sequences
  // share a batch, so batches differ from epoch to epoch.
  Rng(seed_, 2 * static_cast<uint64_t>(epoch)).shuffle(order);
  const std::size_t pool = pool_batches_ > 0 ? static_cast<std::size_t>(pool_batches_ * batch_size_)
                                             : std::max<std::size_t>(n, 1);
  std::vector<std::vector<int64_t>> batches;
  for (std::size_t p = 0; p < n; p += pool) {
    const std::size_t end = std::min(n, p + pool);
    std::stable_sort(order.begin() + static_cast<std::ptrdiff_t>(p),
                     order.begin() + static_cast<std::ptrdiff_t>(end), [&](int64_t a, int64_t b) {
                       return lengths_[static_cast<std::size_t>(a)] <
                              lengths_[static_cast<std::size_t>(b)];
                     });
    cut(order, p, end, batch_size_, drop_last_, batches);
  }
  // Without this the model would see short words first and long words last.
  Rng(seed_, 2 * static_cast<uint64_t>(epoch) + 1).shuffle(batches);
  return batches;
}

int64_t BucketingSampler::num_batches() const {
  const int64_t n = size();
  const int64_t pool = pool_batches_ > 0 ? pool_batches_ * batch_size_ : std::max<int64_t>(n, 1);
  int64_t count = 0;
  for (int64_t p = 0; p < n; p += pool) {
    const int64_t m = std::min(n, p + pool) - p;
    count += drop_last_ ? m / batch_size_ : (m + batch_size_ - 1) / batch_size_;
  }
  return count;
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
  const int64_t n = static_cast<int64_t>(lengths.size());
  for (std::size_t b = 0; b < batches.size(); ++b) {
    int64_t longest = 0;
    for (std::size_t i = 0; i < batches[b].size(); ++i) {
      const int64_t idx = batches[b][i];
      if (idx < 0 || idx >= n) {
        throw std::invalid_argument("padding_stats: batches[" + std::to_string(b) + "][" +
                                    std::to_string(i) + "] = " + std::to_string(idx) +
                                    " is out of range [0, " + std::to_string(n) + ")");
      }
      const int64_t len = lengths[static_cast<std::size_t>(idx)];
      s.real_tokens += len;
      longest = std::max(longest, len);
    }
    s.padded_slots += longest * static_cast<int64_t>(batches[b].size());
  }
  return s;
}

PaddingReport padding_report(const BucketingSampler& sampler, int64_t epoch) {
  PaddingReport r;
  const auto batches = sampler.epoch(epoch);
  r.num_batches = static_cast<int64_t>(batches.size());
  r.bucketed = padding_stats(sampler.lengths(), batches);
  r.random =
      padding_stats(sampler.lengths(), random_batches(sampler.size(), sampler.batch_size(),
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
