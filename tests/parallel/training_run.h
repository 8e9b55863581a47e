// The trainer-like harness the multi-rank model tests share: a DecoderModel with its [schedules]
// on this rank's Comm (one rank or W, in a layout of ParallelDegrees), the AdamW that an
// OptimizerConfig's placement names over it (resident by default), this rank's share of a
// seeded global batch, the job's grad norm, and whole gathered tensors to compare across
// schedules, layouts or rank counts. Header-only; each test is one translation unit.
//
//   TrainingRun run(init_process_group(), model_config, schedules);   // this rank of W
//   global_batch(step, B * T, V, ids, labels);                         // the same on every rank
//   double loss = run.forward_backward(ids, labels, B, T);             // the job's loss
//   double norm = run.grad_norm();  run.update(step, norm, lr);
//
// Used by test_train_parallel, test_train_layouts, test_model_ring_dtp and test_train_llep
// (ctest -R parallel|layouts|ring|llep).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "core/comm/comm.h"
#include "core/comm/process_group.h"
#include "core/data/batch_shard.h"
#include "core/error.h"
#include "core/model/decoder.h"
#include "core/model/optimizer_params.h"
#include "core/train/router_balance.h"
#include "ops/elementwise.h"
#include "ops/fill.h"
#include "ops/schedules/optimizer_choice.h"

namespace moepeak::test_support {

// The next value of a splitmix64 sequence whose state is `x`.
inline uint64_t splitmix64(uint64_t& x) {
  x += 0x9e3779b97f4a7c15ull;
  uint64_t z = x;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The global batch of a step: (n) ids and labels in [0, vocab), about one label in seven -100.
// `salt` picks an independent sequence of batches (tests differ in it; every rank agrees).
inline void global_batch(int step, int64_t n, int64_t vocab, std::vector<int64_t>& ids,
                         std::vector<int64_t>& labels, uint64_t salt = 1) {
  ids.resize(static_cast<size_t>(n));
  labels.resize(static_cast<size_t>(n));
  uint64_t x = 0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(step) + salt);
  auto next = [&] { return splitmix64(x); };
  for (int64_t i = 0; i < n; ++i) {
    ids[i] = static_cast<int64_t>(next() % static_cast<uint64_t>(vocab));
    labels[i] =
        next() % 7 == 0 ? -100 : static_cast<int64_t>(next() % static_cast<uint64_t>(vocab));
  }
}

// |a - b| / |b|
inline double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-300); }

// max |got - want| / max |want|
inline double scaled_error(const std::vector<double>& got, const std::vector<double>& want) {
  MOEPEAK_CHECK(got.size() == want.size(), "compared tensors differ in size: ", got.size(), " vs ",
                want.size());
  double scale = 0, worst = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t j = 0; j < want.size(); ++j) worst = std::max(worst, std::abs(got[j] - want[j]));
  return worst / std::max(scale, 1e-300);
}

// A small MoE decoder the multi-rank tests train: V = 37, H = 16, F = 20, 4 query heads of 4
// over 2 kv heads, 4 experts of which each token takes 2, the load-balancing loss on.
inline ModelConfig small_moe_model(int64_t layers = 2) {
  ModelConfig m;
  m.vocab_size = 37;
  m.hidden_size = 16;
  m.intermediate_size = 20;
  m.num_hidden_layers = layers;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 4;
  m.num_local_experts = 4;
  m.num_experts_per_tok = 2;
  m.max_position_embeddings = 64;
  m.router_aux_loss_coef = 0.02;
  m.initializer_range = 0.2;
  return m;
}

// The layouts' models: Mixtral's, or Qwen3-MoE's parts (q/k norms, a dense layer, narrower
// experts, unnormalised top-k weights), or those with a tied head (standard schedules: Ring-DTP
// keeps a head of its own), gpt-oss's or DeepSeek-V3's (below). Used by test_train_layouts and
// test_train_documents.
enum class LayoutModel { mixtral, qwen3, qwen3_tied, gpt_oss, deepseek_v3 };

// 8 experts (Ep up to 8), 8 query heads over 2 kv heads (replicated when Sp = 4), the
// load-balancing loss on (its counts are summed over the expert replicas).
inline ModelConfig layout_model() {
  ModelConfig m;
  m.vocab_size = 37;
  m.hidden_size = 16;
  m.intermediate_size = 20;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 8;
  m.num_key_value_heads = 2;
  m.head_dim = 4;
  m.num_local_experts = 8;
  m.num_experts_per_tok = 2;
  m.max_position_embeddings = 64;
  m.router_aux_loss_coef = 0.02;
  m.initializer_range = 0.2;
  return m;
}

inline ModelConfig model_of(LayoutModel which) {
  ModelConfig m = layout_model();
  if (which == LayoutModel::mixtral) return m;
  if (which == LayoutModel::deepseek_v3) {
    // Latent attention over 8 heads (Sp = 4: 2 query and 2 key/value heads a rank), q/k heads
    // of 4 + 2 rotary dims and value heads of 3, a dense first layer, 2 of 4 groups, a shared
    // expert, the correction biases moving every step (gamma 0.05, so that the choices change
    // within the 10 steps) and the sequence-wise balance loss (alpha 0.02; under Ulysses each
    // sequence's counts and scores are summed over its sequence group).
    m.model_type = ModelType::deepseek_v3;
    m.num_key_value_heads = 8;
    m.head_dim = 6;
    m.q_lora_rank = 6;
    m.kv_lora_rank = 5;
    m.qk_nope_head_dim = 4;
    m.qk_rope_head_dim = 2;
    m.v_head_dim = 3;
    m.num_hidden_layers = 3;
    m.first_k_dense_replace = 1;
    m.moe_intermediate_size = 12;
    m.n_group = 4;
    m.topk_group = 2;
    m.routed_scaling_factor = 2.5;
    m.n_shared_experts = 1;
    m.rope_interleave = true;
    m.router_aux_loss_coef = 0.02;
    m.router_bias_update_rate = 0.05;
    return m;
  }
  if (which == LayoutModel::gpt_oss) {
    m.model_type = ModelType::gpt_oss;
    m.head_dim = 6;
    m.attention_bias = true;
    m.sliding_window = 3;  // below the batches' T = 8: the even layers' window binds
    m.swiglu_limit = 0.3;  // so that the clamp binds on a good share of the experts' inputs
    return m;
  }
  m.model_type = ModelType::qwen3_moe;
  m.moe_intermediate_size = 12;
  m.mlp_only_layers = {0};
  m.norm_topk_prob = false;
  m.head_dim = 6;
  m.tie_word_embeddings = which == LayoutModel::qwen3_tied;
  return m;
}

// All four bounded schedules at the small models' shapes (8 tokens per rank): PipelinedLLEP in
// several chunks with rebalancing whenever one expert group is busier than the mean, Ring-DTP
// in strips of 2 columns, SCO (OffloadStreamAdamW is the optimizer's placement, set apart).
inline SchedulesConfig bounded_schedules() {
  SchedulesConfig s;
  s.dispatch = DispatchSchedule::pipelined_llep;
  s.chunk_tokens = 3;
  s.max_chunks = 4;
  s.llep_lambda = 1.0;
  s.min_tokens_per_gemm = 1;
  s.vocab = VocabSchedule::ring_dtp;
  s.vocab_strip = 2;
  s.checkpoint = CheckpointSchedule::sco;
  return s;
}

struct TrainingRun {
  std::unique_ptr<Backend> backend = Backend::create(BackendOptions{});
  Stream& stream = backend->default_stream();
  std::unique_ptr<Comm> comm;
  std::unique_ptr<DecoderModel> model;
  std::unique_ptr<schedules::Optimizer> adamw;
  // The routers' correction-bias balancing, as the Trainer runs it (model.router_bias_update_rate;
  // inactive for a model without correction biases).
  std::unique_ptr<RouterBiasBalance> balance;
  DType dtype;
  OwnedTensor ids, labels, positions;  // (N) this rank's share of the loaded batch
  OwnedTensor doc_start;               // (B/(W/Sp), T) i32 with packed documents
  TokenBatch batch;
  int64_t loss_tokens = 0;  // scored tokens of the whole global batch

  // ranks = RankInfo{} for one rank in this process (no MPI peers).
  // `degrees`: the layout (default: every degree W); `placement`: the optimizer's;
  // `zero_prefetch_depth`: the model's ZeRO-3 gathers ahead of use (ZeroTraffic).
  TrainingRun(const RankInfo& ranks, const ModelConfig& cfg, const SchedulesConfig& schedules,
              DType dtype_ = DType::f32, uint64_t init_seed = 11,
              std::optional<ParallelDegrees> degrees = std::nullopt,
              OptimizerPlacement placement = OptimizerPlacement::resident,
              int zero_prefetch_depth = kDefaultZeroPrefetchDepth)
      : dtype(dtype_) {
    comm = make_comm(*backend, ranks);
    model = std::make_unique<DecoderModel>(*backend, stream, *comm, cfg, schedules, dtype, degrees,
                                           zero_prefetch_depth);
    model->params().initialize(init_seed, cfg.initializer_range, stream);
    OptimizerConfig opt;
    opt.weight_decay = 0.1;
    opt.placement = placement;
    opt.bucket_params = 512;  // several buckets of the tiny models under offload_stream
    adamw = schedules::make_optimizer(*backend, optimizer_params(model->params()), opt, 1);
    balance =
        std::make_unique<RouterBiasBalance>(model->params().layout(), cfg.router_bias_update_rate);
  }

  // Uploads this rank's share of the global (B*T) batch.
  void load(const std::vector<int64_t>& gids, const std::vector<int64_t>& glabels, int64_t B,
            int64_t T) {
    const BatchBlock block = rank_batch_block(B, T, comm->world_size(), comm->rank(),
                                              model->groups().degrees().sequence);
    LocalBatch local;
    for (int64_t b = block.row_begin; b < block.row_begin + block.rows; ++b) {
      for (int64_t t = block.col_begin; t < block.col_begin + block.cols; ++t) {
        local.input_ids.push_back(gids[b * T + t]);
        local.labels.push_back(glabels[b * T + t]);
        local.positions.push_back(t);
      }
    }
    load(local, B, T, count_scored(glabels));
  }

  // Uploads a share of a (B, T) batch as the trainer reads it (read_local_batch): ids, labels,
  // positions and, with packed documents, the sequence group's doc_start; loss_tokens: the
  // scored tokens of the whole batch.
  void load(const LocalBatch& local, int64_t B, int64_t T, int64_t loss_tokens_) {
    const int64_t N = static_cast<int64_t>(local.input_ids.size());
    auto upload = [&](OwnedTensor& t, const void* v, DType dt, Shape shape, const char* what) {
      t = OwnedTensor::device(*backend, shape, dt, LiveSet::workspace, what);
      std::memcpy(t.data(), v, static_cast<size_t>(t.view().numel()) * dtype_size(dt));
    };
    upload(ids, local.input_ids.data(), DType::i64, Shape{N}, "ids");
    upload(labels, local.labels.data(), DType::i64, Shape{N}, "labels");
    upload(positions, local.positions.data(), DType::i64, Shape{N}, "positions");
    batch = TokenBatch{ids, labels, positions, B, T, count_scored(local.labels)};
    if (!local.doc_start.empty()) {
      upload(doc_start, local.doc_start.data(), DType::i32, Shape{local.batch, T},
             "document starts");
      batch.doc_start = doc_start;
    }
    loss_tokens = loss_tokens_;
  }

  // Forward and backward of the loaded batch from zeroed gradients; returns the job's loss.
  double forward_backward() {
    model->params().zero_grads(stream);
    const double loss = model->forward_backward(batch, loss_tokens);
    balance->add(model->expert_load());
    return loss;
  }
  double forward_backward(const std::vector<int64_t>& gids, const std::vector<int64_t>& glabels,
                          int64_t B, int64_t T) {
    load(gids, glabels, B, T);
    return forward_backward();
  }

  // The gradient norm over the job (each element counted once: the dense shards on one of their
  // replicas).
  double grad_norm() {
    OwnedTensor acc =
        OwnedTensor::device(*backend, Shape{1}, DType::f64, LiveSet::workspace, "norm");
    ops::fill(acc, 0.0, stream);
    ops::sum_squares_cpu(model->params().counted_grads(), acc, stream);
    stream.synchronize();
    double sum[1] = {acc.data_as<double>()[0]};
    all_reduce_host(*comm, *backend, stream, sum);
    return std::sqrt(sum[0]);
  }

  // One AdamW step at `lr`, gradients clipped to norm 1.
  void update(int step, double norm, double lr) {
    const double clip = norm > 1.0 ? 1.0 / (norm + 1e-6) : 1.0;
    adamw->step(step, lr, clip, stream);
    balance->apply(model->params(), *adamw, stream);
    stream.synchronize();
  }

  // Parameter `param` of `flat` (flat_values() or flat_grads()), gathered whole, as doubles.
  // Collective.
  std::vector<double> gathered(int param, const Tensor& flat) {
    const std::vector<char> bytes = model->params().gather_full(param, flat, stream);
    std::vector<double> out(bytes.size() / dtype_size(dtype));
    if (dtype == DType::f64) {
      std::memcpy(out.data(), bytes.data(), bytes.size());
    } else {
      MOEPEAK_CHECK(dtype == DType::f32, "gathered(): f32 or f64, not ", dtype_name(dtype));
      const float* f = reinterpret_cast<const float*>(bytes.data());
      for (size_t i = 0; i < out.size(); ++i) out[i] = f[i];
    }
    return out;
  }
};

}  // namespace moepeak::test_support
