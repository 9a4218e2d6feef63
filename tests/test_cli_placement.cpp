// Where the tool's OpenMP threads run (tools/seqpack/command.h: placement_for,
// place_threads): the decision for every count and setting, and end to end the
// tool run again with OMP_PROC_BIND=close OMP_PLACES=cores where its threads
// fill the CPUs, with its arguments, its input and its results unchanged.
#include <gtest/gtest.h>
#include <sched.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "cli_run.h"
#include "command.h"

namespace {

namespace fs = std::filesystem;
using seqpack::cli::placement_for;
using seqpack::cli::ThreadPlacement;
using seqpack::testing::CliResult;
using seqpack::testing::run_cli;
using seqpack::testing::tiny_tsv;
using seqpack::testing::work_dir;

ThreadPlacement decide(int threads, int cpus, const std::map<std::string, std::string>& env = {}) {
  return placement_for(threads, cpus, [&env](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

int cpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  return sched_getaffinity(0, sizeof(mask), &mask) == 0 ? CPU_COUNT(&mask) : 0;
}

nlohmann::json info(const std::string& args, const std::string& env = "") {
  const CliResult r = run_cli("info --json " + args, env);
  EXPECT_EQ(r.status, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

TEST(CliPlacement, BindsWhereTheThreadsFillTheCpus) {
  EXPECT_TRUE(decide(16, 16).bind);
  EXPECT_TRUE(decide(2, 2).bind);
  EXPECT_TRUE(decide(1, 1).bind);
  const ThreadPlacement fewer = decide(8, 16);
  EXPECT_FALSE(fewer.bind);
  EXPECT_NE(fewer.why.find("8 threads on 16 CPUs"), std::string::npos) << fewer.why;
  EXPECT_FALSE(decide(1, 2).bind);
  // More threads than CPUs: not bound, or two would share a place and wait on each other.
  const ThreadPlacement more = decide(32, 16);
  EXPECT_FALSE(more.bind);
  EXPECT_NE(more.why.find("32 threads on 16 CPUs"), std::string::npos) << more.why;
  EXPECT_FALSE(decide(4, 0).bind);  // the affinity mask could not be read
}

TEST(CliPlacement, TheEnvironmentDecidesFirst) {
  for (const char* var : seqpack::cli::kPlacementVariables) {
    const ThreadPlacement p = decide(16, 16, {{var, "false"}});
    EXPECT_FALSE(p.bind) << var;
    EXPECT_NE(p.why.find(var), std::string::npos) << p.why;
    EXPECT_FALSE(decide(16, 16, {{var, "x"}, {"SEQPACK_BIND_THREADS", "1"}}).bind) << var;
  }
  EXPECT_TRUE(decide(16, 16, {{"OMP_PROC_BIND", ""}}).bind);  // empty: unset
  EXPECT_FALSE(decide(16, 16, {{"SEQPACK_BIND_THREADS", "0"}}).bind);
  EXPECT_TRUE(decide(1, 16, {{"SEQPACK_BIND_THREADS", "1"}}).bind);
  EXPECT_TRUE(decide(16, 16, {{"SEQPACK_BIND_THREADS", ""}}).bind);
}

TEST(CliPlacement, ABadKnobIsRefusedByName) {
  for (const char* bad : {"2", "yes", "-1", " 1"}) {
    try {
      decide(16, 16, {{"SEQPACK_BIND_THREADS", bad}});
      ADD_FAILURE() << "SEQPACK_BIND_THREADS=" << bad << " was taken";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()),
                "SEQPACK_BIND_THREADS: '" + std::string(bad) + "' is not 0 or 1");
    }
  }
  const CliResult r = run_cli("info", "SEQPACK_BIND_THREADS=on");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("SEQPACK_BIND_THREADS: 'on' is not 0 or 1"), std::string::npos) << r.err;
}

// Settings of the test's own environment that decide before the tool does.
bool placed_by_environment() {
  for (const char* var : seqpack::cli::kPlacementVariables) {
    if (const char* v = std::getenv(var); v && *v) return true;
  }
  const char* knob = std::getenv("SEQPACK_BIND_THREADS");
  return knob && *knob;
}

TEST(CliPlacement, TheToolBindsItsThreadsWhereTheyFillTheCpus) {
  if (placed_by_environment()) GTEST_SKIP() << "this environment places OpenMP's threads itself";
  const int n = cpus();
  ASSERT_GT(n, 0);
  const nlohmann::json all = info("--threads " + std::to_string(n));
  EXPECT_EQ(all["threads"], n);
  EXPECT_TRUE(all["threads_bound"].get<bool>()) << all.dump();
  EXPECT_NE(all["thread_placement"].get<std::string>().find("by seqpack"), std::string::npos);
  // OpenMP's default count is every CPU: the tool's default binds too.
  if (!std::getenv("OMP_NUM_THREADS")) EXPECT_TRUE(info("").at("threads_bound").get<bool>());
  for (const char* env : {"SEQPACK_BIND_THREADS=0", "OMP_PROC_BIND=false"}) {
    const nlohmann::json off = info("--threads " + std::to_string(n), env);
    EXPECT_FALSE(off["threads_bound"].get<bool>()) << env;
  }
  // A binding of the user's own is kept, and named as theirs.
  const nlohmann::json theirs = info("", "OMP_PROC_BIND=spread");
  EXPECT_TRUE(theirs["threads_bound"].get<bool>());
  EXPECT_NE(theirs["thread_placement"].get<std::string>().find("environment"), std::string::npos);
  EXPECT_TRUE(info("--threads 1", "SEQPACK_BIND_THREADS=1").at("threads_bound").get<bool>());
  if (n > 1) {
    const nlohmann::json one = info("--threads 1");
    EXPECT_FALSE(one["threads_bound"].get<bool>());
    EXPECT_NE(one["thread_placement"].get<std::string>().find("1 thread on"), std::string::npos);
  }
}

// The tool run again gets every argument and its standard input as they were,
// and a bound run trains the same model as an unbound one (the threads' share
// of the work depends on their count, not on where they run).
TEST(CliPlacement, ABoundRunKeepsItsArgumentsInputAndResults) {
  const std::string threads = " --threads " + std::to_string(cpus());
  std::map<std::string, std::string> model;
  for (const char* env : {"SEQPACK_BIND_THREADS=0", ""}) {
    const fs::path out =
        work_dir() / (std::string("placement_model") + (*env ? "_unbound" : "_bound"));
    const CliResult r =
        run_cli("train --data '" + tiny_tsv().string() + "' --epochs 2 --batch-size 4 --out '" +
                    out.string() + "'" + threads,
                env);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("epoch 2/2"), std::string::npos) << r.out;
    model[env] = seqpack::testing::read_file(out / "model.safetensors");
    const fs::path words = work_dir() / "placement_words.txt";
    std::ofstream(words) << "house\n";
    const CliResult p = run_cli(
        "predict --model '" + out.string() + "' --stream" + threads + " < '" + words.string() + "'",
        env);
    ASSERT_EQ(p.status, 0) << p.err;
    EXPECT_NE(p.out.find("house"), std::string::npos) << p.out;
  }
  EXPECT_FALSE(model[""].empty());
  EXPECT_TRUE(model[""] == model["SEQPACK_BIND_THREADS=0"]) << "a bound run trained another model";
}

}  // namespace

namespace {

// Run by hand through the dynamic loader, /proc/self/exe is the loader:
// running it again failed ("info: cannot open shared object file"). The tool
// sees that it cannot be run again as itself and runs unbound, saying so.
TEST(CliPlacement, UnderTheDynamicLoaderItRunsUnboundAndSaysWhy) {
  const char* loader = "/lib64/ld-linux-x86-64.so.2";
  if (!std::filesystem::exists(loader)) GTEST_SKIP() << "no " << loader << " on this machine";
  const CliResult r = run_cli("info --json", std::string("SEQPACK_BIND_THREADS=1 ") + loader);
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j.at("threads_bound").get<bool>()) << r.out;
  EXPECT_NE(j.at("thread_placement").get<std::string>().find("/proc/self/exe is not this program"),
            std::string::npos)
      << r.out;
}

// libgomp's warnings as it loads (a bad OMP_NUM_THREADS) printed in the tool
// and again in its run again: once now.
TEST(CliPlacement, LibgompWarningsPrintOnceAcrossTheRunAgain) {
  const CliResult r = run_cli("info --json", "SEQPACK_BIND_THREADS=1 OMP_NUM_THREADS=abc");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(nlohmann::json::parse(r.out).at("threads_bound").get<bool>()) << r.out;
  const std::string warning = "Invalid value for environment variable OMP_NUM_THREADS";
  const std::size_t first = r.err.find(warning);
  ASSERT_NE(first, std::string::npos) << r.err;  // libgomp's own warning, once
  EXPECT_EQ(r.err.find(warning, first + 1), std::string::npos) << r.err;
}

// The reason variable set by hand to bytes that are not UTF-8 made `info
// --json` fail with a JSON type error.
TEST(CliPlacement, AnyBytesInTheReasonVariableGiveValidJson) {
  const CliResult r = run_cli("info --json",
                              "SEQPACK_THREADS_BOUND_BY_TOOL=\"$(printf '\\377\\376x')\" "
                              "OMP_PROC_BIND=close");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_NE(j.at("thread_placement").get<std::string>().find("??x"), std::string::npos) << r.out;
}

}  // namespace
