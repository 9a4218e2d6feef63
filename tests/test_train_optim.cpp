// Adam, SGD and clip_grad_norm vs PyTorch 1.13 (fixture train.json), plus
// hand-worked steps and bad options.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "cpu/adam.h"
#include "seqpack/optim.h"
#include "seqpack/threading.h"
#include "test_util.h"
#include "train/grad_sum.h"
#include "train/param_memory.h"

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
    a.kernels = testing::kernels();  // the program's ISA cap (CTest runs it under caps)
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
      // float32: eight roundings (u = 2^-24) of values near 1, as torch's own
      // float32 steps round; 1 - beta2 taken in float (1 - float(0.999))
      // instead of torch's double put these steps up to 9e-7 off.
      const double tol = dt == DType::f64 ? 1e-12 : 8.0 / (1 << 24);
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
        const cpu::AdamScalars s{0.1f, 0.999f, 0.001f, 1e-8f, wd,
                                 static_cast<float>(2e-3 / (1 - std::pow(0.9, 3))),
                                 static_cast<float>(std::sqrt(1 - std::pow(0.999, 3)))};
        cpu::adam_update_f32(p.data(), g.data(), m.data(), v.data(),
                             amsgrad ? vmax.data() : nullptr, n, s,
                             seqpack::testing::kernels().isa_cap);
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
  Adam a32({{"w", v32, g32}},
           {.lr = 1e-2, .weight_decay = 0.01, .amsgrad = true, .kernels = testing::kernels()});
  for (int step = 0; step < 5; ++step) {
    for (int64_t i = 0; i < n; ++i) g64.data<double>()[i] = normal(rng);
    g32.copy_from(g64.to(DType::f32));
    a64.step();
    a32.step();
  }
  EXPECT_TRUE(testing::all_close(v32.to(DType::f64), v64, 1e-5, 1e-5, "float32 vs float64 Adam"));
}

// Adam and clip_grad_norm run over chunks of 16384 elements on OpenMP's
// threads: Adam element by element (the bits of one pass of the kernel over
// each whole tensor, at any thread count), the norm in double chunk by chunk
// (the same bits at any thread count, within double rounding of a plain sum).
TEST(Optimizers, ChunkedOverThreadsKeepTheBits) {
  const int before = num_threads();
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<int64_t> sizes = {40000, 17, 16384, 16385};
  auto fill = [&](Tensor t, float scale) {
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = scale * normal(rng);
    return t;
  };
  std::vector<Tensor> values, grads;
  for (int64_t n : sizes) {
    values.push_back(fill(Tensor::empty({n}, DType::f32), 1.0f));
    grads.push_back(fill(Tensor::empty({n}, DType::f32), 0.1f));
  }
  // The reference: the kernel over each whole tensor, three steps.
  const AdamOptions o{
      .lr = 1e-2, .weight_decay = 0.01, .amsgrad = true, .kernels = testing::kernels()};
  std::vector<std::vector<float>> want;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const auto n = static_cast<std::size_t>(sizes[k]);
    std::vector<float> p(values[k].data<float>(), values[k].data<float>() + n), m(n), v(n), vmax(n);
    for (int step = 1; step <= 3; ++step) {
      const cpu::AdamScalars sc{0.1f,
                                0.999f,
                                0.001f,
                                1e-8f,
                                0.01f,
                                static_cast<float>(1e-2 / (1 - std::pow(0.9, step))),
                                static_cast<float>(std::sqrt(1 - std::pow(0.999, step)))};
      cpu::adam_update_f32(p.data(), grads[k].data<float>(), m.data(), v.data(), vmax.data(),
                           sizes[k], sc, seqpack::testing::kernels().isa_cap);
    }
    want.push_back(p);
  }
  long double plain = 0;
  for (const Tensor& g : grads)
    for (int64_t i = 0; i < g.numel(); ++i)
      plain += static_cast<long double>(g.data<float>()[i]) * g.data<float>()[i];
  double norm_one_thread = 0;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    std::vector<Parameter> ps;
    for (std::size_t k = 0; k < sizes.size(); ++k)
      ps.push_back({"p" + std::to_string(k), values[k].clone(), grads[k].clone()});
    Adam adam(ps, o);
    for (int step = 0; step < 3; ++step) adam.step();
    for (std::size_t k = 0; k < sizes.size(); ++k)
      EXPECT_EQ(std::memcmp(ps[k].value.data<float>(), want[k].data(), want[k].size() * 4), 0)
          << "parameter " << k << " at " << threads << " threads";
    const double norm = clip_grad_norm(ps, 1e9);  // no clipping: the norm alone
    if (threads == 1) norm_one_thread = norm;
    EXPECT_EQ(norm, norm_one_thread) << threads << " threads";
    // Positive terms summed in double, at most 16384 in a row and then the
    // chunks' sums: (16384 + chunks) roundings of half an ulp of the total.
    const double bound = (16384 + 8) * std::numeric_limits<double>::epsilon() / 2;
    EXPECT_NEAR(norm * norm, static_cast<double>(plain), bound * static_cast<double>(plain));
    // And clipping scales every chunk of every gradient.
    clip_grad_norm(ps, 0.5 * norm);
    for (std::size_t k = 0; k < sizes.size(); ++k)
      for (int64_t i = 0; i < sizes[k]; i += 4097)
        EXPECT_FLOAT_EQ(ps[k].grad.data<float>()[i],
                        grads[k].data<float>()[i] * static_cast<float>(0.5 * norm / (norm + 1e-6)))
            << "grad " << k << "[" << i << "] at " << threads << " threads";
  }
  set_num_threads(before);
}

// zero_grad clears every element of every gradient, in chunks over the
// threads (each chunk by the thread Adam gave it): tails of 16384-element
// chunks, float64, a single element, a gradient listed twice, and nothing
// else (the values stay).
TEST(Optimizers, ZeroGradClearsEveryChunkAtAnyThreadCount) {
  const int before = num_threads();
  for (int threads : {1, 2, 3, 5}) {
    set_num_threads(threads);
    std::vector<Parameter> ps;
    for (int64_t n : {40000, 1, 16384, 16385}) {
      ps.push_back(
          {"f32", Tensor::full({n}, 1.0, DType::f32), Tensor::full({n}, -2.5, DType::f32)});
      ps.push_back({"f64", Tensor::full({n}, 1.0, DType::f64), Tensor::full({n}, 3.0, DType::f64)});
    }
    // A gradient listed twice: zeroed one pass after the other.
    SGD({ps[0], ps[0]}, {.lr = 0.1}).zero_grad();
    EXPECT_EQ(ps[0].grad.item_as_double(39999), 0.0);
    ps[0].grad.fill(-2.5);
    SGD(ps, {.lr = 0.1}).zero_grad();
    for (const Parameter& p : ps) {
      for (int64_t i = 0; i < p.grad.numel(); ++i) {
        ASSERT_EQ(p.grad.item_as_double(i), 0.0)
            << p.name << " grad[" << i << "] of " << p.grad.numel() << " at " << threads
            << " threads";
        ASSERT_EQ(std::signbit(p.grad.item_as_double(i)), false);
      }
      EXPECT_EQ(p.value.item_as_double(p.value.numel() - 1), 1.0);
    }
  }
  set_num_threads(before);
}

// add_grads (a backward's weight gradients into the module's) adds element by
// element, in chunks over the threads: the same bits as a plain loop at any
// thread count, f32 and f64, across chunk edges; mismatched lists are a bug
// of the caller, refused by name.
TEST(Optimizers, AddGradsIsAPlainSumAtAnyThreadCount) {
  const int before = num_threads();
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const std::vector<int64_t> sizes = {40000, 1, 16384, 16385};
  std::vector<Tensor> base, add;
  for (int64_t n : sizes) {
    for (DType dt : {DType::f32, DType::f64}) {
      Tensor a = Tensor::empty({n}, dt), b = Tensor::empty({n}, dt);
      for (int64_t i = 0; i < n; ++i) {
        if (dt == DType::f32) {
          a.data<float>()[i] = static_cast<float>(normal(rng));
          b.data<float>()[i] = static_cast<float>(normal(rng));
        } else {
          a.data<double>()[i] = normal(rng);
          b.data<double>()[i] = normal(rng);
        }
      }
      base.push_back(a);
      add.push_back(b);
    }
  }
  for (int threads : {1, 2, 3, 5}) {
    set_num_threads(threads);
    std::vector<Tensor> dst;
    for (const Tensor& t : base) dst.push_back(t.clone());
    train::add_grads(dst, add);
    for (std::size_t k = 0; k < dst.size(); ++k) {
      for (int64_t i = 0; i < dst[k].numel(); ++i) {
        const bool f32 = dst[k].dtype() == DType::f32;
        const double want =
            f32 ? static_cast<double>(base[k].data<float>()[i] + add[k].data<float>()[i])
                : base[k].data<double>()[i] + add[k].data<double>()[i];
        ASSERT_EQ(dst[k].item_as_double(i), want)
            << "tensor " << k << " [" << i << "] at " << threads << " threads";
      }
    }
  }
  set_num_threads(before);
  std::vector<Tensor> one = {Tensor::zeros({3}, DType::f32)};
  EXPECT_THROW(train::add_grads(one, {}), std::logic_error);
  EXPECT_THROW(train::add_grads(one, {Tensor::zeros({4}, DType::f32)}), std::logic_error);
  EXPECT_THROW(train::add_grads(one, {Tensor::zeros({3}, DType::f64)}), std::logic_error);
}

// One tensor listed twice is updated twice, one pass after the other (as on
// one thread), never from two threads at once; a parameter without a
// gradient counts for nothing in the norm (torch skips grad None).
TEST(Optimizers, SharedTensorsAreUpdatedOneAfterTheOther) {
  const int before = num_threads();
  set_num_threads(2);
  const int64_t n = 3 * 16384 + 5;
  Tensor w = Tensor::full({n}, 1.0, DType::f32), g = Tensor::full({n}, 0.5, DType::f32);
  Adam adam({{"a", w, g}, {"b", w, g}}, {.lr = 0.1});
  adam.step();
  // Each pass moves every weight by lr (the first step): two passes, 2 * lr,
  // each within a few float roundings (a dozen operations on values near 1).
  for (int64_t i = 0; i < n; i += 1001) EXPECT_NEAR(w.data<float>()[i], 0.8, 1e-6) << i;
  // What keeps them apart: the overlap test, which sees the same tensor
  // twice, a gradient shared, and parameters that merely sit side by side.
  EXPECT_TRUE(train::parameters_share_memory({{"a", w, g}, {"b", w, g}}));
  const Tensor w2 = Tensor::full({n}, 1.0, DType::f32), g2 = Tensor::full({n}, 0.5, DType::f32);
  EXPECT_TRUE(train::parameters_share_memory({{"a", w, g}, {"b", w2, g}}));
  EXPECT_FALSE(train::parameters_share_memory({{"a", w, g}, {"b", w2, g2}}));
  std::vector<Parameter> with_none = {{"a", w, g}, {"none", w, Tensor()}};
  const double norm = clip_grad_norm(with_none, 1e9);
  EXPECT_NEAR(norm, 0.5 * std::sqrt(static_cast<double>(n)), 1e-9 * std::sqrt(double(n)));
  set_num_threads(before);
}

// non_finite_grad names the first gradient holding a NaN or an infinity,
// wherever it sits (vector lanes and tails alike), in float32 and float64;
// the largest finite values, subnormals and absent gradients pass.
TEST(Optimizers, NonFiniteGradNamesTheFirstBadGradient) {
  const float fbad[] = {std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()};
  for (int64_t n : {1, 15, 16, 17, 1000}) {
    Tensor fine = Tensor::full({n}, 0.0, DType::f32);
    fine.data<float>()[0] = std::numeric_limits<float>::max();
    fine.data<float>()[n - 1] = -std::numeric_limits<float>::denorm_min();
    Tensor d = Tensor::full({n}, -std::numeric_limits<double>::max(), DType::f64);
    const Tensor v32 = Tensor::zeros({n}, DType::f32), v64 = Tensor::zeros({n}, DType::f64);
    std::vector<Parameter> ps = {{"none", v32, Tensor()}, {"fine", v32, fine}, {"d", v64, d}};
    EXPECT_EQ(non_finite_grad(ps), "") << n;
    for (float bad : fbad) {
      for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
        Tensor g = fine.clone();
        g.data<float>()[at] = bad;
        std::vector<Parameter> qs = {{"fine", v32, fine}, {"bad", v32, g}, {"also", v32, g}};
        EXPECT_EQ(non_finite_grad(qs), "bad") << n << " " << bad << " at " << at;
      }
    }
    Tensor dg = d.clone();
    dg.data<double>()[n - 1] = std::numeric_limits<double>::quiet_NaN();
    EXPECT_EQ(non_finite_grad({{"d", v64, dg}}), "d") << n;
    dg.data<double>()[n - 1] = -std::numeric_limits<double>::infinity();
    EXPECT_EQ(non_finite_grad({{"d", v64, dg}}), "d") << n;
  }
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
  // An integer gradient is named before any thread starts (on every count:
  // an exception inside OpenMP's region would end the process).
  const int before = num_threads();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::vector<Parameter> ints = {
        {"w", v, Tensor::zeros({2}, DType::f32)},
        {"ids", Tensor::zeros({40000}, DType::i64), Tensor::zeros({40000}, DType::i64)}};
    try {
      clip_grad_norm(ints, 1.0);
      ADD_FAILURE() << "expected std::invalid_argument";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("parameter 1 (ids) is int64"), std::string::npos)
          << e.what();
    }
  }
  set_num_threads(before);
}

}  // namespace
}  // namespace seqpack
