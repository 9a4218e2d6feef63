// The files of a model directory (config.json, vocabulary.json,
// model.safetensors) and of a training checkpoint are validated field by field
// before anything is built from them: formats and versions, integer fields that
// are integers within the limits `seqpack train` enforces, label lists, tensor
// names/shapes/dtypes, finite values, and only regular files are read. Every
// rejection is a std::invalid_argument naming the file, the field and the value.
//
// The limits are written here from their sources, not from the code under test:
// 16384 is `seqpack train`'s range for --embed and --hidden
// (tools/seqpack/cmd_train.cpp), 1112066 = 2 specials + the 0x110000 - 0x800
// Unicode scalar values, 1048576 = 2^20 labels (docs/reliability.md).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "seqpack/classifier.h"
#include "seqpack/optim.h"
#include "seqpack/safetensors.h"
#include "seqpack/vocabulary.h"
#include "temp_dir.h"
#include "test_util.h"

namespace seqpack {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::expect_invalid;
using testing::TempDir;

const json kGoodConfig = {{"format", "seqpack-char-classifier"},
                          {"version", 1},
                          {"vocab_size", 19},
                          {"embed_dim", 6},
                          {"hidden_size", 5},
                          {"num_classes", 3},
                          {"labels", {"english", "french", "german"}}};

json with(json j, const std::string& key, const json& value) {
  j[key] = value;
  return j;
}

// Runs `f` in a child process that is killed after `seconds`: a load that
// blocks or reads forever is reported as a failure instead of hanging the
// suite. Expects f to throw std::invalid_argument containing every needle.
void expect_invalid_promptly(const std::function<void()>& f,
                             const std::vector<std::string>& needles, unsigned seconds = 10) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    ::alarm(seconds);
    std::string msg = "no exception";
    int code = 2;
    try {
      f();
    } catch (const std::invalid_argument& e) {
      msg = e.what();
      code = 0;
    } catch (const std::exception& e) {
      msg = std::string("not an invalid_argument: ") + e.what();
      code = 3;
    }
    (void)!::write(fds[1], msg.data(), msg.size());
    ::_exit(code);
  }
  ::close(fds[1]);
  std::string msg;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
    msg.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) {
    ADD_FAILURE() << "killed by signal " << WTERMSIG(status)
                  << (WTERMSIG(status) == SIGALRM ? " (still running after the time limit: a hang)"
                                                  : "");
    return;
  }
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << msg;
  for (const auto& n : needles)
    EXPECT_NE(msg.find(n), std::string::npos) << "message \"" << msg << "\" lacks \"" << n << "\"";
}

// ---------------------------------------------------------------- config.json

TEST(ModelConfig, AGoodConfigGivesItsSizesAndLabels) {
  std::vector<std::string> labels;
  const CharClassifierOptions o = parse_classifier_config(kGoodConfig.dump(), "c.json", &labels);
  EXPECT_EQ(o.vocab_size, 19);
  EXPECT_EQ(o.embed_dim, 6);
  EXPECT_EQ(o.hidden_size, 5);
  EXPECT_EQ(o.num_classes, 3);
  EXPECT_EQ(labels, (std::vector<std::string>{"english", "french", "german"}));
  // Other keys are ignored; the limits themselves are accepted.
  json big = with(with(kGoodConfig, "comment", "x"), "hidden_size", 16384);
  big["embed_dim"] = 16384;
  big["vocab_size"] = 1112066;
  EXPECT_EQ(parse_classifier_config(big.dump(), "c.json").hidden_size, 16384);
}

TEST(ModelConfig, FormatAndVersionAreChecked) {
  expect_invalid(
      [] { parse_classifier_config(with(kGoodConfig, "format", "pt").dump(), "c.json"); },
      {"c.json", "\"format\" is \"pt\", expected \"seqpack-char-classifier\""});
  expect_invalid([] { parse_classifier_config(with(kGoodConfig, "version", 2).dump(), "c.json"); },
                 {"c.json", "\"version\" is 2"});
  expect_invalid(
      [] { parse_classifier_config(with(kGoodConfig, "version", "1").dump(), "c.json"); },
      {"\"version\" is \"1\""});
  expect_invalid(
      [] { parse_classifier_config(with(kGoodConfig, "version", 1.5).dump(), "c.json"); },
      {"\"version\" is 1.5"});
  json no_format = kGoodConfig;
  no_format.erase("format");
  expect_invalid([&] { parse_classifier_config(no_format.dump(), "c.json"); },
                 {"c.json", "\"format\" is missing"});
}

TEST(ModelConfig, IntegerFieldsMustBeIntegersWithinTheLimits) {
  struct Case {
    std::string key, value, expect;
  };
  const std::vector<Case> cases = {
      {"hidden_size", "16.5", "\"hidden_size\" = 16.5 is not an integer"},
      {"hidden_size", "1e23", "\"hidden_size\" = 1e+23 is not an integer"},
      {"hidden_size", "16.0", "\"hidden_size\" = 16.0 is not an integer"},
      {"hidden_size", "\"16\"", "\"hidden_size\" = \"16\" is not an integer"},
      {"hidden_size", "1152921504606846976",
       "\"hidden_size\" = 1152921504606846976 is out of range [1, 16384]"},
      {"hidden_size", "18446744073709551615",
       "\"hidden_size\" = 18446744073709551615 is out of range [1, 16384]"},
      {"hidden_size", "16385", "\"hidden_size\" = 16385 is out of range [1, 16384]"},
      {"hidden_size", "0", "\"hidden_size\" = 0 is out of range [1, 16384]"},
      {"embed_dim", "-3", "\"embed_dim\" = -3 is out of range [1, 16384]"},
      {"vocab_size", "1112067", "\"vocab_size\" = 1112067 is out of range [1, 1112066]"},
      {"num_classes", "1048577", "\"num_classes\" = 1048577 is out of range [1, 1048576]"},
      {"num_classes", "null", "\"num_classes\" = null is not an integer"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key + " = " + c.value);
    json j = kGoodConfig;
    j[c.key] = json::parse(c.value);
    expect_invalid([&] { parse_classifier_config(j.dump(), "dir/config.json"); },
                   {"dir/config.json", c.expect});
    // Never the wrapped-around value of a conversion.
    try {
      parse_classifier_config(j.dump(), "dir/config.json");
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()).find("-9223372036854775808"), std::string::npos) << e.what();
    }
  }
  json missing = kGoodConfig;
  missing.erase("embed_dim");
  expect_invalid([&] { parse_classifier_config(missing.dump(), "c.json"); },
                 {"\"embed_dim\" is missing"});
}

TEST(ModelConfig, LabelsAreDistinctNonEmptyStringsOnePerClass) {
  const auto labels = [](const json& l) { return with(kGoodConfig, "labels", l).dump(); };
  expect_invalid(
      [&] {
        parse_classifier_config(labels({"en", "fr", "en"}), "c.json");
      },
      {"c.json", "\"labels\"[2] = \"en\" repeats \"labels\"[0]"});
  expect_invalid(
      [&] {
        parse_classifier_config(labels({"en", "", "de"}), "c.json");
      },
      {"\"labels\"[1] is an empty label"});
  expect_invalid(
      [&] {
        parse_classifier_config(labels({"en", 7, "de"}), "c.json");
      },
      {"\"labels\"[1] = 7 is not a string"});
  expect_invalid(
      [&] {
        parse_classifier_config(labels({"en", "fr"}), "c.json");
      },
      {"\"labels\" has 2 entries but \"num_classes\" = 3"});
  expect_invalid([&] { parse_classifier_config(labels("en"), "c.json"); },
                 {"\"labels\" = \"en\" is not an array"});
}

TEST(ModelConfig, NotJsonOrNotAnObjectNamesTheFile) {
  expect_invalid([] { parse_classifier_config("{\"format\": ", "dir/config.json"); },
                 {"dir/config.json: not valid JSON (", "parse error"});
  expect_invalid([] { parse_classifier_config("[1, 2]", "dir/config.json"); },
                 {"dir/config.json: expected a JSON object, got [1,2]"});
  // A huge value is shown cut short, not copied whole into the message.
  const std::string long_format = std::string(100000, 'x');
  try {
    parse_classifier_config(with(kGoodConfig, "format", long_format).dump(), "c.json");
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_LT(std::string(e.what()).size(), 300u);
  }
}

TEST(ModelConfig, OptionsValidateTheSameLimits) {
  CharClassifierOptions o{.vocab_size = 10, .embed_dim = 4, .hidden_size = 16385, .num_classes = 2};
  expect_invalid([&] { o.validate(); }, {"hidden_size = 16385 is out of range [1, 16384]"});
  // Rejected before any member is allocated (2^60 rows would overflow the sizes).
  o.hidden_size = int64_t{1} << 60;
  expect_invalid([&] { CharClassifier m(o); }, {"hidden_size = 1152921504606846976"});
  o.hidden_size = 4;
  o.vocab_size = int64_t{1} << 60;
  expect_invalid([&] { CharClassifier m(o); }, {"vocab_size = 1152921504606846976"});
}

// ------------------------------------------------------------ model directories

struct SavedModel {
  TempDir tmp;
  std::string dir;
  SavedModel() : dir(tmp.file("model")) {
    const Vocabulary vocab = Vocabulary::build({U"hello", U"wörld"});
    CharClassifier model(
        {.vocab_size = vocab.size(), .embed_dim = 3, .hidden_size = 4, .num_classes = 2}, 1);
    save_classifier(dir, model, vocab, {"yes", "no"});
  }
  std::string path(const std::string& name) const { return dir + "/" + name; }
  void write_config(const json& j) const {
    std::ofstream(path("config.json"), std::ios::trunc) << j.dump();
  }
  json config() const { return json::parse(testing::read_file(path("config.json"))); }
  // model.safetensors with `edit` applied to its tensors.
  void edit_weights(const std::function<void(std::map<std::string, Tensor>&)>& edit) const {
    std::map<std::string, Tensor> t = load_safetensors(path("model.safetensors"));
    for (auto& [k, v] : t) v = v.clone();
    edit(t);
    save_safetensors(path("model.safetensors"), t);
  }
};

TEST(ModelDirectory, ASavedModelLoads) {
  SavedModel m;
  const TrainedClassifier tc = load_classifier(m.dir);
  EXPECT_EQ(tc.labels, (std::vector<std::string>{"yes", "no"}));
  EXPECT_EQ(tc.model->options().hidden_size, 4);
}

TEST(ModelDirectory, AnAbsurdSizeIsAnErrorNotACrash) {
  SavedModel m;
  m.write_config(with(m.config(), "hidden_size", json::parse("1152921504606846976")));
  expect_invalid(
      [&] { load_classifier(m.dir); },
      {m.path("config.json"), "\"hidden_size\" = 1152921504606846976 is out of range [1, 16384]"});
  m.write_config(with(m.config(), "hidden_size", 16.5));
  expect_invalid([&] { load_classifier(m.dir); },
                 {m.path("config.json"), "\"hidden_size\" = 16.5 is not an integer"});
  m.write_config(with(m.config(), "hidden_size", 1e23));
  expect_invalid([&] { load_classifier(m.dir); }, {"\"hidden_size\" = 1e+23 is not an integer"});
  m.write_config(with(m.config(), "format", "other"));
  expect_invalid([&] { load_classifier(m.dir); },
                 {m.path("config.json"), "\"format\" is \"other\""});
}

TEST(ModelDirectory, TensorsMustMatchTheConfigBeforeAnythingIsAllocated) {
  SavedModel m;
  // The largest sizes config.json may give, with the small file's tensors: the
  // mismatch is found from the shapes alone (a model of this size would need
  // over 70 GB).
  json big = m.config();
  big["hidden_size"] = 16384;
  big["embed_dim"] = 16384;
  m.write_config(big);
  expect_invalid([&] { load_classifier(m.dir); },
                 {m.path("model.safetensors"), "has shape [", "expected [", "16384"});
  m.write_config(with(big, "hidden_size", 4));
  expect_invalid([&] { load_classifier(m.dir); },
                 {"tensor 'embedding.weight' has shape [", ", expected [", ", 16384]"});
}

TEST(ModelDirectory, NonFiniteWeightsAreRejected) {
  for (double bad : {std::nan(""), double{INFINITY}, -double{INFINITY}}) {
    SavedModel m;
    m.edit_weights(
        [&](auto& t) { t.at("fc.weight").template data<float>()[3] = static_cast<float>(bad); });
    expect_invalid([&] { load_classifier(m.dir); },
                   {m.path("model.safetensors"),
                    "tensor 'fc.weight' holds " + std::to_string(bad) + " at index 3"});
  }
  SavedModel m;
  m.edit_weights(
      [](auto& t) { t.at("lstm.weight_hh_l0_reverse").template data<float>()[0] = NAN; });
  expect_invalid([&] { load_classifier(m.dir); },
                 {"tensor 'lstm.weight_hh_l0_reverse' holds nan at index 0"});
}

TEST(ModelDirectory, MisnamedOrMistypedWeightsAreRejected) {
  SavedModel extra;
  extra.edit_weights([](auto& t) { t["fc.extra"] = Tensor::zeros({1}); });
  expect_invalid([&] { load_classifier(extra.dir); },
                 {extra.path("model.safetensors"), "unexpected tensor 'fc.extra'"});
  SavedModel missing;
  missing.edit_weights([](auto& t) { t.erase("fc.bias"); });
  expect_invalid([&] { load_classifier(missing.dir); }, {"tensor 'fc.bias' is missing"});
  SavedModel ints;
  ints.edit_weights([](auto& t) { t["fc.bias"] = Tensor::zeros({2}, DType::i64); });
  expect_invalid([&] { load_classifier(ints.dir); }, {"tensor 'fc.bias' has dtype int64"});
}

TEST(ModelDirectory, MissingOrWrongKindOfDirectoryIsNamedPrecisely) {
  TempDir tmp;
  expect_invalid([&] { load_classifier(tmp.file("nothing")); },
                 {"model directory '" + tmp.file("nothing") + "' does not exist"});
  tmp.write("a_file", "x");
  expect_invalid([&] { load_classifier(tmp.file("a_file")); },
                 {"'" + tmp.file("a_file") + "' is not a model directory: it is a regular file"});
  fs::create_directory(tmp.file("empty"));
  expect_invalid([&] { load_classifier(tmp.file("empty")); },
                 {"model directory '" + tmp.file("empty") + "' has no config.json"});
  SavedModel m;
  fs::remove(m.path("model.safetensors"));
  expect_invalid([&] { load_classifier(m.dir); },
                 {"model directory '" + m.dir + "' has no model.safetensors"});
}

// A directory, a link to /dev/zero, a FIFO: refused by path, promptly.
TEST(ModelDirectory, OnlyRegularFilesAreRead) {
  for (const std::string name : {"config.json", "vocabulary.json", "model.safetensors"}) {
    SCOPED_TRACE(name);
    {
      SavedModel m;
      fs::remove(m.path(name));
      fs::create_symlink("/dev/zero", m.path(name));
      expect_invalid_promptly([&] { load_classifier(m.dir); },
                              {m.path(name), "not a regular file", "character device"});
    }
    {
      SavedModel m;
      fs::remove(m.path(name));
      ASSERT_EQ(::mkfifo(m.path(name).c_str(), 0600), 0);
      expect_invalid_promptly([&] { load_classifier(m.dir); },
                              {m.path(name), "not a regular file", "FIFO"});
    }
    {
      SavedModel m;
      fs::remove(m.path(name));
      fs::create_directory(m.path(name));
      expect_invalid_promptly([&] { load_classifier(m.dir); },
                              {m.path(name), "not a regular file", "directory"});
    }
  }
  TempDir tmp;
  ASSERT_EQ(::mkfifo(tmp.file("fifo").c_str(), 0600), 0);
  expect_invalid_promptly(
      [&] { Vocabulary::load(tmp.file("fifo")); },
      {"vocabulary file '" + tmp.file("fifo") + "' is not a regular file (it is a FIFO (named pipe))"});
  expect_invalid_promptly([&] { Vocabulary::load(tmp.path.string()); },
                          {"is not a regular file (it is a directory)"});
}

// ------------------------------------------------------------ vocabulary.json

TEST(VocabularyFile, VersionIsTheInteger1) {
  const std::string head =
      R"({"format":"seqpack-vocabulary","special_tokens":["<pad>","<unk>"],"tokens":["a"],)";
  EXPECT_EQ(Vocabulary::from_json(head + R"("version":1})").size(), 3);
  expect_invalid([&] { Vocabulary::from_json(head + R"("version":1.0})", "v.json"); },
                 {"v.json", "\"version\" is 1.0"});
  expect_invalid([&] { Vocabulary::from_json(head + R"("version":true})", "v.json"); },
                 {"\"version\" is true"});
  const std::string long_format = R"({"format":")" + std::string(100000, 'y') + "\"}";
  try {
    Vocabulary::from_json(long_format, "v.json");
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_LT(std::string(e.what()).size(), 300u);
  }
}

// ------------------------------------------------------------ checkpoints

struct SavedCheckpoint {
  TempDir tmp;
  std::string path = tmp.file("checkpoint.safetensors");
  std::map<std::string, std::string> meta;
  std::map<std::string, Tensor> tensors;
  explicit SavedCheckpoint(DType dtype = DType::f32) {
    const Vocabulary vocab = Vocabulary::build({U"abc"});
    CharClassifier model({.vocab_size = vocab.size(),
                          .embed_dim = 2,
                          .hidden_size = 3,
                          .num_classes = 2,
                          .dtype = dtype},
                         2);
    Adam opt(model.parameters(), {.lr = 1e-3});
    save_training_checkpoint(path, model, opt, vocab, {"a", "b"}, 1, R"({"epochs": 1})");
    tensors = load_safetensors(path, &meta);
    for (auto& [k, v] : tensors) v = v.clone();
  }
  // The checkpoint rewritten with the (edited) metadata and tensors.
  void rewrite() const { save_safetensors(path, tensors, meta); }
  void set_config(const std::string& key, const json& value) {
    json mc = json::parse(meta.at("model_config"));
    mc[key] = value;
    meta["model_config"] = mc.dump();
  }
};

TEST(CheckpointFile, AGoodCheckpointLoads) {
  for (DType d : {DType::f32, DType::f64}) {
    SavedCheckpoint c(d);
    const TrainingCheckpoint ck = load_training_checkpoint(c.path);
    EXPECT_EQ(ck.epoch, 1);
    EXPECT_EQ(ck.model_options.dtype, d);
    EXPECT_EQ(ck.model_options.hidden_size, 3);
    EXPECT_EQ(ck.labels, (std::vector<std::string>{"a", "b"}));
  }
}

TEST(CheckpointFile, ModelConfigIsValidatedFieldByField) {
  struct Case {
    std::string key;
    json value;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"dtype", "int8", "\"dtype\" = \"int8\" is not \"F32\" or \"F64\""},
      {"dtype", 32, "\"dtype\" = 32 is not \"F32\" or \"F64\""},
      {"hidden_size", 16.5, "\"hidden_size\" = 16.5 is not an integer"},
      {"hidden_size", json::parse("1152921504606846976"),
       "\"hidden_size\" = 1152921504606846976 is out of range [1, 16384]"},
      {"num_classes", 0, "\"num_classes\" = 0 is out of range [1, 1048576]"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.expect);
    SavedCheckpoint c;
    c.set_config(k.key, k.value);
    c.rewrite();
    expect_invalid([&] { load_training_checkpoint(c.path); },
                   {c.path, "metadata \"model_config\"", k.expect});
  }
  SavedCheckpoint c;
  c.meta["model_config"] = "{\"vocab_size\": ";
  c.rewrite();
  expect_invalid([&] { load_training_checkpoint(c.path); },
                 {c.path, "metadata \"model_config\": not valid JSON ("});
}

TEST(CheckpointFile, CountsLabelsAndTrainConfigAreChecked) {
  struct Case {
    std::string key, value, expect;
  };
  const std::vector<Case> cases = {
      {"epoch", "12abc", "metadata \"epoch\" = '12abc' is not a non-negative integer"},
      {"epoch", "-1", "metadata \"epoch\" = '-1' is not a non-negative integer"},
      {"epoch", " 3", "metadata \"epoch\" = ' 3' is not a non-negative integer"},
      {"adam_step", "99999999999999999999",
       "metadata \"adam_step\" = '99999999999999999999' is too large"},
      {"labels", R"(["a", "a"])", "metadata \"labels\": labels[1] = \"a\" repeats labels[0]"},
      {"labels", R"(["a", ""])", "labels[1] is an empty label"},
      {"labels", R"(["a"])", "labels has 1 entries but \"num_classes\" = 2"},
      {"train_config", "[1]", "metadata \"train_config\": expected a JSON object, got [1]"},
      {"train_config", "{", "metadata \"train_config\": not valid JSON ("},
      {"format", "pt", "has format 'pt', expected 'seqpack-train-checkpoint'"},
      {"version", "2", "has version '2'"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.key + " = " + k.value);
    SavedCheckpoint c;
    c.meta[k.key] = k.value;
    c.rewrite();
    expect_invalid([&] { load_training_checkpoint(c.path); }, {c.path, k.expect});
  }
}

TEST(CheckpointFile, TensorsMatchTheConfig) {
  {
    SavedCheckpoint c;
    c.set_config("hidden_size", 4);
    c.rewrite();
    expect_invalid([&] { load_training_checkpoint(c.path); },
                   {c.path, "tensor 'model.", "has shape ["});
  }
  {
    SavedCheckpoint c;  // float32 tensors said to be float64
    c.set_config("dtype", "F64");
    c.rewrite();
    expect_invalid([&] { load_training_checkpoint(c.path); },
                   {c.path, "has dtype float32, expected float64"});
  }
  {
    SavedCheckpoint c;
    c.tensors.erase("adam.exp_avg_sq.fc.bias");
    c.rewrite();
    expect_invalid([&] { load_training_checkpoint(c.path); },
                   {"tensor 'adam.exp_avg_sq.fc.bias' is missing"});
  }
  {
    SavedCheckpoint c;
    c.tensors["adam.momentum.fc.bias"] = Tensor::zeros({2});
    c.rewrite();
    expect_invalid([&] { load_training_checkpoint(c.path); },
                   {"unexpected tensor 'adam.momentum.fc.bias'"});
  }
}

TEST(CheckpointFile, NonFiniteValuesAreRejected) {
  {
    SavedCheckpoint c;
    c.tensors.at("model.fc.bias").data<float>()[1] = NAN;
    c.rewrite();
    expect_invalid([&] { load_training_checkpoint(c.path); },
                   {c.path, "tensor 'model.fc.bias' holds nan at index 1"});
  }
  {
    SavedCheckpoint c;
    c.tensors.at("adam.exp_avg.fc.bias").data<float>()[0] = INFINITY;
    c.rewrite();
    expect_invalid([&] { load_training_checkpoint(c.path); },
                   {"tensor 'adam.exp_avg.fc.bias' holds inf at index 0"});
  }
  {
    SavedCheckpoint c;
    c.tensors.at("adam.exp_avg_sq.fc.weight").data<float>()[2] = -1.0f;
    c.rewrite();
    expect_invalid([&] { load_training_checkpoint(c.path); },
                   {"tensor 'adam.exp_avg_sq.fc.weight' holds -1.000000 at index 2 (it must be "
                    "non-negative)"});
  }
}

TEST(CheckpointFile, OnlyARegularFileIsACheckpoint) {
  TempDir tmp;
  fs::create_directory(tmp.file("ck"));
  expect_invalid_promptly(
      [&] { load_training_checkpoint(tmp.file("ck")); },
      {"checkpoint " + tmp.file("ck") + " is not a regular file (it is a directory)"});
  fs::create_symlink("/dev/zero", tmp.file("zero"));
  expect_invalid_promptly([&] { load_training_checkpoint(tmp.file("zero")); },
                          {"character device"});
  expect_invalid([&] { load_training_checkpoint(tmp.file("none")); },
                 {"no checkpoint at " + tmp.file("none")});
}

}  // namespace
}  // namespace seqpack
