// Shared test helpers: JSON fixtures -> Tensors, and closeness checks that
// print the index, both values and the tolerance.
#pragma once

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "seqpack/cpu_info.h"
#include "seqpack/packed_sequence.h"
#include "seqpack/policy.h"
#include "seqpack/rnn.h"
#include "seqpack/tensor.h"

namespace seqpack::testing {

// The test program's SEQPACK_* policy (CTest runs some programs under
// SEQPACK_MAX_CPU_ISA, SEQPACK_BF16, tests/CMakeLists.txt; the test main
// checks it, gtest_main_policy.cpp), its kernel settings, and the plan config
// of both: what the tests give the kernels, engines and plans they run, so
// that a program run under a setting runs its kernels under it.
inline const Policy& policy() {
  static const Policy p = policy_from_environment();
  return p;
}
inline const KernelConfig& kernels() {
  static const KernelConfig k = kernel_config(policy());
  return k;
}
inline RNNConfig config() { return rnn_config(policy()); }

// Whether precision bf16 runs here: on native bf16 dot products, or emulated
// (the policy's bf16 = "emulated", SEQPACK_BF16=emulated: CTest runs the bf16
// programs so again, tests/CMakeLists.txt).
inline bool bf16_runs() { return cpu_info(policy()).bf16 != "none"; }

// Why a bf16 test is skipped.
inline std::string no_bf16_here() {
  return "no bf16 on " + cpu_info(policy()).isa + " (SEQPACK_BF16=emulated runs it emulated)";
}

inline nlohmann::json load_fixture(const std::string& name) {
  const std::string path = std::string(SEQPACK_FIXTURES_DIR) + "/" + name;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open fixture " + path);
  return nlohmann::json::parse(in);
}

// A nested JSON list -> Tensor of `dtype` with the list's shape.
// An object {"shape": [...], "values": [...]} (flat values) is accepted too,
// which is how empty tensors (a zero in the shape) are stored.
inline Tensor tensor_from_json(const nlohmann::json& j, DType dtype) {
  Shape shape;
  std::vector<double> flat;
  if (j.is_object()) {
    for (auto& s : j.at("shape")) shape.push_back(s.get<int64_t>());
    for (auto& v : j.at("values")) flat.push_back(v.get<double>());
  } else {
    const nlohmann::json* cur = &j;
    while (cur->is_array()) {
      shape.push_back(static_cast<int64_t>(cur->size()));
      if (cur->empty()) break;
      cur = &(*cur)[0];
    }
    // Depth-first flatten in row-major order.
    std::function<void(const nlohmann::json&)> rec = [&](const nlohmann::json& x) {
      if (x.is_array()) {
        for (auto& y : x) rec(y);
      } else {
        flat.push_back(x.get<double>());
      }
    };
    rec(j);
  }
  Tensor t = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (dtype) {
      case DType::f32:
        t.data<float>()[i] = static_cast<float>(flat[static_cast<size_t>(i)]);
        break;
      case DType::f64:
        t.data<double>()[i] = flat[static_cast<size_t>(i)];
        break;
      case DType::i64:
        t.data<int64_t>()[i] = static_cast<int64_t>(flat[static_cast<size_t>(i)]);
        break;
    }
  }
  return t;
}

// Mixed tolerance: |a - e| <= atol + rtol * |e|. Reports the first few
// mismatches with their flat index and both values.
inline ::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected,
                                            double rtol, double atol,
                                            const std::string& what = "") {
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure() << what << ": shape " << shape_str(actual.shape())
                                         << " != expected " << shape_str(expected.shape());
  }
  int bad = 0;
  ::testing::AssertionResult res = ::testing::AssertionFailure();
  res << what << ":";
  for (int64_t i = 0; i < actual.numel(); ++i) {
    const double a = actual.item_as_double(i), e = expected.item_as_double(i);
    const bool ok =
        (std::isnan(a) && std::isnan(e)) || std::fabs(a - e) <= atol + rtol * std::fabs(e);
    if (!ok) {
      if (bad < 5) res << " [" << i << "] got " << a << " expected " << e << ";";
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  res << " " << bad << " of " << actual.numel() << " elements differ (rtol " << rtol << ", atol "
      << atol << ")";
  return res;
}

// The rule by which tests compare results computed along different code paths
// (seqpack against PyTorch's fixtures, one ISA against another), the same as
// python/tests/tolerance.py (docs/testing.md): two valid orders of a chain of
// n roundings differ by at most 2 * u * n * (the magnitude of the terms), and
// the largest magnitude of the tensor compared stands for the terms.
inline double unit_roundoff(DType d) { return d == DType::f64 ? 0x1p-53 : 0x1p-24; }

// Roundings of one step's element-wise gate math (sigmoid, tanh within a few
// ulps each, a handful of products and sums).
constexpr int64_t kGateMathRoundings = 16;

// n for the outputs, states and gradients of a recurrent layer: per step the
// layer input (input_size, or D * (proj_size or hidden_size) above the first
// layer), the state, with proj_size the cell's hidden units, and the gate
// math; times the steps a value depends on (for a weight gradient every token:
// pass the number of packed rows) and the layers.
inline int64_t rnn_reduction_length(int64_t input_size, int64_t hidden_size, int64_t num_layers,
                                    bool bidirectional, int64_t steps, int64_t proj_size = 0) {
  const int64_t d = bidirectional ? 2 : 1;
  const int64_t h_out = proj_size > 0 ? proj_size : hidden_size;
  const int64_t per_step = std::max(input_size, d * h_out) + h_out +
                           (proj_size > 0 ? hidden_size : 0) + kGateMathRoundings;
  return per_step * std::max<int64_t>(steps, 1) * std::max<int64_t>(num_layers, 1);
}
inline int64_t rnn_reduction_length(const RNNOptions& o, int64_t steps) {
  return rnn_reduction_length(o.input_size, o.hidden_size, o.num_layers, o.bidirectional, steps,
                              o.proj_size);
}

// |actual - expected| <= 2 * u(dtype) * n * max|expected| elementwise (NaN
// meets NaN, an infinity itself); names the first offending indices, both
// values, the bound and n.
inline ::testing::AssertionResult fp_close(const Tensor& actual, const Tensor& expected, int64_t n,
                                           DType dtype, const std::string& what = "") {
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure() << what << ": shape " << shape_str(actual.shape())
                                         << " != expected " << shape_str(expected.shape());
  }
  double scale = 0;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    const double e = expected.item_as_double(i);
    if (std::isfinite(e)) scale = std::max(scale, std::fabs(e));
  }
  const double bound = 2.0 * unit_roundoff(dtype) * static_cast<double>(std::max<int64_t>(n, 1)) * scale;
  int bad = 0;
  ::testing::AssertionResult res = ::testing::AssertionFailure();
  res << what << ":";
  for (int64_t i = 0; i < actual.numel(); ++i) {
    const double a = actual.item_as_double(i), e = expected.item_as_double(i);
    const bool ok = (std::isnan(a) && std::isnan(e)) || a == e || std::fabs(a - e) <= bound;
    if (!ok) {
      if (bad < 5) res << " [" << i << "] got " << a << " expected " << e << ";";
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  res << " " << bad << " of " << actual.numel() << " elements differ by more than " << bound
      << " (2 * u * n " << n << " * max|expected| " << scale << ")";
  return res;
}

// Runs `f`, expects std::invalid_argument, and checks that its message contains
// every string in `needles` (the offending values it must name).
template <typename F>
void expect_invalid(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected std::invalid_argument"
                  << (needles.empty() ? "" : " mentioning " + needles[0]);
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) {
      EXPECT_NE(msg.find(n), std::string::npos)
          << "message \"" << msg << "\" lacks \"" << n << "\"";
    }
  }
}

// Runs `check`, one random draw's comparisons (EXPECT_* inside) of float32
// results with the float64 reference; it draws its own values and sets its
// argument to the reference's `relu_margin` (see RNNReferenceResult). A ReLU's
// derivative jumps at 0: a pre-activation closer to 0 than float32 rounding
// may land on the other side in any float32 implementation (PyTorch's too),
// and the gradients then part from the reference's by far more than rounding.
// So when a draw fails with its reference within 1e-4 of a ReLU's 0, its
// failures are dropped and `check` runs again on new values, at most twice;
// the third draw's failures are reported as they are. A real bug fails every
// draw.
inline void compare_redrawing_near_relu_kinks(const std::function<void(double&)>& check) {
  for (int draw = 0; draw < 3; ++draw) {
    ::testing::TestPartResultArray results;
    // A check that stops before setting it (an ASSERT) is reported, never redrawn.
    double relu_margin = std::numeric_limits<double>::infinity();
    {
      ::testing::ScopedFakeTestPartResultReporter catcher(
          ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
      check(relu_margin);
    }
    bool failed = false;
    for (int i = 0; i < results.size(); ++i) failed |= results.GetTestPartResult(i).failed();
    if (failed && relu_margin < 1e-4 && draw < 2) {
      std::cerr << "redrawn: a comparison failed with a ReLU pre-activation " << relu_margin
                << " from 0 in the reference\n";
      continue;
    }
    for (int i = 0; i < results.size(); ++i) {
      const ::testing::TestPartResult& r = results.GetTestPartResult(i);
      if (!r.failed()) continue;
      ADD_FAILURE_AT(r.file_name() ? r.file_name() : "(unknown file)", r.line_number())
          << r.message();
    }
    return;
  }
}

// A seed for random tests: SEQPACK_TEST_SEED from the environment, else random.
// Tests print it (SCOPED_TRACE) so a failure can be replayed.
// Uniform in [-1, 1), float32 or float64.
inline Tensor random_tensor(const Shape& shape, DType dtype, std::mt19937_64& rng) {
  Tensor t = Tensor::empty(shape, dtype);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::f32) {
      t.data<float>()[i] = static_cast<float>(u(rng));
    } else {
      t.data<double>()[i] = u(rng);
    }
  }
  return t;
}

// float32, uniform in [-scale, scale).
inline Tensor random_tensor(const Shape& shape, double scale, std::mt19937_64& rng) {
  Tensor t = Tensor::empty(shape, DType::f32);
  std::uniform_real_distribution<float> u(static_cast<float>(-scale), static_cast<float>(scale));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

// Rows of caller's sequence b in `plan`'s packed layout, in time order.
inline std::vector<int64_t> rows_of(const PackingPlan& plan, int64_t b) {
  std::vector<int64_t> rows;
  const auto& idx = plan.padded_index();
  for (int64_t r = 0; r < static_cast<int64_t>(idx.size()); ++r) {
    if (idx[static_cast<std::size_t>(r)] % plan.batch() == b) rows.push_back(r);
  }
  return rows;
}

// Those rows of packed [rows, F], as float64 [rows.size(), F].
inline Tensor gather_rows(const Tensor& packed, const std::vector<int64_t>& rows) {
  const int64_t F = packed.size(1);
  Tensor out = Tensor::empty({static_cast<int64_t>(rows.size()), F}, DType::f64);
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (int64_t f = 0; f < F; ++f)
      out.data<double>()[static_cast<int64_t>(i) * F + f] = packed.item_as_double(rows[i] * F + f);
  return out;
}

// max |a - b| over the elements (NaN wins).
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = std::fabs(a.item_as_double(i) - b.item_as_double(i));
    if (!(d <= worst)) worst = d;
  }
  return worst;
}

// A random recurrent-layer case of the parity grids (test_rnn_bf16,
// test_rnn_int8): weights U(-1/sqrt(H), 1/sqrt(H)) (torch's initialisation),
// input U(-1, 1), with give_h0 h0 (and an LSTM's c0) U(-0.5, 0.5), drawn in
// that order from `gen`, which the caller may go on drawing from.
struct RnnCase {
  std::string name;  // mode, sizes and seed, for SCOPED_TRACE
  PackingPlan plan;
  std::vector<Tensor> weights;
  Tensor x, h0, c0;
};
inline RnnCase random_rnn_case(const RNNOptions& o, const std::vector<int64_t>& lengths,
                               bool give_h0, uint64_t seed, std::mt19937_64& gen) {
  RnnCase c{std::string(rnn_mode_name(o.mode)) + " H" + std::to_string(o.hidden_size) + " L" +
                std::to_string(o.num_layers) + (o.bidirectional ? " bi" : "") +
                (o.proj_size ? " P" + std::to_string(o.proj_size) : "") + " seed " +
                std::to_string(seed),
            PackingPlan::from_lengths(lengths, /*enforce_sorted=*/false), {}, {}, {}, {}};
  const int64_t B = c.plan.batch(), LD = o.num_layers * o.num_directions();
  for (const Shape& s : rnn_parameter_shapes(o))
    c.weights.push_back(random_tensor(s, 1.0 / std::sqrt(double(o.hidden_size)), gen));
  c.x = random_tensor({c.plan.total_rows(), o.input_size}, 1.0, gen);
  if (give_h0) {
    c.h0 = random_tensor({LD, B, o.real_hidden_size()}, 0.5, gen);
    if (o.mode == RNNMode::lstm) c.c0 = random_tensor({LD, B, o.hidden_size}, 0.5, gen);
  }
  return c;
}

// Same shape, dtype and bytes; or both undefined (an absent gradient).
inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

inline uint64_t test_seed() {
  if (const char* s = std::getenv("SEQPACK_TEST_SEED")) return std::stoull(s);
  return std::random_device{}();
}

}  // namespace seqpack::testing
