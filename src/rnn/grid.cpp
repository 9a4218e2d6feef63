// The grid's partitioning (rnn/grid.h): thread counts, column and row shares.
#include "rnn/grid.h"

namespace seqpack::rnn {

int step_threads(int64_t H, bool by_rows) {
  if (by_rows) return omp_get_max_threads();
  const int64_t by_width = std::max<int64_t>(1, H / 128);
  return static_cast<int>(std::min<int64_t>(omp_get_max_threads(), by_width));
}

void split_columns(int64_t width, int nth, int tid, int64_t& a, int64_t& b) {
  const int64_t blocks = (width + 15) / 16;
  a = std::min(width, blocks * tid / nth * 16);
  b = std::min(width, blocks * (tid + 1) / nth * 16);
}

std::vector<cpu::ColumnRange> step_ranges(int64_t width, int64_t blocks, int nt) {
  std::vector<cpu::ColumnRange> r{{0, width * blocks}};
  if (nt <= 1) return r;
  for (int tid = 0; tid < nt; ++tid) {
    int64_t a, b;
    split_columns(width, nt, tid, a, b);
    for (int64_t q = 0; q < blocks; ++q) r.emplace_back(q * width + a, q * width + b);
  }
  return r;
}

std::size_t step_range(int nth, int tid, int64_t blocks, int64_t q) {
  return nth == 1 ? 0 : static_cast<std::size_t>(1 + tid * blocks + q);
}

int64_t rows_after_h0(const std::vector<int64_t>& bs, int64_t t, int64_t d) {
  const int64_t TT = static_cast<int64_t>(bs.size());
  if (d == 0) return t == 0 ? 0 : bs[static_cast<std::size_t>(t)];
  return t + 1 < TT ? bs[static_cast<std::size_t>(t + 1)] : 0;
}

std::vector<int64_t> row_bounds(const std::vector<int64_t>& bs, int64_t B, int nt) {
  std::vector<int64_t> ending(static_cast<std::size_t>(B + 1), 0);  // steps with bs[t] = v
  for (int64_t n : bs) ++ending[static_cast<std::size_t>(n)];
  std::vector<int64_t> tokens(static_cast<std::size_t>(B + 1), 0);  // in rows [0, r)
  int64_t len = static_cast<int64_t>(bs.size());                    // length of row r
  for (int64_t r = 0; r < B; ++r) {
    len -= ending[static_cast<std::size_t>(r)];
    tokens[static_cast<std::size_t>(r + 1)] = tokens[static_cast<std::size_t>(r)] + len;
  }
  std::vector<int64_t> bounds{0};
  for (int i = 1; i < nt; ++i) {
    int64_t r = bounds.back();
    while (r < B && tokens[static_cast<std::size_t>(r)] * nt < tokens.back() * i) ++r;
    bounds.push_back(r);
  }
  bounds.push_back(B);
  return bounds;
}

}  // namespace seqpack::rnn
