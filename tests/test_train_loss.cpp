// CrossEntropyLoss: values and gradients vs PyTorch 1.13 (fixture train.json),
// gradient vs central finite differences, ignore_index and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>

#include "seqpack/loss.h"
#include "test_util.h"

namespace seqpack {
namespace {

using testing::all_close;

TEST(CrossEntropyLoss, MatchesTorch) {
  auto fixture = testing::load_fixture("train.json");
  for (auto& c : fixture.at("cross_entropy")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    for (DType dt : {DType::f64, DType::f32}) {
      const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
      CrossEntropyLoss ce(c.at("ignore_index").get<int64_t>());
      Tensor logits = testing::tensor_from_json(c.at("logits"), dt);
      Tensor targets = testing::tensor_from_json(c.at("targets"), DType::i64);
      EXPECT_NEAR(ce.forward(logits, targets), c.at("loss").get<double>(), tol);
      EXPECT_TRUE(all_close(ce.backward(), testing::tensor_from_json(c.at("grad"), dt), tol, tol,
                            "grad"));
    }
  }
}

TEST(CrossEntropyLoss, GradientMatchesFiniteDifferences) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, 2.0);
  Tensor logits = Tensor::empty({5, 4}, DType::f64);
  for (int64_t i = 0; i < 20; ++i) logits.data<double>()[i] = n(rng);
  Tensor targets = Tensor::from_vector<int64_t>({3, 7, 0, 7, 1});  // 7 = ignored
  CrossEntropyLoss ce(/*ignore_index=*/7);
  ce.forward(logits, targets);
  Tensor analytic = ce.backward(2.0);
  Tensor numeric = Tensor::empty({5, 4}, DType::f64);
  const double eps = 1e-6;
  for (int64_t i = 0; i < 20; ++i) {
    double* p = logits.data<double>() + i;
    const double orig = *p;
    *p = orig + eps;
    const double up = ce.forward(logits, targets);
    *p = orig - eps;
    const double down = ce.forward(logits, targets);
    *p = orig;
    numeric.data<double>()[i] = 2.0 * (up - down) / (2 * eps);
  }
  EXPECT_TRUE(all_close(analytic, numeric, 1e-7, 1e-8, "d loss / d logits"));
  for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(analytic.data<double>()[1 * 4 + j], 0.0);
}

TEST(CrossEntropyLoss, HandWorkedValueAndLargeLogits) {
  // Two classes with equal logits: loss = log 2.
  CrossEntropyLoss ce;
  EXPECT_NEAR(ce.forward(Tensor::from_vector<double>({0.5, 0.5}, {1, 2}),
                         Tensor::from_vector<int64_t>({0})),
              std::log(2.0), 1e-15);
  // Logits of 1000 must not overflow: loss = log(1 + e^-1) for the larger class.
  EXPECT_NEAR(ce.forward(Tensor::from_vector<float>({1000.f, 999.f}, {1, 2}),
                         Tensor::from_vector<int64_t>({0})),
              std::log1p(std::exp(-1.0)), 1e-6);
}

TEST(CrossEntropyLoss, AllIgnoredIsNaNWithZeroGradient) {
  CrossEntropyLoss ce;
  const double loss = ce.forward(Tensor::zeros({2, 3}, DType::f32),
                                 Tensor::from_vector<int64_t>({-100, -100}));
  EXPECT_TRUE(std::isnan(loss));
  Tensor g = ce.backward();
  for (int64_t i = 0; i < g.numel(); ++i) EXPECT_EQ(g.item_as_double(i), 0.0);
}

TEST(CrossEntropyLoss, BadTargetsNameTheValue) {
  CrossEntropyLoss ce;
  try {
    ce.forward(Tensor::zeros({3, 4}, DType::f32), Tensor::from_vector<int64_t>({0, 1, 4}));
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("targets[2] = 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ce.forward(Tensor::zeros({3, 4}, DType::f32), Tensor::from_vector<int64_t>({0})),
               std::invalid_argument);
  EXPECT_THROW(ce.forward(Tensor::zeros({3}, DType::f32), Tensor::from_vector<int64_t>({0})),
               std::invalid_argument);
  EXPECT_THROW(ce.forward(Tensor::zeros({1, 4}, DType::f32), Tensor::from_vector<float>({0.f})),
               std::invalid_argument);
}

// No classes at all (C = 0): torch.softmax returns the empty [N, 0] tensor and
// cross_entropy with every target ignored gives NaN; a real target is out of range.
// Both used to read the maximum of an empty row (past the end of the buffer).
TEST(CrossEntropyLoss, NoClassesDoesNotReadPastTheRow) {
  const Tensor empty_rows = Tensor::zeros({2, 0}, DType::f64);
  EXPECT_EQ(softmax(empty_rows).shape(), (Shape{2, 0}));
  CrossEntropyLoss ce;
  EXPECT_TRUE(std::isnan(ce.forward(empty_rows, Tensor::from_vector<int64_t>({-100, -100}))));
  EXPECT_EQ(ce.backward().shape(), (Shape{2, 0}));
  testing::expect_invalid([&] { ce.forward(empty_rows, Tensor::from_vector<int64_t>({-100, 0})); },
                          {"targets[1] = 0", "[0, 0)"});
}

}  // namespace
}  // namespace seqpack
