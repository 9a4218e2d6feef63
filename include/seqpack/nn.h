// Trainable building blocks with hand-written backward passes: Embedding,
// Linear and Dropout, with PyTorch 1.13's parameter names, initialisation
// rules and gradients.
//
//   Embedding emb(vocab, 32, /*padding_idx=*/0, DType::f32, /*seed=*/1);
//   Linear fc(32, 7, /*bias=*/true, DType::f32, /*seed=*/2);
//   Tensor h = emb.forward(ids);              // ids: int64 [N] -> [N, 32]
//   Tensor logits = fc.forward(h);            // [N, 7]
//   CrossEntropyLoss ce;                      // seqpack/loss.h
//   double loss = ce.forward(logits, labels);
//   emb.backward(fc.backward(ce.backward())); // grads accumulate, as in torch
//   opt.step(); opt.zero_grad();              // seqpack/optim.h
//
// Design: each module keeps what its last forward needs for backward
// (explicit backward rather than a general tape). A model calls its modules'
// backward in reverse order; the models here are small chains, so a tape
// would add machinery without removing any code.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "seqpack/precision.h"
#include "seqpack/tensor.h"

namespace seqpack {

// A parameter as optimisers see it. `value` and `grad` are views sharing the
// module's storage, so an optimiser step updates the module in place.
struct Parameter {
  std::string name;
  Tensor value;
  Tensor grad;  // same shape and dtype, accumulated by backward
};

// Embedding(num_embeddings, embedding_dim, padding_idx): weight [V, D] drawn
// from N(0, 1) as torch does; the padding_idx row starts at zero and never
// receives gradient, so it stays zero through training.
class Embedding {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim,
            std::optional<int64_t> padding_idx = std::nullopt, DType dtype = DType::f32,
            uint64_t seed = 0);

  // indices: int64, any shape; returns shape + [D]. Throws naming the first
  // index outside [0, num_embeddings).
  Tensor forward(const Tensor& indices);
  // Accumulates into grad() (rows of padding_idx excepted). Embedding is a
  // leaf, so nothing is returned.
  void backward(const Tensor& grad_output);

  int64_t num_embeddings() const { return weight_.size(0); }
  int64_t embedding_dim() const { return weight_.size(1); }
  std::optional<int64_t> padding_idx() const { return padding_idx_; }
  Tensor& weight() { return weight_; }
  Tensor& grad() { return grad_; }
  std::vector<Parameter> parameters(const std::string& prefix = "");
  void zero_grad();

 private:
  Tensor weight_, grad_;
  std::optional<int64_t> padding_idx_;
  Tensor last_indices_;
};

// Linear(in, out): y = x W^T + b, W [out, in], b [out]; both drawn from
// U(-1/sqrt(in), 1/sqrt(in)) (what torch's kaiming_uniform_(a=sqrt(5)) reduces to).
class Linear {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, DType dtype = DType::f32,
         uint64_t seed = 0);

  // input [*, in] -> [*, out]. Keeps a view of the input for backward.
  Tensor forward(const Tensor& input);
  // Returns the input gradient and accumulates dW, db.
  Tensor backward(const Tensor& grad_output);

  int64_t in_features() const { return weight_.size(1); }
  int64_t out_features() const { return weight_.size(0); }
  Tensor& weight() { return weight_; }
  Tensor& bias() { return bias_; }  // undefined without bias
  Tensor& weight_grad() { return weight_grad_; }
  Tensor& bias_grad() { return bias_grad_; }
  std::vector<Parameter> parameters(const std::string& prefix = "");
  void zero_grad();
  // The kernels its products run on (their ISA cap: a policy's
  // kernel_config, seqpack/policy.h; the defaults until set).
  void set_kernels(const KernelConfig& kernels) { kernels_ = kernels; }
  const KernelConfig& kernels() const { return kernels_; }

 private:
  Tensor weight_, bias_, weight_grad_, bias_grad_;
  Tensor last_input_;
  KernelConfig kernels_;
};

// Dropout(p): in training, zeroes each element with probability p and scales
// the rest by 1 / (1 - p); identity in eval mode or when p = 0.
class Dropout {
 public:
  explicit Dropout(double p = 0.5, uint64_t seed = 0);

  Tensor forward(const Tensor& input);
  // Applies a given keep-mask (1 keep, 0 drop; same shape as input) instead of
  // drawing one: for tests and for replaying a forward.
  Tensor forward_with_mask(const Tensor& input, const Tensor& mask);
  Tensor backward(const Tensor& grad_output);

  void train(bool on = true) { training_ = on; }
  void eval() { train(false); }
  bool is_training() const { return training_; }
  double p() const { return p_; }

 private:
  double p_;
  bool training_ = true;
  std::mt19937_64 rng_;
  Tensor scale_;  // mask / (1 - p) of the last forward; undefined = identity
};

}  // namespace seqpack
