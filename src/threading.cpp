#include "seqpack/threading.h"

#include <omp.h>

#include <stdexcept>
#include <string>

#include "cpu/gemm.h"

namespace seqpack {

void set_num_threads(int n) {
  if (n < 1) throw std::invalid_argument("set_num_threads: n = " + std::to_string(n) + " must be >= 1");
  omp_set_num_threads(n);
  // GEMMs called outside seqpack's own OpenMP regions (the big input and weight-gradient
  // products) may use all n threads; inside a region the kernels lower this to 1 themselves.
  cpu::set_blas_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace seqpack
