// What a live set's choice point (dispatch_choice.h, vocab_choice.h, checkpoint_choice.h,
// optimizer_choice.h) returns beside the schedule object it makes: the bytes of the configured
// schedule, the formula that gave them and the schedule's name, exactly as `moepeak plan` prints
// them (docs/plan.md#the-terms-and-the-function-behind-each). The planner copies these into its
// terms and knows no per-schedule function itself.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

namespace moepeak::schedules {

// One device term: `bytes` from `function` ("dispatch_standard_bytes(N=96, k=2, ...)"), for the
// schedule as the config spells it ("standard").
struct ScheduleBytes {
  uint64_t bytes = 0;
  std::string function;
  std::string schedule;
};

// One pinned host term ("optimizer_state", "optimizer_grad_copy", "sco_boundaries").
struct HostBytes {
  std::string name;
  uint64_t bytes = 0;
  std::string function;
};

// "N=96, k=2, H=32": the arguments of a formula as the plan prints them.
inline std::string formula_args(std::initializer_list<std::pair<const char*, int64_t>> kv) {
  std::string s;
  for (const auto& [k, v] : kv)
    s += (s.empty() ? "" : ", ") + std::string(k) + "=" + std::to_string(v);
  return s;
}

}  // namespace moepeak::schedules
