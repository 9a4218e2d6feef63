// CrossEntropyLoss with PyTorch 1.13's defaults: mean reduction over the
// targets that are not ignore_index (NaN when every target is ignored, as torch).
//
//   CrossEntropyLoss ce;                       // ignore_index = -100
//   double loss = ce.forward(logits, targets); // logits [N, C], targets int64 [N]
//   Tensor dlogits = ce.backward();            // d loss / d logits, [N, C]
#pragma once

#include <cstdint>

#include "seqpack/tensor.h"

namespace seqpack {

class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(int64_t ignore_index = -100) : ignore_index_(ignore_index) {}

  // loss = mean over kept n of (logsumexp(logits[n]) - logits[n][targets[n]]).
  // Throws naming a target outside [0, C) that is not ignore_index.
  double forward(const Tensor& logits, const Tensor& targets);
  // Gradient of the last forward's loss (times grad_loss) w.r.t. its logits:
  // (softmax - onehot) / kept, zero on ignored rows.
  Tensor backward(double grad_loss = 1.0) const;

  int64_t ignore_index() const { return ignore_index_; }

 private:
  int64_t ignore_index_;
  Tensor probs_;    // softmax of the last logits
  Tensor targets_;  // last targets
  int64_t kept_ = 0;
};

// Softmax over the last dimension of a [N, C] tensor (a new tensor).
Tensor softmax(const Tensor& logits);

}  // namespace seqpack
