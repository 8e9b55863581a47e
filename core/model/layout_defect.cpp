// layout_defect: the layout rules of DecoderModel::check_layout (see layout_defect.h).
#include "core/model/layout_defect.h"

#include "core/error.h"
#include "core/model/param_layout.h"
#include "ops/schedules/ulysses.h"

namespace moepeak {

std::string_view layout_defect_name(LayoutDefect d) {
  switch (d) {
    case LayoutDefect::none:
      return "none";
    case LayoutDefect::experts:
      return "experts";
    case LayoutDefect::batch:
      return "batch";
    case LayoutDefect::query_heads:
      return "query_heads";
    case LayoutDefect::seq_len:
      return "seq_len";
    case LayoutDefect::kv_group:
      return "kv_group";
    case LayoutDefect::kv_heads:
      return "kv_heads";
    case LayoutDefect::other:
      return "other";
  }
  MOEPEAK_THROW("layout_defect_name: unknown LayoutDefect ", static_cast<int>(d));
}

LayoutDefect layout_defect(const ModelConfig& model, int64_t batch, int64_t seq_len,
                           const ParallelDegrees& d, std::string* why) {
  MOEPEAK_CHECK(d.world >= 1 && d.expert >= 1 && d.sequence >= 1 && d.data_shard >= 1 &&
                    d.world % d.expert == 0 && d.world % d.sequence == 0 &&
                    d.world % d.data_shard == 0,
                "degrees ", d.str(), " do not divide W = ", d.world);
  MOEPEAK_CHECK(batch >= 1, "layout_defect: batch ", batch, " (a positive batch expected)");
  auto broken = [&](LayoutDefect defect, auto&&... message) {
    if (why) *why = detail::concat(message...);
    return defect;
  };
  if (model.num_local_experts % d.expert != 0) {
    return broken(LayoutDefect::experts, "expert parallelism over Ep = ", d.expert,
                  " ranks needs model.num_local_experts (", model.num_local_experts,
                  ") divisible by Ep (parallelism.expert_parallel)");
  }
  const int groups = d.sequence_groups();
  if (batch % groups != 0) {
    return broken(LayoutDefect::batch, "sequence parallelism over Sp = ", d.sequence,
                  " of W = ", d.world, " ranks gives ", groups,
                  " sequence groups, which need training.batch_size (", batch,
                  ") divisible by W/Sp = ", groups);
  }
  const AttentionSpec& a = cached_param_layout(model).spec().layers.front().attention;
  switch (schedules::UlyssesLayout::defect(seq_len, d.sequence, a.heads, a.kv_heads, why)) {
    case schedules::UlyssesDefect::none:
      return LayoutDefect::none;
    case schedules::UlyssesDefect::query_heads:
      return LayoutDefect::query_heads;
    case schedules::UlyssesDefect::seq_len:
      return LayoutDefect::seq_len;
    case schedules::UlyssesDefect::kv_group:
      return LayoutDefect::kv_group;
    case schedules::UlyssesDefect::kv_heads:
      return LayoutDefect::kv_heads;
  }
  MOEPEAK_THROW("layout_defect: unknown UlyssesDefect");
}

}  // namespace moepeak
