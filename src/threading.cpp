#include "seqpack/threading.h"

#include <omp.h>

#include <stdexcept>
#include <string>


namespace seqpack {

void set_num_threads(int n) {
  if (n < 1) throw std::invalid_argument("set_num_threads: n = " + std::to_string(n) + " must be >= 1");
  // seqpack's threads are OpenMP's: its GEMMs split large products over them
  // and keep OpenBLAS's own pool at one thread while they run (cpu/gemm.h).
  omp_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace seqpack
