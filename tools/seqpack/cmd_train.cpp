// `seqpack train`: trains the character-level classifier, by default the
// language identifier on Debian's word lists, and saves it to a directory.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <limits>
#include <numeric>
#include <memory>
#include <optional>
#include <set>
#include <filesystem>
#include <time.h>
#include <unistd.h>
#include <type_traits>
#include <string>
#include <vector>

#include "command.h"
#include "seqpack/classifier.h"
#include "seqpack/data.h"
#include "seqpack/json_limits.h"
#include "seqpack/loss.h"
#include "seqpack/model_dir.h"
#include "seqpack/optim.h"
#include "seqpack/policy.h"
#include "seqpack/precision.h"
#include "seqpack/safetensors.h"
#include "seqpack/threading.h"
#include "seqpack/vocabulary.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace seqpack;

struct TrainArgs {
  std::string data;
  std::string dict_dir = "/usr/share/dict";
  int64_t words_per_language = 20000;
  int64_t epochs = 5;
  int64_t batch_size = 128;
  double lr = 2e-3;
  int64_t hidden = 128;
  int64_t embed = 32;
  uint64_t seed = 0;
  int threads = 0;
  double clip = 0.0;
  std::string out = seqpack::cli::kDefaultModelDir;
  bool quiet = false;
  bool profile = false;
  bool overwrite = false;
  std::string resume;
  // fp32, bf16 or auto; resolved to fp32 or bf16 before training starts.
  std::string precision = "auto";
  // Flags the user typed (as "--name"), so --resume can tell a value taken from
  // the checkpoint from a conflicting one.
  std::set<std::string> given;
};

// The settings that decide the data, the model and every update: saved in the
// checkpoint, and what --resume must not be told differently.
nlohmann::json train_config(const TrainArgs& a) {
  return {{"data", a.data},         {"dict_dir", a.dict_dir}, {"words_per_language", a.words_per_language},
          {"epochs", a.epochs},     {"batch_size", a.batch_size}, {"lr", a.lr},
          {"hidden", a.hidden},     {"embed", a.embed},       {"seed", a.seed},
          {"clip", a.clip},         {"precision", a.precision}};
}

// The ranges the command line enforces, for values read from a checkpoint.
void check_saved_ranges(const TrainArgs& a, const std::string& path) {
  const auto bad = [&](const char* key, const std::string& value, const char* range) {
    throw std::invalid_argument(fmt::format("checkpoint {}: train_config {} = {} is out of range: must be {}",
                                            path, key, value, range));
  };
  if (a.words_per_language < 1) bad("words_per_language", std::to_string(a.words_per_language), ">= 1");
  if (a.epochs < 1) bad("epochs", std::to_string(a.epochs), ">= 1");
  if (a.batch_size < 1) bad("batch_size", std::to_string(a.batch_size), ">= 1");
  if (!(a.lr > 0) || !std::isfinite(a.lr)) bad("lr", fmt::format("{:g}", a.lr), "> 0 and finite");
  if (a.hidden < 1 || a.hidden > 16384) bad("hidden", std::to_string(a.hidden), "in [1, 16384]");
  if (a.embed < 1 || a.embed > 16384) bad("embed", std::to_string(a.embed), "in [1, 16384]");
  if (!(a.clip >= 0) || !std::isfinite(a.clip)) bad("clip", fmt::format("{:g}", a.clip), ">= 0 and finite");
  if (a.precision != "fp32" && a.precision != "bf16" && a.precision != "auto") {
    bad("precision", "'" + a.precision + "'", "fp32, bf16 or auto");
  }
}

// Fills `a` from a checkpoint's train_config; a flag the user also gave must
// agree with it (--epochs excepted: it is the new total). Every conflict is
// named in one error.
void apply_checkpoint_config(TrainArgs& a, const nlohmann::json& c, const std::string& path) {
  std::vector<std::string> conflicts;
  auto take = [&](const char* flag, const char* key, auto& field) {
    using T = std::decay_t<decltype(field)>;
    T saved;
    const auto bad = [&] {
      return std::invalid_argument("checkpoint " + path + ": train_config has no valid '" + key + "'" +
                                   (c.contains(key) ? " (it has " + json_excerpt(c.at(key)) + ")" : ""));
    };
    if (!c.contains(key)) throw bad();
    const auto& v = c.at(key);
    // Exactly the JSON type the field was written with: 16.5 is no size, -1 no seed.
    if constexpr (std::is_same_v<T, std::string>) {
      if (!v.is_string()) throw bad();
    } else if constexpr (std::is_unsigned_v<T>) {
      if (!v.is_number_unsigned()) throw bad();
    } else if constexpr (std::is_integral_v<T>) {
      if (!v.is_number_integer()) throw bad();
    } else {
      if (!v.is_number()) throw bad();
    }
    saved = v.get<T>();
    if (a.given.count(flag) && field != saved) {
      conflicts.push_back(fmt::format("{} {} (the checkpoint has {})", flag, field, saved));
    }
    field = saved;
  };
  take("--data", "data", a.data);
  take("--dict-dir", "dict_dir", a.dict_dir);
  take("--words-per-language", "words_per_language", a.words_per_language);
  take("--batch-size", "batch_size", a.batch_size);
  take("--lr", "lr", a.lr);
  take("--hidden", "hidden", a.hidden);
  take("--embed", "embed", a.embed);
  take("--seed", "seed", a.seed);
  take("--clip", "clip", a.clip);
  // Checkpoints written before --precision existed trained in fp32.
  if (!c.contains("precision")) {
    if (a.given.count("--precision") && a.precision != "fp32") {
      conflicts.push_back("--precision " + a.precision + " (the checkpoint has fp32)");
    }
    a.precision = "fp32";
  } else {
    take("--precision", "precision", a.precision);
  }
  if (!a.given.count("--epochs")) {
    if (c.contains("epochs") && !c.at("epochs").is_number_integer()) {
      throw std::invalid_argument("checkpoint " + path + ": train_config has no valid 'epochs' (it has " +
                                  json_excerpt(c.at("epochs")) + ")");
    }
    a.epochs = c.value("epochs", a.epochs);
  }
  check_saved_ranges(a, path);
  if (!conflicts.empty()) {
    std::string msg = "--resume " + a.resume + ": these flags conflict with the checkpoint:";
    for (const auto& s : conflicts) msg += " " + s + ";";
    msg += " drop them to continue as the checkpoint was trained";
    throw std::invalid_argument(msg);
  }
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Process CPU time in seconds (all threads); with --threads 1 it is what a
// phase cost regardless of the machine's other load.
double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// --profile: CPU and wall-clock seconds per phase of the training step,
// summed over an epoch. CPU seconds count every thread (spinning ones too);
// wall-clock seconds show where a many-thread step spends its time.
struct StepProfile {
  static constexpr const char* kNames[] = {"batch", "forward", "loss", "backward", "clip", "step",
                                           "zero_grad", "other"};
  static constexpr int kPhases = 8;
  double cpu[kPhases] = {};
  double wall[kPhases] = {};
  double last_cpu = 0.0;
  Clock::time_point last_wall;
  void start() {
    last_cpu = cpu_seconds();
    last_wall = Clock::now();
  }
  // Charges the time since the previous mark to `phase`.
  void mark(int phase) {
    const double now = cpu_seconds();
    const auto now_wall = Clock::now();
    cpu[phase] += now - last_cpu;
    wall[phase] += std::chrono::duration<double>(now_wall - last_wall).count();
    last_cpu = now;
    last_wall = now_wall;
  }
  static std::string line(const char* what, const double (&seconds)[kPhases]) {
    double total = 0.0;
    for (double s : seconds) total += s;
    std::string out = fmt::format("step profile ({} s): total {:.3f}", what, total);
    for (int i = 0; i < kPhases; ++i) {
      out += fmt::format(", {} {:.3f} ({:.1f}%)", kNames[i], seconds[i],
                         total > 0 ? 100.0 * seconds[i] / total : 0.0);
    }
    return out;
  }
  std::string cpu_str() const { return line("cpu", cpu); }
  std::string wall_str() const { return line("wall", wall); }
  // The recurrent core's parts (rnn_core_profile) within the forward and
  // the backward wall-clock seconds; "rest" is the model's other layers and
  // the calls' own overhead.
  std::string core_str(const RNNCoreProfile& c) const {
    const auto part = [](const char* name, double s, double whole) {
      return fmt::format("{} {:.3f} ({:.1f}%)", name, s, whole > 0 ? 100.0 * s / whole : 0.0);
    };
    const double fwd = wall[1], bwd = wall[3];
    const double fwd_rest = fwd - c.forward_inputs - c.forward_steps - c.forward_states;
    const double bwd_rest =
        bwd - c.backward_prepare - c.backward_steps - c.backward_weights - c.backward_inputs;
    return fmt::format(
        "rnn core profile (wall s): forward {:.3f}: {}, {}, {}, {}; backward {:.3f}: {}, {}, {}, "
        "{}, {}",
        fwd, part("inputs", c.forward_inputs, fwd), part("steps", c.forward_steps, fwd),
        part("states", c.forward_states, fwd), part("rest", fwd_rest, fwd), bwd,
        part("prepare", c.backward_prepare, bwd), part("steps", c.backward_steps, bwd),
        part("weights", c.backward_weights, bwd), part("inputs", c.backward_inputs, bwd),
        part("rest", bwd_rest, bwd));
  }
};

// One line redrawn in place on stderr: "epoch 2/5 [=====>     ] 61% 150/245 ...".
void draw_progress(int64_t epoch, int64_t epochs, int64_t done, int64_t total, double words_s,
                   double tokens_s, double loss) {
  const int width = 24;
  const int filled = total > 0 ? static_cast<int>(width * done / total) : width;
  std::string bar(static_cast<std::size_t>(filled), '=');
  if (filled < width) bar += '>';
  bar.resize(width, ' ');
  fmt::print(stderr, "\repoch {}/{} [{}] {:3d}% {}/{} batches | {:.0f} words/s {:.0f} tokens/s | loss {:.4f}",
             epoch, epochs, bar, total > 0 ? static_cast<int>(100 * done / total) : 100, done, total,
             words_s, tokens_s, loss);
  std::fflush(stderr);
}

// Predicted label of every example, in batches (no gradient is kept).
std::vector<int64_t> predict_all(CharClassifier& model, const Vocabulary& vocab,
                                 const std::vector<Example>& examples, int64_t batch_size) {
  std::vector<int64_t> pred(examples.size());
  for (std::size_t start = 0; start < examples.size(); start += static_cast<std::size_t>(batch_size)) {
    const std::size_t stop = std::min(examples.size(), start + static_cast<std::size_t>(batch_size));
    std::vector<int64_t> idx(stop - start);
    std::iota(idx.begin(), idx.end(), static_cast<int64_t>(start));
    TokenBatch b = make_token_batch(vocab, examples, idx, /*batch_first=*/true);
    Tensor logits = model.forward(b.tokens, b.lengths, /*batch_first=*/true, /*requires_grad=*/false);
    const int64_t c = logits.size(1);
    for (std::size_t i = 0; i < idx.size(); ++i) {
      int64_t best = 0;
      for (int64_t k = 1; k < c; ++k) {
        if (logits.item_as_double(static_cast<int64_t>(i) * c + k) >
            logits.item_as_double(static_cast<int64_t>(i) * c + best)) {
          best = k;
        }
      }
      pred[start + i] = best;
    }
  }
  return pred;
}

double accuracy(const std::vector<int64_t>& pred, const std::vector<Example>& examples) {
  if (examples.empty()) return 0.0;
  int64_t ok = 0;
  for (std::size_t i = 0; i < examples.size(); ++i) ok += pred[i] == examples[i].label;
  return static_cast<double>(ok) / static_cast<double>(examples.size());
}

void print_confusion(const std::vector<int64_t>& pred, const std::vector<Example>& examples,
                     const std::vector<std::string>& labels) {
  const std::size_t n = labels.size();
  std::vector<std::vector<int64_t>> m(n, std::vector<int64_t>(n, 0));
  for (std::size_t i = 0; i < examples.size(); ++i) {
    m[static_cast<std::size_t>(examples[i].label)][static_cast<std::size_t>(pred[i])]++;
  }
  std::size_t name_w = 10;
  for (const auto& l : labels) name_w = std::max(name_w, l.size());
  fmt::print("confusion matrix (rows: true label, columns: predicted):\n");
  fmt::print("{:>{}} ", "", name_w);
  for (const auto& l : labels) fmt::print(" {:>7.7}", l);
  fmt::print("   recall\n");
  for (std::size_t r = 0; r < n; ++r) {
    fmt::print("{:>{}} ", labels[r], name_w);
    int64_t row = 0;
    for (std::size_t c = 0; c < n; ++c) {
      fmt::print(" {:>7}", m[r][c]);
      row += m[r][c];
    }
    fmt::print("   {:5.1f}%\n", row ? 100.0 * static_cast<double>(m[r][r]) / static_cast<double>(row) : 0.0);
  }
}

// Where --resume reads from, and the output directory this run writes.
struct RunDirs {
  std::unique_ptr<ModelDirWriter> out;      // locked for the whole run
  std::unique_ptr<ModelDirWriter> source;   // --resume DIR other than --out (locked too)
  std::optional<TrainingCheckpoint> ck;
  std::string ck_path;
  bool continue_interrupted = false;  // ck is the interrupted run's own staging in --out
};

std::string resume_dir_of(const std::string& resume) {
  namespace fs = std::filesystem;
  if (!fs::is_regular_file(resume)) return resume;
  const std::string p = fs::path(resume).parent_path().string();
  return p.empty() ? "." : p;
}

bool same_dir(const std::string& x, const std::string& y) {
  namespace fs = std::filesystem;
  return fs::weakly_canonical(fs::absolute(x)) == fs::weakly_canonical(fs::absolute(y));
}

void print_notes(const ModelDirWriter& w) {
  for (const auto& n : w.notes()) fmt::print("{}\n", n);
}

// Locks --out (and the --resume directory), finishes what an interrupted run
// left there, and loads the checkpoint to resume from: an interrupted run's
// (killed while training or while saving) before the directory's own.
RunDirs open_dirs(TrainArgs& a) {
  RunDirs d;
  const std::string holder = "seqpack train";
  if (!a.resume.empty()) {
    // Nothing at all to resume: said before any directory is locked or created.
    namespace fs = std::filesystem;
    const fs::path r = fs::absolute(a.resume).lexically_normal();
    bool staged = false;
    if (!fs::exists(r) && fs::is_directory(r.parent_path())) {
      for (const auto& e : fs::directory_iterator(r.parent_path())) {
        staged = staged || e.path().filename().string().rfind("." + r.filename().string() + ".saving-", 0) == 0;
      }
    }
    if (!fs::exists(r) && !staged) {
      throw std::invalid_argument("no checkpoint at " + a.resume + ": it does not exist");
    }
    if (!a.given.count("--out")) a.out = resume_dir_of(a.resume);
  }
  d.out = std::make_unique<ModelDirWriter>(a.out, holder);
  print_notes(*d.out);
  if (!a.resume.empty()) {
    // A model directory (or one whose interrupted run is all there is), or a checkpoint file.
    const bool is_dir = !std::filesystem::is_regular_file(a.resume);
    const bool into_itself = is_dir && same_dir(a.resume, a.out);
    if (is_dir && !into_itself) {
      d.source = std::make_unique<ModelDirWriter>(a.resume, holder);
      print_notes(*d.source);
    }
    const ModelDirWriter* src = is_dir ? (into_itself ? d.out.get() : d.source.get()) : nullptr;
    if (src != nullptr && src->interrupted_checkpoint()) {
      d.ck_path = *src->interrupted_checkpoint();
      d.continue_interrupted = into_itself;
    } else {
      d.ck_path = is_dir ? (std::filesystem::path(a.resume) / "checkpoint.safetensors").string() : a.resume;
    }
    d.ck = load_training_checkpoint(d.ck_path);
    // "auto" compares with the checkpoint as what it resolves to here.
    if (a.given.count("--precision"))
      a.precision =
          precision_name(resolve_precision(a.precision, kernel_config(cli::tool_policy())));
    check_json_depth(d.ck->train_config, "checkpoint " + d.ck_path + ": train_config");
    apply_checkpoint_config(a, nlohmann::json::parse(d.ck->train_config), d.ck_path);
  }
  if (a.overwrite) {
    for (const char* f : {"model.safetensors", "checkpoint.safetensors"}) {
      if (std::filesystem::exists(std::filesystem::path(a.out) / f)) {
        fmt::print("{}/ holds a model from an earlier run: --overwrite, so this run replaces it\n", a.out);
        break;
      }
    }
  }
  return d;
}

// A run that does not continue the interrupted run in --out drops its staging
// directory: only once the data, the options and --out have been checked, so
// that a mistyped command loses nothing.
void discard_interrupted(const TrainArgs& a, RunDirs& d) {
  if (d.out->interrupted_checkpoint() && !d.continue_interrupted) {
    fmt::print("{}/: discarded the checkpoint of an interrupted run (train --resume {} would have "
               "continued it)\n", a.out, a.out);
    d.out->discard_interrupted();
  }
}

// What a failed run leaves in --out, for its message: a run never commits
// before it succeeds, so a model there is the one the directory had.
std::string what_out_keeps(const std::string& out) {
  std::error_code ec;
  return std::filesystem::exists(std::filesystem::path(out) / "model.safetensors", ec)
             ? out + "/ keeps the model it had"
             : out + "/ holds no model (none was saved there before)";
}

// Stops the run when a step's loss or gradient is not finite: nothing of it is
// saved, the output directory keeps what it had.
void check_finite(const TrainArgs& a, int64_t epoch, std::size_t batch, double loss, const std::string& grad) {
  if (std::isfinite(loss) && grad.empty()) return;
  const std::string what =
      !std::isfinite(loss) ? fmt::format("the loss is {}", loss) : "the gradient of " + grad + " is not finite";
  throw std::runtime_error(fmt::format(
      "training diverged at epoch {}, batch {}: {}. Nothing of this epoch is saved; {}. Try a "
      "smaller --lr (now {:g}){}",
      epoch, batch + 1, what, what_out_keeps(a.out), a.lr, a.clip > 0 ? " or a smaller --clip" : " or --clip 1"));
}

// A run that failed before its commit (a full disk, an I/O error, a diverging
// step): its staged files go, so that a full disk gets its space back, except the
// checkpoint of its last finished epoch, which `--resume` continues from. Says
// on stderr what was removed and what was kept.
void clean_up_failed_run(const TrainArgs& a, RunDirs& d) {
  std::string note;
  try {
    const ModelDirWriter::Abandoned r = d.out->abandon_keeping_checkpoint();
    if (r.kept.empty()) {
      note = "removed the run's staging directory " + r.staging + "/ (it held no checkpoint yet)";
    } else {
      std::string removed;
      for (const auto& n : r.removed) removed += (removed.empty() ? "" : ", ") + n;
      std::error_code ec;
      const auto bytes = std::filesystem::file_size(r.kept, ec);
      note = (removed.empty() ? std::string("kept")
                              : "removed the run's staged " + removed + "; kept") +
             " its checkpoint " + r.kept + (ec ? "" : fmt::format(" ({} bytes)", bytes)) +
             ": `seqpack train --resume " + a.out + "` continues from it, a run without " +
             "--resume deletes it, and `rm -r " + r.staging + "` frees its space now";
    }
  } catch (const std::exception& e) {
    note = std::string("could not remove the run's staged files: ") + e.what();
  }
  fmt::print(stderr, "seqpack train: {}; {}\n", what_out_keeps(a.out), note);
}

// The checkpoint's weights written as the model, when an interrupted run had
// finished training but not its save.
void finish_interrupted_save(TrainArgs& a, RunDirs& d) {
  CharClassifier model(d.ck->model_options, 0);
  model.load_state_dict(d.ck->model_state);
  d.out->begin(/*keep_previous=*/!a.overwrite, /*continue_interrupted=*/true);
  write_classifier_files(d.out->staging(), model, d.ck->vocabulary, d.ck->labels);
  const std::string kept = d.out->commit();
  fmt::print("{}: the interrupted run had trained all {} epochs; saved its model to {}/{}\n", d.ck_path,
             d.ck->epoch, a.out, kept.empty() ? "" : " (the model that was there is in " + kept + "/)");
}

// Data a classifier cannot be trained and tested on is an error, not a run
// that reports "0.00% (0 words)".
void check_split(const TrainArgs& a, const DatasetSplit& split) {
  const std::string source = a.data.empty() ? "the word lists in " + a.dict_dir : a.data;
  const std::size_t total = split.train.size() + split.val.size() + split.test.size();
  if (split.labels.size() < 2) {
    throw std::invalid_argument(fmt::format(
        "{}: {} example{} with {} label{}{}: a classifier needs at least 2 labels", source, total,
        total == 1 ? "" : "s", split.labels.size(), split.labels.size() == 1 ? "" : "s",
        split.labels.size() == 1 ? " ('" + split.labels[0] + "')" : ""));
  }
  if (split.train.empty() || split.test.empty()) {
    throw std::invalid_argument(fmt::format(
        "{}: {} examples are too few to split: they give {} training, {} validation and {} test "
        "examples (80%, 10% and the rest of each label), and training and testing each need at "
        "least one; give at least 3 examples of a label (10 or more of each for a useful model)",
        source, total, split.train.size(), split.val.size(), split.test.size()));
  }
}

// The training data, split.
DatasetSplit load_split(const TrainArgs& a) {
  DatasetSplit split;
  if (a.data.empty()) {
    LanguageIdOptions lo;
    lo.dict_dir = a.dict_dir;
    lo.words_per_language = a.words_per_language;
    lo.seed = lo.seed + a.seed;
    split = load_language_id(lo);
    fmt::print("dataset: Debian word lists in {}, {} languages, {} words each\n", a.dict_dir,
               split.labels.size(), a.words_per_language);
  } else {
    TextDataset ds = load_tsv(a.data);
    fmt::print("dataset: {}: {} examples, {} labels", a.data, ds.examples.size(), ds.labels.size());
    if (ds.empty_lines > 0) fmt::print(", {} empty lines skipped", ds.empty_lines);
    fmt::print("\n");
    split = split_dataset(ds, 0.8, 0.1, a.seed);
  }
  check_split(a, split);
  fmt::print("split: {} train, {} validation, {} test\n", split.train.size(), split.val.size(),
             split.test.size());
  return split;
}

// One epoch's measurements.
struct EpochResult {
  double loss_sum = 0.0;
  int64_t words = 0, tokens = 0;
};

// One pass over `batches`: forward, loss, backward, clip, step; the progress bar
// on a terminal.
EpochResult train_epoch(const TrainArgs& a, int64_t epoch, const std::vector<std::vector<int64_t>>& batches,
                        const DatasetSplit& split, const Vocabulary& vocab, CharClassifier& model, Adam& opt,
                        StepProfile* prof) {
  // The progress bar redraws one line with carriage returns: only for a terminal.
  // A log file or pipe gets the one line per epoch below instead.
  const bool show_bar = !a.quiet && ::isatty(STDOUT_FILENO) && ::isatty(STDERR_FILENO);
  CrossEntropyLoss ce;
  EpochResult r;
  const auto t0 = Clock::now();
  auto last_draw = t0;
  double running = 0.0;
  // Marks cost two clock reads each; without --profile they are skipped.
  const auto mark = [&](int phase) {
    if (prof != nullptr) prof->mark(phase);
  };
  if (prof != nullptr) prof->start();
  for (std::size_t k = 0; k < batches.size(); ++k) {
    TokenBatch b = make_token_batch(vocab, split.train, batches[k], /*batch_first=*/true);
    mark(0);
    Tensor logits = model.forward(b.tokens, b.lengths, /*batch_first=*/true);
    mark(1);
    const double loss = ce.forward(logits, b.labels);
    const Tensor grad_logits = ce.backward();
    mark(2);
    model.backward(grad_logits);
    mark(3);
    const double norm = a.clip > 0 ? clip_grad_norm(opt.parameters(), a.clip) : 0.0;
    check_finite(a, epoch, k, loss, std::isfinite(norm) ? non_finite_grad(opt.parameters()) : "the model");
    mark(4);
    opt.step();
    mark(5);
    opt.zero_grad();
    mark(6);
    r.words += static_cast<int64_t>(b.lengths.size());
    r.tokens += std::accumulate(b.lengths.begin(), b.lengths.end(), int64_t{0});
    r.loss_sum += loss;
    running = k == 0 ? loss : 0.98 * running + 0.02 * loss;
    const auto now = Clock::now();
    if (show_bar && (std::chrono::duration<double>(now - last_draw).count() > 0.1 || k + 1 == batches.size())) {
      const double s = std::max(1e-9, seconds_since(t0));
      draw_progress(epoch, a.epochs, static_cast<int64_t>(k + 1), static_cast<int64_t>(batches.size()),
                    r.words / s, r.tokens / s, running);
      last_draw = now;
    }
    mark(7);
  }
  if (show_bar) fmt::print(stderr, "\n");
  return r;
}

// Epochs first_epoch..a.epochs, each followed by its validation accuracy and a
// checkpoint in the staging directory.
void train_epochs(const TrainArgs& a, int64_t first_epoch, const DatasetSplit& split, const Vocabulary& vocab,
                  CharClassifier& model, Adam& opt, const std::string& checkpoint_path) {
  BucketingSampler sampler(lengths_of(split.train), a.batch_size, a.seed);
  const PaddingReport pr = padding_report(sampler, 0);
  const auto pad_pct = [](const PaddingStats& s) { return 100.0 * (1.0 - s.efficiency()); };
  fmt::print(
      "padding: random batches of {} would compute {} slots for {} real tokens ({:.1f}% padding); "
      "bucketing cuts that to {} ({:.1f}% padding); packing computes only the {} real tokens (0% padding)\n",
      a.batch_size, pr.random.padded_slots, pr.random.real_tokens, pad_pct(pr.random),
      pr.bucketed.padded_slots, pad_pct(pr.bucketed), pr.packed.real_tokens);
  const std::string config_text = train_config(a).dump();
  double total_train_s = 0.0, total_cpu_s = 0.0;
  for (int64_t epoch = first_epoch; epoch <= a.epochs; ++epoch) {
    const auto batches = sampler.epoch(epoch - 1);
    const auto t0 = Clock::now();
    // Process CPU time too: on a shared machine wall time depends on the
    // neighbours, CPU time (with --threads 1) does not.
    const std::clock_t c0 = std::clock();
    StepProfile prof;
    rnn_core_profile(/*reset=*/true);  // this epoch's training alone
    const EpochResult r = train_epoch(a, epoch, batches, split, vocab, model, opt, a.profile ? &prof : nullptr);
    const RNNCoreProfile core = rnn_core_profile(/*reset=*/true);
    const double secs = seconds_since(t0);
    const double cpu_secs = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    total_train_s += secs;
    total_cpu_s += cpu_secs;
    const double val_cpu0 = cpu_seconds();
    const double val_acc = accuracy(predict_all(model, vocab, split.val, 512), split.val);
    if (a.profile) {
      fmt::print("{}; validation {:.3f}\n{}\n{}\n", prof.cpu_str(), cpu_seconds() - val_cpu0,
                 prof.wall_str(), prof.core_str(core));
    }
    fmt::print(
        "epoch {}/{}: train loss {:.4f}, validation accuracy {}, {:.2f} s, cpu {:.2f} s "
        "({:.0f} words/s, {:.0f} tokens/s)\n",
        epoch, a.epochs, batches.empty() ? 0.0 : r.loss_sum / static_cast<double>(batches.size()),
        split.val.empty() ? std::string("n/a (the validation split is empty)")
                          : fmt::format("{:.2f}%", 100.0 * val_acc),
        secs, cpu_secs, r.words / std::max(1e-9, secs), r.tokens / std::max(1e-9, secs));
    std::fflush(stdout);
    save_training_checkpoint(checkpoint_path, model, opt, vocab, split.labels, epoch, config_text);
  }
  const int64_t trained = a.epochs - first_epoch + 1;
  if (trained > 0) {
    fmt::print("training time: {:.2f} s, {:.2f} s per epoch (cpu {:.2f} s per epoch)\n", total_train_s,
               total_train_s / static_cast<double>(trained), total_cpu_s / static_cast<double>(trained));
  }
}

// The model and its options for this run's data.
CharClassifierOptions model_options(TrainArgs& a, const Vocabulary& vocab, int64_t n_classes) {
  CharClassifierOptions mo;
  mo.vocab_size = vocab.size();
  mo.embed_dim = a.embed;
  mo.hidden_size = a.hidden;
  mo.num_classes = n_classes;
  std::string precision_note;
  mo.precision = resolve_precision(a.precision, kernel_config(cli::tool_policy()), &precision_note);
  a.precision = precision_name(mo.precision);  // what the checkpoint records
  fmt::print("{}, {} thread{}\n", precision_note, num_threads(), num_threads() == 1 ? "" : "s");
  fmt::print("model: Embedding({}, {}, padding_idx=0) -> LSTM({}, {}, bidirectional) -> Linear({}, {})\n",
             mo.vocab_size, mo.embed_dim, mo.embed_dim, mo.hidden_size, 2 * mo.hidden_size, n_classes);
  return mo;
}

// A --data that does not exist or cannot be read is named before --out is
// locked (the lock file beside it would otherwise be left behind) or anything
// in it touched. A path that is not a regular file is left to load_tsv, which
// refuses it without opening it (a FIFO would block here).
void check_data_readable(const TrainArgs& a) {
  if (a.data.empty()) return;
  std::error_code ec;
  const auto status = std::filesystem::status(a.data, ec);
  if (status.type() == std::filesystem::file_type::not_found) {
    throw std::invalid_argument("cannot open TSV file '" + a.data + "': No such file or directory");
  }
  if (status.type() != std::filesystem::file_type::regular) return;
  if (::access(a.data.c_str(), R_OK) != 0) {
    throw std::invalid_argument("cannot open TSV file '" + a.data + "': Permission denied");
  }
}

// Whether --out is to be checked against --data before the model directory
// is opened: where --data is a regular file (load_tsv refuses anything else,
// by name) and --out is not '/', the working directory or one of its
// ancestors (ModelDirWriter refuses those, by name, whatever they hold).
bool out_may_hold_data(const TrainArgs& a) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (a.data.empty() || !fs::is_regular_file(a.data, ec)) return false;
  const fs::path out = fs::weakly_canonical(fs::absolute(a.out, ec), ec);
  if (ec) return true;
  const fs::path here = fs::weakly_canonical(fs::current_path(ec), ec);
  if (ec) return true;
  auto o = out.begin(), h = here.begin();
  for (; o != out.end() && h != here.end() && *o == *h; ++o, ++h) {
  }
  return o != out.end();  // not '/', the working directory or an ancestor of it
}

void run_train(TrainArgs a) {
  seqpack::cli::place_threads(a.threads);
  check_data_readable(a);
  // --out changes as one unit (a staging directory swapped in): a --data
  // inside it would be moved aside or deleted with the old model.
  if (out_may_hold_data(a)) check_output_not_input(a.out, "--out directory", {{"--data file", a.data}});
  RunDirs d = open_dirs(a);
  if (d.ck) {
    if (d.ck->epoch >= a.epochs) {
      if (d.continue_interrupted) return finish_interrupted_save(a, d);
      fmt::print("{}: all {} epochs are already done (the checkpoint is at epoch {}); nothing to train. "
                 "Pass --epochs N with N > {} to train further.\n",
                 d.ck_path, a.epochs, d.ck->epoch, d.ck->epoch);
      return;
    }
    fmt::print("resuming from {}: epoch {} of {} done\n", d.ck_path, d.ck->epoch, a.epochs);
  }
  if (a.threads > 0) set_num_threads(a.threads);
  if (a.profile) rnn_core_profile_enable(true);
  const double startup_cpu0 = cpu_seconds();
  const DatasetSplit split = load_split(a);
  const Vocabulary vocab = Vocabulary::build(texts_of(split.train));
  if (a.profile) fmt::print("profile: data and vocabulary {:.3f} cpu s\n", cpu_seconds() - startup_cpu0);
  // The data is rebuilt from its source on resume; if that changed, the
  // checkpoint's weights would silently meet different characters.
  if (d.ck && (vocab.to_json() != d.ck->vocabulary.to_json() || split.labels != d.ck->labels)) {
    throw std::invalid_argument("--resume " + a.resume + ": the training data (" +
                                (a.data.empty() ? a.dict_dir : a.data) +
                                ") no longer gives the checkpoint's vocabulary and labels");
  }
  CharClassifier model(model_options(a, vocab, static_cast<int64_t>(split.labels.size())), a.seed);
  model.lstm().set_config(rnn_config(cli::tool_policy()));  // the tool's SEQPACK_* policy
  model.fc().set_kernels(kernel_config(cli::tool_policy()));
  Adam opt(model.parameters(), {.lr = a.lr, .kernels = kernel_config(cli::tool_policy())});
  int64_t first_epoch = 1;
  if (d.ck) {
    model.load_state_dict(d.ck->model_state);
    opt.load_state(d.ck->adam_state, d.ck->adam_step);
    first_epoch = d.ck->epoch + 1;
  }
  // Data, options and --out are all checked: only now may an interrupted run's
  // checkpoint be dropped.
  discard_interrupted(a, d);
  // Everything goes to a staging directory beside --out; --out changes only at
  // the end, in one step (seqpack/model_dir.h).
  d.out->begin(/*keep_previous=*/!a.overwrite, d.continue_interrupted);
  try {
    train_epochs(a, first_epoch, split, vocab, model, opt,
                 (std::filesystem::path(d.out->staging()) / "checkpoint.safetensors").string());
    const std::vector<int64_t> pred = predict_all(model, vocab, split.test, 512);
    fmt::print("test accuracy: {:.2f}% ({} words)\n", 100.0 * accuracy(pred, split.test),
               split.test.size());
    print_confusion(pred, split.test, split.labels);
    write_classifier_files(d.out->staging(), model, vocab, split.labels);
  } catch (...) {
    clean_up_failed_run(a, d);
    throw;
  }
  const std::string kept = d.out->commit();
  if (!kept.empty()) {
    fmt::print("{}/ held a model from an earlier run: moved it to {}/ (--overwrite replaces it instead)\n",
               a.out, kept);
  }
  fmt::print("saved the model to {}/ (model.safetensors, vocabulary.json, config.json; checkpoint.safetensors "
             "for --resume)\n", a.out);
  fmt::print("try: seqpack predict --model {} <word>...\n", a.out);
}

void setup(CLI::App& sub) {
  auto a = std::make_shared<TrainArgs>();
  sub.add_option("--data", a->data,
                 "train on a label<TAB>text file instead of the Debian word lists (split 80/10/10)");
  sub.add_option("--dict-dir", a->dict_dir, "directory of the Debian word lists")->capture_default_str();
  using seqpack::cli::add_number;
  add_number<int64_t>(sub, "--words-per-language", a->words_per_language, "words sampled per language", 1);
  add_number<int64_t>(sub, "--epochs", a->epochs, "passes over the training split (with --resume: the new total)", 1);
  add_number<int64_t>(sub, "--batch-size", a->batch_size, "sequences per batch", 1);
  add_number(sub, "--lr", a->lr, "Adam learning rate", 0.0, std::numeric_limits<double>::max(),
             /*min_open=*/true);
  add_number<int64_t>(sub, "--hidden", a->hidden, "LSTM hidden size per direction", 1, 16384);
  add_number<int64_t>(sub, "--embed", a->embed, "character embedding size", 1, 16384);
  add_number<uint64_t>(sub, "--seed", a->seed, "seed of the initialisation and batch order", 0);
  add_number(sub, "--threads", a->threads, "threads (0: the library default)", 0, 1024);
  add_number(sub, "--clip", a->clip, "clip the gradient norm to this (0: off)", 0.0);
  sub.add_option("--out", a->out, "directory to save the model to")->capture_default_str();
  sub.add_option("--precision", a->precision,
                 "LSTM matrix products: fp32 (PyTorch-exact), bf16 (bf16 products, fp32 "
                 "accumulation; needs native bf16), or auto (bf16 where native)")
      ->check(CLI::IsMember({"fp32", "bf16", "auto"}))
      ->capture_default_str();
  sub.add_flag("--quiet", a->quiet, "no progress bar (there is none either when the output is not a terminal)");
  sub.add_flag("--overwrite", a->overwrite,
               "replace a model already in --out (default: move it to OUT/previous-N first)");
  sub.add_flag("--profile", a->profile,
               "print the CPU seconds of each phase of the training step (batch, forward, loss, "
               "backward, clip, step, zero_grad) per epoch");
  sub.add_option("--resume", a->resume,
                 "continue from the checkpoint in this output directory of an earlier run (its data, "
                 "sizes and seed; --epochs sets the new total)");
  sub.callback([a, &sub] {
    a->given.clear();
    for (const CLI::Option* o : sub.get_options()) {
      if (o->count() > 0) a->given.insert(o->get_name());
    }
    run_train(*a);
  });
}

const bool registered = seqpack::cli::register_command(
    {"train", "train a character-level classifier (default: language of a word, on Debian's word lists)",
     setup});

}  // namespace
