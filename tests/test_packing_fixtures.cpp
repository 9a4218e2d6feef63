// Packing against PyTorch 1.13: tests/fixtures/packing.json, written by
// tests/fixtures/gen_packing.py over a grid of cases. Packing only moves values,
// so every comparison is exact (tolerance 0).
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "seqpack/packed_sequence.h"
#include "test_util.h"

namespace seqpack {
namespace {

using nlohmann::json;
using testing::all_close;
using testing::tensor_from_json;

const json& fixture() {
  static const json doc = testing::load_fixture("packing.json");
  return doc;
}

DType parse_dtype(const std::string& s) {
  if (s == "float32") return DType::f32;
  if (s == "float64") return DType::f64;
  return DType::i64;
}

Tensor opt_tensor(const json& j, DType dtype) {
  return j.is_null() ? Tensor() : tensor_from_json(j, dtype);
}

PackedSequence packed_from_json(const json& j, DType dtype) {
  PackedSequence p;
  p.data = tensor_from_json(j.at("data"), dtype);
  p.batch_sizes = tensor_from_json(j.at("batch_sizes"), DType::i64);
  p.sorted_indices = opt_tensor(j.at("sorted_indices"), DType::i64);
  p.unsorted_indices = opt_tensor(j.at("unsorted_indices"), DType::i64);
  return p;
}

void expect_same(const Tensor& got, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(got.defined(), expected.defined()) << what << ": defined";
  if (!expected.defined()) return;
  EXPECT_EQ(got.dtype(), expected.dtype()) << what;
  EXPECT_TRUE(all_close(got, expected, 0.0, 0.0, what));
}

void expect_packed(const PackedSequence& got, const json& expected, DType dtype,
                   const std::string& what) {
  const PackedSequence e = packed_from_json(expected, dtype);
  expect_same(got.data, e.data, what + ".data");
  expect_same(got.batch_sizes, e.batch_sizes, what + ".batch_sizes");
  expect_same(got.sorted_indices, e.sorted_indices, what + ".sorted_indices");
  expect_same(got.unsorted_indices, e.unsorted_indices, what + ".unsorted_indices");
}

void expect_list(const std::vector<Tensor>& got, const json& expected, DType dtype,
                 const std::string& what) {
  ASSERT_EQ(got.size(), expected.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    expect_same(got[i], tensor_from_json(expected[i], dtype), what + "[" + std::to_string(i) + "]");
  }
}

class PackingFixture : public ::testing::TestWithParam<std::size_t> {};

TEST_P(PackingFixture, MatchesPyTorch) {
  const json& c = fixture().at("cases").at(GetParam());
  const std::string name = c.at("name");
  SCOPED_TRACE("case " + name);
  const DType dtype = parse_dtype(c.at("dtype"));
  const auto lengths = c.at("lengths").get<std::vector<int64_t>>();
  const double pv = c.at("padding_value");
  const bool enforce_sorted = c.at("enforce_sorted");
  const bool stable = c.at("torch_order_is_stable");
  std::optional<int64_t> total_length;
  if (!c.at("total_length").is_null()) total_length = c.at("total_length").get<int64_t>();

  std::vector<Tensor> seqs;
  for (const auto& s : c.at("sequences")) seqs.push_back(tensor_from_json(s, dtype));
  const PackedSequence torch_packed = packed_from_json(c.at("pack_sequence_unsorted"), dtype);

  if (stable || enforce_sorted) {
    expect_packed(pack_sequence(seqs, enforce_sorted), c.at("pack_sequence"), dtype,
                  "pack_sequence");
  }

  const PackedSequence ours = pack_sequence(seqs, /*enforce_sorted=*/false);
  if (stable) {
    expect_packed(ours, c.at("pack_sequence_unsorted"), dtype, "pack_sequence(unsorted)");
  } else {
    // PyTorch's sort broke ties in another order; ours is the stable one, and
    // everything but the order of tied rows agrees.
    expect_same(ours.batch_sizes, torch_packed.batch_sizes, "batch_sizes");
    EXPECT_EQ(ours.sorted_indices.to_vector<int64_t>(),
              c.at("stable_sorted_indices").get<std::vector<int64_t>>());
    EXPECT_NE(ours.sorted_indices.to_vector<int64_t>(),
              torch_packed.sorted_indices.to_vector<int64_t>())
        << "PyTorch's order now agrees: set the case's expectation to stable";
  }
  expect_same(invert_permutation(torch_packed.sorted_indices),
              tensor_from_json(c.at("invert_permutation"), DType::i64), "invert_permutation");
  expect_list(unpack_sequence(torch_packed), c.at("unpack_sequence"), dtype, "unpack_sequence");
  expect_list(unpack_sequence(ours), c.at("unpack_sequence"), dtype, "unpack_sequence(ours)");

  for (bool bf : {false, true}) {
    SCOPED_TRACE(bf ? "batch_first" : "time_major");
    const json& r = c.at(bf ? "batch_first" : "time_major");
    expect_same(pad_sequence(seqs, bf, pv), tensor_from_json(r.at("pad_sequence"), dtype),
                "pad_sequence");
    expect_same(pad_sequence(seqs, bf, pv, PaddingSide::left),
                tensor_from_json(r.at("pad_sequence_left"), dtype), "pad_sequence(left)");
    const Tensor padded = pad_sequence(seqs, bf);
    if (stable || enforce_sorted) {
      expect_packed(pack_padded_sequence(padded, lengths, bf, enforce_sorted),
                    r.at("pack_padded_sequence"), dtype, "pack_padded_sequence");
    }
    if (stable) {
      expect_packed(pack_padded_sequence(padded, Tensor::from_vector(lengths), bf,
                                         /*enforce_sorted=*/false),
                    r.at("pack_padded_sequence_unsorted"), dtype,
                    "pack_padded_sequence(tensor lengths, unsorted)");
    }
    const json& pp = r.at("pad_packed_sequence");
    for (const PackedSequence* p : {&torch_packed, &ours}) {
      auto [out, out_lengths] = pad_packed_sequence(*p, bf, pv, total_length);
      expect_same(out, tensor_from_json(pp.at("padded"), dtype), "pad_packed_sequence.padded");
      expect_same(out_lengths, tensor_from_json(pp.at("lengths"), DType::i64),
                  "pad_packed_sequence.lengths");
    }
    const Tensor before = padded.clone();
    expect_list(unpad_sequence(padded, lengths, bf), r.at("unpad_sequence"), dtype,
                "unpad_sequence");
    expect_same(padded, before, "unpad_sequence leaves its input alone");

    if (dtype == DType::i64) continue;
    // Gradients (float64 in the fixture), through the plan of PyTorch's packing.
    const PackingPlan plan = PackingPlan::from_packed(torch_packed);
    const json& gp = r.at("grad_pack");
    const Tensor grad_data = tensor_from_json(gp.at("grad_data"), DType::f64);
    expect_same(pack_padded_sequence_backward(grad_data, plan, padded.size(bf ? 1 : 0), bf),
                tensor_from_json(gp.at("grad_input"), DType::f64), "pack_padded_sequence_backward");
    const json& gd = r.at("grad_pad");
    expect_same(pad_packed_sequence_backward(tensor_from_json(gd.at("grad_padded"), DType::f64),
                                             plan, bf),
                tensor_from_json(gd.at("grad_data"), DType::f64), "pad_packed_sequence_backward");
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, PackingFixture,
                         ::testing::Range<std::size_t>(0, fixture().at("cases").size()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           return fixture().at("cases").at(info.param).at("name").get<std::string>();
                         });

TEST(PackingFixtureRepr, MatchesPyTorchRepr) {
  for (const auto& r : fixture().at("reprs")) {
    std::vector<Tensor> seqs;
    for (const auto& s : r.at("sequences")) seqs.push_back(tensor_from_json(s, DType::f32));
    EXPECT_EQ(pack_sequence(seqs, r.at("enforce_sorted").get<bool>()).to_string(),
              r.at("repr").get<std::string>());
  }
}

TEST(PackingFixtureMeta, SomeCaseShowsPyTorchUnstableTies) {
  // Guards the grid: the unstable-tie path above must be exercised.
  bool any = false;
  for (const auto& c : fixture().at("cases")) any |= !c.at("torch_order_is_stable").get<bool>();
  EXPECT_TRUE(any);
}

}  // namespace
}  // namespace seqpack
