// The core's argument checks (rnn/checks.h).
#include "rnn/checks.h"

#include <stdexcept>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "rnn/cells.h"
#include "rnn/saved.h"
#include "seqpack/precision.h"

namespace seqpack::rnn {

void check_state(const Tensor& s, const Shape& want, DType dtype, const char* what) {
  if (!s.defined()) return;
  if (s.shape() != want) {
    throw std::invalid_argument(std::string(what) + " has shape " + shape_str(s.shape()) +
                                ", expected " + shape_str(want));
  }
  if (s.dtype() != dtype) {
    throw std::invalid_argument(std::string(what) + " has dtype " + dtype_name(s.dtype()) +
                                ", expected " + dtype_name(dtype));
  }
}

void check_weights(const RNNOptions& o, const std::vector<Tensor>& weights) {
  const auto names = rnn_parameter_names(o);
  const auto shapes = rnn_parameter_shapes(o);
  if (weights.size() != names.size()) {
    throw std::invalid_argument("expected " + std::to_string(names.size()) +
                                " weight tensors for these options, got " +
                                std::to_string(weights.size()));
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    const Tensor& w = weights[i];
    if (!w.defined() || w.shape() != shapes[i]) {
      throw std::invalid_argument(names[i] + " has shape " +
                                  (w.defined() ? shape_str(w.shape()) : "undefined") +
                                  ", expected " + shape_str(shapes[i]));
    }
    if (w.dtype() != o.dtype) {
      throw std::invalid_argument(names[i] + " has dtype " + dtype_name(w.dtype()) + ", expected " +
                                  dtype_name(o.dtype));
    }
  }
}

void check_initial_state(const RNNOptions& options, const PackingPlan& plan, const Tensor& h0,
                         const Tensor& c0) {
  const int64_t LD = options.num_layers * options.num_directions();
  check_state(h0, {LD, plan.batch(), options.real_hidden_size()}, options.dtype, "h0");
  if (has_cell_state(options.mode)) {
    check_state(c0, {LD, plan.batch(), options.hidden_size}, options.dtype, "c0");
  } else if (c0.defined()) {
    throw std::invalid_argument(std::string("c0 is only used by LSTM, not ") +
                                rnn_mode_name(options.mode));
  }
}

bool same_values(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  return a.raw_data() == b.raw_data() || a.nbytes() == 0 ||
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

void check_forward_mode(const RNNOptions& options, bool training, bool save_for_backward) {
  if (!precision_traits(options.precision).backward && (training || save_for_backward)) {
    const std::string p = precision_name(options.precision);
    throw std::invalid_argument(
        "precision " + p + " is for inference only, but this forward is " +
        (training ? "in training mode (call eval(), or pass training = false)"
                  : "saving for a backward (" + p + " has no gradient; use fp32 or bf16)"));
  }
}

void check_forward(const RNNOptions& options, const Tensor& data, const PackingPlan& plan,
                   const Tensor& h0, const Tensor& c0) {
  if (!data.defined() || data.dim() != 2) {
    throw std::invalid_argument("packed input must be 2-D [rows, input_size], got shape " +
                                (data.defined() ? shape_str(data.shape()) : "undefined"));
  }
  if (data.size(1) != options.input_size) {
    throw std::invalid_argument(
        "input has " + std::to_string(data.size(1)) +
        " features, expected input_size = " + std::to_string(options.input_size));
  }
  if (data.size(0) != plan.total_rows()) {
    throw std::invalid_argument("packed input has " + std::to_string(data.size(0)) +
                                " rows but the batch sizes sum to " +
                                std::to_string(plan.total_rows()));
  }
  if (data.dtype() != options.dtype) {
    throw std::invalid_argument(std::string("input has dtype ") + dtype_name(data.dtype()) +
                                " but the weights are " + dtype_name(options.dtype));
  }
  check_initial_state(options, plan, h0, c0);
}

void check_forward_lookup(const RNNOptions& options, const Tensor& table,
                          const std::vector<int64_t>& ids, const PackingPlan& plan,
                          const Tensor& h0, const Tensor& c0) {
  if (!table.defined() || table.dim() != 2 || table.size(1) != options.input_size) {
    throw std::invalid_argument(
        "lookup table must be 2-D [rows, input_size = " + std::to_string(options.input_size) +
        "], got shape " + (table.defined() ? shape_str(table.shape()) : "undefined"));
  }
  if (table.dtype() != options.dtype) {
    throw std::invalid_argument(std::string("lookup table has dtype ") + dtype_name(table.dtype()) +
                                " but the weights are " + dtype_name(options.dtype));
  }
  if (static_cast<int64_t>(ids.size()) != plan.total_rows()) {
    throw std::invalid_argument("lookup has " + std::to_string(ids.size()) +
                                " ids but the batch sizes sum to " +
                                std::to_string(plan.total_rows()));
  }
  const int64_t V = table.size(0);
  for (std::size_t r = 0; r < ids.size(); ++r) {
    if (ids[r] < 0 || ids[r] >= V) {
      throw std::invalid_argument("lookup ids[" + std::to_string(r) + "] = " +
                                  std::to_string(ids[r]) + " is outside the table's rows [0, " +
                                  std::to_string(V) + ")");
    }
  }
  check_initial_state(options, plan, h0, c0);
}

void check_backward(const RNNSaved& saved, const Tensor& grad_output, const Tensor& grad_h_n,
                    const Tensor& grad_c_n) {
  const RNNOptions& o = saved.options;
  const int64_t LD = o.num_layers * o.num_directions();
  check_state(grad_output, {saved.total_rows, o.output_size()}, o.dtype, "grad_output");
  check_state(grad_h_n, {LD, saved.batch, o.real_hidden_size()}, o.dtype, "grad_h_n");
  if (has_cell_state(o.mode)) {
    check_state(grad_c_n, {LD, saved.batch, o.hidden_size}, o.dtype, "grad_c_n");
  } else if (grad_c_n.defined()) {
    throw std::invalid_argument(std::string("grad_c_n is only used by LSTM, not ") +
                                rnn_mode_name(o.mode));
  }
}

}  // namespace seqpack::rnn
