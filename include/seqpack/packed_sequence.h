// Packing utilities with the names, arguments and semantics of PyTorch 1.13's
// torch.nn.utils.rnn, plus zero-length sequences.
//
//   std::vector<Tensor> seqs = {a /*[3, F]*/, b /*[2, F]*/, c /*[4, F]*/};
//   PackedSequence p = pack_sequence(seqs, /*enforce_sorted=*/false);
//   // p.data rows: c0 a0 b0 | c1 a1 b1 | c2 a2 | c3     batch_sizes = [3, 3, 2, 1]
//   // p.sorted_indices = [2, 0, 1]   p.unsorted_indices = [1, 2, 0]
//   auto [padded, lengths] = pad_packed_sequence(p);   // [4, 3, F], lengths = [3, 2, 4]
//
// Layout: packed data is time-major. batch_sizes[t] is the number of sequences
// longer than t; rows of step t are the first batch_sizes[t] sequences in
// length-descending order (stable: ties keep the caller's order).
//
// Beyond PyTorch: zero-length sequences are accepted everywhere. They contribute
// no packed rows, get all-padding rows when padded, and report length 0.
#pragma once

#include <iosfwd>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "seqpack/tensor.h"

namespace seqpack {

struct PackedSequence {
  Tensor data;              // [sum(lengths), *features]
  Tensor batch_sizes;       // int64 [max_len], non-increasing
  Tensor sorted_indices;    // int64 [batch] or undefined (enforce_sorted=true)
  Tensor unsorted_indices;  // int64 [batch] or undefined

  // Checks the invariants of a hand-built PackedSequence and throws
  // std::invalid_argument naming the first offending value.
  void validate() const;
  // Number of sequences in the batch (including zero-length ones).
  int64_t batch_size() const;
  // PyTorch's repr: "PackedSequence(data=tensor([...]), batch_sizes=tensor([...]), ...)".
  std::string to_string() const;
};

// Writes p.to_string() (PyTorch's repr), as operator<< of Tensor does.
std::ostream& operator<<(std::ostream& out, const PackedSequence& p);

enum class PaddingSide { right, left };

// Index maps computed once from the lengths and reused for forward and backward
// (packing, unpacking and their gradients, and the recurrent layers).
class PackingPlan {
 public:
  // Lengths in the caller's order. With enforce_sorted, lengths must be
  // non-increasing; otherwise they are stably sorted by decreasing length.
  static PackingPlan from_lengths(const std::vector<int64_t>& lengths, bool enforce_sorted);
  // The plan of an existing PackedSequence (validated).
  static PackingPlan from_packed(const PackedSequence& packed);

  int64_t batch() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t max_len() const { return static_cast<int64_t>(batch_sizes_.size()); }
  int64_t total_rows() const { return total_rows_; }
  const std::vector<int64_t>& lengths() const { return lengths_; }  // caller's order
  const std::vector<int64_t>& batch_sizes() const { return batch_sizes_; }
  // sorted_indices()[k] = caller's index of the k-th longest sequence.
  const std::vector<int64_t>& sorted_indices() const { return sorted_indices_; }
  const std::vector<int64_t>& unsorted_indices() const { return unsorted_indices_; }
  bool enforce_sorted() const { return enforce_sorted_; }
  // offsets()[t] = first packed row of step t; offsets()[max_len] = total_rows.
  const std::vector<int64_t>& offsets() const { return offsets_; }

  // Packed data row r holds time step t of caller's sequence b, where
  // padded_index()[r] = t * batch + b (the row of a time-major [T, B] padding).
  const std::vector<int64_t>& padded_index() const { return padded_index_; }

  // Gather: padded [T, B, *f] (T >= max_len) -> packed rows [total_rows, *f].
  Tensor pack(const Tensor& padded_time_major) const;
  // Scatter: packed rows -> padded [total_length, B, *f], padding elsewhere.
  Tensor unpack(const Tensor& packed_rows, int64_t total_length, double padding_value) const;

  // True when some sequence has length 0 (batch() > batch_sizes()[0]).
  bool has_zero_length() const;

  // The int64 tensors of a PackedSequence with this layout.
  Tensor batch_sizes_tensor() const;
  // Undefined when enforce_sorted, except with zero-length sequences: those have
  // no packed rows, so the (identity) indices are kept to record the batch size.
  Tensor sorted_indices_tensor() const;
  Tensor unsorted_indices_tensor() const;

 private:
  std::vector<int64_t> lengths_, batch_sizes_, sorted_indices_, unsorted_indices_, offsets_,
      padded_index_;
  int64_t total_rows_ = 0;
  bool enforce_sorted_ = true;
};

Tensor pad_sequence(const std::vector<Tensor>& sequences, bool batch_first = false,
                    double padding_value = 0.0, PaddingSide padding_side = PaddingSide::right);

// `lengths` may be given as a vector or an int64 tensor (1-D).
PackedSequence pack_padded_sequence(const Tensor& input, const std::vector<int64_t>& lengths,
                                    bool batch_first = false, bool enforce_sorted = true);
PackedSequence pack_padded_sequence(const Tensor& input, const Tensor& lengths,
                                    bool batch_first = false, bool enforce_sorted = true);

PackedSequence pack_sequence(const std::vector<Tensor>& sequences, bool enforce_sorted = true);

// Returns (padded, lengths), both in the caller's original order; lengths is int64 [B].
std::pair<Tensor, Tensor> pad_packed_sequence(const PackedSequence& sequence,
                                              bool batch_first = false,
                                              double padding_value = 0.0,
                                              std::optional<int64_t> total_length = std::nullopt);

// Never modifies `padded` (PyTorch's transposes its input in place).
std::vector<Tensor> unpad_sequence(const Tensor& padded, const std::vector<int64_t>& lengths,
                                   bool batch_first = false);
std::vector<Tensor> unpack_sequence(const PackedSequence& packed);

// inverse[perm[i]] = i; throws if perm is not a permutation of 0..n-1.
Tensor invert_permutation(const Tensor& permutation);

// Gradients. pack_padded_sequence's backward scatters the packed gradient into a
// zero padded tensor of the input's shape; pad_packed_sequence's gathers rows.
Tensor pack_padded_sequence_backward(const Tensor& grad_data, const PackingPlan& plan,
                                     int64_t padded_length, bool batch_first);
Tensor pad_packed_sequence_backward(const Tensor& grad_padded, const PackingPlan& plan,
                                    bool batch_first);

// Swaps dims 0 and 1 (a copy): batch-first <-> time-major.
Tensor transpose01(const Tensor& t);

}  // namespace seqpack
