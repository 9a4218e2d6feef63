// Packing: hand-worked examples and every rejected input.
//
// The running example: sequences a = [1, 2, 3], b = [4, 5], c = [6, 7, 8, 9]
// (one feature each). Sorted by decreasing length: c (4 steps), a (3), b (2),
// so sorted_indices = [2, 0, 1] and unsorted_indices = [1, 2, 0].
//   step 0: c0 a0 b0 = 6 1 4
//   step 1: c1 a1 b1 = 7 2 5
//   step 2: c2 a2    = 8 3
//   step 3: c3       = 9
// data = 6 1 4 7 2 5 8 3 9, batch_sizes = 3 3 2 1.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "seqpack/packed_sequence.h"
#include "test_util.h"

namespace seqpack {
namespace {

using V = std::vector<int64_t>;

// Runs `f`, expects std::invalid_argument, and checks the message contains
// every string in `needles`.
template <typename F>
void expect_invalid(F&& f, std::vector<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) {
      EXPECT_NE(msg.find(n), std::string::npos) << "message \"" << msg << "\" lacks \"" << n << "\"";
    }
  }
}

TEST(PackingPlan, HandWorkedExampleUnsorted) {
  const PackingPlan plan = PackingPlan::from_lengths({3, 2, 4}, /*enforce_sorted=*/false);
  EXPECT_EQ(plan.batch(), 3);
  EXPECT_EQ(plan.max_len(), 4);
  EXPECT_EQ(plan.total_rows(), 9);
  EXPECT_EQ(plan.lengths(), (V{3, 2, 4}));
  EXPECT_EQ(plan.batch_sizes(), (V{3, 3, 2, 1}));
  EXPECT_EQ(plan.sorted_indices(), (V{2, 0, 1}));
  EXPECT_EQ(plan.unsorted_indices(), (V{1, 2, 0}));
  EXPECT_EQ(plan.offsets(), (V{0, 3, 6, 8, 9}));
  // Row r holds (t, b) with index t * 3 + b: c0 a0 b0 | c1 a1 b1 | c2 a2 | c3.
  EXPECT_EQ(plan.padded_index(), (V{2, 0, 1, 5, 3, 4, 8, 6, 11}));
  EXPECT_FALSE(plan.has_zero_length());
  EXPECT_EQ(plan.sorted_indices_tensor().to_vector<int64_t>(), (V{2, 0, 1}));
  EXPECT_EQ(plan.unsorted_indices_tensor().to_vector<int64_t>(), (V{1, 2, 0}));
  EXPECT_EQ(plan.batch_sizes_tensor().to_vector<int64_t>(), (V{3, 3, 2, 1}));
}

TEST(PackingPlan, PackAndUnpackHandWorkedExample) {
  const PackingPlan plan = PackingPlan::from_lengths({3, 2, 4}, /*enforce_sorted=*/false);
  // Time-major padding [4, 3, 1] of a, b, c with 0 as padding.
  const Tensor padded =
      Tensor::from_vector<float>({1, 4, 6, 2, 5, 7, 3, 0, 8, 0, 0, 9}, Shape{4, 3, 1});
  const Tensor rows = plan.pack(padded);
  EXPECT_EQ(rows.shape(), (Shape{9, 1}));
  EXPECT_EQ(rows.to_vector<float>(), (std::vector<float>{6, 1, 4, 7, 2, 5, 8, 3, 9}));
  const Tensor back = plan.unpack(rows, 5, -1.0);
  EXPECT_EQ(back.shape(), (Shape{5, 3, 1}));
  EXPECT_EQ(back.to_vector<float>(),
            (std::vector<float>{1, 4, 6, 2, 5, 7, 3, -1, 8, -1, -1, 9, -1, -1, -1}));
}

TEST(PackingPlan, EnforceSortedHasNoIndexTensors) {
  const PackingPlan plan = PackingPlan::from_lengths({4, 3, 3, 1}, /*enforce_sorted=*/true);
  EXPECT_EQ(plan.batch_sizes(), (V{4, 3, 3, 1}));
  EXPECT_EQ(plan.sorted_indices(), (V{0, 1, 2, 3}));
  EXPECT_FALSE(plan.sorted_indices_tensor().defined());
  EXPECT_FALSE(plan.unsorted_indices_tensor().defined());
}

TEST(PackingPlan, TiesKeepCallersOrder) {
  const PackingPlan plan = PackingPlan::from_lengths({2, 3, 2, 3, 1}, /*enforce_sorted=*/false);
  EXPECT_EQ(plan.sorted_indices(), (V{1, 3, 0, 2, 4}));
  EXPECT_EQ(plan.batch_sizes(), (V{5, 4, 2}));
}

TEST(PackingPlan, ZeroLengthSequences) {
  const PackingPlan plan = PackingPlan::from_lengths({0, 2, 0, 1}, /*enforce_sorted=*/false);
  EXPECT_EQ(plan.sorted_indices(), (V{1, 3, 0, 2}));
  EXPECT_EQ(plan.batch_sizes(), (V{2, 1}));
  EXPECT_EQ(plan.total_rows(), 3);
  EXPECT_TRUE(plan.has_zero_length());
  // Sorted zero-length tails keep their indices so the batch size survives.
  const PackingPlan sorted = PackingPlan::from_lengths({2, 0}, /*enforce_sorted=*/true);
  EXPECT_EQ(sorted.sorted_indices_tensor().to_vector<int64_t>(), (V{0, 1}));
  const PackingPlan empty = PackingPlan::from_lengths({0, 0}, /*enforce_sorted=*/true);
  EXPECT_EQ(empty.max_len(), 0);
  EXPECT_EQ(empty.total_rows(), 0);
  EXPECT_EQ(empty.offsets(), (V{0}));
}

TEST(PackingPlan, FromPackedRecoversLengths) {
  PackedSequence p;
  p.data = Tensor::from_vector<float>({6, 1, 4, 7, 2, 5, 8, 3, 9});
  p.batch_sizes = Tensor::from_vector<int64_t>({3, 3, 2, 1});
  p.sorted_indices = Tensor::from_vector<int64_t>({2, 0, 1});
  p.unsorted_indices = Tensor::from_vector<int64_t>({1, 2, 0});
  EXPECT_EQ(p.batch_size(), 3);
  const PackingPlan plan = PackingPlan::from_packed(p);
  EXPECT_EQ(plan.lengths(), (V{3, 2, 4}));
  EXPECT_EQ(plan.padded_index(), (V{2, 0, 1, 5, 3, 4, 8, 6, 11}));
  EXPECT_FALSE(plan.enforce_sorted());

  // A hand-built order that differs from the stable sort on ties is kept as given.
  PackedSequence q;
  q.data = Tensor::from_vector<float>({1, 2, 3, 4});
  q.batch_sizes = Tensor::from_vector<int64_t>({2, 2});
  q.sorted_indices = Tensor::from_vector<int64_t>({1, 0});
  q.unsorted_indices = Tensor::from_vector<int64_t>({1, 0});
  EXPECT_EQ(PackingPlan::from_packed(q).padded_index(), (V{1, 0, 3, 2}));

  // Zero-length sequences: the indices carry the batch size.
  PackedSequence z;
  z.data = Tensor::from_vector<float>({5});
  z.batch_sizes = Tensor::from_vector<int64_t>({1});
  z.sorted_indices = Tensor::from_vector<int64_t>({2, 0, 1});
  z.unsorted_indices = Tensor::from_vector<int64_t>({1, 2, 0});
  EXPECT_EQ(z.batch_size(), 3);
  EXPECT_EQ(PackingPlan::from_packed(z).lengths(), (V{0, 0, 1}));
}

TEST(PackingPlanErrors, NegativeLength) {
  expect_invalid([] { PackingPlan::from_lengths({2, -1}, false); }, {"lengths[1] = -1"});
}

TEST(PackingPlanErrors, UnsortedWithEnforceSorted) {
  expect_invalid([] { PackingPlan::from_lengths({2, 3}, true); },
                 {"lengths[1] = 3", "lengths[0] = 2", "enforce_sorted=false"});
}

TEST(PackingPlanErrors, PackShapeMismatch) {
  const PackingPlan plan = PackingPlan::from_lengths({3, 2}, true);
  expect_invalid([&] { plan.pack(Tensor::zeros({3, 4}, DType::f32)); }, {"batch size 4", "2 lengths"});
  expect_invalid([&] { plan.pack(Tensor::zeros({2, 2}, DType::f32)); }, {"padded length 2", "3"});
  expect_invalid([&] { plan.pack(Tensor::zeros({3}, DType::f32)); }, {"shape [3]"});
  expect_invalid([&] { plan.unpack(Tensor::zeros({4}, DType::f32), 3, 0); }, {"[4]", "5 rows"});
  expect_invalid([&] { plan.unpack(Tensor::zeros({5}, DType::f32), 2, 0); }, {"total_length = 2"});
}

PackedSequence example_packed() {
  PackedSequence p;
  p.data = Tensor::from_vector<float>({6, 1, 4, 7, 2, 5, 8, 3, 9});
  p.batch_sizes = Tensor::from_vector<int64_t>({3, 3, 2, 1});
  p.sorted_indices = Tensor::from_vector<int64_t>({2, 0, 1});
  p.unsorted_indices = Tensor::from_vector<int64_t>({1, 2, 0});
  return p;
}

TEST(PackedSequenceValidate, AcceptsTheExample) { EXPECT_NO_THROW(example_packed().validate()); }

TEST(PackedSequenceValidate, BatchSizesIncrease) {
  PackedSequence p = example_packed();
  p.batch_sizes = Tensor::from_vector<int64_t>({3, 2, 3, 1});
  expect_invalid([&] { p.validate(); }, {"batch_sizes[2] = 3", "batch_sizes[1] = 2", "non-increasing"});
}

TEST(PackedSequenceValidate, BatchSizesDoNotAddUp) {
  PackedSequence p = example_packed();
  p.batch_sizes = Tensor::from_vector<int64_t>({3, 3, 2});
  expect_invalid([&] { p.validate(); }, {"add up to 8", "9 rows"});
}

TEST(PackedSequenceValidate, NonPositiveBatchSize) {
  PackedSequence p = example_packed();
  p.batch_sizes = Tensor::from_vector<int64_t>({3, 3, 3, 0});
  expect_invalid([&] { p.validate(); }, {"batch_sizes[3] = 0"});
}

TEST(PackedSequenceValidate, IndicesNotAPermutation) {
  PackedSequence p = example_packed();
  p.sorted_indices = Tensor::from_vector<int64_t>({2, 0, 0});
  expect_invalid([&] { p.validate(); }, {"sorted_indices[2] = 0", "repeats"});
  p.sorted_indices = Tensor::from_vector<int64_t>({2, 0, 3});
  expect_invalid([&] { p.validate(); }, {"sorted_indices[2] = 3", "out of range"});
  p = example_packed();
  p.unsorted_indices = Tensor::from_vector<int64_t>({-1, 2, 0});
  expect_invalid([&] { p.validate(); }, {"unsorted_indices[0] = -1"});
}

TEST(PackedSequenceValidate, IndicesNotInverse) {
  PackedSequence p = example_packed();
  p.unsorted_indices = Tensor::from_vector<int64_t>({2, 0, 1});
  expect_invalid([&] { p.validate(); }, {"not the inverse", "sorted_indices[0] = 2"});
}

TEST(PackedSequenceValidate, OnlyOneIndexTensor) {
  PackedSequence p = example_packed();
  p.unsorted_indices = Tensor();
  expect_invalid([&] { p.validate(); }, {"sorted_indices is given but unsorted_indices is not"});
  p = example_packed();
  p.sorted_indices = Tensor();
  expect_invalid([&] { p.validate(); }, {"unsorted_indices is given but sorted_indices is not"});
}

TEST(PackedSequenceValidate, IndicesTooShortOrWrongType) {
  PackedSequence p = example_packed();
  p.sorted_indices = Tensor::from_vector<int64_t>({1, 0});
  p.unsorted_indices = Tensor::from_vector<int64_t>({1, 0});
  expect_invalid([&] { p.validate(); }, {"2 entries", "batch_sizes[0] = 3"});
  p = example_packed();
  p.batch_sizes = Tensor::from_vector<float>({3, 3, 2, 1});
  expect_invalid([&] { p.validate(); }, {"batch_sizes", "float32"});
  p = example_packed();
  p.unsorted_indices = Tensor::from_vector<int64_t>({1, 2, 0, 3});
  expect_invalid([&] { p.validate(); }, {"3 entries", "4"});
}

}  // namespace
}  // namespace seqpack
