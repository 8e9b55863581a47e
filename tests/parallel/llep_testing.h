// What test_llep.cpp and test_llep_gpt_oss.cpp share (one test binary, test_llep): the problem
// (tokens, experts, routing; optionally gpt-oss's expert biases and clamped SwiGLU), the runs of
// each dispatcher over this rank's slice, the comparisons against the standard expert-parallel
// dispatcher (and its f64 run, and the float64 host reference of tests/moe_reference.h), and the
// LlepTest fixture's whole-case checks (check_llep, check_pipelined). test_llep.cpp's comment
// says what is checked and why the tolerances are what they are.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/comm/comm.h"
#include "core/comm/process_group.h"
#include "core/error.h"
#include "core/runtime/arena.h"
#include "core/runtime/backend.h"
#include "core/runtime/cpu_stream.h"
#include "ops/fill.h"
#include "ops/schedules/dispatch_expert_parallel.h"
#include "ops/schedules/dispatch_llep.h"
#include "ops/schedules/dispatch_pipelined_llep.h"
#include "ops/schedules/schedule_dtype.h"
#include "ops/swiglu.h"
#include "tests/moe_reference.h"
#include "tests/parallel/rank_test_env.h"

namespace moepeak::llep_testing {

using schedules::ExpertDispatch;
using schedules::ExpertParallelDispatch;
using schedules::ExpertWeights;
using schedules::LlepDispatch;
using schedules::LlepParams;
using schedules::PipelinedLlepDispatch;
using schedules::PipelinedLlepParams;

// H * b is a multiple of the arena's 256-byte granule in f32 and f64, so footprint rounding
// does not eat the room the bound leaves for tiles (see check_pipelined). F = 2.5 H:
// the room beside the slots holds tiles of a few rows only with F cut into blocks, so the
// pipeline runs its blocked expert MLP (ffn_blocks >= 2, checked): 2 blocks of 80 on 4 ranks,
// 3 of 54, 54 and 52 (a narrower last one) on 2.
constexpr int64_t kHidden = 64, kFfn = 160, kExperts = 8, kTopK = 2;

inline int64_t tokens_of(int64_t rank) { return 48 + 2 * rank; }
inline int64_t first_token_of(int64_t rank) {
  int64_t n = 0;
  for (int64_t r = 0; r < rank; ++r) n += tokens_of(r);
  return n;
}

enum class Routing { balanced, zipf, adversarial };
inline const char* routing_name(Routing r) {
  switch (r) {
    case Routing::balanced:
      return "balanced";
    case Routing::zipf:
      return "zipf";
    case Routing::adversarial:
      return "adversarial";
  }
  return "?";
}

// The full problem, in doubles (written to tensors in the run's dtype).
struct Problem {
  int64_t tokens = 0;                              // all ranks'
  std::vector<double> x, weight, dout, out0, dx0;  // (T, H), (T, k), (T, H) x 3
  std::vector<int64_t> index;                      // (T, k)
  std::vector<std::vector<double>> w1, w2, w3, dw1, dw2, dw3;
  // gpt-oss: per expert b1, b3 (F), b2 (H) and their gradients' starting values, and the clamped
  // SwiGLU (the plain one and no biases otherwise).
  bool biases = false;
  std::vector<std::vector<double>> b1, b2, b3, db1, db2, db3;
  ops::SwigluParams activation;
};

// gpt-oss's experts with a small clamp: a and b are of order 0.5 to 1 here, so limit 0.5 binds
// on a good fraction of the elements (checked against the float64 reference); its alpha.
inline ops::SwigluParams clamped_swiglu() { return ops::SwigluParams::gpt_oss(0.5, 1.702); }

// "gpt-oss limit 0.5 " for a gpt-oss case (its clamp), "" otherwise.
inline std::string gpt_oss_label(const std::optional<ops::SwigluParams>& gpt_oss) {
  if (!gpt_oss) return "";
  std::ostringstream os;
  os << "gpt-oss limit " << gpt_oss->limit << " ";
  return os.str();
}

// With `gpt_oss` (an activation), also random expert biases (drawn after everything else, so the
// other inputs are those of the same seed without them) and that SwiGLU.
inline Problem make_problem(uint64_t seed, Routing routing, int64_t world,
                            const std::optional<ops::SwigluParams>& gpt_oss = std::nullopt) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uni(-1.0, 1.0), pos(0.1, 1.0), u01(1e-12, 1.0);
  auto vec = [&](int64_t n, double scale) {
    std::vector<double> v(static_cast<size_t>(n));
    for (auto& e : v) e = scale * uni(rng);
    return v;
  };
  Problem p;
  p.tokens = first_token_of(world);
  const int64_t T = p.tokens;
  p.x = vec(T * kHidden, 1.0);
  p.dout = vec(T * kHidden, 1.0);
  p.out0 = vec(T * kHidden, 0.5);
  p.dx0 = vec(T * kHidden, 0.5);
  for (int64_t e = 0; e < kExperts; ++e) {
    p.w1.push_back(vec(kFfn * kHidden, 1.0 / std::sqrt(double(kHidden))));
    p.w3.push_back(vec(kFfn * kHidden, 1.0 / std::sqrt(double(kHidden))));
    p.w2.push_back(vec(kHidden * kFfn, 1.0 / std::sqrt(double(kFfn))));
    p.dw1.push_back(vec(kFfn * kHidden, 0.1));
    p.dw3.push_back(vec(kFfn * kHidden, 0.1));
    p.dw2.push_back(vec(kHidden * kFfn, 0.1));
  }
  for (int64_t n = 0; n < T; ++n) {
    std::vector<int64_t> pick;
    if (routing == Routing::adversarial) {
      pick = {0, 1};
      std::shuffle(pick.begin(), pick.end(), rng);
    } else {
      // k distinct experts, weights 1 (balanced) or 1/(e+1)^2 (Zipf), by exponential keys.
      std::vector<std::pair<double, int64_t>> keys;
      for (int64_t e = 0; e < kExperts; ++e) {
        double pe = routing == Routing::zipf ? 1.0 / double((e + 1) * (e + 1)) : 1.0;
        keys.push_back({std::pow(u01(rng), 1.0 / pe), e});
      }
      std::sort(keys.begin(), keys.end(), std::greater<>());
      for (int64_t j = 0; j < kTopK; ++j) pick.push_back(keys[j].second);
    }
    double sum = 0;
    std::vector<double> w(kTopK);
    for (auto& v : w) sum += (v = pos(rng));
    for (int64_t j = 0; j < kTopK; ++j) {
      p.index.push_back(pick[j]);
      p.weight.push_back(w[j] / sum);
    }
  }
  if (gpt_oss) {
    p.biases = true;
    p.activation = *gpt_oss;
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

class Env : public test_support::RankTestEnv {
 public:
  using RankTestEnv::RankTestEnv;
  OwnedTensor index(const std::vector<int64_t>& v, int64_t begin, int64_t end) {
    return indices(v, kTopK, begin, end);
  }
  std::vector<double> all_gather(double v) {
    std::vector<double> mine = {v};
    return all_gather_host(comm(), backend(), stream(), mine);
  }
};

struct Experts {
  std::vector<ExpertWeights> weights;
  std::vector<OwnedTensor> storage;
};
inline Experts make_experts(Env& env, const Problem& p, int64_t first, int64_t count) {
  Experts ex;
  for (int64_t e = first; e < first + count; ++e) {
    ExpertWeights w;
    // The weight gradients in the model's main_grad_dtype (fp32 beside bf16 weights).
    const DType grad = schedules::main_grad_dtype(env.dtype());
    auto add = [&](const std::vector<double>& v, int64_t rows, int64_t cols, Tensor& slot,
                   DType dtype) {
      ex.storage.push_back(env.input(v, cols, 0, rows, dtype));
      slot = ex.storage.back().view();
    };
    add(p.w1[e], kFfn, kHidden, w.w1, env.dtype());
    add(p.w3[e], kFfn, kHidden, w.w3, env.dtype());
    add(p.w2[e], kHidden, kFfn, w.w2, env.dtype());
    add(p.dw1[e], kFfn, kHidden, w.dw1, grad);
    add(p.dw3[e], kFfn, kHidden, w.dw3, grad);
    add(p.dw2[e], kHidden, kFfn, w.dw2, grad);
    if (p.biases) {  // (F) and (H) vectors; their gradients beside the weights'
      auto bias = [&](const std::vector<double>& v, Tensor& slot, DType dtype) {
        const int64_t n = static_cast<int64_t>(v.size());
        ex.storage.push_back(env.input(v, n, 0, 1, dtype));
        slot = ex.storage.back().view().reshape(Shape{n});
      };
      bias(p.b1[e], w.b1, env.dtype());
      bias(p.b3[e], w.b3, env.dtype());
      bias(p.b2[e], w.b2, env.dtype());
      bias(p.db1[e], w.db1, grad);
      bias(p.db3[e], w.db3, grad);
      bias(p.db2[e], w.db2, grad);
    }
    ex.weights.push_back(w);
  }
  return ex;
}

struct Result {
  std::vector<double> out, dx, dweight;
  std::vector<std::vector<double>> dw;  // per local expert: dw1, dw3, dw2 [, db1, db3, db2]
  std::vector<int64_t> counts;
  uint64_t dispatch_peak = 0, dispatch_left = 0;
  uint64_t copies_peak = 0;  // the `weights` peak past the layer's own weights: spill copies
  uint64_t grads_peak = 0;   // the `grads` peak: spill gradient copies and the owner's scratch
};

// One layer's inputs and outputs over this rank's slice of a problem.
struct LayerRun {
  Experts ex;
  OwnedTensor x, weight, index, out, dout, dx, dweight, scratch;
  LayerRun(Env& env, const Problem& p) {
    const int64_t r = env.rank(), El = kExperts / env.world();
    const int64_t n0 = first_token_of(r), n1 = n0 + tokens_of(r);
    ex = make_experts(env, p, r * El, El);
    x = env.input(p.x, kHidden, n0, n1);
    weight = env.input(p.weight, kTopK, n0, n1);
    index = env.index(p.index, n0, n1);
    out = env.input(p.out0, kHidden, n0, n1);
    dout = env.input(p.dout, kHidden, n0, n1);
    dx = env.input(p.dx0, kHidden, n0, n1);
    dweight = env.nan_output(Shape{n1 - n0, kTopK});
    scratch = env.input(p.out0, kHidden, n0, n1);
  }
  void forward(ExpertDispatch& d) { d.forward(x, index, weight, ex.weights, out); }
  void backward(ExpertDispatch& d) { d.backward(dout, ex.weights, dx, dweight); }
  // The outputs, after the stream is drained (counts and peaks are the caller's).
  Result read(Env& env) const {
    Result run;
    run.out = env.read(out);
    run.dx = env.read(dx);
    run.dweight = env.read(dweight);
    for (const auto& w : ex.weights) {
      std::vector<double> all = env.read(w.dw1);
      for (const Tensor* t : {&w.dw3, &w.dw2, &w.db1, &w.db3, &w.db2}) {
        if (!t->defined()) continue;
        std::vector<double> part = env.read(*t);
        all.insert(all.end(), part.begin(), part.end());
      }
      run.dw.push_back(all);
    }
    return run;
  }
};

// One dispatcher over this rank's slice: forward, backward; with `recompute` as a checkpointed
// layer does it — forward (its output kept), release, forward again (the recompute, its output
// dropped: PipelinedLLEP gets an undefined `out` and only plans), backward. `after_forward`
// sees the dispatcher before backward.
inline Result run_dispatch(Env& env, const Problem& p, ExpertDispatch& dispatch,
                           bool recompute = false,
                           const std::function<void()>& after_forward = {}) {
  LayerRun layer(env, p);
  env.poison_free_arena();
  env.backend().arena().reset_peaks();
  const uint64_t own_weights = env.backend().arena().stats().current()[LiveSet::weights];
  const uint64_t own_grads = env.backend().arena().stats().current()[LiveSet::grads];
  layer.forward(dispatch);
  if (recompute) {
    dispatch.release();
    const bool plan_only = dynamic_cast<PipelinedLlepDispatch*>(&dispatch) != nullptr;
    dispatch.forward(layer.x, layer.index, layer.weight, layer.ex.weights,
                     plan_only ? Tensor() : layer.scratch.view());
  }
  if (after_forward) after_forward();
  const std::vector<int64_t> counts = dispatch.expert_counts();
  layer.backward(dispatch);
  env.stream().synchronize();
  MemoryStats stats = env.backend().arena().stats();
  Result run = layer.read(env);
  run.counts = counts;
  run.dispatch_peak = stats.peak_per_set()[LiveSet::dispatch];
  run.dispatch_left = stats.current()[LiveSet::dispatch];
  run.copies_peak = stats.peak_per_set()[LiveSet::weights] - own_weights;
  run.grads_peak = stats.peak_per_set()[LiveSet::grads] - own_grads;
  return run;
}

inline Result run_standard(Env& env, const Problem& p) {
  ExpertParallelDispatch d(env.backend(), env.stream(), env.comm(), env.dtype(), kExperts,
                           p.activation);
  return run_dispatch(env, p, d);
}

struct Diff {
  bool bitwise = true;
  double rel = 0;
  std::string str() const {
    if (bitwise) return "bitwise";
    std::ostringstream os;
    os << "rel " << rel;
    return os.str();
  }
  void merge(const Diff& o) {
    bitwise = bitwise && o.bitwise;
    rel = std::max(rel, o.rel);
  }
};
// Max |got - want| over max |want| (infinite on a NaN), and whether the bits agree.
inline Diff compare(const std::vector<double>& got, const std::vector<double>& want) {
  Diff d;
  double err = 0, scale = 0;
  EXPECT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    double g = got[i], w = want[i];
    if (std::isnan(g) || std::isnan(w)) err = std::numeric_limits<double>::infinity();
    if (g != w || std::signbit(g) != std::signbit(w)) d.bitwise = false;
    err = std::max(err, std::abs(g - w));
    scale = std::max(scale, std::abs(w));
  }
  d.rel = scale > 0 ? err / scale : err;
  return d;
}

// See the file comment: an ulp or so per row, weight gradients summed in another order. bf16:
// 2^-6 of the largest value between the two bf16 schedules, which round their bf16 intermediates
// (a, b, g per F block; dout w2 against y) at different points, so each carries its own bf16
// error (~8e-3 against f64) and the two may lie on either side; the tight check is against f64
// (kBf16Margin).
inline double tolerance(DType dtype) {
  return dtype == DType::f64 ? 1e-13 : dtype == DType::bf16 ? 0x1p-6 : 2e-6;
}

// How much less accurate against f64 than the standard dispatcher in bf16 a bf16 schedule may
// be. Measured on 1, 2 and 4 ranks: PipelinedLLEP's error is the standard's own or less (7.7e-3
// against 8.2e-3 at most, W = 4 Zipf), LLEP's bitwise the standard's (experts split: dW within
// 3.1e-7, fp32 sums in another order) — bf16 partial sums had drifted by one bf16 rounding per
// F block, chunk and helper.
constexpr double kBf16Margin = 1.5;

// Holds `got` to the standard run `ref` (same dtype) and, in f32 and bf16, to `ref64` (the
// standard in f64). Returns the dW difference; prints one line from rank 0.
inline Diff check_against_standard(Env& env, const Result& got, const Result& ref,
                                   const Result* ref64, const std::string& what,
                                   bool expect_bitwise) {
  const double tol = tolerance(env.dtype());
  Diff out = compare(got.out, ref.out), dx = compare(got.dx, ref.dx);
  Diff dweight = compare(got.dweight, ref.dweight);
  EXPECT_LE(out.rel, tol) << what << ": out";
  EXPECT_LE(dx.rel, tol) << what << ": dx";
  EXPECT_LE(dweight.rel, tol) << what << ": dweight";
  Diff dw, dw64, row64;
  // bf16 against f64: no less accurate than the standard dispatcher in bf16 (its own error
  // against f64, times kBf16Margin); f32 within f32's tolerance.
  const bool bf16 = env.dtype() == DType::bf16;
  auto against64 = [&](const std::vector<double>& mine, const std::vector<double>& standard,
                       const std::vector<double>& exact, const std::string& part) {
    const Diff d = compare(mine, exact);
    const double bound = bf16 ? kBf16Margin * compare(standard, exact).rel : tolerance(DType::f32);
    EXPECT_LE(d.rel, bound) << what << ": " << part << " against f64";
    return d;
  };
  if (ref64) {
    row64 = against64(got.out, ref.out, ref64->out, "out");
    row64.merge(against64(got.dx, ref.dx, ref64->dx, "dx"));
    row64.merge(against64(got.dweight, ref.dweight, ref64->dweight, "dweight"));
  }
  for (size_t l = 0; l < got.dw.size(); ++l) {
    Diff d = compare(got.dw[l], ref.dw[l]);
    EXPECT_LE(d.rel, tol) << what << ": weight grads of local expert " << l;
    dw.merge(d);
    if (ref64) {
      dw64.merge(against64(got.dw[l], ref.dw[l], ref64->dw[l],
                           "weight grads of local expert " + std::to_string(l)));
    }
  }
  if (expect_bitwise) {
    EXPECT_TRUE(out.bitwise && dx.bitwise && dweight.bitwise && dw.bitwise)
        << what << ": no expert split, so the same GEMMs: out " << out.str() << ", dx " << dx.str()
        << ", dweight " << dweight.str() << ", dW " << dw.str();
  }
  EXPECT_EQ(got.counts, ref.counts) << what << ": global expert counts";
  EXPECT_EQ(got.dispatch_left, 0u) << what << ": dispatch buffers left after backward";
  Diff rows = out;
  rows.merge(dx);
  rows.merge(dweight);
  std::vector<double> row_rel = env.all_gather(rows.rel), dw_rel = env.all_gather(dw.rel);
  std::vector<double> vs64 = env.all_gather(std::max(row64.rel, dw64.rel));
  Diff standard64;  // the standard dispatcher's own error against f64 (bf16, f32)
  if (ref64) {
    standard64 = compare(ref.out, ref64->out);
    standard64.merge(compare(ref.dx, ref64->dx));
    standard64.merge(compare(ref.dweight, ref64->dweight));
    for (size_t l = 0; l < ref.dw.size(); ++l) standard64.merge(compare(ref.dw[l], ref64->dw[l]));
  }
  std::vector<double> std64 = env.all_gather(standard64.rel);
  std::vector<double> bits = env.all_gather(rows.bitwise && dw.bitwise ? 1.0 : 0.0);
  if (env.rank() == 0) {
    auto worst = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
    int bitwise_ranks = 0;
    for (double b : bits) bitwise_ranks += b > 0;
    std::printf(
        "[W=%lld %s] max rel over ranks: out/dx/dweight %.3g, dW %.3g; vs the f64 "
        "standard %.3g (the standard's own %.3g); all bitwise on %d/%lld ranks\n",
        static_cast<long long>(env.world()), what.c_str(), worst(row_rel), worst(dw_rel),
        ref64 ? worst(vs64) : 0.0, ref64 ? worst(std64) : 0.0, bitwise_ranks,
        static_cast<long long>(env.world()));
  }
  return dw;
}

// The spilled experts `rank` holds copies of over a pass's plans (the union of its helped
// experts), and their bytes: one buffer of w1, w3 (F, H), w2 (H, F) and, with biases, b1, b3 (F)
// and b2 (H) each in `weights`.
inline int64_t copies_held(const std::vector<schedules::LlepPlan>& plans, int64_t rank) {
  std::vector<int64_t> experts;
  for (const auto& plan : plans) {
    for (const auto& t : schedules::llep_transfers(plan)) {
      if (t.helper == rank) experts.push_back(t.expert);
    }
  }
  std::sort(experts.begin(), experts.end());
  return std::unique(experts.begin(), experts.end()) - experts.begin();
}
inline uint64_t copy_bytes(DType dtype, bool biases) {
  const uint64_t elements = 3ull * kFfn * kHidden + (biases ? 2ull * kFfn + kHidden : 0);
  return DeviceArena::footprint(elements * dtype_size(dtype));
}
inline bool owns_a_transfer(const std::vector<schedules::LlepPlan>& plans, int64_t rank) {
  for (const auto& plan : plans) {
    for (const auto& t : schedules::llep_transfers(plan)) {
      if (t.owner == rank) return true;
    }
  }
  return false;
}

// The measured spill copies against their bytes: `copies` weight copies (and as many gradient
// copies, plus the owner's scratch for returned gradients when `owns`), each of copy_bytes; and
// llep_spill_copy_bytes, the planner's function (at the launch bound of `max_copies` copies),
// counts the same bytes per copy.
inline void check_spill_bytes(const Result& got, DType dtype, bool biases, int64_t copies,
                              bool owns, const schedules::LlepSpillCopyBytes& planned,
                              const std::string& what) {
  const uint64_t one = copy_bytes(dtype, biases);
  const uint64_t one_grad = copy_bytes(schedules::main_grad_dtype(dtype), biases);
  EXPECT_EQ(got.copies_peak, static_cast<uint64_t>(copies) * one) << what;
  EXPECT_EQ(got.grads_peak, static_cast<uint64_t>(copies) * one_grad + (owns ? one_grad : 0))
      << what << ": gradient copies and the returned-gradient scratch";
  EXPECT_LE(copies, planned.copies) << what;
  if (planned.copies > 0) {
    EXPECT_EQ(planned.weights, static_cast<uint64_t>(planned.copies) * one) << what;
    EXPECT_EQ(planned.grads, static_cast<uint64_t>(planned.copies) * one_grad) << what;
    EXPECT_EQ(planned.scratch, one_grad) << what;
  }
}

inline PipelinedLlepParams pipeline_params(int64_t c, int64_t k_max, ChunkMembership membership,
                                           double lambda = 1.3) {
  PipelinedLlepParams q;
  q.chunk_tokens = c;
  q.max_chunks = k_max;
  q.membership = membership;
  q.lambda = lambda;
  q.min_tokens_per_gemm = 2;
  return q;
}

// What check_pipelined expects of the launch shape: the slots (0: any) and whether the rows fit
// 2 * W * M_c * H * b.
struct Expect {
  int64_t slots = 0;
  bool bounded = true;
};

class LlepTest : public ::testing::Test {
 protected:
  // Standard runs for a problem, in the run's dtype and (for f32) in f64.
  struct References {
    Result ref, ref64;
    bool has64 = false;
  };
  // The standard runs also hold the standard's f64 run to the float64 host reference.
  References references(DType dtype, const Problem& p) {
    References r;
    {
      Env env(dtype);
      r.ref = run_standard(env, p);
    }
    if (dtype == DType::f32 || dtype == DType::bf16) {
      Env env64(DType::f64);
      r.ref64 = run_standard(env64, p);
      r.has64 = true;
    }
    check_standard_against_float64(r.has64 ? r.ref64 : r.ref, p);
    return r;
  }

  // The f64 standard dispatcher's results on this rank's slice (`run`) against the float64 host
  // reference (tests/moe_reference.h): within 1e-12 relative (its GEMMs sum H or F products in
  // another order than the reference's loops, and a token's k outputs and the gradients over the
  // rows in another grouping: rounding of f64 only). With biases and the binding clamp, the clamp
  // is checked to bind on at least 10% of a's and of b's elements.
  static void check_standard_against_float64(const Result& run, const Problem& p) {
    const test_support::MoeReference exact =
        test_support::moe_reference(p, p.tokens, kHidden, kFfn, kTopK, p.biases, p.activation);
    const RankInfo pg = init_process_group();
    const int64_t r = pg.rank, El = kExperts / pg.world_size;
    const int64_t n0 = first_token_of(r), n1 = n0 + tokens_of(r);
    auto slice = [](const std::vector<double>& v, int64_t begin, int64_t end, int64_t width) {
      return std::vector<double>(v.begin() + begin * width, v.begin() + end * width);
    };
    Diff d = compare(run.out, slice(exact.out, n0, n1, kHidden));
    d.merge(compare(run.dx, slice(exact.dx, n0, n1, kHidden)));
    d.merge(compare(run.dweight, slice(exact.dweight, n0, n1, kTopK)));
    for (int64_t l = 0; l < El; ++l) d.merge(compare(run.dw[l], exact.grads[r * El + l]));
    EXPECT_LE(d.rel, 1e-12) << "the f64 standard dispatcher against the float64 reference"
                            << (p.biases ? " (biases, gpt-oss SwiGLU)" : "");
    if (p.biases) {
      if (p.activation.limit <= clamped_swiglu().limit) {
        EXPECT_GE(exact.a_clamped, 0.1) << "the clamp of a binds on too few elements";
        EXPECT_GE(exact.b_clamped, 0.1) << "the clamp of b binds on too few elements";
      }
      if (r == 0) {
        std::printf(
            "  f64 standard vs float64 reference (rank 0): rel %.3g; clamped: a %.0f%%, "
            "b %.0f%% of the elements\n",
            d.rel, 100 * exact.a_clamped, 100 * exact.b_clamped);
      }
    }
  }

  // With `gpt_oss`, the experts have biases and that (clamped) SwiGLU.
  void check_llep(DType dtype, Routing routing, uint64_t seed, int64_t max_helped = 0,
                  const std::optional<ops::SwigluParams>& gpt_oss = std::nullopt) {
    Env env(dtype);
    const Problem p = make_problem(seed, routing, env.world(), gpt_oss);
    References refs = references(dtype, p);
    LlepParams q{1.0, 1.3, 2, max_helped};
    LlepDispatch d(env.backend(), env.stream(), env.comm(), dtype, kExperts, q, p.activation);
    int64_t received = 0, copies = 0;
    bool spilled = false, split = false, owns = false;
    Result got = run_dispatch(env, p, d, false, [&] {
      received = d.received_rows();
      spilled = d.plan().spill;
      copies = copies_held({d.plan()}, env.rank());
      owns = owns_a_transfer({d.plan()}, env.rank());
      for (const auto& pieces : d.plan().pieces) split = split || pieces.size() > 1;
      EXPECT_LE(received, d.capacity());
    });
    const std::string what = std::string("llep ") + gpt_oss_label(gpt_oss) +
                             std::string(dtype_name(dtype)) + " " + routing_name(routing) +
                             (split ? " (experts split)" : "");
    check_against_standard(env, got, refs.ref, refs.has64 ? &refs.ref64 : nullptr, what, !split);
    const int64_t n = tokens_of(env.rank()), n_max = tokens_of(env.world() - 1);
    EXPECT_EQ(got.dispatch_peak,
              schedules::dispatch_expert_parallel_bytes(n, kTopK, kHidden, kFfn, dtype, received))
        << what << ": " << received << " rows computed";
    EXPECT_LE(got.dispatch_peak,
              schedules::llep_dispatch_bytes(n_max, kTopK, kHidden, kFfn, dtype, env.world(), q))
        << what;
    if (routing == Routing::adversarial && env.world() > 1) {
      EXPECT_TRUE(spilled) << what;
    }
    // The spill copies: exactly the experts this rank helps, within the launch-time bound.
    check_spill_bytes(got, dtype, p.biases, copies, owns,
                      schedules::llep_spill_copy_bytes(kExperts, env.world(), kHidden, kFfn, dtype,
                                                       d.capacity(), 1, q, p.biases),
                      what);
  }

  // Returns this rank's dispatch peak.
  uint64_t check_pipelined(DType dtype, Routing routing, uint64_t seed,
                           const PipelinedLlepParams& q, bool recompute = false,
                           int slowed_stream = -1, Expect expect = {},
                           const std::optional<ops::SwigluParams>& gpt_oss = std::nullopt) {
    Env env(dtype);
    const int64_t W = env.world();
    const Problem p = make_problem(seed, routing, W, gpt_oss);
    References refs = references(dtype, p);
    PipelinedLlepDispatch d(env.backend(), env.stream(), env.comm(), dtype, kExperts, q, nullptr,
                            p.activation);
    if (slowed_stream == 0)
      as_cpu_stream(env.stream()).set_debug_delay(std::chrono::microseconds(300));
    if (slowed_stream == 1)
      as_cpu_stream(d.comm_stream()).set_debug_delay(std::chrono::microseconds(300));
    if (slowed_stream == 2)
      as_cpu_stream(d.return_stream()).set_debug_delay(std::chrono::microseconds(300));
    schedules::PipelinedLlepShape shape;
    int64_t max_rows = 0, copies = 0;
    bool all_spilled = true, owns = false;
    Result got = run_dispatch(env, p, d, recompute, [&] {
      shape = d.shape();
      max_rows = d.max_received_rows();
      copies = copies_held(d.plans(), env.rank());
      owns = owns_a_transfer(d.plans(), env.rank());
      for (const auto& plan : d.plans()) all_spilled = all_spilled && plan.spill;
    });
    as_cpu_stream(env.stream()).set_debug_delay(std::chrono::microseconds(0));
    as_cpu_stream(d.comm_stream()).set_debug_delay(std::chrono::microseconds(0));
    as_cpu_stream(d.return_stream()).set_debug_delay(std::chrono::microseconds(0));
    std::ostringstream name;
    name << "pipelined " << gpt_oss_label(gpt_oss)
         << (q.membership == ChunkMembership::strided ? "strided" : "contiguous")
         << " K=" << shape.chunks << " c_eff=" << shape.chunk_tokens << " S=" << shape.slots
         << " T=" << shape.tile_rows << " F_b=" << shape.ffn_block
         << (shape.bounded ? "" : " (unbounded)") << " " << dtype_name(dtype) << " "
         << routing_name(routing) << (recompute ? " recompute" : "")
         << (slowed_stream == 0   ? " slowed compute"
             : slowed_stream == 1 ? " slowed dispatch lane"
             : slowed_stream == 2 ? " slowed return lane"
                                  : "");
    const std::string what = name.str();
    check_against_standard(env, got, refs.ref, refs.has64 ? &refs.ref64 : nullptr, what, false);

    // The shape comes from the largest N; the bound is fixed by it.
    const int64_t n_max = tokens_of(W - 1);
    const auto expect_shape =
        schedules::pipelined_llep_shape(n_max, kTopK, kHidden, kFfn, dtype, W, q);
    EXPECT_EQ(shape.chunks, expect_shape.chunks);
    EXPECT_EQ(shape.chunks, std::min((n_max + q.chunk_tokens - 1) / q.chunk_tokens, q.max_chunks));
    EXPECT_EQ(shape.chunk_tokens, (n_max + shape.chunks - 1) / shape.chunks);
    EXPECT_EQ(shape.slots, expect_shape.slots) << what;
    EXPECT_EQ(shape.tile_rows, expect_shape.tile_rows) << what;
    EXPECT_EQ(shape.ffn_block, expect_shape.ffn_block) << what;
    EXPECT_GE(shape.ffn_blocks, 2) << what << ": the expert MLP blocked over F";
    EXPECT_EQ(shape.bounded, expect_shape.bounded) << what;
    if (expect.slots != 0) {
      EXPECT_EQ(shape.slots, expect.slots) << what;
    }
    EXPECT_EQ(shape.bounded, expect.bounded) << what;
    EXPECT_GE(shape.tile_rows, 1) << what;
    EXPECT_LE(shape.tile_rows, shape.chunk_tokens) << what;
    EXPECT_LE(max_rows, shape.receive_rows) << what;
    EXPECT_LE(shape.receive_rows, W * kTopK * shape.chunk_tokens);
    const uint64_t formula =
        schedules::pipelined_llep_dispatch_bytes(n_max, kTopK, kHidden, kFfn, dtype, W, q);
    EXPECT_EQ(got.dispatch_peak, formula) << what << ": measured dispatch peak against the formula";
    // The bound: 2 * Ep * k * c_eff * H * b for every buffer with H or F columns, plus the
    // per-chunk metadata; in the corner case (rows too wide for it even with one slot and
    // one-row tiles) over it by exactly backward's rows past 2 * W * M_c * H * b.
    const uint64_t b = dtype_size(dtype), Mc = shape.rows_per_source, Rc = shape.receive_rows;
    const uint64_t T = shape.tile_rows, H = kHidden, Fb = shape.ffn_block;
    const uint64_t paper = 2ull * W * Mc * H * b;
    const uint64_t bound =
        schedules::pipelined_llep_bound_bytes(n_max, kTopK, kHidden, kFfn, dtype, W, q);
    EXPECT_GT(bound, paper) << what;
    if (shape.bounded) {
      EXPECT_LE(got.dispatch_peak, bound) << what << ": dispatch peak over 2 W M_c H b + metadata";
    } else {
      auto fp = [](uint64_t v) { return DeviceArena::footprint(v); };
      const uint64_t S = static_cast<uint64_t>(shape.slots);
      const uint64_t b_acc = dtype_size(schedules::main_grad_dtype(dtype));
      const uint64_t rows = (S >= 2 ? 2 : 1) * fp(Mc * H * b) + 2 * S * fp(Rc * H * b) +
                            2 * fp(T * H * b) + fp(T * H * b_acc) + 4 * fp(T * Fb * b);
      if (q.slots == 0) {
        EXPECT_EQ(shape.slots, 1) << what;
      }
      EXPECT_EQ(got.dispatch_peak - bound, rows - paper) << what << ": the documented excess";
    }
    if (env.rank() == 0) {
      std::printf(
          "[W=%lld %s] dispatch peak %llu bytes, bound %llu (2 W M_c H b = %llu + "
          "metadata %llu)\n",
          static_cast<long long>(W), what.c_str(),
          static_cast<unsigned long long>(got.dispatch_peak),
          static_cast<unsigned long long>(bound), static_cast<unsigned long long>(paper),
          static_cast<unsigned long long>(bound - paper));
    }
    if (routing == Routing::adversarial && W > 1) {
      EXPECT_TRUE(all_spilled) << what;
    }
    // The spill copies of the pass: the union over the chunks' plans, within the bound.
    check_spill_bytes(got, dtype, p.biases, copies, owns,
                      schedules::llep_spill_copy_bytes(kExperts, W, kHidden, kFfn, dtype,
                                                       std::max<int64_t>(1, shape.receive_rows),
                                                       shape.chunks, q.llep(), p.biases),
                      what);
    return got.dispatch_peak;
  }
};

// At the defaults (lambda = 1.3) and these shapes: one slot on 2 ranks (the two-slot live set
// would be 2 + 4 rho = 7.2 U > 2 W U = 4 U), two on 4 (7.2 U <= 8 U); both fit the bound.
inline int64_t default_slots() { return init_process_group().world_size >= 4 ? 2 : 1; }

}  // namespace moepeak::llep_testing
