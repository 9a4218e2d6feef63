// A character-level sequence classifier: the model of `seqpack train`.
//
//   Embedding(vocab, embed, padding_idx=0) -> bidirectional 1-layer LSTM(hidden)
//   over packed batches -> [h_n forward ; h_n reverse] -> Linear(2 * hidden, classes)
//
// Parameter names are the state_dict keys of the equivalent torch module with
// attributes `embedding`, `lstm`, `fc`, so a saved model loads into PyTorch:
//
//   class CharClassifier(torch.nn.Module):
//       def __init__(self, vocab, embed, hidden, classes):
//           super().__init__()
//           self.embedding = torch.nn.Embedding(vocab, embed, padding_idx=0)
//           self.lstm = torch.nn.LSTM(embed, hidden, bidirectional=True)
//           self.fc = torch.nn.Linear(2 * hidden, classes)
//       def forward(self, packed_ids):           # a PackedSequence of token ids
//           x = PackedSequence(self.embedding(packed_ids.data), *packed_ids[1:])
//           _, (h_n, _) = self.lstm(x)
//           return self.fc(torch.cat([h_n[0], h_n[1]], dim=1))
//
// Training step, as in PyTorch:
//
//   CharClassifier model({.vocab_size = vocab.size(), .num_classes = 7}, /*seed=*/0);
//   Adam opt(model.parameters(), {.lr = 2e-3});
//   CrossEntropyLoss ce;
//   Tensor logits = model.forward(batch.tokens, batch.lengths, /*batch_first=*/true);
//   double loss = ce.forward(logits, batch.labels);
//   model.backward(ce.backward());
//   opt.step();
//   opt.zero_grad();
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "seqpack/nn.h"
#include "seqpack/optim.h"
#include "seqpack/rnn.h"
#include "seqpack/tensor.h"
#include "seqpack/vocabulary.h"

namespace seqpack {

struct CharClassifierOptions {
  int64_t vocab_size = 0;
  int64_t embed_dim = 32;
  int64_t hidden_size = 128;
  int64_t num_classes = 0;
  DType dtype = DType::f32;
  // The LSTM's matrix products (RNNOptions::precision); the embedding and the
  // linear layer stay in `dtype`.
  Precision precision = Precision::fp32;

  // The largest sizes a model may have: `seqpack train`'s ranges for --embed
  // and --hidden, every Unicode scalar value plus <pad> and <unk> for the
  // vocabulary, and 2^20 labels. validate() and the model loaders enforce them,
  // so a hostile file cannot make seqpack allocate absurd tensors.
  static constexpr int64_t max_embed_dim = 16384;
  static constexpr int64_t max_hidden_size = 16384;
  static constexpr int64_t max_vocab_size = 2 + 0x110000 - 0x800;
  static constexpr int64_t max_num_classes = int64_t{1} << 20;

  // Throws std::invalid_argument naming the offending option and value: every
  // size must be in [1, its maximum] and dtype a floating-point type.
  void validate() const;
};

class CharClassifier {
 public:
  // Parameters drawn as torch initialises them, from `seed`.
  explicit CharClassifier(CharClassifierOptions options, uint64_t seed = 0);

  const CharClassifierOptions& options() const { return options_; }

  // tokens: int64 [B, T] (batch_first) or [T, B], padded; lengths[b] <= T are
  // the real lengths (0 allowed: that sequence sees h_n = 0). Returns logits
  // [B, num_classes]. Padding is never computed on: the LSTM runs on packed rows.
  // With requires_grad, keeps what backward needs. Without it (inference) the
  // linear layer sums each logit in a fixed order, so a float32 model gives a
  // sequence the same bits whatever else is in the batch.
  Tensor forward(const Tensor& tokens, const std::vector<int64_t>& lengths, bool batch_first,
                 bool requires_grad = true);
  // One token sequence per batch element.
  Tensor forward(const std::vector<std::vector<int64_t>>& sequences, bool requires_grad = true);
  // Gradient of the loss w.r.t. the last forward's logits; accumulates the
  // gradients of every parameter.
  void backward(const Tensor& grad_logits);

  // Every parameter with its torch name ("embedding.weight", "lstm.weight_ih_l0", ...).
  std::vector<Parameter> parameters();
  void zero_grad();
  // Views keyed by torch's state_dict names.
  std::map<std::string, Tensor> state_dict();
  // Strict: a missing, unexpected or wrongly shaped key throws naming it.
  void load_state_dict(const std::map<std::string, Tensor>& state);

  Embedding& embedding() { return embedding_; }
  // (The LSTM's plan is compared with its weights at each forward: a change
  // through this reference is seen by the next one.)
  LSTM& lstm() { return lstm_; }
  Linear& fc() { return fc_; }

  // The LSTM's precision from now on (CharClassifierOptions::precision);
  // throws naming the ISA where it cannot run. At int8 the model is for
  // inference (forward without requires_grad).
  //
  // The LSTM's plan (rnn_make_plan: quantized at int8, W_hh laid out at fp32
  // and bf16) serves the forwards without requires_grad: made at the first,
  // made again after a forward with requires_grad (a training step may
  // follow) or any access that may change the weights (parameters(),
  // state_dict(), load_state_dict(), lstm(), set_precision()).
  void set_precision(Precision p);

 private:
  CharClassifierOptions options_;
  Embedding embedding_;
  LSTM lstm_;
  Linear fc_;
  // Saved by forward for backward.
  std::shared_ptr<const RNNSaved> saved_;
  int64_t batch_ = 0;
  // The LSTM's, made from its weights' present values (rnn_current_plan at
  // each forward): one per optimizer step in training.
  std::shared_ptr<const RNNModelPlan> plan_;
};

// Probabilities of each label for one input, best first.
struct LabelScore {
  std::string label;
  double probability;
};

// A model whose weights are finite gave a non-finite logit (its output layer
// overflowed): no probability can be given for that word. The message names
// the word, the logit's index and label, and the value.
class NonFiniteLogits : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A trained classifier with what is needed to use it on text.
struct TrainedClassifier {
  std::unique_ptr<CharClassifier> model;
  Vocabulary vocabulary;
  std::vector<std::string> labels;

  // Softmax over the labels for each word (characters unknown to the
  // vocabulary map to <unk>), sorted by decreasing probability.
  std::vector<std::vector<LabelScore>> predict(const std::vector<std::u32string>& words);
  // The raw logits [words, labels]. A word's logits are the same bits alone
  // or in any batch, at every precision, for a float32 model (a float64
  // model's LSTM steps use BLAS's dgemm: equal to rounding). Throws
  // NonFiniteLogits when one is NaN or infinite: a NaN is never served as a
  // probability.
  Tensor logits(const std::vector<std::u32string>& words);
  // predict's result from logits already computed (one forward for both).
  // Throws std::invalid_argument naming the entry when a logit is not finite.
  std::vector<std::vector<LabelScore>> scores(const Tensor& logits) const;
};

// Writes a model directory: model.safetensors (torch's state_dict names),
// vocabulary.json and config.json (sizes and label names). The directory
// changes as one unit (seqpack/model_dir.h): a process killed at any point
// leaves it holding the whole old model or the whole new one. Throws
// ModelDirBusy while another process writes it.
void save_classifier(const std::string& dir, CharClassifier& model, const Vocabulary& vocabulary,
                     const std::vector<std::string>& labels);
// The three files of save_classifier written into `dir` as they are, each
// atomically but not together (for a staging directory of a ModelDirWriter).
void write_classifier_files(const std::string& dir, CharClassifier& model, const Vocabulary& vocabulary,
                            const std::vector<std::string>& labels);
// Reads a directory written by save_classifier (or by the torch side, see
// tests/fixtures/gen_model.py). Throws std::invalid_argument naming the
// directory and the missing or inconsistent file. The files are read through
// one open descriptor of the directory, so they are one model's even while a
// save swaps another model in under the path.
TrainedClassifier load_classifier(const std::string& dir);

// ---- Validation of the model files (used by load_classifier and
// load_training_checkpoint; public so they can be fuzzed without files).
struct TrainingCheckpoint;
//
// config.json's text: {"format": "seqpack-char-classifier", "version": 1,
// "vocab_size", "embed_dim", "hidden_size", "num_classes": JSON integers within
// CharClassifierOptions' limits, "labels": num_classes distinct non-empty
// strings} (other keys are ignored). Returns the sizes; `labels`, when given,
// receives the labels. Throws std::invalid_argument starting with `where`
// (e.g. the file's path) and naming the field and its value.
CharClassifierOptions parse_classifier_config(const std::string& json_text,
                                              const std::string& where,
                                              std::vector<std::string>* labels = nullptr);
// The checks of load_training_checkpoint on a file already parsed (metadata and
// tensors as load_safetensors returns them): metadata fields, the tensors' names,
// shapes and dtypes against model_config, finite values. `source` names the
// file in every message (load_training_checkpoint passes "checkpoint <path>").
TrainingCheckpoint parse_training_checkpoint(const std::map<std::string, std::string>& metadata,
                                             const std::map<std::string, Tensor>& tensors,
                                             const std::string& source);

// A training checkpoint: everything `seqpack train --resume` needs to continue
// as if it had never stopped. One safetensors file, so replacing it is a single
// rename (a checkpoint spread over several files could be seen half old, half new):
//   tensors  "model.<torch name>"             parameters, in the training dtype
//            "adam.exp_avg.<torch name>", "adam.exp_avg_sq.<torch name>"
//   metadata "format" = "seqpack-train-checkpoint", "version" = "1",
//            "epoch" (epochs completed), "adam_step", "model_config" (JSON sizes),
//            "vocabulary" (Vocabulary::to_json), "labels" (JSON array),
//            "train_config" (JSON, opaque here: the trainer's own settings)
// The batch order needs no state of its own: BucketingSampler::epoch(e) is a pure
// function of the seed (in train_config) and e.
struct TrainingCheckpoint {
  int64_t epoch = 0;
  CharClassifierOptions model_options;
  std::map<std::string, Tensor> model_state;  // torch names
  std::map<std::string, Tensor> adam_state;   // Adam::state() keys
  int64_t adam_step = 0;
  Vocabulary vocabulary;
  std::vector<std::string> labels;
  std::string train_config;  // JSON text
};

// Writes the checkpoint to `path` atomically: complete temporary file in the same
// directory, fsync, rename over `path`, fsync of the directory. A process killed
// at any point leaves either the previous checkpoint or the new one.
void save_training_checkpoint(const std::string& path, CharClassifier& model, const Adam& optimizer,
                              const Vocabulary& vocabulary, const std::vector<std::string>& labels,
                              int64_t epoch, const std::string& train_config);
// Reads and validates a checkpoint: a missing, truncated or inconsistent file
// throws std::invalid_argument naming `path` and what is wrong with it.
TrainingCheckpoint load_training_checkpoint(const std::string& path);

}  // namespace seqpack
