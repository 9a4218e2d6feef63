// Index maps between the varlen layout and packed or padded batches.
#include "seqpack/varlen.h"

#include <stdexcept>
#include <string>

namespace seqpack {

std::vector<int64_t> cu_seqlens_from_lengths(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> cu(lengths.size() + 1, 0);
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    if (lengths[b] < 0) {
      throw std::invalid_argument("cu_seqlens_from_lengths: lengths[" + std::to_string(b) +
                                  "] = " + std::to_string(lengths[b]) + " is negative");
    }
    cu[b + 1] = cu[b] + lengths[b];
  }
  return cu;
}

std::vector<int64_t> lengths_from_cu_seqlens(const std::vector<int64_t>& cu_seqlens,
                                             int64_t total_rows) {
  if (cu_seqlens.empty()) {
    throw std::invalid_argument("cu_seqlens is empty; it needs B + 1 entries starting at 0");
  }
  if (cu_seqlens[0] != 0) {
    throw std::invalid_argument("cu_seqlens[0] = " + std::to_string(cu_seqlens[0]) + " must be 0");
  }
  std::vector<int64_t> lengths(cu_seqlens.size() - 1);
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    if (cu_seqlens[b + 1] < cu_seqlens[b]) {
      throw std::invalid_argument(
          "cu_seqlens[" + std::to_string(b + 1) + "] = " + std::to_string(cu_seqlens[b + 1]) +
          " is less than cu_seqlens[" + std::to_string(b) + "] = " + std::to_string(cu_seqlens[b]));
    }
    lengths[b] = cu_seqlens[b + 1] - cu_seqlens[b];
  }
  if (total_rows >= 0 && cu_seqlens.back() != total_rows) {
    throw std::invalid_argument("cu_seqlens[" + std::to_string(lengths.size()) + "] = " +
                                std::to_string(cu_seqlens.back()) + " does not match the " +
                                std::to_string(total_rows) + " rows of the values");
  }
  return lengths;
}

namespace {
// Calls f(packed row, varlen row) for every row of the plan.
template <typename F>
void for_each_packed_row(const PackingPlan& plan, F&& f) {
  const std::vector<int64_t> cu = cu_seqlens_from_lengths(plan.lengths());
  const int64_t B = plan.batch();
  const std::vector<int64_t>& padded = plan.padded_index();
  for (int64_t r = 0; r < plan.total_rows(); ++r) {
    const int64_t p = padded[static_cast<std::size_t>(r)];
    f(r, cu[static_cast<std::size_t>(p % B)] + p / B);
  }
}

void check_lengths(const char* fn, const std::vector<int64_t>& lengths, int64_t padded_length) {
  if (padded_length < 0) {
    throw std::invalid_argument(
        std::string(fn) + ": padded_length = " + std::to_string(padded_length) + " is negative");
  }
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    if (lengths[b] < 0 || lengths[b] > padded_length) {
      throw std::invalid_argument(
          std::string(fn) + ": lengths[" + std::to_string(b) + "] = " + std::to_string(lengths[b]) +
          (lengths[b] < 0 ? " is negative"
                          : " exceeds the padded length " + std::to_string(padded_length)));
    }
  }
}
}  // namespace

std::vector<int64_t> varlen_gather_from_packed(const PackingPlan& plan) {
  std::vector<int64_t> index(static_cast<std::size_t>(plan.total_rows()));
  for_each_packed_row(plan, [&](int64_t r, int64_t v) { index[static_cast<std::size_t>(v)] = r; });
  return index;
}

std::vector<int64_t> packed_gather_from_varlen(const PackingPlan& plan) {
  std::vector<int64_t> index(static_cast<std::size_t>(plan.total_rows()));
  for_each_packed_row(plan, [&](int64_t r, int64_t v) { index[static_cast<std::size_t>(r)] = v; });
  return index;
}

std::vector<int64_t> varlen_gather_from_padded(const std::vector<int64_t>& lengths,
                                               int64_t padded_length, bool batch_first) {
  check_lengths("varlen_gather_from_padded", lengths, padded_length);
  const int64_t B = static_cast<int64_t>(lengths.size());
  std::vector<int64_t> index;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < lengths[static_cast<std::size_t>(b)]; ++t)
      index.push_back(batch_first ? b * padded_length + t : t * B + b);
  }
  return index;
}

std::vector<int64_t> padded_gather_from_varlen(const std::vector<int64_t>& lengths,
                                               int64_t padded_length, bool batch_first) {
  check_lengths("padded_gather_from_varlen", lengths, padded_length);
  const std::vector<int64_t> cu = cu_seqlens_from_lengths(lengths);
  const int64_t B = static_cast<int64_t>(lengths.size());
  std::vector<int64_t> index(static_cast<std::size_t>(B * padded_length), cu.back());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < lengths[static_cast<std::size_t>(b)]; ++t) {
      const int64_t p = batch_first ? b * padded_length + t : t * B + b;
      index[static_cast<std::size_t>(p)] = cu[static_cast<std::size_t>(b)] + t;
    }
  }
  return index;
}

}  // namespace seqpack
