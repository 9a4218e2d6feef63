// The CPU's capabilities as the kernels and engines need them (private; the
// public summary is seqpack/cpu_info.h). Nothing here knows about precisions:
// src/precision.cpp decides from these what may run.
#pragma once

#include "cpu/isa_cap.h"

namespace seqpack::cpu {

// The ISA oneDNN dispatches to (the CPU's, capped by ONEDNN_MAX_CPU_ISA), in
// ONEDNN_MAX_CPU_ISA's spelling.
const char* isa_name();
// bf16 dot products on `kernels`: native (AVX512-BF16 or AMX), or emulated.
bool has_bf16_dot_products(const Kernels& kernels);
// Whether the CPU (under the ISA cap) has bf16 dot products of its own, not
// emulated: precision "auto"'s choice, without cpu_info()'s strings (a
// call under autocast asks it every time).
bool native_bf16_dot_products();
// Throws std::invalid_argument naming the ISA when `kernels` have no bf16 dot
// products (what the bf16 engines need): no native ones, and not emulated.
void require_bf16_dot_products(const Kernels& kernels);
// Native int8 dot products in oneDNN's ISA: AVX512-VNNI (AMX CPUs have it),
// the VNNI int8 kernel's cap.
bool has_int8_dot_products();
// AMX (tiles, bf16 and int8) in oneDNN's ISA: the AMX-INT8 kernel's cap.
bool has_amx_dot_products();
// The int8 precision runs on every CPU (cpu/gemm_int8.h picks its kernel);
// throws std::invalid_argument naming the int8 kernel of `kernels` where
// this CPU cannot run it.
void check_int8_kernel_choice(const Kernels& kernels);

}  // namespace seqpack::cpu
