// search_layouts / step_traffic: the layout search over make_plan (see layout_search.h).
#include "core/plan/layout_search.h"

#include <algorithm>
#include <tuple>

#include "core/error.h"
#include "core/model/decoder.h"
#include "core/model/param_layout.h"
#include "ops/schedules/checkpoint_choice.h"
#include "ops/schedules/vocab_choice.h"

namespace moepeak {
namespace {

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

// (G-1)/G: the share of a buffer a ring collective over G ranks moves per rank.
double ring(int ranks) { return ranks > 1 ? static_cast<double>(ranks - 1) / ranks : 0.0; }

const PlanTerm& largest_term(const Plan& p) {
  return *std::max_element(p.terms.begin(), p.terms.end(),
                           [](const PlanTerm& a, const PlanTerm& b) { return a.bytes < b.bytes; });
}

}  // namespace

StepTraffic step_traffic(const Config& cfg, const ParallelDegrees& d, int64_t batch,
                         int64_t seq_len, int64_t grad_accum, DType dtype) {
  const ModelConfig& m = cfg.model;
  const ParamLayout& layout = cached_param_layout(m);
  const double b = static_cast<double>(dtype_size(dtype));
  const bool rows = lm_head_sharding(cfg.schedules.vocab) == LmHeadSharding::vocab_rows;
  const double H = static_cast<double>(m.hidden_size),
               F = static_cast<double>(m.expert_intermediate_size());
  const double L = static_cast<double>(m.num_hidden_layers),
               E = static_cast<double>(m.num_local_experts);
  const double V = static_cast<double>(m.vocab_size);
  // Experts and their dispatch only in the MoE layers (a dense layer's MLP, like the shared
  // experts, is a dense parameter); the attention's heads and widths from the spec (latent
  // attention: q/k heads of nope + rope, value heads of v_head_dim, nkv = nh).
  const DecoderSpec& spec = layout.spec();
  const double L_moe = static_cast<double>(spec.moe_layers());
  const AttentionSpec& a = spec.layers.front().attention;
  const double expert_params = L_moe * E * 3 * F * H;
  double dense = static_cast<double>(layout.parameter_count()) - expert_params;
  if (rows) dense -= V * H;  // the LM head by vocabulary rows is never gathered
  const double N = static_cast<double>(batch * seq_len) / d.world;
  const double mb = static_cast<double>(grad_accum);
  const double passes = schedules::recomputes_layers(cfg.schedules.checkpoint) ? 3 : 2;
  StepTraffic t;
  t.zero_dense = mb * 3 * ring(d.data_shard) * dense * b;
  t.dense_replicas = mb * 2 * ring(d.dense_replicas()) * dense / d.data_shard * b;
  t.zero_experts = mb * 3 * ring(d.expert_replicas()) * expert_params / d.expert * b;
  // q (nh d), k (nkv d), v (nkv dv), out (nh dv) and their gradients: (nh + nkv)(d + dv) per
  // token and pass, = 2 (nh + nkv) d (bitwise) when dv = d.
  t.ulysses = mb * passes * L * N * static_cast<double>(a.heads + a.kv_heads) *
              static_cast<double>(a.head_dim + a.value_dim()) * b * ring(d.sequence);
  t.dispatch = mb * passes * L_moe * 2 * N * static_cast<double>(m.num_experts_per_tok) * H * b *
               ring(d.expert);
  if (rows && d.world > 1) {
    t.vocab = mb * 3 * (d.world - 1) * std::min(N, V / d.world) * H * b;
  }
  return t;
}

LayoutSearch search_layouts(const Config& cfg, const PlanInputs& inputs, LayoutGoal goal) {
  const int W = inputs.world();
  LayoutSearch s;
  s.goal = goal;
  s.global_batch = inputs.batch * inputs.grad_accum;
  for (int ep : divisors(W)) {
    if (cfg.model.num_local_experts % ep != 0) continue;
    for (int sp : divisors(W)) {
      for (int ds : divisors(W)) {
        LayoutRow row;
        row.degrees = {W, ep, sp, ds};
        PlanInputs in = inputs;
        in.degrees = row.degrees;
        // The micro-batches that split over the W/Sp sequence groups, largest first.
        std::vector<int64_t> batches;
        for (int64_t B = s.global_batch; B >= 1; --B) {
          if (s.global_batch % B == 0 && B % row.degrees.sequence_groups() == 0)
            batches.push_back(B);
        }
        if (batches.empty()) {
          row.defect = LayoutDefect::batch;
          row.why = "the global batch " + std::to_string(s.global_batch) +
                    " does not split over W/Sp = " + std::to_string(W / sp) + " sequence groups";
          s.rows.push_back(std::move(row));
          continue;
        }
        // The rules of the layout (the batch aside, each micro-batch passes it), named as such;
        // make_plan would throw them too, wrapped.
        row.defect = layout_defect(cfg.model, batches.front(), in.seq_len, row.degrees, &row.why);
        if (row.defect != LayoutDefect::none) {
          s.rows.push_back(std::move(row));
          continue;
        }
        try {
          for (int64_t B : batches) {
            in.batch = B;
            in.grad_accum = s.global_batch / B;
            row.plan = make_plan(cfg, in);
            row.batch = B;
            row.grad_accum = in.grad_accum;
            row.valid = true;
            if (row.plan.fits()) break;
          }
        } catch (const Error& e) {
          row.valid = false;
          row.defect = LayoutDefect::other;
          row.why = nested_message(e);
          s.rows.push_back(std::move(row));
          continue;
        }
        in.batch = row.batch;
        in.grad_accum = row.grad_accum;
        row.binding = std::string(live_set_name(largest_term(row.plan).set));
        if (goal == LayoutGoal::max_context) row.max_context = max_seq_len(cfg, in);
        if (goal == LayoutGoal::max_batch) row.max_batch = max_batch(cfg, in);
        row.traffic =
            step_traffic(cfg, row.degrees, row.batch, in.seq_len, row.grad_accum, in.dtype);
        s.rows.push_back(std::move(row));
      }
    }
  }
  auto score = [&](const LayoutRow& r) -> int64_t {
    if (goal == LayoutGoal::max_context) return r.max_context;
    if (goal == LayoutGoal::max_batch) return r.max_batch;
    return 0;
  };
  auto eligible = [&](const LayoutRow& r) {
    if (!r.valid) return false;
    return goal == LayoutGoal::fits ? r.plan.fits() : score(r) > 0;
  };
  for (size_t i = 0; i < s.rows.size(); ++i) {
    const LayoutRow& r = s.rows[i];
    if (!eligible(r)) continue;
    if (s.best < 0) {
      s.best = static_cast<int>(i);
      continue;
    }
    const LayoutRow& b = s.rows[static_cast<size_t>(s.best)];
    const auto key = [&](const LayoutRow& x) {
      return std::tuple(score(x), -x.traffic.total(), x.degrees.data_shard, x.degrees.expert);
    };
    if (key(r) > key(b)) s.best = static_cast<int>(i);
  }
  return s;
}

}  // namespace moepeak
