// `moepeak train [--config F]... [--set section.key=value]... [--resume | --resume-from DIR]
//                [--init-from HF_DIR] [--dump-step DIR] [--force]`: runs training
// (core/train/trainer.h) and ends with a summary of the final loss and the peak of each live set.
// First it plans the run's memory (core/plan/plan.h, the same table as `moepeak plan`) and refuses
// to start, printing the plan and exiting 2, when the plan does not fit the device capacity or the
// host budget (--force: start anyway). --init-from is model.init_from
// (core/checkpoint/hf_import.h).
//
// Preemption (docs/slurm.md): SIGUSR1 and SIGTERM ask every rank to checkpoint at the next step
// boundary and exit with kExitRequeue (75), which slurm/train.sbatch answers with `scontrol
// requeue` (or a cluster's RequeueExit=75); the requeued job's `--resume` continues from it.
#include <spdlog/spdlog.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <optional>

#include "cli/commands.h"
#include "core/comm/process_group.h"
#include "core/config/config.h"
#include "core/error.h"
#include "core/plan/plan.h"
#include "core/train/trainer.h"
#include "core/units.h"

namespace moepeak::cli {
namespace {

// The preemption flag: the signal's number, stored by the handler (lock-free, so
// async-signal-safe).
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_stop_signal(int signal) { g_stop_signal.store(signal); }

// SIGUSR1 and SIGTERM set the flag instead of ending the process; a second SIGTERM still does
// not kill it (Slurm's SIGKILL after KillWait does).
void install_stop_handlers() {
  struct sigaction action = {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signal : {SIGUSR1, SIGTERM}) {
    if (sigaction(signal, &action, nullptr) != 0) {
      MOEPEAK_THROW("cannot install the handler of signal ", signal, " (preemption)");
    }
  }
}

// The last step's device-memory peaks, one row per live set (nccl-tests style table), beside
// the plan's term for each when the launch check made one.
void print_peak_table(const StepMetrics& m, const std::optional<Plan>& plan) {
  std::printf("# device memory of the last step (capacity %s)%s\n",
              format_bytes(m.capacity).c_str(),
              plan ? "; planned: the plan's term (moepeak plan), its total the largest phase and "
                     "the allocator's allowance"
                   : "");
  std::printf("# %-11s %14s %14s %14s", "live set", "own peak", "at total peak", "% capacity");
  if (plan) std::printf(" %14s %10s", "planned", "meas/plan");
  std::printf("\n");
  auto pct = [&](uint64_t b) {
    return m.capacity ? 100.0 * static_cast<double>(b) / m.capacity : 0.0;
  };
  auto planned = [&](uint64_t measured, uint64_t bound) {
    if (!plan) return;
    std::printf(" %14s %10.3f", format_bytes(bound).c_str(),
                bound ? static_cast<double>(measured) / static_cast<double>(bound) : 0.0);
  };
  for (LiveSet s : kAllLiveSets) {
    std::printf("  %-11s %14s %14s %13.2f%%", std::string(live_set_name(s)).c_str(),
                format_bytes(m.peak_per_set[s]).c_str(), format_bytes(m.at_peak[s]).c_str(),
                pct(m.peak_per_set[s]));
    if (plan) planned(m.peak_per_set[s], plan->term(s).bytes);
    std::printf("\n");
  }
  std::printf("  %-11s %14s %14s %13.2f%%", "total", format_bytes(m.peak_total).c_str(),
              format_bytes(m.at_peak.total()).c_str(), pct(m.peak_total));
  if (plan) planned(m.peak_total, plan->total);
  std::printf("\n");
  // Each phase's peak (the plan's total is its largest phase: docs/plan.md#phases).
  std::printf("# %-18s %22s %14s", "phase", "peak", "% capacity");
  if (plan) std::printf(" %14s %10s", "planned", "meas/plan");
  std::printf("\n");
  for (StepPhase ph : kAllStepPhases) {
    std::printf("  %-18s %22s %13.2f%%", std::string(step_phase_name(ph)).c_str(),
                format_bytes(m.phase_peaks[ph]).c_str(), pct(m.phase_peaks[ph]));
    if (plan) planned(m.phase_peaks[ph], plan->phase(ph).total);
    std::printf("\n");
  }
}

}  // namespace

void register_train_command(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand("train",
                                 "train a model (the embedded default: tiny MoE on the copy task)");
  static ConfigArgs args;
  static TrainOptions options;
  add_config_options(*cmd, args);
  auto* resume =
      cmd->add_flag("--resume", options.resume,
                    "continue from the latest checkpoint of this run (job.run_dir/job.name)");
  cmd->add_option("--resume-from", options.resume_from, "continue from this checkpoint directory")
      ->check(CLI::ExistingDirectory)
      ->excludes(resume);
  static std::string init_from;
  cmd->add_option("--init-from", init_from,
                  "start from this Hugging Face checkpoint directory (model.init_from; Mixtral, "
                  "Qwen3-MoE); "
                  "a resumed run continues from its own checkpoint instead")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--dump-step", options.dump_step_dir,
                  "write step 1's weights, batch, loss and gradients (safetensors) into DIR");
  static bool force = false;
  cmd->add_flag("--force", force, "start even when the memory plan (moepeak plan) does not fit");
  cmd->callback([&ctx] {
    ctx.action = [&ctx] {
      // Before the launch (MPI's start, the config, the plan take seconds on a busy node): a
      // preemption signal then still stops the run at its first step boundary with a checkpoint,
      // rather than killing a rank before it has a handler. Installed again after MPI starts, in
      // case the MPI library replaced them.
      install_stop_handlers();
      if (!init_from.empty()) args.overrides.push_back("model.init_from=" + init_from);
      Config cfg = load_config_for_command(args, ctx);
      const RankInfo ranks = join_ranks();
      // The launch check: every rank reaches the same verdict from the same config. A config the
      // plan cannot lay out is left to the trainer, whose error names the launch.
      std::optional<Plan> plan;
      try {
        plan = make_plan(cfg, plan_inputs(cfg, ranks.world_size));
      } catch (const Error&) {
      }
      if (plan && !plan->fits()) {
        if (!force) {
          if (ranks.rank == 0) {
            print_plan(*plan, stdout);
            std::fflush(stdout);
            spdlog::error("the memory plan does not fit; not starting (--force starts anyway)");
          }
          finalize_process_group();
          return 2;
        }
        spdlog::warn("--force: starting although the memory plan does not fit: {}",
                     plan->verdict());
      }
      install_stop_handlers();
      options.stop_signal = &g_stop_signal;
      TrainResult r = train(cfg, options);
      if (r.stopped_by_signal != 0) {
        if (ranks.rank == 0) {
          spdlog::warn(
              "preempted (signal {}) after step {}: checkpoint written; exit {} asks the job "
              "script to requeue, and --resume continues from step {}",
              r.stopped_by_signal, r.last_step, kExitRequeue, r.last_step + 1);
        }
        finalize_process_group();
        return kExitRequeue;
      }
      if (!r.losses.empty() && ranks.rank == 0) {
        spdlog::info("trained steps {}..{}: final loss {:.4f}; metrics in {}", r.first_step,
                     r.last_step, r.losses.back(), r.metrics_file);
        print_peak_table(r.last, plan);
      }
      finalize_process_group();
      return 0;
    };
  });
}

}  // namespace moepeak::cli
