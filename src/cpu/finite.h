// Whether an array holds no NaN or infinity: a scan at memory speed (the
// widest vectors the CPU has), for checks that read a whole weight matrix at
// every call (rnn/plan.h: whether W_hh·0 is 0).
#pragma once

#include <cstdint>

namespace seqpack::cpu {

bool all_finite(const float* p, int64_t n);
bool all_finite(const double* p, int64_t n);

}  // namespace seqpack::cpu
