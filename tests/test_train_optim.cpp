// Adam, SGD and clip_grad_norm vs PyTorch 1.13 (fixture train.json), plus
// hand-worked steps and bad options.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>

#include "cpu/adam.h"
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

// The fixture's tensors have 3 elements, fewer than one SIMD vector: these
// sizes cover full vectors and every tail length of AVX2 and AVX-512.
TEST(Adam, SimdKernelMatchesScalarLoop) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const bool amsgrad : {false, true}) {
    for (const float wd : {0.0f, 0.05f}) {
      for (int64_t n : {1, 7, 8, 15, 16, 17, 33, 100, 1031}) {
        SCOPED_TRACE("amsgrad " + std::to_string(amsgrad) + " wd " + std::to_string(wd) + " n " +
                     std::to_string(n));
        std::vector<float> p(n), g(n), m(n), v(n), vmax(n);
        for (int64_t i = 0; i < n; ++i) {
          p[i] = normal(rng);
          g[i] = normal(rng) * 0.1f;
          m[i] = normal(rng) * 0.01f;
          v[i] = std::fabs(normal(rng)) * 1e-4f;
          vmax[i] = v[i] * (i % 2 ? 2.0f : 0.5f);  // both sides of the max
        }
        const auto p0 = p, m0 = m, v0 = v;
        auto p2 = p, m2 = m, v2 = v, vmax2 = vmax;
        // The scalars of step 3 with lr 2e-3 and torch's default betas.
        const cpu::AdamScalars s{0.9f, 0.999f, 1e-8f, wd,
                                 static_cast<float>(2e-3 / (1 - std::pow(0.9, 3))),
                                 static_cast<float>(std::sqrt(1 - std::pow(0.999, 3)))};
        cpu::adam_update_f32(p.data(), g.data(), m.data(), v.data(), amsgrad ? vmax.data() : nullptr,
                             n, s);
        cpu::adam_update_f32_scalar(p2.data(), g.data(), m2.data(), v2.data(),
                                    amsgrad ? vmax2.data() : nullptr, n, s);
        for (int64_t i = 0; i < n; ++i) {
          // The same operations, but the compiler may fuse a multiply and an add
          // into one FMA in either path: a few roundings of the terms apart.
          const float gi = std::fabs(g[i]) + wd * std::fabs(p0[i]);
          EXPECT_NEAR(m[i], m2[i], 1e-6f * (std::fabs(m0[i]) + gi)) << "m[" << i << "]";
          EXPECT_NEAR(v[i], v2[i], 1e-6f * (v0[i] + gi * gi)) << "v[" << i << "]";
          EXPECT_NEAR(p[i], p2[i], 1e-6f * (std::fabs(p0[i]) + s.step_size)) << "p[" << i << "]";
          if (amsgrad) EXPECT_NEAR(vmax[i], vmax2[i], 1e-6f * (v0[i] + gi * gi + vmax2[i])) << "vmax[" << i << "]";
        }
      }
    }
  }
}

// A float32 Adam with many elements follows the float64 one (whose loop is the
// plain formula) to float precision over several steps.
TEST(Adam, Float32StepsTrackFloat64) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const int64_t n = 203;
  Tensor v64 = Tensor::empty({n}, DType::f64), g64 = Tensor::zeros({n}, DType::f64);
  for (int64_t i = 0; i < n; ++i) v64.data<double>()[i] = normal(rng);
  Tensor v32 = v64.to(DType::f32), g32 = Tensor::zeros({n}, DType::f32);
  Adam a64({{"w", v64, g64}}, {.lr = 1e-2, .weight_decay = 0.01, .amsgrad = true});
  Adam a32({{"w", v32, g32}}, {.lr = 1e-2, .weight_decay = 0.01, .amsgrad = true});
  for (int step = 0; step < 5; ++step) {
    for (int64_t i = 0; i < n; ++i) g64.data<double>()[i] = normal(rng);
    g32.copy_from(g64.to(DType::f32));
    a64.step();
    a32.step();
  }
  EXPECT_TRUE(testing::all_close(v32.to(DType::f64), v64, 1e-5, 1e-5, "float32 vs float64 Adam"));
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
