// `moepeak config show [--config F]... [--set section.key=value]... [--origins]`: prints the
// resolved configuration as TOML — the embedded default, then each file in order, then each
// --set — so what a run will use can be read (and saved, and passed back with --config).
#include <spdlog/spdlog.h>

#include <cstdio>

#include "cli/commands.h"
#include "core/checkpoint/hf_import.h"  // defines: with_init_from_model
#include "core/comm/process_group.h"
#include "core/config/config.h"
#include "core/log.h"

namespace moepeak::cli {

void add_config_options(CLI::App& sub, ConfigArgs& args) {
  sub.add_option("-c,--config", args.files,
                 "TOML config file; repeat to layer files (later ones override earlier keys)")
      ->check(CLI::ExistingFile);
  sub.add_option("--set", args.overrides, "override one key: section.key=value (repeatable)");
}

Config load_config_for_command(const ConfigArgs& args, const Context& ctx) {
  // [model] completed from model.init_from's config.json, so that plan, tune and train all see
  // the model the run will start from.
  Config cfg = with_init_from_model(load_config(args.files, args.overrides));
  if (ctx.log_level.empty()) log::set_level(log::parse_level(enum_name(cfg.runtime.log_level)));
  return cfg;
}

RankInfo join_ranks() {
  const RankInfo ranks = init_process_group();
  log::set_ranks(ranks.rank, ranks.world_size);
  return ranks;
}

void register_config_command(CLI::App& app, Context& ctx) {
  auto* config = app.add_subcommand("config", "inspect the resolved configuration");
  config->require_subcommand(1);
  auto* show = config->add_subcommand("show", "print the resolved config as TOML");
  static ConfigArgs args;
  static bool origins = false;
  add_config_options(*show, args);
  show->add_flag("--origins", origins, "annotate each key set by a file or --set with where");
  show->callback([&ctx] {
    ctx.action = [] {
      Config cfg = with_init_from_model(load_config(args.files, args.overrides));
      std::fputs(config_to_toml(cfg, origins).c_str(), stdout);
      return 0;
    };
  });
}

}  // namespace moepeak::cli
