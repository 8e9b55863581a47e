// `moepeak tune`'s work, short of printing and files: the grids of the requested sweeps (each
// candidate checked against the plan first where a point could not fit), the measurements
// (sweeps.h), and the choice of each sweep's value by docs/tune.md's rules (core/tune/select.h),
// applied in turn (optimizer, vocab, sco, dispatch) to a config in which every swept schedule is
// on; then the plan of the chosen config, which must fit.
//
//   TuneGrids g = tune_grids(cfg, W, request);          // what will be measured (no work yet)
//   TuneOutcome o = tune_measure_and_select(cfg, ranks, g, request, tick);  // every rank at once
//   o.tuned        the config with the chosen values; o.final_plan its plan (fits)
//
// Every rank measures together and sees the same numbers (times and peaks are maxima over the
// ranks), so every rank chooses the same values. Errors: a rule that finds no point names its
// constraint; a chosen config whose plan does not fit names the verdict. Test: ctest -R
// test_measure (tests/measure), test_tune_cli.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/config/config.h"
#include "core/measure/sweeps.h"
#include "core/plan/plan.h"
#include "core/tune/select.h"

namespace moepeak::measure {

struct TuneRequest {
  std::set<std::string> sweeps = {"dispatch", "optimizer", "vocab", "sco"};
  int warmup = 1, repeats = 5;
  double dispatch_tolerance = 0.03, optimizer_tolerance = 0.05, vocab_tolerance = 0.03,
         sco_tolerance = 0.03;
};

// Whether `cfg` fits its plan on in.world() ranks, and why not (the verdict, or the layout error).
struct PlanCheck {
  bool fits = false;
  std::string note;
};
PlanCheck plan_check(const Config& cfg, const PlanInputs& in);

struct TuneGrids {
  bool dispatch = false, optimizer = false, vocab = false, sco = false;  // the requested sweeps
  TuneShape shape;
  PlanInputs in;
  Config base;  // the user's config with every requested sweep's schedule switched on
  std::vector<std::pair<int64_t, int64_t>> dispatch_grid;   // (c, K_max)
  std::vector<std::pair<int64_t, int64_t>> optimizer_grid;  // (beta, s)
  // (payload, K): K = 0 always, K > 0 only where the plan of `base` with it fits.
  std::vector<std::pair<VocabPayload, int64_t>> vocab_grid;
  int sco_steps = 0;  // the SCO sweep's steps (sco_ticks), 0 when it does not run
  int ticks = 0;      // measured points + SCO steps: the progress bar's total
};
// Error (naming the key) when the config cannot be laid out on `world` ranks.
TuneGrids tune_grids(const Config& cfg, int world, const TuneRequest& request);

struct TuneOutcome {
  bool dispatch = false, optimizer = false, vocab = false, sco = false;  // which sweeps ran
  const char* backend = "CPU";  // where the sweeps measured: "CPU" or "CUDA"
  std::vector<tune::DispatchPoint> dispatch_points;
  OptimizerSweep optimizer_sweep;
  std::vector<tune::VocabPoint> vocab_points;
  ScoSweepResult sco_sweep;
  tune::Choice dispatch_choice, optimizer_choice, vocab_choice, sco_choice;
  tune::Choice kept_choice;  // the chosen vocab point (vocab_choice: its payload's unkept point)
  Config tuned;              // the base config with every choice applied
  Plan final_plan;           // tuned's plan; it fits
};
// `tick(text)` after every measured point (sweeps.h).
TuneOutcome tune_measure_and_select(const Config& cfg, const RankInfo& ranks,
                                    const TuneGrids& grids, const TuneRequest& request,
                                    const std::function<void(const std::string&)>& tick);

}  // namespace moepeak::measure
