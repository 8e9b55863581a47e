// LlepDispatch and PipelinedLlepDispatch on W real rank processes against the standard
// expert-parallel dispatcher (ExpertParallelDispatch) on the same ranks and inputs.
//
// Every rank builds the same full problem from a seed — N_r = 48 + 2r tokens on rank r (uneven,
// so K and c_eff come from the largest), E = 8 experts of H = 64, F = 64, top-2 — and runs on its
// token slice and its experts [r*E/W, (r+1)*E/W). Routing: balanced (uniform), Zipf-skewed
// (p(e) ~ 1/(e+1)^2, expert 0 hot) and adversarial (every token picks experts 0 and 1, both on
// rank 0). Checked, in f64 and f32:
//   - out, dx, dweight and every local expert weight gradient within 1e-13 (f64) / 2e-6 (f32)
//     relative of the standard's, and in f32 also within 2e-6 of the standard dispatcher run in
//     f64 (float64-checked). Why not bitwise: a row's expert output is the same dot products in
//     the same order, but OpenBLAS computes the rows of a GEMM with different kernels depending
//     on where they fall in its register blocking (the M remainder), so the same row can round
//     differently in a GEMM of another row count (checked: most sub-GEMMs of a 40-row GEMM differ
//     in the last bit). The pipeline runs each expert over per-chunk tiles of T rows and over F
//     in blocks (y and dx summed block by block, dweight as g . (dout w2) over F instead of
//     dout . y over H), and a spill splits an expert's rows between ranks: differences of an ulp
//     or so (measured <= 1.3e-15 f64, <= 4.4e-7 f32 on 2 and 4 ranks). Weight gradients are
//     moreover summed per chunk, per tile and per helper in another order (measured <= 1.5e-15
//     f64, <= 6.5e-7 f32); the f32 results are within 5.8e-7 of the f64 standard, as close as
//     LLEP's f32 (6.8e-7). The tolerances leave a 3x (f32) and 65x (f64) margin.
//     Bitwise where the GEMMs are the same: LlepDispatch when no expert is split (the gate
//     kept every expert home, or whole experts moved) gives bitwise out, dx, dweight and dW —
//     checked;
//   - bf16 storage (every sum over F blocks, chunks, tiles and helpers in fp32; the expert
//     gradients fp32 main grads): against the bf16 standard within 2^-6 and against the f64
//     standard no less accurate than the bf16 standard (x 1.5); also on 1 rank;
//   - poisoned inputs: dweight (=) NaN beforehand, the whole free arena NaN (a buffer read before
//     it is written shows up); out, dx and dW (+=) start from seeded values;
//   - the global expert counts equal the standard's (routing is never changed);
//   - memory: LLEP's measured `dispatch` peak equals dispatch_expert_parallel_bytes for the rows
//     it computed and stays under llep_dispatch_bytes; PipelinedLLEP's equals
//     pipelined_llep_dispatch_bytes in all three routings (fixed at launch) and is at most
//     pipelined_llep_bound_bytes = 2 * Ep * k * c_eff * H * b + the per-chunk metadata (H * b is
//     a whole number of 256-byte granules, so footprint rounding leaves the tiles room), no chunk
//     receives more than R_c rows; the launch shape's slots: S = 1 on 2 ranks, S = 2 on 4 at the
//     defaults, S = 1 on 4 with lambda = 2 (two slots would not fit), and the corner case
//     lambda = W - 0.4 (over the bound by exactly the documented rows); schedules.llep_slots = 2
//     and 3 on 2 and 4 ranks (exact, the peak the formula's, over the bound by the documented
//     rows where they do not fit); the standard dispatcher's peak on rank 0 grows from balanced
//     to adversarial;
//   - spills happen (adversarial: every chunk's plan spills, weights travel, gradients return);
//   - each of the three streams (compute, dispatch lane, return lane) slowed on purpose (a missing
//     wait would corrupt a slot: with S >= 2 chunk i+1's dispatch and chunk i-1's return overlap
//     chunk i's experts; S = 1 once more with the dispatch lane slowed); forward, then the
//     checkpoint's recompute as a plan-only forward (undefined `out`), then backward; LLEP with the
//     recompute as a full forward; strided and contiguous chunks; K capped by K_max; one chunk;
//     errors.
//
//     ctest -R test_llep --output-on-failure
//     mpirun --allow-run-as-root --oversubscribe -np 4 build/tests/parallel/test_llep
//
// Registered with 4 and 2 ranks (tests/parallel/llep.cmake); 2 cores serve them, so shapes are
// tiny.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
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
#include "tests/parallel/rank_test_env.h"

namespace moepeak {
namespace {

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

int64_t tokens_of(int64_t rank) { return 48 + 2 * rank; }
int64_t first_token_of(int64_t rank) {
  int64_t n = 0;
  for (int64_t r = 0; r < rank; ++r) n += tokens_of(r);
  return n;
}

enum class Routing { balanced, zipf, adversarial };
const char* routing_name(Routing r) {
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
};

Problem make_problem(uint64_t seed, Routing routing, int64_t world) {
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
Experts make_experts(Env& env, const Problem& p, int64_t first, int64_t count) {
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
    ex.weights.push_back(w);
  }
  return ex;
}

struct Result {
  std::vector<double> out, dx, dweight;
  std::vector<std::vector<double>> dw;  // per local expert: dw1, dw3, dw2
  std::vector<int64_t> counts;
  uint64_t dispatch_peak = 0, dispatch_left = 0;
  uint64_t copies_peak = 0;  // the `weights` peak past the layer's own weights: spill copies
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
      std::vector<double> all = env.read(w.dw1), d3 = env.read(w.dw3), d2 = env.read(w.dw2);
      all.insert(all.end(), d3.begin(), d3.end());
      all.insert(all.end(), d2.begin(), d2.end());
      run.dw.push_back(all);
    }
    return run;
  }
};

// One dispatcher over this rank's slice: forward, backward; with `recompute` as a checkpointed
// layer does it — forward (its output kept), release, forward again (the recompute, its output
// dropped: PipelinedLLEP gets an undefined `out` and only plans), backward. `after_forward`
// sees the dispatcher before backward.
Result run_dispatch(Env& env, const Problem& p, ExpertDispatch& dispatch, bool recompute = false,
                    const std::function<void()>& after_forward = {}) {
  LayerRun layer(env, p);
  env.poison_free_arena();
  env.backend().arena().reset_peaks();
  const uint64_t own_weights = env.backend().arena().stats().current()[LiveSet::weights];
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
  return run;
}

Result run_standard(Env& env, const Problem& p) {
  ExpertParallelDispatch d(env.backend(), env.stream(), env.comm(), env.dtype(), kExperts);
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
Diff compare(const std::vector<double>& got, const std::vector<double>& want) {
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
double tolerance(DType dtype) {
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
Diff check_against_standard(Env& env, const Result& got, const Result& ref, const Result* ref64,
                            const std::string& what, bool expect_bitwise) {
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
// experts), and their bytes: one (3, F, H) buffer each in `weights`.
int64_t copies_held(const std::vector<schedules::LlepPlan>& plans, int64_t rank) {
  std::vector<int64_t> experts;
  for (const auto& plan : plans) {
    for (const auto& t : schedules::llep_transfers(plan)) {
      if (t.helper == rank) experts.push_back(t.expert);
    }
  }
  std::sort(experts.begin(), experts.end());
  return std::unique(experts.begin(), experts.end()) - experts.begin();
}
uint64_t copy_bytes(DType dtype) {
  return DeviceArena::footprint(3ull * kFfn * kHidden * dtype_size(dtype));
}

PipelinedLlepParams pipeline_params(int64_t c, int64_t k_max, ChunkMembership membership,
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
    return r;
  }

  void check_llep(DType dtype, Routing routing, uint64_t seed, int64_t max_helped = 0) {
    Env env(dtype);
    const Problem p = make_problem(seed, routing, env.world());
    References refs = references(dtype, p);
    LlepParams q{1.0, 1.3, 2, max_helped};
    LlepDispatch d(env.backend(), env.stream(), env.comm(), dtype, kExperts, q);
    int64_t received = 0, copies = 0;
    bool spilled = false, split = false;
    Result got = run_dispatch(env, p, d, false, [&] {
      received = d.received_rows();
      spilled = d.plan().spill;
      copies = copies_held({d.plan()}, env.rank());
      for (const auto& pieces : d.plan().pieces) split = split || pieces.size() > 1;
      EXPECT_LE(received, d.capacity());
    });
    const std::string what = std::string("llep ") + std::string(dtype_name(dtype)) + " " +
                             routing_name(routing) + (split ? " (experts split)" : "");
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
    EXPECT_EQ(got.copies_peak, static_cast<uint64_t>(copies) * copy_bytes(dtype)) << what;
    EXPECT_LE(copies, schedules::llep_max_copies(kExperts, env.world(), d.capacity(), 1, q))
        << what;
  }

  // Returns this rank's dispatch peak.
  uint64_t check_pipelined(DType dtype, Routing routing, uint64_t seed,
                           const PipelinedLlepParams& q, bool recompute = false,
                           int slowed_stream = -1, Expect expect = {}) {
    Env env(dtype);
    const int64_t W = env.world();
    const Problem p = make_problem(seed, routing, W);
    References refs = references(dtype, p);
    PipelinedLlepDispatch d(env.backend(), env.stream(), env.comm(), dtype, kExperts, q);
    if (slowed_stream == 0)
      as_cpu_stream(env.stream()).set_debug_delay(std::chrono::microseconds(300));
    if (slowed_stream == 1)
      as_cpu_stream(d.comm_stream()).set_debug_delay(std::chrono::microseconds(300));
    if (slowed_stream == 2)
      as_cpu_stream(d.return_stream()).set_debug_delay(std::chrono::microseconds(300));
    schedules::PipelinedLlepShape shape;
    int64_t max_rows = 0, copies = 0;
    bool all_spilled = true;
    Result got = run_dispatch(env, p, d, recompute, [&] {
      shape = d.shape();
      max_rows = d.max_received_rows();
      copies = copies_held(d.plans(), env.rank());
      for (const auto& plan : d.plans()) all_spilled = all_spilled && plan.spill;
    });
    as_cpu_stream(env.stream()).set_debug_delay(std::chrono::microseconds(0));
    as_cpu_stream(d.comm_stream()).set_debug_delay(std::chrono::microseconds(0));
    as_cpu_stream(d.return_stream()).set_debug_delay(std::chrono::microseconds(0));
    std::ostringstream name;
    name << "pipelined " << (q.membership == ChunkMembership::strided ? "strided" : "contiguous")
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
    EXPECT_EQ(got.copies_peak, static_cast<uint64_t>(copies) * copy_bytes(dtype)) << what;
    EXPECT_LE(copies,
              schedules::llep_max_copies(kExperts, W, std::max<int64_t>(1, shape.receive_rows),
                                         shape.chunks, q.llep()))
        << what;
    return got.dispatch_peak;
  }
};

TEST_F(LlepTest, LlepMatchesStandardF64) {
  for (Routing r : {Routing::balanced, Routing::zipf, Routing::adversarial})
    check_llep(DType::f64, r, 31);
}
TEST_F(LlepTest, LlepMatchesStandardF32) {
  for (Routing r : {Routing::balanced, Routing::zipf, Routing::adversarial})
    check_llep(DType::f32, r, 32);
}

// At the defaults (lambda = 1.3) and these shapes: one slot on 2 ranks (the two-slot live set
// would be 2 + 4 rho = 7.2 U > 2 W U = 4 U), two on 4 (7.2 U <= 8 U); both fit the bound.
int64_t default_slots() { return init_process_group().world_size >= 4 ? 2 : 1; }

TEST_F(LlepTest, PipelinedStridedMatchesStandardF64) {
  const auto q = pipeline_params(12, 16, ChunkMembership::strided);
  for (Routing r : {Routing::balanced, Routing::zipf, Routing::adversarial}) {
    check_pipelined(DType::f64, r, 41, q, false, -1, {default_slots(), true});
  }
}
TEST_F(LlepTest, PipelinedStridedMatchesStandardF32) {
  const auto q = pipeline_params(12, 16, ChunkMembership::strided);
  for (Routing r : {Routing::balanced, Routing::zipf, Routing::adversarial}) {
    check_pipelined(DType::f32, r, 42, q, false, -1, {default_slots(), true});
  }
}
// bf16 storage: every sum over F blocks, chunks, tiles and helpers in fp32 (the tile
// accumulators, the fp32 expert gradients), so the pipeline is within one bf16 rounding of the
// standard dispatcher in bf16 on the same inputs (measured: see the file comment).
TEST_F(LlepTest, PipelinedStridedMatchesStandardBf16) {
  const auto q = pipeline_params(12, 16, ChunkMembership::strided);
  const bool bounded = schedules::pipelined_llep_shape(
                           tokens_of(init_process_group().world_size - 1), kTopK, kHidden, kFfn,
                           DType::bf16, init_process_group().world_size, q)
                           .bounded;
  for (Routing r : {Routing::balanced, Routing::zipf, Routing::adversarial}) {
    check_pipelined(DType::bf16, r, 43, q, false, -1, {0, bounded});
  }
}
TEST_F(LlepTest, LlepMatchesStandardBf16) {
  for (Routing r : {Routing::balanced, Routing::zipf, Routing::adversarial})
    check_llep(DType::bf16, r, 33);
}
TEST_F(LlepTest, HelpedExpertLimitRaisedToEveryForeignExpert) {
  // schedules.llep_max_helped_experts = E - E/W: the copies bound is then E - E/W, and the
  // plans may differ from the default's (E/W + 1); still exact.
  const int64_t W = init_process_group().world_size;
  for (Routing r : {Routing::zipf, Routing::adversarial}) {
    check_llep(DType::f64, r, 33, kExperts - kExperts / W);
  }
  PipelinedLlepParams q = pipeline_params(12, 16, ChunkMembership::strided);
  q.max_helped_experts = kExperts - kExperts / W;
  check_pipelined(DType::f64, Routing::zipf, 43, q, false, -1, {default_slots(), true});
}

TEST_F(LlepTest, PipelinedContiguousAndCappedChunkCountMatchStandard) {
  // Contiguous membership; and c = 1 with K_max = 3: K = 3 chunks of c_eff = ceil(N_max / 3).
  check_pipelined(DType::f64, Routing::zipf, 51,
                  pipeline_params(12, 16, ChunkMembership::contiguous), false, -1,
                  {default_slots(), true});
  check_pipelined(DType::f32, Routing::adversarial, 52,
                  pipeline_params(12, 16, ChunkMembership::contiguous), false, -1,
                  {default_slots(), true});
  check_pipelined(DType::f64, Routing::adversarial, 53,
                  pipeline_params(1, 3, ChunkMembership::strided), false, -1,
                  {default_slots(), true});
  // One chunk (c >= N): the pipeline degenerates to LLEP with recompute.
  check_pipelined(DType::f64, Routing::zipf, 54,
                  pipeline_params(1000, 16, ChunkMembership::strided), false, -1,
                  {default_slots(), true});
}

TEST_F(LlepTest, PipelinedOneSlotWhereTwoDoNotFit) {
  // lambda = 2: R_c = 2 M_c, so two slots would need 2 + 4 * 2 = 10 U > 2 W U on 4 ranks (and
  // on 2): one slot, 1 + 2 * 2 = 5 U, fits 8 U on 4 ranks; on 2 (4 U) it does not (below).
  if (init_process_group().world_size < 4) GTEST_SKIP() << "needs 4 ranks";
  const auto q = pipeline_params(12, 16, ChunkMembership::strided, 2.0);
  for (Routing r : {Routing::zipf, Routing::adversarial}) {
    check_pipelined(DType::f64, r, 55, q, false, -1, {1, true});
  }
  check_pipelined(DType::f32, Routing::adversarial, 56, q, true, 1, {1, true});  // comm slowed
}

TEST_F(LlepTest, PipelinedOverTheBoundInTheCornerCase) {
  // lambda = W - 0.4: one slot needs 1 + 2 rho ~ 2 W + 0.2 U of rows before any tile, over
  // 2 W U: the dispatcher still runs (S = 1, T = T_min) and is over the bound by exactly the
  // documented amount.
  const double lambda = static_cast<double>(init_process_group().world_size) - 0.4;
  const auto q = pipeline_params(12, 16, ChunkMembership::strided, lambda);
  for (Routing r : {Routing::zipf, Routing::adversarial}) {
    check_pipelined(DType::f64, r, 57, q, false, -1, {1, false});
  }
}

TEST_F(LlepTest, DispatchPeakIsFixedWhileTheStandardGrowsWithSkew) {
  const auto q = pipeline_params(12, 16, ChunkMembership::strided);
  for (DType dtype : {DType::f64, DType::f32}) {
    std::vector<uint64_t> pipelined, standard;
    for (Routing r : {Routing::balanced, Routing::zipf, Routing::adversarial}) {
      pipelined.push_back(check_pipelined(dtype, r, 61, q, false, -1, {default_slots(), true}));
      Env env(dtype);
      standard.push_back(run_standard(env, make_problem(61, r, env.world())).dispatch_peak);
    }
    Env env(dtype);
    EXPECT_EQ(pipelined[0], pipelined[1]);
    EXPECT_EQ(pipelined[0], pipelined[2]);
    if (env.rank() == 0 && env.world() > 1) {
      // Rank 0 owns experts 0 and 1: the adversarial routing sends it every row.
      EXPECT_GT(standard[2], standard[0]);
      EXPECT_GE(standard[1], standard[0]);
      std::printf(
          "[W=%lld %s] rank 0 dispatch peak bytes: standard %llu / %llu / %llu "
          "(balanced / zipf / adversarial), pipelined llep %llu in all three\n",
          static_cast<long long>(env.world()), std::string(dtype_name(dtype)).c_str(),
          static_cast<unsigned long long>(standard[0]),
          static_cast<unsigned long long>(standard[1]),
          static_cast<unsigned long long>(standard[2]),
          static_cast<unsigned long long>(pipelined[0]));
    }
  }
}

TEST_F(LlepTest, SlowedStreamsAndRecompute) {
  // Two slots on 4 ranks: chunk i+1's dispatch overlaps chunk i's experts, so a missing event
  // wait shows up as a corrupted slot when one stream is slowed (one slot on 2 ranks: the
  // dispatch waits for the previous chunk's combine).
  const auto q = pipeline_params(12, 16, ChunkMembership::strided);
  const Expect e{default_slots(), true};
  check_pipelined(DType::f64, Routing::adversarial, 71, q, false, 0, e);
  check_pipelined(DType::f64, Routing::zipf, 72, q, false, 1, e);
  check_pipelined(DType::f32, Routing::adversarial, 73, q, true, -1, e);
  check_pipelined(DType::f64, Routing::zipf, 74, q, true, 1, e);
}

TEST_F(LlepTest, AskedSlotsAtAnyWorldSize) {
  // schedules.llep_slots: two slots on 2 ranks (where the rule picks one: 7.2 U > 4 U, so over
  // the bound by the documented rows) and on 4; three on both (dispatch of chunk i+1, experts of
  // chunk i and the return of chunk i-1 with no wait between them) — each with every one of the
  // three streams slowed in turn, and the plan-only recompute.
  const int64_t W = init_process_group().world_size;
  for (int64_t slots : {2, 3}) {
    PipelinedLlepParams q = pipeline_params(12, 16, ChunkMembership::strided);
    q.slots = slots;
    const bool fits = slots == 2 && W >= 4;  // 2 + 4 rho = 7.2 U <= 2 W U = 8 U
    const Expect e{slots, fits};
    check_pipelined(DType::f64, Routing::adversarial, 81, q, false, -1, e);
    check_pipelined(DType::f64, Routing::zipf, 82, q, true, 0, e);
    check_pipelined(DType::f64, Routing::adversarial, 83, q, false, 1, e);
    check_pipelined(DType::f32, Routing::adversarial, 84, q, true, 2, e);
  }
}

TEST_F(LlepTest, LayersShareOneLane) {
  // The model gives every layer's dispatcher one lane (PipelinedLlepLane: one duplicated
  // communicator, one comm stream). Two layers on one lane, run as a step runs them — forward
  // of both, then backward in reverse — with the lane slowed, give the same bits as each on a
  // lane of its own.
  Env env(DType::f64);
  const int64_t W = env.world();
  const auto q = pipeline_params(12, 16, ChunkMembership::strided);
  const Problem pa = make_problem(91, Routing::zipf, W);
  const Problem pb = make_problem(92, Routing::adversarial, W);
  std::vector<Result> alone;
  for (const Problem* p : {&pa, &pb}) {
    PipelinedLlepDispatch d(env.backend(), env.stream(), env.comm(), DType::f64, kExperts, q);
    alone.push_back(run_dispatch(env, *p, d));
  }
  auto lane = schedules::PipelinedLlepLane::make(env.backend(), env.comm());
  PipelinedLlepDispatch da(env.backend(), env.stream(), env.comm(), DType::f64, kExperts, q, lane);
  PipelinedLlepDispatch db(env.backend(), env.stream(), env.comm(), DType::f64, kExperts, q, lane);
  EXPECT_EQ(&da.comm_stream(), lane->stream.get());
  EXPECT_EQ(&db.comm_stream(), lane->stream.get());
  LayerRun a(env, pa), b(env, pb);
  as_cpu_stream(*lane->stream).set_debug_delay(std::chrono::microseconds(300));
  a.forward(da);
  b.forward(db);
  b.backward(db);
  a.backward(da);
  env.stream().synchronize();
  as_cpu_stream(*lane->stream).set_debug_delay(std::chrono::microseconds(0));
  EXPECT_EQ(env.backend().arena().stats().current()[LiveSet::dispatch], 0u);
  const Result shared[2] = {a.read(env), b.read(env)};
  for (int l = 0; l < 2; ++l) {
    const std::string what = "layer " + std::to_string(l) + " on a shared lane";
    EXPECT_TRUE(compare(shared[l].out, alone[l].out).bitwise) << what << ": out";
    EXPECT_TRUE(compare(shared[l].dx, alone[l].dx).bitwise) << what << ": dx";
    EXPECT_TRUE(compare(shared[l].dweight, alone[l].dweight).bitwise) << what << ": dweight";
    ASSERT_EQ(shared[l].dw.size(), alone[l].dw.size());
    for (size_t e = 0; e < shared[l].dw.size(); ++e) {
      EXPECT_TRUE(compare(shared[l].dw[e], alone[l].dw[e]).bitwise) << what << ": dW " << e;
    }
  }
  EXPECT_EQ(da.expert_counts(), alone[0].counts);
  EXPECT_EQ(db.expert_counts(), alone[1].counts);
}

TEST_F(LlepTest, LlepWithRecompute) {
  Env env(DType::f64);
  const Problem p = make_problem(81, Routing::zipf, env.world());
  References refs = references(DType::f64, p);
  LlepDispatch d(env.backend(), env.stream(), env.comm(), DType::f64, kExperts, {1.0, 1.3, 2});
  Result got = run_dispatch(env, p, d, true);
  check_against_standard(env, got, refs.ref, nullptr, "llep f64 zipf recompute", false);
}

TEST_F(LlepTest, Errors) {
  Env env(DType::f64);
  const int64_t W = env.world();
  if (W > 1) {
    EXPECT_THROW(LlepDispatch(env.backend(), env.stream(), env.comm(), DType::f64, W + 1), Error);
    try {
      PipelinedLlepDispatch d(env.backend(), env.stream(), env.comm(), DType::f64, W + 1);
      FAIL() << "E = W + 1 was accepted";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("E = " + std::to_string(W + 1)), std::string::npos) << e.message();
      EXPECT_NE(e.message().find("W = " + std::to_string(W)), std::string::npos) << e.message();
    }
  }
  PipelinedLlepParams bad;
  bad.chunk_tokens = 0;
  EXPECT_THROW(
      PipelinedLlepDispatch(env.backend(), env.stream(), env.comm(), DType::f64, kExperts, bad),
      Error);
  PipelinedLlepParams four_slots;
  four_slots.slots = schedules::kPipelinedLlepMaxSlots + 1;
  try {
    PipelinedLlepDispatch(env.backend(), env.stream(), env.comm(), DType::f64, kExperts,
                          four_slots);
    ADD_FAILURE() << "4 slots accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("schedules.llep_slots = 4"), std::string::npos) << e.message();
  }
  PipelinedLlepDispatch d(env.backend(), env.stream(), env.comm(), DType::f64, kExperts);
  LlepDispatch l(env.backend(), env.stream(), env.comm(), DType::f64, kExperts);
  auto t = env.nan_output(Shape{2, kHidden});
  auto w = env.nan_output(Shape{2, kTopK});
  EXPECT_THROW(d.backward(t, {}, t, w), Error);
  EXPECT_THROW(l.backward(t, {}, t, w), Error);
  // A wrong number of local experts is found before any collective.
  Problem p = make_problem(5, Routing::balanced, W);
  Experts too_many = make_experts(env, p, 0, kExperts / W + 1);
  auto index = env.index(p.index, 0, 2);
  EXPECT_THROW(d.forward(t, index, w, too_many.weights, t), Error);
  EXPECT_THROW(l.forward(t, index, w, too_many.weights, t), Error);
}

}  // namespace
}  // namespace moepeak
