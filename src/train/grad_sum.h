// Adding a backward's weight gradients into the gradients the modules keep
// (RNNBase, RNNCellBase, CharClassifier), as autograd accumulates them.
#pragma once

#include <vector>

#include "seqpack/tensor.h"

namespace seqpack::train {

// dst[k] += src[k] for every k (the same shapes and float dtype, f32 or f64;
// dst the module's own tensors, which never overlap), element by element:
// the same bits on any number of threads. The tensors are cut into chunks of
// 16384 elements, which OpenMP's threads share (outside a parallel region,
// where there are two chunks or more). On the calling thread alone, the main
// job's add (656 KB of LSTM gradients a batch) took 0.4% of a two-thread
// run's samples on a Zen 4 (perf) while the other thread waited; shared,
// 0.2-0.3% a thread: too little to see in the epoch there, a larger share of
// the step the more threads run.
void add_grads(std::vector<Tensor>& dst, const std::vector<Tensor>& src);

}  // namespace seqpack::train
