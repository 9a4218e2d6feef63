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
