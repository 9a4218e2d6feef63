// Checkpoints and `seqpack train --resume`: a run stopped after epoch 1 and
// resumed ends with the same bytes as an uninterrupted run (one thread);
// missing, corrupt and finished checkpoints and conflicting flags are clear
// errors. (A process killed at any point of a save: test_model_dir_faults.) Tiny TSV and sizes, so each run takes well under a second.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_run.h"
#include "seqpack/classifier.h"
#include "seqpack/model_dir.h"
#include "seqpack/optim.h"
#include "seqpack/safetensors.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using seqpack::testing::CliResult;
using seqpack::testing::run_cli;
using seqpack::testing::tiny_tsv;
using seqpack::testing::work_dir;

std::string slurp(const fs::path& p) { return seqpack::testing::read_file(p.string()); }

// Small enough to be fast, with several batches per epoch so the batch order
// (a function of seed and epoch) matters.
std::string train_args(const fs::path& out, int epochs) {
  return "train --quiet --threads 1 --data " + tiny_tsv().string() + " --epochs " +
         std::to_string(epochs) + " --hidden 8 --embed 4 --batch-size 4 --seed 7 --out " + out.string();
}

// Trained once for all tests: 3 epochs without interruption.
const fs::path& full_run() {
  static const fs::path p = [] {
    const fs::path d = work_dir() / "full";
    const CliResult r = run_cli(train_args(d, 3));
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    return d;
  }();
  return p;
}

TEST(CliResume, OneEpochThenResumeMatchesAnUninterruptedRunBitForBit) {
  const fs::path part = work_dir() / "part";
  CliResult r1 = run_cli(train_args(part, 1));
  ASSERT_EQ(r1.status, 0) << r1.out << r1.err;
  ASSERT_TRUE(fs::exists(part / "checkpoint.safetensors"));
  EXPECT_EQ(seqpack::load_training_checkpoint((part / "checkpoint.safetensors").string()).epoch, 1);

  CliResult r2 = run_cli("train --quiet --threads 1 --epochs 3 --resume " + part.string());
  ASSERT_EQ(r2.status, 0) << r2.out << r2.err;
  EXPECT_NE(r2.out.find("epoch 1 of 3 done"), std::string::npos) << r2.out;
  EXPECT_EQ(r2.out.find("epoch 1/3:"), std::string::npos) << r2.out;  // not retrained
  EXPECT_NE(r2.out.find("epoch 3/3:"), std::string::npos) << r2.out;

  const fs::path full = full_run();
  const std::string a = slurp(full / "model.safetensors"), b = slurp(part / "model.safetensors");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the resumed model differs from the uninterrupted one";
  // The checkpoints agree too (weights, Adam moments and step, epoch, config).
  EXPECT_TRUE(slurp(full / "checkpoint.safetensors") == slurp(part / "checkpoint.safetensors"));
  const auto ck = seqpack::load_training_checkpoint((part / "checkpoint.safetensors").string());
  EXPECT_EQ(ck.epoch, 3);
  EXPECT_EQ(ck.adam_step, 3 * 4);  // 16 training words in batches of 4
  // A control that can fail: a run that differs (2 epochs) gives other weights.
  const fs::path two = work_dir() / "two";
  ASSERT_EQ(run_cli(train_args(two, 2)).status, 0);
  EXPECT_FALSE(slurp(two / "model.safetensors") == a);
}

TEST(CliResume, MissingOrCorruptCheckpointNamesThePath) {
  const fs::path none = work_dir() / "never-trained";
  CliResult m = run_cli("train --resume " + none.string());
  EXPECT_NE(m.status, 0);
  EXPECT_NE(m.err.find("no checkpoint at " + none.string()), std::string::npos) << m.err;

  const fs::path empty_dir = work_dir() / "empty-dir";
  fs::create_directories(empty_dir);
  CliResult e = run_cli("train --resume " + empty_dir.string());
  EXPECT_NE(e.status, 0);
  EXPECT_NE(e.err.find((empty_dir / "checkpoint.safetensors").string()), std::string::npos) << e.err;

  const fs::path garbage = work_dir() / "garbage";
  fs::create_directories(garbage);
  std::ofstream(garbage / "checkpoint.safetensors") << "this is not a checkpoint";
  CliResult g = run_cli("train --resume " + garbage.string());
  EXPECT_NE(g.status, 0);
  EXPECT_NE(g.err.find((garbage / "checkpoint.safetensors").string() + " is corrupt"), std::string::npos)
      << g.err;

  // A real checkpoint cut short.
  const std::string whole = slurp(full_run() / "checkpoint.safetensors");
  const fs::path cut = work_dir() / "truncated";
  fs::create_directories(cut);
  std::ofstream(cut / "checkpoint.safetensors", std::ios::binary) << whole.substr(0, whole.size() / 2);
  CliResult t = run_cli("train --resume " + cut.string());
  EXPECT_NE(t.status, 0);
  EXPECT_NE(t.err.find((cut / "checkpoint.safetensors").string()), std::string::npos) << t.err;

  // A valid safetensors file that is not a checkpoint (the saved model).
  CliResult w = run_cli("train --resume " + (full_run() / "model.safetensors").string());
  EXPECT_NE(w.status, 0);
  EXPECT_NE(w.err.find("model.safetensors has format 'pt', expected 'seqpack-train-checkpoint'"), std::string::npos) << w.err;
}

TEST(CliResume, FinishedCheckpointSaysSoAndConflictingFlagsAreNamed) {
  const fs::path full = full_run();
  const std::string model = slurp(full / "model.safetensors");
  CliResult done = run_cli("train --resume " + full.string());
  EXPECT_EQ(done.status, 0) << done.err;
  EXPECT_NE(done.out.find("all 3 epochs are already done"), std::string::npos) << done.out;
  EXPECT_TRUE(slurp(full / "model.safetensors") == model);  // untouched

  // --hidden 8 agrees with the checkpoint and is not reported; --lr and --seed conflict.
  CliResult c = run_cli("train --resume " + full.string() + " --epochs 4 --hidden 8 --lr 0.5 --seed 1");
  EXPECT_NE(c.status, 0);
  EXPECT_NE(c.err.find("--lr 0.5 (the checkpoint has 0.002)"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("--seed 1 (the checkpoint has 7)"), std::string::npos) << c.err;
  EXPECT_EQ(c.err.find("--hidden"), std::string::npos) << c.err;
  EXPECT_TRUE(slurp(full / "model.safetensors") == model);
}

// A checkpoint's train_config gets the command line's checks: a value the
// flags would reject, or of the wrong JSON type, is an error naming it.
TEST(CliResume, OutOfRangeOrMistypedTrainConfigIsNamed) {
  const std::string ck = slurp(full_run() / "checkpoint.safetensors");
  const auto with_config = [&](const std::string& name, const std::string& key, const nlohmann::json& value) {
    std::map<std::string, std::string> meta;
    const auto tensors = seqpack::parse_safetensors(ck, &meta);
    auto config = nlohmann::json::parse(meta.at("train_config"));
    config[key] = value;
    meta["train_config"] = config.dump();
    const fs::path d = work_dir() / name;
    fs::create_directories(d);
    seqpack::save_safetensors((d / "checkpoint.safetensors").string(), tensors, meta);
    return d;
  };
  const struct {
    const char* key;
    nlohmann::json value;
    const char* message;
  } cases[] = {
      {"clip", -1.0, "train_config clip = -1 is out of range: must be >= 0 and finite"},
      {"lr", 0.0, "train_config lr = 0 is out of range: must be > 0 and finite"},
      {"hidden", 16.5, "train_config has no valid 'hidden' (it has 16.5)"},
      {"hidden", 100000, "train_config hidden = 100000 is out of range: must be in [1, 16384]"},
      {"batch_size", 0, "train_config batch_size = 0 is out of range: must be >= 1"},
      {"seed", -3, "train_config has no valid 'seed' (it has -3)"},
      {"precision", "int8", "train_config precision = 'int8' is out of range: must be fp32, bf16 or auto"},
      {"epochs", "5", "train_config has no valid 'epochs' (it has \"5\")"},
  };
  int i = 0;
  for (const auto& c : cases) {
    const fs::path d = with_config("bad-config-" + std::to_string(i++), c.key, c.value);
    const CliResult r = run_cli("train --quiet --resume " + d.string() + (std::string(c.key) == "epochs" ? "" : " --epochs 9"));
    EXPECT_EQ(r.status, 1) << c.key;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("epoch 2/"), std::string::npos) << r.out;
  }
}

// What a run killed while training leaves: its checkpoint in a begun,
// uncommitted staging directory beside OUT (here the checkpoint of a 1-epoch run).
void leave_interrupted_run(const fs::path& out) {
  static const fs::path one = [] {
    const fs::path d = work_dir() / "one-epoch";
    const CliResult r = run_cli(train_args(d, 1));
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    return d;
  }();
  seqpack::ModelDirWriter w(out.string(), "the test's interrupted run");
  w.begin(/*keep_previous=*/true);
  fs::copy_file(one / "checkpoint.safetensors", fs::path(w.staging()) / "checkpoint.safetensors");
}  // the lock is released, the staging directory stays

// The checkpoints in OUT's staging directories.
int staged_checkpoints(const fs::path& out) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(out.parent_path())) {
    const std::string name = e.path().filename().string();
    n += name.rfind("." + out.filename().string() + ".saving-", 0) == 0 &&
         fs::exists(e.path() / "checkpoint.safetensors");
  }
  return n;
}

// A run with a mistake in its command fails before it discards an interrupted
// run's checkpoint in --out: "discarded the checkpoint" came before "cannot open
// TSV file 'nosuch.tsv'", and two epochs of work were gone.
TEST(CliResume, AMistakenRunFailsBeforeItDiscardsAnInterruptedCheckpoint) {
  const fs::path out = work_dir() / "m3";
  leave_interrupted_run(out);
  ASSERT_EQ(staged_checkpoints(out), 1);
  const fs::path malformed = work_dir() / "malformed.tsv";
  std::ofstream(malformed) << "english\tthe\nno tab\n";
  const fs::path one_label = work_dir() / "one-label.tsv";
  std::ofstream(one_label) << "english\tthe\nenglish\twater\n";
  const struct {
    std::string args, message;
  } mistakes[] = {
      {"--data " + (work_dir() / "nosuch.tsv").string(),
       "cannot open TSV file '" + (work_dir() / "nosuch.tsv").string() + "'"},
      {"--data " + work_dir().string(), "is a directory"},
      {"--data " + malformed.string(), "line 2: no tab"},
      {"--data " + one_label.string(), "a classifier needs at least 2 labels"},
  };
  for (const auto& m : mistakes) {
    SCOPED_TRACE(m.args);
    const CliResult r =
        run_cli("train --quiet --threads 1 --epochs 3 " + m.args + " --out " + out.string());
    EXPECT_EQ(r.status, 1) << r.out << r.err;
    EXPECT_NE(r.err.find(m.message), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("discarded"), std::string::npos) << r.out;
    EXPECT_EQ(staged_checkpoints(out), 1) << "the interrupted run's checkpoint is gone";
  }
  // The checkpoint is whole: resuming it to 3 epochs gives the uninterrupted run's bytes.
  const CliResult res = run_cli("train --quiet --threads 1 --epochs 3 --resume " + out.string());
  ASSERT_EQ(res.status, 0) << res.out << res.err;
  EXPECT_NE(res.out.find("epoch 1 of 3 done"), std::string::npos) << res.out;
  EXPECT_TRUE(slurp(out / "model.safetensors") == slurp(full_run() / "model.safetensors"));
  EXPECT_EQ(staged_checkpoints(out), 0);

  // The control: a valid run that does not resume discards it, and says so.
  const fs::path out2 = work_dir() / "m4";
  leave_interrupted_run(out2);
  const CliResult fresh = run_cli(train_args(out2, 1));
  ASSERT_EQ(fresh.status, 0) << fresh.err;
  EXPECT_NE(fresh.out.find(out2.string() + "/: discarded the checkpoint of an interrupted run"),
            std::string::npos)
      << fresh.out;
  EXPECT_EQ(staged_checkpoints(out2), 0);
}

// The optimiser state round trip the checkpoint relies on: an Adam restored
// from another's state takes the same next step, bit for bit.
// The lock file beside --out is written (its holder's line), so, like every
// output, never through a symbolic link and never into what is not a regular
// file: a link there truncated its target, a dangling one created it.
TEST(ModelDirLock, RefusesALinkOrASpecialFileAndWritesNothingThrough) {
  const fs::path dir = work_dir() / "lock-links";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path victim = dir / "victim.txt";
  std::ofstream(victim) << "keep me\n";
  const fs::path out = dir / "model";
  const fs::path lock = dir / ".model.lock";
  const auto victim_text = [&] {
    std::ifstream in(victim);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  fs::create_symlink(victim, lock);
  try {
    seqpack::ModelDirWriter w(out.string(), "the test");
    FAIL() << "a lock through a symbolic link was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'" + lock.string() + "' is a symbolic link"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(victim_text(), "keep me\n");
  const CliResult r = run_cli("train --quiet --epochs 1 --out " + out.string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("is a symbolic link"), std::string::npos) << r.err;
  EXPECT_EQ(victim_text(), "keep me\n");
  fs::remove(lock);
  const fs::path nowhere = dir / "created-through-link";
  fs::create_symlink(nowhere, lock);  // dangling
  EXPECT_THROW(seqpack::ModelDirWriter(out.string(), "the test"), std::invalid_argument);
  EXPECT_FALSE(fs::exists(nowhere));
  fs::remove(lock);
  fs::create_directory(lock);
  try {
    seqpack::ModelDirWriter w(out.string(), "the test");
    FAIL() << "a directory was taken as the lock file";
  } catch (const std::exception& e) {  // the open's own error (EISDIR), naming the path
    EXPECT_NE(std::string(e.what()).find("lock file"), std::string::npos) << e.what();
  }
  fs::remove(lock);
  EXPECT_NO_THROW(seqpack::ModelDirWriter(out.string(), "the test"));  // a plain lock is fine
}

TEST(AdamState, RestoredOptimizerTakesTheSameStep) {
  using seqpack::Tensor;
  const auto make = [] {
    Tensor w = Tensor::zeros({3}, seqpack::DType::f32), g = Tensor::zeros({3}, seqpack::DType::f32);
    for (int i = 0; i < 3; ++i) w.data<float>()[i] = 0.5f * static_cast<float>(i);
    return std::pair{w, g};
  };
  auto [w1, g1] = make();
  auto [w2, g2] = make();
  seqpack::Adam a({{"w", w1, g1}}, {.lr = 0.1});
  seqpack::Adam b({{"w", w2, g2}}, {.lr = 0.1});
  for (int s = 0; s < 3; ++s) {
    for (int i = 0; i < 3; ++i) g1.data<float>()[i] = static_cast<float>(i - s) * 0.3f;
    a.step();
  }
  w2.copy_from(w1);
  b.load_state(a.state(), a.step_count());
  EXPECT_EQ(b.step_count(), 3);
  for (int i = 0; i < 3; ++i) g1.data<float>()[i] = g2.data<float>()[i] = 0.7f - static_cast<float>(i);
  a.step();
  b.step();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(w1.data<float>()[i], w2.data<float>()[i]) << i;
  // A state that does not fit is rejected by key, before anything is copied.
  auto [w3, g3] = make();
  seqpack::Adam c({{"w", w3, g3}}, {.lr = 0.1});
  EXPECT_THROW(c.load_state({}, 3), std::invalid_argument);
  try {
    c.load_state({{"exp_avg.w", Tensor::zeros({2}, seqpack::DType::f32)}}, 3);
    FAIL() << "expected a shape error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("exp_avg.w"), std::string::npos) << e.what();
  }
}

}  // namespace
