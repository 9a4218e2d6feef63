// Uses an installed seqpack (examples/consumer/CMakeLists.txt): packs two
// sequences of lengths 3 and 1 and checks the hand-worked batch_sizes [2, 1, 1]
// (two sequences have step 0, one has steps 1 and 2), and that the headers and
// the library are the same version.
#include <cstdio>
#include <cstring>
#include <exception>

#include "seqpack/packed_sequence.h"
#include "seqpack/version.h"

int main() {
  try {
    using namespace seqpack;
    if (std::strcmp(version(), SEQPACK_VERSION_STRING) != 0) {
      std::fprintf(stderr, "core_consumer: headers are seqpack %s, the library %s\n",
                   SEQPACK_VERSION_STRING, version());
      return 1;
    }
    PackedSequence p = pack_sequence({Tensor::full({3, 2}, 1.0), Tensor::full({1, 2}, 2.0)});
    const double expected[] = {2, 1, 1};
    if (p.batch_sizes.numel() != 3) {
      std::fprintf(stderr, "core_consumer: %lld batch sizes, expected 3\n",
                   static_cast<long long>(p.batch_sizes.numel()));
      return 1;
    }
    for (int t = 0; t < 3; ++t) {
      if (p.batch_sizes.item_as_double(t) != expected[t]) {
        std::fprintf(stderr, "core_consumer: batch_sizes[%d] = %g, expected %g\n", t,
                     p.batch_sizes.item_as_double(t), expected[t]);
        return 1;
      }
    }
    std::printf("core_consumer: seqpack %s, batch_sizes 2 1 1: ok\n", version());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "core_consumer: %s\n", e.what());
    return 1;
  }
  return 0;
}
