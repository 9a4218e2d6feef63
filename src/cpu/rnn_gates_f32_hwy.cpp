// TEMPORARY float32 scalar kernels (replaced by the Highway ones)
#include "cpu/rnn_gates.h"
#include "cpu/rnn_gates_scalar.h"

namespace seqpack::cpu {

template <>
void lstm_gates_forward<float>(int64_t n, int64_t H, float* gates, const float* c_prev,
                                int64_t ld_cprev, float* c, int64_t ld_c, float* h,
                                int64_t ld_h) {
  scalar::lstm_gates_forward(n, H, gates, c_prev, ld_cprev, c, ld_c, h, ld_h);
}
template <>
void lstm_gates_backward<float>(int64_t n, int64_t H, const float* gates, const float* c,
                                 const float* c_prev, const float* dh, int64_t ld_dh,
                                 float* dc, float* dgates) {
  scalar::lstm_gates_backward(n, H, gates, c, c_prev, dh, ld_dh, dc, dgates);
}
template <>
void gru_gates_forward<float>(int64_t n, int64_t H, float* gx, const float* gh,
                               const float* b_hh, const float* h_prev, int64_t ld_hprev,
                               float* h, int64_t ld_h, float* ghn) {
  scalar::gru_gates_forward(n, H, gx, gh, b_hh, h_prev, ld_hprev, h, ld_h, ghn);
}
template <>
void gru_gates_backward<float>(int64_t n, int64_t H, const float* gates, const float* ghn,
                                const float* h_prev, int64_t ld_hprev, const float* dh,
                                int64_t ld_dh, float* dgx, float* dgh, float* dh_prev) {
  scalar::gru_gates_backward(n, H, gates, ghn, h_prev, ld_hprev, dh, ld_dh, dgx, dgh, dh_prev);
}
template <>
void rnn_gates_forward<float>(int64_t n, int64_t H, float* gates, bool relu, float* h,
                               int64_t ld_h) {
  scalar::rnn_gates_forward(n, H, gates, relu, h, ld_h);
}
template <>
void rnn_gates_backward<float>(int64_t n, int64_t H, const float* h_saved, bool relu,
                                const float* dh, int64_t ld_dh, float* dpre) {
  scalar::rnn_gates_backward(n, H, h_saved, relu, dh, ld_dh, dpre);
}

}  // namespace seqpack::cpu
namespace seqpack::cpu { const char* rnn_gates_f32_target() { return "scalar"; } }
