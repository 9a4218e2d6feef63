// Recycled tensor storage for the recurrent layers' per-call buffers (gate
// activations, saved states, gradients). Fresh large allocations come from
// mmap and are zero-filled page by page by the kernel on first touch; in a
// training loop that cost the same as a sizeable fraction of the GEMMs. Blocks
// released here are kept (up to a cap) and handed out again for a request of
// the same size class, so a steady loop stops faulting pages in.
#pragma once

#include "seqpack/tensor.h"

namespace seqpack::cpu {

// Like Tensor::empty, but the storage returns to the pool when the last view
// of it goes away. Thread-safe.
Tensor pooled_empty(Shape shape, DType dtype);

// The size of the block pooled_empty takes for `bytes` of storage (0 for a
// request too small to pool): requests of nearby sizes share a size class, so
// a block released by one batch serves the next batch of a similar size.
std::size_t pool_block_bytes(std::size_t bytes);
// Bytes held in released blocks, waiting for reuse, and the most it holds
// (past it, the blocks released longest ago are freed).
std::size_t pool_cached_bytes();
std::size_t pool_max_cached_bytes();

}  // namespace seqpack::cpu
