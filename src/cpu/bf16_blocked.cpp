#include "cpu/bf16_blocked.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "cpu/bf16.h"

namespace seqpack::cpu {

namespace {

constexpr int64_t kTileRows = 32;  // 16 pairs

int64_t tiles(int64_t size, int64_t block) { return (size + block - 1) / block; }

// Where op(src)'s value at tile-local row r and column c goes, from the tile's start.
int64_t in_tile(int64_t r, int64_t c, int64_t n_block) {
  return ((r / 2) * n_block + c) * 2 + (r & 1);
}

// The mask of the first `count` of 16 lanes (count in [0, 16]).
__mmask16 first_lanes(int64_t count) {
  return static_cast<__mmask16>((1u << std::clamp<int64_t>(count, 0, 16)) - 1u);
}

// Rows 2p and 2p + 1 of op(src) = src [k, n] (row stride ld) into their
// pair row of every tile of row of tiles ti: 16 columns at a time rounded
// together and interleaved, a 64-byte store each.
__attribute__((target("avx512f,avx512bw,avx512bf16,avx512vl"))) void pair_row_native(
    const float* src, int64_t ld, int64_t k, int64_t n, int64_t ti, int64_t p,
    const PairBlocking& b, uint16_t* dst) {
  // Lane 2t takes row 2p's column t, lane 2t + 1 row 2p + 1's.
  alignas(64) static const uint16_t interleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                      21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                      11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i order = _mm512_load_si512(interleave);
  const int64_t i = ti * kTileRows + 2 * p;
  const float* lo_row = src + i * ld;
  const float* hi_row = lo_row + ld;
  for (int64_t tj = 0; tj < tiles(n, b.n_block); ++tj) {
    uint16_t* out = dst + ti * b.tile_k_stride + tj * b.tile_n_stride + p * b.n_block * 2;
    for (int64_t c0 = 0; c0 < b.n_block; c0 += 16) {
      const int64_t j = tj * b.n_block + c0;
      const __mmask16 cols = first_lanes(n - j);
      const __m512 lo =
          i < k && cols ? _mm512_maskz_loadu_ps(cols, lo_row + j) : _mm512_setzero_ps();
      const __m512 hi =
          i + 1 < k && cols ? _mm512_maskz_loadu_ps(cols, hi_row + j) : _mm512_setzero_ps();
      const __m512i pairs = reinterpret_cast<const __m512i&>(
          static_cast<const __m512bh&>(_mm512_cvtne2ps_pbh(hi, lo)));
      _mm512_storeu_si512(out + c0 * 2, _mm512_permutexvar_epi16(order, pairs));
    }
  }
}

// r[i][j] -> r[j][i] for a 16 x 16 table of 32-bit values, one row a
// register: pairs of rows interleaved by 32 then 64 bits, then 128-bit lanes
// exchanged between the registers four rows apart.
__attribute__((target("avx512f"))) void transpose_16x16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4i + c], lane L: column 4L + c of rows 4i .. 4i + 3.
  for (int i = 0; i < 4; ++i) {
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i x0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
    const __m512i x1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
    const __m512i x2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i x3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
    r[c] = _mm512_shuffle_i32x4(x0, x2, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(x0, x2, 0xDD);
    r[8 + c] = _mm512_shuffle_i32x4(x1, x3, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(x1, x3, 0xDD);
  }
}

// Columns j0 .. j0 + 15 of op(src) = srcᵀ (src [n, k], row stride ld: a
// stored row is a column, its 32 values of a tile 16 pairs already) into
// their place in every tile of their column of tiles: per tile, 16 rows
// rounded into 16 registers of pairs and transposed into the tile's 16 pair
// rows. (Gathering the pair rows from a table in memory instead ran at a
// third of the speed: the gathers wait on the table's stores.)
__attribute__((target("avx512f,avx512bw,avx512bf16,avx512vl"))) void column_strip_native(
    const float* src, int64_t ld, int64_t k, int64_t n, int64_t j0, const PairBlocking& b,
    uint16_t* dst) {
  const int64_t tj = j0 / b.n_block, c0 = j0 % b.n_block;
  __m512i table[16];
  for (int64_t ti = 0; ti < tiles(k, kTileRows); ++ti) {
    const int64_t i0 = ti * kTileRows;
    const __mmask16 low = first_lanes(k - i0), high = first_lanes(k - i0 - 16);
    for (int64_t c = 0; c < 16; ++c) {
      const int64_t j = j0 + c;
      const float* row = src + j * ld + i0;
      const __m512 lo = j < n && low ? _mm512_maskz_loadu_ps(low, row) : _mm512_setzero_ps();
      const __m512 hi = j < n && high ? _mm512_maskz_loadu_ps(high, row + 16) : _mm512_setzero_ps();
      table[c] = reinterpret_cast<const __m512i&>(
          static_cast<const __m512bh&>(_mm512_cvtne2ps_pbh(hi, lo)));
    }
    transpose_16x16(table);
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
