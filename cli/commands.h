// The subcommands of the `moepeak` binary. Each cli/<name>.cpp registers one subcommand on the
// app and sets `ctx.action` when it is selected; main() runs the action after parsing, so errors
// in the action are reported (and exited on) in one place.
#pragma once

#include <CLI/CLI.hpp>

#include "core/comm/comm.h"
#include "core/config/config.h"
#include "core/plan/plan.h"

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace moepeak::cli {

// `moepeak train` stopped by SIGUSR1/SIGTERM at a step boundary with a checkpoint written: the
// job should be requeued and resumed (EX_TEMPFAIL; slurm/train.sbatch runs `scontrol requeue`).
inline constexpr int kExitRequeue = 75;

struct Context {
  std::string log_level;  // empty: runtime.log_level of the config (info without one)
  bool log_all_ranks = false;
  std::function<int()> action;  // set by the selected subcommand; returns the exit code
};

// --config FILE (repeatable; later files override earlier ones) and --set section.key=value.
struct ConfigArgs {
  std::vector<std::string> files;
  std::vector<std::string> overrides;
};
void add_config_options(CLI::App& sub, ConfigArgs& args);
// Loads the config and, unless --log-level was given, applies its runtime.log_level.
Config load_config_for_command(const ConfigArgs& args, const Context& ctx);
// Joins the job's ranks (mpirun, srun, or a world of one: init_process_group) and puts the rank
// into the log prefix. Commands that train call it; finalize_process_group() at their end.
RankInfo join_ranks();

void register_config_command(CLI::App& app, Context& ctx);
void register_train_command(CLI::App& app, Context& ctx);
void register_bench_command(CLI::App& app, Context& ctx);
void register_plan_command(CLI::App& app, Context& ctx);
void register_probe_command(CLI::App& app, Context& ctx);   // cli/probe_cmd.cpp
void register_tune_command(CLI::App& app, Context& ctx);    // cli/tune_cmd.cpp
void register_export_command(CLI::App& app, Context& ctx);  // cli/export_cmd.cpp
void register_data_command(CLI::App& app, Context& ctx);    // cli/data_cmd.cpp

// The plan table (nccl-tests style, `#` comment lines; cli/plan_cmd.cpp), also printed by
// `moepeak train` when it refuses to start.
void print_plan(const Plan& plan, std::FILE* out);

// Prints the --version text to stdout.
void print_version();

}  // namespace moepeak::cli
