#include "seqpack/cpu_info.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <stdexcept>
#include <string>

#include "cpu/cpu_info.h"
#include "cpu/gemm.h"
#include "cpu/gemm_engine.h"
#include "cpu/gemm_int8.h"
#include "cpu/isa_cap.h"
#include "cpu/onednn_compat.h"
#include "cpu/rnn_gates.h"
#include "seqpack/policy.h"
#include "seqpack/threading.h"

namespace seqpack {

namespace cpu {

namespace {
// The ISA oneDNN dispatches to: the CPU's, capped by ONEDNN_MAX_CPU_ISA.
dnnl::cpu_isa effective_isa() { return dnnl::get_effective_cpu_isa(); }
}  // namespace

const char* isa_name() { return onednn::isa_name(effective_isa()); }

bool native_bf16_dot_products() { return onednn::isa_has_bf16(effective_isa()); }

bool has_bf16_dot_products(const Kernels& kernels) {
  return native_bf16_dot_products() || kernels.bf16_emulated;
}

void require_bf16_dot_products(const Kernels& kernels) {
  if (has_bf16_dot_products(kernels)) return;
  throw std::invalid_argument(
      std::string("precision bf16 needs native bf16 dot products (AVX512-BF16 or AMX), but "
                  "this CPU's ISA is ") +
      isa_name() +
      "; use fp32 (or auto), or bf16's products emulated in fp32 (slower than fp32: the "
      "policy's bf16 = \"emulated\", SEQPACK_BF16=emulated)");
}

bool has_int8_dot_products() { return onednn::isa_has_vnni(effective_isa()); }
bool has_amx_dot_products() { return onednn::isa_has_amx(effective_isa()); }

void check_int8_kernel_choice(const Kernels& kernels) {
  // The kernel is chosen here, on the calling thread, before any product
  // asks: a kernel this CPU cannot run is refused by name, not thrown inside
  // a team.
  int8_kernel(kernels);
}

}  // namespace cpu

CpuInfo cpu_info(const Policy& policy) {
  const KernelConfig kernels = kernel_config(policy);
  CpuInfo info;
  const dnnl::cpu_isa isa = cpu::effective_isa();
  info.isa = cpu::onednn::isa_name(isa);
  info.native_bf16 = cpu::onednn::isa_has_bf16(isa);
  info.bf16 = kernels.bf16_emulated ? "emulated" : info.native_bf16 ? "native" : "none";
  info.native_int8 = cpu::vnni_int8_supported(kernels.isa_cap);
  info.amx = cpu::onednn::isa_has_amx(isa);
  info.int8_kernel = cpu::int8_kernel_name(cpu::int8_kernel(kernels));
  const dnnl_version_t* v = dnnl::version();
  info.onednn_version =
      std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  info.threads = num_threads();
  info.blas = cpu::blas_config();
  info.isa_cap = cpu::isa_level_name(kernels.isa_cap);
  info.kernels = cpu::rnn_gates_f32_target(kernels.isa_cap);
  return info;
}

}  // namespace seqpack
