// cpu/gemm_int8.h's portable part: which kernel runs (the CPU, the caps,
// the policy's int8 kernel), the quantization of rows and weights handed to the
// kernel's ISA, and the scalar kernel: the reference the SIMD kernels equal
// bit for bit (tests/test_rnn_int8.cpp) and the products below AVX2.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "cpu/cpu_info.h"
#include "cpu/gemm_int8.h"
#include "cpu/gemm_int8_kernels.h"
#include "cpu/isa_cap.h"

namespace seqpack::cpu {

namespace int8_impl {

void quantize_row_scalar(const float* x, int64_t k, int levels, uint8_t* q, int64_t ld,
                         float* scale, int32_t* zp) {
  constexpr float kMax = std::numeric_limits<float>::max();
  float lo = 0.f, hi = 0.f;
  bool nan = false;
  for (int64_t i = 0; i < k; ++i) {
    nan = nan || std::isnan(x[i]);
    const float v = std::clamp(x[i], -kMax, kMax);  // NaN passes: min/max below ignore it
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  std::memset(q, 0, static_cast<std::size_t>(ld));
  if (nan) {  // the row's results are NaN, as fp32's
    *scale = std::numeric_limits<float>::quiet_NaN();
    *zp = 0;
    return;
  }
  const U8RowParams p = u8_row_params(lo, hi, levels);
  *scale = p.scale;
  *zp = p.zp;
  if (p.inv == 0.f) return;
  for (int64_t i = 0; i < k; ++i) {
    const auto t = static_cast<int32_t>(std::nearbyint(std::clamp(x[i], -kMax, kMax) * p.inv));
    q[i] = static_cast<uint8_t>(std::clamp(t + p.zp, 0, levels));
  }
}

// C from the exact int32 sums, as the SIMD kernels' epilogues compute it:
// the same operations in the same order, so the same bits.
void gemm_scalar(const Product& p) {
  const QuantizedRows& a = p.a;
  const QuantizedWeights& b = p.b;
  constexpr float kMax = std::numeric_limits<float>::max();
  for (int64_t i = 0; i < p.m; ++i) {
    const int64_t r = p.a_row0 + i;
    const uint8_t* qa = a.q.data() + r * a.ld;
    const float sa = a.scale.data()[r];
    const int32_t za = a.zp.data()[r];
    float* dst = p.c + i * p.ldc;
    for (int64_t j = p.col0; j < p.col1; ++j) {
      const int8_t* col = b.packed.data() + j / 16 * b.k4p * 64 + j % 16 * 4;
      int32_t acc = 0;
      for (int64_t kk = 0; kk < b.k4; ++kk)
        for (int t = 0; t < 4; ++t) acc += int32_t{qa[kk * 4 + t]} * int32_t{col[kk * 64 + t]};
      const int32_t centred = acc - za * b.sum.data()[j];
      // min(FLT_MAX, ·) keeping NaN, as vminps(FLT_MAX, x) does
      const float prod = b.scale.data()[j] * sa;
      const float sab = kMax < prod ? kMax : prod;
      float f = static_cast<float>(centred) * sab;
      if (p.init) {
        f = p.init[i][j] + f;
      } else if (p.c_row) {
        f = p.c_row[j] + f;
      } else if (p.beta != 0.f) {
        f = std::fma(p.beta, dst[j], f);
      }
      dst[j] = f;
    }
  }
}

}  // namespace int8_impl

namespace {

using namespace int8_impl;

bool runs_here(Int8Kernel kernel, IsaLevel cap) {
  switch (kernel) {
    case Int8Kernel::amx:
      return amx_int8_supported(cap);
    case Int8Kernel::vnni:
      return vnni_int8_supported(cap);
    case Int8Kernel::avx2:
      return avx2_int8_supported(cap);
    default: return true;
  }
}

std::string cannot_run(Int8Kernel kernel, IsaLevel cap) {
  const char* needs = kernel == Int8Kernel::amx    ? "AMX-INT8"
                      : kernel == Int8Kernel::vnni ? "AVX512-VNNI"
                                                   : "AVX2";
  return std::string("'") + int8_kernel_name(kernel) + "' needs " + needs +
         ", which this CPU (oneDNN ISA " + isa_name() + ", SEQPACK_MAX_CPU_ISA " +
         isa_level_name(cap) + ") does not offer";
}

std::atomic<int64_t> weight_quantizations{0};

}  // namespace

const char* int8_kernel_name(Int8Kernel kernel) {
  switch (kernel) {
    case Int8Kernel::vnni: return "vnni";
    case Int8Kernel::amx: return "amx";
    case Int8Kernel::avx2: return "avx2";
    case Int8Kernel::scalar: return "scalar";
    default: return "auto";
  }
}

int int8_row_levels(Int8Kernel kernel) {
  return kernel == Int8Kernel::vnni || kernel == Int8Kernel::amx ? 255 : 127;
}

bool vnni_int8_supported(IsaLevel cap) {
  static const bool cpu = __builtin_cpu_supports("avx512vnni") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  // A cap below avx3 rules the kernel out like a smaller CPU.
  return cpu && has_int8_dot_products() && avx512_allowed(cap);
}

bool avx2_int8_supported(IsaLevel cap) {
  static const bool cpu = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return cpu && cap != IsaLevel::sse4;
}

bool amx_int8_supported(IsaLevel cap) {
  static const bool yes =
      vnni_int8_supported(IsaLevel::avx512) && has_amx_dot_products() && amx_int8_usable();
  return yes && avx512_allowed(cap);
}

Int8Kernel int8_kernel(const Kernels& kernels) {
  const Int8Kernel set = kernels.int8;
  if (set != Int8Kernel::automatic) {
    if (!runs_here(set, kernels.isa_cap))
      throw std::invalid_argument("SEQPACK_INT8_KERNEL: " + cannot_run(set, kernels.isa_cap));
    return set;
  }
  for (const Int8Kernel k : {Int8Kernel::amx, Int8Kernel::vnni, Int8Kernel::avx2}) {
    if (runs_here(k, kernels.isa_cap)) return k;
  }
  return Int8Kernel::scalar;
}

void quantize_rows_u8(int64_t m, int64_t k, const float* x, int64_t ldx, QuantizedRows& out,
                      Int8Kernel kernel) {
  if (kernel == Int8Kernel::automatic) throw std::logic_error("quantize_rows_u8: no kernel");
  out.m = m;
  out.k = k;
  out.ld = (k + 3) / 4 * 4;
  out.kernel = kernel;
  out.levels = int8_row_levels(kernel);
  // 16 rows and 64 bytes past the last row, zero (the AMX tiles' reach)
  uint8_t* q = out.q.resize(static_cast<std::size_t>((m + 16) * out.ld + 64));
  std::memset(q + m * out.ld, 0, static_cast<std::size_t>(16 * out.ld + 64));
  float* s = out.scale.resize(static_cast<std::size_t>(std::max<int64_t>(m, 1)));
  int32_t* z = out.zp.resize(static_cast<std::size_t>(std::max<int64_t>(m, 1)));
  const auto row = kernel == Int8Kernel::vnni || kernel == Int8Kernel::amx ? quantize_row_avx512
                   : kernel == Int8Kernel::avx2                            ? quantize_row_avx2
                                                                           : quantize_row_scalar;
  for (int64_t i = 0; i < m; ++i)
    row(x + i * ldx, k, out.levels, q + i * out.ld, out.ld, s + i, z + i);
}

int64_t int8_weight_quantizations() { return weight_quantizations.load(); }

void quantize_weights_s8(const float* b, bool trans_b, int64_t k, int64_t n, int64_t ldb,
                         QuantizedWeights& out, IsaLevel cap) {
  ++weight_quantizations;
  out.k = k;
  out.n = n;
  out.k4 = (k + 3) / 4;
  out.k4p = (out.k4 + 15) / 16 * 16;
  out.groups = (n + 15) / 16;
  const int64_t np = out.groups * 16;
  const auto bytes = static_cast<std::size_t>(std::max<int64_t>(out.groups * out.k4p * 64, 1));
  int8_t* p = out.packed.resize(bytes);
  std::memset(p, 0, bytes);  // the rows past k4 (and the columns past n) stay zero
  float* sc = out.scale.resize(static_cast<std::size_t>(std::max<int64_t>(np, 1)));
  int32_t* sum = out.sum.resize(static_cast<std::size_t>(std::max<int64_t>(np, 1)));
  const auto at = [&](int64_t kk, int64_t j) { return trans_b ? b[j * ldb + kk] : b[kk * ldb + j]; };
  const bool simd_columns = trans_b && vnni_int8_supported(cap);
  const bool parallel = !omp_in_parallel() && k * n >= (1 << 16);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t j = 0; j < np; ++j) {
    const int64_t g = j / 16, lane = j % 16;
    int8_t* col = p + g * out.k4p * 64 + lane * 4;
    if (j >= n) {
      sc[j] = 0.f;
      sum[j] = 0;
      continue;
    }
    if (simd_columns) {
      quantize_column_avx512(b + j * ldb, k, out.k4, col, sc + j, sum + j);
      continue;
    }
    float mx = 0.f;
    bool finite = true;
    for (int64_t kk = 0; kk < k; ++kk) {
      const float w = at(kk, j);
      finite = finite && std::isfinite(w);
      mx = std::max(mx, std::fabs(w));
    }
    const float s = !finite ? std::numeric_limits<float>::quiet_NaN() : mx > 0.f ? mx / 127.f : 1.f;
    const float inv = finite && mx > 0.f ? 1.f / s : 0.f;
    int32_t total = 0;
    for (int64_t kk = 0; kk < k; ++kk) {
      int32_t q = 0;
      if (inv != 0.f)
        q = std::clamp(static_cast<int32_t>(std::nearbyint(at(kk, j) * inv)), -127, 127);
      col[kk / 4 * 64 + kk % 4] = static_cast<int8_t>(q);
      total += q;
    }
    sc[j] = s;
    sum[j] = total;
  }
}

void gemm_u8s8_f32(int64_t m, const QuantizedRows& a, int64_t a_row0, const QuantizedWeights& b,
                   int64_t col0, int64_t col1, float beta, float* c, int64_t ldc,
                   const float* const* init, const float* c_row) {
  col1 = std::min(col1, b.n);
  if (m <= 0 || col1 <= col0) return;
  const Product p{m, a, a_row0, b, col0, col1, beta, c, ldc, init, c_row};
  switch (a.kernel) {
    case Int8Kernel::amx:
      if (m >= kAmxMinRows) {
        gemm_amx(p);
        return;
      }
      gemm_vnni(p);
      return;
    case Int8Kernel::vnni: gemm_vnni(p); return;
    case Int8Kernel::avx2: gemm_avx2(p); return;
    default: gemm_scalar(p); return;
  }
}

}  // namespace seqpack::cpu
