// Logging: spdlog, with rank 0 printing at the configured level and other ranks printing only
// warnings and errors unless `--log-all-ranks` is given. Every line carries the rank when W > 1.
//
//   moepeak::log::init(level, rank, world, all_ranks);   // once, from cli/
//   spdlog::info("step {} loss {:.4f}", step, loss);
//   log::every_rank().info("rank {} on {}", rank, host);  // printed by every rank
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

// The logger for the few lines that differ per rank and matter on each (where the rank runs, what
// it is bound to): every rank prints them at the configured level, whatever the rank rule. Same
// stream and pattern as the default logger; valid until the next init/set_*.
spdlog::logger& every_rank();

}  // namespace moepeak::log
