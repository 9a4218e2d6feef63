// Recycled tensor storage for the recurrent layers' per-call buffers (gate
// activations, saved states, gradients). Fresh large allocations come from
// mmap and are zero-filled page by page by the kernel on first touch; in a
// training loop that cost the same as a sizeable fraction of the GEMMs. Blocks
// released here are kept (up to a cap) and handed out again for a request of
// the same size, so a steady loop stops faulting pages in.
#pragma once

#include "seqpack/tensor.h"

namespace seqpack::cpu {

// Like Tensor::empty, but the storage returns to the pool when the last view
// of it goes away. Thread-safe.
Tensor pooled_empty(Shape shape, DType dtype);

}  // namespace seqpack::cpu
