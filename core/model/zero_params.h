// ZeroParamStore: the model parameters of one rank under ZeRO-3 for the dense weights and expert
// parallelism for the experts (docs/design.md#parallel-layout).
//
// W = comm.world_size(), r = comm.rank(); E = num_local_experts must be a multiple of W.
//   - Dense tensor i (every parameter but model.layers.{l}.block_sparse_moe.experts.{j}.w{1,2,3}:
//     embedding, norms, attention, router, LM head) of n_i elements is cut in W shards of
//     s_i = ceil(n_i / W) elements; rank r stores elements [r*s_i, r*s_i + s_i) of the flattened
//     tensor, the part past n_i (only on the last ranks) being zeros that stay zero.
//   - Expert j lives whole on rank j / (E/W) (experts [r*E/W, (r+1)*E/W) on rank r); the other
//     ranks store nothing of it. Expert weights and grads are never sharded or reduced here.
//   - With LmHeadSharding::vocab_rows (Ring-DTP), lm_head.weight (V, H) is split by vocabulary
//     rows instead: rank r keeps rows [floor(r*V/W), floor((r+1)*V/W)) (lm_head_rows(), the same
//     intervals as Ring-DTP's vocab_shard) as a (V_r, H) tensor, never gathered; its gradient
//     accumulates there. With W = 1 both layouts are the whole tensor.
// This rank's pieces (dense shards and local expert tensors, in ParamLayout order) sit at offsets
// aligned to ParamLayout::kAlignElements in one flat `weights` buffer and one flat `grads`
// buffer, both zero-filled at construction, so padding is zero and a sum of squares over
// flat_grads() on every rank, all-reduced, counts each real element exactly once.
//
// A layer is used through a GatheredGroup (RAII): gather() all-gathers the full dense tensors into
// one `weights` buffer (one all_gather per tensor, straight into its place: rank q's shard lands at
// q*s_i, so no staging or reordering; the gathered slot of a tensor is W*s_i elements, aligned)
// and, for backward, allocates a zeroed `grads` buffer of the same layout; reduce_scatter_grads()
// sums the gathered grads over ranks into this rank's shard grads (+=: one reduce_scatter per
// tensor into a `workspace` temporary of max s_i, then an add). GatherParts says which of the two
// buffers a use needs (forward: values; embedding backward: grads). Expert params of this rank
// may be named in a group: value/grad return the stored tensors. Destroying the group frees both
// buffers at once (host-side, as every Buffer: safe when all their uses ran on the stream the
// next owner uses).
//
// One rank (W = 1): the shards are the whole tensors, so a group is views of the stored tensors:
// gather() allocates and copies nothing, grads accumulate straight into the stored grads and
// reduce_scatter_grads() does nothing. The single-rank model thus has the one-rank memory profile.
//
// Memory (per rank, bytes as the arena counts them, DeviceArena::footprint):
//   persistent weights = persistent grads = footprint(sum_i align(piece_i) * b)
//   gathered weights   = gathered grads   = footprint(sum_{i in group} align(W*s_i) * b)  (W > 1;
//   0 for W = 1, and 0 for a part the GatherParts leaves out)
// zero_persistent_bytes / zero_gathered_bytes / zero_largest_gathered_bytes give these to the
// planner; the largest group is over zero_gather_groups(): the embedding, each decoder layer's
// dense params, and the final norm with the LM head.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/comm/comm.h"
#include "core/config/config.h"
#include "core/model/mixtral_params.h"
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

// Dense (ZeRO-sharded) params of each gather group, in order of use in the forward pass:
// {embed}, {layer l: input_norm, q, k, v, o, post_norm, gate} for each l, {final_norm, lm_head}
// ({final_norm} alone when the LM head is stored by vocabulary rows).
std::vector<std::vector<int>> zero_gather_groups(const ParamLayout& layout,
                                                 LmHeadSharding lm_head = LmHeadSharding::zero3);
// Persistent shard + local-expert buffers of one rank: the same on every rank, except that
// vocabulary rows differ by one row between ranks — then the largest rank's.
ZeroBytes zero_persistent_bytes(const ModelConfig& model, DType dtype, int world_size,
                                LmHeadSharding lm_head = LmHeadSharding::zero3);
// The elements of that flat buffer on the largest rank (the P the optimizer's byte functions take).
int64_t zero_persistent_elements(const ModelConfig& model, int world_size,
                                 LmHeadSharding lm_head = LmHeadSharding::zero3);
// The buffers gather(params, parts) allocates (expert params in `params` cost nothing; W = 1
// costs nothing).
ZeroBytes zero_gathered_bytes(const ModelConfig& model, DType dtype, int world_size,
                              std::span<const int> params,
                              GatherParts parts = GatherParts::values_and_grads);
// The largest over zero_gather_groups().
ZeroBytes zero_largest_gathered_bytes(const ModelConfig& model, DType dtype, int world_size,
                                      LmHeadSharding lm_head = LmHeadSharding::zero3);

class ZeroParamStore {
 public:
  struct LocalPiece {
    int param;
    Tensor value, grad;  // dense: 1-D (s_i) shard; expert: the full tensor
    bool is_norm;
    bool is_expert;
  };

  class GatheredGroup {
   public:
    GatheredGroup() = default;
    GatheredGroup(GatheredGroup&&) noexcept = default;
    GatheredGroup& operator=(GatheredGroup&&) noexcept = default;

    // The full tensor of a gathered dense param, or the stored tensor of a local expert param.
    // Error if the part was not gathered.
    Tensor value(int param) const;
    Tensor grad(int param) const;
    // shard grads += sum over ranks of the gathered grads (collective: every rank calls it).
    void reduce_scatter_grads(Stream& stream);
    const std::vector<int>& params() const { return params_; }

   private:
    friend class ZeroParamStore;
    const ZeroParamStore* store_ = nullptr;
    std::vector<int> params_;
    std::vector<int64_t> slot_;  // per param of the layout: element offset in the buffers, or -1
    GatherParts parts_ = GatherParts::values_and_grads;
    OwnedTensor values_, grads_;
  };

  // Throws unless num_local_experts % world_size == 0 (and V >= W for vocab_rows). Not
  // collective.
  ZeroParamStore(Backend& backend, const ModelConfig& model, DType dtype, Comm& comm,
                 LmHeadSharding lm_head = LmHeadSharding::zero3);

  const ParamLayout& layout() const { return layout_; }
  DType dtype() const { return dtype_; }
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  Comm& comm() const { return comm_; }
  Backend& backend() const { return backend_; }

  bool is_expert(int param) const { return info_.at(param).expert >= 0; }
  // Stored by vocabulary rows (the LM head under LmHeadSharding::vocab_rows).
  bool is_row_sharded(int param) const { return info_.at(param).rows; }
  LmHeadSharding lm_head_sharding() const { return lm_head_; }
  // Rank that stores expert param `param` whole; -1 for dense params.
  int expert_owner(int param) const;
  // Stored here: every dense param (its shard) and this rank's expert params.
  bool is_local(int param) const { return info_.at(param).offset >= 0; }
  // s_i for a dense param; numel for an expert param; V_r * H for row-sharded.
  int64_t shard_elements(int param) const { return info_.at(param).local_numel; }
  // The piece of `param` this rank stores (Error if none): a 1-D shard (dense), the full tensor
  // (expert) or (V_r, H) rows (row-sharded).
  Tensor local_value(int param) const;
  Tensor local_grad(int param) const;

  const std::vector<LocalPiece>& local_pieces() const { return pieces_; }
  Tensor flat_values() const { return values_.view(); }
  Tensor flat_grads() const { return grads_.view(); }

  // Fills this rank's pieces with exactly the values ParamStore::initialize gives those elements.
  void initialize(uint64_t seed, double initializer_range, Stream& stream);
  void zero_grads(Stream& stream);

  // Collective: every rank calls it with the same params, in the same order as other collectives.
  GatheredGroup gather(std::span<const int> params, Stream& stream,
                       GatherParts parts = GatherParts::values_and_grads) const;
  // The full tensor's bytes (numel * dtype size) on every rank: dense params by all_gather of the
  // shards, experts by a broadcast from their owner. `flat` is any buffer laid out like
  // flat_values() (the values, the grads, the optimizer's m or v); the first form reads the
  // values. Collective; synchronises the stream.
  std::vector<char> gather_full(int param, Stream& stream) const;
  std::vector<char> gather_full(int param, const Tensor& flat, Stream& stream) const;
  // Keeps this rank's part of a full host tensor (numel elements of dtype()) in the values, or
  // in `flat` laid out like them; not collective. Synchronises the stream (the host memory may go
  // away after the call).
  void load_full(int param, const void* full, Stream& stream);
  void load_full(int param, const void* full, const Tensor& flat, Stream& stream);

 private:
  struct Info {
    int expert = -1;          // expert index j for expert params
    bool rows = false;        // stored by vocabulary rows
    int64_t offset = -1;      // elements into the flat buffers, -1 if not stored here
    int64_t local_numel = 0;  // s_i (dense), numel (expert), V_r * H (rows)
    int64_t first = 0;        // the first element of the flattened tensor this rank stores
  };
  Tensor piece(const Tensor& flat, int param) const;

  ParamLayout layout_;
  DType dtype_;
  LmHeadSharding lm_head_;
  Backend& backend_;
  Comm& comm_;
  int rank_, world_;
  std::vector<Info> info_;
  std::vector<LocalPiece> pieces_;
  OwnedTensor values_, grads_;
};

}  // namespace moepeak
