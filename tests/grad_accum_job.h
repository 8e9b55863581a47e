// The jobs of the gradient-accumulation tests (tests/model/test_grad_accum.cpp on one rank,
// tests/parallel/test_train_grad_accum.cpp on four and two): a token file of random uint16 tokens
// below 32 read in sequential windows, so m micro-batches of B are exactly the windows of one batch
// of m B, and the tiny model on it with a given (B, m); and the tiny preset itself (the embedded
// default job, on the copy task, whose sequence j is also the same for any B) with a given (B, m).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/config/config.h"

namespace moepeak::test_support {

// Writes DIR/tokens.bin (20,000 tokens) and returns its path.
inline std::string write_accum_tokens(const std::filesystem::path& dir) {
  std::mt19937 rng(7);
  std::vector<uint16_t> tokens(20000);
  for (uint16_t& t : tokens) t = static_cast<uint16_t>(rng() % 32);
  const std::filesystem::path path = dir / "tokens.bin";
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(tokens.size() * sizeof(uint16_t)));
  return path.string();
}

// `steps` steps of `accum` micro-batches of `batch` sequences of 32 tokens from `tokens`.
inline Config accum_config(const std::filesystem::path& run_dir, const std::string& tokens,
                           int64_t batch, int64_t accum, int64_t steps) {
  return load_config(
      {}, {"job.run_dir=" + run_dir.string(), "training.steps=" + std::to_string(steps),
           "training.seq_len=32", "training.batch_size=" + std::to_string(batch),
           "training.grad_accum_steps=" + std::to_string(accum), "training.dataset=\"bin\"",
           "training.dataset_path=\"" + tokens + "\"", "model.vocab_size=32",
           "metrics.progress=\"off\"", "runtime.log_level=\"warn\""});
}

// The tiny preset (the embedded default job: the copy task, T = 128, vocabulary 256) for `steps`
// steps of `accum` micro-batches of `batch` sequences, and `extra` settings on top.
inline Config copy_accum_config(const std::filesystem::path& run_dir, int64_t batch, int64_t accum,
                                int64_t steps, std::vector<std::string> extra = {}) {
  std::vector<std::string> settings = {"job.run_dir=" + run_dir.string(),
                                       "training.steps=" + std::to_string(steps),
                                       "training.batch_size=" + std::to_string(batch),
                                       "training.grad_accum_steps=" + std::to_string(accum),
                                       "metrics.progress=\"off\"",
                                       "runtime.log_level=\"warn\""};
  settings.insert(settings.end(), extra.begin(), extra.end());
  return load_config({}, settings);
}

}  // namespace moepeak::test_support
