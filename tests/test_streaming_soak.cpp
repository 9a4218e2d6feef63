// Streaming soak: StreamingRNN under long random schedules, for a bounded time.
//
// Several threads each run rounds until the time is up. A round takes one of a
// set of models shared by all threads (RNN tanh/relu, LSTM with and without
// proj_size, GRU; hidden 5 to 128; 1 to 3 layers; float32 and float64) and
// drives one StreamingRNN on it through up to 400 random operations: open a
// stream (from zeros or a given h0/c0), push a random subset of the open
// streams in random order with chunks of random lengths (0 included, and
// pushes of only empty chunks or of no stream at all), reset a stream to a new
// initial state and start a new sequence on it, close a stream, check a stream
// mid-flight, and pushes that must be rejected (a closed or unknown id, a chunk
// of the wrong width) and leave every state as it was. Up to 64 streams are
// open at once.
//
// Every time a stream is checked (at random, at reset, at close and at the end
// of the round), its outputs so far and its current (h, c) are compared with
// one rnn_forward over the whole sequence fed so far (batch of one, from the
// same initial state): the contract of docs/streaming.md, float32 within 1e-6
// and float64 within 1e-12 (absolute + relative each).
//
//   SEQPACK_SOAK_SECONDS   time budget (default 20; at most 600)
//   SEQPACK_SOAK_THREADS   threads (default 3)
//   SEQPACK_TEST_SEED      the seed (printed; random when unset)
//   SEQPACK_SOAK_REPLAY    "THREAD:ROUND": run only that round, on one thread
//                          (with the same SEQPACK_TEST_SEED), as a failure says
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "seqpack/packed_sequence.h"
#include "seqpack/rnn.h"
#include "seqpack/streaming.h"
#include "test_util.h"

namespace {

using namespace seqpack;
using seqpack::testing::all_close;
using seqpack::testing::bitwise_equal;
using seqpack::testing::random_tensor;

constexpr int kMaxOpen = 64;       // streams open at once in a round
constexpr int kOpsPerRound = 400;  // operations per round
constexpr int kMinOps = 40;        // operations per round even past the deadline
using Clock = std::chrono::steady_clock;
constexpr int64_t kMaxSegment = 48;  // steps of one sequence between resets
// |streamed - whole| <= tol + tol * |whole|. float64 is not bit for bit: a push
// of many streams runs its products on more rows than a forward of one
// sequence, and OpenBLAS's dgemm rounds a row differently with the row count
// (already from 1 row to 2); float32 likewise (docs/streaming.md).
constexpr double kTolF32 = 1e-6;
constexpr double kTolF64 = 1e-12;

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t round_seed(uint64_t seed, uint64_t thread, uint64_t round) {
  return splitmix64(splitmix64(seed ^ (thread << 40)) + round);
}

int64_t env_int(const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return fallback;
  const int64_t v = std::stoll(s);
  if (v < lo || v > hi) {
    throw std::invalid_argument(std::string(name) + " = " + s + " is outside [" +
                                std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return v;
}

// The models of a run, shared (read-only) by every thread's StreamingRNNs.
struct Model {
  std::string name;
  std::unique_ptr<RNNBase> module;
};

std::vector<Model> make_models(uint64_t seed) {
  struct Spec {
    RNNMode mode;
    int64_t input, hidden, layers, proj;
    DType dtype;
  };
  const std::vector<Spec> specs = {
      {RNNMode::lstm, 7, 33, 2, 0, DType::f32},     {RNNMode::lstm, 4, 16, 1, 0, DType::f64},
      {RNNMode::lstm, 24, 128, 2, 0, DType::f32},   {RNNMode::gru, 16, 96, 1, 0, DType::f64},
      {RNNMode::lstm, 5, 20, 2, 7, DType::f32},     {RNNMode::lstm, 3, 9, 3, 4, DType::f64},
      {RNNMode::gru, 6, 64, 1, 0, DType::f32},      {RNNMode::gru, 3, 5, 3, 0, DType::f64},
      {RNNMode::rnn_tanh, 8, 17, 2, 0, DType::f32}, {RNNMode::rnn_tanh, 2, 11, 1, 0, DType::f64},
      {RNNMode::rnn_relu, 5, 13, 2, 0, DType::f32}, {RNNMode::rnn_relu, 4, 8, 1, 0, DType::f64},
  };
  std::vector<Model> models;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const Spec& s = specs[i];
    RNNOptions o;
    o.mode = s.mode;
    o.input_size = s.input;
    o.hidden_size = s.hidden;
    o.num_layers = s.layers;
    o.proj_size = s.proj;
    o.dtype = s.dtype;
    auto m = std::make_unique<RNNBase>(o, splitmix64(seed + i));
    m->eval();
    models.push_back({std::string(rnn_mode_name(s.mode)) + " I=" + std::to_string(s.input) +
                          " H=" + std::to_string(s.hidden) + " layers=" + std::to_string(s.layers) +
                          " proj=" + std::to_string(s.proj) + " " + dtype_name(s.dtype),
                      std::move(m)});
  }
  return models;
}

// One stream of a round: the sequence fed since its last open/reset, from its
// initial state, and the outputs push returned for it.
struct Stream {
  int64_t id = -1;
  Tensor h0, c0;             // [layers, *]; undefined = zeros
  Tensor seq;                // [kMaxSegment-ish, input] drawn at open/reset
  int64_t fed = 0;           // rows of seq pushed so far
  std::vector<Tensor> outs;  // clones of push's outputs
};

class Round {
 public:
  Round(const Model& model, uint64_t seed)
      : model_(model), o_(model.module->options()), rng_(seed), streams_(*model.module) {}

  // Empty when every check passed, else what failed and the last operations.
  // Stops issuing operations at `deadline` (after kMinOps), then checks and
  // closes the open streams: a slow build (sanitizers) overruns the time budget
  // by one short round at most.
  std::string run(Clock::time_point deadline = Clock::time_point::max()) {
    try {
      for (int op = 0; op < kOpsPerRound && failure_.empty(); ++op) {
        if (op >= kMinOps && Clock::now() >= deadline) break;
        step();
      }
      while (failure_.empty() && !open_.empty()) close_at(0, "end of round");
    } catch (const std::exception& e) {
      failure_ = std::string("unexpected exception: ") + e.what();
    }
    if (failure_.empty()) return "";
    std::string log;
    for (const auto& line : log_) log += "    " + line + "\n";
    return failure_ + "\n  last operations:\n" + log;
  }

  int64_t pushes() const { return pushes_; }
  int64_t checks() const { return checks_; }
  double worst_f32() const { return worst_f32_; }
  double worst_f64() const { return worst_f64_; }
  int64_t f64_inexact() const { return f64_inexact_; }

 private:
  void note(const std::string& s) {
    log_.push_back(s);
    if (log_.size() > 12) log_.pop_front();
  }
  int64_t uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  // An index in [0, n), n > 0.
  std::size_t pick(std::size_t n) {
    return static_cast<std::size_t>(uniform(0, static_cast<int64_t>(n) - 1));
  }

  void start_sequence(Stream& s) {
    const bool lstm = o_.mode == RNNMode::lstm;
    const bool given = uniform(0, 2) == 0;
    s.h0 = given ? random_tensor({o_.num_layers, o_.real_hidden_size()}, o_.dtype, rng_) : Tensor();
    s.c0 =
        given && lstm ? random_tensor({o_.num_layers, o_.hidden_size}, o_.dtype, rng_) : Tensor();
    // Mostly short sequences, now and then a long one.
    const int64_t len =
        uniform(0, 5) == 0 ? uniform(kMaxSegment / 2, kMaxSegment) : uniform(0, kMaxSegment / 4);
    s.seq = random_tensor({len, o_.input_size}, o_.dtype, rng_);
    s.fed = 0;
    s.outs.clear();
  }

  void step() {
    const int64_t r = uniform(0, 99);
    if (open_.empty() || (r < 12 && static_cast<int>(open_.size()) < kMaxOpen)) {
      Stream s;
      start_sequence(s);
      s.id = streams_.open(s.h0, s.c0);
      note("open -> " + std::to_string(s.id) + " (len " + std::to_string(s.seq.size(0)) +
           (s.h0.defined() ? ", given h0)" : ")"));
      open_.push_back(std::move(s));
    } else if (r < 70) {
      push();
    } else if (r < 78) {
      const std::size_t i = pick(open_.size());
      check(open_[i], "check");
    } else if (r < 84) {
      const std::size_t i = pick(open_.size());
      Stream& s = open_[i];
      check(s, "before reset");
      start_sequence(s);
      streams_.reset(s.id, s.h0, s.c0);
      note("reset " + std::to_string(s.id) + " (len " + std::to_string(s.seq.size(0)) +
           (s.h0.defined() ? ", given h0)" : ")"));
    } else if (r < 90) {
      close_at(pick(open_.size()), "close");
    } else if (r < 95) {
      rejected_push();
    } else {
      // Every open stream at once, each its whole remaining sequence or nothing.
      push(/*everyone=*/true);
    }
  }

  void push(bool everyone = false) {
    std::vector<std::size_t> members;
    for (std::size_t i = 0; i < open_.size(); ++i) {
      if (everyone || uniform(0, 2) != 0) members.push_back(i);
    }
    std::shuffle(members.begin(), members.end(), rng_);
    std::vector<int64_t> ids;
    std::vector<Tensor> chunks;
    std::vector<int64_t> lens;
    for (std::size_t i : members) {
      Stream& s = open_[i];
      const int64_t left = s.seq.size(0) - s.fed;
      int64_t n = 0;
      if (left > 0) {
        const int64_t k = uniform(0, 9);
        n = k == 0 ? 0 : (k == 1 || everyone ? left : uniform(1, std::min<int64_t>(left, 8)));
      }
      ids.push_back(s.id);
      chunks.push_back(s.seq.slice0(s.fed, s.fed + n).clone());
      lens.push_back(n);
    }
    std::ostringstream what;
    what << "push " << ids.size() << " streams:";
    for (std::size_t k = 0; k < ids.size() && k < 16; ++k) what << " " << ids[k] << "+" << lens[k];
    if (ids.size() > 16) what << " ...";
    note(what.str());
    const std::vector<Tensor> y = streams_.push(ids, chunks);
    ++pushes_;
    if (y.size() != ids.size()) {
      failure_ = "push returned " + std::to_string(y.size()) + " outputs for " +
                 std::to_string(ids.size()) + " chunks";
      return;
    }
    for (std::size_t k = 0; k < members.size(); ++k) {
      Stream& s = open_[members[k]];
      if (y[k].shape() != Shape{lens[k], o_.real_hidden_size()}) {
        failure_ = "push: stream " + std::to_string(s.id) + " got outputs " +
                   shape_str(y[k].shape()) + " for a chunk of " + std::to_string(lens[k]) +
                   " steps";
        return;
      }
      s.outs.push_back(y[k].clone());
      s.fed += lens[k];
    }
  }

  // A push that must throw before any state changes: a closed or never-issued
  // id, or a chunk of the wrong width, among valid chunks for open streams.
  void rejected_push() {
    std::vector<int64_t> ids;
    std::vector<Tensor> chunks;
    for (Stream& s : open_) {
      if (s.fed < s.seq.size(0) && uniform(0, 1) == 0) {
        ids.push_back(s.id);
        chunks.push_back(s.seq.slice0(s.fed, s.fed + 1).clone());
      }
    }
    const int64_t kind = uniform(0, 2);
    const std::size_t at = static_cast<std::size_t>(uniform(0, static_cast<int64_t>(ids.size())));
    std::string bad;
    if (kind == 0 && !closed_.empty()) {
      const int64_t id = closed_[pick(closed_.size())];
      ids.insert(ids.begin() + static_cast<std::ptrdiff_t>(at), id);
      chunks.insert(chunks.begin() + static_cast<std::ptrdiff_t>(at),
                    Tensor::zeros({1, o_.input_size}, o_.dtype));
      bad = "closed stream " + std::to_string(id);
    } else if (kind == 1) {
      const int64_t id = 1000000 + uniform(0, 1000);
      ids.insert(ids.begin() + static_cast<std::ptrdiff_t>(at), id);
      chunks.insert(chunks.begin() + static_cast<std::ptrdiff_t>(at),
                    Tensor::zeros({1, o_.input_size}, o_.dtype));
      bad = "unknown stream " + std::to_string(id);
    } else {
      if (ids.empty()) return;
      chunks[at % ids.size()] = Tensor::zeros({2, o_.input_size + 1}, o_.dtype);
      bad = "a chunk of width " + std::to_string(o_.input_size + 1);
    }
    note("rejected push of " + std::to_string(ids.size()) + " with " + bad);
    try {
      streams_.push(ids, chunks);
    } catch (const std::invalid_argument&) {
      return;  // the states are compared with whole forwards at the next checks
    }
    failure_ = "a push with " + bad + " was accepted";
  }

  void close_at(std::size_t i, const char* why) {
    Stream& s = open_[i];
    check(s, why);
    if (!failure_.empty()) return;
    streams_.close(s.id);
    note(std::string(why) + ": closed " + std::to_string(s.id));
    closed_.push_back(s.id);
    if (streams_.is_open(s.id)) failure_ = "stream " + std::to_string(s.id) + " open after close";
    open_.erase(open_.begin() + static_cast<std::ptrdiff_t>(i));
  }

  // Stream s so far against one forward over its whole sequence so far.
  void check(const Stream& s, const char* why) {
    if (!failure_.empty()) return;
    ++checks_;
    const bool lstm = o_.mode == RNNMode::lstm;
    const int64_t L = o_.num_layers, H = o_.real_hidden_size(), C = o_.hidden_size;
    const Tensor x = s.seq.slice0(0, s.fed).clone();
    const PackingPlan plan = PackingPlan::from_lengths({s.fed}, /*enforce_sorted=*/true);
    const Tensor h0 = s.h0.defined() ? s.h0.view({L, 1, H}) : Tensor();
    const Tensor c0 = s.c0.defined() ? s.c0.view({L, 1, C}) : Tensor();
    const RNNForwardResult whole =
        rnn_forward(*rnn_make_plan(o_, model_.module->parameters(), /*in_place=*/true,
                                   seqpack::testing::config()),
                    x, plan, h0, c0, false, false);
    // The streamed outputs, concatenated.
    Tensor streamed = Tensor::empty({s.fed, H}, o_.dtype);
    int64_t at = 0;
    for (const Tensor& y : s.outs) {
      if (y.size(0) > 0) streamed.slice0(at, at + y.size(0)).copy_from(y);
      at += y.size(0);
    }
    const StreamState st = streams_.state(s.id);
    const Tensor whole_h = whole.h_n.view({L, H});
    const Tensor whole_c = lstm ? whole.c_n.view({L, C}) : Tensor();
    std::string where = std::string(why) + ": stream " + std::to_string(s.id) + " after " +
                        std::to_string(s.fed) + " steps in " + std::to_string(s.outs.size()) +
                        " chunks" + (s.h0.defined() ? " from a given h0" : "");
    auto compare = [&](const Tensor& a, const Tensor& e, const char* what) {
      if (!failure_.empty()) return;
      const bool f64 = o_.dtype == DType::f64;
      if (a.shape() == e.shape()) {
        double& worst = f64 ? worst_f64_ : worst_f32_;
        for (int64_t i = 0; i < a.numel(); ++i) {
          const double d = f64 ? std::abs(a.data<double>()[i] - e.data<double>()[i])
                               : std::abs(static_cast<double>(a.data<float>()[i]) -
                                          static_cast<double>(e.data<float>()[i]));
          worst = std::max(worst, d);
        }
        if (f64 && !bitwise_equal(a, e)) ++f64_inexact_;
      }
      const double tol = f64 ? kTolF64 : kTolF32;
      const auto ok = all_close(a, e, tol, tol, what);
      if (!ok) failure_ = where + ": " + ok.message();
    };
    compare(streamed, whole.output, "output");
    compare(st.h, whole_h, "h");
    if (lstm) compare(st.c, whole_c, "c");
  }

  const Model& model_;
  RNNOptions o_;
  std::mt19937_64 rng_;
  StreamingRNN streams_;
  std::vector<Stream> open_;
  std::vector<int64_t> closed_;
  std::deque<std::string> log_;
  std::string failure_;
  int64_t pushes_ = 0, checks_ = 0, f64_inexact_ = 0;
  double worst_f32_ = 0.0, worst_f64_ = 0.0;
};

TEST(StreamingSoak, RandomSchedulesOnManyStreamsMatchWholeForwards) {
  const uint64_t seed = seqpack::testing::test_seed();
  const int64_t seconds = env_int("SEQPACK_SOAK_SECONDS", 20, 0, 600);
  const int64_t threads = env_int("SEQPACK_SOAK_THREADS", 3, 1, 64);
  const char* replay = std::getenv("SEQPACK_SOAK_REPLAY");
  std::printf("Streaming soak seed: %llu (SEQPACK_TEST_SEED), %lld s, %lld threads\n",
              static_cast<unsigned long long>(seed), static_cast<long long>(seconds),
              static_cast<long long>(threads));
  std::fflush(stdout);
  const std::vector<Model> models = make_models(seed);
  auto model_of = [&](uint64_t rs) -> const Model& { return models[rs % models.size()]; };

  if (replay != nullptr && *replay != '\0') {
    const std::string r = replay;
    const auto colon = r.find(':');
    ASSERT_NE(colon, std::string::npos)
        << "SEQPACK_SOAK_REPLAY = " << r << ": expected THREAD:ROUND";
    const uint64_t t = std::stoull(r.substr(0, colon)), k = std::stoull(r.substr(colon + 1));
    const uint64_t rs = round_seed(seed, t, k);
    Round round(model_of(rs), rs);
    const std::string failure = round.run();
    EXPECT_EQ(failure, "") << "seed " << seed << ", round " << r << ", " << model_of(rs).name;
    std::printf("replayed round %s (%s): %lld pushes, %lld checks\n", r.c_str(),
                model_of(rs).name.c_str(), static_cast<long long>(round.pushes()),
                static_cast<long long>(round.checks()));
    return;
  }

  const auto deadline = Clock::now() + std::chrono::seconds(seconds);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> rounds{0}, pushes{0}, checks{0}, f64_inexact{0};
  std::mutex mu;
  std::vector<std::string> failures;
  double worst_f32 = 0.0, worst_f64 = 0.0;
  auto worker = [&](uint64_t t) {
    // Always at least one round per thread, then until the time is up (or a
    // failure anywhere), at most 100000 rounds.
    for (uint64_t k = 0; k < 100000 && !stop.load(); ++k) {
      if (k > 0 && Clock::now() >= deadline) break;
      const uint64_t rs = round_seed(seed, t, k);
      Round round(model_of(rs), rs);
      const std::string failure = round.run(deadline);
      rounds.fetch_add(1);
      pushes.fetch_add(round.pushes());
      checks.fetch_add(round.checks());
      f64_inexact.fetch_add(round.f64_inexact());
      std::lock_guard<std::mutex> lock(mu);
      worst_f32 = std::max(worst_f32, round.worst_f32());
      worst_f64 = std::max(worst_f64, round.worst_f64());
      if (!failure.empty()) {
        failures.push_back("round " + std::to_string(t) + ":" + std::to_string(k) + " (" +
                           model_of(rs).name + "); replay with SEQPACK_TEST_SEED=" +
                           std::to_string(seed) + " SEQPACK_SOAK_REPLAY=" + std::to_string(t) +
                           ":" + std::to_string(k) + "\n  " + failure);
        stop.store(true);
      }
    }
  };
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) pool.emplace_back(worker, static_cast<uint64_t>(t));
  for (auto& th : pool) th.join();
  std::printf(
      "Streaming soak: %lld rounds, %lld pushes, %lld stream checks; max |streamed - whole| "
      "float32 %.3g, float64 %.3g (%lld float64 comparisons not bit for bit)\n",
      static_cast<long long>(rounds.load()), static_cast<long long>(pushes.load()),
      static_cast<long long>(checks.load()), worst_f32, worst_f64,
      static_cast<long long>(f64_inexact.load()));
  for (const auto& f : failures) ADD_FAILURE() << f;
  if (failures.empty()) EXPECT_GE(rounds.load(), threads);
}

}  // namespace
