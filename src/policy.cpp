// The core's policy (seqpack/policy.h): checked whole, then turned into the
// configs that carry it to the parts that read it (rnn_config: the grid's
// split rules, the step groups, and the kernel settings: the ISA cap, the
// int8 kernel, bf16 emulation; kernel_config: those alone).
#include "seqpack/policy.h"

#include <cctype>
#include <stdexcept>
#include <string>

#include "cpu/gemm_int8.h"
#include "cpu/isa_cap.h"
#include "policy_text.h"
#include "rnn/grid.h"
#include "seqpack/rnn.h"

namespace seqpack {

namespace {

std::string lower(std::string v) {
  for (char& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return v;
}

cpu::IsaLevel isa_level(const std::string& value) {
  const std::string v = lower(value);
  if (v.empty() || v == "avx512") return cpu::IsaLevel::avx512;
  for (const cpu::IsaLevel level : {cpu::IsaLevel::avx3_zen4, cpu::IsaLevel::avx3_dl,
                                    cpu::IsaLevel::avx3, cpu::IsaLevel::avx2,
                                    cpu::IsaLevel::sse4}) {
    if (v == cpu::isa_level_name(level)) return level;
  }
  throw std::invalid_argument("SEQPACK_MAX_CPU_ISA = '" + value +
                              "' is not one of avx512, avx3_zen4, avx3_dl, avx3, avx2, sse4 "
                              "(or unset)");
}

cpu::Int8Kernel int8_kernel(const std::string& v) {
  if (v.empty() || v == "auto") return cpu::Int8Kernel::automatic;
  for (const cpu::Int8Kernel k : {cpu::Int8Kernel::vnni, cpu::Int8Kernel::amx,
                                  cpu::Int8Kernel::avx2, cpu::Int8Kernel::scalar}) {
    if (v == cpu::int8_kernel_name(k)) return k;
  }
  throw std::invalid_argument("SEQPACK_INT8_KERNEL: '" + v +
                              "' is not auto, amx, vnni, avx2 or scalar");
}

rnn::SplitChoice split_choice(const std::string& v) {
  if (v.empty() || v == "engine") return rnn::SplitChoice::engine;
  if (v == "rows") return rnn::SplitChoice::rows;
  if (v == "columns") return rnn::SplitChoice::columns;
  throw std::invalid_argument("SEQPACK_STEP_SPLIT: '" + v + "' is not one of rows, columns, engine");
}

// Whether the bf16 setting asks for emulated products.
bool bf16_emulated(const std::string& value) {
  const std::string v = lower(value);
  if (v.empty() || v == "native") return false;
  if (v == "emulated") return true;
  throw std::invalid_argument("SEQPACK_BF16: '" + value + "' is not native or emulated");
}

// A count of at least `lo` and at most 2^20, or 0 (the default).
int64_t count(const char* name, int64_t v, int64_t lo, const char* what) {
  if (v != 0 && (v < lo || v > policy_text::kMaxCount)) {
    throw policy_text::not_a_count(name, std::to_string(v), lo, what);
  }
  return v;
}

// The policy's settings in the core's terms, every one checked.
struct Parsed {
  cpu::IsaLevel cap;
  cpu::Int8Kernel kernel;
  rnn::SplitChoice split;
  int64_t units, rows;
  bool bf16_emulated;
};

Parsed parse(const Policy& p) {
  return Parsed{isa_level(p.max_cpu_isa),
                int8_kernel(p.int8_kernel),
                split_choice(p.step_split),
                count("SEQPACK_STEP_UNITS", p.step_units, 16, "hidden units"),
                count("SEQPACK_STEP_ROWS", p.step_rows, 1, "rows"),
                bf16_emulated(p.bf16)};
}

}  // namespace

void policy_text::check(const Policy& policy) { (void)parse(policy); }

KernelConfig kernel_config(const Policy& p) {
  const Parsed s = parse(p);
  KernelConfig k;
  k.isa_cap = s.cap;
  k.int8 = s.kernel;
  k.bf16_emulated = s.bf16_emulated;
  return k;
}

RNNConfig rnn_config(const Policy& p) {
  const Parsed s = parse(p);
  RNNConfig c;
  c.split = s.split;
  c.step_units = s.units;
  c.step_rows = s.rows;
  c.step_groups = p.step_groups;
  c.kernels = kernel_config(p);
  return c;
}

}  // namespace seqpack
