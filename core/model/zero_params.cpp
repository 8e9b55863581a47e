// ZeroParamStore: ZeRO-3 shards of the dense parameters and whole local experts in one flat
// weights and one flat grads buffer per rank; gathered groups for use (see zero_params.h).
#include "core/model/zero_params.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/model/param_init.h"
#include "ops/elementwise.h"
#include "ops/op_common.h"

namespace moepeak {
namespace {

int64_t align_up(int64_t n) {
  constexpr int64_t a = ParamLayout::kAlignElements;
  return (n + a - 1) / a * a;
}

int64_t shard_size(int64_t numel, int world) { return (numel + world - 1) / world; }

void check_experts_divisible(const ModelConfig& model, int world) {
  if (world < 1 || model.num_local_experts % world != 0) {
    MOEPEAK_INPUT_ERROR("ZeRO-3 with expert parallelism needs num_local_experts (E = ",
                        model.num_local_experts, ") divisible by the world size (W = ", world, ")");
  }
}

// Expert index of every param (-1 for dense ones).
std::vector<int> expert_of(const ParamLayout& layout) {
  std::vector<int> e(layout.params().size(), -1);
  for (const LayerParamIndex& L : layout.layers) {
    for (size_t j = 0; j < L.w1.size(); ++j) {
      e[L.w1[j]] = e[L.w2[j]] = e[L.w3[j]] = static_cast<int>(j);
    }
  }
  return e;
}

// What rank `rank` stores of param i: elements [first, first + numel) of the flattened tensor
// (numel = 0: nothing). Dense: the ZeRO-3 slice [r*s, r*s + s) (the part past n is padding);
// expert: all of it on the owner; vocabulary rows: rows [floor(rV/W), floor((r+1)V/W)).
struct Extent {
  int64_t first = 0, numel = 0;
  bool rows = false;
};
Extent extent_of(const ParamLayout& layout, const std::vector<int>& expert, size_t i,
                 int experts_per_rank, int world, int rank, LmHeadSharding lm_head) {
  const int64_t n = layout.params()[i].shape.numel();
  if (expert[i] >= 0) {
    if (expert[i] / experts_per_rank != rank) return {};
    return {0, n, false};
  }
  if (lm_head == LmHeadSharding::vocab_rows && static_cast<int>(i) == layout.lm_head) {
    const Shape& shape = layout.params()[i].shape;
    const auto [begin, end] = lm_head_rows(shape[0], world, rank);
    return {begin * shape[1], (end - begin) * shape[1], true};
  }
  const int64_t s = shard_size(n, world);
  return {rank * s, s, false};
}

// Elements of rank `rank`'s flat buffers.
int64_t local_elements(const ParamLayout& layout, int experts_per_rank, int world, int rank,
                       LmHeadSharding lm_head) {
  std::vector<int> expert = expert_of(layout);
  int64_t total = 0;
  for (size_t i = 0; i < expert.size(); ++i) {
    total += align_up(extent_of(layout, expert, i, experts_per_rank, world, rank, lm_head).numel);
  }
  return total;
}

uint64_t footprint(int64_t elements, DType dtype) {
  if (elements == 0) return 0;
  return DeviceArena::footprint(static_cast<uint64_t>(elements) * dtype_size(dtype));
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

std::vector<std::vector<int>> zero_gather_groups(const ParamLayout& layout,
                                                 LmHeadSharding lm_head) {
  std::vector<std::vector<int>> groups;
  groups.push_back({layout.embed});
  for (const LayerParamIndex& L : layout.layers) {
    groups.push_back({L.input_norm, L.q, L.k, L.v, L.o, L.post_norm, L.gate});
  }
  if (lm_head == LmHeadSharding::vocab_rows)
    groups.push_back({layout.final_norm});
  else
    groups.push_back({layout.final_norm, layout.lm_head});
  return groups;
}

int64_t zero_persistent_elements(const ModelConfig& model, int world_size, LmHeadSharding lm_head) {
  check_experts_divisible(model, world_size);
  ParamLayout layout(model);
  int per_rank = static_cast<int>(model.num_local_experts / world_size);
  int64_t largest = 0;
  for (int r = 0; r < world_size; ++r) {
    largest = std::max(largest, local_elements(layout, per_rank, world_size, r, lm_head));
  }
  return largest;
}

ZeroBytes zero_persistent_bytes(const ModelConfig& model, DType dtype, int world_size,
                                LmHeadSharding lm_head) {
  uint64_t b = footprint(zero_persistent_elements(model, world_size, lm_head), dtype);
  return ZeroBytes{b, b};
}

ZeroBytes zero_gathered_bytes(const ModelConfig& model, DType dtype, int world_size,
                              std::span<const int> params, GatherParts parts) {
  ParamLayout layout(model);
  std::vector<int> expert = expert_of(layout);
  int64_t elements = 0;
  for (int p : params) {
    MOEPEAK_CHECK(p >= 0 && p < static_cast<int>(expert.size()), "no parameter ", p);
    if (expert[p] >= 0) continue;
    elements += align_up(world_size * shard_size(layout.params()[p].shape.numel(), world_size));
  }
  if (world_size == 1) return ZeroBytes{};  // views of the stored tensors
  uint64_t b = footprint(elements, dtype);
  return ZeroBytes{parts == GatherParts::grads ? 0 : b, parts == GatherParts::values ? 0 : b};
}

ZeroBytes zero_largest_gathered_bytes(const ModelConfig& model, DType dtype, int world_size,
                                      LmHeadSharding lm_head) {
  ZeroBytes best;
  for (const auto& g : zero_gather_groups(ParamLayout(model), lm_head)) {
    ZeroBytes b = zero_gathered_bytes(model, dtype, world_size, g);
    if (b.total() > best.total()) best = b;
  }
  return best;
}

ZeroParamStore::ZeroParamStore(Backend& backend, const ModelConfig& model, DType dtype, Comm& comm,
                               LmHeadSharding lm_head)
    : layout_(model),
      dtype_(dtype),
      lm_head_(lm_head),
      backend_(backend),
      comm_(comm),
      rank_(comm.rank()),
      world_(comm.world_size()) {
  check_experts_divisible(model, world_);
  MOEPEAK_CHECK(dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16,
                "parameters must be f32, f64 or bf16, not ", dtype_name(dtype));
  const int per_rank = static_cast<int>(model.num_local_experts / world_);
  std::vector<int> expert = expert_of(layout_);
  info_.resize(expert.size());
  int64_t total = 0;
  for (size_t i = 0; i < expert.size(); ++i) {
    Info& info = info_[i];
    info.expert = expert[i];
    const Extent e = extent_of(layout_, expert, i, per_rank, world_, rank_, lm_head_);
    info.rows = e.rows;
    if (e.numel == 0 && info.expert >= 0) continue;  // another rank's expert
    info.first = e.first;
    info.local_numel = e.numel;
    info.offset = total;
    total += align_up(info.local_numel);
  }
  MOEPEAK_CHECK(total == local_elements(layout_, per_rank, world_, rank_, lm_head_),
                "ZeRO-3 layout drift");
  values_ =
      OwnedTensor::device(backend, Shape{total}, dtype, LiveSet::weights, "ZeRO-3 weight shards");
  grads_ =
      OwnedTensor::device(backend, Shape{total}, dtype, LiveSet::grads, "ZeRO-3 gradient shards");
  Stream& stream = backend.default_stream();
  backend.memset_async(values_.data(), 0, values_.nbytes(), stream);
  backend.memset_async(grads_.data(), 0, grads_.nbytes(), stream);
  stream.synchronize();
  for (size_t i = 0; i < info_.size(); ++i) {
    if (info_[i].offset < 0) continue;
    int p = static_cast<int>(i);
    pieces_.push_back(LocalPiece{p, piece(values_.view(), p), piece(grads_.view(), p),
                                 layout_.params()[i].is_norm, info_[i].expert >= 0});
  }
}

int ZeroParamStore::expert_owner(int param) const {
  int e = info_.at(param).expert;
  if (e < 0) return -1;
  int per_rank = static_cast<int>(layout_.layers.front().w1.size()) / world_;
  return e / per_rank;
}

Tensor ZeroParamStore::piece(const Tensor& flat, int param) const {
  const Info& info = info_.at(param);
  MOEPEAK_CHECK(flat.numel() == values_.view().numel() && flat.dtype() == dtype_,
                "a flat buffer laid out like this rank's parameters has ", values_.view().numel(),
                " elements of ", dtype_name(dtype_), ", not ", flat.str());
  MOEPEAK_CHECK(info.offset >= 0, layout_.params()[param].name, " is expert ", info.expert,
                " of rank ", expert_owner(param), ", not stored on rank ", rank_);
  char* base = static_cast<char*>(flat.data()) + info.offset * dtype_size(dtype_);
  const Shape& full = layout_.params()[param].shape;
  Shape shape = info.expert >= 0 ? full
                : info.rows      ? Shape{info.local_numel / full[1], full[1]}
                                 : Shape{info.local_numel};
  return Tensor(base, shape, dtype_, Placement::device, &backend_);
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
      double v = param_init::element(seed, static_cast<uint64_t>(piece.param), piece.is_norm,
                                     initializer_range, j);
      param_init::store(dtype_, v, host.data() + (info.offset + j - begin) * b);
    }
  }
  backend_.copy_async(values_.data(), host.data(), host.size(), CopyKind::host_to_device, stream);
  stream.synchronize();  // `host` dies here
}

void ZeroParamStore::zero_grads(Stream& stream) {
  backend_.memset_async(grads_.data(), 0, grads_.nbytes(), stream);
}

ZeroParamStore::GatheredGroup ZeroParamStore::gather(std::span<const int> params, Stream& stream,
                                                     GatherParts parts) const {
  GatheredGroup g;
  g.store_ = this;
  g.parts_ = parts;
  g.params_.assign(params.begin(), params.end());
  g.slot_.assign(info_.size(), -1);
  int64_t total = 0;
  for (int p : params) {
    MOEPEAK_CHECK(p >= 0 && p < static_cast<int>(info_.size()), "gather: no parameter ", p);
    MOEPEAK_CHECK(g.slot_[p] < 0, "gather: ", layout_.params()[p].name, " named twice");
    MOEPEAK_CHECK(!info_[p].rows, "gather: ", layout_.params()[p].name,
                  " is stored by vocabulary rows (Ring-DTP) and never gathered; use local_value");
    if (info_[p].expert >= 0) {
      local_value(p);  // throws unless it is one of this rank's experts
      g.slot_[p] = 0;  // marks it present; experts are read from the store
      continue;
    }
    g.slot_[p] = total;
    total += align_up(world_ * info_[p].local_numel);
  }
  // NOTES: with one rank a shard is the whole tensor, so the group reads and accumulates into
  // the store itself (value()/grad() check world_ before they look at the buffers).
  if (total == 0 || world_ == 1) return g;
  const size_t b = dtype_size(dtype_);
  if (parts != GatherParts::grads) {
    g.values_ = OwnedTensor::device(backend_, Shape{total}, dtype_, LiveSet::weights,
                                    "ZeRO-3 gathered weights");
    for (int p : params) {
      if (info_[p].expert >= 0) continue;
      char* dst = static_cast<char*>(g.values_.data()) + g.slot_[p] * b;
      comm_.all_gather(local_value(p).data(), dst, static_cast<size_t>(info_[p].local_numel),
                       dtype_, stream);
    }
  }
  if (parts != GatherParts::values) {
    g.grads_ = OwnedTensor::device(backend_, Shape{total}, dtype_, LiveSet::grads,
                                   "ZeRO-3 gathered grads");
    backend_.memset_async(g.grads_.data(), 0, g.grads_.nbytes(), stream);
  }
  return g;
}

Tensor ZeroParamStore::GatheredGroup::value(int param) const {
  MOEPEAK_CHECK(store_ != nullptr, "GatheredGroup: empty group");
  MOEPEAK_CHECK(param >= 0 && param < static_cast<int>(slot_.size()) && slot_[param] >= 0,
                "GatheredGroup: parameter ", param, " was not gathered");
  const Shape& shape = store_->layout_.params()[param].shape;
  if (store_->is_expert(param)) return store_->local_value(param);
  MOEPEAK_CHECK(parts_ != GatherParts::grads,
                "GatheredGroup: ", store_->layout_.params()[param].name,
                " was gathered for its gradient only");
  if (store_->world_ == 1) return store_->local_value(param).reshape(shape);
  char* base = static_cast<char*>(values_.data()) + slot_[param] * dtype_size(store_->dtype_);
  return Tensor(base, shape, store_->dtype_, Placement::device, &store_->backend_);
}

Tensor ZeroParamStore::GatheredGroup::grad(int param) const {
  MOEPEAK_CHECK(store_ != nullptr, "GatheredGroup: empty group");
  MOEPEAK_CHECK(param >= 0 && param < static_cast<int>(slot_.size()) && slot_[param] >= 0,
                "GatheredGroup: parameter ", param, " was not gathered");
  const Shape& shape = store_->layout_.params()[param].shape;
  if (store_->is_expert(param)) return store_->local_grad(param);
  MOEPEAK_CHECK(parts_ != GatherParts::values,
                "GatheredGroup: ", store_->layout_.params()[param].name,
                " was gathered without its gradient");
  if (store_->world_ == 1) return store_->local_grad(param).reshape(shape);
  char* base = static_cast<char*>(grads_.data()) + slot_[param] * dtype_size(store_->dtype_);
  return Tensor(base, shape, store_->dtype_, Placement::device, &store_->backend_);
}

void ZeroParamStore::GatheredGroup::reduce_scatter_grads(Stream& stream) {
  MOEPEAK_CHECK(store_ != nullptr, "GatheredGroup: empty group");
  MOEPEAK_CHECK(parts_ != GatherParts::values,
                "GatheredGroup: reduce_scatter_grads of a group gathered without gradients");
  if (store_->world_ == 1) return;  // the grads were accumulated in place
  int64_t largest = 0;
  for (int p : params_) {
    if (!store_->is_expert(p)) largest = std::max(largest, store_->info_[p].local_numel);
  }
  if (largest == 0) return;
  OwnedTensor tmp = OwnedTensor::device(store_->backend_, Shape{largest}, store_->dtype_,
                                        LiveSet::workspace, "ZeRO-3 reduce-scatter temporary");
  const size_t b = dtype_size(store_->dtype_);
  for (int p : params_) {
    if (store_->is_expert(p)) continue;
    int64_t s = store_->info_[p].local_numel;
    const char* src = static_cast<const char*>(grads_.data()) + slot_[p] * b;
    store_->comm_.reduce_scatter(src, tmp.data(), static_cast<size_t>(s), store_->dtype_,
                                 ReduceOp::sum, stream);
    Tensor part(tmp.data(), Shape{s}, store_->dtype_, Placement::device, &store_->backend_);
    ops::add(store_->local_grad(p), part, store_->local_grad(p), stream);  // shard += part
  }
  // `tmp` is released here; its last uses are queued on `stream`, as are its next owner's.
}

std::vector<char> ZeroParamStore::gather_full(int param, Stream& stream) const {
  return gather_full(param, values_.view(), stream);
}

std::vector<char> ZeroParamStore::gather_full(int param, const Tensor& flat, Stream& stream) const {
  MOEPEAK_CHECK(param >= 0 && param < static_cast<int>(info_.size()), "no parameter ", param);
  const Info& info = info_[param];
  const size_t b = dtype_size(dtype_);
  const int64_t n = layout_.params()[param].shape.numel();
  std::vector<char> full(static_cast<size_t>(n) * b);
  if (info.rows) {
    // Ranks hold floor or ceil(V/W) rows: pad every part to the largest for one all_gather.
    int64_t most = 0;
    for (int r = 0; r < world_; ++r) {
      const auto [begin, end] = lm_head_rows(layout_.params()[param].shape[0], world_, r);
      most = std::max(most, end - begin);
    }
    const int64_t H = layout_.params()[param].shape[1];
    OwnedTensor mine = OwnedTensor::device(backend_, Shape{most * H}, dtype_, LiveSet::workspace,
                                           "vocabulary rows gather_full send");
    OwnedTensor all = OwnedTensor::device(backend_, Shape{world_ * most * H}, dtype_,
                                          LiveSet::workspace, "vocabulary rows gather_full");
    backend_.copy_async(mine.data(), piece(flat, param).data(),
                        static_cast<size_t>(info.local_numel) * b, CopyKind::device_to_device,
                        stream);
    comm_.all_gather(mine.data(), all.data(), static_cast<size_t>(most * H), dtype_, stream);
    std::vector<char> padded(all.nbytes());
    backend_.copy_async(padded.data(), all.data(), padded.size(), CopyKind::device_to_host, stream);
    stream.synchronize();
    for (int r = 0; r < world_; ++r) {
      const auto [begin, end] = lm_head_rows(layout_.params()[param].shape[0], world_, r);
      std::copy_n(padded.data() + static_cast<size_t>(r * most * H) * b,
                  static_cast<size_t>((end - begin) * H) * b,
                  full.data() + static_cast<size_t>(begin * H) * b);
    }
    return full;
  }
  if (info.expert < 0) {
    OwnedTensor tmp = OwnedTensor::device(backend_, Shape{world_ * info.local_numel}, dtype_,
                                          LiveSet::workspace, "ZeRO-3 gather_full");
    comm_.all_gather(piece(flat, param).data(), tmp.data(), static_cast<size_t>(info.local_numel),
                     dtype_, stream);
    backend_.copy_async(full.data(), tmp.data(), full.size(), CopyKind::device_to_host, stream);
    stream.synchronize();
    return full;
  }
  const int owner = expert_owner(param);
  OwnedTensor tmp =
      OwnedTensor::device(backend_, Shape{n}, dtype_, LiveSet::workspace, "ZeRO-3 gather_full");
  if (owner == rank_) {
    backend_.copy_async(tmp.data(), piece(flat, param).data(), full.size(),
                        CopyKind::device_to_device, stream);
  }
  comm_.broadcast(tmp.data(), static_cast<size_t>(n), dtype_, owner, stream);
  backend_.copy_async(full.data(), tmp.data(), full.size(), CopyKind::device_to_host, stream);
  stream.synchronize();
  return full;
}

void ZeroParamStore::load_full(int param, const void* full, Stream& stream) {
  load_full(param, full, values_.view(), stream);
}

void ZeroParamStore::load_full(int param, const void* full, const Tensor& flat, Stream& stream) {
  MOEPEAK_CHECK(param >= 0 && param < static_cast<int>(info_.size()), "no parameter ", param);
  const Info& info = info_[param];
  if (info.offset < 0) return;  // another rank's expert
  const size_t b = dtype_size(dtype_);
  const int64_t n = layout_.params()[param].shape.numel();
  Tensor dst = piece(flat, param);
  if (info.expert >= 0) {
    backend_.copy_async(dst.data(), full, static_cast<size_t>(n) * b, CopyKind::host_to_device,
                        stream);
  } else {
    int64_t begin = std::min(n, info.first);
    int64_t end = std::min(n, begin + info.local_numel);
    if (end > begin) {
      backend_.copy_async(dst.data(), static_cast<const char*>(full) + begin * b,
                          static_cast<size_t>(end - begin) * b, CopyKind::host_to_device, stream);
    }
    if (end - begin < info.local_numel) {  // padding stays zero
      backend_.memset_async(static_cast<char*>(dst.data()) + (end - begin) * b, 0,
                            static_cast<size_t>(info.local_numel - (end - begin)) * b, stream);
    }
  }
  stream.synchronize();  // `full` may die after the call
}

}  // namespace moepeak
