// Runs the seqpack command-line tool (SEQPACK_CLI_PATH, set by tests/CMakeLists.txt)
// for the command-line tests, and a work directory for the files they write.
//
//   const CliResult r = run_cli("train --data " + tsv + " --epochs 1");
//   ASSERT_EQ(r.status, 0) << r.err;
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "temp_dir.h"

namespace seqpack::testing {

struct CliResult {
  int status;  // the exit code, or 128 + the signal that ended the process
  std::string out, err;
};

// A directory for this test program's files, removed when it exits.
inline const std::filesystem::path& work_dir() {
  static const TempDir dir;
  return dir.path;
}

// `seqpack <args>` through the shell, with `env` (e.g. "SEQPACK_X=1") before it.
inline CliResult run_cli(const std::string& args, const std::string& env = "") {
  static const TempDir dir;  // the captured output, apart from the test's own files
  const std::string out = dir.file("stdout.txt"), err = dir.file("stderr.txt");
  const std::string cmd = env + (env.empty() ? "" : " ") + "'" + SEQPACK_CLI_PATH + "' " + args +
                          " >'" + out + "' 2>'" + err + "'";
  const int raw = std::system(cmd.c_str());
  const int status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  return {status, read_file(out), read_file(err)};
}

// 20 words (10 English, 10 French) as a label<TAB>text file: a training run on
// it takes well under a second.
inline const std::filesystem::path& tiny_tsv() {
  static const std::filesystem::path p = [] {
    const std::filesystem::path f = work_dir() / "tiny.tsv";
    const char* en[] = {"the", "house", "water", "night", "light", "which", "there", "would", "about", "think"};
    const char* fr[] = {"maison", "eau", "nuit", "été", "château", "être", "très", "quelle", "chose", "année"};
    std::ofstream o(f);
    for (int i = 0; i < 10; ++i) o << "english\t" << en[i] << "\nfrench\t" << fr[i] << "\n";
    return f;
  }();
  return p;
}

}  // namespace seqpack::testing
