// The seqpack command-line tool: a thin front end over the public headers.
#include <cstdio>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>

#include "command.h"

namespace {

// The subcommand being run ("predict"), for errors that do not say it themselves.
std::string command_of(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) return sub->get_name();
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"seqpack: variable-length sequence batching and packed recurrent networks"};
  seqpack::cli::add_commands(app);
  const auto& cmds = seqpack::cli::commands();
  // CLI11 reports an unknown first word only as "A subcommand is required";
  // name it and list the commands instead.
  if (argc > 1 && argv[1][0] != '-') {
    const std::string word = argv[1];
    bool known = false;
    std::string names;
    for (const auto& cmd : cmds) {
      known = known || cmd.name == word;
      names += (names.empty() ? "" : ", ") + cmd.name;
    }
    if (!known) {
      std::fprintf(stderr, "seqpack: error: unknown command '%s' (commands: %s)\n", word.c_str(),
                   names.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
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
