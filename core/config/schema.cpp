// The config schema: the one table of every key (section, key, type, member, allowed values,
// meaning), value checks against it, and the two things written from it: the TOML that
// `moepeak config show` prints (config_to_toml) and the reference tables of docs/config.md.
#include "core/config/schema.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/units.h"

namespace moepeak::config_schema {
namespace {

// ---- How a field is checked, beyond its type ------------------------------------------------

struct Rule {
  std::optional<Bound> lower, upper;
  bool byte_size = false;  // a std::string member holding a byte size or "auto"
  std::string (*check_text)(const std::string&) = nullptr;
  std::string_view text_rule;
};

Rule no_limit() { return {}; }
Rule bounded(std::optional<Bound> lower, std::optional<Bound> upper) {
  Rule r;
  r.lower = lower;
  r.upper = upper;
  return r;
}
Rule at_least(double v) { return bounded(Bound{v, true}, std::nullopt); }
Rule above(double v) { return bounded(Bound{v, false}, std::nullopt); }
Rule between(Bound lower, Bound upper) { return bounded(lower, upper); }
Rule byte_size_or_auto(std::optional<Bound> lower = std::nullopt) {
  Rule r;
  r.lower = lower;
  r.byte_size = true;
  return r;
}
Rule text(std::string (*check)(const std::string&), std::string_view rule) {
  Rule r;
  r.check_text = check;
  r.text_rule = rule;
  return r;
}

std::string check_non_empty(const std::string& s) { return s.empty() ? "must not be empty" : ""; }

std::string check_run_name(const std::string& s) {
  if (s.empty()) return "must not be empty";
  for (char c : s) {
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return "may contain only letters, digits, '.', '_' and '-'";
  }
  if (s == "." || s == "..") return "must not be '.' or '..'";
  return "";
}

// ---- Building a field from its members ------------------------------------------------------

template <typename T>
constexpr bool is_config_enum = std::is_enum_v<T>;
template <typename T>
struct EnumListOf {
  static constexpr bool value = false;
};
template <typename E>
struct EnumListOf<std::vector<E>> {
  static constexpr bool value = std::is_enum_v<E>;
  using Enum = E;
};

template <auto SectionMember, auto KeyMember>
Field make_field(std::string_view section, std::string_view key, Rule rule, std::string_view doc) {
  using Value = std::remove_cvref_t<decltype((std::declval<Config&>().*SectionMember).*KeyMember)>;
  Field f{};
  f.section = section;
  f.key = key;
  f.doc = doc;
  f.lower = rule.lower;
  f.upper = rule.upper;
  f.check_text = rule.check_text;
  f.text_rule = rule.text_rule;
  if constexpr (std::is_same_v<Value, int64_t>) {
    f.type = FieldType::integer;
  } else if constexpr (std::is_same_v<Value, double>) {
    f.type = FieldType::floating;
  } else if constexpr (std::is_same_v<Value, bool>) {
    f.type = FieldType::boolean;
  } else if constexpr (std::is_same_v<Value, std::string>) {
    f.type = rule.byte_size ? FieldType::byte_size : FieldType::string;
  } else if constexpr (std::is_same_v<Value, std::vector<DatasetSource>>) {
    f.type = FieldType::dataset_list;
  } else if constexpr (std::is_same_v<Value, std::vector<int64_t>>) {
    f.type = FieldType::integer_list;
  } else if constexpr (EnumListOf<Value>::value) {
    f.type = FieldType::enum_list;
    f.choices = EnumNames<typename EnumListOf<Value>::Enum>::names;
  } else {
    static_assert(is_config_enum<Value>,
                  "config members are int64_t, double, bool, string, enum, a dataset list or an "
                  "integer list");
    f.type = FieldType::enumeration;
    f.choices = EnumNames<Value>::names;
  }
  f.get = [](const Config& c) -> FieldValue {
    const Value& v = (c.*SectionMember).*KeyMember;
    if constexpr (is_config_enum<Value>) {
      return std::string(enum_name(v));
    } else if constexpr (EnumListOf<Value>::value) {
      std::vector<std::string> names;
      for (auto e : v) names.emplace_back(enum_name(e));
      return names;
    } else {
      return v;
    }
  };
  f.set = [](Config& c, const FieldValue& v) {
    Value& m = (c.*SectionMember).*KeyMember;
    if constexpr (is_config_enum<Value>) {
      auto parsed = enum_from_name<Value>(std::get<std::string>(v));
      MOEPEAK_CHECK(parsed.has_value(), "unchecked enum value ", std::get<std::string>(v));
      m = *parsed;
    } else if constexpr (EnumListOf<Value>::value) {
      m.clear();
      for (const std::string& name : std::get<std::vector<std::string>>(v)) {
        auto parsed = enum_from_name<typename EnumListOf<Value>::Enum>(name);
        MOEPEAK_CHECK(parsed.has_value(), "unchecked enum value ", name);
        m.push_back(*parsed);
      }
    } else {
      m = std::get<Value>(v);
    }
  };
  return f;
}

// FIELD(model, hidden_size, ...) names the member and spells the key from it, so the TOML key and
// the C++ member cannot differ.
#define FIELD(section, key, rule, doc) \
  make_field<&Config::section, &decltype(Config::section)::key>(#section, #key, rule, doc)

// ---- The schema -----------------------------------------------------------------------------

constexpr Section kSections[] = {
    {"job", "Run identity: name, seed, and where the run's outputs go."},
    {"model",
     "The architecture: its family (model_type) and shapes, with Hugging Face config.json field "
     "names (docs/models.md)."},
    {"training", "Batch, sequence length, steps, data and compute dtype."},
    {"parallelism", "The process count the job expects and the degrees of its layout."},
    {"schedules",
     "Standard or bounded schedule per live set (docs/design.md#the-schedules) and their knobs."},
    {"optimizer", "AdamW hyper-parameters and where the optimizer state lives."},
    {"lr_scheduler", "Learning-rate warm-up and decay."},
    {"checkpoint", "Saving checkpoints (HF safetensors + per-rank state) during the run."},
    {"eval", "A held-out loss during training: forward only, with the training schedules."},
    {"metrics", "Per-step metrics: console line, JSONL file, progress line, TensorBoard."},
    {"runtime", "Backend, memory capacities, logging and threads."},
};

const std::vector<Field>& field_table() {
  static const std::vector<Field> table = {
      // [job]
      FIELD(job, name, text(check_run_name, "non-empty; letters, digits, '.', '_', '-'"),
            "Run name; the run's outputs go to run_dir/name."),
      FIELD(job, description, no_limit(), "Free text recorded with the run."),
      FIELD(job, seed, at_least(0), "Seed for weight initialisation and the data order."),
      FIELD(job, run_dir, text(check_non_empty, "non-empty"),
            "Directory under which each run gets run_dir/name (\".\" = the working directory)."),
      // [model]
      FIELD(model, model_type, no_limit(),
            "The model family, as Hugging Face's config.json names it: mixtral (every layer MoE, "
            "renormalised top-k), qwen3_moe (q/k RMSNorm per head, dense layers by "
            "mlp_only_layers and decoder_sparse_step, norm_topk_prob), gpt_oss (attention "
            "sinks, sliding-window layers, biases, a clamped SwiGLU) or deepseek_v3 (DeepSeek-V3 "
            "and Kimi-K2: latent attention, sigmoid group routing, shared experts). "
            "docs/models.md."),
      FIELD(model, vocab_size, at_least(2), "Vocabulary size V (embedding and LM-head rows)."),
      FIELD(model, hidden_size, at_least(1), "Model width H."),
      FIELD(model, intermediate_size, at_least(1),
            "Hidden width of the SwiGLU MLP: each expert's (unless moe_intermediate_size is set) "
            "and the dense layers'."),
      FIELD(model, num_hidden_layers, at_least(1), "Decoder layers L."),
      FIELD(model, num_attention_heads, at_least(1),
            "Query heads; a multiple of num_key_value_heads."),
      FIELD(model, num_key_value_heads, at_least(1), "Key/value heads (grouped-query attention)."),
      FIELD(model, head_dim, at_least(0),
            "Width per head, even (RoPE rotates pairs); 0 = hidden_size / num_attention_heads."),
      FIELD(model, num_local_experts, at_least(1),
            "Experts per MoE layer E (qwen3_moe's num_experts)."),
      FIELD(model, num_experts_per_tok, at_least(1),
            "Experts each token is routed to (top-k); at most num_local_experts."),
      FIELD(model, moe_intermediate_size, at_least(0),
            "qwen3_moe: hidden width of each expert's SwiGLU MLP; 0 = intermediate_size."),
      FIELD(model, mlp_only_layers, at_least(0),
            "qwen3_moe: layers (0-based) with a dense MLP instead of experts."),
      FIELD(model, decoder_sparse_step, at_least(1),
            "qwen3_moe: layer i has experts when (i + 1) % decoder_sparse_step == 0 (and it is "
            "not in mlp_only_layers); 1 = every layer."),
      FIELD(model, norm_topk_prob, no_limit(),
            "Renormalise the top-k router probabilities to sum 1 (mixtral: always true)."),
      FIELD(model, tie_word_embeddings, no_limit(),
            "The LM head is the embedding matrix (one tensor, both gradients)."),
      FIELD(model, attention_bias, no_limit(),
            "q/k/v/o projections with biases (gpt_oss: true in the released models; qwen3_moe)."),
      FIELD(model, layer_types, no_limit(),
            "gpt_oss: each layer's attention, full_attention or sliding_attention (the last "
            "sliding_window keys); empty = even layers sliding, odd layers full."),
      FIELD(model, sliding_window, at_least(0),
            "gpt_oss: the keys a sliding_attention layer sees (the query and the window - 1 "
            "before it); 0 = the family's default, 128."),
      FIELD(model, swiglu_limit, above(0),
            "gpt_oss: the experts' clamp, gate <= limit and -limit <= up <= limit."),
      FIELD(model, swiglu_alpha, above(0),
            "gpt_oss: the experts' activation (up + 1) * gate * sigmoid(alpha * gate)."),
      FIELD(model, q_lora_rank, at_least(0),
            "deepseek_v3: the queries' low-rank bottleneck (q_a_proj, q_a_layernorm, q_b_proj); "
            "0 = a plain q_proj (config.json's null)."),
      FIELD(model, kv_lora_rank, at_least(0),
            "deepseek_v3: the keys' and values' latent width (kv_a_proj_with_mqa, "
            "kv_a_layernorm, kv_b_proj)."),
      FIELD(model, qk_nope_head_dim, at_least(0),
            "deepseek_v3: the part of each query/key head without RoPE."),
      FIELD(model, qk_rope_head_dim, at_least(0),
            "deepseek_v3: the rotary part of each query/key head, even; the key's is one vector "
            "shared by every head."),
      FIELD(model, v_head_dim, at_least(0), "deepseek_v3: the width of each value head."),
      FIELD(model, n_group, at_least(1),
            "deepseek_v3: the router's expert groups (num_local_experts / n_group experts "
            "each); 1 = no grouping."),
      FIELD(model, topk_group, at_least(1),
            "deepseek_v3: the groups a token's experts may come from (the groups with the "
            "largest sum of their two best scores)."),
      FIELD(model, routed_scaling_factor, above(0),
            "deepseek_v3: the factor on the routed experts' weights."),
      FIELD(model, n_shared_experts, at_least(0),
            "deepseek_v3: experts every token goes through beside its routed ones (one SwiGLU "
            "of width moe_intermediate_size * n_shared_experts); 0 = none."),
      FIELD(model, first_k_dense_replace, at_least(0),
            "deepseek_v3: the first layers, dense (a SwiGLU of width intermediate_size)."),
      FIELD(model, router_bias_update_rate, at_least(0),
            "deepseek_v3: auxiliary-loss-free balancing: after each optimizer step every "
            "expert's e_score_correction_bias moves by this gamma times sign(mean load - its "
            "load), the loads over the job's tokens; 0 = the bias stays as loaded (DeepSeek-V3 "
            "trained with 1e-3)."),
      FIELD(model, num_nextn_predict_layers, at_least(0),
            "deepseek_v3: multi-token-prediction layers the checkpoint carries "
            "(model.layers.{num_hidden_layers}...); passed through import and export as they "
            "are, not trained."),
      FIELD(model, rope_interleave, no_limit(),
            "RoPE rotates interleaved pairs (x0, x1), (x2, x3), ... instead of (i, i + d/2) "
            "(deepseek_v3's default)."),
      FIELD(model, max_position_embeddings, at_least(1),
            "Longest sequence the model takes; training.seq_len may not exceed it (raise it with "
            "RoPE scaling to extend the context, docs/models.md)."),
      FIELD(model, rope_theta, above(0), "RoPE base frequency theta."),
      FIELD(model, rope_type, no_limit(),
            "RoPE scaling as transformers computes it (modeling_rope_utils.py): default (none), "
            "linear, dynamic (NTK, recomputed for sequences past max_position_embeddings), yarn, "
            "llama3. docs/models.md#extending-the-context."),
      FIELD(model, rope_factor, at_least(1),
            "Scaling factor (linear, dynamic, yarn, llama3); yarn: 1 = max_position_embeddings "
            "/ rope_original_max_position_embeddings."),
      FIELD(model, rope_original_max_position_embeddings, at_least(0),
            "yarn, llama3: the context the model was pretrained at; 0 = not set."),
      FIELD(model, rope_beta_fast, above(0), "yarn: the fast boundary of the frequency ramp."),
      FIELD(model, rope_beta_slow, above(0), "yarn: the slow boundary of the frequency ramp."),
      FIELD(model, rope_truncate, no_limit(),
            "yarn: round the ramp's boundaries to whole dimensions (gpt-oss: false)."),
      FIELD(model, rope_mscale, at_least(0),
            "yarn: mscale of the attention factor (with rope_mscale_all_dim); 0 = not set."),
      FIELD(model, rope_mscale_all_dim, at_least(0),
            "yarn: mscale_all_dim of the attention factor; 0 = not set."),
      FIELD(model, rope_attention_factor, at_least(0),
            "yarn: the factor multiplying cos and sin; 0 = derived from rope_factor."),
      FIELD(model, rope_low_freq_factor, above(0), "llama3: low_freq_factor."),
      FIELD(model, rope_high_freq_factor, above(0), "llama3: high_freq_factor."),
      FIELD(model, rms_norm_eps, above(0), "Epsilon inside RMSNorm."),
      FIELD(model, router_aux_loss_coef, at_least(0),
            "Weight of the auxiliary load-balancing loss; 0 = the loss is off. deepseek_v3: "
            "DeepSeek-V3's sequence-wise balance loss (its alpha; 1e-4 in the paper)."),
      FIELD(model, initializer_range, above(0),
            "Standard deviation of the normal weight initialisation."),
      FIELD(model, eos_token_id, at_least(-1),
            "The token that ends a document (config.json's eos_token_id; the first of a list): "
            "where training.document_mask and training.reset_position_ids cut a packed window. "
            "-1 = none."),
      FIELD(model, init_from, no_limit(),
            "Hugging Face checkpoint directory of a supported family (config.json, "
            "model.safetensors or "
            "model.safetensors.index.json) to start from; keys of [model] not set come from its "
            "config.json. Empty = random initialisation. Ignored when a run resumes."),
      // [training]
      FIELD(training, batch_size, at_least(1),
            "Global sequences per micro-batch B (over all ranks): what every memory bound is "
            "for."),
      FIELD(training, grad_accum_steps, at_least(1),
            "Micro-batches per optimizer step m: a step trains on m B sequences, with the "
            "gradients of its micro-batches summed before the one AdamW update."),
      FIELD(training, seq_len, at_least(2),
            "Tokens per sequence T; at most model.max_position_embeddings."),
      FIELD(training, steps, at_least(1), "Optimizer steps to run."),
      FIELD(training, max_norm, at_least(0), "Gradient-norm clipping threshold; 0 = no clipping."),
      FIELD(training, on_nonfinite, no_limit(),
            "A step whose loss or gradient norm is NaN or infinite: stop = end the job with an "
            "error naming the step and the first live set holding a non-finite value, writing no "
            "checkpoint of that state; skip = drop that step's update (the weights and optimizer "
            "state stay as they were), count it in the metrics (skipped_steps) and go on."),
      FIELD(training, max_skipped_steps, at_least(1),
            "With on_nonfinite = \"skip\": stop the job after this many skipped steps in a "
            "row."),
      FIELD(training, document_mask, no_limit(),
            "Packed documents: a token attends only to the earlier tokens of its own document (a "
            "window's first, partial document starts at the window's start), and the label of a "
            "document's last token (the next document's first) is not scored. Documents end with "
            "model.eos_token_id, or as training.document_boundaries says."),
      FIELD(training, reset_position_ids, no_limit(),
            "Packed documents: RoPE positions restart at 0 at each document's first token."),
      FIELD(training, document_boundaries, no_limit(),
            "Where documents end for document_mask and reset_position_ids: eos = after each "
            "model.eos_token_id (the EOS belongs to the document it ends); index = a Megatron "
            "dataset's own document index (training.dataset = \"megatron\")."),
      FIELD(training, dataset, no_limit(),
            "copy = the built-in synthetic long-range copy task; bin = llm.c/nanoGPT token file; "
            "megatron = Megatron .bin/.idx indexed dataset."),
      FIELD(training, dataset_path, no_limit(),
            "Data file (for megatron the path of the .bin); required unless dataset = \"copy\"."),
      FIELD(training, datasets, no_limit(),
            "A blend of token files, sampled in proportion to their weights (Megatron's blended "
            "dataset): [{ path = \"a\", weight = 0.7 }, { path = \"b\", weight = 0.3 }]; each "
            "entry's format is training.dataset unless it sets dataset. Empty = the one "
            "training.dataset_path."),
      FIELD(training, token_dtype, no_limit(),
            "Token type of a headerless .bin (uint16, uint32), or llmc = llm.c's 256-int32 "
            "header form."),
      FIELD(training, shuffle, no_limit(),
            "Token files: visit each epoch's seq_len-token windows in a pseudo-random order "
            "drawn from job.seed, reshuffled every epoch; false = in file order, each window "
            "starting where the last ended. The copy task ignores it."),
      FIELD(training, dtype, no_limit(),
            "Compute dtype; auto = float32 on the CPU backend, bfloat16 on CUDA."),
      // [parallelism]
      FIELD(parallelism, world_size, at_least(0),
            "Ranks the job expects; 0 = whatever the launcher starts, otherwise the job refuses "
            "to start on another count."),
      FIELD(parallelism, expert_parallel, at_least(0),
            "Expert-parallel degree Ep (divides the world size W and num_local_experts): each "
            "group of Ep ranks holds every expert once; the W/Ep groups are expert-data-parallel "
            "replicas over which each expert is ZeRO-3 sharded. 0 = W."),
      FIELD(parallelism, sequence_parallel, at_least(0),
            "Ulysses degree Sp (divides W, num_attention_heads and seq_len): each group of Sp "
            "ranks holds B/(W/Sp) whole sequences, split by position. 0 = W."),
      FIELD(parallelism, data_shard, at_least(0),
            "Ranks a dense weight is ZeRO-3 sharded over (divides W); below W the W/data_shard "
            "groups are replicas whose gradients are all-reduced (hybrid sharding). 0 = W."),
      FIELD(parallelism, zero_prefetch_depth, between({0, true}, {8, true}),
            "ZeRO-3 groups all-gathered ahead of use on a comm stream while the current one "
            "computes (each layer's gradient reduce-scatter then overlaps the next layer's "
            "backward); each costs one gathered layer in `weights`. 0 = every gather and "
            "reduce-scatter on the compute stream, exposed."),
      // [schedules]
      FIELD(schedules, dispatch, no_limit(),
            "Expert dispatch: standard all-to-all, llep (least-loaded EP), or pipelined_llep "
            "(LLEP in chunks with receive buffers bounded at launch)."),
      FIELD(schedules, chunk_tokens, at_least(1),
            "PipelinedLLEP token budget c per chunk and source rank."),
      FIELD(schedules, max_chunks, at_least(1),
            "PipelinedLLEP chunk limit K_max; K = min(ceil(N/c), K_max)."),
      FIELD(schedules, chunk_membership, no_limit(),
            "Tokens of chunk i: strided = positions i, i+K, i+2K, ...; contiguous = one slice."),
      FIELD(schedules, llep_lambda, at_least(1),
            "LLEP rebalances only when max/mean expert load exceeds lambda."),
      FIELD(schedules, llep_alpha, above(0),
            "LLEP capacity factor: each rank takes at most alpha x total/W routes."),
      FIELD(schedules, llep_slots, between({0, true}, {3, true}),
            "PipelinedLLEP receive slots S in flight: 1 = dispatch, experts and return one chunk "
            "after another; 2 = the next chunk's dispatch and the last one's return beside this "
            "chunk's experts; 3 = all three at once with no wait between them. 0 = the most the "
            "paper's bound 2 Ep k c_eff H b holds (2, or 1 when it does not fit). Each slot is "
            "R_c rows (2 R_c in backward) in `dispatch`; the plan follows the choice."),
      FIELD(schedules, llep_max_helped_experts, at_least(0),
            "LLEP and PipelinedLLEP: foreign experts a rank may compute rows of (and so hold "
            "weight copies of) per plan, new ones per chunk under PipelinedLLEP. It fixes the "
            "copies' bytes in `weights` and `grads` at launch. 0 = min(E - E/W, E/W + 1), the "
            "fewest that always fits the receive capacity; smaller values are refused, larger "
            "ones (up to E - E/W) let the planner balance more at the cost of more copies."),
      FIELD(schedules, min_tokens_per_gemm, at_least(1),
            "LLEP spills no fewer routes than this to another rank (keeps GEMMs efficient)."),
      FIELD(schedules, routing, no_limit(),
            "model = the router's top-k; worst_case = every token's k experts are experts "
            "0..k-1 (all on expert rank 0 when k <= E/Ep), the routing the plan's expert-parallel "
            "and LLEP dispatch bounds assume: bench reach's baseline, not for training (the model "
            "does not learn)."),
      FIELD(schedules, vocab, no_limit(),
            "Vocabulary projection: materialized N x V logits, or ring_dtp (Ring-DTP strips)."),
      FIELD(schedules, ring_payload, no_limit(),
            "What travels round the Ring-DTP ring; auto = weights when N > V/P, else "
            "activations."),
      FIELD(schedules, vocab_strip, at_least(0),
            "Ring-DTP logit columns per strip; 0 = the whole shard (V/P)."),
      FIELD(schedules, vocab_kept_strips, at_least(0),
            "Ring-DTP strips kept from forward to backward (each saves re-forming it in backward "
            "for N x strip logits held between the two); 0 = the paper's schedule, none kept."),
      FIELD(schedules, checkpoint, no_limit(),
            "Activation checkpointing: none, standard (boundaries stay on device), or sco "
            "(boundaries offloaded to pinned host memory)."),
      FIELD(schedules, sco_host_budget, byte_size_or_auto(),
            "Pinned host bytes SCO may use for boundaries (layers offloaded from layer 0 on while "
            "they fit); auto = what runtime.pinned_memory can still give at each step."),
      // [optimizer]
      FIELD(optimizer, name, no_limit(), "Optimizer."),
      FIELD(optimizer, lr, above(0), "Peak learning rate."),
      FIELD(optimizer, beta1, between({0, true}, {1, false}), "AdamW first-moment decay."),
      FIELD(optimizer, beta2, between({0, true}, {1, false}), "AdamW second-moment decay."),
      FIELD(optimizer, eps, above(0), "AdamW epsilon."),
      FIELD(optimizer, weight_decay, at_least(0), "Decoupled weight decay."),
      FIELD(optimizer, placement, no_limit(),
            "resident = m, v on the device beside the weights (fp32 weights are the master); "
            "offload_serial = master, m, v in pinned host memory, grads to the host, a "
            "multi-threaded host AdamW, weights back (ZeRO-Offload); offload_stream = "
            "OffloadStreamAdamW (host state streamed through the device in buckets)."),
      FIELD(optimizer, bucket_params, at_least(1),
            "OffloadStreamAdamW bucket size beta: parameters per bucket (device staging is "
            "staging_slots x 3 x beta values)."),
      FIELD(optimizer, staging_slots, at_least(2),
            "OffloadStreamAdamW device staging slots s; a slot is refilled only after its "
            "write-back, so 3 overlaps all three stages."),
      // [lr_scheduler]
      FIELD(lr_scheduler, warmup_steps, at_least(0),
            "Linear warm-up steps from 0 to optimizer.lr."),
      FIELD(lr_scheduler, decay, no_limit(), "Decay after warm-up down to min_lr_ratio x lr."),
      FIELD(lr_scheduler, min_lr_ratio, between({0, true}, {1, true}),
            "Final learning rate as a fraction of optimizer.lr."),
      // [checkpoint]
      FIELD(checkpoint, enable, no_limit(), "Write checkpoints."),
      FIELD(checkpoint, folder, text(check_non_empty, "non-empty"),
            "Checkpoint directory, relative to the run directory."),
      FIELD(checkpoint, interval, at_least(0), "Steps between checkpoints; 0 = only at the end."),
      FIELD(checkpoint, keep_latest, at_least(1), "Checkpoints kept; older ones are deleted."),
      FIELD(checkpoint, write_buffer, byte_size_or_auto(Bound{4096, true}),
            "Host buffer each rank streams its own shards through on a save (a save's host "
            "memory per rank beyond the training's); auto = 64MiB."),
      FIELD(checkpoint, async, no_limit(),
            "Asynchronous saves: the step boundary copies the state to pinned host memory (the "
            "plan's checkpoint_snapshot term) and a background thread writes the files while "
            "training goes on; the next save, a stop signal and the end of training wait for it."),
      // [metrics]
      // [eval]
      FIELD(eval, dataset_path, no_limit(),
            "Held-out token file (for megatron the prefix or .bin), in training.dataset's format "
            "and token type; empty = no evaluation. The same windows, in file order from its "
            "start, every evaluation."),
      FIELD(eval, interval, at_least(0),
            "Steps between evaluations, and one at the end of training; 0 = at the end only."),
      FIELD(eval, batches, at_least(1),
            "Batches of training.batch_size x training.seq_len per evaluation (the file must "
            "hold batches x batch_size x seq_len + 1 tokens)."),
      FIELD(metrics, log_freq, at_least(1), "Steps between console metric lines."),
      FIELD(metrics, file, no_limit(),
            "JSONL metrics file; empty = metrics.jsonl in the run directory."),
      FIELD(metrics, progress, no_limit(),
            "Progress line redrawn in place: auto = only when stdout is the user's terminal (a "
            "terminal, and under mpirun one whose window mpirun copied from its own: mpirun "
            "writing to a file or pipe gets log lines only), always = wherever stdout goes, "
            "off = never."),
      FIELD(metrics, tensorboard, no_limit(),
            "TensorBoard event files of each step's scalars in tensorboard/ of the run directory "
            "(rank 0; `tensorboard --logdir RUN_DIR/tensorboard`); a resumed run first drops the "
            "steps it writes again (docs/design.md#machine-readable-outputs)."),
      // [runtime]
      FIELD(runtime, backend, no_limit(), "auto = CUDA when built and a GPU is usable, else CPU."),
      FIELD(runtime, device_memory, byte_size_or_auto(Bound{0, false}),
            "Device memory capacity (the arena); auto = on CUDA the card's free memory less the "
            "plan's terms outside the arena (the CUDA context, cuBLAS, 512 MiB of NCCL buffers "
            "per communicator; set it lower where NCCL needs more, e.g. NVLS on NVSwitch nodes), "
            "2 GiB on the CPU."),
      FIELD(runtime, pinned_memory, byte_size_or_auto(),
            "Pinned host pool budget; auto = from the probe's host budget."),
      FIELD(runtime, probe_file, no_limit(),
            "Topology file written by `moepeak probe`; empty = probe at start-up."),
      FIELD(runtime, log_level, no_limit(),
            "Log level of rank 0; other ranks log warnings up, and each rank's placement line "
            "(--log-all-ranks: every rank at this level)."),
      FIELD(runtime, threads, at_least(0),
            "CPU compute threads per rank; 0 = this rank's share of the cores."),
      FIELD(runtime, numa_node, at_least(-1),
            "NUMA node for pinned memory and threads; -1 = the node local to the rank."),
      FIELD(runtime, bind, no_limit(),
            "Bind each rank's threads and pinned pool to its place (its GPU's NUMA node, or its "
            "share of the cores); auto = unless the launcher bound the rank already or the host "
            "has more ranks than PUs; rank = always; none = never."),
      FIELD(runtime, cpu_link_gb_per_s, at_least(0),
            "CPU backend only: every collective and send/recv of a rank takes at least its bytes "
            "/ this bandwidth (GB/s = 1e9 B/s, as `moepeak probe` reports), so overlap shows as "
            "over a real network; 0 = off (shared-memory speed)."),
      FIELD(runtime, cpu_link_latency_us, at_least(0),
            "CPU backend only: the link model's latency per operation in microseconds; 0 = none."),
      FIELD(runtime, cpu_comm_wait, no_limit(),
            "CPU backend only: how a comm stream waits for MPI. block = MPI's blocking calls, "
            "which spin on a core; poll = non-blocking calls tested with short sleeps, so a "
            "waiting rank leaves its core to compute (as a GPU's communication leaves its SMs). "
            "For overlap measurements on hosts with fewer cores than ranks' threads."),
      FIELD(runtime, collective_timeout, at_least(0),
            "Seconds a collective or send/recv may run before the watchdog aborts the job, "
            "naming the rank, the operation, its communicator and the step (a dead, hung or "
            "far-behind peer) instead of hanging until the scheduler's limit; 0 = no watchdog. "
            "The CPU backend's MPI operations; NCCL's own timeout serves the CUDA backend."),
  };
  return table;
}
#undef FIELD

// Shortest text that reads back as the same double: 0.02, 1e-05, 10000.
std::string shortest_number(double v) {
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, result.ptr);
}

std::string range_text(const std::optional<Bound>& lower, const std::optional<Bound>& upper) {
  if (lower && upper) {
    return std::string(lower->inclusive ? "[" : "(") + shortest_number(lower->value) + ", " +
           shortest_number(upper->value) + (upper->inclusive ? "]" : ")");
  }
  if (lower) return std::string(lower->inclusive ? ">= " : "> ") + shortest_number(lower->value);
  if (upper) return std::string(upper->inclusive ? "<= " : "< ") + shortest_number(upper->value);
  return "";
}

bool in_range(double v, const std::optional<Bound>& lower, const std::optional<Bound>& upper) {
  if (lower && (lower->inclusive ? v < lower->value : v <= lower->value)) return false;
  if (upper && (upper->inclusive ? v > upper->value : v >= upper->value)) return false;
  return true;
}

std::string range_phrase(const std::optional<Bound>& lower, const std::optional<Bound>& upper) {
  std::string r = range_text(lower, upper);
  return (lower && upper) ? "in " + r : r;
}

std::string choices_text(std::span<const std::string_view> choices) {
  std::string out;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i) out += ", ";
    out += choices[i];
  }
  return out;
}

}  // namespace

// Escapes the one character that would end a markdown table cell.
std::string markdown_cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

std::span<const Section> sections() { return kSections; }

std::span<const Field> fields() { return field_table(); }

const Section* find_section(std::string_view name) {
  for (const Section& s : kSections) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

const Field* find_field(std::string_view section, std::string_view key) {
  for (const Field& f : field_table()) {
    if (f.section == section && f.key == key) return &f;
  }
  return nullptr;
}

std::string_view type_name(FieldType type) {
  switch (type) {
    case FieldType::integer:
      return "integer";
    case FieldType::floating:
      return "float";
    case FieldType::boolean:
      return "boolean";
    case FieldType::string:
      return "string";
    case FieldType::enumeration:
      return "enum";
    case FieldType::byte_size:
      return "byte size";
    case FieldType::dataset_list:
      return "dataset list";
    case FieldType::integer_list:
      return "integer list";
    case FieldType::enum_list:
      return "enum list";
  }
  return "?";
}

std::string allowed_text(const Field& field) {
  switch (field.type) {
    case FieldType::integer:
    case FieldType::floating: {
      std::string r = range_text(field.lower, field.upper);
      return r.empty() ? "any" : r;
    }
    case FieldType::boolean:
      return "true, false";
    case FieldType::string:
      return field.text_rule.empty() ? "any" : std::string(field.text_rule);
    case FieldType::enumeration:
      return choices_text(field.choices);
    case FieldType::byte_size: {
      std::string r = "byte size (\"16GiB\", \"512MB\", \"4096\") or \"auto\"";
      if (field.lower || field.upper) r += "; bytes " + range_text(field.lower, field.upper);
      return r;
    }
    case FieldType::dataset_list:
      return "an array of { path = \"...\", weight = w >= 0 [, dataset = \"bin\" | "
             "\"megatron\"] }, the weights not all 0";
    case FieldType::integer_list: {
      const std::string r = range_text(field.lower, field.upper);
      return "an array of integers" + (r.empty() ? std::string() : ", each " + r);
    }
    case FieldType::enum_list:
      return "an array, each of " + choices_text(field.choices);
  }
  return "";
}

namespace {

// training.datasets: each path named, each weight finite and >= 0, each format a token file's,
// and not every weight 0. "" when fine.
std::string check_dataset_list(const std::string& key, const std::vector<DatasetSource>& list) {
  bool any_weight = false;
  for (size_t i = 0; i < list.size(); ++i) {
    const DatasetSource& d = list[i];
    const std::string entry = key + "[" + std::to_string(i) + "]";
    if (d.path.empty()) return entry + ".path must not be empty";
    if (!std::isfinite(d.weight) || d.weight < 0) {
      return entry + " (" + d.path + "): weight must be a finite number >= 0, got " +
             shortest_number(d.weight);
    }
    if (d.dataset == DatasetKind::copy) {
      return entry + " (" + d.path +
             "): dataset must be \"bin\" or \"megatron\" (a blend mixes token files)";
    }
    any_weight = any_weight || d.weight > 0;
  }
  if (!list.empty() && !any_weight) {
    return key +
           ": every weight is 0, so the blend has nothing to sample; give at least one "
           "dataset a weight > 0";
  }
  return "";
}

}  // namespace

std::string check_value(const Field& field, const FieldValue& value) {
  const std::string key = field.full_key();
  switch (field.type) {
    case FieldType::integer: {
      int64_t v = std::get<int64_t>(value);
      if (!in_range(static_cast<double>(v), field.lower, field.upper)) {
        return key + " must be " + range_phrase(field.lower, field.upper) + ", got " +
               std::to_string(v);
      }
      return "";
    }
    case FieldType::floating: {
      double v = std::get<double>(value);
      if (!std::isfinite(v)) return key + " must be a finite number, got " + shortest_number(v);
      if (!in_range(v, field.lower, field.upper)) {
        return key + " must be " + range_phrase(field.lower, field.upper) + ", got " +
               to_toml_literal(value);
      }
      return "";
    }
    case FieldType::boolean:
      return "";
    case FieldType::string: {
      if (!field.check_text) return "";
      std::string problem = field.check_text(std::get<std::string>(value));
      if (problem.empty()) return "";
      return key + " " + problem + ", got " + quote_toml_string(std::get<std::string>(value));
    }
    case FieldType::enumeration: {
      const std::string& v = std::get<std::string>(value);
      if (std::find(field.choices.begin(), field.choices.end(), v) != field.choices.end())
        return "";
      std::string msg =
          key + " must be one of " + choices_text(field.choices) + "; got " + quote_toml_string(v);
      if (auto near = closest_match(v, {field.choices.begin(), field.choices.end()})) {
        msg += " (did you mean '" + *near + "'?)";
      }
      return msg;
    }
    case FieldType::byte_size: {
      const std::string& v = std::get<std::string>(value);
      if (v == "auto") return "";
      std::optional<uint64_t> bytes = parse_bytes(v);
      if (!bytes) {
        return key +
               " must be a byte size such as \"16GiB\", \"512MB\" or \"4096\", or \"auto\"; got " +
               quote_toml_string(v);
      }
      if (!in_range(static_cast<double>(*bytes), field.lower, field.upper)) {
        return key + " must be " + range_phrase(field.lower, field.upper) + " bytes, got " +
               quote_toml_string(v);
      }
      return "";
    }
    case FieldType::dataset_list:
      return check_dataset_list(key, std::get<std::vector<DatasetSource>>(value));
    case FieldType::integer_list: {
      const auto& list = std::get<std::vector<int64_t>>(value);
      for (size_t i = 0; i < list.size(); ++i) {
        if (!in_range(static_cast<double>(list[i]), field.lower, field.upper)) {
          return key + "[" + std::to_string(i) + "] must be " +
                 range_phrase(field.lower, field.upper) + ", got " + std::to_string(list[i]);
        }
      }
      return "";
    }
    case FieldType::enum_list: {
      const auto& list = std::get<std::vector<std::string>>(value);
      for (size_t i = 0; i < list.size(); ++i) {
        if (std::find(field.choices.begin(), field.choices.end(), list[i]) != field.choices.end())
          continue;
        std::string msg = key + "[" + std::to_string(i) + "] must be one of " +
                          choices_text(field.choices) + "; got " + quote_toml_string(list[i]);
        if (auto near = closest_match(list[i], {field.choices.begin(), field.choices.end()}))
          msg += " (did you mean '" + *near + "'?)";
        return msg;
      }
      return "";
    }
  }
  return "";
}

std::string quote_toml_string(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    unsigned char u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (u < 0x20 || u == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04X", static_cast<unsigned>(u));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string to_toml_literal(const FieldValue& value) {
  if (auto list = std::get_if<std::vector<int64_t>>(&value)) {
    std::string out = "[";
    for (size_t i = 0; i < list->size(); ++i) out += (i ? ", " : "") + std::to_string((*list)[i]);
    return out + "]";
  }
  if (auto list = std::get_if<std::vector<std::string>>(&value)) {
    std::string out = "[";
    for (size_t i = 0; i < list->size(); ++i)
      out += (i ? ", " : "") + quote_toml_string((*list)[i]);
    return out + "]";
  }
  if (auto list = std::get_if<std::vector<DatasetSource>>(&value)) {
    std::string out = "[";
    for (const DatasetSource& d : *list) {
      out += (out.size() > 1 ? ", " : "") + std::string("{ path = ") + quote_toml_string(d.path) +
             ", weight = " + to_toml_literal(d.weight);
      if (d.dataset) out += ", dataset = " + quote_toml_string(enum_name(*d.dataset));
      out += " }";
    }
    return out + "]";
  }
  if (auto i = std::get_if<int64_t>(&value)) return std::to_string(*i);
  if (auto b = std::get_if<bool>(&value)) return *b ? "true" : "false";
  if (auto s = std::get_if<std::string>(&value)) return quote_toml_string(*s);
  double d = std::get<double>(value);
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  std::string text = shortest_number(d);
  if (text.find_first_of(".e") == std::string::npos) text += ".0";  // TOML reads 10000 as integer
  return text;
}

std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string_view>& candidates) {
  // Optimal string alignment distance: edits plus adjacent transpositions ("modle" -> "model").
  auto distance = [](std::string_view a, std::string_view b) {
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      for (size_t j = 1; j <= b.size(); ++j) {
        size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
        if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
      }
    }
    return d[a.size()][b.size()];
  };
  size_t limit = word.size() <= 3 ? 1 : (word.size() <= 8 ? 2 : 3);
  std::optional<std::string> best;
  size_t best_distance = limit + 1;
  for (std::string_view c : candidates) {
    size_t dist = distance(word, c);
    if (dist < best_distance) {
      best_distance = dist;
      best = std::string(c);
    }
  }
  return best;
}

}  // namespace moepeak::config_schema

namespace moepeak {

using config_schema::Field;
using config_schema::markdown_cell;
using config_schema::Section;

std::string config_to_toml(const Config& cfg, bool with_origins) {
  std::string out;
  for (const Section& section : config_schema::sections()) {
    std::vector<std::pair<std::string, const Field*>> lines;
    for (const Field& f : config_schema::fields()) {
      if (f.section != section.name) continue;
      lines.emplace_back(std::string(f.key) + " = " + config_schema::to_toml_literal(f.get(cfg)),
                         &f);
    }
    size_t width = 0;
    for (const auto& [line, f] : lines) width = std::max(width, line.size());

    if (!out.empty()) out += "\n";
    out += "# " + std::string(section.doc) + "\n";
    out += "[" + std::string(section.name) + "]\n";
    for (const auto& [line, f] : lines) {
      out += line;
      auto origin = cfg.origins.find(f->full_key());
      if (with_origins && origin != cfg.origins.end()) {
        std::string where = origin->second;
        for (char& c : where) {
          if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';  // keep it one comment
        }
        out += std::string(width - line.size() + 2, ' ') + "# " + where;
      }
      out += "\n";
    }
  }
  return out;
}

std::vector<std::string> config_keys() {
  std::vector<std::string> keys;
  for (const Field& f : config_schema::fields()) keys.push_back(f.full_key());
  return keys;
}

std::string config_value_toml(const Config& cfg, std::string_view key) {
  size_t dot = key.find('.');
  const Field* f = dot == std::string_view::npos
                       ? nullptr
                       : config_schema::find_field(key.substr(0, dot), key.substr(dot + 1));
  if (!f) MOEPEAK_INPUT_ERROR("unknown config key '", key, "'");
  return config_schema::to_toml_literal(f->get(cfg));
}

std::string config_reference_markdown() {
  const Config defaults;
  std::string out;
  for (const Section& section : config_schema::sections()) {
    if (!out.empty()) out += "\n";
    out += "### [" + std::string(section.name) + "]\n\n" + std::string(section.doc) + "\n\n";
    out += "| key | type | default | allowed | meaning |\n";
    out += "|-----|------|---------|---------|---------|\n";
    for (const Field& f : config_schema::fields()) {
      if (f.section != section.name) continue;
      out += "| `" + std::string(f.key) + "` | " + std::string(config_schema::type_name(f.type)) +
             " | `" + markdown_cell(config_schema::to_toml_literal(f.get(defaults))) + "` | " +
             markdown_cell(config_schema::allowed_text(f)) + " | " +
             markdown_cell(std::string(f.doc)) + " |\n";
    }
  }
  return out;
}

}  // namespace moepeak
