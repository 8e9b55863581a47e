// Rank discovery from the launcher's environment (see rank_env.h for the precedence and why).
// Test: ctest -R rank_env
#include "slurm/rank_env.h"

#include <charconv>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "core/error.h"

namespace moepeak {

std::string_view launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::none:
      return "none";
    case Launcher::openmpi:
      return "openmpi";
    case Launcher::slurm:
      return "slurm";
    case Launcher::pmix:
      return "pmix";
    case Launcher::pmi:
      return "pmi";
  }
  return "?";
}

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

EnvLookup env_from_map(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n'))
    s.remove_suffix(1);
  return s;
}

// A non-negative decimal integer that fits an int, or an Error naming the variable.
int parse_count(std::string_view text, std::string_view variable) {
  std::string_view digits = trim(text);
  int value = -1;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || value < 0) {
    MOEPEAK_INPUT_ERROR("environment variable ", variable, "='", text,
                        "' is not a non-negative integer");
  }
  return value;
}

// Reads the first of `names` that is set; records which one in *which.
std::optional<int> read_int(const EnvLookup& env, std::initializer_list<const char*> names,
                            std::string* which = nullptr) {
  for (const char* name : names) {
    if (auto value = env(name)) {
      if (which) *which = name;
      return parse_count(*value, name);
    }
  }
  return std::nullopt;
}

std::string read_string(const EnvLookup& env, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (auto value = env(name)) return *value;
  }
  return {};
}

bool is_set(const EnvLookup& env, const char* name) { return env(name).has_value(); }

void fill_openmpi(const EnvLookup& env, LauncherEnv& out) {
  out.launcher = Launcher::openmpi;
  out.rank = read_int(env, {"OMPI_COMM_WORLD_RANK"}, &out.rank_var);
  out.world_size = read_int(env, {"OMPI_COMM_WORLD_SIZE"}, &out.world_size_var);
  out.local_rank = read_int(env, {"OMPI_COMM_WORLD_LOCAL_RANK"}, &out.local_rank_var);
  out.local_size = read_int(env, {"OMPI_COMM_WORLD_LOCAL_SIZE"}, &out.local_size_var);
  if (!out.rank) {
    MOEPEAK_INPUT_ERROR(
        "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not: the OpenMPI "
        "launcher environment is incomplete");
  }
}

void fill_slurm(const EnvLookup& env, LauncherEnv& out) {
  out.launcher = Launcher::slurm;
  out.rank = read_int(env, {"SLURM_PROCID"}, &out.rank_var);
  if (!out.rank) {
    MOEPEAK_INPUT_ERROR(
        "SLURM_STEP_ID is set but SLURM_PROCID is not: the srun environment is "
        "incomplete");
  }
  // The step's task count, not the allocation's: `srun -n 2` inside `sbatch -n 8` runs 2 ranks.
  out.world_size =
      read_int(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"}, &out.world_size_var);
  out.local_rank = read_int(env, {"SLURM_LOCALID"}, &out.local_rank_var);
  out.node_id = read_int(env, {"SLURM_NODEID"});
  for (const char* list_var : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    auto list = env(list_var);
    if (list && out.node_id) {
      out.local_size = slurm_tasks_on_node(*list, *out.node_id, list_var);
      out.local_size_var = list_var;
      break;
    }
  }
  if (!out.local_size) {
    out.local_size = read_int(env, {"SLURM_NTASKS_PER_NODE"}, &out.local_size_var);
  }
}

void fill_pmix(const EnvLookup& env, LauncherEnv& out) {
  out.launcher = Launcher::pmix;
  out.rank = read_int(env, {"PMIX_RANK"}, &out.rank_var);
}

void fill_pmi(const EnvLookup& env, LauncherEnv& out) {
  out.launcher = Launcher::pmi;
  out.rank = read_int(env, {"PMI_RANK"}, &out.rank_var);
  out.world_size = read_int(env, {"PMI_SIZE"}, &out.world_size_var);
  out.local_rank = read_int(env, {"MPI_LOCALRANKID"}, &out.local_rank_var);
  out.local_size = read_int(env, {"MPI_LOCALNRANKS"}, &out.local_size_var);
}

void check_consistent(const LauncherEnv& e) {
  if (e.world_size && *e.world_size < 1) {
    MOEPEAK_INPUT_ERROR(e.world_size_var, "=", *e.world_size, ": a job has at least one rank");
  }
  if (e.rank && e.world_size && *e.rank >= *e.world_size) {
    MOEPEAK_INPUT_ERROR(e.rank_var, "=", *e.rank, " is not below ", e.world_size_var, "=",
                        *e.world_size, ": the launcher environment is inconsistent");
  }
  if (e.local_size && *e.local_size < 1) {
    MOEPEAK_INPUT_ERROR(e.local_size_var, "=", *e.local_size, ": a node runs at least one rank");
  }
  if (e.local_rank && e.local_size && *e.local_rank >= *e.local_size) {
    MOEPEAK_INPUT_ERROR(e.local_rank_var, "=", *e.local_rank, " is not below ", e.local_size_var,
                        "=", *e.local_size, ": the launcher environment is inconsistent");
  }
  if (e.local_size && e.world_size && *e.local_size > *e.world_size) {
    MOEPEAK_INPUT_ERROR(e.local_size_var, "=", *e.local_size, " is larger than ", e.world_size_var,
                        "=", *e.world_size, ": a node cannot run more ranks than the job has");
  }
  if (e.local_rank && e.world_size && *e.local_rank >= *e.world_size) {
    MOEPEAK_INPUT_ERROR(e.local_rank_var, "=", *e.local_rank, " is not below ", e.world_size_var,
                        "=", *e.world_size, ": the launcher environment is inconsistent");
  }
}

}  // namespace

int slurm_tasks_on_node(std::string_view list, int node_id, std::string_view variable) {
  // Entries "n" or "n(xk)" separated by commas, covering consecutive nodes.
  auto malformed = [&](std::string_view why) {
    MOEPEAK_INPUT_ERROR("environment variable ", variable, "='", list, "' is malformed (", why,
                        "); expected a list like 2(x3),1");
  };
  int first_node = 0;
  std::string_view rest = trim(list);
  if (rest.empty()) malformed("empty");
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view entry = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    int repeat = 1;
    size_t paren = entry.find("(x");
    std::string_view tasks_text = entry;
    if (paren != std::string_view::npos) {
      if (entry.back() != ')') malformed("unclosed '(x'");
      std::string_view repeat_text = entry.substr(paren + 2, entry.size() - paren - 3);
      tasks_text = entry.substr(0, paren);
      int value = -1;
      auto [end, ec] =
          std::from_chars(repeat_text.data(), repeat_text.data() + repeat_text.size(), value);
      if (repeat_text.empty() || ec != std::errc() ||
          end != repeat_text.data() + repeat_text.size() || value < 1) {
        malformed("bad repeat count");
      }
      repeat = value;
    }
    int tasks = -1;
    auto [end, ec] =
        std::from_chars(tasks_text.data(), tasks_text.data() + tasks_text.size(), tasks);
    if (tasks_text.empty() || ec != std::errc() || end != tasks_text.data() + tasks_text.size() ||
        tasks < 0) {
      malformed("bad task count");
    }
    if (node_id < first_node + repeat) return tasks;
    first_node += repeat;
  }
  MOEPEAK_INPUT_ERROR("SLURM_NODEID=", node_id, " is beyond the ", first_node, " nodes listed in ",
                      variable, "='", list, "'");
}

LauncherEnv detect_launcher_env(const EnvLookup& env) {
  LauncherEnv out;
  if (is_set(env, "OMPI_COMM_WORLD_SIZE") || is_set(env, "OMPI_COMM_WORLD_RANK")) {
    fill_openmpi(env, out);
  } else if (is_set(env, "SLURM_STEP_ID") || is_set(env, "SLURM_STEPID")) {
    fill_slurm(env, out);
  } else if (is_set(env, "PMIX_RANK")) {
    fill_pmix(env, out);
  } else if (is_set(env, "PMI_RANK")) {
    fill_pmi(env, out);
  }
  out.job_id = read_string(env, {"SLURM_JOB_ID", "SLURM_JOBID"});
  if (out.launcher == Launcher::slurm)
    out.step_id = read_string(env, {"SLURM_STEP_ID", "SLURM_STEPID"});
  check_consistent(out);
  return out;
}

std::string LauncherEnv::describe() const {
  std::ostringstream os;
  auto value = [](const std::optional<int>& v) {
    return v ? std::to_string(*v) : std::string("?");
  };
  os << launcher_name(launcher);
  if (!launched()) return os.str();
  os << " rank " << value(rank) << "/" << value(world_size) << " local " << value(local_rank) << "/"
     << value(local_size);
  if (node_id) os << " node " << *node_id;
  if (!job_id.empty()) {
    os << " job " << job_id;
    if (!step_id.empty()) os << "." << step_id;
  }
  return os.str();
}

}  // namespace moepeak
