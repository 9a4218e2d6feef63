// Threads seqpack may use.
//
//   seqpack::set_num_threads(2);   // seqpack's parallel regions and GEMMs use 2 threads
//   int n = seqpack::num_threads();
//
// seqpack has one pool, OpenMP's: its GEMMs split large products over those
// threads themselves and keep OpenBLAS's own pool at one thread while they run,
// so the two pools never oversubscribe the cores. OpenBLAS's setting is left as
// the caller had it (torch in the same process keeps its own).
#pragma once

namespace seqpack {

// n >= 1; throws std::invalid_argument naming n otherwise.
void set_num_threads(int n);
// The OpenMP thread count seqpack's parallel regions use.
int num_threads();

}  // namespace seqpack
