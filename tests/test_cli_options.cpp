// Every numeric option of every subcommand of the seqpack tool rejects values
// out of its range with a message naming the option and the value. The test
// builds the tool's own app (the same add_commands as main.cpp) and walks its
// option list, so a new subcommand or option is covered without editing this
// file, and a numeric option added without add_number fails here.
// A few rejections are also run through the real binary for the exit status
// and the message on stderr.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli_run.h"
#include "command.h"

namespace {

using seqpack::cli::number_options;
using seqpack::cli::NumberInfo;

struct NumericOption {
  std::vector<std::string> path;  // "data", "stats"
  std::string name;               // "--batch-size"
  NumberInfo info;
};

bool is_numeric_type(const std::string& type_name) {
  const std::string base = type_name.substr(0, type_name.find(':'));
  return base == "INT" || base == "UINT" || base == "FLOAT" || base == "NUMBER";
}

// Every option of `app` and its subcommands; a numeric option without a range fails.
void walk(const CLI::App& app, std::vector<std::string> path, std::vector<NumericOption>& out) {
  for (const CLI::Option* o : app.get_options()) {
    if (o->get_type_size() == 0 || o->get_name() == "--help") continue;  // flags
    const bool registered = number_options().count(o) > 0;
    if (is_numeric_type(o->get_type_name())) {
      EXPECT_TRUE(registered) << "seqpack " << (path.empty() ? "" : path.back()) << " "
                              << o->get_name() << " is numeric (" << o->get_type_name()
                              << ") but was not added with seqpack::cli::add_number, so its "
                                 "range is never checked";
    }
    if (registered) out.push_back({path, o->get_name(), number_options().at(o)});
  }
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    auto p = path;
    p.push_back(sub->get_name());
    walk(*sub, p, out);
  }
}

// A fresh app of the tool, callbacks and all. (Removing a command's callback
// would free the arguments its options write into: they live in the callback.)
std::unique_ptr<CLI::App> make_app() {
  number_options().clear();
  auto app = std::make_unique<CLI::App>("seqpack");
  seqpack::cli::add_commands(*app);
  return app;
}

std::vector<NumericOption> all_numeric_options() {
  auto app = make_app();
  std::vector<NumericOption> out;
  walk(*app, {}, out);
  return out;
}

// The parse error for `path name value`, or "" when it parsed (errors about
// other, missing options do not count: only this option's value is judged).
std::string parse_error(const NumericOption& o, const std::string& value) {
  auto app = make_app();
  std::vector<std::string> args = {"seqpack"};
  args.insert(args.end(), o.path.begin(), o.path.end());
  args.push_back(o.name + "=" + value);  // "=" so a value like -1 is never read as a flag
  // An unknown last argument: CLI11 rejects it (ExtrasError) after every
  // option's value has been converted and checked and before any command's
  // callback runs, so parsing never runs a command.
  args.push_back("--not-an-option-of-any-command");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    app->parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::RequiredError&) {
    return "";
  } catch (const CLI::ExtrasError&) {
    return "";
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

TEST(CliOptions, EveryNumericOptionIsRangeChecked) {
  const auto options = all_numeric_options();
  // The walk finds the options we know of (a control that it walks at all).
  std::vector<std::string> names;
  for (const auto& o : options) {
    std::string p;
    for (const auto& s : o.path) p += s + " ";
    names.push_back(p + o.name);
  }
  for (const char* expected :
       {"train --threads", "train --epochs", "train --lr", "train --seed", "bench --threads",
        "bench --scale", "bench --min-time", "predict --top", "data stats --batch-size",
        "data export --words-per-language", "demo --seed"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  }
  int checked = 0;
  for (const auto& o : options) {
    std::string cmd;
    for (const auto& s : o.path) cmd += s + " ";
    for (const auto& bad : o.info.rejected) {
      SCOPED_TRACE("seqpack " + cmd + o.name + " " + bad);
      const std::string err = parse_error(o, bad);
      EXPECT_NE(err.find(o.name), std::string::npos) << "accepted, or the error does not name the "
                                                        "option: '"
                                                     << err << "'";
      EXPECT_NE(err.find(bad), std::string::npos)
          << "the error does not name the value: '" << err << "'";
      ++checked;
    }
    for (const auto& good : o.info.accepted) {
      EXPECT_EQ(parse_error(o, good), "")
          << "seqpack " << cmd << o.name << " " << good << " is in range (" << o.info.range << ")";
    }
  }
  EXPECT_GE(checked, 4 * static_cast<int>(options.size()));
}

// Hand-picked values with the exact messages (docs/errors.md), through the binary.
TEST(CliOptions, TheToolRejectsOutOfRangeValuesBeforeDoingAnything) {
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"train --threads -1", "--threads: -1 is out of range: must be in [0, 1024]"},
      {"train --epochs 0", "--epochs: 0 is out of range: must be >= 1"},
      {"train --lr 0", "--lr: 0 is out of range: must be > 0"},
      {"train --lr nan", "--lr: nan is out of range: must be > 0"},
      {"train --hidden 100000", "--hidden: 100000 is out of range: must be in [1, 16384]"},
      {"train --seed -3", "--seed: -3 is out of range: must be >= 0"},
      {"train --batch-size two", "--batch-size: 'two' is not an integer (must be >= 1)"},
      {"predict --top 0 word", "--top: 0 is out of range: must be >= 1"},
      {"bench --threads 0", "--threads: 0 is out of range: must be in [1, 1024]"},
      {"bench --min-time 0", "--min-time: 0 is out of range: must be in (0, 3600]"},
      {"data stats --batch-size 0", "--batch-size: 0 is out of range: must be >= 1"},
  };
  for (const auto& c : cases) {
    const auto r = seqpack::testing::run_cli(c.args);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_LT(r.status, 128) << c.args;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << ": " << r.err;
    EXPECT_EQ(r.out, "") << c.args << " did something before rejecting the value";
  }
}

// The guesses behind "did you mean" (ErrorsCli.DidYouMean runs them through the tool).
TEST(CliOptions, DidYouMeanPicksTheClosestNames) {
  using seqpack::cli::did_you_mean;
  const std::vector<std::string> opts = {"--epochs", "--embed", "--model", "--hidden", "--help",
                                         "--threads", "--top"};
  EXPECT_EQ(did_you_mean("--epoch", opts), "--epochs");
  EXPECT_EQ(did_you_mean("--modle", opts), "--model");   // a transposition is one edit
  EXPECT_EQ(did_you_mean("--hid", opts), "--hidden");    // the start of exactly one
  EXPECT_EQ(did_you_mean("--tpo", opts), "--top");
  EXPECT_EQ(did_you_mean("--xyzzy", opts), "");
  EXPECT_EQ(did_you_mean("--embeds", opts), "--embed");
  EXPECT_EQ(did_you_mean("--epocs", opts), "--epochs");
  EXPECT_EQ(did_you_mean("trian", {"train", "predict", "bench"}), "train");
  EXPECT_EQ(did_you_mean("--eh", opts), "");  // too short to guess
  EXPECT_EQ(did_you_mean("--frob", {"--lr", "--out", "--seed", "-h"}), "");
}

}  // namespace
