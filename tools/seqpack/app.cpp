// The registry of subcommands and the app holding them all (used by main.cpp
// and by tests/test_cli_options.cpp, which walks every option), and how the
// tool reports a command line it cannot parse.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "command.h"
#include "seqpack/policy.h"
#include "seqpack/version.h"

namespace seqpack::cli {

const Policy& tool_policy() {
  static const Policy policy = policy_from_environment();
  return policy;
}

std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}

const char* const kExitCodes =
    "Exit status:\n"
    "  0    success\n"
    "  1    the command failed (bad input, a file or model that cannot be read or written, a\n"
    "       non-finite result, out of memory); the message says what and where\n"
    "  2    unknown command (seqpack frobnicate, seqpack data exprot)\n"
    "  105  an option's value is out of its range or not one of its choices\n"
    "  106  a required argument is missing (no command, a required option)\n"
    "  109  unexpected arguments (an unknown option, a word the command does not take)\n"
    "  114  an option is missing its value (--model with nothing after it)\n"
    "  other codes from 100 to 127: another command-line error (CLI11's ExitCodes)\n"
    "  128 + N: killed by signal N\n";

void add_commands(CLI::App& app) {
  // `seqpack --version` prints "seqpack 0.1.0" and exits 0 (the flag is
  // handled before the required subcommand is asked for).
  app.set_version_flag("--version", std::string("seqpack ") + version());
  app.require_subcommand(1);
  app.footer(std::string("\nRun 'seqpack COMMAND --help' for a command's options.\n\n") + kExitCodes);
  auto& cmds = commands();
  std::sort(cmds.begin(), cmds.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (auto& cmd : cmds) {
    CLI::App* sub = app.add_subcommand(cmd.name, cmd.description);
    cmd.setup(*sub);
  }
}

namespace {

// Edit distance with adjacent transpositions (optimal string alignment):
// "modle" is 1 from "model", "epoch" 1 from "epochs".
std::size_t edit_distance(const std::string& a, const std::string& b) {
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<std::size_t>> d(n + 1, std::vector<std::size_t>(m + 1));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= n; ++i) {
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

// The command being parsed: the deepest subcommand the parse reached.
const CLI::App* deepest_command(const CLI::App& app) {
  const CLI::App* at = &app;
  while (!at->get_subcommands().empty()) at = at->get_subcommands().front();
  return at;
}

// "seqpack data export"
std::string command_path(const CLI::App* app) {
  std::string path;
  for (const CLI::App* a = app; a != nullptr; a = a->get_parent()) {
    path = (a->get_parent() == nullptr ? std::string("seqpack") : a->get_name()) +
           (path.empty() ? "" : " ") + path;
  }
  return path;
}

std::vector<std::string> subcommand_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    names.push_back(sub->get_name());
  }
  return names;
}

// "  bench    time ..." lines, one per subcommand of `app`.
std::string command_list(const CLI::App& app) {
  std::size_t width = 0;
  const auto subs = app.get_subcommands([](const CLI::App*) { return true; });
  for (const CLI::App* sub : subs) width = std::max(width, sub->get_name().size());
  std::string out;
  for (const CLI::App* sub : subs) {
    out += "  " + sub->get_name() + std::string(width + 2 - sub->get_name().size(), ' ') +
           sub->get_description() + "\n";
  }
  return out;
}

// The long option names of `app` ("--model") and its short ones ("-h").
std::set<std::string> option_names(const CLI::App& app) {
  std::set<std::string> names;
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& l : o->get_lnames()) names.insert("--" + l);
    for (const std::string& s : o->get_snames()) names.insert("-" + s);
  }
  return names;
}

bool is_number(const std::string& s) {
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size();
}

}  // namespace

std::string did_you_mean(const std::string& word, const std::vector<std::string>& names) {
  // Close enough to be a slip of the keyboard: one edit in a short name, two
  // in a longer one; or the start of exactly one name ("--hid" for "--hidden").
  std::string core = word;
  while (!core.empty() && core[0] == '-') core.erase(0, 1);
  const std::size_t limit = core.size() <= 3 ? 1 : 2;
  std::size_t best = limit + 1;
  std::vector<std::string> found;
  std::vector<std::string> prefixed;
  for (const std::string& name : names) {
    std::string n = name;
    while (!n.empty() && n[0] == '-') n.erase(0, 1);
    if (n == core) continue;
    if (core.size() >= 2 && n.rfind(core, 0) == 0) prefixed.push_back(name);
    const std::size_t d = edit_distance(core, n);
    if (d > limit) continue;
    if (d < best) {
      best = d;
      found = {name};
    } else if (d == best) {
      found.push_back(name);
    }
  }
  if (found.empty() && prefixed.size() == 1) found = prefixed;
  std::string out;
  for (std::size_t i = 0; i < found.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == found.size() ? " or " : ", ") + found[i];
  }
  return out;
}

std::string unknown_command_message(const std::string& word, const CLI::App& app) {
  const std::vector<std::string> names = subcommand_names(app);
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  const std::string guess = did_you_mean(word, names);
  return "unknown command '" + word + "'" + (guess.empty() ? "" : ": did you mean " + guess + "?") +
         " (commands: " + list + ")";
}

int report_parse_error(const CLI::App& app, const CLI::ParseError& e,
                       const std::vector<std::string>& args) {
  if (e.get_exit_code() == 0) return app.exit(e);  // help and --version, on stdout
  // By type: CLI11 names some errors after the app that raised them (get_name()).
  const bool required = dynamic_cast<const CLI::RequiredError*>(&e) != nullptr;
  const bool extras = dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr;
  const bool validation = dynamic_cast<const CLI::ValidationError*>(&e) != nullptr;
  const CLI::App* at = deepest_command(app);
  const std::string path = command_path(at);
  const bool has_subcommands = !subcommand_names(*at).empty();
  std::string message = e.what();
  std::string after;  // lines after the message
  if (required && has_subcommands && message.find("subcommand") != std::string::npos) {
    // `seqpack data exprot`: the first word after the command names no subcommand of it.
    std::size_t depth = 0;
    for (const CLI::App* a = at; a->get_parent() != nullptr; a = a->get_parent()) ++depth;
    for (const std::string& arg : args) {
      if (depth > 0) {
        depth -= arg.empty() || arg[0] != '-' ? 1 : 0;
        continue;
      }
      if (arg.empty() || arg[0] == '-') continue;
      std::fprintf(stderr, "seqpack: error: %s\n", unknown_command_message(arg, *at).c_str());
      return 2;
    }
    // A bare `seqpack` (or `seqpack data`): what the commands are.
    message = "a command is required: " + path + " COMMAND [OPTIONS], COMMAND one of";
    after = command_list(*at) + "Run '" + path + " COMMAND --help' for a command's options.\n";
  } else if (extras) {
    // Name the unknown options and the words that look like a mistyped command.
    const std::set<std::string> known = option_names(*at);
    std::vector<std::string> candidates(known.begin(), known.end());
    // The command line's words, past the names of the commands on the way to `at`.
    std::vector<const CLI::App*> chain;
    for (const CLI::App* a = at; a != nullptr; a = a->get_parent()) chain.insert(chain.begin(), a);
    std::size_t depth = 1;
    bool command_named = false;
    std::vector<std::string> notes;
    for (const std::string& arg : args) {
      if (arg == "--") break;
      if (depth < chain.size() && arg == chain[depth]->get_name()) {
        ++depth;
        continue;
      }
      if (arg.size() < 2 || arg[0] != '-' || is_number(arg)) {
        // `seqpack data exprot`: the first word after a command that has commands.
        if (has_subcommands && depth == chain.size() && !command_named && !arg.empty() &&
            arg[0] != '-') {
          notes.push_back(unknown_command_message(arg, *at));
          command_named = true;
        }
        continue;
      }
      const std::string name = arg.substr(0, arg.find('='));
      if (known.count(name) > 0) continue;
      const std::string guess = did_you_mean(name, candidates);
      notes.push_back(path + " has no option " + name +
                      (guess.empty() ? "" : ": did you mean " + guess + "?"));
    }
    for (const std::string& n : notes) message += "; " + n;
    message += " (see '" + path + " --help')";
  } else if (!validation) {
    message += " (see '" + path + " --help')";
  }
  std::fprintf(stderr, "seqpack: error: %s\n%s", message.c_str(), after.c_str());
  return e.get_exit_code();
}

}  // namespace seqpack::cli
