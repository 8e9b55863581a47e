// Ulysses head exchange (ops/schedules/ulysses.h) on real rank processes. Every rank builds the
// same seeded full tensors q (B, T, nh, d) and k, v (B, T, nkv, d), takes its sequence slice
// (B, T/W, heads, d), and checks against what it computes locally:
//   - seq_to_heads gives exactly (bitwise) the (B, T, h_r, d) head slice of the full tensor;
//   - heads_to_seq after seq_to_heads returns the input bitwise (accumulate false and true);
//   - heads_to_seq on per-rank data: accumulate sums the copies of a replicated kv head in
//     increasing rank (bitwise against the same sum computed locally), accumulate=false takes the
//     lowest rank's copy;
//   - end to end: Ulysses attention (seq_to_heads q, k, v -> attention on the rank's heads ->
//     heads_to_seq) equals single-process attention on the full tensors, forward and backward
//     (dk/dv of replicated kv heads summed over their ranks), within 1e-12 in f64;
//   - invalid configurations (nh % W, T % W, uneven kv straddling) throw Error with the numbers.
// Cases: MHA nh=8,nkv=8; GQA nh=8,nkv=2 (replicated at W=4); MQA nh=4,nkv=1; on 2 and 4 ranks.
//
//     ctest -R ulysses --output-on-failure
//     mpirun --allow-run-as-root --oversubscribe -np 4 build/tests/parallel/test_ulysses
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/comm/comm.h"
#include "core/comm/process_group.h"
#include "core/error.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#include "ops/attention.h"
#include "ops/fill.h"
#include "ops/schedules/ulysses.h"

namespace moepeak {
namespace {

using schedules::HeadKind;
using schedules::UlyssesLayout;
using Range = std::pair<int64_t, int64_t>;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<double> random_values(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

// Positions [begin, begin + len) of every sequence of a (B, T, H, d) array.
std::vector<double> seq_slice(const std::vector<double>& full, int64_t B, int64_t T, int64_t H,
                              int64_t d, int64_t begin, int64_t len) {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(B * len * H * d));
  for (int64_t b = 0; b < B; ++b) {
    const auto* first = full.data() + (b * T + begin) * H * d;
    out.insert(out.end(), first, first + len * H * d);
  }
  return out;
}

// Heads [h0, h1) of a (B, T, H, d) array: (B, T, h1 - h0, d).
std::vector<double> head_slice(const std::vector<double>& full, int64_t B, int64_t T, int64_t H,
                               int64_t d, int64_t h0, int64_t h1) {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(B * T * (h1 - h0) * d));
  for (int64_t row = 0; row < B * T; ++row) {
    const auto* first = full.data() + (row * H + h0) * d;
    out.insert(out.end(), first, first + (h1 - h0) * d);
  }
  return out;
}

struct Case {
  int64_t q_heads, kv_heads;
};
const Case kCases[] = {{8, 8}, {8, 2}, {4, 1}};
constexpr int64_t kBatch = 2, kSeq = 12, kHeadDim = 4;

class UlyssesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ranks_ = init_process_group();
    BackendOptions options;
    options.device_memory = 64ull << 20;
    options.pinned_budget = 16ull << 20;
    backend_ = Backend::create(options);
    comm_ = make_comm(*backend_, ranks_);
  }
  static void TearDownTestSuite() {
    backend_->synchronize();
    comm_.reset();
    backend_.reset();
  }

  Stream& stream() { return backend_->default_stream(); }
  int world() const { return comm_->world_size(); }
  int rank() const { return comm_->rank(); }

  UlyssesLayout layout(const Case& c, int64_t T = kSeq) const {
    return UlyssesLayout::make(kBatch, T, world(), rank(), c.q_heads, c.kv_heads, kHeadDim);
  }

  OwnedTensor tensor(Shape shape, DType dtype, const std::vector<double>& values) {
    auto t = OwnedTensor::device(*backend_, shape, dtype, LiveSet::workspace, "test tensor");
    EXPECT_EQ(static_cast<size_t>(t.numel()), values.size()) << shape.str();
    for (size_t i = 0; i < values.size(); ++i) {
      if (dtype == DType::f64) {
        t.data_as<double>()[i] = values[i];
      } else {
        t.data_as<float>()[i] = static_cast<float>(values[i]);
      }
    }
    return t;
  }
  OwnedTensor poisoned(Shape shape, DType dtype) {
    auto t = OwnedTensor::device(*backend_, shape, dtype, LiveSet::workspace, "test output");
    ops::fill(t, kNaN, stream());
    return t;
  }
  std::vector<double> read(const Tensor& t) {
    stream().synchronize();
    std::vector<double> v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = t.dtype() == DType::f64 ? t.data_as<double>()[i]
                                     : static_cast<double>(t.data_as<float>()[i]);
    }
    return v;
  }
  // `expected` rounded to the dtype, as a tensor made from it would hold it.
  static std::vector<double> rounded(std::vector<double> v, DType dtype) {
    if (dtype == DType::f32) {
      for (auto& x : v) x = static_cast<float>(x);
    }
    return v;
  }

  static RankInfo ranks_;
  static std::unique_ptr<Backend> backend_;
  static std::unique_ptr<Comm> comm_;
};
RankInfo UlyssesTest::ranks_;
std::unique_ptr<Backend> UlyssesTest::backend_;
std::unique_ptr<Comm> UlyssesTest::comm_;

// Bitwise equality (NaN never equals), reporting the first mismatch.
void expect_bitwise(const std::vector<double>& got, const std::vector<double>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(got[i] == want[i])) {
      if (bad++ == 0) first = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements differ; first at "
                     << first << ": got " << got[first] << ", want " << want[first];
}

// max |got - want| over the elements; NaN counts as infinite.
double max_abs_diff(const std::vector<double>& got, const std::vector<double>& want) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::abs(got[i] - want[i]);
    if (!(e <= worst)) worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
  }
  return worst;
}

size_t count_differing(const std::vector<double>& got, const std::vector<double>& want) {
  size_t n = 0;
  for (size_t i = 0; i < got.size(); ++i) n += !(got[i] == want[i]);
  return n;
}

// ---- layout, sizes, invalid configurations (local; no communication) --------------------------

TEST_F(UlyssesTest, HeadRangesOfEachRank) {
  // GQA with replication: nh = 8, nkv = 2 on 4 ranks.
  auto gqa = UlyssesLayout::make(2, 8, 4, 1, 8, 2, 4);
  EXPECT_EQ(gqa.local_seq(), 2);
  EXPECT_EQ(gqa.local_tokens(), 4);
  EXPECT_TRUE(gqa.kv_replicated());
  const std::pair<int64_t, int64_t> q[] = {{0, 2}, {2, 4}, {4, 6}, {6, 8}};
  const std::pair<int64_t, int64_t> kv[] = {{0, 1}, {0, 1}, {1, 2}, {1, 2}};
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(gqa.q_heads_of(p), q[p]) << p;
    EXPECT_EQ(gqa.kv_heads_of(p), kv[p]) << p;
  }
  EXPECT_EQ(gqa.seq_shape(HeadKind::query), (Shape{2, 2, 8, 4}));
  EXPECT_EQ(gqa.heads_shape(HeadKind::kv), (Shape{2, 8, 1, 4}));
  // gpt-oss: 64 query heads, 8 kv heads, 16 ranks: kv head p/2 on rank p.
  auto oss = UlyssesLayout::make(1, 32, 16, 0, 64, 8, 4);
  for (int p = 0; p < 16; ++p) {
    EXPECT_EQ(oss.q_heads_of(p), Range(4 * p, 4 * p + 4));
    EXPECT_EQ(oss.kv_heads_of(p), Range(p / 2, p / 2 + 1));
  }
  // Mixtral: 32 query heads, 8 kv heads, 4 ranks: two kv heads each, no replication.
  auto mix = UlyssesLayout::make(1, 8, 4, 3, 32, 8, 4);
  EXPECT_FALSE(mix.kv_replicated());
  EXPECT_EQ(mix.kv_heads_of(3), Range(6, 8));
  EXPECT_EQ(mix.heads_shape(HeadKind::query), (Shape{1, 8, 8, 4}));
  EXPECT_THROW(mix.q_heads_of(4), Error);
}

void expect_rejected(int64_t B, int64_t T, int64_t W, int64_t nh, int64_t nkv,
                     const std::vector<std::string>& mentions) {
  try {
    UlyssesLayout::make(B, T, W, 0, nh, nkv, 4);
    ADD_FAILURE() << "accepted T=" << T << " W=" << W << " nh=" << nh << " nkv=" << nkv;
  } catch (const Error& e) {
    for (const auto& m : mentions) {
      EXPECT_NE(e.message().find(m), std::string::npos) << "'" << m << "' not in: " << e.message();
    }
  }
}

TEST_F(UlyssesTest, InvalidConfigurationsAreRejectedWithTheNumbers) {
  expect_rejected(2, 8, 4, 6, 2, {"6 query heads", "4 ranks", "6 % 4 = 2"});
  expect_rejected(2, 8, 16, 8, 8, {"8 query heads", "16 ranks"});
  expect_rejected(2, 10, 4, 8, 2, {"sequence length 10", "4 ranks", "10 % 4 = 2"});
  expect_rejected(2, 8, 2, 8, 3, {"8 query heads", "3 kv heads"});
  // 12 query heads in groups of 2 (6 kv heads), 3 per rank on 4 ranks: rank 0 would need kv
  // heads 0 and half of 1.
  expect_rejected(2, 8, 4, 12, 6, {"6 kv heads on 4 ranks"});
  EXPECT_THROW(UlyssesLayout::make(2, 8, 4, 4, 8, 2, 4), Error);  // rank outside the world
  EXPECT_THROW(UlyssesLayout::make(0, 8, 4, 0, 8, 2, 4), Error);
}

TEST_F(UlyssesTest, StagingElementsAndExchangeBytes) {
  // nh = 8, nkv = 2, W = 4, B = 2, T = 8 (Lt = 2), d = 4.
  auto l = UlyssesLayout::make(2, 8, 4, 2, 8, 2, 4);
  // query: B*Lt*d*nh + B*T*(nh/W)*d = 128 + 128.
  EXPECT_EQ(schedules::ulysses_staging_elements(l, HeadKind::query), 256);
  // kv, replicated: each rank holds one kv head: B*Lt*d*4 + B*T*1*d = 64 + 64.
  EXPECT_EQ(schedules::ulysses_staging_elements(l, HeadKind::kv), 128);
  EXPECT_EQ(schedules::ulysses_exchange_bytes(l, DType::f64), 2048u);
  EXPECT_EQ(schedules::ulysses_exchange_bytes(l, DType::f32), 1024u);
  // Mixtral-like, no replication: nh = 32, nkv = 8, W = 4, B = 1, T = 4096, d = 128.
  auto m = UlyssesLayout::make(1, 4096, 4, 0, 32, 8, 128);
  const int64_t N = 1024;
  EXPECT_EQ(schedules::ulysses_staging_elements(m, HeadKind::query), 2 * N * 32 * 128);
  EXPECT_EQ(schedules::ulysses_staging_elements(m, HeadKind::kv), 2 * N * 8 * 128);
  EXPECT_EQ(schedules::ulysses_exchange_bytes(m, DType::bf16), 2ull * N * 32 * 128 * 2);
}

// ---- exchanges ---------------------------------------------------------------------------------

class UlyssesExchangeTest : public UlyssesTest {
 public:
  // seq_to_heads of one kind gives the rank's head slice of the full tensor, bitwise; the round
  // trip back returns the input bitwise.
  void check(const UlyssesLayout& l, HeadKind kind, DType dtype, uint64_t seed) {
    const int64_t B = l.batch, T = l.seq_len, H = l.total_heads(kind), d = l.head_dim;
    const auto full = rounded(random_values(B * T * H * d, seed), dtype);  // same on every rank
    auto [h0, h1] = l.heads_of(kind, rank());
    const std::string what =
        std::string(kind == HeadKind::query ? "query" : "kv") + " nh=" + std::to_string(l.q_heads) +
        " nkv=" + std::to_string(l.kv_heads) + " " + std::string(dtype_name(dtype));
    auto x_seq = tensor(l.seq_shape(kind), dtype,
                        seq_slice(full, B, T, H, d, rank() * l.local_seq(), l.local_seq()));
    auto x_heads = poisoned(l.heads_shape(kind), dtype);
    auto staging = schedules::make_ulysses_staging(*backend_, l, dtype);
    EXPECT_EQ(staging.live_set(), LiveSet::attention);
    schedules::seq_to_heads(x_seq, x_heads, kind, staging, l, *comm_, stream());
    expect_bitwise(read(x_heads), head_slice(full, B, T, H, d, h0, h1), "seq_to_heads " + what);
    for (bool accumulate : {false, true}) {
      auto back = poisoned(l.seq_shape(kind), dtype);
      schedules::heads_to_seq(x_heads, back, kind, accumulate, staging, l, *comm_, stream());
      if (accumulate && kind == HeadKind::kv && l.kv_replicated()) {
        // Replicated heads come back as the sum of identical copies: k * x for k holders.
        std::vector<double> want = read(x_seq);
        const int64_t holders = l.world / l.kv_heads;
        for (auto& x : want) {
          double s = x;
          for (int64_t i = 1; i < holders; ++i)
            s = dtype == DType::f32 ? double(float(s + x)) : s + x;
          x = s;
        }
        expect_bitwise(read(back), want, "heads_to_seq sum of copies " + what);
      } else {
        expect_bitwise(read(back), read(x_seq),
                       "round trip (accumulate=" + std::to_string(accumulate) + ") " + what);
      }
    }
  }
};

TEST_F(UlyssesExchangeTest, SeqToHeadsGivesTheHeadSliceAndRoundTripsBitwise) {
  uint64_t seed = 100;
  for (const Case& c : kCases) {
    for (DType dtype : {DType::f64, DType::f32}) {
      for (int64_t T : {kSeq, int64_t{16}}) {
        auto l = layout(c, T);
        check(l, HeadKind::query, dtype, seed++);
        check(l, HeadKind::kv, dtype, seed++);
      }
    }
  }
}

// heads_to_seq on data that differs per rank: rank p's x_heads is seeded by p, so every rank can
// compute every other rank's contribution locally.
TEST_F(UlyssesExchangeTest, AccumulateSumsReplicatedCopiesInRankOrder) {
  for (const Case& c : kCases) {
    for (DType dtype : {DType::f64, DType::f32}) {
      auto l = layout(c);
      const int64_t B = l.batch, Lt = l.local_seq(), T = l.seq_len, H = l.kv_heads, d = l.head_dim;
      auto contribution = [&](int p) {
        auto [h0, h1] = l.kv_heads_of(p);
        return rounded(random_values(B * T * (h1 - h0) * d, 7000 + 31 * p + c.kv_heads), dtype);
      };
      // Expected: for each kv head, its holders' rows of this rank's positions, in rank order.
      std::vector<double> sum(static_cast<size_t>(B * Lt * H * d), kNaN), lowest = sum;
      std::vector<bool> seen(static_cast<size_t>(H), false);
      for (int p = 0; p < world(); ++p) {
        auto [h0, h1] = l.kv_heads_of(p);
        const auto x = contribution(p);
        for (int64_t h = h0; h < h1; ++h) {
          const bool first = !seen[static_cast<size_t>(h)];
          seen[static_cast<size_t>(h)] = true;
          for (int64_t b = 0; b < B; ++b) {
            for (int64_t t = 0; t < Lt; ++t) {
              for (int64_t i = 0; i < d; ++i) {
                const double v = x[static_cast<size_t>(
                    ((b * T + rank() * Lt + t) * (h1 - h0) + h - h0) * d + i)];
                double& s = sum[static_cast<size_t>(((b * Lt + t) * H + h) * d + i)];
                if (first) {
                  s = v;
                  lowest[static_cast<size_t>(((b * Lt + t) * H + h) * d + i)] = v;
                } else {
                  s = dtype == DType::f32 ? double(float(s) + float(v)) : s + v;
                }
              }
            }
          }
        }
      }
      auto x_heads = tensor(l.heads_shape(HeadKind::kv), dtype, contribution(rank()));
      auto staging = schedules::make_ulysses_staging(*backend_, l, dtype);
      auto summed = poisoned(l.seq_shape(HeadKind::kv), dtype);
      auto taken = poisoned(l.seq_shape(HeadKind::kv), dtype);
      schedules::heads_to_seq(x_heads, summed, HeadKind::kv, true, staging, l, *comm_, stream());
      schedules::heads_to_seq(x_heads, taken, HeadKind::kv, false, staging, l, *comm_, stream());
      const std::string what = "nh=" + std::to_string(c.q_heads) +
                               " nkv=" + std::to_string(c.kv_heads) + " " +
                               std::string(dtype_name(dtype));
      expect_bitwise(read(summed), sum, "accumulate=true " + what);
      expect_bitwise(read(taken), lowest, "accumulate=false " + what);
    }
  }
}

TEST_F(UlyssesExchangeTest, BadArgumentsThrowOnTheCallingThread) {
  auto l = layout(Case{8, 2});
  auto staging = schedules::make_ulysses_staging(*backend_, l, DType::f64);
  auto x_seq = poisoned(l.seq_shape(HeadKind::kv), DType::f64);
  auto x_heads = poisoned(l.heads_shape(HeadKind::kv), DType::f64);
  auto q_heads = poisoned(l.heads_shape(HeadKind::query), DType::f64);
  // Shapes of the other kind.
  EXPECT_THROW(schedules::seq_to_heads(x_seq, q_heads, HeadKind::kv, staging, l, *comm_, stream()),
               Error);
  // Staging too small or of another dtype.
  Tensor small = staging.view().rows(0, 3);
  EXPECT_THROW(schedules::seq_to_heads(x_seq, x_heads, HeadKind::kv, small, l, *comm_, stream()),
               Error);
  auto staging32 = schedules::make_ulysses_staging(*backend_, l, DType::f32);
  EXPECT_THROW(
      schedules::heads_to_seq(x_heads, x_seq, HeadKind::kv, true, staging32, l, *comm_, stream()),
      Error);
  // A layout for another rank.
  auto other = UlyssesLayout::make(l.batch, l.seq_len, l.world, (l.rank + 1) % l.world, l.q_heads,
                                   l.kv_heads, l.head_dim);
  EXPECT_THROW(
      schedules::seq_to_heads(x_seq, x_heads, HeadKind::kv, staging, other, *comm_, stream()),
      Error);
  stream().synchronize();  // nothing was enqueued, nothing failed
}

// ---- end to end: Ulysses attention == single-process attention ---------------------------------

struct AttentionRun {
  std::vector<double> out, dq, dk, dv;
};

class UlyssesAttentionTest : public UlyssesTest {
 public:
  void check(const Case& c, ops::AttentionBlocks blocks, uint64_t seed) {
    auto l = layout(c, 16);
    const int64_t B = l.batch, T = l.seq_len, nh = l.q_heads, nkv = l.kv_heads, d = l.head_dim;
    const int64_t Lt = l.local_seq(), me = rank();
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const DType f64 = DType::f64;
    const auto q = random_values(B * T * nh * d, seed),
               k = random_values(B * T * nkv * d, seed + 1),
               v = random_values(B * T * nkv * d, seed + 2),
               dout = random_values(B * T * nh * d, seed + 3);

    // Single process on the full tensors.
    const Shape qs{B, T, nh, d}, kvs{B, T, nkv, d};
    auto fq = tensor(qs, f64, q), fk = tensor(kvs, f64, k), fv = tensor(kvs, f64, v);
    auto fdout = tensor(qs, f64, dout);
    auto fout = poisoned(qs, f64), flse = poisoned(Shape{B, nh, T}, f64);
    auto fdq = poisoned(qs, f64), fdk = poisoned(kvs, f64), fdv = poisoned(kvs, f64);
    ops::detail::attention_forward_cpu_blocked(fq, fk, fv, scale, ops::AttentionVariant{}, fout,
                                               flse, blocks, stream());
    ops::detail::attention_backward_cpu_blocked(fq, fk, fv, fout, flse, fdout, scale,
                                                ops::AttentionVariant{}, fdq, fdk, fdv, Tensor(),
                                                blocks, stream());
    auto slice = [&](const OwnedTensor& t, int64_t H) {
      return seq_slice(read(t), B, T, H, d, me * Lt, Lt);
    };
    AttentionRun want{slice(fout, nh), slice(fdq, nh), slice(fdk, nkv), slice(fdv, nkv)};

    // Ulysses: this rank's tokens of every head in, heads exchanged around the op.
    const HeadKind Q = HeadKind::query, KV = HeadKind::kv;
    auto staging = schedules::make_ulysses_staging(*backend_, l, f64);
    auto sq = tensor(l.seq_shape(Q), f64, seq_slice(q, B, T, nh, d, me * Lt, Lt));
    auto sk = tensor(l.seq_shape(KV), f64, seq_slice(k, B, T, nkv, d, me * Lt, Lt));
    auto sv = tensor(l.seq_shape(KV), f64, seq_slice(v, B, T, nkv, d, me * Lt, Lt));
    auto sdout = tensor(l.seq_shape(Q), f64, seq_slice(dout, B, T, nh, d, me * Lt, Lt));
    auto hq = poisoned(l.heads_shape(Q), f64), hk = poisoned(l.heads_shape(KV), f64),
         hv = poisoned(l.heads_shape(KV), f64), hout = poisoned(l.heads_shape(Q), f64),
         hdout = poisoned(l.heads_shape(Q), f64), hdq = poisoned(l.heads_shape(Q), f64),
         hdk = poisoned(l.heads_shape(KV), f64), hdv = poisoned(l.heads_shape(KV), f64);
    const int64_t hq_n = l.heads_count(Q, static_cast<int>(me));
    auto hlse = poisoned(Shape{B, hq_n, T}, f64);  // stays in the head layout for the backward
    auto out = poisoned(l.seq_shape(Q), f64), dq = poisoned(l.seq_shape(Q), f64),
         dk = poisoned(l.seq_shape(KV), f64), dv = poisoned(l.seq_shape(KV), f64);
    auto& comm = *comm_;
    schedules::seq_to_heads(sq, hq, Q, staging, l, comm, stream());
    schedules::seq_to_heads(sk, hk, KV, staging, l, comm, stream());
    schedules::seq_to_heads(sv, hv, KV, staging, l, comm, stream());
    ops::detail::attention_forward_cpu_blocked(hq, hk, hv, scale, ops::AttentionVariant{}, hout,
                                               hlse, blocks, stream());
    schedules::heads_to_seq(hout, out, Q, false, staging, l, comm, stream());
    // Backward.
    schedules::seq_to_heads(sdout, hdout, Q, staging, l, comm, stream());
    ops::detail::attention_backward_cpu_blocked(hq, hk, hv, hout, hlse, hdout, scale,
                                                ops::AttentionVariant{}, hdq, hdk, hdv, Tensor(),
                                                blocks, stream());
    schedules::heads_to_seq(hdq, dq, Q, false, staging, l, comm, stream());
    schedules::heads_to_seq(hdk, dk, KV, true, staging, l, comm, stream());
    schedules::heads_to_seq(hdv, dv, KV, true, staging, l, comm, stream());
    AttentionRun got{read(out), read(dq), read(dk), read(dv)};

    const std::string what = "nh=" + std::to_string(nh) + " nkv=" + std::to_string(nkv) +
                             " W=" + std::to_string(l.world) + " blocks " +
                             std::to_string(blocks.query_rows) + "x" + std::to_string(blocks.keys);
    const std::pair<const char*, std::pair<std::vector<double>*, std::vector<double>*>> parts[] = {
        {"out", {&got.out, &want.out}},
        {"dq", {&got.dq, &want.dq}},
        {"dk", {&got.dk, &want.dk}},
        {"dv", {&got.dv, &want.dv}}};
    std::string report;
    for (const auto& [name, gw] : parts) {
      const double err = max_abs_diff(*gw.first, *gw.second);
      EXPECT_LE(err, 1e-12) << name << " " << what;
      char diff[64];
      std::snprintf(diff, sizeof diff, " max|diff| %.1e", err);
      report += std::string(" ") + name +
                (count_differing(*gw.first, *gw.second) == 0 ? std::string(" bitwise") : diff);
    }
    // Whether the results were bitwise equal, for the record (rank 0 prints its own slice).
    if (me == 0) std::printf("[ulysses e2e %s]%s\n", what.c_str(), report.c_str());
  }
};

TEST_F(UlyssesAttentionTest, EqualsSingleProcessAttentionForwardAndBackward) {
  uint64_t seed = 9000;
  for (const Case& c : kCases) {
    check(c, ops::kAttentionBlocks, seed);
    check(c, ops::AttentionBlocks{4, 3}, seed + 10);  // small blocks: many per sequence
    seed += 100;
  }
}

}  // namespace
}  // namespace moepeak
