// The presets (configs/*.toml) as the plan tests lay them on H200s: 141 GB of device memory and
// 250 GB of pinned host memory per rank, and with `bounded` the four bounded schedules
// (PipelinedLLEP, Ring-DTP, SCO, OffloadStreamAdamW). Used by test_plan_reach and
// test_fastest_layouts.
#pragma once

#include <string>
#include <vector>

#include "core/config/config.h"
#include "tests/source_dir.h"

namespace moepeak::test_support {

// `extra`: more --set overrides (a layout, a batch, a context), after the H200 and schedule ones.
inline Config h200_preset(const std::string& model, bool bounded,
                          const std::vector<std::string>& extra = {}) {
  std::vector<std::string> sets = {"runtime.device_memory=141GB", "runtime.pinned_memory=250GB"};
  if (bounded) {
    for (const char* s : {"schedules.dispatch=pipelined_llep", "schedules.vocab=ring_dtp",
                          "schedules.checkpoint=sco", "optimizer.placement=offload_stream"}) {
      sets.emplace_back(s);
    }
  }
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config({source_dir() + "/configs/" + model + ".toml"}, sets);
}

}  // namespace moepeak::test_support
