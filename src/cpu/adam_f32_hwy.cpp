// float32 Adam update (cpu/adam.h) in Highway SIMD, compiled per x86 target by
// foreach_target.h and chosen at run time. The operations are those of the
// scalar loop, in the same order (Mul then Add rather than MulAdd), so the two
// paths agree to rounding.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/adam_f32_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cmath>

#include "cpu/adam.h"
#include "cpu/isa_cap.h"

// foreach_target.h includes this file once per target; the scalar element is
// target-independent, so it is defined only the first time.
#ifndef SEQPACK_CPU_ADAM_ELEMENT_DEFINED
#define SEQPACK_CPU_ADAM_ELEMENT_DEFINED
namespace seqpack::cpu {
namespace {
// One element of the update; the SIMD loop below does the same per lane.
template <bool kAmsgrad, bool kWeightDecay>
inline void adam_element(float& p, float grad, float& m, float& v, float* vmax,
                         const AdamScalars& s) {
  float g = grad;
  if constexpr (kWeightDecay) g += s.weight_decay * p;
  const float mi = m + s.one_minus_beta1 * (g - m);
  const float vi = v * s.beta2 + s.one_minus_beta2 * g * g;
  m = mi;
  v = vi;
  float vv = vi;
  if constexpr (kAmsgrad) {
    vv = *vmax > vi ? *vmax : vi;
    *vmax = vv;
  }
  const float denom = std::sqrt(vv) / s.bc2_sqrt + s.eps;
  p -= s.step_size * mi / denom;
}
}  // namespace
}  // namespace seqpack::cpu
#endif  // SEQPACK_CPU_ADAM_ELEMENT_DEFINED

HWY_BEFORE_NAMESPACE();
namespace seqpack::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <bool kAmsgrad, bool kWeightDecay>
void AdamLoop(float* HWY_RESTRICT p, const float* HWY_RESTRICT grad, float* HWY_RESTRICT m,
              float* HWY_RESTRICT v, float* HWY_RESTRICT vmax, int64_t n, const AdamScalars& s) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const auto one_minus_b1 = hn::Set(d, s.one_minus_beta1);
  const auto b2 = hn::Set(d, s.beta2);
  const auto one_minus_b2 = hn::Set(d, s.one_minus_beta2);
  const auto eps = hn::Set(d, s.eps);
  const auto wd = hn::Set(d, s.weight_decay);
  const auto step_size = hn::Set(d, s.step_size);
  const auto bc2_sqrt = hn::Set(d, s.bc2_sqrt);
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const auto pi = hn::LoadU(d, p + i);
    auto g = hn::LoadU(d, grad + i);
    if constexpr (kWeightDecay) g = hn::Add(g, hn::Mul(wd, pi));
    const auto mo = hn::LoadU(d, m + i);
    const auto mi = hn::Add(mo, hn::Mul(one_minus_b1, hn::Sub(g, mo)));
    const auto vi = hn::Add(hn::Mul(hn::LoadU(d, v + i), b2), hn::Mul(hn::Mul(one_minus_b2, g), g));
    hn::StoreU(mi, d, m + i);
    hn::StoreU(vi, d, v + i);
    auto vv = vi;
    if constexpr (kAmsgrad) {
      vv = hn::Max(hn::LoadU(d, vmax + i), vi);
      hn::StoreU(vv, d, vmax + i);
    }
    const auto denom = hn::Add(hn::Div(hn::Sqrt(vv), bc2_sqrt), eps);
    hn::StoreU(hn::Sub(pi, hn::Div(hn::Mul(step_size, mi), denom)), d, p + i);
  }
  for (; i < n; ++i) {
    adam_element<kAmsgrad, kWeightDecay>(p[i], grad[i], m[i], v[i], kAmsgrad ? vmax + i : nullptr, s);
  }
}

void AdamUpdate(float* p, const float* grad, float* m, float* v, float* vmax, int64_t n,
                const AdamScalars& s) {
  const bool decay = s.weight_decay != 0.0f;
  if (vmax) {
    decay ? AdamLoop<true, true>(p, grad, m, v, vmax, n, s)
          : AdamLoop<true, false>(p, grad, m, v, vmax, n, s);
  } else {
    decay ? AdamLoop<false, true>(p, grad, m, v, vmax, n, s)
          : AdamLoop<false, false>(p, grad, m, v, vmax, n, s);
  }
}

}  // namespace seqpack::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace seqpack::cpu {

HWY_EXPORT(AdamUpdate);

void adam_update_f32(float* p, const float* grad, float* m, float* v, float* vmax, int64_t n,
                     const AdamScalars& s, IsaLevel cap) {
  SEQPACK_HWY_DISPATCH(AdamUpdate, cap)(p, grad, m, v, vmax, n, s);
}

void adam_update_f32_scalar(float* p, const float* grad, float* m, float* v, float* vmax, int64_t n,
                            const AdamScalars& s) {
  const bool decay = s.weight_decay != 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    float* vm = vmax ? vmax + i : nullptr;
    if (vmax) {
      decay ? adam_element<true, true>(p[i], grad[i], m[i], v[i], vm, s)
            : adam_element<true, false>(p[i], grad[i], m[i], v[i], vm, s);
    } else {
      decay ? adam_element<false, true>(p[i], grad[i], m[i], v[i], vm, s)
            : adam_element<false, false>(p[i], grad[i], m[i], v[i], vm, s);
    }
  }
}

}  // namespace seqpack::cpu
#endif  // HWY_ONCE
