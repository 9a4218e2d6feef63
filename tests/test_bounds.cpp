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

#include "cpu/omp_errors.h"
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

#define EXPECT_CONTAINS(text, needle)                          \
  EXPECT_NE(std::string(text).find(needle), std::string::npos) \
      << "'" << (text) << "' lacks '" << (needle) << "'"

// ------------------------------------------------------------ tensor sizes

TEST(BoundsTensor, ShapeProductsThatOverflowInt64AreRejectedNamingTheShape) {
  // 2^62 * 4 = 2^64: wraps to 0 in int64 arithmetic.
  const std::string m = invalid_argument_of([] { shape_numel({int64_t{1} << 62, 4}); });
  EXPECT_CONTAINS(m, "shape [4611686018427387904, 4]");
  EXPECT_CONTAINS(m, "more elements than a 64-bit integer");
  // Same for three factors, none of them large alone after the first product.
  EXPECT_CONTAINS(invalid_argument_of([] {
                    shape_numel({int64_t{1} << 32, int64_t{1} << 31, 2});
                  }),
                  "64-bit integer");
  // A zero size makes the product empty, however large the others.
  EXPECT_EQ(shape_numel({0, INT64_MAX, INT64_MAX}), 0);
  EXPECT_EQ(shape_numel({INT64_MAX, 0}), 0);
  EXPECT_EQ(shape_numel({INT64_MAX}), INT64_MAX);
}

TEST(BoundsTensor, TensorsAboveTheByteLimitAreRejectedBeforeAllocating) {
  // 2^44 * 2 float32 = 2^47 bytes > 2^46.
  const std::string m = invalid_argument_of([] {
    Tensor::empty({int64_t{1} << 44, 2}, DType::f32);
  });
  EXPECT_CONTAINS(m,
                  "float32 tensor of shape [17592186044416, 2] would take 140737488355328 bytes");
  EXPECT_CONTAINS(m, "limit of 70368744177664 bytes");
  // The byte count itself past int64: 2^62 float64 elements = 2^65 bytes.
  EXPECT_CONTAINS(invalid_argument_of([] { Tensor::zeros({int64_t{1} << 62}, DType::f64); }),
                  "would take 36893488147419103232 bytes");
  EXPECT_CONTAINS(invalid_argument_of([] {
                    Tensor::full({int64_t{1} << 62, 4}, 1.0);
                  }),
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
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves its shadow memory up front and aborts on a failed "
                  "allocation: an address-space limit cannot be tested under it";
#endif
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

// ------------------------------------------------------------ RNN sizes

TEST(BoundsRnn, OptionsRejectSizesAboveTheLimitNamingTheOption) {
  RNNOptions o;
  o.input_size = 4;
  o.hidden_size = int64_t{1} << 60;  // the config.json of issue 21
  EXPECT_CONTAINS(
      invalid_argument_of([&] { o.validate(); }),
      "hidden_size = 1152921504606846976 is too large: seqpack allows at most 16777216");
  o.hidden_size = 8;
  o.input_size = int64_t{1} << 62;
  EXPECT_CONTAINS(invalid_argument_of([&] { o.validate(); }), "input_size = 4611686018427387904");
  o.input_size = 4;
  o.num_layers = 1 << 20;
  EXPECT_CONTAINS(invalid_argument_of([&] { o.validate(); }), "num_layers = 1048576 is too large");
  // Each size allowed alone, but their product is not: 4 * 2^24 * 2^24 float32.
  o.num_layers = 1;
  o.input_size = o.hidden_size = int64_t{1} << 24;
  const std::string m = invalid_argument_of([&] { o.validate(); });
  EXPECT_CONTAINS(m,
                  "input_size = 16777216, hidden_size = 16777216, num_layers = 1: parameter "
                  "weight_ih_l0: a float32 tensor of shape [67108864, 16777216]");
}

TEST(BoundsRnn, ModulesAndCellsWithHugeSizesThrowInsteadOfCrashing) {
  RNNOptions o;
  o.input_size = 4;
  o.hidden_size = int64_t{1} << 60;
  EXPECT_CONTAINS(invalid_argument_of([&] { LSTM m(o, 1); }), "hidden_size = 1152921504606846976");
  o.hidden_size = int64_t{1} << 62;
  EXPECT_CONTAINS(invalid_argument_of([&] { GRU m(o, 1); }), "hidden_size = 4611686018427387904");
  EXPECT_CONTAINS(invalid_argument_of([] { LSTMCell c(4, int64_t{1} << 60, true, DType::f32, 1); }),
                  "hidden_size = 1152921504606846976");
  EXPECT_CONTAINS(invalid_argument_of([] { Linear l(int64_t{1} << 40, int64_t{1} << 40); }),
                  "Linear: in_features = 1099511627776, out_features = 1099511627776: shape "
                  "[1099511627776, 1099511627776] has more elements than a 64-bit integer");
  EXPECT_CONTAINS(invalid_argument_of([] { Linear l(int64_t{1} << 20, int64_t{1} << 30); }),
                  "Linear: in_features = 1048576, out_features = 1073741824: a float32 tensor of "
                  "shape [1073741824, 1048576] would take 4503599627370496 bytes");
  EXPECT_CONTAINS(invalid_argument_of([] { Embedding e(int64_t{1} << 62, 4); }),
                  "Embedding: num_embeddings = 4611686018427387904, embedding_dim = 4");
}

// ------------------------------------------------------------ OpenMP regions

TEST(BoundsOpenMp, AnExceptionInARegionIsRethrownAfterIt) {
  cpu::OmpErrors errors;
  int ran = 0;
#pragma omp parallel num_threads(2) reduction(+ : ran)
  errors.run([&] {
    ++ran;
    if (omp_get_thread_num() == omp_get_num_threads() - 1) throw std::length_error("worker failed");
  });
  EXPECT_GE(ran, 1);
  EXPECT_THROW(
      try { errors.rethrow(); } catch (const std::length_error& e) {
        EXPECT_STREQ(e.what(), "worker failed");
        throw;
      },
      std::length_error);
  cpu::OmpErrors none;
  none.run([] {});
  EXPECT_NO_THROW(none.rethrow());
}

// A bidirectional layer runs its two directions on two OpenMP threads, each
// allocating its gates there. Under an address-space limit the allocation
// fails inside the region: the caller gets the error (once std::terminate).
TEST(BoundsOpenMp, AnAllocationFailingInsideTheRecurrentCoreReachesTheCaller) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves its shadow memory up front and aborts on a failed "
                  "allocation: an address-space limit cannot be tested under it";
#endif
  const int threads_before = num_threads();
  set_num_threads(2);
  RNNOptions o;
  o.mode = RNNMode::lstm;
  o.input_size = 1;
  o.hidden_size = 4096;
  o.proj_size = 1;  // small outputs, allocated before the region; large gates inside it
  o.bidirectional = true;
  LSTM lstm(o, 1);
  const int64_t T = 1 << 18;  // gates: 2^18 * 4 * 4096 float32 = 16 GiB per direction
  const Tensor x = Tensor::zeros({T, 1, 1});
  AddressSpaceLimit limit(rlim_t{12} << 30);
  ASSERT_TRUE(limit.ok);  // without it the forward would run (for minutes)
  try {
    lstm.forward(x);
    ADD_FAILURE() << "the forward needed 32 GiB and did not fail under a 12 GiB limit";
  } catch (const std::bad_alloc& e) {
    // The gates [N, 4H] of one direction, allocated inside the region.
    EXPECT_CONTAINS(std::string(e.what()), "for a float32 tensor of shape [262144, 16384]");
  }
  set_num_threads(threads_before);
}

// ------------------------------------------------------------ files

struct Files {
  seqpack::testing::TempDir dir;
  fs::path fifo, zero_link, directory;
  Files() {
    directory = dir.path / "a_directory";
    fs::create_directory(directory);
    zero_link = dir.path / "zero_link";
    fs::create_symlink("/dev/zero", zero_link);
    fifo = dir.path / "a_fifo";
    ::mkfifo(fifo.c_str(), 0600);
  }
};

TEST(BoundsFiles, DataFilesMustBeRegularFilesNamingThePath) {
  const Files f;
  EXPECT_CONTAINS(invalid_argument_of([&] { load_tsv(f.directory.string()); }),
                  "TSV file '" + f.directory.string() + "' is a directory, not a regular file");
  // Read forever once; now refused before reading.
  EXPECT_CONTAINS(invalid_argument_of([&] { load_tsv(f.zero_link.string()); }),
                  "TSV file '" + f.zero_link.string() + "' is a character device");
  // Opening a FIFO with no writer would block: refused before opening.
  EXPECT_CONTAINS(invalid_argument_of([&] { load_tsv(f.fifo.string()); }),
                  "'" + f.fifo.string() + "' is a FIFO (named pipe)");
  EXPECT_CONTAINS(invalid_argument_of([] { load_tsv("/nonexistent/x.tsv"); }),
                  "cannot open TSV file '/nonexistent/x.tsv'");
}

TEST(BoundsFiles, SafetensorsFilesMustBeRegularFilesNamingThePath) {
  const Files f;
  EXPECT_CONTAINS(invalid_argument_of([&] { load_safetensors(f.directory.string()); }),
                  "safetensors file '" + f.directory.string() + "' is a directory");
  EXPECT_CONTAINS(invalid_argument_of([&] { load_safetensors(f.zero_link.string()); }),
                  "safetensors file '" + f.zero_link.string() + "' is a character device");
  EXPECT_CONTAINS(invalid_argument_of([&] { load_safetensors(f.fifo.string()); }),
                  "is a FIFO (named pipe)");
  // A regular file behind a symbolic link is read as usual.
  const fs::path file = f.dir.path / "t.safetensors";
  save_safetensors(file.string(), {{"w", Tensor::from_vector<float>({1.f, 2.f, 3.f})}});
  const fs::path link = f.dir.path / "link.safetensors";
  fs::create_symlink(file, link);
  const auto loaded = load_safetensors(link.string());
  EXPECT_EQ(loaded.at("w").to_vector<float>(), (std::vector<float>{1.f, 2.f, 3.f}));
}

// A byte-order mark is not part of the first label: two labels stay two.
TEST(BoundsFiles, AByteOrderMarkAtTheStartOfATsvIsSkipped) {
  const seqpack::testing::TempDir dir;
  const fs::path tsv = dir.path / "bom.tsv";
  std::ofstream(tsv, std::ios::binary) << "\xEF\xBB\xBF"
                                          "en\tcat\nfr\tchat\nen\tdog\n";
  const TextDataset ds = load_tsv(tsv.string());
  EXPECT_EQ(ds.labels, (std::vector<std::string>{"en", "fr"}));
  ASSERT_EQ(ds.examples.size(), 3u);
  EXPECT_EQ(ds.examples[0].label, ds.examples[2].label);
  // Only at the very start: a mark later on is text (here inside the label).
  const fs::path later = dir.path / "later.tsv";
  std::ofstream(later, std::ios::binary) << "en\tcat\n\xEF\xBB\xBF"
                                            "en\tdog\n";
  EXPECT_EQ(load_tsv(later.string()).labels.size(), 2u);
}

}  // namespace
