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

#include <string>

namespace seqpack {

// n >= 1; throws std::invalid_argument naming n otherwise.
void set_num_threads(int n);
// The OpenMP thread count seqpack's parallel regions use.
int num_threads();

// Pins OpenMP's threads 0..n-1 (n = num_threads(), the calling thread as 0)
// each to one CPU of the caller's affinity mask, in the mask's order, as
// OMP_PROC_BIND=close with one place per CPU would. For a process that owns
// the machine: the command-line tool calls it. Unpinned, threads that fill
// every CPU run unsteadily on a shared virtual machine (the main job at 16
// threads on 16 vCPUs: 224k to 560k tokens/s, pinned 550k to 577k;
// docs/performance.md). SEQPACK_PIN_THREADS chooses: unset, pin only when n
// equals the mask's CPU count; 1, whenever n is at most that count; 0, never.
// Nothing is pinned where the environment places OpenMP's threads itself
// (OMP_PROC_BIND, OMP_PLACES, GOMP_CPU_AFFINITY, KMP_AFFINITY). Returns the
// pinned CPUs ("0-15"), or "" with `why` saying why not. Throws
// std::invalid_argument naming a SEQPACK_PIN_THREADS other than 0 or 1.
std::string pin_threads(std::string* why = nullptr);

}  // namespace seqpack
