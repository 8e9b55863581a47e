// `moepeak tune`: measures the curves of the bounded schedules at the per-rank shapes of the
// user's config on the machine it runs on, chooses chunk size c (and K_max), bucket size beta and
// staging slots s, the Ring-DTP payload and kept strips, and SCO's host budget by the rules of
// docs/tune.md (core/tune/select.h), checks the plan with the choice applied, and writes into DIR:
//   tuned.toml   a config fragment with the chosen values (each with the rule and the numbers in a
//                comment) and, in its header, the exact `moepeak train` command that uses it
//   curves.json  every measured point: median/min/max time, measured and planned bytes, the plan
//   *.svg        one plot per curve with the chosen point marked (core/tune/curve_svg.h)
//
//   moepeak tune [--config F]... [--set k=v]... --out DIR [--repeats 5] [--warmup 1]
//                [--only dispatch,optimizer,vocab,sco] [--dispatch-tolerance 0.03]
//                [--optimizer-tolerance 0.05] [--vocab-tolerance 0.03] [--sco-tolerance 0.03]
//   mpirun -np W moepeak tune ...          srun moepeak tune ...   (sbatch slurm/tune.sbatch)
//
// Shapes (W ranks, config B x T): N = B*T/W tokens per rank; dispatch (N, H) x top-k over E
// experts with F-wide experts; optimizer P = zero_persistent_elements(model, W) parameters per
// rank; vocab (N, H) against V/W LM-head rows; SCO one rank's model on N tokens. The sweeps are
// core/measure/sweeps.cpp, on runtime.backend (f32; with CUDA each rank on its local GPU, NCCL
// between them). Every rank measures at once; the times are the slowest rank's, so every
// rank selects the same values; rank 0 prints and writes. Nothing is written when a rule finds
// no point (the error names the constraint) or the plan with the choice does not fit; each file
// is written atomically. Exit 0 on success, 1 on an error, 2 on a usage mistake.
// Test: ctest -R test_tune (tests/tune/test_tune_cli.sh: 1 and 2 ranks, the outputs, plan and a
// 2-step train with the fragment, the nothing-fits error).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_common.h"
#include "cli/commands.h"
#include "core/atomic_file.h"
#include "core/comm/process_group.h"
#include "core/config/config.h"
#include "core/error.h"
#include "core/measure/sweeps.h"
#include "core/measure/tune_run.h"
#include "core/plan/plan.h"
#include "core/progress_line.h"
#include "core/train/trainer.h"
#include "core/tune/curve_svg.h"
#include "core/tune/select.h"
#include "core/units.h"
#include "ops/schedules/vocab_ring_dtp.h"

namespace moepeak::cli {

using namespace measure;  // the measurement this command prints (core/measure)
namespace {

struct TuneArgs {
  ConfigArgs config;
  std::string out;
  std::vector<std::string> only;
  TuneRequest request;  // --repeats, --warmup and the tolerances bind to it; --only fills sweeps
};

// The progress of the sweeps on rank 0: a bar redrawn in place where draws_progress says so (the
// rule of training's progress line, core/progress_line.h), else a plain `#` line per tick.
class Progress {
 public:
  Progress(int total, bool show, ProgressMode mode)
      : total_(total), show_(show), tty_(show && draws_progress(mode, STDOUT_FILENO)) {}
  ~Progress() {
    if (tty_ && done_ > 0) std::fputs("\n", stdout);
  }
  void tick(const std::string& what) {
    ++done_;
    if (!show_) return;
    if (tty_) {
      constexpr int kWidth = 30;
      std::string bar(static_cast<size_t>(kWidth * done_ / std::max(total_, 1)), '=');
      bar.resize(kWidth, ' ');
      std::printf("\r\033[K[%s] %d/%d %s", bar.c_str(), done_, total_, what.c_str());
    } else {
      std::printf("# tune [%d/%d] %s\n", done_, total_, what.c_str());
    }
    std::fflush(stdout);
  }

 private:
  int total_, done_ = 0;
  bool show_, tty_;
};

std::string ms(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", 1e3 * s);
  return buf;
}

nlohmann::json timing_json(const tune::Timing& t) {
  return {{"median_s", t.median_s}, {"min_s", t.min_s}, {"max_s", t.max_s}, {"repeats", t.repeats}};
}

// The keys tuned.toml may set, per sweep.
const std::map<std::string, std::vector<std::string>>& tuned_keys() {
  static const std::map<std::string, std::vector<std::string>> keys = {
      {"dispatch", {"schedules.dispatch", "schedules.chunk_tokens", "schedules.max_chunks"}},
      {"optimizer", {"optimizer.placement", "optimizer.bucket_params", "optimizer.staging_slots"}},
      {"vocab", {"schedules.vocab", "schedules.ring_payload", "schedules.vocab_kept_strips"}},
      {"sco", {"schedules.checkpoint", "schedules.sco_host_budget"}}};
  return keys;
}

using Outcome = TuneOutcome;

// ---- Output ---------------------------------------------------------------------------------

void print_tables(const Outcome& o, const TuneShape& s, const TuneArgs& args,
                  const Plan& final_plan) {
  std::printf(
      "# moepeak tune: host %s, %s; W = %d rank%s; per rank N = %lld tokens, H = %lld, F = %lld, "
      "E = %lld top-%lld, V = %lld, L = %lld, P = %lld parameters; f32 on the %s backend\n",
      process_host().c_str(), now_utc().c_str(), s.world, s.world == 1 ? "" : "s",
      static_cast<long long>(s.tokens), static_cast<long long>(s.hidden),
      static_cast<long long>(s.ffn), static_cast<long long>(s.experts),
      static_cast<long long>(s.top_k), static_cast<long long>(s.vocab),
      static_cast<long long>(s.layers), static_cast<long long>(s.params), o.backend);
  std::printf(
      "# every point: median (min..max) of %d timed repetitions after %d warm-up, the slowest "
      "rank's; "
      "* = chosen, plan: the plan with the point's values applied\n",
      args.request.repeats, args.request.warmup);
  if (o.dispatch) {
    std::printf(
        "# dispatch: PipelinedLLEP forward + backward of one MoE layer, Zipf(1.2) routing\n");
    std::printf("# %8s %6s %5s %7s %10s %10s %10s %12s %12s %6s\n", "c", "K_max", "K", "c_eff",
                "median_ms", "min_ms", "max_ms", "peak", "bound", "plan");
    for (size_t i = 0; i < o.dispatch_points.size(); ++i) {
      const tune::DispatchPoint& p = o.dispatch_points[i];
      std::printf("%s %8lld %6lld %5lld %7lld %10s %10s %10s %12s %12s %6s\n",
                  i == o.dispatch_choice.index ? " *" : "  ",
                  static_cast<long long>(p.chunk_tokens), static_cast<long long>(p.max_chunks),
                  static_cast<long long>(p.chunks), static_cast<long long>(p.chunk_eff),
                  ms(p.time.median_s).c_str(), ms(p.time.min_s).c_str(), ms(p.time.max_s).c_str(),
                  format_bytes(p.peak_bytes).c_str(), format_bytes(p.bound_bytes).c_str(),
                  p.plan_fits ? "fits" : "over");
    }
  }
  if (o.optimizer) {
    const OptimizerSweep& w = o.optimizer_sweep;
    std::printf(
        "# optimizer: one OffloadStreamAdamW step; host-link floor %s ms (12 B/param at %.2f GB/s "
        "h2d, "
        "%.2f GB/s d2h, the slower way)\n",
        ms(w.floor_s).c_str(), w.h2d_bytes_per_s / 1e9, w.d2h_bytes_per_s / 1e9);
    std::printf("# %8s %3s %9s %10s %10s %10s %8s %12s %12s %6s\n", "beta", "s", "bucket",
                "median_ms", "min_ms", "max_ms", "x floor", "staging", "bound", "plan");
    for (size_t i = 0; i < w.points.size(); ++i) {
      const tune::OptimizerPoint& p = w.points[i];
      std::printf(
          "%s %8lld %3lld %9lld %10s %10s %10s %8.2f %12s %12s %6s\n",
          i == o.optimizer_choice.index ? " *" : "  ", static_cast<long long>(p.bucket_params),
          static_cast<long long>(p.staging_slots), static_cast<long long>(p.bucket),
          ms(p.time.median_s).c_str(), ms(p.time.min_s).c_str(), ms(p.time.max_s).c_str(),
          w.floor_s > 0 ? p.time.median_s / w.floor_s : 0.0, format_bytes(p.staging_bytes).c_str(),
          format_bytes(p.bound_bytes).c_str(), p.plan_fits ? "fits" : "over");
    }
  }
  if (o.vocab) {
    std::printf("# vocab: Ring-DTP forward + backward\n");
    std::printf("# %-12s %5s %10s %10s %10s %12s %12s %6s\n", "payload", "kept", "median_ms",
                "min_ms", "max_ms", "logits", "bound", "plan");
    for (size_t i = 0; i < o.vocab_points.size(); ++i) {
      const tune::VocabPoint& p = o.vocab_points[i];
      std::printf(
          "%s %-12s %5lld %10s %10s %10s %12s %12s %6s\n", i == o.kept_choice.index ? " *" : "  ",
          p.payload.c_str(), static_cast<long long>(p.kept_strips), ms(p.time.median_s).c_str(),
          ms(p.time.min_s).c_str(), ms(p.time.max_s).c_str(), format_bytes(p.peak_bytes).c_str(),
          format_bytes(p.bound_bytes).c_str(), p.plan_fits ? "fits" : "over");
    }
  }
  if (o.sco) {
    const ScoSweepResult& r = o.sco_sweep;
    std::printf(
        "# sco: a step's forward + backward; standard checkpointing %s ms (%s..%s), boundaries "
        "%s\n",
        ms(r.standard.median_s).c_str(), ms(r.standard.min_s).c_str(), ms(r.standard.max_s).c_str(),
        format_bytes(r.standard_boundaries).c_str());
    std::printf("# %-6s %9s %12s %10s %10s %10s %9s %12s %12s %6s\n", "budget", "offloaded",
                "host_budget", "median_ms", "min_ms", "max_ms", "overhead", "boundaries", "bound",
                "plan");
    for (size_t i = 0; i < r.points.size(); ++i) {
      const tune::ScoPoint& p = r.points[i];
      std::printf("%s %-6s %5lld/%-3lld %12s %10s %10s %10s %8.1f%% %12s %12s %6s\n",
                  i == o.sco_choice.index ? " *" : "  ", p.label.c_str(),
                  static_cast<long long>(p.offloaded_layers), static_cast<long long>(s.layers),
                  format_bytes(p.host_budget).c_str(), ms(p.time.median_s).c_str(),
                  ms(p.time.min_s).c_str(), ms(p.time.max_s).c_str(), 100.0 * p.overhead,
                  format_bytes(p.peak_bytes).c_str(), format_bytes(p.bound_bytes).c_str(),
                  p.plan_fits ? "fits" : "over");
    }
  }
  if (o.dispatch) std::printf("# chosen dispatch: %s\n", o.dispatch_choice.reason.c_str());
  if (o.optimizer) std::printf("# chosen optimizer: %s\n", o.optimizer_choice.reason.c_str());
  if (o.vocab) {
    std::printf("# chosen vocab: %s; %s\n", o.vocab_choice.reason.c_str(),
                o.kept_choice.reason.c_str());
  }
  if (o.sco) std::printf("# chosen sco: %s\n", o.sco_choice.reason.c_str());
  std::printf("# plan with tuned.toml: %s\n", final_plan.verdict().c_str());
}

nlohmann::json curves_json(const Outcome& o, const TuneShape& s, const TuneArgs& args,
                           const Plan& plan, const std::string& command) {
  nlohmann::json j = {{"tool", "moepeak tune"},
                      {"host", process_host()},
                      {"date", now_utc()},
                      {"world_size", s.world},
                      {"config_files", args.config.files},
                      {"overrides", args.config.overrides},
                      {"repeats", args.request.repeats},
                      {"warmup", args.request.warmup},
                      {"shape",
                       {{"tokens_per_rank", s.tokens},
                        {"hidden_size", s.hidden},
                        {"intermediate_size", s.ffn},
                        {"num_local_experts", s.experts},
                        {"num_experts_per_tok", s.top_k},
                        {"vocab_size", s.vocab},
                        {"num_hidden_layers", s.layers},
                        {"params_per_rank", s.params},
                        {"dtype", "f32"}}},
                      {"command", command},
                      {"plan",
                       {{"fits", plan.fits()},
                        {"verdict", plan.verdict()},
                        {"total_bytes", plan.total},
                        {"capacity_bytes", plan.inputs.capacity},
                        {"host_bytes", plan.host_total},
                        {"host_budget_bytes", plan.inputs.host_budget}}}};
  if (o.dispatch) {
    nlohmann::json pts = nlohmann::json::array();
    for (const auto& p : o.dispatch_points) {
      pts.push_back({{"chunk_tokens", p.chunk_tokens},
                     {"max_chunks", p.max_chunks},
                     {"chunks", p.chunks},
                     {"chunk_eff", p.chunk_eff},
                     {"time", timing_json(p.time)},
                     {"peak_bytes", p.peak_bytes},
                     {"bound_bytes", p.bound_bytes},
                     {"plan_fits", p.plan_fits},
                     {"plan_note", p.plan_note}});
    }
    j["dispatch"] = {
        {"what", "PipelinedLLEP forward + backward of one MoE layer, Zipf(1.2) routing"},
        {"rule", "smallest c_eff within tolerance of the fastest point the plan accepts"},
        {"tolerance", args.request.dispatch_tolerance},
        {"points", pts},
        {"chosen", o.dispatch_choice.index},
        {"reason", o.dispatch_choice.reason}};
  }
  if (o.optimizer) {
    nlohmann::json pts = nlohmann::json::array();
    for (const auto& p : o.optimizer_sweep.points) {
      pts.push_back({{"bucket_params", p.bucket_params},
                     {"staging_slots", p.staging_slots},
                     {"bucket", p.bucket},
                     {"slots", p.slots},
                     {"time", timing_json(p.time)},
                     {"staging_bytes", p.staging_bytes},
                     {"bound_bytes", p.bound_bytes},
                     {"plan_fits", p.plan_fits},
                     {"plan_note", p.plan_note}});
    }
    j["optimizer"] = {
        {"what", "one OffloadStreamAdamW step of this rank's parameters"},
        {"rule",
         "smallest staging (s x beta) within tolerance of the fastest point the plan accepts"},
        {"tolerance", args.request.optimizer_tolerance},
        {"points", pts},
        {"floor_s", o.optimizer_sweep.floor_s},
        {"h2d_bytes_per_s", o.optimizer_sweep.h2d_bytes_per_s},
        {"d2h_bytes_per_s", o.optimizer_sweep.d2h_bytes_per_s},
        {"chosen", o.optimizer_choice.index},
        {"reason", o.optimizer_choice.reason}};
  }
  if (o.vocab) {
    nlohmann::json pts = nlohmann::json::array();
    for (const auto& p : o.vocab_points) {
      pts.push_back({{"payload", p.payload},
                     {"kept_strips", p.kept_strips},
                     {"time", timing_json(p.time)},
                     {"peak_bytes", p.peak_bytes},
                     {"bound_bytes", p.bound_bytes},
                     {"plan_fits", p.plan_fits},
                     {"plan_note", p.plan_note}});
    }
    j["vocab"] = {
        {"what", "Ring-DTP forward + backward"},
        {"rule",
         "the faster payload the plan accepts with no strips kept; then the fewest kept strips "
         "within tolerance of that payload's fastest point the plan accepts"},
        {"tolerance", args.request.vocab_tolerance},
        {"points", pts},
        {"chosen", o.kept_choice.index},
        {"reason", o.vocab_choice.reason + "; " + o.kept_choice.reason}};
  }
  if (o.sco) {
    nlohmann::json pts = nlohmann::json::array();
    for (const auto& p : o.sco_sweep.points) {
      pts.push_back({{"label", p.label},
                     {"offloaded_layers", p.offloaded_layers},
                     {"host_budget", p.host_budget},
                     {"time", timing_json(p.time)},
                     {"overhead", p.overhead},
                     {"peak_bytes", p.peak_bytes},
                     {"bound_bytes", p.bound_bytes},
                     {"plan_fits", p.plan_fits},
                     {"plan_note", p.plan_note}});
    }
    j["sco"] = {{"what", "a model step's forward + backward, standard checkpointing vs SCO"},
                {"rule", "most offloaded layers with overhead within tolerance of standard"},
                {"tolerance", args.request.sco_tolerance},
                {"standard", timing_json(o.sco_sweep.standard)},
                {"standard_boundaries_bytes", o.sco_sweep.standard_boundaries},
                {"points", pts},
                {"chosen", o.sco_choice.index},
                {"reason", o.sco_choice.reason}};
  }
  return j;
}

// The plots, file name -> SVG text.
std::map<std::string, std::string> plots(const Outcome& o, const TuneShape& s,
                                         double sco_tolerance) {
  std::map<std::string, std::string> out;
  const std::string shape =
      "W = " + std::to_string(s.world) + ", N = " + std::to_string(s.tokens) + " tokens per rank";
  if (o.dispatch) {
    tune::Curve time{"dispatch: PipelinedLLEP forward + backward (" + shape + ")",
                     "c_eff (tokens per source per chunk)",
                     "median time (ms)",
                     true,
                     {},
                     {},
                     -1,
                     -1,
                     o.dispatch_choice.reason};
    tune::Curve peak{"dispatch: measured dispatch peak (" + shape + ")",
                     "c_eff (tokens per source per chunk)",
                     "dispatch peak (MiB)",
                     true,
                     {},
                     {},
                     -1,
                     -1,
                     o.dispatch_choice.reason};
    std::map<int64_t, int> series_of;  // K_max -> series
    for (size_t i = 0; i < o.dispatch_points.size(); ++i) {
      const tune::DispatchPoint& p = o.dispatch_points[i];
      if (!series_of.count(p.max_chunks)) {
        series_of[p.max_chunks] = static_cast<int>(time.series.size());
        time.series.push_back({"K_max = " + std::to_string(p.max_chunks), {}});
        peak.series.push_back({"K_max = " + std::to_string(p.max_chunks), {}});
      }
      const int si = series_of[p.max_chunks];
      const std::string label =
          "c = " + std::to_string(p.chunk_tokens) + ", K = " + std::to_string(p.chunks);
      time.series[static_cast<size_t>(si)].points.push_back(
          {static_cast<double>(p.chunk_eff), 1e3 * p.time.median_s, label, p.plan_fits});
      peak.series[static_cast<size_t>(si)].points.push_back(
          {static_cast<double>(p.chunk_eff), static_cast<double>(p.peak_bytes) / MiB, label,
           p.plan_fits});
      if (i == o.dispatch_choice.index) {
        time.chosen_series = peak.chosen_series = si;
        time.chosen_point = peak.chosen_point =
            static_cast<int>(time.series[static_cast<size_t>(si)].points.size()) - 1;
      }
    }
    out["dispatch_time.svg"] = tune::curve_svg(time);
    out["dispatch_peak.svg"] = tune::curve_svg(peak);
  }
  if (o.optimizer) {
    tune::Curve c{
        "optimizer: OffloadStreamAdamW step (" + shape + ", P = " + std::to_string(s.params) + ")",
        "device staging s x beta (MiB)",
        "median time (ms)",
        true,
        {},
        {},
        -1,
        -1,
        o.optimizer_choice.reason};
    c.references.push_back({1e3 * o.optimizer_sweep.floor_s,
                            "host-link floor " + ms(o.optimizer_sweep.floor_s) + " ms"});
    std::map<int64_t, int> series_of;  // s -> series
    for (size_t i = 0; i < o.optimizer_sweep.points.size(); ++i) {
      const tune::OptimizerPoint& p = o.optimizer_sweep.points[i];
      if (!series_of.count(p.staging_slots)) {
        series_of[p.staging_slots] = static_cast<int>(c.series.size());
        c.series.push_back({"s = " + std::to_string(p.staging_slots), {}});
      }
      auto& pts = c.series[static_cast<size_t>(series_of[p.staging_slots])].points;
      pts.push_back(
          {static_cast<double>(p.bound_bytes) / MiB, 1e3 * p.time.median_s,
           "beta = " + std::to_string(p.bucket_params) + ", s = " + std::to_string(p.staging_slots),
           p.plan_fits});
      if (i == o.optimizer_choice.index) {
        c.chosen_series = series_of[p.staging_slots];
        c.chosen_point = static_cast<int>(pts.size()) - 1;
      }
    }
    out["optimizer.svg"] = tune::curve_svg(c);
  }
  if (o.vocab) {
    tune::Curve c{"vocab: Ring-DTP forward + backward (" + shape + ")",
                  "strips kept from forward to backward",
                  "median time (ms)",
                  false,
                  {},
                  {},
                  -1,
                  -1,
                  o.vocab_choice.reason + "; " + o.kept_choice.reason};
    for (size_t i = 0; i < o.vocab_points.size(); ++i) {
      const tune::VocabPoint& p = o.vocab_points[i];
      auto series = std::find_if(c.series.begin(), c.series.end(),
                                 [&](const tune::CurveSeries& s) { return s.name == p.payload; });
      if (series == c.series.end())
        series = c.series.insert(c.series.end(), tune::CurveSeries{p.payload, {}});
      if (i == o.kept_choice.index) {
        c.chosen_series = static_cast<int>(series - c.series.begin());
        c.chosen_point = static_cast<int>(series->points.size());
      }
      series->points.push_back({static_cast<double>(p.kept_strips), 1e3 * p.time.median_s,
                                p.payload + ", " + std::to_string(p.kept_strips) + " kept",
                                p.plan_fits});
    }
    out["vocab.svg"] = tune::curve_svg(c);
  }
  if (o.sco) {
    tune::Curve c{"sco: step time over offloaded layers (" + shape + ")",
                  "layers offloaded |S|",
                  "median forward + backward (ms)",
                  false,
                  {},
                  {},
                  -1,
                  -1,
                  o.sco_choice.reason};
    const double standard_ms = 1e3 * o.sco_sweep.standard.median_s;
    c.references.push_back(
        {standard_ms, "standard checkpointing " + ms(o.sco_sweep.standard.median_s) + " ms"});
    c.references.push_back({standard_ms * (1 + sco_tolerance),
                            "standard + " +
                                std::to_string(static_cast<int>(100 * sco_tolerance + 0.5)) +
                                "% (the limit)"});
    c.series.push_back({"SCO", {}});
    for (const tune::ScoPoint& p : o.sco_sweep.points) {
      c.series[0].points.push_back(
          {static_cast<double>(p.offloaded_layers), 1e3 * p.time.median_s,
           p.label + " (" + std::to_string(p.offloaded_layers) + " layers)", p.plan_fits});
    }
    c.chosen_series = 0;
    c.chosen_point = static_cast<int>(o.sco_choice.index);
    out["sco.svg"] = tune::curve_svg(c);
  }
  return out;
}

// tuned.toml: the header (how to use it), then per section the chosen keys, each group after a
// comment with the rule and the numbers.
std::string tuned_toml(const Outcome& o, const Config& tuned, const TuneShape& s,
                       const std::string& command) {
  std::ostringstream t;
  auto value = [&](const char* key) { return config_value_toml(tuned, key); };
  auto line = [&](const char* key) {
    const std::string k(key);
    t << k.substr(k.find('.') + 1) << " = " << value(key) << "\n";
  };
  t << "# moepeak tune: chosen on " << process_host() << ", " << now_utc() << ", W = " << s.world
    << " rank(s), N = " << s.tokens
    << " tokens per rank (rules: docs/tune.md; curves: curves.json, *.svg).\n";
  t << "# A config fragment: load it after your config. The exact command:\n";
  t << "#   " << command << "\n";
  t << "# Each value says why it was chosen; delete a group to keep your own setting.\n";
  if (o.dispatch || o.vocab || o.sco) {
    t << "\n[schedules]\n";
    if (o.dispatch) {
      t << "# dispatch: " << o.dispatch_choice.reason << "\n";
      line("schedules.dispatch");
      line("schedules.chunk_tokens");
      line("schedules.max_chunks");
    }
    if (o.vocab) {
      t << "# vocab: " << o.vocab_choice.reason << "\n";
      line("schedules.vocab");
      line("schedules.ring_payload");
      t << "# " << o.kept_choice.reason << "\n";
      line("schedules.vocab_kept_strips");
    }
    if (o.sco) {
      t << "# checkpoint: " << o.sco_choice.reason << "\n";
      line("schedules.checkpoint");
      line("schedules.sco_host_budget");
    }
  }
  if (o.optimizer) {
    t << "\n[optimizer]\n";
    t << "# optimizer: " << o.optimizer_choice.reason << "\n";
    line("optimizer.placement");
    line("optimizer.bucket_params");
    line("optimizer.staging_slots");
  }
  return t.str();
}

// ---- The command ----------------------------------------------------------------------------

int run_tune(const TuneArgs& args, const Context& ctx) {
  const Config cfg = load_config_for_command(args.config, ctx);
  const RankInfo ranks = join_ranks();
  const bool root = ranks.rank == 0;
  const int W = ranks.world_size;
  TuneRequest request = args.request;
  if (!args.only.empty()) request.sweeps = {args.only.begin(), args.only.end()};
  const std::set<std::string>& only = request.sweeps;
  const TuneGrids grids = tune_grids(cfg, W, request);
  const TuneShape& shape = grids.shape;
  if (root) {
    std::printf(
        "# moepeak tune: %d points to measure (dispatch %zu, optimizer %zu, vocab %zu, sco %d "
        "steps) on "
        "W = %d rank%s, %d repetitions each after %d warm-up\n",
        grids.ticks, grids.dispatch_grid.size(), grids.optimizer_grid.size(),
        grids.vocab_grid.size(), grids.sco_steps, W, W == 1 ? "" : "s", args.request.repeats,
        args.request.warmup);
    std::fflush(stdout);
  }
  Outcome o;
  {
    Progress progress(grids.ticks, root, cfg.metrics.progress);
    o = tune_measure_and_select(cfg, ranks, grids, request,
                                [&](const std::string& what) { progress.tick(what); });
  }
  const Config& base = o.tuned;
  const PlanInputs& in = grids.in;

  // The command that uses the fragment: the user's configs and the --set overrides that do not
  // set a tuned key (a --set would win over tuned.toml), then tuned.toml.
  const std::string out_dir = args.out;
  const std::string tuned_path = out_dir + "/tuned.toml";
  std::set<std::string> tuned_set;
  for (const auto& [sweep, keys] : tuned_keys()) {
    if (only.count(sweep)) tuned_set.insert(keys.begin(), keys.end());
  }
  std::vector<std::string> kept;
  for (const std::string& ov : args.config.overrides) {
    const std::string key = ov.substr(0, ov.find('='));
    if (tuned_set.count(key)) {
      if (root)
        std::printf("# note: --set %s is left out of the command: tuned.toml sets %s\n", ov.c_str(),
                    key.c_str());
    } else {
      kept.push_back(ov);
    }
  }
  std::string command;
  if (W > 1)
    command = std::getenv("SLURM_JOB_ID") ? "srun -n " + std::to_string(W) + " "
                                          : "mpirun -np " + std::to_string(W) + " ";
  command += "moepeak train";
  for (const std::string& f : args.config.files) command += " --config " + shell_word(f);
  for (const std::string& ov : kept) command += " --set " + shell_word(ov);
  command += " --config " + shell_word(tuned_path);

  const Plan& final_plan = o.final_plan;
  const std::string toml = tuned_toml(o, base, shape, command);
  if (root) {
    print_tables(o, shape, args, final_plan);
    // Check the fragment re-loads on top of the user's config to exactly the planned settings.
    create_directories(out_dir);
    const std::string check_path =
        out_dir + "/.tuned.check." + std::to_string(::getpid()) + ".toml";
    write_file_atomically(check_path, toml);
    std::vector<std::string> files = args.config.files;
    files.push_back(check_path);
    Config reloaded;
    try {
      reloaded = load_config(files, kept);
    } catch (...) {
      std::remove(check_path.c_str());
      throw;
    }
    std::remove(check_path.c_str());
    const Plan reloaded_plan = make_plan(reloaded, in);
    MOEPEAK_CHECK(reloaded_plan.fits() && reloaded.schedules == base.schedules &&
                      reloaded.optimizer == base.optimizer,
                  "tune: tuned.toml does not re-load to the chosen settings");
    for (const auto& [name, svg] : plots(o, shape, args.request.sco_tolerance))
      write_file_atomically(out_dir + "/" + name, svg);
    write_file_atomically(out_dir + "/curves.json",
                          curves_json(o, shape, args, final_plan, command).dump(2) + "\n");
    write_file_atomically(tuned_path, toml);
    std::printf("# wrote %s, %s/curves.json and the plots; train with:\n#   %s\n",
                tuned_path.c_str(), out_dir.c_str(), command.c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

void register_tune_command(CLI::App& app, Context& ctx) {
  static TuneArgs args;
  auto* cmd = app.add_subcommand("tune",
                                 "measure the bounded schedules' curves on this machine and choose "
                                 "chunk size c, bucket size beta, "
                                 "slots s, the Ring-DTP payload and kept strips, and SCO's host "
                                 "budget (writes DIR/tuned.toml, "
                                 "curves.json, *.svg)");
  add_config_options(*cmd, args.config);
  cmd->add_option("--out", args.out, "directory for tuned.toml, curves.json and the plots")
      ->required();
  cmd->add_option("--repeats", args.request.repeats,
                  "timed repetitions per point (the median is used)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--warmup", args.request.warmup, "untimed repetitions first")
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--only", args.only,
                  "sweeps to run (default all): dispatch, optimizer, vocab, sco")
      ->delimiter(',')
      ->check(CLI::IsMember({"dispatch", "optimizer", "vocab", "sco"}));
  cmd->add_option("--dispatch-tolerance", args.request.dispatch_tolerance,
                  "the chunk rule's time tolerance over the fastest point (0.03 = 3%)")
      ->check(CLI::Range(0.0, 10.0));
  cmd->add_option("--optimizer-tolerance", args.request.optimizer_tolerance,
                  "the staging rule's time tolerance over the fastest point (0.05 = 5%)")
      ->check(CLI::Range(0.0, 10.0));
  cmd->add_option("--vocab-tolerance", args.request.vocab_tolerance,
                  "the kept-strips rule's time tolerance over the fastest point (0.03 = 3%)")
      ->check(CLI::Range(0.0, 10.0));
  cmd->add_option("--sco-tolerance", args.request.sco_tolerance,
                  "the SCO rule's overhead limit over standard checkpointing (0.03 = 3%)")
      ->check(CLI::Range(0.0, 10.0));
  cmd->callback([&ctx] {
    ctx.action = [&ctx] {
      const int rc = run_tune(args, ctx);
      finalize_process_group();
      return rc;
    };
  });
}

}  // namespace moepeak::cli
