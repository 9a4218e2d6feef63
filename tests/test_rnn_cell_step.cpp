// Each cell of the recurrent core (src/rnn/cell_lstm.h, cell_gru.h,
// cell_rnn.h) alone: its forward and backward step, float32 and float64,
// against the float64 reference's row math, through CellTester
// (tests/cell_tester.h). Sweeps batch 1, hidden sizes that are not a multiple
// of the SIMD width, a row split's share of the rows, a column split's share
// of the units, rows that continue and rows that begin, saving or not, with
// and without bias.
#include <gtest/gtest.h>

#include <string>

#include "cell_tester.h"

namespace seqpack::testing {
namespace {

class CellStep : public ::testing::TestWithParam<RNNMode> {};

TEST_P(CellStep, WholeStep) {
  for (int64_t batch : {1, 3, 13}) {
    for (int64_t hidden : {1, 7, 16, 33}) {
      for (bool save : {false, true}) {
        CellTester(GetParam())
            .batch(batch)
            .hidden(hidden)
            .continuing(batch / 2)
            .save(save)
            .iterations(2)
            .seed(static_cast<uint64_t>(100 * batch + hidden))
            .Test();
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_P(CellStep, ColumnSplitShares) {
  // The units a thread of a column split owns: blocks of 16 (rnn/grid.h).
  for (const auto& [k0, k1] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 16}, {16, 48}, {32, 37}, {48, 49}}) {
    for (bool save : {false, true}) {
      CellTester(GetParam())
          .batch(5)
          .hidden(49)
          .columns(k0, k1)
          .continuing(3)
          .save(save)
          .seed(static_cast<uint64_t>(k0 * 7 + k1))
          .Test();
      if (HasFatalFailure()) return;
    }
  }
}

TEST_P(CellStep, RowSplitShares) {
  // A row split's thread: rows [a, b) of the step, some continuing, some beginning.
  for (const auto& [a, b] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 9}, {9, 11}, {3, 3}}) {
    for (bool save : {false, true}) {
      CellTester(GetParam())
          .batch(11)
          .hidden(35)
          .rows(a, b)
          .continuing(6)
          .save(save)
          .seed(static_cast<uint64_t>(a * 31 + b))
          .Test();
      if (HasFatalFailure()) return;
    }
  }
}

TEST_P(CellStep, EveryRowBeginsOrContinues) {
  for (int64_t cont : {0, 8}) {
    CellTester(GetParam()).batch(8).hidden(20).continuing(cont).save(true).seed(77 + cont).Test();
  }
}

TEST_P(CellStep, WithoutBias) {
  CellTester(GetParam()).batch(6).hidden(19).continuing(2).bias(false).save(true).seed(5).Test();
}

INSTANTIATE_TEST_SUITE_P(Cells, CellStep,
                         ::testing::Values(RNNMode::lstm, RNNMode::gru, RNNMode::rnn_tanh,
                                           RNNMode::rnn_relu),
                         [](const ::testing::TestParamInfo<RNNMode>& info) {
                           return std::string(rnn_mode_name(info.param));
                         });

}  // namespace
}  // namespace seqpack::testing
