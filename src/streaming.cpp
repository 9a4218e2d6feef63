// StreamingRNN: per-stream (h, c) kept between pushes; each push is one packed
// batch through the public rnn_forward, with h0/c0 gathered from the streams.
#include "seqpack/streaming.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "seqpack/packed_sequence.h"

namespace seqpack {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Copies row `src_row` of a 2-D tensor to row `dst_row` of another of the same
// dtype and row width.
void copy_row(const Tensor& src, int64_t src_row, Tensor& dst, int64_t dst_row, int64_t width) {
  const std::size_t bytes = static_cast<std::size_t>(width) * dtype_size(src.dtype());
  std::memcpy(static_cast<char*>(dst.raw_data()) + static_cast<std::size_t>(dst_row) * bytes,
              static_cast<const char*>(src.raw_data()) + static_cast<std::size_t>(src_row) * bytes,
              bytes);
}

}  // namespace

StreamingRNN::StreamingRNN(RNNOptions options, std::vector<Tensor> weights, const RNNConfig& config)
    : options_(options), config_(config), weights_(std::move(weights)) {
  options_.validate();
  if (options_.bidirectional) {
    throw std::invalid_argument(
        "StreamingRNN: the model is bidirectional; a stream's reverse direction would need "
        "inputs that have not arrived yet, so only unidirectional models can stream");
  }
  // Inference only: dropout never applies, and batch_first has no meaning for packed rows.
  options_.dropout = 0.0;
  options_.batch_first = false;
  const auto names = rnn_parameter_names(options_);
  const auto shapes = rnn_parameter_shapes(options_);
  if (weights_.size() != names.size()) {
    throw std::invalid_argument("StreamingRNN: " + str(static_cast<int64_t>(weights_.size())) +
                                " weights given; the model has " +
                                str(static_cast<int64_t>(names.size())) + " parameters");
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    const Tensor& w = weights_[i];
    if (!w.defined() || w.shape() != shapes[i]) {
      throw std::invalid_argument("StreamingRNN: weight " + names[i] + " has shape " +
                                  (w.defined() ? shape_str(w.shape()) : "(undefined)") +
                                  "; expected " + shape_str(shapes[i]));
    }
    if (w.dtype() != options_.dtype) {
      throw std::invalid_argument("StreamingRNN: weight " + names[i] + " has dtype " +
                                  dtype_name(w.dtype()) + "; the options say " +
                                  dtype_name(options_.dtype));
    }
  }
  replan();
}

void StreamingRNN::replan() {
  plan_ = rnn_make_plan(options_, weights_, /*in_place=*/false, config_);
}

StreamingRNN::StreamingRNN(const RNNBase& module)
    : StreamingRNN(module.options(), module.parameters(), module.config()) {}

StreamState StreamingRNN::initial_state(const Tensor& h0, const Tensor& c0,
                                        const std::string& where) const {
  const bool lstm = options_.mode == RNNMode::lstm;
  const Shape h_shape{options_.num_layers, options_.real_hidden_size()};
  const Shape c_shape{options_.num_layers, options_.hidden_size};
  auto take = [&](const Tensor& t, const Shape& shape, const char* name) {
    if (!t.defined()) return Tensor::zeros(shape, options_.dtype);
    if (t.shape() != shape || t.dtype() != options_.dtype) {
      throw std::invalid_argument(where + ": " + name + " is " + dtype_name(t.dtype()) + " " +
                                  shape_str(t.shape()) + "; expected " +
                                  dtype_name(options_.dtype) + " " + shape_str(shape) +
                                  " (num_layers, hidden)");
    }
    return t.clone();
  };
  if (!lstm && c0.defined()) {
    throw std::invalid_argument(where + ": c0 given to a " + rnn_mode_name(options_.mode) +
                                ", which has no cell state");
  }
  StreamState s;
  s.h = take(h0, h_shape, "h0");
  if (lstm) s.c = take(c0, c_shape, "c0");
  return s;
}

int64_t StreamingRNN::open(const Tensor& h0, const Tensor& c0) {
  StreamState s = initial_state(h0, c0, "open");
  const int64_t id = next_id_++;
  states_.emplace(id, std::move(s));
  return id;
}

const StreamState& StreamingRNN::checked(int64_t id, const std::string& where) const {
  auto it = states_.find(id);
  if (it != states_.end()) return it->second;
  if (id >= 0 && id < next_id_) {
    throw std::invalid_argument(where + " = " + str(id) + ": stream " + str(id) + " was closed");
  }
  throw std::invalid_argument(
      where + " = " + str(id) + ": no stream " + str(id) + " was opened (open() has returned " +
      (next_id_ == 0 ? std::string("no ids yet") : "ids 0.." + str(next_id_ - 1)) + ")");
}

void StreamingRNN::reset(int64_t id, const Tensor& h0, const Tensor& c0) {
  checked(id, "reset: id");
  states_[id] = initial_state(h0, c0, "reset");
}

void StreamingRNN::close(int64_t id) {
  checked(id, "close: id");
  states_.erase(id);
}

StreamState StreamingRNN::state(int64_t id) const {
  const StreamState& s = checked(id, "state: id");
  return {s.h.clone(), s.c.defined() ? s.c.clone() : Tensor()};
}

std::vector<int64_t> StreamingRNN::open_ids() const {
  std::vector<int64_t> ids;
  ids.reserve(states_.size());
  for (const auto& kv : states_) ids.push_back(kv.first);
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::vector<Tensor> StreamingRNN::push(const std::vector<int64_t>& stream_ids,
                                       const std::vector<Tensor>& chunks) {
  if (stream_ids.size() != chunks.size()) {
    throw std::invalid_argument("push: " + str(static_cast<int64_t>(stream_ids.size())) +
                                " stream ids for " + str(static_cast<int64_t>(chunks.size())) +
                                " chunks; give one chunk per stream");
  }
  const int64_t batch = static_cast<int64_t>(chunks.size());
  const int64_t input_size = options_.input_size;
  // Everything is checked before any state changes. (Messages are only built
  // on failure: a push of 64 one-step chunks is a few microseconds of work.)
  std::vector<StreamState*> states(static_cast<std::size_t>(batch));
  std::vector<int64_t> lengths(static_cast<std::size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const std::size_t k = static_cast<std::size_t>(b);
    auto it = states_.find(stream_ids[k]);
    if (it == states_.end()) checked(stream_ids[k], "push: stream_ids[" + str(b) + "]");
    states[k] = &it->second;
    const Tensor& x = chunks[k];
    if (!x.defined() || x.dim() != 2 || x.size(1) != input_size) {
      throw std::invalid_argument("push: chunks[" + str(b) + "] has shape " +
                                  (x.defined() ? shape_str(x.shape()) : "(undefined)") +
                                  "; expected [length, " + str(input_size) +
                                  "] (input_size = " + str(input_size) + ")");
    }
    if (x.dtype() != options_.dtype) {
      throw std::invalid_argument("push: chunks[" + str(b) + "] has dtype " +
                                  dtype_name(x.dtype()) + "; the model is " +
                                  dtype_name(options_.dtype));
    }
    lengths[k] = x.size(0);
  }
  // A stream twice in one push: its two states would be the same object.
  std::vector<StreamState*> sorted = states;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    for (int64_t b = 1; b < batch; ++b) {
      for (int64_t a = 0; a < b; ++a) {
        if (stream_ids[static_cast<std::size_t>(a)] == stream_ids[static_cast<std::size_t>(b)]) {
          throw std::invalid_argument("push: stream_ids[" + str(b) +
                                      "] = " + str(stream_ids[static_cast<std::size_t>(b)]) +
                                      " repeats stream_ids[" + str(a) +
                                      "]: one chunk per stream per push (concatenate them)");
        }
      }
    }
  }

  // The outputs: one buffer per push, chunk after chunk; each chunk's is a view.
  const int64_t hidden = options_.real_hidden_size();
  std::vector<int64_t> first_row(static_cast<std::size_t>(batch) + 1, 0);
  for (int64_t b = 0; b < batch; ++b) {
    first_row[static_cast<std::size_t>(b) + 1] =
        first_row[static_cast<std::size_t>(b)] + lengths[static_cast<std::size_t>(b)];
  }
  Tensor out = Tensor::empty({first_row.back(), hidden}, options_.dtype);
  std::vector<Tensor> outputs(static_cast<std::size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    outputs[static_cast<std::size_t>(b)] = out.slice0(first_row[static_cast<std::size_t>(b)],
                                                      first_row[static_cast<std::size_t>(b) + 1]);
  }
  if (first_row.back() == 0) return outputs;  // nothing to run; every state stays
  const PackingPlan plan = PackingPlan::from_lengths(lengths, /*enforce_sorted=*/false);

  // Packed rows: row r is step t of chunk b where padded_index[r] = t * batch + b.
  const auto& where_row = plan.padded_index();
  Tensor data = Tensor::empty({plan.total_rows(), input_size}, options_.dtype);
  for (int64_t r = 0; r < plan.total_rows(); ++r) {
    const int64_t p = where_row[static_cast<std::size_t>(r)];
    copy_row(chunks[static_cast<std::size_t>(p % batch)], p / batch, data, r, input_size);
  }
  // h0/c0 [num_layers, batch, *] in the caller's order, from the streams' states.
  const bool lstm = options_.mode == RNNMode::lstm;
  const int64_t layers = options_.num_layers, cell = options_.hidden_size;
  Tensor h0 = Tensor::empty({layers, batch, hidden}, options_.dtype);
  Tensor c0 = lstm ? Tensor::empty({layers, batch, cell}, options_.dtype) : Tensor();
  Tensor h0_rows = h0.view({layers * batch, hidden});
  Tensor c0_rows = lstm ? c0.view({layers * batch, cell}) : Tensor();
  for (int64_t b = 0; b < batch; ++b) {
    const StreamState& s = *states[static_cast<std::size_t>(b)];
    for (int64_t l = 0; l < layers; ++l) {
      copy_row(s.h, l, h0_rows, l * batch + b, hidden);
      if (lstm) copy_row(s.c, l, c0_rows, l * batch + b, cell);
    }
  }

  // The weights are shared with the caller (a torch module's parameters):
  // compared with the plan's copy at each push, so a write through any
  // tensor is seen by the next push.
  plan_ = rnn_current_plan(plan_, options_, weights_, config_);
  const RNNForwardResult y = rnn_forward(*plan_, data, plan, h0, c0,
                                         /*training=*/false, /*save_for_backward=*/false, 0);

  for (int64_t r = 0; r < plan.total_rows(); ++r) {
    const int64_t p = where_row[static_cast<std::size_t>(r)];
    copy_row(y.output, r, out, first_row[static_cast<std::size_t>(p % batch)] + p / batch, hidden);
  }
  const Tensor h_rows = y.h_n.view({layers * batch, hidden});
  const Tensor c_rows = lstm ? y.c_n.view({layers * batch, cell}) : Tensor();
  for (int64_t b = 0; b < batch; ++b) {
    StreamState& s = *states[static_cast<std::size_t>(b)];
    for (int64_t l = 0; l < layers; ++l) {
      copy_row(h_rows, l * batch + b, s.h, l, hidden);
      if (lstm) copy_row(c_rows, l * batch + b, s.c, l, cell);
    }
  }
  return outputs;
}

}  // namespace seqpack
