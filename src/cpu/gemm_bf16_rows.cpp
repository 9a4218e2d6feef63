#include "cpu/gemm_bf16_rows.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cpu/bf16.h"
#include "cpu/bf16_pairs_avx512.h"
#include "cpu/cpu_info.h"
#include "cpu/gemm_engine.h"
#include "cpu/isa_cap.h"

namespace seqpack::cpu {

namespace {

using bf16_pairs::first_lanes;

constexpr int64_t kChunk = 32;  // bf16 values to a register: A's rows are padded to these

// Lanes [lo, hi) of 16 (16-bit pairs: lanes [2lo, 2hi) of 32).
__mmask16 lane_range(int64_t lo, int64_t hi) {
  return hi <= lo ? 0 : static_cast<__mmask16>(first_lanes(hi) & ~first_lanes(lo));
}
__mmask32 pair_lanes(__mmask16 lanes) {
  uint32_t out = 0;
  for (int t = 0; t < 16; ++t)
    if ((lanes >> t) & 1u) out |= 3u << (2 * t);
  return out;
}

SEQPACK_BF16_PAIRS_TARGET inline __m512bh as_bf16(__m512i v) {
  return reinterpret_cast<const __m512bh&>(v);
}

// A's pair p of row i, in every lane.
SEQPACK_BF16_PAIRS_TARGET inline __m512bh a_pair(const uint16_t* a, int64_t kp, int i, int64_t p) {
  uint32_t pair;
  std::memcpy(&pair, a + i * kp + 2 * p, sizeof pair);
  return as_bf16(_mm512_set1_epi32(static_cast<int>(pair)));
}

// op(B)'s pair p at the 16 columns from j (those of `lanes`): column(j)
// once per 16 columns, then load(p) for every pair; op(B) is W [k, n] in
// fp32 (in place) or laid out in pair tiles.
struct PlainPairs {
  const float* w;
  int64_t ld, k;
  struct Column {
    const float* w;
    int64_t ld, k;
    __mmask16 lanes;
    int64_t p0 = 0;
    void seek(int64_t p) { p0 = p; }
    // Pair p0 + q.
    SEQPACK_BF16_PAIRS_TARGET __m512i load(int64_t q) const {
      return bf16_pairs::row_pair(w, ld, k, 2 * (p0 + q), 0, lanes);
    }
  };
  Column column(int64_t j, __mmask16 lanes) const { return {w + j, ld, k, lanes}; }
};
struct TiledPairs {
  const uint16_t* laid;
  PairBlocking b;
  struct Column {
    const uint16_t* start;  // pair 0's
    int64_t tile_k_stride, pair_stride;
    __mmask32 halves;
    const uint16_t* at = nullptr;
    // p a multiple of 16: the first pair of a tile.
    void seek(int64_t p) { at = start + (p >> 4) * tile_k_stride; }
    // Pair p + q of the tile seek() found (q < 16); the line four tiles on
    // fetched ahead (the weights stream from memory: a product of one row
    // reads each once).
    SEQPACK_BF16_PAIRS_TARGET __m512i load(int64_t q) const {
      const uint16_t* at_q = at + q * pair_stride;
      _mm_prefetch(reinterpret_cast<const char*>(at_q + 4 * tile_k_stride), _MM_HINT_T0);
      return _mm512_maskz_loadu_epi16(halves, at_q);
    }
  };
  // j a multiple of 16: the 16 columns lie in one tile.
  Column column(int64_t j, __mmask16 lanes) const {
    return {laid + (j / b.n_block) * b.tile_n_stride + (j % b.n_block) * 2, b.tile_k_stride,
            b.n_block * 2, pair_lanes(lanes)};
  }
};

// out = (first block ? acc : acc + out), per lane.
template <int M, int V>
SEQPACK_BF16_PAIRS_TARGET inline void add_block(const __m512 acc[M][V], __m512 total[M][V],
                                                bool first) {
  for (int i = 0; i < M; ++i)
    for (int v = 0; v < V; ++v)
      total[i][v] = first ? acc[i][v] : _mm512_add_ps(acc[i][v], total[i][v]);
}

// C's lanes of rows [0, M) at columns [j, j + 16 V) (those of lanes[v]):
// total + the bias, or + beta·C.
template <int M, int V>
SEQPACK_BF16_PAIRS_TARGET inline void finish(const __m512 total[M][V], const __mmask16 lanes[V],
                                             int64_t j, float beta, float* c, int64_t ldc,
                                             const float* c_row) {
  const __m512 scale = _mm512_set1_ps(beta);
  for (int i = 0; i < M; ++i) {
    for (int v = 0; v < V; ++v) {
      if (!lanes[v]) continue;
      float* out = c + i * ldc + j + 16 * v;
      __m512 r = total[i][v];
      if (c_row) {
        r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(lanes[v], c_row + j + 16 * v));
      } else if (beta != 0.0f) {
        r = _mm512_add_ps(r, _mm512_mul_ps(scale, _mm512_maskz_loadu_ps(lanes[v], out)));
      }
      _mm512_mask_storeu_ps(out, lanes[v], r);
    }
  }
}

// Columns [j0, j1) 64 at a time (four registers of 16 lanes, from a
// multiple of 16), pair after pair of op(B)'s rows.
template <int M, typename Pairs>
SEQPACK_BF16_PAIRS_TARGET void pair_columns(const uint16_t* a, const Pairs& pairs, int64_t k,
                                            int64_t k_block, int64_t j0, int64_t j1, float beta,
                                            float* c, int64_t ldc, const float* c_row) {
  constexpr int V = 4;
  const int64_t kp = (k + kChunk - 1) / kChunk * kChunk, np = (k + 1) / 2;
  const int64_t block = k_block / 2;  // a multiple of 16 pairs
  for (int64_t j = j0 / 16 * 16; j < j1; j += 16 * V) {
    __mmask16 lanes[V];
    typename Pairs::Column cols[V];
    for (int v = 0; v < V; ++v) {
      const int64_t at = j + 16 * v;
      lanes[v] = lane_range(std::max<int64_t>(j0 - at, 0), std::min<int64_t>(j1 - at, 16));
      cols[v] = pairs.column(at, lanes[v]);
    }
    __m512 acc[M][V], total[M][V];
    for (int64_t p0 = 0; p0 < np; p0 += block) {
      for (int i = 0; i < M; ++i)
        for (int v = 0; v < V; ++v) acc[i][v] = _mm512_setzero_ps();
      const int64_t p1 = std::min(np, p0 + block);
      // 16 pairs at a time (a tile's; blocks are whole numbers of them),
      // each column of the tile from a cursor; a column without lanes loads
      // zeros (masked loads read nothing).
      for (int64_t q0 = p0; q0 < p1; q0 += 16) {
        for (int v = 0; v < V; ++v) cols[v].seek(q0);
        const int64_t count = std::min<int64_t>(16, p1 - q0);
        for (int64_t q = 0; q < count; ++q) {
          __m512i bv[V];
          for (int v = 0; v < V; ++v) bv[v] = cols[v].load(q);
          for (int i = 0; i < M; ++i) {
            const __m512bh av = a_pair(a, kp, i, q0 + q);
            for (int v = 0; v < V; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, as_bf16(bv[v]));
          }
        }
      }
      add_block<M, V>(acc, total, p0 == 0);
    }
    if (np == 0) {
      for (int i = 0; i < M; ++i)
        for (int v = 0; v < V; ++v) total[i][v] = _mm512_setzero_ps();
    }
    finish<M, V>(total, lanes, j, beta, c, ldc, c_row);
  }
}

// op(B) = Wᵀ with W [n, k] in fp32: columns [j0, j1) 16 at a time (from a
// multiple of 16), 16 pairs at a time rounded from 16 rows of W and
// transposed (bf16_pairs::column_pairs).
template <int M>
SEQPACK_BF16_PAIRS_TARGET void column_products(const uint16_t* a, const float* w, int64_t ld,
                                               int64_t k, int64_t k_block, int64_t j0, int64_t j1,
                                               float beta, float* c, int64_t ldc,
                                               const float* c_row) {
  const int64_t kp = (k + kChunk - 1) / kChunk * kChunk, np = (k + 1) / 2;
  const int64_t block = k_block / 2;  // a multiple of 16 pairs
  __m512i table[16];
  for (int64_t j = j0 / 16 * 16; j < j1; j += 16) {
    const __mmask16 lanes[1] = {
        lane_range(std::max<int64_t>(j0 - j, 0), std::min<int64_t>(j1 - j, 16))};
    __m512 acc[M][1], total[M][1];
    for (int64_t p0 = 0; p0 < np; p0 += block) {
      for (int i = 0; i < M; ++i) acc[i][0] = _mm512_setzero_ps();
      const int64_t p1 = std::min(np, p0 + block);
      for (int64_t q0 = p0; q0 < p1; q0 += 16) {
        bf16_pairs::column_pairs(w, ld, k, j, 2 * q0, lanes[0], table);
        const int64_t count = std::min<int64_t>(16, p1 - q0);
        for (int64_t q = 0; q < count; ++q) {
          for (int i = 0; i < M; ++i)
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], a_pair(a, kp, i, q0 + q), as_bf16(table[q]));
        }
      }
      add_block<M, 1>(acc, total, p0 == 0);
    }
    if (np == 0) {
      for (int i = 0; i < M; ++i) total[i][0] = _mm512_setzero_ps();
    }
    finish<M, 1>(total, lanes, j, beta, c, ldc, c_row);
  }
}

template <int M>
void product_of(const uint16_t* a, const Bf16RowsB& b, int64_t j0, int64_t j1, float beta, float* c,
                int64_t ldc, const float* c_row) {
  if (b.laid) {
    pair_columns<M>(a, TiledPairs{b.laid, b.blocking}, b.k, b.k_block, j0, j1, beta, c, ldc, c_row);
  } else if (b.trans) {
    column_products<M>(a, b.w, b.ld, b.k, b.k_block, j0, j1, beta, c, ldc, c_row);
  } else {
    pair_columns<M>(a, PlainPairs{b.w, b.ld, b.k}, b.k, b.k_block, j0, j1, beta, c, ldc, c_row);
  }
}

}  // namespace

bool bf16_rows_available() {
  return cpu_converts_bf16() && !bf16_emulation() && has_bf16_dot_products() &&
         !has_amx_dot_products() && isa_cap() == IsaLevel::avx512;
}

const uint16_t* bf16_rows_operand(int64_t m, int64_t k, const float* a, int64_t lda,
                                  const uint16_t* a16, GrowBuffer<uint16_t>& buf) {
  const int64_t kp = (k + kChunk - 1) / kChunk * kChunk;
  uint16_t* out = buf.resize(static_cast<std::size_t>(m * kp));
  for (int64_t i = 0; i < m; ++i) {
    uint16_t* row = out + i * kp;
    if (a16) {
      std::memcpy(row, a16 + i * k, static_cast<std::size_t>(k) * sizeof(uint16_t));
    } else {
      f32_to_bf16(a + i * lda, row, k);
    }
    std::fill(row + k, row + kp, uint16_t{0});
  }
  return out;
}

void bf16_rows_product(int64_t m, const uint16_t* a, const Bf16RowsB& b, int64_t j0, int64_t j1,
                       float beta, float* c, int64_t ldc, const float* c_row) {
  if (b.k_block <= 0 || b.k_block % kChunk != 0) {
    throw std::invalid_argument("bf16_rows_product: k_block = " + std::to_string(b.k_block) +
                                ", a positive multiple of 32 needed");
  }
  if (m < 1 || m > kFewRows) {
    throw std::invalid_argument("bf16_rows_product: m = " + std::to_string(m) + " rows, 1 to " +
                                std::to_string(kFewRows) + " allowed");
  }
  using Product = void (*)(const uint16_t*, const Bf16RowsB&, int64_t, int64_t, float, float*,
                           int64_t, const float*);
  static constexpr Product products[kFewRows] = {product_of<1>, product_of<2>, product_of<3>,
                                                 product_of<4>};
  products[m - 1](a, b, j0, j1, beta, c, ldc, c_row);
}

}  // namespace seqpack::cpu
