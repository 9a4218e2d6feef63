// Training in seqpack reads like PyTorch: forward, loss, backward, optimiser
// step, zero_grad. A character-level LSTM learns which of three languages a
// word is in, from twelve words, then classifies words it has not seen.
//
//   cmake --build build --target example_train_tiny && ./build/examples/train_tiny
#include <cstdio>
#include <string>
#include <vector>

#include "seqpack/classifier.h"
#include "seqpack/loss.h"
#include "seqpack/optim.h"
#include "seqpack/vocabulary.h"

int main() {
  using namespace seqpack;
  const std::vector<std::string> labels = {"english", "french", "german"};
  const std::vector<std::u32string> words = {U"the",    U"and", U"house",  U"water",
                                             U"maison", U"été", U"eau",    U"très",
                                             U"haus",   U"straße", U"über", U"wasser"};
  const Tensor targets = Tensor::from_vector<int64_t>({0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2});

  // <pad> = 0, <unk> = 1, then the characters of the corpus.
  const Vocabulary vocab = Vocabulary::build(words);
  std::vector<std::vector<int64_t>> batch;
  for (const auto& w : words) batch.push_back(vocab.encode(w));

  // Embedding(V, 8, padding_idx=0) -> bidirectional LSTM(16) -> Linear(32, 3).
  CharClassifier model({.vocab_size = vocab.size(), .embed_dim = 8, .hidden_size = 16,
                        .num_classes = 3},
                       /*seed=*/0);
  Adam opt(model.parameters(), {.lr = 2e-2});
  CrossEntropyLoss loss_fn;

  for (int step = 1; step <= 100; ++step) {
    Tensor logits = model.forward(batch);             // variable lengths, packed inside
    double loss = loss_fn.forward(logits, targets);   // mean cross-entropy
    model.backward(loss_fn.backward());               // accumulates every parameter's grad
    clip_grad_norm(opt.parameters(), /*max_norm=*/5.0);
    opt.step();
    opt.zero_grad();
    if (step % 20 == 0) std::printf("step %3d  loss %.4f\n", step, loss);
  }

  const std::vector<std::u32string> unseen = {U"château", U"wasserhaus", U"other"};
  std::vector<std::vector<int64_t>> ids;
  for (const auto& w : unseen) ids.push_back(vocab.encode(w));  // unknown chars -> <unk>
  Tensor p = softmax(model.forward(ids, /*requires_grad=*/false));
  for (std::size_t i = 0; i < unseen.size(); ++i) {
    std::printf("%-12s", encode_utf8(unseen[i]).c_str());
    for (std::size_t c = 0; c < labels.size(); ++c) {
      std::printf("  %s %.2f", labels[c].c_str(), p.item_as_double(static_cast<int64_t>(i * 3 + c)));
    }
    std::printf("\n");
  }
  return 0;
}
