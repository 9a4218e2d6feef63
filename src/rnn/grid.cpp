// The grid's partitioning (rnn/grid.h): thread counts, column and row shares.
#include "rnn/grid.h"

namespace seqpack::rnn {

namespace {

int64_t min_step_units(const RNNConfig& c) {
  return c.step_units > 0 ? std::max<int64_t>(c.step_units, 16) : kDefaultStepUnits;
}

}  // namespace

int step_threads(const RNNConfig& config, int64_t H, bool by_rows, int available) {
  if (available <= 0) available = omp_get_max_threads();
  if (by_rows) return available;
  const int64_t by_width = std::max<int64_t>(1, H / min_step_units(config));
  return static_cast<int>(std::min<int64_t>(available, by_width));
}

int direction_threads(const RNNOptions& o, const RNNConfig& config, bool by_rows, int64_t rows,
                      int64_t steps) {
  const int64_t floor_rows = std::max<int64_t>(config.step_rows, 0);
  const int all = omp_get_max_threads();
  const int nt = step_threads(config, o.hidden_size, by_rows,
                              o.num_directions() == 2 ? std::max(1, all / 2) : all);
  if (by_rows) {
    if (floor_rows == 0 || nt <= 1) return nt;
    const int64_t mean_rows = rows / std::max<int64_t>(steps, 1);
    return static_cast<int>(std::clamp<int64_t>(mean_rows / floor_rows, 1, nt));
  }
  if (nt <= 1 || !config.work_rule) return nt;
  const int64_t K = o.real_hidden_size(), G = o.gate_count() * o.hidden_size;
  const int64_t bytes = K * G * static_cast<int64_t>(dtype_size(o.dtype));
  const double macs = static_cast<double>(rows) / static_cast<double>(std::max<int64_t>(steps, 1)) *
                      static_cast<double>(K * G);
  const int64_t by_bytes = bytes / (256 << 10);
  const auto by_macs = static_cast<int64_t>(macs / static_cast<double>(1 << 20));
  return static_cast<int>(std::clamp<int64_t>(std::max(by_bytes, by_macs), 1, nt));
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
