// The decoder (docs/design.md#the-model) of any model family — built from the family's
// description, DecoderSpec (core/model/decoder_spec.h, core/model/families/), and naming no
// family itself — on W ranks in the layout of docs/design.md#parallel-layout (W = 1 is one
// rank): forward and backward of a batch with the
// standard schedule of each live set — materialised logits, all-at-once expert dispatch, and
// per-layer gradient checkpointing ("none": every activation kept; "standard": only each layer's
// input kept, the layer recomputed in backward; "sco": the same, with inputs offloaded to pinned
// host memory in between).
//
//   this rank's tokens  N = B*T/W: positions [(r%Sp)*T/Sp, +T/Sp) of each of the B/(W/Sp)
//                       sequences of its sequence group (docs/parallelism.md; Sp = W: all B)
//   input_ids, labels, positions (N) i64, sequence-major, positions global
//   embedding -> L x [x += attn(norm(x)); x += mlp(norm(x))] -> norm -> lm_head -> cross-entropy
//   attn: q, k, v projections [-> per-head q/k RMSNorm] -> RoPE -> attention -> o projection
//   mlp:  MoE (router -> top-k -> experts, per the dispatch schedule) or a dense SwiGLU MLP
//
// Parallel layout (W > 1, degrees Ep, Sp, Ds: core/model/parallel_layout.h; with W = 1 every
// exchange below is skipped and every gather is a view):
//   - parameters: ZeroParamStore — dense tensors ZeRO-3 sharded over the data-shard group,
//     gathered by groups (the embedding, each layer's attention/norms/router with the rank's
//     experts of the layer, the final norm with the LM head) for use in forward and again in
//     backward, their gradients reduce-scattered after use (and all-reduced over the dense
//     replicas when Ds < W) — by ZeroTraffic (core/model/zero_traffic.h): the next
//     zero_prefetch_depth groups gathered on a comm stream while one computes, each
//     reduce-scatter there during the next layer's backward; expert e on expert-group rank e /
//     (E/Ep), ZeRO-3 sharded over the W/Ep expert replicas (whole, never gathered, when Ep = W);
//   - attention: q, k, v from this rank's tokens, RoPE at global positions, then Ulysses
//     all-to-alls inside the sequence group to whole sequences of nh/Sp query heads (and their
//     kv heads, replicated when nkv < Sp), attention, and back (ops/schedules/ulysses.h);
//   - MoE layers: router on this rank's tokens, then the dispatcher schedules.dispatch names (one
//     per MoE layer, made on the layer's first forward and kept; schedules::make_dispatch,
//     ops/schedules/dispatch_choice.h): "standard" — StandardDispatch on one
//     rank, ExpertParallelDispatch (one all_to_all_v each way) over the Ep ranks of the expert
//     group; "llep" — LlepDispatch
//     (least-loaded EP, ops/schedules/dispatch_llep.h); "pipelined_llep" — PipelinedLlepDispatch
//     (LLEP per chunk of at most c_eff tokens per source, buffers fixed at launch,
//     ops/schedules/dispatch_pipelined_llep.h). On one rank LLEP has nothing to balance (the
//     plan keeps every expert home) and the pipeline still chunks, so its bound holds there too;
//   - loss: each rank's share of the global mean, all-reduced; the load-balancing loss from the
//     job-wide expert counts and router-probability sums.
//
// Vocabulary projection (schedules.vocab; schedules::make_vocab, ops/schedules/vocab_choice.h):
// "materialized" gathers the LM head with the final norm and forms the (N, V) logits
// (MaterializedVocab); "ring_dtp" keeps the LM head stored by vocabulary rows
// (LmHeadSharding::vocab_rows, never gathered) and folds logit strips into an online
// log-sum-exp over a ring of the W ranks (RingDtpVocab, ops/schedules/vocab_ring_dtp.h).
//
// Checkpoint boundaries (schedules.checkpoint; schedules::make_boundaries,
// ops/schedules/checkpoint_choice.h): each layer's input is kept from its forward to its backward
// by a schedules::CheckpointBoundaries — StandardBoundaries (on device; also for
// "none") or ScoBoundaries ("sco": the inputs that fit schedules.sco_host_budget go to pinned host
// memory on a copy stream and come back one layer ahead; ops/schedules/checkpoint_sco.h).
//
// Live sets: weights and grads (ZeroParamStore: shards, local experts, the gathered group),
// attention (norm, q, k, v, attention output, lse, exchange staging), dispatch (the expert
// dispatcher), logits (MaterializedVocab, or RingDtpVocab), boundaries (each layer's output, the
// next layer's input, restored inputs under SCO; in the pinned pool, SCO's host copies), workspace
// (everything else).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "core/comm/comm.h"
#include "core/config/config.h"
#include "core/model/decoder_spec.h"
#include "core/model/parallel_layout.h"
#include "core/model/zero_params.h"
#include "core/model/zero_traffic.h"
#include "core/runtime/backend.h"
#include "ops/attention.h"
#include "ops/router.h"
#include "ops/schedules/checkpoint_standard.h"
#include "ops/schedules/dispatch.h"
#include "ops/schedules/ulysses.h"
#include "ops/schedules/vocab_choice.h"

namespace moepeak {

namespace schedules {
struct PipelinedLlepLane;
}  // namespace schedules
struct SwigluMlp;  // decoder.cpp

// How the LM head is stored for a vocabulary schedule: by vocabulary rows for ring_dtp, else
// ZeRO-3 like every dense tensor (the planner sizes `weights` and `grads` with the same choice;
// defined with the vocabulary schedules, ops/schedules/vocab_choice.h).
using schedules::lm_head_sharding;

struct TokenBatch {
  // N = batch * seq_len / W: this rank's slice (positions [(r % Sp) T/Sp, +T/Sp)) of each of the
  // B/(W/Sp) sequences of its sequence group r / Sp (docs/parallelism.md).
  Tensor input_ids;                // (N) i64, device
  Tensor labels;                   // (N) i64, device; -100 = not scored
  Tensor positions;                // (N) i64, device; positions in each sequence (RoPE's)
  int64_t batch = 0, seq_len = 0;  // the global batch B and the whole sequence length T
  int64_t scored_tokens = 0;       // this rank's labels != -100
  // Packed documents (training.document_mask): (B/(W/Sp), T) i32, device — the first position of
  // each position's document in each whole sequence of the sequence group, what every layer's
  // attention masks by (ops::AttentionVariant::doc_start); undefined: one document per sequence.
  Tensor doc_start{};
};

class DecoderModel {
 public:
  // dtype: f32 (training), f64 (gradient checks) or, on the CUDA backend, bf16 (bf16 weights,
  // gradients and activations; fp32 math inside the ops; the attention lse in f32). `comm`
  // spans the W ranks (a single-rank Comm for W = 1); `degrees` the layout on them (default:
  // every degree W), whose groups the model splits from `comm` (collective); E must be a
  // multiple of Ep. `schedules`: the [schedules] section of the config (the schedule of each
  // live set the model owns and their knobs).
  // zero_prefetch_depth: the ZeRO-3 gathers issued ahead of use (ZeroTraffic; 0 = every
  // collective on `stream` where it is needed).
  DecoderModel(Backend& backend, Stream& stream, Comm& comm, const ModelConfig& model,
               const SchedulesConfig& schedules, DType dtype,
               std::optional<ParallelDegrees> degrees = std::nullopt,
               int zero_prefetch_depth = kDefaultZeroPrefetchDepth);
  // The default schedules with this checkpointing (tests).
  DecoderModel(Backend& backend, Stream& stream, Comm& comm, const ModelConfig& model,
               CheckpointSchedule checkpoint, DType dtype);
  ~DecoderModel();

  // Throws moepeak::Error (an input error), naming the numbers, unless a global batch of B x T
  // tokens can be trained in the layout: E % Ep == 0, B % (W/Sp) == 0 and the sequence-parallel
  // attention's conditions on the Sp ranks of a group (core/model/layout_defect.h, whose first
  // broken rule it names). Not collective: every rank reaches the same verdict before any work.
  static void check_layout(const ModelConfig& model, int64_t batch, int64_t seq_len,
                           const ParallelDegrees& degrees);
  static void check_layout(const ModelConfig& model, int64_t batch, int64_t seq_len, int world) {
    check_layout(model, batch, seq_len, ParallelDegrees::uniform(world));
  }

  ZeroParamStore& params() { return params_; }
  const ZeroParamStore& params() const { return params_; }
  const ModelConfig& config() const { return model_; }
  const DecoderSpec& spec() const { return spec_; }
  Comm& comm() const { return comm_; }
  const ParallelGroups& groups() const { return layout_; }

  // The job's mean cross-entropy over the scored tokens (plus router_aux_loss_coef times the
  // load-balancing loss over the MoE layers when the coefficient is not 0, as transformers'
  // <Family>ForCausalLM reports it) — the same value on every rank — and its gradients
  // accumulated (+=) into this
  // rank's params().flat_grads() (dense shards: the sum over ranks; local experts).
  // loss_tokens: the number of scored tokens of the whole global batch. Collective.
  double forward_backward(const TokenBatch& batch, int64_t loss_tokens);
  // The same loss without gradients (finite differences). Collective.
  double forward_loss(const TokenBatch& batch, int64_t loss_tokens);
  // The cross-entropy alone (no auxiliary loss), forward only: nothing kept for a backward (no
  // boundaries, no activations past their layer), no gradient touched — evaluation. The sum over
  // this rank's tokens of the job's batch divided by loss_tokens, summed over ranks. Collective.
  double forward_cross_entropy(const TokenBatch& batch, int64_t loss_tokens);

  // Where the layers' inputs are kept between forward and backward (StandardBoundaries, or
  // schedules::ScoBoundaries under checkpoint = "sco": tests read its |S| and slow its copy
  // stream).
  schedules::CheckpointBoundaries& boundaries() { return *boundaries_; }
  // The ZeRO-3 traffic of each pass (tests slow its comm stream).
  ZeroTraffic& zero_traffic() { return zero_traffic_; }

  // Tokens routed to each expert of each layer in the last forward, over the job: [layer][expert]
  // (empty for a dense layer).
  const std::vector<std::vector<int64_t>>& expert_load() const { return expert_load_; }

 private:
  struct LayerActivations;
  using Group = ZeroParamStore::GatheredGroup;
  // The layer's output (undefined for a recompute whose MLP only keeps what backward needs).
  OwnedTensor layer_forward(int layer, const Group& w, const Tensor& x, const TokenBatch& batch,
                            LayerActivations& acts, bool recompute);
  // y = h + mlp(n2) from the activations' h and n2, keeping what the backward needs.
  OwnedTensor moe_forward(int layer, const Group& w, LayerActivations& a, bool recompute);
  OwnedTensor dense_mlp_forward(const LayerParamIndex& L, const Group& w, LayerActivations& a,
                                bool recompute);
  // dn2 += d mlp(n2) / d n2 from dy, param grads += into the group.
  void moe_backward(int layer, const Group& w, const Tensor& dy, LayerActivations& a,
                    const Tensor& dn2);
  void dense_mlp_backward(const LayerParamIndex& L, const Group& w, const Tensor& dy,
                          LayerActivations& a, const Tensor& dn2);
  OwnedTensor layer_backward(int layer, const Group& w, const Tensor& dy, const Tensor& x,
                             const TokenBatch& batch, LayerActivations& acts);
  // h = x + o_proj(attention(norm(x))), keeping what attention_backward needs.
  OwnedTensor attention_forward(int layer, const Group& w, const Tensor& x, const TokenBatch& batch,
                                LayerActivations& a);
  // dx = d layer input from dh (the residual's gradient), param grads += into the group.
  OwnedTensor attention_backward(int layer, const Group& w, const Tensor& dh, const Tensor& x,
                                 const TokenBatch& batch, LayerActivations& a);
  // The same for the latent attention (AttentionKind::latent; decoder_latent_attention.cpp).
  OwnedTensor latent_attention_forward(int layer, const Group& w, const Tensor& x,
                                       const TokenBatch& batch, LayerActivations& a);
  OwnedTensor latent_attention_backward(int layer, const Group& w, const Tensor& dh,
                                        const Tensor& x, const TokenBatch& batch,
                                        LayerActivations& a);
  // The Ulysses layout of the value heads (and the attention output): ulysses_ with the value
  // head width; and a staging buffer for either exchange.
  schedules::UlyssesLayout values_layout() const;
  OwnedTensor ulysses_staging() const;
  // The shared experts' SwiGLU on n2, added into y (an undefined y: gate and up only, for the
  // backward), and its backward into dn2.
  void shared_experts_forward(const LayerParamIndex& L, const Group& w, LayerActivations& a,
                              const Tensor& y);
  void shared_experts_backward(const LayerParamIndex& L, const Group& w, const Tensor& dy,
                               LayerActivations& a, const Tensor& dn2);
  // A SwiGLU MLP (a dense layer's or the shared experts'): forward keeping gate and up, adding
  // into y when defined; backward adding into dn2 and the weights' gradients.
  void swiglu_mlp_forward(const SwigluMlp& m, const Tensor& n2, OwnedTensor& gate, OwnedTensor& up,
                          const Tensor& y) const;
  void swiglu_mlp_backward(const SwigluMlp& m, const Tensor& n2, const Tensor& gate,
                           const Tensor& up, const Tensor& dy, const Tensor& dn2) const;
  // The router op's group-limited parameters of the layer (defaults for another score), its
  // correction bias widened into `bias_f32` for a bf16 model.
  ops::GroupLimitedRouting group_limited_routing(int layer, const Group& w,
                                                 OwnedTensor& bias_f32) const;
  // The layer's window and this rank's slice of its sinks (the query heads it attends over).
  ops::AttentionVariant attention_variant(int layer, const Group& w, const TokenBatch& batch) const;
  // y = x W^T (+ b when bias >= 0), written; the bias is broadcast into y first and the GEMM
  // accumulates onto it, so a bf16 y is rounded once (ops/bias.h).
  void project(const Tensor& x, const Group& w, int weight, int bias, const Tensor& y) const;
  double run(const TokenBatch& batch, int64_t loss_tokens, bool with_backward,
             bool with_aux_loss = true);
  // This rank's experts of `layer` from its gathered group (with their gradients for backward).
  std::vector<schedules::ExpertWeights> local_experts_of(int layer, const Group& w,
                                                         bool with_grads) const;
  // The auxiliary load-balancing loss (router_aux_loss_coef > 0), transformers' formula over the
  // MoE layers and the job's tokens: adds each layer's column sums of the router probabilities,
  // then forms the loss and (for backward) its constant per-expert gradient with respect to the
  // probabilities.
  void accumulate_router_prob_sums(const Tensor& probs);
  double router_aux_loss(int64_t tokens, bool with_backward);
  // DeepSeek-V3's sequence-wise balance loss (DecoderSpec::aux_loss_per_sequence;
  // decoder_sequence_aux.cpp): in a MoE layer's forward, its loss over this rank's sequences and
  // their gradient weights; in its backward, their path into the router logits' gradient.
  void accumulate_sequence_balance(int layer, const LayerActivations& a);
  void sequence_balance_backward(int layer, const LayerActivations& a, const Tensor& drouter);
  OwnedTensor device(Shape shape, LiveSet set, const char* what) const;
  // Tells the arena which phase of the step runs from here (its per-phase peaks).
  void enter(StepPhase phase) const;

  Backend& backend_;
  Stream& stream_;
  Comm& comm_;
  ModelConfig model_;
  SchedulesConfig schedules_;
  CheckpointSchedule checkpoint_;
  DType dtype_;
  ParallelGroups layout_;  // the layout's groups (before params_, which keeps a reference)
  ZeroParamStore params_;
  DecoderSpec spec_;          // params_.layout().spec()
  ZeroTraffic zero_traffic_;  // the ZeRO-3 collectives of each pass (after params_, which it reads)
  // zero_gather_groups: embed, layers (with this rank's experts)..., final norm + head
  std::vector<std::vector<int>> groups_;
  schedules::UlyssesLayout ulysses_;  // of the current batch: query/key heads (d)
  ops::RopeParams rope_{};            // the rotary frequencies of the current batch
  std::vector<std::vector<int64_t>> expert_load_;
  std::vector<double> router_prob_sums_;  // per expert, over all layers of the current forward
  OwnedTensor aux_dprobs_;                // (E) d(coef * aux)/d probs, during backward
  // The sequence-wise loss: per MoE layer, d(coef * loss)/d s' for each sequence of this rank's
  // sequence group, (B_g, E) row-major on the host, from its forward; and this rank's share of
  // the loss (its sequence group's rank 0 holds the group's).
  std::vector<std::vector<double>> sequence_aux_grad_;
  double sequence_aux_loss_ = 0;
  std::unique_ptr<schedules::CheckpointBoundaries> boundaries_;  // per schedules.checkpoint
  std::unique_ptr<schedules::VocabProjection> vocab_;            // per schedules.vocab
  // Per layer, made on its first forward (PipelinedLLEP's constructor is collective: every rank
  // reaches it at the same layer) and kept across steps.
  std::vector<std::unique_ptr<schedules::ExpertDispatch>> dispatchers_;
  // PipelinedLLEP's comm stream and communicator, one for all layers (made with the first layer's
  // dispatcher; see PipelinedLlepLane).
  std::shared_ptr<schedules::PipelinedLlepLane> llep_lane_;
};

}  // namespace moepeak
