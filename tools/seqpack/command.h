// Subcommands of the seqpack tool register themselves here, one file each
// (cmd_demo.cpp, cmd_train.cpp, ...), so main.cpp never changes.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace seqpack::cli {

struct Command {
  std::string name;
  std::string description;
  // Adds options to `sub` and sets its callback.
  std::function<void(CLI::App& sub)> setup;
};

std::vector<Command>& commands();

// Usage, at namespace scope of a cmd_*.cpp:
//   static const bool registered = seqpack::cli::register_command({"demo", "...", setup});
inline bool register_command(Command command) {
  commands().push_back(std::move(command));
  return true;
}

}  // namespace seqpack::cli
