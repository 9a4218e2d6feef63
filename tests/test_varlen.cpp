// Index maps between the varlen (cu_seqlens) layout and packed or padded batches.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "seqpack/packed_sequence.h"
#include "seqpack/varlen.h"
#include "test_util.h"

using seqpack::PackingPlan;
using seqpack::testing::expect_invalid;
using V = std::vector<int64_t>;

TEST(Varlen, HandWorked) {
  // a (2 steps), b (empty), c (3 steps). Packed, longest first:
  // c0 a0 | c1 a1 | c2; varlen: a0 a1 c0 c1 c2.
  const V lengths{2, 0, 3};
  EXPECT_EQ(seqpack::cu_seqlens_from_lengths(lengths), (V{0, 2, 2, 5}));
  EXPECT_EQ(seqpack::lengths_from_cu_seqlens({0, 2, 2, 5}, 5), lengths);
  const PackingPlan plan = PackingPlan::from_lengths(lengths, /*enforce_sorted=*/false);
  EXPECT_EQ(seqpack::varlen_gather_from_packed(plan), (V{1, 3, 0, 2, 4}));
  EXPECT_EQ(seqpack::packed_gather_from_varlen(plan), (V{2, 0, 3, 1, 4}));
  // Padded to T = 3: batch_first rows b * 3 + t, time-major rows t * 3 + b.
  EXPECT_EQ(seqpack::varlen_gather_from_padded(lengths, 3, /*batch_first=*/true),
            (V{0, 1, 6, 7, 8}));
  EXPECT_EQ(seqpack::varlen_gather_from_padded(lengths, 3, /*batch_first=*/false),
            (V{0, 3, 2, 5, 8}));
  // 5 = the padding row after the 5 varlen rows.
  EXPECT_EQ(seqpack::padded_gather_from_varlen(lengths, 3, /*batch_first=*/true),
            (V{0, 1, 5, 5, 5, 5, 2, 3, 4}));
  EXPECT_EQ(seqpack::padded_gather_from_varlen(lengths, 4, /*batch_first=*/false),
            (V{0, 5, 2, 1, 5, 3, 5, 5, 4, 5, 5, 5}));
  // Empty batch.
  EXPECT_EQ(seqpack::cu_seqlens_from_lengths({}), (V{0}));
  EXPECT_TRUE(seqpack::lengths_from_cu_seqlens({0}, 0).empty());
}

TEST(Varlen, RandomBatchesAgreeWithPackingAndPadding) {
  // Reference: sequence b's step t holds the value 1000 * b + t; every map
  // must move those values to where the layout says they belong.
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t B = 1 + static_cast<int64_t>(rng() % 9);
    V lengths;
    for (int64_t b = 0; b < B; ++b) lengths.push_back(static_cast<int64_t>(rng() % 6));
    V varlen;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < lengths[static_cast<std::size_t>(b)]; ++t)
        varlen.push_back(1000 * b + t);
    const PackingPlan plan = PackingPlan::from_lengths(lengths, false);
    V packed(static_cast<std::size_t>(plan.total_rows()));
    for (std::size_t r = 0; r < packed.size(); ++r) {
      const int64_t p = plan.padded_index()[r];
      packed[r] = 1000 * (p % B) + p / B;
    }
    const V to_varlen = seqpack::varlen_gather_from_packed(plan);
    const V to_packed = seqpack::packed_gather_from_varlen(plan);
    for (std::size_t v = 0; v < varlen.size(); ++v)
      ASSERT_EQ(packed[static_cast<std::size_t>(to_varlen[v])], varlen[v]) << v;
    for (std::size_t r = 0; r < packed.size(); ++r)
      ASSERT_EQ(varlen[static_cast<std::size_t>(to_packed[r])], packed[r]) << r;
    const int64_t T = 6;
    for (bool bf : {false, true}) {
      V padded(static_cast<std::size_t>(B * T), -1);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < lengths[static_cast<std::size_t>(b)]; ++t)
          padded[static_cast<std::size_t>(bf ? b * T + t : t * B + b)] = 1000 * b + t;
      const V from_padded = seqpack::varlen_gather_from_padded(lengths, T, bf);
      for (std::size_t v = 0; v < varlen.size(); ++v)
        ASSERT_EQ(padded[static_cast<std::size_t>(from_padded[v])], varlen[v]);
      V with_pad = varlen;
      with_pad.push_back(-1);
      const V to_padded = seqpack::padded_gather_from_varlen(lengths, T, bf);
      for (std::size_t p = 0; p < padded.size(); ++p)
        ASSERT_EQ(with_pad[static_cast<std::size_t>(to_padded[p])], padded[p]);
    }
  }
}

TEST(Varlen, BadInputNamesTheValue) {
  expect_invalid([] { seqpack::cu_seqlens_from_lengths({1, -2}); }, {"lengths[1] = -2"});
  expect_invalid([] { seqpack::lengths_from_cu_seqlens({}); }, {"empty"});
  expect_invalid([] { seqpack::lengths_from_cu_seqlens({1, 3}); }, {"cu_seqlens[0] = 1"});
  expect_invalid(
      [] {
        seqpack::lengths_from_cu_seqlens({0, 3, 2});
      },
      {"cu_seqlens[2] = 2", "cu_seqlens[1] = 3"});
  expect_invalid(
      [] {
        seqpack::lengths_from_cu_seqlens({0, 3}, 4);
      },
      {"cu_seqlens[1] = 3", "4 rows"});
  expect_invalid(
      [] {
        seqpack::varlen_gather_from_padded({2, 5}, 4, true);
      },
      {"lengths[1] = 5", "padded length 4"});
  expect_invalid([] { seqpack::padded_gather_from_varlen({-1}, 4, true); }, {"lengths[0] = -1"});
  expect_invalid([] { seqpack::padded_gather_from_varlen({1}, -4, true); }, {"padded_length = -4"});
}
