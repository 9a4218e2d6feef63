// Every GEMM engine (fp32; bf16 where the CPU has native bf16; int8 on the
// kernel int8_kernel() picks) against the plain float64 GEMM of GemmEngineTester
// (tests/gemm_engine_tester.h), over odd sizes (1, 3, 17, 33, 129 rows and
// columns; K not a multiple of any SIMD width), both transposes, beta 0 and 1,
// a bias row, and the per-step column ranges of 1 to 4 threads.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdlib>
#include <string>

#include "gemm_engine_tester.h"

namespace seqpack::testing {
namespace {

class GemmEngineSweep : public ::testing::TestWithParam<Precision> {
 protected:
  void SetUp() override {
    std::string why;
    if (!GemmEngineTester::Supported(GetParam(), &why)) GTEST_SKIP() << why;
  }
};

const int64_t kSizes[] = {1, 3, 17, 33, 129};

TEST_P(GemmEngineSweep, WholeBatchProducts) {
  const Precision p = GetParam();
  uint64_t seed = 1000;
  for (int64_t m : kSizes) {
    for (int64_t n : kSizes) {
      for (int64_t k : {1, 5, 33, 131}) {
        for (bool ta : {false, true}) {
          if (ta && p == Precision::int8) continue;  // int8: forward products only
          for (bool tb : {false, true}) {
            for (int mode = 0; mode < 3; ++mode) {  // beta 0, beta 1, a bias row
              GemmEngineTester()
                  .precision(p)
                  .m(m)
                  .n(n)
                  .k(k)
                  .trans_a(ta)
                  .trans_b(tb)
                  .beta(mode == 1 ? 1.0f : 0.0f)
                  .bias(mode == 2)
                  .seed(++seed)
                  .TestGemm();
              if (HasFatalFailure()) return;
            }
          }
        }
      }
    }
  }
}

// A product large enough for the bf16 engine to multiply in bf16.
TEST_P(GemmEngineSweep, LargeWholeBatchProduct) {
  GemmEngineTester()
      .precision(GetParam())
      .m(129)
      .n(257)
      .k(131)
      .trans_b(true)
      .bias(true)
      .seed(7)
      .TestGemm();
  GemmEngineTester().precision(GetParam()).m(257).n(129).k(131).beta(1).seed(8).TestGemm();
}

TEST_P(GemmEngineSweep, StepProductsOverThreadSplits) {
  const Precision p = GetParam();
  uint64_t seed = 5000;
  for (int threads : {1, 2, 3, 4}) {
    for (int64_t width : {1, 17, 33, 129}) {
      for (int64_t blocks : {1, 3, 4}) {
        for (int64_t m : {1, 3, 17, 33}) {
          for (int64_t k : {3, 17, 129}) {
            for (float beta : {0.0f, 1.0f}) {
              GemmEngineTester()
                  .precision(p)
                  .m(m)
                  .width(width)
                  .blocks(blocks)
                  .k(k)
                  .trans_b(true)
                  .beta(beta)
                  .threads(threads)
                  .seed(++seed)
                  .TestStep();
              if (HasFatalFailure()) return;
            }
          }
        }
      }
    }
  }
}

// Step products on weights read in place (a call of one step): the
// reference's values and the laid-out weights' bits, both layouts of B, on
// the column ranges of 1 to 3 threads.
TEST_P(GemmEngineSweep, StepProductsOnWeightsInPlace) {
  const Precision p = GetParam();
  uint64_t seed = 9000;
  for (int threads : {1, 2, 3}) {
    for (int64_t width : {1, 17, 129}) {
      for (int64_t blocks : {1, 4}) {
        for (int64_t m : {1, 3, 7, 33}) {
          for (int64_t k : {3, 17, 129}) {
            for (bool tb : {false, true}) {
              GemmEngineTester()
                  .precision(p)
                  .m(m)
                  .width(width)
                  .blocks(blocks)
                  .k(k)
                  .trans_b(tb)
                  .beta(tb ? 1.0f : 0.0f)
                  .threads(threads)
                  .in_place(true)
                  .seed(++seed)
                  .TestStep();
              if (HasFatalFailure()) return;
            }
          }
        }
      }
    }
  }
}

// Weights large enough for the bf16 engine's steps to run in bf16, both layouts.
TEST_P(GemmEngineSweep, LargeStepProducts) {
  for (bool tb : {false, true}) {
    for (int threads : {1, 2, 3}) {
      GemmEngineTester()
          .precision(GetParam())
          .m(33)
          .width(129)
          .blocks(4)
          .k(129)
          .trans_b(tb)
          .threads(threads)
          .iterations(2)
          .seed(900 + threads)
          .TestStep();
      if (HasFatalFailure()) return;
    }
  }
}

// A thread's gate blocks as one step_blocks() call (one oneDNN product of
// its columns of every block), against the plain GEMM: the core's engines
// and oneDNN for everything, odd sizes, both layouts, 1-4 threads.
TEST_P(GemmEngineSweep, GroupedStepBlocksOverThreadSplits) {
  uint64_t seed = 7000;
  for (bool onednn : {false, true}) {
    if (onednn && GetParam() == Precision::int8) continue;
    for (int threads : {1, 2, 3, 4}) {
      for (int64_t width : {17, 33, 129}) {
        for (int64_t m : {1, 17}) {
          for (bool tb : {false, true}) {
            for (float beta : {0.0f, 1.0f}) {
              GemmEngineTester()
                  .precision(GetParam())
                  .onednn(onednn)
                  .grouped(true)
                  .m(m)
                  .width(width)
                  .blocks(4)
                  .k(33)
                  .trans_b(tb)
                  .beta(beta)
                  .threads(threads)
                  .seed(++seed)
                  .TestStep();
              if (HasFatalFailure()) return;
            }
          }
        }
      }
    }
  }
}

// Step ranges of 16 columns over a long reduction, as test_rnn_threads'
// bf16 cases make them (the backward's dG·W_hh: k = 4H = 512, R = 128 over 8
// threads; a projection's 96 columns).
TEST_P(GemmEngineSweep, NarrowStepRangesOverALongReduction) {
  uint64_t seed = 9000;
  for (int64_t k : {128, 512}) {
    for (int64_t width : {96, 128}) {
      for (int64_t m : {1, 3, 8, 33}) {
        for (int threads : {4, 6, 8}) {
          for (float beta : {0.0f, 1.0f}) {
            GemmEngineTester()
                .precision(GetParam())
                .m(m)
                .width(width)
                .blocks(1)
                .k(k)
                .trans_b(false)
                .beta(beta)
                .threads(threads)
                .seed(++seed)
                .TestStep();
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

// One range read by every thread (a row split), at every thread count from
// 1 to 8 in turn, as a process whose thread count changes runs it: each
// thread laid out or read W_hh with the blocked layout oneDNN picked for the
// thread count it saw, so from 3 threads on (AVX512-BF16 and AMX) the rows
// read garbage, until the layout went with the operand (gemm_onednn.cpp).
TEST_P(GemmEngineSweep, OneRangeAtEveryThreadCount) {
  for (bool tb : {false, true}) {
    for (int threads = 1; threads <= 8; ++threads) {
      GemmEngineTester()
          .precision(GetParam())
          .m(37)
          .width(512)
          .blocks(1)
          .k(128)
          .trans_b(tb)
          .threads(threads)
          .seed(9500 + static_cast<uint64_t>(threads))
          .TestStep();
      if (HasFatalFailure()) return;
    }
  }
}

// A whole-batch product large enough to be split by columns as well as rows
// (the int8 engine keeps a thread's share of B within half a core's L2), at
// several thread counts, against the reference.
TEST_P(GemmEngineSweep, WholeBatchProductsSplitOverThreads) {
  const int before = omp_get_max_threads();
  for (int threads : {1, 3, 16}) {
    omp_set_num_threads(threads);
    GemmEngineTester()
        .precision(GetParam())
        .m(200)
        .n(1100)
        .k(300)
        .bias(true)
        .seed(40 + threads)
        .TestGemm();
    GemmEngineTester()
        .precision(GetParam())
        .m(97)
        .n(2048)
        .k(512)
        .beta(1)
        .seed(60 + threads)
        .TestGemm();
    if (HasFatalFailure()) break;
  }
  omp_set_num_threads(before);
}

INSTANTIATE_TEST_SUITE_P(Engines, GemmEngineSweep,
                         ::testing::Values(Precision::fp32, Precision::bf16, Precision::int8),
                         [](const ::testing::TestParamInfo<Precision>& info) {
                           return std::string(precision_name(info.param));
                         });

}  // namespace
}  // namespace seqpack::testing
