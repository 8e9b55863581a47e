// Helpers shared by the bench subcommands (see bench_common.h).
#include "cli/bench_common.h"

#include <algorithm>
#include <ctime>
#include <fstream>
#include <thread>

#include "core/error.h"

namespace moepeak::cli {

void add_bench_common_options(CLI::App& sub, BenchCommonArgs& args) {
  add_config_options(sub, args.config);
  sub.add_option("--warmup", args.warmup, "untimed repetitions first")->check(CLI::NonNegativeNumber);
  sub.add_option("--iters", args.iters, "timed repetitions (the median is reported)")
      ->check(CLI::PositiveNumber);
  sub.add_option("--json", args.json_path, "write the results as JSON (DESIGN.md §10)");
}

BackendOptions bench_backend_options(const Config& cfg, const RankInfo& ranks) {
  BackendOptions o;
  o.kind = BackendKind::cpu;
  o.device_memory = cfg.runtime.device_memory_bytes().value_or(0);
  o.cpu_threads = static_cast<int>(cfg.runtime.threads);
  if (o.cpu_threads == 0 && ranks.local_size > 1) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    o.cpu_threads = std::max(1, cores / ranks.local_size);
  }
  return o;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string now_utc() {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&t));
  return buf;
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
  if (!(f << out.dump(2) << "\n")) MOEPEAK_THROW("cannot write the bench results to ", path);
}

}  // namespace moepeak::cli
