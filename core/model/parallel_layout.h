// The degrees of a parallel layout and the communicators of its groups (docs/parallelism.md).
//
// On W ranks a layout has three degrees, each dividing W:
//   Ep  expert_parallel   ranks one MoE layer's experts are split over (E/Ep experts each);
//   Sp  sequence_parallel ranks of one Ulysses group (whole sequences split by position);
//   Ds  data_shard        ranks a dense weight's ZeRO-3 shards span.
// Groups are runs of consecutive ranks (so a degree up to the GPUs of a node stays in a node):
//   expert group      ranks [Ep*floor(r/Ep), +Ep), rank in it r % Ep; it holds every expert once.
//   expert replicas   the W/Ep ranks with the same r % Ep (rank in it r / Ep): the copies of one
//                     set of experts, over which each expert is ZeRO-3 sharded.
//   sequence group    ranks [Sp*floor(r/Sp), +Sp): the Sp ranks holding sequence group r / Sp's
//                     B/(W/Sp) sequences, rank r % Sp holding positions [(r%Sp) T/Sp, +T/Sp).
//   data shard        ranks [Ds*floor(r/Ds), +Ds): one full copy of the dense weights' shards.
//   dense replicas    the W/Ds ranks with the same r % Ds: copies of one dense shard, whose
//                     gradients are all-reduced.
// Every degree = W is the layout of a single group: one ZeRO-3 world, experts split over all
// ranks, every sequence split over all ranks (the default).
#pragma once

#include <memory>
#include <string>

#include "core/comm/comm.h"
#include "core/config/config.h"
#include "core/runtime/backend.h"

namespace moepeak {

struct ParallelDegrees {
  int world = 1, expert = 1, sequence = 1, data_shard = 1;

  // Every degree W.
  static ParallelDegrees uniform(int world) { return {world, world, world, world}; }
  // The [parallelism] section on W ranks: 0 is W; throws moepeak::Error naming the key unless
  // each degree is positive and divides W.
  static ParallelDegrees resolve(const ParallelismConfig& p, int world);

  int expert_replicas() const { return world / expert; }
  int sequence_groups() const { return world / sequence; }
  int dense_replicas() const { return world / data_shard; }
  bool is_uniform() const { return expert == world && sequence == world && data_shard == world; }
  // "Ep 2, Sp 4, data_shard 2" (for messages and logs).
  std::string str() const;
  bool operator==(const ParallelDegrees&) const = default;
};

// The communicators of a layout's groups for this rank. Comm::split is collective: every rank of
// `world` constructs ParallelGroups with the same degrees at the same point. A group spanning
// every rank is `world` itself; a group of one rank is a single-rank Comm (no traffic).
class ParallelGroups {
 public:
  ParallelGroups(Comm& world, const ParallelDegrees& degrees, BackendKind kind);

  const ParallelDegrees& degrees() const { return degrees_; }
  Comm& world() const { return world_; }
  Comm& expert() const { return *expert_; }
  Comm& expert_replicas() const { return *expert_replicas_; }
  Comm& sequence() const { return *sequence_; }
  Comm& data_shard() const { return *data_shard_; }
  Comm& dense_replicas() const { return *dense_replicas_; }
  // Which of the W/Sp sequence groups this rank is in.
  int sequence_group() const { return world_.rank() / degrees_.sequence; }

 private:
  Comm& world_;
  ParallelDegrees degrees_;
  std::unique_ptr<Comm> owned_[5];
  Comm *expert_, *expert_replicas_, *sequence_, *data_shard_, *dense_replicas_;
};

}  // namespace moepeak
