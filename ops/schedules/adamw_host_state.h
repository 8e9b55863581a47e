// HostAdamWState: the optimizer state of the two offload placements (offload_serial,
// offload_stream) — master weights, m and v of this rank's pieces in the pinned NUMA-local pool
// (backend.pinned(), live set `optimizer` in the pool's accounting), each a flat buffer laid out
// like the flat weights buffer (optimizer.h), plus the pieces as runs of those buffers.
//
//   master, m, v (P)   pinned host, state dtype adamw_state_dtype(working): the working weights'
//                      dtype for f32 (the master is then a separate fp32 copy of the working
//                      weights) and f64 (tests); fp32 for bf16 working weights.
//                      P = the flat weights buffer's elements.
//   host bytes         adamw_offload_host_bytes(P, dtype) = 3·PinnedPool::footprint(P·b)
//
// At construction the master is copied from the working weights and m = v = 0, as a fresh
// resident AdamW starts. Test: tests/ops/test_adamw_offload.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "core/runtime/backend.h"
#include "ops/schedules/optimizer.h"

namespace moepeak::schedules {

// Pinned host bytes of master, m and v for `elements` parameters in `dtype`.
uint64_t adamw_offload_host_bytes(int64_t elements, DType dtype);

// The dtype of the optimizer state (master, m, v) for working weights of `working`: fp32 for
// bf16, else the working dtype.
DType adamw_state_dtype(DType working);

class HostAdamWState {
 public:
  // A piece as a run of the flat buffers: elements [offset, offset + length).
  struct Segment {
    int piece;  // index into pieces()
    int64_t offset, length;
    bool decay;
  };

  // `who` names the optimizer in errors. Throws unless every piece lies in flat_values with its
  // dtype and a gradient of main_grad_dtype, and the dtype is f32, f64 or bf16 (an fp32 state).
  // Synchronises the backend's default stream.
  HostAdamWState(Backend& backend, const Tensor& flat_values, std::vector<OptimizerPiece> pieces,
                 const char* who);

  Backend& backend() const { return *backend_; }
  DType dtype() const { return master_.view().dtype(); }  // the state's (master, m, v)
  DType working_dtype() const { return flat_values_.dtype(); }
  int64_t elements() const { return flat_values_.numel(); }
  const Tensor& flat_values() const { return flat_values_; }
  const std::vector<OptimizerPiece>& pieces() const { return pieces_; }
  const std::vector<Segment>& segments() const { return segments_; }  // by offset

  Tensor master() const { return master_.view(); }
  Tensor m() const { return m_.view(); }
  Tensor v() const { return v_.view(); }

  // exp_avg, exp_avg_sq (and master when its dtype differs from the working weights').
  std::vector<OptimizerState> state() const;
  // master = the working weights, widened to the state dtype (device -> host on `stream`, then
  // synchronises it).
  void load_master_from_weights(Stream& stream);

 private:
  Backend* backend_;
  Tensor flat_values_;
  std::vector<OptimizerPiece> pieces_;
  std::vector<Segment> segments_;
  OwnedTensor master_, m_, v_;
};

}  // namespace moepeak::schedules
