// `seqpack data export --out DIR`: the default language-ID split as TSV files,
// so another tool (the PyTorch comparison script) trains on exactly the same data.
// `seqpack data stats`: dataset sizes and the padding saved by bucketing and packing.
#include <fmt/core.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "seqpack/data.h"
#include "seqpack/safetensors.h"

namespace {

struct DataArgs {
  std::string dict_dir = "/usr/share/dict";
  int64_t words_per_language = 20000;
  // As `seqpack train --seed`: the same value gives the same sample, split and
  // batches in both commands (the word lists add LanguageIdOptions' own seed).
  uint64_t seed = 0;
  std::string out;
  int64_t batch_size = 128;
  std::string tsv;
};

seqpack::LanguageIdOptions options_of(const DataArgs& a) {
  seqpack::LanguageIdOptions o;
  o.dict_dir = a.dict_dir;
  o.words_per_language = a.words_per_language;
  o.seed = o.seed + a.seed;
  return o;
}

void add_dataset_options(CLI::App& sub, DataArgs& a) {
  sub.add_option("--dict-dir", a.dict_dir, "directory holding the Debian word lists")
      ->capture_default_str();
  seqpack::cli::add_number<int64_t>(sub, "--words-per-language", a.words_per_language,
                                    "words sampled per language", 1);
  seqpack::cli::add_number<uint64_t>(sub, "--seed", a.seed, "seed of the sample, the split and the batches (the same as seqpack train --seed)", 0);
}

void print_padding(const char* name, const std::vector<seqpack::Example>& part, const DataArgs& a) {
  if (part.empty()) return;
  seqpack::BucketingSampler sampler(seqpack::lengths_of(part), a.batch_size, a.seed);
  const seqpack::PaddingReport r = seqpack::padding_report(sampler);
  fmt::print(
      "{:<6} {:>7} sequences {:>8} tokens in {:>5} batches of {}: efficiency random {:5.1f}%, "
      "bucketed {:5.1f}%, packed {:5.1f}% (padded slots {} / {} / {})\n",
      name, part.size(), r.packed.real_tokens, r.num_batches, a.batch_size,
      100 * r.random.efficiency(), 100 * r.bucketed.efficiency(), 100 * r.packed.efficiency(),
      r.random.padded_slots, r.bucketed.padded_slots, r.packed.padded_slots);
}

void setup_data(CLI::App& app) {
  app.require_subcommand(1);
  auto args = std::make_shared<DataArgs>();

  CLI::App* exp = app.add_subcommand(
      "export",
      "write the default split as train.tsv, val.tsv, test.tsv (label index<TAB>word) "
      "and labels.txt");
  add_dataset_options(*exp, *args);
  exp->add_option("--out", args->out, "output directory (created if needed)")->required();
  exp->callback([args] {
    // Refused before the word lists are read (export_split checks again).
    const seqpack::LanguageIdOptions o = options_of(*args);
    std::vector<seqpack::InputPath> lists;
    for (const seqpack::WordList& wl : o.lists) lists.push_back({"word list", o.dict_dir + "/" + wl.file});
    for (const char* name : {"train.tsv", "val.tsv", "test.tsv", "labels.txt"}) {
      seqpack::check_output_file(args->out + "/" + name);
      seqpack::check_output_not_input(args->out + "/" + name, "output file", lists);
    }
    const seqpack::DatasetSplit split = seqpack::load_language_id(o);
    seqpack::export_split(split, args->out);
    fmt::print(
        "wrote {}/train.tsv ({} words), val.tsv ({}), test.tsv ({}) and labels.txt ({} labels)\n",
        args->out, split.train.size(), split.val.size(), split.test.size(), split.labels.size());
  });

  CLI::App* stats = app.add_subcommand(
      "stats",
      "dataset sizes and padding efficiency (real tokens / padded slots) of random "
      "batches, length-bucketed batches and packing");
  add_dataset_options(*stats, *args);
  stats->add_option("--data", args->tsv, "a label<TAB>text file instead of the default dataset");
  seqpack::cli::add_number<int64_t>(*stats, "--batch-size", args->batch_size, "batch size", 1);
  stats->callback([args] {
    seqpack::DatasetSplit split;
    if (!args->tsv.empty()) {
      const seqpack::TextDataset ds = seqpack::load_tsv(args->tsv);
      fmt::print("{}: {} examples, {} labels, {} empty lines skipped\n", args->tsv,
                 ds.examples.size(), ds.labels.size(), ds.empty_lines);
      split = seqpack::split_dataset(ds, 0.8, 0.1, args->seed);
    } else {
      split = seqpack::load_language_id(options_of(*args));
      fmt::print("language-ID dataset from {}: {} languages x {} words\n", args->dict_dir,
                 split.labels.size(), args->words_per_language);
    }
    std::map<int64_t, int64_t> per_label;
    for (const auto& e : split.train) ++per_label[e.label];
    for (std::size_t l = 0; l < split.labels.size(); ++l) {
      fmt::print("  {:<12} {:>6} train\n", split.labels[l], per_label[static_cast<int64_t>(l)]);
    }
    print_padding("train", split.train, *args);
    print_padding("val", split.val, *args);
    print_padding("test", split.test, *args);
  });
}

const bool registered = seqpack::cli::register_command(
    {"data", "export the default dataset as TSV, or print its statistics", setup_data});

}  // namespace
