// The policy of the core: the settings that choose its kernels and share its
// steps between threads. The core never reads the environment and holds no
// policy of its own: the front ends (the seqpack tool, the Python module, the
// PyTorch operators, the test and benchmark programs) read it once with
// policy_from_environment() and give it to what they make: its config to the
// model plans (rnn_config, include/seqpack/rnn.h: the step split, the step
// groups and the kernel settings, fixed with the plan), its kernel settings
// to the kernels they call outside a model (kernel_config: the optimizer's,
// a Linear layer's, cpu_info's report). A C++ program that wants the same
// variables does the same, and one that sets none runs on the defaults.
#pragma once

#include <cstdint>
#include <string>

namespace seqpack {

struct Policy {
  // A cap on the ISA of seqpack's own kernels (Highway's gate, small-product
  // and Adam kernels; the int8 kernels): "avx512" (or empty: none), "avx2" or
  // "sse4". Variable SEQPACK_MAX_CPU_ISA. oneDNN's own cap is its variable
  // ONEDNN_MAX_CPU_ISA, read by oneDNN.
  std::string max_cpu_isa;
  // The kernel of the int8 products: "auto" (or empty: the best this CPU
  // runs), "amx", "vnni", "avx2" or "scalar". Variable SEQPACK_INT8_KERNEL.
  // A kernel this CPU cannot run is refused where a plan is made with it
  // (rnn_make_plan) and by cpu_info.
  std::string int8_kernel;
  // Who splits a direction's steps between threads: "engine" (or empty: the
  // engine's choice), "rows" or "columns". Variable SEQPACK_STEP_SPLIT, for
  // measuring.
  std::string step_split;
  // Hidden units per thread below which a column split stops adding threads:
  // 0 (the default, 64) or 16 to 2^20. Variable SEQPACK_STEP_UNITS.
  int64_t step_units = 0;
  // Mean rows a step per thread below which a row split stops adding
  // threads: 0 (the default: no such floor) or 1 to 2^20. Variable
  // SEQPACK_STEP_ROWS.
  int64_t step_rows = 0;
  // Whether the oneDNN engine makes one product of a thread's step ranges
  // (the default) or one product per range. Variable SEQPACK_STEP_GROUPS
  // (1 or 0).
  bool step_groups = true;
  // How precision bf16 multiplies: "native" (or empty: on the CPU's bf16
  // dot products, AVX512-BF16 or AMX; refused where there are none) or
  // "emulated" (on every CPU: the operands rounded to bf16 as the native
  // products round them, then multiplied in fp32, which gives the native
  // results up to the order of the fp32 sums; slower than fp32: for
  // checking a bf16 model, and bf16's code, on a CPU without bf16).
  // Variable SEQPACK_BF16.
  std::string bf16;
};

struct KernelConfig;
// The kernel settings of `policy` (max_cpu_isa, int8_kernel, bf16), for the
// callers of seqpack's kernels that make no model plan (a plan's are its
// config's: rnn_config). Throws std::invalid_argument as rnn_config does.
KernelConfig kernel_config(const Policy& policy);

// The policy of the variables named above (unset or empty: the default).
// Throws std::invalid_argument naming the variable and its value where one
// is not among the values above.
Policy policy_from_environment();

}  // namespace seqpack
