#include "seqpack/tensor.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <vector>

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
  bool overflow = false;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      throw std::invalid_argument("shape " + shape_str(shape) + " has a negative size " +
                                  std::to_string(shape[i]) + " at dimension " +
                                  std::to_string(i));
    }
    overflow |= __builtin_mul_overflow(n, shape[i], &n);
  }
  // A zero size makes any product empty, even one that overflowed on the way
  // (while an overflowed product can wrap to exactly 0: [2^62, 4]).
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  if (overflow) {
    throw std::invalid_argument("shape " + shape_str(shape) +
                                " has more elements than a 64-bit integer can count");
  }
  return n;
}

std::size_t shape_nbytes(const Shape& shape, DType dtype) {
  const int64_t n = shape_numel(shape);
  const int64_t esize = static_cast<int64_t>(dtype_size(dtype));
  if (n > kMaxTensorBytes / esize) {
    // n * esize may not fit in int64_t: print it as a 128-bit product.
    const unsigned __int128 bytes = static_cast<unsigned __int128>(n) * esize;
    std::string digits;
    for (unsigned __int128 v = bytes; v > 0; v /= 10)
      digits.insert(digits.begin(), char('0' + int(v % 10)));
    throw std::invalid_argument("a " + std::string(dtype_name(dtype)) + " tensor of shape " +
                                shape_str(shape) + " would take " + digits +
                                " bytes, more than seqpack's limit of " +
                                std::to_string(kMaxTensorBytes) + " bytes (2^46) per tensor");
  }
  return static_cast<std::size_t>(n * esize);
}

AllocationError::AllocationError(std::size_t nbytes, const Shape& shape, DType dtype)
    : message_("cannot allocate " + std::to_string(nbytes) + " bytes for a " + dtype_name(dtype) +
               " tensor of shape " + shape_str(shape) + ": out of memory") {}

Tensor::Tensor(std::shared_ptr<void> storage, void* ptr, Shape shape, DType dtype)
    : storage_(std::move(storage)),
      ptr_(ptr),
      shape_(std::move(shape)),
      dtype_(dtype),
      numel_(shape_numel(shape_)),
      defined_(true) {}

namespace {
// 64-byte aligned so SIMD kernels and BLAS see cache-line aligned rows.
std::shared_ptr<void> allocate(std::size_t nbytes, const Shape& shape, DType dtype) {
  const std::size_t rounded = (nbytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (!p) throw AllocationError(nbytes, shape, dtype);
  try {
    return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  } catch (const std::bad_alloc&) {  // the control block's own; shared_ptr has freed p
    throw AllocationError(nbytes, shape, dtype);
  }
}
}  // namespace

Tensor Tensor::empty(Shape shape, DType dtype) {
  auto storage = allocate(shape_nbytes(shape, dtype), shape, dtype);
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
// Tensor::to_string follows torch/_tensor_str.py of PyTorch 1.13 with its default print options:
// one _Formatter decides, from every printed value, between integer-looking floats ("3."),
// fixed 4-decimal and scientific notation, and a common width that right-aligns all elements.
constexpr int kPrecision = 4;
constexpr int64_t kThreshold = 1000;  // more elements than this are summarised with "..."
constexpr int64_t kEdgeItems = 3;     // elements kept at each end of a summarised dimension
constexpr int kLineWidth = 80;

std::string printf_double(const char* fmt, int width, double v) {
  // Python prints NaN as "nan" whatever its sign bit; printf may print "-nan".
  if (std::isnan(v)) return "nan";
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, width, kPrecision, v);
  return buf;
}

class Formatter {
 public:
  // `idx` are the flat indices of the elements that will be printed (after summarising),
  // which is what torch's _Formatter sees.
  Formatter(const Tensor& t, const std::vector<int64_t>& idx) : floating_(t.dtype() != DType::i64) {
    if (!floating_) {
      for (int64_t i : idx) width_ = std::max(width_, format(t, i).size());
      return;
    }
    std::vector<double> values;
    for (int64_t i : idx) values.push_back(t.item_as_double(i));
    // Zeros, NaN and infinities neither pick the notation nor widen the columns.
    std::vector<double> finite;
    for (double v : values) {
      if (std::isfinite(v) && v != 0) finite.push_back(v);
    }
    if (finite.empty()) return;
    double lo = std::fabs(finite[0]), hi = lo;
    for (double v : finite) {
      lo = std::min(lo, std::fabs(v));
      hi = std::max(hi, std::fabs(v));
      int_mode_ = int_mode_ && v == std::ceil(v);
    }
    sci_mode_ = hi / lo > 1000.0 || hi > 1.0e8 || (!int_mode_ && lo < 1.0e-4);
    for (double v : finite) {
      if (sci_mode_) {
        width_ = std::max(width_, printf_double("%*.*e", 0, v).size());
      } else if (int_mode_) {
        width_ = std::max(width_, printf_double("%*.0f", 0, v).size() + 1);  // + 1 for the "."
      } else {
        width_ = std::max(width_, printf_double("%*.*f", 0, v).size());
      }
    }
  }

  std::size_t width() const { return width_; }

  std::string format(const Tensor& t, int64_t flat) const {
    std::string s;
    const double v = floating_ ? t.item_as_double(flat) : 0.0;
    if (!floating_) {
      s = std::to_string(t.data<int64_t>()[flat]);  // not through double: exact beyond 2^53
    } else if (sci_mode_) {
      s = printf_double("%*.*e", static_cast<int>(width_), v);
    } else if (int_mode_) {
      s = std::isfinite(v) ? printf_double("%*.0f", 0, v) + "." : printf_double("%*.0f", 0, v);
    } else {
      s = printf_double("%*.*f", 0, v);
    }
    if (s.size() < width_) s.insert(0, width_ - s.size(), ' ');
    return s;
  }

 private:
  bool floating_;
  bool int_mode_ = true;
  bool sci_mode_ = false;
  std::size_t width_ = 1;
};

// The flat indices that get printed: a summarised dimension keeps its first and last
// kEdgeItems entries (torch's get_summarized_data).
void printed_indices(const Shape& s, std::size_t d, int64_t offset, bool summarize,
                     std::vector<int64_t>& out) {
  if (d == s.size()) {
    out.push_back(offset);
    return;
  }
  int64_t stride = 1;
  for (std::size_t k = d + 1; k < s.size(); ++k) stride *= s[k];
  for (int64_t i = 0; i < s[d]; ++i) {
    if (summarize && s[d] > 2 * kEdgeItems && i == kEdgeItems) i = s[d] - kEdgeItems;
    printed_indices(s, d + 1, offset + i * stride, summarize, out);
  }
}

std::string format_rec(const Tensor& t, const Formatter& f, std::size_t d, int64_t offset,
                       int indent, bool summarize) {
  const Shape& s = t.shape();
  int64_t stride = 1;
  for (std::size_t k = d + 1; k < s.size(); ++k) stride *= s[k];
  const bool cut = summarize && s[d] > 2 * kEdgeItems;
  std::vector<std::string> items;
  for (int64_t i = 0; i < s[d]; ++i) {
    if (cut && i == kEdgeItems) {
      items.push_back(d + 1 == s.size() ? " ..." : "...");
      i = s[d] - kEdgeItems;
    }
    items.push_back(d + 1 == s.size()
                        ? f.format(t, offset + i * stride)
                        : format_rec(t, f, d + 1, offset + i * stride, indent + 1, summarize));
  }
  std::string out = "[";
  if (d + 1 == s.size()) {
    // The innermost dimension wraps at the line width, as many elements a line as fit.
    const int64_t per_line = std::max<int64_t>(
        1, (kLineWidth - indent) / static_cast<int64_t>(f.width() + 2));
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (i) out += static_cast<int64_t>(i) % per_line ? ", " : ",\n" + std::string(indent + 1, ' ');
      out += items[i];
    }
  } else {
    // Blocks of a k-d tensor are separated by k - 1 line breaks.
    const std::string sep =
        "," + std::string(s.size() - d - 1, '\n') + std::string(static_cast<std::size_t>(indent + 1), ' ');
    for (std::size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  }
  return out + "]";
}
}  // namespace

std::string Tensor::to_string() const {
  if (!defined_) return "None";
  const std::string prefix = "tensor(";
  const int indent = static_cast<int>(prefix.size());
  std::string body;
  std::vector<std::string> suffixes;
  if (numel_ == 0) {
    body = "[]";
    if (shape_.size() != 1) {
      std::string size = "size=(";
      for (std::size_t i = 0; i < shape_.size(); ++i) size += (i ? ", " : "") + std::to_string(shape_[i]);
      suffixes.push_back(size + ")");
    }
    // An empty tensor has no elements to show its dtype, so only float32 (the default) goes unnamed.
    if (dtype_ != DType::f32) suffixes.push_back(std::string("dtype=torch.") + dtype_name(dtype_));
  } else {
    const bool summarize = numel_ > kThreshold;
    std::vector<int64_t> idx;
    printed_indices(shape_, 0, 0, summarize, idx);
    const Formatter f(*this, idx);
    body = shape_.empty() ? f.format(*this, 0) : format_rec(*this, f, 0, 0, indent, summarize);
    // int64 is PyTorch's default integer type and is not named; float64 is.
    if (dtype_ == DType::f64) suffixes.push_back("dtype=torch.float64");
  }
  // A suffix that would pass the line width goes on its own line (torch's _add_suffixes).
  std::string out = prefix + body;
  const std::size_t nl = out.rfind('\n');
  std::size_t last_line = nl == std::string::npos ? out.size() + 2 : out.size() - nl + 1;
  for (const std::string& suffix : suffixes) {
    if (last_line + suffix.size() + 2 > static_cast<std::size_t>(kLineWidth)) {
      out += ",\n" + std::string(static_cast<std::size_t>(indent), ' ') + suffix;
      last_line = static_cast<std::size_t>(indent) + suffix.size();
    } else {
      out += ", " + suffix;
      last_line += suffix.size() + 2;
    }
  }
  return out + ")";
}

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) { return out << tensor.to_string(); }

}  // namespace seqpack
