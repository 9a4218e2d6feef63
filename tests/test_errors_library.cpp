// Every rejected input of the packing utilities and the recurrent layers, with
// the message it gives: the tests behind the table in docs/errors.md. Each
// check asserts std::invalid_argument and that the message names the value.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "seqpack/packed_sequence.h"
#include "seqpack/rnn.h"
#include "test_util.h"

namespace seqpack {
namespace {

#define EXPECT_REJECTS(expr, needle)                                                        \
  do {                                                                                      \
    try {                                                                                   \
      (void)(expr);                                                                         \
      ADD_FAILURE() << #expr << " did not throw std::invalid_argument";                     \
    } catch (const std::invalid_argument& e_) {                                             \
      EXPECT_NE(std::string(e_.what()).find(needle), std::string::npos)                     \
          << "message '" << e_.what() << "' does not contain '" << (needle) << "'";         \
    }                                                                                       \
  } while (0)

Tensor f32(Shape s) { return Tensor::zeros(std::move(s), DType::f32); }
Tensor i64(std::vector<int64_t> v) { return Tensor::from_vector(v); }

// ---------------------------------------------------------------------------
// Packing

TEST(ErrorsPacking, LengthsCountDiffersFromBatch) {
  EXPECT_REJECTS(pack_padded_sequence(f32({3, 4, 1}), {3, 2}),
                 "got 2 lengths but the input of shape [3, 4, 1] has batch size 4");
  EXPECT_REJECTS(unpad_sequence(f32({3, 4, 1}), {3, 2, 1}), "got 3 lengths");
}

TEST(ErrorsPacking, LengthExceedsPaddedLength) {
  EXPECT_REJECTS(pack_padded_sequence(f32({5, 4}), {5, 5, 7, 1}),
                 "lengths[2] = 7 exceeds the padded length 5");
  EXPECT_REJECTS(pack_padded_sequence(f32({4, 5}), {7, 1, 1, 1}, /*batch_first=*/true),
                 "lengths[0] = 7 exceeds the padded length 5");
}

TEST(ErrorsPacking, NegativeLength) {
  EXPECT_REJECTS(pack_padded_sequence(f32({3, 2}), {3, -1}), "lengths[1] = -1 is negative");
  EXPECT_REJECTS(PackingPlan::from_lengths({2, -3}, false), "lengths[1] = -3 is negative");
}

TEST(ErrorsPacking, UnsortedLengthsWithEnforceSorted) {
  EXPECT_REJECTS(pack_padded_sequence(f32({3, 3}), {1, 3, 2}),
                 "lengths[1] = 3 is greater than lengths[0] = 1");
  EXPECT_REJECTS(pack_padded_sequence(f32({3, 3}), {1, 3, 2}), "enforce_sorted=false");
  EXPECT_REJECTS(pack_sequence({f32({1, 2}), f32({2, 2})}), "enforce_sorted=false");
}

TEST(ErrorsPacking, LengthsTensorNotOneDimensionalOrFractional) {
  EXPECT_REJECTS(pack_padded_sequence(f32({3, 2}), Tensor::zeros({2, 1}, DType::i64)),
                 "lengths must be a 1-D tensor, got shape [2, 1]");
  EXPECT_REJECTS(pack_padded_sequence(f32({3, 2}), Tensor::from_vector<double>({2.5, 1.0})),
                 "lengths[0] = 2.5 is not a whole number");
}

TEST(ErrorsPacking, TotalLengthShorterThanLongest) {
  const PackedSequence p = pack_sequence({f32({3, 1}), f32({2, 1})});
  EXPECT_REJECTS(pad_packed_sequence(p, false, 0.0, 2),
                 "total_length = 2 is less than the longest sequence length 3");
}

TEST(ErrorsPacking, SequencesDifferInTrailingShapeOrDtype) {
  EXPECT_REJECTS(pad_sequence({f32({2, 2}), f32({2, 3})}),
                 "sequences[1] has shape [2, 3] (trailing [3]) but sequences[0] has [2, 2]");
  EXPECT_REJECTS(pack_sequence({f32({2, 2}), Tensor::zeros({1, 2}, DType::f64)}),
                 "sequences[1] has dtype float64 but sequences[0] has dtype float32");
}

TEST(ErrorsPacking, EmptyOrUndefinedOrScalarSequences) {
  EXPECT_REJECTS(pad_sequence({}), "pad_sequence: received an empty list of sequences");
  EXPECT_REJECTS(pack_sequence({}), "pack_sequence: received an empty list of sequences");
  EXPECT_REJECTS(pad_sequence({f32({2}), Tensor()}), "sequences[1] is undefined");
  EXPECT_REJECTS(pad_sequence({f32({})}), "a sequence needs at least 1 dimension (time)");
}

TEST(ErrorsPacking, InputWithTooFewDimensions) {
  EXPECT_REJECTS(pack_padded_sequence(f32({3}), {3}),
                 "input must have at least 2 dimensions (time and batch), got shape [3]");
  EXPECT_REJECTS(unpad_sequence(f32({3}), {3}), "at least 2 dimensions");
  EXPECT_REJECTS(pack_padded_sequence(Tensor(), std::vector<int64_t>{}), "input is undefined");
  EXPECT_REJECTS(transpose01(f32({3})), "transpose01: needs at least 2 dimensions, got shape [3]");
}

TEST(ErrorsPacking, PaddingValueTheDtypeCannotHold) {
  const std::vector<Tensor> ints = {i64({1, 2}), i64({3})};
  EXPECT_REJECTS(pad_sequence(ints, false, std::nan("")), "value nan cannot be converted to int64");
  EXPECT_REJECTS(pad_packed_sequence(pack_sequence(ints), false, 1e300),
                 "value 1e+300 cannot be converted to int64");
  EXPECT_REJECTS(pad_sequence({f32({2})}, false, -1e300), "cannot be converted to float32");
}

PackedSequence hand_built(std::vector<int64_t> batch_sizes, int64_t rows) {
  PackedSequence p;
  p.data = f32({rows, 1});
  p.batch_sizes = i64(std::move(batch_sizes));
  return p;
}

TEST(ErrorsPacking, HandBuiltBatchSizesIncrease) {
  EXPECT_REJECTS(pad_packed_sequence(hand_built({2, 3}, 5)),
                 "batch_sizes[1] = 3 is greater than batch_sizes[0] = 2");
}

TEST(ErrorsPacking, HandBuiltBatchSizesNotPositive) {
  EXPECT_REJECTS(pad_packed_sequence(hand_built({2, 0}, 2)), "batch_sizes[1] = 0 must be positive");
}

TEST(ErrorsPacking, HandBuiltBatchSizesDoNotAddUpToRows) {
  EXPECT_REJECTS(pad_packed_sequence(hand_built({2, 2}, 5)),
                 "batch_sizes add up to 4 rows but data has 5 rows");
}

TEST(ErrorsPacking, HandBuiltBatchSizesNotInt64Vector) {
  PackedSequence p = hand_built({2}, 2);
  p.batch_sizes = f32({1});
  EXPECT_REJECTS(pad_packed_sequence(p), "batch_sizes must be a 1-D int64 tensor, got float32");
  p.batch_sizes = Tensor();
  EXPECT_REJECTS(pad_packed_sequence(p), "batch_sizes is undefined");
  p = hand_built({1}, 1);
  p.data = Tensor();
  EXPECT_REJECTS(pad_packed_sequence(p), "data is undefined");
}

TEST(ErrorsPacking, HandBuiltIndicesNotAPermutation) {
  PackedSequence p = hand_built({3, 1}, 4);
  p.sorted_indices = i64({0, 0, 2});
  p.unsorted_indices = i64({0, 1, 2});
  EXPECT_REJECTS(pad_packed_sequence(p), "sorted_indices[1] = 0 repeats sorted_indices[0]");
  p.sorted_indices = i64({0, 5, 1});
  EXPECT_REJECTS(pad_packed_sequence(p), "sorted_indices[1] = 5 is out of range [0, 3)");
  p.sorted_indices = i64({1, 2, 0});
  p.unsorted_indices = i64({1, 2, 0});
  EXPECT_REJECTS(pad_packed_sequence(p), "unsorted_indices is not the inverse of sorted_indices");
  p.unsorted_indices = Tensor();
  EXPECT_REJECTS(pad_packed_sequence(p), "sorted_indices is given but unsorted_indices is not");
  p.sorted_indices = i64({0, 1});
  p.unsorted_indices = i64({0, 1});
  EXPECT_REJECTS(pad_packed_sequence(p), "sorted_indices has 2 entries but batch_sizes[0] = 3");
  EXPECT_REJECTS(invert_permutation(i64({1, 1})), "permutation[1] = 1 repeats permutation[0]");
}

TEST(ErrorsPacking, BackwardGradientOfTheWrongShape) {
  const PackingPlan plan = PackingPlan::from_lengths({3, 1}, true);
  EXPECT_REJECTS(pack_padded_sequence_backward(f32({5, 2}), plan, 3, false),
                 "packed rows of shape [5, 2] do not match the plan's 4 rows");
  EXPECT_REJECTS(pack_padded_sequence_backward(f32({4, 2}), plan, 2, false),
                 "padded_length = 2 is less than the longest sequence length 3");
  EXPECT_REJECTS(pad_packed_sequence_backward(f32({3, 3, 2}), plan, false),
                 "has batch size 3 but there are 2 lengths");
}

// ---------------------------------------------------------------------------
// Recurrent layers: options

RNNOptions lstm(int64_t in = 2, int64_t hidden = 3) {
  RNNOptions o;
  o.mode = RNNMode::lstm;
  o.input_size = in;
  o.hidden_size = hidden;
  return o;
}

TEST(ErrorsRNNOptions, NonPositiveSizes) {
  EXPECT_REJECTS(lstm(0, 3).validate(), "input_size must be positive, got 0");
  EXPECT_REJECTS(lstm(2, -1).validate(), "hidden_size must be positive, got -1");
  RNNOptions o = lstm();
  o.num_layers = 0;
  EXPECT_REJECTS(o.validate(), "num_layers must be positive, got 0");
  EXPECT_REJECTS(LSTM(lstm(-2, 3)), "input_size must be positive, got -2");
}

TEST(ErrorsRNNOptions, DropoutOutsideZeroOne) {
  RNNOptions o = lstm();
  o.dropout = 1.0;
  EXPECT_REJECTS(o.validate(), "dropout must be in [0, 1), got 1");
  o.dropout = -0.5;
  EXPECT_REJECTS(o.validate(), "got -0.5");
  o.dropout = std::nan("");
  EXPECT_REJECTS(o.validate(), "dropout must be in [0, 1)");
}

TEST(ErrorsRNNOptions, ProjSize) {
  RNNOptions o = lstm(2, 3);
  o.proj_size = 3;
  EXPECT_REJECTS(o.validate(), "proj_size = 3 must be smaller than hidden_size = 3");
  o.proj_size = -1;
  EXPECT_REJECTS(o.validate(), "proj_size must be non-negative, got -1");
  o.proj_size = 2;
  o.mode = RNNMode::gru;
  EXPECT_REJECTS(o.validate(), "proj_size = 2 is only supported for LSTM, not gru");
}

TEST(ErrorsRNNOptions, DtypeModeAndNonlinearity) {
  RNNOptions o = lstm();
  o.dtype = DType::i64;
  EXPECT_REJECTS(o.validate(), "dtype must be float32 or float64, got int64");
  EXPECT_REJECTS(parse_rnn_mode("lstmm"), "unknown RNN mode 'lstmm'");
  EXPECT_REJECTS(RNN(lstm()), "RNN needs mode rnn_tanh or rnn_relu, got lstm");
  EXPECT_REJECTS(RNNCell(2, 3, true, "sigmoid"), "unknown nonlinearity 'sigmoid'");
}

// ---------------------------------------------------------------------------
// Recurrent layers: inputs

TEST(ErrorsRNNInputs, InputFeatureSizeDiffersFromInputSize) {
  LSTM m(lstm(2, 3));
  EXPECT_REJECTS(m.forward(f32({4, 1, 5})), "input has 5 features, expected input_size = 2");
  EXPECT_REJECTS(m.forward(pack_sequence({f32({2, 5})})), "input has 5 features, expected input_size = 2");
  LSTMCell cell(2, 3);
  EXPECT_REJECTS(cell.forward(f32({1, 5})), "input has 5 features, expected input_size = 2");
}

TEST(ErrorsRNNInputs, InputWithWrongDimensionsOrDtype) {
  LSTM m(lstm(2, 3));
  EXPECT_REJECTS(m.forward(f32({2})), "RNN input must be 2-D (unbatched) or 3-D, got shape [2]");
  EXPECT_REJECTS(m.forward(f32({1, 1, 1, 2})), "got shape [1, 1, 1, 2]");
  EXPECT_REJECTS(m.forward(Tensor::zeros({3, 1, 2}, DType::f64)),
                 "input has dtype float64 but the module's parameters are float32");
  LSTMCell cell(2, 3);
  EXPECT_REJECTS(cell.forward(f32({1, 1, 2})), "cell input must be 1-D or 2-D, got shape [1, 1, 2]");
}

TEST(ErrorsRNNInputs, InitialStateOfTheWrongShape) {
  LSTM m(lstm(2, 3));
  EXPECT_REJECTS(m.forward(f32({4, 2, 2}), f32({1, 2, 4})), "h0 has shape [1, 2, 4], expected [1, 2, 3]");
  EXPECT_REJECTS(m.forward(f32({4, 2, 2}), Tensor(), f32({2, 2, 3})),
                 "c0 has shape [2, 2, 3], expected [1, 2, 3]");
  RNNOptions g = lstm(2, 3);
  g.mode = RNNMode::gru;
  GRU gru(g);
  EXPECT_REJECTS(gru.forward(f32({4, 2, 2}), Tensor(), f32({1, 2, 3})), "c0 is only used by LSTM, not gru");
  GRUCell cell(2, 3);
  EXPECT_REJECTS(cell.forward(f32({2, 2}), f32({2, 4})), "has shape [2, 4], expected [2, 3]");
  EXPECT_REJECTS(cell.forward(f32({2, 2}), Tensor(), f32({2, 3})), "cx is only accepted by LSTMCell");
}

TEST(ErrorsRNNInputs, LengthsOfAPaddedBatch) {
  LSTM m(lstm(2, 3));
  EXPECT_REJECTS(m.forward(f32({4, 2, 2}), std::vector<int64_t>{4}), "got 1 lengths for a batch of 2");
  EXPECT_REJECTS(m.forward(f32({4, 2, 2}), std::vector<int64_t>{4, 5}),
                 "lengths[1] = 5 is outside [0, 4], the padded length");
  EXPECT_REJECTS(m.forward(f32({4, 2, 2}), std::vector<int64_t>{-1, 2}), "lengths[0] = -1 is outside [0, 4]");
}

TEST(ErrorsRNNInputs, BackwardMisuse) {
  LSTM m(lstm(2, 3));
  const RNNOutput no_grad = m.forward(f32({4, 1, 2}), Tensor(), Tensor(), /*requires_grad=*/false);
  EXPECT_REJECTS(m.backward(no_grad, f32({4, 1, 3})), "backward: the forward ran without requires_grad");
  const RNNOutput y = m.forward(f32({4, 1, 2}));
  EXPECT_REJECTS(m.backward(y, f32({4, 1, 4})), "grad_output has shape [4, 1, 4], expected the output's shape [4, 1, 3]");
}

TEST(ErrorsRNNInputs, StateDictAndParameterNames) {
  LSTM m(lstm(2, 3));
  auto sd = m.state_dict();
  sd.erase("bias_hh_l0");
  EXPECT_REJECTS(m.load_state_dict(sd), "missing key 'bias_hh_l0'");
  sd = m.state_dict();
  sd["weight_hr_l0"] = f32({1, 3});
  EXPECT_REJECTS(m.load_state_dict(sd), "unexpected key 'weight_hr_l0'");
  sd = m.state_dict();
  sd["weight_hh_l0"] = f32({12, 4});
  EXPECT_REJECTS(m.load_state_dict(sd), "'weight_hh_l0' has shape [12, 4], expected [12, 3]");
  EXPECT_REJECTS(m.parameter("weight_xx"), "unknown parameter 'weight_xx'");
}

TEST(ErrorsRNNInputs, FunctionalWeightsAndPackedRows) {
  const RNNOptions o = lstm(2, 3);
  const PackingPlan plan = PackingPlan::from_lengths({2}, true);
  std::vector<Tensor> w;
  for (const Shape& s : rnn_parameter_shapes(o)) w.push_back(f32(s));
  EXPECT_REJECTS(
      rnn_forward(*rnn_make_plan(o, {w[0]}, /*in_place=*/true, seqpack::testing::config()),
                  f32({2, 2}), plan, {}, {}, false, false),
      "expected 4 weight tensors for these options, got 1");
  std::vector<Tensor> bad = w;
  bad[1] = f32({12, 4});
  EXPECT_REJECTS(rnn_forward(*rnn_make_plan(o, bad, /*in_place=*/true, seqpack::testing::config()),
                             f32({2, 2}), plan, {}, {}, false, false),
                 "weight_hh_l0 has shape [12, 4], expected [12, 3]");
  EXPECT_REJECTS(rnn_forward(*rnn_make_plan(o, w, /*in_place=*/true, seqpack::testing::config()),
                             f32({3, 2}), plan, {}, {}, false, false),
                 "packed input has 3 rows but the batch sizes sum to 2");
  EXPECT_REJECTS(rnn_forward(*rnn_make_plan(o, w, /*in_place=*/true, seqpack::testing::config()),
                             f32({2}), plan, {}, {}, false, false),
                 "packed input must be 2-D [rows, input_size], got shape [2]");
}

}  // namespace
}  // namespace seqpack
