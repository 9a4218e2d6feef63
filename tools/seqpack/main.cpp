// The seqpack command-line tool: a thin front end over the public headers.
#include <cstdio>
#include <exception>
#include <string>

#include "command.h"

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
  } catch (const std::exception& e) {
    std::fprintf(stderr, "seqpack: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
