// Dropout between the layers of a recurrent stack (RNNOptions::dropout, training
// only): the keep rate, the 1/(1-p) scale of every kept element, a fresh mask
// per layer and per seed, nothing in eval, and the gradient through the mask.
//
// The mask is made visible by a stack that copies its input: relu RNN, no bias,
// W_hh = 0, W_ih of layer 0 the identity, and in every later layer the forward
// direction reads the first H columns of its input (W_ih = [I 0]) and the
// reverse direction the last H ([0 I]). For an input x > 0 every product is
// exact (one term 1·x, the others 0·x), so with dropout p between layers 0 and 1
// layer 1's output at packed row r, column c = d·H + k is
//   relu(m[r, c] · x[r, k]) = m[r, c] · x[r, k],
// m = 0 where dropped and 1/(1-p) where kept (PyTorch's nn.RNN semantics; the
// Python test checks torch.nn.RNN itself against the same rule).
// The kept set is read off the output (x > 0, so kept <=> nonzero); the keep
// rate is checked on 5e4-1e5 elements with a tolerance of about 9 standard
// deviations, so a correct mask fails it with probability < 1e-15 for any seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "seqpack/packed_sequence.h"
#include "seqpack/rnn.h"
#include "test_util.h"

namespace {

using seqpack::DType;
using seqpack::PackingPlan;
using seqpack::RNNMode;
using seqpack::RNNOptions;
using seqpack::Tensor;

struct DropCase {
  DType dtype;
  double p;
  bool bidirectional;
  int64_t num_layers;
};

std::string describe(const DropCase& c) {
  return std::string(c.dtype == DType::f64 ? "float64" : "float32") + " p=" + std::to_string(c.p) +
         (c.bidirectional ? " bi" : " uni") + " L" + std::to_string(c.num_layers);
}

void PrintTo(const DropCase& c, std::ostream* os) { *os << describe(c); }

constexpr int64_t kHidden = 40;

RNNOptions options_of(const DropCase& c) {
  return {.mode = RNNMode::rnn_relu,
          .input_size = kHidden,
          .hidden_size = kHidden,
          .num_layers = c.num_layers,
          .bias = false,
          .dropout = c.p,
          .bidirectional = c.bidirectional,
          .dtype = c.dtype};
}

// The copying stack described above, in rnn_parameter_names order.
std::vector<Tensor> copy_weights(const RNNOptions& o) {
  const auto names = seqpack::rnn_parameter_names(o);
  const auto shapes = seqpack::rnn_parameter_shapes(o);
  std::vector<Tensor> w;
  for (size_t i = 0; i < names.size(); ++i) {
    Tensor t = Tensor::zeros(shapes[i], DType::f64);
    if (names[i].rfind("weight_ih_l", 0) == 0) {
      const bool reverse = names[i].find("_reverse") != std::string::npos;
      const int64_t layer = std::stoll(names[i].substr(11));  // "weight_ih_l<layer>[_reverse]"
      const int64_t cols = shapes[i][1];
      const int64_t offset = layer == 0 || !reverse ? 0 : kHidden;
      for (int64_t j = 0; j < kHidden; ++j) t.data<double>()[j * cols + offset + j] = 1.0;
    }
    w.push_back(t.to(o.dtype));
  }
  return w;
}

// Lengths 1..40 in a scrambled order: about 1000 packed rows.
std::vector<int64_t> lengths() {
  std::vector<int64_t> n;
  for (int64_t b = 0; b < 48; ++b) n.push_back(1 + (b * 29) % 40);
  return n;
}

Tensor positive_input(int64_t rows, DType dtype, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(0.5, 1.5);
  Tensor t = Tensor::empty({rows, kHidden}, DType::f64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = u(gen);
  return t.to(dtype);  // values rounded once; both x and the test read these
}

// 2 ulp of the dtype: the kept value is x·(1/(1-p)) or x/(1-p), each rounded once.
double ulp2(DType d) { return d == DType::f64 ? 4.5e-16 : 2.4e-7; }

// The mask m[r, c] (0 or the scale) that layer 1 saw, read off a two-layer
// output, after checking that every element is 0 or exactly x·scale.
std::vector<double> read_mask(const DropCase& c, const Tensor& x, const Tensor& out, double scale) {
  const int64_t N = x.size(0), C = out.size(1);
  // A power-of-two scale makes x·scale exact; otherwise allow the rounding of
  // x·(1/(1-p)) against x/(1-p).
  const bool exact = std::exp2(std::round(std::log2(scale))) == scale;
  const double rtol = exact ? 0.0 : ulp2(c.dtype);
  std::vector<double> m(static_cast<size_t>(N * C));
  int bad = 0;
  for (int64_t r = 0; r < N; ++r) {
    for (int64_t col = 0; col < C; ++col) {
      const double xv = x.item_as_double(r * kHidden + col % kHidden);
      const double y = out.item_as_double(r * C + col);
      const double want = xv * scale;
      if (y == 0) {
        m[static_cast<size_t>(r * C + col)] = 0;
      } else if (std::fabs(y - want) <= rtol * want) {
        m[static_cast<size_t>(r * C + col)] = scale;
      } else if (bad++ < 5) {
        ADD_FAILURE() << "row " << r << " column " << col << ": next layer's input " << y
                      << " is neither 0 nor x/(1-p) = " << xv << " * " << scale << " = " << want;
      }
    }
  }
  EXPECT_EQ(bad, 0) << bad << " elements neither dropped nor scaled by 1/(1-p)";
  return m;
}

void expect_keep_rate(const std::vector<double>& m, int64_t rows, int64_t cols, double keep,
                      const std::string& what) {
  const double n = static_cast<double>(m.size());
  double kept = 0;
  for (double v : m) kept += v != 0;
  // 9 standard deviations of the sample mean, at least 0.01.
  const double tol = std::max(0.01, 9 * std::sqrt(keep * (1 - keep) / n));
  EXPECT_NEAR(kept / n, keep, tol) << what << ": keep rate over " << n << " elements";
  // Every column on its own (a mask shared by all rows fails here), and
  // neighbours agree only as often as independent draws do, p² + (1-p)²
  // (a mask shared by a row's columns, or by a column's rows, fails here).
  const double col_tol = 9 * std::sqrt(keep * (1 - keep) / static_cast<double>(rows));
  for (int64_t c = 0; c < cols; ++c) {
    double k = 0;
    for (int64_t r = 0; r < rows; ++r) k += m[static_cast<size_t>(r * cols + c)] != 0;
    EXPECT_NEAR(k / static_cast<double>(rows), keep, col_tol) << what << ": column " << c;
  }
  const double agree = keep * keep + (1 - keep) * (1 - keep);
  double across = 0, down = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const bool here = m[static_cast<size_t>(r * cols + c)] != 0;
      if (c + 1 < cols) across += here == (m[static_cast<size_t>(r * cols + c + 1)] != 0);
      if (r + 1 < rows) down += here == (m[static_cast<size_t>((r + 1) * cols + c)] != 0);
    }
  }
  EXPECT_NEAR(across / static_cast<double>(rows * (cols - 1)), agree, 0.03)
      << what << ": neighbouring columns";
  EXPECT_NEAR(down / static_cast<double>((rows - 1) * cols), agree, 0.03)
      << what << ": neighbouring rows";
}

class RNNDropout : public ::testing::TestWithParam<DropCase> {};
class RNNDropoutGradient : public ::testing::TestWithParam<DropCase> {};

// Two layers: the next layer's input is m ⊙ [x, x]; three layers: layer 2 gets
// its own mask, so the output is m2 ⊙ m1 ⊙ [x, x] and is kept at (1-p)².
TEST_P(RNNDropout, KeepRateAndScaleOfTheNextLayersInput) {
  const DropCase& c = GetParam();
  SCOPED_TRACE(describe(c));
  const RNNOptions o = options_of(c);
  const auto w = copy_weights(o);
  const PackingPlan plan = PackingPlan::from_lengths(lengths(), /*enforce_sorted=*/false);
  const int64_t N = plan.total_rows(), C = o.output_size();
  const Tensor x = positive_input(N, c.dtype, 17);

  // Eval: no mask, the stack copies its input exactly.
  const auto e = seqpack::rnn_forward(
      *rnn_make_plan(o, w, /*in_place=*/true, seqpack::testing::config()), x, plan, {}, {},
      /*training=*/false,
      /*save_for_backward=*/false, /*dropout_seed=*/5);
  for (int64_t i = 0; i < N * C; ++i) {
    const double want = x.item_as_double((i / C) * kHidden + (i % C) % kHidden);
    if (e.output.item_as_double(i) != want) {
      ADD_FAILURE() << "eval output [" << i << "] = " << e.output.item_as_double(i)
                    << ", expected the input " << want << " (no dropout in eval)";
      break;
    }
  }

  const auto t = seqpack::rnn_forward(
      *rnn_make_plan(o, w, /*in_place=*/true, seqpack::testing::config()), x, plan, {}, {},
      /*training=*/true,
      /*save_for_backward=*/false, /*dropout_seed=*/5);
  const double s = 1.0 / (1.0 - c.p);
  const int64_t masks = c.num_layers - 1;
  const auto m = read_mask(c, x, t.output, std::pow(s, static_cast<double>(masks)));
  expect_keep_rate(m, N, C, std::pow(1 - c.p, static_cast<double>(masks)), "training seed 5");

  // Another seed, another mask: agreement with this one as for independent draws.
  const auto t2 = seqpack::rnn_forward(
      *rnn_make_plan(o, w, /*in_place=*/true, seqpack::testing::config()), x, plan, {}, {},
      /*training=*/true,
      /*save_for_backward=*/false, /*dropout_seed=*/6);
  const auto m2 = read_mask(c, x, t2.output, std::pow(s, static_cast<double>(masks)));
  const double keep = std::pow(1 - c.p, static_cast<double>(masks));
  double agree = 0;
  for (size_t i = 0; i < m.size(); ++i) agree += (m[i] != 0) == (m2[i] != 0);
  EXPECT_NEAR(agree / static_cast<double>(m.size()), keep * keep + (1 - keep) * (1 - keep), 0.03)
      << "masks of seeds 5 and 6";
}

// The gradient through the mask, for L = <g, output> of the two-layer stack:
//   dL/dx[r, k] = Σ_d m[r, d·H + k] · g[r, d·H + k]
// and the weight gradients of both layers, which see the masked, scaled input:
//   dW_ih_l1(d)[j, c] = Σ_r m[r, dH + j]≠0 · g[r, dH + j] · m[r, c] · x[r, c mod H]
//   dW_ih_l0(d)[j, k] = Σ_r m[r, dH + j] · g[r, dH + j] · x[r, k]
TEST_P(RNNDropoutGradient, GradientThroughTheMask) {
  const DropCase& c = GetParam();
  ASSERT_EQ(c.num_layers, 2) << "the expected gradients are those of two layers";
  SCOPED_TRACE(describe(c));
  const RNNOptions o = options_of(c);
  const auto w = copy_weights(o);
  const PackingPlan plan = PackingPlan::from_lengths(lengths(), /*enforce_sorted=*/false);
  const int64_t N = plan.total_rows(), C = o.output_size(), D = o.num_directions();
  const Tensor x = positive_input(N, c.dtype, 23);
  const auto t = seqpack::rnn_forward(
      *rnn_make_plan(o, w, /*in_place=*/true, seqpack::testing::config()), x, plan, {}, {},
      /*training=*/true,
      /*save_for_backward=*/true, /*dropout_seed=*/9);
  ASSERT_TRUE(t.saved);
  const double s = 1.0 / (1.0 - c.p);
  const auto m = read_mask(c, x, t.output, s);

  std::mt19937_64 gen(31);
  std::normal_distribution<double> nd;
  Tensor g64 = Tensor::empty({N, C}, DType::f64);
  for (int64_t i = 0; i < N * C; ++i) g64.data<double>()[i] = nd(gen);
  const Tensor g = g64.to(c.dtype);
  const auto grads = seqpack::rnn_backward(*t.saved, g, {}, {});

  const double rtol = c.dtype == DType::f64 ? 1e-13 : 1e-6;
  auto gv = [&](int64_t r, int64_t col) { return g.item_as_double(r * C + col); };
  auto mv = [&](int64_t r, int64_t col) { return m[static_cast<size_t>(r * C + col)]; };
  int bad = 0;
  for (int64_t r = 0; r < N; ++r) {
    for (int64_t k = 0; k < kHidden; ++k) {
      double want = 0, mag = 0;
      for (int64_t d = 0; d < D; ++d) {
        want += mv(r, d * kHidden + k) * gv(r, d * kHidden + k);
        mag += std::fabs(mv(r, d * kHidden + k) * gv(r, d * kHidden + k));
      }
      const double got = grads.input.item_as_double(r * kHidden + k);
      if (std::fabs(got - want) > rtol * mag + 1e-300 && bad++ < 5) {
        ADD_FAILURE() << "grad input [" << r << ", " << k << "] = " << got << ", expected " << want
                      << " (mask " << mv(r, k) << (D > 1 ? ", " + std::to_string(mv(r, kHidden + k)) : "")
                      << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0) << bad << " input gradients wrong";

  // Weight gradients: sums over ~1000 rows, held to a bound relative to the
  // sum of the magnitudes (float32 summation error is far below 1e-4 of it).
  const auto names = seqpack::rnn_parameter_names(o);
  const double wtol = c.dtype == DType::f64 ? 1e-12 : 1e-4;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& n = names[i];
    const bool layer1 = n.rfind("weight_ih_l1", 0) == 0, layer0 = n.rfind("weight_ih_l0", 0) == 0;
    if (!layer0 && !layer1) continue;
    const int64_t d = n.find("_reverse") != std::string::npos ? 1 : 0;
    const int64_t cols = layer1 ? C : kHidden;
    const Tensor& dw = grads.weights[i];
    ASSERT_EQ(dw.shape(), (seqpack::Shape{kHidden, cols})) << n;
    int wbad = 0;
    for (int64_t j = 0; j < kHidden; ++j) {
      for (int64_t col = 0; col < cols; ++col) {
        double want = 0, mag = 0;
        for (int64_t r = 0; r < N; ++r) {
          const int64_t out_col = d * kHidden + j;
          const double term =
              layer1 ? (mv(r, out_col) != 0) * gv(r, out_col) * mv(r, col) *
                           x.item_as_double(r * kHidden + col % kHidden)
                     : mv(r, out_col) * gv(r, out_col) * x.item_as_double(r * kHidden + col);
          want += term;
          mag += std::fabs(term);
        }
        const double got = dw.item_as_double(j * cols + col);
        if (std::fabs(got - want) > wtol * mag + 1e-300 && wbad++ < 5) {
          ADD_FAILURE() << n << " gradient [" << j << ", " << col << "] = " << got << ", expected "
                        << want;
        }
      }
    }
    EXPECT_EQ(wbad, 0) << n << ": " << wbad << " gradients wrong";
  }
}

// rnn_saved_dropout_masks: the masks a saving forward applied, the ones read
// off its output (what seqpack.torch's double backward multiplies each layer's
// input by when it recomputes the forward); none in eval, none before layer 0.
TEST_P(RNNDropout, SavedMasksAreTheAppliedOnes) {
  const DropCase& c = GetParam();
  SCOPED_TRACE(describe(c));
  const RNNOptions o = options_of(c);
  const auto w = copy_weights(o);
  const PackingPlan plan = PackingPlan::from_lengths(lengths(), /*enforce_sorted=*/false);
  const int64_t N = plan.total_rows(), C = o.output_size();
  const Tensor x = positive_input(N, c.dtype, 29);
  const auto e = seqpack::rnn_forward(
      *rnn_make_plan(o, w, /*in_place=*/true, seqpack::testing::config()), x, plan, {}, {},
      /*training=*/false,
      /*save_for_backward=*/true, /*dropout_seed=*/7);
  ASSERT_TRUE(e.saved);
  EXPECT_EQ(seqpack::rnn_saved_options(*e.saved).dropout, c.p);
  for (const Tensor& m : seqpack::rnn_saved_dropout_masks(*e.saved))
    EXPECT_FALSE(m.defined()) << "a mask in eval";

  const auto t = seqpack::rnn_forward(
      *rnn_make_plan(o, w, /*in_place=*/true, seqpack::testing::config()), x, plan, {}, {},
      /*training=*/true,
      /*save_for_backward=*/true, /*dropout_seed=*/7);
  ASSERT_TRUE(t.saved);
  const auto saved = seqpack::rnn_saved_dropout_masks(*t.saved);
  ASSERT_EQ(static_cast<int64_t>(saved.size()), c.num_layers);
  EXPECT_FALSE(saved[0].defined()) << "a mask before layer 0";
  const double s = 1.0 / (1.0 - c.p);
  const int64_t masks = c.num_layers - 1;
  // The output is the product of the masks times [x, x].
  const auto applied = read_mask(c, x, t.output, std::pow(s, static_cast<double>(masks)));
  const double scale = c.dtype == DType::f64 ? s : static_cast<double>(static_cast<float>(s));
  int bad = 0;
  for (int64_t i = 0; i < N * C; ++i) {
    bool kept = true;
    for (int64_t l = 1; l < c.num_layers; ++l) {
      const Tensor& m = saved[static_cast<size_t>(l)];
      ASSERT_TRUE(m.defined()) << "no mask for layer " << l;
      ASSERT_EQ(m.shape(), (seqpack::Shape{N, C})) << "layer " << l;
      const double v = m.item_as_double(i);
      if (v != 0 && v != scale && bad++ < 5) {
        ADD_FAILURE() << "layer " << l << " mask [" << i << "] = " << v << ", neither 0 nor "
                      << scale;
      }
      kept = kept && v != 0;
    }
    if (kept != (applied[static_cast<size_t>(i)] != 0) && bad++ < 5) {
      ADD_FAILURE() << "element " << i << ": the saved masks " << (kept ? "keep" : "drop")
                    << " it, the forward " << (kept ? "dropped" : "kept") << " it";
    }
  }
  EXPECT_EQ(bad, 0);
}

std::string case_id(const ::testing::TestParamInfo<DropCase>& info) {
  const DropCase& c = info.param;
  return std::string(c.dtype == DType::f64 ? "f64" : "f32") + "_p" +
         std::to_string(static_cast<int>(std::lround(c.p * 100))) +
         (c.bidirectional ? "_bi" : "_uni") + "_L" + std::to_string(c.num_layers);
}

// p = 0.75 and 0.5 have power-of-two scales (kept values exact); 0.3 and 0.2
// do not (kept values within 2 ulp of x/(1-p)).
const DropCase kTwoLayers[] = {{DType::f32, 0.3, true, 2},
                               {DType::f32, 0.75, false, 2},
                               {DType::f64, 0.2, true, 2},
                               {DType::f64, 0.5, false, 2}};

INSTANTIATE_TEST_SUITE_P(TwoLayers, RNNDropout, ::testing::ValuesIn(kTwoLayers), case_id);
INSTANTIATE_TEST_SUITE_P(ThreeLayers, RNNDropout,
                         ::testing::Values(DropCase{DType::f32, 0.5, true, 3}), case_id);
INSTANTIATE_TEST_SUITE_P(TwoLayers, RNNDropoutGradient, ::testing::ValuesIn(kTwoLayers), case_id);

// The module: dropout only while training, the seed advancing per forward, and
// a padded batch through the same copying stack.
TEST(RNNDropout, ModuleAppliesTheScaledMaskOnlyWhenTraining) {
  const DropCase c{DType::f32, 0.4, true, 2};
  const RNNOptions o = options_of(c);
  seqpack::RNN m(o, /*seed=*/0);
  const auto w = copy_weights(o);
  std::map<std::string, Tensor> state;
  const auto names = seqpack::rnn_parameter_names(o);
  for (size_t i = 0; i < names.size(); ++i) state[names[i]] = w[i];
  m.load_state_dict(state);
  const int64_t T = 30, B = 24;
  const Tensor x = positive_input(T * B, c.dtype, 41).view({T, B, kHidden});
  m.eval();
  const auto e = m.forward(x);
  for (int64_t i = 0; i < e.padded.numel(); ++i) {
    const int64_t C = 2 * kHidden;
    ASSERT_EQ(e.padded.item_as_double(i), x.item_as_double((i / C) * kHidden + (i % C) % kHidden))
        << "eval output [" << i << "]";
  }
  m.train();
  m.set_dropout_seed(3);
  const auto y = m.forward(x);
  const Tensor flat_x = x.view({T * B, kHidden});
  const auto mask = read_mask(c, flat_x, y.padded.view({T * B, 2 * kHidden}), 1.0 / (1 - c.p));
  expect_keep_rate(mask, T * B, 2 * kHidden, 1 - c.p, "module");
}

}  // namespace
