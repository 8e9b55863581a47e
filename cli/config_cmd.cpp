// `moepeak config show [--config F]... [--set section.key=value]... [--origins]`: prints the
// resolved configuration as TOML — the embedded default, then each file in order, then each
// --set — so what a run will use can be read (and saved, and passed back with --config).
#include <cstdio>

#include "cli/commands.h"
#include "core/config/config.h"

namespace moepeak::cli {

void add_config_options(CLI::App& sub, ConfigArgs& args) {
  sub.add_option("-c,--config", args.files,
                 "TOML config file; repeat to layer files (later ones override earlier keys)")
      ->check(CLI::ExistingFile);
  sub.add_option("--set", args.overrides, "override one key: section.key=value (repeatable)");
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
      Config cfg = load_config(args.files, args.overrides);
      std::fputs(config_to_toml(cfg, origins).c_str(), stdout);
      return 0;
    };
  });
}

}  // namespace moepeak::cli
