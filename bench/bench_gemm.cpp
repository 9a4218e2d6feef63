// sgemm rate of this machine through seqpack's one GEMM entry point
// (src/cpu/gemm.h, OpenBLAS), as FLOP/s rate counters.
//
//   build/bench/bench_gemm [--threads=N] [--benchmark_filter=...] [google benchmark flags]
//
// BM_sgemm_peak is the machine's reference rate (a large square product, what the
// "fraction of sgemm rate" figures of docs/performance.md divide by). The other
// shapes are the ones the recurrent layers issue: the input projection over all
// packed rows (X[rows, I] * W_ih^T) and the per-step product of the live rows
// with W_hh (h[live, H] * W_hh^T).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/gemm.h"
#include "seqpack/threading.h"

namespace {

// C[m, n] = A[m, k] * B[n, k]^T: the layout of every RNN product (weights are [out, in]).
void run_sgemm(benchmark::State& state, int64_t m, int64_t n, int64_t k) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(n * k)),
      c(static_cast<size_t>(m * n));
  for (auto& x : a) x = u(rng);
  for (auto& x : b) x = u(rng);
  for (auto _ : state) {
    seqpack::cpu::gemm<float>(/*trans_a=*/false, /*trans_b=*/true, m, n, k, 1.f, a.data(), k,
                              b.data(), k, 0.f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["FLOPS"] = benchmark::Counter(
      2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k),
      benchmark::Counter::kIsIterationInvariantRate);
}

void BM_sgemm_peak(benchmark::State& state) {
  run_sgemm(state, state.range(0), state.range(0), state.range(0));
}
BENCHMARK(BM_sgemm_peak)->Arg(1024)->Unit(benchmark::kMillisecond);

// Args: m (rows), n (output features = gates * H), k (input features).
void BM_sgemm_rnn(benchmark::State& state) {
  run_sgemm(state, state.range(0), state.range(1), state.range(2));
}
BENCHMARK(BM_sgemm_rnn)
    ->ArgNames({"m", "n", "k"})
    // lstm-bi-2layer (H = 512): input projections of layers 0 and 1, per-step W_hh product.
    ->Args({881, 2048, 256})
    ->Args({881, 2048, 1024})
    ->Args({32, 2048, 512})
    ->Args({8, 2048, 512})
    // lstm-sentences (I = 128, H = 256): input projection, per-step product.
    ->Args({1316, 1024, 128})
    ->Args({64, 1024, 256})
    // gru-chars (I = 64, H = 128): input projection, per-step product.
    ->Args({2854, 384, 64})
    ->Args({256, 384, 128})
    // lstm-long-seq (I = 64, H = 128): per-step product of a few live rows.
    ->Args({32, 512, 128})
    ->Args({4, 512, 128})
    ->Unit(benchmark::kMicrosecond);

}  // namespace

// Google Benchmark's main, plus --threads=N (default 1: the single-core rate).
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
  seqpack::set_num_threads(threads);
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 1;
  benchmark::AddCustomContext("seqpack_threads", std::to_string(threads));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
