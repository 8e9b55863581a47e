// Where this process is in its job: its world rank and the optimizer step it runs, for messages
// written far from the trainer (the collective watchdog, fault injection). Set by the trainer;
// readable from any thread.
#pragma once

#include <cstdint>

namespace moepeak::run_context {

// The world rank; -1 until the trainer knows it.
void set_rank(int rank);
int rank();
// The optimizer step running now (1-based); 0 during setup, before the first step.
void set_step(int64_t step);
int64_t step();

}  // namespace moepeak::run_context
