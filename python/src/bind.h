// One registration function per bound concept; module.cpp calls them all.
#pragma once

#include <pybind11/pybind11.h>

namespace seqpack::python {

void bind_tensor(pybind11::module_& m);
void bind_packing(pybind11::module_& m);
void bind_rnn(pybind11::module_& m);
void bind_threading(pybind11::module_& m);
void bind_precision(pybind11::module_& m);
void bind_streaming(pybind11::module_& m);
void bind_data(pybind11::module_& m);
void bind_varlen(pybind11::module_& m);
void bind_classifier(pybind11::module_& m);

}  // namespace seqpack::python
