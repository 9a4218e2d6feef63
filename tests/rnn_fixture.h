// Loads the PyTorch RNN fixtures written by tests/fixtures/gen_rnn.py and moves
// per-sequence rows in and out of the packed and padded layouts with plain
// loops (independent of PackingPlan, so a packing bug cannot hide an RNN bug
// or the other way round). Shared by the RNN reference, parity and gradient tests.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "seqpack/rnn.h"
#include "test_util.h"

namespace seqpack::testing {

// A tensor gen_rnn.py generated from a seed instead of storing it:
// {"generator": "splitmix64", "seed", "shape", "scale"}. Element i (row-major)
// is k / 2^23 * scale with k = (splitmix64(seed, i) >> 40) - 2^23, exact in
// float32 and float64 (|k| < 2^24, scale a power of two): splitmix64_values in
// gen_rnn.py computes the same numbers.
inline Tensor generated_tensor(const nlohmann::json& j, DType dtype) {
  if (j.at("generator").get<std::string>() != "splitmix64") {
    throw std::runtime_error("unknown fixture generator " + j.at("generator").dump());
  }
  Shape shape = j.at("shape").get<Shape>();
  const uint64_t seed = j.at("seed").get<uint64_t>();
  const double scale = j.at("scale").get<double>();
  Tensor t = Tensor::empty(shape, DType::f64);
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint64_t z = seed + static_cast<uint64_t>(i + 1) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    const int64_t k = static_cast<int64_t>(z >> 40) - (int64_t{1} << 23);
    t.data<double>()[i] = static_cast<double>(k) * (scale / static_cast<double>(1 << 23));
  }
  return t.to(dtype);
}

// A stored tensor or a generated one.
inline Tensor fixture_tensor(const nlohmann::json& j, DType dtype) {
  return j.is_object() && j.contains("generator") ? generated_tensor(j, dtype)
                                                  : tensor_from_json(j, dtype);
}

// A gradient stored at a sample of its elements (the wide cases' weight
// matrices): flat row-major indices and PyTorch's values there.
struct SampledGrad {
  Shape shape;
  std::vector<int64_t> index;
  std::vector<double> values;
};

struct RNNCase {
  std::string name;
  RNNOptions options;
  std::string kind;  // "packed", "padded", "padded_lengths", "unbatched"
  std::vector<int64_t> lengths;
  bool enforce_sorted = true;
  int64_t total_length = 0;                  // padded_lengths cases padded beyond max_len(); else 0
  std::vector<std::string> parameter_names;  // PyTorch's _flat_weights_names
  std::vector<Tensor> weights;               // in that order, options.dtype
  std::vector<Tensor> sequences;             // caller's order, [len_b, input_size]
  Tensor input;                              // packed data, or the padded / unbatched tensor
  Tensor batch_sizes;
  std::vector<int64_t> sorted_indices;  // empty when PyTorch gave None
  Tensor h0, c0;                        // undefined when not given; as stored
  Tensor output;                        // packed data or padded
  Tensor h_n, c_n;
  Tensor grad_output, grad_h_n, grad_c_n;
  std::map<std::string, Tensor> grads;  // "input", "h0", "c0" and parameter names
  std::map<std::string, SampledGrad> sampled_grads;  // parameters stored as a sample

  int64_t batch() const { return static_cast<int64_t>(lengths.size()); }
  int64_t max_len() const {
    int64_t m = 0;
    for (int64_t n : lengths) m = std::max(m, n);
    return m;
  }
  // Steps of the padded input and output: max_len(), or more when the case
  // pads to a fixed total_length.
  int64_t padded_len() const { return total_length > 0 ? total_length : max_len(); }
  // Caller's index of the k-th sequence in packed order.
  int64_t sorted(int64_t k) const {
    return sorted_indices.empty() ? k : sorted_indices[static_cast<std::size_t>(k)];
  }
};

inline RNNMode rnn_mode_from(const std::string& s) {
  if (s == "rnn_tanh") return RNNMode::rnn_tanh;
  if (s == "rnn_relu") return RNNMode::rnn_relu;
  if (s == "lstm") return RNNMode::lstm;
  if (s == "gru") return RNNMode::gru;
  throw std::runtime_error("unknown mode " + s);
}

inline std::vector<RNNCase> load_rnn_cases() {
  std::vector<RNNCase> cases;
  for (const char* file :
       {"rnn_rnn_tanh.json", "rnn_rnn_relu.json", "rnn_lstm.json", "rnn_gru.json"}) {
    const nlohmann::json doc = load_fixture(file);
    for (const auto& j : doc.at("cases")) {
      RNNCase c;
      c.name = j.at("name").get<std::string>();
      const auto& o = j.at("options");
      c.options.mode = rnn_mode_from(o.at("mode").get<std::string>());
      c.options.input_size = o.at("input_size").get<int64_t>();
      c.options.hidden_size = o.at("hidden_size").get<int64_t>();
      c.options.num_layers = o.at("num_layers").get<int64_t>();
      c.options.bias = o.at("bias").get<bool>();
      c.options.batch_first = o.at("batch_first").get<bool>();
      c.options.bidirectional = o.at("bidirectional").get<bool>();
      c.options.proj_size = o.at("proj_size").get<int64_t>();
      c.options.dtype = o.at("dtype").get<std::string>() == "float64" ? DType::f64 : DType::f32;
      const DType dt = c.options.dtype;
      c.kind = j.at("kind").get<std::string>();
      c.lengths = j.at("lengths").get<std::vector<int64_t>>();
      if (j.contains("enforce_sorted")) c.enforce_sorted = j.at("enforce_sorted").get<bool>();
      if (j.contains("total_length")) c.total_length = j.at("total_length").get<int64_t>();
      c.parameter_names = j.at("parameter_names").get<std::vector<std::string>>();
      for (const auto& n : c.parameter_names) {
        c.weights.push_back(fixture_tensor(j.at("state_dict").at(n), dt));
      }
      for (const auto& s : j.at("sequences")) {
        Tensor t = tensor_from_json(s, dt);
        // A JSON [[...]] of one row parses fine; only an empty list would lose
        // its feature dimension, and PyTorch fixtures have no empty sequences.
        c.sequences.push_back(t);
      }
      if (c.kind == "packed") {
        const auto& in = j.at("input");
        c.input = tensor_from_json(in.at("data"), dt);
        c.batch_sizes = tensor_from_json(in.at("batch_sizes"), DType::i64);
        if (!in.at("sorted_indices").is_null()) {
          c.sorted_indices = in.at("sorted_indices").get<std::vector<int64_t>>();
        }
        c.output = tensor_from_json(j.at("output").at("data"), dt);
      } else {
        c.input = tensor_from_json(j.at("input"), dt);
        c.output = tensor_from_json(j.at("output"), dt);
      }
      if (j.contains("h0")) c.h0 = fixture_tensor(j.at("h0"), dt);
      if (j.contains("c0")) c.c0 = fixture_tensor(j.at("c0"), dt);
      c.h_n = tensor_from_json(j.at("h_n"), dt);
      if (j.contains("c_n")) c.c_n = tensor_from_json(j.at("c_n"), dt);
      c.grad_output = fixture_tensor(j.at("grad_output"), dt);
      c.grad_h_n = fixture_tensor(j.at("grad_h_n"), dt);
      if (j.contains("grad_c_n")) c.grad_c_n = fixture_tensor(j.at("grad_c_n"), dt);
      for (auto it = j.at("grads").begin(); it != j.at("grads").end(); ++it) {
        const auto& v = it.value();
        if (v.is_object() && v.contains("sampled_index")) {
          c.sampled_grads[it.key()] = {v.at("shape").get<Shape>(),
                                       v.at("sampled_index").get<std::vector<int64_t>>(),
                                       v.at("sampled_values").get<std::vector<double>>()};
        } else {
          c.grads[it.key()] = tensor_from_json(v, dt);
        }
      }
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

// One RNNCell / LSTMCell / GRUCell step (rnn_cells.json).
struct RNNCellCase {
  std::string name;
  RNNMode mode = RNNMode::rnn_tanh;
  int64_t input_size = 0, hidden_size = 0;
  bool bias = true;
  DType dtype = DType::f32;
  bool unbatched = false;
  std::vector<std::string> parameter_names;  // weight_ih, weight_hh[, bias_ih, bias_hh]
  std::vector<Tensor> weights;
  Tensor input, hx, cx, h, c, grad_h, grad_c;
  std::map<std::string, Tensor> grads;  // "input", "hx", "cx" and parameter names
  int64_t batch() const { return unbatched ? 1 : input.size(0); }
};

inline std::vector<RNNCellCase> load_rnn_cell_cases() {
  std::vector<RNNCellCase> cases;
  const nlohmann::json doc = load_fixture("rnn_cells.json");
  for (const auto& j : doc.at("cases")) {
    RNNCellCase c;
    c.name = j.at("name").get<std::string>();
    c.mode = rnn_mode_from(j.at("mode").get<std::string>());
    c.input_size = j.at("input_size").get<int64_t>();
    c.hidden_size = j.at("hidden_size").get<int64_t>();
    c.bias = j.at("bias").get<bool>();
    c.dtype = j.at("dtype").get<std::string>() == "float64" ? DType::f64 : DType::f32;
    c.parameter_names = j.at("parameter_names").get<std::vector<std::string>>();
    for (const auto& n : c.parameter_names) {
      c.weights.push_back(tensor_from_json(j.at("state_dict").at(n), c.dtype));
    }
    c.input = tensor_from_json(j.at("input"), c.dtype);
    c.unbatched = c.input.dim() == 1;
    if (j.contains("hx")) c.hx = tensor_from_json(j.at("hx"), c.dtype);
    if (j.contains("cx")) c.cx = tensor_from_json(j.at("cx"), c.dtype);
    c.h = tensor_from_json(j.at("h"), c.dtype);
    c.grad_h = tensor_from_json(j.at("grad_h"), c.dtype);
    if (j.contains("c")) c.c = tensor_from_json(j.at("c"), c.dtype);
    if (j.contains("grad_c")) c.grad_c = tensor_from_json(j.at("grad_c"), c.dtype);
    for (auto it = j.at("grads").begin(); it != j.at("grads").end(); ++it) {
      c.grads[it.key()] = tensor_from_json(it.value(), c.dtype);
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

// Per-sequence rows [len_b, F] (caller's order) -> the case's output layout:
// packed rows, padded [T, B, F] / [B, T, F] with zeros at padding, or [T, F].
inline Tensor rows_to_layout(const RNNCase& c, const std::vector<Tensor>& rows, int64_t features) {
  const int64_t B = c.batch();
  int64_t T = c.max_len();
  if (c.kind == "packed") {
    int64_t total = 0;
    for (int64_t n : c.lengths) total += n;
    Tensor out = Tensor::zeros({total, features}, DType::f64);
    int64_t r = 0;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < B; ++k) {
        const int64_t b = c.sorted(k);
        if (c.lengths[static_cast<std::size_t>(b)] <= t) continue;
        for (int64_t f = 0; f < features; ++f) {
          out.data<double>()[r * features + f] =
              rows[static_cast<std::size_t>(b)].item_as_double(t * features + f);
        }
        ++r;
      }
    }
    return out;
  }
  if (c.kind == "unbatched") return rows[0].to(DType::f64).view({T, features});
  const bool bf = c.options.batch_first;
  T = c.padded_len();
  Tensor out = Tensor::zeros(bf ? Shape{B, T, features} : Shape{T, B, features}, DType::f64);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < c.lengths[static_cast<std::size_t>(b)]; ++t) {
      const int64_t dst = bf ? (b * T + t) : (t * B + b);
      for (int64_t f = 0; f < features; ++f) {
        out.data<double>()[dst * features + f] =
            rows[static_cast<std::size_t>(b)].item_as_double(t * features + f);
      }
    }
  }
  return out;
}

// The inverse: a tensor in the case's layout -> per-sequence rows (float64).
// Padding positions are dropped.
inline std::vector<Tensor> layout_to_rows(const RNNCase& c, const Tensor& x, int64_t features) {
  const int64_t B = c.batch();
  int64_t T = c.max_len();
  std::vector<Tensor> rows;
  for (int64_t b = 0; b < B; ++b) {
    rows.push_back(Tensor::zeros({c.lengths[static_cast<std::size_t>(b)], features}, DType::f64));
  }
  if (c.kind == "packed") {
    int64_t r = 0;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < B; ++k) {
        const int64_t b = c.sorted(k);
        if (c.lengths[static_cast<std::size_t>(b)] <= t) continue;
        for (int64_t f = 0; f < features; ++f) {
          rows[static_cast<std::size_t>(b)].data<double>()[t * features + f] =
              x.item_as_double(r * features + f);
        }
        ++r;
      }
    }
    return rows;
  }
  const bool bf = c.options.batch_first && c.kind != "unbatched";
  T = c.padded_len();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < c.lengths[static_cast<std::size_t>(b)]; ++t) {
      const int64_t src = bf ? (b * T + t) : (t * B + b);
      for (int64_t f = 0; f < features; ++f) {
        rows[static_cast<std::size_t>(b)].data<double>()[t * features + f] =
            x.item_as_double(src * features + f);
      }
    }
  }
  return rows;
}

// h/c states as the layers see them: unbatched [N, H] -> [N, 1, H].
inline Tensor batched_state(const RNNCase& c, const Tensor& s) {
  if (!s.defined() || c.kind != "unbatched") return s;
  return s.view({s.size(0), 1, s.size(1)});
}

// n of fp_close (test_util.h, docs/testing.md) for every value and gradient of
// a case: its recurrence over every token of the batch (a weight gradient sums
// over all of them; an output depends on fewer).
inline int64_t case_n(const RNNCase& c) {
  int64_t tokens = 0;
  for (int64_t n : c.lengths) tokens += n;
  return rnn_reduction_length(c.options, tokens);
}

// The gradient of parameter `name` against PyTorch's: every element, or the
// stored sample of them (the same bound, scaled by the sample's largest
// magnitude). Reports the first mismatches.
inline ::testing::AssertionResult parameter_grad_close(const RNNCase& c, const std::string& name,
                                                       const Tensor& actual) {
  const std::string what = c.name + " grad " + name;
  const auto s = c.sampled_grads.find(name);
  if (s == c.sampled_grads.end()) {
    return fp_close(actual, c.grads.at(name), case_n(c), c.options.dtype, what);
  }
  const SampledGrad& g = s->second;
  if (actual.shape() != g.shape) {
    return ::testing::AssertionFailure() << what << ": shape " << shape_str(actual.shape())
                                         << " != expected " << shape_str(g.shape);
  }
  double scale = 0;
  for (double e : g.values) scale = std::max(scale, std::fabs(e));
  const double tol = 2.0 * unit_roundoff(c.options.dtype) * static_cast<double>(case_n(c)) * scale;
  ::testing::AssertionResult res = ::testing::AssertionFailure();
  res << what << " (sampled):";
  int bad = 0;
  for (size_t k = 0; k < g.index.size(); ++k) {
    const double a = actual.item_as_double(g.index[k]), e = g.values[k];
    if (!(std::fabs(a - e) <= tol)) {
      if (bad < 5) res << " [" << g.index[k] << "] got " << a << " expected " << e << ";";
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  res << " " << bad << " of " << g.index.size() << " sampled elements differ (bound " << tol << ")";
  return res;
}


}  // namespace seqpack::testing
