#include <gtest/gtest.h>

#include <sstream>
#include <stdexcept>

#include "seqpack/tensor.h"

using seqpack::DType;
using seqpack::Tensor;

TEST(Tensor, ZerosHasShapeAndZeroValues) {
  Tensor t = Tensor::zeros({2, 3}, DType::f32);
  EXPECT_EQ(t.dim(), 2);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 3);
  EXPECT_EQ(t.numel(), 6);
  for (float v : t.to_vector<float>()) EXPECT_EQ(v, 0.f);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor rows = t.slice0(1, 3);
  EXPECT_EQ(rows.shape(), (seqpack::Shape{2, 2}));
  EXPECT_EQ(rows.to_vector<double>(), (std::vector<double>{3, 4, 5, 6}));
  rows.data<double>()[0] = 30;
  EXPECT_EQ(t.data<double>()[2], 30);
  Tensor row = t.select0(2);
  EXPECT_EQ(row.shape(), (seqpack::Shape{2}));
  EXPECT_EQ(row.to_vector<double>(), (std::vector<double>{5, 6}));
  Tensor flat = t.view({6});
  EXPECT_TRUE(flat.shares_storage_with(t));
  Tensor copy = t.clone();
  copy.data<double>()[0] = -1;
  EXPECT_EQ(t.data<double>()[0], 1);
}

TEST(Tensor, DtypeMismatchThrowsNamingBoth) {
  Tensor t = Tensor::zeros({2}, DType::i64);
  try {
    t.data<float>();
    FAIL() << "expected an exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("int64"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("float32"), std::string::npos) << e.what();
  }
}

TEST(Tensor, BadShapesThrowNamingTheValue) {
  try {
    Tensor::zeros({2, -3}, DType::f32);
    FAIL() << "expected an exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("-3"), std::string::npos) << e.what();
  }
  Tensor t = Tensor::zeros({4, 2}, DType::f32);
  EXPECT_THROW(t.view({3, 3}), std::invalid_argument);
  EXPECT_THROW(t.slice0(2, 5), std::out_of_range);
  EXPECT_THROW(t.size(2), std::out_of_range);
  EXPECT_THROW(Tensor::from_vector<float>({1, 2, 3}, {2, 2}), std::invalid_argument);
}

TEST(Tensor, ConvertsAndPrintsLikePyTorch) {
  Tensor t = Tensor::from_vector<int64_t>({1, 2, 3, 4}, {2, 2});
  Tensor f = t.to(DType::f32);
  EXPECT_EQ(f.to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(t.to_string(), "tensor([[1, 2],\n        [3, 4]])");
  EXPECT_EQ(Tensor::from_vector<float>({6, 1, 4}).to_string(), "tensor([6., 1., 4.])");
  EXPECT_FALSE(Tensor().defined());
  EXPECT_TRUE(Tensor::zeros({0, 3}, DType::f32).defined());
}

// LibTorch users write Tensor::zeros({5, 2}) and std::cout << t: float32 by
// default, printed as torch prints it (torch.zeros(2, 2) and torch.full((1, 2), 0.5)).
TEST(TensorLibTorchHabits, FactoriesDefaultToFloat32AndStreamPrintsTheRepr) {
  EXPECT_EQ(seqpack::Tensor::zeros({5, 2}).dtype(), seqpack::DType::f32);
  EXPECT_EQ(seqpack::Tensor::full({5, 2}, 1.0).dtype(), seqpack::DType::f32);
  EXPECT_EQ(seqpack::Tensor::empty({5, 2}).dtype(), seqpack::DType::f32);
  std::ostringstream s;
  s << seqpack::Tensor::zeros({2, 2}) << "|" << seqpack::Tensor::full({1, 2}, 0.5);
  EXPECT_EQ(s.str(), "tensor([[0., 0.],\n        [0., 0.]])|tensor([[0.5000, 0.5000]])");
}
