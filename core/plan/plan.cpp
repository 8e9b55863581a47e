// make_plan: each live set's term from its schedule's own byte function (see plan.h and
// docs/plan.md for the table of functions). Test: ctest -R test_plan
#include "core/plan/plan.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "core/model/mixtral.h"
#include "core/model/mixtral_memory.h"
#include "core/model/zero_params.h"
#include "core/runtime/backend.h"
#include "core/units.h"
#include "ops/schedules/adamw_host_state.h"
#include "ops/schedules/adamw_offload_serial.h"
#include "ops/schedules/adamw_offload_stream.h"
#include "ops/schedules/adamw_resident.h"
#include "ops/schedules/checkpoint_sco.h"
#include "ops/schedules/checkpoint_standard.h"
#include "ops/schedules/dispatch_expert_parallel.h"
#include "ops/schedules/dispatch_llep.h"
#include "ops/schedules/dispatch_pipelined_llep.h"
#include "ops/schedules/dispatch_standard.h"
#include "ops/schedules/llep_experts.h"
#include "ops/schedules/vocab_materialized.h"
#include "ops/schedules/vocab_ring_dtp.h"
#include "topology/auto_budget.h"

namespace moepeak {
namespace {

std::string args(std::initializer_list<std::pair<const char*, int64_t>> kv) {
  std::string s;
  for (const auto& [k, v] : kv)
    s += (s.empty() ? "" : ", ") + std::string(k) + "=" + std::to_string(v);
  return s;
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
  in.world = world > 0                        ? world
             : cfg.parallelism.world_size > 0 ? static_cast<int>(cfg.parallelism.world_size)
                                              : 1;
  in.batch = cfg.training.batch_size;
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

Plan make_plan(const Config& cfg, const PlanInputs& in) {
  const ModelConfig& m = cfg.model;
  const SchedulesConfig& s = cfg.schedules;
  check_positive("training.batch_size", in.batch);
  check_positive("training.seq_len", in.seq_len);
  check_positive("model.hidden_size", m.hidden_size);
  check_positive("model.num_hidden_layers", m.num_hidden_layers);
  check_positive("model.vocab_size", m.vocab_size);
  if (in.world < 1) MOEPEAK_INPUT_ERROR("world size ", in.world, ": must be positive");
  try {
    MixtralModel::check_layout(m, in.batch, in.seq_len, in.world);
  } catch (const Error& e) {
    MOEPEAK_INPUT_ERROR("this config cannot be laid out on W = ", in.world,
                        " ranks: ", nested_message(e));
  }
  if (s.vocab == VocabSchedule::ring_dtp && m.vocab_size < in.world) {
    MOEPEAK_INPUT_ERROR("schedules.vocab = \"ring_dtp\" needs model.vocab_size (", m.vocab_size,
                        ") >= the world size (", in.world, ")");
  }

  Plan p;
  p.inputs = in;
  const int W = in.world;
  const DType dt = in.dtype;
  const int64_t N = in.batch * in.seq_len / W, H = m.hidden_size, F = m.intermediate_size;
  const int64_t V = m.vocab_size, L = m.num_hidden_layers, k = m.num_experts_per_tok;
  p.tokens_per_rank = N;
  auto set = [&](LiveSet ls, uint64_t bytes, std::string function, std::string_view schedule) {
    p.terms[static_cast<size_t>(ls)] =
        PlanTerm{ls, bytes, std::move(function), std::string(schedule)};
  };

  // weights, grads: the persistent shards + local experts, and the largest gathered group.
  const LmHeadSharding head = lm_head_sharding(s.vocab);
  const ZeroBytes zp = zero_persistent_bytes(m, dt, W, head);
  const ZeroBytes zg = zero_largest_gathered_bytes(m, dt, W, head);
  const int64_t P = zero_persistent_elements(m, W, head);
  const std::string zargs =
      "(W=" + std::to_string(W) + (head == LmHeadSharding::vocab_rows ? ", vocab_rows)" : ")");
  set(LiveSet::weights, zp.weights + zg.weights,
      "zero_persistent_bytes" + zargs + " + zero_largest_gathered_bytes" + zargs,
      head == LmHeadSharding::vocab_rows ? "zero3+vocab_rows" : "zero3");
  set(LiveSet::grads, zp.grads + zg.grads,
      "zero_persistent_bytes" + zargs + " + zero_largest_gathered_bytes" + zargs,
      head == LmHeadSharding::vocab_rows ? "zero3+vocab_rows" : "zero3");

  // optimizer (device) and its host state: fp32 (docs/design.md#the-schedules; the CPU optimizers
  // keep it in the compute dtype, f32 there). With bf16 working weights the resident state is an
  // fp32 master, m and v (adamw_resident_bytes of the working dtype); the offloaded state is fp32
  // either way.
  const OptimizerConfig& o = cfg.optimizer;
  const DType st = DType::f32;
  const std::string_view placement = enum_name(o.placement);
  uint64_t host_before_sco = 0;
  switch (o.placement) {
    case OptimizerPlacement::resident:
      set(LiveSet::optimizer, schedules::adamw_resident_bytes(P, dt),
          "adamw_resident_bytes(" + args({{"P", P}}) + ")", placement);
      break;
    case OptimizerPlacement::offload_serial: {
      set(LiveSet::optimizer, 0, "0 (host AdamW)", placement);
      const uint64_t state = schedules::adamw_offload_host_bytes(P, st);
      const uint64_t grads = schedules::adamw_offload_serial_grad_bytes(P, st);
      p.host.push_back(
          {"optimizer_state", state, "adamw_offload_host_bytes(" + args({{"P", P}}) + ")"});
      p.host.push_back({"optimizer_grad_copy", grads,
                        "adamw_offload_serial_grad_bytes(" + args({{"P", P}}) + ")"});
      host_before_sco = state + grads;
      break;
    }
    case OptimizerPlacement::offload_stream: {
      const auto shape = schedules::offload_stream_shape(P, o.bucket_params, o.staging_slots);
      set(LiveSet::optimizer, schedules::adamw_offload_stream_bytes(shape.bucket, shape.slots, st),
          "adamw_offload_stream_bytes(" + args({{"bucket", shape.bucket}, {"slots", shape.slots}}) +
              ")",
          placement);
      const uint64_t state = schedules::adamw_offload_host_bytes(P, st);
      p.host.push_back(
          {"optimizer_state", state, "adamw_offload_host_bytes(" + args({{"P", P}}) + ")"});
      host_before_sco = state;
      break;
    }
  }

  // attention, workspace: the model's own functions.
  set(LiveSet::attention, attention_bytes(m, in.batch, in.seq_len, W, s.checkpoint, dt),
      "attention_bytes(" + args({{"B", in.batch}, {"T", in.seq_len}, {"W", W}}) + ")",
      W > 1 ? "ulysses" : "local");
  set(LiveSet::workspace, workspace_bytes(m, in.batch, in.seq_len, W, s, dt),
      "workspace_bytes(" + args({{"B", in.batch}, {"T", in.seq_len}, {"W", W}}) + ")", "model");

  // dispatch.
  const int64_t layers_resident = s.checkpoint == CheckpointSchedule::none ? L : 1;
  const std::string dargs = args({{"N", N}, {"k", k}, {"H", H}, {"F", F}});
  switch (s.dispatch) {
    case DispatchSchedule::standard:
      if (W == 1) {
        set(LiveSet::dispatch, schedules::dispatch_standard_bytes(N, k, H, F, dt, layers_resident),
            "dispatch_standard_bytes(" + dargs + ", layers=" + std::to_string(layers_resident) +
                ")",
            "standard");
      } else {
        // The worst case R = W*N*k (every token to this rank's experts). NOTES: without
        // checkpointing every layer keeps its dispatcher's buffers; the function has no layer
        // count, so the bound is L times it (loose, documented in docs/plan.md).
        const uint64_t one = schedules::dispatch_expert_parallel_bytes(N, k, H, F, dt, W * N * k);
        set(LiveSet::dispatch, static_cast<uint64_t>(layers_resident) * one,
            (layers_resident > 1 ? std::to_string(layers_resident) + " x " : std::string()) +
                "dispatch_expert_parallel_bytes(" + dargs +
                ", R=W*N*k=" + std::to_string(W * N * k) + ")",
            "standard");
      }
      break;
    case DispatchSchedule::llep: {
      const schedules::LlepParams lp{s.llep_alpha, s.llep_lambda, s.min_tokens_per_gemm};
      const uint64_t one = schedules::llep_dispatch_bytes(N, k, H, F, dt, W, lp);
      set(LiveSet::dispatch, static_cast<uint64_t>(layers_resident) * one,
          (layers_resident > 1 ? std::to_string(layers_resident) + " x " : std::string()) +
              "llep_dispatch_bytes(" + dargs + ", W=" + std::to_string(W) + ")",
          "llep");
      break;
    }
    case DispatchSchedule::pipelined_llep: {
      const auto pp = schedules::pipelined_llep_params(s);
      const auto shape = schedules::pipelined_llep_shape(N, k, W, pp);
      set(LiveSet::dispatch, schedules::pipelined_llep_dispatch_bytes(N, k, H, F, dt, W, pp),
          "pipelined_llep_dispatch_bytes(" + dargs + ", W=" + std::to_string(W) + ", K=" +
              std::to_string(shape.chunks) + ", c_eff=" + std::to_string(shape.chunk_tokens) + ")",
          "pipelined_llep");
      break;
    }
  }

  // LLEP's weight spilling (W > 1): a helper's copies of spilled experts in `weights` and, in
  // backward, their gradient buffers plus the owner's returned-gradient scratch in `grads`.
  // LlepDispatch holds its copies from forward to backward (L layers at once under `none`);
  // PipelinedLLEP allocates them inside each forward / backward call (one layer, K chunk plans).
  if (W > 1 &&
      (s.dispatch == DispatchSchedule::llep || s.dispatch == DispatchSchedule::pipelined_llep)) {
    const int64_t E = m.num_local_experts;
    const schedules::LlepParams lp{s.llep_alpha, s.llep_lambda, s.min_tokens_per_gemm};
    int64_t capacity = 0, plans = 0, layers = 1;
    if (s.dispatch == DispatchSchedule::llep) {
      capacity = std::max<int64_t>(1, schedules::llep_receive_capacity(N * k, W, lp));
      plans = 1;
      layers = layers_resident;
    } else {
      const auto shape =
          schedules::pipelined_llep_shape(N, k, W, schedules::pipelined_llep_params(s));
      capacity = std::max<int64_t>(1, shape.receive_rows);
      plans = shape.chunks;
    }
    const schedules::LlepSpillCopyBytes spill =
        schedules::llep_spill_copy_bytes(E, W, H, F, dt, capacity, plans, lp);
    const std::string f =
        "llep_spill_copy_bytes(" +
        args({{"E", E}, {"W", W}, {"H", H}, {"F", F}, {"cap", capacity}, {"plans", plans}}) +
        ", copies=" + std::to_string(spill.copies) + ")";
    const std::string times = layers > 1 ? std::to_string(layers) + " x " : std::string();
    PlanTerm& wt = p.terms[static_cast<size_t>(LiveSet::weights)];
    wt.bytes += static_cast<uint64_t>(layers) * spill.weights;
    wt.function += " + " + times + f + ".weights";
    wt.schedule += "+" + std::string(enum_name(s.dispatch));
    PlanTerm& gt = p.terms[static_cast<size_t>(LiveSet::grads)];
    gt.bytes += static_cast<uint64_t>(layers) * spill.grads + spill.scratch;
    gt.function += " + " + times + f + ".grads + .scratch";
    gt.schedule += "+" + std::string(enum_name(s.dispatch));
  }

  // logits.
  if (s.vocab == VocabSchedule::materialized) {
    set(LiveSet::logits, schedules::vocab_materialized_bytes(N, V, dt),
        "vocab_materialized_bytes(" + args({{"N", N}, {"V", V}}) + ")", "materialized");
  } else {
    set(LiveSet::logits,
        schedules::ring_dtp_bytes(N, H, V, W, s.vocab_strip, s.vocab_kept_strips, s.ring_payload,
                                  dt),
        "ring_dtp_bytes(" +
            args({{"N", N},
                  {"H", H},
                  {"V", V},
                  {"P", W},
                  {"strip", s.vocab_strip},
                  {"kept", s.vocab_kept_strips}}) +
            ", " + std::string(enum_name(s.ring_payload)) + ")",
        "ring_dtp");
  }

  // boundaries (device) and SCO's pinned block.
  if (s.checkpoint == CheckpointSchedule::sco) {
    // "auto": the pool's budget less what is live in it when the step starts (the optimizer's
    // host state), as sco_host_budget resolves it in the run.
    const uint64_t budget = s.sco_host_budget_bytes().value_or(
        in.host_budget > host_before_sco ? in.host_budget - host_before_sco : 0);
    p.sco_offloaded_layers = schedules::sco_offloaded_layers(L, N, H, dt, budget);
    set(LiveSet::boundaries, schedules::sco_boundaries_bytes(L, p.sco_offloaded_layers, N, H, dt),
        "sco_boundaries_bytes(" +
            args({{"L", L}, {"S", p.sco_offloaded_layers}, {"N", N}, {"H", H}}) + ")",
        "sco");
    p.host.push_back(
        {"sco_boundaries", schedules::sco_host_bytes(p.sco_offloaded_layers, N, H, dt),
         "sco_host_bytes(" + args({{"S", p.sco_offloaded_layers}, {"N", N}, {"H", H}}) + ")"});
  } else {
    set(LiveSet::boundaries, schedules::boundaries_standard_bytes(L, N, H, dt),
        "boundaries_standard_bytes(" + args({{"L", L}, {"N", N}, {"H", H}}) + ")",
        enum_name(s.checkpoint));
  }

  for (const PlanTerm& t : p.terms) p.total += t.bytes;
  for (const HostTerm& h : p.host) p.host_total += h.bytes;
  p.device_fits = p.total <= in.capacity;
  p.host_fits = p.host_total <= in.host_budget;
  return p;
}

std::vector<std::string> Plan::overflow() const {
  std::vector<std::string> out;
  if (!device_fits) {
    const uint64_t over = total - inputs.capacity;
    for (const PlanTerm& t : terms) {  // a set that does not fit on its own
      if (t.bytes > inputs.capacity) {
        out.push_back(std::string(live_set_name(t.set)) + " " + format_bytes(t.bytes) +
                      " > capacity " + format_bytes(inputs.capacity) + " by " +
                      format_bytes(t.bytes - inputs.capacity));
      }
    }
    if (out.empty()) {  // the largest terms that together exceed the overflow
      std::vector<PlanTerm> sorted(terms.begin(), terms.end());
      std::sort(sorted.begin(), sorted.end(),
                [](const PlanTerm& a, const PlanTerm& c) { return a.bytes > c.bytes; });
      uint64_t removed = 0;
      for (const PlanTerm& t : sorted) {
        out.push_back(std::string(live_set_name(t.set)) + " " + format_bytes(t.bytes) + " (" +
                      std::to_string(static_cast<int>(pct(t.bytes, inputs.capacity) + 0.5)) +
                      "% of capacity)");
        removed += t.bytes;
        if (removed >= over) break;
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
    os << "FITS: device " << format_bytes(total) << " of " << format_bytes(inputs.capacity) << " ("
       << static_cast<int>(pct(total, inputs.capacity) + 0.5) << "%), host "
       << format_bytes(host_total) << " of " << format_bytes(inputs.host_budget);
    return os.str();
  }
  os << "DOES NOT FIT:";
  if (!device_fits) {
    os << " device total " << format_bytes(total) << " > capacity " << format_bytes(inputs.capacity)
       << " by " << format_bytes(total - inputs.capacity) << ";";
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
  return search(inputs.world, limit, [&](int64_t T) {
    PlanInputs in = inputs;
    in.seq_len = T;
    return make_plan(cfg, in).fits();
  });
}

int64_t max_batch(const Config& cfg, const PlanInputs& inputs, int64_t limit) {
  return search(1, limit, [&](int64_t B) {
    PlanInputs in = inputs;
    in.batch = B;
    return make_plan(cfg, in).fits();
  });
}

}  // namespace moepeak
