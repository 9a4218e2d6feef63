// `seqpack demo`: walks through packing on the example the documents use,
// sequences [1, 2, 3], [4, 5], [6, 7, 8, 9], then runs a small LSTM over a
// packed batch. Uses only the public headers, like every subcommand.
#include <fmt/core.h>

#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "seqpack/packed_sequence.h"
#include "seqpack/rnn.h"

namespace {

using seqpack::PackedSequence;
using seqpack::Tensor;

// "6, 1, 4": whole numbers for the packing example; with `fixed`, every value
// with 4 decimals (the LSTM's outputs).
std::string join(const Tensor& t, int64_t begin = 0, int64_t end = -1, bool fixed = false) {
  if (end < 0) end = t.numel();
  std::string s;
  for (int64_t i = begin; i < end; ++i) {
    if (i > begin) s += ", ";
    const double v = t.item_as_double(i);
    s += fixed ? fmt::format("{:.4f}", v) : fmt::format("{}", static_cast<int64_t>(v));
  }
  return s;
}

// Prints a [rows, cols] block, one row per line, each row as "[a, b, c]".
void print_rows(const Tensor& t, const std::string& indent, const std::vector<std::string>& labels,
                bool fixed = false) {
  const int64_t rows = t.size(0), cols = t.numel() / (rows ? rows : 1);
  for (int64_t r = 0; r < rows; ++r) {
    const std::string label = r < static_cast<int64_t>(labels.size()) ? labels[r] + " " : "";
    fmt::print("{}{}[{}]\n", indent, label, join(t, r * cols, (r + 1) * cols, fixed));
  }
}

const char* kNames[] = {"a", "b", "c"};

void packing_walkthrough() {
  const std::vector<Tensor> seqs = {Tensor::from_vector<float>({1, 2, 3}),
                                    Tensor::from_vector<float>({4, 5}),
                                    Tensor::from_vector<float>({6, 7, 8, 9})};
  fmt::print("Three sequences of different lengths, one feature per step:\n");
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    fmt::print("  {} = {:<14} (length {})\n", kNames[b], "[" + join(seqs[b]) + "]", seqs[b].size(0));
  }

  const Tensor padded = seqpack::pad_sequence(seqs, /*batch_first=*/true);
  const int64_t B = padded.size(0), T = padded.size(1);
  fmt::print("\n1. Padded batch (pad_sequence, batch_first=true, padding 0): shape [{}, {}]\n", B, T);
  print_rows(padded, "   ", {"a", "b", "c"});

  const PackedSequence p = seqpack::pack_sequence(seqs, /*enforce_sorted=*/false);
  fmt::print("\n2. Packed (pack_sequence, enforce_sorted=false):\n   {}\n", p.to_string());
  fmt::print("   data             = {}\n", join(p.data));
  fmt::print("   batch_sizes      = {}   (sequences still running at each step)\n",
             join(p.batch_sizes));
  fmt::print("   sorted_indices   = {}   (longest first: c, a, b; ties keep the given order)\n",
             join(p.sorted_indices));
  fmt::print("   unsorted_indices = {}   (position of a, b, c in that sorted order)\n",
             join(p.unsorted_indices));

  fmt::print("\n3. Reading the packed data step by step (time-major, longest sequence first):\n");
  const std::vector<int64_t> bs = p.batch_sizes.to_vector<int64_t>();
  const std::vector<int64_t> order = p.sorted_indices.to_vector<int64_t>();
  int64_t row = 0;
  for (std::size_t t = 0; t < bs.size(); ++t) {
    std::string who, idx;
    for (int64_t k = 0; k < bs[t]; ++k) {
      who += std::string(k ? ", " : "") + kNames[order[k]];
      idx += std::string(k ? ", " : "") + std::to_string(order[k]);
    }
    const std::string rows = bs[t] == 1 ? fmt::format("row {}", row)
                                        : fmt::format("rows {}-{}", row, row + bs[t] - 1);
    fmt::print("   step {}: {:<9} = [{}]  = step {} of sequences {} (indices {})\n", t, rows,
               join(p.data, row, row + bs[t]), t, who, idx);
    row += bs[t];
  }

  auto [unpacked, lengths] = seqpack::pad_packed_sequence(p, /*batch_first=*/true);
  fmt::print("\n4. Unpacked (pad_packed_sequence, batch_first=true), in the original order:\n");
  print_rows(unpacked, "   ", {"a", "b", "c"});
  fmt::print("   lengths = {}\n", join(lengths));

  const int64_t slots = B * T, rows_packed = p.data.size(0);
  fmt::print("\n5. Computation saved: a recurrent layer over the padded batch runs {} steps "
             "({} x {});\n   over the packed batch it runs {} rows: {} fewer, {:.0f}% saved.\n",
             slots, B, T, rows_packed, slots - rows_packed,
             100.0 * static_cast<double>(slots - rows_packed) / static_cast<double>(slots));
}

void lstm_walkthrough(uint64_t seed) {
  const Tensor x = Tensor::from_vector<float>({1, 1, 2, 2, 3, 3, 4, 4, 5, 5}, {5, 2});
  const Tensor y = Tensor::from_vector<float>({10, 10, 20, 20}, {2, 2});
  fmt::print("\n6. An LSTM (input_size 2, hidden_size 3, weights drawn from seed {}) over the\n"
             "   packed batch x = [[1, 1], [2, 2], [3, 3], [4, 4], [5, 5]] and y = [[10, 10], "
             "[20, 20]]:\n", seed);
  seqpack::LSTM lstm({.mode = seqpack::RNNMode::lstm, .input_size = 2, .hidden_size = 3}, seed);
  const PackedSequence p = seqpack::pack_sequence({x, y});
  fmt::print("   packed input batch_sizes = {}\n", join(p.batch_sizes));
  const seqpack::RNNOutput out = lstm.forward(p, Tensor(), Tensor(), /*requires_grad=*/false);
  fmt::print("   packed output ({} rows, time-major like the input):\n", out.packed.data.size(0));
  print_rows(out.packed.data, "     ", {"x0", "y0", "x1", "y1", "x2", "x3", "x4"}, true);
  fmt::print("   h_n (the state at each sequence's own last step: x at step 4, y at step 1):\n");
  print_rows(out.h_n.view({2, 3}), "     ", {"x", "y"}, true);
  fmt::print("   c_n:\n");
  print_rows(out.c_n.view({2, 3}), "     ", {"x", "y"}, true);
  auto [unpacked, lengths] = seqpack::pad_packed_sequence(out.packed, /*batch_first=*/true);
  fmt::print("   unpacked output (pad_packed_sequence, batch_first=true), shape [2, 5, 3]; "
             "y is zero after its 2 steps:\n");
  for (int64_t b = 0; b < 2; ++b) {
    fmt::print("     {}:\n", b == 0 ? "x" : "y");
    print_rows(unpacked.select0(b), "       ", {}, true);
  }
  fmt::print("   lengths = {}\n", join(lengths));
}

const bool registered = seqpack::cli::register_command(
    {"demo", "walk through packing three sequences, then an LSTM over a packed batch",
     [](CLI::App& sub) {
       auto seed = std::make_shared<uint64_t>(0);
       seqpack::cli::add_number<uint64_t>(sub, "--seed", *seed, "seed of the LSTM's weights", 0);
       sub.callback([seed] {
         packing_walkthrough();
         lstm_walkthrough(*seed);
       });
     }});

}  // namespace
