// float64 gate kernels: the scalar loops (used for finite-difference checks,
// where exactness matters more than speed). No engine hands float64 a row
// sink: the sink arguments are empty and ignored.
#include "cpu/rnn_gates.h"
#include "cpu/rnn_gates_scalar.h"

namespace seqpack::cpu {

template <>
void lstm_gates_forward<double>(IsaLevel, int64_t n, int64_t H, int64_t k0, int64_t k1,
                                double* gates, const double* c_prev, int64_t ld_cprev, double* c,
                                int64_t ld_c, double* h, int64_t ld_h, const double* const* x_rows,
                                const double*, int64_t, RowSink) {
  scalar::lstm_gates_forward(n, H, k0, k1, gates, c_prev, ld_cprev, c, ld_c, h, ld_h, x_rows);
}
template <>
void lstm_gates_backward<double>(IsaLevel, int64_t n, int64_t H, int64_t k0, int64_t k1,
                                 const double* gates, const double* c, const double* c_prev,
                                 const double* dh, int64_t ld_dh, double* dc, double* dgates,
                                 double* dbias, double* const* dx_rows, RowSink) {
  scalar::lstm_gates_backward(n, H, k0, k1, gates, c, c_prev, dh, ld_dh, dc, dgates, dbias,
                              dx_rows);
}
template <>
void gru_gates_forward<double>(IsaLevel, int64_t n, int64_t H, int64_t k0, int64_t k1, double* gx,
                               const double* gh, const double* b_hh, const double* h_prev,
                               int64_t ld_hprev, double* h, int64_t ld_h, double* ghn, RowSink) {
  scalar::gru_gates_forward(n, H, k0, k1, gx, gh, b_hh, h_prev, ld_hprev, h, ld_h, ghn);
}
template <>
void gru_gates_backward<double>(IsaLevel, int64_t n, int64_t H, int64_t k0, int64_t k1,
                                const double* gates, const double* ghn, const double* h_prev,
                                int64_t ld_hprev, const double* dh, int64_t ld_dh, double* dgx,
                                double* dgh, double* dh_prev, double* db_ih, double* db_hh, RowSink,
                                RowSink) {
  scalar::gru_gates_backward(n, H, k0, k1, gates, ghn, h_prev, ld_hprev, dh, ld_dh, dgx, dgh,
                             dh_prev, db_ih, db_hh);
}
template <>
void rnn_gates_forward<double>(IsaLevel, int64_t n, int64_t H, int64_t k0, int64_t k1,
                               double* gates, bool relu, double* h, int64_t ld_h, RowSink) {
  scalar::rnn_gates_forward(n, H, k0, k1, gates, relu, h, ld_h);
}
template <>
void rnn_gates_backward<double>(IsaLevel, int64_t n, int64_t H, int64_t k0, int64_t k1,
                                const double* h_saved, bool relu, const double* dh, int64_t ld_dh,
                                double* dpre, double* dbias, RowSink) {
  scalar::rnn_gates_backward(n, H, k0, k1, h_saved, relu, dh, ld_dh, dpre, dbias);
}

}  // namespace seqpack::cpu
