#include "cpu/gemm_bf16_rows.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

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

// Products of more rows (kFewRows < m), in place only: per panel of 32
// columns and block of k, op(B)'s pairs rounded once into `packed` (two
// registers of 16 columns a pair, in L1 for blocks of up to 512 values),
// then read by every chunk of up to kPanelRows rows, whose sums of the
// block are added to the panel's running totals in `totals` (m x 32).
// Rounding W costs what laying it out costs (bench_gemm BM_bf16_in_place,
// Zen 5, W in cache: 64 x 500 x 2000 in 337 us, against 331 laying W out
// and running oneDNN's kernel, whose product alone took 255), but reads
// W where an optimizer step left it rather than writing and reading back a
// layout: LSTM(500)'s one-step train+SGD call at batch 64 went from 2629 to
// 2419 us (bench/step_vs_torch.py). Software prefetches of the next
// panel's W during the products measured no faster (337 against 341 us).
constexpr int kPanelRows = 12;  // 24 accumulators, 2 pair registers, 1 broadcast
constexpr int64_t kPanelColumns = 32;

struct PanelScratch {
  GrowBuffer<uint16_t> packed;  // 32 values a register
  GrowBuffer<float> totals;
  GrowBuffer<uint32_t> a;  // A's pairs, interleaved per chunk of rows
};

// Pairs [p0, p1) of op(B) at columns [j, j + 32) (those of lanes[0..1])
// rounded into out: pair q's two registers at out[2 (q - p0)], [.. + 1].
SEQPACK_BF16_PAIRS_TARGET void pack_panel(const Bf16RowsB& b, int64_t j, const __mmask16 lanes[2],
                                          int64_t p0, int64_t p1, __m512i* out) {
  if (b.trans) {
    __m512i table[16];
    for (int v = 0; v < 2; ++v) {
      for (int64_t q0 = p0; q0 < p1; q0 += 16) {
        bf16_pairs::column_pairs(b.w, b.ld, b.k, j + 16 * v, 2 * q0, lanes[v], table);
        const int64_t count = std::min<int64_t>(16, p1 - q0);
        for (int64_t q = 0; q < count; ++q) out[2 * (q0 - p0 + q) + v] = table[q];
      }
    }
    return;
  }
  for (int64_t p = p0; p < p1; ++p) {
    for (int v = 0; v < 2; ++v)
      out[2 * (p - p0) + v] = bf16_pairs::row_pair(b.w, b.ld, b.k, 2 * p, j + 16 * v, lanes[v]);
  }
}

// R rows of A by `count` packed pairs: A's pairs from `a` interleaved (pair q
// of row i at a[q R + i]); the rows' block sums stored to totals (first
// block) or added to them.
template <int R>
SEQPACK_BF16_PAIRS_TARGET void panel_rows(const uint32_t* a, int64_t count, const __m512i* packed,
                                          float* totals, bool first) {
  __m512 acc[R][2];
  for (int i = 0; i < R; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t q = 0; q < count; ++q, a += R) {
    const __m512bh b0 = as_bf16(_mm512_load_si512(packed + 2 * q));
    const __m512bh b1 = as_bf16(_mm512_load_si512(packed + 2 * q + 1));
    for (int i = 0; i < R; ++i) {
      const __m512bh av = as_bf16(_mm512_set1_epi32(static_cast<int>(a[i])));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], av, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], av, b1);
    }
  }
  for (int i = 0; i < R; ++i) {
    for (int v = 0; v < 2; ++v) {
      float* t = totals + i * kPanelColumns + 16 * v;
      _mm512_storeu_ps(t, first ? acc[i][v] : _mm512_add_ps(acc[i][v], _mm512_loadu_ps(t)));
    }
  }
}

// (packed as void: a pointer type to a vector type loses its attributes as
// a template argument.)
template <int R>
void panel_rows_of(const uint32_t* a, int64_t count, const void* packed, float* totals,
                   bool first) {
  panel_rows<R>(a, count, static_cast<const __m512i*>(packed), totals, first);
}

using PanelRows = void (*)(const uint32_t*, int64_t, const void*, float*, bool);
template <int... R>
constexpr std::array<PanelRows, sizeof...(R)> panel_kernels(std::integer_sequence<int, R...>) {
  return {panel_rows_of<R + 1>...};
}
constexpr auto kPanelKernels = panel_kernels(std::make_integer_sequence<int, kPanelRows>{});

SEQPACK_BF16_PAIRS_TARGET void panel_product(int64_t m, const uint16_t* a, const Bf16RowsB& b,
                                             int64_t j0, int64_t j1, float beta, float* c,
                                             int64_t ldc, const float* c_row) {
  thread_local PanelScratch scratch;
  const int64_t kp = (b.k + kChunk - 1) / kChunk * kChunk, np = (b.k + 1) / 2;
  const int64_t block = b.k_block / 2;
  auto* packed = reinterpret_cast<__m512i*>(
      scratch.packed.resize(static_cast<std::size_t>(2 * kChunk * std::min(np, block))));
  float* totals = scratch.totals.resize(static_cast<std::size_t>(m * kPanelColumns));
  // A's pairs per chunk of rows: chunk i0's pair q of row i0 + i at
  // a_pairs[i0 np + q rows + i] (rows: the chunk's).
  uint32_t* a_pairs = scratch.a.resize(static_cast<std::size_t>(m * np));
  for (int64_t i0 = 0; i0 < m; i0 += kPanelRows) {
    const int64_t rows = std::min<int64_t>(kPanelRows, m - i0);
    for (int64_t i = 0; i < rows; ++i) {
      const uint16_t* row = a + (i0 + i) * kp;
      for (int64_t q = 0; q < np; ++q)
        std::memcpy(a_pairs + i0 * np + q * rows + i, row + 2 * q, sizeof(uint32_t));
    }
  }
  for (int64_t j = j0 / 16 * 16; j < j1; j += kPanelColumns) {
    const __mmask16 lanes[2] = {
        lane_range(std::max<int64_t>(j0 - j, 0), std::min<int64_t>(j1 - j, 16)),
        lane_range(std::max<int64_t>(j0 - j - 16, 0), std::min<int64_t>(j1 - j - 16, 16))};
    if (np == 0) std::fill(totals, totals + m * kPanelColumns, 0.0f);
    for (int64_t p0 = 0; p0 < np; p0 += block) {
      const int64_t p1 = std::min(np, p0 + block);
      pack_panel(b, j, lanes, p0, p1, packed);
      for (int64_t i0 = 0; i0 < m; i0 += kPanelRows) {
        const int64_t rows = std::min<int64_t>(kPanelRows, m - i0);
        kPanelKernels[rows - 1](a_pairs + i0 * np + p0 * rows, p1 - p0, packed,
                                totals + i0 * kPanelColumns, p0 == 0);
      }
    }
    const __m512 scale = _mm512_set1_ps(beta);
    for (int64_t i = 0; i < m; ++i) {
      for (int v = 0; v < 2; ++v) {
        if (!lanes[v]) continue;
        const int64_t at = j + 16 * v;
        float* out = c + i * ldc + at;
        __m512 r = _mm512_loadu_ps(totals + i * kPanelColumns + 16 * v);
        if (c_row) {
          r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(lanes[v], c_row + at));
        } else if (beta != 0.0f) {
          r = _mm512_add_ps(r, _mm512_mul_ps(scale, _mm512_maskz_loadu_ps(lanes[v], out)));
        }
        _mm512_mask_storeu_ps(out, lanes[v], r);
      }
    }
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

bool bf16_rows_available(const Kernels& kernels) {
  return cpu_converts_bf16() && !kernels.bf16_emulated && native_bf16_dot_products() &&
         !has_amx_dot_products() && avx512_allowed(kernels.isa_cap);
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
  if (m < 1 || (m > kFewRows && !b.w)) {
    throw std::invalid_argument("bf16_rows_product: m = " + std::to_string(m) + " rows, 1 to " +
                                std::to_string(kFewRows) + " allowed on laid-out weights, " +
                                "at least 1 in place");
  }
  if (m > kFewRows) {
    panel_product(m, a, b, j0, j1, beta, c, ldc, c_row);
    return;
  }
  using Product = void (*)(const uint16_t*, const Bf16RowsB&, int64_t, int64_t, float, float*,
                           int64_t, const float*);
  static constexpr Product products[kFewRows] = {product_of<1>, product_of<2>, product_of<3>,
                                                 product_of<4>};
  products[m - 1](a, b, j0, j1, beta, c, ldc, c_row);
}

}  // namespace seqpack::cpu
