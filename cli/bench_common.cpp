// Helpers shared by the bench subcommands (see bench_common.h).
#include "cli/bench_common.h"

#include <ctime>
#include <fstream>

#include "core/error.h"

namespace moepeak::cli {

void add_bench_common_options(CLI::App& sub, BenchCommonArgs& args) {
  add_config_options(sub, args.config);
  sub.add_option("--warmup", args.warmup, "untimed repetitions first")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--iters", args.iters, "timed repetitions (the median is reported)")
      ->check(CLI::PositiveNumber);
  sub.add_option("--json", args.json_path,
                 "write the results as JSON (docs/design.md#machine-readable-outputs)");
}

void add_ceiling_options(CLI::App& sub, CeilingArgs& args) {
  sub.add_option("--dtype", args.dtype, "storage dtype (default bf16 on CUDA, f32 on the CPU)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  sub.add_option("--ceiling-size", args.ceiling_size,
                 "n of the n^3 ceiling GEMM (default 8192 on CUDA, 1024 on the CPU)")
      ->check(CLI::Range(64, 16384));
}

std::string shell_word(const std::string& s) {
  const bool plain = !s.empty() && s.find_first_not_of(
                                       "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                       "0123456789_./=:,+-@%") == std::string::npos;
  if (plain) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string now_utc() {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&t));
  return buf;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

nlohmann::json peak_bytes_json(const MemoryStats& stats) {
  nlohmann::json peak = {{"total", stats.peak_total()}};
  for (LiveSet s : kAllLiveSets) peak[std::string(live_set_name(s))] = stats.peak_per_set()[s];
  return peak;
}

void write_bench_json(const std::string& path, const std::string& bench, int world_size,
                      const nlohmann::json& shape, const nlohmann::json& rows) {
  nlohmann::json out = {{"bench", bench}, {"world_size", world_size}, {"shape", shape},
                        {"rows", rows},   {"host", process_host()},   {"date", now_utc()}};
  std::ofstream f(path);
  if (!(f << out.dump(2) << "\n")) MOEPEAK_INPUT_ERROR("cannot write the bench results to ", path);
}

}  // namespace moepeak::cli
