// `moepeak tune`'s grids, measurements and choices (see tune_run.h).
#include "core/measure/tune_run.h"

#include "core/error.h"
#include "core/train/trainer.h"
#include "ops/schedules/vocab_ring_dtp.h"

namespace moepeak::measure {

PlanCheck plan_check(const Config& cfg, const PlanInputs& in) {
  try {
    const Plan p = make_plan(cfg, in);
    return {p.fits(), p.fits() ? std::string() : p.verdict()};
  } catch (const Error& e) {
    return {false, e.what()};
  }
}

namespace {

// Marks each point with whether `base` with the point's values applied (apply(config, point))
// fits the plan, and why not.
template <typename Point, typename Apply>
void plan_check_points(std::vector<Point>& points, const Config& base, const PlanInputs& in,
                       Apply&& apply) {
  for (Point& p : points) {
    Config c = base;
    apply(c, p);
    const PlanCheck pc = plan_check(c, in);
    p.plan_fits = pc.fits;
    p.plan_note = pc.note;
  }
}

}  // namespace

TuneGrids tune_grids(const Config& cfg, int world, const TuneRequest& request) {
  TuneGrids g;
  g.dispatch = request.sweeps.count("dispatch") > 0;
  g.optimizer = request.sweeps.count("optimizer") > 0;
  g.vocab = request.sweeps.count("vocab") > 0;
  g.sco = request.sweeps.count("sco") > 0;
  g.shape = tune_shape(cfg, world);
  g.in = plan_inputs(cfg, world);
  // The config every candidate is planned in: the user's, with each swept schedule switched on at
  // its configured knobs; each choice is applied to it in turn (optimizer, vocab, sco, dispatch).
  g.base = cfg;
  if (g.dispatch) g.base.schedules.dispatch = DispatchSchedule::pipelined_llep;
  if (g.optimizer) g.base.optimizer.placement = OptimizerPlacement::offload_stream;
  if (g.vocab) g.base.schedules.vocab = VocabSchedule::ring_dtp;
  if (g.sco) g.base.schedules.checkpoint = CheckpointSchedule::sco;
  if (g.dispatch) g.dispatch_grid = dispatch_grid(cfg, g.shape);
  if (g.optimizer) g.optimizer_grid = optimizer_grid(cfg, g.shape);
  // A kept strip holds N x strip logits: a point that cannot fit is not run.
  if (g.vocab) {
    for (VocabPayload payload : {VocabPayload::activations, VocabPayload::weights}) {
      for (int64_t kept : vocab_kept_grid(cfg, g.shape, payload)) {
        Config c = g.base;
        c.schedules.ring_payload = payload;
        c.schedules.vocab_kept_strips = kept;
        if (kept == 0 || plan_check(c, g.in).fits) g.vocab_grid.emplace_back(payload, kept);
      }
    }
  }
  SweepRun run;
  run.warmup = request.warmup;
  run.repeats = request.repeats;
  g.sco_steps = g.sco ? sco_ticks(run) : 0;
  g.ticks =
      static_cast<int>(g.dispatch_grid.size() + g.optimizer_grid.size() + g.vocab_grid.size()) +
      g.sco_steps;
  return g;
}

TuneOutcome tune_measure_and_select(const Config& cfg, const RankInfo& ranks, const TuneGrids& g,
                                    const TuneRequest& request,
                                    const std::function<void(const std::string&)>& tick) {
  TuneOutcome o;
  o.dispatch = g.dispatch;
  o.optimizer = g.optimizer;
  o.vocab = g.vocab;
  o.sco = g.sco;
  o.backend = uses_cuda_backend(cfg) ? "CUDA" : "CPU";
  SweepRun run;
  run.warmup = request.warmup;
  run.repeats = request.repeats;
  run.tick = tick;
  if (o.dispatch) o.dispatch_points = sweep_dispatch(cfg, ranks, g.shape, g.dispatch_grid, run);
  if (o.optimizer) o.optimizer_sweep = sweep_optimizer(cfg, ranks, g.shape, g.optimizer_grid, run);
  if (o.vocab) o.vocab_points = sweep_vocab(cfg, ranks, g.shape, g.vocab_grid, run);
  if (o.sco) o.sco_sweep = sweep_sco(cfg, ranks, g.shape, run);

  // Selection, on the measured points only; every rank has the same numbers.
  Config base = g.base;
  const PlanInputs& in = g.in;
  if (o.optimizer) {
    plan_check_points(o.optimizer_sweep.points, base, in,
                      [](Config& c, const tune::OptimizerPoint& p) {
                        c.optimizer.bucket_params = p.bucket_params;
                        c.optimizer.staging_slots = p.staging_slots;
                      });
    o.optimizer_choice =
        tune::select_staging(o.optimizer_sweep.points, request.optimizer_tolerance);
    const tune::OptimizerPoint& p = o.optimizer_sweep.points[o.optimizer_choice.index];
    base.optimizer.bucket_params = p.bucket_params;
    base.optimizer.staging_slots = p.staging_slots;
  }
  if (o.vocab) {
    plan_check_points(o.vocab_points, base, in, [](Config& c, const tune::VocabPoint& p) {
      c.schedules.ring_payload = enum_from_name<VocabPayload>(p.payload).value();
      c.schedules.vocab_kept_strips = p.kept_strips;
    });
    const VocabPayload preferred = schedules::ring_dtp_resolve_payload(
        VocabPayload::automatic, g.shape.tokens, g.shape.vocab, g.shape.world);
    o.vocab_choice = tune::select_payload(o.vocab_points, std::string(enum_name(preferred)));
    const std::string payload = o.vocab_points[o.vocab_choice.index].payload;
    o.kept_choice = tune::select_kept_strips(o.vocab_points, payload, request.vocab_tolerance);
    base.schedules.ring_payload = enum_from_name<VocabPayload>(payload).value();
    base.schedules.vocab_kept_strips = o.vocab_points[o.kept_choice.index].kept_strips;
  }
  if (o.sco) {
    plan_check_points(o.sco_sweep.points, base, in, [](Config& c, const tune::ScoPoint& p) {
      c.schedules.sco_host_budget = std::to_string(p.host_budget);
    });
    o.sco_choice = tune::select_sco(o.sco_sweep.points, request.sco_tolerance);
    base.schedules.sco_host_budget =
        std::to_string(o.sco_sweep.points[o.sco_choice.index].host_budget);
  }
  if (o.dispatch) {
    plan_check_points(o.dispatch_points, base, in, [](Config& c, const tune::DispatchPoint& p) {
      c.schedules.chunk_tokens = p.chunk_tokens;
      c.schedules.max_chunks = p.max_chunks;
    });
    o.dispatch_choice = tune::select_chunk(o.dispatch_points, request.dispatch_tolerance);
    base.schedules.chunk_tokens = o.dispatch_points[o.dispatch_choice.index].chunk_tokens;
    base.schedules.max_chunks = o.dispatch_points[o.dispatch_choice.index].max_chunks;
  }

  // The plan with every choice applied must fit.
  o.final_plan = make_plan(base, in);
  if (!o.final_plan.fits()) {
    MOEPEAK_INPUT_ERROR("tune: the plan with the chosen values does not fit: ",
                        o.final_plan.verdict());
  }
  o.tuned = base;
  return o;
}

}  // namespace moepeak::measure
