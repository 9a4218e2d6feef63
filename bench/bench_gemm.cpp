// sgemm rate of this machine through seqpack's one GEMM entry point
// (src/cpu/gemm.h, OpenBLAS), as FLOP/s rate counters.
//
//   build/bench/bench_gemm [--threads=N] [--benchmark_filter=...] [google benchmark flags]
//
// BM_sgemm_peak is the machine's reference rate (a large square product, what the
// "fraction of sgemm rate" figures of docs/performance.md divide by). The other
// shapes are the ones the recurrent layers issue: the input projection over all
// packed rows (X[rows, I] * W_ih^T) and the per-step product of the live rows
// with W_hh (h[live, H] * W_hh^T). The int8 engine has its own: BM_int8_peak (the
// core's vpdpbusd rate) and BM_int8_gemm (its products at the workloads' shapes),
// both as OPS rate counters (2 per multiply-add, like FLOPS).
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cpu/bf16_blocked.h"
#include "cpu/gemm.h"
#include "cpu/gemm_bf16_rows.h"
#include "cpu/gemm_engine.h"
#include "cpu/gemm_int8.h"
#include "seqpack/cpu_info.h"
#include "seqpack/policy.h"
#include "seqpack/precision.h"
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
                              b.data(), k, 0.f, c.data(), n, bench_kernels().isa_cap);
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

// The core's arithmetic peak: kChains independent multiply-add chains held in
// registers (no memory traffic), 512-bit where the CPU has AVX-512, else 256-bit
// FMA. BM_fma_peak/0 is fp32 FMA, BM_fma_peak/1 bf16 dot products (vdpbf16ps,
// 2 multiply-adds per fp32 lane; skipped without AVX512-BF16). No GEMM on this
// core can run faster, so compare_torch.py divides by it for the hard ceilings.
constexpr int kChains = 12;

__attribute__((target("avx512f"))) float fma_chains_avx512(int64_t iters) {
  __m512 acc[kChains];
  for (auto& a : acc) a = _mm512_setzero_ps();
  __m512 x = _mm512_set1_ps(1e-7f);
  const __m512 y = _mm512_set1_ps(1.0001f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(x, y, acc[c]);
    __asm__ volatile("" : "+v"(x));  // opaque: the chains cannot be folded into one product
  }
  float sum = 0;
  for (auto& a : acc) sum += _mm512_reduce_add_ps(a);
  return sum;
}

__attribute__((target("avx2,fma"))) float fma_chains_avx2(int64_t iters) {
  __m256 acc[kChains];
  for (auto& a : acc) a = _mm256_setzero_ps();
  __m256 x = _mm256_set1_ps(1e-7f);
  const __m256 y = _mm256_set1_ps(1.0001f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(x, y, acc[c]);
    __asm__ volatile("" : "+v"(x));  // opaque: the chains cannot be folded into one product
  }
  alignas(32) float lanes[8];
  float sum = 0;
  for (auto& a : acc) {
    _mm256_store_ps(lanes, a);
    for (float v : lanes) sum += v;
  }
  return sum;
}

__attribute__((target("avx512f,avx512bf16"))) float dpbf16_chains(int64_t iters) {
  __m512 acc[kChains];
  for (auto& a : acc) a = _mm512_setzero_ps();
  __m512bh x = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80));  // 1.0
  const __m512bh y = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3380));  // 2^-24
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], x, y);
    __asm__ volatile("" : "+v"(x));  // opaque: the chains cannot be folded into one product
  }
  float sum = 0;
  for (auto& a : acc) sum += _mm512_reduce_add_ps(a);
  return sum;
}

void BM_fma_peak(benchmark::State& state) {
  const bool bf16 = state.range(0) == 1;
  const bool avx512 = __builtin_cpu_supports("avx512f");
  if (bf16 && !(avx512 && __builtin_cpu_supports("avx512bf16"))) {
    state.SkipWithError("no AVX512-BF16 on this CPU");
    return;
  }
  constexpr int64_t kIters = 1 << 16;
  for (auto _ : state) {
    float r = bf16 ? dpbf16_chains(kIters)
                   : (avx512 ? fma_chains_avx512(kIters) : fma_chains_avx2(kIters));
    benchmark::DoNotOptimize(r);
  }
  // FLOPs (2 per multiply-add) per call: chains x lanes x multiply-adds per lane.
  const double lanes = avx512 ? 16 : 8, per_lane = bf16 ? 2 : 1;
  state.counters["FLOPS"] = benchmark::Counter(2.0 * kChains * lanes * per_lane * kIters,
                                               benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_fma_peak)->ArgNames({"bf16"})->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

// The core's int8 peak: kChains independent vpdpbusd chains (AVX512-VNNI: per
// int32 lane, 4 u8·s8 products added to the accumulator) in registers, the
// instruction the int8 engine's kernel (src/cpu/gemm_int8_avx512vnni.cpp) runs.
// Counter OPS: int8 operations per second, 2 per multiply-add (as FLOPS counts
// fp32's), so an int8 product's 2·m·n·k over its time divides by it directly.
__attribute__((target("avx512f,avx512vnni"))) int32_t dpbusd_chains(int64_t iters) {
  __m512i acc[kChains];
  for (auto& a : acc) a = _mm512_setzero_si512();
  __m512i x = _mm512_set1_epi8(1);        // u8 operand
  const __m512i y = _mm512_set1_epi8(1);  // s8 operand
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbusd_epi32(acc[c], x, y);
    __asm__ volatile("" : "+v"(x));  // opaque: the chains cannot be folded into one product
  }
  __m512i sum = _mm512_setzero_si512();
  for (auto& a : acc) sum = _mm512_add_epi32(sum, a);
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, sum);
  int32_t total = 0;
  for (int32_t v : lanes) total += v;
  return total;
}

void BM_int8_peak(benchmark::State& state) {
  if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni"))) {
    state.SkipWithError("no AVX512-VNNI on this CPU");
    return;
  }
  constexpr int64_t kIters = 1 << 16;
  for (auto _ : state) {
    int32_t r = dpbusd_chains(kIters);
    benchmark::DoNotOptimize(r);
  }
  // Per call: chains x 16 int32 lanes x 4 multiply-adds per lane, 2 ops each.
  state.counters["OPS"] = benchmark::Counter(2.0 * kChains * 16 * 4 * kIters,
                                             benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_int8_peak)->Unit(benchmark::kMicrosecond);

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

// m = 1 is what a per-step product degenerates to once only one sequence is still
// live (lstm-long-tail: 475 of its 500 steps). sgemm packs all of W (n x k) on every
// call whatever m is; sgemv streams W once. Args: n, k.
void BM_sgemm_m1(benchmark::State& state) { run_sgemm(state, 1, state.range(0), state.range(1)); }
void BM_sgemv(benchmark::State& state) {
  const int64_t n = state.range(0), k = state.range(1);
  std::vector<float> w(static_cast<size_t>(n * k), 0.5f), x(static_cast<size_t>(k), 1.f),
      y(static_cast<size_t>(n));
  for (auto _ : state) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), static_cast<int>(k), 1.f,
                w.data(), static_cast<int>(k), x.data(), 1, 0.f, y.data(), 1);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.counters["FLOPS"] = benchmark::Counter(2.0 * static_cast<double>(n * k),
                                               benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_sgemm_m1)->ArgNames({"n", "k"})->Args({2048, 512})->Args({512, 128})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_sgemv)->ArgNames({"n", "k"})->Args({2048, 512})->Args({512, 128})->Unit(benchmark::kMicrosecond);

// A product of a few rows by weights as stored, C = A·Wᵀ + bias (a call of
// one step's input projection; trans 1) or C = A·W + bias (its input
// gradient, dG·W_ih; trans 0): oneDNN's f32 matmul, the kernel the fp32
// engine runs at up to kDotRowsEngine rows (gemm_dot_rows), and the few-row
// kernel of a step read in place (gemm_unpacked_small, no bias). Args: n, k,
// rows, kernel (0 = oneDNN, 1 = gemm_dot_rows, 2 = gemm_unpacked_small),
// trans.
void BM_dot_rows(benchmark::State& state) {
  const int64_t n = state.range(0), k = state.range(1), m = state.range(2);
  const int64_t kernel = state.range(3);
  const bool trans = state.range(4) != 0;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> a(static_cast<size_t>(m * k)), w(static_cast<size_t>(n * k)),
      c(static_cast<size_t>(m * n)), bias(static_cast<size_t>(n));
  for (auto& x : a) x = u(rng);
  for (auto& x : w) x = u(rng);
  for (auto& x : bias) x = u(rng);
  for (auto _ : state) {
    if (kernel == 0) {
      seqpack::cpu::onednn_gemm_f32(false, trans, m, n, k, a.data(), k, w.data(), trans ? k : n,
                                    0.f, c.data(), n, bias.data());
    } else if (kernel == 1) {
      seqpack::cpu::gemm_dot_rows(bench_kernels().isa_cap, m, n, k, a.data(), k, w.data(), trans,
                                  trans ? k : n, 0.f, c.data(), n, bias.data());
    } else {
      seqpack::cpu::gemm_unpacked_small(bench_kernels().isa_cap, m, a.data(), k, w.data(), trans, k,
                                        n, trans ? k : n, 0, n, 0.f, c.data(), n);
    }
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["FLOPS"] = benchmark::Counter(2.0 * static_cast<double>(m * n * k),
                                               benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_dot_rows)
    ->ArgNames({"n", "k", "rows", "kernel", "trans"})
    ->ArgsProduct({{512, 2048}, {128, 512}, {1, 2, 4}, {0, 1, 2}, {1}})
    ->ArgsProduct({{128, 512}, {512, 2048}, {1, 2}, {0, 1, 2}, {0}})
    ->Unit(benchmark::kMicrosecond);

// The per-step recurrent product side by side: sgemm (OpenBLAS, which packs W
// on every call) against cpu::gemm_packed_small on W packed once (outside the
// timing, as rnn_core packs once per layer and direction), each shape at the
// same n one right after the other. Forward shapes C[n, G] += h[n, R] · W_hhᵀ
// (K = R, N = G, beta 1); backward dh[n, R] = dG[n, G] · W_hh (K = G, N = R,
// beta 0). Args: k, n (output columns), rows, packed (0 = sgemm, 1 = packed,
// 2 = W read in place: cpu::gemm_unpacked_small, a call of one step).
void BM_step(benchmark::State& state) {
  const int64_t k = state.range(0), n = state.range(1), rows = state.range(2);
  const int64_t packed = state.range(3);
  // The forward shapes have N > K (N = gates * K), the backward ones K > N.
  const bool forward = n >= k;
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> a(static_cast<size_t>(rows * k)), w(static_cast<size_t>(n * k)),
      c(static_cast<size_t>(rows * n));
  for (auto& x : a) x = u(rng);
  for (auto& x : w) x = u(rng);
  for (auto& x : c) x = u(rng);
  const float beta = forward ? 1.f : 0.f;
  // W is W_hh [G, R]: forward multiplies by its transpose ([N, K] storage),
  // backward by W_hh itself ([K, N] storage).
  seqpack::cpu::PackedWeights pw;
  seqpack::cpu::pack_weights(w.data(), /*trans_b=*/forward, k, n, forward ? k : n, pw,
                             bench_kernels().isa_cap);
  for (auto _ : state) {
    if (packed == 1) {
      seqpack::cpu::gemm_packed_small(rows, a.data(), k, pw, 0, n, beta, c.data(), n);
    } else if (packed == 2) {
      seqpack::cpu::gemm_unpacked_small(bench_kernels().isa_cap, rows, a.data(), k, w.data(),
                                        /*trans_b=*/forward, k, n, forward ? k : n, 0, n, beta,
                                        c.data(), n);
    } else {
      seqpack::cpu::gemm<float>(/*trans_a=*/false, /*trans_b=*/forward, rows, n, k, 1.f, a.data(),
                                k, w.data(), forward ? k : n, beta, c.data(), n,
                                bench_kernels().isa_cap);
    }
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["FLOPS"] = benchmark::Counter(
      2.0 * static_cast<double>(rows) * static_cast<double>(n) * static_cast<double>(k),
      benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_step)
    ->ArgNames({"k", "n", "rows", "packed"})
    ->Apply([](benchmark::internal::Benchmark* b) {
      // (K, N): LSTM H = 128 (the training job), GRU H = 128 (gru-chars),
      // LSTM H = 256 (lstm-sentences), LSTM H = 512 (lstm-bi-2layer,
      // lstm-long-tail), RNN H = 64 (rnn-tanh-tiny); forward then backward.
      const int64_t shapes[][2] = {{128, 512},  {512, 128},  {128, 384}, {384, 128},
                                   {256, 1024}, {1024, 256}, {512, 2048}, {2048, 512},
                                   {64, 64}};
      for (const auto& s : shapes) {
        for (int64_t rows : {1, 2, 3, 4, 5, 7, 8, 16, 32, 64, 128, 256}) {
          b->Args({s[0], s[1], rows, 0});
          b->Args({s[0], s[1], rows, 1});
        }
      }
      // The input side over a whole batch (every packed row): the input
      // projection X·W_ihᵀ (K = I, N = G) and dX = dG·W_ih (K = G, N = I) of
      // gru-chars, lstm-sentences, lstm-bi-2layer (layers 0 and 1) and
      // rnn-tanh-tiny, rows = the workload's tokens.
      const int64_t whole[][3] = {{64, 384, 2854},  {384, 64, 2854},  {128, 1024, 1316},
                                  {1024, 128, 1316}, {256, 2048, 881}, {2048, 256, 881},
                                  {1024, 2048, 881}, {2048, 1024, 881}, {32, 64, 690},
                                  {64, 32, 690}};
      for (const auto& s : whole) {
        b->Args({s[0], s[1], s[2], 0});
        b->Args({s[0], s[1], s[2], 1});
      }
      // One decoder step of GRU(500) and LSTM(500) (bench/step_vs_torch.py),
      // forward and backward, batch 1 and 64, W in place too.
      const int64_t decoder[][2] = {{500, 1500}, {1500, 500}, {500, 2000}, {2000, 500}};
      for (const auto& s : decoder)
        for (int64_t rows : {1, 64})
          for (int64_t how : {0, 1, 2}) b->Args({s[0], s[1], rows, how});
    })
    ->Unit(benchmark::kMicrosecond);

// n values uniform in [-1, 1], from a fixed seed per call site.
std::vector<float> random_floats(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(rng);
  return v;
}

// The FLOPS rate counter of an m x n x k product per iteration.
void set_product_rate(benchmark::State& state, int64_t m, int64_t n, int64_t k) {
  state.counters["FLOPS"] = benchmark::Counter(
      2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k),
      benchmark::Counter::kIsIterationInvariantRate);
}

// The whole-batch products (input projection X·W_ihᵀ, dX = dG·W_ih, dW = dGᵀ·X)
// through the three ways seqpack can run them: OpenBLAS's sgemm (cpu::gemm),
// oneDNN's f32 matmul (the f32 engine's choice) and the bf16 engine (bf16
// operands converted per call, fp32 accumulation; skipped without native bf16).
// Args: m, n, k, trans_a, trans_b, engine (0 sgemm, 1 oneDNN f32, 2 oneDNN bf16).
void BM_batch(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const bool ta = state.range(3) != 0, tb = state.range(4) != 0;
  const int64_t engine = state.range(5);
  if (engine == 2 && !seqpack::cpu_info(bench_policy()).native_bf16) {
    state.SkipWithError("no native bf16 on this CPU");
    return;
  }
  std::mt19937 rng(42);
  const std::vector<float> a = random_floats(m * k, rng), b = random_floats(k * n, rng);
  std::vector<float> c(static_cast<size_t>(m * n));
  const int64_t lda = ta ? m : k, ldb = tb ? k : n;
  const auto& bf16 = engine == 2
                         ? seqpack::cpu::gemm_engine_f32(seqpack::Precision::bf16, bench_kernels())
                         : seqpack::cpu::gemm_engine_f32(seqpack::Precision::fp32, bench_kernels());
  for (auto _ : state) {
    if (engine == 0) {
      seqpack::cpu::gemm<float>(ta, tb, m, n, k, 1.f, a.data(), lda, b.data(), ldb, 0.f, c.data(),
                                n, bench_kernels().isa_cap);
    } else if (engine == 1) {
      seqpack::cpu::onednn_gemm_f32(ta, tb, m, n, k, a.data(), lda, b.data(), ldb, 0.f, c.data(), n,
                                    nullptr);
    } else {
      bf16.gemm({.m = m,
                 .n = n,
                 .k = k,
                 .a = {.data = a.data(), .ld = lda, .trans = ta},
                 .b = {.data = b.data(), .ld = ldb, .trans = tb},
                 .c = c.data(),
                 .ldc = n});
    }
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_product_rate(state, m, n, k);
}
BENCHMARK(BM_batch)
    ->ArgNames({"m", "n", "k", "ta", "tb", "engine"})
    ->Apply([](benchmark::internal::Benchmark* b) {
      // gru-chars (H 128, I 64, 2854 tokens), lstm-sentences (H 256, I 128,
      // 1316 tokens), lstm-bi-2layer layer 1 (H 512, I 1024, 881 tokens):
      // input projection, dX, dW_ih, dW_hh.
      const int64_t shapes[][5] = {{2854, 384, 64, 0, 1},
                                   {2854, 64, 384, 0, 0},
                                   {384, 64, 2854, 1, 0},
                                   {384, 128, 2854, 1, 0},
                                   {1316, 1024, 128, 0, 1},
                                   {1316, 128, 1024, 0, 0},
                                   {1024, 128, 1316, 1, 0},
                                   {1024, 256, 1316, 1, 0},
                                   {881, 2048, 1024, 0, 1},
                                   {881, 1024, 2048, 0, 0},
                                   {2048, 1024, 881, 1, 0},
                                   {2048, 512, 881, 1, 0},
                                   // One decoder step at batch 64: GRU(500)'s and LSTM(500)'s input
                                   // projections (bench/step_vs_torch.py).
                                   {64, 1500, 500, 0, 1},
                                   {64, 2000, 500, 0, 1},
                                   // The weight gradients of one step of an RNN(1024) at batch 1 to
                                   // 64 (dW = dGᵀ·X, k the batch): C written, hardly multiplied.
                                   {1024, 1024, 1, 1, 0},
                                   {1024, 1024, 4, 1, 0},
                                   {1024, 1024, 8, 1, 0},
                                   {1024, 1024, 16, 1, 0},
                                   {1024, 1024, 32, 1, 0},
                                   {1024, 1024, 64, 1, 0},
                                   // LSTM(500)'s dW_ih of one step at batch 1 (n = 500: a tail).
                                   {2000, 500, 1, 1, 0}};
      for (const auto& s : shapes)
        for (int64_t e : {0, 1, 2}) b->Args({s[0], s[1], s[2], s[3], s[4], e});
    })
    ->Unit(benchmark::kMicrosecond);

// A step's product of `rows` live rows with W laid out once, through the f32
// engine (cpu::gemm_packed_small), the bf16 engine (oneDNN, blocked bf16
// weights) and the int8 engine (rows quantized per call, s8 weights
// quantized once, vpdpbusd). Args: k, n, rows, engine (1 f32, 2 bf16,
// 3 int8); forward shapes (beta 1).
void BM_engine_step(benchmark::State& state) {
  const int64_t k = state.range(0), n = state.range(1), rows = state.range(2);
  const int64_t engine = state.range(3);
  if (engine == 2 && !seqpack::cpu_info(bench_policy()).native_bf16) {
    state.SkipWithError("no native bf16 on this CPU");
    return;
  }
  const auto& eng = seqpack::cpu::gemm_engine_f32(engine == 3   ? seqpack::Precision::int8
                                                  : engine == 2 ? seqpack::Precision::bf16
                                                                : seqpack::Precision::fp32,
                                                  bench_kernels());
  std::mt19937 rng(42);
  const std::vector<float> a = random_floats(rows * k, rng), w = random_floats(n * k, rng);
  std::vector<float> c(static_cast<size_t>(rows * n));
  const auto op = eng.prepare(w.data(), /*trans_b=*/true, k, n, k, {{0, n}});
  for (auto _ : state) {
    eng.step(rows, a.data(), k, *op, 0, 1.f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_product_rate(state, rows, n, k);
}
BENCHMARK(BM_engine_step)
    ->ArgNames({"k", "n", "rows", "engine"})
    ->Apply([](benchmark::internal::Benchmark* b) {
      const int64_t shapes[][2] = {{128, 512}, {128, 384}, {256, 1024}, {512, 2048}, {64, 64}};
      for (const auto& s : shapes)
        for (int64_t rows : {1, 4, 16, 32, 64, 128, 256})
          for (int64_t e : {1, 2, 3}) b->Args({s[0], s[1], rows, e});
    })
    ->Unit(benchmark::kMicrosecond);

// A bf16 product of m rows by fp32 weights W (op(B) = Wᵀ, W [n, k], the
// forward's; or W [k, n], the backward's dX) as a call that meets its
// weights first runs it: way 0 reads W in place, rounding as it reads
// (cpu::bf16_rows_product, blocks of k as oneDNN 2.6's), way 1 lays W out
// (GemmEngine::prepare) and runs oneDNN's kernel on the layout, way 2 runs
// oneDNN's kernel on a layout made once (the floor).
void BM_bf16_in_place(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  const bool trans = state.range(3) != 0;
  const int64_t way = state.range(4);
  if (!seqpack::cpu::bf16_rows_available(bench_kernels())) {
    state.SkipWithError("no native AVX512-BF16 without AMX here");
    return;
  }
  std::mt19937 rng(42);
  const std::vector<float> a = random_floats(m * k, rng), w = random_floats(n * k, rng);
  std::vector<float> c(static_cast<size_t>(m * n));
  const int64_t ldw = trans ? k : n;
  const auto& eng = seqpack::cpu::gemm_engine_f32(seqpack::Precision::bf16, bench_kernels());
  seqpack::cpu::GrowBuffer<uint16_t> a16;
  const auto once = eng.prepare(w.data(), trans, k, n, ldw, {{0, n}});
  const seqpack::cpu::Bf16RowsB b{
      .k = k, .n = n, .k_block = k > 1024 ? 1024 : 512, .w = w.data(), .ld = ldw, .trans = trans};
  for (auto _ : state) {
    if (way == 0) {
      const uint16_t* rows = seqpack::cpu::bf16_rows_operand(m, k, a.data(), k, nullptr, a16);
      seqpack::cpu::bf16_rows_product(m, rows, b, 0, n, 0.f, c.data(), n);
    } else if (way == 1) {
      const auto op = eng.prepare(w.data(), trans, k, n, ldw, {{0, n}});
      eng.step(m, a.data(), k, *op, 0, 0.f, c.data(), n);
    } else {
      eng.step(m, a.data(), k, *once, 0, 0.f, c.data(), n);
    }
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_product_rate(state, m, n, k);
}
BENCHMARK(BM_bf16_in_place)
    ->ArgNames({"m", "k", "n", "trans", "way"})
    ->Apply([](benchmark::internal::Benchmark* b) {
      // LSTM(500)'s and GRU(500)'s input projection and dX at batch 8 and 64.
      const int64_t shapes[][3] = {{500, 2000, 1}, {2000, 500, 0}, {500, 1500, 1}, {1500, 500, 0}};
      for (int64_t m : {8, 64})
        for (const auto& s : shapes)
          for (int64_t way : {0, 1, 2}) b->Args({m, s[0], s[1], s[2], way});
    })
    ->Unit(benchmark::kMicrosecond);

// Weights [rows, cols] (W_hh and W_ih as stored: [gates·H, H]) laid out for
// bf16 products in oneDNN's BA16a64b2a, as a training loop does after every
// optimiser step (cpu/bf16_blocked.h): way 0 rounds them into a plain bf16
// copy (f32_to_bf16: the same bytes read and written, the floor), 1 writes
// the layout of op(W) = Wᵀ (the forward's), 2 of op(W) = W (the
// backward's), 3 Wᵀ's by the plain loops. Counter bytes_per_second: fp32
// read plus bf16 written.
void BM_bf16_layout(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1), way = state.range(2);
  std::mt19937 rng(42);
  const std::vector<float> w = random_floats(rows * cols, rng);
  const bool trans = way != 2;
  const int64_t k = trans ? cols : rows, n = trans ? rows : cols;
  const int64_t tiles_k = (k + 31) / 32, tiles_n = (n + 63) / 64;
  const seqpack::cpu::PairBlocking blocking{
      .n_block = 64, .tile_k_stride = 32 * 64, .tile_n_stride = tiles_k * 32 * 64};
  std::vector<uint16_t> out(static_cast<size_t>(tiles_k * tiles_n * 32 * 64));
  for (auto _ : state) {
    if (way == 0) {
      seqpack::cpu::f32_to_bf16(w.data(), out.data(), rows * cols);
    } else if (way == 3) {
      seqpack::cpu::write_pair_blocked_bf16_reference(w.data(), trans, cols, k, n, blocking,
                                                      out.data());
    } else {
      seqpack::cpu::write_pair_blocked_bf16(w.data(), trans, cols, k, n, blocking, out.data());
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * rows * cols * 6);
}
BENCHMARK(BM_bf16_layout)
    ->ArgNames({"rows", "cols", "way"})
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (const auto& [r, c] : {std::pair<int64_t, int64_t>{2000, 500}, {4096, 1024}})
        for (int64_t way : {0, 1, 2, 3}) b->Args({r, c, way});
    })
    ->Unit(benchmark::kMicrosecond);

// The int8 engine's product (src/cpu/gemm_int8.h) at the workloads' shapes:
// W [n, k] quantized once (quantize_weights_s8, as the model plan does per
// model), then per call the rows quantized (quantize_rows_u8, quant:1, as the
// engine does for every product) or not (quant:0: the kernel alone on rows
// quantized once), and gemm_u8s8_f32 over all n columns. Counter OPS: 2·m·n·k
// per second, to set against BM_int8_peak's OPS. Args: k, n, rows, quant,
// beta (1: a step adding to the input projection's gates; 0: a whole batch).
void BM_int8_gemm(benchmark::State& state) {
  const int64_t k = state.range(0), n = state.range(1), rows = state.range(2);
  const bool quant = state.range(3) != 0;
  const float beta = static_cast<float>(state.range(4));
  std::mt19937 rng(42);
  const std::vector<float> a = random_floats(rows * k, rng), w = random_floats(n * k, rng);
  std::vector<float> c = random_floats(rows * n, rng);
  seqpack::cpu::QuantizedWeights qw;
  seqpack::cpu::quantize_weights_s8(w.data(), /*trans_b=*/true, k, n, k, qw,
                                    bench_kernels().isa_cap);
  const seqpack::cpu::Int8Kernel kernel = seqpack::cpu::int8_kernel(bench_kernels());
  seqpack::cpu::QuantizedRows qa;
  seqpack::cpu::quantize_rows_u8(rows, k, a.data(), k, qa, kernel);
  for (auto _ : state) {
    if (quant) seqpack::cpu::quantize_rows_u8(rows, k, a.data(), k, qa, kernel);
    seqpack::cpu::gemm_u8s8_f32(rows, qa, 0, qw, 0, n, beta, c.data(), n);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["OPS"] = benchmark::Counter(
      2.0 * static_cast<double>(rows) * static_cast<double>(n) * static_cast<double>(k),
      benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_int8_gemm)
    ->ArgNames({"k", "n", "rows", "quant", "beta"})
    ->Apply([](benchmark::internal::Benchmark* b) {
      // Steps (K = H, N = gates * H): LSTM H 128, GRU H 128, LSTM H 256,
      // LSTM H 512 (lstm-bi-2layer, lstm-long-tail), RNN H 64.
      const int64_t steps[][2] = {{128, 512}, {128, 384}, {256, 1024}, {512, 2048}, {64, 64}};
      for (const auto& s : steps)
        for (int64_t rows : {1, 4, 16, 32, 64, 128, 256})
          for (int64_t q : {0, 1}) b->Args({s[0], s[1], rows, q, 1});
      // Whole batches, the input projections X·W_ihᵀ over every token (K = I,
      // N = gates * H, rows = tokens): gru-chars, lstm-sentences,
      // lstm-bi-2layer layers 0 and 1 (per direction), lstm-long-tail,
      // rnn-tanh-tiny, lstm-long-seq.
      const int64_t whole[][3] = {{64, 384, 2854},  {128, 1024, 1316}, {256, 2048, 881},
                                  {1024, 2048, 881}, {512, 2048, 910},  {32, 64, 690},
                                  {64, 512, 13838}};
      for (const auto& s : whole)
        for (int64_t q : {0, 1}) b->Args({s[0], s[1], s[2], q, 0});
    })
    ->Unit(benchmark::kMicrosecond);

// The GEMMs of one workload's forward and backward, grouped by kind, with the shapes
// and call counts of the recurrent layers (see src/rnn/time_loop.h): what the GEMMs alone
// cost, to set against `seqpack bench`'s CPU time for the same workload. Kinds:
//   fwd_input   G = X * W_ih^T over all packed rows, per layer and direction
//   fwd_steps   per step t: gates[bs_t, G] += h[bs_t, H] * W_hh^T
//   fwd_steps_gemv4  the same, with steps of <= 4 live rows done as one sgemv per row
//   bwd_steps   per step t: dh[bs_t, H] = dG[bs_t, G] * W_hh
//   bwd_whole   dW_ih = dG^T X, dX += dG W_ih, dW_hh = dG^T H_prev over all packed rows
struct WorkloadShape {
  std::string name;
  int64_t input = 0, hidden = 0, layers = 1, dirs = 1, gates = 1;
  std::vector<int64_t> batch_sizes;
  int64_t rows = 0;
};

void run_kind(benchmark::State& state, const WorkloadShape& w, const std::string& kind) {
  const int64_t H = w.hidden, G = w.gates * H, N = w.rows;
  const int64_t widest = std::max({w.input, w.dirs * H, G});
  std::mt19937 rng(7);
  auto buf = [&](int64_t n) { return random_floats(n, rng); };
  std::vector<float> x = buf(N * widest), g = buf(N * G), wt = buf(G * widest), hp = buf(N * H),
                     dw = buf(G * widest), dx = buf(N * widest);
  double flops = 0;
  for (auto _ : state) {
    flops = 0;
    for (int64_t l = 0; l < w.layers; ++l) {
      const int64_t in = l == 0 ? w.input : w.dirs * H;
      for (int64_t d = 0; d < w.dirs; ++d) {
        if (kind == "fwd_input") {
          seqpack::cpu::gemm<float>(false, true, N, G, in, 1.f, x.data(), in, wt.data(), in, 1.f,
                                    g.data(), G, bench_kernels().isa_cap);
          flops += 2.0 * N * G * in;
        } else if (kind == "fwd_steps" || kind == "bwd_steps" || kind == "fwd_steps_gemv4") {
          int64_t r0 = 0;
          for (int64_t n : w.batch_sizes) {
            if (kind == "fwd_steps_gemv4" && n <= 4) {
              // The fix of docs/performance.md, finding 1: a step with few live rows does
              // one sgemv per row (W_hh streamed, never packed) instead of one sgemm.
              for (int64_t j = 0; j < n; ++j) {
                cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(G), static_cast<int>(H),
                            1.f, wt.data(), static_cast<int>(H), hp.data() + (r0 + j) * H, 1, 1.f,
                            g.data() + (r0 + j) * G, 1);
              }
            } else if (kind != "bwd_steps") {
              seqpack::cpu::gemm<float>(false, true, n, G, H, 1.f, hp.data() + r0 * H, H, wt.data(),
                                        H, 1.f, g.data() + r0 * G, G, bench_kernels().isa_cap);
            } else {
              seqpack::cpu::gemm<float>(false, false, n, H, G, 1.f, g.data() + r0 * G, G, wt.data(),
                                        H, 0.f, hp.data() + r0 * H, H, bench_kernels().isa_cap);
            }
            flops += 2.0 * n * G * H;
            r0 += n;
          }
        } else {  // bwd_whole
          seqpack::cpu::gemm<float>(true, false, G, in, N, 1.f, g.data(), G, x.data(), in, 0.f,
                                    dw.data(), in, bench_kernels().isa_cap);
          seqpack::cpu::gemm<float>(false, false, N, in, G, 1.f, g.data(), G, wt.data(), in, 1.f,
                                    dx.data(), in, bench_kernels().isa_cap);
          seqpack::cpu::gemm<float>(true, false, G, H, N, 1.f, g.data(), G, hp.data(), H, 0.f,
                                    dw.data(), H, bench_kernels().isa_cap);
          flops += 2.0 * G * N * (2 * in + H);
        }
      }
    }
    benchmark::ClobberMemory();
  }
  state.counters["FLOPS"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
}

// The GEMMs of a workload's mode (forward_packed, or train_packed: forward,
// then dh_prev per step, dW_ih, dX, dW_hh) with seqpack's shapes, row counts
// and zero-h0 skips, all through oneDNN at one precision (onednn_engine: the
// steps on weights laid out once, as seqpack lays them out once per call):
// oneDNN's own rate on exactly the products seqpack issues. compare_torch.py
// divides seqpack's achieved GEMM rate by it. int8 (forward_packed only) runs
// seqpack's own int8 engine instead (no oneDNN engine has its per-row
// scales): rows quantized per product, weights quantized once outside the
// timing (as the model's plan, rnn_make_plan, does per model). Counters: FLOPS (rate) and
// gemm_flop (FLOPs per batch).
void run_workload_gemms(benchmark::State& state, const WorkloadShape& w, bool train,
                        seqpack::Precision precision) {
  if (precision == seqpack::Precision::bf16 && !seqpack::cpu_info(bench_policy()).native_bf16) {
    state.SkipWithError("no native bf16 on this CPU");
    return;
  }
  const bool int8 = precision == seqpack::Precision::int8;
  const auto& eng = int8 ? seqpack::cpu::int8_engine(bench_kernels())
                         : seqpack::cpu::onednn_engine(precision, bench_kernels());
  const int64_t H = w.hidden, G = w.gates * H, N = w.rows, T = static_cast<int64_t>(w.batch_sizes.size());
  const int64_t widest = std::max({w.input, w.dirs * H, G});
  std::mt19937 rng(7);
  auto buf = [&](int64_t n) { return random_floats(n, rng); };
  std::vector<float> x = buf(N * widest), g = buf(N * G), wih = buf(G * widest), whh = buf(G * H),
                     hp = buf(N * H), dw = buf(G * widest), dx = buf(N * widest);
  // W_ih of each layer's input width laid out once (int8: quantized), as the
  // model's plan does; null for the engines that read weights as they are.
  const auto wih0 = eng.lay_out_weights(wih.data(), /*trans_b=*/true, w.input, G, w.input);
  const auto wih1 = eng.lay_out_weights(wih.data(), /*trans_b=*/true, w.dirs * H, G, w.dirs * H);
  const auto fwd_op = eng.prepare(whh.data(), /*trans_b=*/true, H, G, H, {{0, G}});
  const auto bwd_op =
      train ? eng.prepare(whh.data(), /*trans_b=*/false, G, H, H, {{0, H}}) : nullptr;
  // Rows of step t whose h_prev is not the zero h0 (rows_after_h0, src/rnn/grid.h).
  auto live = [&](int64_t t, int64_t d) -> int64_t {
    if (d == 0) return t == 0 ? 0 : w.batch_sizes[static_cast<size_t>(t)];
    return t + 1 < T ? w.batch_sizes[static_cast<size_t>(t + 1)] : 0;
  };
  double flops = 0;
  for (auto _ : state) {
    flops = 0;
    for (int64_t l = 0; l < w.layers; ++l) {
      const int64_t in = l == 0 ? w.input : w.dirs * H;
      for (int64_t d = 0; d < w.dirs; ++d) {
        eng.gemm({.m = N,
                  .n = G,
                  .k = in,
                  .a = {.data = x.data(), .ld = in},
                  .b = {.data = wih.data(),
                        .ld = in,
                        .trans = true,
                        .laid_out = l == 0 ? wih0.get() : wih1.get()},
                  .c = g.data(),
                  .ldc = G});
        flops += 2.0 * N * G * in;
        for (int pass = 0; pass < (train ? 2 : 1); ++pass) {
          int64_t r0 = 0;
          for (int64_t t = 0; t < T; ++t) {
            const int64_t n = live(t, d);
            if (pass == 0) {
              eng.step(n, hp.data() + r0 * H, H, *fwd_op, 0, 1.f, g.data() + r0 * G, G);
            } else {
              eng.step(n, g.data() + r0 * G, G, *bwd_op, 0, 0.f, hp.data() + r0 * H, H);
            }
            flops += 2.0 * n * G * H;
            r0 += w.batch_sizes[static_cast<size_t>(t)];
          }
        }
        if (!train) continue;
        eng.gemm({.m = G,
                  .n = in,
                  .k = N,
                  .a = {.data = g.data(), .ld = G, .trans = true},
                  .b = {.data = x.data(), .ld = in},
                  .c = dw.data(),
                  .ldc = in});
        eng.gemm({.m = N,
                  .n = in,
                  .k = G,
                  .a = {.data = g.data(), .ld = G},
                  .b = {.data = wih.data(), .ld = in},
                  .beta = 1.f,
                  .c = dx.data(),
                  .ldc = in});
        const int64_t skip = d == 0 ? w.batch_sizes[0] : 0;
        eng.gemm({.m = G,
                  .n = H,
                  .k = N - skip,
                  .a = {.data = g.data() + skip * G, .ld = G, .trans = true},
                  .b = {.data = hp.data() + skip * H, .ld = H},
                  .c = dw.data(),
                  .ldc = H});
        flops += 2.0 * G * N * 2 * in + 2.0 * G * (N - skip) * H;
      }
    }
    benchmark::ClobberMemory();
  }
  state.counters["FLOPS"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["gemm_flop"] = flops;
}

void register_workloads(const std::string& path) {
  std::ifstream in(path);
  if (!in) return;  // the fixed shapes above still run
  static std::vector<WorkloadShape> shapes;
  const nlohmann::json doc = nlohmann::json::parse(in);
  for (const auto& j : doc.at("workloads")) {
    WorkloadShape w;
    w.name = j.at("name").get<std::string>();
    const std::string cell = j.at("cell").get<std::string>();
    w.gates = cell == "lstm" ? 4 : cell == "gru" ? 3 : 1;
    w.input = j.at("input_size").get<int64_t>();
    w.hidden = j.at("hidden_size").get<int64_t>();
    w.layers = j.at("num_layers").get<int64_t>();
    w.dirs = j.value("bidirectional", false) ? 2 : 1;
    const auto lengths = j.at("lengths").get<std::vector<int64_t>>();
    const int64_t T = *std::max_element(lengths.begin(), lengths.end());
    for (int64_t t = 0; t < T; ++t) {
      w.batch_sizes.push_back(std::count_if(lengths.begin(), lengths.end(),
                                            [t](int64_t len) { return len > t; }));
      w.rows += w.batch_sizes.back();
    }
    shapes.push_back(std::move(w));
  }
  for (const auto& w : shapes) {
    for (const char* kind : {"fwd_input", "fwd_steps", "fwd_steps_gemv4", "bwd_steps", "bwd_whole"}) {
      benchmark::RegisterBenchmark(("BM_rnn_gemms/" + w.name + "/" + kind).c_str(),
                                   [&w, k = std::string(kind)](benchmark::State& s) {
                                     run_kind(s, w, k);
                                   })
          ->Unit(benchmark::kMillisecond);
    }
    for (const char* mode : {"forward_packed", "train_packed"}) {
      for (auto p : {seqpack::Precision::fp32, seqpack::Precision::bf16, seqpack::Precision::int8}) {
        if (p == seqpack::Precision::int8 && std::string(mode) == "train_packed") continue;
        const std::string name = "BM_workload_gemms/" + w.name + "/" + mode + "/" +
                                 seqpack::precision_name(p);
        benchmark::RegisterBenchmark(name.c_str(), [&w, train = std::string(mode) == "train_packed",
                                                    p](benchmark::State& s) {
          run_workload_gemms(s, w, train, p);
        })->Unit(benchmark::kMillisecond);
      }
    }
  }
}

}  // namespace

// Google Benchmark's main, plus --threads=N (default 1: the single-core rate) and
// --workloads=FILE (default $SEQPACK_WORKLOADS, else the source tree's
// bench/workloads.json) for the per-workload BM_rnn_gemms cases.
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
  register_workloads(path);
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 1;
  benchmark::AddCustomContext("seqpack_threads", std::to_string(threads));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
