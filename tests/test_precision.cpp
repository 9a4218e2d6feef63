// Precision choice and ISA dispatch (seqpack/precision.h). CTest runs this
// binary three times: as the CPU is, and capped by ONEDNN_MAX_CPU_ISA to
// AVX512_CORE and to AVX2 (tests/CMakeLists.txt), so the refusal and the
// fall-back are tested on any machine.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <stdexcept>
#include <string>

#include "cpu_isa.h"
#include "seqpack/precision.h"
#include "seqpack/rnn.h"
#include "test_util.h"

namespace seqpack {
namespace {

std::string capped_to() {
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  return cap ? cap : "";
}

TEST(Precision, NamesRoundTripAndBadNamesAreRejected) {
  EXPECT_EQ(parse_precision("fp32"), Precision::fp32);
  EXPECT_EQ(parse_precision("bf16"), Precision::bf16);
  EXPECT_STREQ(precision_name(Precision::bf16), "bf16");
  EXPECT_EQ(parse_precision("int8"), Precision::int8);
  EXPECT_STREQ(precision_name(Precision::int8), "int8");
  try {
    parse_precision("fp16");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'fp16'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(resolve_precision("half", seqpack::testing::kernels()), std::invalid_argument);
}

TEST(Precision, CapsAreHonoured) {
  const CpuInfo cpu = cpu_info(seqpack::testing::policy());
  const std::string cap = capped_to();
  // A cap bounds the ISA from above: below it, oneDNN stays at the CPU's own.
  if (!cap.empty()) EXPECT_EQ(cpu.isa, testing::onednn_isa_under_cap(cap)) << "capped to " << cap;
  if (!cap.empty()) EXPECT_FALSE(cpu.native_bf16) << cpu.isa;
  if (!cap.empty()) EXPECT_FALSE(cpu.native_int8) << cpu.isa;  // AVX512_CORE has no VNNI
  // int8 runs under any cap, on a kernel below it.
  if (!cap.empty()) EXPECT_TRUE(cpu.int8_kernel == "avx2" || cpu.int8_kernel == "scalar") << cpu.int8_kernel;
  EXPECT_FALSE(cpu.onednn_version.empty());
  EXPECT_GE(cpu.threads, 1);
}

TEST(Precision, AutoPicksBf16ExactlyWhereNative) {
  const CpuInfo cpu = cpu_info(seqpack::testing::policy());
  std::string note;
  const Precision p = resolve_precision("auto", seqpack::testing::kernels(), &note);
  EXPECT_EQ(p, cpu.native_bf16 ? Precision::bf16 : Precision::fp32);
  EXPECT_NE(note.find(cpu.isa), std::string::npos) << note;
  EXPECT_EQ(resolve_precision("fp32", seqpack::testing::kernels()), Precision::fp32);
}

TEST(Precision, ExplicitBf16WithoutNativeSupportNamesTheIsa) {
  const CpuInfo cpu = cpu_info(seqpack::testing::policy());
  if (cpu.bf16 != "none") {  // native, or emulated (SEQPACK_BF16)
    EXPECT_EQ(resolve_precision("bf16", seqpack::testing::kernels()), Precision::bf16);
    EXPECT_NO_THROW(check_precision_supported(Precision::bf16, seqpack::testing::kernels()));
    return;
  }
  for (auto attempt :
       {+[] { resolve_precision("bf16", seqpack::testing::kernels()); },
        +[] { check_precision_supported(Precision::bf16, seqpack::testing::kernels()); },
        +[] {
          RNNOptions o{.mode = RNNMode::lstm, .input_size = 2, .hidden_size = 3};
          o.precision = Precision::bf16;
          // refused before the weights are read
          rnn_make_plan(o, {}, /*in_place=*/false, seqpack::testing::config());
        }}) {
    try {
      attempt();
      FAIL() << "bf16 accepted on " << cpu.isa;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("ISA is " + cpu.isa), std::string::npos) << e.what();
      // and says how bf16 runs anyway
      EXPECT_NE(std::string(e.what()).find("SEQPACK_BF16=emulated"), std::string::npos)
          << e.what();
    }
  }
}

// int8 runs on every CPU (AMX-INT8, AVX512-VNNI, AVX2 or the scalar kernel),
// capped or not; auto never picks it.
TEST(Precision, Int8RunsOnEveryCpuAndAutoNeverPicksIt) {
  const CpuInfo cpu = cpu_info(seqpack::testing::policy());
  EXPECT_NE(resolve_precision("auto", seqpack::testing::kernels()), Precision::int8);
  EXPECT_EQ(resolve_precision("int8", seqpack::testing::kernels()), Precision::int8);
  EXPECT_NO_THROW(check_precision_supported(Precision::int8, seqpack::testing::kernels()));
  RNNOptions o{.mode = RNNMode::lstm, .input_size = 2, .hidden_size = 3};
  o.precision = Precision::int8;
  EXPECT_NO_THROW(o.validate());
  const std::set<std::string> kernels{"amx", "vnni", "avx2", "scalar"};
  EXPECT_EQ(kernels.count(cpu.int8_kernel), 1u) << cpu.int8_kernel;
  EXPECT_EQ(cpu.native_int8, cpu.int8_kernel == "amx" || cpu.int8_kernel == "vnni")
      << cpu.int8_kernel;
}

TEST(Precision, Int8NeedsFloat32) {
  RNNOptions o{.mode = RNNMode::lstm, .input_size = 2, .hidden_size = 3};
  o.dtype = DType::f64;
  o.precision = Precision::int8;
  try {
    o.validate();
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("int8 needs dtype float32, got float64"),
              std::string::npos)
        << e.what();
  }
}

TEST(Precision, Bf16NeedsFloat32) {
  RNNOptions o{.mode = RNNMode::gru, .input_size = 2, .hidden_size = 3};
  o.dtype = DType::f64;
  o.precision = Precision::bf16;
  try {
    o.validate();
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("float64"), std::string::npos) << e.what();
  }
}

// One row per precision: its name round-trips, and what it can do is what a
// model's plan of it states (int8 alone has no backward).
TEST(Precision, TraitsAreOneRowPerPrecision) {
  ASSERT_EQ(all_precisions().size(), 3u);
  for (const PrecisionTraits& t : all_precisions()) {
    EXPECT_EQ(parse_precision(t.name), t.precision) << t.name;
    EXPECT_STREQ(precision_name(t.precision), t.name);
    EXPECT_EQ(&precision_traits(t.precision), &t);
    EXPECT_EQ(t.backward, t.precision != Precision::int8) << t.name;
    EXPECT_EQ(t.require == nullptr, t.precision == Precision::fp32) << t.name;
  }
  RNNOptions o{.mode = RNNMode::gru, .input_size = 3, .hidden_size = 4};
  std::vector<Tensor> w;
  for (const Shape& s : rnn_parameter_shapes(o)) w.push_back(Tensor::zeros(s, DType::f32));
  const RNNPlanInfo info =
      rnn_plan_info(*rnn_make_plan(o, w, /*in_place=*/false, seqpack::testing::config()));
  EXPECT_EQ(info.backward, precision_traits(o.precision).backward);
}

}  // namespace
}  // namespace seqpack
