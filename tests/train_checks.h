// Checks the trainer's tests share (one process or W ranks): how many steps a run's metrics file
// logged, and that a run resumed from one of its checkpoints ends bit for bit as it did.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/checkpoint/train_checkpoint.h"
#include "core/config/config.h"
#include "core/train/trainer.h"

namespace moepeak::test_support {

// Non-empty lines (one per logged step) of a metrics.jsonl.
inline int metrics_line_count(const std::filesystem::path& file) {
  std::ifstream in(file);
  int lines = 0;
  for (std::string line; std::getline(in, line);) lines += !line.empty();
  return lines;
}

// Runs `cfg` as job `name` resumed from `full`'s checkpoint of step `from` and expects the losses
// of the steps after it to be `full`'s, bit for bit.
inline void expect_resumes_bit_for_bit(Config cfg, const std::string& name, const TrainResult& full,
                                       int64_t from) {
  cfg.job.name = name;
  TrainOptions options;
  options.resume_from =
      (std::filesystem::path(full.run_dir) / "checkpoints" / checkpoint_dir_name(from)).string();
  const TrainResult resumed = train(cfg, options);
  const size_t expected = full.losses.size() - static_cast<size_t>(from);
  ASSERT_EQ(resumed.losses.size(), expected);
  for (size_t i = 0; i < expected; ++i) {
    EXPECT_EQ(resumed.losses[i], full.losses[static_cast<size_t>(from) + i])
        << "step " << from + 1 + static_cast<int64_t>(i);
  }
}

}  // namespace moepeak::test_support
