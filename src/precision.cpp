#include "seqpack/precision.h"

#include <stdexcept>

#include "cpu/cpu_info.h"

namespace seqpack {

const std::vector<PrecisionTraits>& all_precisions() {
  static const std::vector<PrecisionTraits> rows{
      {Precision::fp32, "fp32", /*backward=*/true, nullptr},
      {Precision::bf16, "bf16", /*backward=*/true, cpu::require_bf16_dot_products},
      {Precision::int8, "int8", /*backward=*/false, cpu::check_int8_kernel_choice},
  };
  return rows;
}

const PrecisionTraits& precision_traits(Precision p) {
  for (const PrecisionTraits& t : all_precisions())
    if (t.precision == p) return t;
  throw std::invalid_argument("unknown precision " + std::to_string(static_cast<int>(p)));
}

const char* precision_name(Precision p) { return precision_traits(p).name; }

Precision parse_precision(const std::string& name) {
  for (const PrecisionTraits& t : all_precisions())
    if (name == t.name) return t.precision;
  throw std::invalid_argument("precision must be fp32, bf16 or int8, got '" + name + "'");
}

void check_precision_supported(Precision p, const KernelConfig& kernels) {
  if (const auto require = precision_traits(p).require) require(kernels);
}

Precision resolve_precision(const std::string& name, const KernelConfig& kernels,
                            std::string* note) {
  Precision p;
  if (name == "auto") {
    // cpu_info() only for the note: its strings cost about 1 us, a tenth of a
    // small layer's call under autocast (RNN(64), one step at batch 1).
    const bool native = cpu::native_bf16_dot_products();
    p = native ? Precision::bf16 : Precision::fp32;
    if (note) {
      *note = std::string("precision auto -> ") + precision_name(p) + " (ISA " + cpu::isa_name() +
              (native ? ", native bf16)" : ", no native bf16: fp32)");
    }
    return p;
  }
  if (name != "fp32" && name != "bf16" && name != "int8") {
    throw std::invalid_argument("precision must be fp32, bf16, int8 or auto, got '" + name + "'");
  }
  p = parse_precision(name);
  check_precision_supported(p, kernels);
  if (note)
    *note = std::string("precision ") + precision_name(p) + " (ISA " + cpu::isa_name() + ")";
  return p;
}

}  // namespace seqpack
