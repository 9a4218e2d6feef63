#include "cpu/bf16_blocked.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "cpu/bf16.h"
#include "cpu/bf16_pairs_avx512.h"

namespace seqpack::cpu {

namespace {

constexpr int64_t kTileRows = 32;  // 16 pairs

int64_t tiles(int64_t size, int64_t block) { return (size + block - 1) / block; }

// Where op(src)'s value at tile-local row r and column c goes, from the tile's start.
int64_t in_tile(int64_t r, int64_t c, int64_t n_block) {
  return ((r / 2) * n_block + c) * 2 + (r & 1);
}

using bf16_pairs::column_pairs;
using bf16_pairs::row_pair;

// Rows 2p and 2p + 1 of op(src) = src [k, n] (row stride ld) into their
// pair row of every tile of row of tiles ti: 16 columns at a time rounded
// together and interleaved, a 64-byte store each.
SEQPACK_BF16_PAIRS_TARGET void pair_row_native(const float* src, int64_t ld, int64_t k, int64_t n,
                                               int64_t ti, int64_t p, const PairBlocking& b,
                                               uint16_t* dst) {
  const int64_t i = ti * kTileRows + 2 * p;
  for (int64_t tj = 0; tj < tiles(n, b.n_block); ++tj) {
    uint16_t* out = dst + ti * b.tile_k_stride + tj * b.tile_n_stride + p * b.n_block * 2;
    for (int64_t c0 = 0; c0 < b.n_block; c0 += 16) {
      const int64_t j = tj * b.n_block + c0;
      _mm512_storeu_si512(out + c0 * 2, row_pair(src, ld, k, i, j, bf16_pairs::first_lanes(n - j)));
    }
  }
}

// Columns j0 .. j0 + 15 of op(src) = srcᵀ (src [n, k], row stride ld: a
// stored row is a column, its 32 values of a tile 16 pairs already) into
// their place in every tile of their column of tiles: per tile, 16 rows
// rounded into 16 registers of pairs and transposed into the tile's 16 pair
// rows. (Gathering the pair rows from a table in memory instead ran at a
// third of the speed: the gathers wait on the table's stores.)
SEQPACK_BF16_PAIRS_TARGET void column_strip_native(const float* src, int64_t ld, int64_t k,
                                                   int64_t n, int64_t j0, const PairBlocking& b,
                                                   uint16_t* dst) {
  const int64_t tj = j0 / b.n_block, c0 = j0 % b.n_block;
  const __mmask16 rows = bf16_pairs::first_lanes(n - j0);
  __m512i table[16];
  for (int64_t ti = 0; ti < tiles(k, kTileRows); ++ti) {
    column_pairs(src, ld, k, j0, ti * kTileRows, rows, table);
    uint16_t* tile = dst + ti * b.tile_k_stride + tj * b.tile_n_stride;
    for (int64_t p = 0; p < kTileRows / 2; ++p)
      _mm512_storeu_si512(tile + (p * b.n_block + c0) * 2, table[p]);
  }
}

}  // namespace

void write_pair_blocked_bf16_reference(const float* src, bool trans, int64_t ld, int64_t k,
                                       int64_t n, const PairBlocking& b, uint16_t* dst) {
  for (int64_t ti = 0; ti < tiles(k, kTileRows); ++ti) {
    for (int64_t tj = 0; tj < tiles(n, b.n_block); ++tj) {
      uint16_t* tile = dst + ti * b.tile_k_stride + tj * b.tile_n_stride;
      for (int64_t r = 0; r < kTileRows; ++r) {
        for (int64_t c = 0; c < b.n_block; ++c) {
          const int64_t i = ti * kTileRows + r, j = tj * b.n_block + c;
          uint16_t v = 0;
          if (i < k && j < n) v = bf16_of(trans ? src[j * ld + i] : src[i * ld + j]);
          tile[in_tile(r, c, b.n_block)] = v;
        }
      }
    }
  }
}

void write_pair_blocked_bf16(const float* src, bool trans, int64_t ld, int64_t k, int64_t n,
                             const PairBlocking& b, uint16_t* dst) {
  if (!cpu_converts_bf16() || b.n_block % 16 != 0) {
    write_pair_blocked_bf16_reference(src, trans, ld, k, n, b, dst);
    return;
  }
  // In strips that read src's rows front to back, few at a time: 16 stored
  // rows (16 columns of op(src)) or 2 (a pair row), each across all of its
  // tiles. Tile by tile instead (a tile's 64 or 32 rows read 128 or 256
  // bytes at a time) took 1.4-2x as long on 4096 x 1024 weights and 1.3x
  // on 2000 x 500 (Zen 5, bench_gemm BM_bf16_layout, alternating runs).
  if (trans) {
    for (int64_t j0 = 0; j0 < tiles(n, b.n_block) * b.n_block; j0 += 16)
      column_strip_native(src, ld, k, n, j0, b, dst);
  } else {
    for (int64_t ti = 0; ti < tiles(k, kTileRows); ++ti)
      for (int64_t p = 0; p < kTileRows / 2; ++p) pair_row_native(src, ld, k, n, ti, p, b, dst);
  }
}

}  // namespace seqpack::cpu
