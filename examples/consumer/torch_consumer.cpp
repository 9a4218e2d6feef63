// A LibTorch program using seqpack's PyTorch operators from an installed
// seqpack (find_package(seqpack CONFIG COMPONENTS torch), target seqpack::torch),
// as torchvision's C++ operators are used: linking the library registers the
// operators, which the dispatcher then finds by name (and torch::jit::load
// in a TorchScript model scripted from seqpack.torch). Nothing here refers to
// libseqpack_torch by symbol: seqpack::torch makes the linker keep it.
//
// Runs seqpack::rnn_padded, a one-layer tanh RNN with input and hidden size 1
// and hand-picked weights (w_ih 0.5, w_hh -0.25, b_ih 0.1, b_hh 0), on the
// batch-first batch x = [[1, 2], [3, pad]] with lengths [2, 1], and checks it
// against the recurrence worked by hand:
//   sequence 0: h1 = tanh(0.5*1 + 0.1) = tanh(0.6),  h2 = tanh(0.5*2 + 0.1 - 0.25*h1)
//   sequence 1: h1 = tanh(0.5*3 + 0.1) = tanh(1.6),  padding step -> output 0
//   h_n = [h2 of sequence 0, h1 of sequence 1]
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <vector>

int main() {
  try {
    const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow("seqpack::rnn_padded", "");
    at::Tensor x = at::tensor({1.0f, 2.0f, 3.0f, 0.0f}).view({2, 2, 1});
    at::Tensor lengths = at::tensor(std::vector<int64_t>{2, 1});
    std::vector<at::Tensor> weights = {at::full({1, 1}, 0.5f), at::full({1, 1}, -0.25f),
                                       at::full({1}, 0.1f), at::full({1}, 0.0f)};
    // The schema: rnn_padded(input, lengths?, h0?, c0?, weights, mode, hidden_size,
    // num_layers, bias, batch_first, bidirectional, proj_size, dropout, train, seed?, precision)
    std::vector<c10::IValue> stack = {x, lengths, c10::IValue(), c10::IValue(),
                                      c10::List<at::Tensor>(weights), std::string("RNN_TANH"),
                                      int64_t{1}, int64_t{1}, true, true, false, int64_t{0}, 0.0,
                                      false, c10::IValue(), std::string("fp32")};
    op.callBoxed(&stack);
    const at::Tensor out = stack.at(0).toTensor(), h_n = stack.at(1).toTensor();

    const double a1 = std::tanh(0.6), a2 = std::tanh(1.1 - 0.25 * a1), b1 = std::tanh(1.6);
    const double expected_out[] = {a1, a2, b1, 0.0};  // [B=2, T=2, H=1], batch-first
    const double expected_h[] = {a2, b1};             // [layers=1, B=2, H=1]
    if (out.numel() != 4 || h_n.numel() != 2) {
      std::fprintf(stderr, "torch_consumer: output %lld values, h_n %lld, expected 4 and 2\n",
                   static_cast<long long>(out.numel()), static_cast<long long>(h_n.numel()));
      return 1;
    }
    const at::Tensor o = out.contiguous().to(at::kDouble), h = h_n.contiguous().to(at::kDouble);
    for (int k = 0; k < 4; ++k) {
      if (std::abs(o.data_ptr<double>()[k] - expected_out[k]) > 1e-6) {
        std::fprintf(stderr, "torch_consumer: output[%d] = %.9g, expected %.9g\n", k,
                     o.data_ptr<double>()[k], expected_out[k]);
        return 1;
      }
    }
    for (int k = 0; k < 2; ++k) {
      if (std::abs(h.data_ptr<double>()[k] - expected_h[k]) > 1e-6) {
        std::fprintf(stderr, "torch_consumer: h_n[%d] = %.9g, expected %.9g\n", k,
                     h.data_ptr<double>()[k], expected_h[k]);
        return 1;
      }
    }
    std::printf("torch_consumer: seqpack::rnn_padded output and h_n: ok\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_consumer: %s\n", e.what());
    return 1;
  }
  return 0;
}
