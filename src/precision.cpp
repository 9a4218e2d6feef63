#include "seqpack/precision.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <stdexcept>

#include "cpu/gemm.h"
#include "cpu/onednn_compat.h"
#include "seqpack/threading.h"

namespace seqpack {

namespace {

// The ISA oneDNN dispatches to: the CPU's, capped by ONEDNN_MAX_CPU_ISA.
dnnl::cpu_isa effective_isa() { return dnnl::get_effective_cpu_isa(); }

using cpu::onednn::isa_has_amx;
using cpu::onednn::isa_has_bf16;
using cpu::onednn::isa_name;

}  // namespace

const char* precision_name(Precision p) { return p == Precision::bf16 ? "bf16" : "fp32"; }

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::fp32;
  if (name == "bf16") return Precision::bf16;
  throw std::invalid_argument("precision must be fp32 or bf16, got '" + name + "'");
}

CpuInfo cpu_info() {
  CpuInfo info;
  const dnnl::cpu_isa isa = effective_isa();
  info.isa = isa_name(isa);
  info.native_bf16 = isa_has_bf16(isa);
  info.amx = isa_has_amx(isa);
  const dnnl_version_t* v = dnnl::version();
  info.onednn_version =
      std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  info.threads = num_threads();
  info.blas = cpu::blas_config();
  return info;
}

void check_precision_supported(Precision p) {
  if (p != Precision::bf16) return;
  const dnnl::cpu_isa isa = effective_isa();
  if (!isa_has_bf16(isa)) {
    throw std::invalid_argument(
        std::string("precision bf16 needs native bf16 dot products (AVX512-BF16 or AMX), but "
                    "this CPU's ISA is ") +
        isa_name(isa) + "; use fp32 (or auto)");
  }
}

Precision resolve_precision(const std::string& name, std::string* note) {
  const CpuInfo cpu = cpu_info();
  Precision p;
  if (name == "auto") {
    p = cpu.native_bf16 ? Precision::bf16 : Precision::fp32;
    if (note) {
      *note = std::string("precision auto -> ") + precision_name(p) + " (ISA " + cpu.isa +
              (cpu.native_bf16 ? ", native bf16)" : ", no native bf16: fp32)");
    }
    return p;
  }
  if (name != "fp32" && name != "bf16") {
    throw std::invalid_argument("precision must be fp32, bf16 or auto, got '" + name + "'");
  }
  p = parse_precision(name);
  check_precision_supported(p);
  if (note) *note = std::string("precision ") + precision_name(p) + " (ISA " + cpu.isa + ")";
  return p;
}

}  // namespace seqpack
