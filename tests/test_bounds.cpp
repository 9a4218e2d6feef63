// Bounded inputs in the library (docs/reliability.md, "Bounded inputs"):
// sizes are checked for overflow and against limits before anything is
// allocated, a failed allocation says what it was for, no exception escapes an
// OpenMP region, and only regular files are read as data and models.
#include <gtest/gtest.h>
#include <omp.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "seqpack/data.h"
#include "seqpack/nn.h"
#include "seqpack/packed_sequence.h"
#include "seqpack/rnn.h"
#include "seqpack/safetensors.h"
#include "seqpack/tensor.h"
#include "seqpack/threading.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;
using namespace seqpack;

// The message of the std::invalid_argument that `f` throws ("" if none).
template <typename F>
std::string invalid_argument_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_CONTAINS(text, needle) \
  EXPECT_NE(std::string(text).find(needle), std::string::npos) << "'" << (text) << "' lacks '" << (needle) << "'"

// ------------------------------------------------------------ tensor sizes

TEST(BoundsTensor, ShapeProductsThatOverflowInt64AreRejectedNamingTheShape) {
  // 2^62 * 4 = 2^64: wraps to 0 in int64 arithmetic.
  const std::string m = invalid_argument_of([] { shape_numel({int64_t{1} << 62, 4}); });
  EXPECT_CONTAINS(m, "shape [4611686018427387904, 4]");
  EXPECT_CONTAINS(m, "more elements than a 64-bit integer");
  // Same for three factors, none of them large alone after the first product.
  EXPECT_CONTAINS(invalid_argument_of([] { shape_numel({int64_t{1} << 32, int64_t{1} << 31, 2}); }),
                  "64-bit integer");
  // A zero size makes the product empty, however large the others.
  EXPECT_EQ(shape_numel({0, INT64_MAX, INT64_MAX}), 0);
  EXPECT_EQ(shape_numel({INT64_MAX, 0}), 0);
  EXPECT_EQ(shape_numel({INT64_MAX}), INT64_MAX);
}

TEST(BoundsTensor, TensorsAboveTheByteLimitAreRejectedBeforeAllocating) {
  // 2^44 * 2 float32 = 2^47 bytes > 2^46.
  const std::string m =
      invalid_argument_of([] { Tensor::empty({int64_t{1} << 44, 2}, DType::f32); });
  EXPECT_CONTAINS(m, "float32 tensor of shape [17592186044416, 2] would take 140737488355328 bytes");
  EXPECT_CONTAINS(m, "limit of 70368744177664 bytes");
  // The byte count itself past int64: 2^62 float64 elements = 2^65 bytes.
  EXPECT_CONTAINS(invalid_argument_of([] { Tensor::zeros({int64_t{1} << 62}, DType::f64); }),
                  "would take 36893488147419103232 bytes");
  EXPECT_CONTAINS(invalid_argument_of([] { Tensor::full({int64_t{1} << 62, 4}, 1.0); }),
                  "64-bit integer");
  // Exactly at the limit is not refused by the check (2^44 float32 = 2^46 bytes).
  EXPECT_EQ(shape_nbytes({int64_t{1} << 44}, DType::f32), std::size_t{1} << 46);
  EXPECT_EQ(shape_nbytes({3, 5}, DType::f64), 120u);
}

// Lowers the address-space limit for one scope, so that a large allocation
// fails whatever the machine's overcommit policy.
struct AddressSpaceLimit {
  rlimit old{};
  bool ok = false;
  explicit AddressSpaceLimit(rlim_t bytes) {
    getrlimit(RLIMIT_AS, &old);
    rlimit lim = old;
    lim.rlim_cur = std::min<rlim_t>(bytes, old.rlim_max);
    ok = setrlimit(RLIMIT_AS, &lim) == 0;
  }
  ~AddressSpaceLimit() { setrlimit(RLIMIT_AS, &old); }
};

TEST(BoundsTensor, AFailedAllocationSaysHowManyBytesForWhichShape) {
  AddressSpaceLimit limit(rlim_t{64} << 30);  // 64 GiB of address space
  ASSERT_TRUE(limit.ok);
  // 2^43 float32 = 32 TiB: under seqpack's limit, over the address space.
  try {
    Tensor::empty({int64_t{1} << 21, int64_t{1} << 22}, DType::f32);
    FAIL() << "a 32 TiB tensor was allocated";
  } catch (const std::bad_alloc& e) {  // still a std::bad_alloc for callers that catch one
    EXPECT_NE(dynamic_cast<const AllocationError*>(&e), nullptr);
    EXPECT_STREQ(e.what(),
                 "cannot allocate 35184372088832 bytes for a float32 tensor of shape "
                 "[2097152, 4194304]: out of memory");
  }
}

}  // namespace
