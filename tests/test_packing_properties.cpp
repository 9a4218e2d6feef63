// Packing properties on random batches (zero lengths and ties included):
// pack -> pad and pad -> unpad round trips, the plan's definition, and the
// backward functions as adjoints of the forward ones. Every check compares with
// the sequences themselves, element by element, not with other packing code.
// Replay a failure with SEQPACK_TEST_SEED=<seed printed in the trace>.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "seqpack/packed_sequence.h"
#include "test_util.h"

namespace seqpack {
namespace {

struct Batch {
  std::vector<int64_t> lengths;
  Shape tail;
  DType dtype;
  std::vector<Tensor> seqs;
  int64_t row = 1;  // elements per step
};

Batch random_batch(std::mt19937_64& rng) {
  auto uni = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  Batch b;
  const int64_t batch = uni(1, 9);
  // A small length range makes ties and zeros frequent.
  const int64_t max_len = uni(0, 6);
  for (int64_t i = 0; i < batch; ++i) b.lengths.push_back(uni(0, max_len));
  const int64_t ndims = uni(0, 3);
  for (int64_t d = 0; d < ndims; ++d) b.tail.push_back(uni(1, 3));
  for (int64_t s : b.tail) b.row *= s;
  const DType dtypes[] = {DType::f32, DType::f64, DType::i64};
  b.dtype = dtypes[uni(0, 2)];
  for (int64_t len : b.lengths) {
    Shape shape = {len};
    shape.insert(shape.end(), b.tail.begin(), b.tail.end());
    Tensor t = Tensor::empty(shape, b.dtype);
    std::vector<double> vals(static_cast<std::size_t>(t.numel()));
    // Distinct whole numbers (never equal to the padding value below), exact in every dtype.
    for (auto& v : vals) v = static_cast<double>(uni(1, 1000000));
    for (int64_t i = 0; i < t.numel(); ++i) {
      switch (b.dtype) {
        case DType::f32: t.data<float>()[i] = static_cast<float>(vals[i]); break;
        case DType::f64: t.data<double>()[i] = vals[i]; break;
        case DType::i64: t.data<int64_t>()[i] = static_cast<int64_t>(vals[i]); break;
      }
    }
    b.seqs.push_back(t);
  }
  return b;
}

// Element k of step t of sequence b in a padded tensor.
double padded_at(const Tensor& p, bool batch_first, int64_t t, int64_t b, int64_t k, int64_t row) {
  const int64_t T = p.size(batch_first ? 1 : 0), B = p.size(batch_first ? 0 : 1);
  const int64_t r = batch_first ? b * T + t : t * B + b;
  return p.item_as_double(r * row + k);
}

// Checks `padded` holds each sequence at its steps and `pad` elsewhere.
::testing::AssertionResult padded_matches(const Batch& bt, const Tensor& padded, bool batch_first,
                                          double pad, PaddingSide side, int64_t T) {
  const int64_t B = static_cast<int64_t>(bt.seqs.size());
  Shape want = batch_first ? Shape{B, T} : Shape{T, B};
  want.insert(want.end(), bt.tail.begin(), bt.tail.end());
  if (padded.shape() != want) {
    return ::testing::AssertionFailure() << "shape " << shape_str(padded.shape()) << " != "
                                         << shape_str(want);
  }
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = bt.lengths[b];
    const int64_t start = side == PaddingSide::left ? T - len : 0;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < bt.row; ++k) {
        const bool inside = t >= start && t < start + len;
        const double e = inside ? bt.seqs[b].item_as_double((t - start) * bt.row + k) : pad;
        const double a = padded_at(padded, batch_first, t, b, k, bt.row);
        if (a != e) {
          return ::testing::AssertionFailure() << "sequence " << b << " step " << t << " element "
                                               << k << ": got " << a << " expected " << e;
        }
      }
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult same_values(const Tensor& a, const Tensor& e) {
  return testing::all_close(a, e, 0.0, 0.0);
}

constexpr int kTrials = 300;

TEST(PackingProperties, PlanMatchesItsDefinition) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < kTrials; ++trial) {
    const Batch bt = random_batch(rng);
    SCOPED_TRACE("trial " + std::to_string(trial));
    const PackingPlan plan = PackingPlan::from_lengths(bt.lengths, /*enforce_sorted=*/false);
    const int64_t longest = *std::max_element(bt.lengths.begin(), bt.lengths.end());
    ASSERT_EQ(plan.max_len(), longest);
    for (int64_t t = 0; t < longest; ++t) {
      const int64_t longer = std::count_if(bt.lengths.begin(), bt.lengths.end(),
                                           [&](int64_t l) { return l > t; });
      EXPECT_EQ(plan.batch_sizes()[t], longer) << "t = " << t;
    }
    // Stable: non-increasing lengths, ties in increasing caller index.
    const auto& s = plan.sorted_indices();
    for (std::size_t k = 1; k < s.size(); ++k) {
      const int64_t a = bt.lengths[s[k - 1]], b = bt.lengths[s[k]];
      EXPECT_TRUE(a > b || (a == b && s[k - 1] < s[k])) << "sorted_indices[" << k << "]";
    }
    for (std::size_t k = 0; k < s.size(); ++k) EXPECT_EQ(plan.unsorted_indices()[s[k]], (int64_t)k);
    // The plan of the packed result is the same plan.
    const PackedSequence p = pack_sequence(bt.seqs, /*enforce_sorted=*/false);
    const PackingPlan again = PackingPlan::from_packed(p);
    EXPECT_EQ(again.lengths(), bt.lengths);
    EXPECT_EQ(again.padded_index(), plan.padded_index());
    EXPECT_EQ(again.offsets(), plan.offsets());
  }
}

TEST(PackingProperties, PackThenPadRoundTrip) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < kTrials; ++trial) {
    const Batch bt = random_batch(rng);
    SCOPED_TRACE("trial " + std::to_string(trial) + " lengths " + shape_str(bt.lengths) +
                 " tail " + shape_str(bt.tail) + " " + dtype_name(bt.dtype));
    const bool bf = trial % 2 == 0;
    const double pad = -1.0 - trial % 3;
    const int64_t longest = *std::max_element(bt.lengths.begin(), bt.lengths.end());
    const int64_t extra = trial % 4 == 0 ? 2 : 0;

    // pack_sequence -> pad_packed_sequence.
    const PackedSequence p = pack_sequence(bt.seqs, /*enforce_sorted=*/false);
    auto [out, lengths] = pad_packed_sequence(p, bf, pad, longest + extra);
    EXPECT_EQ(lengths.to_vector<int64_t>(), bt.lengths);
    EXPECT_TRUE(padded_matches(bt, out, bf, pad, PaddingSide::right, longest + extra));

    // pad_sequence -> pack_padded_sequence -> unpack_sequence.
    const Tensor padded = pad_sequence(bt.seqs, bf, pad);
    EXPECT_TRUE(padded_matches(bt, padded, bf, pad, PaddingSide::right, longest));
    EXPECT_TRUE(padded_matches(bt, pad_sequence(bt.seqs, bf, pad, PaddingSide::left), bf, pad,
                               PaddingSide::left, longest));
    const PackedSequence q = pack_padded_sequence(padded, bt.lengths, bf, /*enforce_sorted=*/false);
    EXPECT_TRUE(same_values(q.data, p.data));
    const auto back = unpack_sequence(q);
    ASSERT_EQ(back.size(), bt.seqs.size());
    for (std::size_t b = 0; b < back.size(); ++b) EXPECT_TRUE(same_values(back[b], bt.seqs[b]));

    // The sorted path: the same sequences in sorted order, enforce_sorted=true.
    std::vector<Tensor> sorted_seqs;
    const PackingPlan plan = PackingPlan::from_lengths(bt.lengths, false);
    for (int64_t i : plan.sorted_indices()) {
      sorted_seqs.push_back(bt.seqs[i]);
    }
    const PackedSequence r = pack_sequence(sorted_seqs, /*enforce_sorted=*/true);
    EXPECT_TRUE(same_values(r.data, p.data));
    EXPECT_TRUE(same_values(r.batch_sizes, p.batch_sizes));
  }
}

TEST(PackingProperties, PadThenUnpadRoundTripLeavesInputAlone) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < kTrials; ++trial) {
    const Batch bt = random_batch(rng);
    SCOPED_TRACE("trial " + std::to_string(trial));
    const bool bf = trial % 2 == 1;
    const Tensor padded = pad_sequence(bt.seqs, bf);
    const Tensor before = padded.clone();
    const auto back = unpad_sequence(padded, bt.lengths, bf);
    ASSERT_EQ(back.size(), bt.seqs.size());
    for (std::size_t b = 0; b < back.size(); ++b) EXPECT_TRUE(same_values(back[b], bt.seqs[b]));
    EXPECT_TRUE(same_values(padded, before));
    EXPECT_EQ(padded.shape(), before.shape());
  }
}

// Sum over i of a[i] * b[i], in double (exact for the small whole numbers used).
double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.item_as_double(i) * b.item_as_double(i);
  return s;
}

TEST(PackingProperties, BackwardsAreAdjoints) {
  // For a linear map A, <A x, g> = <x, A^T g>: pack's backward is pack's
  // transpose and pad's backward is pad's transpose.
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> small(-9, 9);
  auto random_like = [&](Shape shape) {
    Tensor t = Tensor::empty(std::move(shape), DType::f64);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = small(rng);
    return t;
  };
  for (int trial = 0; trial < kTrials; ++trial) {
    const Batch bt = random_batch(rng);
    SCOPED_TRACE("trial " + std::to_string(trial));
    const bool bf = trial % 2 == 0;
    const PackingPlan plan = PackingPlan::from_lengths(bt.lengths, false);
    const int64_t T = plan.max_len() + trial % 3, B = plan.batch();
    Shape padded_shape = bf ? Shape{B, T} : Shape{T, B};
    padded_shape.insert(padded_shape.end(), bt.tail.begin(), bt.tail.end());
    Shape rows_shape = {plan.total_rows()};
    rows_shape.insert(rows_shape.end(), bt.tail.begin(), bt.tail.end());
    const Tensor x = random_like(padded_shape), g = random_like(rows_shape);
    const Tensor packed = pack_padded_sequence(x, bt.lengths, bf, false).data;
    EXPECT_EQ(dot(packed, g), dot(x, pack_padded_sequence_backward(g, plan, T, bf)));
    PackedSequence ps{g, plan.batch_sizes_tensor(), plan.sorted_indices_tensor(),
                      plan.unsorted_indices_tensor()};
    const Tensor y = random_like(padded_shape);
    const Tensor unpacked = pad_packed_sequence(ps, bf, 0.0, T).first;
    EXPECT_EQ(dot(unpacked, y), dot(g, pad_packed_sequence_backward(y, plan, bf)));
  }
}

}  // namespace
}  // namespace seqpack
