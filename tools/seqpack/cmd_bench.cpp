// `seqpack bench`: median seconds per batch and tokens/s of the recurrent layers
// on the workloads of a JSON file (bench/workloads.json by default), in three
// modes:
//   forward_packed  rnn_forward over the packed rows of the batch
//   forward_padded  the same batch with every sequence at max_len (what packing saves)
//   train_packed    forward + backward of sum(outputs), i.e. grad_output = ones
// tokens = sum of the real lengths in every mode, so tokens/s compare across modes.
// --json prints one object per line: impl, threads, precision, isa, workload, mode,
// sec_per_batch (median wall clock), tokens_per_s, cpu_sec_per_batch (median
// process CPU time), tokens, scale, reps.
//
//   seqpack bench --threads 1 --json          # bench/workloads.json
//
// The packing plan, inputs, weights and grad_output are built once outside the
// timed region: a timed batch is exactly one rnn_forward (and one rnn_backward).
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "command.h"
#include "seqpack/json_limits.h"
#include "seqpack/packed_sequence.h"
#include "seqpack/policy.h"
#include "seqpack/precision.h"
#include "seqpack/rnn.h"
#include "seqpack/tensor.h"
#include "seqpack/threading.h"

namespace seqpack::cli {
namespace {

const std::vector<std::string> kModes = {"forward_packed", "forward_padded", "train_packed"};

// Caps on a workload, checked before anything is allocated: a workload of 3e9
// tokens once grew to 23 GB before std::bad_alloc. They are far above the
// shipped workloads (at most 16k tokens, hidden 512).
constexpr int64_t kMaxBenchSize = 16384;          // input_size, hidden_size (train's --hidden)
constexpr int64_t kMaxBenchLayers = 64;           // num_layers
constexpr int64_t kMaxBenchBatch = 1'000'000;     // sequences (entries of lengths)
constexpr int64_t kMaxBenchTokens = 100'000'000;  // sum of the lengths, after --scale
constexpr double kMaxBenchBytes = 16.0 * (1ull << 30);  // estimated tensors of one run: 16 GiB

struct Workload {
  std::string name;
  RNNOptions options;
  std::vector<int64_t> lengths;
};

// Own mapping (rather than parse_rnn_mode) so the message names the workload and key.
RNNMode cell_from_name(const std::string& workload, const std::string& cell) {
  static const std::map<std::string, RNNMode> cells = {{"lstm", RNNMode::lstm},
                                                        {"gru", RNNMode::gru},
                                                        {"rnn_tanh", RNNMode::rnn_tanh},
                                                        {"rnn_relu", RNNMode::rnn_relu}};
  auto it = cells.find(cell);
  if (it == cells.end()) {
    throw std::invalid_argument(fmt::format(
        "workload '{}': key 'cell' = '{}' is not one of lstm, gru, rnn_tanh, rnn_relu", workload,
        cell));
  }
  return it->second;
}

int64_t positive_int(const nlohmann::json& w, const std::string& name, const char* key,
                     int64_t min_value, int64_t max_value) {
  if (!w.contains(key)) {
    throw std::invalid_argument(fmt::format("workload '{}': key '{}' is missing", name, key));
  }
  const auto& v = w.at(key);
  // An unsigned value above INT64_MAX would read back as a negative int64_t.
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX) ||
      v.get<int64_t>() < min_value) {
    throw std::invalid_argument(fmt::format("workload '{}': key '{}' = {} must be an integer >= {}",
                                            name, key, json_excerpt(v), min_value));
  }
  if (v.get<int64_t>() > max_value) {
    throw std::invalid_argument(
        fmt::format("workload '{}': key '{}' = {} is larger than the bench's cap of {}", name, key,
                    json_excerpt(v), max_value));
  }
  return v.get<int64_t>();
}

// Checks the size of `wl` with every length multiplied by `scale`, before
// anything is allocated: tokens, and an estimate of the bytes of its tensors
// (inputs, the padded batch, and per layer the gates, outputs and cell states
// a train_packed run keeps for its backward).
void check_workload_size(const Workload& wl, int64_t scale) {
  int64_t tokens = 0, max_len = 0;
  for (int64_t l : wl.lengths) {
    tokens += l;
    max_len = std::max(max_len, l);
  }
  const int64_t B = static_cast<int64_t>(wl.lengths.size());
  if (tokens > kMaxBenchTokens / scale) {
    throw std::invalid_argument(fmt::format(
        "workload '{}': {} tokens (the sum of its lengths{}) is more than the bench's cap of {}",
        wl.name, static_cast<double>(tokens) * static_cast<double>(scale),
        scale > 1 ? fmt::format(", times --scale {}", scale) : "", kMaxBenchTokens));
  }
  const RNNOptions& o = wl.options;
  const double n = static_cast<double>(tokens * scale);
  const double padded = static_cast<double>(B) * static_cast<double>(max_len * scale);
  const double D = static_cast<double>(o.num_directions()), H = static_cast<double>(o.hidden_size);
  const double per_row =
      static_cast<double>(o.input_size) +
      static_cast<double>(o.num_layers) * D * (static_cast<double>(o.gate_count()) * H + 3 * H);
  // The parameters, four times: the weights, the plan's layout of them, and
  // for train_packed their gradients and the layout each step makes again.
  double params = 0;
  for (const Shape& s : rnn_parameter_shapes(o)) {
    double count = 1;
    for (int64_t d : s) count *= static_cast<double>(d);
    params += count;
  }
  const double bytes =
      4.0 * (n * per_row + padded * static_cast<double>(o.input_size) + 4 * params);
  if (bytes > kMaxBenchBytes) {
    throw std::invalid_argument(fmt::format(
        "workload '{}': about {:.3g} bytes of tensors and weights ({} tokens, {:.0f} parameters, "
        "input_size {}, hidden_size {}, num_layers {}{}) is more than the bench's cap of {:.0f} "
        "bytes (16 GiB)",
        wl.name, bytes, static_cast<int64_t>(n), params, o.input_size, o.hidden_size, o.num_layers,
        o.bidirectional ? ", bidirectional" : "", kMaxBenchBytes));
  }
}

std::vector<Workload> load_workloads(const std::string& path) {
  // A directory failed deep in the stream library without the path, a device
  // or FIFO would be read forever.
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec)) {
    throw std::invalid_argument(fmt::format(
        "workloads file '{}' is not a regular file (a directory, device or FIFO)", path));
  }
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(fmt::format("cannot open workloads file '{}'", path));
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  check_json_depth(text, fmt::format("workloads file '{}'", path));
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::invalid_argument(
        fmt::format("workloads file '{}' is not valid JSON: {}", path, e.what()));
  }
  if (!doc.is_object() || !doc.contains("workloads") || !doc.at("workloads").is_array()) {
    throw std::invalid_argument(
        fmt::format("workloads file '{}': key 'workloads' (an array) is missing", path));
  }
  std::vector<Workload> out;
  std::set<std::string> seen;
  const auto& list = doc.at("workloads");
  if (list.empty()) {
    throw std::invalid_argument(fmt::format(
        "workloads file '{}': 'workloads' is empty: give at least one workload", path));
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& w = list[i];
    if (!w.is_object() || !w.contains("name") || !w.at("name").is_string()) {
      throw std::invalid_argument(fmt::format(
          "workloads file '{}': workloads[{}]: key 'name' (a string) is missing", path, i));
    }
    Workload wl;
    wl.name = w.at("name").get<std::string>();
    if (!seen.insert(wl.name).second) {
      throw std::invalid_argument(
          fmt::format("workloads file '{}': workload name '{}' appears twice", path, wl.name));
    }
    if (!w.contains("cell") || !w.at("cell").is_string()) {
      throw std::invalid_argument(
          fmt::format("workload '{}': key 'cell' (a string) is missing", wl.name));
    }
    RNNOptions& o = wl.options;
    o.mode = cell_from_name(wl.name, w.at("cell").get<std::string>());
    o.input_size = positive_int(w, wl.name, "input_size", 1, kMaxBenchSize);
    o.hidden_size = positive_int(w, wl.name, "hidden_size", 1, kMaxBenchSize);
    o.num_layers = positive_int(w, wl.name, "num_layers", 1, kMaxBenchLayers);
    if (w.contains("bidirectional")) {
      if (!w.at("bidirectional").is_boolean()) {
        throw std::invalid_argument(fmt::format(
            "workload '{}': key 'bidirectional' = {} must be true or false", wl.name,
            json_excerpt(w.at("bidirectional"))));
      }
      o.bidirectional = w.at("bidirectional").get<bool>();
    }
    if (!w.contains("lengths") || !w.at("lengths").is_array() || w.at("lengths").empty()) {
      throw std::invalid_argument(fmt::format(
          "workload '{}': key 'lengths' (a non-empty array of integers) is missing", wl.name));
    }
    const auto& lengths = w.at("lengths");
    if (static_cast<int64_t>(lengths.size()) > kMaxBenchBatch) {
      throw std::invalid_argument(fmt::format(
          "workload '{}': key 'lengths' has {} sequences, more than the bench's cap of {}", wl.name,
          lengths.size(), kMaxBenchBatch));
    }
    for (size_t b = 0; b < lengths.size(); ++b) {
      const auto& len = lengths[b];
      if (!len.is_number_integer() ||
          (len.is_number_unsigned() && len.get<uint64_t>() > INT64_MAX) || len.get<int64_t>() < 0) {
        throw std::invalid_argument(fmt::format(
            "workload '{}': lengths[{}] = {} must be an integer >= 0", wl.name, b, json_excerpt(len)));
      }
      if (len.get<int64_t>() > kMaxBenchTokens) {
        throw std::invalid_argument(fmt::format(
            "workload '{}': lengths[{}] = {} is larger than the bench's cap of {} tokens", wl.name,
            b, json_excerpt(len), kMaxBenchTokens));
      }
      wl.lengths.push_back(len.get<int64_t>());
    }
    if (*std::max_element(wl.lengths.begin(), wl.lengths.end()) == 0) {
      throw std::invalid_argument(
          fmt::format("workload '{}': key 'lengths' holds no positive length", wl.name));
    }
    out.push_back(std::move(wl));
  }
  return out;
}

Tensor uniform(const Shape& shape, float bound, std::mt19937_64& rng) {
  Tensor t = Tensor::empty(shape, DType::f32);
  std::uniform_real_distribution<float> u(-bound, bound);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = u(rng);
  return t;
}

struct Timing {
  double median = 0;      // wall-clock seconds
  double cpu_median = 0;  // process CPU seconds (all threads)
  int reps = 0;
};

// CPU time of the whole process. At one thread it is what the run cost regardless
// of how many other processes shared the cores; wall time is not.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Untimed warm-up (first-touch of the workspace, OpenMP pool start-up) for one run
// and until kWarmSeconds after the first measurement began: OpenBLAS's pool thread,
// started when the library loads, spins for about 0.1 s before it sleeps, and
// would otherwise count in the CPU time of the first runs (at --threads 1 a short
// run showed twice its wall time in CPU). Then timed runs until at least min_time
// has been spent on at least 3 runs and the median has stopped moving (within 1%
// of the median without the last two runs), or until the budget of 5 * min_time
// runs out. A run slower than the whole budget is timed once.
constexpr double kWarmSeconds = 0.3;

Timing measure(const std::function<void()>& run, double min_time) {
  using clock = std::chrono::steady_clock;
  const double budget = 5 * min_time;
  static const auto first_start = clock::now();
  do {
    run();
  } while (std::chrono::duration<double>(clock::now() - first_start).count() < kWarmSeconds);
  rnn_core_profile(/*reset=*/true);  // --profile: the timed runs alone
  std::vector<double> samples, cpu_samples;
  double total = 0;
  while (true) {
    const double c0 = process_cpu_seconds();
    const auto t0 = clock::now();
    run();
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    cpu_samples.push_back(process_cpu_seconds() - c0);
    samples.push_back(dt);
    total += dt;
    const size_t n = samples.size();
    if (total >= budget || n >= 100000) break;
    if (total >= min_time && n >= 3) {
      const double m = median_of(samples);
      const double m_before = median_of(std::vector<double>(samples.begin(), samples.end() - 2));
      if (std::fabs(m - m_before) <= 0.01 * m) break;
    }
  }
  return {median_of(samples), median_of(cpu_samples), static_cast<int>(samples.size())};
}

struct Args {
  std::string workloads;
  int threads = 1;
  bool json = false;
  std::vector<std::string> names;
  std::vector<std::string> modes;
  double min_time = 0.5;
  int scale = 1;
  std::string precision = "fp32";
  bool profile = false;
};

// --profile: the recurrent core's parts (rnn_core_profile) per call of the
// timed runs, in seconds; absent parts (a forward has no backward) are 0.
nlohmann::ordered_json core_per_call(const RNNCoreProfile& p) {
  const double f = static_cast<double>(std::max<int64_t>(p.forwards, 1));
  const double b = static_cast<double>(std::max<int64_t>(p.backwards, 1));
  return {{"forward_inputs", p.forward_inputs / f},  {"forward_steps", p.forward_steps / f},
          {"forward_states", p.forward_states / f},  {"backward_prepare", p.backward_prepare / b},
          {"backward_steps", p.backward_steps / b},  {"backward_weights", p.backward_weights / b},
          {"backward_inputs", p.backward_inputs / b}};
}

// The inputs of one mode, built outside the timed region.
struct Batch {
  PackingPlan plan;
  Tensor data;
};

Batch make_batch(const std::vector<int64_t>& lengths, int64_t input_size, std::mt19937_64& rng) {
  Batch b{PackingPlan::from_lengths(lengths, /*enforce_sorted=*/false), Tensor()};
  b.data = uniform({b.plan.total_rows(), input_size}, 1.f, rng);
  return b;
}

// The workloads shipped in the repository: bench/workloads.json under the
// current directory (a clone's root), else under the source tree of this build.
std::string default_workloads() {
  const std::string local = "bench/workloads.json";
  if (std::ifstream(local)) return local;
  const std::string built = std::string(SEQPACK_SOURCE_DIR) + "/bench/workloads.json";
  if (std::ifstream(built)) return built;
  throw std::invalid_argument("no --workloads given, and neither " + local + " nor " + built +
                              " exists: pass --workloads FILE");
}

void run_bench(Args args) {
  place_threads(args.threads);
  rnn_core_profile_enable(args.profile);  // off: no clock reads in the core
  if (args.workloads.empty()) args.workloads = default_workloads();
  std::vector<Workload> all = load_workloads(args.workloads);
  std::vector<Workload> selected;
  if (args.names.empty()) {
    selected = all;
  } else {
    for (const auto& name : args.names) {
      auto it = std::find_if(all.begin(), all.end(), [&](const Workload& w) { return w.name == name; });
      if (it == all.end()) {
        std::string known;
        for (const auto& w : all) known += (known.empty() ? "" : ", ") + w.name;
        throw std::invalid_argument(fmt::format("--workload '{}' is not in '{}' (it has: {})", name,
                                                args.workloads, known));
      }
      selected.push_back(*it);
    }
  }
  // Every selected workload is checked before the first one runs.
  for (const Workload& wl : selected) check_workload_size(wl, args.scale);
  set_num_threads(args.threads);
  const Precision precision = resolve_precision(args.precision, kernel_config(tool_policy()));
  // A precision without a backward (int8) is inference only: its default
  // modes are the forwards, and training is refused.
  std::vector<std::string> modes = args.modes.empty() ? kModes : args.modes;
  if (!precision_traits(precision).backward) {
    if (std::count(args.modes.begin(), args.modes.end(), "train_packed")) {
      const std::string p = precision_name(precision);
      throw std::invalid_argument("--mode train_packed cannot run at --precision " + p + ": " +
                                  p + " is for inference only");
    }
    std::erase(modes, "train_packed");
  }
  const std::string isa = cpu_info(tool_policy()).isa;

  if (!args.json) {
    fmt::print("{:<16} {:<15} {:>7} {:>13} {:>13} {:>13} {:>6}\n", "workload", "mode", "threads",
               "s/batch", "tokens/s", "cpu s/batch", "reps");
    std::fflush(stdout);
  }
  const size_t total_runs = selected.size() * modes.size();
  size_t done = 0;
  for (const Workload& wl : selected) {
    std::vector<int64_t> lengths = wl.lengths;
    for (auto& l : lengths) l *= args.scale;
    int64_t tokens = 0, max_len = 0;
    for (auto l : lengths) {
      tokens += l;
      max_len = std::max(max_len, l);
    }
    RNNOptions o = wl.options;
    o.precision = precision;
    // Fixed seed: every run of the tool measures the same numbers.
    std::mt19937_64 rng(0x5eed);
    std::vector<Tensor> weights;
    const float bound = 1.f / std::sqrt(static_cast<float>(o.hidden_size));
    for (const Shape& s : rnn_parameter_shapes(o)) weights.push_back(uniform(s, bound, rng));
    Batch packed = make_batch(lengths, o.input_size, rng);
    // The forwards read the weights through the model's plan, made once per
    // model as a server would (int8 quantizes them, as torch's
    // quantize_dynamic does; fp32 and bf16 lay out W_hh at the first call,
    // the warm-up), not timed. Training lays out its weights at every step
    // (an in-place plan of them, made in the timed step).
    const RNNConfig config = rnn_config(tool_policy());  // the tool's SEQPACK_* policy
    const auto model = rnn_make_plan(o, weights, /*in_place=*/false, config);

    for (const std::string& mode : modes) {
      ++done;
      std::fprintf(stderr, "bench [%zu/%zu] %s %s (threads %d, %lld tokens)...\n", done,
                   total_runs, wl.name.c_str(), mode.c_str(), args.threads,
                   static_cast<long long>(tokens));
      Timing t;
      if (mode == "forward_packed") {
        t = measure(
            [&] {
              rnn_forward(*model, packed.data, packed.plan, {}, {}, /*training=*/false,
                          /*save_for_backward=*/false, 0);
            },
            args.min_time);
      } else if (mode == "forward_padded") {
        Batch padded = make_batch(std::vector<int64_t>(lengths.size(), max_len), o.input_size, rng);
        t = measure(
            [&] {
              rnn_forward(*model, padded.data, padded.plan, {}, {}, /*training=*/false,
                          /*save_for_backward=*/false, 0);
            },
            args.min_time);
      } else {  // train_packed
        const Tensor ones = Tensor::full({packed.plan.total_rows(), o.output_size()}, 1.0, DType::f32);
        t = measure(
            [&] {
              RNNForwardResult y =
                  rnn_forward(*rnn_make_plan(o, weights, /*in_place=*/true, config), packed.data,
                              packed.plan, {}, {},
                              /*training=*/true, /*save_for_backward=*/true);
              // No h0 was given, so (as in torch) it gets no gradient.
              rnn_backward(*y.saved, ones, {}, {}, /*initial_state_grad=*/false);
            },
            args.min_time);
      }
      const double tokens_per_s = static_cast<double>(tokens) / t.median;
      const nlohmann::ordered_json core = core_per_call(rnn_core_profile(/*reset=*/true));
      std::fprintf(stderr, "bench [%zu/%zu] %s %s: %.6g s/batch, %.6g tokens/s, %d reps\n", done,
                   total_runs, wl.name.c_str(), mode.c_str(), t.median, tokens_per_s, t.reps);
      if (args.json) {
        nlohmann::ordered_json line = {{"impl", "seqpack"},     {"threads", args.threads},
                               {"precision", precision_name(precision)}, {"isa", isa},
                               {"workload", wl.name},   {"mode", mode},
                               {"sec_per_batch", t.median}, {"tokens_per_s", tokens_per_s},
                               {"cpu_sec_per_batch", t.cpu_median},
                               {"tokens", tokens},      {"scale", args.scale},
                               {"reps", t.reps}};
        if (args.profile) line["core_sec_per_call"] = core;
        fmt::print("{}\n", line.dump());
      } else {
        fmt::print("{:<16} {:<15} {:>7} {:>13.6g} {:>13.6g} {:>13.6g} {:>6}\n", wl.name, mode,
                   args.threads, t.median, tokens_per_s, t.cpu_median, t.reps);
        if (args.profile) {
          std::string parts;
          for (const auto& [name, sec] : core.items()) {
            if (mode != "train_packed" && name.rfind("backward", 0) == 0) continue;
            parts += fmt::format("{}{} {:.4g}", parts.empty() ? "" : ", ", name,
                                 1e3 * sec.get<double>());
          }
          fmt::print("  rnn core ms per call: {}\n", parts);
        }
      }
      std::fflush(stdout);
    }
  }
}

void setup(CLI::App& sub) {
  auto args = std::make_shared<Args>();
  sub.add_option("--workloads", args->workloads,
                 "JSON file of workloads (default: bench/workloads.json of the current directory, "
                 "else of the source tree the tool was built from)");
  add_number(sub, "--threads", args->threads, "OpenMP and OpenBLAS threads", 1, 1024);
  sub.add_flag("--json", args->json, "one JSON object per line instead of a table");
  sub.add_option("--workload", args->names, "only these workloads (repeatable)");
  sub.add_option("--mode", args->modes, "only these modes (repeatable)")
      ->check(CLI::IsMember(kModes));
  add_number(sub, "--min-time", args->min_time,
             "seconds of timed runs per measurement before the median may be taken "
             "(budget: 5x this)",
             0.0, 3600.0, /*min_open=*/true);
  sub.add_option("--precision", args->precision,
                 "fp32 (default), bf16 (needs native bf16), int8 (inference: the forward modes; any "
      "CPU, `seqpack info` names its kernel), or auto (bf16 where native)")
      ->check(CLI::IsMember({"fp32", "bf16", "int8", "auto"}));
  add_number(sub, "--scale", args->scale, "multiply every length by this integer", 1, 1000);
  sub.add_flag("--profile", args->profile,
               "also the recurrent core's parts per call of the timed runs (rnn_core_profile): "
               "a line under each row, or core_sec_per_call in --json");
  sub.callback([args] { run_bench(*args); });
}

[[maybe_unused]] const bool registered = register_command(
    {"bench", "time the recurrent layers on the workloads of a JSON file", setup});

}  // namespace
}  // namespace seqpack::cli
