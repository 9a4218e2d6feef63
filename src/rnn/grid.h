// The grid of the recurrent core: how one direction's steps are shared
// between threads (by columns of the gates, or by rows: whole sequences per
// thread), the engine's column ranges that follow from it, and the threads
// themselves (run_teams, run_threads). Neither the time loop
// (rnn/time_loop.h) nor the cells (rnn/cell_*.h) decide which thread owns a
// row or a column: they receive a Split.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "cpu/gemm_engine.h"
#include "cpu/gemm_int8.h"
#include "cpu/omp_errors.h"
#include "seqpack/rnn.h"

namespace seqpack::rnn {

// Threads for the splitting of one direction's steps among `available`
// (OpenMP's count by default), but at least 64 hidden units per thread
// (the config's step_units sets another minimum, for measuring). Below that
// the per-step barriers cost more than the split saves (and on a loaded
// machine a barrier waiting for a descheduled thread costs far more:
// rnn-tanh-tiny, H = 64, ran 2000x slower on two threads with 32 units each
// under OpenMP's barrier). A row split (by_rows) has no barrier in its
// steps: every thread.
int step_threads(const RNNConfig& config, int64_t H, bool by_rows, int available = 0);

// The default minimum (lstm-bi-2layer, H = 512, on a 16-core Xeon: 8 threads
// a direction at 64 units ran bf16 forward in 7.8 ms, 4 at 128 in 11.5 ms;
// docs/performance.md).
inline constexpr int64_t kDefaultStepUnits = 64;

// Columns [a, b) of [0, width) owned by thread `tid` of `nth`, in blocks of 16
// so that each thread's SIMD vectors stay whole.
void split_columns(int64_t width, int nth, int tid, int64_t& a, int64_t& b);

// Column ranges of a per-step product over `blocks` blocks of `width`
// columns: index 0 is all of them (one thread); then, for each thread of
// `nt`, its share [a, b) of every block (split_columns), so that thread tid's
// range of block q is step_range(nth, tid, blocks, q).
std::vector<cpu::ColumnRange> step_ranges(int64_t width, int64_t blocks, int nt);
std::size_t step_range(int nth, int tid, int64_t blocks, int64_t q);

// Rows of step t (of `bs`, `TT` steps) whose h_prev is not h0: the forward
// direction's steps after the first continue every live row; in the reverse
// direction rows bs[t+1].. begin at step t. With a zero h0 the product of the
// other rows with W_hh is zero, and in the backward it only feeds grad h0.
int64_t rows_after_h0(const std::vector<int64_t>& bs, int64_t t, int64_t d);

// Rows [bounds[i], bounds[i + 1]) for thread i of nt under a row split:
// contiguous in the length-sorted order, each holding about 1/nt of the
// tokens (row j lives in the steps t with j < bs[t]). A row is one sequence
// from its first step to its last, so its thread owns it for the whole loop.
std::vector<int64_t> row_bounds(const std::vector<int64_t>& bs, int64_t B, int nt);

// Who chooses between the row and the column split (RNNConfig::split).
using SplitChoice = RNNConfig::Split;

// Whether a direction's threads split its steps by rows (whole sequences per
// thread) rather than by columns: the config's fixed choice, or the engine's
// for W_hh [R, G], in a forward or (backward) a backward.
template <typename T>
bool rows_split(const cpu::GemmEngine<T>& eng, const RNNOptions& o, const RNNConfig& config,
                bool backward = false) {
  switch (config.split) {
    case SplitChoice::rows:
      return true;
    case SplitChoice::columns:
      return false;
    case SplitChoice::engine:
      break;
  }
  return eng.steps_by_rows(o.real_hidden_size(), o.gate_count() * o.hidden_size, backward);
}

// A barrier for one team of threads: a direction's, while the other
// direction's team runs beside it in the same parallel region, so OpenMP's
// barrier (the whole region's) cannot serve. A counter and a generation on
// their own cache lines; a waiting thread spins on the generation, then
// yields (a machine with fewer free cores than threads: a barrier waiting for
// a descheduled thread). break_all() releases the waiting threads with
// BrokenBarrier, so that one thread's exception cannot leave its team waiting.
struct BrokenBarrier {};

class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  SpinBarrier(const SpinBarrier&) = delete;
  SpinBarrier& operator=(const SpinBarrier&) = delete;

  void wait() {
    if (n_ <= 1) return;
    const unsigned gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
      count_.store(0, std::memory_order_relaxed);
      gen_.store(gen + 1, std::memory_order_release);
      return;
    }
    for (int spins = 0; gen_.load(std::memory_order_acquire) == gen;) {
      if (broken_.load(std::memory_order_relaxed)) throw BrokenBarrier{};
      if (spins < kSpins) {
        ++spins;
        relax();
      } else {
        std::this_thread::yield();
      }
    }
  }
  void break_all() { broken_.store(true, std::memory_order_relaxed); }

 private:
  static constexpr int kSpins = 4096;  // a few microseconds to tens of microseconds
  static void relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  alignas(64) std::atomic<int> count_{0};
  alignas(64) std::atomic<unsigned> gen_{0};
  alignas(64) std::atomic<bool> broken_{false};
  const int n_;
};

// One thread's place in a team: its number, the team's size and the team's
// barrier (null for a team of one).
struct Team {
  int tid = 0, nth = 1;
  SpinBarrier* barrier = nullptr;
};

namespace detail {

// Directions [d0, d0 + count) side by side, a team of nt threads each, in
// one parallel region (one thread in all, or more than OpenMP's count: the
// calling thread, one after the other, each as a team of one: the range
// of all columns, which every layout has).
template <typename F>
void teams_region(int64_t d0, int64_t count, int nt, F& body) {
  const int total = static_cast<int>(count) * nt;
  if (total <= 1 || total > omp_get_max_threads()) {
    for (int64_t d = d0; d < d0 + count; ++d) body(d, Team{});
    return;
  }
  // No exception may leave the region (std::terminate): kept, rethrown after it.
  cpu::OmpErrors errors;
  std::vector<std::unique_ptr<SpinBarrier>> barriers;
  for (int64_t d = 0; d < count; ++d) barriers.push_back(std::make_unique<SpinBarrier>(nt));
#pragma omp parallel num_threads(total)
  errors.run([&] {
    // The column split (and the engine's step ranges) were planned for nt
    // threads a direction; a smaller team runs it all on one thread.
    if (omp_get_num_threads() != total) {
      if (omp_get_thread_num() == 0)
        for (int64_t d = d0; d < d0 + count; ++d) body(d, Team{});
      return;
    }
    const int i = omp_get_thread_num();
    SpinBarrier& bar = *barriers[static_cast<std::size_t>(i / nt)];
    try {
      body(d0 + i / nt, Team{i % nt, nt, &bar});
    } catch (const BrokenBarrier&) {
      // another thread of the team failed: its exception is the one kept
    } catch (...) {
      bar.break_all();
      throw;
    }
  });
  errors.rethrow();
}

}  // namespace detail

// Runs body(d, team) for d in [0, D), each on a team of `nt` threads of one
// parallel region (D * nt threads, the directions side by side), or, where
// OpenMP's count (seqpack::set_num_threads) is smaller than D * nt, one
// direction after the other. The caller holds a cpu::BlasSingleThread, so
// each thread's BLAS calls stay on that thread. Thread i works for direction
// i / nt all along (its weights stay in its cache from step to step).
template <typename F>
void run_teams(int64_t D, int nt, F&& body) {
  nt = std::max(nt, 1);
  if (D > 1 && D * nt > omp_get_max_threads()) {
    for (int64_t d = 0; d < D; ++d) detail::teams_region(d, 1, nt, body);
    return;
  }
  detail::teams_region(0, D, nt, body);
}

// Runs body(tid, nth) on `nt` threads, with a barrier of their own (Team).
template <typename F>
void run_threads(int nt, F&& body) {
  run_teams(1, nt, [&](int64_t, const Team& team) { body(team.tid, team.nth); });
}

// Threads a direction's steps are split over, for a call of `rows` packed
// rows in `steps` steps: OpenMP's count, shared by the directions of a
// bidirectional layer (each on its own team, side by side), no more than
// step_threads allows, and, under a column split, no more than give each
// thread 256 KB of W_hh (in the layer's dtype: the engine's layout may be
// smaller) or 2^20 multiply-adds a step (the steps' mean row count). Below
// both, a thread's share gains neither cache nor arithmetic, and the barrier
// costs: lstm-long-seq (H = 128, 256 KB of fp32 W_hh, 18 rows a step) ran its
// fp32 forward 10% slower on two threads than on one's split. A row split has
// no such rule: with no barrier, each further thread takes tokens off the
// longest one's share (lstm-long-seq's bf16 forward, 18 rows a step: 9.7 ms
// on 2 threads, 6.4 on 8, on the GPU machine's Xeon). The config's
// step_rows (SEQPACK_STEP_ROWS), for measuring, gives a row split at most
// (rows / steps) / step_rows threads (at 32 the main job's 16-thread epoch
// took 1.8 times as long); its work_rule off (tests) drops the column
// split's rule.
int direction_threads(const RNNOptions& o, const RNNConfig& config, bool by_rows, int64_t rows,
                      int64_t steps);

// This thread's share of a step among nth threads. By columns (the
// default): hidden units [a, b) of every gate and columns [ra, rb) of h
// (split_columns), for all of the step's rows. By rows (engines whose
// rows_split, on several threads; `bounds` from row_bounds): every
// column, for this thread's rows of each step, the same rows all along.
struct Split {
  int tid = 0, nth = 1;
  bool by_rows = false;
  int64_t a = 0, b = 0, ra = 0, rb = 0;
  int64_t row0 = 0, row1 = 0;  // a row split's rows
  SpinBarrier* barrier = nullptr;
  Split(const Team& team, int64_t H, int64_t R, const std::vector<int64_t>& bounds)
      : tid(team.tid), nth(team.nth), by_rows(!bounds.empty() && team.nth > 1),
        barrier(team.barrier) {
    split_columns(H, by_rows ? 1 : nth, by_rows ? 0 : tid, a, b);
    split_columns(R, by_rows ? 1 : nth, by_rows ? 0 : tid, ra, rb);
    if (by_rows) {
      row0 = bounds[static_cast<std::size_t>(tid)];
      row1 = bounds[static_cast<std::size_t>(tid + 1)];
    }
  }
  // This thread's rows [first, last) of a step of n rows.
  std::pair<int64_t, int64_t> rows(int64_t n) const {
    if (!by_rows) return {0, n};
    return {std::min(n, row0), std::min(n, row1)};
  }
  // The engine's range (step_ranges) of this thread's columns of block q of `blocks`.
  std::size_t range(int64_t blocks, int64_t q) const {
    return by_rows ? 0 : step_range(nth, tid, blocks, q);
  }
  // Whether this thread does a step's once-per-step work (keeping rows in
  // the engine's store): under a row split each thread for its rows, under a
  // column split thread 0.
  bool owns_row_work() const { return by_rows || tid == 0; }
};

// The threads of a column split meet inside a step (a product reads every
// column of its rows). Those of a row split never meet in the loop: each
// row's state is read and written by its thread alone.
inline void columns_barrier(const Split& sp) {
  if (sp.nth > 1 && !sp.by_rows) sp.barrier->wait();
}

}  // namespace seqpack::rnn
