// What two threads pay to meet: the round trip of one cache line between two
// threads spinning on it, the floor under every per-step barrier and every
// value one thread writes for another (docs/performance.md, "Two threads").
//
//   build/bench/bench_threads [google benchmark flags]
//
// Counter ns_per_round_trip: thread A writes 2i + 1 once it sees 2i, thread B
// writes 2i + 2 once it sees 2i + 1. On a virtual machine the figure tells
// where the host put the two vCPUs at that moment: on the Zen 4 of
// docs/performance.md anywhere from about 64 ns (one die) to 364 ns (cores of
// different dies), changing from run to run and within one; a figure between
// the two is a run that met both.
//
// Counter ns_per_barrier: two threads passing the recurrent core's team
// barrier (rnn/grid.h's SpinBarrier, the one a column split meets at every
// step) with nothing between, the least a step of two threads pays for it.
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include "rnn/grid.h"

namespace {

// Spins until `line` holds `value`; past a few microseconds (a machine with
// one free CPU: the other thread is not running) it yields.
void wait_for(const std::atomic<int64_t>& line, int64_t value) {
  for (int spins = 0; line.load(std::memory_order_acquire) != value;) {
    if (++spins > 1000) std::this_thread::yield();
  }
}

void BM_cache_line_round_trip(benchmark::State& state) {
  const int64_t trips = state.range(0);
  alignas(64) std::atomic<int64_t> line{0};
  double seconds = 0;
  for (auto _ : state) {
    line.store(0, std::memory_order_relaxed);
    std::thread other([&] {
      for (int64_t i = 0; i < trips; ++i) {
        wait_for(line, 2 * i + 1);
        line.store(2 * i + 2, std::memory_order_release);
      }
    });
    // Both threads running before the clock starts: the first trip.
    line.store(1, std::memory_order_release);
    wait_for(line, 2);
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 1; i < trips; ++i) {
      wait_for(line, 2 * i);
      line.store(2 * i + 1, std::memory_order_release);
    }
    wait_for(line, 2 * trips);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    other.join();
  }
  state.counters["ns_per_round_trip"] =
      seconds * 1e9 / (static_cast<double>(state.iterations()) * static_cast<double>(trips - 1));
}
BENCHMARK(BM_cache_line_round_trip)->Arg(100000)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_team_barrier(benchmark::State& state) {
  const int64_t passes = state.range(0);
  double seconds = 0;
  for (auto _ : state) {
    seqpack::rnn::SpinBarrier barrier(2);
    std::thread other([&] {
      for (int64_t i = 0; i < passes; ++i) barrier.wait();
    });
    barrier.wait();  // both threads running before the clock starts
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 1; i < passes; ++i) barrier.wait();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    other.join();
  }
  state.counters["ns_per_barrier"] =
      seconds * 1e9 / (static_cast<double>(state.iterations()) * static_cast<double>(passes - 1));
}
BENCHMARK(BM_team_barrier)->Arg(100000)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
