// Shared by the `moepeak bench <name>` subcommands (one file each, cli/bench_*.cpp), nccl-tests
// style: every bench takes the same core flags, prints a `#`-commented header (what, host, date,
// world size) and a fixed-column table on stdout from rank 0, and with --json FILE writes the
// object of docs/design.md#machine-readable-outputs:
//   {"bench", "world_size", "shape": {...}, "rows": [{"schedule", "time_s", "peak_bytes":
//    {"total", <live set>...}, "bound_bytes", "max_rel_err", ...}], "host", "date"}
#pragma once

#include <chrono>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/measure/harness.h"
#include "core/runtime/memory_stats.h"

namespace moepeak::cli {

// The benches' measurements live in core/measure; cli/ keeps the flags and the printing.
using measure::bench_any_backend_options;
using measure::bench_backend_options;
using measure::bench_dtype;
using measure::Ceiling;
using measure::EventTimer;
using measure::fill_seeded;
using measure::filled;
using measure::max_over_ranks;
using measure::max_scaled_err;
using measure::measure_ceiling;
using measure::median;

// The flags every bench has: --config/--set, --warmup, --iters, --json.
struct BenchCommonArgs {
  ConfigArgs config;
  int warmup = 2;
  int iters = 5;
  std::string json_path;
};
void add_bench_common_options(CLI::App& sub, BenchCommonArgs& args);

// --dtype and --ceiling-size of the benches measured against a GEMM ceiling (gemm, attention):
// measure::measure_ceiling(backend, args.dtype, args.ceiling_size, bench).
struct CeilingArgs {
  std::string dtype;     // "" = bf16 on CUDA, f32 on the CPU
  int ceiling_size = 0;  // 0 = 8192 on CUDA, 1024 on the CPU
};
void add_ceiling_options(CLI::App& sub, CeilingArgs& args);

std::string now_utc();  // "2026-11-29 21:38:19 UTC"

// A shell word: quoted when it holds anything but [A-Za-z0-9_./=:,+@%-] (the commands tune
// prints and bench reach runs).
std::string shell_word(const std::string& s);

// Wall seconds on the steady clock since t0 (the I/O benches' timer).
double seconds_since(std::chrono::steady_clock::time_point t0);

// {"total": peak_total, "<live set>": that set's own peak, ...}
nlohmann::json peak_bytes_json(const MemoryStats& stats);

// Writes the object above (adding "host" and "date"); throws moepeak::Error naming the path.
void write_bench_json(const std::string& path, const std::string& bench, int world_size,
                      const nlohmann::json& shape, const nlohmann::json& rows);

// Bench subcommands registered on `moepeak bench` (each in its own cli/bench_<name>.cpp).
void register_bench_step(CLI::App& bench, Context& ctx);
void register_bench_sco(CLI::App& bench, Context& ctx);         // cli/bench_sco.cpp
void register_bench_vocab(CLI::App& bench, Context& ctx);       // cli/bench_vocab.cpp
void register_bench_adamw(CLI::App& bench, Context& ctx);       // cli/bench_adamw.cpp
void register_bench_dispatch(CLI::App& bench, Context& ctx);    // cli/bench_dispatch.cpp
void register_bench_overlap(CLI::App& bench, Context& ctx);     // cli/bench_overlap.cpp
void register_bench_gemm(CLI::App& bench, Context& ctx);        // cli/bench_gemm.cpp
void register_bench_attention(CLI::App& bench, Context& ctx);   // cli/bench_attention.cpp
void register_bench_checkpoint(CLI::App& bench, Context& ctx);  // cli/bench_checkpoint.cpp
void register_bench_data(CLI::App& bench, Context& ctx);        // cli/bench_data.cpp
void register_bench_reach(CLI::App& bench, Context& ctx);       // cli/bench_reach.cpp

}  // namespace moepeak::cli
