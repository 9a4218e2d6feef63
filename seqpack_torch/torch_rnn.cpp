#include "torch_rnn.h"

namespace seqpack::torch_ops {

std::tuple<at::Tensor, at::Tensor, at::Tensor> torch_packed_rnn(
    const TorchRnn& r, const at::Tensor& data, const at::Tensor& h0, const at::Tensor& c0,
    const std::vector<at::Tensor>& weights) {
  using at::Tensor;
  const int64_t D = r.bidirectional ? 2 : 1, L = r.num_layers;
  const bool lstm = r.mode == "LSTM";
  const Tensor batch_sizes = r.batch_sizes.contiguous();
  const Tensor &sorted = r.sorted_indices, &unsorted = r.unsorted_indices;
  // Sequences with rows (the others are the last ones in the sorted order).
  const int64_t running = batch_sizes.numel() > 0 ? batch_sizes.data_ptr<int64_t>()[0] : 0;
  Tensor h = sorted.defined() ? h0.index_select(1, sorted.to(h0.device())) : h0;
  Tensor c = lstm && sorted.defined() ? c0.index_select(1, sorted.to(c0.device())) : c0;
  const int64_t batch = h.size(1);
  Tensor x = data;
  std::vector<Tensor> h_n, c_n;
  if (running > 0) {
    const int64_t per = static_cast<int64_t>(weights.size()) / (L * D);
    for (int64_t l = 0; l < L; ++l) {
      const auto k = static_cast<size_t>(l);
      if (k < r.masks.size() && r.masks[k].defined()) x = x * r.masks[k];
      const std::vector<Tensor> p(weights.begin() + l * D * per,
                                  weights.begin() + (l + 1) * D * per);
      const Tensor hl = h.narrow(0, l * D, D).narrow(1, 0, running);
      Tensor out, hn, cn;
      if (lstm) {
        std::tie(out, hn, cn) =
            at::lstm(x, batch_sizes, {hl, c.narrow(0, l * D, D).narrow(1, 0, running)}, p,
                     r.bias, 1, 0.0, false, r.bidirectional);
        c_n.push_back(cn);
      } else if (r.mode == "GRU") {
        std::tie(out, hn) = at::gru(x, batch_sizes, hl, p, r.bias, 1, 0.0, false, r.bidirectional);
      } else if (r.mode == "RNN_TANH") {
        std::tie(out, hn) =
            at::rnn_tanh(x, batch_sizes, hl, p, r.bias, 1, 0.0, false, r.bidirectional);
      } else {
        std::tie(out, hn) =
            at::rnn_relu(x, batch_sizes, hl, p, r.bias, 1, 0.0, false, r.bidirectional);
      }
      h_n.push_back(hn);
      x = out;
    }
  } else {
    x = at::zeros({data.size(0), D * h0.size(2)}, data.options());
  }
  // The states of zero-length sequences pass through; then the caller's order.
  auto finish = [&](std::vector<Tensor>& layers, const Tensor& initial) {
    Tensor t = running > 0 ? at::cat(layers, 0) : initial;
    if (running > 0 && running < batch) {
      t = at::cat({t, initial.narrow(1, running, batch - running)}, 1);
    }
    return unsorted.defined() ? t.index_select(1, unsorted.to(t.device())) : t;
  };
  Tensor h_out = finish(h_n, h);
  Tensor c_out = lstm ? finish(c_n, c) : Tensor();
  return {x, h_out, c_out};
}

}  // namespace seqpack::torch_ops
