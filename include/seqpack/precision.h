// Precision of the recurrent core's matrix products, and what the CPU offers.
//
//   RNNOptions o{.mode = RNNMode::lstm, .input_size = 64, .hidden_size = 128};
//   o.precision = resolve_precision("auto");   // bf16 where the CPU has bf16 dot products
//   CpuInfo cpu = cpu_info();                  // cpu.isa, cpu.native_bf16, ... (cpu_info.h)
//
// fp32 (the default) is PyTorch-exact. bf16 is mixed precision: the matrix
// products read bf16 copies of their operands and accumulate in fp32; gate
// math, the LSTM cell state, biases, weights, every gradient and the outputs
// stay fp32 (docs/performance.md gives the error bounds). It runs only where
// the CPU has native bf16 dot products (AVX512-BF16 or AMX), read at run time
// (ONEDNN_MAX_CPU_ISA caps it).
#pragma once

#include <string>

#include "seqpack/cpu_info.h"  // CpuInfo, cpu_info(): what the choice of a precision reads

namespace seqpack {

enum class Precision { fp32, bf16 };

// "fp32", "bf16".
const char* precision_name(Precision p);
// "fp32" or "bf16"; throws std::invalid_argument naming the value otherwise
// ("auto" is resolve_precision's).
Precision parse_precision(const std::string& name);

// "fp32", "bf16" or "auto" (bf16 where native, else fp32). An explicit "bf16"
// on a CPU without native bf16 throws std::invalid_argument naming the CPU's
// ISA. `note`, when given, receives one line saying what was chosen and why.
Precision resolve_precision(const std::string& name, std::string* note = nullptr);

// Throws std::invalid_argument naming the ISA when `p` cannot run here.
void check_precision_supported(Precision p);

}  // namespace seqpack
