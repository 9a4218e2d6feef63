// The NumPy <-> seqpack::Tensor bridge, visible to every binding file.
//
// A C-contiguous, aligned float32/float64/int64 ndarray becomes a Tensor that
// wraps the array's memory (no copy) and keeps the array alive. A Tensor goes
// back as an ndarray viewing the Tensor's storage, owned by a capsule holding a
// Tensor handle, so the storage lives as long as the array. None <-> an
// undefined Tensor (optional arguments such as h0).
//
// Conversions of other dtypes or layouts are the pure-Python layer's job: it
// knows the argument's name for the error message. Here a mismatch raises a
// TypeError naming the dtype/layout found.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "seqpack/packed_sequence.h"
#include "seqpack/tensor.h"

namespace seqpack::python {

namespace py = pybind11;

// The NumPy dtype of a seqpack dtype.
py::dtype numpy_dtype(DType dtype);

// Tensor viewing `array` (which it keeps alive); throws py::type_error when the
// array is not C-contiguous and aligned, or has another dtype.
Tensor tensor_from_array(const py::array& array);

// ndarray viewing `tensor`'s storage; None for an undefined tensor.
py::object array_from_tensor(const Tensor& tensor);

}  // namespace seqpack::python

namespace pybind11::detail {

template <>
struct type_caster<seqpack::Tensor> {
  PYBIND11_TYPE_CASTER(seqpack::Tensor, const_name("numpy.ndarray"));

  bool load(handle src, bool /*convert*/) {
    if (src.is_none()) {
      value = seqpack::Tensor();
      return true;
    }
    if (!isinstance<array>(src)) {
      throw type_error(std::string("expected a numpy.ndarray, got ") +
                       std::string(str(type::handle_of(src).attr("__name__"))));
    }
    value = seqpack::python::tensor_from_array(reinterpret_borrow<array>(src));
    return true;
  }

  static handle cast(const seqpack::Tensor& src, return_value_policy, handle) {
    return seqpack::python::array_from_tensor(src).release();
  }
};

// PackedSequence <-> the tuple (data, batch_sizes, sorted_indices,
// unsorted_indices); seqpack.PackedSequence is a namedtuple of those.
template <>
struct type_caster<seqpack::PackedSequence> {
  PYBIND11_TYPE_CASTER(seqpack::PackedSequence, const_name("PackedSequence"));

  bool load(handle src, bool /*convert*/) {
    if (!isinstance<tuple>(src) || len(src) != 4) {
      throw type_error("expected a PackedSequence (data, batch_sizes, sorted_indices, "
                       "unsorted_indices)");
    }
    auto t = reinterpret_borrow<tuple>(src);
    value.data = t[0].cast<seqpack::Tensor>();
    value.batch_sizes = t[1].cast<seqpack::Tensor>();
    value.sorted_indices = t[2].cast<seqpack::Tensor>();
    value.unsorted_indices = t[3].cast<seqpack::Tensor>();
    return true;
  }

  static handle cast(const seqpack::PackedSequence& src, return_value_policy, handle) {
    return make_tuple(seqpack::python::array_from_tensor(src.data),
                      seqpack::python::array_from_tensor(src.batch_sizes),
                      seqpack::python::array_from_tensor(src.sorted_indices),
                      seqpack::python::array_from_tensor(src.unsorted_indices))
        .release();
  }
};

}  // namespace pybind11::detail
