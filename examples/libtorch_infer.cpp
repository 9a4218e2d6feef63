// Serving from C++ with LibTorch: loads a TorchScript model that uses seqpack's
// operators (a module scripted from Python with seqpack.torch layers and
// seqpack.torch.pack_padded_sequence / pad_packed_sequence, saved with
// torch.jit.save) and runs it on a batch of variable-length sequences.
//
//   libtorch_infer MODEL.pt INPUT_SIZE LENGTH...
//
// The model's forward takes (x [B, T, INPUT_SIZE] batch-first, lengths int64 [B])
// and returns a tuple whose first element is a tensor. The batch is made here:
// sequence b has LENGTH[b] steps (0 is allowed), x[b][t][i] =
// sin(0.1 * (31 b + 7 t + i + 1)) on valid steps and 0 on padding. The
// program prints the first output's shape, then one value per line, so that
// another program (tests/check_libtorch_infer.py) can compare them.
//
// Linking libseqpack_torch is what makes seqpack's operators known to
// torch::jit::load: the library registers them when it is loaded. Nothing
// refers to it by symbol; the target seqpack::torch links it inside
// --no-as-needed (seqpack_torch/CMakeLists.txt), and an installed seqpack
// gives the same target (find_package(seqpack CONFIG COMPONENTS torch)).
#include <torch/script.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s MODEL.pt INPUT_SIZE LENGTH...\n", argv[0]);
    return 2;
  }
  try {
    const int64_t input_size = std::stoll(argv[2]);
    std::vector<int64_t> lengths;
    for (int a = 3; a < argc; ++a) lengths.push_back(std::stoll(argv[a]));
    const int64_t B = static_cast<int64_t>(lengths.size());
    int64_t T = 0;
    for (int64_t n : lengths) T = std::max(T, n);

    torch::Tensor x = torch::zeros({B, T, input_size});
    auto acc = x.accessor<float, 3>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < lengths[b]; ++t)
        for (int64_t i = 0; i < input_size; ++i)
          acc[b][t][i] = static_cast<float>(std::sin(0.1 * double(31 * b + 7 * t + i + 1)));

    torch::jit::script::Module model = torch::jit::load(argv[1]);
    model.eval();
    torch::NoGradGuard no_grad;
    c10::IValue result = model.forward({x, torch::tensor(lengths, torch::kLong)});
    torch::Tensor out =
        result.isTuple() ? result.toTuple()->elements()[0].toTensor() : result.toTensor();
    out = out.contiguous().to(torch::kDouble);
    std::printf("output");
    for (int64_t d : out.sizes()) std::printf(" %lld", static_cast<long long>(d));
    std::printf("\n");
    const double* p = out.data_ptr<double>();
    for (int64_t k = 0; k < out.numel(); ++k) std::printf("%.9g\n", p[k]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "libtorch_infer: %s\n", e.what());
    return 1;
  }
  return 0;
}
