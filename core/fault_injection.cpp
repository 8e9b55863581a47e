// Fault injection (core/fault_injection.h): MOEPEAK_FAULT parsed once, each fault fired once.
#include "core/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/run_context.h"

namespace moepeak {
namespace {

enum class FaultAction { kill, term, usr1, delay, nan, enospc };

struct Fault {
  FaultAction action;
  std::string point;
  std::optional<int> rank;
  std::optional<int64_t> step;
  double seconds = 0;
  bool fired = false;
};

constexpr const char* kPoints[] = {"step",       "collective",    "weights",   "grads",
                                   "save_shard", "save_manifest", "save_write"};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return out;
    start = at + 1;
  }
}

int64_t parse_integer(const std::string& spec, const std::string& key, const std::string& text) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  MOEPEAK_CHECK_INPUT(!text.empty() && end != nullptr && *end == '\0', "MOEPEAK_FAULT '", spec,
                      "': ", key, " must be an integer, not '", text, "'");
  return v;
}

Fault parse_fault(const std::string& spec) {
  const std::vector<std::string> parts = split(spec, ',');
  const size_t at = parts[0].find('@');
  MOEPEAK_CHECK_INPUT(at != std::string::npos, "MOEPEAK_FAULT '", spec, "': expected ACTION@POINT");
  const std::string action = parts[0].substr(0, at);
  Fault f{};
  if (action == "kill") {
    f.action = FaultAction::kill;
  } else if (action == "term") {
    f.action = FaultAction::term;
  } else if (action == "usr1") {
    f.action = FaultAction::usr1;
  } else if (action == "delay") {
    f.action = FaultAction::delay;
  } else if (action == "nan") {
    f.action = FaultAction::nan;
  } else if (action == "enospc") {
    f.action = FaultAction::enospc;
  } else {
    MOEPEAK_INPUT_ERROR("MOEPEAK_FAULT '", spec, "': unknown action '", action,
                        "' (kill, term, usr1, delay, nan, enospc)");
  }
  f.point = parts[0].substr(at + 1);
  bool known = false;
  for (const char* p : kPoints) known = known || f.point == p;
  MOEPEAK_CHECK_INPUT(
      known, "MOEPEAK_FAULT '", spec, "': unknown point '", f.point,
      "' (step, collective, weights, grads, save_shard, save_manifest, save_write)");
  for (size_t i = 1; i < parts.size(); ++i) {
    const size_t eq = parts[i].find('=');
    MOEPEAK_CHECK_INPUT(eq != std::string::npos, "MOEPEAK_FAULT '", spec,
                        "': expected key=value, not '", parts[i], "'");
    const std::string key = parts[i].substr(0, eq), value = parts[i].substr(eq + 1);
    if (key == "rank") {
      f.rank = static_cast<int>(parse_integer(spec, key, value));
    } else if (key == "step") {
      f.step = parse_integer(spec, key, value);
    } else if (key == "seconds") {
      f.seconds = static_cast<double>(parse_integer(spec, key, value));
    } else {
      MOEPEAK_INPUT_ERROR("MOEPEAK_FAULT '", spec, "': unknown key '", key,
                          "' (rank, step, seconds)");
    }
  }
  MOEPEAK_CHECK_INPUT(f.action != FaultAction::delay || f.seconds > 0, "MOEPEAK_FAULT '", spec,
                      "': delay needs seconds=X");
  return f;
}

struct Faults {
  std::mutex mu;
  bool parsed = false;
  std::vector<Fault> list;
};

Faults& faults() {
  static Faults f;
  return f;
}

}  // namespace

bool fault_here(std::string_view point, std::optional<int64_t> step) {
  const char* env = std::getenv("MOEPEAK_FAULT");
  if (env == nullptr || *env == '\0') return false;
  Faults& all = faults();
  std::optional<Fault> hit;
  {
    std::lock_guard<std::mutex> lock(all.mu);
    if (!all.parsed) {
      all.parsed = true;
      for (const std::string& spec : split(env, ';')) {
        if (!spec.empty()) all.list.push_back(parse_fault(spec));
      }
    }
    for (Fault& f : all.list) {
      if (f.fired || f.point != point) continue;
      if (f.rank && *f.rank != run_context::rank()) continue;
      if (f.step && *f.step != step.value_or(run_context::step())) continue;
      f.fired = true;
      hit = f;
      break;
    }
  }
  if (!hit) return false;
  switch (hit->action) {
    case FaultAction::kill:
      ::kill(::getpid(), SIGKILL);
      return false;
    case FaultAction::term:
      ::raise(SIGTERM);
      return false;
    case FaultAction::usr1:
      ::raise(SIGUSR1);
      return false;
    case FaultAction::delay:
      std::this_thread::sleep_for(std::chrono::duration<double>(hit->seconds));
      return false;
    case FaultAction::nan:
    case FaultAction::enospc:
      return true;
  }
  return false;
}

}  // namespace moepeak
