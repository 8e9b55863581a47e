// The layout search (core/plan/layout_search.h, `moepeak plan --search-layout`) on the Mixtral
// presets at 8, 16 and 64 H200s, on gpt-oss-20b at 8, DeepSeek-V3 at 64 and Kimi-K2 at 128:
// every (Ep, Sp, data_shard) of W is listed once; the invalid ones say why, with the kind of the
// rule they break (core/model/layout_defect.h, checked on each rule too); each valid row's plan
// is make_plan's for its degrees, micro-batch and accumulation (B * m = the global batch); the
// best is eligible and no row beats it on the goal; the traffic terms vanish exactly where a
// degree makes a collective trivial and equal the documented formula on one row each (Mixtral,
// DeepSeek-V3).
// Run: ctest -R test_plan_layout_search --output-on-failure
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/config/config.h"
#include "core/error.h"
#include "core/model/decoder.h"
#include "core/model/layout_defect.h"
#include "core/model/param_layout.h"
#include "core/plan/layout_search.h"
#include "core/plan/plan.h"
#include "tests/source_dir.h"

namespace moepeak {
namespace {

const std::string kSourceDir = test_support::source_dir();

Config h200_bounded(const std::string& model, const std::vector<std::string>& sets = {}) {
  std::vector<std::string> all = {
      "runtime.device_memory=141GB",       "runtime.pinned_memory=250GB",
      "schedules.dispatch=pipelined_llep", "schedules.vocab=ring_dtp",
      "schedules.checkpoint=sco",          "optimizer.placement=offload_stream"};
  all.insert(all.end(), sets.begin(), sets.end());
  Config c = load_config({kSourceDir + "/configs/" + model + ".toml"}, all);
  // The search ignores the configured degrees.
  c.parallelism.expert_parallel = c.parallelism.sequence_parallel = c.parallelism.data_shard = 0;
  return c;
}

int divisor_count(int n) {
  int c = 0;
  for (int d = 1; d <= n; ++d) c += n % d == 0;
  return c;
}

void expect_consistent(const std::string& model, int W, LayoutGoal goal,
                       const std::vector<std::string>& sets = {}) {
  SCOPED_TRACE(model + " on " + std::to_string(W));
  const Config cfg = h200_bounded(model, sets);
  const PlanInputs in = plan_inputs(cfg, W);
  const LayoutSearch s = search_layouts(cfg, in, goal);
  int ep_count = 0;
  for (int ep = 1; ep <= W; ++ep) {
    ep_count += W % ep == 0 && cfg.model.num_local_experts % ep == 0;
  }
  EXPECT_EQ(s.rows.size(), static_cast<size_t>(ep_count * divisor_count(W) * divisor_count(W)));
  std::set<std::tuple<int, int, int>> seen;
  auto score = [&](const LayoutRow& r) {
    return goal == LayoutGoal::max_context ? r.max_context : r.max_batch;
  };
  for (const LayoutRow& r : s.rows) {
    const ParallelDegrees& d = r.degrees;
    EXPECT_TRUE(seen.insert({d.expert, d.sequence, d.data_shard}).second) << d.str();
    EXPECT_EQ(W % d.expert + W % d.sequence + W % d.data_shard, 0) << d.str();
    // The rule a row breaks, from the documented rules (core/model/layout_defect.h) in their
    // order: the global batch over W/Sp, then the attention's over Sp.
    const AttentionSpec& a = cached_param_layout(cfg.model).spec().layers.front().attention;
    const int64_t heads = a.heads, kv = a.kv_heads, sp = d.sequence;
    const LayoutDefect expected = s.global_batch % d.sequence_groups() != 0 ? LayoutDefect::batch
                                  : heads % sp != 0              ? LayoutDefect::query_heads
                                  : in.seq_len % sp != 0         ? LayoutDefect::seq_len
                                  : heads % kv != 0              ? LayoutDefect::kv_group
                                  : kv % sp != 0 && sp % kv != 0 ? LayoutDefect::kv_heads
                                                                 : LayoutDefect::none;
    EXPECT_EQ(r.defect, expected) << d.str() << ": " << layout_defect_name(r.defect) << " ("
                                  << r.why << "), expected " << layout_defect_name(expected);
    if (!r.valid) {
      EXPECT_FALSE(r.why.empty()) << d.str();
      continue;
    }
    EXPECT_EQ(r.batch * r.grad_accum, s.global_batch) << d.str();
    EXPECT_EQ(r.batch % d.sequence_groups(), 0) << d.str();
    PlanInputs at = in;
    at.degrees = d;
    at.batch = r.batch;
    at.grad_accum = r.grad_accum;
    EXPECT_EQ(make_plan(cfg, at).total, r.plan.total) << d.str();
    // A collective over one rank moves nothing.
    if (d.data_shard == 1) {
      EXPECT_EQ(r.traffic.zero_dense, 0.0) << d.str();
    }
    if (d.data_shard == W) {
      EXPECT_EQ(r.traffic.dense_replicas, 0.0) << d.str();
    }
    if (d.expert == W) {
      EXPECT_EQ(r.traffic.zero_experts, 0.0) << d.str();
    }
    if (d.sequence == 1) {
      EXPECT_EQ(r.traffic.ulysses, 0.0) << d.str();
    }
    if (d.expert == 1) {
      EXPECT_EQ(r.traffic.dispatch, 0.0) << d.str();
    }
  }
  // A head count that Sp does not divide is invalid, and says so.
  if (W > cfg.model.num_attention_heads || cfg.model.num_attention_heads % W != 0) {
    bool named = false;
    for (const LayoutRow& r : s.rows) {
      named |= !r.valid && r.degrees.sequence == W && r.why.find("heads") != std::string::npos;
    }
    EXPECT_TRUE(named) << "Sp = W = " << W << " with " << cfg.model.num_attention_heads
                       << " heads is not flagged";
  }
  ASSERT_GE(s.best, 0) << "no layout fits";
  const LayoutRow& best = s.rows[static_cast<size_t>(s.best)];
  EXPECT_TRUE(best.valid);
  EXPECT_GT(score(best), 0);
  for (const LayoutRow& r : s.rows) {
    if (r.valid) {
      EXPECT_LE(score(r), score(best)) << r.degrees.str();
    }
  }
}

TEST(LayoutSearch, Mixtral8x7bOn8And16And64ByMaxContext) {
  for (int W : {8, 16, 64}) expect_consistent("mixtral-8x7b", W, LayoutGoal::max_context);
}

TEST(LayoutSearch, Mixtral8x22bOn8And16And64ByMaxBatch) {
  for (int W : {8, 16, 64}) expect_consistent("mixtral-8x22b", W, LayoutGoal::max_batch);
}

// Qwen3-30B-A3B on one and on eight nodes (4 kv heads: Sp = 8 replicates each on two ranks);
// 235B-A22B on eight nodes (on one, no layout holds it: test_plan_reach).
TEST(LayoutSearch, Qwen3PresetsOn8And64ByMaxContext) {
  for (int W : {8, 64}) expect_consistent("qwen3-30b-a3b", W, LayoutGoal::max_context);
  expect_consistent("qwen3-235b-a22b", 64, LayoutGoal::max_context);
}

// DeepSeek-V3 and Kimi-K2 on eight and sixteen nodes (docs/plan.md, "DeepSeek-V3 and Kimi-K2";
// one sequence: Sp = W only). DeepSeek-V3 has 128 heads; Kimi-K2 64, so on sixteen nodes Sp =
// 128 is flagged and two sequences let Sp = 64 split them.
TEST(LayoutSearch, DeepseekV3AndKimiK2On64And128ByMaxContext) {
  for (int W : {64, 128}) expect_consistent("deepseek-v3", W, LayoutGoal::max_context);
  expect_consistent("kimi-k2", 64, LayoutGoal::max_context);
  expect_consistent("kimi-k2", 128, LayoutGoal::max_context, {"training.batch_size=2"});
}

TEST(LayoutSearch, GptOss20bOn8ByMaxContext) {
  expect_consistent("gpt-oss-20b", 8, LayoutGoal::max_context);
}

// Mixtral-8x7B has 8 experts: on 64 ranks every valid layout has Ep <= 8, and the best of the
// default goal (fits at the configured shape, fewest bytes) fits.
TEST(LayoutSearch, Mixtral8x7bOn64RanksFitsWithAtMostEightExpertRanks) {
  const Config cfg = h200_bounded("mixtral-8x7b");
  const LayoutSearch s = search_layouts(cfg, plan_inputs(cfg, 64), LayoutGoal::fits);
  ASSERT_GE(s.best, 0);
  const LayoutRow& best = s.rows[static_cast<size_t>(s.best)];
  EXPECT_TRUE(best.plan.fits()) << best.plan.verdict();
  for (const LayoutRow& r : s.rows) EXPECT_LE(r.degrees.expert, 8);
  for (const LayoutRow& r : s.rows) {
    if (r.valid && r.plan.fits()) {
      EXPECT_GE(r.traffic.total(), best.traffic.total());
    }
  }
}

// Each rule of core/model/layout_defect.h on the embedded default (4 experts, 4 query heads, 2 kv
// heads) and a 12-head, 3-kv-head variant: the kind and the numbers of the first rule broken, and
// DecoderModel::check_layout throws that message as an input error (the user's config, no C++
// location); a layout that breaks none passes both.
TEST(LayoutDefect, NamesTheFirstRuleBrokenWithItsNumbers) {
  const Config base = load_config({}, {});
  const Config twelve =
      load_config({}, {"model.num_attention_heads=12", "model.num_key_value_heads=3"});
  struct Case {
    const Config* cfg;
    ParallelDegrees degrees;  // W, Ep, Sp, Ds
    int64_t batch, seq_len;
    LayoutDefect defect;
    std::vector<std::string> words;  // in the message
  };
  const std::vector<Case> cases = {
      // Ep = 8 over 4 experts, though the batch (1 over 8 groups) breaks a later rule too.
      {&base, {8, 8, 1, 1}, 1, 128, LayoutDefect::experts, {"Ep = 8", "num_local_experts (4)"}},
      {&base, {8, 1, 2, 1}, 2, 128, LayoutDefect::batch, {"Sp = 2", "4 sequence groups", "(2)"}},
      // Sp = 8 over 4 heads, though seq_len 130 does not split over 8 either.
      {&base, {8, 1, 8, 1}, 1, 130, LayoutDefect::query_heads, {"4 query heads", "over 8 ranks"}},
      {&base, {8, 1, 4, 1}, 2, 130, LayoutDefect::seq_len, {"sequence length 130", "130 % 4 = 2"}},
      {&twelve, {2, 1, 2, 1}, 1, 128, LayoutDefect::kv_heads, {"3 kv heads on 2 ranks"}},
      {&base, {8, 2, 4, 2}, 2, 128, LayoutDefect::none, {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.degrees.str() + ", batch " + std::to_string(c.batch) + ", seq_len " +
                 std::to_string(c.seq_len));
    std::string why = "poison";
    const LayoutDefect d = layout_defect(c.cfg->model, c.batch, c.seq_len, c.degrees, &why);
    EXPECT_EQ(d, c.defect) << layout_defect_name(d) << ": " << why;
    EXPECT_EQ(layout_defect(c.cfg->model, c.batch, c.seq_len, c.degrees), c.defect);
    if (c.defect == LayoutDefect::none) {
      EXPECT_NO_THROW(DecoderModel::check_layout(c.cfg->model, c.batch, c.seq_len, c.degrees));
      continue;
    }
    for (const std::string& w : c.words) EXPECT_NE(why.find(w), std::string::npos) << why;
    try {
      DecoderModel::check_layout(c.cfg->model, c.batch, c.seq_len, c.degrees);
      ADD_FAILURE() << "check_layout accepted it";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::input);
      EXPECT_EQ(e.message(), why);
    }
  }
  // The stable keys the search's --json writes.
  EXPECT_EQ(layout_defect_name(LayoutDefect::batch), "batch");
  EXPECT_EQ(layout_defect_name(LayoutDefect::query_heads), "query_heads");
  EXPECT_EQ(layout_defect_name(LayoutDefect::other), "other");
}

// The traffic formula of docs/parallelism.md#bytes-per-step, on one layout by hand.
TEST(LayoutSearch, TrafficIsTheDocumentedFormula) {
  const Config cfg = h200_bounded("mixtral-8x7b");
  const ModelConfig& m = cfg.model;
  const ParallelDegrees d{64, 8, 8, 8};
  const int64_t B = 8, T = 32768, accum = 2;
  const StepTraffic t = step_traffic(cfg, d, B, T, accum, DType::bf16);
  const double b = 2, H = 4096, F = 14336, L = 32, E = 8, V = 32000, N = B * T / 64.0;
  const double P_exp = L * E * 3 * F * H;
  const double P_dense = static_cast<double>(ParamLayout(m).parameter_count()) - P_exp - V * H;
  auto ring = [](double g) { return (g - 1) / g; };
  EXPECT_DOUBLE_EQ(t.zero_dense, accum * 3 * ring(8) * P_dense * b);
  EXPECT_DOUBLE_EQ(t.dense_replicas, accum * 2 * ring(8) * P_dense / 8 * b);
  EXPECT_DOUBLE_EQ(t.zero_experts, accum * 3 * ring(8) * P_exp / 8 * b);
  EXPECT_DOUBLE_EQ(t.ulysses, accum * 3 * L * 2 * N * (32 + 8) * 128 * b * ring(8));
  EXPECT_DOUBLE_EQ(t.dispatch, accum * 3 * L * 2 * N * 2 * H * b * ring(8));
  EXPECT_DOUBLE_EQ(t.vocab, accum * 3 * 63 * std::min(N, V / 64) * H * b);
}

// The same formula for DeepSeek-V3: the Ulysses exchange at its own head widths (q, k of
// 128 + 64, v and out of 128, nkv = nh = 128), experts and their dispatch in the 58 MoE layers
// only, the 3 dense layers' MLPs and the shared experts among the dense parameters.
TEST(LayoutSearch, TrafficOfLatentAttentionAndDenseLayers) {
  const Config cfg = h200_bounded("deepseek-v3");
  const ParallelDegrees d{64, 8, 8, 8};
  const int64_t B = 8, T = 32768, accum = 2;
  const StepTraffic t = step_traffic(cfg, d, B, T, accum, DType::bf16);
  const double b = 2, H = 7168, F = 2048, E = 256, V = 129280, N = B * T / 64.0;
  const double P_exp = 58 * E * 3 * F * H;
  const double P_dense =
      static_cast<double>(ParamLayout(cfg.model).parameter_count()) - P_exp - V * H;
  auto ring = [](double g) { return (g - 1) / g; };
  EXPECT_DOUBLE_EQ(t.zero_dense, accum * 3 * ring(8) * P_dense * b);
  EXPECT_DOUBLE_EQ(t.dense_replicas, accum * 2 * ring(8) * P_dense / 8 * b);
  EXPECT_DOUBLE_EQ(t.zero_experts, accum * 3 * ring(8) * P_exp / 8 * b);
  EXPECT_DOUBLE_EQ(t.ulysses, accum * 3 * 61 * N * (128 + 128) * (192 + 128) * b * ring(8));
  EXPECT_DOUBLE_EQ(t.dispatch, accum * 3 * 58 * 2 * N * 8 * H * b * ring(8));
  EXPECT_DOUBLE_EQ(t.vocab, accum * 3 * 63 * std::min(N, V / 64) * H * b);
}

}  // namespace
}  // namespace moepeak
