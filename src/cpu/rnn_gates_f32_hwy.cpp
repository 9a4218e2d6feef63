// float32 gate kernels in Highway SIMD, compiled once per x86 target (SSE4,
// AVX2, AVX-512, ...) by foreach_target.h and chosen at run time by
// HWY_DYNAMIC_DISPATCH, so one binary uses the widest vectors the CPU has.
// Columns past the last full vector go through the scalar formulas of
// rnn_gates_scalar.h (same maths, std:: functions).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/rnn_gates_f32_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "cpu/rnn_gates.h"
#include "cpu/rnn_gates_scalar.h"

HWY_BEFORE_NAMESPACE();
namespace seqpack::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// σ(x) = 1 / (1 + e^-x). The argument is clamped where e^-x would overflow
// float (σ is 0 or 1 to float precision there anyway).
HWY_INLINE VF Sigmoid(DF d, VF x) {
  const VF one = hn::Set(d, 1.0f);
  const VF xc = hn::Max(x, hn::Set(d, -87.0f));
  return hn::Div(one, hn::Add(one, hn::Exp(d, hn::Neg(xc))));
}

HWY_INLINE VF Tanh(DF d, VF x) { return hn::Tanh(d, x); }

void LstmForward(int64_t n, int64_t H, int64_t k0, int64_t k1, float* gates, const float* c_prev,
                 int64_t ld_cprev, float* c, int64_t ld_c, float* h, int64_t ld_h) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const VF one = hn::Set(d, 1.0f);
  (void)one;
  for (int64_t r = 0; r < n; ++r) {
    float* g = gates + r * 4 * H;
    const float* cp = c_prev + r * ld_cprev;
    float* cr = c + r * ld_c;
    float* hr = h + r * ld_h;
    int64_t k = k0;
    for (; k + L <= k1; k += L) {
      const VF ig = Sigmoid(d, hn::LoadU(d, g + k));
      const VF fg = Sigmoid(d, hn::LoadU(d, g + H + k));
      const VF gg = Tanh(d, hn::LoadU(d, g + 2 * H + k));
      const VF og = Sigmoid(d, hn::LoadU(d, g + 3 * H + k));
      hn::StoreU(ig, d, g + k);
      hn::StoreU(fg, d, g + H + k);
      hn::StoreU(gg, d, g + 2 * H + k);
      hn::StoreU(og, d, g + 3 * H + k);
      const VF cn = hn::MulAdd(fg, hn::LoadU(d, cp + k), hn::Mul(ig, gg));
      hn::StoreU(cn, d, cr + k);
      hn::StoreU(hn::Mul(og, Tanh(d, cn)), d, hr + k);
    }
    for (; k < k1; ++k) scalar::lstm_forward_at(H, k, g, cp, cr, hr);
  }
}

void LstmBackward(int64_t n, int64_t H, int64_t k0, int64_t k1, const float* gates, const float* c,
                  const float* c_prev, const float* dh, int64_t ld_dh, float* dc, float* dgates) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const VF one = hn::Set(d, 1.0f);
  for (int64_t r = 0; r < n; ++r) {
    const float* g = gates + r * 4 * H;
    const float* cr = c + r * H;
    const float* cp = c_prev + r * H;
    const float* dhr = dh + r * ld_dh;
    float* dcr = dc + r * H;
    float* dg = dgates + r * 4 * H;
    int64_t k = k0;
    for (; k + L <= k1; k += L) {
      const VF ig = hn::LoadU(d, g + k), fg = hn::LoadU(d, g + H + k);
      const VF gg = hn::LoadU(d, g + 2 * H + k), og = hn::LoadU(d, g + 3 * H + k);
      const VF tc = Tanh(d, hn::LoadU(d, cr + k));
      const VF dhv = hn::LoadU(d, dhr + k);
      // dc_t = dc_{t+1}·f_{t+1} + dh·o·(1 - tanh²c)
      const VF dct =
          hn::MulAdd(hn::Mul(dhv, og), hn::NegMulAdd(tc, tc, one), hn::LoadU(d, dcr + k));
      hn::StoreU(hn::Mul(hn::Mul(dct, gg), hn::Mul(ig, hn::Sub(one, ig))), d, dg + k);
      hn::StoreU(hn::Mul(hn::Mul(dct, hn::LoadU(d, cp + k)), hn::Mul(fg, hn::Sub(one, fg))), d,
                 dg + H + k);
      hn::StoreU(hn::Mul(hn::Mul(dct, ig), hn::NegMulAdd(gg, gg, one)), d, dg + 2 * H + k);
      hn::StoreU(hn::Mul(hn::Mul(dhv, tc), hn::Mul(og, hn::Sub(one, og))), d, dg + 3 * H + k);
      hn::StoreU(hn::Mul(dct, fg), d, dcr + k);
    }
    for (; k < k1; ++k) scalar::lstm_backward_at(H, k, g, cr, cp, dhr, dcr, dg);
  }
}

void GruForward(int64_t n, int64_t H, int64_t k0, int64_t k1, float* gx, const float* gh,
                const float* b_hh, const float* h_prev, int64_t ld_hprev, float* h, int64_t ld_h,
                float* ghn) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const VF one = hn::Set(d, 1.0f);
  const VF zero = hn::Zero(d);
  for (int64_t r = 0; r < n; ++r) {
    float* x = gx + r * 3 * H;
    const float* y = gh + r * 3 * H;
    const float* hp = h_prev + r * ld_hprev;
    float* hr = h + r * ld_h;
    float* ghr = ghn ? ghn + r * H : nullptr;
    int64_t k = k0;
    for (; k + L <= k1; k += L) {
      const VF bhr = b_hh ? hn::LoadU(d, b_hh + k) : zero;
      const VF bhz = b_hh ? hn::LoadU(d, b_hh + H + k) : zero;
      const VF bhn = b_hh ? hn::LoadU(d, b_hh + 2 * H + k) : zero;
      const VF rg = Sigmoid(d, hn::Add(hn::Add(hn::LoadU(d, x + k), hn::LoadU(d, y + k)), bhr));
      const VF zg =
          Sigmoid(d, hn::Add(hn::Add(hn::LoadU(d, x + H + k), hn::LoadU(d, y + H + k)), bhz));
      const VF hnv = hn::Add(hn::LoadU(d, y + 2 * H + k), bhn);
      const VF ng = Tanh(d, hn::MulAdd(rg, hnv, hn::LoadU(d, x + 2 * H + k)));
      hn::StoreU(rg, d, x + k);
      hn::StoreU(zg, d, x + H + k);
      hn::StoreU(ng, d, x + 2 * H + k);
      if (ghr) hn::StoreU(hnv, d, ghr + k);
      // h' = n + z (h - n) = (1 - z) n + z h
      hn::StoreU(hn::MulAdd(zg, hn::Sub(hn::LoadU(d, hp + k), ng), ng), d, hr + k);
    }
    (void)one;
    for (; k < k1; ++k) scalar::gru_forward_at(H, k, x, y, b_hh, hp, hr, ghr ? ghr : nullptr);
  }
}

void GruBackward(int64_t n, int64_t H, int64_t k0, int64_t k1, const float* gates, const float* ghn,
                 const float* h_prev, int64_t ld_hprev, const float* dh, int64_t ld_dh, float* dgx,
                 float* dgh, float* dh_prev) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const VF one = hn::Set(d, 1.0f);
  for (int64_t r = 0; r < n; ++r) {
    const float* g = gates + r * 3 * H;
    const float* hnr = ghn + r * H;
    const float* hp = h_prev + r * ld_hprev;
    const float* dr = dh + r * ld_dh;
    float* dx = dgx + r * 3 * H;
    float* dy = dgh + r * 3 * H;
    float* dhp = dh_prev + r * H;
    int64_t k = k0;
    for (; k + L <= k1; k += L) {
      const VF rg = hn::LoadU(d, g + k), zg = hn::LoadU(d, g + H + k);
      const VF ng = hn::LoadU(d, g + 2 * H + k);
      const VF dv = hn::LoadU(d, dr + k);
      const VF dnp = hn::Mul(hn::Mul(dv, hn::Sub(one, zg)), hn::NegMulAdd(ng, ng, one));
      const VF dzp =
          hn::Mul(hn::Mul(dv, hn::Sub(hn::LoadU(d, hp + k), ng)), hn::Mul(zg, hn::Sub(one, zg)));
      const VF drp = hn::Mul(hn::Mul(dnp, hn::LoadU(d, hnr + k)), hn::Mul(rg, hn::Sub(one, rg)));
      hn::StoreU(drp, d, dx + k);
      hn::StoreU(dzp, d, dx + H + k);
      hn::StoreU(dnp, d, dx + 2 * H + k);
      hn::StoreU(drp, d, dy + k);
      hn::StoreU(dzp, d, dy + H + k);
      hn::StoreU(hn::Mul(dnp, rg), d, dy + 2 * H + k);
      hn::StoreU(hn::Mul(dv, zg), d, dhp + k);
    }
    for (; k < k1; ++k) scalar::gru_backward_at(H, k, g, hnr, hp, dr, dx, dy, dhp);
  }
}

void RnnForward(int64_t n, int64_t H, int64_t k0, int64_t k1, float* gates, bool relu, float* h,
                int64_t ld_h) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const VF zero = hn::Zero(d);
  for (int64_t r = 0; r < n; ++r) {
    float* g = gates + r * H;
    float* hr = h + r * ld_h;
    int64_t k = k0;
    for (; k + L <= k1; k += L) {
      const VF a = hn::LoadU(d, g + k);
      // IfThenElse rather than Max so a NaN stays NaN, as torch.relu.
      const VF v = relu ? hn::IfThenElse(hn::Lt(a, zero), zero, a) : Tanh(d, a);
      hn::StoreU(v, d, g + k);
      hn::StoreU(v, d, hr + k);
    }
    for (; k < k1; ++k) scalar::rnn_forward_at(k, g, relu, hr);
  }
}

void RnnBackward(int64_t n, int64_t H, int64_t k0, int64_t k1, const float* h_saved, bool relu,
                 const float* dh, int64_t ld_dh, float* dpre) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const VF zero = hn::Zero(d);
  const VF one = hn::Set(d, 1.0f);
  for (int64_t r = 0; r < n; ++r) {
    const float* hs = h_saved + r * H;
    const float* dr = dh + r * ld_dh;
    float* o = dpre + r * H;
    int64_t k = k0;
    for (; k + L <= k1; k += L) {
      const VF hv = hn::LoadU(d, hs + k);
      const VF dv = hn::LoadU(d, dr + k);
      const VF res =
          relu ? hn::IfThenZeroElse(hn::Le(hv, zero), dv) : hn::Mul(dv, hn::NegMulAdd(hv, hv, one));
      hn::StoreU(res, d, o + k);
    }
    for (; k < k1; ++k) scalar::rnn_backward_at(k, hs, relu, dr, o);
  }
}

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
HWY_EXPORT(TargetName);

template <>
void lstm_gates_forward<float>(int64_t n, int64_t H, int64_t k0, int64_t k1, float* gates,
                               const float* c_prev, int64_t ld_cprev, float* c, int64_t ld_c,
                               float* h, int64_t ld_h) {
  HWY_DYNAMIC_DISPATCH(LstmForward)(n, H, k0, k1, gates, c_prev, ld_cprev, c, ld_c, h, ld_h);
}
template <>
void lstm_gates_backward<float>(int64_t n, int64_t H, int64_t k0, int64_t k1, const float* gates,
                                const float* c, const float* c_prev, const float* dh, int64_t ld_dh,
                                float* dc, float* dgates) {
  HWY_DYNAMIC_DISPATCH(LstmBackward)(n, H, k0, k1, gates, c, c_prev, dh, ld_dh, dc, dgates);
}
template <>
void gru_gates_forward<float>(int64_t n, int64_t H, int64_t k0, int64_t k1, float* gx,
                              const float* gh, const float* b_hh, const float* h_prev,
                              int64_t ld_hprev, float* h, int64_t ld_h, float* ghn) {
  HWY_DYNAMIC_DISPATCH(GruForward)(n, H, k0, k1, gx, gh, b_hh, h_prev, ld_hprev, h, ld_h, ghn);
}
template <>
void gru_gates_backward<float>(int64_t n, int64_t H, int64_t k0, int64_t k1, const float* gates,
                               const float* ghn, const float* h_prev, int64_t ld_hprev,
                               const float* dh, int64_t ld_dh, float* dgx, float* dgh,
                               float* dh_prev) {
  HWY_DYNAMIC_DISPATCH(GruBackward)
  (n, H, k0, k1, gates, ghn, h_prev, ld_hprev, dh, ld_dh, dgx, dgh, dh_prev);
}
template <>
void rnn_gates_forward<float>(int64_t n, int64_t H, int64_t k0, int64_t k1, float* gates, bool relu,
                              float* h, int64_t ld_h) {
  HWY_DYNAMIC_DISPATCH(RnnForward)(n, H, k0, k1, gates, relu, h, ld_h);
}
template <>
void rnn_gates_backward<float>(int64_t n, int64_t H, int64_t k0, int64_t k1, const float* h_saved,
                               bool relu, const float* dh, int64_t ld_dh, float* dpre) {
  HWY_DYNAMIC_DISPATCH(RnnBackward)(n, H, k0, k1, h_saved, relu, dh, ld_dh, dpre);
}

const char* rnn_gates_f32_target() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

}  // namespace seqpack::cpu
#endif  // HWY_ONCE
