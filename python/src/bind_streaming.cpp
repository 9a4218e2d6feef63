// Streaming inference (include/seqpack/streaming.h): per-stream state of a
// unidirectional RNN/LSTM/GRU; seqpack.streaming and seqpack.torch_streaming
// wrap it. push runs without the GIL.
#include <pybind11/stl.h>

#include <memory>
#include <utility>

#include "bind.h"
#include "seqpack/streaming.h"
#include "tensor_caster.h"

namespace seqpack::python {

void bind_streaming(py::module_& m) {
  py::class_<StreamingRNN>(m, "StreamingRNN")
      .def(py::init([](RNNOptions options, std::vector<Tensor> weights) {
             return std::make_unique<StreamingRNN>(options, std::move(weights), policy_config());
           }),
           py::arg("options"), py::arg("weights"))
      .def(py::init<const RNNBase&>(), py::arg("module"))
      .def_property_readonly("options", &StreamingRNN::options)
      .def("open", &StreamingRNN::open, py::arg("h0"), py::arg("c0"))
      .def(
          "push",
          [](StreamingRNN& s, const std::vector<int64_t>& ids, const std::vector<Tensor>& chunks) {
            py::gil_scoped_release release;
            return s.push(ids, chunks);
          },
          py::arg("stream_ids"), py::arg("chunks"))
      .def("reset", &StreamingRNN::reset, py::arg("id"), py::arg("h0"), py::arg("c0"))
      .def("close", &StreamingRNN::close, py::arg("id"))
      .def("replan", &StreamingRNN::replan)
      .def(
          "state",
          [](const StreamingRNN& s, int64_t id) {
            const StreamState st = s.state(id);
            return py::make_tuple(array_from_tensor(st.h), array_from_tensor(st.c));
          },
          py::arg("id"))
      .def("is_open", &StreamingRNN::is_open, py::arg("id"))
      .def("open_ids", &StreamingRNN::open_ids)
      .def_property_readonly("num_open", &StreamingRNN::num_open);
}

}  // namespace seqpack::python
