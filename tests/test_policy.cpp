// The core's policy (seqpack/policy.h): set_policy checks every setting
// before it installs any, each reaches the part of the core that reads it,
// the ISA cap changes within a process (Highway's dispatch follows, both
// ways), and policy_from_environment reads the SEQPACK_* variables and
// refuses bad values by name. Every test leaves the policy it found.
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

// Restores the policy and the variables on scope exit.
struct PolicyGuard {
  Policy before = policy();
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
    set_policy(before);
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
  const PolicyGuard guard;
  Policy p;
  p.max_cpu_isa = "sse4";
  p.int8_kernel = "scalar";
  p.step_split = "rows";
  p.step_units = 128;
  p.step_rows = 8;
  p.step_groups = false;
  p.bf16 = "Emulated";  // any case
  const uint64_t generation = cpu::isa_generation();
  set_policy(p);
  EXPECT_TRUE(same(policy(), p));
  EXPECT_TRUE(cpu::bf16_emulation());
  EXPECT_EQ(cpu_info().bf16, "emulated");
  // Weights laid out for the bf16 units are not read by emulated products.
  EXPECT_GT(cpu::isa_generation(), generation);
  EXPECT_EQ(cpu::isa_cap(), cpu::IsaLevel::sse4);
  EXPECT_EQ(cpu_info().isa_cap, "sse4");
  EXPECT_EQ(cpu::int8_kernel(), cpu::Int8Kernel::scalar);
  // The split settings are the config of the plans made with them.
  const RNNConfig config = rnn_config(p);
  EXPECT_EQ(config.split, rnn::SplitChoice::rows);
  EXPECT_EQ(config.step_rows, 8);
  // A column split of H = 512 over 16 threads: one thread per 128 units.
  EXPECT_EQ(rnn::step_threads(config, 512, /*by_rows=*/false, 16), 4);
  EXPECT_FALSE(config.step_groups);

  set_policy(Policy{});  // the defaults again
  EXPECT_EQ(cpu::isa_cap(), cpu::IsaLevel::avx512);
  EXPECT_EQ(rnn_config(Policy{}), RNNConfig{});
  EXPECT_EQ(rnn::step_threads(RNNConfig{}, 512, false, 16), 512 / rnn::kDefaultStepUnits);
  EXPECT_TRUE(RNNConfig{}.step_groups);
  EXPECT_FALSE(cpu::bf16_emulation());
  EXPECT_EQ(cpu_info().bf16, cpu_info().native_bf16 ? "native" : "none");
}

TEST(Policy, BadSettingsAreRefusedByNameAndNothingIsInstalled) {
  const PolicyGuard guard;
  Policy good;
  good.step_split = "columns";
  set_policy(good);
  const auto refused = [&](Policy p, const std::string& needle) {
    expect_refused([&] { set_policy(p); }, needle);
    EXPECT_TRUE(same(policy(), good)) << needle;
    expect_refused([&] { rnn_config(p); }, needle);  // as set_policy refuses it
  };
  Policy p = good;
  p.max_cpu_isa = "avx9";
  refused(p,
          "SEQPACK_MAX_CPU_ISA = 'avx9' is not one of avx512, avx3_zen4, avx3_dl, avx3, avx2, sse4");
  p = good;
  p.int8_kernel = "fast";
  refused(p, "SEQPACK_INT8_KERNEL: 'fast' is not auto, amx, vnni, avx2 or scalar");
  p = good;
  p.step_split = "diagonal";
  refused(p, "SEQPACK_STEP_SPLIT: 'diagonal' is not one of rows, columns, engine");
  p = good;
  p.step_units = 8;
  refused(p, "SEQPACK_STEP_UNITS: '8' is not a count of hidden units from 16 to 1048576");
  p = good;
  p.step_rows = -1;
  refused(p, "SEQPACK_STEP_ROWS: '-1' is not a count of rows from 1 to 1048576");
  p = good;
  p.step_rows = (1 << 20) + 1;
  refused(p, "SEQPACK_STEP_ROWS: '1048577'");
  p = good;
  p.bf16 = "fake";
  refused(p, "SEQPACK_BF16: 'fake' is not native or emulated");
  // A bad setting after good ones: the good ones are not installed either.
  p = good;
  p.max_cpu_isa = "sse4";
  p.step_units = 100;
  p.step_split = "sideways";
  refused(p, "'sideways'");
  EXPECT_EQ(cpu::isa_cap(), cpu::IsaLevel::avx512);
}

TEST(Policy, AKernelTheCpuLacksIsRefusedAtTheFirstProduct) {
  const PolicyGuard guard;
  Policy p;
  p.max_cpu_isa = "avx2";  // rules out vnni and amx on any CPU
  p.int8_kernel = "vnni";
  set_policy(p);  // the words are right: accepted
  expect_refused([] { (void)cpu::int8_kernel(); }, "SEQPACK_INT8_KERNEL: 'vnni' needs AVX512-VNNI");
  p.int8_kernel = "auto";
  set_policy(p);
  EXPECT_EQ(cpu::int8_kernel(), cpu::Int8Kernel::avx2);
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
  RNNForwardResult forward() const {
    return rnn_forward(*rnn_make_plan(o, w, /*in_place=*/true), x, plan, Tensor(), Tensor(), false,
                       false);
  }
};

// The cap changes Highway's target within a process, down and back up, and
// a layer's results under each stay within fp32's bound of each other.
TEST(Policy, TheIsaCapMovesHighwaysDispatchBothWays) {
  const PolicyGuard guard;
  set_policy(Policy{});
  const std::string widest = cpu_info().kernels;
  const RandomLayer layer(RNNMode::gru, 5, 24, {6, 3, 5}, 7);
  const auto run = [&] { return layer.forward(); };
  const RNNForwardResult wide = run();

  Policy capped;
  capped.max_cpu_isa = "sse4";
  set_policy(capped);
  const std::string narrow = cpu_info().kernels;
  EXPECT_EQ(narrow.find("AVX"), std::string::npos) << narrow;
  EXPECT_NE(narrow, widest);  // every CPU here has AVX2
  const RNNForwardResult small = run();
  EXPECT_TRUE(testing::fp_close(small.output, wide.output, 6, DType::f32, "output"));
  EXPECT_TRUE(testing::fp_close(small.h_n, wide.h_n, 6, DType::f32, "h_n"));

  set_policy(Policy{});
  EXPECT_EQ(cpu_info().kernels, widest);
}

// The AVX-512 levels cap Highway's AVX-512 targets one by one: under avx3
// the kernels run Highway's plain AVX3 target where the CPU has AVX-512
// (AVX2's elsewhere), never AVX3_DL, AVX3_ZEN4 or AVX3_SPR; each level gives
// a target no wider than the next level's, and the same results.
TEST(Policy, TheAvx512LevelsCapHighwaysTargetsOneByOne) {
  const PolicyGuard guard;
  set_policy(Policy{});
  const std::string widest = cpu_info().kernels;
  const bool avx512 = widest.rfind("AVX3", 0) == 0;
  const RandomLayer layer(RNNMode::lstm, 3, 13, {5, 5, 5}, 11);  // every sequence full
  const auto run = [&] { return layer.forward(); };
  const RNNForwardResult wide = run();
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
    set_policy(capped);
    const std::string target = cpu_info().kernels;
    EXPECT_EQ(cpu_info().isa_cap, level);
    EXPECT_TRUE(allowed(level, target)) << target;
    if (avx512) EXPECT_EQ(target.rfind("AVX3", 0), 0u) << target;  // AVX-512 stays on
    const RNNForwardResult r = run();
    const int64_t n = 5 * (3 + 13 + 16);  // 5 steps of x, h and the gate math
    EXPECT_TRUE(testing::fp_close(r.output, wide.output, n, DType::f32, "output"));
    EXPECT_TRUE(testing::fp_close(r.h_n, wide.h_n, n, DType::f32, "h_n"));
  }
  set_policy(Policy{});
  EXPECT_EQ(cpu_info().kernels, widest);
}

// A model plan made under one cap keeps working after the cap changes: its
// step operands (panels as wide as two vectors of the target they were laid
// out for) are laid out again for the new target, not read with the wrong
// width.
TEST(Policy, AModelPlanOutlivesACapChange) {
  const PolicyGuard guard;
  set_policy(Policy{});
  RNNOptions o;
  o.mode = RNNMode::lstm;
  o.input_size = 6;
  o.hidden_size = 40;  // panels of 16 columns on AVX2, 32 on AVX-512, 8 on SSE4: several each
  std::mt19937_64 gen(11);
  std::vector<Tensor> w;
  for (const Shape& s : rnn_parameter_shapes(o)) w.push_back(testing::random_tensor(s, 0.3, gen));
  const PackingPlan plan = PackingPlan::from_lengths({7, 5, 2}, /*enforce_sorted=*/false);
  const Tensor x = testing::random_tensor({plan.total_rows(), o.input_size}, 1.0, gen);
  const auto model = rnn_make_plan(o, w);
  const auto run = [&] {
    return rnn_forward(*model, x, plan, Tensor(), Tensor(), false, false, 0);
  };
  const RNNForwardResult before = run();
  const RNNForwardResult again = run();  // the plan's layouts, made by the first call
  Policy capped;
  capped.max_cpu_isa = "sse4";
  set_policy(capped);
  const RNNForwardResult narrow = run();
  set_policy(Policy{});
  const RNNForwardResult after = run();
  for (const auto* r : {&again, &narrow, &after}) {
    EXPECT_TRUE(testing::fp_close(r->output, before.output, 7, DType::f32, "output"));
    EXPECT_TRUE(testing::fp_close(r->h_n, before.h_n, 7, DType::f32, "h_n"));
    EXPECT_TRUE(testing::fp_close(r->c_n, before.c_n, 7, DType::f32, "c_n"));
  }
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
  set_policy(p);
  EXPECT_EQ(cpu::isa_cap(), cpu::IsaLevel::avx2);
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
