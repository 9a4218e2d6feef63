// The varlen layout of a batch of sequences: their rows one after another in
// the caller's order, sequence b at rows [cu_seqlens[b], cu_seqlens[b + 1])
// (FlashAttention's cu_seqlens, PyTorch's jagged offsets). Moving between it
// and a packed or padded batch is one gather; the index of that gather comes
// from the lengths alone and is computed here.
//
//   lengths 2 0 3  ->  cu_seqlens 0 2 2 5
//   packed rows (time-major, longest first): c0 a0 | c1 a1 | c2
//   varlen rows: a0 a1 c0 c1 c2 = packed[varlen_gather_from_packed(plan)]
//                                = packed[{1, 3, 0, 2, 4}]
#pragma once

#include <cstdint>
#include <vector>

#include "seqpack/packed_sequence.h"

namespace seqpack {

// [0, l0, l0 + l1, ...]: B + 1 offsets. A negative length throws, naming it.
std::vector<int64_t> cu_seqlens_from_lengths(const std::vector<int64_t>& lengths);

// The lengths of a cu_seqlens array, checked: at least one entry, cu_seqlens[0]
// = 0, non-decreasing, and the last entry equal to `total_rows` when that is
// not negative. Errors name the offending entry.
std::vector<int64_t> lengths_from_cu_seqlens(const std::vector<int64_t>& cu_seqlens,
                                             int64_t total_rows = -1);

// index[v] = packed row holding varlen row v, so varlen = packed.data[index].
std::vector<int64_t> varlen_gather_from_packed(const PackingPlan& plan);
// index[r] = varlen row of packed row r, so packed.data = varlen[index].
std::vector<int64_t> packed_gather_from_varlen(const PackingPlan& plan);

// index[v] = row of varlen row v in the padded batch seen as rows, [B * T]
// (batch_first) or [T * B], so varlen = padded_rows[index]. Lengths are checked
// against padded_length.
std::vector<int64_t> varlen_gather_from_padded(const std::vector<int64_t>& lengths,
                                               int64_t padded_length, bool batch_first);
// index[p] = varlen row of padded row p, or sum(lengths) for a padding slot,
// so padded_rows = (varlen rows followed by one padding row)[index].
std::vector<int64_t> padded_gather_from_varlen(const std::vector<int64_t>& lengths,
                                               int64_t padded_length, bool batch_first);

}  // namespace seqpack
