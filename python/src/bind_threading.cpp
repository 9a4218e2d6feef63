// Thread count of seqpack's kernels (include/seqpack/threading.h).
#include "bind.h"
#include "seqpack/threading.h"

namespace seqpack::python {

void bind_threading(pybind11::module_& m) {
  m.def("set_num_threads", &set_num_threads, pybind11::arg("n"));
  m.def("get_num_threads", &num_threads);
}

}  // namespace seqpack::python
