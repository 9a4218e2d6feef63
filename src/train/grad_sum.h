// Adding a backward's weight gradients into the gradients the modules keep
// (RNNBase, RNNCellBase, CharClassifier), as autograd accumulates them.
#pragma once

#include <vector>

#include "seqpack/tensor.h"

namespace seqpack::train {

// dst[k] += src[k] for every k (the same shapes and float dtype, f32 or f64),
// element by element: the same bits on any number of threads. The tensors
// are cut into chunks of 16384 elements, which OpenMP's threads share
// (outside a parallel region, where there are two chunks or more): on the
// calling thread alone the main job's 656 KB of LSTM gradients were read back
// from the cores that had just computed them, one batch after another.
void add_grads(std::vector<Tensor>& dst, const std::vector<Tensor>& src);

}  // namespace seqpack::train
