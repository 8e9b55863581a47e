#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <string>

#include "core/error.h"

namespace moepeak::log {

spdlog::level::level_enum parse_level(std::string_view name) {
  if (name == "trace") return spdlog::level::trace;
  if (name == "debug") return spdlog::level::debug;
  if (name == "info") return spdlog::level::info;
  if (name == "warn") return spdlog::level::warn;
  if (name == "error") return spdlog::level::err;
  if (name == "off") return spdlog::level::off;
  MOEPEAK_THROW("unknown log level '", name, "' (expected trace, debug, info, warn, error or off)");
}

void init(spdlog::level::level_enum level, int rank, int world_size, bool all_ranks) {
  auto logger = spdlog::stderr_color_mt("moepeak");
  std::string pattern = "[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] ";
  if (world_size > 1) pattern += "[rank " + std::to_string(rank) + "/" + std::to_string(world_size) + "] ";
  logger->set_pattern(pattern + "%v");
  if (rank != 0 && !all_ranks && level < spdlog::level::warn) level = spdlog::level::warn;
  logger->set_level(level);
  spdlog::set_default_logger(logger);
}

}  // namespace moepeak::log
