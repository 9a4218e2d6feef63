// CharClassifier (Embedding -> packed bidirectional LSTM -> Linear): gradients
// vs finite differences, torch's parameter names, a torch-written model giving
// torch's logits, save -> load, and overfitting a tiny dataset.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <filesystem>
#include <random>
#include <set>

#include "seqpack/classifier.h"
#include "seqpack/loss.h"
#include "seqpack/optim.h"
#include "seqpack/safetensors.h"
#include "seqpack/vocabulary.h"
#include "test_util.h"

namespace seqpack {
namespace {

namespace fs = std::filesystem;
using testing::all_close;

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() /
               ("seqpack_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

TEST(CharClassifier, GradientsMatchFiniteDifferences) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  CharClassifier model({.vocab_size = 6, .embed_dim = 3, .hidden_size = 4, .num_classes = 3,
                        .dtype = DType::f64},
                       seed);
  // Unsorted lengths, a repeated token, padding id 0 inside no sequence, and
  // one zero-length sequence (it only sees the head's bias).
  const std::vector<std::vector<int64_t>> seqs = {{1, 2, 3}, {5}, {}, {4, 4, 2, 1}, {3, 2}};
  const Tensor targets = Tensor::from_vector<int64_t>({0, 2, 1, 1, 0});
  CrossEntropyLoss ce;
  model.zero_grad();
  ce.forward(model.forward(seqs), targets);
  model.backward(ce.backward());
  const double eps = 1e-6;
  for (Parameter& p : model.parameters()) {
    SCOPED_TRACE(p.name);
    Tensor numeric = Tensor::zeros(p.value.shape(), DType::f64);
    double* v = p.value.data<double>();
    for (int64_t i = 0; i < p.value.numel(); ++i) {
      const double orig = v[i];
      v[i] = orig + eps;
      const double up = ce.forward(model.forward(seqs, /*requires_grad=*/false), targets);
      v[i] = orig - eps;
      const double down = ce.forward(model.forward(seqs, /*requires_grad=*/false), targets);
      v[i] = orig;
      numeric.data<double>()[i] = (up - down) / (2 * eps);
    }
    if (p.name == "embedding.weight") {
      // padding_idx: the row gets no gradient even if the numeric one were non-zero.
      for (int64_t j = 0; j < 3; ++j) numeric.data<double>()[j] = 0.0;
    }
    EXPECT_TRUE(all_close(p.grad, numeric, 1e-6, 1e-8, p.name));
  }
}

TEST(CharClassifier, ParameterNamesAreTorchStateDictKeys) {
  auto expected = testing::load_fixture("model_torch_expected.json");
  CharClassifier model({.vocab_size = 19, .embed_dim = 6, .hidden_size = 5, .num_classes = 3}, 0);
  std::set<std::string> mine, torch_keys;
  for (auto& [k, v] : model.state_dict()) mine.insert(k);
  for (auto& k : expected.at("state_dict_keys")) torch_keys.insert(k.get<std::string>());
  EXPECT_EQ(mine, torch_keys);
  // Embedding's padding row starts at zero.
  for (int64_t j = 0; j < 6; ++j) EXPECT_EQ(model.embedding().weight().item_as_double(j), 0.0);
}

TEST(CharClassifier, TorchWrittenModelGivesTorchLogits) {
  auto expected = testing::load_fixture("model_torch_expected.json");
  // Assemble a model directory from the fixture files, as `seqpack train` writes one.
  const fs::path dir = temp_dir("torch_model");
  const fs::path fx = SEQPACK_FIXTURES_DIR;
  fs::copy_file(fx / "model_torch.safetensors", dir / "model.safetensors");
  fs::copy_file(fx / "model_torch_vocabulary.json", dir / "vocabulary.json");
  fs::copy_file(fx / "model_torch_config.json", dir / "config.json");
  TrainedClassifier tc = load_classifier(dir.string());
  tc.model->lstm().set_config(testing::config());  // under the ISA caps pass's cap
  tc.model->fc().set_kernels(testing::kernels());
  std::vector<std::u32string> words;
  for (auto& w : expected.at("words")) words.push_back(decode_utf8(w.get<std::string>()));
  // Unknown characters map to <unk> = 1, as the torch side encoded them.
  for (std::size_t i = 0; i < words.size(); ++i) {
    EXPECT_EQ(tc.vocabulary.encode(words[i]), expected["ids"][i].get<std::vector<int64_t>>())
        << "word " << i;
  }
  const Tensor logits = tc.logits(words);
  // docs/testing.md: an embedding row, a one-layer LSTM over the longest word,
  // the output layer's sum over the hidden units.
  int64_t longest = 0;
  for (auto& ids : expected.at("ids")) longest = std::max<int64_t>(longest, ids.size());
  const auto& cfg = tc.model->options();
  const int64_t n = testing::rnn_reduction_length(cfg.embed_dim, cfg.hidden_size, 1, false, longest) +
                    cfg.hidden_size;
  EXPECT_TRUE(testing::fp_close(logits, testing::tensor_from_json(expected.at("logits"), DType::f32),
                                n, DType::f32, "logits vs torch"));
  fs::remove_all(dir);
}

TEST(CharClassifier, SaveThenLoadGivesIdenticalPredictions) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Vocabulary vocab = Vocabulary::build({U"hello", U"wörld", U"abc"});
  CharClassifier model({.vocab_size = vocab.size(), .embed_dim = 4, .hidden_size = 6,
                        .num_classes = 2},
                       seed);
  const fs::path dir = temp_dir("save_load");
  save_classifier(dir.string(), model, vocab, {"yes", "no"});
  TrainedClassifier tc = load_classifier(dir.string());
  EXPECT_EQ(tc.labels, (std::vector<std::string>{"yes", "no"}));
  EXPECT_TRUE(tc.vocabulary == vocab);
  const std::vector<std::u32string> words = {U"hello", U"wörld?", U"z", U"ab"};
  std::vector<std::vector<int64_t>> ids;
  for (auto& w : words) ids.push_back(vocab.encode(w));
  EXPECT_TRUE(all_close(tc.logits(words), model.forward(ids, false), 0, 0, "reloaded logits"));
  // Probabilities sum to one and come best first.
  for (auto& scores : tc.predict(words)) {
    ASSERT_EQ(scores.size(), 2u);
    EXPECT_GE(scores[0].probability, scores[1].probability);
    EXPECT_NEAR(scores[0].probability + scores[1].probability, 1.0, 1e-6);
  }
  // Inconsistent directories are reported, naming the file.
  EXPECT_THROW(save_classifier(dir.string(), model, vocab, {"only-one"}), std::invalid_argument);
  fs::remove(dir / "vocabulary.json");
  try {
    load_classifier(dir.string());
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_classifier((dir / "missing").string()), std::invalid_argument);
  fs::remove_all(dir);
}

TEST(CharClassifier, OverfitsATinyDatasetTo100Percent) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::vector<std::u32string> words = {U"the",   U"and",  U"house", U"water",
                                             U"maison", U"été", U"eau",   U"très",
                                             U"haus",  U"straße", U"über", U"wasser"};
  const std::vector<int64_t> labels = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2};
  const Vocabulary vocab = Vocabulary::build(words);
  std::vector<std::vector<int64_t>> ids;
  for (auto& w : words) ids.push_back(vocab.encode(w));
  const Tensor targets = Tensor::from_vector<int64_t>(labels);
  CharClassifier model({.vocab_size = vocab.size(), .embed_dim = 8, .hidden_size = 16,
                        .num_classes = 3},
                       seed);
  Adam opt(model.parameters(), {.lr = 2e-2});
  CrossEntropyLoss ce;
  double loss = 0;
  for (int step = 0; step < 150; ++step) {
    loss = ce.forward(model.forward(ids), targets);
    model.backward(ce.backward());
    clip_grad_norm(opt.parameters(), 5.0);
    opt.step();
    opt.zero_grad();
  }
  const Tensor logits = model.forward(ids, /*requires_grad=*/false);
  int correct = 0;
  for (int64_t i = 0; i < 12; ++i) {
    int64_t best = 0;
    for (int64_t c = 1; c < 3; ++c) {
      if (logits.item_as_double(i * 3 + c) > logits.item_as_double(i * 3 + best)) best = c;
    }
    correct += best == labels[static_cast<std::size_t>(i)];
  }
  EXPECT_EQ(correct, 12) << "final loss " << loss;
  EXPECT_LT(loss, 0.05);
  // The padding row never moved.
  for (int64_t j = 0; j < 8; ++j) EXPECT_EQ(model.embedding().weight().item_as_double(j), 0.0);
}

TEST(CharClassifier, BadInputNamesTheValue) {
  CharClassifier model({.vocab_size = 5, .embed_dim = 2, .hidden_size = 3, .num_classes = 2}, 0);
  try {
    model.forward(Tensor::zeros({2, 3}, DType::i64), {3, 4}, /*batch_first=*/true);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("lengths[1] = 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model.forward(Tensor::zeros({2, 3}, DType::i64), {3}, /*batch_first=*/true),
               std::invalid_argument);
  EXPECT_THROW(model.forward({{1, 7}}), std::invalid_argument);  // token id past the vocabulary
  EXPECT_THROW(CharClassifier({.vocab_size = 5, .num_classes = 0}), std::invalid_argument);
  EXPECT_THROW(model.backward(Tensor::zeros({1, 2}, DType::f32)), std::logic_error);
  std::map<std::string, Tensor> sd = model.state_dict();
  sd.erase("fc.bias");
  EXPECT_THROW(model.load_state_dict(sd), std::invalid_argument);
}

// Whether row i of a and row j of b [*, c] are equal: bit for bit in float32,
// to 1e-13 in float64.
bool same_row(const Tensor& a, int64_t i, const Tensor& b, int64_t j) {
  const int64_t c = a.size(1);
  if (a.dtype() == DType::f32) {
    return std::memcmp(a.data<float>() + i * c, b.data<float>() + j * c, c * sizeof(float)) == 0;
  }
  for (int64_t k = 0; k < c; ++k) {
    const double x = a.item_as_double(i * c + k), y = b.item_as_double(j * c + k);
    if (std::fabs(x - y) > 1e-13 * (1 + std::fabs(y))) return false;
  }
  return true;
}

// Inference logits (forward without requires_grad) of a float32 model are the
// same bits for a sequence alone and in any batch (the head sums in a fixed
// order; BLAS rounded a row differently with the row count), and agree with
// training's forward (BLAS) to rounding. A float64 model's LSTM runs its steps
// on BLAS's dgemm, which rounds a row by the row count: there, to rounding.
TEST(CharClassifier, InferenceLogitsAreTheSameBitsAloneAndInAnyBatch) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 gen(seed);
  std::vector<std::vector<int64_t>> seqs;
  for (int i = 0; i < 41; ++i) {
    std::vector<int64_t> ids(gen() % 13);  // 0 to 12 tokens
    for (auto& id : ids) id = 1 + static_cast<int64_t>(gen() % 9);
    seqs.push_back(ids);
  }
  seqs[5].clear();  // an empty one among them
  const int64_t n = static_cast<int64_t>(seqs.size());
  for (const DType dtype : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dtype));
    // 2 * hidden = 74: not a multiple of the head's 8 lanes.
    CharClassifier model({.vocab_size = 10, .embed_dim = 5, .hidden_size = 37, .num_classes = 5,
                          .dtype = dtype},
                         seed);
    const Tensor all = model.forward(seqs, /*requires_grad=*/false);
    for (int64_t i = 0; i < n; ++i) {
      const Tensor alone = model.forward({seqs[static_cast<std::size_t>(i)]}, false);
      ASSERT_TRUE(same_row(alone, 0, all, i)) << "sequence " << i << " alone and in the batch of " << n;
    }
    // Other company: reversed, and in batches of 7.
    const Tensor r = model.forward({seqs.rbegin(), seqs.rend()}, false);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(same_row(r, n - 1 - i, all, i)) << "sequence " << i << " in the reversed batch";
    }
    for (int64_t start = 0; start < n; start += 7) {
      const int64_t stop = std::min(n, start + 7);
      const Tensor p = model.forward({seqs.begin() + start, seqs.begin() + stop}, false);
      for (int64_t i = start; i < stop; ++i) {
        ASSERT_TRUE(same_row(p, i - start, all, i)) << "sequence " << i << " in a batch of " << stop - start;
      }
    }
    const Tensor trained = model.forward(seqs, /*requires_grad=*/true);
    EXPECT_TRUE(all_close(all, trained, dtype == DType::f32 ? 1e-5 : 1e-12,
                          dtype == DType::f32 ? 1e-6 : 1e-14, "inference vs training head"));
  }
}

// A model with finite weights whose output layer overflows (3.4e38 weights, as
// a hostile trial set them): its logits are an error naming the word, the
// logit and its label, never a NaN probability.
TEST(TrainedClassifier, NonFiniteLogitsAreAnErrorNeverAProbability) {
  TrainedClassifier tc;
  tc.vocabulary = Vocabulary::build({U"hello", U"abc"});
  tc.labels = {"a", "b", "c"};
  tc.model = std::make_unique<CharClassifier>(
      CharClassifierOptions{.vocab_size = tc.vocabulary.size(), .embed_dim = 3, .hidden_size = 5,
                            .num_classes = 3},
      1);
  const std::vector<std::u32string> words = {U"", U"hello", U"abc"};
  const Tensor finite = tc.logits(words);
  ASSERT_EQ(tc.predict(words).size(), 3u);
  // h > 0 for every non-empty word (LSTM weights 0, the g gate's bias 1:
  // h = σ(0)·tanh(c) with c > 0), so row 2 of the output layer at 3.4e38
  // makes logit 2 +inf; an empty word (h = 0) keeps the bias, finite.
  std::map<std::string, Tensor> sd = tc.model->state_dict();
  for (auto& [name, t] : sd) {
    if (name.rfind("lstm.", 0) == 0) t.fill(0.0);
  }
  for (const char* bias : {"lstm.bias_ih_l0", "lstm.bias_ih_l0_reverse"}) {
    for (int64_t k = 10; k < 15; ++k) sd.at(bias).data<float>()[k] = 1.f;  // [i, f, g, o] x 5
  }
  for (int64_t k = 0; k < 10; ++k) sd.at("fc.weight").data<float>()[2 * 10 + k] = 3.4e38f;
  sd.at("fc.bias").data<float>()[2] = 3.4e38f;
  for (const auto& call : {0, 1}) {
    try {
      if (call == 0) tc.predict(words);
      else tc.logits(words);
      FAIL() << "non-finite logits were returned";
    } catch (const NonFiniteLogits& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("word 2 ('hello'): logit 2 (label 'c') is inf"), std::string::npos)
          << what;
    }
  }
  EXPECT_THROW(tc.logits({U"abc"}), std::runtime_error);
  const Tensor empty_word = tc.logits({U""});
  EXPECT_TRUE(std::isfinite(empty_word.item_as_double(2)));
  EXPECT_EQ(empty_word.item_as_double(2), 3.4e38f);
  // scores() on logits given by the caller: the entry named.
  Tensor bad = finite.clone();
  bad.data<float>()[1 * 3 + 1] = std::numeric_limits<float>::quiet_NaN();
  try {
    tc.scores(bad);
    FAIL() << "scores accepted a NaN logit";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("logits[1][1] (label 'b') is nan"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(tc.scores(Tensor::zeros({2, 4}, DType::f32)), std::invalid_argument);
}

}  // namespace
}  // namespace seqpack
