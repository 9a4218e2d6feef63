// The seqpack command-line tool: a thin front end over the public headers.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
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

// Descriptors 0, 1 and 2 that the parent left closed are opened on /dev/null,
// so that no file the tool opens (train's lock file) takes their number and
// receives its output. Each is opened the other way round (standard output
// read-only), so a write to a closed standard output still fails (EBADF) and
// is reported, as coreutils do.
void open_standard_descriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int got = ::open("/dev/null", fd == 0 ? O_WRONLY : O_RDONLY);
    if (got >= 0 && got != fd) {  // cannot happen: the lowest free number is fd
      ::dup2(got, fd);
      ::close(got);
    }
  }
}

// Everything the command printed reached standard output: a full disk
// (/dev/full), a closed descriptor or a broken pipe is an error with its
// reason, not a silent success. Output larger than stdio's buffer fails
// earlier, in fmt::print (a std::system_error); this catches the rest.
// Returns the error message, or "" when all was written.
std::string standard_output_error() {
  errno = 0;
  const bool flush_failed = std::fflush(stdout) != 0;
  const int err = errno;
  if (!flush_failed && !std::ferror(stdout)) return "";
  return std::string("cannot write to standard output: ") +
         (flush_failed && err != 0 ? std::strerror(err) : "an earlier write failed");
}

}  // namespace

int main(int argc, char** argv) {
  open_standard_descriptors();
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
    // The core reads no environment: the tool reads the SEQPACK_* policy
    // once, here (a bad value is reported before any command runs), and its
    // commands give it to what they make (tool_policy).
    (void)seqpack::cli::tool_policy();
    app.parse(argc, argv);
    const std::string out_error = standard_output_error();
    if (!out_error.empty()) {
      std::fprintf(stderr, "seqpack: error: %s (while running 'seqpack %s')\n", out_error.c_str(),
                   command_of(app).c_str());
      return 1;
    }
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
