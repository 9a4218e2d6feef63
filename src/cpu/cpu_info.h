// The CPU's capabilities as the kernels and engines need them (private; the
// public summary is seqpack/cpu_info.h). Nothing here knows about precisions:
// src/precision.cpp decides from these what may run.
#pragma once

namespace seqpack::cpu {

// The ISA oneDNN dispatches to (the CPU's, capped by ONEDNN_MAX_CPU_ISA), in
// ONEDNN_MAX_CPU_ISA's spelling.
const char* isa_name();
// Native bf16 dot products: AVX512-BF16 or AMX.
bool has_bf16_dot_products();
// Whether the CPU (under the ISA cap) has bf16 dot products of its own, not
// emulated: precision "auto"'s choice, without cpu_info()'s strings (a
// call under autocast asks it every time).
bool native_bf16_dot_products();
// Throws std::invalid_argument naming the ISA when the CPU has no native bf16
// dot products (what the bf16 engines need).
void require_bf16_dot_products();
// Native int8 dot products in oneDNN's ISA: AVX512-VNNI (AMX CPUs have it),
// the VNNI int8 kernel's cap.
bool has_int8_dot_products();
// AMX (tiles, bf16 and int8) in oneDNN's ISA: the AMX-INT8 kernel's cap.
bool has_amx_dot_products();
// The int8 precision runs on every CPU (cpu/gemm_int8.h picks its kernel);
// throws std::invalid_argument naming the policy's kernel where this CPU
// cannot run it.
void check_int8_kernel_choice();

}  // namespace seqpack::cpu
