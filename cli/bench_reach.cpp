// `moepeak bench reach`: the longest context (or the largest global batch) each schedule stack
// trains at the config's device capacity, found by real training runs, beside the plan's limit —
// the paper's reach result measured, not computed (docs/perf.md "bench reach").
//
//   moepeak bench reach -c CONFIG [-n W] [--axis context|batch] [--steps 2] [--stacks LIST]
//                       [--step N] [--launcher CMD] [--json FILE] [--svg FILE]
//
// Stacks: standard (every schedule standard: expert-parallel dispatch, materialised logits,
// standard checkpointing, resident AdamW) with the model's own router, standard_worst_case (the
// same with schedules.routing = worst_case: every token to expert rank 0, the routing the plan's
// dispatch bound assumes), each bounded operator alone (pipelined_llep, ring_dtp, sco,
// offload_stream) and `bounded` (all four). The standard rows' ratio says how much of a
// headline ratio against the standard stack is the router's doing. Each probe is its own job: this
// process (not itself launched under mpirun) runs `LAUNCHER moepeak train --force ...` with K
// steps and no checkpoint, so an out-of-memory on one rank ends that job alone (the trainer
// aborts all its ranks) and the next probe starts on a clean arena. The launcher is `mpirun -np
// {W}` (`srun -n {W}` inside a Slurm job; none for W = 1); `{W}` in --launcher is replaced.
// The search (core/measure/reach_search.h) starts at the plan's limit for the stack and brackets
// the first failure to one --step (default: the layout's granularity, at least 1/50 of the
// standard stack's planned limit); it probes no value below the smallest multiple of the step a
// job can be made at (its config loads and its plan can be made: training.seq_len >= 2, the
// layout's rules), where it starts when nothing fits by the plan (one rank of configs/reach.toml).
// Per stack it reports the measured and planned limits, the live set the arena named in the
// out-of-memory one step past the limit, tokens/s at the stack's own limit and at the standard
// stack's, and the loss of step 1 at the standard's limit (every stack trains there; the losses
// agree within the schedules' exactness bars).
//
// Test: ctest -R test_bench_reach (tests/cli/test_bench_reach.sh: 2 ranks, a tiny capacity; one
// rank of configs/reach.toml, where nothing fits by the plan).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_common.h"
#include "cli/commands.h"
#include "core/atomic_file.h"
#include "core/checkpoint/hf_import.h"
#include "core/config/config.h"
#include "core/error.h"
#include "core/measure/reach_search.h"
#include "core/plan/plan.h"

namespace moepeak::cli {
namespace {

namespace fs = std::filesystem;

struct ReachArgs {
  ConfigArgs config;
  int world = 1;
  std::string axis = "context";
  int steps = 2;
  std::string stacks =
      "standard,standard_worst_case,pipelined_llep,ring_dtp,sco,offload_stream,bounded";
  int64_t step = 0;
  std::string launcher;
  std::string json_path, svg_path;
};

// Each stack as the --set overrides that make it, on top of the all-standard ones.
const std::map<std::string, std::vector<std::string>>& stack_overrides() {
  static const std::map<std::string, std::vector<std::string>> m = {
      {"standard", {}},
      {"standard_worst_case", {"schedules.routing=worst_case"}},
      {"pipelined_llep", {"schedules.dispatch=pipelined_llep"}},
      {"ring_dtp", {"schedules.vocab=ring_dtp"}},
      {"sco", {"schedules.checkpoint=sco"}},
      {"offload_stream", {"optimizer.placement=offload_stream"}},
      {"bounded",
       {"schedules.dispatch=pipelined_llep", "schedules.vocab=ring_dtp", "schedules.checkpoint=sco",
        "optimizer.placement=offload_stream"}}};
  return m;
}
const std::vector<std::string> kStandard = {
    "schedules.dispatch=standard", "schedules.vocab=materialized", "schedules.checkpoint=standard",
    "optimizer.placement=resident"};

// The user's --set overrides, then every schedule standard, then the stack's own: what both the
// plan of a stack and each of its probes are made from.
std::vector<std::string> stack_sets(const ConfigArgs& config, const std::string& stack) {
  std::vector<std::string> sets = config.overrides;
  sets.insert(sets.end(), kStandard.begin(), kStandard.end());
  for (const std::string& s : stack_overrides().at(stack)) sets.push_back(s);
  return sets;
}

// One training job's outcome.
struct ProbeRun {
  bool trained = false;
  std::string binding;  // the live set the arena named in its out-of-memory error
  double tokens_per_s = 0, loss1 = 0;
};

class Prober {
 public:
  Prober(const ReachArgs& args, const Config& cfg) : args_(args), cfg_(cfg) {
    dir_ = fs::temp_directory_path() / ("moepeak-reach-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    MOEPEAK_CHECK(n > 0, "bench reach: cannot find its own executable (/proc/self/exe)");
    self_ = std::string(self, static_cast<size_t>(n));
    launcher_ = args.launcher;
    if (launcher_.empty() && args.world > 1) {
      launcher_ = std::getenv("SLURM_JOB_ID") ? "srun -n {W}" : "mpirun -np {W}";
    }
    const size_t at = launcher_.find("{W}");
    if (at != std::string::npos) launcher_.replace(at, 3, std::to_string(args.world));
  }
  ~Prober() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const std::string& launcher() const { return launcher_; }

  // The --set overrides of a job of the stack at `value` on the axis named `name`.
  std::vector<std::string> probe_sets(const std::string& stack, int64_t value,
                                      const std::string& name) const {
    std::vector<std::string> sets = stack_sets(args_.config, stack);
    const std::string key = args_.axis == "context" ? "training.seq_len" : "training.batch_size";
    sets.push_back(key + "=" + std::to_string(value));
    if (args_.axis == "context") {
      sets.push_back("model.max_position_embeddings=" +
                     std::to_string(std::max(value, cfg_.model.max_position_embeddings)));
    }
    // The job has the bench's W ranks, whatever W the config names (reach.toml: 4).
    sets.push_back("parallelism.world_size=" + std::to_string(args_.world));
    sets.push_back("training.steps=" + std::to_string(args_.steps));
    sets.push_back("checkpoint.enable=false");
    sets.push_back("metrics.progress=off");
    sets.push_back("job.run_dir=" + dir_.string());
    sets.push_back("job.name=" + name);
    return sets;
  }

  // "" when a job of the stack can be made at `value`: its config loads as the job's will (the
  // schema's bounds, e.g. training.seq_len >= 2, and the rules across keys) and its plan can be
  // made on W ranks (the layout's rules: the batch over the W/Sp sequence groups, seq_len and the
  // heads over Sp; core/model/layout_defect.h); else the error that says why not. Whether it
  // fits is the job's to find.
  std::string cannot_run(const std::string& stack, int64_t value) const {
    try {
      const Config c =
          with_init_from_model(load_config(args_.config.files, probe_sets(stack, value, "check")));
      make_plan(c, plan_inputs(c, args_.world));
      return "";
    } catch (const Error& e) {
      return e.message();
    }
  }

  // A job of the stack at `value` on the axis.
  ProbeRun run(const std::string& stack, int64_t value) {
    const std::string name = "probe-" + std::to_string(++count_);
    std::string cmd = launcher_.empty() ? "" : launcher_ + " ";
    cmd += shell_word(self_) + " train --force";
    for (const std::string& f : args_.config.files) cmd += " --config " + shell_word(f);
    for (const std::string& s : probe_sets(stack, value, name)) cmd += " --set " + shell_word(s);
    const fs::path log = dir_ / (name + ".log");
    cmd += " >" + shell_word(log.string()) + " 2>&1";
    const int status = std::system(cmd.c_str());
    ProbeRun r;
    r.trained = status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    std::ifstream in(log);
    // "out of device memory in cuda:0 device memory: requested 2.67 GiB for weights (...)"
    static const std::regex oom(
        "out of device memory in .*?: requested \\S+ \\S+ for ([a-z_]+) \\(");
    std::vector<std::string> tail;  // the last lines, for an error that is not memory
    for (std::string line; std::getline(in, line);) {
      std::smatch m;
      if (r.binding.empty() && std::regex_search(line, m, oom)) r.binding = m[1];
      if (line.empty()) continue;
      tail.push_back(line);
      if (tail.size() > 6) tail.erase(tail.begin());
    }
    // NOTES: only an out-of-memory ends a probe as a limit; any other failure (a launcher that
    // will not start, a layout the value cannot split into) would be read as one and the search
    // would walk down to nothing, so it stops the bench.
    if (!r.trained && r.binding.empty()) {
      std::string text;
      for (const std::string& l : tail) text += "\n  " + l;
      MOEPEAK_THROW("bench reach: the ", stack, " probe at ", value,
                    " failed without running out of device memory; its command:\n  ", cmd,
                    "\nthe end of its output:", text);
    }
    if (r.trained) {
      std::ifstream metrics(dir_ / name / "metrics.jsonl");
      std::vector<nlohmann::json> rows;
      for (std::string line; std::getline(metrics, line);) {
        if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
      }
      MOEPEAK_CHECK(!rows.empty(), "bench reach: ", name, " trained but wrote no metrics (",
                    log.string(), ")");
      r.loss1 = rows.front().at("loss").get<double>();
      r.tokens_per_s = rows.back().at("tokens_per_s").get<double>();
    }
    std::error_code ec;
    fs::remove_all(dir_ / name, ec);
    return r;
  }

 private:
  const ReachArgs& args_;
  const Config& cfg_;
  fs::path dir_;
  std::string self_, launcher_;
  int count_ = 0;
};

struct StackResult {
  std::string stack;
  int64_t planned = 0;
  measure::ReachSearch search;
  std::map<int64_t, ProbeRun> runs;  // by value
  ProbeRun at_standard;              // a run at the standard stack's measured limit
  std::string binding;               // the live set named one step past the limit
};

// A bar per stack: measured limit (filled) over the plan's (outlined).
std::string reach_svg(const std::vector<StackResult>& rows, const std::string& axis) {
  int64_t top = 1;
  for (const StackResult& r : rows) top = std::max({top, r.search.limit, r.planned});
  const int width = 780, left = 170, bar = 22, gap = 12, plot = width - left - 150;
  const int height = 40 + static_cast<int>(rows.size()) * (bar + gap) + 20;
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<text x=\"10\" y=\"20\" font-size=\"14\">moepeak bench reach: the largest "
    << (axis == "context" ? "seq_len" : "global batch")
    << " that trains (filled) and the plan's (outline)</text>\n";
  int y = 40;
  for (const StackResult& r : rows) {
    const int wm = static_cast<int>(static_cast<double>(plot) * r.search.limit / top);
    const int wp = static_cast<int>(static_cast<double>(plot) * r.planned / top);
    s << "<text x=\"10\" y=\"" << y + 15 << "\">" << r.stack << "</text>\n"
      << "<rect x=\"" << left << "\" y=\"" << y << "\" width=\"" << wm << "\" height=\"" << bar
      << "\" fill=\"#4878a8\"/>\n"
      << "<rect x=\"" << left << "\" y=\"" << y << "\" width=\"" << wp << "\" height=\"" << bar
      << "\" fill=\"none\" stroke=\"#c04040\" stroke-width=\"2\"/>\n"
      << "<text x=\"" << left + std::max(wm, wp) + 6 << "\" y=\"" << y + 15 << "\">"
      << r.search.limit << (r.binding.empty() ? "" : " (" + r.binding + ")") << "</text>\n";
    y += bar + gap;
  }
  s << "</svg>\n";
  return s.str();
}

int run_bench_reach(const ReachArgs& args, const Context& ctx) {
  MOEPEAK_CHECK_INPUT(args.axis == "context" || args.axis == "batch", "bench reach --axis ",
                      args.axis, ": context or batch");
  MOEPEAK_CHECK_INPUT(args.world >= 1 && args.steps >= 1, "bench reach: -n ", args.world,
                      ", --steps ", args.steps, " (both at least 1)");
  const Config cfg = load_config_for_command(args.config, ctx);
  std::vector<std::string> stacks;
  std::stringstream list(args.stacks);
  for (std::string s; std::getline(list, s, ',');) {
    MOEPEAK_CHECK_INPUT(stack_overrides().count(s), "bench reach --stacks: unknown stack '", s,
                        "' (standard, standard_worst_case, pipelined_llep, ring_dtp, sco, "
                        "offload_stream, bounded)");
    stacks.push_back(s);
  }
  MOEPEAK_CHECK_INPUT(!stacks.empty(), "bench reach --stacks: none given");

  // Each stack's config and planned limit.
  const bool context = args.axis == "context";
  std::vector<StackResult> rows;
  int64_t granularity = 1, planned_standard = 0, top = 0;
  for (const std::string& stack : stacks) {
    const Config c = load_config(args.config.files, stack_sets(args.config, stack));
    const PlanInputs in = plan_inputs(c, args.world);
    granularity = context ? in.degrees.sequence : in.degrees.sequence_groups();
    StackResult r;
    r.stack = stack;
    r.planned = context ? max_seq_len(c, in) : max_batch(c, in);
    if (stack == "standard") planned_standard = r.planned;
    top = std::max(top, r.planned);
    rows.push_back(r);
  }
  int64_t step = args.step;
  if (step <= 0) {
    const int64_t base = planned_standard > 0 ? planned_standard : std::max<int64_t>(top, 50);
    step = std::max<int64_t>(1, base / 50 / granularity) * granularity;
  }
  MOEPEAK_CHECK_INPUT(step % granularity == 0, "bench reach --step ", step,
                      " must be a multiple of ", granularity, " (the layout's granularity)");
  const int64_t max = std::max<int64_t>(2 * top, 4 * step) / step * step + step;

  Prober prober(args, cfg);
  // Per stack the smallest multiple of the step a job can be made at (a seq_len of 1 is none:
  // with nothing fitting by the plan, the search would start there), and why those below cannot.
  std::vector<int64_t> lowest(rows.size(), 0);
  std::vector<std::string> below(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    std::string why;
    for (int64_t v = step; v <= max && lowest[i] == 0; v += step) {
      why = prober.cannot_run(rows[i].stack, v);
      if (why.empty()) {
        lowest[i] = v;
      } else if (below[i].empty()) {
        below[i] = std::to_string(v) + ": " + why;
      }
    }
    MOEPEAK_CHECK_INPUT(lowest[i] > 0, "bench reach: no job of the ", rows[i].stack,
                        " stack can be made at any ", context ? "seq_len" : "global batch",
                        " that is a multiple of ", step, " up to ", max, "; at ", max, ": ", why);
  }
  std::printf(
      "# moepeak bench reach: %s axis, %d rank(s) via '%s', %d step(s) per probe, "
      "search step %lld\n",
      args.axis.c_str(), args.world,
      prober.launcher().empty() ? "(none)" : prober.launcher().c_str(), args.steps,
      static_cast<long long>(step));
  std::printf("# host %s, %s; capacity %s per rank\n", process_host().c_str(), now_utc().c_str(),
              cfg.runtime.device_memory.c_str());
  std::fflush(stdout);
  for (size_t i = 0; i < rows.size(); ++i) {
    StackResult& r = rows[i];
    if (lowest[i] > step) {
      std::printf("#   %-15s from %lld: no job can be made at %s\n", r.stack.c_str(),
                  static_cast<long long>(lowest[i]), below[i].c_str());
    }
    r.search = measure::search_reach({r.planned, step, max, lowest[i]}, [&](int64_t v) {
      ProbeRun p = prober.run(r.stack, v);
      std::printf("#   %-15s %9lld %s\n", r.stack.c_str(), static_cast<long long>(v),
                  p.trained ? "trains" : ("out of memory in " + p.binding).c_str());
      std::fflush(stdout);
      r.runs[v] = p;
      return p.trained;
    });
    if (r.search.first_failed) r.binding = r.runs.at(r.search.first_failed).binding;
  }
  // Every stack at the standard stack's measured limit: tokens/s there and step 1's loss. The
  // worst-case router trains another function (and reaches less): it has no such row.
  auto model_router = [](const StackResult& r) { return r.stack != "standard_worst_case"; };
  int64_t common = 0;
  for (const StackResult& r : rows) {
    if (r.stack == "standard") common = r.search.limit;
  }
  if (common == 0) {  // no standard row: the smallest limit any stack reached
    for (const StackResult& r : rows) {
      if (r.search.limit > 0 && model_router(r))
        common = common ? std::min(common, r.search.limit) : r.search.limit;
    }
  }
  for (StackResult& r : rows) {
    if (common == 0 || !model_router(r)) continue;
    auto it = r.runs.find(common);
    r.at_standard = it != r.runs.end() ? it->second : prober.run(r.stack, common);
  }

  std::printf("# %-19s %-7s %9s %9s %9s %-11s %12s %12s %12s\n", "stack", "axis", "measured",
              "planned", "meas/plan", "binding", "tok/s@limit", "tok/s@std", "loss1@std");
  // A stack that did not train at the standard's limit (or has no such row) shows "-" there.
  auto at_std = [](const StackResult& r, double v, const char* format) {
    char buf[32];
    if (!r.at_standard.trained) return std::string("-");
    std::snprintf(buf, sizeof(buf), format, v);
    return std::string(buf);
  };
  auto at_std_json = [](const StackResult& r, double v) {
    return r.at_standard.trained ? nlohmann::json(v) : nlohmann::json();
  };
  nlohmann::json json_rows = nlohmann::json::array();
  for (const StackResult& r : rows) {
    const ProbeRun* at_limit = r.search.limit ? &r.runs.at(r.search.limit) : nullptr;
    std::printf("  %-19s %-7s %9lld %9lld %9.3f %-11s %12.0f %12s %12s\n", r.stack.c_str(),
                args.axis.c_str(), static_cast<long long>(r.search.limit),
                static_cast<long long>(r.planned),
                r.planned ? static_cast<double>(r.search.limit) / r.planned : 0.0,
                r.binding.empty() ? "-" : r.binding.c_str(),
                at_limit ? at_limit->tokens_per_s : 0.0,
                at_std(r, r.at_standard.tokens_per_s, "%.0f").c_str(),
                at_std(r, r.at_standard.loss1, "%.6f").c_str());
    nlohmann::json probes = nlohmann::json::array();
    for (const measure::ReachProbe& p : r.search.probes) {
      probes.push_back({{"value", p.value},
                        {"trained", p.trained},
                        {"binding_live_set", r.runs.at(p.value).binding}});
    }
    json_rows.push_back(
        {{"stack", r.stack},
         {"axis", args.axis},
         {"measured_limit", r.search.limit},
         {"planned_limit", r.planned},
         {"first_failed", r.search.first_failed},
         {"binding_live_set", r.binding.empty() ? nlohmann::json() : nlohmann::json(r.binding)},
         {"tokens_per_s", at_limit ? at_limit->tokens_per_s : 0.0},
         {"standard_limit", common},
         {"tokens_per_s_at_standard_limit", at_std_json(r, r.at_standard.tokens_per_s)},
         {"loss_step1_at_standard_limit", at_std_json(r, r.at_standard.loss1)},
         {"probes", probes}});
  }
  if (!args.json_path.empty()) {
    nlohmann::json shape = {{"axis", args.axis},
                            {"world_size", args.world},
                            {"steps", args.steps},
                            {"step", step},
                            {"capacity", cfg.runtime.device_memory}};
    write_bench_json(args.json_path, "reach", args.world, shape, json_rows);
  }
  if (!args.svg_path.empty()) write_file_atomically(args.svg_path, reach_svg(rows, args.axis));
  return 0;
}

}  // namespace

void register_bench_reach(CLI::App& bench, Context& ctx) {
  static ReachArgs args;
  auto* sub = bench.add_subcommand(
      "reach",
      "the longest context (or largest batch) each schedule stack trains at the "
      "config's capacity, by real runs, beside the plan's limit");
  add_config_options(*sub, args.config);
  sub->add_option("-n,--world-size", args.world, "ranks of each probe job")->capture_default_str();
  sub->add_option("--axis", args.axis, "context (seq_len) or batch (global batch)")
      ->capture_default_str();
  sub->add_option("--steps", args.steps, "full training steps per probe")->capture_default_str();
  sub->add_option("--stacks", args.stacks, "comma-separated stacks")->capture_default_str();
  sub->add_option("--step", args.step,
                  "search resolution (default: the layout's granularity, >= 1/50 of the standard "
                  "stack's planned limit)");
  sub->add_option("--launcher", args.launcher,
                  "command that starts a job of W ranks, {W} replaced (default: mpirun -np {W}; "
                  "srun -n {W} in a Slurm job)");
  sub->add_option("--json", args.json_path, "write the rows as JSON");
  sub->add_option("--svg", args.svg_path, "draw the limits per stack");
  sub->callback([&ctx] { ctx.action = [&ctx] { return run_bench_reach(args, ctx); }; });
}

}  // namespace moepeak::cli
