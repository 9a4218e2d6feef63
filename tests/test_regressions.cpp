// Regressions found by fuzzing, and a replay of every fuzz input kept in the
// repository (the seed corpus fuzz/corpus/<target>/ and the crashing inputs
// fuzz/regressions/<target>/) through the same checks the fuzzers run
// (fuzz/fuzz_checks.h). Here they run with any compiler, in the normal and the
// sanitizer builds, so a fixed crash stays fixed without clang.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../fuzz/fuzz_checks.h"

namespace {

namespace fs = std::filesystem;
using Check = void (*)(const uint8_t*, std::size_t);

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void run(Check check, const std::string& bytes) {
  check(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

// Runs `check` over every file of fuzz/<kind>/<target>/; returns how many.
int replay(const std::string& kind, const std::string& target, Check check) {
  const fs::path dir = fs::path(SEQPACK_SOURCE_DIR) / "fuzz" / kind / target;
  if (!fs::is_directory(dir)) return 0;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    SCOPED_TRACE(f.string());
    EXPECT_NO_THROW(run(check, read_bytes(f)));
  }
  return static_cast<int>(files.size());
}

TEST(FuzzReplay, SafetensorsCorpus) {
  EXPECT_GT(replay("corpus", "safetensors", seqpack::fuzz::check_safetensors), 0);
  replay("regressions", "safetensors", seqpack::fuzz::check_safetensors);
}

TEST(FuzzReplay, TsvVocabularyCorpus) {
  EXPECT_GT(replay("corpus", "tsv_vocabulary", seqpack::fuzz::check_tsv_vocabulary), 0);
  replay("regressions", "tsv_vocabulary", seqpack::fuzz::check_tsv_vocabulary);
}

TEST(FuzzReplay, PackingCorpus) {
  EXPECT_GT(replay("corpus", "packing", seqpack::fuzz::check_packing), 0);
  replay("regressions", "packing", seqpack::fuzz::check_packing);
}

TEST(FuzzReplay, ModelFilesCorpus) {
  EXPECT_GT(replay("corpus", "model_files", seqpack::fuzz::check_model_files), 0);
  replay("regressions", "model_files", seqpack::fuzz::check_model_files);
}

// The model-file checks tell accepted from rejected inputs as the schemas say
// (tests/test_model_files.cpp has the messages), so the replay above is not
// vacuous: the unedited checkpoint loads, each forbidden edit is rejected.
TEST(FuzzReplay, ModelFilesChecksAcceptAndRejectAsDocumented) {
  using seqpack::fuzz::check_checkpoint_edits;
  using seqpack::fuzz::check_classifier_config;
  EXPECT_TRUE(check_checkpoint_edits(""));
  EXPECT_TRUE(check_checkpoint_edits("epoch=7\nadam_step=0\ncomment=ignored"));
  for (const char* edit :
       {"model_config={\"vocab_size\":5,\"embed_dim\":2,\"hidden_size\":2,\"num_classes\":2,"
        "\"dtype\":\"int8\"}",
        "model_config={\"vocab_size\":5,\"embed_dim\":2,\"hidden_size\":2.5,\"num_classes\":2,"
        "\"dtype\":\"F32\"}",
        "epoch=3x", "adam_step", "labels=[\"x\",\"x\"]", "labels=[\"x\",\"\"]",
        "@nan:model.fc.weight", "@inf:adam.exp_avg.fc.bias", "@neg:adam.exp_avg_sq.fc.bias",
        "@grow:model.fc.bias", "@f64:model.fc.bias", "@drop:adam.exp_avg.fc.bias",
        "@add:model.extra"}) {
    EXPECT_FALSE(check_checkpoint_edits(edit)) << edit;
  }
  const std::string config = R"({"format": "seqpack-char-classifier", "version": 1, "vocab_size": 5,
      "embed_dim": 2, "hidden_size": HIDDEN, "num_classes": 2, "labels": ["x", "y"]})";
  const auto with_hidden = [&](const std::string& h) {
    std::string c = config;
    return c.replace(c.find("HIDDEN"), 6, h);
  };
  EXPECT_TRUE(check_classifier_config(with_hidden("16384")));
  for (const char* bad : {"16.5", "1e23", "16385", "1152921504606846976", "0", "\"2\""}) {
    EXPECT_FALSE(check_classifier_config(with_hidden(bad))) << bad;
  }
}

// The checks themselves must be able to fail: a broken invariant is a Finding,
// which is not an invalid_argument, so it escapes a target as a crash.
TEST(FuzzReplay, FindingIsNotARejection) {
  EXPECT_THROW(seqpack::fuzz::require(false, "x"), seqpack::fuzz::Finding);
  bool caught_as_rejection = false;
  try {
    seqpack::fuzz::require(false, "x");
  } catch (const std::invalid_argument&) {
    caught_as_rejection = true;
  } catch (const seqpack::fuzz::Finding&) {
  }
  EXPECT_FALSE(caught_as_rejection);
}

// Found by fuzz_packing (seed corpus input random_22): a padding value the
// dtype cannot hold was converted with undefined behaviour (NaN or 1e300 to
// int64; 1e300 to float32 overflows) and the garbage returned as padding.
// PyTorch's at::full rejects these ("value cannot be converted to type int64_t
// without overflow"); a fractional value for int64 is truncated, as in PyTorch.
TEST(Regression, PaddingValueTheDtypeCannotHoldIsRejected) {
  using namespace seqpack;
  const std::vector<Tensor> ints = {Tensor::from_vector<int64_t>({1, 2, 3}),
                                    Tensor::from_vector<int64_t>({4})};
  for (double bad : {std::nan(""), 1e300, -1e300}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(pad_sequence(ints, /*batch_first=*/false, bad), std::invalid_argument);
    const PackedSequence p = pack_sequence(ints);
    EXPECT_THROW(pad_packed_sequence(p, /*batch_first=*/false, bad), std::invalid_argument);
  }
  try {
    pad_sequence(ints, /*batch_first=*/false, std::nan(""));
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("nan"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("int64"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pad_sequence(ints, false, 7.5).to_vector<int64_t>(),
            (std::vector<int64_t>{1, 4, 2, 7, 3, 7}));
  const std::vector<Tensor> floats = {Tensor::from_vector<float>({1, 2}), Tensor::from_vector<float>({3})};
  EXPECT_THROW(pad_sequence(floats, false, 1e300), std::invalid_argument);
  EXPECT_THROW(pad_packed_sequence(pack_sequence(floats), false, -1e300), std::invalid_argument);
  // Infinity and NaN are float32 values: accepted, as in PyTorch.
  EXPECT_TRUE(std::isinf(pad_sequence(floats, false, INFINITY).to_vector<float>()[3]));
  EXPECT_TRUE(std::isnan(pad_sequence(floats, false, std::nan("")).to_vector<float>()[3]));
}

}  // namespace
