// ZeroParamStore: ZeRO-3 shards of the dense parameters and whole local experts in one flat
// weights and one flat grads buffer per rank; gathered groups for use (see zero_params.h).
#include "core/model/zero_params.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "core/error.h"
#include "core/model/param_init.h"
#include "core/runtime/stream_profile.h"
#include "ops/elementwise.h"
#include "ops/op_common.h"
#include "ops/schedules/schedule_dtype.h"  // defines: main_grad_dtype

namespace moepeak {
namespace {

constexpr int64_t kAbsent = -1, kInStore = -2;

int64_t align_up(int64_t n) {
  constexpr int64_t a = ParamLayout::kAlignElements;
  return (n + a - 1) / a * a;
}

int64_t shard_size(int64_t numel, int ranks) { return (numel + ranks - 1) / ranks; }

void check_experts_divisible(const ModelConfig& model, const ParallelDegrees& d) {
  if (d.expert < 1 || model.num_local_experts % d.expert != 0) {
    MOEPEAK_INPUT_ERROR("expert parallelism over Ep = ", d.expert,
                        " ranks needs num_local_experts (E = ", model.num_local_experts,
                        ") divisible by Ep");
  }
}

// A head stored by vocabulary rows (Ring-DTP) cannot also be the ZeRO-3 sharded embedding.
void check_head_storage(const ParamLayout& layout, LmHeadSharding lm_head) {
  if (lm_head == LmHeadSharding::vocab_rows && layout.tied()) {
    MOEPEAK_INPUT_ERROR(
        "schedules.vocab = \"ring_dtp\" keeps the LM head by vocabulary rows, "
        "but model.tie_word_embeddings makes it the embedding, which ZeRO-3 "
        "shards: use schedules.vocab = \"materialized\" with tied embeddings");
  }
}

// Expert index of every param (-1 for dense ones), kept by the layout.
const std::vector<int>& expert_of(const ParamLayout& layout) { return layout.expert_index(); }

// What rank `rank` stores of param i: elements [first, first + numel) of the flattened tensor
// (stored = false: nothing), whose shards span `shards` ranks and which `replicas` groups hold
// again (see zero_params.h). Dense: the ZeRO-3 slice of data-shard rank r % Ds; expert: the
// slice of replica r / Ep on the ranks of its expert-group rank, whole when W/Ep = 1;
// vocabulary rows: rows [floor(rV/W), floor((r+1)V/W)).
struct Extent {
  bool stored = true, rows = false;
  int64_t first = 0, numel = 0;
  int shards = 1, replicas = 1;
  // Its shards span more than one rank: a gathered group all-gathers its full tensor.
  bool gathered() const { return shards > 1; }
  // Its gradient is summed over ranks (over its shards' group, its replicas or both): a gathered
  // group gives the gradient a slot of its own and reduces it into the shard.
  bool reduced() const { return shards * replicas > 1; }
};

// The expert-group rank that holds expert j: j / (E/Ep).
int expert_group_rank(const ParamLayout& layout, const ParallelDegrees& d, int expert) {
  return expert / (static_cast<int>(layout.spec().experts()) / d.expert);
}

Extent extent_of(const ParamLayout& layout, const std::vector<int>& expert, size_t i,
                 const ParallelDegrees& d, int rank, LmHeadSharding lm_head) {
  const int64_t n = layout.params()[i].shape.numel();
  Extent e;
  if (expert[i] >= 0) {
    if (expert_group_rank(layout, d, expert[i]) != rank % d.expert) return Extent{false};
    e.shards = d.expert_replicas();
    const int64_t s = shard_size(n, e.shards);
    e.first = (rank / d.expert) * s;
    e.numel = s;
    return e;
  }
  if (lm_head == LmHeadSharding::vocab_rows && static_cast<int>(i) == layout.lm_head) {
    const Shape& shape = layout.params()[i].shape;
    const auto [begin, end] = lm_head_rows(shape[0], d.world, rank);
    e.rows = true;
    e.first = begin * shape[1];
    e.numel = (end - begin) * shape[1];
    return e;
  }
  e.shards = d.data_shard;
  e.replicas = d.dense_replicas();
  const int64_t s = shard_size(n, e.shards);
  e.first = (rank % d.data_shard) * s;
  e.numel = s;
  return e;
}

// Elements of rank `rank`'s flat buffers.
int64_t local_elements(const ParamLayout& layout, const std::vector<int>& expert,
                       const ParallelDegrees& d, int rank, LmHeadSharding lm_head) {
  int64_t total = 0;
  for (size_t i = 0; i < expert.size(); ++i) {
    const Extent e = extent_of(layout, expert, i, d, rank, lm_head);
    if (e.stored) total += align_up(e.numel);
  }
  return total;
}
int64_t local_elements(const ParamLayout& layout, const ParallelDegrees& d, int rank,
                       LmHeadSharding lm_head) {
  return local_elements(layout, expert_of(layout), d, rank, lm_head);
}

uint64_t footprint(int64_t elements, DType dtype) {
  if (elements == 0) return 0;
  return DeviceArena::footprint(static_cast<uint64_t>(elements) * dtype_size(dtype));
}

// A param's extent on rank 0 of its groups (the sizes every rank shares), Error if unknown.
Extent any_extent(const ParamLayout& layout, const std::vector<int>& expert, int p,
                  const ParallelDegrees& d) {
  MOEPEAK_CHECK(p >= 0 && p < static_cast<int>(expert.size()), "no parameter ", p);
  const int rank = expert[p] >= 0 ? expert_group_rank(layout, d, expert[p]) : 0;
  return extent_of(layout, expert, static_cast<size_t>(p), d, rank, LmHeadSharding::zero3);
}

}  // namespace

std::pair<int64_t, int64_t> lm_head_rows(int64_t vocab, int world, int rank) {
  MOEPEAK_CHECK(world > 0 && rank >= 0 && rank < world, "lm_head_rows: rank ", rank, " of ", world);
  MOEPEAK_CHECK(vocab >= world,
                "the LM head split by vocabulary rows needs at least one row per "
                "rank: vocab_size = ",
                vocab, ", W = ", world);
  return {rank * vocab / world, (rank + 1) * vocab / world};
}

std::vector<std::vector<int>> zero_gather_groups(const ParamLayout& layout, LmHeadSharding lm_head,
                                                 int expert_begin, int expert_end) {
  std::vector<std::vector<int>> groups;
  groups.push_back({layout.embed});
  for (const LayerParamIndex& L : layout.layers) {
    std::vector<int> g;
    // The layer's params but its experts, those it has (-1: absent in this layer's kind).
    for (int p :
         {L.input_norm, L.q, L.k, L.v, L.o, L.q_a, L.q_a_norm, L.q_b, L.kv_a, L.kv_a_norm, L.kv_b,
          L.q_bias, L.k_bias, L.v_bias, L.o_bias, L.sinks, L.q_norm, L.k_norm, L.post_norm}) {
      if (p >= 0) g.push_back(p);
    }
    if (L.moe()) {
      for (int p : {L.router, L.router_bias, L.router_correction_bias, L.shared_gate, L.shared_up,
                    L.shared_down}) {
        if (p >= 0) g.push_back(p);
      }
      for (int j = expert_begin; j < expert_end; ++j) {
        g.insert(g.end(), {L.w1[j], L.w2[j], L.w3[j]});
        if (!L.b1.empty()) g.insert(g.end(), {L.b1[j], L.b2[j], L.b3[j]});
      }
    } else {
      g.insert(g.end(), {L.dense_gate, L.dense_up, L.dense_down});
    }
    groups.push_back(std::move(g));
  }
  if (lm_head == LmHeadSharding::vocab_rows)
    groups.push_back({layout.final_norm});
  else
    groups.push_back({layout.final_norm, layout.lm_head});
  return groups;
}

std::pair<int, int> zero_local_experts(const ModelConfig& model, const ParallelDegrees& degrees,
                                       int expert_rank) {
  check_experts_divisible(model, degrees);
  const int per_rank = static_cast<int>(model.num_local_experts / degrees.expert);
  return {expert_rank * per_rank, (expert_rank + 1) * per_rank};
}

int64_t zero_persistent_elements(const ModelConfig& model, const ParallelDegrees& degrees,
                                 LmHeadSharding lm_head) {
  check_experts_divisible(model, degrees);
  const ParamLayout& layout = cached_param_layout(model);
  check_head_storage(layout, lm_head);
  const std::vector<int>& expert = expert_of(layout);
  // NOTES: every piece has the same size on every rank but the vocabulary rows (floor or ceil of
  // V/W rows), so rank 0's pieces without the rows plus the largest rank's rows is the largest.
  int64_t base = local_elements(layout, expert, degrees, 0, LmHeadSharding::zero3);
  if (lm_head != LmHeadSharding::vocab_rows) return base;
  const Shape& head = layout.params()[layout.lm_head].shape;
  base -= align_up(shard_size(head.numel(), degrees.data_shard));
  int64_t rows = 0;
  for (int r = 0; r < degrees.world; ++r) {
    const auto [begin, end] = lm_head_rows(head[0], degrees.world, r);
    rows = std::max(rows, align_up((end - begin) * head[1]));
  }
  return base + rows;
}

ZeroBytes zero_persistent_bytes(const ModelConfig& model, DType dtype,
                                const ParallelDegrees& degrees, LmHeadSharding lm_head) {
  const int64_t elements = zero_persistent_elements(model, degrees, lm_head);
  return ZeroBytes{footprint(elements, dtype),
                   footprint(elements, schedules::main_grad_dtype(dtype))};
}

namespace {

ZeroBytes gathered_bytes(const ParamLayout& layout, const std::vector<int>& expert, DType dtype,
                         const ParallelDegrees& degrees, std::span<const int> params,
                         GatherParts parts) {
  int64_t values = 0, grads = 0;
  for (int p : params) {
    const Extent e = any_extent(layout, expert, p, degrees);
    const int64_t slot = align_up(e.shards * e.numel);
    if (e.gathered()) values += slot;
    if (e.reduced()) grads += slot;
  }
  return ZeroBytes{
      parts == GatherParts::grads ? 0 : footprint(values, dtype),
      parts == GatherParts::values ? 0 : footprint(grads, schedules::main_grad_dtype(dtype))};
}

}  // namespace

ZeroBytes zero_gathered_bytes(const ModelConfig& model, DType dtype, const ParallelDegrees& degrees,
                              std::span<const int> params, GatherParts parts) {
  return zero_gathered_bytes(model, cached_param_layout(model), dtype, degrees, params, parts);
}

ZeroBytes zero_gathered_bytes(const ModelConfig& model, const ParamLayout& layout, DType dtype,
                              const ParallelDegrees& degrees, std::span<const int> params,
                              GatherParts parts) {
  check_experts_divisible(model, degrees);
  return gathered_bytes(layout, expert_of(layout), dtype, degrees, params, parts);
}

ZeroParamStore::ZeroParamStore(Backend& backend, const ModelConfig& model, DType dtype, Comm& comm,
                               LmHeadSharding lm_head)
    : ZeroParamStore(backend, model, dtype,
                     std::make_unique<ParallelGroups>(
                         comm, ParallelDegrees::uniform(comm.world_size()), backend.kind()),
                     nullptr, lm_head) {}

ZeroParamStore::ZeroParamStore(Backend& backend, const ModelConfig& model, DType dtype,
                               const ParallelGroups& groups, LmHeadSharding lm_head)
    : ZeroParamStore(backend, model, dtype, nullptr, &groups, lm_head) {}

ZeroParamStore::~ZeroParamStore() = default;

ZeroParamStore::ZeroParamStore(Backend& backend, const ModelConfig& model, DType dtype,
                               std::unique_ptr<ParallelGroups> owned, const ParallelGroups* groups,
                               LmHeadSharding lm_head)
    : layout_(model),
      dtype_(dtype),
      grad_dtype_(schedules::main_grad_dtype(dtype)),
      lm_head_(lm_head),
      backend_(backend),
      owned_groups_(std::move(owned)),
      groups_(groups ? groups : owned_groups_.get()),
      rank_(groups_->world().rank()),
      world_(groups_->world().world_size()) {
  const ParallelDegrees& d = groups_->degrees();
  check_experts_divisible(model, d);
  check_head_storage(layout_, lm_head_);
  MOEPEAK_CHECK(dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16,
                "parameters must be f32, f64 or bf16, not ", dtype_name(dtype));
  const std::vector<int>& expert = expert_of(layout_);
  info_.resize(expert.size());
  std::vector<Extent> extents(expert.size());
  for (size_t i = 0; i < expert.size(); ++i) {
    extents[i] = extent_of(layout_, expert, i, d, rank_, lm_head_);
  }
  // Offsets: with dense replicas, the dense shards first (the replicated region), then the rest;
  // without, every piece in layout order (one region, each element on one rank).
  const bool regions = d.dense_replicas() > 1;
  int64_t total = 0;
  for (int pass = 0; pass < (regions ? 2 : 1); ++pass) {
    for (size_t i = 0; i < expert.size(); ++i) {
      const Extent& e = extents[i];
      const bool dense = expert[i] < 0 && !e.rows;
      if (regions && dense != (pass == 0)) continue;
      Info& info = info_[i];
      info.expert = expert[i];
      info.rows = e.rows;
      if (!e.stored) continue;  // another expert-group rank's expert
      info.first = e.first;
      info.local_numel = e.numel;
      info.whole = !e.rows && !e.reduced();
      info.slot_elements = e.shards * e.numel;
      if (e.gathered())
        info.shards = expert[i] >= 0 ? ShardGroup::expert_replicas : ShardGroup::data_shard;
      info.replicated = e.replicas > 1;
      info.offset = total;
      total += align_up(info.local_numel);
    }
    if (regions && pass == 0) replicated_elements_ = total;
  }
  MOEPEAK_CHECK(total == local_elements(layout_, d, rank_, lm_head_), "ZeRO-3 layout drift");
  values_ =
      OwnedTensor::device(backend, Shape{total}, dtype, LiveSet::weights, "ZeRO-3 weight shards");
  grads_ = OwnedTensor::device(backend, Shape{total}, grad_dtype_, LiveSet::grads,
                               "ZeRO-3 gradient shards");
  Stream& stream = backend.default_stream();
  backend.memset_async(values_.data(), 0, values_.nbytes(), stream);
  backend.memset_async(grads_.data(), 0, grads_.nbytes(), stream);
  stream.synchronize();
  for (size_t i = 0; i < info_.size(); ++i) {
    if (info_[i].offset < 0) continue;
    int p = static_cast<int>(i);
    pieces_.push_back(LocalPiece{p, piece(values_.view(), p), piece(grads_.view(), p),
                                 layout_.params()[i].is_norm, layout_.params()[i].decays,
                                 info_[i].expert >= 0});
  }
}

int ZeroParamStore::expert_owner(int param) const {
  int e = info_.at(param).expert;
  if (e < 0) return -1;
  return expert_group_rank(layout_, groups_->degrees(), e);
}

Tensor ZeroParamStore::counted_grads() const {
  if (rank_ / groups_->degrees().data_shard == 0) return grads_.view();  // dense-replica rank 0
  char* base = static_cast<char*>(grads_.data()) + replicated_elements_ * dtype_size(grad_dtype_);
  return Tensor(base, Shape{grads_.view().numel() - replicated_elements_}, grad_dtype_,
                Placement::device, &backend_);
}

char* ZeroParamStore::piece_bytes(const Tensor& flat, int param) const {
  const Info& info = info_.at(param);
  MOEPEAK_CHECK(flat.numel() == values_.view().numel(),
                "a flat buffer laid out like this rank's parameters has ", values_.view().numel(),
                " elements, not ", flat.str());
  MOEPEAK_CHECK(info.offset >= 0, layout_.params()[param].name, " is expert ", info.expert,
                " of expert-group rank ", expert_owner(param), ", not stored on rank ", rank_);
  return static_cast<char*>(flat.data()) + info.offset * dtype_size(flat.dtype());
}

Tensor ZeroParamStore::piece(const Tensor& flat, int param) const {
  const Info& info = info_.at(param);
  char* base = piece_bytes(flat, param);
  const Shape& full = layout_.params()[param].shape;
  Shape shape = info.whole && info.expert >= 0 ? full
                : info.rows                    ? Shape{info.local_numel / full[1], full[1]}
                                               : Shape{info.local_numel};
  return Tensor(base, shape, flat.dtype(), Placement::device, &backend_);
}

Tensor ZeroParamStore::local_value(int param) const { return piece(values_.view(), param); }
Tensor ZeroParamStore::local_grad(int param) const { return piece(grads_.view(), param); }

void ZeroParamStore::initialize(uint64_t seed, double initializer_range, Stream& stream) {
  // Generated on the host in float64 (only this rank's elements), converted and copied in.
  const size_t b = dtype_size(dtype_);
  std::vector<char> host(values_.nbytes(), 0);
  for (const LocalPiece& piece : pieces_) {
    const Info& info = info_[piece.param];
    int64_t n = layout_.params()[piece.param].shape.numel();
    int64_t begin = info.first;
    int64_t end = std::min(n, begin + info.local_numel);
    for (int64_t j = begin; j < end; ++j) {
      const double v = layout_.params()[piece.param].zero_init
                           ? 0.0
                           : param_init::element(seed, static_cast<uint64_t>(piece.param),
                                                 piece.is_norm, initializer_range, j);
      param_init::store(dtype_, v, host.data() + (info.offset + j - begin) * b);
    }
  }
  backend_.copy_async(values_.data(), host.data(), host.size(), CopyKind::host_to_device, stream);
  stream.synchronize();  // `host` dies here
}

void ZeroParamStore::zero_grads(Stream& stream) {
  backend_.memset_async(grads_.data(), 0, grads_.nbytes(), stream);
}

ZeroComms ZeroParamStore::comms() const {
  return ZeroComms{&groups_->data_shard(), &groups_->expert_replicas(), &groups_->dense_replicas()};
}

Comm& ZeroParamStore::shard_comm(ShardGroup group, const ZeroComms& comms) {
  Comm* c = group == ShardGroup::expert_replicas ? comms.expert_replicas
            : group == ShardGroup::data_shard    ? comms.data_shard
                                                 : nullptr;
  MOEPEAK_CHECK(c != nullptr, "ZeroParamStore: a collective over no shard group");
  return *c;
}

namespace {

// op(p) for each p of `params` that `pick` selects, as one Comm group on `comm` (none when no
// param is selected): a layer's small tensors (norms, router) go with its large ones.
template <typename Pick, typename Op>
void in_one_group(Comm& comm, std::span<const int> params, Pick pick, Op op) {
  std::optional<CommGroup> batch;
  for (int p : params) {
    if (!pick(p)) continue;
    if (!batch) batch.emplace(comm);
    op(p);
  }
  if (batch) batch->end();
}

}  // namespace

ZeroParamStore::GatheredGroup ZeroParamStore::gather(std::span<const int> params, Stream& stream,
                                                     GatherParts parts) const {
  GatheredGroup g = gather_values(params, parts, stream, comms());
  g.allocate_grads(stream);
  return g;
}

ZeroParamStore::GatheredGroup ZeroParamStore::gather_values(std::span<const int> params,
                                                            GatherParts parts, Stream& stream,
                                                            const ZeroComms& comms) const {
  const StreamTrafficTag traffic("zero gather");
  GatheredGroup g;
  g.store_ = this;
  g.parts_ = parts;
  g.params_.assign(params.begin(), params.end());
  g.value_slot_.assign(info_.size(), kAbsent);
  g.grad_slot_.assign(info_.size(), kAbsent);
  int64_t values = 0, grads = 0;
  for (int p : params) {
    MOEPEAK_CHECK(p >= 0 && p < static_cast<int>(info_.size()), "gather: no parameter ", p);
    MOEPEAK_CHECK(g.value_slot_[p] == kAbsent, "gather: ", layout_.params()[p].name,
                  " named twice");
    MOEPEAK_CHECK(!info_[p].rows, "gather: ", layout_.params()[p].name,
                  " is stored by vocabulary rows (Ring-DTP) and never gathered; use local_value");
    local_value(p);  // throws unless it is stored here (an expert of this rank)
    const Info& info = info_[p];
    const int64_t slot = align_up(info.slot_elements);
    // NOTES: a param whose shards span one rank is its own full tensor (read from the store);
    // its gradient needs a slot of its own only when replicas sum it, since the store's grads
    // already hold earlier micro-batches' sums.
    const bool gathered = info.shards != ShardGroup::none;
    g.value_slot_[p] = gathered ? values : kInStore;
    if (gathered) values += slot;
    g.grad_slot_[p] = info.whole ? kInStore : grads;
    if (!info.whole) grads += slot;
  }
  if (parts != GatherParts::values) g.grad_elements_ = grads;
  const size_t b = dtype_size(dtype_);
  if (parts != GatherParts::grads && values > 0) {
    g.values_ = OwnedTensor::device(backend_, Shape{values}, dtype_, LiveSet::weights,
                                    "ZeRO-3 gathered weights");
    for (ShardGroup group : {ShardGroup::data_shard, ShardGroup::expert_replicas}) {
      Comm& comm = shard_comm(group, comms);
      in_one_group(
          comm, params, [&](int p) { return g.value_slot_[p] >= 0 && info_[p].shards == group; },
          [&](int p) {
            char* dst = static_cast<char*>(g.values_.data()) + g.value_slot_[p] * b;
            comm.all_gather(local_value(p).data(), dst, static_cast<size_t>(info_[p].local_numel),
                            dtype_, stream);
          });
    }
  }
  return g;
}

void ZeroParamStore::GatheredGroup::allocate_grads(Stream& stream) {
  MOEPEAK_CHECK(store_ != nullptr, "GatheredGroup: empty group");
  if (grad_elements_ == 0 || grads_.data() != nullptr) return;
  grads_ = OwnedTensor::device(store_->backend_, Shape{grad_elements_}, store_->grad_dtype_,
                               LiveSet::grads, "ZeRO-3 gathered grads");
  store_->backend_.memset_async(grads_.data(), 0, grads_.nbytes(), stream);
}

Tensor ZeroParamStore::GatheredGroup::value(int param) const {
  MOEPEAK_CHECK(store_ != nullptr, "GatheredGroup: empty group");
  MOEPEAK_CHECK(
      param >= 0 && param < static_cast<int>(value_slot_.size()) && value_slot_[param] != kAbsent,
      "GatheredGroup: parameter ", param, " was not gathered");
  const Shape& shape = store_->layout_.params()[param].shape;
  if (value_slot_[param] == kInStore) return store_->local_value(param).reshape(shape);
  MOEPEAK_CHECK(parts_ != GatherParts::grads,
                "GatheredGroup: ", store_->layout_.params()[param].name,
                " was gathered for its gradient only");
  char* base = static_cast<char*>(values_.data()) + value_slot_[param] * dtype_size(store_->dtype_);
  return Tensor(base, shape, store_->dtype_, Placement::device, &store_->backend_);
}

Tensor ZeroParamStore::GatheredGroup::grad(int param) const {
  MOEPEAK_CHECK(store_ != nullptr, "GatheredGroup: empty group");
  MOEPEAK_CHECK(
      param >= 0 && param < static_cast<int>(grad_slot_.size()) && grad_slot_[param] != kAbsent,
      "GatheredGroup: parameter ", param, " was not gathered");
  const Shape& shape = store_->layout_.params()[param].shape;
  MOEPEAK_CHECK(parts_ != GatherParts::values,
                "GatheredGroup: ", store_->layout_.params()[param].name,
                " was gathered without its gradient");
  if (grad_slot_[param] == kInStore) return store_->local_grad(param).reshape(shape);
  char* base =
      static_cast<char*>(grads_.data()) + grad_slot_[param] * dtype_size(store_->grad_dtype_);
  return Tensor(base, shape, store_->grad_dtype_, Placement::device, &store_->backend_);
}

void ZeroParamStore::GatheredGroup::reduce_scatter_grads(Stream& stream) {
  MOEPEAK_CHECK(store_ != nullptr, "GatheredGroup: empty group");
  reduce_scatter_grads(stream, store_->comms());
}

void ZeroParamStore::GatheredGroup::reduce_scatter_grads(Stream& stream, const ZeroComms& comms) {
  const StreamTrafficTag traffic("zero reduce-scatter");
  MOEPEAK_CHECK(store_ != nullptr, "GatheredGroup: empty group");
  MOEPEAK_CHECK(parts_ != GatherParts::values,
                "GatheredGroup: reduce_scatter_grads of a group gathered without gradients");
  if (grad_elements_ == 0) return;
  MOEPEAK_CHECK(grads_.data() != nullptr,
                "GatheredGroup: reduce_scatter_grads before allocate_grads");
  const ZeroParamStore& s = *store_;
  const DType g = s.grad_dtype_;
  const size_t b = dtype_size(g);
  // This rank's part of param p's summed gradient: its block of the slot (sharded: the in-place
  // reduce_scatter's output, rank q of the shard group at q * s_i) or the whole slot.
  auto part_of = [&](int p) -> char* {
    const Info& info = s.info_[p];
    char* slot = static_cast<char*>(grads_.data()) + grad_slot_[p] * b;
    if (info.shards == ShardGroup::none) return slot;
    return slot + static_cast<size_t>(shard_comm(info.shards, comms).rank() * info.local_numel) * b;
  };
  auto count = [&](int p) { return static_cast<size_t>(s.info_[p].local_numel); };
  for (ShardGroup group : {ShardGroup::data_shard, ShardGroup::expert_replicas}) {
    Comm& comm = shard_comm(group, comms);
    in_one_group(
        comm, params_, [&](int p) { return grad_slot_[p] >= 0 && s.info_[p].shards == group; },
        [&](int p) {
          comm.reduce_scatter(static_cast<char*>(grads_.data()) + grad_slot_[p] * b, part_of(p),
                              count(p), g, ReduceOp::sum, stream);
        });
  }
  MOEPEAK_CHECK(comms.dense_replicas != nullptr, "ZeroParamStore: no dense-replica group");
  in_one_group(
      *comms.dense_replicas, params_,
      [&](int p) { return grad_slot_[p] >= 0 && s.info_[p].replicated; },
      [&](int p) {
        comms.dense_replicas->all_reduce(part_of(p), part_of(p), count(p), g, ReduceOp::sum,
                                         stream);
      });
  for (int p : params_) {
    if (grad_slot_[p] < 0) continue;  // accumulated in the store
    const int64_t n = s.info_[p].local_numel;
    Tensor summed(part_of(p), Shape{n}, g, Placement::device, &s.backend_);
    Tensor shard = s.local_grad(p).reshape(Shape{n});
    ops::add(shard, summed, shard, stream);  // shard += the job's sum
  }
}

std::vector<char> ZeroParamStore::gather_full(int param, Stream& stream) const {
  return gather_full(param, values_.view(), stream);
}

std::vector<char> ZeroParamStore::gather_full(int param, const Tensor& flat, Stream& stream) const {
  MOEPEAK_CHECK(param >= 0 && param < static_cast<int>(info_.size()), "no parameter ", param);
  const Info& info = info_[param];
  const DType dtype = flat.dtype();
  const size_t b = dtype_size(dtype);
  const Shape& shape = layout_.params()[param].shape;
  const int64_t n = shape.numel();
  std::vector<char> full(static_cast<size_t>(n) * b);
  // NOTES: collectives read device memory (NCCL), so a piece of a host or other-dtype buffer (an
  // offloaded optimizer state, the fp32 master) is staged in a device `workspace` buffer first;
  // on the CPU backend both are host memory and the staging is a copy.
  const bool in_place = flat.placement() == Placement::device;
  auto staged = [&](int64_t elements, const char* what) {
    return OwnedTensor::device(backend_, Shape{elements}, dtype, LiveSet::workspace, what);
  };
  auto send_piece = [&](OwnedTensor& stage) -> const void* {
    const char* src = piece_bytes(flat, param);
    if (in_place) return src;
    stage = staged(info.local_numel, "gather_full piece");
    backend_.copy_async(stage.data(), src, static_cast<size_t>(info.local_numel) * b,
                        CopyKind::host_to_device, stream);
    return stage.data();
  };
  auto to_host = [&](const void* src, size_t bytes, size_t at) {
    backend_.copy_async(full.data() + at, src, bytes, CopyKind::device_to_host, stream);
  };
  if (info.rows) {
    // Ranks hold floor or ceil(V/W) rows: pad every part to the largest for one all_gather.
    int64_t most = 0;
    for (int r = 0; r < world_; ++r) {
      const auto [begin, end] = lm_head_rows(shape[0], world_, r);
      most = std::max(most, end - begin);
    }
    const int64_t H = shape[1];
    OwnedTensor mine = staged(most * H, "vocabulary rows gather_full send");
    OwnedTensor all = staged(world_ * most * H, "vocabulary rows gather_full");
    backend_.copy_async(mine.data(), piece_bytes(flat, param),
                        static_cast<size_t>(info.local_numel) * b,
                        in_place ? CopyKind::device_to_device : CopyKind::host_to_device, stream);
    comm().all_gather(mine.data(), all.data(), static_cast<size_t>(most * H), dtype, stream);
    for (int r = 0; r < world_; ++r) {
      const auto [begin, end] = lm_head_rows(shape[0], world_, r);
      to_host(static_cast<const char*>(all.data()) + static_cast<size_t>(r * most * H) * b,
              static_cast<size_t>((end - begin) * H) * b, static_cast<size_t>(begin * H) * b);
    }
    stream.synchronize();
    return full;
  }
  // The shards' group puts the full tensor (padded to G * s) on each of its ranks; an expert's
  // owner in each expert group then broadcasts it to the group.
  const bool held = info.offset >= 0;
  OwnedTensor stage, all;
  const void* whole = nullptr;
  if (held) {
    const void* mine = send_piece(stage);
    if (info.shards != ShardGroup::none) {
      all = staged(info.slot_elements, "gather_full");
      shard_comm(info.shards, comms())
          .all_gather(mine, all.data(), static_cast<size_t>(info.local_numel), dtype, stream);
      whole = all.data();
    } else {
      whole = mine;
    }
  }
  if (info.expert >= 0 && groups_->degrees().expert > 1) {
    OwnedTensor bcast = staged(n, "gather_full expert");
    if (held) {
      backend_.copy_async(bcast.data(), whole, static_cast<size_t>(n) * b,
                          CopyKind::device_to_device, stream);
    }
    groups_->expert().broadcast(bcast.data(), static_cast<size_t>(n), dtype, expert_owner(param),
                                stream);
    to_host(bcast.data(), full.size(), 0);
    stream.synchronize();
    return full;
  }
  to_host(whole, full.size(), 0);
  stream.synchronize();
  return full;
}

void ZeroParamStore::load_full(int param, const void* full, Stream& stream) {
  load_full(param, full, values_.view(), stream);
}

void ZeroParamStore::load_full(int param, const void* full, const Tensor& flat, Stream& stream) {
  MOEPEAK_CHECK(param >= 0 && param < static_cast<int>(info_.size()), "no parameter ", param);
  const auto range = stored_range(param);
  if (!range) return;  // another expert-group rank's expert
  const size_t b = dtype_size(flat.dtype());
  load_stored_range(param, static_cast<const char*>(full) + static_cast<size_t>(range->first) * b,
                    flat, stream);
}

std::optional<std::pair<int64_t, int64_t>> ZeroParamStore::stored_range(int param) const {
  const Info& info = info_.at(param);
  if (info.offset < 0) return std::nullopt;
  const int64_t n = layout_.params()[param].shape.numel();
  const int64_t begin = std::min(n, info.first);
  return std::pair{begin, std::min(n, begin + info.local_numel)};
}

bool ZeroParamStore::writes_checkpoint(int param) const {
  const Info& info = info_.at(param);
  if (info.offset < 0) return false;
  const bool dense = info.expert < 0 && !info.rows;
  return !dense || rank_ / groups_->degrees().data_shard == 0;  // dense-replica rank 0
}

int64_t ZeroParamStore::piece_offset(int param) const {
  const Info& info = info_.at(param);
  MOEPEAK_CHECK(info.offset >= 0, layout_.params()[param].name, " is expert ", info.expert,
                " of expert-group rank ", expert_owner(param), ", not stored on rank ", rank_);
  return info.offset;
}

void ZeroParamStore::copy_piece_to_host(int param, const Tensor& flat, int64_t offset,
                                        int64_t count, void* dst, Stream& stream) const {
  const auto range = stored_range(param);
  MOEPEAK_CHECK(
      range && offset >= 0 && count >= 0 && offset + count <= range->second - range->first,
      "copy_piece_to_host: elements [", offset, ", ", offset + count, ") of ",
      layout_.params()[param].name, "'s piece on rank ", rank_, " are not stored there");
  const size_t b = dtype_size(flat.dtype());
  const char* src = piece_bytes(flat, param) + static_cast<size_t>(offset) * b;
  if (count == 0) return;
  if (flat.placement() == Placement::host) {
    stream.synchronize();  // the state is current
    std::memcpy(dst, src, static_cast<size_t>(count) * b);
    return;
  }
  backend_.copy_async(dst, src, static_cast<size_t>(count) * b, CopyKind::device_to_host, stream);
  stream.synchronize();
}

void ZeroParamStore::load_stored_range(int param, const void* src, const Tensor& flat,
                                       Stream& stream) {
  const Info& info = info_.at(param);
  const auto range = stored_range(param);
  MOEPEAK_CHECK(range, "load_stored_range: ", layout_.params()[param].name,
                " is not stored on rank ", rank_);
  const size_t b = dtype_size(flat.dtype());
  char* dst = piece_bytes(flat, param);
  const size_t have = static_cast<size_t>(range->second - range->first) * b;
  const size_t pad = static_cast<size_t>(info.local_numel) * b - have;  // stays zero
  if (flat.placement() == Placement::host) {
    stream.synchronize();
    std::memcpy(dst, src, have);
    std::memset(dst + have, 0, pad);
    return;
  }
  if (have > 0) backend_.copy_async(dst, src, have, CopyKind::host_to_device, stream);
  if (pad > 0) backend_.memset_async(dst + have, 0, pad, stream);
  stream.synchronize();  // `src` may die after the call
}

}  // namespace moepeak
