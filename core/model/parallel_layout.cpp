// ParallelDegrees and ParallelGroups: the layout's degrees and its groups' communicators (see
// parallel_layout.h).
#include "core/model/parallel_layout.h"

#include "core/comm/single_comm.h"
#include "core/error.h"

namespace moepeak {
namespace {

int degree_of(const char* key, int64_t value, int world) {
  const int64_t d = value == 0 ? world : value;
  if (d < 1 || d > world || world % d != 0) {
    MOEPEAK_INPUT_ERROR("parallelism.", key, " = ", value,
                        " must divide the world size W = ", world, " (0 means W)");
  }
  return static_cast<int>(d);
}

}  // namespace

ParallelDegrees ParallelDegrees::resolve(const ParallelismConfig& p, int world) {
  MOEPEAK_CHECK(world >= 1, "a layout needs at least one rank, not ", world);
  return {world, degree_of("expert_parallel", p.expert_parallel, world),
          degree_of("sequence_parallel", p.sequence_parallel, world),
          degree_of("data_shard", p.data_shard, world)};
}

std::string ParallelDegrees::str() const {
  return "Ep " + std::to_string(expert) + ", Sp " + std::to_string(sequence) + ", data_shard " +
         std::to_string(data_shard);
}

ParallelGroups::ParallelGroups(Comm& world, const ParallelDegrees& degrees, BackendKind kind)
    : world_(world), degrees_(degrees) {
  const int W = world.world_size(), r = world.rank();
  MOEPEAK_CHECK(degrees.world == W, "a layout for ", degrees.world, " ranks on a communicator of ",
                W);
  int next = 0;
  // NOTES: every rank makes the same splits in the same order (Comm::split is collective), and a
  // group of all ranks or of one rank makes none, so the default layout creates no communicator.
  auto group = [&](const char* name, int size, int color, int key) -> Comm* {
    if (size == W) return &world;
    std::unique_ptr<Comm>& slot = owned_[next++];
    if (size == 1) {
      slot = std::make_unique<SingleComm>(kind);
    } else {
      slot = world.split(color, key);
    }
    slot->set_name(name);
    MOEPEAK_CHECK(slot->world_size() == size, "a group of ", size, " ranks came out with ",
                  slot->world_size());
    return slot.get();
  };
  // Splits are only collective when some rank splits: the size (not the rank) decides, so every
  // rank agrees.
  const int Ep = degrees.expert, Sp = degrees.sequence, Ds = degrees.data_shard;
  expert_ = group("expert", Ep, r / Ep, r);
  expert_replicas_ = group("expert_replicas", W / Ep, r % Ep, r);
  sequence_ = group("sequence", Sp, r / Sp, r);
  data_shard_ = group("data_shard", Ds, r / Ds, r);
  dense_replicas_ = group("dense_replicas", W / Ds, r % Ds, r);
}

}  // namespace moepeak
