// Streaming inference: per-stream recurrent state for a multi-layer,
// unidirectional RNN/LSTM/GRU fed in chunks as data arrives.
//
//   LSTM lstm({.input_size = 40, .hidden_size = 256, .num_layers = 2});
//   StreamingRNN streams(lstm);              // shares lstm's parameters
//   int64_t a = streams.open(), b = streams.open();
//   auto y = streams.push({a, b}, {chunk_a /*[3, 40]*/, chunk_b /*[8, 40]*/});
//   // y[0]: [3, 256], y[1]: [8, 256]; a and b now hold their (h, c)
//   int64_t c = streams.open();               // starts mid-flight
//   y = streams.push({c, a}, {chunk_c, next_a});
//   streams.close(b);
//
// One push runs the chunks of every stream in it as ONE packed batch through
// rnn_forward (chunks of different lengths, h0/c0 gathered from the streams'
// states), so many streams cost one batched recurrence, not one each.
// Contract: feeding a sequence in any split into chunks, interleaved with other
// streams, gives the outputs and final state of one forward over the whole
// sequence, to rounding (float32 within 1e-6, float64 within 1e-12: the BLAS
// rounds a row differently with the number of rows, so not bit for bit).
//
// Stream ids are issued by open(), counting from 0, and never reused: an id
// that open() never returned is unknown, one that was closed stays closed.
// Inference only: no gradient, no dropout. At precision int8 a stream's
// results do not depend on the other streams in its pushes, bit for bit (the
// rows are quantized one by one), nor on how its sequence is split into
// chunks (the values are equal; a zero may differ in sign).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "seqpack/rnn.h"
#include "seqpack/tensor.h"

namespace seqpack {

// The recurrent state of one stream.
struct StreamState {
  Tensor h;  // [num_layers, real_hidden]
  Tensor c;  // LSTM: [num_layers, hidden]; undefined otherwise
};

class StreamingRNN {
 public:
  // `weights` in rnn_parameter_names(options) order, shared (not copied), and
  // the model's plan made from them (rnn_make_plan: at int8 the matrices are
  // quantized now; at fp32 and bf16 W_hh is laid out at the first push that
  // needs it). Throws std::invalid_argument for a bidirectional model or
  // weights of the wrong count, shape or dtype. `config`: how the pushes
  // share their steps between threads (the plan's, rnn_make_plan).
  StreamingRNN(RNNOptions options, std::vector<Tensor> weights, const RNNConfig& config = {});
  // Shares the module's parameters, and takes its config.
  explicit StreamingRNN(const RNNBase& module);
  // A new plan from the weights' current values now. Not needed after a
  // change: each push compares the weights with its plan's copy (exact) and
  // makes a new plan where they differ.
  void replan();

  const RNNOptions& options() const { return options_; }

  // A new stream starting from h0 [num_layers, real_hidden] and c0
  // [num_layers, hidden] (LSTM), or zeros when undefined. Returns its id.
  int64_t open(const Tensor& h0 = {}, const Tensor& c0 = {});

  // Runs chunks[i] ([len_i, input_size], len_i >= 0, the options' dtype) on
  // stream stream_ids[i], all in one packed batch. Returns each chunk's
  // outputs of the last layer, [len_i, real_hidden], in the order given (views
  // of one buffer per push, chunk after chunk; clone() one to keep it alone), and
  // keeps each stream's state at the end of its chunk. Unknown, closed or
  // repeated ids, and chunks of the wrong shape or dtype, throw
  // std::invalid_argument naming them, before any state changes.
  std::vector<Tensor> push(const std::vector<int64_t>& stream_ids,
                           const std::vector<Tensor>& chunks);

  // Back to h0/c0 (zeros when undefined), as if the stream had just opened.
  void reset(int64_t id, const Tensor& h0 = {}, const Tensor& c0 = {});
  // Forgets the stream; its id is rejected from now on.
  void close(int64_t id);

  // A copy of the stream's current state.
  StreamState state(int64_t id) const;
  bool is_open(int64_t id) const { return states_.count(id) > 0; }
  // Ids of the open streams, ascending.
  std::vector<int64_t> open_ids() const;
  int64_t num_open() const { return static_cast<int64_t>(states_.size()); }

 private:
  // Throws naming `id` (unknown or closed) when it is not open; `where` is the
  // caller's name for it ("stream_ids[2]").
  const StreamState& checked(int64_t id, const std::string& where) const;
  StreamState initial_state(const Tensor& h0, const Tensor& c0, const std::string& where) const;

  RNNOptions options_;
  RNNConfig config_;
  std::vector<Tensor> weights_;
  std::shared_ptr<const RNNModelPlan> plan_;
  std::unordered_map<int64_t, StreamState> states_;
  int64_t next_id_ = 0;
};

}  // namespace seqpack
