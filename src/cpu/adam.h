// The Adam update of one float parameter tensor, torch 1.13's single-tensor
// formula element by element (see include/seqpack/optim.h):
//
//   g = grad + weight_decay * p
//   m = m + (1 - beta1) * (g - m)            (torch: exp_avg.lerp_(g, 1 - beta1))
//   v = v * beta2 + (1 - beta2) * g * g
//   vv = amsgrad ? (vmax = max(vmax, v)) : v
//   p = p - step_size * m / (sqrt(vv) / bc2_sqrt + eps)
//
// with step_size = lr / (1 - beta1^t) and bc2_sqrt = sqrt(1 - beta2^t) computed
// by the caller in double, and 1 - beta1 and 1 - beta2 too, as torch takes
// them (Python floats, then the kernel's float): 1 - float(0.999) would be
// 1.3e-5 off 0.001 in relative terms, and every v with it. float32 runs in
// Highway SIMD (adam_f32_hwy.cpp): std::sqrt in a scalar loop keeps GCC from
// vectorising it (errno), and the optimiser touches every parameter every step.
#pragma once

#include <cstdint>

#include "cpu/isa_cap.h"

namespace seqpack::cpu {

struct AdamScalars {
  float one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, step_size, bc2_sqrt;
};

// vmax is null without amsgrad. Arrays must not overlap.
// On the target of `cap` (Highway's, cpu/isa_cap.h).
void adam_update_f32(float* p, const float* grad, float* m, float* v, float* vmax, int64_t n,
                     const AdamScalars& s, IsaLevel cap);

// The same update as a plain scalar loop: the reference the SIMD path is tested against.
void adam_update_f32_scalar(float* p, const float* grad, float* m, float* v, float* vmax, int64_t n,
                            const AdamScalars& s);

}  // namespace seqpack::cpu
