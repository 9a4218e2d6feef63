// The registry of subcommands and the app holding them all (used by main.cpp
// and by tests/test_cli_options.cpp, which walks every option).
#include <algorithm>

#include "command.h"
#include "seqpack/version.h"

namespace seqpack::cli {

std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}

void add_commands(CLI::App& app) {
  // `seqpack --version` prints "seqpack 0.1.0" and exits 0 (the flag is
  // handled before the required subcommand is asked for).
  app.set_version_flag("--version", std::string("seqpack ") + version());
  app.require_subcommand(1);
  auto& cmds = commands();
  std::sort(cmds.begin(), cmds.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (auto& cmd : cmds) {
    CLI::App* sub = app.add_subcommand(cmd.name, cmd.description);
    cmd.setup(*sub);
  }
}

}  // namespace seqpack::cli
