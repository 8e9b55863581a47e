// HubLayout: the Hub tensors of a model and where each of its params lies in them — the one
// answer the Hugging Face import (core/checkpoint/hf_import.h), export (hf_export.h) and step
// dump (train_checkpoint.h) use. Each param's place is its family's HubPlacement (family.h):
// mixtral and qwen3_moe keep every param as a Hub tensor of its own name and shape; gpt-oss
// fuses each layer's experts into mlp.experts.gate_up_proj (E, H, 2I), down_proj (E, I, H) and
// their biases (E, 2I), (E, H).
//
//   HubLayout hub(layout);                         // ParamLayout's params, placed
//   for (const HubTensor& t : hub.tensors()) ...   // the Hub's tensors, in model order
//   hub.placement(p);                              // param p's HubPlacement
//   for_each_in_hub_order(hub.placement(p), dims, [](int64_t param_el, int64_t hub_el) { ... });
//
// The walks below visit a param's elements in increasing Hub order (the placements are nested,
// family.h), so a reader goes through the Hub tensor front to back and a writer writes it so.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/model/families/family.h"
#include "core/model/param_layout.h"

namespace moepeak {

struct HubTensor {
  std::string name;
  std::vector<int64_t> shape;
  bool mxfp4 = false;       // the family's released checkpoints may hold it as MXFP4 (family.h)
  std::vector<int> params;  // the params placed in it, in layout order
  int64_t numel() const;
};

class HubLayout {
 public:
  // Throws moepeak::Error (internal: a family's placements are wrong) when the params placed in
  // a Hub tensor disagree about its shape, do not add up to its size, leave it, or a placement
  // is not nested or has a largest-stride slice across two rows (family.h's NOTES).
  explicit HubLayout(const ParamLayout& layout);

  // In the order of their first params (the layout's order: model order).
  const std::vector<HubTensor>& tensors() const { return tensors_; }
  const HubPlacement& placement(int param) const { return placements_.at(param); }
  int tensor_of(int param) const { return tensor_of_.at(param); }
  // The Hub tensor called `name`, or -1.
  int find(const std::string& name) const;
  // Some Hub tensor may be MXFP4 (the family has a released MXFP4 form).
  bool has_mxfp4() const;
  // The tensor holds one param whole, row-major: a 1:1 name mapping (copy it as it is).
  bool is_whole(const HubTensor& t) const;

 private:
  std::vector<HubPlacement> placements_;
  std::vector<int> tensor_of_;
  std::vector<HubTensor> tensors_;
  std::unordered_map<std::string, int> index_;  // name -> tensors_ index
};

// The param's dims by decreasing stride (the nested order: outermost in the Hub tensor first).
std::vector<int> hub_order_dims(const HubPlacement& placement);

// The Hub element of the param's row-major element `index` (dims: the param's shape).
int64_t hub_element(const HubPlacement& placement, const std::vector<int64_t>& dims, int64_t index);

// Calls f(param_element, hub_element) for every element of the param, in increasing hub_element
// order (the param's dims walked in hub_order_dims' order). param_element is row-major over dims.
template <typename F>
void for_each_in_hub_order(const HubPlacement& placement, const std::vector<int64_t>& dims, F&& f) {
  const std::vector<int> order = hub_order_dims(placement);
  const int n = static_cast<int>(dims.size());
  for (int64_t d : dims) {
    if (d == 0) return;
  }
  std::vector<int64_t> row_major(static_cast<size_t>(n), 1);  // the param's own strides
  for (int k = n - 1; k > 0; --k) row_major[k - 1] = row_major[k] * dims[k];
  std::vector<int64_t> at(static_cast<size_t>(n), 0);  // index per dim
  int64_t param = 0, hub = placement.offset;
  // NOTES: an odometer over `order` (innermost = last): each step adds one dim's strides and
  // rewinds the dims that wrapped, so the walk costs O(1) per element.
  const int inner = n > 0 ? order[static_cast<size_t>(n - 1)] : -1;
  while (true) {
    if (n == 0) {
      f(param, hub);
      return;
    }
    for (int64_t i = 0; i < dims[inner]; ++i) {
      f(param + i * row_major[inner], hub + i * placement.strides[inner]);
    }
    int k = n - 2;
    for (; k >= 0; --k) {
      const int d = order[static_cast<size_t>(k)];
      if (++at[d] < dims[d]) {
        param += row_major[d];
        hub += placement.strides[d];
        break;
      }
      param -= (dims[d] - 1) * row_major[d];
      hub -= (dims[d] - 1) * placement.strides[d];
      at[d] = 0;
    }
    if (k < 0) return;
  }
}

// The placement of a param of `dims` as it lies in the MXFP4 decode of its Hub tensor X
// (mxfp4.h: the decoded [..., rows, cols] is X with its last two dims swapped). The Hub tensor
// needs >= 2 dims and a placement whose every stride steps along one dim of X without carrying
// into the next (true of gpt-oss's); Error otherwise.
HubPlacement mxfp4_decoded_placement(const HubPlacement& placement,
                                     const std::vector<int64_t>& dims);

}  // namespace moepeak
