// One version everywhere: the header's macros, the library's seqpack::version(),
// `seqpack --version` and `seqpack info` all name CMake's
// project(seqpack VERSION x.y.z), read here from CMakeLists.txt itself.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "cli_run.h"
#include "seqpack/version.h"

namespace seqpack {
namespace {

using testing::run_cli;

// "0.1.0" from the top-level CMakeLists.txt's project(seqpack VERSION 0.1.0 ...).
std::string cmake_project_version() {
  std::ifstream in(std::string(SEQPACK_SOURCE_DIR) + "/CMakeLists.txt");
  std::stringstream text;
  text << in.rdbuf();
  std::smatch m;
  const std::string s = text.str();
  if (!std::regex_search(s, m, std::regex(R"(project\(\s*seqpack\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+))")))
    return "(no project(seqpack VERSION ...) in CMakeLists.txt)";
  return m[1];
}

TEST(Version, HeaderMacrosAreTheProjectVersion) {
  const std::string composed = std::to_string(SEQPACK_VERSION_MAJOR) + "." +
                               std::to_string(SEQPACK_VERSION_MINOR) + "." +
                               std::to_string(SEQPACK_VERSION_PATCH);
  EXPECT_EQ(composed, SEQPACK_VERSION_STRING);
  EXPECT_EQ(std::string(SEQPACK_VERSION_STRING), cmake_project_version());
}

TEST(Version, LibraryFunctionEqualsTheHeaderMacro) {
  EXPECT_EQ(std::string(version()), SEQPACK_VERSION_STRING);
  EXPECT_EQ(std::string(version()), cmake_project_version());
}

TEST(Version, ToolPrintsItsVersionAndExitsZero) {
  const auto r = run_cli("--version");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "seqpack " + cmake_project_version() + "\n");
  EXPECT_EQ(r.err, "");
}

TEST(Version, InfoShowsTheVersion) {
  const auto table = run_cli("info");
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_EQ(table.out.rfind("seqpack          " + cmake_project_version() + "\n", 0), 0u)
      << table.out;
  const auto json = run_cli("info --json");
  ASSERT_EQ(json.status, 0) << json.err;
  EXPECT_NE(json.out.find("\"seqpack\":\"" + cmake_project_version() + "\""), std::string::npos)
      << json.out;
}

}  // namespace
}  // namespace seqpack
