// Datasets: TSV files, splitting, the language-ID dataset from word lists (tiny
// fake lists, and the real Debian lists when installed), export and the CLI.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <stdexcept>
#include <string>

#include "seqpack/data.h"
#include "test_util.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using seqpack::DatasetSplit;
using seqpack::Example;

namespace {

using seqpack::testing::TempDir;
using seqpack::testing::read_file;

using seqpack::testing::expect_invalid;

std::multiset<std::string> texts(const std::vector<Example>& v) {
  std::multiset<std::string> out;
  for (const auto& e : v) out.insert(e.text);
  return out;
}

std::map<int64_t, int64_t> label_counts(const std::vector<Example>& v) {
  std::map<int64_t, int64_t> out;
  for (const auto& e : v) ++out[e.label];
  return out;
}

// Three tiny fake word lists: shared words across lists, apostrophes of both
// kinds, an in-list duplicate, CRLF and blank lines.
struct FakeDict {
  TempDir dir;
  seqpack::LanguageIdOptions options;
  FakeDict() {
    std::string en =
        "apple\nbanana\ndog's\ncherry\nshared\nkiwi\nlemon\nmango\r\n\nolive\npeach\nplum\n";
    std::string fr =
        "pomme\nl'"
        "eau\nl\u2019arbre\nshared\ncerise\nfraise\nmangue\npoire\nprune\nraisin\nbanane\n";
    std::string de =
        "Apfel\nBirne\nKirsche\nshared\nbanana\nPflaume\nTraube\nZitrone\nMango\nPfirsich\nApfel\nÄ"
        "pfel\n";
    dir.write("en.txt", en);
    dir.write("fr.txt", fr);
    dir.write("de.txt", de);
    options.dict_dir = dir.path.string();
    options.lists = {{"english", "en.txt", "wfake-en"},
                     {"french", "fr.txt", "wfake-fr"},
                     {"german", "de.txt", "wfake-de"}};
    options.words_per_language = 8;
    options.train_fraction = 0.5;
    options.val_fraction = 0.25;
    options.seed = 3;
  }
};

}  // namespace

TEST(LoadTsv, ReadsLabelsTextCountsEmptyLines) {
  TempDir dir;
  const std::string path =
      dir.write("d.tsv", "fr\tété\r\nen\tsummer\n\n\nde\tSommer mit\tTab\n\r\nen\twinter\n");
  const seqpack::TextDataset ds = seqpack::load_tsv(path);
  EXPECT_EQ(ds.labels, (std::vector<std::string>{"de", "en", "fr"}));  // sorted
  EXPECT_EQ(ds.empty_lines, 3);
  ASSERT_EQ(ds.examples.size(), 4u);
  EXPECT_EQ(ds.examples[0].text, "été");  // '\r' dropped
  EXPECT_EQ(ds.examples[0].chars, U"été");
  EXPECT_EQ(ds.examples[0].label, 2);
  EXPECT_EQ(ds.examples[1].label, 1);
  EXPECT_EQ(ds.examples[2].text, "Sommer mit\tTab");  // text is everything after the first tab
  EXPECT_EQ(ds.examples[2].label, 0);
  EXPECT_EQ(ds.examples[3].text, "winter");
}

TEST(LoadTsv, MalformedLinesNameTheLineNumber) {
  TempDir dir;
  expect_invalid([&] { seqpack::load_tsv(dir.write("a.tsv", "en\tok\n\nen no tab here\n")); },
                 {"a.tsv' line 3", "no tab", "\"en no tab here\""});
  expect_invalid([&] { seqpack::load_tsv(dir.write("b.tsv", "en\tok\n\tword\n")); },
                 {"b.tsv' line 2", "empty label"});
  expect_invalid([&] { seqpack::load_tsv(dir.write("c.tsv", "en\tok\nfr\t\n")); },
                 {"c.tsv' line 2", "empty text"});
  expect_invalid([&] { seqpack::load_tsv(dir.write("d.tsv", "en\tok\nen\tok\nfr\tcaf\xE9\n")); },
                 {"d.tsv' line 3", "byte offset 3", "0xE9"});
  expect_invalid([&] { seqpack::load_tsv(dir.file("missing.tsv")); }, {"missing.tsv"});
  // A very long malformed line is quoted shortened.
  try {
    seqpack::load_tsv(dir.write("e.tsv", std::string(5000, 'x') + "\n"));
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_LT(std::string(e.what()).size(), 300u) << e.what();
  }
}

TEST(SplitDataset, StratifiedCompleteDisjointAndDeterministic) {
  seqpack::TextDataset ds;
  ds.labels = {"a", "b"};
  for (int i = 0; i < 100; ++i) {
    ds.examples.push_back({"a" + std::to_string(i), U"a", 0});
    if (i < 30) ds.examples.push_back({"b" + std::to_string(i), U"b", 1});
  }
  const DatasetSplit s = seqpack::split_dataset(ds, 0.8, 0.1, /*seed=*/7);
  EXPECT_EQ(s.labels, ds.labels);
  EXPECT_EQ(label_counts(s.train), (std::map<int64_t, int64_t>{{0, 80}, {1, 24}}));
  EXPECT_EQ(label_counts(s.val), (std::map<int64_t, int64_t>{{0, 10}, {1, 3}}));
  EXPECT_EQ(label_counts(s.test), (std::map<int64_t, int64_t>{{0, 10}, {1, 3}}));
  std::multiset<std::string> all = texts(s.train);
  for (const auto& t : texts(s.val)) all.insert(t);
  for (const auto& t : texts(s.test)) all.insert(t);
  EXPECT_EQ(all, texts(ds.examples));
  EXPECT_EQ(std::set<std::string>(all.begin(), all.end()).size(), all.size());
  const DatasetSplit again = seqpack::split_dataset(ds, 0.8, 0.1, 7);
  EXPECT_EQ(texts(again.test), texts(s.test));
  std::vector<std::string> order, order2;
  for (const auto& e : s.train) order.push_back(e.text);
  for (const auto& e : again.train) order2.push_back(e.text);
  EXPECT_EQ(order, order2);
  EXPECT_NE(texts(seqpack::split_dataset(ds, 0.8, 0.1, 8).test), texts(s.test));
  // Not grouped by label: the training order is shuffled.
  std::vector<int64_t> labels;
  for (const auto& e : s.train) labels.push_back(e.label);
  EXPECT_FALSE(std::is_sorted(labels.begin(), labels.end()));
}

TEST(SplitDataset, BadFractionsAndLabels) {
  seqpack::TextDataset ds;
  ds.labels = {"a"};
  ds.examples = {{"x", U"x", 0}};
  expect_invalid([&] { seqpack::split_dataset(ds, 0.9, 0.2, 0); },
                 {"train_fraction = 0.9", "val_fraction = 0.2"});
  expect_invalid([&] { seqpack::split_dataset(ds, -0.1, 0.2, 0); }, {"train_fraction = -0.1"});
  ds.examples.push_back({"y", U"y", 4});
  expect_invalid([&] { seqpack::split_dataset(ds, 0.8, 0.1, 0); }, {"examples[1].label = 4"});
}

TEST(LanguageId, FakeListsDropApostrophesAndSharedWords) {
  FakeDict fake;
  const DatasetSplit s = seqpack::load_language_id(fake.options);
  EXPECT_EQ(s.labels, (std::vector<std::string>{"english", "french", "german"}));
  std::vector<Example> all = s.train;
  all.insert(all.end(), s.val.begin(), s.val.end());
  all.insert(all.end(), s.test.begin(), s.test.end());
  ASSERT_EQ(all.size(), 24u);
  EXPECT_EQ(label_counts(s.train), (std::map<int64_t, int64_t>{{0, 4}, {1, 4}, {2, 4}}));
  EXPECT_EQ(label_counts(s.val), (std::map<int64_t, int64_t>{{0, 2}, {1, 2}, {2, 2}}));
  EXPECT_EQ(label_counts(s.test), (std::map<int64_t, int64_t>{{0, 2}, {1, 2}, {2, 2}}));
  std::set<std::string> seen, en;
  for (const auto& e : all) {
    EXPECT_TRUE(seen.insert(e.text).second) << "duplicate " << e.text;
    EXPECT_EQ(e.text.find('\''), std::string::npos) << e.text;
    EXPECT_EQ(e.text.find("\u2019"), std::string::npos) << e.text;
    EXPECT_NE(e.text, "shared");
    EXPECT_NE(e.text, "banana");  // in the English and the German list
    EXPECT_EQ(e.chars, seqpack::decode_utf8(e.text));
    EXPECT_EQ(e.text.find('\r'), std::string::npos) << e.text;
    if (e.label == 0) en.insert(e.text);
  }
  // English has exactly 8 usable words (banana is German too, dog's has an
  // apostrophe, shared is everywhere), so all 8 are sampled.
  EXPECT_EQ(en, (std::set<std::string>{"apple", "cherry", "kiwi", "lemon", "mango", "olive",
                                       "peach", "plum"}));
}

TEST(LanguageId, FakeListsCountUsableWordsExactly) {
  FakeDict fake;
  fake.options.words_per_language = 8;
  // English: apple banana(shared) dog's cherry shared kiwi lemon mango olive peach
  // -> usable: apple cherry kiwi lemon mango olive peach = 7 < 8.
  fake.dir.write("en.txt",
                 "apple\nbanana\ndog's\ncherry\nshared\nkiwi\nlemon\nmango\nolive\npeach\n");
  expect_invalid([&] { seqpack::load_language_id(fake.options); },
                 {"en.txt", "only 7 usable words", "words_per_language = 8"});
  fake.options.words_per_language = 7;
  const DatasetSplit s = seqpack::load_language_id(fake.options);
  std::set<std::string> en;
  for (const auto* part : {&s.train, &s.val, &s.test}) {
    for (const auto& e : *part) {
      if (e.label == 0) en.insert(e.text);
    }
  }
  EXPECT_EQ(en,
            (std::set<std::string>{"apple", "cherry", "kiwi", "lemon", "mango", "olive", "peach"}));
}

// The sample depends on the words, not on the files' order: lists whose words
// share long prefixes (the sort compares 8 bytes at once, then the rest),
// are prefixes of each other, differ only past byte 8 or by a byte >= 0x80,
// with duplicates, CRLF, and no final newline, give the same split in any
// line order. The word in two lists only past byte 8 must be dropped.
TEST(LanguageId, SampleIsIndependentOfLineOrderWithLongSharedPrefixes) {
  const std::vector<std::string> en = {"internationalisation", "internationalization", "international",
                                       "internation", "intern", "inter", "internationally",
                                       "internationalist", "internationalism", "internationalists",
                                       "internationale", "international\xC3\xA9", "internationalisation"};
  const std::vector<std::string> fr = {"internationaux", "internationales", "internationalistes",
                                       "internationalement", "internationalisme", "internationaliste",
                                       "internationalisation", "internationalisai", "internationalisa",
                                       "internationalisas", "internationalisera", "internationalisez"};
  auto join = [](std::vector<std::string> words, bool reversed) {
    if (reversed) std::reverse(words.begin(), words.end());
    std::string out;
    for (std::size_t i = 0; i < words.size(); ++i) {
      out += words[i];
      if (i + 1 < words.size()) out += i % 3 == 0 ? "\r\n" : "\n";
    }
    return out;
  };
  std::vector<DatasetSplit> splits;
  for (const bool reversed : {false, true}) {
    FakeDict fake;
    fake.dir.write("en.txt", join(en, reversed));
    fake.dir.write("fr.txt", join(fr, !reversed));
    fake.options.lists.pop_back();  // English and French only
    fake.options.words_per_language = 11;  // every usable word
    splits.push_back(seqpack::load_language_id(fake.options));
  }
  for (const auto& [a, b] : {std::pair{&splits[0].train, &splits[1].train},
                             std::pair{&splits[0].val, &splits[1].val},
                             std::pair{&splits[0].test, &splits[1].test}}) {
    ASSERT_EQ(a->size(), b->size());
    for (std::size_t i = 0; i < a->size(); ++i) EXPECT_EQ((*a)[i].text, (*b)[i].text) << i;
  }
  std::set<std::string> en_seen, fr_seen;
  for (const auto* part : {&splits[0].train, &splits[0].val, &splits[0].test}) {
    for (const auto& e : *part) (e.label == 0 ? en_seen : fr_seen).insert(e.text);
  }
  // 12 distinct English words, 12 French; "internationalisation" is in both.
  std::set<std::string> en_expected(en.begin(), en.end()), fr_expected(fr.begin(), fr.end());
  en_expected.erase("internationalisation");
  fr_expected.erase("internationalisation");
  EXPECT_EQ(en_seen, en_expected);
  EXPECT_EQ(fr_seen, fr_expected);
}

TEST(LanguageId, DeterministicForASeedAndDifferentForAnother) {
  FakeDict fake;
  fake.options.words_per_language = 5;
  const DatasetSplit a = seqpack::load_language_id(fake.options);
  const DatasetSplit b = seqpack::load_language_id(fake.options);
  std::vector<std::string> ta, tb;
  for (const auto& e : a.train) ta.push_back(e.text);
  for (const auto& e : b.train) tb.push_back(e.text);
  EXPECT_EQ(ta, tb);
  EXPECT_EQ(texts(a.test), texts(b.test));
  bool differs = false;
  for (uint64_t seed = 4; seed < 10 && !differs; ++seed) {
    fake.options.seed = seed;
    differs = texts(seqpack::load_language_id(fake.options).train) != texts(a.train);
  }
  EXPECT_TRUE(differs);
}

TEST(LanguageId, MissingListNamesTheFileAndPackage) {
  FakeDict fake;
  fake.options.lists.push_back({"dutch", "nl.txt", "wdutch"});
  expect_invalid([&] { seqpack::load_language_id(fake.options); }, {"nl.txt", "dutch", "wdutch"});
  fake.options.lists.clear();
  expect_invalid([&] { seqpack::load_language_id(fake.options); }, {"no word lists"});
  FakeDict f2;
  f2.options.words_per_language = 0;
  expect_invalid([&] { seqpack::load_language_id(f2.options); }, {"words_per_language = 0"});
}

TEST(LanguageId, InvalidUtf8InAListNamesTheLine) {
  FakeDict fake;
  fake.dir.write("fr.txt", "pomme\ncaf\xE9\n");
  expect_invalid([&] { seqpack::load_language_id(fake.options); },
                 {"fr.txt' line 2", "byte offset 3"});
}

TEST(LanguageId, DefaultListsAreTheSevenDebianPackages) {
  const auto& lists = seqpack::default_word_lists();
  ASSERT_EQ(lists.size(), 7u);
  std::vector<std::string> packages;
  for (const auto& l : lists) packages.push_back(l.package);
  EXPECT_EQ(packages, (std::vector<std::string>{"wamerican", "wfrench", "wngerman", "wspanish",
                                                "witalian", "wportuguese", "wdutch"}));
  EXPECT_EQ(lists[2].file, "ngerman");
  EXPECT_EQ(lists[0].file, "american-english");
}

TEST(LanguageId, RealDebianListsGiveSevenTimes20000Words) {
  for (const auto& l : seqpack::default_word_lists()) {
    if (!fs::exists("/usr/share/dict/" + l.file)) {
      GTEST_SKIP() << "/usr/share/dict/" << l.file << " is missing: install the Debian package "
                   << l.package;
    }
  }
  const DatasetSplit s = seqpack::load_language_id();
  ASSERT_EQ(s.labels.size(), 7u);
  EXPECT_EQ(s.train.size(), 7u * 16000);
  EXPECT_EQ(s.val.size(), 7u * 2000);
  EXPECT_EQ(s.test.size(), 7u * 2000);
  std::map<int64_t, int64_t> expected_train, expected_eval;
  for (int64_t l = 0; l < 7; ++l) {
    expected_train[l] = 16000;
    expected_eval[l] = 2000;
  }
  EXPECT_EQ(label_counts(s.train), expected_train);
  EXPECT_EQ(label_counts(s.val), expected_eval);
  EXPECT_EQ(label_counts(s.test), expected_eval);
  std::set<std::string> seen;
  bool has_accent = false;
  for (const auto* part : {&s.train, &s.val, &s.test}) {
    for (const auto& e : *part) {
      ASSERT_TRUE(seen.insert(e.text).second) << "'" << e.text << "' appears twice";
      ASSERT_EQ(e.text.find('\''), std::string::npos) << e.text;
      has_accent |= e.chars.size() < e.text.size();
    }
  }
  EXPECT_TRUE(has_accent);  // code points, not bytes
}

TEST(ExportSplit, WritesTsvFilesThatLoadBack) {
  FakeDict fake;
  const DatasetSplit s = seqpack::load_language_id(fake.options);
  TempDir out;
  const std::string dir = out.file("nested/export");
  seqpack::export_split(s, dir);
  EXPECT_EQ(read_file(dir + "/labels.txt"), "english\nfrench\ngerman\n");
  const seqpack::TextDataset train = seqpack::load_tsv(dir + "/train.tsv");
  EXPECT_EQ(train.labels, (std::vector<std::string>{"0", "1", "2"}));
  ASSERT_EQ(train.examples.size(), s.train.size());
  for (std::size_t i = 0; i < s.train.size(); ++i) {
    EXPECT_EQ(train.examples[i].text, s.train[i].text);
    EXPECT_EQ(train.examples[i].label, s.train[i].label);
  }
  EXPECT_EQ(seqpack::load_tsv(dir + "/test.tsv").examples.size(), s.test.size());
  EXPECT_EQ(seqpack::load_tsv(dir + "/val.tsv").examples.size(), s.val.size());
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }
}

TEST(DataCli, ExportWritesTheSplitAndReportsMissingLists) {
  TempDir out;
  FakeDict fake;
  // The CLI reads the default file names: create them from the fake lists.
  const char* names[] = {"american-english", "french",     "ngerman", "spanish",
                         "italian",          "portuguese", "dutch"};
  for (int l = 0; l < 7; ++l) {
    std::string words;
    for (int i = 0; i < 10; ++i)
      words += std::string(names[l]).substr(0, 3) + std::to_string(i) + "\n";
    fake.dir.write(names[l], words);
  }
  const std::string base = std::string(SEQPACK_CLI_PATH) + " data export --dict-dir " +
                           fake.dir.path.string() + " --words-per-language 10 --out ";
  ASSERT_EQ(std::system((base + out.file("x") + " >/dev/null").c_str()), 0);
  EXPECT_EQ(seqpack::load_tsv(out.file("x/train.tsv")).examples.size(), 7u * 8);
  EXPECT_EQ(seqpack::load_tsv(out.file("x/val.tsv")).examples.size(), 7u);
  EXPECT_EQ(read_file(out.file("x/labels.txt")),
            "english\nfrench\ngerman\nspanish\nitalian\nportuguese\ndutch\n");
  fs::remove(fake.dir.file("ngerman"));
  const std::string err = out.file("err.txt");
  EXPECT_NE(std::system((base + out.file("y") + " >/dev/null 2>" + err).c_str()), 0);
  EXPECT_NE(read_file(err).find("wngerman"), std::string::npos) << read_file(err);
}

TEST(DataCli, StatsReportsSizesAndPaddingForATsvFile) {
  TempDir dir;
  std::string tsv = "\n";
  for (int i = 0; i < 40; ++i) tsv += (i % 2 ? "a\t" : "b\t") + std::string(1 + i % 9, 'x') + "\n";
  const std::string path = dir.write("d.tsv", tsv);
  const std::string out = dir.file("out.txt");
  ASSERT_EQ(std::system((std::string(SEQPACK_CLI_PATH) + " data stats --batch-size 4 --data " +
                         path + " >" + out)
                            .c_str()),
            0);
  const std::string text = read_file(out);
  EXPECT_NE(text.find("40 examples, 2 labels, 1 empty lines skipped"), std::string::npos) << text;
  EXPECT_NE(text.find("train"), std::string::npos) << text;
  EXPECT_NE(text.find("bucketed"), std::string::npos) << text;
  EXPECT_NE(text.find("packed 100.0%"), std::string::npos) << text;
}

// `data stats --data F` and `train --data F` split and batch a file the same
// way for the same --seed (they once used seeds 20240229 and 0): the padding
// each reports for the training part agrees.
TEST(DataCli, StatsAndTrainSplitAFileAlikeForTheSameSeed) {
  TempDir dir;
  std::string tsv;
  for (int i = 0; i < 60; ++i) tsv += (i % 3 ? "a\t" : "b\t") + std::string(1 + (i * 7) % 13, 'x') + "\n";
  const std::string path = dir.write("d.tsv", tsv);
  const auto run = [&](const std::string& args) {
    const std::string out = dir.file("out.txt");
    EXPECT_EQ(std::system((std::string(SEQPACK_CLI_PATH) + " " + args + " >" + out + " 2>&1").c_str()), 0);
    return read_file(out);
  };
  // stats: "train ... (padded slots RANDOM / BUCKETED / REAL)"
  const auto stats_slots = [&](const std::string& seed) {
    const std::string t = run("data stats --batch-size 4 --data " + path + " --seed " + seed);
    const std::size_t at = t.find("(padded slots ", t.find("train "));
    EXPECT_NE(at, std::string::npos) << t;
    return t.substr(at + 14, t.find(')', at) - at - 14);
  };
  // train: "random batches of 4 would compute RANDOM slots for REAL real tokens (...);
  // bucketing cuts that to BUCKETED (...)"
  const std::string t = run("train --quiet --threads 1 --epochs 1 --hidden 4 --embed 2 --batch-size 4 --data " +
                            path + " --out " + dir.file("model"));
  const std::size_t r = t.find("would compute ");
  ASSERT_NE(r, std::string::npos) << t;
  const std::string random = t.substr(r + 14, t.find(' ', r + 14) - r - 14);
  const std::size_t real_at = t.find("slots for ", r) + 10;
  const std::string real = t.substr(real_at, t.find(' ', real_at) - real_at);
  const std::size_t b = t.find("cuts that to ", r) + 13;
  const std::string bucketed = t.substr(b, t.find(' ', b) - b);
  EXPECT_EQ(stats_slots("0"), random + " / " + bucketed + " / " + real) << t;
  // A control that can fail: another seed batches the same file otherwise.
  EXPECT_NE(stats_slots("1"), stats_slots("0"));
}
