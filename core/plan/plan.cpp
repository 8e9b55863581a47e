// make_plan: one small function per live-set term, each from its schedule's choice point
// (ops/schedules/*_choice.h: the bytes of the configured schedule, its formula and its name) or
// the model's own functions (see plan.h and docs/plan.md for the table of functions).
// Test: ctest -R 'test_plan|test_schedule_choice'
#include "core/plan/plan.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "core/model/checkpoint_snapshot.h"
#include "core/model/decoder.h"
#include "core/model/decoder_memory.h"
#include "core/model/zero_params.h"
#include "core/model/zero_traffic.h"
#include "core/runtime/arena.h"
#include "core/runtime/backend.h"
#include "core/units.h"
#include "ops/schedules/checkpoint_choice.h"
#include "ops/schedules/dispatch_choice.h"
#include "ops/schedules/optimizer_choice.h"
#include "ops/schedules/vocab_choice.h"
#include "topology/auto_budget.h"

namespace moepeak {
namespace {

std::string args(std::initializer_list<std::pair<const char*, int64_t>> kv) {
  return schedules::formula_args(kv);
}

double pct(uint64_t part, uint64_t whole) {
  return whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

void check_positive(const char* key, int64_t v) {
  if (v <= 0) MOEPEAK_INPUT_ERROR(key, " = ", v, ": must be positive for a plan");
}

}  // namespace

PlanInputs plan_inputs(const Config& cfg, int world) {
  PlanInputs in;
  if (world < 0) MOEPEAK_INPUT_ERROR("--world-size ", world, ": must be positive");
  const int W = world > 0                        ? world
                : cfg.parallelism.world_size > 0 ? static_cast<int>(cfg.parallelism.world_size)
                                                 : 1;
  in.degrees = ParallelDegrees::resolve(cfg.parallelism, W);
  in.batch = cfg.training.batch_size;
  in.grad_accum = cfg.training.grad_accum_steps;
  in.seq_len = cfg.training.seq_len;
  const bool cuda = cfg.runtime.backend == BackendChoice::cuda;
  switch (cfg.training.dtype) {
    case ComputeDtype::float32:
      in.dtype = DType::f32;
      break;
    case ComputeDtype::bfloat16:
      in.dtype = DType::bf16;
      break;
    case ComputeDtype::automatic:
      in.dtype = cuda ? DType::bf16 : DType::f32;
      break;
  }
  if (auto d = cfg.runtime.device_memory_bytes()) {
    in.capacity = *d;
  } else if (cuda) {
    MOEPEAK_INPUT_ERROR(
        "runtime.device_memory = \"auto\" with runtime.backend = \"cuda\": the plan needs "
        "the device's capacity; set it (e.g. --set runtime.device_memory=141GiB for an H200)");
  } else {
    in.capacity = Backend::kCpuDefaultDeviceMemory;  // what the CPU arena takes for "auto"
  }
  // The pinned budget a rank's run takes (runtime.pinned_memory; "auto": the probe file's budget
  // of local rank 0 — the budgets of a node's ranks are equal shares — else the CPU default).
  in.host_budget = topology::pinned_memory_budget(cfg, 0, 0, 1, /*cpu_backend=*/!cuda);
  return in;
}

namespace {

// The shapes every term is a function of (N for the largest rank).
struct PlanSizes {
  ParallelDegrees d;
  int W = 1;
  DType dt = DType::f32;
  int64_t B = 0, T = 0, N = 0;
  int64_t H = 0, F = 0, V = 0, L = 0, k = 0, E = 0;
  int64_t L_moe = 0;  // layers with experts (the family's description)
};

// Throws (naming the key) for a config the model cannot lay out on W ranks or whose shapes are
// not positive.
void check_plan_inputs(const Config& cfg, const PlanInputs& in) {
  const ModelConfig& m = cfg.model;
  check_positive("training.batch_size", in.batch);
  check_positive("training.seq_len", in.seq_len);
  check_positive("model.hidden_size", m.hidden_size);
  check_positive("model.num_hidden_layers", m.num_hidden_layers);
  check_positive("model.vocab_size", m.vocab_size);
  const ParallelDegrees& d = in.degrees;
  if (d.world < 1) MOEPEAK_INPUT_ERROR("world size ", d.world, ": must be positive");
  try {
    DecoderModel::check_layout(m, in.batch, in.seq_len, d);
  } catch (const Error& e) {
    MOEPEAK_INPUT_ERROR("this config cannot be laid out on W = ", d.world, " ranks (", d.str(),
                        "): ", nested_message(e));
  }
  schedules::check_vocab_schedule(cfg.schedules, m.vocab_size, d.world);
}

PlanSizes sizes_of(const Config& cfg, const PlanInputs& in) {
  const ModelConfig& m = cfg.model;
  PlanSizes z;
  z.d = in.degrees;
  z.W = in.degrees.world;
  z.dt = in.dtype;
  z.B = in.batch;
  z.T = in.seq_len;
  z.N = in.batch * in.seq_len / z.W;
  z.H = m.hidden_size;
  z.F = m.expert_intermediate_size();
  z.V = m.vocab_size;
  z.L = m.num_hidden_layers;
  z.k = m.num_experts_per_tok;
  z.E = m.num_local_experts;
  z.L_moe = describe_decoder(m).moe_layers();
  return z;
}

void set(Plan& p, LiveSet ls, uint64_t bytes, std::string function, std::string_view schedule) {
  p.terms[static_cast<size_t>(ls)] =
      PlanTerm{ls, bytes, std::move(function), std::string(schedule)};
}

void set(Plan& p, LiveSet ls, schedules::ScheduleBytes b) {
  set(p, ls, b.bytes, std::move(b.function), b.schedule);
}

void add_host(Plan& p, const std::vector<schedules::HostBytes>& host) {
  for (const schedules::HostBytes& h : host) p.host.push_back({h.name, h.bytes, h.function});
}

// The bytes per phase of the sets whose phases are not just their term or nothing.
struct SetPhases {
  PhaseBytes weights, grads, boundaries, attention, workspace;
  uint64_t setup = 0;  // the persistent shards: allocated at setup, below every hole
};

// weights, grads: the persistent shards + local experts, and the gathered groups live at once
// over a pass (with the prefetch depth's groups ahead and a reduce-scatter behind), with the LM
// head as the vocabulary schedule stores it; per phase the groups of its uses (the optimizer's
// none).
void add_weights_and_grads(Plan& p, const Config& cfg, const PlanSizes& z, SetPhases& phases) {
  const LmHeadSharding head = lm_head_sharding(cfg.schedules.vocab);
  const bool rows = head == LmHeadSharding::vocab_rows;
  const int depth = static_cast<int>(cfg.parallelism.zero_prefetch_depth);
  const ZeroBytes zp = zero_persistent_bytes(cfg.model, z.dt, z.d, head);
  // Per phase, and over the pass their largest (zero_pass_gathered_bytes, computed once).
  const std::array<ZeroBytes, kNumStepPhases> gathered =
      zero_phase_gathered_bytes(cfg.model, z.dt, z.d, head, depth);
  ZeroBytes zg;
  for (const ZeroBytes& g : gathered) {
    zg.weights = std::max(zg.weights, g.weights);
    zg.grads = std::max(zg.grads, g.grads);
  }
  const std::string zargs = "(W=" + std::to_string(z.W) +
                            (z.d.is_uniform() ? std::string()
                                              : ", Ep=" + std::to_string(z.d.expert) +
                                                    ", Ds=" + std::to_string(z.d.data_shard)) +
                            (rows ? ", vocab_rows)" : ")");
  std::string pass_args = zargs;
  pass_args.insert(pass_args.size() - 1, ", depth=" + std::to_string(depth));
  const std::string function =
      "zero_persistent_bytes" + zargs + " + zero_pass_gathered_bytes" + pass_args;
  const std::string_view schedule = rows ? "zero3+vocab_rows" : "zero3";
  set(p, LiveSet::weights, zp.weights + zg.weights, function, schedule);
  set(p, LiveSet::grads, zp.grads + zg.grads, function, schedule);
  for (StepPhase ph : kAllStepPhases) {
    phases.weights[ph] = zp.weights + gathered[static_cast<size_t>(ph)].weights;
    phases.grads[ph] = zp.grads + gathered[static_cast<size_t>(ph)].grads;
  }
  phases.setup = zp.weights + zp.grads;
}

// optimizer (device) and its host state, for this rank's P flat parameter elements. Returns the
// host bytes it holds (live in the pinned pool when a step starts).
uint64_t add_optimizer(Plan& p, const Config& cfg, const PlanSizes& z) {
  const int64_t P = zero_persistent_elements(cfg.model, z.d, lm_head_sharding(cfg.schedules.vocab));
  schedules::OptimizerBytes o = schedules::optimizer_bytes(cfg.optimizer, P, z.dt);
  set(p, LiveSet::optimizer, std::move(o.device));
  add_host(p, o.host);
  return o.host_total();
}

// An asynchronous checkpoint's pinned snapshot (checkpoint.enable and checkpoint.async): a host
// copy of the P elements of every saved flat. Returns its bytes (live in the pool from setup).
uint64_t add_checkpoint_snapshot(Plan& p, const Config& cfg, const PlanSizes& z) {
  if (!cfg.checkpoint.enable || !cfg.checkpoint.async) return 0;
  const int64_t P = zero_persistent_elements(cfg.model, z.d, lm_head_sharding(cfg.schedules.vocab));
  const uint64_t bytes = checkpoint_snapshot_bytes(P, checkpoint_flat_dtypes(z.dt));
  p.host.push_back({"checkpoint_snapshot", bytes,
                    "checkpoint_snapshot_bytes(" + args({{"P", P}}) + ", " +
                        std::string(dtype_name(z.dt)) + " weights + AdamW state)"});
  return bytes;
}

// "W=8" or "W=8, Ep=2, Sp=4, Ds=8" for the functions' arguments.
std::string layout_args(const ParallelDegrees& d) {
  if (d.is_uniform()) return args({{"W", d.world}});
  return args({{"W", d.world}, {"Ep", d.expert}, {"Sp", d.sequence}, {"Ds", d.data_shard}});
}

// attention: the model's own function (with Ulysses' staging when Sp > 1), its peak over the
// phases.
void add_attention(Plan& p, const Config& cfg, const PlanSizes& z, SetPhases& phases) {
  phases.attention =
      attention_phase_bytes(cfg.model, z.B, z.T, z.d, cfg.schedules.checkpoint, z.dt);
  set(p, LiveSet::attention, phases.attention.max(),
      "attention_bytes(" + args({{"B", z.B}, {"T", z.T}}) + ", " + layout_args(z.d) + ")",
      z.d.sequence > 1 ? "ulysses" : "local");
}

// workspace: the model's own function, its peak over the phases.
void add_workspace(Plan& p, const Config& cfg, const PlanSizes& z, SetPhases& phases) {
  const bool documents = cfg.training.document_mask;
  phases.workspace =
      workspace_phase_bytes(cfg.model, z.B, z.T, z.d, cfg.schedules, z.dt, documents);
  set(p, LiveSet::workspace, phases.workspace.max(),
      "workspace_bytes(" + args({{"B", z.B}, {"T", z.T}}) + ", " + layout_args(z.d) +
          (documents ? ", documents" : "") + ")",
      "model");
}

// dispatch, and what the dispatcher adds to weights and grads (LLEP's spilled-expert copies:
// PipelinedLLEP's within its forward and backward, LLEP's until the layer is released).
void add_dispatch(Plan& p, const Config& cfg, const PlanSizes& z, SetPhases& phases) {
  const SchedulesConfig& s = cfg.schedules;
  schedules::DispatchShape shape{
      z.N, z.k, z.H, z.F, z.E, z.d.expert, schedules::resident_layers(s.checkpoint, z.L_moe), z.dt};
  const DecoderSpec& spec = cached_param_layout(cfg.model).spec();
  shape.expert_biases = std::any_of(spec.layers.begin(), spec.layers.end(),
                                    [](const LayerSpec& l) { return l.mlp.moe() && l.mlp.bias; });
  set(p, LiveSet::dispatch, schedules::dispatch_bytes(s, shape));
  if (const auto spill = schedules::dispatch_spill_bytes(s, shape)) {
    PlanTerm& wt = p.terms[static_cast<size_t>(LiveSet::weights)];
    wt.bytes += spill->weights;
    wt.function += " + " + spill->weights_function;
    wt.schedule += "+" + spill->schedule;
    PlanTerm& gt = p.terms[static_cast<size_t>(LiveSet::grads)];
    gt.bytes += spill->grads;
    gt.function += " + " + spill->grads_function;
    gt.schedule += "+" + spill->schedule;
    const bool pipelined = s.dispatch == DispatchSchedule::pipelined_llep;
    for (StepPhase ph : kAllStepPhases) {
      const bool experts = ph == StepPhase::forward_experts || ph == StepPhase::backward_experts;
      const bool layers = ph != StepPhase::embedding && ph != StepPhase::optimizer;
      if (pipelined ? experts : layers) {
        phases.weights[ph] += spill->weights;
        phases.grads[ph] += spill->grads;
      }
    }
  }
}

// logits: the vocabulary schedule's.
void add_logits(Plan& p, const Config& cfg, const PlanSizes& z) {
  set(p, LiveSet::logits, schedules::vocab_bytes(cfg.schedules, {z.N, z.H, z.V, z.W, z.dt}));
}

// boundaries (device) and SCO's pinned block; `host_live` is what the optimizer holds in the
// pool when a step starts (SCO's "auto" budget is the rest); its device bytes per phase.
void add_boundaries(Plan& p, const Config& cfg, const PlanSizes& z, uint64_t host_live,
                    SetPhases& phases) {
  schedules::BoundariesBytes b = schedules::boundaries_bytes(
      cfg.schedules, {z.L, z.N, z.H, z.dt, p.inputs.host_budget, host_live});
  p.sco_offloaded_layers = b.offloaded_layers;
  set(p, LiveSet::boundaries, std::move(b.device));
  add_host(p, b.host);
  phases.boundaries = b.phases;
}

// CUDA: the device memory beside the arena (outside_arena.h), for this layout's communicators.
void add_outside_arena(Plan& p, const Config& cfg) {
  if (cfg.runtime.backend != BackendChoice::cuda) return;
  const OutsideArena o = model_outside_arena(p.inputs.degrees, cfg);
  p.communicators = o.inputs.group_communicators;
  p.outside = o.terms;
  p.outside_total = o.total();
}

// Each phase: the weights, grads, attention, boundaries and workspace as `phases` has them,
// every other set's term where it may hold bytes (live_in_phase); the total is the largest phase
// and the allocator's allowance.
void add_phases(Plan& p, const Config& cfg, const SetPhases& phases) {
  for (StepPhase ph : kAllStepPhases) {
    PlanPhase& phase = p.phases[static_cast<size_t>(ph)];
    phase.phase = ph;
    for (LiveSet s : kAllLiveSets) {
      uint64_t bytes;
      if (s == LiveSet::attention) {
        bytes = phases.attention[ph];
      } else if (s == LiveSet::workspace) {
        bytes = phases.workspace[ph];
      } else if (s == LiveSet::boundaries) {
        bytes = phases.boundaries[ph];
      } else if (s == LiveSet::weights) {
        bytes = phases.weights[ph];
      } else if (s == LiveSet::grads) {
        bytes = phases.grads[ph];
      } else {
        bytes = live_in_phase(s, ph, cfg.schedules, cfg.optimizer.placement) ? p.term(s).bytes : 0;
      }
      phase.bytes[static_cast<size_t>(s)] = bytes;
      phase.total += bytes;
    }
    if (phase.total > p.phase(p.peak_phase).total) p.peak_phase = ph;
  }
  // What the setup allocates (the shards, a resident optimizer's state) sits contiguous at the
  // arena's start; the allocator's holes are among the rest.
  const PlanPhase& peak = p.phase(p.peak_phase);
  p.setup = phases.setup + (cfg.optimizer.placement == OptimizerPlacement::resident
                                ? p.term(LiveSet::optimizer).bytes
                                : 0);
  p.fragmentation =
      DeviceArena::fragmentation_allowance(peak.total - std::min(peak.total, p.setup));
  p.total = peak.total + p.fragmentation;
}

void add_totals(Plan& p) {
  for (const PlanTerm& t : p.terms) p.sum_of_terms += t.bytes;
  for (const HostTerm& h : p.host) p.host_total += h.bytes;
  p.device_fits = p.total <= p.inputs.capacity;
  p.host_fits = p.host_total <= p.inputs.host_budget;
}

}  // namespace

// A list of terms, one per live set, in the order their inputs need (the spill copies join the
// weights and grads with the dispatch term; SCO's "auto" budget follows the optimizer's host).
Plan make_plan(const Config& cfg, const PlanInputs& in) {
  check_plan_inputs(cfg, in);
  const PlanSizes z = sizes_of(cfg, in);
  Plan p;
  p.inputs = in;
  p.tokens_per_rank = z.N;
  SetPhases phases;
  add_weights_and_grads(p, cfg, z, phases);
  const uint64_t optimizer_host = add_optimizer(p, cfg, z);
  const uint64_t snapshot_host = add_checkpoint_snapshot(p, cfg, z);
  add_attention(p, cfg, z, phases);
  add_workspace(p, cfg, z, phases);
  add_dispatch(p, cfg, z, phases);
  add_logits(p, cfg, z);
  add_boundaries(p, cfg, z, optimizer_host + snapshot_host, phases);
  add_outside_arena(p, cfg);
  add_phases(p, cfg, phases);
  add_totals(p);
  return p;
}

std::vector<std::string> Plan::overflow() const {
  std::vector<std::string> out;
  if (!device_fits) {
    for (const PlanTerm& t : terms) {  // a set that does not fit on its own
      if (t.bytes > inputs.capacity) {
        out.push_back(std::string(live_set_name(t.set)) + " " + format_bytes(t.bytes) +
                      " > capacity " + format_bytes(inputs.capacity) + " by " +
                      format_bytes(t.bytes - inputs.capacity));
      }
    }
    if (out.empty()) {  // per phase over the capacity, its largest sets that exceed the overflow
      std::vector<PlanPhase> over_phases;
      for (PlanPhase ph : phases) {
        ph.total += fragmentation;  // the allocator's allowance, as the peak phase's
        if (ph.total > inputs.capacity) over_phases.push_back(ph);
      }
      std::sort(over_phases.begin(), over_phases.end(),
                [](const PlanPhase& a, const PlanPhase& c) { return a.total > c.total; });
      std::vector<LiveSet> named;
      for (const PlanPhase& ph : over_phases) {
        std::vector<LiveSet> sets(kAllLiveSets.begin(), kAllLiveSets.end());
        std::stable_sort(sets.begin(), sets.end(),
                         [&](LiveSet a, LiveSet c) { return ph[a] > ph[c]; });
        uint64_t removed = 0;
        for (LiveSet s : sets) {
          if (removed >= ph.total - inputs.capacity) break;
          removed += ph[s];
          if (std::find(named.begin(), named.end(), s) != named.end()) continue;
          named.push_back(s);
          out.push_back(std::string(live_set_name(s)) + " " + format_bytes(ph[s]) + " (" +
                        std::to_string(static_cast<int>(pct(ph[s], inputs.capacity) + 0.5)) +
                        "% of capacity, " + std::string(step_phase_name(ph.phase)) + ")");
        }
      }
    }
  }
  if (!host_fits) {
    for (const HostTerm& h : host) {
      if (h.bytes > 0) out.push_back("host " + h.name + " " + format_bytes(h.bytes));
    }
  }
  return out;
}

std::string Plan::verdict() const {
  std::ostringstream os;
  if (fits()) {
    os << "FITS: device " << format_bytes(total) << " (" << step_phase_name(peak_phase) << ") of "
       << format_bytes(inputs.capacity) << " ("
       << static_cast<int>(pct(total, inputs.capacity) + 0.5) << "%), host "
       << format_bytes(host_total) << " of " << format_bytes(inputs.host_budget);
    return os.str();
  }
  os << "DOES NOT FIT:";
  if (!device_fits) {
    os << " device total " << format_bytes(total) << " (" << step_phase_name(peak_phase)
       << ") > capacity " << format_bytes(inputs.capacity) << " by "
       << format_bytes(total - inputs.capacity) << ";";
  }
  if (!host_fits) {
    os << " host " << format_bytes(host_total) << " > budget " << format_bytes(inputs.host_budget)
       << " by " << format_bytes(host_total - inputs.host_budget) << ";";
  }
  const auto terms_over = overflow();
  os << " overflowing: ";
  for (size_t i = 0; i < terms_over.size(); ++i) os << (i ? ", " : "") << terms_over[i];
  return os.str();
}

Config with_standard_schedules(const Config& cfg) {
  Config c = cfg;
  c.schedules.dispatch = DispatchSchedule::standard;
  c.schedules.vocab = VocabSchedule::materialized;
  c.schedules.checkpoint = CheckpointSchedule::standard;
  c.optimizer.placement = OptimizerPlacement::resident;
  return c;
}

namespace {

// The largest v in [1, limit] (in units of `step`) with fits(v), assuming fits is monotone
// (more tokens never need less memory); layouts that cannot split count as not fitting.
template <class Fits>
int64_t search(int64_t step, int64_t limit, Fits fits) {
  auto ok = [&](int64_t v) {
    try {
      return fits(v);
    } catch (const Error&) {
      return false;
    }
  };
  int64_t lo = 0, hi = step;  // lo fits (or 0), hi is the next candidate
  while (hi <= limit && ok(hi)) {
    lo = hi;
    hi *= 2;
  }
  hi = std::min(hi, limit + step);
  while (hi - lo > step) {  // invariant: lo fits or is 0, hi does not (or is past the limit)
    const int64_t mid = lo + (hi - lo) / 2 / step * step;
    if (mid == lo) break;
    if (ok(mid))
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

}  // namespace

int64_t max_seq_len(const Config& cfg, const PlanInputs& inputs, int64_t limit) {
  return search(inputs.degrees.sequence, limit, [&](int64_t T) {
    PlanInputs in = inputs;
    in.seq_len = T;
    return make_plan(cfg, in).fits();
  });
}

int64_t max_batch(const Config& cfg, const PlanInputs& inputs, int64_t limit) {
  return search(inputs.degrees.sequence_groups(), limit, [&](int64_t B) {
    PlanInputs in = inputs;
    in.batch = B;
    return make_plan(cfg, in).fits();
  });
}

}  // namespace moepeak
