// Passes over a list of tensors cut into chunks that OpenMP's threads share:
// the optimisers, clip_grad_norm and zero_grad (src/train/optim.cpp) and the
// sum of a backward's weight gradients into the modules' (train/grad_sum.h).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace seqpack::train {

// Each tensor's chunks start at multiples of kChunk, so a SIMD loop meets the
// same vectors and tail as over the whole tensor: the bits of an
// element-by-element pass do not depend on the thread count.
constexpr int64_t kChunk = 1 << 14;

struct Chunk {
  std::size_t tensor;
  int64_t begin, end;
};

struct Chunks {
  std::vector<Chunk> list;
  bool disjoint = true;  // no two tensors share memory: the chunks may run at once
};

// Chunks of tensors of `sizes` elements (tensor k has sizes[k]).
inline Chunks chunks_of_sizes(const std::vector<int64_t>& sizes) {
  Chunks c;
  for (std::size_t k = 0; k < sizes.size(); ++k)
    for (int64_t a = 0; a < sizes[k]; a += kChunk)
      c.list.push_back({k, a, std::min(sizes[k], a + kChunk)});
  return c;
}

// f(k, begin, end, c): elements [begin, end) of tensor k as chunk c, on
// OpenMP's threads (a static schedule, so chunk c goes to the same thread in
// every pass of one list) where the tensors are disjoint, there are two
// chunks or more and the caller is outside a parallel region; else in order.
template <typename F>
void for_chunks(const Chunks& chunks, F&& f) {
  const auto count = static_cast<int64_t>(chunks.list.size());
  const bool parallel =
      chunks.disjoint && count >= 2 && omp_get_max_threads() > 1 && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t c = 0; c < count; ++c) {
    const Chunk& ch = chunks.list[static_cast<std::size_t>(c)];
    f(ch.tensor, ch.begin, ch.end, c);
  }
}

}  // namespace seqpack::train
