// libseqpack_bench_torch_noop: the floor under seqpack::rnn's per-call cost in
// torch, for bench/bench_torch_overhead.py. Benchmark-only (built with
// SEQPACK_BUILD_TORCH and SEQPACK_BUILD_BENCHMARKS, never installed).
//
//   seqpack_bench::noop_rnn(<seqpack::rnn's schema>) -> (output, h_n, c_n)
//
// takes exactly seqpack::rnn's arguments and goes through what any custom
// operator with a C++ autograd Function pays in torch: argument parsing and
// dispatch, the node (one save_for_backward of the same tensors, one
// saved_data entry, as RNNFunction), the outputs' allocation, and in backward
// gradients of the right shapes for the input, states and every weight (so
// the same AccumulateGrad nodes run). There is no arithmetic and no check: the
// tensors are torch::empty. What seqpack::rnn costs above this is seqpack's
// own (its wrapper, conversions and checks), the rest is torch's.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define SEQPACK_BENCH_CALLGRIND 1
#endif

namespace seqpack_bench {

namespace {

using at::Tensor;
using OptTensor = c10::optional<at::Tensor>;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Stands in for RNNFunction's NodeState: one capsule in saved_data.
struct NodeState : torch::CustomClassHolder {
  int64_t h0_edge = -1, c0_edge = -1, w_edge = 1;
  bool lstm = false;
};

bool defined(const OptTensor& t) { return t.has_value() && t->defined(); }

// Output shapes of seqpack::rnn: output [rows, D * H_out], h_n [L * D, B,
// H_out], c_n [L * D, B, H] for an LSTM, else an empty placeholder.
struct Shapes {
  std::vector<int64_t> output, h_n, c_n;
};

Shapes shapes_of(const Tensor& data, const Tensor& batch_sizes, const OptTensor& sorted_indices,
                 c10::string_view mode, int64_t hidden_size, int64_t num_layers,
                 bool bidirectional, int64_t proj_size) {
  const int64_t dirs = bidirectional ? 2 : 1;
  const int64_t h_out = proj_size > 0 ? proj_size : hidden_size;
  const int64_t batch = defined(sorted_indices) ? sorted_indices->size(0)
                        : batch_sizes.numel() > 0 ? batch_sizes.data_ptr<int64_t>()[0]
                                                  : 0;
  Shapes s;
  s.output = {data.size(0), dirs * h_out};
  s.h_n = {num_layers * dirs, batch, h_out};
  s.c_n = mode == "LSTM" ? std::vector<int64_t>{num_layers * dirs, batch, hidden_size}
                         : std::vector<int64_t>{0};
  return s;
}

variable_list empty_outputs(const Shapes& s, const Tensor& like) {
  return {at::empty(s.output, like.options()), at::empty(s.h_n, like.options()),
          at::empty(s.c_n, like.options())};
}

class NoopFunction : public torch::autograd::Function<NoopFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& data, const OptTensor& h0,
                               const OptTensor& c0, at::TensorList weights, const Shapes& shapes) {
    variable_list out = empty_outputs(shapes, data);
    variable_list saved = {data};
    if (defined(h0)) saved.push_back(*h0);
    if (defined(c0)) saved.push_back(*c0);
    saved.insert(saved.end(), weights.begin(), weights.end());
    ctx->save_for_backward(saved);
    auto st = c10::make_intrusive<NodeState>();
    int64_t edge = 1;
    st->h0_edge = defined(h0) ? edge++ : -1;
    st->c0_edge = defined(c0) ? edge++ : -1;
    st->w_edge = edge;
    st->lstm = shapes.c_n.size() == 3;
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    if (!st->lstm) ctx->mark_non_differentiable({out[2]});
    ctx->set_materialize_grads(false);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    auto capsule = ctx->saved_data.at("state").toCapsule();
    const auto& st = *static_cast<NodeState*>(capsule.get());
    auto like = [](const Tensor& t) { return at::empty(t.sizes(), t.options()); };
    size_t next = 0;
    variable_list result;
    result.reserve(saved.size() + 3);
    result.push_back(ctx->needs_input_grad(0) ? like(saved[next]) : Tensor());
    ++next;
    result.push_back(st.h0_edge >= 0 && ctx->needs_input_grad(st.h0_edge) ? like(saved[next])
                                                                          : Tensor());
    if (st.h0_edge >= 0) ++next;
    result.push_back(st.c0_edge >= 0 && ctx->needs_input_grad(st.c0_edge) ? like(saved[next])
                                                                          : Tensor());
    if (st.c0_edge >= 0) ++next;
    for (int64_t i = 0; next < saved.size(); ++next, ++i)
      result.push_back(ctx->needs_input_grad(st.w_edge + i) ? like(saved[next]) : Tensor());
    result.emplace_back();  // shapes
    return result;
  }
};

std::tuple<Tensor, Tensor, Tensor> noop_rnn(
    const Tensor& data, const Tensor& batch_sizes, const OptTensor& sorted_indices,
    const OptTensor& unsorted_indices, const OptTensor& h0, const OptTensor& c0,
    at::TensorList weights, c10::string_view mode, int64_t hidden_size, int64_t num_layers,
    bool bias, bool bidirectional, int64_t proj_size, double dropout, bool train,
    c10::optional<int64_t> seed, c10::string_view precision) {
  const Shapes s = shapes_of(data, batch_sizes, sorted_indices, mode, hidden_size, num_layers,
                             bidirectional, proj_size);
  bool graph = false;
  if (at::GradMode::is_enabled()) {
    graph = data.requires_grad() || (defined(h0) && h0->requires_grad()) ||
            (defined(c0) && c0->requires_grad());
    for (const Tensor& w : weights) graph = graph || w.requires_grad();
  }
  variable_list out =
      graph ? NoopFunction::apply(data, h0, c0, weights, s) : empty_outputs(s, data);
  return {out[0], out[1], out[2]};
}

}  // namespace
}  // namespace seqpack_bench

TORCH_LIBRARY(seqpack_bench, m) {
  m.def(
      "noop_rnn(Tensor data, Tensor batch_sizes, Tensor? sorted_indices, "
      "Tensor? unsorted_indices, Tensor? h0, Tensor? c0, Tensor[] weights, str mode, "
      "int hidden_size, int num_layers, bool bias, bool bidirectional, int proj_size, "
      "float dropout, bool train, int? seed=None, str precision=\"fp32\") "
      "-> (Tensor output, Tensor h_n, Tensor c_n)",
      &seqpack_bench::noop_rnn);
}

// bench_torch_overhead.py --instructions: counts the instructions of one
// stretch of calls under valgrind --tool=callgrind (started with
// --instr-atstart=no --collect-atstart=no) and writes them as a dump named
// `name`. start returns 0 when not under valgrind (or built without its
// headers): nothing is counted then.
extern "C" int seqpack_bench_callgrind_start() {
#ifdef SEQPACK_BENCH_CALLGRIND
  if (!RUNNING_ON_VALGRIND) return 0;
  CALLGRIND_START_INSTRUMENTATION;
  CALLGRIND_ZERO_STATS;
  CALLGRIND_TOGGLE_COLLECT;
  return 1;
#else
  return 0;
#endif
}

extern "C" void seqpack_bench_callgrind_stop(const char* name) {
#ifdef SEQPACK_BENCH_CALLGRIND
  CALLGRIND_TOGGLE_COLLECT;
  CALLGRIND_DUMP_STATS_AT(name);
#else
  (void)name;
#endif
}
