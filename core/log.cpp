#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <memory>
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

namespace {
struct Settings {
  spdlog::level::level_enum level = spdlog::level::info;
  int rank = 0, world_size = 1;
  bool all_ranks = false;
};
Settings& settings() {
  static Settings s;
  return s;
}
std::shared_ptr<spdlog::logger>& every_rank_logger() {
  static std::shared_ptr<spdlog::logger> logger;
  return logger;
}
void apply() {
  const Settings& s = settings();
  // One sink for both loggers, so their lines never interleave mid-line.
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("moepeak", sink);
  auto every = std::make_shared<spdlog::logger>("moepeak.every_rank", sink);
  std::string pattern = "[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] ";
  if (s.world_size > 1) {
    pattern += "[rank " + std::to_string(s.rank) + "/" + std::to_string(s.world_size) + "] ";
  }
  logger->set_pattern(pattern + "%v");
  every->set_pattern(pattern + "%v");
  spdlog::level::level_enum level = s.level;
  if (s.rank != 0 && !s.all_ranks && level < spdlog::level::warn) level = spdlog::level::warn;
  logger->set_level(level);
  every->set_level(s.level);
  spdlog::set_default_logger(logger);
  every_rank_logger() = every;
}
}  // namespace

void init(spdlog::level::level_enum level, int rank, int world_size, bool all_ranks) {
  settings() = Settings{level, rank, world_size, all_ranks};
  apply();
}

void set_level(spdlog::level::level_enum level) {
  settings().level = level;
  apply();
}

void set_ranks(int rank, int world_size) {
  settings().rank = rank;
  settings().world_size = world_size;
  apply();
}

spdlog::logger& every_rank() {
  if (!every_rank_logger()) apply();
  return *every_rank_logger();
}

}  // namespace moepeak::log
