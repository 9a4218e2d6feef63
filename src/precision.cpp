#include "seqpack/precision.h"

#include <stdexcept>

#include "cpu/cpu_info.h"

namespace seqpack {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::bf16: return "bf16";
    case Precision::int8: return "int8";
    default: return "fp32";
  }
}

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::fp32;
  if (name == "bf16") return Precision::bf16;
  if (name == "int8") return Precision::int8;
  throw std::invalid_argument("precision must be fp32, bf16 or int8, got '" + name + "'");
}

void check_precision_supported(Precision p) {
  if (p == Precision::bf16) cpu::require_bf16_dot_products();
  if (p == Precision::int8) cpu::require_int8_dot_products();
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
  if (name != "fp32" && name != "bf16" && name != "int8") {
    throw std::invalid_argument("precision must be fp32, bf16, int8 or auto, got '" + name + "'");
  }
  p = parse_precision(name);
  check_precision_supported(p);
  if (note) *note = std::string("precision ") + precision_name(p) + " (ISA " + cpu.isa + ")";
  return p;
}

}  // namespace seqpack
