// seqpack::Tensor: a dense, contiguous, row-major tensor that does no maths.
//
//   Tensor x = Tensor::zeros({3, 2});                // 3 rows of 2 features, float32
//   std::cout << x;                                  // tensor([[0., 0.], ...]) as torch prints
//   x.data<float>()[1] = 5.f;                       // x[0][1] = 5
//   Tensor row = x.slice0(1, 2);                    // rows 1..2, a view sharing storage
//   Tensor flat = x.view({6});                      // same storage, another shape
//
// Storage is reference counted and shared by views; clone() makes a deep copy.
// Sizes are signed int64_t. Only the three dtypes below exist.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace seqpack {

enum class DType { f32, f64, i64 };

// Bytes per element of `dtype`.
std::size_t dtype_size(DType dtype);
// "float32", "float64" or "int64".
const char* dtype_name(DType dtype);

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}

using Shape = std::vector<int64_t>;

// "[3, 2]"
std::string shape_str(const Shape& shape);

class Tensor {
 public:
  // An undefined tensor (no storage): used for optional arguments such as h0.
  Tensor() = default;

  // Zero-filled tensor of the given shape. The dtype defaults to float32, as
  // LibTorch's factories do.
  static Tensor zeros(Shape shape, DType dtype = DType::f32);
  static Tensor full(Shape shape, double value, DType dtype = DType::f32);
  // Uninitialised storage, for outputs that are overwritten entirely.
  static Tensor empty(Shape shape, DType dtype = DType::f32);
  // Copies `values` into a new tensor of `shape` (numel must match).
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, Shape shape);
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values) {
    return from_vector(values, Shape{static_cast<int64_t>(values.size())});
  }
  // Wraps memory owned by someone else (NumPy, torch) without copying; `owner`
  // keeps it alive. The memory must be contiguous and row-major.
  static Tensor wrap(void* data, Shape shape, DType dtype, std::shared_ptr<void> owner);

  bool defined() const { return defined_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  // size(d) accepts negative d, counting from the end as Python does.
  int64_t size(int64_t d) const;
  int64_t numel() const { return numel_; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * dtype_size(dtype_); }

  // Typed pointer to the first element; throws if T does not match dtype().
  template <typename T>
  T* data();
  template <typename T>
  const T* data() const;
  void* raw_data() { return ptr_; }
  const void* raw_data() const { return ptr_; }

  // Views sharing storage.
  Tensor view(Shape shape) const;                    // same numel, another shape
  Tensor slice0(int64_t start, int64_t stop) const;  // rows [start, stop) of dim 0
  Tensor select0(int64_t index) const;               // row `index` of dim 0, one dim fewer

  // Deep copies.
  Tensor clone() const;
  Tensor to(DType dtype) const;  // converting copy (clone when dtype matches)
  void copy_from(const Tensor& src);  // same shape and dtype; overwrites this storage
  void fill(double value);

  // Elements as a std::vector (converting), for tests and printing.
  template <typename T>
  std::vector<T> to_vector() const;

  // Element access for tests and printing, row-major flat index.
  double item_as_double(int64_t flat_index) const;

  // PyTorch 1.13 repr(): "tensor([[ 1.0000, -2.5000],\n        [ 3.0000,  4.0000]])", with
  // torch's notation choice, column width, line wrapping, "..." summary and dtype suffixes.
  std::string to_string() const;

  // True when both tensors share the same storage buffer (views of each other).
  bool shares_storage_with(const Tensor& other) const { return storage_ == other.storage_; }

 private:
  Tensor(std::shared_ptr<void> storage, void* ptr, Shape shape, DType dtype);

  std::shared_ptr<void> storage_;
  void* ptr_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::f32;
  int64_t numel_ = 0;
  bool defined_ = false;
};

// The largest tensor seqpack allocates: 2^46 bytes (64 TiB). It is more than
// any machine's memory, so it refuses no real workload, but it stops a hostile
// size (a config's "hidden_size": 2^60) long before a byte count can wrap
// around to a small allocation that later writes overrun.
inline constexpr int64_t kMaxTensorBytes = int64_t{1} << 46;

// Number of elements of a shape. Throws std::invalid_argument naming the shape
// on a negative size, or when the product does not fit in int64_t.
int64_t shape_numel(const Shape& shape);
// Bytes of a tensor of `shape` and `dtype`. Throws std::invalid_argument naming
// the shape when they exceed kMaxTensorBytes (or overflow).
std::size_t shape_nbytes(const Shape& shape, DType dtype);

// A failed allocation: a std::bad_alloc (so callers catching that still do)
// whose what() says what was asked for: "cannot allocate 8589934592 bytes for a
// float32 tensor of shape [65536, 32768]: out of memory".
class AllocationError : public std::bad_alloc {
 public:
  AllocationError(std::size_t nbytes, const Shape& shape, DType dtype);
  // Memory another library could not have ("cannot make ...: out of memory").
  explicit AllocationError(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

// Writes to_string(): PyTorch's repr, "tensor([...])" ("None" when undefined).
std::ostream& operator<<(std::ostream& out, const Tensor& tensor);

}  // namespace seqpack
