#include "seqpack/tensor.h"

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace seqpack {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::f64:
    case DType::i64:
      return 8;
  }
  throw std::invalid_argument("unknown dtype");
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "float32";
    case DType::f64:
      return "float64";
    case DType::i64:
      return "int64";
  }
  return "unknown";
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      throw std::invalid_argument("shape " + shape_str(shape) + " has a negative size " +
                                  std::to_string(shape[i]) + " at dimension " +
                                  std::to_string(i));
    }
    n *= shape[i];
  }
  return n;
}

Tensor::Tensor(std::shared_ptr<void> storage, void* ptr, Shape shape, DType dtype)
    : storage_(std::move(storage)),
      ptr_(ptr),
      shape_(std::move(shape)),
      dtype_(dtype),
      numel_(shape_numel(shape_)),
      defined_(true) {}

namespace {
// 64-byte aligned so SIMD kernels and BLAS see cache-line aligned rows.
std::shared_ptr<void> allocate(std::size_t nbytes) {
  const std::size_t rounded = (nbytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (!p) throw std::bad_alloc();
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}
}  // namespace

Tensor Tensor::empty(Shape shape, DType dtype) {
  const int64_t n = shape_numel(shape);
  auto storage = allocate(static_cast<std::size_t>(n) * dtype_size(dtype));
  void* ptr = storage.get();
  return Tensor(std::move(storage), ptr, std::move(shape), dtype);
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  if (t.nbytes()) std::memset(t.ptr_, 0, t.nbytes());
  return t;
}

Tensor Tensor::full(Shape shape, double value, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  t.fill(value);
  return t;
}

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, Shape shape) {
  const int64_t n = shape_numel(shape);
  if (n != static_cast<int64_t>(values.size())) {
    throw std::invalid_argument("from_vector: " + std::to_string(values.size()) +
                                " values do not fill shape " + shape_str(shape));
  }
  Tensor t = empty(std::move(shape), dtype_of<T>());
  if (n) std::memcpy(t.ptr_, values.data(), t.nbytes());
  return t;
}
template Tensor Tensor::from_vector<float>(const std::vector<float>&, Shape);
template Tensor Tensor::from_vector<double>(const std::vector<double>&, Shape);
template Tensor Tensor::from_vector<int64_t>(const std::vector<int64_t>&, Shape);

Tensor Tensor::wrap(void* data, Shape shape, DType dtype, std::shared_ptr<void> owner) {
  if (!data && shape_numel(shape) > 0) {
    throw std::invalid_argument("Tensor::wrap: null data for shape " + shape_str(shape));
  }
  return Tensor(std::move(owner), data, std::move(shape), dtype);
}

int64_t Tensor::size(int64_t d) const {
  const int64_t n = dim();
  const int64_t k = d < 0 ? d + n : d;
  if (k < 0 || k >= n) {
    throw std::out_of_range("dimension " + std::to_string(d) + " out of range for a tensor of shape " +
                            shape_str(shape_));
  }
  return shape_[static_cast<std::size_t>(k)];
}

template <typename T>
T* Tensor::data() {
  if (!defined_) throw std::invalid_argument("data() of an undefined tensor");
  if (dtype_of<T>() != dtype_) {
    throw std::invalid_argument(std::string("tensor has dtype ") + dtype_name(dtype_) +
                                ", accessed as " + dtype_name(dtype_of<T>()));
  }
  return static_cast<T*>(ptr_);
}
template <typename T>
const T* Tensor::data() const {
  return const_cast<Tensor*>(this)->data<T>();
}
template float* Tensor::data<float>();
template double* Tensor::data<double>();
template int64_t* Tensor::data<int64_t>();
template const float* Tensor::data<float>() const;
template const double* Tensor::data<double>() const;
template const int64_t* Tensor::data<int64_t>() const;

Tensor Tensor::view(Shape shape) const {
  if (shape_numel(shape) != numel_) {
    throw std::invalid_argument("view: shape " + shape_str(shape) + " does not match " +
                                std::to_string(numel_) + " elements of shape " +
                                shape_str(shape_));
  }
  return Tensor(storage_, ptr_, std::move(shape), dtype_);
}

Tensor Tensor::slice0(int64_t start, int64_t stop) const {
  if (dim() == 0) throw std::invalid_argument("slice0 of a 0-dimensional tensor");
  if (start < 0 || stop < start || stop > shape_[0]) {
    throw std::out_of_range("slice0 [" + std::to_string(start) + ", " + std::to_string(stop) +
                            ") out of range for dimension 0 of shape " + shape_str(shape_));
  }
  Shape s = shape_;
  s[0] = stop - start;
  const int64_t row = shape_[0] ? numel_ / shape_[0] : 0;
  char* p = static_cast<char*>(ptr_) + start * row * static_cast<int64_t>(dtype_size(dtype_));
  return Tensor(storage_, p, std::move(s), dtype_);
}

Tensor Tensor::select0(int64_t index) const {
  Tensor t = slice0(index, index + 1);
  Shape s(shape_.begin() + 1, shape_.end());
  return t.view(std::move(s));
}

Tensor Tensor::clone() const {
  if (!defined_) return Tensor();
  Tensor t = empty(shape_, dtype_);
  if (nbytes()) std::memcpy(t.ptr_, ptr_, nbytes());
  return t;
}

namespace {
template <typename To, typename From>
void convert(To* dst, const From* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<To>(src[i]);
}
template <typename To>
void convert_from(To* dst, const Tensor& src) {
  switch (src.dtype()) {
    case DType::f32:
      convert(dst, src.data<float>(), src.numel());
      break;
    case DType::f64:
      convert(dst, src.data<double>(), src.numel());
      break;
    case DType::i64:
      convert(dst, src.data<int64_t>(), src.numel());
      break;
  }
}
}  // namespace

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return clone();
  Tensor t = empty(shape_, dtype);
  switch (dtype) {
    case DType::f32:
      convert_from(t.data<float>(), *this);
      break;
    case DType::f64:
      convert_from(t.data<double>(), *this);
      break;
    case DType::i64:
      convert_from(t.data<int64_t>(), *this);
      break;
  }
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  if (src.shape_ != shape_ || src.dtype_ != dtype_) {
    throw std::invalid_argument("copy_from: source " + shape_str(src.shape_) + " " +
                                dtype_name(src.dtype_) + " does not match destination " +
                                shape_str(shape_) + " " + dtype_name(dtype_));
  }
  if (nbytes() && ptr_ != src.ptr_) std::memmove(ptr_, src.ptr_, nbytes());
}

void Tensor::fill(double value) {
  // A value the dtype cannot hold is rejected as PyTorch's at::full does:
  // converting it would be undefined behaviour (NaN or 1e300 to int64).
  if ((dtype_ == DType::f32 && std::isfinite(value) && std::fabs(value) > FLT_MAX) ||
      (dtype_ == DType::i64 && !(value >= -0x1p63 && value < 0x1p63))) {
    std::ostringstream os;
    os << "value " << value << " cannot be converted to " << dtype_name(dtype_) << " without overflow";
    throw std::invalid_argument(os.str());
  }
  switch (dtype_) {
    case DType::f32: {
      float* p = data<float>();
      for (int64_t i = 0; i < numel_; ++i) p[i] = static_cast<float>(value);
      break;
    }
    case DType::f64: {
      double* p = data<double>();
      for (int64_t i = 0; i < numel_; ++i) p[i] = value;
      break;
    }
    case DType::i64: {
      int64_t* p = data<int64_t>();
      for (int64_t i = 0; i < numel_; ++i) p[i] = static_cast<int64_t>(value);
      break;
    }
  }
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  std::vector<T> out(static_cast<std::size_t>(numel_));
  if (numel_) convert_from(out.data(), *this);
  return out;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;

double Tensor::item_as_double(int64_t i) const {
  if (i < 0 || i >= numel_) {
    throw std::out_of_range("flat index " + std::to_string(i) + " out of range for " +
                            std::to_string(numel_) + " elements");
  }
  switch (dtype_) {
    case DType::f32:
      return data<float>()[i];
    case DType::f64:
      return data<double>()[i];
    case DType::i64:
      return static_cast<double>(data<int64_t>()[i]);
  }
  return 0;
}

namespace {
std::string format_element(const Tensor& t, int64_t i) {
  std::ostringstream os;
  if (t.dtype() == DType::i64) {
    os << static_cast<int64_t>(t.item_as_double(i));
    return os.str();
  }
  const double v = t.item_as_double(i);
  if (v == static_cast<double>(static_cast<int64_t>(v)) && v < 1e15 && v > -1e15) {
    os << static_cast<int64_t>(v) << ".";  // PyTorch prints whole floats as "3."
  } else {
    os.precision(4);
    os << std::fixed << v;
  }
  return os.str();
}

void format_rec(const Tensor& t, std::size_t d, int64_t& flat, std::string& out, int indent) {
  const Shape& s = t.shape();
  if (d == s.size()) {
    out += format_element(t, flat++);
    return;
  }
  out += "[";
  for (int64_t i = 0; i < s[d]; ++i) {
    if (i) {
      out += ",";
      if (d + 1 < s.size()) {
        out += "\n" + std::string(static_cast<std::size_t>(indent + 1), ' ');
      } else {
        out += " ";
      }
    }
    format_rec(t, d + 1, flat, out, indent + 1);
  }
  out += "]";
}
}  // namespace

std::string Tensor::to_string() const {
  if (!defined_) return "None";
  std::string out = "tensor(";
  int64_t flat = 0;
  format_rec(*this, 0, flat, out, 7);
  if (numel_ == 0) out += ", size=" + shape_str(shape_);
  if (dtype_ == DType::f64) out += ", dtype=torch.float64";
  return out + ")";
}

}  // namespace seqpack
