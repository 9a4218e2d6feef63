// ONNX export (seqpack_onnx, `seqpack export`) run in ONNX Runtime and compared
// with seqpack's own forward: RNN/LSTM/GRU over a grid of modes, layers,
// directions, batch_first, initial states, mixed and zero lengths, batch of 1;
// the classifier through the API and through the command line; bad arguments.
//
// ONNX Runtime is the npm package onnxruntime-node in tools/ort (installed by
// scripts/setup.sh), driven by tools/ort/run_ort.js: one Node process per test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cli_run.h"
#include "seqpack/classifier.h"
#include "seqpack/onnx_export.h"
#include "seqpack/rnn.h"
#include "seqpack/vocabulary.h"

namespace seqpack {
namespace {

using nlohmann::json;
using testing::run_cli;
using testing::work_dir;

constexpr double kTol = 1e-5;  // float32, absolute (values are O(1))

json tensor_json(const Tensor& t) {
  json j = {{"dims", t.shape()}};
  switch (t.dtype()) {
    case DType::f32:
      j["type"] = "float32";
      j["data"] = t.to_vector<float>();
      break;
    case DType::f64:
      j["type"] = "float64";
      j["data"] = t.to_vector<double>();
      break;
    case DType::i64:
      j["type"] = "int64";
      j["data"] = t.to_vector<int64_t>();
      break;
  }
  return j;
}

// Runs every request in one ONNX Runtime process; returns its "results".
json run_ort(const json& runs) {
  static int calls = 0;
  const std::string stem = (work_dir() / ("ort_" + std::to_string(calls++))).string();
  std::ofstream(stem + ".json") << json{{"threads", 1}, {"runs", runs}}.dump();
  const std::string cmd = std::string("node '") + SEQPACK_ORT_RUNNER + "' '" + stem + ".json' >'" +
                          stem + ".out' 2>'" + stem + ".err'";
  const int status = std::system(cmd.c_str());
  if (status != 0) {
    std::ifstream err(stem + ".err");
    const std::string msg((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
    ADD_FAILURE() << "ONNX Runtime runner failed (" << cmd << "): " << msg;
    return json::array();
  }
  std::ifstream out(stem + ".out");
  const json result = json::parse(out);
  std::printf("[ ONNX Runtime %s ]\n", result.at("ort_version").get<std::string>().c_str());
  return result.at("results");
}

// Largest |ort - expected| over a tensor, with a failure naming the first bad index.
double max_error(const json& ort, const Tensor& expected, const std::string& what) {
  const std::vector<int64_t> dims = ort.at("dims").get<std::vector<int64_t>>();
  EXPECT_EQ(Shape(dims.begin(), dims.end()), expected.shape()) << what;
  if (Shape(dims.begin(), dims.end()) != expected.shape()) return INFINITY;
  const std::vector<double> got = ort.at("data").get<std::vector<double>>();
  double worst = 0.0;
  bool reported = false;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = expected.item_as_double(static_cast<int64_t>(i));
    const double err = std::fabs(got[i] - e);
    worst = std::max(worst, err);
    if (!(err <= kTol) && !reported) {
      ADD_FAILURE() << what << ": index " << i << ": ONNX Runtime " << got[i] << ", seqpack " << e
                    << " (|diff| " << err << " > " << kTol << ")";
      reported = true;
    }
  }
  return worst;
}

Tensor random_tensor(Shape shape, std::mt19937_64& rng, double scale = 1.0) {
  std::uniform_real_distribution<double> u(-scale, scale);
  Tensor t = Tensor::empty(shape, DType::f32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(u(rng));
  return t;
}

std::unique_ptr<RNNBase> make_rnn(const RNNOptions& o, uint64_t seed) {
  switch (o.mode) {
    case RNNMode::lstm:
      return std::make_unique<LSTM>(o, seed);
    case RNNMode::gru:
      return std::make_unique<GRU>(o, seed);
    default:
      return std::make_unique<RNN>(o, seed);
  }
}

struct Case {
  std::string name;
  std::unique_ptr<RNNBase> rnn;
  bool initial_state;
  std::string model;
  std::vector<RNNOutput> expected;
  std::vector<json> runs;
};

// One padded batch: input, lengths and (optionally) h0/c0 as ONNX Runtime feeds,
// with seqpack's forward of the same batch as the expected result.
void add_batch(Case& c, const std::vector<int64_t>& lengths, int64_t T, std::mt19937_64& rng) {
  const RNNOptions& o = c.rnn->options();
  const int64_t B = static_cast<int64_t>(lengths.size());
  const int64_t LD = o.num_layers * o.num_directions();
  Tensor x =
      random_tensor(o.batch_first ? Shape{B, T, o.input_size} : Shape{T, B, o.input_size}, rng);
  Tensor h0, c0;
  json inputs = {{"input", tensor_json(x)},
                 {"lengths", tensor_json(Tensor::from_vector(lengths, {B}))}};
  if (c.initial_state) {
    h0 = random_tensor({LD, B, o.hidden_size}, rng, 0.5);
    inputs["h0"] = tensor_json(h0);
    if (o.mode == RNNMode::lstm) {
      c0 = random_tensor({LD, B, o.hidden_size}, rng, 0.5);
      inputs["c0"] = tensor_json(c0);
    }
  }
  c.expected.push_back(c.rnn->forward(x, lengths, h0, c0, /*requires_grad=*/false));
  c.runs.push_back({{"model", c.model}, {"inputs", inputs}});
}

TEST(OnnxExport, RnnGridMatchesSeqpackInOnnxRuntime) {
  const uint64_t seed = 20261123;
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  for (RNNMode mode : {RNNMode::rnn_tanh, RNNMode::rnn_relu, RNNMode::lstm, RNNMode::gru}) {
    for (int64_t layers : {1, 2}) {
      for (bool bidirectional : {false, true}) {
        for (bool batch_first : {false, true}) {
          for (bool initial_state : {false, true}) {
            RNNOptions o{.mode = mode,
                         .input_size = 3,
                         .hidden_size = 5,
                         .num_layers = layers,
                         .batch_first = batch_first,
                         .bidirectional = bidirectional};
            Case c;
            c.name = std::string(rnn_mode_name(mode)) + " layers=" + std::to_string(layers) +
                     (bidirectional ? " bidirectional" : "") + (batch_first ? " batch_first" : "") +
                     (initial_state ? " h0" : "");
            c.rnn = make_rnn(o, rng());
            c.rnn->eval();
            c.initial_state = initial_state;
            c.model = (work_dir() / ("rnn_" + std::to_string(cases.size()) + ".onnx")).string();
            export_rnn_onnx(*c.rnn, c.model, {.initial_state = initial_state});
            add_batch(c, {4, 1, 6, 3, 6, 2}, 6, rng);  // mixed, unsorted, ties
            add_batch(c, {3}, 5, rng);                 // batch of 1, shorter than the padding
            add_batch(c, {5, 0, 2}, 5, rng);           // a zero-length sequence
            add_batch(c, {1, 1}, 1, rng);              // T = 1
            cases.push_back(std::move(c));
          }
        }
      }
    }
  }
  // Without biases, and with dropout (an eval forward: none), in each mode.
  for (RNNMode mode : {RNNMode::rnn_tanh, RNNMode::rnn_relu, RNNMode::lstm, RNNMode::gru}) {
    RNNOptions o{.mode = mode,
                 .input_size = 4,
                 .hidden_size = 3,
                 .num_layers = 3,
                 .bias = false,
                 .batch_first = true,
                 .dropout = 0.5,
                 .bidirectional = true};
    Case c;
    c.name = std::string(rnn_mode_name(mode)) + " layers=3 bidirectional bias=false dropout=0.5";
    c.rnn = make_rnn(o, rng());
    c.rnn->eval();
    c.initial_state = true;
    c.model = (work_dir() / ("rnn_" + std::to_string(cases.size()) + ".onnx")).string();
    export_rnn_onnx(*c.rnn, c.model, {.opset = kOnnxMinOpset, .initial_state = true});
    add_batch(c, {2, 7, 0, 5}, 7, rng);
    cases.push_back(std::move(c));
  }
  json runs = json::array();
  for (const Case& c : cases) {
    for (const json& r : c.runs) runs.push_back(r);
  }
  const json results = run_ort(runs);
  ASSERT_EQ(results.size(), runs.size());
  double worst = 0.0;
  std::size_t k = 0;
  for (const Case& c : cases) {
    for (std::size_t b = 0; b < c.runs.size(); ++b, ++k) {
      const json& r = results[k];
      const std::string what =
          c.name + " batch " + std::to_string(b) + " (seed " + std::to_string(seed) + ")";
      ASSERT_FALSE(r.contains("error")) << what << ": " << r["error"];
      const RNNOutput& e = c.expected[b];
      worst = std::max(worst, max_error(r["outputs"]["output"], e.padded, what + " output"));
      worst = std::max(worst, max_error(r["outputs"]["h_n"], e.h_n, what + " h_n"));
      if (c.rnn->options().mode == RNNMode::lstm) {
        worst = std::max(worst, max_error(r["outputs"]["c_n"], e.c_n, what + " c_n"));
      }
    }
  }
  std::printf("[ %zu models, %zu runs: max |ONNX Runtime - seqpack| = %.3g ]\n", cases.size(), k,
              worst);
  RecordProperty("max_abs_error", std::to_string(worst));
}

// Empty inputs: a batch of 0 (at any padded length) and a padded length of 0
// (every length 0). ONNX Runtime 1.20.1 itself crashes the process on them (its
// LSTM and GRU at batch 0, its RNN at T = 0 with a batch), so the exported graph
// runs each operator only when the input has elements. Expected values are
// written out, not computed by seqpack: at batch 0 the shapes torch gives for an
// empty batch (nn.LSTM(I, H, num_layers=L, bidirectional) on [T, 0, I]: output
// [T, 0, dirs * H], h_n and c_n [L * dirs, 0, H]); at T = 0 every sequence has
// length 0 and keeps its initial state (h0, or zeros), with no output.
TEST(OnnxExport, EmptyBatchAndZeroPaddedLengthRunInOnnxRuntime) {
  std::mt19937_64 rng(21);
  struct Empty {
    std::string name;
    std::string model;
    RNNOptions o;
    bool initial_state;
    Tensor h0, c0;  // expected h_n, c_n
    Shape output;   // expected output shape
  };
  std::vector<Empty> cases;
  json runs = json::array();
  for (RNNMode mode : {RNNMode::rnn_tanh, RNNMode::rnn_relu, RNNMode::lstm, RNNMode::gru}) {
    for (bool bidirectional : {false, true}) {
      for (bool initial_state : {false, true}) {
        const RNNOptions o{.mode = mode,
                           .input_size = 3,
                           .hidden_size = 4,
                           .num_layers = 2,
                           .batch_first = initial_state,
                           .bidirectional = bidirectional};
        const std::unique_ptr<RNNBase> rnn = make_rnn(o, rng());
        const std::string name = std::string(rnn_mode_name(mode)) +
                                 (bidirectional ? " bidirectional" : "") +
                                 (initial_state ? " batch_first with h0" : "");
        const std::string model =
            (work_dir() / ("empty_" + std::to_string(cases.size()) + ".onnx")).string();
        export_rnn_onnx(*rnn, model, {.initial_state = initial_state});
        const int64_t LD = 2 * o.num_directions(), H = o.hidden_size, DH = o.output_size();
        for (const auto& [B, T] : {std::pair<int64_t, int64_t>{0, 5}, {0, 1}, {0, 0}, {3, 0}}) {
          Empty e{name + " B=" + std::to_string(B) + " T=" + std::to_string(T),
                  model,
                  o,
                  initial_state,
                  Tensor::zeros({LD, B, H}, DType::f32),
                  Tensor::zeros({LD, B, H}, DType::f32),
                  o.batch_first ? Shape{B, T, DH} : Shape{T, B, DH}};
          const Tensor x = random_tensor(
              o.batch_first ? Shape{B, T, o.input_size} : Shape{T, B, o.input_size}, rng);
          json inputs = {
              {"input", tensor_json(x)},
              {"lengths", tensor_json(Tensor::from_vector(std::vector<int64_t>(B, 0), {B}))}};
          if (initial_state) {
            e.h0 = random_tensor({LD, B, H}, rng, 0.5);
            inputs["h0"] = tensor_json(e.h0);
            if (mode == RNNMode::lstm) {
              e.c0 = random_tensor({LD, B, H}, rng, 0.5);
              inputs["c0"] = tensor_json(e.c0);
            }
          }
          runs.push_back({{"model", model}, {"inputs", inputs}});
          cases.push_back(std::move(e));
        }
      }
    }
  }
  const json results = run_ort(runs);
  ASSERT_EQ(results.size(), runs.size()) << "ONNX Runtime did not answer every run";
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Empty& e = cases[i];
    const json& r = results[i];
    ASSERT_FALSE(r.contains("error")) << e.name << ": " << r["error"];
    max_error(r["outputs"]["output"], Tensor::zeros(e.output, DType::f32), e.name + " output");
    max_error(r["outputs"]["h_n"], e.h0, e.name + " h_n");
    if (e.o.mode == RNNMode::lstm) max_error(r["outputs"]["c_n"], e.c0, e.name + " c_n");
  }
}

// The classifier on an empty batch gives logits [0, classes]; on a padded
// length of 0 (every word empty) each word's logits are the output layer's bias
// (h_n = 0), as CharClassifier::forward says for an empty word.
TEST(OnnxExport, ClassifierRunsOnAnEmptyBatch) {
  CharClassifier model({.vocab_size = 6, .embed_dim = 2, .hidden_size = 3, .num_classes = 4}, 5);
  const std::string path = (work_dir() / "empty_classifier.onnx").string();
  std::ofstream(path, std::ios::binary) << classifier_to_onnx(model);
  json runs = json::array();
  for (const auto& [B, T] : {std::pair<int64_t, int64_t>{0, 4}, {0, 0}, {2, 0}}) {
    runs.push_back(
        {{"model", path},
         {"inputs",
          {{"tokens", tensor_json(Tensor::zeros({B, T}, DType::i64))},
           {"lengths", tensor_json(Tensor::from_vector(std::vector<int64_t>(B, 0), {B}))}}}});
  }
  const json results = run_ort(runs);
  ASSERT_EQ(results.size(), 3u) << "ONNX Runtime did not answer every run";
  for (std::size_t i = 0; i < 2; ++i) {
    ASSERT_FALSE(results[i].contains("error")) << results[i]["error"];
    max_error(results[i]["outputs"]["logits"], Tensor::zeros({0, 4}, DType::f32),
              "empty batch " + std::to_string(i));
  }
  ASSERT_FALSE(results[2].contains("error")) << results[2]["error"];
  const Tensor bias = model.fc().bias();
  Tensor expected = Tensor::empty({2, 4}, DType::f32);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t k = 0; k < 4; ++k) expected.data<float>()[b * 4 + k] = bias.data<float>()[k];
  }
  max_error(results[2]["outputs"]["logits"], expected, "two empty words");
}

// ONNX Runtime must reject, not silently run, lengths outside [0, T].
TEST(OnnxExport, RuntimeRejectsLengthsOutsideThePadding) {
  LSTM lstm({.input_size = 2, .hidden_size = 3, .bidirectional = true}, 1);
  const std::string model = (work_dir() / "bad_lengths.onnx").string();
  export_rnn_onnx(lstm, model);
  std::mt19937_64 rng(7);
  const Tensor x = random_tensor({4, 2, 2}, rng);
  json runs = json::array();
  for (const std::vector<int64_t>& lengths :
       {std::vector<int64_t>{5, 2}, std::vector<int64_t>{-1, 2}}) {
    runs.push_back({{"model", model},
                    {"inputs",
                     {{"input", tensor_json(x)},
                      {"lengths", tensor_json(Tensor::from_vector(lengths, {2}))}}}});
  }
  const json results = run_ort(runs);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_TRUE(results[0].contains("error")) << "length 5 > T = 4 ran: " << results[0].dump();
  EXPECT_TRUE(results[1].contains("error")) << "length -1 ran: " << results[1].dump();
}

// At T = 0 the operator does not run (ONNX Runtime would crash on it); the graph
// rejects a length other than 0 itself.
TEST(OnnxExport, RuntimeRejectsLengthsAtZeroPaddedLength) {
  for (RNNMode mode : {RNNMode::rnn_tanh, RNNMode::lstm, RNNMode::gru}) {
    const std::unique_ptr<RNNBase> rnn =
        make_rnn({.mode = mode, .input_size = 2, .hidden_size = 3, .num_layers = 2}, 1);
    const std::string model =
        (work_dir() / (std::string("t0_") + rnn_mode_name(mode) + ".onnx")).string();
    export_rnn_onnx(*rnn, model);
    json runs = json::array();
    for (const std::vector<int64_t>& lengths :
         {std::vector<int64_t>{0, 1}, std::vector<int64_t>{-1, 0}, std::vector<int64_t>{0, 0}}) {
      runs.push_back({{"model", model},
                      {"inputs",
                       {{"input", tensor_json(Tensor::zeros({0, 2, 2}, DType::f32))},
                        {"lengths", tensor_json(Tensor::from_vector(lengths, {2}))}}}});
    }
    const json results = run_ort(runs);
    ASSERT_EQ(results.size(), 3u);
    EXPECT_TRUE(results[0].contains("error")) << "length 1 at T = 0 ran: " << results[0].dump();
    EXPECT_TRUE(results[1].contains("error")) << "length -1 at T = 0 ran: " << results[1].dump();
    EXPECT_FALSE(results[2].contains("error")) << results[2].dump();
  }
}

TEST(OnnxExport, BadArgumentsAreNamed) {
  LSTM lstm({.input_size = 2, .hidden_size = 3}, 1);
  auto message = [&](const OnnxExportOptions& o) {
    try {
      rnn_to_onnx(lstm, o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({.opset = 13}).find("opset = 13"), std::string::npos) << message({.opset = 13});
  EXPECT_NE(message({.opset = 18}).find("opset = 18"), std::string::npos) << message({.opset = 18});
  LSTM projected({.input_size = 2, .hidden_size = 3, .proj_size = 2}, 1);
  try {
    rnn_to_onnx(projected);
    ADD_FAILURE() << "proj_size exported";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("proj_size = 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(export_rnn_onnx(lstm, ""), std::invalid_argument);
}

// float64 modules export as float64 graphs that pass the checker (ONNX Runtime's
// CPU recurrent kernels run float32 only, so they are not run here).
TEST(OnnxExport, Float64ModelsPassTheChecker) {
  GRU gru({.input_size = 2,
           .hidden_size = 3,
           .num_layers = 2,
           .bidirectional = true,
           .dtype = DType::f64},
          1);
  EXPECT_GT(rnn_to_onnx(gru, {.initial_state = true}).size(), 0u);
  CharClassifier model(
      {.vocab_size = 5, .embed_dim = 2, .hidden_size = 3, .num_classes = 2, .dtype = DType::f64},
      1);
  EXPECT_GT(classifier_to_onnx(model).size(), 0u);
}

// The classifier's logits for a batch of token ids, in ONNX Runtime and in seqpack.
struct ClassifierBatch {
  Tensor tokens;  // [B, T]
  std::vector<int64_t> lengths;
};

ClassifierBatch random_tokens(const std::vector<int64_t>& lengths, int64_t vocab,
                              std::mt19937_64& rng) {
  const int64_t B = static_cast<int64_t>(lengths.size());
  const int64_t T = std::max<int64_t>(1, *std::max_element(lengths.begin(), lengths.end()));
  ClassifierBatch cb{Tensor::zeros({B, T}, DType::i64), lengths};
  std::uniform_int_distribution<int64_t> id(1, vocab - 1);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < lengths[static_cast<std::size_t>(b)]; ++t) {
      cb.tokens.data<int64_t>()[b * T + t] = id(rng);
    }
  }
  return cb;
}

double check_classifier(CharClassifier& model, const std::string& onnx_path,
                        const std::vector<std::vector<int64_t>>& batches, std::mt19937_64& rng) {
  json runs = json::array();
  std::vector<Tensor> expected;
  for (const auto& lengths : batches) {
    const ClassifierBatch cb = random_tokens(lengths, model.options().vocab_size, rng);
    expected.push_back(model.forward(cb.tokens, cb.lengths, /*batch_first=*/true,
                                     /*requires_grad=*/false));
    const int64_t B = static_cast<int64_t>(lengths.size());
    runs.push_back({{"model", onnx_path},
                    {"inputs",
                     {{"tokens", tensor_json(cb.tokens)},
                      {"lengths", tensor_json(Tensor::from_vector(lengths, {B}))}}}});
  }
  const json results = run_ort(runs);
  EXPECT_EQ(results.size(), runs.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < std::min(results.size(), runs.size()); ++i) {
    if (results[i].contains("error")) {
      ADD_FAILURE() << "batch " << i << ": " << results[i]["error"];
      continue;
    }
    worst = std::max(worst, max_error(results[i]["outputs"]["logits"], expected[i],
                                      "classifier batch " + std::to_string(i)));
  }
  return worst;
}

TEST(OnnxExport, ClassifierMatchesSeqpackInOnnxRuntime) {
  std::mt19937_64 rng(11);
  CharClassifier model({.vocab_size = 17, .embed_dim = 6, .hidden_size = 7, .num_classes = 4}, 3);
  const std::string path = (work_dir() / "classifier.onnx").string();
  std::ofstream(path, std::ios::binary) << classifier_to_onnx(model);
  const double worst = check_classifier(model, path, {{5, 1, 9, 3, 9}, {4}, {6, 0, 2}, {1}}, rng);
  std::printf("[ classifier: max |ONNX Runtime - seqpack| = %.3g ]\n", worst);
}

// Token ids outside the vocabulary are errors of the runtime, negative ones too
// (ONNX's Gather alone would read -1 as the last row).
TEST(OnnxExport, ClassifierRejectsIdsOutsideTheVocabulary) {
  CharClassifier model({.vocab_size = 6, .embed_dim = 2, .hidden_size = 3, .num_classes = 2}, 5);
  const std::string path = (work_dir() / "ids.onnx").string();
  std::ofstream(path, std::ios::binary) << classifier_to_onnx(model);
  json runs = json::array();
  for (int64_t bad : {-1, -6, 6, 0}) {
    const Tensor tokens = Tensor::from_vector(std::vector<int64_t>{1, bad, 2, 3}, {2, 2});
    runs.push_back(
        {{"model", path},
         {"inputs",
          {{"tokens", tensor_json(tokens)},
           {"lengths", tensor_json(Tensor::from_vector(std::vector<int64_t>{2, 2}, {2}))}}}});
  }
  const json results = run_ort(runs);
  ASSERT_EQ(results.size(), 4u);
  EXPECT_TRUE(results[0].contains("error")) << "id -1 ran: " << results[0].dump();
  EXPECT_TRUE(results[1].contains("error")) << "id -6 ran: " << results[1].dump();
  EXPECT_TRUE(results[2].contains("error")) << "id 6 ran: " << results[2].dump();
  EXPECT_FALSE(results[3].contains("error")) << results[3].dump();
}

// `seqpack export` on a model directory, run in ONNX Runtime, gives the
// directory's classifier's logits.
TEST(OnnxExport, CommandLineExportMatchesSeqpack) {
  std::mt19937_64 rng(12);
  const std::string dir = (work_dir() / "model").string();
  {
    CharClassifier model({.vocab_size = 9, .embed_dim = 4, .hidden_size = 5, .num_classes = 3}, 4);
    const Vocabulary vocab =
        Vocabulary::from_code_points({U'a', U'b', U'c', U'd', U'e', U'f', U'g'});
    save_classifier(dir, model, vocab, {"x", "y", "z"});
  }
  const std::string onnx = (work_dir() / "cli.onnx").string();
  const auto r = run_cli("export --model '" + dir + "' --onnx '" + onnx + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("wrote " + onnx), std::string::npos) << r.out;
  TrainedClassifier tc = load_classifier(dir);
  const double worst = check_classifier(*tc.model, onnx, {{3, 1, 7, 7, 2}, {5}, {0, 4}}, rng);
  std::printf("[ seqpack export: max |ONNX Runtime - seqpack| = %.3g ]\n", worst);
}

TEST(OnnxExport, CommandLineRejectsBadOptions) {
  const std::string onnx = (work_dir() / "never.onnx").string();
  struct Bad {
    std::string args, expect;
  };
  for (const Bad& b : {Bad{"--opset 99", "--opset: 99 is out of range: must be in [14, 17]"},
                       Bad{"--opset 13", "--opset: 13 is out of range"},
                       Bad{"--opset -1", "--opset: -1 is out of range"}, Bad{"--opset abc", "--opset"},
                       Bad{"--model /nonexistent/dir", "/nonexistent/dir"}}) {
    const auto r = run_cli("export --onnx '" + onnx + "' " + b.args);
    EXPECT_NE(r.status, 0) << b.args;
    EXPECT_NE(r.err.find(b.expect), std::string::npos) << b.args << ": " << r.err;
    EXPECT_FALSE(std::filesystem::exists(onnx)) << b.args;
  }
  const auto r = run_cli("export --model x");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--onnx"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace seqpack
