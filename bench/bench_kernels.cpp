// The recurrent layers on every workload of a workloads file, through the public
// functional API (rnn_forward / rnn_backward), as Google Benchmark cases with
// tokens/s and FLOP/s rate counters; and the float32 fused gate kernels alone
// (gates/<cell>_<forward|backward>/n:<rows>/H:<hidden>), one time step's call,
// with elements/s counting n x H hidden units.
//
//   build/bench/bench_kernels [--threads=N] [--workloads=FILE] [google benchmark flags]
//
// FILE defaults to $SEQPACK_WORKLOADS, else the source tree's bench/workloads.json.
// `seqpack bench` measures the same three modes with its own stopping rule; this program is for profiling one case in isolation, e.g.
//   valgrind --tool=callgrind build/bench/bench_kernels
//     --benchmark_filter='lstm-bi-2layer/forward_packed' --benchmark_min_time=0.01
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/rnn_gates.h"
#include "seqpack/packed_sequence.h"
#include "seqpack/policy.h"
#include "seqpack/rnn.h"
#include "seqpack/tensor.h"
#include "seqpack/threading.h"

namespace {

// The SEQPACK_* variables' policy (read once, at main), and its kernel
// settings: what the benchmarks give the plans they make and the kernels
// they call.
const seqpack::Policy& bench_policy() {
  static const seqpack::Policy policy = seqpack::policy_from_environment();
  return policy;
}
[[maybe_unused]] const seqpack::KernelConfig& bench_kernels() {
  static const seqpack::KernelConfig kernels = seqpack::kernel_config(bench_policy());
  return kernels;
}

using namespace seqpack;

struct Case {
  std::string name;
  RNNOptions options;
  std::vector<int64_t> lengths;
};

Tensor uniform(const Shape& shape, float bound, std::mt19937_64& rng) {
  Tensor t = Tensor::empty(shape, DType::f32);
  std::uniform_real_distribution<float> u(-bound, bound);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

// 2 * gates*H * (I_layer + H) per token, layer and direction.
double forward_flops(const RNNOptions& o, int64_t tokens) {
  double total = 0;
  for (int64_t l = 0; l < o.num_layers; ++l) {
    const int64_t in = l == 0 ? o.input_size : o.output_size();
    total += static_cast<double>(o.num_directions() * 2 * o.gate_count() * o.hidden_size *
                                 (in + o.hidden_size));
  }
  return total * static_cast<double>(tokens);
}

void run_case(benchmark::State& state, const Case& c, const std::string& mode) {
  const RNNOptions& o = c.options;
  const RNNConfig config = rnn_config(bench_policy());  // the SEQPACK_* variables'
  std::mt19937_64 rng(0x5eed);
  std::vector<Tensor> weights;
  for (const Shape& s : rnn_parameter_shapes(o)) {
    weights.push_back(uniform(s, 1.f / std::sqrt(static_cast<float>(o.hidden_size)), rng));
  }
  int64_t tokens = 0, max_len = 0;
  for (auto l : c.lengths) {
    tokens += l;
    max_len = std::max(max_len, l);
  }
  // forward_padded: every sequence at max_len, the work a padded batch does.
  const std::vector<int64_t> lengths =
      mode == "forward_padded" ? std::vector<int64_t>(c.lengths.size(), max_len) : c.lengths;
  const PackingPlan plan = PackingPlan::from_lengths(lengths, /*enforce_sorted=*/false);
  const Tensor data = uniform({plan.total_rows(), o.input_size}, 1.f, rng);
  const Tensor ones = Tensor::full({plan.total_rows(), o.output_size()}, 1.0, DType::f32);
  const bool train = mode == "train_packed";
  for (auto _ : state) {
    RNNForwardResult y = rnn_forward(*rnn_make_plan(o, weights, /*in_place=*/true, config), data,
                                     plan, {}, {}, /*training=*/train,
                                     /*save_for_backward=*/train);
    if (train) {
      RNNGradients g = rnn_backward(*y.saved, ones, {}, {});
      benchmark::DoNotOptimize(g.input.raw_data());
    }
    benchmark::DoNotOptimize(y.output.raw_data());
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  if (!train) {
    state.counters["FLOPS"] = benchmark::Counter(forward_flops(o, plan.total_rows()),
                                                 benchmark::Counter::kIsIterationInvariantRate);
  }
}

// One step's gate kernel over n rows, hidden size H. The forward kernels work
// in place (activations overwrite pre-activations), so repeated calls feed
// activations back in: values stay in (-1, 1), away from any special case, and
// no copy pollutes the timing.
void run_gate_kernel(benchmark::State& state, const std::string& kernel) {
  const int64_t n = state.range(0), H = state.range(1);
  std::mt19937_64 rng(0x5eed);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  auto buf = [&](int64_t size) {
    std::vector<float> v(static_cast<std::size_t>(size));
    for (float& x : v) x = u(rng);
    return v;
  };
  std::vector<float> gates = buf(n * 4 * H), gh = buf(n * 3 * H), b = buf(3 * H);
  std::vector<float> c = buf(n * H), cp = buf(n * H), dh = buf(n * H), dc = buf(n * H);
  std::vector<float> h = buf(n * H), dg = buf(n * 4 * H), dg2 = buf(n * 4 * H);
  // The *_dbias variants also sum the bias gradients (the kernels' optional
  // accumulators), which replaces a column-sum pass over [N, G] per bias.
  std::vector<float> db = buf(4 * H), db2 = buf(3 * H);
  for (auto _ : state) {
    if (kernel == "lstm_forward") {
      cpu::lstm_gates_forward<float>(bench_kernels().isa_cap, n, H, 0, H, gates.data(), c.data(), H,
                                     c.data(), H, h.data(), H);
    } else if (kernel == "lstm_backward") {
      cpu::lstm_gates_backward<float>(bench_kernels().isa_cap, n, H, 0, H, gates.data(), c.data(),
                                      cp.data(), dh.data(), H, dc.data(), dg.data());
    } else if (kernel == "lstm_backward_dbias") {
      cpu::lstm_gates_backward<float>(bench_kernels().isa_cap, n, H, 0, H, gates.data(), c.data(),
                                      cp.data(), dh.data(), H, dc.data(), dg.data(), db.data());
    } else if (kernel == "gru_backward_dbias") {
      cpu::gru_gates_backward<float>(bench_kernels().isa_cap, n, H, 0, H, gates.data(), c.data(),
                                     cp.data(), H, dh.data(), H, dg.data(), dg2.data(), dc.data(),
                                     db.data(), db2.data());
    } else if (kernel == "gru_forward") {
      cpu::gru_gates_forward<float>(bench_kernels().isa_cap, n, H, 0, H, gates.data(), gh.data(),
                                    b.data(), cp.data(), H, h.data(), H, c.data());
    } else if (kernel == "gru_backward") {
      cpu::gru_gates_backward<float>(bench_kernels().isa_cap, n, H, 0, H, gates.data(), c.data(),
                                     cp.data(), H, dh.data(), H, dg.data(), dg2.data(), dc.data());
    } else if (kernel == "rnn_tanh_forward") {
      cpu::rnn_gates_forward<float>(bench_kernels().isa_cap, n, H, 0, H, gates.data(),
                                    /*relu=*/false, h.data(), H);
    }
    benchmark::ClobberMemory();
  }
  state.counters["elements/s"] = benchmark::Counter(static_cast<double>(n * H),
                                                    benchmark::Counter::kIsIterationInvariantRate);
}

std::vector<Case> load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot open workloads file '" + path + "'");
  const nlohmann::json doc = nlohmann::json::parse(in);
  std::vector<Case> cases;
  for (const auto& w : doc.at("workloads")) {
    Case c;
    c.name = w.at("name").get<std::string>();
    c.options.mode = parse_rnn_mode(w.at("cell").get<std::string>());
    c.options.input_size = w.at("input_size").get<int64_t>();
    c.options.hidden_size = w.at("hidden_size").get<int64_t>();
    c.options.num_layers = w.at("num_layers").get<int64_t>();
    c.options.bidirectional = w.value("bidirectional", false);
    c.lengths = w.at("lengths").get<std::vector<int64_t>>();
    cases.push_back(std::move(c));
  }
  return cases;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  std::string path;
  if (const char* env = std::getenv("SEQPACK_WORKLOADS")) path = env;
  if (path.empty()) path = std::string(SEQPACK_SOURCE_DIR) + "/bench/workloads.json";
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      threads = std::atoi(argv[i] + 10);
    } else if (std::strncmp(argv[i], "--workloads=", 12) == 0) {
      path = argv[i] + 12;
    } else {
      rest.push_back(argv[i]);
    }
  }
  (void)bench_policy();  // the SEQPACK_* variables, checked before any benchmark
  seqpack::set_num_threads(threads);
  static std::vector<Case> cases;
  try {
    cases = load(path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_kernels: %s\n", e.what());
    return 1;
  }
  for (const Case& c : cases) {
    for (const char* mode : {"forward_packed", "forward_padded", "train_packed"}) {
      benchmark::RegisterBenchmark((c.name + "/" + mode).c_str(),
                                   [&c, m = std::string(mode)](benchmark::State& s) {
                                     run_case(s, c, m);
                                   })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
  }
  for (const char* kernel : {"lstm_forward", "lstm_backward", "lstm_backward_dbias", "gru_forward",
                             "gru_backward", "gru_backward_dbias", "rnn_tanh_forward"}) {
    benchmark::RegisterBenchmark((std::string("gates/") + kernel).c_str(),
                                 [k = std::string(kernel)](benchmark::State& s) {
                                   run_gate_kernel(s, k);
                                 })
        ->ArgNames({"n", "H"})
        ->Args({128, 128})
        ->Args({32, 512})
        ->Unit(benchmark::kMicrosecond);
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 1;
  benchmark::AddCustomContext("seqpack_threads", std::to_string(threads));
  benchmark::AddCustomContext("workloads", path);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
