// Recurrent layers (include/seqpack/rnn.h): options, the functional core used
// by seqpack.torch, and the modules and cells used by seqpack.nn. The kernels
// run without the GIL.
#include <pybind11/stl.h>

#include <memory>

#include "bind.h"
#include "tensor_caster.h"
#include "seqpack/rnn.h"

namespace seqpack::python {

namespace {

// RNNSaved is opaque (incomplete) in the public header: hold it by pointer.
struct SavedHandle {
  std::shared_ptr<const RNNSaved> saved;
};

py::tuple gradients_tuple(const RNNGradients& g) {
  py::list weights;
  for (const Tensor& w : g.weights) weights.append(array_from_tensor(w));
  return py::make_tuple(array_from_tensor(g.input), array_from_tensor(g.h0),
                        array_from_tensor(g.c0), weights);
}

}  // namespace

void bind_rnn(py::module_& m) {
  py::enum_<RNNMode>(m, "RNNMode")
      .value("rnn_tanh", RNNMode::rnn_tanh)
      .value("rnn_relu", RNNMode::rnn_relu)
      .value("lstm", RNNMode::lstm)
      .value("gru", RNNMode::gru);

  py::class_<RNNOptions>(m, "RNNOptions")
      .def(py::init([](RNNMode mode, int64_t input_size, int64_t hidden_size, int64_t num_layers,
                       bool bias, bool batch_first, double dropout, bool bidirectional,
                       int64_t proj_size, DType dtype, Precision precision) {
             RNNOptions o{mode,    input_size,    hidden_size, num_layers, bias,
                          batch_first, dropout, bidirectional, proj_size,  dtype};
             o.precision = precision;
             return o;
           }),
           py::arg("mode"), py::arg("input_size"), py::arg("hidden_size"), py::arg("num_layers"),
           py::arg("bias"), py::arg("batch_first"), py::arg("dropout"), py::arg("bidirectional"),
           py::arg("proj_size"), py::arg("dtype"), py::arg("precision") = Precision::fp32)
      .def_readonly("mode", &RNNOptions::mode)
      .def_readonly("input_size", &RNNOptions::input_size)
      .def_readonly("hidden_size", &RNNOptions::hidden_size)
      .def_readonly("num_layers", &RNNOptions::num_layers)
      .def_readonly("bias", &RNNOptions::bias)
      .def_readonly("batch_first", &RNNOptions::batch_first)
      .def_readonly("dropout", &RNNOptions::dropout)
      .def_readonly("bidirectional", &RNNOptions::bidirectional)
      .def_readonly("proj_size", &RNNOptions::proj_size)
      .def_readonly("dtype", &RNNOptions::dtype)
      .def_readonly("precision", &RNNOptions::precision)
      .def("validate", &RNNOptions::validate)
      .def("parameter_names", &rnn_parameter_names)
      .def("parameter_shapes", &rnn_parameter_shapes);

  // Functional core (seqpack.torch's autograd Function).
  py::class_<SavedHandle>(m, "RNNSaved");
  m.def(
      "rnn_forward",
      [](const RNNOptions& options, const std::vector<Tensor>& weights, const Tensor& data,
         const PackingPlan& plan, const Tensor& h0, const Tensor& c0, bool training,
         bool save_for_backward, uint64_t dropout_seed) {
        RNNForwardResult r;
        {
          py::gil_scoped_release release;
          r = rnn_forward(*rnn_make_plan(options, weights, /*in_place=*/true, policy_config()),
                          data, plan, h0, c0, training, save_for_backward, dropout_seed);
        }
        py::object saved = py::none();
        if (r.saved) saved = py::cast(SavedHandle{r.saved});
        return py::make_tuple(array_from_tensor(r.output), array_from_tensor(r.h_n),
                              array_from_tensor(r.c_n), saved);
      },
      py::arg("options"), py::arg("weights"), py::arg("data"), py::arg("plan"), py::arg("h0"),
      py::arg("c0"), py::arg("training"), py::arg("save_for_backward"),
      py::arg("dropout_seed"));
  m.def(
      "rnn_backward",
      [](const SavedHandle& saved, const Tensor& grad_output, const Tensor& grad_h_n,
         const Tensor& grad_c_n, bool initial_state_grad) {
        RNNGradients g;
        {
          py::gil_scoped_release release;
          g = rnn_backward(*saved.saved, grad_output, grad_h_n, grad_c_n, initial_state_grad);
        }
        return gradients_tuple(g);
      },
      py::arg("saved"), py::arg("grad_output"), py::arg("grad_h_n"), py::arg("grad_c_n"),
      py::arg("initial_state_grad") = true);

  // Modules (seqpack.nn).
  py::class_<RNNOutput, std::shared_ptr<RNNOutput>>(m, "RNNOutput")
      .def_property_readonly("packed",
                             [](const RNNOutput& o) -> py::object {
                               if (!o.packed.data.defined()) return py::none();
                               return py::cast(o.packed);
                             })
      .def_readonly("padded", &RNNOutput::padded)
      .def_readonly("h_n", &RNNOutput::h_n)
      .def_readonly("c_n", &RNNOutput::c_n)
      .def_property_readonly("has_saved", [](const RNNOutput& o) { return bool(o.saved); });

  py::class_<RNNBase>(m, "RNNBase")
      .def(py::init([](RNNOptions options, uint64_t seed) {
             auto r = std::make_unique<RNNBase>(options, seed);
             r->set_config(policy_config());
             return r;
           }),
           py::arg("options"), py::arg("seed"))
      .def_property_readonly("options", &RNNBase::options)
      .def_property_readonly("parameter_names", &RNNBase::parameter_names)
      .def_property_readonly(
          "parameters", [](RNNBase& r) -> const std::vector<Tensor>& { return r.parameters(); })
      .def_property_readonly("grads",
                             [](RNNBase& r) -> const std::vector<Tensor>& { return r.grads(); })
      .def("zero_grad", &RNNBase::zero_grad)
      .def("reset_parameters", &RNNBase::reset_parameters, py::arg("seed"))
      .def("state_dict", &RNNBase::state_dict)
      .def("load_state_dict", &RNNBase::load_state_dict, py::arg("state"))
      .def("train", &RNNBase::train, py::arg("on"))
      .def("replan", &RNNBase::replan)
      .def_property_readonly("training", &RNNBase::is_training)
      .def("set_dropout_seed", &RNNBase::set_dropout_seed, py::arg("seed"))
      .def(
          "forward_packed",
          [](RNNBase& r, const PackedSequence& input, const Tensor& h0, const Tensor& c0,
             bool requires_grad) {
            py::gil_scoped_release release;
            return std::make_shared<RNNOutput>(r.forward(input, h0, c0, requires_grad));
          },
          py::arg("input"), py::arg("h0"), py::arg("c0"), py::arg("requires_grad"))
      .def(
          "forward_padded",
          [](RNNBase& r, const Tensor& input, const Tensor& h0, const Tensor& c0,
             bool requires_grad) {
            py::gil_scoped_release release;
            return std::make_shared<RNNOutput>(r.forward(input, h0, c0, requires_grad));
          },
          py::arg("input"), py::arg("h0"), py::arg("c0"), py::arg("requires_grad"))
      .def(
          "backward",
          [](RNNBase& r, const RNNOutput& out, const Tensor& grad_output, const Tensor& grad_h_n,
             const Tensor& grad_c_n) {
            RNNGradients g;
            {
              py::gil_scoped_release release;
              g = r.backward(out, grad_output, grad_h_n, grad_c_n);
            }
            return gradients_tuple(g);
          },
          py::arg("out"), py::arg("grad_output"), py::arg("grad_h_n"), py::arg("grad_c_n"));

  py::class_<CellOutput, std::shared_ptr<CellOutput>>(m, "CellOutput")
      .def_readonly("h", &CellOutput::h)
      .def_readonly("c", &CellOutput::c);

  py::class_<RNNCellBase>(m, "RNNCellBase")
      .def(py::init([](RNNMode mode, int64_t input_size, int64_t hidden_size, bool bias,
                       DType dtype, uint64_t seed) {
             auto c =
                 std::make_unique<RNNCellBase>(mode, input_size, hidden_size, bias, dtype, seed);
             c->set_config(policy_config());
             return c;
           }),
           py::arg("mode"), py::arg("input_size"), py::arg("hidden_size"), py::arg("bias"),
           py::arg("dtype"), py::arg("seed"))
      .def_property_readonly("parameter_names", &RNNCellBase::parameter_names)
      .def_property_readonly(
          "parameters", [](RNNCellBase& c) -> const std::vector<Tensor>& { return c.parameters(); })
      .def_property_readonly("grads",
                             [](RNNCellBase& c) -> const std::vector<Tensor>& { return c.grads(); })
      .def("zero_grad", &RNNCellBase::zero_grad)
      .def("state_dict", &RNNCellBase::state_dict)
      .def("load_state_dict", &RNNCellBase::load_state_dict, py::arg("state"))
      .def(
          "forward",
          [](RNNCellBase& c, const Tensor& input, const Tensor& hx, const Tensor& cx,
             bool requires_grad) {
            py::gil_scoped_release release;
            return std::make_shared<CellOutput>(c.forward(input, hx, cx, requires_grad));
          },
          py::arg("input"), py::arg("hx"), py::arg("cx"), py::arg("requires_grad"))
      .def(
          "backward",
          [](RNNCellBase& c, const CellOutput& out, const Tensor& grad_h, const Tensor& grad_c) {
            CellGradients g;
            {
              py::gil_scoped_release release;
              g = c.backward(out, grad_h, grad_c);
            }
            return py::make_tuple(array_from_tensor(g.input), array_from_tensor(g.h),
                                  array_from_tensor(g.c));
          },
          py::arg("out"), py::arg("grad_h"), py::arg("grad_c"));
}

}  // namespace seqpack::python
