// Index maps between the varlen (cu_seqlens) layout and packed or padded
// batches (include/seqpack/varlen.h), used by seqpack.data.
#include <pybind11/stl.h>

#include "bind.h"
#include "seqpack/varlen.h"
#include "tensor_caster.h"

namespace seqpack::python {

void bind_varlen(py::module_& m) {
  m.def("cu_seqlens_from_lengths", &cu_seqlens_from_lengths, py::arg("lengths"));
  m.def("lengths_from_cu_seqlens", &lengths_from_cu_seqlens, py::arg("cu_seqlens"),
        py::arg("total_rows"));
  m.def("varlen_gather_from_packed", &varlen_gather_from_packed, py::arg("plan"));
  m.def("packed_gather_from_varlen", &packed_gather_from_varlen, py::arg("plan"));
  m.def("varlen_gather_from_padded", &varlen_gather_from_padded, py::arg("lengths"),
        py::arg("padded_length"), py::arg("batch_first"));
  m.def("padded_gather_from_varlen", &padded_gather_from_varlen, py::arg("lengths"),
        py::arg("padded_length"), py::arg("batch_first"));
}

}  // namespace seqpack::python
