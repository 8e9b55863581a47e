// Fault injection for the fault tests (tests/faults/, docs/reliability.md): inert unless the
// environment variable MOEPEAK_FAULT asks for a fault. A production run never sets it.
//
//   MOEPEAK_FAULT="ACTION@POINT[,rank=R][,step=S][,seconds=X]"   several separated by ';'
//
// ACTION  kill   SIGKILL this process (no handler, no clean-up: the OOM killer, a node failure)
//         term   raise SIGTERM on this process (the scheduler's preemption)
//         usr1   raise SIGUSR1 (Slurm's --signal before a time limit)
//         delay  sleep X seconds (a rank that is slow)
//         nan    the caller poisons one element with NaN (a non-finite weight or gradient)
//         enospc the caller fails as a full disk would (errno ENOSPC)
// POINT   where the code calls fault_here(): step (a step's start), collective (a communication
//         operation starting on its stream), weights (after a step's update: the next step
//         reads it), grads (after a step's backward), save_shard (a rank half-way through its
//         checkpoint shard), save_manifest (rank 0: the manifest written, the directory not yet
//         renamed), save_write (a write into a checkpoint file).
// rank / step: only that world rank / optimizer step (run_context); absent = any. Each fault
// fires once per process.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace moepeak {

// Fires the faults of MOEPEAK_FAULT that match `point` at this rank and step: kill, term, usr1
// and delay happen here; returns true when one asks the caller to inject (nan, enospc). Throws
// moepeak::Error for a malformed MOEPEAK_FAULT (at its first use).
// `step`: the step the code at `point` works for, when it is not the one running now (an
// asynchronous checkpoint's writer thread saves an earlier step).
bool fault_here(std::string_view point, std::optional<int64_t> step = std::nullopt);

}  // namespace moepeak
