// The core's policy (seqpack/policy.h): rnn_config and kernel_config check
// every setting, each reaches the part of the core that reads it through the
// config of the plans made with it (nothing process-wide: plans of different
// ISA caps run side by side, Highway's dispatch following each), and
// policy_from_environment reads the SEQPACK_* variables and refuses bad values
// by name. Every test leaves the variables it found.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cpu/gemm_engine.h"
#include "cpu/gemm_int8.h"
#include "cpu/isa_cap.h"
#include "rnn/grid.h"
#include "seqpack/cpu_info.h"
#include "seqpack/packed_sequence.h"
#include "seqpack/policy.h"
#include "seqpack/rnn.h"
#include "test_util.h"

namespace seqpack {
namespace {

const char* const kVariables[] = {
    "SEQPACK_MAX_CPU_ISA", "SEQPACK_INT8_KERNEL", "SEQPACK_STEP_SPLIT", "SEQPACK_STEP_UNITS",
    "SEQPACK_STEP_ROWS",   "SEQPACK_STEP_GROUPS", "SEQPACK_BF16"};

// Restores the variables on scope exit.
struct PolicyGuard {
  std::vector<std::pair<const char*, std::optional<std::string>>> vars;
  PolicyGuard() {
    for (const char* name : kVariables) {
      const char* v = std::getenv(name);
      vars.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
    }
  }
  ~PolicyGuard() {
    for (const auto& [name, value] : vars) {
      if (value) {
        setenv(name, value->c_str(), 1);
      } else {
        unsetenv(name);
      }
    }
  }
};

bool same(const Policy& a, const Policy& b) {
  return a.max_cpu_isa == b.max_cpu_isa && a.int8_kernel == b.int8_kernel &&
         a.step_split == b.step_split && a.step_units == b.step_units &&
         a.step_rows == b.step_rows && a.step_groups == b.step_groups && a.bf16 == b.bf16;
}

// Expects `f` to throw std::invalid_argument whose message holds `needle`.
template <typename F>
void expect_refused(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "accepted; expected an error with: " << needle;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Policy, EachSettingReachesThePartThatReadsIt) {
  Policy p;
  p.max_cpu_isa = "sse4";
  p.int8_kernel = "scalar";
  p.step_split = "rows";
  p.step_units = 128;
  p.step_rows = 8;
  p.step_groups = false;
  p.bf16 = "Emulated";  // any case
  // The kernel settings: a plan's config holds them, cpu_info reports them.
  const KernelConfig k = kernel_config(p);
  EXPECT_EQ(k.isa_cap, cpu::IsaLevel::sse4);
  EXPECT_EQ(k.int8, cpu::Int8Kernel::scalar);
  EXPECT_TRUE(k.bf16_emulated);
  EXPECT_EQ(cpu_info(p).bf16, "emulated");
  EXPECT_EQ(cpu_info(p).isa_cap, "sse4");
  EXPECT_EQ(cpu_info(p).int8_kernel, "scalar");
  EXPECT_EQ(cpu::int8_kernel(k), cpu::Int8Kernel::scalar);
  // bf16 runs emulated on any CPU, on an engine of its own.
  EXPECT_NO_THROW(check_precision_supported(Precision::bf16, k));
  if (cpu_info(Policy{}).native_bf16) {
    EXPECT_NE(&cpu::gemm_engine_f32(Precision::bf16, k),
              &cpu::gemm_engine_f32(Precision::bf16, KernelConfig{}));
  }
  // The split settings and the kernels are the config of the plans made with
  // them.
  const RNNConfig config = rnn_config(p);
  EXPECT_EQ(config.kernels, k);
  EXPECT_EQ(config.split, rnn::SplitChoice::rows);
  EXPECT_EQ(config.step_rows, 8);
  // A column split of H = 512 over 16 threads: one thread per 128 units.
  EXPECT_EQ(rnn::step_threads(config, 512, /*by_rows=*/false, 16), 4);
  EXPECT_FALSE(config.step_groups);

  // The defaults.
  EXPECT_EQ(kernel_config(Policy{}), KernelConfig{});
  EXPECT_EQ(KernelConfig{}.isa_cap, cpu::IsaLevel::avx512);
  EXPECT_EQ(rnn_config(Policy{}), RNNConfig{});
  EXPECT_EQ(rnn::step_threads(RNNConfig{}, 512, false, 16), 512 / rnn::kDefaultStepUnits);
  EXPECT_TRUE(RNNConfig{}.step_groups);
  EXPECT_FALSE(RNNConfig{}.kernels.bf16_emulated);
  const CpuInfo plain = cpu_info(Policy{});
  EXPECT_EQ(plain.bf16, plain.native_bf16 ? "native" : "none");
  EXPECT_EQ(plain.isa_cap, "avx512");
}

TEST(Policy, BadSettingsAreRefusedByName) {
  Policy good;
  good.step_split = "columns";
  const auto refused = [&](Policy p, const std::string& needle) {
    expect_refused([&] { rnn_config(p); }, needle);
    expect_refused([&] { kernel_config(p); }, needle);  // as rnn_config refuses it
    expect_refused([&] { cpu_info(p); }, needle);
  };
  Policy p = good;
  p.max_cpu_isa = "avx9";
  refused(p, "SEQPACK_MAX_CPU_ISA = 'avx9'");
  p = good;
  p.int8_kernel = "fast";
  refused(p, "SEQPACK_INT8_KERNEL: 'fast' is not auto");
  p = good;
  p.step_units = 8;
  refused(p, "SEQPACK_STEP_UNITS: '8' is not a count of hidden units");
  p = good;
  p.step_rows = -1;
  refused(p, "SEQPACK_STEP_ROWS: '-1' is not a count of rows");
  p = good;
  p.bf16 = "fake";
  refused(p, "SEQPACK_BF16: 'fake' is not native or emulated");
  // A bad setting after good ones.
  p = good;
  p.max_cpu_isa = "sse4";
  p.step_units = 100;
  p.step_split = "sideways";
  refused(p, "'sideways'");
  EXPECT_NO_THROW(rnn_config(good));
}

TEST(Policy, AKernelTheCpuLacksIsRefusedWhereAPlanIsMade) {
  Policy p;
  p.max_cpu_isa = "avx2";  // rules out vnni and amx on any CPU
  p.int8_kernel = "vnni";
  const KernelConfig k = kernel_config(p);  // the words are right: accepted
  const std::string needle = "SEQPACK_INT8_KERNEL: 'vnni' needs AVX512-VNNI";
  expect_refused([&] { (void)cpu::int8_kernel(k); }, needle);
  expect_refused([&] { cpu_info(p); }, needle);
  RNNOptions o;
  o.mode = RNNMode::lstm;
  o.input_size = 3;
  o.hidden_size = 4;
  o.precision = Precision::int8;
  std::mt19937_64 gen(3);
  std::vector<Tensor> w;
  for (const Shape& s : rnn_parameter_shapes(o)) w.push_back(testing::random_tensor(s, 0.3, gen));
  expect_refused([&] { rnn_make_plan(o, w, /*in_place=*/false, rnn_config(p)); }, needle);
  p.int8_kernel = "auto";
  EXPECT_EQ(cpu::int8_kernel(kernel_config(p)), cpu::Int8Kernel::avx2);
  EXPECT_NO_THROW(rnn_make_plan(o, w, /*in_place=*/false, rnn_config(p)));
}

// A one-layer recurrent layer with random weights (|w| <= 0.3) and input
// (|x| <= 1) over sequences of `lengths`, and its inference forward.
struct RandomLayer {
  RNNOptions o;
  std::vector<Tensor> w;
  PackingPlan plan;
  Tensor x;
  RandomLayer(RNNMode mode, int64_t input_size, int64_t hidden_size,
              const std::vector<int64_t>& lengths, uint64_t seed)
      : o(options(mode, input_size, hidden_size)),
        plan(PackingPlan::from_lengths(lengths, /*enforce_sorted=*/false)) {
    std::mt19937_64 gen(seed);
    for (const Shape& s : rnn_parameter_shapes(o)) w.push_back(testing::random_tensor(s, 0.3, gen));
    x = testing::random_tensor({plan.total_rows(), o.input_size}, 1.0, gen);
  }
  static RNNOptions options(RNNMode mode, int64_t input_size, int64_t hidden_size) {
    RNNOptions r;
    r.mode = mode;
    r.input_size = input_size;
    r.hidden_size = hidden_size;
    return r;
  }
  // The forward of a plan made with `config`.
  RNNForwardResult forward(const RNNConfig& config) const {
    return rnn_forward(*rnn_make_plan(o, w, /*in_place=*/true, config), x, plan, Tensor(), Tensor(),
                       false, false);
  }
};

// The cap moves Highway's target per plan, down and back up within a
// process, and a layer's results under each stay within fp32's bound of each
// other; the uncapped plan gives its own bits again after a capped one ran.
TEST(Policy, TheIsaCapMovesHighwaysDispatchBothWays) {
  const Policy wide_policy;
  const std::string widest = cpu_info(wide_policy).kernels;
  const RandomLayer layer(RNNMode::gru, 5, 24, {6, 3, 5}, 7);
  const RNNForwardResult wide = layer.forward(rnn_config(wide_policy));

  Policy capped;
  capped.max_cpu_isa = "sse4";
  const std::string narrow = cpu_info(capped).kernels;
  EXPECT_EQ(narrow.find("AVX"), std::string::npos) << narrow;
  EXPECT_NE(narrow, widest);  // every CPU here has AVX2
  const RNNForwardResult small = layer.forward(rnn_config(capped));
  EXPECT_TRUE(testing::fp_close(small.output, wide.output, 6, DType::f32, "output"));
  EXPECT_TRUE(testing::fp_close(small.h_n, wide.h_n, 6, DType::f32, "h_n"));

  const RNNForwardResult again = layer.forward(rnn_config(wide_policy));
  EXPECT_TRUE(testing::bitwise_equal(again.output, wide.output));
  EXPECT_TRUE(testing::bitwise_equal(again.h_n, wide.h_n));
  EXPECT_EQ(cpu_info(wide_policy).kernels, widest);
}

// The AVX-512 levels cap Highway's AVX-512 targets one by one: under avx3
// the kernels run Highway's plain AVX3 target where the CPU has AVX-512
// (AVX2's elsewhere), never AVX3_DL, AVX3_ZEN4 or AVX3_SPR; each level gives
// a target no wider than the next level's, and the same results.
TEST(Policy, TheAvx512LevelsCapHighwaysTargetsOneByOne) {
  const std::string widest = cpu_info(Policy{}).kernels;
  const bool avx512 = widest.rfind("AVX3", 0) == 0;
  const RandomLayer layer(RNNMode::lstm, 3, 13, {5, 5, 5}, 11);  // every sequence full
  const RNNForwardResult wide = layer.forward(rnn_config(Policy{}));
  const auto allowed = [](const std::string& level, const std::string& target) {
    if (target.rfind("AVX3", 0) != 0) return true;  // AVX2 or below: under every level
    if (level == "avx3") return target == "AVX3";
    if (level == "avx3_dl") return target == "AVX3" || target == "AVX3_DL";
    return target != "AVX3_SPR";  // avx3_zen4
  };
  for (const std::string level : {"avx3", "avx3_dl", "avx3_zen4"}) {
    SCOPED_TRACE(level);
    Policy capped;
    capped.max_cpu_isa = level;
    const std::string target = cpu_info(capped).kernels;
    EXPECT_EQ(cpu_info(capped).isa_cap, level);
    EXPECT_TRUE(allowed(level, target)) << target;
    if (avx512) EXPECT_EQ(target.rfind("AVX3", 0), 0u) << target;  // AVX-512 stays on
    const RNNForwardResult r = layer.forward(rnn_config(capped));
    const int64_t n = 5 * (3 + 13 + 16);  // 5 steps of x, h and the gate math
    EXPECT_TRUE(testing::fp_close(r.output, wide.output, n, DType::f32, "output"));
    EXPECT_TRUE(testing::fp_close(r.h_n, wide.h_n, n, DType::f32, "h_n"));
  }
  EXPECT_EQ(cpu_info(Policy{}).kernels, widest);
}

// Model plans of two caps live side by side: each lays its step operands out
// for its own target (panels as wide as two of its vectors) and keeps them,
// so calls of the two interleaved give each plan's own bits every time, and
// the two agree within fp32's bound.
TEST(Policy, PlansOfTwoCapsRunSideBySide) {
  RNNOptions o;
  o.mode = RNNMode::lstm;
  o.input_size = 6;
  o.hidden_size = 40;  // panels of 16 columns on AVX2, 32 on AVX-512, 8 on SSE4: several each
  std::mt19937_64 gen(11);
  std::vector<Tensor> w;
  for (const Shape& s : rnn_parameter_shapes(o)) w.push_back(testing::random_tensor(s, 0.3, gen));
  const PackingPlan plan = PackingPlan::from_lengths({7, 5, 2}, /*enforce_sorted=*/false);
  const Tensor x = testing::random_tensor({plan.total_rows(), o.input_size}, 1.0, gen);
  Policy capped;
  capped.max_cpu_isa = "sse4";
  const auto wide = rnn_make_plan(o, w, /*in_place=*/false, rnn_config(Policy{}));
  const auto narrow = rnn_make_plan(o, w, /*in_place=*/false, rnn_config(capped));
  const auto run = [&](const std::shared_ptr<const RNNModelPlan>& model) {
    return rnn_forward(*model, x, plan, Tensor(), Tensor(), false, false, 0);
  };
  const RNNForwardResult first_wide = run(wide);
  const RNNForwardResult first_narrow = run(narrow);
  for (int round = 0; round < 2; ++round) {
    const RNNForwardResult w2 = run(wide);
    const RNNForwardResult n2 = run(narrow);
    EXPECT_TRUE(testing::bitwise_equal(w2.output, first_wide.output)) << round;
    EXPECT_TRUE(testing::bitwise_equal(n2.output, first_narrow.output)) << round;
    EXPECT_TRUE(testing::bitwise_equal(n2.c_n, first_narrow.c_n)) << round;
  }
  EXPECT_TRUE(testing::fp_close(first_narrow.output, first_wide.output, 7, DType::f32, "output"));
  EXPECT_TRUE(testing::fp_close(first_narrow.h_n, first_wide.h_n, 7, DType::f32, "h_n"));
  EXPECT_TRUE(testing::fp_close(first_narrow.c_n, first_wide.c_n, 7, DType::f32, "c_n"));
}

TEST(Policy, FromTheEnvironment) {
  const PolicyGuard guard;
  for (const char* v : kVariables) unsetenv(v);
  EXPECT_TRUE(same(policy_from_environment(), Policy{}));
  setenv("SEQPACK_MAX_CPU_ISA", "AVX2", 1);  // any case, as written
  setenv("SEQPACK_INT8_KERNEL", "scalar", 1);
  setenv("SEQPACK_STEP_SPLIT", "columns", 1);
  setenv("SEQPACK_STEP_UNITS", "32", 1);
  setenv("SEQPACK_STEP_ROWS", "8", 1);
  setenv("SEQPACK_STEP_GROUPS", "0", 1);
  setenv("SEQPACK_BF16", "emulated", 1);
  const Policy p = policy_from_environment();
  EXPECT_EQ(p.bf16, "emulated");
  EXPECT_EQ(p.max_cpu_isa, "AVX2");
  EXPECT_EQ(p.int8_kernel, "scalar");
  EXPECT_EQ(p.step_split, "columns");
  EXPECT_EQ(p.step_units, 32);
  EXPECT_EQ(p.step_rows, 8);
  EXPECT_FALSE(p.step_groups);
  EXPECT_EQ(kernel_config(p).isa_cap, cpu::IsaLevel::avx2);
  // Empty is unset.
  for (const char* v : kVariables) setenv(v, "", 1);
  EXPECT_TRUE(same(policy_from_environment(), Policy{}));

  for (const auto& [name, value, needle] :
       std::vector<std::tuple<const char*, const char*, std::string>>{
           {"SEQPACK_MAX_CPU_ISA", "avx9", "SEQPACK_MAX_CPU_ISA = 'avx9'"},
           {"SEQPACK_INT8_KERNEL", "fast", "SEQPACK_INT8_KERNEL: 'fast' is not auto"},
           {"SEQPACK_STEP_SPLIT", "diagonal", "SEQPACK_STEP_SPLIT: 'diagonal' is not one of rows"},
           {"SEQPACK_STEP_UNITS", "8", "SEQPACK_STEP_UNITS: '8' is not a count of hidden units"},
           {"SEQPACK_STEP_UNITS", "64k", "SEQPACK_STEP_UNITS: '64k' is not a count"},
           {"SEQPACK_STEP_GROUPS", "yes", "SEQPACK_STEP_GROUPS: 'yes' is not 0 or 1"},
           {"SEQPACK_BF16", "avx512", "SEQPACK_BF16: 'avx512' is not native or emulated"},
           {"SEQPACK_STEP_ROWS", "0", "SEQPACK_STEP_ROWS: '0' is not a count of rows"},
           {"SEQPACK_STEP_ROWS", "many", "SEQPACK_STEP_ROWS: 'many' is not a count of rows"}}) {
    setenv(name, value, 1);
    expect_refused([] { (void)policy_from_environment(); }, needle);
    setenv(name, "", 1);
  }
}

}  // namespace
}  // namespace seqpack
