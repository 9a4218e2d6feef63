// Tensor::to_string against the repr() PyTorch 1.13 prints for the same tensors
// (tests/fixtures/gen_tensor_repr.py): notation, column width, wrapping at 80
// columns, blank lines between blocks, summarising with "...", dtype and size suffixes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <string>

#include "seqpack/tensor.h"
#include "test_util.h"

namespace seqpack {
namespace {

DType dtype_from_name(const std::string& name) {
  if (name == "float32") return DType::f32;
  if (name == "float64") return DType::f64;
  if (name == "int64") return DType::i64;
  throw std::invalid_argument("unknown dtype " + name);
}

// Values are stored as strings (Python's repr of each element, "nan", "inf") since
// JSON has no NaN; strtod reads all of them back exactly.
Tensor tensor_from_case(const nlohmann::json& c) {
  Shape shape;
  for (const auto& s : c.at("shape")) shape.push_back(s.get<int64_t>());
  const DType dtype = dtype_from_name(c.at("dtype").get<std::string>());
  Tensor t = Tensor::empty(shape, dtype);
  const auto& values = c.at("values");
  EXPECT_EQ(static_cast<int64_t>(values.size()), t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) {
    const std::string v = values.at(static_cast<std::size_t>(i)).get<std::string>();
    switch (dtype) {
      case DType::f32:
        t.data<float>()[i] = static_cast<float>(std::strtod(v.c_str(), nullptr));
        break;
      case DType::f64:
        t.data<double>()[i] = std::strtod(v.c_str(), nullptr);
        break;
      case DType::i64:
        t.data<int64_t>()[i] = std::stoll(v);
        break;
    }
  }
  return t;
}

TEST(TensorRepr, MatchesPyTorch) {
  const nlohmann::json fixture = testing::load_fixture("tensor_repr.json");
  ASSERT_GE(fixture.at("cases").size(), 30u);
  for (const auto& c : fixture.at("cases")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    EXPECT_EQ(tensor_from_case(c).to_string(), c.at("repr").get<std::string>());
  }
}

TEST(TensorRepr, HandWorkedExamples) {
  // The layout of torch's repr, worked by hand: one column width for all elements
  // (" 1.0000" is as wide as "-2.5000"), rows aligned under "tensor([".
  EXPECT_EQ(Tensor::from_vector<float>({1, -2.5, 3, 4}, {2, 2}).to_string(),
            "tensor([[ 1.0000, -2.5000],\n        [ 3.0000,  4.0000]])");
  EXPECT_EQ(Tensor::from_vector<double>({0.5}, {}).to_string(), "tensor(0.5000, dtype=torch.float64)");
  EXPECT_EQ(Tensor::from_vector<int64_t>({-1, 10}).to_string(), "tensor([-1, 10])");
  // int64 beyond 2^53 prints exactly (not through a double).
  EXPECT_EQ(Tensor::from_vector<int64_t>({std::numeric_limits<int64_t>::max()}).to_string(),
            "tensor([9223372036854775807])");
  EXPECT_EQ(Tensor::from_vector<float>({-std::numeric_limits<float>::quiet_NaN(), 2}).to_string(),
            "tensor([nan, 2.])");
  EXPECT_EQ(Tensor().to_string(), "None");
}

}  // namespace
}  // namespace seqpack
