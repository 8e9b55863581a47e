// ExpertParallelDispatch on W real rank processes against StandardDispatch on one rank, and
// StandardDispatch against the float64 host reference (tests/moe_reference.h).
//
// Every rank builds the same full problem from a seed (N tokens (N, H), all E experts' weights
// w1, w3 (F, H), w2 (H, F), routing index/weight (N, k); in the gpt-oss cases also random biases
// b1, b3 (F), b2 (H) and the clamped SwiGLU with limit 0.5 and alpha 1.702, so the clamp binds on
// a good fraction of the elements, checked), runs StandardDispatch over all of it locally as the
// reference, then runs the expert-parallel dispatcher on its token slice [r*N/W, (r+1)*N/W) and
// its experts [r*E/W, (r+1)*E/W). Checked, in f64 and f32:
//   - StandardDispatch against the float64 reference: out, dx, dweight and every weight (and
//     bias) gradient within 1e-12 (f64) / 1e-5 (f32) relative (GEMMs and the reference's loops
//     sum in other orders; f32 rounds its inputs and every product: measured in the file's
//     results, printed);
//   - out, dx and dweight slices: bitwise equal to the reference, else within 1e-12 (f64) /
//     1e-5 (f32); the test prints which;
//   - local expert weight (and bias) gradients: within 1e-12 (f64) / 1e-5 (f32) relative;
//   - dweight (=) poisoned with NaN beforehand, the whole free arena too (so an internal buffer
//     read before it is written shows up); out, dx and dW (+=) start from seeded values;
//   - the rows each rank receives and the global expert counts;
//   - the measured dispatch peak equals dispatch_expert_parallel_bytes for the rows received, and
//     grows on the receiving rank under skewed routing (most tokens pick expert 0, or every token
//     picks rank 0's experts: the worst case the planner assumes);
//   - E % W != 0 is an Error naming E and W.
//
//     ctest -R expert_parallel --output-on-failure
//     mpirun --allow-run-as-root --oversubscribe -np 4 build/tests/parallel/test_expert_parallel
//
// Written for W in {1, 2, 4} (E = 8 experts, N = 24 tokens, k = 2 <= E/W for the "all to rank
// 0" routing); registered with 4 and 2 ranks. 2 cores serve them, so shapes are tiny.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/comm/comm.h"
#include "core/comm/process_group.h"
#include "core/error.h"
#include "core/runtime/backend.h"
#include "ops/fill.h"
#include "ops/schedules/dispatch_expert_parallel.h"
#include "ops/schedules/dispatch_standard.h"
#include "ops/swiglu.h"
#include "tests/moe_reference.h"
#include "tests/parallel/rank_test_env.h"

namespace moepeak {
namespace {

using schedules::dispatch_expert_parallel_bytes;
using schedules::ExpertParallelDispatch;
using schedules::ExpertWeights;
using schedules::StandardDispatch;

constexpr int64_t kTokens = 24, kHidden = 8, kFfn = 12, kExperts = 8, kTopK = 2;

enum class Routing { random, skewed, all_to_rank0 };

const char* routing_name(Routing r) {
  switch (r) {
    case Routing::random:
      return "random";
    case Routing::skewed:
      return "skewed";
    case Routing::all_to_rank0:
      return "all to rank 0";
  }
  return "?";
}

// The full problem, in doubles (written to tensors in the run's dtype).
struct Problem {
  std::vector<double> x, weight, dout, out0, dx0;  // (N, H), (N, k), (N, H), (N, H), (N, H)
  std::vector<int64_t> index;                      // (N, k)
  std::vector<std::vector<double>> w1, w2, w3, dw1, dw2, dw3;  // per expert; dw*: starting values
  // gpt-oss: per expert b1, b3 (F), b2 (H) and their gradients' starting values, and the clamped
  // SwiGLU (the plain one and no biases otherwise).
  bool biases = false;
  std::vector<std::vector<double>> b1, b2, b3, db1, db2, db3;
  ops::SwigluParams activation;
};

// gpt-oss's experts with a small clamp (0.5: a and b are of order 0.3 to 1 here, so it binds on a
// good fraction of the elements) and its alpha.
const ops::SwigluParams kClamped = ops::SwigluParams::gpt_oss(0.5, 1.702);

Problem make_problem(uint64_t seed, Routing routing, int64_t experts_on_rank0,
                     bool gpt_oss = false) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uni(-1.0, 1.0), pos(0.1, 1.0), coin(0.0, 1.0);
  auto vec = [&](int64_t n, double scale) {
    std::vector<double> v(static_cast<size_t>(n));
    for (auto& e : v) e = scale * uni(rng);
    return v;
  };
  Problem p;
  p.x = vec(kTokens * kHidden, 1.0);
  p.dout = vec(kTokens * kHidden, 1.0);
  p.out0 = vec(kTokens * kHidden, 0.5);
  p.dx0 = vec(kTokens * kHidden, 0.5);
  for (int64_t e = 0; e < kExperts; ++e) {
    p.w1.push_back(vec(kFfn * kHidden, 1.0 / std::sqrt(double(kHidden))));
    p.w3.push_back(vec(kFfn * kHidden, 1.0 / std::sqrt(double(kHidden))));
    p.w2.push_back(vec(kHidden * kFfn, 1.0 / std::sqrt(double(kFfn))));
    p.dw1.push_back(vec(kFfn * kHidden, 0.1));
    p.dw3.push_back(vec(kFfn * kHidden, 0.1));
    p.dw2.push_back(vec(kHidden * kFfn, 0.1));
  }
  for (int64_t n = 0; n < kTokens; ++n) {
    std::vector<int64_t> order(kExperts);
    for (int64_t e = 0; e < kExperts; ++e) order[e] = e;
    std::shuffle(order.begin(), order.end(), rng);
    if (routing == Routing::skewed && coin(rng) < 0.85) {
      std::iter_swap(order.begin(), std::find(order.begin(), order.end(), 0));  // expert 0 first
    } else if (routing == Routing::all_to_rank0) {
      // The first k of rank 0's experts [0, experts_on_rank0), in random order.
      for (int64_t e = 0; e < experts_on_rank0; ++e) order[e] = e;
      std::shuffle(order.begin(), order.begin() + experts_on_rank0, rng);
    }
    double sum = 0;
    std::vector<double> w(kTopK);
    for (auto& v : w) sum += (v = pos(rng));
    for (int64_t j = 0; j < kTopK; ++j) {
      p.index.push_back(order[j]);
      p.weight.push_back(w[j] / sum);
    }
  }
  if (gpt_oss) {  // drawn last, so the other cases' inputs are those of before
    p.biases = true;
    p.activation = kClamped;
    for (int64_t e = 0; e < kExperts; ++e) {
      p.b1.push_back(vec(kFfn, 0.5));
      p.b3.push_back(vec(kFfn, 0.5));
      p.b2.push_back(vec(kHidden, 0.5));
      p.db1.push_back(vec(kFfn, 0.1));
      p.db3.push_back(vec(kFfn, 0.1));
      p.db2.push_back(vec(kHidden, 0.1));
    }
  }
  return p;
}

// Tensors in the arena's workspace set (so the dispatch set holds only the dispatcher's).
class Env : public test_support::RankTestEnv {
 public:
  using RankTestEnv::input;
  using RankTestEnv::RankTestEnv;
  OwnedTensor input(const std::vector<double>& v, int64_t rows, int64_t width) {
    return RankTestEnv::input(v, width, 0, rows);
  }
  OwnedTensor index(const std::vector<int64_t>& v, int64_t begin, int64_t end) {
    return indices(v, kTopK, begin, end);
  }
  // Every rank's value of v, rank order.
  std::vector<int64_t> all_gather(int64_t v) {
    std::vector<int64_t> send{v}, all(static_cast<size_t>(world()));
    comm().all_gather(send.data(), all.data(), 1, DType::i64, stream());
    stream().synchronize();
    return all;
  }
};

// Experts [first, first + count) of the problem as tensors; grads start at the problem's values.
struct Experts {
  std::vector<ExpertWeights> weights;
  std::vector<OwnedTensor> storage;
};
Experts make_experts(Env& env, const Problem& p, int64_t first, int64_t count) {
  Experts ex;
  for (int64_t e = first; e < first + count; ++e) {
    ExpertWeights w;
    auto add = [&](const std::vector<double>& v, int64_t rows, int64_t cols, Tensor& slot) {
      ex.storage.push_back(env.input(v, rows, cols));
      slot = ex.storage.back().view();
    };
    add(p.w1[e], kFfn, kHidden, w.w1);
    add(p.w3[e], kFfn, kHidden, w.w3);
    add(p.w2[e], kHidden, kFfn, w.w2);
    add(p.dw1[e], kFfn, kHidden, w.dw1);
    add(p.dw3[e], kFfn, kHidden, w.dw3);
    add(p.dw2[e], kHidden, kFfn, w.dw2);
    if (p.biases) {  // (F) and (H) vectors
      auto bias = [&](const std::vector<double>& v, Tensor& slot) {
        ex.storage.push_back(env.input(v, 1, static_cast<int64_t>(v.size())));
        slot = ex.storage.back().view().reshape(Shape{static_cast<int64_t>(v.size())});
      };
      bias(p.b1[e], w.b1);
      bias(p.b3[e], w.b3);
      bias(p.b2[e], w.b2);
      bias(p.db1[e], w.db1);
      bias(p.db3[e], w.db3);
      bias(p.db2[e], w.db2);
    }
    ex.weights.push_back(w);
  }
  return ex;
}

struct Outputs {
  std::vector<double> out, dx, dweight;
  std::vector<std::vector<double>> dw;  // per expert: dw1, dw3, dw2 concatenated
  std::vector<int64_t> counts;
};

// dw1, dw3, dw2 and, with biases, db1, db3, db2, concatenated (tests/moe_reference.h layout).
std::vector<double> expert_grads(Env& env, const ExpertWeights& w) {
  std::vector<double> all = env.read(w.dw1);
  for (const Tensor* t : {&w.dw3, &w.dw2, &w.db1, &w.db3, &w.db2}) {
    if (!t->defined()) continue;
    std::vector<double> part = env.read(*t);
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

Outputs run_reference(Env& env, const Problem& p) {
  Experts ex = make_experts(env, p, 0, kExperts);
  auto x = env.input(p.x, kTokens, kHidden), weight = env.input(p.weight, kTokens, kTopK);
  auto index = env.index(p.index, 0, kTokens);
  auto out = env.input(p.out0, kTokens, kHidden), dout = env.input(p.dout, kTokens, kHidden);
  auto dx = env.input(p.dx0, kTokens, kHidden);
  auto dweight = env.nan_output(Shape{kTokens, kTopK});
  StandardDispatch dispatch(env.backend(), env.stream(), env.dtype(), p.activation);
  dispatch.forward(x, index, weight, ex.weights, out);
  dispatch.backward(dout, ex.weights, dx, dweight);
  Outputs o{env.read(out), env.read(dx), env.read(dweight), {}, dispatch.expert_counts()};
  for (const auto& w : ex.weights) o.dw.push_back(expert_grads(env, w));
  return o;
}

struct EpRun {
  Outputs outputs;
  int64_t received_rows = 0;
  uint64_t dispatch_peak = 0, dispatch_left = 0;
};

EpRun run_expert_parallel(Env& env, const Problem& p) {
  const int64_t W = env.comm().world_size(), r = env.comm().rank();
  const int64_t n0 = r * kTokens / W, n1 = (r + 1) * kTokens / W, El = kExperts / W;
  Experts ex = make_experts(env, p, r * El, El);
  auto x = env.input(p.x, kHidden, n0, n1), weight = env.input(p.weight, kTopK, n0, n1);
  auto index = env.index(p.index, n0, n1);
  auto out = env.input(p.out0, kHidden, n0, n1), dout = env.input(p.dout, kHidden, n0, n1);
  auto dx = env.input(p.dx0, kHidden, n0, n1);
  auto dweight = env.nan_output(Shape{n1 - n0, kTopK});
  ExpertParallelDispatch dispatch(env.backend(), env.stream(), env.comm(), env.dtype(), kExperts,
                                  p.activation);
  EXPECT_EQ(dispatch.num_local_experts(), El);
  EXPECT_EQ(dispatch.first_local_expert(), r * El);
  env.poison_free_arena();
  env.backend().arena().reset_peaks();
  dispatch.forward(x, index, weight, ex.weights, out);
  EpRun run;
  run.received_rows = dispatch.received_rows();
  run.outputs.counts = dispatch.expert_counts();
  dispatch.backward(dout, ex.weights, dx, dweight);
  env.stream().synchronize();
  MemoryStats stats = env.backend().arena().stats();
  run.dispatch_peak = stats.peak_per_set()[LiveSet::dispatch];
  run.dispatch_left = stats.current()[LiveSet::dispatch];
  run.outputs.out = env.read(out);
  run.outputs.dx = env.read(dx);
  run.outputs.dweight = env.read(dweight);
  for (const auto& w : ex.weights) run.outputs.dw.push_back(expert_grads(env, w));
  return run;
}

// Max |got - want| over max |want| (infinite if got holds a NaN), and whether the bits agree.
struct Diff {
  bool bitwise = true;
  double rel = 0;
  std::string str() const {
    if (bitwise) return "bitwise";
    std::ostringstream os;
    os << "rel " << rel;
    return os.str();
  }
};
Diff compare(const std::vector<double>& got, const std::vector<double>& want, size_t begin = 0) {
  Diff d;
  double err = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double g = got[i], w = want[begin + i];
    if (std::isnan(g) || std::isnan(w)) err = std::numeric_limits<double>::infinity();
    if (g != w || std::signbit(g) != std::signbit(w)) d.bitwise = false;
    err = std::max(err, std::abs(g - w));
    scale = std::max(scale, std::abs(w));
  }
  d.rel = scale > 0 ? err / scale : err;
  return d;
}

class ExpertParallelTest : public ::testing::Test {
 protected:
  // f64: the same per-row arithmetic as one rank, so at most rounding in a different GEMM
  // blocking. f32: dW sums R products of values of order 1 in a possibly different order;
  // with float's 6e-8 unit roundoff and tens of rows, 1e-5 leaves room without hiding a bug.
  static double tolerance(DType dtype) { return dtype == DType::f64 ? 1e-12 : 1e-5; }

  // StandardDispatch's outputs `ref` against the float64 reference of problem `p`: returns the
  // largest relative difference over out, dx, dweight and every expert's gradients.
  static double check_against_float64(const Outputs& ref, const Problem& p, DType dtype,
                                      const std::string& what) {
    const test_support::MoeReference exact =
        test_support::moe_reference(p, kTokens, kHidden, kFfn, kTopK, p.biases, p.activation);
    const double tol = tolerance(dtype);
    double worst = 0;
    auto check = [&](const std::vector<double>& got, const std::vector<double>& want,
                     const std::string& part) {
      EXPECT_EQ(got.size(), want.size()) << what << ": " << part;
      if (got.size() != want.size()) return;
      const Diff d = compare(got, want);
      EXPECT_LE(d.rel, tol) << what << ": standard " << part << " against the float64 reference";
      worst = std::max(worst, d.rel);
    };
    check(ref.out, exact.out, "out");
    check(ref.dx, exact.dx, "dx");
    check(ref.dweight, exact.dweight, "dweight");
    for (int64_t e = 0; e < kExperts; ++e) {
      check(ref.dw[e], exact.grads[e], "gradients of expert " + std::to_string(e));
    }
    if (p.biases) {
      // The clamp is exercised: a and b beyond +-0.5 on a good fraction of the elements.
      EXPECT_GE(exact.a_clamped, 0.1) << what;
      EXPECT_GE(exact.b_clamped, 0.1) << what;
    }
    return worst;
  }

  // Runs one case and checks everything; returns (received rows, dispatch peak) of this rank.
  std::pair<int64_t, uint64_t> check_case(DType dtype, Routing routing, uint64_t seed,
                                          bool gpt_oss = false) {
    Env env(dtype);
    const int64_t W = env.comm().world_size(), r = env.comm().rank();
    const int64_t n0 = r * kTokens / W, n1 = (r + 1) * kTokens / W, El = kExperts / W;
    const Problem p = make_problem(seed, routing, El, gpt_oss);
    const Outputs ref = run_reference(env, p);
    const EpRun ep = run_expert_parallel(env, p);
    const double tol = tolerance(dtype);
    const std::string what = std::string(dtype_name(dtype)) + ", " + routing_name(routing) +
                             " routing" + (gpt_oss ? ", biases and clamped SwiGLU" : "");
    const double vs64 = check_against_float64(ref, p, dtype, what);

    Diff out = compare(ep.outputs.out, ref.out, static_cast<size_t>(n0 * kHidden));
    Diff dx = compare(ep.outputs.dx, ref.dx, static_cast<size_t>(n0 * kHidden));
    Diff dweight = compare(ep.outputs.dweight, ref.dweight, static_cast<size_t>(n0 * kTopK));
    EXPECT_LE(out.rel, tol) << what << ": out";
    EXPECT_LE(dx.rel, tol) << what << ": dx";
    EXPECT_LE(dweight.rel, tol) << what << ": dweight";
    Diff dw;
    for (int64_t l = 0; l < El; ++l) {
      Diff d = compare(ep.outputs.dw[l], ref.dw[r * El + l]);
      EXPECT_LE(d.rel, tol) << what << ": weight grads of expert " << r * El + l;
      dw.bitwise = dw.bitwise && d.bitwise;
      dw.rel = std::max(dw.rel, d.rel);
    }
    EXPECT_EQ(ep.outputs.counts, ref.counts) << what << ": global expert counts";

    // Rows received: what the full routing sends to this rank's experts.
    int64_t expect_rows = 0;
    for (int64_t e : p.index) expect_rows += (e / El == r);
    EXPECT_EQ(ep.received_rows, expect_rows) << what;
    EXPECT_EQ(ep.dispatch_peak, dispatch_expert_parallel_bytes(n1 - n0, kTopK, kHidden, kFfn, dtype,
                                                               ep.received_rows))
        << what << ": measured dispatch peak against the formula, " << ep.received_rows
        << " rows received";
    EXPECT_EQ(ep.dispatch_left, 0u) << what << ": dispatch buffers left after backward";

    // One line per case from rank 0: how close, and the rows each rank received.
    std::vector<int64_t> rows = env.all_gather(ep.received_rows);
    std::vector<int64_t> peaks = env.all_gather(static_cast<int64_t>(ep.dispatch_peak));
    std::vector<int64_t> bit = env.all_gather(out.bitwise && dx.bitwise && dweight.bitwise);
    if (r == 0) {
      std::ostringstream os;
      os << "[W=" << W << " " << what << "] rank 0: out " << out.str() << ", dx " << dx.str()
         << ", dweight " << dweight.str() << ", dW " << dw.str()
         << "; standard vs float64 reference rel " << vs64 << "; out/dx/dweight bitwise on ";
      int64_t n_bitwise = 0;
      for (int64_t b : bit) n_bitwise += b;
      os << n_bitwise << "/" << W << " ranks; received rows";
      for (int64_t v : rows) os << " " << v;
      os << "; dispatch peak bytes";
      for (int64_t v : peaks) os << " " << v;
      std::printf("%s\n", os.str().c_str());
      RecordProperty(what + " received rows rank 0", std::to_string(rows[0]));
      RecordProperty(what + " out/dx/dweight",
                     out.bitwise && dx.bitwise && dweight.bitwise ? "bitwise" : "within tolerance");
    }
    return {ep.received_rows, ep.dispatch_peak};
  }
};

TEST_F(ExpertParallelTest, MatchesOneRankF64Random) { check_case(DType::f64, Routing::random, 11); }
TEST_F(ExpertParallelTest, MatchesOneRankF32Random) { check_case(DType::f32, Routing::random, 12); }

// gpt-oss's experts: biases b1, b3, b2 (their gradients summed on the owner over the same rows in
// the same order as on one rank) and the clamped SwiGLU with a clamp that binds.
TEST_F(ExpertParallelTest, BiasedClampedMatchesOneRankF64) {
  check_case(DType::f64, Routing::random, 13, true);
  check_case(DType::f64, Routing::skewed, 14, true);
}
TEST_F(ExpertParallelTest, BiasedClampedMatchesOneRankF32) {
  check_case(DType::f32, Routing::random, 15, true);
  check_case(DType::f32, Routing::all_to_rank0, 16, true);
}

TEST_F(ExpertParallelTest, SkewedRoutingGrowsTheReceivingRanksBuffers) {
  for (DType dtype : {DType::f64, DType::f32}) {
    auto [rows_random, peak_random] = check_case(dtype, Routing::random, 21);
    auto [rows_skewed, peak_skewed] = check_case(dtype, Routing::skewed, 21);
    auto [rows_worst, peak_worst] = check_case(dtype, Routing::all_to_rank0, 21);
    Env env(dtype);
    const int64_t W = env.comm().world_size();
    if (env.comm().rank() == 0 && W > 1) {
      // Rank 0 owns expert 0, the hot one: it receives more, and its buffers grow with it (in
      // steps of the arena's 256-byte alignment, so a few more f32 rows may fit the same bytes).
      EXPECT_GT(rows_skewed, rows_random);
      EXPECT_GE(peak_skewed, peak_random);
      EXPECT_GT(peak_worst, peak_random);
      // Every routed row of the batch: the planner's worst case, W * N_local * k.
      EXPECT_EQ(rows_worst, kTokens * kTopK);
      EXPECT_EQ(peak_worst, dispatch_expert_parallel_bytes(kTokens / W, kTopK, kHidden, kFfn, dtype,
                                                           W * (kTokens / W) * kTopK));
      EXPECT_GT(peak_worst, peak_skewed);
    } else if (W > 1) {
      EXPECT_EQ(rows_worst, 0);  // nothing for the other ranks
    }
  }
}

TEST_F(ExpertParallelTest, ExpertsNotDivisibleByRanksIsAnError) {
  Env env(DType::f64);
  const int64_t W = env.comm().world_size();
  if (W == 1) GTEST_SKIP() << "every E is a multiple of one rank";
  try {
    ExpertParallelDispatch dispatch(env.backend(), env.stream(), env.comm(), DType::f64, W + 1);
    FAIL() << "E = W + 1 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("E = " + std::to_string(W + 1)), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("W = " + std::to_string(W)), std::string::npos) << e.message();
  }
}

TEST_F(ExpertParallelTest, BackwardWithoutForwardAndWrongExpertCountAreErrors) {
  Env env(DType::f64);
  const int64_t El = kExperts / env.comm().world_size();
  ExpertParallelDispatch dispatch(env.backend(), env.stream(), env.comm(), DType::f64, kExperts);
  auto t = env.nan_output(Shape{2, kHidden});
  auto w = env.nan_output(Shape{2, kTopK});
  EXPECT_THROW(dispatch.backward(t, {}, t, w), Error);
  // A wrong number of local experts is found before any collective.
  Problem p = make_problem(5, Routing::random, El);
  Experts too_many = make_experts(env, p, 0, El + 1);
  auto index = env.index(p.index, 0, 2);
  EXPECT_THROW(dispatch.forward(t, index, w, too_many.weights, t), Error);
}

}  // namespace
}  // namespace moepeak
