// Adam, SGD and clip_grad_norm vs PyTorch 1.13 (fixture train.json), plus
// hand-worked steps and bad options.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "seqpack/optim.h"
#include "test_util.h"

namespace seqpack {
namespace {

using testing::all_close;
using testing::tensor_from_json;

std::unique_ptr<Optimizer> make(const std::string& name, const nlohmann::json& o,
                                std::vector<Parameter> ps) {
  if (name.rfind("adam", 0) == 0) {
    AdamOptions a;
    a.lr = o.at("lr");
    a.beta1 = o.value("beta1", 0.9);
    a.beta2 = o.value("beta2", 0.999);
    a.eps = o.value("eps", 1e-8);
    a.weight_decay = o.value("weight_decay", 0.0);
    a.amsgrad = o.value("amsgrad", false);
    return std::make_unique<Adam>(std::move(ps), a);
  }
  SGDOptions s;
  s.lr = o.at("lr");
  s.momentum = o.value("momentum", 0.0);
  s.dampening = o.value("dampening", 0.0);
  s.weight_decay = o.value("weight_decay", 0.0);
  s.nesterov = o.value("nesterov", false);
  return std::make_unique<SGD>(std::move(ps), s);
}

TEST(Optimizers, StepsMatchTorch) {
  auto fixture = testing::load_fixture("train.json");
  for (auto& c : fixture.at("optim")) {
    const std::string name = c.at("name");
    for (DType dt : {DType::f64, DType::f32}) {
      SCOPED_TRACE(name + (dt == DType::f64 ? " f64" : " f32"));
      const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
      std::vector<Parameter> ps;
      for (size_t i = 0; i < 2; ++i) {
        Tensor v = tensor_from_json(c.at("params")[i], dt);
        ps.push_back({"p" + std::to_string(i), v, Tensor::zeros(v.shape(), dt)});
      }
      auto opt = make(name, c.at("options"), ps);
      for (size_t s = 0; s < c.at("grads").size(); ++s) {
        for (size_t i = 0; i < 2; ++i) ps[i].grad.copy_from(tensor_from_json(c["grads"][s][i], dt));
        opt->step();
        for (size_t i = 0; i < 2; ++i) {
          EXPECT_TRUE(all_close(ps[i].value, tensor_from_json(c["after"][s][i], dt), tol, tol,
                                "step " + std::to_string(s) + " param " + std::to_string(i)));
        }
      }
      opt->zero_grad();
      EXPECT_EQ(ps[0].grad.item_as_double(0), 0.0);
    }
  }
}

TEST(ClipGradNorm, MatchesTorch) {
  auto fixture = testing::load_fixture("train.json");
  for (auto& c : fixture.at("clip")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    const double norm_type = c.at("norm_type").is_string()
                                 ? std::numeric_limits<double>::infinity()
                                 : c.at("norm_type").get<double>();
    std::vector<Parameter> ps;
    for (auto& g : c.at("grads")) {
      Tensor t = tensor_from_json(g, DType::f64);
      ps.push_back({"", Tensor::zeros(t.shape(), DType::f64), t});
    }
    const double total = clip_grad_norm(ps, c.at("max_norm"), norm_type);
    EXPECT_NEAR(total, c.at("total_norm").get<double>(), 1e-12);
    for (size_t i = 0; i < ps.size(); ++i) {
      EXPECT_TRUE(all_close(ps[i].grad, tensor_from_json(c["clipped"][i], DType::f64), 1e-12,
                            1e-12, "clipped grad " + std::to_string(i)));
    }
  }
}

TEST(Adam, FirstStepMovesEachWeightByLr) {
  // With bias correction the first Adam step is lr * g / (|g| + eps'), i.e.
  // almost exactly lr in the direction of -sign(g), whatever |g| is.
  Tensor v = Tensor::from_vector<double>({1.0, 1.0, 1.0});
  Tensor g = Tensor::from_vector<double>({1e-3, -5.0, 200.0});
  Adam opt({{"w", v, g}}, {.lr = 0.1});
  opt.step();
  EXPECT_NEAR(v.data<double>()[0], 0.9, 1e-5);
  EXPECT_NEAR(v.data<double>()[1], 1.1, 1e-8);
  EXPECT_NEAR(v.data<double>()[2], 0.9, 1e-8);
  EXPECT_EQ(opt.step_count(), 1);
}

TEST(Optimizers, BadOptionsNameTheValue) {
  Tensor v = Tensor::zeros({2}, DType::f32);
  std::vector<Parameter> ps = {{"w", v, Tensor::zeros({2}, DType::f32)}};
  try {
    Adam opt(ps, {.lr = -1.0});
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("lr = -1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Adam(ps, {.beta1 = 1.0}), std::invalid_argument);
  EXPECT_THROW(SGD(ps, {.lr = 0.1, .nesterov = true}), std::invalid_argument);
  EXPECT_THROW(SGD({{"w", v, Tensor::zeros({3}, DType::f32)}}, {.lr = 0.1}), std::invalid_argument);
  EXPECT_THROW(clip_grad_norm(ps, 1.0, 0.0), std::invalid_argument);
}

}  // namespace
}  // namespace seqpack
