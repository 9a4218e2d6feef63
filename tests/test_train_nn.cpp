// Embedding, Linear and Dropout: backward vs central finite differences in
// float64, plus PyTorch's initialisation rules and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <stdexcept>

#include "seqpack/nn.h"
#include "test_util.h"

namespace seqpack {
namespace {

using testing::all_close;

Tensor random_f64(Shape shape, std::mt19937_64& rng) {
  Tensor t = Tensor::empty(shape, DType::f64);
  std::normal_distribution<double> n(0.0, 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = n(rng);
  return t;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.item_as_double(i) * b.item_as_double(i);
  return s;
}

// d loss / d x by central differences, loss() reading x's storage.
Tensor numeric_grad(Tensor x, const std::function<double()>& loss, double eps = 1e-6) {
  Tensor g = Tensor::zeros(x.shape(), DType::f64);
  double* px = x.data<double>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double orig = px[i];
    px[i] = orig + eps;
    const double up = loss();
    px[i] = orig - eps;
    const double down = loss();
    px[i] = orig;
    g.data<double>()[i] = (up - down) / (2 * eps);
  }
  return g;
}

TEST(Embedding, GradientMatchesFiniteDifferences) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Embedding emb(6, 3, /*padding_idx=*/2, DType::f64, seed);
  // Repeated indices accumulate; index 2 is padding and must get no gradient.
  Tensor idx = Tensor::from_vector<int64_t>({1, 2, 5, 1, 0, 2, 4, 1}, {2, 4});
  Tensor r = random_f64({2, 4, 3}, rng);
  emb.forward(idx);
  emb.backward(r);
  auto loss = [&] { return dot(emb.forward(idx), r); };
  Tensor expected = numeric_grad(emb.weight(), loss);
  for (int64_t j = 0; j < 3; ++j) expected.data<double>()[2 * 3 + j] = 0.0;
  EXPECT_TRUE(all_close(emb.grad(), expected, 1e-7, 1e-8, "embedding weight grad"));
  for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(emb.grad().data<double>()[2 * 3 + j], 0.0);
}

TEST(Embedding, PaddingRowStartsAtZeroAndForwardGathersRows) {
  Embedding emb(5, 4, /*padding_idx=*/0, DType::f32, 3);
  for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(emb.weight().data<float>()[j], 0.f);
  Tensor out = emb.forward(Tensor::from_vector<int64_t>({3, 0}));
  ASSERT_EQ(out.shape(), (Shape{2, 4}));
  for (int64_t j = 0; j < 4; ++j) {
    EXPECT_EQ(out.data<float>()[j], emb.weight().data<float>()[3 * 4 + j]);
    EXPECT_EQ(out.data<float>()[4 + j], 0.f);
  }
  // Negative padding_idx counts from the end, as torch.
  Embedding neg(5, 2, /*padding_idx=*/-1, DType::f32, 3);
  EXPECT_EQ(*neg.padding_idx(), 4);
}

TEST(Embedding, InitialisationIsStandardNormal) {
  Embedding emb(200, 50, std::nullopt, DType::f64, 11);
  double mean = 0, sq = 0;
  const int64_t n = emb.weight().numel();
  for (int64_t i = 0; i < n; ++i) {
    mean += emb.weight().data<double>()[i];
    sq += emb.weight().data<double>()[i] * emb.weight().data<double>()[i];
  }
  mean /= n;
  const double var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(var, 1.0, 0.05);
}

TEST(Embedding, BadInputNamesTheValue) {
  Embedding emb(4, 2, std::nullopt, DType::f32, 0);
  try {
    emb.forward(Tensor::from_vector<int64_t>({1, 4}));
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("indices[1] = 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(emb.forward(Tensor::from_vector<int64_t>({-1})), std::invalid_argument);
  EXPECT_THROW(emb.forward(Tensor::from_vector<float>({1.f})), std::invalid_argument);
  EXPECT_THROW(Embedding(4, 2, /*padding_idx=*/4), std::invalid_argument);
  EXPECT_THROW(Embedding(0, 2), std::invalid_argument);
}

TEST(Linear, GradientsMatchFiniteDifferences) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Linear fc(5, 3, /*bias=*/true, DType::f64, seed);
  Tensor x = random_f64({4, 5}, rng);
  Tensor r = random_f64({4, 3}, rng);
  fc.forward(x);
  Tensor gx = fc.backward(r);
  auto loss = [&] { return dot(fc.forward(x), r); };
  EXPECT_TRUE(all_close(gx, numeric_grad(x, loss), 1e-7, 1e-8, "input grad"));
  EXPECT_TRUE(all_close(fc.weight_grad(), numeric_grad(fc.weight(), loss), 1e-7, 1e-8, "weight grad"));
  EXPECT_TRUE(all_close(fc.bias_grad(), numeric_grad(fc.bias(), loss), 1e-7, 1e-8, "bias grad"));
}

TEST(Linear, ForwardIsXWTransposedPlusBiasAndGradsAccumulate) {
  Linear fc(2, 2, /*bias=*/true, DType::f64, 0);
  fc.weight().copy_from(Tensor::from_vector<double>({1, 2, 3, 4}, {2, 2}));
  fc.bias().copy_from(Tensor::from_vector<double>({10, 20}));
  // Leading dims are flattened: [1, 1, 2] -> [1, 1, 2].
  Tensor y = fc.forward(Tensor::from_vector<double>({1, -1}, {1, 1, 2}));
  EXPECT_TRUE(all_close(y, Tensor::from_vector<double>({9, 19}, {1, 1, 2}), 0, 0, "y"));
  fc.backward(Tensor::from_vector<double>({1, 1}, {1, 1, 2}));
  fc.backward(Tensor::from_vector<double>({1, 1}, {1, 1, 2}));
  EXPECT_TRUE(all_close(fc.weight_grad(), Tensor::from_vector<double>({2, -2, 2, -2}, {2, 2}), 0,
                        0, "accumulated dW"));
  EXPECT_TRUE(all_close(fc.bias_grad(), Tensor::from_vector<double>({2, 2}), 0, 0, "db"));
  fc.zero_grad();
  EXPECT_EQ(fc.weight_grad().item_as_double(0), 0.0);
  Linear nobias(3, 2, /*bias=*/false, DType::f32, 0);
  EXPECT_FALSE(nobias.bias().defined());
  EXPECT_EQ(nobias.parameters("fc.").size(), 1u);
  EXPECT_EQ(fc.parameters("fc.")[1].name, "fc.bias");
}

TEST(Linear, InitialisationBoundIsOneOverSqrtFanIn) {
  Linear fc(16, 64, /*bias=*/true, DType::f64, 5);
  double lo = 1, hi = -1;
  for (int64_t i = 0; i < fc.weight().numel(); ++i) {
    lo = std::min(lo, fc.weight().data<double>()[i]);
    hi = std::max(hi, fc.weight().data<double>()[i]);
  }
  EXPECT_GE(lo, -0.25);
  EXPECT_LE(hi, 0.25);
  EXPECT_LT(lo, -0.2);  // actually spread over the range, not a constant
  EXPECT_GT(hi, 0.2);
}

TEST(Linear, BadInputNamesTheShape) {
  Linear fc(3, 2);
  try {
    fc.forward(Tensor::zeros({4, 5}, DType::f32));
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[4, 5]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fc.forward(Tensor::zeros({4, 3}, DType::f64)), std::invalid_argument);
  fc.forward(Tensor::zeros({4, 3}, DType::f32));
  EXPECT_THROW(fc.backward(Tensor::zeros({4, 3}, DType::f32)), std::invalid_argument);
}

TEST(Dropout, FixedMaskGradientMatchesFiniteDifferences) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Dropout drop(0.25);
  Tensor x = random_f64({3, 4}, rng);
  Tensor mask = Tensor::from_vector<double>({1, 0, 1, 1, 0, 0, 1, 1, 1, 1, 1, 0}, {3, 4});
  Tensor r = random_f64({3, 4}, rng);
  Tensor y = drop.forward_with_mask(x, mask);
  for (int64_t i = 0; i < 12; ++i) {
    EXPECT_DOUBLE_EQ(y.data<double>()[i], x.data<double>()[i] * mask.data<double>()[i] / 0.75);
  }
  Tensor gx = drop.backward(r);
  auto loss = [&] { return dot(drop.forward_with_mask(x, mask), r); };
  EXPECT_TRUE(all_close(gx, numeric_grad(x, loss), 1e-7, 1e-8, "dropout input grad"));
}

TEST(Dropout, DropsAboutPAndScalesTheRestEvalIsIdentity) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Dropout drop(0.3, seed);
  Tensor x = Tensor::full({10000}, 1.0, DType::f32);
  Tensor y = drop.forward(x);
  int64_t zeros = 0;
  for (int64_t i = 0; i < y.numel(); ++i) {
    const float v = y.data<float>()[i];
    if (v == 0.f) {
      ++zeros;
    } else {
      EXPECT_FLOAT_EQ(v, 1.f / 0.7f);
    }
  }
  EXPECT_NEAR(zeros / 10000.0, 0.3, 0.03);
  // Backward reuses the forward's mask.
  Tensor g = drop.backward(x);
  for (int64_t i = 0; i < y.numel(); ++i) EXPECT_EQ(g.data<float>()[i], y.data<float>()[i]);
  drop.eval();
  Tensor e = drop.forward(x);
  EXPECT_EQ(e.data<float>()[0], 1.f);
  EXPECT_TRUE(e.shares_storage_with(x));
  EXPECT_THROW(Dropout(1.5), std::invalid_argument);
  EXPECT_THROW(drop.forward_with_mask(x, Tensor::zeros({3}, DType::f32)), std::invalid_argument);
}

}  // namespace
}  // namespace seqpack
