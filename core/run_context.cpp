// Where this process is in its job (core/run_context.h): two atomics.
#include "core/run_context.h"

#include <atomic>

namespace moepeak::run_context {
namespace {
std::atomic<int> g_rank{-1};
std::atomic<int64_t> g_step{0};
}  // namespace

void set_rank(int rank) { g_rank.store(rank); }
int rank() { return g_rank.load(); }
void set_step(int64_t step) { g_step.store(step); }
int64_t step() { return g_step.load(); }

}  // namespace moepeak::run_context
