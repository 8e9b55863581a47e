// ZeRO-3 traffic hidden behind compute (ZeroTraffic, core/model/zero_traffic.h) on 4 real rank
// processes, float32, 4 AdamW steps per run:
//   - bitwise: with prefetch depth 1 and 2 every step's loss and grad norm, the step-1 gradient
//     shards and the final weight shards (every byte) equal depth 0's (every gather and
//     reduce-scatter on the compute stream) — in the uniform layout (dense tensors sharded over
//     4, experts whole) and in HSDP with expert replicas (Ep 2, Sp 2, Ds 2: dense sharded over
//     2 and all-reduced over 2 replicas, each expert sharded over 2), with the standard schedules
//     and with all four bounded ones (whose own streams then run beside ZeroTraffic's);
//   - the same with the comm stream slowed on purpose (a compute that read a gather before it
//     finished, or an optimizer that read a shard before its reduce-scatter, would see other
//     bytes) and with the compute stream slowed (a gather or a reduce-scatter that ran before
//     the compute it must follow would overwrite or read a buffer early);
//   - memory: each run's `weights` and `grads` peaks are exactly zero_persistent_bytes plus
//     zero_pass_gathered_bytes at its depth — the planner's function — and grow with the depth;
//   - a pass driven directly with no host synchronisation between its uses (the host a whole
//     pass ahead of a slowed stream): what compute reads and the shards are bitwise depth 0's;
//   - misuse of a pass is an Error naming it.
// Bitwise is the bar: the schedules differ only in which stream issues the same collectives on
// the same bytes.
// Run: ctest -R test_zero_traffic --output-on-failure
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "core/comm/process_group.h"
#include "core/error.h"
#include "core/model/zero_params.h"
#include "core/model/zero_traffic.h"
#include "core/runtime/cpu_stream.h"
#include "ops/elementwise.h"
#include "ops/fill.h"
#include "tests/expect_contains.h"
#include "tests/parallel/training_run.h"

namespace moepeak {
namespace {

using test_support::global_batch;
using test_support::TrainingRun;

enum class Slowed { none, comm_stream, compute_stream };

struct TrafficCase {
  int ep, sp, ds;
  bool bounded;
  Slowed slowed;
  // Every layer's activations kept (no recompute): backward then has no host synchronisation
  // of its own (PipelinedLLEP plans only in forward), so only stream waits order it.
  bool keep_activations = false;
};

std::string name_of(const TrafficCase& c) {
  const char* slowed = c.slowed == Slowed::comm_stream      ? "_slow_comm"
                       : c.slowed == Slowed::compute_stream ? "_slow_compute"
                                                            : "";
  return "ep" + std::to_string(c.ep) + "_sp" + std::to_string(c.sp) + "_ds" + std::to_string(c.ds) +
         (c.bounded ? "_bounded" : "_standard") + slowed + (c.keep_activations ? "_kept" : "");
}

void PrintTo(const TrafficCase& c, std::ostream* os) { *os << name_of(c); }

ModelConfig traffic_model() { return test_support::small_moe_model(3); }

SchedulesConfig schedules_of(const TrafficCase& c) {
  SchedulesConfig s = c.bounded ? test_support::bounded_schedules() : SchedulesConfig{};
  if (c.keep_activations) s.checkpoint = CheckpointSchedule::none;
  return s;
}

struct Trace {
  std::vector<double> losses, norms;
  std::vector<char> step1_grads, final_values;
  uint64_t weights_peak = 0, grads_peak = 0;  // of step 1's forward and backward
};

std::vector<char> bytes_of(const Tensor& t) {
  const char* p = static_cast<const char*>(t.data());
  return std::vector<char>(p, p + t.nbytes());
}

Trace train(const RankInfo& ranks, const TrafficCase& c, int depth, Slowed slowed) {
  const ModelConfig cfg = traffic_model();
  const int64_t B = 4, T = 8;
  TrainingRun run(ranks, cfg, schedules_of(c), DType::f32, 11,
                  ParallelDegrees{ranks.world_size, c.ep, c.sp, c.ds},
                  c.bounded ? OptimizerPlacement::offload_stream : OptimizerPlacement::resident,
                  depth);
  Stream* comm_stream = run.model->zero_traffic().comm_stream();
  EXPECT_EQ(comm_stream != nullptr, depth > 0);
  if (slowed == Slowed::comm_stream && comm_stream) {
    as_cpu_stream(*comm_stream).set_debug_delay(std::chrono::microseconds(3000));
  }
  if (slowed == Slowed::compute_stream) {
    as_cpu_stream(run.stream).set_debug_delay(std::chrono::microseconds(300));
  }
  Trace t;
  std::vector<int64_t> ids, labels;
  for (int step = 1; step <= 4; ++step) {
    global_batch(step, B * T, cfg.vocab_size, ids, labels, 7);
    if (step == 1) run.backend->arena().reset_peaks();
    t.losses.push_back(run.forward_backward(ids, labels, B, T));
    if (step == 1) {
      const MemoryStats mem = run.backend->arena().stats();
      t.weights_peak = mem.peak_per_set()[LiveSet::weights];
      t.grads_peak = mem.peak_per_set()[LiveSet::grads];
      t.step1_grads = bytes_of(run.model->params().flat_grads());
    }
    t.norms.push_back(run.grad_norm());
    run.update(step, t.norms.back(), 1e-2);
  }
  as_cpu_stream(run.stream).set_debug_delay(std::chrono::microseconds(0));
  t.final_values = bytes_of(run.model->params().flat_values());
  return t;
}

// The message of the Error `f` throws ("(no error)" if none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

class ZeroTrafficRun : public ::testing::TestWithParam<TrafficCase> {};

TEST_P(ZeroTrafficRun, PrefetchIsBitwiseTheUnoverlappedScheduleWithThePlannedPeaks) {
  const TrafficCase c = GetParam();
  const RankInfo ranks = init_process_group();
  ASSERT_EQ(ranks.world_size, 4);
  const ParallelDegrees degrees{4, c.ep, c.sp, c.ds};
  const LmHeadSharding head = lm_head_sharding(schedules_of(c).vocab);
  const ModelConfig cfg = traffic_model();
  const ZeroBytes persistent = zero_persistent_bytes(cfg, DType::f32, degrees, head);
  const Trace blocking = train(ranks, c, 0, Slowed::none);
  uint64_t last_weights = 0;
  for (int depth = 0; depth <= 2; ++depth) {
    SCOPED_TRACE("prefetch depth " + std::to_string(depth) + ", rank " +
                 std::to_string(ranks.rank));
    const Trace t =
        depth == 0 && c.slowed == Slowed::none ? blocking : train(ranks, c, depth, c.slowed);
    for (size_t s = 0; s < t.losses.size(); ++s) {
      EXPECT_EQ(t.losses[s], blocking.losses[s]) << "step " << s + 1 << " loss";
      EXPECT_EQ(t.norms[s], blocking.norms[s]) << "step " << s + 1 << " grad norm";
    }
    EXPECT_TRUE(t.step1_grads == blocking.step1_grads) << "step-1 gradient shards differ";
    EXPECT_TRUE(t.final_values == blocking.final_values) << "final weight shards differ";
    const ZeroBytes planned = zero_pass_gathered_bytes(cfg, DType::f32, degrees, head, depth);
    if (!c.bounded) {  // (LLEP's spilled copies join weights and grads under the bounded ones)
      EXPECT_EQ(t.weights_peak, persistent.weights + planned.weights);
      EXPECT_EQ(t.grads_peak, persistent.grads + planned.grads);
    }
    if (depth > 0) {
      EXPECT_GT(planned.weights, last_weights) << "a deeper prefetch holds more";
    }
    last_weights = planned.weights;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ZeroTrafficRun,
                         ::testing::Values(TrafficCase{4, 4, 4, false, Slowed::none},
                                           TrafficCase{2, 2, 2, false, Slowed::none},
                                           TrafficCase{4, 4, 4, true, Slowed::none},
                                           TrafficCase{2, 2, 2, true, Slowed::none},
                                           TrafficCase{2, 2, 2, false, Slowed::comm_stream},
                                           TrafficCase{2, 2, 2, false, Slowed::compute_stream},
                                           TrafficCase{2, 2, 2, true, Slowed::comm_stream},
                                           TrafficCase{2, 2, 2, true, Slowed::comm_stream, true}),
                         [](const auto& info) { return name_of(info.param); });

// A pass driven directly, with no host synchronisation between its uses (as on a GPU, where the
// host runs a whole pass ahead): per use, the compute stream copies every gathered value into an
// output of its own and fills every gradient slot with 0.25 (rank + 1) + use; then the gradient
// shards and the copies, at depth 1 and 2 with one stream slowed 2 ms per task, are bitwise
// depth 0's. Each of ZeroTraffic's waits guards one of these: a copy reading a gather not yet
// complete (comm slowed), a gather overwriting values a queued copy still reads or a
// reduce-scatter reading slots not yet filled (compute slowed), a slot freed to the next
// allocation before its reduce-scatter read it, or the shards read before the last one (comm
// slowed).
struct PassTrace {
  std::vector<std::vector<char>> copies;  // per use, the values compute read
  std::vector<char> grads;                // the shards after the pass
};

PassTrace drive_pass(const RankInfo& ranks, int depth, Slowed slowed) {
  const ModelConfig cfg = traffic_model();
  TrainingRun run(ranks, cfg, SchedulesConfig{}, DType::f32, 11,
                  ParallelDegrees{ranks.world_size, 2, 2, 2});
  ZeroParamStore& store = run.model->params();
  ZeroTraffic traffic(store, *run.backend, run.stream, depth);
  const auto [first, last] =
      zero_local_experts(cfg, store.groups().degrees(), store.groups().expert().rank());
  const std::vector<std::vector<int>> groups =
      zero_gather_groups(store.layout(), LmHeadSharding::zero3, first, last);
  const std::vector<ZeroUse> uses = zero_pass_uses(cfg.num_hidden_layers, true);
  if (slowed == Slowed::comm_stream && traffic.comm_stream()) {
    as_cpu_stream(*traffic.comm_stream()).set_debug_delay(std::chrono::microseconds(2000));
  }
  if (slowed == Slowed::compute_stream) {
    as_cpu_stream(run.stream).set_debug_delay(std::chrono::microseconds(2000));
  }
  std::vector<OwnedTensor> copies;
  traffic.begin(groups, uses);
  for (size_t k = 0; k < uses.size(); ++k) {
    ZeroTraffic::Group g = traffic.acquire();
    for (int p : g.params()) {
      if (uses[k].parts != GatherParts::grads) {
        const Tensor v = g.value(p);
        copies.push_back(OwnedTensor::device(*run.backend, v.shape(), v.dtype(), LiveSet::workspace,
                                             "value read by compute"));
        ops::copy(v, copies.back(), run.stream);
      }
      if (uses[k].parts != GatherParts::values) {
        ops::fill(g.grad(p), 0.25 * (ranks.rank + 1) + static_cast<double>(k), run.stream);
      }
    }
    traffic.release(std::move(g));
  }
  traffic.end();
  run.stream.synchronize();  // the compute stream only: end() made it wait for the comm stream
  as_cpu_stream(run.stream).set_debug_delay(std::chrono::microseconds(0));
  PassTrace t;
  for (const OwnedTensor& c : copies) t.copies.push_back(bytes_of(c.view()));
  t.grads = bytes_of(store.flat_grads());
  return t;
}

TEST(ZeroTrafficPass, EveryWaitHoldsWithoutHostSynchronisation) {
  const RankInfo ranks = init_process_group();
  const PassTrace blocking = drive_pass(ranks, 0, Slowed::none);
  for (Slowed slowed : {Slowed::comm_stream, Slowed::compute_stream}) {
    for (int depth : {1, 2}) {
      SCOPED_TRACE(std::string(slowed == Slowed::comm_stream ? "comm" : "compute") +
                   " stream slowed, depth " + std::to_string(depth) + ", rank " +
                   std::to_string(ranks.rank));
      const PassTrace t = drive_pass(ranks, depth, slowed);
      ASSERT_EQ(t.copies.size(), blocking.copies.size());
      for (size_t i = 0; i < t.copies.size(); ++i) {
        EXPECT_TRUE(t.copies[i] == blocking.copies[i]) << "value read " << i;
      }
      EXPECT_TRUE(t.grads == blocking.grads) << "gradient shards";
    }
  }
}

TEST(ZeroTrafficPass, MisuseIsAnErrorNamingIt) {
  const RankInfo ranks = init_process_group();
  const ModelConfig cfg = traffic_model();
  TrainingRun run(ranks, cfg, SchedulesConfig{});
  ZeroTraffic traffic(run.model->params(), *run.backend, run.stream, 1);
  const ParamLayout& layout = run.model->params().layout();
  const std::vector<std::vector<int>> groups = zero_gather_groups(layout);
  EXPECT_CONTAINS(error_of([&] { traffic.acquire(); }), "outside a pass");
  traffic.begin(groups, zero_pass_uses(cfg.num_hidden_layers, false));
  EXPECT_CONTAINS(error_of([&] { traffic.begin(groups, {}); }), "already open");
  EXPECT_CONTAINS(error_of([&] { traffic.release(ZeroTraffic::Group()); }), "no use is held");
  ZeroTraffic::Group embed = traffic.acquire();
  EXPECT_CONTAINS(error_of([&] { traffic.acquire(); }), "still held");
  traffic.release(std::move(embed));
  EXPECT_CONTAINS(error_of([&] { traffic.end(); }), "uses not run");
  traffic.abandon();
  EXPECT_FALSE(traffic.in_pass());
  EXPECT_CONTAINS(error_of([&] { ZeroTraffic(run.model->params(), *run.backend, run.stream, 9); }),
                  "zero_prefetch_depth = 9");
}

}  // namespace
}  // namespace moepeak
