// Checks of every Comm operation against what each rank computes locally from seeded data,
// shared by the MPI (4 ranks), single-rank and NCCL tests (tests/comm/test_comm_*.cpp).
//
// Rank r's data is value(seed, r, i): small multiples of 1/4 (or of 1000 / 2^40 for integers), so
// sums over any number of ranks in any order are exact in f32, f64 and bf16 and every rank knows
// what every other rank sent without talking to it. Receive buffers are poisoned (0xA5 bytes)
// before each operation so unwritten elements fail, and the gaps between all_to_all_v blocks must
// still hold the poison afterwards.
//
// Buffers live wherever a TestMemory puts them: host memory for MPI and the CPU, device memory
// for NCCL. Each check submits on `stream`, synchronises it, and compares.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/comm/comm.h"
#include "core/error.h"
#include "core/runtime/dtype.h"
#include "core/runtime/stream.h"

namespace moepeak::testing_comm {

constexpr unsigned char kPoisonByte = 0xA5;

// Where the buffers of a check live.
class TestMemory {
 public:
  virtual ~TestMemory() = default;
  // `bytes` of memory owned by this TestMemory until it is destroyed.
  virtual void* alloc(size_t bytes) = 0;
  // Synchronous copies between the host and that memory.
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, size_t bytes) = 0;
};

class HostTestMemory final : public TestMemory {
 public:
  void* alloc(size_t bytes) override {
    blocks_.push_back(std::make_unique<unsigned char[]>(std::max<size_t>(bytes, 1)));
    return blocks_.back().get();
  }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }

 private:
  std::vector<std::unique_ptr<unsigned char[]>> blocks_;
};

// ---- seeded data -----------------------------------------------------------------------------

inline uint64_t mix(uint64_t seed, uint64_t rank, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + rank * 0xBF58476D1CE4E5B9ull + index + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// An integer in [-8, 8]: what rank `rank` holds at `index` for `seed`.
inline int small_int(uint64_t seed, int rank, size_t index) {
  return static_cast<int>(mix(seed, static_cast<uint64_t>(rank), index) % 17) - 8;
}

template <typename T>
T make_value(int v);
template <>
inline float make_value<float>(int v) {
  return static_cast<float>(v) * 0.25f;
}
template <>
inline double make_value<double>(int v) {
  return v * 0.25;
}
template <>
inline bf16 make_value<bf16>(int v) {
  return bf16(static_cast<float>(v) * 0.25f);
}
template <>
inline int32_t make_value<int32_t>(int v) {
  return v * 1000 + 7;
}
template <>
inline int64_t make_value<int64_t>(int v) {
  return static_cast<int64_t>(v) * (int64_t{1} << 40) + 7;  // needs all 64 bits
}

template <typename T>
double as_double(T x) {
  return static_cast<double>(x);
}
template <>
inline double as_double<bf16>(bf16 x) {
  return static_cast<float>(x);
}

template <typename T>
T value(uint64_t seed, int rank, size_t index) {
  return make_value<T>(small_int(seed, rank, index));
}

template <typename T>
std::vector<T> rank_data(uint64_t seed, int rank, size_t count, size_t first_index = 0) {
  std::vector<T> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = value<T>(seed, rank, first_index + i);
  return v;
}

// The reduction over ranks 0..world-1 of value(seed, r, index), exact for this data.
template <typename T>
double reduced(uint64_t seed, int world, size_t index, ReduceOp op) {
  double acc = as_double(value<T>(seed, 0, index));
  for (int r = 1; r < world; ++r) {
    double x = as_double(value<T>(seed, r, index));
    acc = op == ReduceOp::sum ? acc + x : op == ReduceOp::max ? std::max(acc, x) : std::min(acc, x);
  }
  return acc;
}

// ---- buffers ---------------------------------------------------------------------------------

template <typename T>
void* upload_vector(TestMemory& mem, const std::vector<T>& host) {
  void* p = mem.alloc(host.size() * sizeof(T));
  mem.upload(p, host.data(), host.size() * sizeof(T));
  return p;
}

template <typename T>
void* poisoned(TestMemory& mem, size_t count) {
  std::vector<unsigned char> poison(count * sizeof(T), kPoisonByte);
  void* p = mem.alloc(poison.size());
  mem.upload(p, poison.data(), poison.size());
  return p;
}

template <typename T>
std::vector<T> download_vector(TestMemory& mem, const void* src, size_t count) {
  std::vector<T> host(count);
  mem.download(host.data(), src, count * sizeof(T));
  return host;
}

template <typename T>
bool is_poison(const T& x) {
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, &x, sizeof(T));
  return std::all_of(bytes, bytes + sizeof(T), [](unsigned char b) { return b == kPoisonByte; });
}

// Compares actual[i] with expected[i] exactly; reports the first few differences.
template <typename T>
::testing::AssertionResult same_values(const std::vector<T>& actual,
                                       const std::vector<double>& expected) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " != expected " << expected.size();
  }
  std::ostringstream diffs;
  size_t bad = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    double a = as_double(actual[i]);
    if (a != expected[i]) {
      if (++bad <= 5) {
        diffs << "\n  [" << i << "] got " << a
              << (is_poison(actual[i]) ? " (poison: unwritten)" : "") << ", expected "
              << expected[i];
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << actual.size() << " elements differ" << diffs.str();
}

// ---- checks ----------------------------------------------------------------------------------

template <typename T>
void check_all_reduce(Comm& comm, Stream& stream, TestMemory& mem, size_t count, ReduceOp op,
                      bool in_place, uint64_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "all_reduce " << dtype_name(dtype_of<T>::value) << " " << reduce_op_name(op)
               << (in_place ? " in place" : "") << " count " << count << " rank " << comm.rank());
  const int world = comm.world_size();
  void* send = upload_vector(mem, rank_data<T>(seed, comm.rank(), count));
  void* recv = in_place ? send : poisoned<T>(mem, count);
  comm.all_reduce(send, recv, count, dtype_of<T>::value, op, stream);
  stream.synchronize();
  std::vector<double> expected(count);
  for (size_t i = 0; i < count; ++i) expected[i] = reduced<T>(seed, world, i, op);
  EXPECT_TRUE(same_values(download_vector<T>(mem, recv, count), expected));
}

template <typename T>
void check_reduce_scatter(Comm& comm, Stream& stream, TestMemory& mem, size_t recv_count,
                          ReduceOp op, bool in_place, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "reduce_scatter " << dtype_name(dtype_of<T>::value) << " "
                                    << reduce_op_name(op) << (in_place ? " in place" : "")
                                    << " count " << recv_count << " rank " << comm.rank());
  const int world = comm.world_size(), me = comm.rank();
  const size_t total = static_cast<size_t>(world) * recv_count;
  void* send = upload_vector(mem, rank_data<T>(seed, me, total));
  void* recv = in_place ? static_cast<char*>(send) + me * recv_count * sizeof(T)
                        : poisoned<T>(mem, recv_count);
  comm.reduce_scatter(send, recv, recv_count, dtype_of<T>::value, op, stream);
  stream.synchronize();
  std::vector<double> expected(recv_count);
  for (size_t i = 0; i < recv_count; ++i) {
    expected[i] = reduced<T>(seed, world, me * recv_count + i, op);
  }
  EXPECT_TRUE(same_values(download_vector<T>(mem, recv, recv_count), expected));
}

template <typename T>
void check_all_gather(Comm& comm, Stream& stream, TestMemory& mem, size_t send_count, bool in_place,
                      uint64_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "all_gather " << dtype_name(dtype_of<T>::value) << (in_place ? " in place" : "")
               << " count " << send_count << " rank " << comm.rank());
  const int world = comm.world_size(), me = comm.rank();
  const size_t total = static_cast<size_t>(world) * send_count;
  void* recv = poisoned<T>(mem, total);
  void* send;
  if (in_place) {
    send = static_cast<char*>(recv) + me * send_count * sizeof(T);
    std::vector<T> mine = rank_data<T>(seed, me, send_count);
    mem.upload(send, mine.data(), send_count * sizeof(T));
  } else {
    send = upload_vector(mem, rank_data<T>(seed, me, send_count));
  }
  comm.all_gather(send, recv, send_count, dtype_of<T>::value, stream);
  stream.synchronize();
  std::vector<double> expected(total);
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < send_count; ++i) {
      expected[r * send_count + i] = as_double(value<T>(seed, r, i));
    }
  }
  EXPECT_TRUE(same_values(download_vector<T>(mem, recv, total), expected));
}

template <typename T>
void check_broadcast(Comm& comm, Stream& stream, TestMemory& mem, size_t count, int root,
                     uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "broadcast " << dtype_name(dtype_of<T>::value) << " root "
                                    << root << " count " << count << " rank " << comm.rank());
  void* buf = comm.rank() == root ? upload_vector(mem, rank_data<T>(seed, root, count))
                                  : poisoned<T>(mem, count);
  comm.broadcast(buf, count, dtype_of<T>::value, root, stream);
  stream.synchronize();
  std::vector<double> expected(count);
  for (size_t i = 0; i < count; ++i) expected[i] = as_double(value<T>(seed, root, i));
  EXPECT_TRUE(same_values(download_vector<T>(mem, buf, count), expected));
}

// Elements rank `src` sends to rank `dst` in all_to_all_v: uneven, and zero for every third
// pair, so each rank of a world >= 3 has zero-count sends and receives.
inline size_t a2a_count(int src, int dst, uint64_t seed) {
  if ((src + dst + seed) % 3 == 0) return 0;
  return 1 + (static_cast<size_t>(src) * 5 + static_cast<size_t>(dst) * 3 + seed) % 6;
}

template <typename T>
void check_all_to_all_v(Comm& comm, Stream& stream, TestMemory& mem, uint64_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "all_to_all_v " << dtype_name(dtype_of<T>::value) << " rank " << comm.rank());
  const int world = comm.world_size(), me = comm.rank();
  // Send blocks in peer order, each after a one-element gap; receive blocks in reverse peer
  // order, each after a two-element gap: offsets must be honoured, not assumed packed.
  std::vector<size_t> send_counts(world), send_offsets(world), recv_counts(world),
      recv_offsets(world);
  size_t send_total = 0;
  for (int d = 0; d < world; ++d) {
    send_total += 1;
    send_counts[d] = a2a_count(me, d, seed);
    send_offsets[d] = send_total;
    send_total += send_counts[d];
  }
  size_t recv_total = 0;
  for (int s = world - 1; s >= 0; --s) {
    recv_total += 2;
    recv_counts[s] = a2a_count(s, me, seed);
    recv_offsets[s] = recv_total;
    recv_total += recv_counts[s];
  }
  recv_total += 1;
  std::vector<T> send_host(send_total, make_value<T>(0));
  for (int d = 0; d < world; ++d) {
    for (size_t j = 0; j < send_counts[d]; ++j) {
      send_host[send_offsets[d] + j] = value<T>(seed, me, d * 64 + j);
    }
  }
  void* send = upload_vector(mem, send_host);
  void* recv = poisoned<T>(mem, recv_total);
  comm.all_to_all_v(send, send_counts, send_offsets, recv, recv_counts, recv_offsets,
                    dtype_of<T>::value, stream);
  stream.synchronize();
  std::vector<T> got = download_vector<T>(mem, recv, recv_total);
  std::vector<bool> written(recv_total, false);
  std::vector<double> expected(recv_total, 0.0);
  std::vector<T> got_blocks;
  std::vector<double> expected_blocks;
  for (int s = 0; s < world; ++s) {
    for (size_t j = 0; j < recv_counts[s]; ++j) {
      got_blocks.push_back(got[recv_offsets[s] + j]);
      expected_blocks.push_back(as_double(value<T>(seed, s, me * 64 + j)));
      written[recv_offsets[s] + j] = true;
    }
  }
  EXPECT_TRUE(same_values(got_blocks, expected_blocks));
  for (size_t i = 0; i < recv_total; ++i) {
    if (!written[i]) {
      EXPECT_TRUE(is_poison(got[i])) << "gap element " << i << " was overwritten";
    }
  }
}

// Elements rank r sends in a ring shift: uneven per rank.
inline size_t ring_count(int rank, uint64_t seed) {
  return 2 + (static_cast<size_t>(rank) * 3 + seed) % 5;
}

// Every rank sends to rank + shift and receives from rank - shift (mod world).
template <typename T>
void check_ring_shift(Comm& comm, Stream& stream, TestMemory& mem, int shift, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "sendrecv " << dtype_name(dtype_of<T>::value) << " shift "
                                    << shift << " rank " << comm.rank());
  const int world = comm.world_size(), me = comm.rank();
  const int dst = ((me + shift) % world + world) % world;
  const int src = ((me - shift) % world + world) % world;
  const size_t send_count = ring_count(me, seed), recv_count = ring_count(src, seed);
  void* send = upload_vector(mem, rank_data<T>(seed, me, send_count));
  void* recv = poisoned<T>(mem, recv_count);
  comm.sendrecv(send, send_count, dst, recv, recv_count, src, dtype_of<T>::value, stream);
  stream.synchronize();
  std::vector<double> expected(recv_count);
  for (size_t i = 0; i < recv_count; ++i) expected[i] = as_double(value<T>(seed, src, i));
  EXPECT_TRUE(same_values(download_vector<T>(mem, recv, recv_count), expected));
}

// Pairs (0,1), (2,3), ...: the even rank sends then receives, the odd one receives then sends; a
// last odd-one-out rank sits out. Needs world >= 2.
template <typename T>
void check_send_recv_pairs(Comm& comm, Stream& stream, TestMemory& mem, size_t count,
                           uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "send/recv " << dtype_name(dtype_of<T>::value) << " count "
                                    << count << " rank " << comm.rank());
  const int world = comm.world_size(), me = comm.rank();
  const int peer = me % 2 == 0 ? me + 1 : me - 1;
  if (peer >= world) return;
  void* send = upload_vector(mem, rank_data<T>(seed, me, count));
  void* recv = poisoned<T>(mem, count);
  if (me % 2 == 0) {
    comm.send(send, count, dtype_of<T>::value, peer, stream);
    comm.recv(recv, count, dtype_of<T>::value, peer, stream);
  } else {
    comm.recv(recv, count, dtype_of<T>::value, peer, stream);
    comm.send(send, count, dtype_of<T>::value, peer, stream);
  }
  stream.synchronize();
  std::vector<double> expected(count);
  for (size_t i = 0; i < count; ++i) expected[i] = as_double(value<T>(seed, peer, i));
  EXPECT_TRUE(same_values(download_vector<T>(mem, recv, count), expected));
}

// exchange: every rank sends two messages to every other rank and receives two from each, the
// sends listed by ascending peer and the receives by descending peer (an order in which blocking
// sends of messages past the eager size would deadlock: the second message of each pair is), the
// two of a pair in the same order on both sides. A message to this rank itself is an Error.
inline size_t exchange_count(int from, int to, int message, uint64_t seed) {
  const size_t small = 1 + (static_cast<size_t>(from) * 7 + static_cast<size_t>(to) * 3 +
                            static_cast<size_t>(message) * 5 + seed) %
                               9;
  return message == 0 ? small : 3000 + small;  // 6 KB or more: past the shared-memory eager size
}
inline size_t exchange_first_index(int to, int message) {
  return (static_cast<size_t>(to) * 2 + static_cast<size_t>(message)) * 100000;
}
template <typename T>
void check_exchange(Comm& comm, Stream& stream, TestMemory& mem, uint64_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "exchange " << dtype_name(dtype_of<T>::value) << " rank " << comm.rank());
  const int world = comm.world_size(), me = comm.rank();
  const DType dtype = dtype_of<T>::value;
  std::vector<PeerMessage> sends, recvs;
  for (int peer = 0; peer < world; ++peer) {
    if (peer == me) continue;
    for (int m = 0; m < 2; ++m) {
      const size_t n = exchange_count(me, peer, m, seed);
      sends.push_back(
          {upload_vector(mem, rank_data<T>(seed, me, n, exchange_first_index(peer, m))), n, peer});
    }
  }
  for (int peer = world - 1; peer >= 0; --peer) {
    if (peer == me) continue;
    for (int m = 0; m < 2; ++m) {
      const size_t n = exchange_count(peer, me, m, seed);
      recvs.push_back({poisoned<T>(mem, n), n, peer});
    }
  }
  comm.exchange(sends, recvs, dtype, stream);
  stream.synchronize();
  size_t i = 0;
  for (int peer = world - 1; peer >= 0; --peer) {
    if (peer == me) continue;
    for (int m = 0; m < 2; ++m, ++i) {
      const size_t n = recvs[i].count, first = exchange_first_index(me, m);
      std::vector<double> expected(n);
      for (size_t k = 0; k < n; ++k) expected[k] = as_double(value<T>(seed, peer, first + k));
      EXPECT_TRUE(same_values(download_vector<T>(mem, recvs[i].buf, n), expected))
          << "message " << m << " from rank " << peer;
    }
  }
  void* self = poisoned<T>(mem, 1);
  const PeerMessage to_self[] = {{self, 1, me}};
  EXPECT_THROW(comm.exchange(to_self, {}, dtype, stream), Error);
  EXPECT_THROW(comm.exchange({}, to_self, dtype, stream), Error);
  const PeerMessage outside[] = {{self, 1, world}};
  EXPECT_THROW(comm.exchange(outside, {}, dtype, stream), Error);
}

// Every operation once, for one element type (the reductions with each op).
// A group (Comm::group_start/end, through CommGroup) of an in-place all_gather, an in-place
// reduce_scatter and an all_reduce of different sizes: each result is what the call gives alone.
template <typename T>
void check_group(Comm& comm, Stream& stream, TestMemory& mem, uint64_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "group " << dtype_name(dtype_of<T>::value) << " rank " << comm.rank());
  const int world = comm.world_size(), me = comm.rank();
  const size_t gather_count = 5, scatter_count = 3, reduce_count = 6;
  void* gathered = poisoned<T>(mem, world * gather_count);
  std::vector<T> mine = rank_data<T>(seed, me, gather_count);
  void* my_block = static_cast<char*>(gathered) + me * gather_count * sizeof(T);
  mem.upload(my_block, mine.data(), gather_count * sizeof(T));
  void* scattered = upload_vector(mem, rank_data<T>(seed + 1, me, world * scatter_count));
  void* my_sum = static_cast<char*>(scattered) + me * scatter_count * sizeof(T);
  void* reduced_in = upload_vector(mem, rank_data<T>(seed + 2, me, reduce_count));
  void* reduced_out = poisoned<T>(mem, reduce_count);
  CommGroup group(comm);
  comm.all_gather(my_block, gathered, gather_count, dtype_of<T>::value, stream);
  comm.reduce_scatter(scattered, my_sum, scatter_count, dtype_of<T>::value, ReduceOp::sum, stream);
  comm.all_reduce(reduced_in, reduced_out, reduce_count, dtype_of<T>::value, ReduceOp::sum, stream);
  group.end();
  stream.synchronize();
  std::vector<double> expect_gathered(world * gather_count);
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < gather_count; ++i) {
      expect_gathered[r * gather_count + i] = as_double(value<T>(seed, r, i));
    }
  }
  std::vector<double> expect_scattered(scatter_count), expect_reduced(reduce_count);
  for (size_t i = 0; i < scatter_count; ++i) {
    expect_scattered[i] = reduced<T>(seed + 1, world, me * scatter_count + i, ReduceOp::sum);
  }
  for (size_t i = 0; i < reduce_count; ++i) {
    expect_reduced[i] = reduced<T>(seed + 2, world, i, ReduceOp::sum);
  }
  EXPECT_TRUE(
      same_values(download_vector<T>(mem, gathered, world * gather_count), expect_gathered));
  EXPECT_TRUE(same_values(download_vector<T>(mem, my_sum, scatter_count), expect_scattered));
  EXPECT_TRUE(same_values(download_vector<T>(mem, reduced_out, reduce_count), expect_reduced));
}

template <typename T>
void check_every_operation(Comm& comm, Stream& stream, TestMemory& mem, uint64_t seed) {
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
    check_all_reduce<T>(comm, stream, mem, 13, op, /*in_place=*/false, seed);
    check_all_reduce<T>(comm, stream, mem, 13, op, /*in_place=*/true, seed + 1);
    check_reduce_scatter<T>(comm, stream, mem, 7, op, /*in_place=*/false, seed + 2);
    check_reduce_scatter<T>(comm, stream, mem, 7, op, /*in_place=*/true, seed + 3);
  }
  check_all_gather<T>(comm, stream, mem, 9, /*in_place=*/false, seed + 4);
  check_all_gather<T>(comm, stream, mem, 9, /*in_place=*/true, seed + 5);
  check_broadcast<T>(comm, stream, mem, 11, comm.world_size() - 1, seed + 6);
  check_broadcast<T>(comm, stream, mem, 11, 0, seed + 7);
  check_all_to_all_v<T>(comm, stream, mem, seed + 8);
  check_ring_shift<T>(comm, stream, mem, +1, seed + 9);
  check_ring_shift<T>(comm, stream, mem, -1, seed + 10);
  if (comm.world_size() >= 2) check_send_recv_pairs<T>(comm, stream, mem, 10, seed + 11);
  check_exchange<T>(comm, stream, mem, seed + 12);
  check_group<T>(comm, stream, mem, seed + 13);
}

// Comm::split: the ranks with rank % modulus == color, ranked by decreasing parent rank (key =
// -rank), as a communicator: its size and rank, the parent ranks all-gathered in key order, and
// every operation on it.
inline void check_split(Comm& parent, Stream& stream, TestMemory& mem, int modulus, uint64_t seed) {
  const int W = parent.world_size(), me = parent.rank(), color = me % modulus;
  std::unique_ptr<Comm> group = parent.split(color, -me);
  std::vector<int64_t> members;  // parent ranks in the group's order
  for (int r = W - 1; r >= 0; --r) {
    if (r % modulus == color) members.push_back(r);
  }
  ASSERT_EQ(group->world_size(), static_cast<int>(members.size()));
  EXPECT_EQ(group->kind(), parent.kind());
  EXPECT_EQ(members[static_cast<size_t>(group->rank())], me);
  EXPECT_LE(group->ranks().local_size, group->world_size());
  const int64_t mine = me;
  auto* send = static_cast<int64_t*>(mem.alloc(sizeof(int64_t)));
  auto* recv = static_cast<int64_t*>(mem.alloc(members.size() * sizeof(int64_t)));
  mem.upload(send, &mine, sizeof mine);
  group->all_gather(send, recv, 1, DType::i64, stream);
  stream.synchronize();
  std::vector<int64_t> gathered(members.size());
  mem.download(gathered.data(), recv, gathered.size() * sizeof(int64_t));
  EXPECT_EQ(gathered, members) << "split by rank % " << modulus;
  check_every_operation<float>(*group, stream, mem, seed);
}

}  // namespace moepeak::testing_comm
