// Why a global batch cannot be trained in a parallel layout (docs/parallelism.md): the rules
// DecoderModel::check_layout enforces, as a kind (what the layout search folds its rows by,
// core/plan/layout_search.h) and a message naming the numbers.
//
//   std::string why;
//   if (layout_defect(model, B, T, degrees, &why) != LayoutDefect::none) ...  // why: the numbers
//
// The rules, tested in this order (the first one broken is named):
//   experts      E % Ep == 0                    model.num_local_experts over expert_parallel
//   batch        B % (W/Sp) == 0                the batch over the W/Sp sequence groups
//   query_heads  nh % Sp == 0                   the sequence-parallel attention's
//   seq_len      T % Sp == 0                      (schedules::UlyssesLayout::defect), on the
//   kv_group     nh % nkv == 0                    Sp ranks of a sequence group
//   kv_heads     nkv % Sp == 0 or Sp % nkv == 0
// Test: ctest -R 'test_plan_layout_search|test_plan_cli'
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/config/config.h"
#include "core/model/parallel_layout.h"

namespace moepeak {

// `other`: none of the rules above, a caller's name for another reason a layout was rejected
// (the layout search's for a plan that throws); layout_defect never returns it.
enum class LayoutDefect { none, experts, batch, query_heads, seq_len, kv_group, kv_heads, other };

// A stable key per kind: "none", "experts", "batch", "query_heads", "seq_len", "kv_group",
// "kv_heads", "other" (the search's --json).
std::string_view layout_defect_name(LayoutDefect d);

// The first rule above that a batch of `batch` sequences of `seq_len` tokens breaks in the layout
// (none: it can be trained so), with `why` set to the message naming the numbers. Throws
// moepeak::Error (internal) unless every degree divides W, and for shapes that are not positive.
LayoutDefect layout_defect(const ModelConfig& model, int64_t batch, int64_t seq_len,
                           const ParallelDegrees& degrees, std::string* why = nullptr);

}  // namespace moepeak
