// `seqpack export --model DIR --onnx FILE`: the classifier saved by `seqpack train`
// as an ONNX model (inputs tokens [B, T] and lengths [B], output logits [B, C]),
// checked by the ONNX checker and shape inference before it is written.
#include <fmt/core.h>

#include <memory>
#include <string>

#include "command.h"
#include "seqpack/classifier.h"
#include "seqpack/onnx_export.h"
#include "seqpack/safetensors.h"

namespace {

using namespace seqpack;

struct ExportArgs {
  seqpack::cli::ModelOption model;
  std::string onnx;
  int64_t opset = kOnnxMaxOpset;
};

void run_export(const ExportArgs& a) {
  if (a.onnx.empty()) throw std::invalid_argument("--onnx = \"\": give the file to write");
  // The writer refuses anything but a regular file or a new path; said before
  // the model is loaded and converted.
  seqpack::check_output_file(a.onnx);
  // Nor onto the model it exports (M/model.safetensors, a link to it, ..).
  seqpack::check_output_not_input(a.onnx, "--onnx file",
                                  {{"--model directory", a.model.model_dir()}});
  const TrainedClassifier tc = load_classifier(a.model.model_dir());
  export_classifier_onnx(tc, a.onnx, {.opset = a.opset});
  const CharClassifierOptions& o = tc.model->options();
  fmt::print(
      "wrote {} (ONNX opset {}, checked): Embedding({}, {}) -> bidirectional LSTM({}) -> "
      "Linear({}, {})\n"
      "  inputs  tokens int64 [batch, time] (padded character ids), lengths int64 [batch]\n"
      "  output  logits float32 [batch, {}]; labels and vocabulary in the metadata\n",
      a.onnx, a.opset, o.vocab_size, o.embed_dim, o.hidden_size, 2 * o.hidden_size, o.num_classes,
      o.num_classes);
}

void setup(CLI::App& sub) {
  auto a = std::make_shared<ExportArgs>();
  a->model.add(sub);
  sub.add_option("--onnx", a->onnx, "ONNX file to write")->required();
  seqpack::cli::add_number<int64_t>(sub, "--opset", a->opset, "ONNX opset of the model",
                                    kOnnxMinOpset, kOnnxMaxOpset);
  sub.callback([a] { run_export(*a); });
}

const bool registered = seqpack::cli::register_command(
    {"export", "write a model saved by seqpack train as ONNX", setup});

}  // namespace
