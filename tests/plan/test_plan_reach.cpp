// The plan's reach on the paper's shapes (configs/gpt-oss-20b.toml, gpt-oss-120b.toml,
// deepseek-v3.toml, kimi-k2.toml on H200s: 141 GB device, 250 GB pinned host per rank) — plan only,
// no training — and the --svg picture's structure (core/plan/plan_svg.h). The bounds are the
// numbers measured in docs/plan.md ("Reach on the paper's shapes") with a little slack: a term that
// grows (or a bounded schedule that stops bounding) moves them and fails here.
// Run: ctest -R test_plan_reach --output-on-failure
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <string>

#include "core/config/config.h"
#include "core/model/param_layout.h"
#include "core/plan/plan.h"
#include "core/plan/plan_svg.h"
#include "tests/plan/h200_configs.h"
#include "tests/source_dir.h"

namespace moepeak {
namespace {

const std::string kSourceDir = test_support::source_dir();

Config h200(const std::string& model, bool bounded, const std::vector<std::string>& extra = {}) {
  return test_support::h200_preset(model, bounded, extra);
}

struct Reach {
  int64_t standard, bounded;
};

Reach reach(const std::string& model, int world) {
  const Config b = h200(model, true);
  const PlanInputs in = plan_inputs(b, world);
  EXPECT_EQ(in.dtype, DType::bf16) << model;  // training.dtype = "bfloat16"
  return {max_seq_len(with_standard_schedules(b), in), max_seq_len(b, in)};
}

// Measured: standard 368,528, bounded 8,922,840 (24.2x, with the LLEP spill copies and the fp32
// main grads). The
// standard reach is set by the expert-parallel dispatch's worst case (W*N*k rows) and the
// resident AdamW state (fp32 master, m, v); the bounded one by attention + workspace + Ring-DTP
// strips, which grow with N.
TEST(PlanReach, GptOss20bOn8H200) {
  const Reach r = reach("gpt-oss-20b", 8);
  EXPECT_GE(r.standard, 300000);
  EXPECT_LE(r.standard, 450000);
  EXPECT_GE(r.bounded, 5000000);
  EXPECT_GE(r.bounded, 12 * r.standard);
}

// The paper's settings: 120B on 16 and the 667B class on 64 H200s train at 1M context.
// Measured: gpt-oss-120b/16 standard 28,992, bounded 12,889,152 (the 667B class: below).
bool fits_at(const std::string& model, int world, bool bounded, int64_t T,
             const std::vector<std::string>& sets = {}) {
  const Config c = h200(model, bounded, sets);
  PlanInputs in = plan_inputs(bounded ? c : with_standard_schedules(c), world);
  in.seq_len = T;
  return make_plan(bounded ? c : with_standard_schedules(c), in).fits();
}

// Point checks (a max_seq_len search on the 256-expert shape takes over a minute in a debug build).
TEST(PlanReach, PaperSettingsReachOneMillion) {
  const int64_t K = 1024;
  EXPECT_TRUE(fits_at("gpt-oss-120b", 16, true, 1024 * K));
  // The paper's headline: gpt-oss-120b (the model: sinks, windows, biases) at 1M on 64 H200s.
  EXPECT_TRUE(fits_at("gpt-oss-120b", 64, true, 1024 * K));
  EXPECT_TRUE(fits_at("gpt-oss-120b", 16, false, 16 * K));   // all-standard stops between
  EXPECT_FALSE(fits_at("gpt-oss-120b", 16, false, 32 * K));  // 16K and 32K
}

// The released DeepSeek-V3 and Kimi-K2 (docs/plan.md, "DeepSeek-V3 and Kimi-K2"; latent
// attention, dense first layers and shared experts in the terms). Measured 2026-12-07 at the
// search's best layouts: DeepSeek-V3/64 (64, 64, 64) bounded 4,814,912, standard 0 (resident
// AdamW, 16 B per parameter, is 156 GiB of 131); DeepSeek-V3/128 bounded 15,642,624, standard
// 62,464; Kimi-K2/64 (64, 64, 32) 2,359,296; Kimi-K2/128 with two sequences (128, 64, 128)
// 8,806,912 (its 64 heads cap Sp at 64). Point checks a little inside and past each bounded
// reach, so that a term that grows or shrinks by 10% fails here.
TEST(PlanReach, DeepseekV3AndKimiK2OnH200s) {
  const int64_t K = 1024;
  const std::vector<std::string> ds64 = {"parallelism.expert_parallel=64",
                                         "parallelism.sequence_parallel=64",
                                         "parallelism.data_shard=64"};
  EXPECT_TRUE(fits_at("deepseek-v3", 64, true, 1024 * K, ds64));  // the paper's 667B at 1M
  EXPECT_TRUE(fits_at("deepseek-v3", 64, true, 4480 * K, ds64));
  EXPECT_FALSE(fits_at("deepseek-v3", 64, true, 5120 * K, ds64));
  EXPECT_FALSE(fits_at("deepseek-v3", 64, false, 1 * K, ds64));
  const std::vector<std::string> ds128 = {"parallelism.expert_parallel=128",
                                          "parallelism.sequence_parallel=128",
                                          "parallelism.data_shard=128"};
  EXPECT_TRUE(fits_at("deepseek-v3", 128, false, 56 * K, ds128));
  EXPECT_FALSE(fits_at("deepseek-v3", 128, false, 64 * K, ds128));
  const std::vector<std::string> kimi128 = {
      "training.batch_size=2", "parallelism.expert_parallel=128",
      "parallelism.sequence_parallel=64", "parallelism.data_shard=128"};
  EXPECT_TRUE(fits_at("kimi-k2", 128, true, 8192 * K, kimi128));
  EXPECT_FALSE(fits_at("kimi-k2", 128, true, 9216 * K, kimi128));
  EXPECT_FALSE(fits_at("kimi-k2", 128, false, 1 * K, kimi128));
}

// The Mixtral presets are Hugging Face's shapes (parameters as the model cards count them),
// laid out for nodes of 8 GPUs (Ep = Sp = Ds = 8, eight sequences per micro-batch): on 8, 16
// and 64 H200s the bounded schedules train 8x7B and 8x22B at their full context, and on 64 the
// standard ones too (docs/plan.md: preset reach 7.54M / 263K for 8x7B, 3.00M / 142K for 8x22B
// on 64). 8x22B on 8 reaches 67,888 of its 65,536 only since the plan's total is its largest
// phase (the sum of terms stopped at 63,560): its fp32 main grads are 65.5 GiB per rank.
TEST(PlanReach, MixtralPresetsAreTheHuggingFaceShapesAndFitAtFullContext) {
  const Config x7 = h200("mixtral-8x7b", true), x22 = h200("mixtral-8x22b", true);
  EXPECT_EQ(ParamLayout(x7.model).parameter_count(), 46702792704);
  EXPECT_EQ(ParamLayout(x22.model).parameter_count(), 140620634112);
  EXPECT_EQ(x7.training.seq_len, x7.model.max_position_embeddings);
  EXPECT_EQ(x22.training.seq_len, x22.model.max_position_embeddings);
  for (int W : {8, 16, 64}) {
    EXPECT_TRUE(fits_at("mixtral-8x7b", W, true, x7.training.seq_len)) << W;
    EXPECT_TRUE(fits_at("mixtral-8x22b", W, true, x22.training.seq_len)) << W;
  }
  EXPECT_FALSE(fits_at("mixtral-8x22b", 8, true, 72 * 1024));
  EXPECT_TRUE(fits_at("mixtral-8x7b", 64, false, x7.training.seq_len));
  EXPECT_TRUE(fits_at("mixtral-8x22b", 64, false, x22.training.seq_len));
  EXPECT_FALSE(fits_at("mixtral-8x22b", 8, false, x22.training.seq_len));
  const PlanInputs in = plan_inputs(x7, 64);
  EXPECT_EQ(in.degrees, (ParallelDegrees{64, 8, 8, 8}));
}

// The Qwen3-MoE presets are Hugging Face's shapes: the parameters the model cards publish
// (Qwen3-30B-A3B: 30.5B total, 3.3B activated; Qwen3-235B-A22B: 235B, 22B — counting the
// embedding among the activated), here as the layout counts them, each tensor's elements written
// out. On H200s (docs/plan.md, "The Qwen3-MoE presets", planned 2026-12-07) the bounded stack at
// the presets' own layouts trains 30B-A3B at its full 40,960 context on 8 (reach 1,007,600) and
// both at 1M on 64 (9,306,512 and 2,395,488 with the 235B's own (64, 8, 64): 2,578,064); the
// standard one does not reach the full context on 8 (30B: the expert-parallel dispatch's worst
// case) nor 235B's on 64 (22,152). No layout holds 235B on 8: its bf16 weights and fp32 main
// grads alone are 6 B x 235B / 8 = 176 GB per rank.
TEST(PlanReach, Qwen3PresetsAreTheHuggingFaceShapes) {
  const Config a3b = h200("qwen3-30b-a3b", true), a22b = h200("qwen3-235b-a22b", true);
  auto expected = [](int64_t V, int64_t H, int64_t L, int64_t nh, int64_t nkv, int64_t d, int64_t E,
                     int64_t I) {
    const int64_t layer = 2 * H + 2 * d                       // input and post norms, q and k norms
                          + 2 * nh * d * H + 2 * nkv * d * H  // q, o; k, v
                          + E * H + 3 * E * I * H;            // router, experts
    return 2 * V * H + H + L * layer;                         // embedding, head, final norm
  };
  const ParamLayout small(a3b.model), large(a22b.model);
  EXPECT_EQ(small.parameter_count(), expected(151936, 2048, 48, 32, 4, 128, 128, 768));
  EXPECT_EQ(large.parameter_count(), expected(151936, 4096, 94, 64, 4, 128, 128, 1536));
  EXPECT_NEAR(small.parameter_count() / 1e9, 30.5, 0.05);
  EXPECT_NEAR(large.parameter_count() / 1e9, 235, 0.5);
  // Activated: the matmuls a token meets (top-8 experts) and the embedding row it reads: 3.35B
  // and 22.19B, which the cards round to 3.3B and 22B.
  EXPECT_NEAR((small.active_matmul_parameters() + 151936 * 2048) / 1e9, 3.3, 0.06);
  EXPECT_NEAR((large.active_matmul_parameters() + 151936 * 4096) / 1e9, 22, 0.5);
  EXPECT_EQ(a3b.training.seq_len, a3b.model.max_position_embeddings);

  EXPECT_TRUE(fits_at("qwen3-30b-a3b", 8, true, a3b.training.seq_len));
  EXPECT_FALSE(fits_at("qwen3-30b-a3b", 8, false, a3b.training.seq_len));
  EXPECT_TRUE(fits_at("qwen3-30b-a3b", 64, true, 1024 * 1024));
  EXPECT_TRUE(fits_at("qwen3-235b-a22b", 64, true, 1024 * 1024));
  EXPECT_FALSE(fits_at("qwen3-235b-a22b", 64, false, a22b.training.seq_len));
  const Config on8 = load_config({kSourceDir + "/configs/qwen3-235b-a22b.toml"},
                                 {"runtime.device_memory=141GB", "runtime.pinned_memory=250GB",
                                  "parallelism.expert_parallel=8", "parallelism.data_shard=8"});
  PlanInputs in = plan_inputs(on8, 8);
  in.seq_len = 1024;
  EXPECT_FALSE(make_plan(on8, in).fits());
}

// configs/reach.toml, the preset `moepeak bench reach` measures (docs/perf.md): on its 4 ranks
// at its 32 MiB the plan gives the standard stack a few hundred tokens and the four bounded
// schedules at the preset's knobs more than 16x that (planned 2026-12-04: 408 / 16,984), and
// the batch axis at its 128 tokens more than 3x (3 / 132 sequences).
TEST(PlanReach, ReachPresetPlansTheHeadline) {
  const Config c = load_config({kSourceDir + "/configs/reach.toml"},
                               {"schedules.dispatch=pipelined_llep", "schedules.vocab=ring_dtp",
                                "schedules.checkpoint=sco", "optimizer.placement=offload_stream"});
  const PlanInputs in = plan_inputs(c);
  EXPECT_EQ(in.world(), 4);
  const int64_t standard = max_seq_len(with_standard_schedules(c), in);
  const int64_t bounded = max_seq_len(c, in);
  EXPECT_GE(standard, 128);
  EXPECT_LE(standard, 1024);
  EXPECT_GE(bounded, 16 * standard);
  EXPECT_LE(bounded, 32 * 1024);  // a bench probe at the limit stays seconds long
  const int64_t batch_standard = max_batch(with_standard_schedules(c), in);
  EXPECT_GE(batch_standard, 1);
  EXPECT_GE(max_batch(c, in), 3 * batch_standard);
}

TEST(PlanSvg, WellFormed) {
  const Config b = h200("gpt-oss-20b", true);
  PlanInputs in = plan_inputs(b, 8);
  std::vector<PlanSeries> series{{"all standard", {}}, {"bounded", {}}};
  const std::vector<int64_t> ts = svg_seq_lens(1024, int64_t{1} << 23, 8);
  ASSERT_EQ(ts.size(), 14u);  // 2^10 .. 2^23
  for (int64_t T : ts) {
    in.seq_len = T;
    series[0].plans.push_back(make_plan(with_standard_schedules(b), in));
    series[1].plans.push_back(make_plan(b, in));
  }
  const std::string svg = plan_svg(series, "gpt-oss-20b <8>");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("gpt-oss-20b &lt;8&gt;"), std::string::npos);  // escaped title
  // One group per live set per panel, each with one rect per plan.
  for (LiveSet s : kAllLiveSets) {
    const std::string open = "<g class=\"set\" data-set=\"" + std::string(live_set_name(s)) + "\"";
    size_t at = 0;
    int groups = 0;
    while ((at = svg.find(open, at)) != std::string::npos) {
      const size_t end = svg.find("</g>", at);
      ASSERT_NE(end, std::string::npos);
      const std::string body = svg.substr(at, end - at);
      size_t rects = 0;
      for (size_t r = 0; (r = body.find("<rect", r)) != std::string::npos; ++r) ++rects;
      EXPECT_EQ(rects, ts.size()) << live_set_name(s);
      ++groups;
      at = end;
    }
    EXPECT_EQ(groups, 2) << live_set_name(s);
    EXPECT_NE(svg.find(">" + std::string(live_set_name(s)) + "</text>"), std::string::npos)
        << "legend";
  }
  size_t lines = 0;
  for (size_t r = 0; (r = svg.find("class=\"capacity\"", r)) != std::string::npos; ++r) ++lines;
  EXPECT_EQ(lines, 2u);
  EXPECT_NE(svg.find(">over</text>"), std::string::npos);  // the standard panel overflows at 8M
  // Every number attribute is finite and non-negative.
  const std::regex attr(R"re(\s(x|y|width|height|x1|x2|y1|y2)="([^"]*)")re");
  int checked = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), attr); it != std::sregex_iterator();
       ++it, ++checked) {
    const double v = std::stod((*it)[2].str());
    EXPECT_TRUE(std::isfinite(v) && v >= 0) << (*it)[0].str();
  }
  EXPECT_GT(checked, 200);
}

}  // namespace
}  // namespace moepeak
