// The run configuration: typed structs, one per TOML section (docs/design.md#conventions), and the
// loader.
//
//   Config cfg = load_config({"configs/base.toml", "configs/cluster.toml"},
//                            {"training.steps=50", "job.name=run7"});
//   cfg.model.head_dim_resolved();  cfg.runtime.device_memory_bytes();
//   config_to_toml(cfg, /*with_origins=*/true);   // what `moepeak config show` prints
//
// The member defaults below are the embedded default job: the `tiny` model on the built-in copy
// task (configs/tiny.toml writes the same values out). Every key is described, range-checked and
// documented by the one schema table in core/config/schema.cpp; docs/config.md is its reference.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/progress_line.h"  // ProgressMode

namespace moepeak {

// ---- Enumerated settings --------------------------------------------------------------------
// Enumerator i is spelled EnumNames<E>::names[i] in config files ("auto" is `automatic` in C++).

enum class ModelType { mixtral, qwen3_moe, gpt_oss, deepseek_v3 };
// What a layer's attention sees (transformers' layer_types): every earlier key, or the last
// model.sliding_window keys.
enum class AttentionLayerType { full_attention, sliding_attention };
enum class RopeType { default_rope, linear, dynamic, yarn, llama3 };
enum class DatasetKind { copy, bin, megatron };
enum class TokenDtype { uint16, uint32, llmc };
enum class ComputeDtype { automatic, float32, bfloat16 };
enum class DispatchSchedule { standard, llep, pipelined_llep };
enum class ChunkMembership { strided, contiguous };
enum class Routing { model, worst_case };
enum class VocabSchedule { materialized, ring_dtp };
enum class VocabPayload { automatic, activations, weights };
enum class CheckpointSchedule { none, standard, sco };
enum class OptimizerKind { adamw };
enum class OptimizerPlacement { resident, offload_serial, offload_stream };
enum class LrDecay { cosine, linear, constant };
// ProgressMode (metrics.progress) is in core/progress_line.h, beside the rule it feeds.
enum class BackendChoice { automatic, cpu, cuda };
enum class LogLevel { trace, debug, info, warn, error };
enum class BindPolicy { automatic, rank, none };
enum class CpuCommWait { block, poll };
enum class NonfiniteAction { stop, skip };
enum class DocumentBoundaries { eos, index };

template <typename E>
struct EnumNames;

template <>
struct EnumNames<ModelType> {
  static constexpr std::array<std::string_view, 4> names{"mixtral", "qwen3_moe", "gpt_oss",
                                                         "deepseek_v3"};
};
template <>
struct EnumNames<AttentionLayerType> {
  static constexpr std::array<std::string_view, 2> names{"full_attention", "sliding_attention"};
};
template <>
struct EnumNames<RopeType> {
  static constexpr std::array<std::string_view, 5> names{"default", "linear", "dynamic", "yarn",
                                                         "llama3"};
};
template <>
struct EnumNames<DatasetKind> {
  static constexpr std::array<std::string_view, 3> names{"copy", "bin", "megatron"};
};
template <>
struct EnumNames<TokenDtype> {
  static constexpr std::array<std::string_view, 3> names{"uint16", "uint32", "llmc"};
};
template <>
struct EnumNames<ComputeDtype> {
  static constexpr std::array<std::string_view, 3> names{"auto", "float32", "bfloat16"};
};
template <>
struct EnumNames<DispatchSchedule> {
  static constexpr std::array<std::string_view, 3> names{"standard", "llep", "pipelined_llep"};
};
template <>
struct EnumNames<ChunkMembership> {
  static constexpr std::array<std::string_view, 2> names{"strided", "contiguous"};
};
template <>
struct EnumNames<Routing> {
  static constexpr std::array<std::string_view, 2> names{"model", "worst_case"};
};
template <>
struct EnumNames<VocabSchedule> {
  static constexpr std::array<std::string_view, 2> names{"materialized", "ring_dtp"};
};
template <>
struct EnumNames<VocabPayload> {
  static constexpr std::array<std::string_view, 3> names{"auto", "activations", "weights"};
};
template <>
struct EnumNames<CheckpointSchedule> {
  static constexpr std::array<std::string_view, 3> names{"none", "standard", "sco"};
};
template <>
struct EnumNames<OptimizerKind> {
  static constexpr std::array<std::string_view, 1> names{"adamw"};
};
template <>
struct EnumNames<OptimizerPlacement> {
  static constexpr std::array<std::string_view, 3> names{"resident", "offload_serial",
                                                         "offload_stream"};
};
template <>
struct EnumNames<LrDecay> {
  static constexpr std::array<std::string_view, 3> names{"cosine", "linear", "constant"};
};
template <>
struct EnumNames<ProgressMode> {
  static constexpr std::array<std::string_view, 3> names{"auto", "always", "off"};
};
template <>
struct EnumNames<BackendChoice> {
  static constexpr std::array<std::string_view, 3> names{"auto", "cpu", "cuda"};
};
template <>
struct EnumNames<BindPolicy> {
  static constexpr std::array<std::string_view, 3> names{"auto", "rank", "none"};
};
template <>
struct EnumNames<CpuCommWait> {
  static constexpr std::array<std::string_view, 2> names{"block", "poll"};
};
template <>
struct EnumNames<NonfiniteAction> {
  static constexpr std::array<std::string_view, 2> names{"stop", "skip"};
};
template <>
struct EnumNames<DocumentBoundaries> {
  static constexpr std::array<std::string_view, 2> names{"eos", "index"};
};
template <>
struct EnumNames<LogLevel> {
  static constexpr std::array<std::string_view, 5> names{"trace", "debug", "info", "warn", "error"};
};

// The config spelling of an enumerator: enum_name(DispatchSchedule::pipelined_llep) ==
// "pipelined_llep", enum_name(BackendChoice::automatic) == "auto".
template <typename E>
constexpr std::string_view enum_name(E value) {
  return EnumNames<E>::names[static_cast<size_t>(value)];
}

template <typename E>
constexpr std::optional<E> enum_from_name(std::string_view name) {
  for (size_t i = 0; i < EnumNames<E>::names.size(); ++i) {
    if (EnumNames<E>::names[i] == name) return static_cast<E>(i);
  }
  return std::nullopt;
}

// ---- Sections -------------------------------------------------------------------------------
// Ranges and meanings are in schema.cpp and docs/config.md; the comments here are reminders.

struct JobConfig {
  std::string name = "moepeak";  // [A-Za-z0-9._-]+
  std::string description;
  int64_t seed = 1234;
  std::string run_dir = "runs";  // each run writes under run_dir/name

  std::string run_path() const;  // run_dir + "/" + name
  bool operator==(const JobConfig&) const = default;
};

// Hugging Face config.json field names, so a model's config.json maps across key for key; the
// family (model_type) decides which apply and how they are read (core/model/families/,
// docs/models.md). Where families name a field differently (Qwen3-MoE's num_experts), the key is
// Mixtral's.
struct ModelConfig {
  ModelType model_type = ModelType::mixtral;
  int64_t vocab_size = 256;
  int64_t hidden_size = 64;
  int64_t intermediate_size = 128;  // each expert's width (Mixtral); dense layers' (Qwen3-MoE)
  int64_t num_hidden_layers = 2;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 2;
  int64_t head_dim = 16;  // 0 = hidden_size / num_attention_heads
  int64_t num_local_experts = 4;
  int64_t num_experts_per_tok = 2;
  // Qwen3-MoE: each expert's width (0 = intermediate_size); the dense layers: those listed and
  // every layer i with (i + 1) % decoder_sparse_step != 0; the top-k weights renormalised or not.
  int64_t moe_intermediate_size = 0;
  std::vector<int64_t> mlp_only_layers;
  int64_t decoder_sparse_step = 1;
  bool norm_topk_prob = true;
  bool tie_word_embeddings = false;  // the LM head is the embedding matrix
  bool attention_bias = false;       // q/k/v/o projections with biases (gpt_oss, qwen3_moe)
  // gpt_oss: each layer's attention (empty = the family's default: even layers sliding, odd full),
  // the window of the sliding ones (0 = the family's default, 128), and the experts' clamped
  // SwiGLU.
  std::vector<AttentionLayerType> layer_types;
  int64_t sliding_window = 0;
  double swiglu_limit = 7.0;
  double swiglu_alpha = 1.702;
  // deepseek_v3 (DeepSeek-V3, Kimi-K2): multi-head latent attention — queries through a rank
  // q_lora_rank bottleneck (0 = a plain q_proj), keys and values through kv_lora_rank, query/key
  // heads of qk_nope_head_dim + qk_rope_head_dim (the rotary part one key shared by every head),
  // value heads of v_head_dim; sigmoid routing over n_group groups keeping topk_group, weights
  // times routed_scaling_factor; n_shared_experts always-on experts of moe_intermediate_size; the
  // first first_k_dense_replace layers dense; router_bias_update_rate: the auxiliary-loss-free
  // balancing's step gamma on the router's e_score_correction_bias (0 = frozen);
  // num_nextn_predict_layers: the checkpoint's multi-token-prediction layers (carried through an
  // import and export, not trained).
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  int64_t n_shared_experts = 0;
  int64_t first_k_dense_replace = 0;
  double router_bias_update_rate = 0.0;
  int64_t num_nextn_predict_layers = 0;
  // RoPE over interleaved pairs (x0, x1), (x2, x3), ... instead of (i, i + d/2) (deepseek_v3).
  bool rope_interleave = false;
  int64_t max_position_embeddings = 512;
  double rope_theta = 10000.0;
  // RoPE scaling (transformers' rope_scaling / rope_parameters; ops/rope_scaling.h): the type and
  // its parameters. 0 = not set for original_max_position_embeddings, mscale, mscale_all_dim and
  // attention_factor (each type's default then applies).
  RopeType rope_type = RopeType::default_rope;
  double rope_factor = 1.0;
  int64_t rope_original_max_position_embeddings = 0;
  double rope_beta_fast = 32.0;
  double rope_beta_slow = 1.0;
  bool rope_truncate = true;
  double rope_mscale = 0.0;
  double rope_mscale_all_dim = 0.0;
  double rope_attention_factor = 0.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  double rms_norm_eps = 1e-5;
  double router_aux_loss_coef = 0.0;  // 0 = no auxiliary load-balancing loss
  double initializer_range = 0.02;
  // The token that ends a document (config.json's eos_token_id, the first of a list): where
  // training.document_mask and reset_position_ids cut a packed window; -1 = none.
  int64_t eos_token_id = -1;
  // A Hugging Face checkpoint directory to start from (core/checkpoint/hf_import.h); empty =
  // random initialisation. Not part of the model's shape: checkpoints do not record it.
  std::string init_from;

  int64_t head_dim_resolved() const {
    return head_dim != 0 ? head_dim : hidden_size / num_attention_heads;
  }
  int64_t expert_intermediate_size() const {
    return moe_intermediate_size != 0 ? moe_intermediate_size : intermediate_size;
  }
  bool operator==(const ModelConfig&) const = default;
};

// One dataset of a blend (training.datasets): a token file, its sampling weight, and its format
// where it is not training.dataset's.
struct DatasetSource {
  std::string path;
  double weight = 1.0;                 // >= 0; the blend samples in proportion to the weights
  std::optional<DatasetKind> dataset;  // bin or megatron; none = training.dataset
  bool operator==(const DatasetSource&) const = default;
};

struct TrainingConfig {
  int64_t batch_size = 8;        // global sequences per micro-batch B
  int64_t grad_accum_steps = 1;  // micro-batches per optimizer step m (a step sees m B sequences)
  int64_t seq_len = 128;
  int64_t steps = 300;
  double max_norm = 1.0;  // 0 = no gradient clipping
  DatasetKind dataset = DatasetKind::copy;
  std::string dataset_path;  // required unless dataset is copy or datasets is set
  // A blend of token files (core/data/blend_loader.h); empty = the one dataset_path.
  std::vector<DatasetSource> datasets;
  TokenDtype token_dtype = TokenDtype::uint16;
  bool shuffle = true;  // token files: each epoch's windows in a seeded shuffled order
  ComputeDtype dtype = ComputeDtype::automatic;  // auto: fp32 on the CPU, bf16 on CUDA
  // A step whose loss or gradient norm is not finite: stop the job, or skip its update.
  NonfiniteAction on_nonfinite = NonfiniteAction::stop;
  int64_t max_skipped_steps = 10;  // skip: stop after this many skipped steps in a row
  // Packed documents (core/data/documents.h): attention stops at each document's end and the
  // label of a document's last token is not scored; RoPE positions restart at each document;
  // the boundaries from model.eos_token_id or from a Megatron dataset's document index.
  bool document_mask = false;
  bool reset_position_ids = false;
  DocumentBoundaries document_boundaries = DocumentBoundaries::eos;

  bool operator==(const TrainingConfig&) const = default;
};

struct ParallelismConfig {
  int64_t world_size = 0;  // 0 = whatever the launcher starts
  // The degrees of the layout (docs/parallelism.md); 0 = the world size W. Each divides W.
  int64_t expert_parallel = 0;    // Ep: ranks an expert layer is split over
  int64_t sequence_parallel = 0;  // Sp: ranks of one Ulysses group (one set of sequences)
  int64_t data_shard = 0;         // ranks a dense weight's ZeRO-3 shards span (HSDP below W)
  // ZeRO-3 gathers issued ahead of use on a comm stream (core/model/zero_traffic.h); 0 = every
  // gather and reduce-scatter on the compute stream where it is needed.
  int64_t zero_prefetch_depth = 1;

  bool operator==(const ParallelismConfig&) const = default;
};

struct SchedulesConfig {
  DispatchSchedule dispatch = DispatchSchedule::standard;
  int64_t chunk_tokens = 4096;  // c
  int64_t max_chunks = 16;      // K_max
  ChunkMembership chunk_membership = ChunkMembership::strided;
  double llep_lambda = 1.3;
  double llep_alpha = 1.0;
  int64_t min_tokens_per_gemm = 32;
  int64_t llep_slots = 0;               // PipelinedLLEP receive slots S; 0 = the bound's rule
  int64_t llep_max_helped_experts = 0;  // new foreign experts per rank per plan; 0 = E/W + 1
  Routing routing = Routing::model;     // worst_case: every token to experts 0..k-1 (benches)
  VocabSchedule vocab = VocabSchedule::materialized;
  VocabPayload ring_payload = VocabPayload::automatic;
  int64_t vocab_strip = 0;        // columns per strip, 0 = whole shard
  int64_t vocab_kept_strips = 0;  // strips kept from forward to backward
  CheckpointSchedule checkpoint = CheckpointSchedule::standard;
  std::string sco_host_budget = "auto";  // byte size or "auto"

  std::optional<uint64_t> sco_host_budget_bytes() const;  // nullopt = auto
  bool operator==(const SchedulesConfig&) const = default;
};

struct OptimizerConfig {
  OptimizerKind name = OptimizerKind::adamw;
  double lr = 1e-2;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  OptimizerPlacement placement = OptimizerPlacement::resident;
  int64_t bucket_params = 1048576;  // beta
  int64_t staging_slots = 3;        // s

  bool operator==(const OptimizerConfig&) const = default;
};

struct LrSchedulerConfig {
  int64_t warmup_steps = 10;
  LrDecay decay = LrDecay::cosine;
  double min_lr_ratio = 0.1;

  bool operator==(const LrSchedulerConfig&) const = default;
};

struct CheckpointConfig {
  bool enable = false;
  std::string folder = "checkpoints";  // relative to the run directory
  int64_t interval = 0;                // 0 = only at the end
  int64_t keep_latest = 2;
  std::string write_buffer = "auto";  // byte size or "auto" (64 MiB)
  bool async = false;  // snapshot to pinned host memory; write on a background thread

  // The host buffer each rank streams its shards through on a save (auto: 64 MiB).
  uint64_t write_buffer_bytes() const;
  bool operator==(const CheckpointConfig&) const = default;
};

// A held-out loss during training (core/train/trainer.h, Trainer::evaluate).
struct EvalConfig {
  std::string dataset_path;  // empty = no evaluation; in training.dataset's format
  int64_t interval = 0;      // steps between evaluations; 0 = at the end of training only
  int64_t batches = 8;       // batches of training.batch_size x seq_len per evaluation

  bool enabled() const { return !dataset_path.empty(); }
  bool operator==(const EvalConfig&) const = default;
};

struct MetricsConfig {
  int64_t log_freq = 1;
  std::string file;  // empty = metrics.jsonl in the run directory
  ProgressMode progress = ProgressMode::automatic;
  bool tensorboard = false;  // events files in <run directory>/tensorboard (tensorboard_writer.h)

  bool operator==(const MetricsConfig&) const = default;
};

struct RuntimeConfig {
  BackendChoice backend = BackendChoice::automatic;
  std::string device_memory = "2GiB";  // byte size or "auto"
  std::string pinned_memory = "1GiB";  // byte size or "auto"
  std::string probe_file;
  LogLevel log_level = LogLevel::info;
  int64_t threads = 0;     // 0 = this rank's share of the cores
  int64_t numa_node = -1;  // -1 = the local node
  BindPolicy bind = BindPolicy::automatic;
  // The CPU backend's link model (LinkModel, core/comm/comm.h): 0 = off.
  double cpu_link_gb_per_s = 0;    // GB/s = 1e9 B/s per rank, as `moepeak probe` reports
  double cpu_link_latency_us = 0;  // per operation
  CpuCommWait cpu_comm_wait = CpuCommWait::block;  // how a comm stream waits for MPI
  double collective_timeout = 1800;  // seconds before the watchdog aborts a hung collective

  std::optional<uint64_t> device_memory_bytes() const;  // nullopt = auto
  std::optional<uint64_t> pinned_memory_bytes() const;  // nullopt = auto
  bool operator==(const RuntimeConfig&) const = default;
};

struct Config {
  JobConfig job;
  ModelConfig model;
  TrainingConfig training;
  ParallelismConfig parallelism;
  SchedulesConfig schedules;
  OptimizerConfig optimizer;
  LrSchedulerConfig lr_scheduler;
  CheckpointConfig checkpoint;
  EvalConfig eval;
  MetricsConfig metrics;
  RuntimeConfig runtime;

  // "section.key" -> where its value came from: "configs/tiny.toml:12" or
  // "--set model.hidden_size=128"; absent = the default.
  std::map<std::string, std::string> origins;

  // origins[key], or "default".
  std::string origin(const std::string& key) const;
  // True when every setting is equal; origins are not compared.
  bool same_settings(const Config& other) const;
  bool operator==(const Config&) const = default;  // settings and origins
};

// ---- Loading and printing -------------------------------------------------------------------

// Starts from the embedded default, applies the files in order (a later file overrides the keys
// it sets, others keep their values) and then the overrides ("section.key=value", last wins), and
// finally checks the rules that span keys. Throws moepeak::Error naming the file and line (or the
// --set text) and the full key on an unknown section or key, a wrong type, an out-of-range value,
// a value outside an enum, a TOML syntax error or a missing file.
Config load_config(const std::vector<std::string>& files,
                   const std::vector<std::string>& overrides);

// Sets `key` ("section.key") from a TOML literal (as config_value_toml prints it), range-checked
// as a file's value is, and records `origin` as where it came from (model.init_from's
// config.json, for instance). Throws moepeak::Error naming the origin on a bad value.
void set_config_value(Config& cfg, std::string_view key, const std::string& toml_value,
                      const std::string& origin);

// The rules that span keys, which load_config checks last: for a config changed after loading.
void check_config(const Config& cfg);

// Every key in schema order as valid TOML that load_config re-reads to the same settings; with
// origins, each key not at its default carries a "  # file:line" (or "# --set ...") comment.
std::string config_to_toml(const Config& cfg, bool with_origins);

// All keys as "section.key", in schema order.
std::vector<std::string> config_keys();

// One value as a TOML literal ("64", "1e-05", "\"auto\"", "true"); throws on an unknown key.
std::string config_value_toml(const Config& cfg, std::string_view key);

// The reference tables of docs/config.md: per section a heading, its description and a
// | key | type | default | allowed | meaning | table generated from the schema.
std::string config_reference_markdown();

}  // namespace moepeak
