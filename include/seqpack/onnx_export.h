// ONNX export of seqpack's recurrent models (library seqpack_onnx, CMake target
// seqpack::onnx; the core library seqpack does not depend on ONNX or protobuf).
//
//   LSTM lstm({.input_size = 8, .hidden_size = 16, .num_layers = 2, .bidirectional = true});
//   export_rnn_onnx(lstm, "lstm.onnx", {.initial_state = true});
//   // inputs  input [T, B, 8], lengths int64 [B], h0 [4, B, 16], c0 [4, B, 16]
//   // outputs output [T, B, 32] (zeros at padding), h_n [4, B, 16], c_n [4, B, 16]
//
// The graphs use ONNX's own LSTM / GRU / RNN operators with sequence_lens, so any
// batch size and padded length run (both axes are symbolic), the padding is never
// computed on, and h_n is each sequence's state at its own last step (the reverse
// direction starts there). Gate order and bias layout are converted from
// PyTorch's (LSTM i,f,g,o -> ONNX i,o,f,c; GRU r,z,n -> ONNX z,r,h with
// linear_before_reset = 1; B = [Wb ; Rb]).
//
// Empty inputs run: ONNX Runtime 1.20.1 crashes the process on its LSTM and GRU
// at batch 0 and on its RNN at T = 0, so each operator sits in an If on
// T * B > 0 whose else branch gives zeros of the outputs' shapes (batch 0:
// output [T, 0, dirs * H], h_n [layers * dirs, 0, H]; T = 0: h_n = h0).
//
// Zero-length sequences keep seqpack's meaning (h_n = h0, c_n = c0, output all
// zeros): ONNX Runtime's RNN kernels give zeros there instead of the initial
// state, so the graph runs such a sequence for one step and selects h0 / c0 and
// zeros for it with Where. Negative lengths, and lengths beyond the padded
// length, are left to the runtime, which rejects them.
//
// Every export is built with libonnx's protobuf classes, then checked by the ONNX
// checker and by strict shape inference (with the output shapes compared against
// the declared ones) before a byte is written. Errors in the arguments throw
// std::invalid_argument naming the value; a model the checker rejects (a bug
// here) throws std::runtime_error with the checker's message.
#pragma once

#include <cstdint>
#include <string>

#include "seqpack/classifier.h"
#include "seqpack/rnn.h"

namespace seqpack {

// ONNX opsets the exporter writes (the LSTM/GRU/RNN of opset 14 and later).
inline constexpr int64_t kOnnxMinOpset = 14;
inline constexpr int64_t kOnnxMaxOpset = 17;  // the newest libonnx 1.12 (Debian 12) checks

struct OnnxExportOptions {
  int64_t opset = kOnnxMaxOpset;
  // RNN export: add the inputs h0 (and c0 for an LSTM), [layers * dirs, B, H],
  // in the caller's batch order. Without them the initial state is zero.
  bool initial_state = false;

  // Throws std::invalid_argument naming the offending option and value.
  void validate() const;
};

// A multi-layer RNN/LSTM/GRU module (eval forward: no dropout), in its dtype
// (float32 or float64; ONNX Runtime's CPU kernels run float32 only).
//   inputs  "input"   [T, B, I] ([B, T, I] when options().batch_first)
//           "lengths" int64 [B], each in [0, T]
//           "h0", "c0" with OnnxExportOptions::initial_state
//   outputs "output"  [T, B, dirs * H] (batch-first like the input), zeros at padding
//           "h_n"     [layers * dirs, B, H]; "c_n" for an LSTM
// proj_size > 0 is rejected: ONNX's LSTM has no projection.
std::string rnn_to_onnx(const RNNBase& rnn, const OnnxExportOptions& options = {});
void export_rnn_onnx(const RNNBase& rnn, const std::string& path,
                     const OnnxExportOptions& options = {});

// The classifier of `seqpack train` (see classifier.h):
//   inputs  "tokens"  int64 [B, T], padded token ids (padding: any id of the
//                     vocabulary, 0 by convention; an id outside [0, vocab_size),
//                     negative ones included, is a runtime error)
//           "lengths" int64 [B], each in [0, T]
//   outputs "logits"  [B, classes]
// A zero-length sequence sees h_n = 0 (only the output layer's bias decides),
// as in CharClassifier::forward. `labels` and `vocabulary_json` (optional,
// Vocabulary::to_json) are stored in the model's metadata_props under "labels"
// (a JSON array) and "vocabulary", so the file alone is enough to serve it.
std::string classifier_to_onnx(CharClassifier& model, const std::vector<std::string>& labels = {},
                               const std::string& vocabulary_json = "",
                               const OnnxExportOptions& options = {});
// Writes `seqpack train`'s model directory as ONNX (atomically).
void export_classifier_onnx(const TrainedClassifier& classifier, const std::string& path,
                            const OnnxExportOptions& options = {});

}  // namespace seqpack
