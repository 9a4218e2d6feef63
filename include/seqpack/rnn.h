// Recurrent layers (RNN, LSTM, GRU and their cells) on packed batches, with the
// options, parameter names, initialisation and results of PyTorch 1.13.
//
//   LSTM lstm({.mode = RNNMode::lstm, .input_size = 2, .hidden_size = 3});
//   PackedSequence x = pack_sequence({a, b});         // a: [5, 2], b: [2, 2]
//   RNNOutput y = lstm.forward(x);                     // y.packed, y.h_n, y.c_n
//   RNNGradients g = lstm.backward(y, dy, dh_n, dc_n); // accumulates lstm.grads()
//
// Gates: LSTM i, f, g, o; GRU r, z, n (n = tanh(W_in x + b_in + r * (W_hn h + b_hn))).
// h_n of each sequence is its state at its own last valid step; the reverse
// direction starts at each sequence's own last step. Zero-length sequences keep
// h_n = h0 and c_n = c0 and produce no output rows.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "seqpack/packed_sequence.h"
#include "seqpack/precision.h"
#include "seqpack/tensor.h"

namespace seqpack {

enum class RNNMode { rnn_tanh, rnn_relu, lstm, gru };

// "rnn_tanh", "rnn_relu", "lstm", "gru" (the names workloads.json uses).
const char* rnn_mode_name(RNNMode mode);
RNNMode parse_rnn_mode(const std::string& name);  // throws naming the value

struct RNNOptions {
  RNNMode mode = RNNMode::lstm;
  int64_t input_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 1;
  bool bias = true;
  bool batch_first = false;
  double dropout = 0.0;  // between layers, training only
  bool bidirectional = false;
  int64_t proj_size = 0;  // LSTM only
  DType dtype = DType::f32;
  // Matrix products in fp32 (PyTorch-exact) or bf16 with fp32 accumulation
  // (float32 only, on a CPU with native bf16: see precision.h).
  Precision precision = Precision::fp32;

  // Throws std::invalid_argument naming the offending option and value.
  void validate() const;
  int64_t gate_count() const;  // 1 (RNN), 4 (LSTM), 3 (GRU)
  int64_t num_directions() const { return bidirectional ? 2 : 1; }
  // Size of h per direction: proj_size when set, else hidden_size.
  int64_t real_hidden_size() const { return proj_size > 0 ? proj_size : hidden_size; }
  // Feature size of the output rows: real_hidden_size * num_directions.
  int64_t output_size() const { return real_hidden_size() * num_directions(); }
  // Every option the same (what a plan made with one serves a holder of the other).
  bool operator==(const RNNOptions&) const = default;
};

// PyTorch's parameter names and shapes, in its order (_flat_weights_names):
// per layer, per direction: weight_ih, weight_hh, [bias_ih, bias_hh], [weight_hr].
std::vector<std::string> rnn_parameter_names(const RNNOptions& options);
std::vector<Shape> rnn_parameter_shapes(const RNNOptions& options);

// Opaque activations saved by a forward for its backward.
struct RNNSaved;

// Result of the functional forward on packed rows.
struct RNNForwardResult {
  Tensor output;  // packed rows [total_rows, output_size]
  Tensor h_n;     // [num_layers * dirs, batch, real_hidden], caller's batch order
  Tensor c_n;     // LSTM: [num_layers * dirs, batch, hidden]; undefined otherwise
  std::shared_ptr<const RNNSaved> saved;  // set when save_for_backward
};

struct RNNGradients {
  Tensor input;                 // same shape as the forward's input (rnn_forward_lookup: the table's)
  Tensor h0;                    // [num_layers * dirs, batch, real_hidden]; see initial_state_grad
  Tensor c0;                    // LSTM only
  std::vector<Tensor> weights;  // rnn_parameter_names order
};

// How a plan's calls share a direction's steps between threads, and the
// kernels they run on: seqpack::Policy's settings (rnn_config), given to the
// plan when it is made, as oneDNN's primitive attributes are. The core reads
// no other.
struct RNNConfig {
  // Who chooses between a row split (whole sequences per thread) and a
  // column split (a share of every step's gate columns per thread): the
  // engine, or a fixed choice (for measuring; tests run both with every
  // engine).
  enum class Split { engine, rows, columns };
  Split split = Split::engine;
  // Hidden units per thread below which a column split stops adding threads
  // (0: 64; at least 16).
  int64_t step_units = 0;
  // Mean rows a step per thread below which a row split stops adding
  // threads (0: no such floor).
  int64_t step_rows = 0;
  // Whether a column split also stops adding threads where a step's work
  // would not pay for them (off: tests that split small layers over many
  // threads).
  bool work_rule = true;
  // Whether the oneDNN engine makes one product of a thread's step ranges
  // (its columns of every gate, laid out together on first use) or one
  // product per range (for measuring).
  bool step_groups = true;
  // The kernels its products and gates run on (Policy's max_cpu_isa,
  // int8_kernel and bf16): the plan's weights are laid out for them.
  KernelConfig kernels;
  bool operator==(const RNNConfig&) const = default;
};
struct Policy;
// The config of `policy`'s settings; throws std::invalid_argument naming a
// setting whose value is not among its own (seqpack/policy.h).
RNNConfig rnn_config(const Policy& policy);

// A model's plan, the prepared model every forward runs: its options and
// weights, and its weight matrices laid out for the engine of its precision,
// as oneDNN's RNN weight reorders or cuDNN's weight space are. rnn_make_plan
// is its one maker; a forward takes the plan, never weights beside it.
//
// Two kinds. A kept plan (the default) owns a copy of the weights it is made
// from (rnn_plan_weights), which nothing else writes, and every layout in it
// is made from that copy, so it cannot go stale: at int8 every matrix is
// quantized when it is made; at fp32 and bf16 the recurrent matrices (W_hh,
// W_hr) are laid out for the threads that share a step's columns, at the
// first forward that splits the steps that way (each split kept). A forward
// of a kept plan that saves for a backward hands the plan to rnn_backward,
// which lays out W_hh and W_hr for its own products through it too, once per
// split (for a model whose recurrent weights stay fixed across backwards:
// input gradients of a trained model, an embedding trained under a frozen
// encoder). Holders keep one and refresh it before each forward with
// rnn_current_plan (exact: the same bytes), so a changed weight gives a new
// plan.
//
// An in-place plan (in_place) holds the caller's tensors themselves, copies
// nothing and keeps no layout: each forward lays out what it needs for itself
// (a few ms for a 2-layer bidirectional LSTM of hidden size 512; nothing at
// one step, whose products read the weights where they are), and reads the
// values the tensors hold then. For weights that change at every call (a
// training step) and one-step calls. A backward of its forwards reads the
// same tensors (as torch's saved tensors: write none of them in between).
//
// `config` decides how its calls share their steps between threads.
struct RNNModelPlan;
std::shared_ptr<const RNNModelPlan> rnn_make_plan(const RNNOptions& options,
                                                  const std::vector<Tensor>& weights,
                                                  bool in_place = false,
                                                  const RNNConfig& config = {});
// What a plan's precision can do.
struct RNNPlanInfo {
  Precision precision = Precision::fp32;
  bool backward = true;    // a forward with it may save for rnn_backward (not int8)
  bool quantized = false;  // holds quantized copies of the weight matrices (int8)
  int splits_laid_out = 0;  // the thread splits whose layouts it holds so far
  int backward_splits_laid_out = 0;  // the same for backwards of its forwards
};
RNNPlanInfo rnn_plan_info(const RNNModelPlan& plan);
// The plan's own copy of the weights it was made from (rnn_parameter_names
// order; an in-place plan's: the caller's tensors): what its forwards read.
const std::vector<Tensor>& rnn_plan_weights(const RNNModelPlan& plan);
// Whether `weights` hold exactly the values the plan was made from (same
// shapes and dtype, the same bytes: a NaN's payload and the sign of a zero
// count); true at once for the plan's own copy.
bool rnn_plan_holds(const RNNModelPlan& plan, const std::vector<Tensor>& weights);
// `plan` where it is a kept plan holding `weights`' values (rnn_plan_holds)
// with `options` and `config`, else a new kept plan of them (rnn_make_plan): what a holder
// of a plan calls before each forward, so that whatever wrote the weights (an
// optimizer, a write through a view, another process), the forward computes
// with the values they hold then.
std::shared_ptr<const RNNModelPlan> rnn_current_plan(std::shared_ptr<const RNNModelPlan> plan,
                                                     const RNNOptions& options,
                                                     const std::vector<Tensor>& weights,
                                                     const RNNConfig& config = {});
// The config a plan was made with.
const RNNConfig& rnn_plan_config(const RNNModelPlan& plan);

// Where a module keeps its plan: safe for forwards on several threads at once
// (each holds the plan it got for its whole call); a copy of a module makes
// its own.
class ModulePlan {
 public:
  ModulePlan() = default;
  ModulePlan(const ModulePlan&) {}
  ModulePlan& operator=(const ModulePlan&) {
    reset();
    return *this;
  }
  // The plan of an inference forward (made now where there is none or the
  // kept one no longer holds the weights' values: rnn_current_plan), or an
  // in-place plan of `weights`, dropping the kept one, for a forward that
  // trains or saves for a backward (an optimizer step may follow it).
  std::shared_ptr<const RNNModelPlan> for_forward(const RNNOptions& options,
                                                  const std::vector<Tensor>& weights,
                                                  const RNNConfig& config, bool inference);
  void reset();

 private:
  std::mutex mutex_;
  std::shared_ptr<const RNNModelPlan> plan_;
};

// Functional core, shared by the modules, the training tape and the Python and
// torch bridges. `model` holds the options and weights (rnn_make_plan).
// `data` holds packed rows [plan.total_rows(), input_size] in plan's layout.
// h0/c0 (undefined = zeros) are in the caller's batch order. Without h0 the
// per-step products skip the rows whose h_prev is that zero state, where
// every entry of W_hh is finite (a NaN or inf there makes W_hh·0 NaN, as in
// torch, so those rows are multiplied then).
// Dropout between layers is applied when `training` and options.dropout > 0,
// from `dropout_seed`.
RNNForwardResult rnn_forward(const RNNModelPlan& model, const Tensor& data, const PackingPlan& plan,
                             const Tensor& h0, const Tensor& c0, bool training,
                             bool save_for_backward, uint64_t dropout_seed = 0);

// rnn_forward with an embedding lookup fused into layer 0: packed row r of
// layer 0's input is row ids[r] of `table` [V, input_size]. The input
// projection X·W_ihᵀ is then computed for the V table rows instead of the
// plan.total_rows() packed rows (and, in the backward, dW_ih and the input
// gradient for V rows instead of every token), which pays when V is small:
// a character vocabulary against a million tokens. The backward's
// RNNGradients::input is dL/dtable [V, input_size] (every row; skipping a
// padding row is the caller's business). ids must have plan.total_rows()
// entries, each in [0, V).
RNNForwardResult rnn_forward_lookup(const RNNModelPlan& model, const Tensor& table,
                                    const std::vector<int64_t>& ids, const PackingPlan& plan,
                                    const Tensor& h0, const Tensor& c0, bool training,
                                    bool save_for_backward, uint64_t dropout_seed = 0);

// Gradients of everything the forward read. Undefined upstream gradients count
// as zeros. Cost is linear in the number of packed rows.
// With initial_state_grad = false, h0 and c0 get no gradient (left undefined),
// which lets the backward skip the products that only feed them: the rows of
// each step whose h_prev is h0 (one per sequence, about 1/length of the work).
// With input_grad = false the input gets no gradient (left undefined), which
// skips the first layer's dX product (what torch skips for an input that does
// not require grad). Where the forward's plan was a kept one, the backward
// reads its recurrent weights through it (RNNModelPlan above).
RNNGradients rnn_backward(const RNNSaved& saved, const Tensor& grad_output,
                          const Tensor& grad_h_n, const Tensor& grad_c_n,
                          bool initial_state_grad = true, bool input_grad = true);

// What a saved forward ran with, for recomputing it along another path (the
// torch operators' double backward recomputes it in differentiable torch
// operations): its options (precision resolved), and per layer the dropout
// mask it applied to that layer's input, [total_rows, layer input size] of 0
// or 1/(1-dropout) in the packed rows' order, undefined where none was applied
// (layer 0, not training, dropout 0).
const RNNOptions& rnn_saved_options(const RNNSaved& saved);
std::vector<Tensor> rnn_saved_dropout_masks(const RNNSaved& saved);

// Wall-clock seconds the recurrent core (rnn_forward, rnn_forward_lookup,
// rnn_backward, and what calls them) spent in each part of its calls, summed
// over the calls made while profiling was on, for finding where a
// many-thread run spends its time (`seqpack train --profile` prints it per
// epoch). Each part runs on every thread, so a part whose share of the wall
// time grows with the thread count is one that does not scale.
struct RNNCoreProfile {
  // Before the steps: the call's weights laid out (where its plan has no
  // kept layout for them), workspaces, dropout and the input projections.
  double forward_inputs = 0;
  double forward_steps = 0;   // the time loops: every direction's team
  double forward_states = 0;  // h_n and c_n, after the steps
  // Before the steps: gradient tensors and workspaces, the step weights laid
  // out, state gradients in, bias gradients cleared.
  double backward_prepare = 0;
  double backward_steps = 0;            // the time loops of the backward
  double backward_weights = 0;          // the weight gradients' products, after the steps
  double backward_inputs = 0;           // each layer's input gradient (dX)
  int64_t forwards = 0, backwards = 0;  // calls counted
};
// Switches profiling on (from zero) or off (the default: no clock is read).
void rnn_core_profile_enable(bool on);
// The sums so far; with reset, zeroed after they are read.
RNNCoreProfile rnn_core_profile(bool reset = false);

// Output of a module forward. For packed input `packed` is set (same
// batch_sizes and indices as the input); for padded input `padded` is set
// ([T, B, output_size] or batch-first, zeros at padding).
struct RNNOutput {
  PackedSequence packed;
  Tensor padded;
  Tensor h_n;
  Tensor c_n;
  // What backward needs; null when the module forward ran without grad.
  std::shared_ptr<const RNNSaved> saved;
  std::shared_ptr<const PackingPlan> plan;
  int64_t padded_length = 0;
};

// Multi-layer RNN/LSTM/GRU module holding its parameters and their gradients.
class RNNBase {
 public:
  // Parameters initialised as PyTorch does: uniform(-1/sqrt(hidden), 1/sqrt(hidden)),
  // drawn from `seed`.
  explicit RNNBase(RNNOptions options, uint64_t seed = 0);
  virtual ~RNNBase() = default;

  const RNNOptions& options() const { return options_; }

  const std::vector<std::string>& parameter_names() const { return names_; }
  // (Non-const access drops the module's plan: the caller may change them.)
  std::vector<Tensor>& parameters() {
    plan_.reset();
    return params_;
  }
  const std::vector<Tensor>& parameters() const { return params_; }
  std::vector<Tensor>& grads() { return grads_; }  // same order, accumulated by backward
  Tensor& parameter(const std::string& name);       // throws naming an unknown name
  void zero_grad();
  void reset_parameters(uint64_t seed);

  // Views of the parameters keyed by PyTorch's names.
  std::map<std::string, Tensor> state_dict() const;
  // Strict: a missing, unexpected or wrongly shaped key throws naming it.
  void load_state_dict(const std::map<std::string, Tensor>& state);

  void train(bool on = true) { training_ = on; }
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // The precision of the next forwards (RNNOptions::precision); throws as
  // RNNOptions::validate does where it cannot run. An int8 module is for
  // inference: its forwards need eval() and save nothing for a backward.
  void set_precision(Precision p);
  // Seed of the next dropout mask (advanced at each training forward).
  void set_dropout_seed(uint64_t seed) { dropout_seed_ = seed; }
  // The module's plan (rnn_make_plan) serves its inference forwards (eval(),
  // nothing saved for a backward): made at the first, and compared with the
  // parameters' values at each (rnn_current_plan), so a change through any
  // tensor taken before is seen by the next forward; dropped where the
  // parameters may change wholesale (a forward that trains or saves for a
  // backward, load_state_dict(), reset_parameters(), set_precision()).
  // replan() drops it too (no longer needed after a change: kept for callers).
  void replan() { plan_.reset(); }
  // How the next forwards share their steps between threads (the plans they
  // make are made with it; the defaults until set: a front end sets its
  // policy's, rnn_config).
  void set_config(const RNNConfig& config) {
    config_ = config;
    plan_.reset();
  }
  const RNNConfig& config() const { return config_; }

  // Packed input: output is a PackedSequence with the input's layout.
  RNNOutput forward(const PackedSequence& input, const Tensor& h0 = {}, const Tensor& c0 = {},
                    bool requires_grad = true);
  // Padded input [T, B, I] (or [B, T, I] with batch_first): every sequence has
  // length T, as in PyTorch. An unbatched [T, I] input is accepted too.
  RNNOutput forward(const Tensor& input, const Tensor& h0 = {}, const Tensor& c0 = {},
                    bool requires_grad = true);
  // Padded input with lengths: runs packed, returns padded output with zeros
  // at padding, h_n at each sequence's own last step.
  RNNOutput forward(const Tensor& input, const std::vector<int64_t>& lengths,
                    const Tensor& h0 = {}, const Tensor& c0 = {}, bool requires_grad = true);

  // grad_output has the shape of the forward's output (packed data or padded).
  // Adds parameter gradients into grads() and returns the input, h0 and c0
  // gradients (RNNGradients::weights holds this call's parameter gradients).
  RNNGradients backward(const RNNOutput& out, const Tensor& grad_output,
                        const Tensor& grad_h_n = {}, const Tensor& grad_c_n = {});

 protected:
  RNNOptions options_;
  std::vector<std::string> names_;
  std::vector<Tensor> params_;
  std::vector<Tensor> grads_;
  bool training_ = true;
  uint64_t dropout_seed_ = 0;
  RNNConfig config_;
  mutable ModulePlan plan_;  // see replan()
};

class RNN : public RNNBase {
 public:
  // options.mode must be rnn_tanh or rnn_relu.
  explicit RNN(RNNOptions options, uint64_t seed = 0);
};
class LSTM : public RNNBase {
 public:
  explicit LSTM(RNNOptions options, uint64_t seed = 0);  // sets mode = lstm
};
class GRU : public RNNBase {
 public:
  explicit GRU(RNNOptions options, uint64_t seed = 0);  // sets mode = gru
};

// Single-step cells with parameters weight_ih, weight_hh, bias_ih, bias_hh.
// Input [B, I] or unbatched [I]; hx [B, H] (undefined = zeros).
struct CellOutput {
  Tensor h;
  Tensor c;  // LSTMCell only
  std::shared_ptr<const RNNSaved> saved;
  bool unbatched = false;
};
struct CellGradients {
  Tensor input, h, c;
};

class RNNCellBase {
 public:
  RNNCellBase(RNNMode mode, int64_t input_size, int64_t hidden_size, bool bias, DType dtype,
              uint64_t seed);
  const std::vector<std::string>& parameter_names() const { return names_; }
  std::vector<Tensor>& parameters() {
    plan_.reset();
    return params_;
  }
  std::vector<Tensor>& grads() { return grads_; }
  std::map<std::string, Tensor> state_dict() const;
  void load_state_dict(const std::map<std::string, Tensor>& state);
  void zero_grad();
  // As RNNBase's: the plan of forwards without requires_grad (a decoding
  // loop's steps), compared with the parameters at each (exact).
  void replan() { plan_.reset(); }
  void set_config(const RNNConfig& config) {  // as RNNBase's
    config_ = config;
    plan_.reset();
  }
  const RNNConfig& config() const { return config_; }

  CellOutput forward(const Tensor& input, const Tensor& hx = {}, const Tensor& cx = {},
                     bool requires_grad = true);
  CellGradients backward(const CellOutput& out, const Tensor& grad_h,
                         const Tensor& grad_c = {});

 protected:
  RNNOptions options_;  // one layer, one direction
  std::vector<std::string> names_;
  std::vector<Tensor> params_;
  std::vector<Tensor> grads_;
  RNNConfig config_;
  mutable ModulePlan plan_;
};

class RNNCell : public RNNCellBase {
 public:
  RNNCell(int64_t input_size, int64_t hidden_size, bool bias = true,
          const std::string& nonlinearity = "tanh", DType dtype = DType::f32, uint64_t seed = 0);
};
class LSTMCell : public RNNCellBase {
 public:
  LSTMCell(int64_t input_size, int64_t hidden_size, bool bias = true, DType dtype = DType::f32,
           uint64_t seed = 0);
};
class GRUCell : public RNNCellBase {
 public:
  GRUCell(int64_t input_size, int64_t hidden_size, bool bias = true, DType dtype = DType::f32,
          uint64_t seed = 0);
};

}  // namespace seqpack
