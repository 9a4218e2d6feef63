// Packing utilities (include/seqpack/packed_sequence.h). Argument checking and
// torch-style signatures live in seqpack/packing.py.
#include <pybind11/stl.h>

#include "bind.h"
#include "tensor_caster.h"

namespace seqpack::python {

void bind_packing(py::module_& m) {
  py::enum_<PaddingSide>(m, "PaddingSide")
      .value("right", PaddingSide::right)
      .value("left", PaddingSide::left);

  m.def("pad_sequence", &pad_sequence, py::arg("sequences"), py::arg("batch_first"),
        py::arg("padding_value"), py::arg("padding_side"));
  m.def("pack_padded_sequence",
        py::overload_cast<const Tensor&, const Tensor&, bool, bool>(&pack_padded_sequence),
        py::arg("input"), py::arg("lengths"), py::arg("batch_first"), py::arg("enforce_sorted"));
  m.def("pack_sequence", &pack_sequence, py::arg("sequences"), py::arg("enforce_sorted"));
  m.def("pad_packed_sequence", &pad_packed_sequence, py::arg("sequence"), py::arg("batch_first"),
        py::arg("padding_value"), py::arg("total_length"));
  m.def("unpad_sequence", &unpad_sequence, py::arg("padded"), py::arg("lengths"),
        py::arg("batch_first"));
  m.def("unpack_sequence", &unpack_sequence, py::arg("packed"));
  m.def("invert_permutation", &invert_permutation, py::arg("permutation"));
  m.def("validate_packed", [](const PackedSequence& p) { p.validate(); }, py::arg("packed"));
  m.def("packed_repr", [](const PackedSequence& p) { return p.to_string(); }, py::arg("packed"));
  m.def("pack_padded_sequence_backward", &pack_padded_sequence_backward, py::arg("grad_data"),
        py::arg("plan"), py::arg("padded_length"), py::arg("batch_first"));
  m.def("pad_packed_sequence_backward", &pad_packed_sequence_backward, py::arg("grad_padded"),
        py::arg("plan"), py::arg("batch_first"));

  // Held by shared_ptr: the RNN bindings keep plans alive across forward and
  // backward.
  py::class_<PackingPlan, std::shared_ptr<PackingPlan>>(m, "PackingPlan")
      .def_static("from_lengths", &PackingPlan::from_lengths, py::arg("lengths"),
                  py::arg("enforce_sorted"))
      .def_static("from_packed", &PackingPlan::from_packed, py::arg("packed"))
      .def_property_readonly("batch", &PackingPlan::batch)
      .def_property_readonly("max_len", &PackingPlan::max_len)
      .def_property_readonly("total_rows", &PackingPlan::total_rows)
      .def_property_readonly("lengths", &PackingPlan::lengths)
      .def_property_readonly("batch_sizes", &PackingPlan::batch_sizes)
      .def_property_readonly("sorted_indices", &PackingPlan::sorted_indices)
      .def_property_readonly("unsorted_indices", &PackingPlan::unsorted_indices)
      .def("pack", &PackingPlan::pack, py::arg("padded_time_major"))
      .def("unpack", &PackingPlan::unpack, py::arg("packed_rows"), py::arg("total_length"),
           py::arg("padding_value"));
}

}  // namespace seqpack::python
