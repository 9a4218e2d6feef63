// Precision of the recurrent core's matrix products, and what the CPU offers.
//
//   RNNOptions o{.mode = RNNMode::lstm, .input_size = 64, .hidden_size = 128};
//   o.precision = resolve_precision("auto", {});  // bf16 where the CPU has bf16 dot products
//   CpuInfo cpu = cpu_info({});                // cpu.isa, cpu.native_bf16, ... (cpu_info.h)
//
// fp32 (the default) is PyTorch-exact. bf16 is mixed precision: the matrix
// products read bf16 copies of their operands and accumulate in fp32; gate
// math, the LSTM cell state, biases, weights, every gradient and the outputs
// stay fp32 (docs/performance.md gives the error bounds). It runs only where
// the CPU has native bf16 dot products (AVX512-BF16 or AMX), read at run time
// (ONEDNN_MAX_CPU_ISA caps it).
//
// int8 is for inference only (a forward without saving for backward, not
// training): weights int8, symmetric, one scale per output unit; the layer
// input and h quantized per row at run time (asymmetric u8), so a sequence's
// result does not depend on the batch around it; int32 accumulation on
// AMX-INT8, AVX512-VNNI, AVX2 (rows over 127 levels there) or a scalar kernel,
// so it runs on every CPU; gate math, the cell state and outputs fp32
// (cpu/gemm_int8.h has the scheme, docs/performance.md the error bounds).
// `auto` never picks it.
#pragma once

#include <string>
#include <vector>

#include "seqpack/cpu_info.h"  // CpuInfo, cpu_info(): what the choice of a precision reads

namespace seqpack {

enum class Precision { fp32, bf16, int8 };

// The kernels seqpack's own code runs on, as a policy chooses them
// (seqpack::Policy's max_cpu_isa, int8_kernel and bf16: kernel_config(policy),
// seqpack/policy.h). A model plan's config holds them (RNNConfig::kernels,
// fixed when the plan is made, with the weights laid out for them); callers
// of kernels outside a model (the optimizers, cpu_info) are given them.
struct KernelConfig {
  // The cap on the ISA of seqpack's own kernels (Highway's gate, small-product
  // and Adam kernels; the int8 kernels): sse4 and avx2 cap every kernel;
  // avx3, avx3_dl and avx3_zen4 leave AVX-512 on and cap Highway's AVX-512
  // targets only (its AVX3 target, then AVX3_DL, then AVX3_ZEN4); avx512 caps
  // nothing.
  enum class Isa : int { sse4 = 0, avx2 = 1, avx3 = 2, avx3_dl = 3, avx3_zen4 = 4, avx512 = 5 };
  Isa isa_cap = Isa::avx512;
  // The kernel of the int8 products (automatic: the best this CPU runs under
  // the cap).
  enum class Int8 : int { automatic, vnni, amx, avx2, scalar };
  Int8 int8 = Int8::automatic;
  // Whether bf16's products run emulated in fp32 (on any CPU) instead of on
  // the CPU's bf16 dot products.
  bool bf16_emulated = false;
  bool operator==(const KernelConfig&) const = default;
};

// What a precision is and can do: one row per precision (a new precision is
// its enum value, its row and its engine, src/cpu/). A model's plan states
// the same (rnn_plan_info).
struct PrecisionTraits {
  Precision precision;
  const char* name;  // "fp32", "bf16", "int8"
  bool backward;     // has a backward: training and saving for one (int8: inference only)
  // Throws std::invalid_argument naming the ISA (or the kernel) where it
  // cannot run on these kernels (or null).
  void (*require)(const KernelConfig&);
};
const PrecisionTraits& precision_traits(Precision p);
// Every precision's row, in the enum's order.
const std::vector<PrecisionTraits>& all_precisions();

// "fp32", "bf16", "int8".
const char* precision_name(Precision p);
// "fp32", "bf16" or "int8"; throws std::invalid_argument naming the value otherwise
// ("auto" is resolve_precision's).
Precision parse_precision(const std::string& name);

// "fp32", "bf16", "int8" or "auto" (bf16 where native, else fp32; never
// int8). An explicit "bf16" or "int8" on a CPU without its dot products
// throws std::invalid_argument naming the CPU's ISA (bf16 emulated in
// `kernels` runs anywhere). `note`, when given, receives one line saying what
// was chosen and why.
Precision resolve_precision(const std::string& name, const KernelConfig& kernels,
                            std::string* note = nullptr);

// Throws std::invalid_argument naming the ISA when `p` cannot run here on
// `kernels` (a model plan checks its own: rnn_make_plan).
void check_precision_supported(Precision p, const KernelConfig& kernels);

}  // namespace seqpack
