// The seqpack command-line tool: a thin front end over the public headers.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "command.h"
#include "seqpack/policy.h"

namespace {

// The subcommand being run ("predict"), for errors that do not say it themselves.
std::string command_of(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) return sub->get_name();
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  seqpack::cli::set_program_args(argv);
  CLI::App app{"seqpack: variable-length sequence batching and packed recurrent networks"};
  seqpack::cli::add_commands(app);
  const std::vector<std::string> args(argv + (argc > 0 ? 1 : 0), argv + std::max(argc, 1));
  // CLI11 reports an unknown first word only as "A subcommand is required";
  // name it, guess what was meant and list the commands instead.
  if (!args.empty() && !args[0].empty() && args[0][0] != '-') {
    const auto& cmds = seqpack::cli::commands();
    const bool known = std::any_of(cmds.begin(), cmds.end(),
                                   [&](const auto& cmd) { return cmd.name == args[0]; });
    if (!known) {
      std::fprintf(stderr, "seqpack: error: %s\n",
                   seqpack::cli::unknown_command_message(args[0], app).c_str());
      return 2;
    }
  }
  try {
    // The core reads no environment: the tool installs the SEQPACK_* policy.
    seqpack::set_policy(seqpack::policy_from_environment());
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return seqpack::cli::report_parse_error(app, e, args);
  } catch (const std::bad_alloc& e) {
    // A bare std::bad_alloc says nothing; seqpack's own (AllocationError) names the tensor.
    std::fprintf(stderr, "seqpack: error: out of memory while running 'seqpack %s' (%s)\n",
                 command_of(app).c_str(), e.what());
    return 1;
  } catch (const std::system_error& e) {  // std::ios_base::failure, std::filesystem errors
    std::fprintf(stderr, "seqpack: error: while running 'seqpack %s': %s\n",
                 command_of(app).c_str(), e.what());
    return 1;
  } catch (const std::invalid_argument& e) {
    // seqpack's own errors: the message names the value and where it came from.
    std::fprintf(stderr, "seqpack: error: %s\n", e.what());
    return 1;
  } catch (const std::runtime_error& e) {
    std::fprintf(stderr, "seqpack: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    // From the standard library or nlohmann-json, which do not say what was being done.
    std::fprintf(stderr, "seqpack: error: while running 'seqpack %s': %s\n",
                 command_of(app).c_str(), e.what());
    return 1;
  }
  return 0;
}
