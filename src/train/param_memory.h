// Whether parameters share memory (src/train/optim.cpp): the optimisers and
// clip_grad_norm run their chunks on several threads only where no two
// parameters' values, nor two of their gradients, overlap.
#pragma once

#include <vector>

#include "seqpack/optim.h"

namespace seqpack::train {

bool parameters_share_memory(const std::vector<Parameter>& params);

}  // namespace seqpack::train
