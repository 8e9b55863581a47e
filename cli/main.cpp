// moepeak: one binary for bounded-memory long-context MoE training.
//
//   moepeak --version
//   moepeak config show [--config F]... [--set section.key=value]...
//   moepeak plan [--config F]... [--set section.key=value]... [-n W] [--json FILE] [--max-context]
//   moepeak probe [--ranks-per-node N] [--output probe.toml] [--json FILE] [--no-bench]
//                 [--topology-xml F]
//   moepeak train [--config F]... [--set section.key=value]... [--resume] [--init-from DIR]
//                 [--dump-step DIR] [--force]
//   moepeak export CHECKPOINT OUT [--dtype bfloat16|float32] [--max-shard-size 5GB]
//   moepeak tune [--config F]... [--set section.key=value]... --out DIR [--repeats 5] [--only ...]
//   moepeak bench step [--config F]... [--warmup n] [--iters n] [--json FILE]
//
// This is the only place that exits: library code throws moepeak::Error, which is printed here
// (an internal error with host, rank and file:line; an input error in the user's terms only) and
// turned into exit code 1 (in a job of several ranks, by MPI_Abort, so that no rank is left waiting
// in a collective for the one that failed). Command-line mistakes exit 2 with CLI11's message.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include "cli/commands.h"
#include "core/comm/process_group.h"
#include "core/error.h"
#include "core/log.h"

int main(int argc, char** argv) {
  moepeak::cli::Context ctx;
  CLI::App app{
      "moepeak: train Mixture-of-Experts models at long context with every device-memory "
      "peak bounded and known before launch"};
  app.name("moepeak");
  app.add_flag_callback(
      "-V,--version",
      [] {
        moepeak::cli::print_version();
        throw CLI::Success();
      },
      "print version, build and library information and exit");
  app.add_option("--log-level", ctx.log_level, "trace, debug, info, warn, error or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  app.add_flag("--log-all-ranks", ctx.log_all_ranks,
               "log on every rank at --log-level (default: rank 0 only; others warn and above)");
  app.require_subcommand(1);
  app.fallthrough();  // --log-level and friends also work after the subcommand

  moepeak::cli::register_config_command(app, ctx);
  moepeak::cli::register_train_command(app, ctx);
  moepeak::cli::register_plan_command(app, ctx);
  moepeak::cli::register_probe_command(app, ctx);
  moepeak::cli::register_tune_command(app, ctx);
  moepeak::cli::register_bench_command(app, ctx);
  moepeak::cli::register_export_command(app, ctx);
  moepeak::cli::register_data_command(app, ctx);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);  // prints help, version, or the mistake
    return code == 0 ? 0 : 2;
  }
  try {
    moepeak::log::init(moepeak::log::parse_level(ctx.log_level.empty() ? "info" : ctx.log_level), 0,
                       1, ctx.log_all_ranks);
    return ctx.action ? ctx.action() : 0;
  } catch (const moepeak::Error& e) {
    // An input error shows no C++ location (core/error.h); where it was raised is for debugging.
    spdlog::debug("the error below was raised at {}:{} on {}{}", e.file(), e.line(),
                  moepeak::process_host(),
                  moepeak::process_rank() < 0 ? std::string()
                                              : " rank " + std::to_string(moepeak::process_rank()));
    std::fprintf(stderr, "moepeak: error: %s\n", e.what());
    moepeak::abort_process_group(1);  // W > 1: the other ranks may wait for this one forever
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moepeak: internal error: %s\n", e.what());
    moepeak::abort_process_group(1);
    return 1;
  }
}
