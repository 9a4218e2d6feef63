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

#include <sstream>
#include <stdexcept>
#include <string>

#include "seqpack/packed_sequence.h"
#include "test_util.h"

namespace seqpack {
namespace {

using V = std::vector<int64_t>;

using seqpack::testing::expect_invalid;

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
  expect_invalid([&] { p.validate(); }, {"sorted_indices[2] = 0 repeats sorted_indices[1]"});
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

// ---------------------------------------------------------------------------
// The public functions on the running example.

std::vector<Tensor> example_sequences() {
  return {Tensor::from_vector<float>({1, 2, 3}), Tensor::from_vector<float>({4, 5}),
          Tensor::from_vector<float>({6, 7, 8, 9})};
}

TEST(Packing, PackSequenceExample) {
  const PackedSequence p = pack_sequence(example_sequences(), /*enforce_sorted=*/false);
  EXPECT_EQ(p.data.to_vector<float>(), (std::vector<float>{6, 1, 4, 7, 2, 5, 8, 3, 9}));
  EXPECT_EQ(p.batch_sizes.to_vector<int64_t>(), (V{3, 3, 2, 1}));
  EXPECT_EQ(p.sorted_indices.to_vector<int64_t>(), (V{2, 0, 1}));
  EXPECT_EQ(p.unsorted_indices.to_vector<int64_t>(), (V{1, 2, 0}));
  EXPECT_EQ(p.to_string(),
            "PackedSequence(data=tensor([6., 1., 4., 7., 2., 5., 8., 3., 9.]), "
            "batch_sizes=tensor([3, 3, 2, 1]), sorted_indices=tensor([2, 0, 1]), "
            "unsorted_indices=tensor([1, 2, 0]))");
  const auto s = example_sequences();
  const PackedSequence q = pack_sequence({s[2], s[0], s[1]});
  EXPECT_EQ(q.to_string(),
            "PackedSequence(data=tensor([6., 1., 4., 7., 2., 5., 8., 3., 9.]), "
            "batch_sizes=tensor([3, 3, 2, 1]), sorted_indices=None, unsorted_indices=None)");
  std::ostringstream streamed;  // operator<< prints the same, as print(p) does in Python
  streamed << p << '|' << q;
  EXPECT_EQ(streamed.str(), p.to_string() + "|" + q.to_string());
}

TEST(Packing, PadSequenceExample) {
  const auto s = example_sequences();
  EXPECT_EQ(pad_sequence(s).to_vector<float>(),
            (std::vector<float>{1, 4, 6, 2, 5, 7, 3, 0, 8, 0, 0, 9}));
  EXPECT_EQ(pad_sequence(s, /*batch_first=*/true, -1.0).to_vector<float>(),
            (std::vector<float>{1, 2, 3, -1, 4, 5, -1, -1, 6, 7, 8, 9}));
  EXPECT_EQ(pad_sequence(s, /*batch_first=*/true, 0.0, PaddingSide::left).to_vector<float>(),
            (std::vector<float>{0, 1, 2, 3, 0, 0, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(pad_sequence(s).shape(), (Shape{4, 3}));
}

TEST(Packing, PadPackedExampleRoundTrip) {
  const Tensor padded = pad_sequence(example_sequences(), /*batch_first=*/true);
  const PackedSequence p = pack_padded_sequence(padded, V{3, 2, 4}, /*batch_first=*/true,
                                                /*enforce_sorted=*/false);
  EXPECT_EQ(p.data.to_vector<float>(), (std::vector<float>{6, 1, 4, 7, 2, 5, 8, 3, 9}));
  auto [out, lengths] = pad_packed_sequence(p, /*batch_first=*/true, -1.0, 5);
  EXPECT_EQ(out.shape(), (Shape{3, 5}));
  EXPECT_EQ(out.to_vector<float>(),
            (std::vector<float>{1, 2, 3, -1, -1, 4, 5, -1, -1, -1, 6, 7, 8, 9, -1}));
  EXPECT_EQ(lengths.dtype(), DType::i64);
  EXPECT_EQ(lengths.to_vector<int64_t>(), (V{3, 2, 4}));
  const auto seqs = unpack_sequence(p);
  ASSERT_EQ(seqs.size(), 3u);
  EXPECT_EQ(seqs[1].to_vector<float>(), (std::vector<float>{4, 5}));
  EXPECT_EQ(seqs[2].to_vector<float>(), (std::vector<float>{6, 7, 8, 9}));
  const auto un = unpad_sequence(padded, {3, 2, 4}, /*batch_first=*/true);
  EXPECT_EQ(un[0].to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(un[1].shape(), (Shape{2}));
}

TEST(Packing, TensorLengthsAndFeatureRows) {
  // Two features per step; int64 data; lengths as a tensor.
  const Tensor padded =
      Tensor::from_vector<int64_t>({1, 10, 3, 30, 2, 20, 0, 0}, Shape{2, 2, 2});
  const PackedSequence p = pack_padded_sequence(padded, Tensor::from_vector<int64_t>({2, 1}));
  EXPECT_EQ(p.data.shape(), (Shape{3, 2}));
  EXPECT_EQ(p.data.to_vector<int64_t>(), (V{1, 10, 3, 30, 2, 20}));
  // Whole-number float lengths are accepted as PyTorch's as_tensor(int64) does.
  const PackedSequence q = pack_padded_sequence(padded, Tensor::from_vector<double>({2, 1}));
  EXPECT_EQ(q.data.to_vector<int64_t>(), (V{1, 10, 3, 30, 2, 20}));
}

TEST(Packing, ZeroLengthSequences) {
  const std::vector<Tensor> seqs = {Tensor::from_vector<float>({1, 2}),
                                    Tensor::zeros({0}, DType::f32),
                                    Tensor::from_vector<float>({3})};
  const Tensor padded = pad_sequence(seqs, false, -7.0);
  EXPECT_EQ(padded.to_vector<float>(), (std::vector<float>{1, -7, 3, 2, -7, -7}));
  const PackedSequence p = pack_sequence(seqs, /*enforce_sorted=*/false);
  EXPECT_EQ(p.data.to_vector<float>(), (std::vector<float>{1, 3, 2}));
  EXPECT_EQ(p.batch_sizes.to_vector<int64_t>(), (V{2, 1}));
  EXPECT_EQ(p.sorted_indices.to_vector<int64_t>(), (V{0, 2, 1}));
  EXPECT_EQ(p.batch_size(), 3);
  auto [out, lengths] = pad_packed_sequence(p, /*batch_first=*/true, -1.0);
  EXPECT_EQ(out.to_vector<float>(), (std::vector<float>{1, 2, -1, -1, 3, -1}));
  EXPECT_EQ(lengths.to_vector<int64_t>(), (V{2, 0, 1}));
  const auto back = unpack_sequence(p);
  EXPECT_EQ(back[1].shape(), (Shape{0}));
  // Sorted with a zero-length tail: indices are kept so the batch size survives.
  const PackedSequence s = pack_padded_sequence(padded, V{2, 1, 0}, false, /*enforce_sorted=*/true);
  EXPECT_EQ(s.batch_size(), 3);
  EXPECT_EQ(pad_packed_sequence(s).second.to_vector<int64_t>(), (V{2, 1, 0}));
  // Every sequence empty: no rows at all.
  const PackedSequence e = pack_padded_sequence(padded, V{0, 0, 0}, false, false);
  EXPECT_EQ(e.data.shape(), (Shape{0}));
  EXPECT_EQ(e.batch_sizes.numel(), 0);
  auto [eo, el] = pad_packed_sequence(e, false, 5.0, 2);
  EXPECT_EQ(eo.shape(), (Shape{2, 3}));
  EXPECT_EQ(eo.to_vector<float>(), (std::vector<float>(6, 5.f)));
  EXPECT_EQ(el.to_vector<int64_t>(), (V{0, 0, 0}));
  EXPECT_EQ(unpad_sequence(padded, {0, 2, 1})[0].shape(), (Shape{0}));
}

TEST(Packing, InvertPermutationAndTranspose) {
  EXPECT_EQ(invert_permutation(Tensor::from_vector<int64_t>({2, 0, 1})).to_vector<int64_t>(),
            (V{1, 2, 0}));
  EXPECT_FALSE(invert_permutation(Tensor()).defined());
  const Tensor t = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, Shape{2, 3});
  const Tensor u = transpose01(t);
  EXPECT_EQ(u.shape(), (Shape{3, 2}));
  EXPECT_EQ(u.to_vector<double>(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
}

TEST(Packing, BackwardByDefinition) {
  // d(pack)/d(padded) scatters; d(pad)/d(packed) gathers, so pack's backward of
  // rows 1..9 is the padding of those rows with zeros, and vice versa.
  const PackingPlan plan = PackingPlan::from_lengths({3, 2, 4}, /*enforce_sorted=*/false);
  const Tensor g = Tensor::from_vector<double>({6, 1, 4, 7, 2, 5, 8, 3, 9});
  const Tensor gp = pack_padded_sequence_backward(g, plan, 5, /*batch_first=*/true);
  EXPECT_EQ(gp.shape(), (Shape{3, 5}));
  EXPECT_EQ(gp.to_vector<double>(),
            (std::vector<double>{1, 2, 3, 0, 0, 4, 5, 0, 0, 0, 6, 7, 8, 9, 0}));
  EXPECT_EQ(pad_packed_sequence_backward(gp, plan, /*batch_first=*/true).to_vector<double>(),
            g.to_vector<double>());
}

// ---------------------------------------------------------------------------
// Every rejected input of the public functions.

TEST(PackingErrors, LengthsCountDiffersFromBatch) {
  const Tensor x = Tensor::zeros({4, 3, 2}, DType::f32);
  expect_invalid([&] { pack_padded_sequence(x, V{4, 3}); }, {"2 lengths", "batch size 3"});
  expect_invalid([&] { pack_padded_sequence(x, V{4, 3, 2}, /*batch_first=*/true); },
                 {"3 lengths", "batch size 4", "batch_first=true"});
  expect_invalid([&] { unpad_sequence(x, {1}); }, {"1 lengths", "batch size 3"});
}

TEST(PackingErrors, LengthExceedsPaddedLength) {
  const Tensor x = Tensor::zeros({5, 4}, DType::f32);
  expect_invalid([&] { pack_padded_sequence(x, V{5, 3, 7, 1}, false, false); },
                 {"lengths[2] = 7 exceeds the padded length 5"});
  expect_invalid([&] { unpad_sequence(x, {5, 3, 7, 1}); }, {"lengths[2] = 7", "padded length 5"});
}

TEST(PackingErrors, NegativeLength) {
  const Tensor x = Tensor::zeros({5, 2}, DType::f32);
  expect_invalid([&] { pack_padded_sequence(x, V{3, -2}); }, {"lengths[1] = -2", "negative"});
  expect_invalid([&] { unpad_sequence(x, {-1, 3}); }, {"lengths[0] = -1", "negative"});
}

TEST(PackingErrors, UnsortedWithEnforceSorted) {
  const Tensor x = Tensor::zeros({5, 3}, DType::f32);
  expect_invalid([&] { pack_padded_sequence(x, V{3, 5, 1}); },
                 {"pack_padded_sequence", "lengths[1] = 5", "enforce_sorted=false"});
  expect_invalid([&] { pack_sequence(example_sequences()); },
                 {"pack_sequence", "lengths[2] = 4", "enforce_sorted=false"});
}

TEST(PackingErrors, TotalLengthTooSmall) {
  const PackedSequence p = pack_sequence(example_sequences(), false);
  expect_invalid([&] { pad_packed_sequence(p, false, 0.0, 3); },
                 {"total_length = 3", "longest sequence length 4"});
}

TEST(PackingErrors, MismatchedSequences) {
  const std::vector<Tensor> shapes = {Tensor::zeros({3, 2}, DType::f32),
                                      Tensor::zeros({2, 3}, DType::f32)};
  expect_invalid([&] { pad_sequence(shapes); }, {"sequences[1]", "[2, 3]", "[3, 2]"});
  expect_invalid([&] { pack_sequence(shapes); }, {"sequences[1]", "[2, 3]"});
  const std::vector<Tensor> dtypes = {Tensor::zeros({3, 2}, DType::f32),
                                      Tensor::zeros({2, 2}, DType::f64)};
  expect_invalid([&] { pad_sequence(dtypes); }, {"sequences[1]", "float64", "float32"});
  expect_invalid([&] { pack_sequence(dtypes, false); }, {"sequences[1]", "float64"});
  const std::vector<Tensor> scalar = {Tensor::zeros({3}, DType::f32), Tensor::zeros({}, DType::f32)};
  expect_invalid([&] { pad_sequence(scalar); }, {"sequences[1]", "shape []"});
}

TEST(PackingErrors, EmptyListOfSequences) {
  expect_invalid([] { pad_sequence({}); }, {"pad_sequence", "empty list"});
  expect_invalid([] { pack_sequence({}); }, {"pack_sequence", "empty list"});
}

TEST(PackingErrors, TooFewDimensions) {
  const Tensor x = Tensor::zeros({5}, DType::f32);
  expect_invalid([&] { pack_padded_sequence(x, V{5}); }, {"at least 2 dimensions", "[5]"});
  expect_invalid([&] { unpad_sequence(x, {5}); }, {"at least 2 dimensions", "[5]"});
  expect_invalid([&] { transpose01(x); }, {"[5]"});
}

TEST(PackingErrors, BadLengthsTensor) {
  const Tensor x = Tensor::zeros({3, 2}, DType::f32);
  expect_invalid([&] { pack_padded_sequence(x, Tensor::zeros({2, 1}, DType::i64)); },
                 {"1-D", "[2, 1]"});
  expect_invalid([&] { pack_padded_sequence(x, Tensor::from_vector<float>({3, 1.5f})); },
                 {"lengths[1] = 1.5 is not a whole number"});
}

TEST(PackingErrors, HandBuiltPackedSequenceInPublicFunctions) {
  PackedSequence p = example_packed();
  p.batch_sizes = Tensor::from_vector<int64_t>({3, 2, 3, 1});
  expect_invalid([&] { pad_packed_sequence(p); }, {"pad_packed_sequence", "batch_sizes[2] = 3"});
  expect_invalid([&] { unpack_sequence(p); }, {"unpack_sequence", "batch_sizes[2] = 3"});
  p = example_packed();
  p.unsorted_indices = Tensor::from_vector<int64_t>({1, 1, 0});
  expect_invalid([&] { pad_packed_sequence(p); }, {"unsorted_indices[1] = 1"});
}

TEST(PackingErrors, InvertPermutation) {
  expect_invalid([] { invert_permutation(Tensor::from_vector<int64_t>({0, 2})); },
                 {"permutation[1] = 2", "out of range"});
  expect_invalid([] { invert_permutation(Tensor::from_vector<int64_t>({1, 1})); },
                 {"permutation[1] = 1", "repeats"});
  expect_invalid([] { invert_permutation(Tensor::from_vector<float>({0, 1})); }, {"float32"});
}

TEST(PackingErrors, BackwardShapes) {
  const PackingPlan plan = PackingPlan::from_lengths({3, 2, 4}, false);
  expect_invalid([&] {
    pack_padded_sequence_backward(Tensor::zeros({8}, DType::f64), plan, 4, false);
  }, {"[8]", "9 rows"});
  expect_invalid([&] {
    pack_padded_sequence_backward(Tensor::zeros({9}, DType::f64), plan, 3, false);
  }, {"padded_length = 3"});
  expect_invalid([&] {
    pad_packed_sequence_backward(Tensor::zeros({4, 2}, DType::f64), plan, false);
  }, {"batch size 2", "3 lengths"});
}

}  // namespace
}  // namespace seqpack
