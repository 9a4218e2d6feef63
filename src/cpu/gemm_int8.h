// int8 products of the int8 engine (cpu/gemm_engine_int8.cpp): u8 rows times
// s8 weights with int32 accumulation, on AMX-INT8's tdpbusd, AVX512-VNNI's
// vpdpbusd, AVX2's vpmaddubsw + vpmaddwd (FBGEMM's sequence: pairs of u8·s8
// products summed in 16 bits, then pairs of those in 32), or a portable
// scalar kernel below AVX2. Every kernel computes the exact int32 sums and the
// same epilogue, so for the same quantized operands they give the same bits.
//
// Quantization, both sides chosen so that a row's result depends on that row
// and the weights alone (no scale is shared between rows: results are
// independent of the batch around a sequence):
//   A (the layer input, h): per row, asymmetric u8 over L levels (L = 255 for
//     the AMX and VNNI kernels, 127 for AVX2 and the scalar kernel: AVX2's
//     vpmaddubsw sums two products in 16 bits with saturation, and
//     2 · 127 · 127 = 32258 fits where 2 · 255 · 127 does not; PyTorch's x86
//     int8 makes the same cut, its reduce_range). lo = min(0, min x),
//     hi = max(0, max x), scale = (hi - lo) / L, zero point
//     zp = round(-lo / scale), q = clamp(round(x / scale) + zp, 0, L):
//     x ≈ scale * (q - zp), 0 exact (u8_row_params). An all-zero row has
//     scale 1, zp 0; a row with a NaN has scale NaN (its results are NaN, as
//     fp32's). ±inf is read as ±FLT_MAX, so it saturates the gates it reaches
//     as fp32's ±inf does, and the range of a row of huge values (FLT_MAX and
//     -FLT_MAX: hi - lo overflows a float) is taken in double: the scale is
//     always finite.
//   B (weights, [k, n] as op(W)): per column (one output unit), symmetric s8.
//     scale = max|w| / 127 (1 for a zero column), q = clamp(round(w / scale),
//     -127, 127). Columns past n are zero. The same on every kernel.
//   C[i, j] = float(Σ_k qa[i,k]·qb[k,j] - zp_i·Σ_k qb[k,j]) · min(sb_j · sa_i, FLT_MAX),
//     exact in int32 up to the float conversion (|acc| < 2^31 for k < 66000).
// Rounding is to nearest even (the CPU's default mode) on both sides.
//
// The kernel is chosen per call from its kernel settings (int8_kernel(), a
// model plan's RNNConfig::kernels); the levels of A go with it, so which
// kernel ran is visible in the results (within the error bounds of
// docs/performance.md), and a results' batch invariance holds on every
// kernel.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/grow_buffer.h"
#include "cpu/isa_cap.h"

namespace seqpack::cpu {

// The kernels of the u8·s8 products (KernelConfig::Int8).
using Int8Kernel = KernelConfig::Int8;
// "auto", "vnni", "amx", "avx2", "scalar".
const char* int8_kernel_name(Int8Kernel kernel);
// The levels of A's quantization on a kernel: 255 on vnni and amx, 127 on
// avx2 and scalar.
int int8_row_levels(Int8Kernel kernel);

// Whether this CPU (as oneDNN dispatches, ONEDNN_MAX_CPU_ISA capping it) and
// the cap allow the AVX512-VNNI kernel (AVX512-VNNI and -BW).
bool vnni_int8_supported(IsaLevel cap);
// Whether the AVX2 kernel can run: the CPU has AVX2 and the cap is not sse4.
bool avx2_int8_supported(IsaLevel cap);
// Whether the AMX-INT8 kernel can run: the VNNI kernel can, the CPU has
// AMX-TILE and AMX-INT8, oneDNN's ISA includes AMX (ONEDNN_MAX_CPU_ISA below
// avx512_core_amx rules it out, as it does oneDNN's own AMX kernels) and Linux
// grants the process the tile data (arch_prctl, asked once).
bool amx_int8_supported(IsaLevel cap);
// The kernel of the products of `kernels` (never automatic): its int8
// kernel (amx, vnni, avx2 or scalar), else the first of amx, vnni, avx2,
// scalar this CPU runs under its cap. Products of fewer than kAmxMinRows rows
// on amx run on VNNI (AMX's 16-row tiles would be mostly empty; the same
// levels, the same bits). Throws std::invalid_argument naming the kernel
// where it names one this CPU cannot run.
Int8Kernel int8_kernel(const Kernels& kernels);
inline constexpr int64_t kAmxMinRows = 4;

// Below this spread a row quantizes to zeros: its scale's reciprocal would
// overflow (a row of values under 1e-30 in magnitude, which the products
// cannot tell from zero anyway).
inline constexpr float kMinSpread = 1e-30f;

// The u8 quantization over `levels` levels (255 or 127) of a row whose values
// (±inf read as ±FLT_MAX) lie in [lo, hi], lo = min(0, min x) and
// hi = max(0, max x), no NaN among them. Pure C++, so the kernels' rounding
// can be checked on any CPU.
struct U8RowParams {
  float scale = 1.f;  // x ≈ scale * (q - zp); finite
  float inv = 0.f;    // 1 / scale; 0 for a row that quantizes to zeros
  int32_t zp = 0;     // in [0, 255]
};
inline U8RowParams u8_row_params(float lo, float hi, int levels = 255) {
  U8RowParams p;
  const float spread = hi - lo;
  if (!(spread >= kMinSpread)) return p;  // all (nearly) zero: q = 0, scale 1
  // hi - lo overflows a float only when both are huge (up to 2 · FLT_MAX): then
  // in double, where it is exact, and the scale (at most 2 · FLT_MAX / 127) is
  // a finite float. A finite spread keeps float arithmetic, bit for bit.
  p.scale = std::isfinite(spread) ? spread / static_cast<float>(levels)
                                  : static_cast<float>((static_cast<double>(hi) -
                                                        static_cast<double>(lo)) /
                                                       static_cast<double>(levels));
  p.inv = 1.f / p.scale;
  p.zp = std::clamp(static_cast<int32_t>(std::nearbyint(-lo * p.inv)), 0, levels);
  return p;
}

// A's rows quantized for one kernel (its levels): row i is q + i * ld (ld = k
// rounded up to 4, the padding zero), with scale[i] and zp[i]. gemm_u8s8_f32
// runs the kernel the rows were quantized for. The storage holds 16 zero rows and
// 64 zero bytes past the last row: the AMX kernel loads whole tiles (16 rows
// of 64 bytes), and what it reads there meets zero weights or goes to rows
// it does not store.
struct QuantizedRows {
  int64_t m = 0, k = 0, ld = 0;
  Int8Kernel kernel = Int8Kernel::scalar;
  int levels = 127;
  GrowBuffer<uint8_t> q;
  GrowBuffer<float> scale;
  GrowBuffer<int32_t> zp;
};

// Quantizes rows [0, m) of x (row stride ldx, k columns) into out (storage
// reused when large enough) for `kernel` (int8_kernel()'s: not automatic).
void quantize_rows_u8(int64_t m, int64_t k, const float* x, int64_t ldx, QuantizedRows& out,
                      Int8Kernel kernel);

// B [k, n] = op(b) quantized per column and laid out for the kernel: groups
// of 16 columns, each [k4p][16][4] bytes (vpdpbusd's operand: 4 consecutive k
// of one column in one int32 lane; 16 such rows are an AMX B tile), its rows
// past ceil(k/4) zero up to k4p, a multiple of 16 (whole tiles).
struct QuantizedWeights {
  int64_t k = 0, n = 0, k4 = 0, k4p = 0, groups = 0;
  GrowBuffer<int8_t> packed;  // groups * k4p * 64
  GrowBuffer<float> scale;    // groups * 16
  GrowBuffer<int32_t> sum;    // groups * 16: Σ_k q[k, j]
};

// B[kk][j] = trans_b ? b[j * ldb + kk] : b[kk * ldb + j]. The same bits on
// any CPU; AVX-512 quantizes the columns where the CPU and `cap` allow it.
void quantize_weights_s8(const float* b, bool trans_b, int64_t k, int64_t n, int64_t ldb,
                         QuantizedWeights& out, IsaLevel cap);
// How many matrices quantize_weights_s8 has quantized in this process (tests
// check that weights quantized once are not quantized again).
int64_t int8_weight_quantizations();

// C[i, j] (j in [col0, col1), c at column 0, row stride ldc) for rows
// i < m of a (rows from row a_row0 of a) =
//   init ? init[i][j] + P : c_row ? c_row[j] + P : beta == 0 ? P : P + beta * C[i, j],
// P the dequantized product above, on the kernel a was quantized for. The
// bits of C[i, j] do not depend on m, a_row0, col0 or col1, nor on the
// kernel for the same quantized a.
void gemm_u8s8_f32(int64_t m, const QuantizedRows& a, int64_t a_row0, const QuantizedWeights& b,
                   int64_t col0, int64_t col1, float beta, float* c, int64_t ldc,
                   const float* const* init = nullptr, const float* c_row = nullptr);

}  // namespace seqpack::cpu
