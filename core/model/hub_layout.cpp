// The Hub tensors of a model and the placement of each param in them (hub_layout.h).
#include "core/model/hub_layout.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "core/error.h"

namespace moepeak {

namespace {

int64_t product(const std::vector<int64_t>& dims) {
  return std::accumulate(dims.begin(), dims.end(), int64_t{1}, std::multiplies<>());
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < dims.size(); ++i) out << (i ? ", " : "") << dims[i];
  out << ")";
  return out.str();
}

// Row-major strides of `dims`.
std::vector<int64_t> row_major_strides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (size_t k = dims.size(); k-- > 1;) s[k - 1] = s[k] * dims[k];
  return s;
}

// Checks family.h's NOTES for one placement of a param of `dims` (see HubLayout's constructor).
void check_placement(const std::string& param, const HubPlacement& p,
                     const std::vector<int64_t>& dims) {
  MOEPEAK_CHECK(p.strides.size() == dims.size(), param, ": ", p.strides.size(),
                " hub strides for a param of ", dims.size(), " dims");
  const int64_t size = product(p.shape);
  int64_t last = p.offset;
  for (size_t k = 0; k < dims.size(); ++k) {
    MOEPEAK_CHECK(p.strides[k] > 0, param, ": hub stride ", p.strides[k]);
    last += (dims[k] - 1) * p.strides[k];
  }
  MOEPEAK_CHECK(p.offset >= 0 && (product(dims) == 0 || last < size), param, " leaves ", p.tensor,
                " ", dims_text(p.shape), ": elements ", p.offset, "..", last);
  const std::vector<int> order = hub_order_dims(p);
  for (size_t k = 0; k + 1 < order.size(); ++k) {
    const int outer = order[k], inner = order[k + 1];
    MOEPEAK_CHECK(p.strides[outer] >= p.strides[inner] * dims[inner], param, ": its placement in ",
                  p.tensor, " is not nested (strides ", dims_text(p.strides), ")");
  }
  // One value of the largest-stride dim lies within one row of the Hub tensor.
  if (!order.empty() && !p.shape.empty() && product(dims) > 0) {
    const int outer = order[0];
    int64_t span = 0;  // the extent of one outer slice, less one
    for (size_t k = 0; k < dims.size(); ++k) {
      if (static_cast<int>(k) != outer) span += (dims[k] - 1) * p.strides[k];
    }
    const int64_t row = p.shape.back();
    for (int64_t v = 0; v < dims[outer]; ++v) {
      const int64_t first = p.offset + v * p.strides[outer];
      MOEPEAK_CHECK(first / row == (first + span) / row, param, ": slice ", v, " of its dim ",
                    outer, " crosses a row of ", p.tensor, " ", dims_text(p.shape));
    }
  }
}

}  // namespace

int64_t HubTensor::numel() const { return product(shape); }

HubLayout::HubLayout(const ParamLayout& layout) {
  const Family& family = family_of(layout.spec().family);
  const auto& params = layout.params();
  std::vector<int64_t> filled;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& info = params[i];
    const std::vector<int64_t>& dims = info.shape.dims();
    HubPlacement p = family.hub_placement(layout.spec(), info.piece, dims);
    check_placement(info.name, p, dims);
    auto [it, added] = index_.emplace(p.tensor, static_cast<int>(tensors_.size()));
    if (added) {
      tensors_.push_back({p.tensor, p.shape, p.mxfp4, {}});
      filled.push_back(0);
    }
    HubTensor& t = tensors_[static_cast<size_t>(it->second)];
    MOEPEAK_CHECK(t.shape == p.shape && t.mxfp4 == p.mxfp4, info.name, " places ", p.tensor, " as ",
                  dims_text(p.shape), ", an earlier param as ", dims_text(t.shape));
    t.params.push_back(static_cast<int>(i));
    filled[static_cast<size_t>(it->second)] += product(dims);
    tensor_of_.push_back(it->second);
    placements_.push_back(std::move(p));
  }
  for (size_t t = 0; t < tensors_.size(); ++t) {
    MOEPEAK_CHECK(filled[t] == tensors_[t].numel(), "the params placed in ", tensors_[t].name, " ",
                  dims_text(tensors_[t].shape), " hold ", filled[t], " of its ",
                  tensors_[t].numel(), " elements");
  }
}

int HubLayout::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

bool HubLayout::has_mxfp4() const {
  return std::any_of(tensors_.begin(), tensors_.end(), [](const HubTensor& t) { return t.mxfp4; });
}

bool HubLayout::is_whole(const HubTensor& t) const {
  if (t.params.size() != 1) return false;
  const HubPlacement& p = placements_.at(static_cast<size_t>(t.params[0]));
  return p.offset == 0 && p.strides == row_major_strides(p.shape) &&
         p.strides.size() == p.shape.size();
}

std::vector<int> hub_order_dims(const HubPlacement& placement) {
  std::vector<int> order(placement.strides.size());
  std::iota(order.begin(), order.end(), 0);
  // Stable: equal strides (extent-1 dims) keep the param's own order.
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return placement.strides[a] > placement.strides[b]; });
  return order;
}

int64_t hub_element(const HubPlacement& placement, const std::vector<int64_t>& dims,
                    int64_t index) {
  int64_t hub = placement.offset;
  for (size_t k = dims.size(); k-- > 0;) {
    hub += (index % dims[k]) * placement.strides[k];
    index /= dims[k];
  }
  return hub;
}

HubPlacement mxfp4_decoded_placement(const HubPlacement& p, const std::vector<int64_t>& dims) {
  const size_t n = p.shape.size();
  MOEPEAK_CHECK(n >= 2, p.tensor, " ", dims_text(p.shape), " has no two dims to swap");
  const std::vector<int64_t> from = row_major_strides(p.shape);
  std::vector<int64_t> decoded_shape = p.shape;
  std::swap(decoded_shape[n - 1], decoded_shape[n - 2]);
  const std::vector<int64_t> to = row_major_strides(decoded_shape);
  auto swapped = [&](size_t d) { return d == n - 1 ? n - 2 : d == n - 2 ? n - 1 : d; };
  HubPlacement q = p;
  q.shape = decoded_shape;
  // The offset as a multi-index of the Hub tensor (`reach`: the largest index each dim gets),
  // moved to the decoded one.
  std::vector<int64_t> reach(n);
  q.offset = 0;
  for (size_t d = 0; d < n; ++d) {
    reach[d] = p.offset / from[d] % p.shape[d];
    q.offset += reach[d] * to[swapped(d)];
  }
  for (size_t k = 0; k < p.strides.size(); ++k) {
    // Each stride steps along exactly one dim of the Hub tensor.
    size_t dim = n;
    for (size_t d = 0; d < n && dim == n; ++d) {
      if (p.strides[k] % from[d] == 0 && p.strides[k] / from[d] < p.shape[d]) dim = d;
    }
    MOEPEAK_CHECK(dim < n, p.tensor, ": hub stride ", p.strides[k],
                  " does not step along one dim of ", dims_text(p.shape));
    q.strides[k] = p.strides[k] / from[dim] * to[swapped(dim)];
    reach[dim] += p.strides[k] / from[dim] * (dims.at(k) - 1);
  }
  // Without a carry from one dim into the next, the multi-indices map one to one.
  for (size_t d = 0; d < n; ++d) {
    MOEPEAK_CHECK(reach[d] < p.shape[d], p.tensor, ": a placement carries across its dim ", d);
  }
  return q;
}

}  // namespace moepeak
