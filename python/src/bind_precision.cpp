// Precision of the recurrent core and what the CPU offers (seqpack/precision.h).
#include <pybind11/stl.h>

#include "bind.h"
#include "seqpack/precision.h"

namespace py = pybind11;

namespace seqpack::python {

void bind_precision(py::module_& m) {
  py::enum_<Precision>(m, "Precision").value("fp32", Precision::fp32).value("bf16", Precision::bf16)
      .value("int8", Precision::int8);
  m.def("cpu_info", [] {
    const CpuInfo c = cpu_info(installed_policy());
    py::dict d;
    d["isa"] = c.isa;
    d["native_bf16"] = c.native_bf16;
    d["bf16"] = c.bf16;
    d["native_int8"] = c.native_int8;
    d["amx"] = c.amx;
    d["int8_kernel"] = c.int8_kernel;
    d["onednn_version"] = c.onednn_version;
    d["blas"] = c.blas;
    d["threads"] = c.threads;
    d["kernels"] = c.kernels;
    d["isa_cap"] = c.isa_cap;
    return d;
  });
  m.def(
      "resolve_precision",
      [](const std::string& name) { return resolve_precision(name, policy_config().kernels); },
      py::arg("name"));
}

}  // namespace seqpack::python
