// Padded-batch helpers (last_valid_step and its backward, reverse_padded_sequence)
// and token batches.
#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <string>

#include "seqpack/data.h"
#include "seqpack/packed_sequence.h"
#include "test_util.h"

using seqpack::DType;
using seqpack::Shape;
using seqpack::Tensor;

namespace {

using seqpack::testing::expect_invalid;

Tensor random_tensor(std::mt19937_64& rng, Shape shape) {
  Tensor t = Tensor::empty(shape, DType::f64);
  std::normal_distribution<double> d;
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = d(rng);
  return t;
}

// What the seed documents build by hand: a one-hot mask over time selecting
// step len - 1, multiplied in and summed over time (time-major [T, B, F]).
Tensor masked_last_step(const Tensor& padded, const std::vector<int64_t>& lengths) {
  const int64_t T = padded.size(0), B = padded.size(1), F = padded.size(2);
  Tensor out = Tensor::zeros({B, F}, DType::f64);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < B; ++b) {
      const double mask = t == lengths[static_cast<std::size_t>(b)] - 1 ? 1.0 : 0.0;
      for (int64_t f = 0; f < F; ++f) {
        out.data<double>()[b * F + f] += mask * padded.data<double>()[(t * B + b) * F + f];
      }
    }
  }
  return out;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.item_as_double(i) * b.item_as_double(i);
  return s;
}

}  // namespace

TEST(LastValidStep, HandWorkedBatchFirst) {
  // [B=3, T=3, F=1]: sequences 1 2 3 | 4 5 _ | _ _ _ with lengths 3, 2, 0.
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 9, 9, 9, 9}, {3, 3, 1});
  Tensor y = seqpack::last_valid_step(x, {3, 2, 0}, /*batch_first=*/true);
  EXPECT_EQ(y.shape(), (Shape{3, 1}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{3, 5, 0}));
  Tensor g = seqpack::last_valid_step_backward(Tensor::from_vector<float>({10, 20, 30}, {3, 1}),
                                               {3, 2, 0}, 3, /*batch_first=*/true);
  EXPECT_EQ(g.to_vector<float>(), (std::vector<float>{0, 0, 10, 0, 20, 0, 0, 0, 0}));
}

TEST(LastValidStep, MatchesTheMaskConstructionTimeMajorAndBatchFirst) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const std::vector<int64_t>& lengths :
       std::vector<std::vector<int64_t>>{{4, 1, 3, 0, 4}, {1}, {2, 2, 2}, {0, 0}, {1, 6}}) {
    const int64_t T = 6, B = static_cast<int64_t>(lengths.size()), F = 3;
    Tensor tm = random_tensor(rng, {T, B, F});
    const Tensor expected = masked_last_step(tm, lengths);
    EXPECT_TRUE(seqpack::testing::all_close(seqpack::last_valid_step(tm, lengths, false), expected,
                                            0, 0, "time-major"));
    const Tensor bf = seqpack::transpose01(tm);
    EXPECT_TRUE(seqpack::testing::all_close(seqpack::last_valid_step(bf, lengths, true), expected,
                                            0, 0, "batch-first"));
  }
}

TEST(LastValidStep, BackwardIsTheAdjoint) {
  // For a linear map f, <g, f(x)> = <f^T(g), x> for all x, g.
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<int64_t> lengths = {3, 0, 5, 1};
  for (bool bf : {false, true}) {
    const Shape shape = bf ? Shape{4, 5, 2, 3} : Shape{5, 4, 2, 3};  // extra feature dims
    Tensor x = random_tensor(rng, shape);
    Tensor g = random_tensor(rng, {4, 2, 3});
    const Tensor y = seqpack::last_valid_step(x, lengths, bf);
    EXPECT_EQ(y.shape(), (Shape{4, 2, 3}));
    const Tensor gx = seqpack::last_valid_step_backward(g, lengths, 5, bf);
    EXPECT_EQ(gx.shape(), shape);
    EXPECT_NEAR(dot(g, y), dot(gx, x), 1e-12 * (1 + std::fabs(dot(g, y))));
  }
}

TEST(LastValidStep, WorksForEveryDtype) {
  Tensor x = Tensor::from_vector<int64_t>({1, 2, 3, 4}, {2, 2});  // [T=2, B=2]
  EXPECT_EQ(seqpack::last_valid_step(x, {2, 1}, false).to_vector<int64_t>(),
            (std::vector<int64_t>{3, 2}));
  Tensor y = Tensor::from_vector<double>({1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(seqpack::last_valid_step(y, {2, 1}, true).to_vector<double>(),
            (std::vector<double>{2, 3}));
}

TEST(LastValidStep, BadInputNamesTheValue) {
  Tensor x = Tensor::zeros({5, 3, 2}, DType::f32);  // T=5, B=3
  expect_invalid(
      [&] {
        seqpack::last_valid_step(x, {1, 7, 2}, false);
      },
      {"lengths[1] = 7 exceeds the padded length 5"});
  expect_invalid([&] { seqpack::last_valid_step(x, {1, -1, 2}, false); }, {"lengths[1] = -1"});
  expect_invalid([&] { seqpack::last_valid_step(x, {1, 2}, false); }, {"2 lengths", "batch of 3"});
  expect_invalid(
      [&] {
        seqpack::last_valid_step(x, {1, 2, 3, 4, 5}, true);
      },
      {"lengths[3] = 4", "padded length 3"});
  expect_invalid([&] { seqpack::last_valid_step(Tensor::zeros({4}, DType::f32), {1}, false); },
                 {"[4]", "2 dimensions"});
  expect_invalid(
      [&] {
        seqpack::last_valid_step_backward(Tensor::zeros({2, 3}, DType::f32), {4, 1}, 3, false);
      },
      {"lengths[0] = 4 exceeds the padded length 3"});
}

TEST(ReversePaddedSequence, HandWorkedTimeMajor) {
  // [T=4, B=2]: columns a = 1 2 3 _ (len 3), b = 5 6 _ _ (len 2); padding is -1.
  Tensor x = Tensor::from_vector<float>({1, 5, 2, 6, 3, -1, -1, -1}, {4, 2});
  Tensor y = seqpack::reverse_padded_sequence(x, {3, 2}, /*batch_first=*/false);
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{3, 6, 2, 5, 1, -1, -1, -1}));
  EXPECT_FALSE(y.shares_storage_with(x));
  EXPECT_EQ(x.to_vector<float>()[0], 1.f);  // input untouched
}

TEST(ReversePaddedSequence, MatchesPerSequenceReversalAndIsItsOwnInverse) {
  const uint64_t seed = seqpack::testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<int64_t> lengths = {5, 0, 1, 3, 5};
  for (bool bf : {false, true}) {
    const Shape shape = bf ? Shape{5, 6, 3} : Shape{6, 5, 3};
    Tensor x = random_tensor(rng, shape);
    Tensor y = seqpack::reverse_padded_sequence(x, lengths, bf);
    // Reference: split into sequences, reverse each, pad back over the original.
    std::vector<Tensor> seqs = seqpack::unpad_sequence(x, lengths, bf);
    Tensor expected = x.clone();
    for (int64_t b = 0; b < 5; ++b) {
      const Tensor& s = seqs[static_cast<std::size_t>(b)];
      for (int64_t t = 0; t < s.size(0); ++t) {
        for (int64_t f = 0; f < 3; ++f) {
          const int64_t dst = bf ? (b * 6 + t) * 3 + f : (t * 5 + b) * 3 + f;
          expected.data<double>()[dst] = s.data<double>()[(s.size(0) - 1 - t) * 3 + f];
        }
      }
    }
    EXPECT_TRUE(seqpack::testing::all_close(y, expected, 0, 0, bf ? "batch-first" : "time-major"));
    EXPECT_TRUE(seqpack::testing::all_close(seqpack::reverse_padded_sequence(y, lengths, bf), x, 0,
                                            0, "twice"));
  }
}

TEST(ReversePaddedSequence, BadInputNamesTheValue) {
  Tensor x = Tensor::zeros({2, 4}, DType::f32);
  expect_invalid(
      [&] {
        seqpack::reverse_padded_sequence(x, {1, 2, 3, 3}, false);
      },
      {"lengths[2] = 3 exceeds the padded length 2"});
  expect_invalid([&] { seqpack::reverse_padded_sequence(x, {1}, true); },
                 {"1 lengths", "batch of 2"});
}

TEST(TokenBatch, EncodesAndPadsWithPad) {
  const seqpack::Vocabulary vocab = seqpack::Vocabulary::build({U"abc"});
  std::vector<seqpack::Example> ex = {{"ab", U"ab", 2}, {"cxa", U"cxa", 0}, {"", U"", 1}};
  seqpack::TokenBatch b = seqpack::make_token_batch(vocab, ex, {1, 0, 2}, /*batch_first=*/true);
  EXPECT_EQ(b.tokens.shape(), (Shape{3, 3}));
  // c x a | a b <pad> | <pad> x3, with x unknown.
  EXPECT_EQ(b.tokens.to_vector<int64_t>(), (std::vector<int64_t>{4, 1, 2, 2, 3, 0, 0, 0, 0}));
  EXPECT_EQ(b.lengths, (std::vector<int64_t>{3, 2, 0}));
  EXPECT_EQ(b.labels.to_vector<int64_t>(), (std::vector<int64_t>{0, 2, 1}));
  seqpack::TokenBatch t = seqpack::make_token_batch(vocab, ex, {1, 0}, /*batch_first=*/false);
  EXPECT_EQ(t.tokens.shape(), (Shape{3, 2}));
  EXPECT_EQ(t.tokens.to_vector<int64_t>(), (std::vector<int64_t>{4, 2, 1, 3, 2, 0}));
  EXPECT_EQ(seqpack::make_token_batch(vocab, ex, {2}, true).tokens.shape(), (Shape{1, 0}));
  expect_invalid(
      [&] {
        seqpack::make_token_batch(vocab, ex, {0, 3}, true);
      },
      {"indices[1] = 3", "[0, 3)"});
}
