// The NumPy <-> Tensor bridge (see tensor_caster.h) and the DType enum.
#include "bind.h"
#include "tensor_caster.h"

namespace seqpack::python {

py::dtype numpy_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return py::dtype::of<float>();
    case DType::f64:
      return py::dtype::of<double>();
    case DType::i64:
      return py::dtype::of<int64_t>();
  }
  throw py::type_error("unknown seqpack dtype");
}

Tensor tensor_from_array(const py::array& array) {
  const py::dtype dt = array.dtype();
  DType dtype;
  if (dt.equal(py::dtype::of<float>())) {
    dtype = DType::f32;
  } else if (dt.equal(py::dtype::of<double>())) {
    dtype = DType::f64;
  } else if (dt.equal(py::dtype::of<int64_t>())) {
    dtype = DType::i64;
  } else {
    throw py::type_error("arrays must be float32, float64 or int64, got " +
                         py::str(static_cast<const py::handle&>(dt)).cast<std::string>());
  }
  constexpr int kLayout =
      static_cast<int>(py::array::c_style) | static_cast<int>(py::detail::npy_api::NPY_ARRAY_ALIGNED_);
  if ((array.flags() & kLayout) != kLayout) {
    throw py::type_error("arrays must be C-contiguous and aligned (use numpy.ascontiguousarray)");
  }
  Shape shape(array.shape(), array.shape() + array.ndim());
  // The deleter may run wherever the last Tensor view dies: take the GIL
  // before dropping the array reference.
  auto* ref = new py::object(array);
  std::shared_ptr<void> owner(ref, [](void* p) {
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(p);
  });
  return Tensor::wrap(const_cast<void*>(array.data()), std::move(shape), dtype, std::move(owner));
}

py::object array_from_tensor(const Tensor& tensor) {
  if (!tensor.defined()) return py::none();
  auto* handle = new Tensor(tensor);
  py::capsule owner(handle, [](void* p) { delete static_cast<Tensor*>(p); });
  std::vector<py::ssize_t> shape(tensor.shape().begin(), tensor.shape().end());
  return py::array(numpy_dtype(tensor.dtype()), shape, const_cast<void*>(tensor.raw_data()),
                   owner);
}

void bind_tensor(py::module_& m) {
  py::enum_<DType>(m, "DType")
      .value("float32", DType::f32)
      .value("float64", DType::f64)
      .value("int64", DType::i64);
  // Round trip through a Tensor: lets tests check that no copy is made.
  m.def("_tensor_roundtrip", [](const Tensor& t) { return t; });
}

}  // namespace seqpack::python
