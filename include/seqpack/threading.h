// Threads seqpack may use: one knob for both OpenMP and OpenBLAS.
//
//   seqpack::set_num_threads(2);   // OpenMP regions and BLAS calls use 2 threads
//   int n = seqpack::num_threads();
//
// The two pools are set together so a caller (the CLI's --threads, the Python
// package, a benchmark) cannot leave them disagreeing and oversubscribe the cores.
#pragma once

namespace seqpack {

// n >= 1; throws std::invalid_argument naming n otherwise.
void set_num_threads(int n);
// The OpenMP thread count seqpack's parallel regions use.
int num_threads();

}  // namespace seqpack
