// Packing utilities: PackingPlan (the index maps) and the torch.nn.utils.rnn
// functions built on it. Every function here moves whole feature rows with
// memcpy, so one code path serves every dtype and trailing feature shape.
#include "seqpack/packed_sequence.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace seqpack {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Bytes of one feature row of a tensor whose first `lead` dims are (time, batch)
// or (rows): the product of the trailing dims times the element size.
std::size_t row_bytes(const Tensor& t, int64_t lead) {
  int64_t n = 1;
  for (int64_t d = lead; d < t.dim(); ++d) n *= t.size(d);
  return static_cast<std::size_t>(n) * dtype_size(t.dtype());
}

Shape trailing_shape(const Tensor& t, int64_t lead) {
  return Shape(t.shape().begin() + lead, t.shape().end());
}

Shape concat_shape(std::initializer_list<int64_t> lead, const Shape& tail) {
  Shape s(lead);
  s.insert(s.end(), tail.begin(), tail.end());
  return s;
}

// Checks that an index tensor is a 1-D int64 tensor, naming it on failure.
std::vector<int64_t> index_vector(const Tensor& t, const char* name) {
  if (t.dtype() != DType::i64 || t.dim() != 1) {
    throw std::invalid_argument(std::string(name) + " must be a 1-D int64 tensor, got " +
                                dtype_name(t.dtype()) + " of shape " + shape_str(t.shape()));
  }
  return t.to_vector<int64_t>();
}

// Throws unless `perm` holds each of 0..n-1 exactly once; messages start with
// `context` and name entries `name`[i].
void check_permutation(const std::vector<int64_t>& perm, const std::string& context,
                       const std::string& name) {
  const int64_t n = static_cast<int64_t>(perm.size());
  std::vector<int64_t> seen_at(perm.size(), -1);
  // The messages are built only on failure: this runs on every call of the
  // torch operators, where formatting 2n strings cost more than the check.
  auto entry = [&](int64_t i, int64_t v) {
    return context + name + "[" + str(i) + "] = " + str(v);
  };
  auto why = [&] { return ": it must be a permutation of 0.." + str(n - 1); };
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = perm[static_cast<std::size_t>(i)];
    if (v < 0 || v >= n) {
      throw std::invalid_argument(entry(i, v) + " is out of range [0, " + str(n) + ")" + why());
    }
    int64_t& first = seen_at[static_cast<std::size_t>(v)];
    if (first >= 0) {
      throw std::invalid_argument(entry(i, v) + " repeats " + name + "[" + str(first) + "]" + why());
    }
    first = i;
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// PackedSequence

void PackedSequence::validate() const {
  if (!data.defined()) throw std::invalid_argument("PackedSequence: data is undefined");
  if (data.dim() < 1) {
    throw std::invalid_argument("PackedSequence: data must have at least 1 dimension, got shape " +
                                shape_str(data.shape()));
  }
  if (!batch_sizes.defined()) {
    throw std::invalid_argument("PackedSequence: batch_sizes is undefined");
  }
  const std::vector<int64_t> bs = index_vector(batch_sizes, "PackedSequence: batch_sizes");
  int64_t sum = 0;
  for (std::size_t t = 0; t < bs.size(); ++t) {
    if (bs[t] <= 0) {
      throw std::invalid_argument("PackedSequence: batch_sizes[" + str(static_cast<int64_t>(t)) +
                                  "] = " + str(bs[t]) + " must be positive");
    }
    if (t > 0 && bs[t] > bs[t - 1]) {
      throw std::invalid_argument("PackedSequence: batch_sizes[" + str(static_cast<int64_t>(t)) +
                                  "] = " + str(bs[t]) + " is greater than batch_sizes[" +
                                  str(static_cast<int64_t>(t) - 1) + "] = " + str(bs[t - 1]) +
                                  ": batch_sizes must be non-increasing");
    }
    sum += bs[t];
  }
  if (sum != data.size(0)) {
    throw std::invalid_argument("PackedSequence: batch_sizes add up to " + str(sum) +
                                " rows but data has " + str(data.size(0)) + " rows (shape " +
                                shape_str(data.shape()) + ")");
  }
  if (sorted_indices.defined() != unsorted_indices.defined()) {
    throw std::invalid_argument(
        std::string("PackedSequence: ") +
        (sorted_indices.defined() ? "sorted_indices is given but unsorted_indices is not"
                                  : "unsorted_indices is given but sorted_indices is not") +
        ": give both or neither");
  }
  if (!sorted_indices.defined()) return;
  const std::vector<int64_t> s = index_vector(sorted_indices, "PackedSequence: sorted_indices");
  const std::vector<int64_t> u =
      index_vector(unsorted_indices, "PackedSequence: unsorted_indices");
  if (s.size() != u.size()) {
    throw std::invalid_argument("PackedSequence: sorted_indices has " + str(s.size()) +
                                " entries but unsorted_indices has " + str(u.size()));
  }
  const int64_t widest = bs.empty() ? 0 : bs[0];
  if (static_cast<int64_t>(s.size()) < widest) {
    throw std::invalid_argument("PackedSequence: sorted_indices has " + str(s.size()) +
                                " entries but batch_sizes[0] = " + str(widest) + " sequences");
  }
  check_permutation(s, "PackedSequence: ", "sorted_indices");
  check_permutation(u, "PackedSequence: ", "unsorted_indices");
  for (std::size_t k = 0; k < s.size(); ++k) {
    if (u[static_cast<std::size_t>(s[k])] != static_cast<int64_t>(k)) {
      throw std::invalid_argument(
          "PackedSequence: unsorted_indices is not the inverse of sorted_indices: "
          "sorted_indices[" + str(static_cast<int64_t>(k)) + "] = " + str(s[k]) +
          " but unsorted_indices[" + str(s[k]) + "] = " + str(u[static_cast<std::size_t>(s[k])]));
    }
  }
}

int64_t PackedSequence::batch_size() const {
  if (sorted_indices.defined()) return sorted_indices.size(0);
  if (!batch_sizes.defined() || batch_sizes.numel() == 0) return 0;
  return batch_sizes.data<int64_t>()[0];
}

std::string PackedSequence::to_string() const {
  return "PackedSequence(data=" + data.to_string() + ", batch_sizes=" + batch_sizes.to_string() +
         ", sorted_indices=" + sorted_indices.to_string() +
         ", unsorted_indices=" + unsorted_indices.to_string() + ")";
}

std::ostream& operator<<(std::ostream& out, const PackedSequence& p) { return out << p.to_string(); }

// ---------------------------------------------------------------------------
// PackingPlan

namespace {

// Fills everything derived from (lengths, sorted order).
void derive(const std::vector<int64_t>& lengths, const std::vector<int64_t>& sorted,
            std::vector<int64_t>& unsorted, std::vector<int64_t>& batch_sizes,
            std::vector<int64_t>& offsets, std::vector<int64_t>& padded_index,
            int64_t& total_rows) {
  const int64_t batch = static_cast<int64_t>(lengths.size());
  unsorted.assign(lengths.size(), 0);
  for (int64_t k = 0; k < batch; ++k) unsorted[static_cast<std::size_t>(sorted[k])] = k;
  const int64_t max_len = batch ? lengths[static_cast<std::size_t>(sorted[0])] : 0;
  // Sorted lengths are non-increasing, so batch_sizes[t] (sequences longer than
  // t) shrinks as t grows: count it by walking the sorted lengths backwards.
  batch_sizes.assign(static_cast<std::size_t>(max_len), 0);
  int64_t k = batch;
  for (int64_t t = 0; t < max_len; ++t) {
    while (k > 0 && lengths[static_cast<std::size_t>(sorted[k - 1])] <= t) --k;
    batch_sizes[static_cast<std::size_t>(t)] = k;
  }
  offsets.assign(static_cast<std::size_t>(max_len) + 1, 0);
  for (int64_t t = 0; t < max_len; ++t) {
    offsets[t + 1] = offsets[t] + batch_sizes[t];
  }
  total_rows = offsets[static_cast<std::size_t>(max_len)];
  padded_index.assign(static_cast<std::size_t>(total_rows), 0);
  for (int64_t t = 0; t < max_len; ++t) {
    for (int64_t j = 0; j < batch_sizes[t]; ++j) {
      padded_index[offsets[t] + j] = t * batch + sorted[j];
    }
  }
}

}  // namespace

PackingPlan PackingPlan::from_lengths(const std::vector<int64_t>& lengths, bool enforce_sorted) {
  const int64_t batch = static_cast<int64_t>(lengths.size());
  for (int64_t b = 0; b < batch; ++b) {
    if (lengths[b] < 0) {
      throw std::invalid_argument("lengths[" + str(b) + "] = " + str(lengths[b]) +
                                  " is negative");
    }
  }
  PackingPlan plan;
  plan.lengths_ = lengths;
  plan.enforce_sorted_ = enforce_sorted;
  plan.sorted_indices_.resize(lengths.size());
  std::iota(plan.sorted_indices_.begin(), plan.sorted_indices_.end(), 0);
  if (enforce_sorted) {
    for (int64_t b = 1; b < batch; ++b) {
      if (lengths[b] > lengths[b - 1]) {
        throw std::invalid_argument(
            "lengths[" + str(b) + "] = " + str(lengths[b]) + " is greater than lengths[" +
            str(b - 1) + "] = " + str(lengths[b - 1]) +
            ": with enforce_sorted=true lengths must be sorted in decreasing order; "
            "pass enforce_sorted=false to accept unsorted lengths");
      }
    }
  } else {
    // Stable, so ties keep the caller's order as PyTorch's sort does.
    std::stable_sort(plan.sorted_indices_.begin(), plan.sorted_indices_.end(),
                     [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  }
  derive(plan.lengths_, plan.sorted_indices_, plan.unsorted_indices_, plan.batch_sizes_,
         plan.offsets_, plan.padded_index_, plan.total_rows_);
  return plan;
}

PackingPlan PackingPlan::from_packed(const PackedSequence& packed) {
  packed.validate();
  const std::vector<int64_t> bs = packed.batch_sizes.to_vector<int64_t>();
  const int64_t batch = packed.batch_size();
  PackingPlan plan;
  plan.enforce_sorted_ = !packed.sorted_indices.defined();
  if (packed.sorted_indices.defined()) {
    plan.sorted_indices_ = packed.sorted_indices.to_vector<int64_t>();
  } else {
    plan.sorted_indices_.resize(static_cast<std::size_t>(batch));
    std::iota(plan.sorted_indices_.begin(), plan.sorted_indices_.end(), 0);
  }
  // The k-th longest sequence is present at every step t with batch_sizes[t] > k.
  plan.lengths_.assign(static_cast<std::size_t>(batch), 0);
  for (int64_t b : bs) {
    for (int64_t k = 0; k < b; ++k) ++plan.lengths_[plan.sorted_indices_[k]];
  }
  derive(plan.lengths_, plan.sorted_indices_, plan.unsorted_indices_, plan.batch_sizes_,
         plan.offsets_, plan.padded_index_, plan.total_rows_);
  return plan;
}

namespace {

// The row of a [T, B, *f] (or [B, T, *f] when batch_first) padded tensor that holds
// padded_index entry i = t * B + b; it does not involve T time-major, so it holds
// for any total_length.
int64_t padded_row(int64_t i, int64_t T, int64_t B, bool batch_first) {
  return batch_first ? (i % B) * T + i / B : i;
}

// Copies packed rows out of a padded tensor ([T, B, *f] or [B, T, *f]).
Tensor gather_rows(const PackingPlan& plan, const Tensor& padded, bool batch_first,
                   const char* what) {
  if (!padded.defined() || padded.dim() < 2) {
    throw std::invalid_argument(std::string(what) +
                                ": input must have at least 2 dimensions (time and batch), got " +
                                (padded.defined() ? "shape " + shape_str(padded.shape())
                                                  : std::string("an undefined tensor")));
  }
  const int64_t T = padded.size(batch_first ? 1 : 0), B = padded.size(batch_first ? 0 : 1);
  if (B != plan.batch()) {
    throw std::invalid_argument(std::string(what) + ": input of shape " +
                                shape_str(padded.shape()) + " has batch size " + str(B) +
                                " but there are " + str(plan.batch()) + " lengths");
  }
  if (T < plan.max_len()) {
    throw std::invalid_argument(std::string(what) + ": input of shape " +
                                shape_str(padded.shape()) + " has padded length " + str(T) +
                                " but the longest sequence has length " + str(plan.max_len()));
  }
  Tensor out = Tensor::empty(concat_shape({plan.total_rows()}, trailing_shape(padded, 2)),
                             padded.dtype());
  const std::size_t rb = row_bytes(padded, 2);
  const char* src = static_cast<const char*>(padded.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  const auto& idx = plan.padded_index();
  for (int64_t r = 0; r < plan.total_rows(); ++r) {
    std::memcpy(dst + r * rb, src + padded_row(idx[r], T, B, batch_first) * rb, rb);
  }
  return out;
}

// Writes `padding_value` into steps [t0, t1) of sequence b of a padded tensor
// with rows of `rb` bytes. Only padding positions are written, so each output
// element is written once (filling everything first costs as much as the copy).
void fill_padding(char* dst, const Tensor& pad_row, std::size_t rb, int64_t T, int64_t B,
                  bool batch_first, int64_t b, int64_t t0, int64_t t1) {
  const char* src = static_cast<const char*>(pad_row.raw_data());
  for (int64_t t = t0; t < t1; ++t) {
    std::memcpy(dst + (batch_first ? b * T + t : t * B + b) * rb, src, rb);
  }
}

Tensor padding_row(const Shape& tail, double padding_value, DType dtype) {
  return Tensor::full({shape_numel(tail)}, padding_value, dtype);
}

// Writes packed rows into a new padded tensor ([T, B, *f] or [B, T, *f]).
Tensor scatter_rows(const PackingPlan& plan, const Tensor& rows, int64_t total_length,
                    bool batch_first, double padding_value, const char* what,
                    const char* length_name = "total_length") {
  if (!rows.defined() || rows.dim() < 1) {
    throw std::invalid_argument(std::string(what) +
                                ": packed rows must have at least 1 dimension, got " +
                                (rows.defined() ? "shape " + shape_str(rows.shape())
                                                : std::string("an undefined tensor")));
  }
  if (rows.size(0) != plan.total_rows()) {
    throw std::invalid_argument(std::string(what) + ": packed rows of shape " +
                                shape_str(rows.shape()) + " do not match the plan's " +
                                str(plan.total_rows()) + " rows");
  }
  if (total_length < plan.max_len()) {
    throw std::invalid_argument(std::string(what) + ": " + length_name + " = " + str(total_length) +
                                " is less than the longest sequence length " +
                                str(plan.max_len()));
  }
  const int64_t T = total_length, B = plan.batch();
  const Shape tail = trailing_shape(rows, 1);
  Tensor out = Tensor::empty(batch_first ? concat_shape({B, T}, tail) : concat_shape({T, B}, tail),
                             rows.dtype());
  const std::size_t rb = row_bytes(rows, 1);
  const char* src = static_cast<const char*>(rows.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  const auto& idx = plan.padded_index();
  for (int64_t r = 0; r < plan.total_rows(); ++r) {
    std::memcpy(dst + padded_row(idx[r], T, B, batch_first) * rb, src + r * rb, rb);
  }
  const Tensor pad = padding_row(tail, padding_value, rows.dtype());
  for (int64_t b = 0; b < B; ++b) {
    fill_padding(dst, pad, rb, T, B, batch_first, b, plan.lengths()[b], T);
  }
  return out;
}

}  // namespace

Tensor PackingPlan::pack(const Tensor& padded_time_major) const {
  return gather_rows(*this, padded_time_major, /*batch_first=*/false, "PackingPlan::pack");
}

Tensor PackingPlan::unpack(const Tensor& packed_rows, int64_t total_length,
                           double padding_value) const {
  return scatter_rows(*this, packed_rows, total_length, /*batch_first=*/false, padding_value,
                      "PackingPlan::unpack");
}

Tensor PackingPlan::batch_sizes_tensor() const { return Tensor::from_vector(batch_sizes_); }

// Zero-length sequences have no packed rows, so batch_sizes alone cannot say how
// many sequences there are: the indices are then kept even with enforce_sorted
// (PyTorch rejects such batches, so no PyTorch result differs).
Tensor PackingPlan::sorted_indices_tensor() const {
  if (enforce_sorted_ && !has_zero_length()) return Tensor();
  return Tensor::from_vector(sorted_indices_);
}

Tensor PackingPlan::unsorted_indices_tensor() const {
  if (enforce_sorted_ && !has_zero_length()) return Tensor();
  return Tensor::from_vector(unsorted_indices_);
}

bool PackingPlan::has_zero_length() const {
  return batch() > (batch_sizes_.empty() ? 0 : batch_sizes_[0]);
}

// ---------------------------------------------------------------------------
// The torch.nn.utils.rnn functions

namespace {

// Re-throws a plan error with the public function's name in front.
template <typename F>
auto with_context(const char* what, F&& f) {
  try {
    return f();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string(what) + ": " + e.what());
  }
}

// A list of sequences [L_i, *f] must be non-empty and agree on dtype and *f.
void check_sequences(const std::vector<Tensor>& sequences, const char* what) {
  if (sequences.empty()) {
    throw std::invalid_argument(std::string(what) + ": received an empty list of sequences");
  }
  for (std::size_t i = 0; i < sequences.size(); ++i) {
    const Tensor& s = sequences[i];
    // Built only on failure (this loop runs on every call).
    auto name = [&] { return "sequences[" + str(static_cast<int64_t>(i)) + "]"; };
    if (!s.defined()) {
      throw std::invalid_argument(std::string(what) + ": " + name() + " is undefined");
    }
    if (s.dim() < 1) {
      throw std::invalid_argument(std::string(what) + ": " + name() + " has shape " +
                                  shape_str(s.shape()) +
                                  "; a sequence needs at least 1 dimension (time)");
    }
    if (i == 0) continue;
    const Tensor& s0 = sequences[0];
    if (s.dtype() != s0.dtype()) {
      throw std::invalid_argument(std::string(what) + ": " + name() + " has dtype " +
                                  dtype_name(s.dtype()) + " but sequences[0] has dtype " +
                                  dtype_name(s0.dtype()));
    }
    if (trailing_shape(s, 1) != trailing_shape(s0, 1)) {
      throw std::invalid_argument(std::string(what) + ": " + name() + " has shape " +
                                  shape_str(s.shape()) + " (trailing " +
                                  shape_str(trailing_shape(s, 1)) + ") but sequences[0] has " +
                                  shape_str(s0.shape()) + " (trailing " +
                                  shape_str(trailing_shape(s0, 1)) +
                                  "): trailing dimensions must match");
    }
  }
}

std::vector<int64_t> sequence_lengths(const std::vector<Tensor>& sequences) {
  std::vector<int64_t> lengths;
  lengths.reserve(sequences.size());
  for (const Tensor& s : sequences) lengths.push_back(s.size(0));
  return lengths;
}

// lengths must match the batch and fit in the padded length `T`.
void check_lengths(const std::vector<int64_t>& lengths, int64_t batch, int64_t T,
                   const Tensor& input, bool batch_first, const char* what) {
  if (static_cast<int64_t>(lengths.size()) != batch) {
    throw std::invalid_argument(std::string(what) + ": got " + str(lengths.size()) +
                                " lengths but the input of shape " + shape_str(input.shape()) +
                                " has batch size " + str(batch) +
                                (batch_first ? " (batch_first=true)" : " (batch_first=false)"));
  }
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    auto name = [&] { return "lengths[" + str(static_cast<int64_t>(b)) + "] = " + str(lengths[b]); };
    if (lengths[b] < 0) {
      throw std::invalid_argument(std::string(what) + ": " + name() + " is negative");
    }
    if (lengths[b] > T) {
      throw std::invalid_argument(std::string(what) + ": " + name() + " exceeds the padded length " +
                                  str(T) + " of the input of shape " + shape_str(input.shape()) +
                                  (batch_first ? " (batch_first=true)" : " (batch_first=false)"));
    }
  }
}

void check_padded_input(const Tensor& input, const char* what) {
  if (!input.defined()) throw std::invalid_argument(std::string(what) + ": input is undefined");
  if (input.dim() < 2) {
    throw std::invalid_argument(std::string(what) +
                                ": input must have at least 2 dimensions (time and batch), got "
                                "shape " + shape_str(input.shape()));
  }
}

}  // namespace

Tensor pad_sequence(const std::vector<Tensor>& sequences, bool batch_first, double padding_value,
                    PaddingSide padding_side) {
  check_sequences(sequences, "pad_sequence");
  const int64_t B = static_cast<int64_t>(sequences.size());
  int64_t T = 0;
  for (const Tensor& s : sequences) T = std::max(T, s.size(0));
  const Shape tail = trailing_shape(sequences[0], 1);
  Tensor out = Tensor::empty(batch_first ? concat_shape({B, T}, tail) : concat_shape({T, B}, tail),
                             sequences[0].dtype());
  const std::size_t rb = row_bytes(out, 2);
  char* dst = static_cast<char*>(out.raw_data());
  const Tensor pad = padding_row(tail, padding_value, sequences[0].dtype());
  for (int64_t b = 0; b < B; ++b) {
    const Tensor& s = sequences[static_cast<std::size_t>(b)];
    const char* src = static_cast<const char*>(s.raw_data());
    const int64_t L = s.size(0);
    const int64_t start = padding_side == PaddingSide::left ? T - L : 0;
    fill_padding(dst, pad, rb, T, B, batch_first, b, 0, start);
    fill_padding(dst, pad, rb, T, B, batch_first, b, start + L, T);
    for (int64_t t = 0; t < L; ++t) {
      const int64_t i = batch_first ? b * T + start + t : (start + t) * B + b;
      std::memcpy(dst + i * rb, src + t * rb, rb);
    }
  }
  return out;
}

PackedSequence pack_padded_sequence(const Tensor& input, const std::vector<int64_t>& lengths,
                                    bool batch_first, bool enforce_sorted) {
  const char* what = "pack_padded_sequence";
  check_padded_input(input, what);
  const int64_t T = input.size(batch_first ? 1 : 0), B = input.size(batch_first ? 0 : 1);
  check_lengths(lengths, B, T, input, batch_first, what);
  const PackingPlan plan =
      with_context(what, [&] { return PackingPlan::from_lengths(lengths, enforce_sorted); });
  PackedSequence out;
  out.data = gather_rows(plan, input, batch_first, what);
  out.batch_sizes = plan.batch_sizes_tensor();
  out.sorted_indices = plan.sorted_indices_tensor();
  out.unsorted_indices = plan.unsorted_indices_tensor();
  return out;
}

PackedSequence pack_padded_sequence(const Tensor& input, const Tensor& lengths, bool batch_first,
                                    bool enforce_sorted) {
  if (!lengths.defined() || lengths.dim() != 1) {
    throw std::invalid_argument(
        "pack_padded_sequence: lengths must be a 1-D tensor, got " +
        (lengths.defined() ? "shape " + shape_str(lengths.shape()) : std::string("undefined")));
  }
  // PyTorch converts lengths with as_tensor(dtype=int64); a fractional length
  // would be truncated silently there, so it is rejected here.
  std::vector<int64_t> v(static_cast<std::size_t>(lengths.numel()));
  for (int64_t i = 0; i < lengths.numel(); ++i) {
    const double x = lengths.item_as_double(i);
    if (lengths.dtype() != DType::i64 && x != static_cast<double>(static_cast<int64_t>(x))) {
      std::ostringstream os;
      os << "pack_padded_sequence: lengths[" << i << "] = " << x << " is not a whole number";
      throw std::invalid_argument(os.str());
    }
    v[static_cast<std::size_t>(i)] =
        lengths.dtype() == DType::i64 ? lengths.data<int64_t>()[i] : static_cast<int64_t>(x);
  }
  return pack_padded_sequence(input, v, batch_first, enforce_sorted);
}

PackedSequence pack_sequence(const std::vector<Tensor>& sequences, bool enforce_sorted) {
  const char* what = "pack_sequence";
  check_sequences(sequences, what);
  const PackingPlan plan = with_context(
      what, [&] { return PackingPlan::from_lengths(sequence_lengths(sequences), enforce_sorted); });
  // Gathers straight from the sequences: no padded intermediate.
  const int64_t B = plan.batch();
  Tensor data = Tensor::empty(concat_shape({plan.total_rows()}, trailing_shape(sequences[0], 1)),
                              sequences[0].dtype());
  const std::size_t rb = row_bytes(data, 1);
  char* dst = static_cast<char*>(data.raw_data());
  const auto& idx = plan.padded_index();
  for (int64_t r = 0; r < plan.total_rows(); ++r) {
    const int64_t t = idx[r] / B, b = idx[r] % B;
    const char* src = static_cast<const char*>(sequences[static_cast<std::size_t>(b)].raw_data());
    std::memcpy(dst + r * rb, src + t * rb, rb);
  }
  PackedSequence out;
  out.data = std::move(data);
  out.batch_sizes = plan.batch_sizes_tensor();
  out.sorted_indices = plan.sorted_indices_tensor();
  out.unsorted_indices = plan.unsorted_indices_tensor();
  return out;
}

std::pair<Tensor, Tensor> pad_packed_sequence(const PackedSequence& sequence, bool batch_first,
                                              double padding_value,
                                              std::optional<int64_t> total_length) {
  const char* what = "pad_packed_sequence";
  const PackingPlan plan = with_context(what, [&] { return PackingPlan::from_packed(sequence); });
  const int64_t T = total_length.value_or(plan.max_len());
  Tensor padded = scatter_rows(plan, sequence.data, T, batch_first, padding_value, what);
  return {std::move(padded), Tensor::from_vector(plan.lengths())};
}

std::vector<Tensor> unpad_sequence(const Tensor& padded, const std::vector<int64_t>& lengths,
                                   bool batch_first) {
  const char* what = "unpad_sequence";
  check_padded_input(padded, what);
  const int64_t T = padded.size(batch_first ? 1 : 0), B = padded.size(batch_first ? 0 : 1);
  check_lengths(lengths, B, T, padded, batch_first, what);
  const Shape tail = trailing_shape(padded, 2);
  const std::size_t rb = row_bytes(padded, 2);
  const char* src = static_cast<const char*>(padded.raw_data());
  std::vector<Tensor> out;
  out.reserve(static_cast<std::size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t L = lengths[static_cast<std::size_t>(b)];
    Tensor s = Tensor::empty(concat_shape({L}, tail), padded.dtype());
    char* dst = static_cast<char*>(s.raw_data());
    for (int64_t t = 0; t < L; ++t) {
      const int64_t i = batch_first ? b * T + t : t * B + b;
      std::memcpy(dst + t * rb, src + i * rb, rb);
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<Tensor> unpack_sequence(const PackedSequence& packed) {
  const PackingPlan plan =
      with_context("unpack_sequence", [&] { return PackingPlan::from_packed(packed); });
  const int64_t B = plan.batch();
  const Shape tail = trailing_shape(packed.data, 1);
  std::vector<Tensor> out;
  out.reserve(static_cast<std::size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    out.push_back(Tensor::empty(concat_shape({plan.lengths()[b]}, tail), packed.data.dtype()));
  }
  const std::size_t rb = row_bytes(packed.data, 1);
  const char* src = static_cast<const char*>(packed.data.raw_data());
  const auto& idx = plan.padded_index();
  for (int64_t r = 0; r < plan.total_rows(); ++r) {
    const int64_t t = idx[r] / B, b = idx[r] % B;
    char* dst = static_cast<char*>(out[static_cast<std::size_t>(b)].raw_data());
    std::memcpy(dst + t * rb, src + r * rb, rb);
  }
  return out;
}

Tensor invert_permutation(const Tensor& permutation) {
  // PyTorch maps None to None; an undefined tensor is the C++ None.
  if (!permutation.defined()) return Tensor();
  const std::vector<int64_t> p = index_vector(permutation, "invert_permutation: permutation");
  check_permutation(p, "invert_permutation: ", "permutation");
  std::vector<int64_t> inv(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) inv[static_cast<std::size_t>(p[i])] = static_cast<int64_t>(i);
  return Tensor::from_vector(inv);
}

Tensor pack_padded_sequence_backward(const Tensor& grad_data, const PackingPlan& plan,
                                     int64_t padded_length, bool batch_first) {
  return scatter_rows(plan, grad_data, padded_length, batch_first, 0.0,
                      "pack_padded_sequence_backward", "padded_length");
}

Tensor pad_packed_sequence_backward(const Tensor& grad_padded, const PackingPlan& plan,
                                    bool batch_first) {
  return gather_rows(plan, grad_padded, batch_first, "pad_packed_sequence_backward");
}

Tensor transpose01(const Tensor& t) {
  if (!t.defined() || t.dim() < 2) {
    throw std::invalid_argument(
        "transpose01: needs at least 2 dimensions, got " +
        (t.defined() ? "shape " + shape_str(t.shape()) : std::string("an undefined tensor")));
  }
  const int64_t A = t.size(0), B = t.size(1);
  Shape s = t.shape();
  std::swap(s[0], s[1]);
  Tensor out = Tensor::empty(s, t.dtype());
  const std::size_t rb = row_bytes(t, 2);
  const char* src = static_cast<const char*>(t.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t a = 0; a < A; ++a) {
    for (int64_t b = 0; b < B; ++b) std::memcpy(dst + (b * A + a) * rb, src + (a * B + b) * rb, rb);
  }
  return out;
}

}  // namespace seqpack
