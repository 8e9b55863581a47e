// Logging: spdlog, with rank 0 printing at the configured level and other ranks printing only
// warnings and errors unless `--log-all-ranks` is given. Every line carries the rank when W > 1.
//
//   moepeak::log::init(level, rank, world, all_ranks);   // once, from cli/
//   MOEPEAK_LOG_INFO("step {} loss {:.4f}", step, loss);  (or spdlog::info directly)
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace moepeak::log {

// Parses "trace" | "debug" | "info" | "warn" | "error" | "off"; throws moepeak::Error otherwise.
spdlog::level::level_enum parse_level(std::string_view name);

// Sets the default logger: stderr, pattern "[time] [level] [rank r/W] msg". Non-zero ranks get
// max(level, warn) unless all_ranks. May be called again (replaces the logger).
void init(spdlog::level::level_enum level, int rank, int world_size, bool all_ranks);
// Change one setting of the last init, keeping the others (the rank rule still applies).
void set_level(spdlog::level::level_enum level);
void set_ranks(int rank, int world_size);

}  // namespace moepeak::log
