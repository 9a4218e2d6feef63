// Subcommands of the seqpack tool register themselves here, one file each
// (cmd_demo.cpp, cmd_train.cpp, ...), so main.cpp never changes.
//
// Every numeric option is added with add_number, which checks its range when
// the command line is parsed: "--threads: -1 is out of range: must be >= 0".
// tests/test_cli_options.cpp walks every option of every subcommand and fails
// for a numeric option added any other way, so none can be forgotten.
#pragma once

#include <CLI/CLI.hpp>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace seqpack::cli {

struct Command {
  std::string name;
  std::string description;
  // Adds options to `sub` and sets its callback.
  std::function<void(CLI::App& sub)> setup;
};

std::vector<Command>& commands();

}  // namespace seqpack::cli

namespace seqpack {
struct Policy;
}  // namespace seqpack

namespace seqpack::cli {

// The tool's SEQPACK_* policy (policy_from_environment, read at the first
// call: main's, which reports a bad value): the commands give its config to
// the models they make and its kernel settings to the kernels they call.
const Policy& tool_policy();

// Usage, at namespace scope of a cmd_*.cpp:
//   static const bool registered = seqpack::cli::register_command({"demo", "...", setup});
inline bool register_command(Command command) {
  commands().push_back(std::move(command));
  return true;
}

// The whole tool: every registered command added to `app` (main.cpp and the tests).
void add_commands(CLI::App& app);

// The tool's exit statuses, as `seqpack --help` lists them (docs/errors.md too).
extern const char* const kExitCodes;

// Where OpenMP's threads run. Commands call place_threads(threads) (0: OpenMP's
// count) first, before anything is read, written or printed. Where the threads
// fill the CPUs the process may use and nothing in the environment places
// them already (kPlacementVariables),
// the tool runs itself again with OMP_PROC_BIND=close OMP_PLACES=cores, which
// libgomp reads only as it loads: threads that fill a shared virtual machine
// run steadier bound (docs/performance.md, "Many threads").
// SEQPACK_BIND_THREADS: 0 never binds, 1 binds at any count. Returns how the
// threads are placed, for `seqpack info`.
// The environment's own placement, which the tool always keeps.
inline constexpr const char* kPlacementVariables[] = {"OMP_PROC_BIND", "OMP_PLACES",
                                                      "GOMP_CPU_AFFINITY", "KMP_AFFINITY"};
struct ThreadPlacement {
  bool bind = false;
  std::string why;
};
using EnvLookup = std::function<const char*(const char*)>;
// The decision alone: bind `threads` threads on `cpus` CPUs, given the
// environment `env` (throws std::invalid_argument for a bad SEQPACK_BIND_THREADS).
ThreadPlacement placement_for(int threads, int cpus, const EnvLookup& env);
// main.cpp's argv, to run the tool again; without it (the tests, which hold
// the commands in their own process) place_threads never does.
void set_program_args(char** argv);
std::string place_threads(int threads);

// The names among `names` close to `word` ("--epochs" for "--epoch", "train"
// for "trian"; several joined with "or"), or "" when none is.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& names);
// "unknown command 'trian': did you mean train? (commands: bench, data, ...)"
// for a word that is none of the subcommands of `app`.
std::string unknown_command_message(const std::string& word, const CLI::App& app);
// Prints a parse error of `app` (the command line's words after the program
// name in `args`) as "seqpack: error: ..." on stderr, with a "did you mean"
// for an unknown option or command and the command list when none was given
// (help and --version go to stdout as CLI11 prints them). Returns the exit status.
int report_parse_error(const CLI::App& app, const CLI::ParseError& e,
                       const std::vector<std::string>& args);

// The range of a numeric option, and values just outside and at its edges (for
// the test that walks every option).
struct NumberInfo {
  std::string range;                  // "must be >= 0", "must be > 0", "must be in [1, 16384]"
  std::vector<std::string> rejected;  // e.g. "-1", "nan", "abc"
  std::vector<std::string> accepted;  // the bounds themselves
};
// The numeric options added so far, by option.
inline std::map<const CLI::Option*, NumberInfo>& number_options() {
  static std::map<const CLI::Option*, NumberInfo> all;
  return all;
}

namespace detail {

template <typename T>
std::string num_str(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
    return buf;
  } else {
    return std::to_string(v);
  }
}

// "" when `text` is a T in range; otherwise what is wrong, naming the value.
// A value past the type's own limits says so ("larger than the largest 64-bit
// integer"), rather than quoting a range it satisfies ("must be >= 1"). "-0"
// is 0 for every type, unsigned ones included, as it is for signed ones.
template <typename T>
std::string check_number(std::string& text, T min, T max, bool min_open,
                         const std::string& range) {
  T v{};
  bool negative_zero = false;  // an unsigned "-0": passed on as "0" (CLI11 2.4 rejects "-0")
  if constexpr (std::is_integral_v<T>) {
    constexpr int bits = std::numeric_limits<T>::digits + (std::is_signed_v<T> ? 1 : 0);
    const std::string type =
        std::to_string(bits) + "-bit" + (std::is_signed_v<T> ? "" : " unsigned") + " integer";
    const char* end = text.data() + text.size();
    const bool negative_digits = text.size() > 1 && text[0] == '-' &&
                                 text.find_first_not_of("0123456789", 1) == std::string::npos;
    auto [p, ec] = std::from_chars(text.data(), end, v);
    if (ec == std::errc::invalid_argument && std::is_unsigned_v<T> && negative_digits) {
      if (text.find_first_not_of('0', 1) != std::string::npos) {
        return text + " is out of range: " + range;
      }
      v = 0;  // "-0"
      negative_zero = true;
      ec = std::errc();
      p = end;
    }
    if (ec == std::errc::result_out_of_range) {
      return text + " is out of range: " +
             (text[0] == '-' ? "smaller than the smallest " + type + ", " +
                                   num_str(std::numeric_limits<T>::min())
                             : "larger than the largest " + type + ", " +
                                   num_str(std::numeric_limits<T>::max())) +
             " (" + range + ")";
    }
    if (ec != std::errc() || p != end) return "'" + text + "' is not an integer (" + range + ")";
  } else {
    char* end = nullptr;
    errno = 0;
    const double d = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size()) {
      return "'" + text + "' is not a number (" + range + ")";
    }
    if (std::isinf(d) || (errno == ERANGE && std::fabs(d) > 1)) {
      return text + " is out of range: " + (d < 0 ? "below the lowest" : "above the largest") +
             " finite double (" + range + ")";
    }
    if (errno == ERANGE) {
      return text + " is out of range: too close to 0 to be represented as a double (" + range +
             ")";
    }
    if (std::isnan(d)) return text + " is out of range: " + range;
    v = static_cast<T>(d);
  }
  if (v < min || v > max || (min_open && v == min)) return text + " is out of range: " + range;
  if (negative_zero) text = "0";
  return "";
}

}  // namespace detail

// Adds `--name` parsing into `value`, accepted in [min, max] ((min, max] with
// min_open). The error names the option (CLI11 prefixes it) and the value.
template <typename T>
CLI::Option* add_number(CLI::App& sub, const std::string& name, T& value, const std::string& help,
                        T min, T max = std::numeric_limits<T>::max(), bool min_open = false) {
  static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>);
  const bool unbounded = max == std::numeric_limits<T>::max();
  NumberInfo info;
  const std::string lo = detail::num_str(min), hi = detail::num_str(max);
  const std::string bounds = unbounded
                                 ? std::string(min_open ? "> " : ">= ") + lo
                                 : std::string(min_open ? "in (" : "in [") + lo + ", " + hi + "]";
  info.range = "must be " + bounds;
  // Just below the range, just above it (or past the type's limit), and not numbers at all.
  if constexpr (std::is_integral_v<T>) {
    if (std::is_unsigned_v<T> && min == 0) {
      info.rejected.push_back("-1");
    } else if (min == std::numeric_limits<T>::min()) {
      info.rejected.push_back(detail::num_str(min) + "0");
    } else {
      info.rejected.push_back(detail::num_str(static_cast<T>(min - 1)));
    }
    info.rejected.push_back(unbounded ? detail::num_str(max) + "0"
                                      : detail::num_str(static_cast<T>(max + 1)));
    info.rejected.push_back("1.5");
    info.accepted = {detail::num_str(static_cast<T>(min + (min_open ? 1 : 0)))};
  } else {
    info.rejected.push_back(detail::num_str(min_open ? min : min - 1));
    if (!unbounded) info.rejected.push_back(detail::num_str(max * 2 + 1));
    info.rejected.insert(info.rejected.end(), {"nan", "inf", "1e999"});
    info.accepted = {detail::num_str(min_open ? min + 0.5 : min)};
  }
  if (!unbounded) info.accepted.push_back(detail::num_str(max));
  info.rejected.push_back("abc");
  const std::string range = info.range;
  CLI::Option* opt = sub.add_option(name, value, help)->capture_default_str();
  // transform, not check: a check's changes to the text are discarded ("-0" -> "0" above).
  opt->transform(CLI::Validator(
      [=](std::string& text) { return detail::check_number<T>(text, min, max, min_open, range); },
      bounds, "seqpack-range"));
  number_options()[opt] = std::move(info);
  return opt;
}

// seqpack train's default --out, and the default --model of the commands that read a model.
inline constexpr const char* kDefaultModelDir = "seqpack-model";

// `--model DIR` of a command that reads a model. `model_dir()` names the
// directory; when --model was not given and the default does not exist, it
// throws an error saying so (the library's own message would not tell the
// user that a default was used, or where it was looked for).
class ModelOption {
 public:
  void add(CLI::App& sub) {
    sub.add_option("--model", dir_, "model directory written by seqpack train")
        ->capture_default_str()
        ->each([this](const std::string&) { given_ = true; });
  }
  const std::string& model_dir() const {
    if (!given_ && !std::filesystem::exists(dir_)) {
      throw std::invalid_argument(
          "no model: --model was not given and the default model directory '" + dir_ +
          "' does not exist in " + std::filesystem::current_path().string() +
          " (seqpack train writes it there by default; or give --model DIR)");
    }
    return dir_;
  }

 private:
  std::string dir_ = kDefaultModelDir;
  bool given_ = false;
};

}  // namespace seqpack::cli
