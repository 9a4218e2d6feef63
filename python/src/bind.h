// One registration function per bound concept; module.cpp calls them all.
#pragma once

#include <pybind11/pybind11.h>

#include "seqpack/rnn.h"

namespace seqpack::python {

// The config of the SEQPACK_* policy the module installed at its import
// (rnn_config): the models and plans made from Python are made with it.
const RNNConfig& policy_config();
// The SEQPACK_* policy the module read at its import.
const Policy& installed_policy();

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
