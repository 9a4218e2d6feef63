// The classifier's forward (what `seqpack predict` runs, without the process,
// the decoding and the printing) on a TSV of words, for bench/onnx_vs_predict.py:
//
//   export SEQPACK_BENCH_MODEL=/tmp/m SEQPACK_BENCH_TSV=/tmp/split/test.tsv
//   ./build/bench/bench_classifier_forward --benchmark_format=json
//
// BM_ClassifierForward/0: every word as one batch; /128: batches of 128 in file order.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "seqpack/classifier.h"
#include "seqpack/vocabulary.h"

namespace {

using namespace seqpack;

struct Workload {
  TrainedClassifier classifier;
  std::vector<std::vector<int64_t>> words;  // token ids
  std::string error;
};

Workload& workload() {
  static Workload w = [] {
    Workload w;
    const char* model = std::getenv("SEQPACK_BENCH_MODEL");
    const char* tsv = std::getenv("SEQPACK_BENCH_TSV");
    if (model == nullptr || tsv == nullptr) {
      w.error =
          "set SEQPACK_BENCH_MODEL (a model directory) and SEQPACK_BENCH_TSV (label<TAB>word)";
      return w;
    }
    w.classifier = load_classifier(model);
    std::ifstream in(tsv);
    std::string line;
    for (int64_t n = 1; std::getline(in, line); ++n) {
      const std::size_t tab = line.find('\t');
      if (tab == std::string::npos) continue;
      w.words.push_back(w.classifier.vocabulary.encode(
          decode_utf8(line.substr(tab + 1), std::string(tsv) + " line " + std::to_string(n))));
    }
    if (w.words.empty()) w.error = std::string("no words in ") + tsv;
    return w;
  }();
  return w;
}

void BM_ClassifierForward(benchmark::State& state) {
  Workload& w = workload();
  if (!w.error.empty()) {
    state.SkipWithError(w.error.c_str());
    return;
  }
  const std::size_t batch =
      state.range(0) > 0 ? static_cast<std::size_t>(state.range(0)) : w.words.size();
  int64_t tokens = 0;
  for (const auto& s : w.words) tokens += static_cast<int64_t>(s.size());
  for (auto _ : state) {
    for (std::size_t s = 0; s < w.words.size(); s += batch) {
      const std::vector<std::vector<int64_t>> b(
          w.words.begin() + static_cast<std::ptrdiff_t>(s),
          w.words.begin() + static_cast<std::ptrdiff_t>(std::min(w.words.size(), s + batch)));
      benchmark::DoNotOptimize(w.classifier.model->forward(b, /*requires_grad=*/false));
    }
  }
  state.counters["words"] = static_cast<double>(w.words.size());
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_ClassifierForward)->Arg(0)->Arg(128)->Unit(benchmark::kMillisecond)->MinTime(1.0);

}  // namespace

BENCHMARK_MAIN();
