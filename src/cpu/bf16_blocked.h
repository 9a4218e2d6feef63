// A weight matrix written straight into the blocked bf16 layout oneDNN's
// bf16 matmul reads (one pass: read fp32, round, place), instead of rounding
// it into a plain bf16 copy and reordering that with oneDNN: its reorder from
// weights stored transposed (every W_hh and W_ihᵀ) ran at ~7 GB/s on Zen 5
// (0.30 ms for LSTM(500)'s W_hh, DNNL_VERBOSE), more than the step products
// of a one-step call that lays its weights out.
#pragma once

#include <cstdint>

namespace seqpack::cpu {

// The layouts written: [k, n] in tiles of 32 rows (k) by `n_block` columns
// (n), each tile stored as 16 row pairs, a pair's two values of one column
// side by side (oneDNN's "16a<n_block>b2a": BA16a64b2a and its 16, 32 and 48
// column kin); the tile of rows [32i, 32i + 32) and columns
// [n_block j, n_block (j + 1)) starts at element i·tile_k_stride +
// j·tile_n_stride. Rows and columns past k and n up to whole tiles are
// written as zeros.
struct PairBlocking {
  int64_t n_block = 0;
  int64_t tile_k_stride = 0, tile_n_stride = 0;
};

// op(src) [k, n] (src [k, n] with row stride ld, or its transpose [n, k]
// with row stride ld where trans) rounded to bf16 (bf16_of's bits) into dst
// laid out as `b` says (dst holds the whole tiles covering [k, n]).
// AVX512-BF16 where the CPU has it (cpu_converts_bf16), else plain loops.
void write_pair_blocked_bf16(const float* src, bool trans, int64_t ld, int64_t k, int64_t n,
                             const PairBlocking& b, uint16_t* dst);

// The plain loops alone: the reference the tests hold the fast path to.
void write_pair_blocked_bf16_reference(const float* src, bool trans, int64_t ld, int64_t k,
                                       int64_t n, const PairBlocking& b, uint16_t* dst);

}  // namespace seqpack::cpu
