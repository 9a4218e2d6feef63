// Streaming throughput: 64 concurrent streams fed through StreamingRNN in
// chunks of 1, 8 and 64 steps (every push carries one chunk of each stream),
// against one whole-sequence forward of the same 64 sequences, in tokens/s.
// Also the same chunked schedule through rnn_forward directly, carrying h/c by
// hand, to show what StreamingRNN's bookkeeping (gather, scatter, state
// copies) costs on top of the recurrence itself.
//
//   build/bench/bench_streaming [--threads=N] [google benchmark flags]
//
// Cases: streaming/<model>/chunk:<c>, chunked_rnn_forward/<model>/chunk:<c>,
// whole/<model>. Models: lstm (128 -> 256, the shape of the lstm-sentences
// workload) and gru (64 -> 128, gru-chars), one layer, float32. Every stream
// is 512 steps long, so each case runs the same 64 x 512 tokens.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "seqpack/packed_sequence.h"
#include "seqpack/policy.h"
#include "seqpack/rnn.h"
#include "seqpack/streaming.h"
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

constexpr int64_t kStreams = 64;
constexpr int64_t kSteps = 512;

struct Model {
  std::string name;
  RNNOptions options;
};

const std::vector<Model>& models() {
  static const std::vector<Model> all = {
      {"lstm", {.mode = RNNMode::lstm, .input_size = 128, .hidden_size = 256}},
      {"gru", {.mode = RNNMode::gru, .input_size = 64, .hidden_size = 128}},
  };
  return all;
}

Tensor uniform(const Shape& shape, std::mt19937_64& rng) {
  Tensor t = Tensor::empty(shape);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

// The 64 input sequences, [kSteps, input_size] each.
std::vector<Tensor> inputs(const RNNOptions& o) {
  std::mt19937_64 rng(7);
  std::vector<Tensor> seqs;
  for (int64_t s = 0; s < kStreams; ++s) seqs.push_back(uniform({kSteps, o.input_size}, rng));
  return seqs;
}

void set_tokens(benchmark::State& state) {
  state.counters["tokens/s"] = benchmark::Counter(
      static_cast<double>(kStreams * kSteps) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
}

void bm_streaming(benchmark::State& state, const Model& m, int64_t chunk) {
  RNNBase model(m.options, 0);
  model.set_config(rnn_config(bench_policy()));  // the SEQPACK_* variables'
  const auto seqs = inputs(m.options);
  // The chunks are views made outside the timed region, as a server receives them.
  std::vector<std::vector<Tensor>> chunks(static_cast<size_t>(kSteps / chunk));
  for (int64_t k = 0; k < kSteps / chunk; ++k) {
    for (const auto& s : seqs)
      chunks[static_cast<size_t>(k)].push_back(s.slice0(k * chunk, (k + 1) * chunk));
  }
  for (auto _ : state) {
    StreamingRNN streams(model);
    std::vector<int64_t> ids;
    for (int64_t s = 0; s < kStreams; ++s) ids.push_back(streams.open());
    for (const auto& push : chunks) benchmark::DoNotOptimize(streams.push(ids, push));
  }
  set_tokens(state);
}

// The same schedule through rnn_forward, with h0/c0 carried by hand: one
// [kStreams, chunk] packed batch per push (all chunks equal, so the packed rows
// are the time-major rows) and the previous push's h_n/c_n as h0/c0.
void bm_chunked_forward(benchmark::State& state, const Model& m, int64_t chunk) {
  RNNBase model(m.options, 0);
  model.set_config(rnn_config(bench_policy()));  // the SEQPACK_* variables'
  const auto seqs = inputs(m.options);
  const RNNOptions& o = m.options;
  const PackingPlan plan = PackingPlan::from_lengths(std::vector<int64_t>(kStreams, chunk), true);
  std::vector<Tensor> packed;
  for (int64_t k = 0; k < kSteps / chunk; ++k) {
    Tensor p = Tensor::empty({kStreams * chunk, o.input_size});
    for (int64_t t = 0; t < chunk; ++t) {
      for (int64_t s = 0; s < kStreams; ++s) {
        std::memcpy(p.data<float>() + (t * kStreams + s) * o.input_size,
                    seqs[static_cast<size_t>(s)].data<float>() + (k * chunk + t) * o.input_size,
                    sizeof(float) * static_cast<size_t>(o.input_size));
      }
    }
    packed.push_back(p);
  }
  for (auto _ : state) {
    Tensor h, c;
    for (const auto& p : packed) {
      RNNForwardResult y =
          rnn_forward(*rnn_make_plan(o, model.parameters(), /*in_place=*/true, model.config()), p,
                      plan, h, c, false, false);
      h = y.h_n;
      c = y.c_n;
    }
    benchmark::DoNotOptimize(h.raw_data());
  }
  set_tokens(state);
}

void bm_whole(benchmark::State& state, const Model& m) {
  RNNBase model(m.options, 0);
  model.set_config(rnn_config(bench_policy()));  // the SEQPACK_* variables'
  const auto seqs = inputs(m.options);
  const PackedSequence x = pack_sequence(seqs, /*enforce_sorted=*/true);
  const PackingPlan plan = PackingPlan::from_packed(x);
  for (auto _ : state) {
    benchmark::DoNotOptimize(rnn_forward(*rnn_make_plan(m.options, model.parameters(),
                                                        /*in_place=*/true, model.config()),
                                         x.data, plan, {}, {}, false, false)
                                 .output.raw_data());
  }
  set_tokens(state);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      threads = std::atoi(argv[i] + 10);
    } else {
      rest.push_back(argv[i]);
    }
  }
  (void)bench_policy();  // the SEQPACK_* variables, checked before any benchmark
  set_num_threads(threads);
  for (const Model& m : models()) {
    for (int64_t chunk : {1, 8, 64}) {
      benchmark::RegisterBenchmark(
          ("streaming/" + m.name + "/chunk:" + std::to_string(chunk)).c_str(),
          [&m, chunk](benchmark::State& s) { bm_streaming(s, m, chunk); })
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(
          ("chunked_rnn_forward/" + m.name + "/chunk:" + std::to_string(chunk)).c_str(),
          [&m, chunk](benchmark::State& s) { bm_chunked_forward(s, m, chunk); })
          ->Unit(benchmark::kMillisecond);
    }
    benchmark::RegisterBenchmark(("whole/" + m.name).c_str(), [&m](benchmark::State& s) {
      bm_whole(s, m);
    })->Unit(benchmark::kMillisecond);
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
