// `seqpack demo` runs and prints the hand-worked packing values, and LSTM
// results equal to the plain reference implementation's for the same weights.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>
#include <vector>

#include "reference/rnn_reference.h"
#include "seqpack/rnn.h"

namespace seqpack {
namespace {

struct DemoRun {
  int status;
  std::string out;
};

DemoRun run_demo(const std::string& args) {
  const std::string cmd = std::string(SEQPACK_CLI_PATH) + " demo " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return {-1, ""};
  std::string out;
  std::array<char, 4096> buf;
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  return {pclose(pipe), out};
}

const DemoRun& demo() {
  static const DemoRun r = run_demo("");
  return r;
}

void expect_contains(const std::string& out, const std::string& needle) {
  EXPECT_NE(out.find(needle), std::string::npos) << "output lacks \"" << needle << "\":\n" << out;
}

TEST(CliDemo, PrintsThePackingWalkthrough) {
  const DemoRun& r = demo();
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* s : {
           // The padded batch, one sequence per row.
           "a [1, 2, 3, 0]", "b [4, 5, 0, 0]", "c [6, 7, 8, 9]",
           // The packed sequence (hand-worked: see tests/test_packing.cpp).
           "data             = 6, 1, 4, 7, 2, 5, 8, 3, 9",
           "batch_sizes      = 3, 3, 2, 1", "sorted_indices   = 2, 0, 1",
           "unsorted_indices = 1, 2, 0",
           "PackedSequence(data=tensor([6., 1., 4., 7., 2., 5., 8., 3., 9.]), "
           "batch_sizes=tensor([3, 3, 2, 1]), sorted_indices=tensor([2, 0, 1]), "
           "unsorted_indices=tensor([1, 2, 0]))",
           // Reading step by step.
           "step 0: rows 0-2  = [6, 1, 4]  = step 0 of sequences c, a, b",
           "step 2: rows 6-7  = [8, 3]  = step 2 of sequences c, a",
           "step 3: row 8     = [9]  = step 3 of sequences c",
           // Unpacked, and the saving.
           "lengths = 3, 2, 4", "12 steps", "9 rows", "25% saved"}) {
    expect_contains(r.out, s);
  }
}

std::string row(const Tensor& t, int64_t begin, int64_t n) {
  std::string s = "[";
  for (int64_t i = begin; i < begin + n; ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4f", t.item_as_double(i));
    s += (i > begin ? ", " : "") + std::string(buf);
  }
  return s + "]";
}

TEST(CliDemo, LstmMatchesTheReference) {
  const DemoRun& r = demo();
  ASSERT_EQ(r.status, 0) << r.out;
  // The demo's LSTM: seed 0 weights, x = [[1,1],...,[5,5]], y = [[10,10],[20,20]].
  RNNOptions opts{.mode = RNNMode::lstm, .input_size = 2, .hidden_size = 3};
  LSTM lstm(opts, /*seed=*/0);
  const std::vector<Tensor> seqs = {
      Tensor::from_vector<float>({1, 1, 2, 2, 3, 3, 4, 4, 5, 5}, {5, 2}),
      Tensor::from_vector<float>({10, 10, 20, 20}, {2, 2})};
  const RNNReferenceResult ref =
      rnn_reference_forward(lstm.options(), lstm.parameters(), seqs, Tensor(), Tensor());
  expect_contains(r.out, "x " + row(ref.h_n, 0, 3));
  expect_contains(r.out, "y " + row(ref.h_n, 3, 3));
  expect_contains(r.out, "x " + row(ref.c_n, 0, 3));
  expect_contains(r.out, "y " + row(ref.c_n, 3, 3));
  expect_contains(r.out, "x4 " + row(ref.outputs[0], 12, 3));
  expect_contains(r.out, "y1 " + row(ref.outputs[1], 3, 3));
  expect_contains(r.out, "lengths = 5, 2");
  // y's padded steps in the unpacked output are zeros.
  expect_contains(r.out, "[0.0000, 0.0000, 0.0000]");
}

TEST(CliDemo, AnotherSeedChangesOnlyTheLstm) {
  const DemoRun other = run_demo("--seed 7");
  ASSERT_EQ(other.status, 0) << other.out;
  expect_contains(other.out, "data             = 6, 1, 4, 7, 2, 5, 8, 3, 9");
  const std::size_t lstm_at = other.out.find("6. An LSTM");
  ASSERT_NE(lstm_at, std::string::npos);
  EXPECT_EQ(other.out.substr(0, lstm_at), demo().out.substr(0, lstm_at));
  EXPECT_NE(other.out.substr(lstm_at), demo().out.substr(lstm_at));
}

}  // namespace
}  // namespace seqpack
