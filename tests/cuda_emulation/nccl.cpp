// The emulated NCCL (include/nccl.h) over MPI: every NCCL call moepeak makes, each operation
// queued in CUDA stream order (stream_order.h) and run as MPI operations on the communicator's own
// MPI communicator when something waits for the stream. Buffers are emulated device memory
// (cudaMalloc), i.e. host memory that MPI reads and writes directly. Links only against MPI.
//
// NOTES
// - Bootstrap. ncclGetUniqueId puts a random 64-bit key and the creating process's
//   MPI_COMM_WORLD rank in the id. ncclCommInitRank is a rendezvous at that creator over
//   MPI_COMM_WORLD on a tag derived from the key (each member sends its NCCL rank; the creator
//   answers with the world ranks ordered by NCCL rank), then MPI_Comm_create_group over those
//   members only. So only members call it, and disjoint sub-groups may form at different times;
//   but the process that called ncclGetUniqueId must itself be one of the members (real NCCL runs
//   a root thread in the creator instead). A communicator of one rank is over MPI_COMM_SELF; in a
//   process without MPI its collectives are plain copies and ncclSend/ncclRecv (to itself, which
//   moepeak never issues) are ncclInvalidUsage.
// - Ordering. MPI matches messages in order per (source, tag, communicator) and collectives in
//   call order per communicator; every operation of one NCCL communicator uses that
//   communicator's MPI communicator (send/recv on one tag), which gives NCCL's per-communicator
//   ordering as long as every rank issues the operations of one communicator in the same order
//   and the stream work of one communicator runs on one host thread at a time.
// - Groups. Between ncclGroupStart and the outermost ncclGroupEnd the calls of this thread are
//   collected; at the end each stream's operations become ONE queued closure that posts all of
//   them as nonblocking MPI operations (MPI_Isend/Irecv, MPI_Iallreduce, ...) and then waits for
//   each of them, so a group of sends and receives with several peers cannot deadlock. A group
//   that spans several streams becomes one closure per stream, each waited for on its own: a
//   send on one stream whose matching receive, on the peer, sits in another stream's closure can
//   deadlock where real NCCL would not. A call that fails validation inside a group makes
//   ncclGroupEnd drop the whole group and return that error (as NCCL does).
// - Errors. Validation failures are returned at the call, with the detail in ncclGetLastError.
//   An MPI failure while the stream runs an operation (e.g. a receive shorter than the message)
//   becomes the communicator's async error (ncclSystemError), printed to stderr; later calls on
//   that communicator return it and its queued work is skipped. Buffers must be cudaMalloc
//   memory (NCCL with NCCL_CHECK_POINTERS=1 rejects host pointers; without it a GPU faults).
// - Not emulated: ncclFloat16, ncclAvg, counts above INT_MAX (MPI counts are int): each is
//   ncclInvalidArgument with a text saying so.
// - What this cannot show: NCCL's own protocols, channels, buffers and their timing; progress of
//   communication independent of the host (here an operation runs only when its stream is waited
//   for, so a host that blocks on MPI before waiting for its stream can deadlock where a GPU would
//   have progressed); concurrency between streams (two streams' operations never overlap, so
//   ranks that wait for their streams in different orders can deadlock); bf16 rounding at each
//   pairwise MPI reduction step rather than NCCL's order of accumulation.
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/cuda_emulation/stream_order.h"

namespace moepeak::cuda_emulation {
namespace {

// ---- errors ---------------------------------------------------------------------------------

std::mutex g_error_mu;
std::string g_last_error;  // ncclGetLastError's text

ncclResult_t set_last_error(ncclResult_t result, std::string text) {
  std::lock_guard<std::mutex> lock(g_error_mu);
  g_last_error = std::move(text);
  return result;
}

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(length));
}

bool mpi_usable() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

// ---- bf16 and the MPI datatypes -------------------------------------------------------------

float bf16_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t float_to_bf16(float f) {  // round to nearest even; NaN stays a (quiet) NaN
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// The MPI_Op of a reduction on bf16: computed in float, rounded back to bf16.
template <ncclRedOp_t Op>
void bf16_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = bf16_to_float(a[i]), y = bf16_to_float(b[i]);
    float r;
    if constexpr (Op == ncclSum) r = x + y;
    if constexpr (Op == ncclProd) r = x * y;
    if constexpr (Op == ncclMax) r = x > y ? x : y;
    if constexpr (Op == ncclMin) r = x < y ? x : y;
    b[i] = float_to_bf16(r);
  }
}

struct Bf16Mpi {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};  // by ncclRedOp_t
};

// Made once, when the first bf16 operation runs (MPI is initialised by then); MPI_Finalize frees.
const Bf16Mpi& bf16_mpi() {
  static const Bf16Mpi made = [] {
    Bf16Mpi m;
    MPI_Type_contiguous(2, MPI_BYTE, &m.type);
    MPI_Type_commit(&m.type);
    MPI_Op_create(&bf16_reduce<ncclSum>, /*commute=*/1, &m.ops[ncclSum]);
    MPI_Op_create(&bf16_reduce<ncclProd>, 1, &m.ops[ncclProd]);
    MPI_Op_create(&bf16_reduce<ncclMax>, 1, &m.ops[ncclMax]);
    MPI_Op_create(&bf16_reduce<ncclMin>, 1, &m.ops[ncclMin]);
    return m;
  }();
  return made;
}

// By ncclDataType_t: element sizes, and MPI's datatypes (none for ncclFloat16, rejected at the
// call; bf16 has its own).
constexpr size_t kElementSize[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};

MPI_Datatype mpi_datatype(ncclDataType_t type) {
  if (type == ncclBfloat16) return bf16_mpi().type;
  const MPI_Datatype types[] = {MPI_INT8_T,        MPI_UINT8_T, MPI_INT32_T,
                                MPI_UINT32_T,      MPI_INT64_T, MPI_UINT64_T,
                                MPI_DATATYPE_NULL, MPI_FLOAT,   MPI_DOUBLE};
  return types[type];
}

MPI_Op mpi_op(ncclRedOp_t op, ncclDataType_t type) {  // ncclSum, ncclProd, ncclMax, ncclMin
  if (type == ncclBfloat16) return bf16_mpi().ops[op];
  const MPI_Op ops[] = {MPI_SUM, MPI_PROD, MPI_MAX, MPI_MIN};
  return ops[op];
}

// ---- communicators and operations -----------------------------------------------------------

struct CommState {
  int rank = 0;
  int nranks = 1;
  MPI_Comm mpi = MPI_COMM_NULL;  // MPI_COMM_NULL for a communicator of one rank

  std::mutex mu;
  ncclResult_t async_error = ncclSuccess;
  std::string error_text;

  ~CommState() {
    if (mpi != MPI_COMM_NULL && mpi_usable()) MPI_Comm_free(&mpi);
  }
  ncclResult_t error() {
    std::lock_guard<std::mutex> lock(mu);
    return async_error;
  }
  std::string text() {
    std::lock_guard<std::mutex> lock(mu);
    return error_text;
  }
  void fail_async(ncclResult_t result, const std::string& text) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (async_error != ncclSuccess) return;  // the first failure is the one reported
      async_error = result;
      error_text = text;
    }
    set_last_error(result, text);
    std::fprintf(stderr, "emulated NCCL (rank %d of %d): %s\n", rank, nranks, text.c_str());
  }
};

enum class Kind { all_reduce, all_gather, reduce_scatter, broadcast, send, recv };

struct Op {
  Kind kind;
  const char* name;
  const void* send;  // null for recv, and for broadcast off the root
  void* recv;        // null for send
  size_t count;      // NCCL's count: per rank for all-gather and reduce-scatter
  ncclDataType_t type;
  ncclRedOp_t op;
  int peer;  // send/recv: the peer; broadcast: the root
  std::shared_ptr<CommState> comm;
  cudaStream_t stream;
};

constexpr int kP2pTag = 0;  // every ncclSend/ncclRecv of a communicator: MPI's order per source

struct GroupState {
  int depth = 0;
  std::vector<Op> ops;
  ncclResult_t error = ncclSuccess;  // the first call in the group that failed
};
thread_local GroupState t_group;

// A failed call: sets the last error, and inside a group, the error ncclGroupEnd returns.
ncclResult_t reject(ncclResult_t result, std::string text) {
  if (t_group.depth > 0 && t_group.error == ncclSuccess) t_group.error = result;
  return set_last_error(result, std::move(text));
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

// A copy of `bytes` at `src`, kept in `scratch` until the group's operations have completed.
const void* copy_of(const void* src, size_t bytes, std::vector<std::vector<char>>& scratch) {
  const char* p = static_cast<const char*>(src);
  scratch.emplace_back(p, p + bytes);
  return scratch.back().data();
}

// Posts `op` as one nonblocking MPI operation on its communicator.
int post(const Op& op, MPI_Request* request, std::vector<std::vector<char>>& scratch) {
  const CommState& c = *op.comm;
  const int n = static_cast<int>(op.count);
  const size_t bytes = op.count * kElementSize[op.type];
  const size_t all_bytes = bytes * static_cast<size_t>(c.nranks);
  const MPI_Datatype type = mpi_datatype(op.type);
  switch (op.kind) {
    case Kind::all_reduce: {
      const void* src = op.send == op.recv ? MPI_IN_PLACE
                        : overlaps(op.send, bytes, op.recv, bytes)
                            ? copy_of(op.send, bytes, scratch)
                            : op.send;
      return MPI_Iallreduce(src, op.recv, n, type, mpi_op(op.op, op.type), c.mpi, request);
    }
    case Kind::all_gather: {
      const bool in_place = op.send == static_cast<char*>(op.recv) + c.rank * bytes;
      const void* src = in_place ? MPI_IN_PLACE
                        : overlaps(op.send, bytes, op.recv, all_bytes)
                            ? copy_of(op.send, bytes, scratch)
                            : op.send;
      return MPI_Iallgather(src, n, type, op.recv, n, type, c.mpi, request);
    }
    case Kind::reduce_scatter: {
      // NCCL's in-place form (recv is this rank's block of send) has no MPI equivalent: copy.
      const void* src = overlaps(op.send, all_bytes, op.recv, bytes)
                            ? copy_of(op.send, all_bytes, scratch)
                            : op.send;
      return MPI_Ireduce_scatter_block(src, op.recv, n, type, mpi_op(op.op, op.type), c.mpi,
                                       request);
    }
    case Kind::broadcast:
      if (c.rank == op.peer && op.send != op.recv) std::memmove(op.recv, op.send, bytes);
      return MPI_Ibcast(op.recv, n, type, op.peer, c.mpi, request);
    case Kind::send:
      return MPI_Isend(op.send, n, type, op.peer, kP2pTag, c.mpi, request);
    case Kind::recv:
      return MPI_Irecv(op.recv, n, type, op.peer, kP2pTag, c.mpi, request);
  }
  return MPI_ERR_OTHER;
}

// Runs a batch (one operation, or one stream's part of a group): posts everything, then waits.
void execute(const std::vector<Op>& ops) {
  std::vector<MPI_Request> requests;
  std::vector<const Op*> owners;  // the operation of each request
  std::vector<std::vector<char>> scratch;
  for (const Op& op : ops) {
    if (op.comm->error() != ncclSuccess) continue;  // a failed communicator does no more work
    if (op.comm->mpi == MPI_COMM_NULL) {            // one rank without MPI: a collective is a copy
      if (op.send != nullptr && op.send != op.recv) {
        std::memmove(op.recv, op.send, op.count * kElementSize[op.type]);
      }
      continue;
    }
    if (!mpi_usable()) {
      op.comm->fail_async(ncclInvalidUsage,
                          std::string(op.name) + ": MPI was finalised before the stream ran it");
      continue;
    }
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = post(op, &request, scratch);
    if (rc != MPI_SUCCESS) {
      op.comm->fail_async(ncclSystemError, std::string(op.name) + ": " + mpi_error_text(rc));
      continue;
    }
    requests.push_back(request);
    owners.push_back(&op);
  }
  // Everything is posted, so waiting in turn cannot deadlock. (One MPI_Wait each, not MPI_Waitall:
  // Open MPI 4.1's MPI_Waitall hangs under MPI_THREAD_MULTIPLE when a request fails.)
  for (size_t i = 0; i < requests.size(); ++i) {
    const int rc = MPI_Wait(&requests[i], MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      owners[i]->comm->fail_async(
          ncclSystemError, std::string(owners[i]->name) + " failed in MPI: " + mpi_error_text(rc));
    }
  }
}

// Queues a batch whose operations all belong to `ops.front().stream`.
ncclResult_t submit(std::vector<Op> ops) {
  const cudaStream_t stream = ops.front().stream;
  const std::string what = ops.size() == 1
                               ? std::string(ops.front().name)
                               : "ncclGroupEnd (" + std::to_string(ops.size()) + " operations)";
  const cudaError_t e = enqueue(stream, what, [ops = std::move(ops)] { execute(ops); });
  if (e == cudaSuccess) return ncclSuccess;
  return set_last_error(ncclUnhandledCudaError,
                        what + ": cannot queue on the stream: " + cudaGetErrorString(e));
}

// The key, and the world rank of its creator, in the bytes of an ncclUniqueId.
struct IdContents {
  uint64_t magic;
  uint64_t key;
  int32_t creator;  // MPI_COMM_WORLD rank of the process that called ncclGetUniqueId; -1: no MPI
};
constexpr uint64_t kIdMagic = 0x6d6f657065616b4eull;  // "moepeakN"
static_assert(sizeof(IdContents) <= NCCL_UNIQUE_ID_BYTES);

int rendezvous_tag(uint64_t key) {  // in the upper half of the tags MPI allows
  int* upper = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &upper, &flag);
  const int ub = flag && upper != nullptr ? *upper : 32767;
  const int half = ub / 2;
  return half + static_cast<int>(key % static_cast<uint64_t>(ub - half));
}

ncclResult_t mpi_failure(const char* what, int rc) {
  return set_last_error(
      ncclSystemError, std::string("ncclCommInitRank: ") + what + " failed: " + mpi_error_text(rc));
}

// The rendezvous of ncclCommInitRank (see NOTES): the world ranks of the members, by NCCL rank,
// then a communicator over just them.
ncclResult_t join(const IdContents& id, int nranks, int rank, MPI_Comm* out) {
  int me = -1, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (id.creator < 0 || id.creator >= world) {
    return set_last_error(ncclInvalidUsage,
                          "ncclCommInitRank: the unique id was made without MPI (or in another "
                          "MPI job); the emulated NCCL needs ncclGetUniqueId after MPI_Init");
  }
  const int tag = rendezvous_tag(id.key);
  std::vector<int> members(static_cast<size_t>(nranks), -1);
  int rc = MPI_SUCCESS;
  if (me == id.creator) {
    members[rank] = me;
    std::string problem;
    std::vector<int> joiners;
    for (int i = 1; i < nranks; ++i) {
      int64_t request[3];  // key, nranks, rank
      MPI_Status status;
      rc = MPI_Recv(request, 3, MPI_INT64_T, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, &status);
      if (rc != MPI_SUCCESS) return mpi_failure("MPI_Recv", rc);
      const int from = status.MPI_SOURCE;
      joiners.push_back(from);
      const int64_t r = request[2];
      if (static_cast<uint64_t>(request[0]) != id.key || request[1] != nranks) {
        problem = "world rank " + std::to_string(from) + " joined with nranks " +
                  std::to_string(request[1]) + ", the id's creator with " + std::to_string(nranks);
      } else if (r < 0 || r >= nranks || members[r] != -1) {
        problem = "NCCL rank " + std::to_string(r) + " claimed by world rank " +
                  std::to_string(from) + " is out of range or taken";
      } else {
        members[r] = from;
      }
    }
    if (!problem.empty()) members.assign(1, -1);
    for (int joiner : joiners) {
      rc = MPI_Send(members.data(), static_cast<int>(members.size()), MPI_INT, joiner, tag,
                    MPI_COMM_WORLD);
      if (rc != MPI_SUCCESS) return mpi_failure("MPI_Send", rc);
    }
    if (!problem.empty()) {
      return set_last_error(ncclInvalidArgument, "ncclCommInitRank: " + problem);
    }
  } else {
    const int64_t request[3] = {static_cast<int64_t>(id.key), nranks, rank};
    rc = MPI_Send(request, 3, MPI_INT64_T, id.creator, tag, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_failure("MPI_Send", rc);
    rc = MPI_Recv(members.data(), nranks, MPI_INT, id.creator, tag, MPI_COMM_WORLD,
                  MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_failure("MPI_Recv", rc);
    if (members[0] < 0) {
      return set_last_error(ncclInvalidArgument,
                            "ncclCommInitRank: the id's creator (world rank " +
                                std::to_string(id.creator) +
                                ") rejected the members (nranks or ranks disagree; see its error)");
    }
  }
  MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, nranks, members.data(), &group);
  rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, out);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  if (rc != MPI_SUCCESS) return mpi_failure("MPI_Comm_create_group", rc);
  MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
  return ncclSuccess;
}

}  // namespace
}  // namespace moepeak::cuda_emulation

using namespace moepeak::cuda_emulation;  // the C API below is at global scope

// The C handle: queued work holds the state too, so it outlives ncclCommDestroy until it has run.
struct ncclComm {
  std::shared_ptr<CommState> state;
};

namespace moepeak::cuda_emulation {
namespace {

// Validates a call and queues it (or, inside a group, collects it).
ncclResult_t add(Kind kind, const char* call, const void* send, void* recv, size_t count,
                 ncclDataType_t type, ncclRedOp_t red, int peer, ncclComm_t comm,
                 cudaStream_t stream) {
  const std::string name = call;
  auto invalid = [&](const std::string& what) { return reject(ncclInvalidArgument, name + what); };
  if (comm == nullptr) return invalid(": comm is NULL");
  CommState& c = *comm->state;
  if (const ncclResult_t failed = c.error(); failed != ncclSuccess) {
    return reject(failed, name + ": the communicator failed earlier: " + c.text());
  }
  if (type < 0 || type >= ncclNumTypes)
    return invalid(": invalid datatype " + std::to_string(type));
  if (type == ncclFloat16) return invalid(": ncclFloat16 is not emulated");
  if (kind == Kind::all_reduce || kind == Kind::reduce_scatter) {
    if (red < 0 || red >= ncclNumOps)
      return invalid(": invalid reduction op " + std::to_string(red));
    if (red == ncclAvg) return invalid(": ncclAvg is not emulated");
  }
  const bool p2p = kind == Kind::send || kind == Kind::recv;
  if ((p2p || kind == Kind::broadcast) && (peer < 0 || peer >= c.nranks)) {
    return invalid(std::string(p2p ? ": peer " : ": root ") + std::to_string(peer) +
                   " is not a rank of this " + std::to_string(c.nranks) + "-rank communicator");
  }
  if (count > static_cast<size_t>(INT_MAX)) {
    return invalid(": count " + std::to_string(count) +
                   " is above INT_MAX, more than MPI (so the emulation) moves in one operation");
  }
  if (p2p && c.mpi == MPI_COMM_NULL) {
    return reject(ncclInvalidUsage, name +
                                        ": send/recv on a one-rank communicator made without "
                                        "MPI is not emulated (initialise MPI first)");
  }
  if (count == 0) return ncclSuccess;  // nothing to do, on every rank alike
  // The buffers it reads and writes; a broadcast reads sendbuff on the root only.
  if (kind == Kind::broadcast && c.rank != peer) send = nullptr;
  const bool reads = kind != Kind::recv && (kind != Kind::broadcast || c.rank == peer);
  for (const auto& [used, buffer, what] :
       {std::tuple{reads, send, "sendbuff"},
        std::tuple{kind != Kind::send, static_cast<const void*>(recv), "recvbuff"}}) {
    if (!used) continue;
    if (buffer == nullptr) return invalid(std::string(": ") + what + " is NULL");
    if (!is_device_pointer(buffer)) {
      return invalid(std::string(": ") + what + " is not device memory (from cudaMalloc)");
    }
  }
  Op op{kind, call, send, recv, count, type, red, peer, comm->state, stream};
  if (t_group.depth > 0) {
    t_group.ops.push_back(std::move(op));
    return ncclSuccess;
  }
  return submit({std::move(op)});
}

}  // namespace
}  // namespace moepeak::cuda_emulation

// ---- the C API ------------------------------------------------------------------------------

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return set_last_error(ncclInvalidArgument, "ncclGetVersion: NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (uniqueId == nullptr) {
    return set_last_error(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  }
  std::random_device random;
  IdContents id{kIdMagic, (static_cast<uint64_t>(random()) << 32) ^ random(), -1};
  if (mpi_usable()) MPI_Comm_rank(MPI_COMM_WORLD, &id.creator);
  std::memset(uniqueId, 0, sizeof *uniqueId);
  std::memcpy(uniqueId->internal, &id, sizeof id);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  if (comm == nullptr) return set_last_error(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return set_last_error(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) +
                                                   " of nranks " + std::to_string(nranks) +
                                                   " is invalid");
  }
  IdContents id;
  std::memcpy(&id, commId.internal, sizeof id);
  if (id.magic != kIdMagic) {
    return set_last_error(ncclInvalidArgument,
                          "ncclCommInitRank: the id does not come from ncclGetUniqueId");
  }
  auto state = std::make_shared<CommState>();
  state->rank = rank;
  state->nranks = nranks;
  if (nranks == 1 && mpi_usable()) {
    if (const int rc = MPI_Comm_dup(MPI_COMM_SELF, &state->mpi); rc != MPI_SUCCESS) {
      return mpi_failure("MPI_Comm_dup", rc);
    }
    MPI_Comm_set_errhandler(state->mpi, MPI_ERRORS_RETURN);
  } else if (nranks > 1) {
    if (!mpi_usable()) {
      return set_last_error(
          ncclInvalidUsage,
          "ncclCommInitRank: the emulated NCCL runs over MPI, but MPI is not initialised (or is "
          "finalised): call MPI_Init_thread first (in moepeak, init_process_group under mpirun)");
    }
    if (const ncclResult_t r = join(id, nranks, rank, &state->mpi); r != ncclSuccess) return r;
  }
  *comm = new ncclComm{std::move(state)};
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;  // the MPI communicator goes with the last queued operation that references it
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (comm == nullptr || asyncError == nullptr) {
    return set_last_error(ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
  }
  *asyncError = comm->state->error();
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {  // NCCL's texts
  static const char* const texts[ncclNumResults] = {
      "no error",
      "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
      "unhandled system error (run with NCCL_DEBUG=INFO for details)",
      "internal error - please report this issue to the NCCL developers",
      "invalid argument (run with NCCL_DEBUG=WARN for details)",
      "invalid usage (run with NCCL_DEBUG=WARN for details)",
      "remote process exited or there was a network error",
      "NCCL operation in progress",
  };
  const int i = static_cast<int>(result);
  return i >= 0 && i < ncclNumResults ? texts[i] : "unknown result code";
}

const char* ncclGetLastError(ncclComm_t comm) {
  thread_local std::string text;  // stable for this thread until its next call
  if (comm != nullptr) {
    std::lock_guard<std::mutex> lock(comm->state->mu);
    if (comm->state->async_error != ncclSuccess) return (text = comm->state->error_text).c_str();
  }
  std::lock_guard<std::mutex> lock(g_error_mu);
  return (text = g_last_error).c_str();
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  return add(Kind::all_reduce, "ncclAllReduce", sendbuff, recvbuff, count, datatype, op, 0, comm,
             stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return add(Kind::broadcast, "ncclBroadcast", sendbuff, recvbuff, count, datatype, ncclSum, root,
             comm, stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return add(Kind::reduce_scatter, "ncclReduceScatter", sendbuff, recvbuff, recvcount, datatype, op,
             0, comm, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return add(Kind::all_gather, "ncclAllGather", sendbuff, recvbuff, sendcount, datatype, ncclSum, 0,
             comm, stream);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return add(Kind::send, "ncclSend", sendbuff, nullptr, count, datatype, ncclSum, peer, comm,
             stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return add(Kind::recv, "ncclRecv", nullptr, recvbuff, count, datatype, ncclSum, peer, comm,
             stream);
}

ncclResult_t ncclGroupStart() {
  ++t_group.depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  GroupState& group = t_group;
  if (group.depth == 0) {
    return set_last_error(ncclInvalidUsage, "ncclGroupEnd without a matching ncclGroupStart");
  }
  if (--group.depth > 0) return ncclSuccess;
  std::vector<Op> ops = std::move(group.ops);
  group.ops.clear();
  const ncclResult_t failed = std::exchange(group.error, ncclSuccess);
  if (failed != ncclSuccess) return failed;  // the failing call set the last error
  // One batch per stream, in the order the streams first appear.
  std::vector<std::vector<Op>> batches;
  for (Op& op : ops) {
    auto it = std::find_if(batches.begin(), batches.end(),
                           [&](const auto& batch) { return batch.front().stream == op.stream; });
    if (it == batches.end()) {
      batches.emplace_back();
      it = batches.end() - 1;
    }
    it->push_back(std::move(op));
  }
  ncclResult_t result = ncclSuccess;
  for (auto& batch : batches) {
    const ncclResult_t r = submit(std::move(batch));
    if (result == ncclSuccess) result = r;
  }
  return result;
}
