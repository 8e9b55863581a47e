// The CPU backend's link model (LinkModel, MpiComm::set_link_model) on real rank processes: with
// a bandwidth set, a transfer of B bytes takes at least B / bandwidth on both of its ends, from
// when it starts on its stream — a send, an all_gather ((W-1) blocks), an all_to_all_v; with a
// latency, each operation takes at least the latency; a Comm group of several pays it once; the
// results are unchanged; duplicates and splits inherit it; the config keys reach make_comm; bad
// values are an Error. Elapsed times are asserted as lower bounds (what the model promises); the
// group's saving is measured against the same operations alone in the same run, so a loaded
// machine or a sanitizer slows both sides alike.
//     ctest -R test_comm_link --output-on-failure
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <vector>

#include "core/comm/mpi_comm.h"
#include "core/comm/process_group.h"
#include "core/config/config.h"
#include "core/error.h"
#include "core/runtime/backend.h"
#include "core/runtime/cpu_stream.h"
#include "core/runtime/stream_profile.h"
#include "core/train/trainer.h"

namespace moepeak {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// 1 GB/s: a megabyte takes a millisecond.
constexpr double kBandwidth = 1e9;

class LinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ranks_ = init_process_group();
    comm_ = std::make_unique<MpiComm>(MPI_COMM_WORLD, ranks_);
  }
  RankInfo ranks_;
  std::unique_ptr<MpiComm> comm_;
  CpuStream stream_{"link-test"};
};

TEST_F(LinkTest, ASendOfBBytesTakesAtLeastBOverTheBandwidthOnBothEnds) {
  ASSERT_GE(ranks_.world_size, 2);
  comm_->set_link_model({kBandwidth, 0});
  const size_t n = 2'000'000;  // 8 MB of f32: >= 8 ms
  std::vector<float> buf(n, static_cast<float>(ranks_.rank));
  comm_->barrier();
  const auto t0 = Clock::now();
  if (ranks_.rank == 0) comm_->send(buf.data(), n, DType::f32, 1, stream_);
  if (ranks_.rank == 1) comm_->recv(buf.data(), n, DType::f32, 0, stream_);
  stream_.synchronize();
  const double took = seconds_since(t0);
  if (ranks_.rank <= 1) {
    EXPECT_GE(took, n * 4 / kBandwidth) << "rank " << ranks_.rank;
    EXPECT_EQ(buf[n - 1], 0.0f) << "the bytes arrived";
  }
}

TEST_F(LinkTest, AnAllGatherMovesWMinusOneBlocksPerRank) {
  comm_->set_link_model({kBandwidth, 0});
  const int W = ranks_.world_size;
  const size_t n = 500'000;  // 2 MB per block
  std::vector<float> mine(n, static_cast<float>(ranks_.rank)), all(n * W, -1.0f);
  comm_->barrier();
  const auto t0 = Clock::now();
  comm_->all_gather(mine.data(), all.data(), n, DType::f32, stream_);
  stream_.synchronize();
  EXPECT_GE(seconds_since(t0), (W - 1) * n * 4 / kBandwidth);
  for (int r = 0; r < W; ++r) EXPECT_EQ(all[r * n + n / 2], static_cast<float>(r));
}

TEST_F(LinkTest, AnAllToAllTakesItsLargerDirection) {
  comm_->set_link_model({kBandwidth, 0});
  const int W = ranks_.world_size;
  const size_t per_peer = 250'000;  // 1 MB to each other rank
  std::vector<size_t> counts(W, per_peer), offsets(W);
  for (int p = 0; p < W; ++p) offsets[p] = p * per_peer;
  std::vector<float> send(per_peer * W, static_cast<float>(ranks_.rank)), recv(per_peer * W);
  comm_->barrier();
  const auto t0 = Clock::now();
  comm_->all_to_all_v(send.data(), counts, offsets, recv.data(), counts, offsets, DType::f32,
                      stream_);
  stream_.synchronize();
  EXPECT_GE(seconds_since(t0), (W - 1) * per_peer * 4 / kBandwidth);
  for (int p = 0; p < W; ++p) EXPECT_EQ(recv[p * per_peer], static_cast<float>(p));
}

TEST_F(LinkTest, LatencyPadsEveryOperationAndSplitsAndDuplicatesInheritIt) {
  comm_->set_link_model({0, 2e-3});  // 2 ms per operation, no bandwidth limit
  auto dup = comm_->duplicate();
  auto half = comm_->split(ranks_.rank % 2, ranks_.rank);
  double v = 1;
  comm_->barrier();
  const auto t0 = Clock::now();
  for (int i = 0; i < 5; ++i) comm_->all_reduce(&v, &v, 1, DType::f64, ReduceOp::sum, stream_);
  for (int i = 0; i < 5; ++i) dup->all_reduce(&v, &v, 1, DType::f64, ReduceOp::max, stream_);
  if (half->world_size() > 1) {
    for (int i = 0; i < 5; ++i) half->all_reduce(&v, &v, 1, DType::f64, ReduceOp::max, stream_);
  }
  stream_.synchronize();
  const int ops = half->world_size() > 1 ? 15 : 10;
  EXPECT_GE(seconds_since(t0), ops * 2e-3);
  EXPECT_EQ(dynamic_cast<MpiComm&>(*dup).link_model().latency_s, 2e-3);
  EXPECT_EQ(dynamic_cast<MpiComm&>(*half).link_model().latency_s, 2e-3);
}

TEST_F(LinkTest, AGroupPaysOneLatencyForAllItsBytes) {
  // Eight all_reduces as one group (bucketing): one latency and the bandwidth time of their
  // bytes together. The same eight alone pay eight latencies: the group must save at least four
  // of the seven, measured against the ungrouped run on the same machine, so a slow machine (or
  // a sanitizer's 10x) slows both alike.
  const double latency = 100e-3;
  comm_->set_link_model({kBandwidth, latency});
  const size_t n = 250'000;  // 1 MB of f32 each: 8 x 1 ms at 1 GB/s
  std::vector<std::vector<float>> bufs(8, std::vector<float>(n, 1.0f));
  const auto run = [&](bool grouped) {
    for (auto& b : bufs) std::fill(b.begin(), b.end(), 1.0f);
    comm_->barrier();
    const auto t0 = Clock::now();
    if (grouped) comm_->group_start();
    for (auto& b : bufs) {
      comm_->all_reduce(b.data(), b.data(), n, DType::f32, ReduceOp::sum, stream_);
    }
    if (grouped) comm_->group_end();
    stream_.synchronize();
    return seconds_since(t0);
  };
  const double alone = run(false);
  const double took = run(true);
  const double wire = 8 * 2.0 * (ranks_.world_size - 1) / ranks_.world_size * n * 4;
  EXPECT_GE(took, latency + wire / kBandwidth);
  EXPECT_GE(alone, 8 * latency + wire / kBandwidth);
  EXPECT_GT(alone - took, 4 * latency)
      << "a group pays the latency once (alone " << alone << " s, grouped " << took << " s)";
  for (const auto& b : bufs) EXPECT_EQ(b[n - 1], static_cast<float>(ranks_.world_size));
  EXPECT_THROW(comm_->group_end(), Error) << "no group is open";
  comm_->group_start();
  EXPECT_THROW(comm_->group_start(), Error) << "groups do not nest";
  comm_->group_end();
}

TEST_F(LinkTest, OperationsAreLabelledForTheStreamProfile) {
  // Each operation is one task named by its op (a group by its first), with the link time
  // inside the span and the caller's traffic tag on it.
  comm_->set_link_model({kBandwidth, 5e-3});
  std::vector<float> a(1000, 1.0f), b(1000 * ranks_.world_size);
  comm_->barrier();
  StreamProfile::start();
  {
    const StreamTrafficTag tag("zero gather");
    comm_->all_gather(a.data(), b.data(), a.size(), DType::f32, stream_);
  }
  {
    CommGroup group(*comm_);
    comm_->reduce_scatter(b.data(), a.data(), a.size(), DType::f32, ReduceOp::sum, stream_);
    comm_->all_reduce(a.data(), a.data(), a.size(), DType::f32, ReduceOp::sum, stream_);
  }
  stream_.synchronize();
  const std::vector<StreamSpan> spans = StreamProfile::stop();
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].op, "all_gather");
  EXPECT_EQ(spans[0].traffic, "zero gather");
  EXPECT_EQ(spans[0].stream, "link-test");
  EXPECT_EQ(spans[1].op, "reduce_scatter");
  EXPECT_EQ(spans[1].traffic, "");
  for (const StreamSpan& s : spans) {
    EXPECT_GE(s.end_s - s.begin_s, 5e-3) << s.op;
    EXPECT_GE(s.end_s - s.begin_s, s.link_s) << s.op;
  }
  const int64_t W = ranks_.world_size;
  EXPECT_DOUBLE_EQ(spans[0].link_s, comm_->link_model().seconds((W - 1) * 1000.0 * 4))
      << "the all_gather's charge";
  EXPECT_GT(spans[1].link_s, 5e-3) << "a group: one latency and both operations' bytes";
  EXPECT_LT(spans[1].link_s, 10e-3);
}

TEST_F(LinkTest, TheConfigKeysReachMakeComm) {
  const Config cfg =
      load_config({}, {"runtime.cpu_link_gb_per_s=12.5", "runtime.cpu_link_latency_us=3"});
  const LinkModel link = link_model(cfg.runtime);
  EXPECT_DOUBLE_EQ(link.bytes_per_s, 12.5e9);
  EXPECT_DOUBLE_EQ(link.latency_s, 3e-6);
  EXPECT_FALSE(link_model(load_config({}, {}).runtime).enabled()) << "off by default";
  EXPECT_FALSE(link.poll_waits) << "MPI's blocking calls by default";
  EXPECT_TRUE(link_model(load_config({}, {"runtime.cpu_comm_wait=poll"}).runtime).poll_waits);
  EXPECT_THROW(load_config({}, {"runtime.cpu_comm_wait=sleep"}), Error);
  BackendOptions options;
  options.cpu_threads = 1;
  auto backend = Backend::create(options);
  auto comm = make_comm(*backend, ranks_, link);
  EXPECT_DOUBLE_EQ(dynamic_cast<MpiComm&>(*comm).link_model().bytes_per_s, 12.5e9);
  auto polled = make_comm(*backend, ranks_, {0, 0, true});
  EXPECT_TRUE(dynamic_cast<MpiComm&>(*polled->duplicate()).link_model().poll_waits)
      << "duplicates inherit the wait mode";
  EXPECT_THROW(load_config({}, {"runtime.cpu_link_gb_per_s=-1"}), Error);
  EXPECT_THROW(comm_->set_link_model({-1, 0}), Error);
}

}  // namespace
}  // namespace moepeak
