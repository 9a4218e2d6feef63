// float32 gate kernels in Highway SIMD, compiled once per x86 target (SSE4,
// AVX2, AVX-512, ...) by foreach_target.h and chosen at run time by
// HWY_DYNAMIC_DISPATCH, so one binary uses the widest vectors the CPU has.
// Columns past the last full vector go through the scalar formulas of
// rnn_gates_scalar.h (same maths, std:: functions, within a few ulp of the
// vector σ and tanh below).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/rnn_gates_f32_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <cassert>
#include <type_traits>

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "cpu/bf16.h"
#include "cpu/isa_cap.h"
#include "cpu/rnn_gates.h"
#include "cpu/rnn_gates_scalar.h"

HWY_BEFORE_NAMESPACE();
namespace seqpack::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// σ and tanh without a division and without hwy::Exp/Expm1's extra steps:
// the divider is slow (vdivps ymm ≈ 3.5-5 cycles a vector on Zen, 5 of them
// per LSTM column) and the library versions handle ranges these kernels clamp
// away. Both are built on one 2^n·e^r reduction:
//   y = n·ln2 + r, |r| <= ln2/2, n = round(y / ln2) through the 1.5·2^23
//   shifter (the integer lands in the low mantissa bits, so 2^n is one shift),
//   e^r - 1 = r + r²·P(r), P of degree 4.
// The quotients use the ≈ 12-bit hardware reciprocal refined twice (one
// Newton step on 1/den, then one correction of the quotient itself), which
// rounds the quotient almost correctly and, unlike a single step, gives
// exactly 1 when numerator == denominator, so σ(+inf) == 1 and tanh(±inf) ==
// ±1 exactly, as in torch (a forget gate that saturates at 1 - 2^-24 would
// decay the cell state over thousands of steps).
// NaN: the clamps are Min/Max(constant, x), which return x when x is NaN on
// x86 (minps/maxps return the second operand), so NaN flows through to the
// result as in torch.

constexpr float kShifter = 12582912.0f + 127.0f;  // 1.5·2^23 + the exponent bias
constexpr float kLog2e = 1.44269504088896341f;

// 2^n and e^r - 1 for y = n·ln2 + r. y must lie in [-88, 88]: at -88 the
// biased exponent n + 127 is 0, so 2^n comes out as exactly 0 (e^y ≈ 6e-39
// is below float's normal range, and 0 is what saturation wants).
// kSplitLn2: subtract n·ln2 in two parts (Cody-Waite). With one part, float's
// ln 2 is off by 1.9e-9, so r and hence e^y carry a relative error of
// |n|·1.9e-9: fine for tanh (|n| <= 29, and e^y enters as 1 - e^y), up to
// 4 ulp for σ at |x| near 88.
// P: minimax fit of (e^r - 1 - r)/r² on |r| <= ln2/2 (weighted least squares
// iterated towards equal ripple), relative error 0.07 ulp: one coefficient
// fewer than Cephes' expf for the same float accuracy.
template <bool kSplitLn2>
HWY_INLINE void ExpSplit(DF d, VF y, VF& two_n, VF& em1_r) {
  const hn::RebindToSigned<DF> di;
  const VF t = hn::MulAdd(y, hn::Set(d, kLog2e), hn::Set(d, kShifter));
  const VF nf = hn::Sub(t, hn::Set(d, kShifter));
  VF r;
  if (kSplitLn2) {
    r = hn::NegMulAdd(nf, hn::Set(d, 0.693359375f), y);
    r = hn::NegMulAdd(nf, hn::Set(d, -2.12194440e-4f), r);
  } else {
    r = hn::NegMulAdd(nf, hn::Set(d, 0.693147182f), y);
  }
  VF p = hn::Set(d, 1.381459878757596e-3f);
  p = hn::MulAdd(p, r, hn::Set(d, 8.368716575205326e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.166838899254799e-2f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.666652113199234e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.999999403953552e-1f));
  em1_r = hn::MulAdd(p, hn::Mul(r, r), r);
  two_n = hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, t)));
}

// num / den for den in [1, 2^127]: reciprocal estimate, one Newton step
// (relative error ≈ 2^-23), then one residual correction of the quotient.
HWY_INLINE VF Quotient(DF d, VF num, VF den) {
  const VF one = hn::Set(d, 1.0f);
  VF rcp = hn::ApproximateReciprocal(den);
  rcp = hn::MulAdd(rcp, hn::NegMulAdd(den, rcp, one), rcp);
  const VF q = hn::Mul(num, rcp);
  return hn::MulAdd(rcp, hn::NegMulAdd(den, q, num), q);
}

// σ(x) = 1 / (1 + e^-x). x is clamped to [-88, 88]: σ is exactly 1 to float
// precision above 17. A result below float's smallest normal (x < -87.3,
// 1/(1 + e^88) ≈ 6e-39 at the clamp) is 0, which is σ(-inf): flushed here,
// because whether the reciprocal estimate returns such a subnormal depends on
// the CPU (Intel's vrcp14ps flushes it, AMD Zen 4's returns 6e-39). NaN fails
// the comparison and flows through. (The scalar tail columns past the last full
// vector use std::exp and return the subnormal, as torch does: 0 and 6e-39 are
// both within 1e-38 of σ.)
HWY_INLINE VF Sigmoid(DF d, VF x) {
  const VF xc = hn::Min(hn::Set(d, 88.0f), hn::Max(hn::Set(d, -88.0f), x));
  VF two_n, em1;
  ExpSplit</*kSplitLn2=*/true>(d, hn::Neg(xc), two_n, em1);
  const VF e = hn::MulAdd(two_n, em1, two_n);  // e^-x
  const VF one = hn::Set(d, 1.0f);
  const VF s = Quotient(d, one, hn::Add(one, e));
  return hn::IfThenZeroElse(hn::Lt(s, hn::Set(d, 1.17549435e-38f)), s);
}

// tanh|x| = -m / (2 + m) with m = e^(-2|x|) - 1 = 2^n (e^r - 1) + (2^n - 1),
// which keeps full relative accuracy near 0 (no 1 - e^.. cancellation) and
// gives exactly 1 once 2^n underflows. |x| is clamped at 10 (tanh rounds to
// 1 in float from 9.01 on). The sign is put back last, so tanh(-0) == -0.
HWY_INLINE VF Tanh(DF d, VF x) {
  const VF sign = hn::And(x, hn::Set(d, -0.0f));
  const VF a = hn::Min(hn::Set(d, 10.0f), hn::Xor(x, sign));
  VF two_n, em1_r;
  ExpSplit</*kSplitLn2=*/false>(d, hn::Mul(a, hn::Set(d, -2.0f)), two_n, em1_r);
  const VF m = hn::MulAdd(two_n, em1_r, hn::Sub(two_n, hn::Set(d, 1.0f)));
  const VF neg_t = Quotient(d, m, hn::Add(m, hn::Set(d, 2.0f)));  // -tanh|x|, or -0
  return hn::Or(hn::Abs(neg_t), sign);
}

// p[0, lanes) = bf16_of(v): a value's bf16 copy for a bf16 engine's row sink,
// written while the value is in a register instead of in a pass over the rows
// after the kernel. AVX-512 with AVX512-BF16: one vcvtneps2bf16, as inline
// assembly (Highway 1.0's DemoteTo truncates; the intrinsic would need
// avx512bf16 enabled on every kernel), on every AVX-512 target (AVX3, and
// the AVX3_DL, AVX3_ZEN4 and AVX3_SPR of newer Highway releases, which rank
// below it: Debian 13's Highway runs AVX3_ZEN4 on Zen 4 and 5, where the
// lane-by-lane loop below made LSTM(64) inference at batch 64 over 64 steps
// 10% slower). Other CPUs (the emulated bf16 engine runs on AVX-512 CPUs
// without BF16 too) and targets: the scalar reference, lane by lane.
HWY_INLINE void StoreBf16(DF d, VF v, uint16_t* p) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if (cpu_converts_bf16()) {
    __m256i bits;
    asm("vcvtneps2bf16 %1, %0" : "=v"(bits) : "v"(v.raw));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits);
    return;
  }
#endif
  HWY_ALIGN float lanes[HWY_MAX_BYTES / sizeof(float)];
  hn::Store(v, d, lanes);
  for (size_t i = 0; i < hn::Lanes(d); ++i) p[i] = bf16_of(lanes[i]);
}

// A pre-activation: the gate row's value, plus the input row's (kAddX).
template <bool kAddX>
HWY_INLINE VF PreActivation(DF d, const float* g, const float* x, int64_t at) {
  if (kAddX) return hn::Add(hn::LoadU(d, g + at), hn::LoadU(d, x + at));
  return hn::LoadU(d, g + at);
}

// Two passes over each row: the gates and c first, then h = o·tanh(c) from
// c and o reloaded (L1 hits). In one pass every column is a chain of two
// dependent transcendentals (≈ 150 cycles of latency in ≈ 160 instructions),
// and the out-of-order window cannot hold enough columns to hide it; split,
// each pass is a set of short independent chains and runs at throughput.
// Each vector also prefetches, for writing, the next kPrefetchLines lines of
// `next` (the rows the next step's product will write: cold, and the
// product waited for each of them; the transcendentals here hide the wait).
constexpr int64_t kPrefetchLines = 4;

// kBf16: h16 given (the bf16 copies' stores compiled in only then, so the
// fp32 path runs the loop it ran before they existed).
template <bool kAddX, bool kBf16>
HWY_INLINE void LstmForwardRows(int64_t n, int64_t H, int64_t k0, int64_t k1, float* gates,
                                const float* c_prev, int64_t ld_cprev, float* c, int64_t ld_c,
                                float* h, int64_t ld_h, const float* const* x_rows,
                                const float* next, int64_t next_len, uint16_t* h16,
                                int64_t ld_h16) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t kv = k0 + (k1 - k0) / L * L;  // end of the full vectors
  constexpr int64_t kLine = 64 / sizeof(float);
  const float* next_end = next + next_len;
  for (int64_t r = 0; r < n; ++r) {
    float* g = gates + r * 4 * H;
    const float* x = kAddX ? x_rows[r] : nullptr;
    const float* cp = c_prev + r * ld_cprev;
    float* cr = c + r * ld_c;
    float* hr = h + r * ld_h;
    uint16_t* h16r = h16 ? h16 + r * ld_h16 : nullptr;
    for (int64_t k = k0; k < kv; k += L) {
      for (int64_t j = 0; j < kPrefetchLines && next < next_end; ++j, next += kLine) {
        __builtin_prefetch(next, /*rw=*/1);
      }
      const VF ig = Sigmoid(d, PreActivation<kAddX>(d, g, x, k));
      const VF fg = Sigmoid(d, PreActivation<kAddX>(d, g, x, H + k));
      const VF gg = Tanh(d, PreActivation<kAddX>(d, g, x, 2 * H + k));
      const VF og = Sigmoid(d, PreActivation<kAddX>(d, g, x, 3 * H + k));
      hn::StoreU(ig, d, g + k);
      hn::StoreU(fg, d, g + H + k);
      hn::StoreU(gg, d, g + 2 * H + k);
      hn::StoreU(og, d, g + 3 * H + k);
      hn::StoreU(hn::MulAdd(fg, hn::LoadU(d, cp + k), hn::Mul(ig, gg)), d, cr + k);
    }
    for (int64_t k = k0; k < kv; k += L) {
      const VF hv = hn::Mul(hn::LoadU(d, g + 3 * H + k), Tanh(d, hn::LoadU(d, cr + k)));
      hn::StoreU(hv, d, hr + k);
      if (kBf16) StoreBf16(d, hv, h16r + k);
    }
    for (int64_t k = kv; k < k1; ++k) {
      scalar::lstm_forward_at(H, k, g, cp, cr, hr, x);
      if (h16r) h16r[k] = bf16_of(hr[k]);
    }
  }
}

void LstmForward(int64_t n, int64_t H, int64_t k0, int64_t k1, float* gates, const float* c_prev,
                 int64_t ld_cprev, float* c, int64_t ld_c, float* h, int64_t ld_h,
                 const float* const* x_rows, const float* next, int64_t next_len, uint16_t* h16,
                 int64_t ld_h16) {
  auto rows = [&](auto add_x, auto bf16) {
    LstmForwardRows<decltype(add_x)::value, decltype(bf16)::value>(
        n, H, k0, k1, gates, c_prev, ld_cprev, c, ld_c, h, ld_h, x_rows, next, next_len, h16,
        ld_h16);
  };
  using Yes = std::true_type;
  using No = std::false_type;
  if (x_rows) {
    h16 ? rows(Yes{}, Yes{}) : rows(Yes{}, No{});
  } else {
    h16 ? rows(No{}, Yes{}) : rows(No{}, No{});
  }
}

// dst[j·H + k] += Σ_r src[r·ld + j·H + k] for gates j < ng and k in [k0, k1):
// the bias-gradient sums of one step, taken right after the kernel wrote
// that step's gradients (still in L1/L2). Adding each row into dst inside the
// row loop instead costs a load and a store per gate and vector, and was
// slower than the separate pass over [N, G] it replaces (58 against 25 µs
// for GruBackward at n = 32, H = 512); here the sums stay in registers, four
// vectors at a time, down the rows.
void AddColumnSums(int64_t n, int64_t ld, int64_t ng, int64_t H, int64_t k0, int64_t k1,
                   const float* src, float* dst) {
  if (n <= 0) return;  // no rows: src may be null (a thread with no rows)
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t j = 0; j < ng; ++j) {
    const float* s = src + j * H;
    float* o = dst + j * H;
    int64_t k = k0;
    for (; k + 4 * L <= k1; k += 4 * L) {
      VF a0 = hn::LoadU(d, o + k), a1 = hn::LoadU(d, o + k + L);
      VF a2 = hn::LoadU(d, o + k + 2 * L), a3 = hn::LoadU(d, o + k + 3 * L);
      for (int64_t r = 0; r < n; ++r) {
        const float* row = s + r * ld + k;
        a0 = hn::Add(a0, hn::LoadU(d, row));
        a1 = hn::Add(a1, hn::LoadU(d, row + L));
        a2 = hn::Add(a2, hn::LoadU(d, row + 2 * L));
        a3 = hn::Add(a3, hn::LoadU(d, row + 3 * L));
      }
      hn::StoreU(a0, d, o + k);
      hn::StoreU(a1, d, o + k + L);
      hn::StoreU(a2, d, o + k + 2 * L);
      hn::StoreU(a3, d, o + k + 3 * L);
    }
    for (; k + L <= k1; k += L) {
      VF a = hn::LoadU(d, o + k);
      for (int64_t r = 0; r < n; ++r) a = hn::Add(a, hn::LoadU(d, s + r * ld + k));
      hn::StoreU(a, d, o + k);
    }
    for (; k < k1; ++k) {
      float a = o[k];
      for (int64_t r = 0; r < n; ++r) a += s[r * ld + k];
      o[k] = a;
    }
  }
}

// dx += v for an input-row accumulator (kAddDx).
template <bool kAddDx>
HWY_INLINE void AddInto(DF d, float* dx, int64_t at, VF v) {
  if (kAddDx) hn::StoreU(hn::Add(hn::LoadU(d, dx + at), v), d, dx + at);
}

// Products arranged so that each x(1-x) factor is one fused x - x·x on a
// partial product and shared products are formed once: 12 vector operations
// for the 5 outputs, against 20 for the formulas as written.
// Software-pipelined: tanh(c) is computed kAhead vectors before the
// iteration that uses it. Inline, each column is one long dependent chain
// (tanh, then five products) and the loop runs at latency; skewed, the chains
// overlap the memory traffic this loop is mostly made of (8 loads, 5 stores
// per vector). One vector ahead was not enough at H = 512 (20.6-24 µs per
// call against 20 at four ahead, n = 32).
// The saved gates and c were written by the forward long before (a whole
// batch earlier, both directions in between): they come from L3 or memory,
// and the loads of each row stalled on them until each vector also
// prefetches the same columns kPrefetchRows rows further on. The gate
// gradients' rows are as cold and each store waited for its line: they are
// prefetched for writing.
template <bool kAddDx, bool kBf16>  // kBf16: dgates16 given (as LstmForwardRows)
HWY_INLINE void LstmBackwardRows(int64_t n, int64_t H, int64_t k0, int64_t k1, const float* gates,
                                 const float* c, const float* c_prev, const float* dh,
                                 int64_t ld_dh, float* dc, float* dgates, float* const* dx_rows,
                                 uint16_t* dgates16) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t kv = k0 + (k1 - k0) / L * L;
  constexpr int64_t kAhead = 4;
  constexpr int64_t kPrefetchRows = 2;
  HWY_ALIGN float ring[2 * kAhead * HWY_MAX_BYTES / sizeof(float)];
  for (int64_t r = 0; r < n; ++r) {
    const float* g = gates + r * 4 * H;
    const float* cr = c + r * H;
    const float* cp = c_prev + r * H;
    const bool prefetch = r + kPrefetchRows < n;
    const float* dhr = dh + r * ld_dh;
    float* dcr = dc + r * H;
    float* dg = dgates + r * 4 * H;
    uint16_t* dg16 = dgates16 ? dgates16 + r * 4 * H : nullptr;
    float* dx = kAddDx ? dx_rows[r] : nullptr;
    // tanh(c) runs kAhead vectors ahead of its use, through a ring of
    // 2·kAhead vectors on the stack.
    for (int64_t j = 0; j < kAhead && k0 + j * L < kv; ++j) {
      hn::Store(Tanh(d, hn::LoadU(d, cr + k0 + j * L)), d, ring + j * L);
    }
    int64_t slot = 0;
    for (int64_t k = k0; k < kv; k += L, slot = (slot + 1) & (2 * kAhead - 1)) {
      if (k + kAhead * L < kv) {
        hn::Store(Tanh(d, hn::LoadU(d, cr + k + kAhead * L)), d,
                  ring + ((slot + kAhead) & (2 * kAhead - 1)) * L);
      }
      if (prefetch) {
        const float* pg = g + kPrefetchRows * 4 * H + k;
        for (int64_t j = 0; j < 4; ++j) hwy::Prefetch(pg + j * H);
        hwy::Prefetch(cr + kPrefetchRows * H + k);
        hwy::Prefetch(cp + kPrefetchRows * H + k);
        float* pdg = dg + kPrefetchRows * 4 * H + k;
        for (int64_t j = 0; j < 4; ++j) __builtin_prefetch(pdg + j * H, /*rw=*/1);
        if (kBf16) {  // as cold as dg's
          uint16_t* p16 = dg16 + kPrefetchRows * 4 * H + k;
          for (int64_t j = 0; j < 4; ++j) __builtin_prefetch(p16 + j * H, /*rw=*/1);
        }
      }
      const VF tc = hn::Load(d, ring + slot * L);
      const VF ig = hn::LoadU(d, g + k), fg = hn::LoadU(d, g + H + k);
      const VF gg = hn::LoadU(d, g + 2 * H + k), og = hn::LoadU(d, g + 3 * H + k);
      const VF dho = hn::Mul(hn::LoadU(d, dhr + k), og);
      const VF u = hn::Mul(dho, tc);
      const VF dgo = hn::NegMulAdd(u, og, u);  // dh·tanh(c)·o(1-o)
      // dc_t = dc_{t+1}·f_{t+1} (carried in dc) + dh·o·(1 - tanh²c)
      const VF dct = hn::Add(hn::NegMulAdd(u, tc, dho), hn::LoadU(d, dcr + k));
      const VF di = hn::Mul(dct, ig);
      const VF dig = hn::Mul(di, gg);
      const VF dgi = hn::NegMulAdd(dig, ig, dig);  // dc·g·i(1-i)
      const VF dgg = hn::NegMulAdd(dig, gg, di);   // dc·i·(1-g²)
      const VF df = hn::Mul(dct, fg);              // dc_{t-1} contribution
      const VF dfc = hn::Mul(df, hn::LoadU(d, cp + k));
      const VF dgf = hn::NegMulAdd(dfc, fg, dfc);  // dc·c_prev·f(1-f)
      hn::StoreU(dgi, d, dg + k);
      hn::StoreU(dgf, d, dg + H + k);
      hn::StoreU(dgg, d, dg + 2 * H + k);
      hn::StoreU(dgo, d, dg + 3 * H + k);
      hn::StoreU(df, d, dcr + k);
      if (kBf16) {
        StoreBf16(d, dgi, dg16 + k);
        StoreBf16(d, dgf, dg16 + H + k);
        StoreBf16(d, dgg, dg16 + 2 * H + k);
        StoreBf16(d, dgo, dg16 + 3 * H + k);
      }
      AddInto<kAddDx>(d, dx, k, dgi);
      AddInto<kAddDx>(d, dx, H + k, dgf);
      AddInto<kAddDx>(d, dx, 2 * H + k, dgg);
      AddInto<kAddDx>(d, dx, 3 * H + k, dgo);
    }
    for (int64_t k = kv; k < k1; ++k) {
      scalar::lstm_backward_at<float>(H, k, g, cr, cp, dhr, dcr, dg, nullptr, dx);
      for (int64_t j = 0; j < 4 && dg16; ++j) dg16[j * H + k] = bf16_of(dg[j * H + k]);
    }
  }
}

void LstmBackward(int64_t n, int64_t H, int64_t k0, int64_t k1, const float* gates, const float* c,
                  const float* c_prev, const float* dh, int64_t ld_dh, float* dc, float* dgates,
                  float* dbias, float* const* dx_rows, uint16_t* dgates16) {
  auto rows = [&](auto add_dx, auto bf16) {
    LstmBackwardRows<decltype(add_dx)::value, decltype(bf16)::value>(
        n, H, k0, k1, gates, c, c_prev, dh, ld_dh, dc, dgates, dx_rows, dgates16);
  };
  using Yes = std::true_type;
  using No = std::false_type;
  if (dx_rows) {
    dgates16 ? rows(Yes{}, Yes{}) : rows(Yes{}, No{});
  } else {
    dgates16 ? rows(No{}, Yes{}) : rows(No{}, No{});
  }
  if (dbias) AddColumnSums(n, 4 * H, 4, H, k0, k1, dgates, dbias);
}

void GruForward(int64_t n, int64_t H, int64_t k0, int64_t k1, float* gx, const float* gh,
                const float* b_hh, const float* h_prev, int64_t ld_hprev, float* h, int64_t ld_h,
                float* ghn, uint16_t* h16, int64_t ld_h16) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t kv = k0 + (k1 - k0) / L * L;
  const VF zero = hn::Zero(d);
  for (int64_t r = 0; r < n; ++r) {
    float* x = gx + r * 3 * H;
    const float* y = gh + r * 3 * H;
    const float* hp = h_prev + r * ld_hprev;
    float* hr = h + r * ld_h;
    float* ghr = ghn ? ghn + r * H : nullptr;
    uint16_t* h16r = h16 ? h16 + r * ld_h16 : nullptr;
    for (int64_t k = k0; k < kv; k += L) {
      const VF bhr = b_hh ? hn::LoadU(d, b_hh + k) : zero;
      const VF bhz = b_hh ? hn::LoadU(d, b_hh + H + k) : zero;
      hn::StoreU(Sigmoid(d, hn::Add(hn::Add(hn::LoadU(d, x + k), hn::LoadU(d, y + k)), bhr)), d,
                 x + k);
      hn::StoreU(
          Sigmoid(d, hn::Add(hn::Add(hn::LoadU(d, x + H + k), hn::LoadU(d, y + H + k)), bhz)), d,
          x + H + k);
    }
    for (int64_t k = k0; k < kv; k += L) {
      const VF rg = hn::LoadU(d, x + k), zg = hn::LoadU(d, x + H + k);
      const VF hnv = hn::Add(hn::LoadU(d, y + 2 * H + k), b_hh ? hn::LoadU(d, b_hh + 2 * H + k) : zero);
      const VF ng = Tanh(d, hn::MulAdd(rg, hnv, hn::LoadU(d, x + 2 * H + k)));
      hn::StoreU(ng, d, x + 2 * H + k);
      if (ghr) hn::StoreU(hnv, d, ghr + k);
      // h' = n + z (h - n) = (1 - z) n + z h
      const VF hv = hn::MulAdd(zg, hn::Sub(hn::LoadU(d, hp + k), ng), ng);
      hn::StoreU(hv, d, hr + k);
      if (h16r) StoreBf16(d, hv, h16r + k);
    }
    for (int64_t k = kv; k < k1; ++k) {
      scalar::gru_forward_at(H, k, x, y, b_hh, hp, hr, ghr ? ghr : nullptr);
      if (h16r) h16r[k] = bf16_of(hr[k]);
    }
  }
}

// 10 vector operations for the 7 outputs (17 as written), see LstmBackward.
void GruBackward(int64_t n, int64_t H, int64_t k0, int64_t k1, const float* gates, const float* ghn,
                 const float* h_prev, int64_t ld_hprev, const float* dh, int64_t ld_dh, float* dgx,
                 float* dgh, float* dh_prev, float* db_ih, float* db_hh, uint16_t* dgx16,
                 uint16_t* dgh16) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = 0; r < n; ++r) {
    const float* g = gates + r * 3 * H;
    const float* hnr = ghn + r * H;
    const float* hp = h_prev + r * ld_hprev;
    const float* dr = dh + r * ld_dh;
    float* dx = dgx + r * 3 * H;
    float* dy = dgh + r * 3 * H;
    float* dhp = dh_prev + r * H;
    uint16_t* dx16 = dgx16 ? dgx16 + r * 3 * H : nullptr;
    uint16_t* dy16 = dgh16 ? dgh16 + r * 3 * H : nullptr;
    int64_t k = k0;
    for (; k + L <= k1; k += L) {
      const VF rg = hn::LoadU(d, g + k), zg = hn::LoadU(d, g + H + k);
      const VF ng = hn::LoadU(d, g + 2 * H + k);
      const VF dv = hn::LoadU(d, dr + k);
      const VF dvz = hn::Mul(dv, zg);       // the part of dh_prev that bypasses W_hh
      const VF dv1z = hn::Sub(dv, dvz);     // dh·(1-z)
      const VF t = hn::Mul(dv1z, ng);
      const VF dnp = hn::NegMulAdd(t, ng, dv1z);  // dh·(1-z)·(1-n²)
      const VF w = hn::Mul(dvz, hn::Sub(hn::LoadU(d, hp + k), ng));
      const VF dzp = hn::NegMulAdd(w, zg, w);  // dh·(h-n)·z(1-z)
      const VF dyn = hn::Mul(dnp, rg);         // gradient of W_hn h + b_hn
      const VF s = hn::Mul(dyn, hn::LoadU(d, hnr + k));
      const VF drp = hn::NegMulAdd(s, rg, s);  // dn·(W_hn h + b_hn)·r(1-r)
      hn::StoreU(drp, d, dx + k);
      hn::StoreU(dzp, d, dx + H + k);
      hn::StoreU(dnp, d, dx + 2 * H + k);
      hn::StoreU(drp, d, dy + k);
      hn::StoreU(dzp, d, dy + H + k);
      hn::StoreU(dyn, d, dy + 2 * H + k);
      hn::StoreU(dvz, d, dhp + k);
      if (dx16) {
        StoreBf16(d, drp, dx16 + k);
        StoreBf16(d, dzp, dx16 + H + k);
        StoreBf16(d, dnp, dx16 + 2 * H + k);
      }
      if (dy16) {
        StoreBf16(d, drp, dy16 + k);
        StoreBf16(d, dzp, dy16 + H + k);
        StoreBf16(d, dyn, dy16 + 2 * H + k);
      }
    }
    for (; k < k1; ++k) {
      scalar::gru_backward_at<float>(H, k, g, hnr, hp, dr, dx, dy, dhp, nullptr, nullptr);
      for (int64_t j = 0; j < 3; ++j) {
        if (dx16) dx16[j * H + k] = bf16_of(dx[j * H + k]);
        if (dy16) dy16[j * H + k] = bf16_of(dy[j * H + k]);
      }
    }
  }
  // Both or neither: the two biases exist together (RNNOptions::bias).
  if (db_ih && db_hh) {
    AddColumnSums(n, 3 * H, 3, H, k0, k1, dgx, db_ih);
    AddColumnSums(n, 3 * H, 3, H, k0, k1, dgh, db_hh);
  }
}

void RnnForward(int64_t n, int64_t H, int64_t k0, int64_t k1, float* gates, bool relu, float* h,
                int64_t ld_h, uint16_t* h16, int64_t ld_h16) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const VF zero = hn::Zero(d);
  for (int64_t r = 0; r < n; ++r) {
    float* g = gates + r * H;
    float* hr = h + r * ld_h;
    uint16_t* h16r = h16 ? h16 + r * ld_h16 : nullptr;
    int64_t k = k0;
    for (; k + L <= k1; k += L) {
      const VF a = hn::LoadU(d, g + k);
      // IfThenElse rather than Max so a NaN stays NaN, as torch.relu.
      const VF v = relu ? hn::IfThenElse(hn::Lt(a, zero), zero, a) : Tanh(d, a);
      hn::StoreU(v, d, g + k);
      hn::StoreU(v, d, hr + k);
      if (h16r) StoreBf16(d, v, h16r + k);
    }
    for (; k < k1; ++k) {
      scalar::rnn_forward_at(k, g, relu, hr);
      if (h16r) h16r[k] = bf16_of(hr[k]);
    }
  }
}

void RnnBackward(int64_t n, int64_t H, int64_t k0, int64_t k1, const float* h_saved, bool relu,
                 const float* dh, int64_t ld_dh, float* dpre, float* dbias, uint16_t* dpre16) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const VF zero = hn::Zero(d);
  for (int64_t r = 0; r < n; ++r) {
    const float* hs = h_saved + r * H;
    const float* dr = dh + r * ld_dh;
    float* o = dpre + r * H;
    uint16_t* o16 = dpre16 ? dpre16 + r * H : nullptr;
    int64_t k = k0;
    for (; k + L <= k1; k += L) {
      const VF hv = hn::LoadU(d, hs + k);
      const VF dv = hn::LoadU(d, dr + k);
      const VF res = relu ? hn::IfThenZeroElse(hn::Le(hv, zero), dv)
                          : hn::NegMulAdd(hn::Mul(dv, hv), hv, dv);  // dh·(1 - h²)
      hn::StoreU(res, d, o + k);
      if (o16) StoreBf16(d, res, o16 + k);
    }
    for (; k < k1; ++k) {
      scalar::rnn_backward_at<float>(k, hs, relu, dr, o, nullptr);
      if (o16) o16[k] = bf16_of(o[k]);
    }
  }
  if (dbias) AddColumnSums(n, H, 1, H, k0, k1, dpre, dbias);
}

// Elementwise σ / tanh of n floats, every element through the vector code
// (the last partial vector via a padded copy), for the accuracy tests.
template <bool kTanh>
void ActivationImpl(int64_t n, const float* x, float* y) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  auto f = [&](VF v) { return kTanh ? Tanh(d, v) : Sigmoid(d, v); };
  int64_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(f(hn::LoadU(d, x + i)), d, y + i);
  if (i < n) {
    HWY_ALIGN float buf[HWY_MAX_BYTES / sizeof(float)] = {};
    for (int64_t j = i; j < n; ++j) buf[j - i] = x[j];
    hn::Store(f(hn::Load(d, buf)), d, buf);
    for (int64_t j = i; j < n; ++j) y[j] = buf[j - i];
  }
}

void SigmoidArray(int64_t n, const float* x, float* y) { ActivationImpl<false>(n, x, y); }
void TanhArray(int64_t n, const float* x, float* y) { ActivationImpl<true>(n, x, y); }

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace seqpack::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace seqpack::cpu {

HWY_EXPORT(LstmForward);
HWY_EXPORT(LstmBackward);
HWY_EXPORT(GruForward);
HWY_EXPORT(GruBackward);
HWY_EXPORT(RnnForward);
HWY_EXPORT(RnnBackward);
HWY_EXPORT(SigmoidArray);
HWY_EXPORT(TanhArray);
HWY_EXPORT(TargetName);

// The sink's element picks the kernels' instantiation: bf16 stores compiled
// in (the h16/dgates16 rows), or none.
namespace {
uint16_t* bf16_rows(const RowSink& sink) {
  assert(!sink || sink.element == SinkElement::bf16);  // the only form the kernels write
  return sink.bf16_row(0);
}
}  // namespace

template <>
void lstm_gates_forward<float>(IsaLevel cap, int64_t n, int64_t H, int64_t k0, int64_t k1,
                               float* gates, const float* c_prev, int64_t ld_cprev, float* c,
                               int64_t ld_c, float* h, int64_t ld_h, const float* const* x_rows,
                               const float* next, int64_t next_len, RowSink h_sink) {
  SEQPACK_HWY_DISPATCH(LstmForward, cap)
  (n, H, k0, k1, gates, c_prev, ld_cprev, c, ld_c, h, ld_h, x_rows, next, next_len,
   bf16_rows(h_sink), h_sink.ld);
}
template <>
void lstm_gates_backward<float>(IsaLevel cap, int64_t n, int64_t H, int64_t k0, int64_t k1,
                                const float* gates, const float* c, const float* c_prev,
                                const float* dh, int64_t ld_dh, float* dc, float* dgates,
                                float* dbias, float* const* dx_rows, RowSink dgates_sink) {
  assert(!dgates_sink || dgates_sink.ld == 4 * H);
  SEQPACK_HWY_DISPATCH(LstmBackward, cap)
  (n, H, k0, k1, gates, c, c_prev, dh, ld_dh, dc, dgates, dbias, dx_rows, bf16_rows(dgates_sink));
}
template <>
void gru_gates_forward<float>(IsaLevel cap, int64_t n, int64_t H, int64_t k0, int64_t k1, float* gx,
                              const float* gh, const float* b_hh, const float* h_prev,
                              int64_t ld_hprev, float* h, int64_t ld_h, float* ghn,
                              RowSink h_sink) {
  SEQPACK_HWY_DISPATCH(GruForward, cap)
  (n, H, k0, k1, gx, gh, b_hh, h_prev, ld_hprev, h, ld_h, ghn, bf16_rows(h_sink), h_sink.ld);
}
template <>
void gru_gates_backward<float>(IsaLevel cap, int64_t n, int64_t H, int64_t k0, int64_t k1,
                               const float* gates, const float* ghn, const float* h_prev,
                               int64_t ld_hprev, const float* dh, int64_t ld_dh, float* dgx,
                               float* dgh, float* dh_prev, float* db_ih, float* db_hh,
                               RowSink dgx_sink, RowSink dgh_sink) {
  assert(!dgx_sink || dgx_sink.ld == 3 * H);
  assert(!dgh_sink || dgh_sink.ld == 3 * H);
  SEQPACK_HWY_DISPATCH(GruBackward, cap)
  (n, H, k0, k1, gates, ghn, h_prev, ld_hprev, dh, ld_dh, dgx, dgh, dh_prev, db_ih, db_hh,
   bf16_rows(dgx_sink), bf16_rows(dgh_sink));
}
template <>
void rnn_gates_forward<float>(IsaLevel cap, int64_t n, int64_t H, int64_t k0, int64_t k1,
                              float* gates, bool relu, float* h, int64_t ld_h, RowSink h_sink) {
  SEQPACK_HWY_DISPATCH(RnnForward, cap)
  (n, H, k0, k1, gates, relu, h, ld_h, bf16_rows(h_sink), h_sink.ld);
}
template <>
void rnn_gates_backward<float>(IsaLevel cap, int64_t n, int64_t H, int64_t k0, int64_t k1,
                               const float* h_saved, bool relu, const float* dh, int64_t ld_dh,
                               float* dpre, float* dbias, RowSink dpre_sink) {
  assert(!dpre_sink || dpre_sink.ld == H);
  SEQPACK_HWY_DISPATCH(RnnBackward, cap)
  (n, H, k0, k1, h_saved, relu, dh, ld_dh, dpre, dbias, bf16_rows(dpre_sink));
}

void sigmoid_f32(IsaLevel cap, int64_t n, const float* x, float* y) {
  SEQPACK_HWY_DISPATCH(SigmoidArray, cap)(n, x, y);
}
void tanh_f32(IsaLevel cap, int64_t n, const float* x, float* y) {
  SEQPACK_HWY_DISPATCH(TanhArray, cap)(n, x, y);
}

const char* rnn_gates_f32_target(IsaLevel cap) { return SEQPACK_HWY_DISPATCH(TargetName, cap)(); }

}  // namespace seqpack::cpu
#endif  // HWY_ONCE
