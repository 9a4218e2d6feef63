// The deterministic generator, the length-bucketing sampler and padding statistics.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <stdexcept>
#include <string>

#include "seqpack/data.h"
#include "test_util.h"

using seqpack::BucketingSampler;
using seqpack::PaddingStats;
using seqpack::Rng;

namespace {

using Batches = std::vector<std::vector<int64_t>>;

using seqpack::testing::expect_invalid;

// Word-like lengths: mostly 4..14, a tail to 30, some zeros.
std::vector<int64_t> random_lengths(uint64_t seed, int64_t n) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = rng() % 100;
    out.push_back(r < 3    ? 0
                  : r < 90 ? 4 + static_cast<int64_t>(rng() % 11)
                           : 15 + static_cast<int64_t>(rng() % 16));
  }
  return out;
}

// Every index 0..n-1 exactly once.
::testing::AssertionResult is_partition(const Batches& batches, int64_t n) {
  std::vector<int> seen(static_cast<std::size_t>(n), 0);
  for (const auto& b : batches) {
    for (int64_t i : b) {
      if (i < 0 || i >= n) return ::testing::AssertionFailure() << "index " << i << " out of range";
      if (seen[static_cast<std::size_t>(i)]++)
        return ::testing::AssertionFailure() << "index " << i << " twice";
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!seen[static_cast<std::size_t>(i)])
      return ::testing::AssertionFailure() << "index " << i << " missing";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace

TEST(Rng, MatchesTheXoshiro256StarStarSpecification) {
  // From an independent Python implementation of splitmix64 seeding (state
  // words = splitmix64 outputs from seed ^ splitmix64(stream)) and xoshiro256**.
  Rng a(0);
  EXPECT_EQ(a.next(), 0xfb5405f7bd79c540ull);
  EXPECT_EQ(a.next(), 0x780c98e26cea5883ull);
  EXPECT_EQ(a.next(), 0x2a146e0980febc66ull);
  Rng b(42);
  EXPECT_EQ(b.next(), 0x1ff785474f113b15ull);
  Rng c(42, 7);
  EXPECT_EQ(c.next(), 0x24bfb39aeb008c15ull);
  EXPECT_EQ(c.next(), 0xd858489e7fc02496ull);
  Rng d(1);
  std::vector<uint64_t> draws;
  for (int i = 0; i < 8; ++i) draws.push_back(d.below(10));
  EXPECT_EQ(draws, (std::vector<uint64_t>{3, 2, 9, 9, 1, 3, 2, 8}));
}

TEST(Rng, BelowCoversTheRangeAndRejectsZero) {
  Rng r(5);
  std::vector<int> hits(7, 0);
  for (int i = 0; i < 7000; ++i) ++hits[r.below(7)];
  // Each value expected 1000 times; 800 is > 6 standard deviations below.
  for (int v = 0; v < 7; ++v) EXPECT_GT(hits[static_cast<std::size_t>(v)], 800) << v;
  EXPECT_EQ(r.below(1), 0u);
  expect_invalid([&] { r.below(0); }, {"n = 0"});
  for (int i = 0; i < 1000; ++i) {
    const double u = r.uniform();
    ASSERT_TRUE(u >= 0.0 && u < 1.0) << u;
  }
}

TEST(PaddingStats, HandWorkedExample) {
  // lengths 1 2 3 4; batches {0, 3} and {1, 2}: real 10, padded 2 * 4 + 2 * 3 = 14.
  const PaddingStats s = seqpack::padding_stats({1, 2, 3, 4}, {{0, 3}, {1, 2}});
  EXPECT_EQ(s.real_tokens, 10);
  EXPECT_EQ(s.padded_slots, 14);
  EXPECT_DOUBLE_EQ(s.efficiency(), 10.0 / 14.0);
  EXPECT_DOUBLE_EQ(PaddingStats{}.efficiency(), 1.0);
  expect_invalid(
      [] {
        seqpack::padding_stats({1, 2}, {{0}, {1, 2}});
      },
      {"batches[1][1] = 2", "[0, 2)"});
}

TEST(BucketingSampler, HandWorkedBatchesAreGroupsOfSimilarLength) {
  // Lengths 5 1 5 1 3 3 with batch 2: the groups must be {1, 1}, {3, 3}, {5, 5}.
  BucketingSampler s({5, 1, 5, 1, 3, 3}, 2, /*seed=*/9);
  Batches b = s.epoch(0);
  for (auto& x : b) std::sort(x.begin(), x.end());
  std::sort(b.begin(), b.end());
  EXPECT_EQ(b, (Batches{{0, 2}, {1, 3}, {4, 5}}));
  const seqpack::PaddingReport r = seqpack::padding_report(s);
  EXPECT_EQ(r.bucketed.real_tokens, 18);
  EXPECT_EQ(r.bucketed.padded_slots, 18);
  EXPECT_EQ(r.packed.padded_slots, 18);
  EXPECT_EQ(r.num_batches, 3);
}

TEST(BucketingSampler, EveryIndexOncePerEpochAndBatchesDoNotInterleave) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto lengths = random_lengths(seed, 1000);
  for (int64_t bs : {1, 7, 128, 1000, 1500}) {
    SCOPED_TRACE("batch_size " + std::to_string(bs));
    BucketingSampler s(lengths, bs, seed);
    const Batches b = s.epoch(0);
    ASSERT_TRUE(is_partition(b, 1000));
    EXPECT_EQ(static_cast<int64_t>(b.size()), s.num_batches());
    int64_t small = 0;
    for (const auto& x : b) {
      EXPECT_LE(static_cast<int64_t>(x.size()), bs);
      small += static_cast<int64_t>(x.size()) < bs;
    }
    EXPECT_LE(small, 1);
    // Sorted globally then cut: the length ranges [min, max] of two batches
    // overlap at most at an endpoint.
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (const auto& x : b) {
      int64_t lo = INT64_MAX, hi = INT64_MIN;
      for (int64_t i : x) {
        lo = std::min(lo, lengths[static_cast<std::size_t>(i)]);
        hi = std::max(hi, lengths[static_cast<std::size_t>(i)]);
      }
      ranges.emplace_back(lo, hi);
    }
    std::sort(ranges.begin(), ranges.end());
    for (std::size_t i = 1; i < ranges.size(); ++i)
      EXPECT_LE(ranges[i - 1].second, ranges[i].first);
  }
}

TEST(BucketingSampler, DeterministicPerSeedAndEpochAndShuffledAcrossEpochs) {
  const auto lengths = random_lengths(3, 2000);
  BucketingSampler a(lengths, 64, /*seed=*/11), b(lengths, 64, /*seed=*/11),
      c(lengths, 64, /*seed=*/12);
  EXPECT_EQ(a.epoch(0), b.epoch(0));
  EXPECT_EQ(a.epoch(3), b.epoch(3));
  EXPECT_NE(a.epoch(0), a.epoch(1));
  EXPECT_NE(a.epoch(0), c.epoch(0));
  // Batches are not in length order: short and long batches are interleaved.
  const Batches e = a.epoch(0);
  std::vector<int64_t> first_len;
  for (const auto& x : e) first_len.push_back(lengths[static_cast<std::size_t>(x[0])]);
  EXPECT_FALSE(std::is_sorted(first_len.begin(), first_len.end()));
  // Equal-length sequences are regrouped from one epoch to the next.
  std::set<std::vector<int64_t>> e0, e1;
  for (auto x : a.epoch(0)) {
    std::sort(x.begin(), x.end());
    e0.insert(x);
  }
  for (auto x : a.epoch(1)) {
    std::sort(x.begin(), x.end());
    e1.insert(x);
  }
  EXPECT_NE(e0, e1);
}

TEST(BucketingSampler, BeatsRandomBatchingOnPaddingEfficiency) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (int64_t pool : {0, 4}) {
    BucketingSampler s(random_lengths(seed, 3000), 32, seed, pool);
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      const seqpack::PaddingReport r = seqpack::padding_report(s, epoch);
      EXPECT_GE(r.bucketed.efficiency(), r.random.efficiency());
      EXPECT_EQ(r.bucketed.real_tokens, r.random.real_tokens);
      EXPECT_DOUBLE_EQ(r.packed.efficiency(), 1.0);
      EXPECT_EQ(r.packed.real_tokens, r.bucketed.real_tokens);
      // The figures are consistent with a direct count.
      EXPECT_EQ(r.bucketed.padded_slots,
                seqpack::padding_stats(s.lengths(), s.epoch(epoch)).padded_slots);
    }
  }
}

TEST(BucketingSampler, PoolsBucketWithinWindowsOfBatches) {
  const auto lengths = random_lengths(17, 1000);
  BucketingSampler s(lengths, 10, /*seed=*/5, /*pool_batches=*/3);
  const Batches b = s.epoch(2);
  EXPECT_TRUE(is_partition(b, 1000));
  // 1000 = 33 pools of 30 + one of 10: 33 * 3 + 1 batches.
  EXPECT_EQ(s.num_batches(), 100);
  EXPECT_EQ(static_cast<int64_t>(b.size()), 100);
}

TEST(BucketingSampler, DropLastKeepsOnlyFullBatches) {
  BucketingSampler s(random_lengths(1, 105), 10, /*seed=*/1, /*pool_batches=*/0,
                     /*drop_last=*/true);
  const Batches b = s.epoch(0);
  EXPECT_EQ(static_cast<int64_t>(b.size()), 10);
  EXPECT_EQ(s.num_batches(), 10);
  for (const auto& x : b) EXPECT_EQ(x.size(), 10u);
  // Random batching drops the same way, so both statistics cover 100 sequences.
  const auto r = seqpack::random_batches(105, 10, 1, /*drop_last=*/true);
  EXPECT_EQ(r.size(), 10u);
}

TEST(BucketingSampler, EmptyDatasetAndZeroLengths) {
  BucketingSampler s({}, 4, 0);
  EXPECT_TRUE(s.epoch(0).empty());
  EXPECT_EQ(s.num_batches(), 0);
  BucketingSampler z({0, 0, 0}, 2, 0);
  const auto r = seqpack::padding_report(z);
  EXPECT_EQ(r.bucketed.padded_slots, 0);
  EXPECT_DOUBLE_EQ(r.bucketed.efficiency(), 1.0);
}

TEST(BucketingSampler, BadInputNamesTheValue) {
  expect_invalid([] { BucketingSampler({1, 2}, 0, 0); }, {"batch_size = 0"});
  expect_invalid([] { BucketingSampler({1, -3}, 2, 0); }, {"lengths[1] = -3"});
  expect_invalid([] { BucketingSampler({1}, 2, 0, -1); }, {"pool_batches = -1"});
  expect_invalid([] { BucketingSampler({1}, 2, 0).epoch(-2); }, {"epoch = -2"});
  expect_invalid([] { seqpack::random_batches(5, 0, 0); }, {"batch_size = 0"});
  expect_invalid([] { seqpack::random_batches(-1, 2, 0); }, {"n = -1"});
}

// ---------------------------------------------------------------------------
// Batching by max_tokens, shuffle = false, and the split among ranks.

namespace {

using seqpack::BucketingOptions;
using seqpack::DistributedBucketingSampler;
using PerRank = std::vector<Batches>;

BucketingOptions tokens_options(int64_t max_tokens, uint64_t seed, int64_t batch_size = 0) {
  BucketingOptions o;
  o.max_tokens = max_tokens;
  o.batch_size = batch_size;
  o.seed = seed;
  return o;
}

Batches sorted_batches(Batches b) {
  for (auto& x : b) std::sort(x.begin(), x.end());
  std::sort(b.begin(), b.end());
  return b;
}

// Long-tailed lengths: log-normal, 1..max_len (sentences, documents, audio).
std::vector<int64_t> long_tail_lengths(uint64_t seed, int64_t n, int64_t max_len) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> d(4.0, 1.0);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i)
    out.push_back(std::clamp<int64_t>(static_cast<int64_t>(d(rng)) + 1, 1, max_len));
  return out;
}

// Mean over steps of (most real tokens / fewest real tokens) across ranks.
double mean_imbalance(const PerRank& ranks, const std::vector<int64_t>& lengths) {
  const std::size_t steps = ranks[0].size();
  double sum = 0;
  for (std::size_t s = 0; s < steps; ++s) {
    int64_t lo = INT64_MAX, hi = 0;
    for (const Batches& r : ranks) {
      const int64_t t = seqpack::batch_tokens(lengths, {r[s]})[0];
      lo = std::min(lo, t);
      hi = std::max(hi, t);
    }
    sum += static_cast<double>(hi) / static_cast<double>(std::max<int64_t>(lo, 1));
  }
  return steps == 0 ? 1.0 : sum / static_cast<double>(steps);
}

// Same batch count on every rank, and every index once over all ranks.
::testing::AssertionResult is_even_partition(const PerRank& ranks, int64_t n) {
  Batches all;
  for (const Batches& r : ranks) {
    if (r.size() != ranks[0].size())
      return ::testing::AssertionFailure() << r.size() << " batches against " << ranks[0].size();
    for (const auto& b : r) {
      if (b.empty()) return ::testing::AssertionFailure() << "an empty batch";
      all.push_back(b);
    }
  }
  return is_partition(all, n);
}

}  // namespace

TEST(BucketingSampler, MaxTokensHandWorked) {
  // Sorted lengths 1 2 3 4 5 6, max_tokens 8 (size * longest <= 8):
  // {1, 2} (3 * 3 = 9 > 8), {3, 4} (2 * 4 = 8), {5} (2 * 6 = 12 > 8), {6}.
  BucketingOptions o = tokens_options(8, 0);
  o.shuffle = false;
  BucketingSampler s({1, 2, 3, 4, 5, 6}, o);
  EXPECT_EQ(s.epoch(0), (Batches{{0, 1}, {2, 3}, {4}, {5}}));
  EXPECT_EQ(s.epoch(4), s.epoch(0));  // no shuffling: the same every epoch
  EXPECT_EQ(s.num_batches(), 4);
  // The random baseline uses the mean batch size, 6 / 4 rounded = 2: three batches.
  const seqpack::PaddingReport r = seqpack::padding_report(s);
  EXPECT_EQ(r.num_batches, 4);
  EXPECT_EQ(r.bucketed.padded_slots, 2 * 2 + 2 * 4 + 5 + 6);
  EXPECT_EQ(r.random.real_tokens, 21);
  EXPECT_EQ(
      r.random.padded_slots,
      seqpack::padding_stats({1, 2, 3, 4, 5, 6}, seqpack::random_batches(6, 2, 0)).padded_slots);
  // Both bounds: batch_size 1 wins.
  o.batch_size = 1;
  EXPECT_EQ(BucketingSampler({1, 2, 3, 4, 5, 6}, o).epoch(0),
            (Batches{{0}, {1}, {2}, {3}, {4}, {5}}));
  // drop_last drops {6}? No: {6} is full (2 * 6 > 8); the pool's last batch
  // is only dropped when one more sequence would still fit.
  o.batch_size = 0;
  o.drop_last = true;
  EXPECT_EQ(BucketingSampler({1, 2, 3, 4, 5, 6}, o).epoch(0), (Batches{{0, 1}, {2, 3}, {4}, {5}}));
  // Lengths 2 2 2 3, max_tokens 9: {2, 2, 2} (4 * 3 = 12 > 9), then {3}, which
  // could take two more: dropped.
  EXPECT_EQ(BucketingSampler({2, 2, 2, 3}, o).epoch(0), (Batches{{0, 1, 2}}));
  // Zero-length sequences count as one token: max_tokens 2 gives pairs.
  o.drop_last = false;
  o.max_tokens = 2;
  EXPECT_EQ(BucketingSampler({0, 0, 0, 0, 0}, o).epoch(0), (Batches{{0, 1}, {2, 3}, {4}}));
}

TEST(BucketingSampler, MaxTokensBoundsEveryBatchAndCoversEveryIndex) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto lengths = long_tail_lengths(seed, 3000, 1000);
  for (int64_t pool : {0, 5}) {
    for (int64_t bs : {0, 16}) {
      SCOPED_TRACE("pool " + std::to_string(pool) + " batch_size " + std::to_string(bs));
      BucketingOptions o = tokens_options(1000, seed, bs);
      o.pool_batches = pool;
      BucketingSampler s(lengths, o);
      for (int64_t epoch = 0; epoch < 2; ++epoch) {
        const Batches b = s.epoch(epoch);
        ASSERT_TRUE(is_partition(b, 3000));
        EXPECT_EQ(s.num_batches(epoch), static_cast<int64_t>(b.size()));
        for (const auto& x : b) {
          int64_t longest = 0;
          for (int64_t i : x) longest = std::max(longest, lengths[static_cast<std::size_t>(i)]);
          EXPECT_LE(static_cast<int64_t>(x.size()) * longest, 1000);
          if (bs > 0) EXPECT_LE(static_cast<int64_t>(x.size()), bs);
        }
      }
      EXPECT_EQ(s.epoch(1), BucketingSampler(lengths, o).epoch(1));
      EXPECT_NE(s.epoch(0), s.epoch(1));
    }
  }
}

TEST(BucketingSampler, ShuffleFalseKeepsBatchesInLengthOrder) {
  const auto lengths = random_lengths(4, 500);
  BucketingOptions o;
  o.batch_size = 32;
  o.shuffle = false;
  const Batches b = BucketingSampler(lengths, o).epoch(3);
  ASSERT_TRUE(is_partition(b, 500));
  std::vector<int64_t> flat;
  for (const auto& x : b)
    for (int64_t i : x) flat.push_back(lengths[static_cast<std::size_t>(i)]);
  EXPECT_TRUE(std::is_sorted(flat.begin(), flat.end()));
}

TEST(BucketingSampler, OldConstructorKeepsItsBatches) {
  // The main job's checkpoints replay epochs: the options constructor with the
  // same settings must give the same batches as before.
  const auto lengths = random_lengths(8, 700);
  BucketingOptions o;
  o.batch_size = 16;
  o.seed = 3;
  o.pool_batches = 4;
  EXPECT_EQ(BucketingSampler(lengths, 16, 3, 4).epoch(2), BucketingSampler(lengths, o).epoch(2));
}

TEST(DistributeBatches, HandWorkedSteps) {
  // Lengths 1 1 2 2 3 3 4 4, batches of 2 without shuffling: {0, 1} (2 tokens),
  // {2, 3} (4), {4, 5} (6), {6, 7} (8).
  const std::vector<int64_t> lengths{1, 1, 2, 2, 3, 3, 4, 4};
  BucketingOptions o;
  o.batch_size = 2;
  o.shuffle = false;
  EXPECT_EQ(DistributedBucketingSampler(lengths, o, 2, 0).all_ranks(0),
            (PerRank{{{0, 1}, {4, 5}}, {{2, 3}, {6, 7}}}));
  // 3 ranks, 4 batches: {6, 7} is halved into {6} and {7} (4 tokens each),
  // then {4, 5} into {4} and {5} (3 each); sorted by tokens: {0, 1} 2, {4} 3,
  // {5} 3, {2, 3} 4, {6} 4, {7} 4, two steps of three.
  EXPECT_EQ(DistributedBucketingSampler(lengths, o, 3, 1).all_ranks(0),
            (PerRank{{{0, 1}, {2, 3}}, {{4}, {6}}, {{5}, {7}}}));
  EXPECT_EQ(DistributedBucketingSampler(lengths, o, 3, 2).epoch(0), (Batches{{5}, {7}}));
  // drop_last drops the lightest batch instead.
  o.drop_last = true;
  EXPECT_EQ(DistributedBucketingSampler(lengths, o, 3, 0).all_ranks(0),
            (PerRank{{{2, 3}}, {{4, 5}}, {{6, 7}}}));
  o.drop_last = false;
  // 8 ranks: every sequence alone; 9 ranks cannot each get one.
  EXPECT_TRUE(is_even_partition(DistributedBucketingSampler(lengths, o, 8, 0).all_ranks(0), 8));
  expect_invalid([&] { DistributedBucketingSampler(lengths, o, 9, 0).epoch(0); },
                 {"8 sequences", "9 ranks"});
  o.drop_last = true;
  EXPECT_TRUE(DistributedBucketingSampler(lengths, o, 9, 0).epoch(0).empty());
}

TEST(DistributeBatches, EvenPartitionReproducibleFromTheSeed) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto lengths = random_lengths(seed, 1001);
  for (int64_t R : {1, 2, 3, 7, 8}) {
    for (bool by_tokens : {false, true}) {
      SCOPED_TRACE("ranks " + std::to_string(R) + (by_tokens ? " max_tokens" : " batch_size"));
      BucketingOptions o = by_tokens ? tokens_options(256, seed) : BucketingOptions{};
      if (!by_tokens) {
        o.batch_size = 24;
        o.seed = seed;
      }
      o.pool_batches = 10;
      const DistributedBucketingSampler d(lengths, o, R, 0);
      for (int64_t epoch = 0; epoch < 3; ++epoch) {
        const PerRank all = d.all_ranks(epoch);
        ASSERT_TRUE(is_even_partition(all, 1001));
        // Each rank computes its own share from the seed alone.
        for (int64_t r = 0; r < R; ++r) {
          EXPECT_EQ(DistributedBucketingSampler(lengths, o, R, r).epoch(epoch),
                    all[static_cast<std::size_t>(r)]);
        }
      }
      if (R > 1) EXPECT_NE(d.epoch(0), d.epoch(1));
      // drop_last: still equal counts, a multiple of R of the sampler's batches kept.
      o.drop_last = true;
      const PerRank dropped = DistributedBucketingSampler(lengths, o, R, 0).all_ranks(0);
      for (const Batches& r : dropped) EXPECT_EQ(r.size(), dropped[0].size());
      EXPECT_EQ(static_cast<int64_t>(dropped[0].size()),
                BucketingSampler(lengths, o).num_batches(0) / R);
    }
  }
}

TEST(DistributeBatches, TokensBalancedAcrossRanks) {
  // Mean over an epoch of max/min real tokens across ranks <= 1.10 when
  // batching by max_tokens, on long-tailed lengths and on word lengths.
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto long_tail = long_tail_lengths(seed, 20000, 2000);
  // Without zero-length words: a batch of them has no real tokens to compare.
  auto words = random_lengths(seed, 20000);
  for (int64_t& l : words) l = std::max<int64_t>(l, 1);
  for (int64_t R : {2, 3, 8}) {
    for (int64_t pool : {0, 100}) {
      SCOPED_TRACE("ranks " + std::to_string(R) + " pool " + std::to_string(pool));
      BucketingOptions o = tokens_options(4096, seed);
      o.pool_batches = pool;
      const double lt =
          mean_imbalance(DistributedBucketingSampler(long_tail, o, R, 0).all_ranks(1), long_tail);
      EXPECT_LE(lt, 1.10) << "long tail";
      o.max_tokens = 1024;
      const double w =
          mean_imbalance(DistributedBucketingSampler(words, o, R, 0).all_ranks(1), words);
      EXPECT_LE(w, 1.10) << "words";
    }
  }
}

TEST(DistributeBatches, TokensBalancedOnTheMainJobsData) {
  const seqpack::DatasetSplit split = seqpack::load_language_id();
  const auto lengths = seqpack::lengths_of(split.train);
  for (int64_t R : {2, 3, 8}) {
    BucketingOptions o = tokens_options(2048, 0);
    const double m =
        mean_imbalance(DistributedBucketingSampler(lengths, o, R, 0).all_ranks(0), lengths);
    EXPECT_LE(m, 1.10) << R << " ranks";
  }
}

TEST(DistributeBatches, BadInputNamesTheValue) {
  BucketingOptions o;
  o.batch_size = 2;
  expect_invalid([&] { DistributedBucketingSampler({1, 2}, o, 0, 0); }, {"num_replicas = 0"});
  expect_invalid([&] { DistributedBucketingSampler({1, 2}, o, 2, 2); }, {"rank = 2", "[0, 2)"});
  expect_invalid([&] { DistributedBucketingSampler({1, 2}, o, 2, -1); }, {"rank = -1"});
  expect_invalid([&] { DistributedBucketingSampler({1, 2}, o, 2, 0).epoch(-1); }, {"epoch = -1"});
  expect_invalid(
      [] {
        seqpack::distribute_batches({{0, 5}}, {1, 2}, 2, 0, 0, true, false);
      },
      {"batches[0][1] = 5"});
  BucketingOptions t;
  expect_invalid([&] { BucketingSampler({1}, t); }, {"batch_size = 0 and max_tokens = 0"});
  t.max_tokens = -4;
  expect_invalid([&] { BucketingSampler({1}, t); }, {"max_tokens = -4"});
  t.max_tokens = 5;
  expect_invalid([&] { BucketingSampler({1, 6}, t); }, {"lengths[1] = 6", "max_tokens = 5"});
  t.batch_size = -2;
  expect_invalid([&] { BucketingSampler({1}, t); }, {"batch_size = -2"});
}
