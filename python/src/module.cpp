// seqpack._seqpack: registers the bindings, one file per bound concept. The
// user-facing API (argument checks, torch-like signatures) is the pure-Python
// package around it.
#include "bind.h"
#include "seqpack/policy.h"
#include "seqpack/version.h"

namespace seqpack::python {

namespace {
Policy installed;            // set once, at the import
RNNConfig installed_config;  // its config
}  // namespace

const RNNConfig& policy_config() { return installed_config; }
const Policy& installed_policy() { return installed; }

}  // namespace seqpack::python

PYBIND11_MODULE(_seqpack, m) {
  m.doc() = "seqpack C++ core (use the seqpack package, not this module)";
  // The core reads no environment: the module reads the SEQPACK_* policy
  // once (a bad value fails the import, naming the variable and the value)
  // and gives its config to every plan it makes.
  const seqpack::Policy policy = seqpack::policy_from_environment();
  seqpack::python::installed_config = seqpack::rnn_config(policy);
  seqpack::python::installed = policy;
  // The linked library's version (seqpack.__version__, include/seqpack/version.h).
  m.attr("__version__") = seqpack::version();
  seqpack::python::bind_tensor(m);
  seqpack::python::bind_packing(m);
  seqpack::python::bind_precision(m);  // before bind_rnn: RNNOptions' default precision
  seqpack::python::bind_rnn(m);
  seqpack::python::bind_threading(m);
  seqpack::python::bind_streaming(m);
  seqpack::python::bind_data(m);
  seqpack::python::bind_varlen(m);
  seqpack::python::bind_classifier(m);
}
