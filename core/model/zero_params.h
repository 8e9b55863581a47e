// ZeroParamStore: the model parameters of one rank, ZeRO-3 sharded over the groups of a parallel
// layout (docs/parallelism.md; the groups: core/model/parallel_layout.h).
//
// W ranks, degrees Ep (expert_parallel), Sp, Ds (data_shard); E = num_local_experts, a multiple
// of Ep. Every tensor of n_i elements, flattened:
//   - Dense tensor i (every parameter but model.layers.{l}.block_sparse_moe.experts.{j}.w{1,2,3}:
//     embedding, norms, attention, router, LM head) is cut in Ds shards of s_i = ceil(n_i / Ds)
//     elements over the rank's data-shard group; its rank g = r % Ds stores elements
//     [g*s_i, g*s_i + s_i), the part past n_i (only on the last ranks) zeros that stay zero. The
//     W/Ds data-shard groups are replicas: their gradients are summed over them.
//   - Expert j is held by rank j / (E/Ep) of every expert group (experts [e*E/Ep, (e+1)*E/Ep) on
//     the ranks with r % Ep = e). Over the W/Ep ranks that hold it (the expert replicas) it is
//     ZeRO-3 sharded like a dense tensor: replica q = r / Ep stores elements [q*s, q*s + s),
//     s = ceil(n / (W/Ep)). With W/Ep = 1 (Ep = W, the default) the owner stores it whole and it
//     is never gathered or reduced.
//   - With LmHeadSharding::vocab_rows (Ring-DTP), lm_head.weight (V, H) is split by vocabulary
//     rows over all W ranks instead: rank r keeps rows [floor(r*V/W), floor((r+1)*V/W))
//     (lm_head_rows(), the intervals of Ring-DTP's vocab_shard) as a (V_r, H) tensor, never
//     gathered; its gradient accumulates there. With W = 1 every layout is the whole tensor.
// This rank's pieces sit at offsets aligned to ParamLayout::kAlignElements in one flat `weights`
// buffer and one flat `grads` buffer, zero-filled at construction, in ParamLayout order — with
// dense replicas (Ds < W), first the dense shards (the `replicated` region, equal on the W/Ds
// replicas), then experts and vocabulary rows (the `unique` region: each element on one rank of
// the job). A norm over the job sums the unique region on every rank and the replicated one on
// one replica (without replicas the replicated region is empty).
//
// A layer is used through a GatheredGroup (RAII): gather() all-gathers the full tensors of the
// params whose shards span more than one rank into one `weights` buffer (an all_gather per
// tensor over its shard group, straight into its place: rank q's shard lands at q*s_i; the slot
// is G*s_i elements, aligned; the tensors of one group go as one Comm group per communicator)
// and, for backward, allocates zeroed gradient slots for every param whose gradient is summed
// over ranks; reduce_scatter_grads() adds the job's sum into this rank's shard grads (+=: a
// reduce_scatter per tensor over its shard group in place, into this rank's block q*s_i of its
// slot, then an all_reduce of that block over the dense replicas when there are any, then an add
// into the shard; a param stored whole but replicated all-reduces its slot in place instead; one
// Comm group per communicator and step, so no temporary). A param held whole and by one rank
// only (an expert with W/Ep = 1, any param on one rank) is read and accumulated in the store
// itself. GatherParts says which of the two buffers a use needs (forward: values; embedding
// backward: grads). Destroying the group frees both buffers at once (host-side, as every Buffer:
// safe when all their uses ran on the stream the next owner uses; ZeroTraffic,
// core/model/zero_traffic.h, runs the collectives on a comm stream of their own and keeps that
// rule across the two streams).
//
// Memory (per rank, bytes as the arena counts them, DeviceArena::footprint):
//   persistent weights = footprint(sum_i align(piece_i) * b)
//   persistent grads   = footprint(sum_i align(piece_i) * b_g)
//   gathered weights = footprint(sum_{i in group, G_i > 1} align(G_i*s_i) * b)
//   gathered grads   = footprint(sum_{i in group, G_i*R_i > 1} align(G_i*s_i) * b_g)
//   (G_i the ranks its shards span, R_i its replicas; 0 for a part the GatherParts leaves out;
//   b_g the bytes of schedules::main_grad_dtype: 4 for bf16 weights, so gradients are summed
//   over micro-batches, ranks and replicas in fp32)
// zero_persistent_bytes / zero_gathered_bytes give these to the planner, over
// zero_gather_groups(): the embedding, each decoder layer's dense params with the rank's experts
// of the layer, and the final norm with the LM head (the groups live at once over a pass:
// zero_pass_gathered_bytes, core/model/zero_traffic.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "core/comm/comm.h"
#include "core/config/config.h"
#include "core/model/parallel_layout.h"
#include "core/model/param_layout.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#include "ops/schedules/vocab.h"

namespace moepeak {

// How the LM head is stored: ZeRO-3 like every dense tensor (gathered for the materialised
// projection), or by vocabulary rows for Ring-DTP. The vocabulary schedule's choice
// (schedules::lm_head_sharding, ops/schedules/vocab_choice.h).
using schedules::LmHeadSharding;

// Rank r's LM-head rows [begin, end) under LmHeadSharding::vocab_rows: floor(r*V/W) ..
// floor((r+1)*V/W). Requires V >= W.
std::pair<int64_t, int64_t> lm_head_rows(int64_t vocab, int world, int rank);

// Which buffers a gathered group allocates: full weights (forward, recompute), zeroed gradient
// accumulators (backward of ops that need no weights, e.g. the embedding), or both (backward).
enum class GatherParts { values, grads, values_and_grads };

// Bytes of one kind of buffer in the `weights` and in the `grads` live set.
struct ZeroBytes {
  uint64_t weights = 0, grads = 0;
  uint64_t total() const { return weights + grads; }
};

// The params of each gather group, in order of use in the forward pass: {embed},
// {layer l: input_norm, the attention's (q, k, v, o, or the latent attention's, then biases,
// sinks, q/k norms: those the layer has), post_norm, then a MoE layer's router (its bias and
// correction bias, the shared experts) and w1, w2, w3 (with biases) of experts
// [expert_begin, expert_end), or a dense layer's gate, up, down} for each
// l, {final_norm, lm_head} ({final_norm} alone when the LM head is stored by vocabulary rows; the
// embedding again when tied). A rank names its own experts (those of its expert-group
// rank e: [e*E/Ep, (e+1)*E/Ep)); they cost nothing unless W/Ep > 1.
std::vector<std::vector<int>> zero_gather_groups(const ParamLayout& layout,
                                                 LmHeadSharding lm_head = LmHeadSharding::zero3,
                                                 int expert_begin = 0, int expert_end = 0);
// The experts of expert-group rank `expert_rank` in every layer: [begin, end).
std::pair<int, int> zero_local_experts(const ModelConfig& model, const ParallelDegrees& degrees,
                                       int expert_rank);
// Persistent shard buffers of one rank: the same on every rank, except that vocabulary rows
// differ by one row between ranks — then the largest rank's.
ZeroBytes zero_persistent_bytes(const ModelConfig& model, DType dtype,
                                const ParallelDegrees& degrees,
                                LmHeadSharding lm_head = LmHeadSharding::zero3);
// The elements of that flat buffer on the largest rank (the P the optimizer's byte functions take).
int64_t zero_persistent_elements(const ModelConfig& model, const ParallelDegrees& degrees,
                                 LmHeadSharding lm_head = LmHeadSharding::zero3);
// The buffers gather(params, parts) allocates (see the memory formulas above).
ZeroBytes zero_gathered_bytes(const ModelConfig& model, DType dtype, const ParallelDegrees& degrees,
                              std::span<const int> params,
                              GatherParts parts = GatherParts::values_and_grads);
// The same with `layout` = ParamLayout(model) built by the caller: callers that ask for many
// gather groups of one model build it once (a layout search asks some million times).
ZeroBytes zero_gathered_bytes(const ModelConfig& model, const ParamLayout& layout, DType dtype,
                              const ParallelDegrees& degrees, std::span<const int> params,
                              GatherParts parts = GatherParts::values_and_grads);
// The same functions for the layout with every degree W.
inline ZeroBytes zero_persistent_bytes(const ModelConfig& model, DType dtype, int world_size,
                                       LmHeadSharding lm_head = LmHeadSharding::zero3) {
  return zero_persistent_bytes(model, dtype, ParallelDegrees::uniform(world_size), lm_head);
}
inline int64_t zero_persistent_elements(const ModelConfig& model, int world_size,
                                        LmHeadSharding lm_head = LmHeadSharding::zero3) {
  return zero_persistent_elements(model, ParallelDegrees::uniform(world_size), lm_head);
}
inline ZeroBytes zero_gathered_bytes(const ModelConfig& model, DType dtype, int world_size,
                                     std::span<const int> params,
                                     GatherParts parts = GatherParts::values_and_grads) {
  return zero_gathered_bytes(model, dtype, ParallelDegrees::uniform(world_size), params, parts);
}

// The communicators a store's collectives use: its layout's groups (ZeroParamStore::comms()), or
// duplicates of them for a stream of their own (ZeroTraffic). Each spans the same ranks as the
// group it stands for.
struct ZeroComms {
  Comm* data_shard = nullptr;       // ParallelGroups::data_shard()
  Comm* expert_replicas = nullptr;  // ParallelGroups::expert_replicas()
  Comm* dense_replicas = nullptr;   // ParallelGroups::dense_replicas()
};

class ZeroParamStore {
 public:
  struct LocalPiece {
    int param;
    Tensor value, grad;  // a 1-D shard; an expert stored whole: the full tensor; rows: (V_r, H)
    bool is_norm;
    bool decays;  // ParamInfo::decays
    bool is_expert;
  };

  class GatheredGroup {
   public:
    GatheredGroup() = default;
    GatheredGroup(GatheredGroup&&) noexcept = default;
    GatheredGroup& operator=(GatheredGroup&&) noexcept = default;

    // The full tensor of a param of the group (gathered, or the store's own when held whole).
    // Error if the part was not gathered.
    Tensor value(int param) const;
    Tensor grad(int param) const;
    // shard grads += sum over ranks of the gathered grads (collective over the shard and replica
    // groups: every rank calls it), on `stream` over `comms` (default: the store's own). The
    // gathered grads' blocks are overwritten by the partial sums.
    void reduce_scatter_grads(Stream& stream);
    void reduce_scatter_grads(Stream& stream, const ZeroComms& comms);
    // The zeroed gradient slots of a group gathered by gather_values() (memset on `stream`);
    // nothing when its parts have no grads or no param needs a slot.
    void allocate_grads(Stream& stream);
    // Frees the gathered values now (the grads stay, e.g. for a reduce still to run).
    void release_values() { values_.reset(); }
    // Some param's gradient is summed over ranks: reduce_scatter_grads has work to do.
    bool has_reduced_grads() const { return grad_elements_ > 0; }
    GatherParts parts() const { return parts_; }
    const std::vector<int>& params() const { return params_; }

   private:
    friend class ZeroParamStore;
    const ZeroParamStore* store_ = nullptr;
    std::vector<int> params_;
    // Per param of the layout: element offset in values_ / grads_, kInStore (read from, or
    // accumulated into, the store itself) or kAbsent.
    std::vector<int64_t> value_slot_, grad_slot_;
    GatherParts parts_ = GatherParts::values_and_grads;
    int64_t grad_elements_ = 0;  // of grads_ (allocated by allocate_grads)
    OwnedTensor values_, grads_;
  };

  // Throws unless num_local_experts % Ep == 0 (and V >= W for vocab_rows). Not collective: the
  // groups' communicators come made.
  ZeroParamStore(Backend& backend, const ModelConfig& model, DType dtype,
                 const ParallelGroups& groups, LmHeadSharding lm_head = LmHeadSharding::zero3);
  // Every degree W over `comm` (no group communicator is made).
  ZeroParamStore(Backend& backend, const ModelConfig& model, DType dtype, Comm& comm,
                 LmHeadSharding lm_head = LmHeadSharding::zero3);
  ~ZeroParamStore();

  const ParamLayout& layout() const { return layout_; }
  DType dtype() const { return dtype_; }
  // The dtype of every gradient buffer (shards, gathered slots) and of the reduce-scatters:
  // schedules::main_grad_dtype(dtype()) — fp32 for bf16 weights.
  DType grad_dtype() const { return grad_dtype_; }
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  Comm& comm() const { return groups_->world(); }  // all W ranks
  const ParallelGroups& groups() const { return *groups_; }
  Backend& backend() const { return backend_; }

  bool is_expert(int param) const { return info_.at(param).expert >= 0; }
  // Stored by vocabulary rows (the LM head under LmHeadSharding::vocab_rows).
  bool is_row_sharded(int param) const { return info_.at(param).rows; }
  LmHeadSharding lm_head_sharding() const { return lm_head_; }
  // The expert-group rank that holds expert param `param` (in every expert group); -1 for dense.
  int expert_owner(int param) const;
  // Stored here: every dense param (its shard) and this rank's expert params.
  bool is_local(int param) const { return info_.at(param).offset >= 0; }
  // Elements of this rank's piece: s_i (sharded), numel (held whole), V_r * H (rows).
  int64_t shard_elements(int param) const { return info_.at(param).local_numel; }
  // The element of the flattened param this rank's piece starts at (0 for a param held whole);
  // a sharded piece covers [shard_first, min(numel, shard_first + shard_elements)).
  int64_t shard_first(int param) const { return info_.at(param).first; }
  // The piece of `param` this rank stores (Error if none): a 1-D shard, the full tensor (an
  // expert held whole) or (V_r, H) rows (row-sharded).
  Tensor local_value(int param) const;
  Tensor local_grad(int param) const;

  const std::vector<LocalPiece>& local_pieces() const { return pieces_; }
  Tensor flat_values() const { return values_.view(); }
  Tensor flat_grads() const { return grads_.view(); }
  // The part of the flat grads this rank adds to a job-wide sum (the grad norm), so that every
  // element of the job counts once: all of them on dense-replica rank 0 (every rank without
  // dense replicas), else only the unique region after the replicated dense shards (see above).
  Tensor counted_grads() const;

  // Fills this rank's pieces with exactly the values ParamStore::initialize gives those elements.
  void initialize(uint64_t seed, double initializer_range, Stream& stream);
  void zero_grads(Stream& stream);

  // Collective: every rank calls it with the same dense params, in the same order as other
  // collectives, each naming its own experts of the same layers. gather() = gather_values() on
  // the store's comms, then allocate_grads(), all on `stream`.
  GatheredGroup gather(std::span<const int> params, Stream& stream,
                       GatherParts parts = GatherParts::values_and_grads) const;
  // The values part of gather(): the weights buffer allocated now and its all-gathers issued on
  // `stream` over `comms`; the gradient slots are laid out but not allocated.
  GatheredGroup gather_values(std::span<const int> params, GatherParts parts, Stream& stream,
                              const ZeroComms& comms) const;
  // The layout's own communicators.
  ZeroComms comms() const;
  // The full tensor's bytes (numel elements of flat's dtype) on every rank: the shards
  // all-gathered over their group, an expert's then broadcast from its owner in each expert
  // group. `flat` is any buffer laid out like flat_values() — the values, the grads, the
  // optimizer's m, v or fp32 master, on the device or in host memory, of any float dtype; the
  // first form reads the values. Collective; synchronises the stream.
  std::vector<char> gather_full(int param, Stream& stream) const;
  std::vector<char> gather_full(int param, const Tensor& flat, Stream& stream) const;
  // Keeps this rank's part of a full host tensor (numel elements of flat's dtype) in the values,
  // or in `flat` laid out like them (zeros past a tensor's end); not collective. Synchronises
  // the stream (the host memory may go away after the call).
  void load_full(int param, const void* full, Stream& stream);
  void load_full(int param, const void* full, const Tensor& flat, Stream& stream);

  // ---- pieces by element range (sharded checkpoints, core/checkpoint/sharded_checkpoint.h) ----
  // The elements [begin, end) of param's flattened tensor held in this rank's piece, less the
  // zero padding past the tensor's end (begin == end for a piece that is all padding); nullopt
  // when the param is another expert-group rank's expert.
  std::optional<std::pair<int64_t, int64_t>> stored_range(int param) const;
  // This rank writes its stored range of `param` to a sharded checkpoint: every piece that is on
  // one rank of the job only, and a dense shard only on dense-replica rank 0 (the other replicas
  // hold the same elements). Over the job the writers' ranges tile every tensor once.
  bool writes_checkpoint(int param) const;
  // Where the stored range of `param` starts in any flat buffer laid out like the values, in
  // elements (a host copy of a flat holds the piece there too). Error for another rank's expert.
  int64_t piece_offset(int param) const;
  // Copies elements [offset, offset + count) of the stored range of `param` in `flat` (laid out
  // like the values, any dtype, on the device or the host) to host memory `dst`. Synchronises.
  void copy_piece_to_host(int param, const Tensor& flat, int64_t offset, int64_t count, void* dst,
                          Stream& stream) const;
  // Sets the stored range of `param` in `flat` from host `src` ((end - begin) elements of flat's
  // dtype) and zeros the padding after it, as load_full does. Not collective; synchronises.
  void load_stored_range(int param, const void* src, const Tensor& flat, Stream& stream);

 private:
  ZeroParamStore(Backend& backend, const ModelConfig& model, DType dtype,
                 std::unique_ptr<ParallelGroups> owned, const ParallelGroups* groups,
                 LmHeadSharding lm_head);
  enum class ShardGroup { none, data_shard, expert_replicas };
  struct Info {
    int expert = -1;          // expert index j for expert params
    bool rows = false;        // stored by vocabulary rows
    bool whole = false;       // held whole and by no other rank (no gather, no reduction)
    int64_t offset = -1;      // elements into the flat buffers, -1 if not stored here
    int64_t local_numel = 0;  // s_i, numel (held whole), V_r * H (rows)
    int64_t first = 0;        // the first element of the flattened tensor this rank stores
    ShardGroup shards = ShardGroup::none;  // the group its shards span (more than one rank)
    bool replicated = false;               // its gradients are summed over the dense replicas
    int64_t slot_elements = 0;             // G * s_i: its place in a gathered group
  };
  // The communicator of a shard group among `comms` (Error for ShardGroup::none).
  static Comm& shard_comm(ShardGroup group, const ZeroComms& comms);
  Tensor piece(const Tensor& flat, int param) const;
  char* piece_bytes(const Tensor& flat, int param) const;  // any dtype laid out like the values

  ParamLayout layout_;
  DType dtype_, grad_dtype_;
  LmHeadSharding lm_head_;
  Backend& backend_;
  std::unique_ptr<ParallelGroups> owned_groups_;  // the uniform layout of the Comm& form
  const ParallelGroups* groups_;
  int rank_, world_;
  std::vector<Info> info_;
  std::vector<LocalPiece> pieces_;
  int64_t replicated_elements_ = 0;  // the dense region at the front of the flat buffers
  OwnedTensor values_, grads_;
};

}  // namespace moepeak
