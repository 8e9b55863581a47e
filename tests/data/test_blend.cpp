// Blends of token files (training.datasets, core/data/blend_loader.h): the dataset of every
// sample is Megatron's greedy choice (checked against the rule written out here in float64),
// every prefix of the run is within two samples of the weights, a weight of 0 is never sampled,
// each member keeps its own window order, a rank's block equals those positions of the whole
// batch, a restored state continues with the same batches and a state of another blend is
// refused; and the config errors: negative or all-zero weights, a missing path, an unknown key, a
// blend beside training.dataset_path, members of different token types, a missing file.
// Run: ctest -R test_blend
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/data/batch_shard.h"
#include "core/data/blend_loader.h"
#include "core/data/data_loader.h"
#include "core/error.h"
#include "tests/expect_contains.h"
#include "tests/temp_dir.h"

namespace moepeak {
namespace {

using test_support::error_of;

constexpr int64_t kBase = 1000;  // dataset d holds tokens [d * kBase, d * kBase + n)

class Blend : public ::testing::Test {
 protected:
  // A headerless file of n tokens first, first + 1, ... stored as T.
  template <typename T = uint16_t>
  std::string write_run(const std::string& name, int n, int64_t first) {
    const std::string p = (temp_.path() / name).string();
    std::ofstream out(p, std::ios::binary);
    for (int i = 0; i < n; ++i) {
      const auto token = static_cast<T>(first + i);
      out.write(reinterpret_cast<const char*>(&token), sizeof(T));
    }
    return p;
  }
  // K datasets of `n` tokens, dataset d's tokens from d * kBase.
  TrainingConfig blend(const std::vector<double>& weights, int64_t B, int64_t T, bool shuffle,
                       int n = 300) {
    tokens_ = n;
    TrainingConfig t;
    t.dataset = DatasetKind::bin;
    t.token_dtype = TokenDtype::uint16;
    t.batch_size = B;
    t.seq_len = T;
    t.shuffle = shuffle;
    for (size_t d = 0; d < weights.size(); ++d) {
      t.datasets.push_back(
          {write_run("d" + std::to_string(d) + ".bin", n, static_cast<int64_t>(d) * kBase),
           weights[d],
           {}});
    }
    return t;
  }
  static ModelConfig model() {
    ModelConfig m;
    m.vocab_size = 65536;
    return m;
  }
  // The dataset each row of `batches` batches came from (by its first token), each row checked
  // to be T + 1 consecutive tokens of one dataset (as a cycle: file order wraps).
  std::vector<int> sources(DataLoader& loader, int batches) const {
    const int64_t B = loader.batch_size(), T = loader.seq_len();
    std::vector<int64_t> ids(static_cast<size_t>(B * T)), labels(ids.size());
    std::vector<int> out;
    for (int i = 0; i < batches; ++i) {
      loader.next_batch(ids.data(), labels.data());
      for (int64_t b = 0; b < B; ++b) {
        const int64_t d = ids[b * T] / kBase;
        EXPECT_EQ(labels[b * T + T - 1], d * kBase + (ids[b * T] - d * kBase + T) % tokens_)
            << "one dataset's consecutive tokens";
        out.push_back(static_cast<int>(d));
      }
    }
    return out;
  }
  test_support::TempDir temp_{"moepeak_test_blend"};
  int64_t tokens_ = 0;  // per dataset, of the last blend()
};

// Megatron's build_blending_indices, written out: sample i from the first d maximising
// w_d * max(i, 1) - c_d over the weights > 0.
std::vector<int> megatron_choices(const std::vector<double>& weights, int samples) {
  double total = 0;
  for (double w : weights) total += w;
  std::vector<double> c(weights.size(), 0);
  std::vector<int> out;
  for (int i = 0; i < samples; ++i) {
    int best = -1;
    double best_error = -1e300;
    for (size_t d = 0; d < weights.size(); ++d) {
      if (weights[d] == 0) continue;
      const double error = weights[d] / total * std::max(i, 1) - c[d];
      if (error > best_error) {
        best = static_cast<int>(d);
        best_error = error;
      }
    }
    c[static_cast<size_t>(best)] += 1;
    out.push_back(best);
  }
  return out;
}

TEST_F(Blend, EverySampleComesFromMegatronsChoiceAndPrefixesFollowTheWeights) {
  for (const std::vector<double>& weights :
       {std::vector<double>{0.5, 0.3, 0.2}, std::vector<double>{7, 2}, std::vector<double>{1, 1, 1},
        std::vector<double>{0.05, 0.9, 0.05}}) {
    SCOPED_TRACE(testing::Message() << weights.size() << " datasets, first weight " << weights[0]);
    auto loader = make_data_loader(blend(weights, 3, 8, true), model(), 1);
    const std::vector<int> got = sources(*loader, 40);  // 120 samples
    EXPECT_EQ(got, megatron_choices(weights, 120));
    double total = 0;
    for (double w : weights) total += w;
    std::vector<double> count(weights.size(), 0);
    for (size_t i = 0; i < got.size(); ++i) {
      count[static_cast<size_t>(got[i])] += 1;
      for (size_t d = 0; d < weights.size(); ++d) {
        // Megatron's max(i, 1) start can put a dataset of weight 0.05 1.2 samples ahead.
        ASSERT_LE(std::abs(count[d] - weights[d] / total * static_cast<double>(i + 1)), 2.0)
            << "after " << i + 1 << " samples, dataset " << d;
      }
    }
    const std::vector<SourceShare> shares = loader->shares();
    ASSERT_EQ(shares.size(), weights.size());
    for (size_t d = 0; d < weights.size(); ++d) {
      EXPECT_EQ(shares[d].samples, static_cast<uint64_t>(count[d]));
      EXPECT_EQ(shares[d].weight, weights[d]);
    }
  }
}

TEST_F(Blend, AWeightOfZeroIsNeverSampled) {
  auto loader = make_data_loader(blend({0, 1, 0, 3}, 4, 8, false), model(), 1);
  for (int d : sources(*loader, 25)) EXPECT_TRUE(d == 1 || d == 3) << d;
  EXPECT_EQ(loader->shares()[0].samples, 0u);
  EXPECT_EQ(loader->shares()[2].samples, 0u);
}

TEST_F(Blend, EachMemberKeepsItsOwnWindowOrder) {
  // In file order each member's windows follow each other: member d's k-th sample starts at
  // d * kBase + k * T.
  auto loader = make_data_loader(blend({0.6, 0.4}, 5, 8, false), model(), 1);
  std::vector<int64_t> ids(40), labels(40);
  std::vector<int64_t> next_start = {0, kBase};
  for (int step = 0; step < 6; ++step) {
    loader->next_batch(ids.data(), labels.data());
    for (int b = 0; b < 5; ++b) {
      const int64_t first = ids[static_cast<size_t>(b * 8)];
      const auto d = static_cast<size_t>(first / kBase);
      EXPECT_EQ(first, next_start[d]) << "step " << step << " row " << b;
      next_start[d] += 8;
    }
  }
}

TEST_F(Blend, ARanksBlockEqualsThoseRowsOfTheWholeBatch) {
  const TrainingConfig t = blend({0.5, 0.3, 0.2}, 8, 8, true);
  auto per_rank = make_data_loader(t, model(), 4);
  auto whole = make_data_loader(t, model(), 4);
  std::vector<int64_t> ids(64), labels(64);
  for (int step = 0; step < 5; ++step) {
    whole->next_batch(ids.data(), labels.data());
    for (int r = 0; r < 4; ++r) {
      const BatchBlock block = rank_batch_block(8, 8, 4, r, 2);  // Sp = 2: rows split in two
      const LocalBatch local = read_local_batch(*per_rank, block);
      for (int64_t n = 0; n < block.tokens(); ++n) {
        const int64_t b = block.row_begin + n / block.cols, c = block.col_begin + n % block.cols;
        ASSERT_EQ(local.input_ids[static_cast<size_t>(n)], ids[static_cast<size_t>(b * 8 + c)]);
        ASSERT_EQ(local.labels[static_cast<size_t>(n)], labels[static_cast<size_t>(b * 8 + c)]);
      }
    }
    per_rank->advance();
  }
}

TEST_F(Blend, RestoreContinuesWithTheSameBatches) {
  for (bool shuffle : {true, false}) {
    SCOPED_TRACE(testing::Message() << "shuffle " << shuffle);
    const TrainingConfig t = blend({0.5, 0.3, 0.2}, 3, 8, shuffle, 120);  // epochs of 14 windows
    auto run = make_data_loader(t, model(), 6);
    sources(*run, 11);
    const std::vector<uint8_t> saved = run->state();
    std::vector<int64_t> a(24), la(24), b(24), lb(24);
    auto resumed = make_data_loader(t, model(), 6);
    resumed->restore(saved);
    for (int i = 0; i < 12; ++i) {
      run->next_batch(a.data(), la.data());
      resumed->next_batch(b.data(), lb.data());
      ASSERT_EQ(a, b) << "batch " << i << " after the restore";
      ASSERT_EQ(la, lb);
    }
  }
}

TEST_F(Blend, ABlendOfManyDatasetsRestores) {
  // 65 datasets (more than a fixed table of state lengths would allow); ids up to 64,039.
  const TrainingConfig t = blend(std::vector<double>(65, 1.0), 7, 8, true, 40);
  auto run = make_data_loader(t, model(), 2);
  sources(*run, 12);
  auto resumed = make_data_loader(t, model(), 2);
  resumed->restore(run->state());
  EXPECT_EQ(sources(*resumed, 5), sources(*run, 5));
}

TEST_F(Blend, RestoreRefusesAnotherBlend) {
  const TrainingConfig t = blend({0.5, 0.3, 0.2}, 2, 8, true);
  auto run = make_data_loader(t, model(), 6);
  sources(*run, 3);
  const std::vector<uint8_t> saved = run->state();

  TrainingConfig reweighted = t;
  reweighted.datasets[1].weight = 0.4;
  auto other = make_data_loader(reweighted, model(), 6);
  const std::vector<uint8_t> before = other->state();
  EXPECT_CONTAINS(error_of([&] { other->restore(saved); }),
                  "the checkpoint's blend gave " + t.datasets[1].path +
                      " (training.datasets[1]) weight 0.3, this run gives it 0.4");
  EXPECT_EQ(other->state(), before) << "a refused state changes nothing";

  TrainingConfig two = t;
  two.datasets.pop_back();
  EXPECT_CONTAINS(error_of([&] { make_data_loader(two, model(), 6)->restore(saved); }),
                  "the checkpoint's blend has 3 datasets, this run's training.datasets has 2");
  TrainingConfig in_order = t;
  in_order.shuffle = false;
  EXPECT_CONTAINS(error_of([&] { make_data_loader(in_order, model(), 6)->restore(saved); }),
                  "read its datasets in shuffled order, but this run has training.shuffle = false");
  TrainingConfig single = t;
  single.dataset_path = t.datasets[0].path;
  single.datasets.clear();
  EXPECT_CONTAINS(error_of([&] { make_data_loader(single, model(), 6)->restore(saved); }),
                  "saved by a 'blend' loader, but this run reads its data with a 'bin' loader");
}

TEST_F(Blend, MembersOfAnotherTokenTypeOrAMissingFileAreNamed) {
  TrainingConfig missing = blend({1, 1}, 2, 8, true);
  missing.datasets[1].path = (temp_.path() / "nope.bin").string();
  EXPECT_CONTAINS(error_of([&] { make_data_loader(missing, model(), 0); }), "nope.bin");

  // A Megatron member (its .idx says uint16) beside a headerless uint32 .bin.
  TrainingConfig mixed = blend({1, 1}, 2, 8, true);
  mixed.datasets[1].path = write_run<uint32_t>("llama.bin", 300, 0);
  mixed.token_dtype = TokenDtype::uint32;
  mixed.datasets[0].dataset = DatasetKind::megatron;
  const std::string prefix = (temp_.path() / "mm").string();
  {
    std::ofstream idx(prefix + ".idx", std::ios::binary);
    const char magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
    idx.write(magic, 9);
    const uint64_t version = 1, sequences = 1, documents = 2;
    const uint8_t code = 8;  // uint16
    const int32_t length = 300;
    const int64_t pointer = 0, doc0 = 0, doc1 = 1;
    idx.write(reinterpret_cast<const char*>(&version), 8);
    idx.write(reinterpret_cast<const char*>(&code), 1);
    idx.write(reinterpret_cast<const char*>(&sequences), 8);
    idx.write(reinterpret_cast<const char*>(&documents), 8);
    idx.write(reinterpret_cast<const char*>(&length), 4);
    idx.write(reinterpret_cast<const char*>(&pointer), 8);
    idx.write(reinterpret_cast<const char*>(&doc0), 8);
    idx.write(reinterpret_cast<const char*>(&doc1), 8);
  }
  write_run("mm.bin", 300, 0);
  mixed.datasets[0].path = prefix;
  EXPECT_CONTAINS(error_of([&] { make_data_loader(mixed, model(), 0); }),
                  "training.datasets[1] " + mixed.datasets[1].path +
                      " stores uint32 token ids, but training.datasets[0] " + prefix + ".bin" +
                      " stores uint16");
}

TEST(BlendConfig, BadWeightsAndEntriesAreErrorsNamingTheEntry) {
  auto error = [](const std::string& value) {
    return error_of([&] {
      load_config({}, {"training.dataset=bin", "training.datasets=" + value});
    });
  };
  EXPECT_CONTAINS(error("[{ path = \"a.bin\", weight = -1 }]"),
                  "training.datasets[0] (a.bin): weight must be a finite number >= 0, got -1");
  EXPECT_CONTAINS(error("[{ path = \"a.bin\", weight = 0 }, { path = \"b.bin\", weight = 0 }]"),
                  "training.datasets: every weight is 0");
  EXPECT_CONTAINS(error("[{ weight = 1 }]"), "training.datasets[0]: needs path = \"...\"");
  EXPECT_CONTAINS(error("[{ path = \"a.bin\" }]"), "training.datasets[0] (a.bin): needs weight");
  EXPECT_CONTAINS(error("[{ path = \"a.bin\", wieght = 1 }]"),
                  "unknown key 'wieght' (did you mean 'weight'?)");
  EXPECT_CONTAINS(error("[{ path = \"a.bin\", weight = 1, dataset = \"copy\" }]"),
                  "dataset must be \"bin\" or \"megatron\"");
  EXPECT_CONTAINS(error("\"a.bin\""), "expected an array of tables");
  EXPECT_CONTAINS(error_of([] {
                    load_config({}, {"training.dataset=bin", "training.dataset_path=x.bin",
                                     "training.datasets=[{ path = \"a.bin\", weight = 1 }]"});
                  }),
                  "are both set; a run reads one dataset or one blend");
  EXPECT_CONTAINS(
      error_of([] { load_config({}, {"training.datasets=[{ path = \"a.bin\", weight = 1 }]"}); }),
      "training.datasets[0] (a.bin) names no format");
  // A good one round-trips through the TOML that `moepeak config show` prints.
  const Config cfg = load_config(
      {}, {"training.dataset=megatron",
           "training.datasets=[{ path = \"a\", weight = 0.7 }, { path = \"b.bin\", weight = 0.3, "
           "dataset = \"bin\" }]"});
  ASSERT_EQ(cfg.training.datasets.size(), 2u);
  EXPECT_EQ(cfg.training.datasets[1].dataset, DatasetKind::bin);
  EXPECT_EQ(config_value_toml(cfg, "training.datasets"),
            "[{ path = \"a\", weight = 0.7 }, { path = \"b.bin\", weight = 0.3, dataset = \"bin\" "
            "}]");
}

}  // namespace
}  // namespace moepeak
