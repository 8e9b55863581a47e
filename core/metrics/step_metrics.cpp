#include "core/metrics/step_metrics.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/units.h"

namespace moepeak {

uint64_t StepMetrics::max_rank_peak() const {
  uint64_t peak = peak_total;
  for (uint64_t b : rank_peak_bytes) peak = std::max(peak, b);
  return peak;
}

nlohmann::json step_metrics_json(const StepMetrics& m) {
  nlohmann::json peak = {{"total", m.peak_total}};
  for (LiveSet s : kAllLiveSets) peak[std::string(live_set_name(s))] = m.peak_per_set[s];
  nlohmann::json at_peak = nlohmann::json::object();
  for (LiveSet s : kAllLiveSets) at_peak[std::string(live_set_name(s))] = m.at_peak[s];
  nlohmann::json phases = nlohmann::json::object();  // {"attention": {"total": .., sets..}, ..}
  for (StepPhase ph : kAllStepPhases) {
    nlohmann::json p = {{"total", m.phase_peaks[ph]}};
    const MemorySnapshot& at = m.phase_at_peak[static_cast<size_t>(ph)];
    for (LiveSet s : kAllLiveSets) p[std::string(live_set_name(s))] = at[s];
    phases[std::string(step_phase_name(ph))] = p;
  }
  nlohmann::json out = {
      {"step", m.step},
      {"loss", m.loss},
      {"grad_norm", m.grad_norm},
      {"lr", m.lr},
      {"skipped", m.skipped},
      {"skipped_steps", m.skipped_steps},
      {"step_time_s", m.step_time_s},
      {"tokens_per_s", m.tokens_per_s},
      {"tflops", m.tflops},
      {"mfu", m.mfu},
      {"peak_bytes", peak},
      {"peak_breakdown_bytes", at_peak},
      {"phase_peak_bytes", phases},
      {"peak_gib", static_cast<double>(m.peak_total) / GiB},
      {"peak_pct", m.capacity ? 100.0 * static_cast<double>(m.peak_total) / m.capacity : 0.0},
      {"capacity_bytes", m.capacity},
      {"arena_high_water_bytes", m.arena_high_water},
      {"world_size", m.world_size},
      {"rank_tokens_per_s", m.rank_tokens_per_s},
      {"rank_peak_bytes", m.rank_peak_bytes}};
  if (m.device_used > 0) {
    // What the plan's terms must cover beyond the arena (docs/plan.md#outside-the-arena).
    out["device_used_bytes"] = m.device_used;
    out["device_used_before_arena_bytes"] = m.used_before_arena;
    out["outside_arena_bytes"] = m.device_used > m.capacity ? m.device_used - m.capacity : 0;
  }
  if (m.eval) {
    nlohmann::json peak = {{"total", m.eval->peak_total}};
    for (LiveSet s : kAllLiveSets) peak[std::string(live_set_name(s))] = m.eval->peak_per_set[s];
    out["eval_loss"] = m.eval->loss;
    out["eval_perplexity"] = m.eval->perplexity;
    out["eval_tokens"] = m.eval->tokens;
    out["eval_time_s"] = m.eval->seconds;
    out["eval_peak_bytes"] = peak;
  }
  if (!m.data_shares.empty()) {
    uint64_t total = 0;
    for (const SourceShare& d : m.data_shares) total += d.samples;
    nlohmann::json data = nlohmann::json::array();
    for (const SourceShare& d : m.data_shares) {
      data.push_back({{"path", d.path},
                      {"weight", d.weight},
                      {"samples", d.samples},
                      {"share", total ? static_cast<double>(d.samples) / total : 0.0}});
    }
    out["data"] = data;
  }
  return out;
}

std::string step_metrics_line(const StepMetrics& m) {
  char buf[320];
  const uint64_t peak = m.max_rank_peak();  // the fullest rank's
  double pct = m.capacity ? 100.0 * static_cast<double>(peak) / m.capacity : 0.0;
  std::snprintf(buf, sizeof(buf),
                "step: %5lld  loss: %8.4f  grad_norm: %8.4f  lr: %.2e  memory: %6.2fGiB(%.1f%%)  "
                "tps: %9.0f  tflops: %.3f  mfu: %.1f%%",
                static_cast<long long>(m.step), m.loss, m.grad_norm, m.lr,
                static_cast<double>(peak) / GiB, pct, m.tokens_per_s, m.tflops, 100.0 * m.mfu);
  std::string line = buf;
  if (m.skipped) line += "  skipped: non-finite";
  if (m.eval) {
    std::snprintf(buf, sizeof(buf), "  eval_loss: %8.4f  eval_ppl: %.2f", m.eval->loss,
                  m.eval->perplexity);
    line += buf;
  }
  return line;
}

std::vector<TensorBoardScalar> step_metrics_scalars(const StepMetrics& m) {
  std::vector<TensorBoardScalar> out = {
      {"train/loss", m.loss},
      {"train/grad_norm", m.grad_norm},
      {"train/lr", m.lr},
      {"perf/tokens_per_s", m.tokens_per_s},
      {"perf/tflops", m.tflops},
      {"perf/mfu", m.mfu},
      {"memory/total_peak_bytes", static_cast<double>(m.peak_total)}};
  for (LiveSet s : kAllLiveSets) {
    out.push_back({"memory/" + std::string(live_set_name(s)) + "_peak_bytes",
                   static_cast<double>(m.peak_per_set[s])});
  }
  if (m.eval) {
    out.push_back({"eval/loss", m.eval->loss});
    out.push_back({"eval/perplexity", m.eval->perplexity});
  }
  return out;
}

MetricsLog::MetricsLog(const std::string& path, bool progress, int64_t first_step,
                       int64_t last_step)
    : path_(path), progress_(progress), first_step_(first_step), last_step_(last_step) {
  file_ = std::fopen(path.c_str(), "a");
  if (file_ == nullptr) {
    MOEPEAK_INPUT_ERROR("cannot open the metrics file ", path,
                        " for appending: ", std::strerror(errno));
  }
}

MetricsLog::~MetricsLog() {
  if (progress_) std::fputs("\n", stdout);
  if (file_ != nullptr) std::fclose(file_);
}

void MetricsLog::record(const StepMetrics& m, bool print) {
  std::string line = step_metrics_json(m).dump() + "\n";
  if (std::fputs(line.c_str(), file_) < 0 || std::fflush(file_) != 0) {
    MOEPEAK_INPUT_ERROR("writing the metrics file ", path_, " failed: ", std::strerror(errno));
  }
  elapsed_s_ += m.step_time_s;
  if (progress_) std::fputs("\r\033[K", stdout);  // clear the progress line before logging
  if (print) spdlog::info("{}", step_metrics_line(m));
  if (progress_) {
    int64_t done = m.step - first_step_ + 1, total = last_step_ - first_step_ + 1;
    double eta = done > 0 ? elapsed_s_ / done * static_cast<double>(total - done) : 0;
    constexpr int kWidth = 30;
    int filled = static_cast<int>(kWidth * done / std::max<int64_t>(total, 1));
    std::string bar(static_cast<size_t>(filled), '=');
    bar.resize(kWidth, ' ');
    std::fprintf(stdout, "\r[%s] step %lld/%lld  loss %.4f  ETA %dm%02ds", bar.c_str(),
                 static_cast<long long>(m.step), static_cast<long long>(last_step_), m.loss,
                 static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
    std::fflush(stdout);
  }
}

}  // namespace moepeak
