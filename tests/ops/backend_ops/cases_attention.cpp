// test_backend_ops cases: causal grouped-query attention forward and backward (ops/attention.h),
// plain and with a variant (a sliding window, attention sinks, packed documents, together).
//
// The backward's out and lse must be those of q, k and v for its formula to mean anything, so a
// backward case runs the forward first on tensors of role `out` (compared too), then the
// backward. Shapes: head dims that are and are not multiples of 32 (8, 24, 16, 40, 64, 128,
// 256), GQA group sizes 1, 2, 3, 4 and 8, sequences that cross the SIMT kernels' 16-row and
// 32-entry tiles and the tensor-core kernels' 64-row and 64-entry ones (bf16 with head dims 32,
// 64, 128, 192, 256 whose shared memory fits), B > 1, empty sizes, and a peaky softmax (scale 2,
// inputs x 2). Every case runs with f32 and bf16 storage; lse is Kind::state, as it is f32 for
// both (ops::attention_lse_dtype). Cases named " dqk=<a> dv=<b>" give v (and so out, dout, dv) a
// head dim other than q's and k's: DeepSeek-V3's 192 / 128 (tensor cores in bf16), small dims
// either way round on the SIMT kernels (24 / 16, 12 / 8, 16 / 24), tensor-core pairs 64 / 32,
// 32 / 128 and 256 / 64, and 128 / 256, whose shared memory is past the tensor cores' budget
// (bf16 falls back to SIMT); plain and with windows and sinks.
// With MOEPEAK_BACKEND_OPS=cpu, bf16 is the CPU's fp32 algorithm with bf16 loads and stores
// (ops/attention.h): out is within one bf16 rounding (2^-8 of the scale; measured <= 3.3e-3),
// dq, dk, dv slightly more (<= 4.4e-3), as the backward reads the rounded out in D = dout . out;
// CUDA's 1e-2 holds for both.
//
// Variant cases (names end in " W=<window>" and/or " sinks[=dominant|=negative]"): windows of 1
// (each query sees only itself; with sinks, as without them p = 1 and dq = dk = 0 exactly, which
// a comparison relative to the reference's size cannot measure), a few keys, sizes that are not
// multiples of the 16/32/64 tiles and cut them, W = T and W > T (plain causal); sinks ~ N(0, 1),
// dominant (6..9: most of each row's probability goes to the sink, out shrinks) and very negative
// (-1000..-900: exp underflows to 0, as without sinks); G = 1, 2, 3, 4, 8, B > 1; bf16 with d = 32,
// 64, 128 runs the tensor-core kernels with windows that start mid-tile. The backward's dsinks is
// an inout tensor (Kind::state: f32 under test for f32 and bf16 storage, as the header asks) that
// starts at N(0, 1) values, so the accumulation (+=) is checked: a kernel that overwrote it would
// be off by the start values. NOTES: dsinks[h] sums B T terms exp(s_h - lse) D of random sign,
// which cancel (|sum| is 5-20x below sum |term| here), while the terms' errors (bf16: D reads the
// rounded out) do not; started near 0 its error relative to its own size grew to 2.5e-2 with
// bf16 (dominant sinks). Start values of the sum's size measure it against the terms instead.
// Measured on the emulated CUDA: f32 <= 9.2e-7 (the peaky case 5.7e-6), dsinks <= 2.7e-7; bf16
// out, dq, dk, dv <= 4.6e-3 (W = 1: 8.4e-3, see there), lse <= 4.4e-4, dsinks <= 1.8e-3. The
// dv != dqk cases: f32 <= 1.0e-6; bf16 out, dq, dk, dv <= 7.1e-3 (dq of 12 / 8 with W > T and
// sinks, the CPU's bf16 alike), lse <= 3.6e-4, dsinks <= 4.8e-3.
//
// Document cases (names with " docs=<lengths>|<lengths of the next sequence>", "40x1": 40
// one-token documents): doc_start is an i32 input (the same in both runs); see the list below,
// and add_document_skip_cases for the case that proves masked tiles are never read (NaN where no
// row of the compared positions may look). Measured on the emulated CUDA: f32 <= 9.6e-7,
// dsinks <= 3.4e-7; bf16 out, dq, dk, dv <= 5.3e-3 (every token alone, one_key; 4.8e-3 else),
// lse <= 2.7e-4, dsinks <= 5.9e-3. With MOEPEAK_BACKEND_OPS=cpu: f32 <= 1.1e-6, bf16 <= 5.3e-3.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ops/attention.h"
#include "ops/copy_2d.h"
#include "tests/ops/backend_ops/harness.h"

namespace moepeak::testing::backend_ops {

namespace {

// head_dim is dqk (q, k, dq, dk), v_head_dim dv (v, out, dout, dv; 0: dv = dqk).
struct AttentionShape {
  int64_t batch, seq, heads, kv_heads, head_dim;
  double scale;  // 0: 1 / sqrt(dqk)
  double input;  // standard deviation of q and k
  Tolerance tolerance;
  int64_t v_head_dim = 0;
  int64_t dv() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
};

// What a variant case adds to its shape.
enum class Sinks { none, normal, dominant, negative };
struct AttentionVariantCase {
  AttentionShape shape;
  int64_t window;  // 0: causal
  Sinks sinks;
};

std::string describe(const AttentionShape& s) {
  std::string name = " B=" + std::to_string(s.batch) + " T=" + std::to_string(s.seq) +
                     " nh=" + std::to_string(s.heads) + " nkv=" + std::to_string(s.kv_heads);
  if (s.dv() == s.head_dim) {
    name += " d=" + std::to_string(s.head_dim);
  } else {
    name += " dqk=" + std::to_string(s.head_dim) + " dv=" + std::to_string(s.dv());
  }
  if (s.scale != 0) name += " peaky";
  return name;
}

std::string describe(const AttentionVariantCase& c) {
  std::string name = describe(c.shape);
  if (c.window > 0) name += " W=" + std::to_string(c.window);
  if (c.sinks == Sinks::normal) name += " sinks";
  if (c.sinks == Sinks::dominant) name += " sinks=dominant";
  if (c.sinks == Sinks::negative) name += " sinks=negative";
  return name;
}

Generator sink_values(Sinks sinks) {
  switch (sinks) {
    case Sinks::dominant:
      return uniform(6.0, 9.0);
    case Sinks::negative:
      return uniform(-1000.0, -900.0);
    default:
      return normal();
  }
}

// The forward and backward cases of a plain (causal) shape. Tensors: q, k, v, out, lse (forward);
// q, k, v, dout, out, lse, dq, dk, dv (backward).
void add_plain_cases(const AttentionShape& s, uint64_t& seed, std::vector<OpCase>& cases) {
  const Shape q_shape{s.batch, s.seq, s.heads, s.head_dim};
  const Shape k_shape{s.batch, s.seq, s.kv_heads, s.head_dim};
  const Shape v_shape{s.batch, s.seq, s.kv_heads, s.dv()};
  const Shape out_shape{s.batch, s.seq, s.heads, s.dv()};
  const Shape lse_shape{s.batch, s.heads, s.seq};
  const double scale = s.scale != 0 ? s.scale : 1.0 / std::sqrt(double(s.head_dim));
  const std::string shape = describe(s);

  OpCase forward{"attention_forward" + shape,
                 {in("q", q_shape, Kind::floating, normal(s.input)),
                  in("k", k_shape, Kind::floating, normal(s.input)), in("v", v_shape),
                  out("out", out_shape), out("lse", lse_shape, Kind::state)},
                 [scale](const std::vector<Tensor>& t, Stream& st) {
                   ops::attention_forward(t[0], t[1], t[2], scale, t[3], t[4], st);
                 }};
  forward.tolerance = s.tolerance;
  forward.seed = seed++;
  cases.push_back(std::move(forward));

  OpCase backward{"attention_backward" + shape,
                  {in("q", q_shape, Kind::floating, normal(s.input)),
                   in("k", k_shape, Kind::floating, normal(s.input)), in("v", v_shape),
                   in("dout", out_shape), out("out", out_shape), out("lse", lse_shape, Kind::state),
                   out("dq", q_shape), out("dk", k_shape), out("dv", v_shape)},
                  [scale](const std::vector<Tensor>& t, Stream& st) {
                    ops::attention_forward(t[0], t[1], t[2], scale, t[4], t[5], st);
                    ops::attention_backward(t[0], t[1], t[2], t[4], t[5], t[3], scale, t[6], t[7],
                                            t[8], st);
                  }};
  backward.tolerance = s.tolerance;
  backward.seed = seed++;
  cases.push_back(std::move(backward));
}

// doc_start (B, T) of each sequence's document lengths (each list sums to T), as the values of
// an i32 tensor, and the lengths as a name: " docs=5+30+1|40+30".
std::vector<double> doc_starts(const std::vector<std::vector<int64_t>>& docs) {
  std::vector<double> starts;
  for (const std::vector<int64_t>& lengths : docs) {
    int64_t first = 0;
    for (int64_t length : lengths) {
      starts.insert(starts.end(), static_cast<size_t>(length), static_cast<double>(first));
      first += length;
    }
  }
  return starts;
}
std::string describe_docs(const std::vector<std::vector<int64_t>>& docs) {
  std::string name = " docs=";
  for (size_t b = 0; b < docs.size(); ++b) {
    if (b > 0) name += "|";
    const std::vector<int64_t>& lengths = docs[b];
    if (lengths.size() > 3 && std::count(lengths.begin(), lengths.end(), lengths[0]) ==
                                  static_cast<std::ptrdiff_t>(lengths.size())) {
      name += std::to_string(lengths.size()) + "x" + std::to_string(lengths[0]);  // 40 x 1
      continue;
    }
    for (size_t i = 0; i < lengths.size(); ++i)
      name += (i > 0 ? "+" : "") + std::to_string(lengths[i]);
  }
  return name;
}

// The forward and backward cases of a variant, with packed documents when `docs` is not empty.
// Tensors: q, k, v, [sinks], [doc_start], out, lse (forward); q, k, v, dout, [sinks],
// [doc_start], out, lse, dq, dk, dv, [dsinks] (backward).
void add_variant_cases(const AttentionVariantCase& c, uint64_t& seed, std::vector<OpCase>& cases,
                       const std::vector<std::vector<int64_t>>& docs = {}) {
  const AttentionShape& s = c.shape;
  const Shape q_shape{s.batch, s.seq, s.heads, s.head_dim};
  const Shape k_shape{s.batch, s.seq, s.kv_heads, s.head_dim};
  const Shape v_shape{s.batch, s.seq, s.kv_heads, s.dv()};
  const Shape out_shape{s.batch, s.seq, s.heads, s.dv()};
  const Shape lse_shape{s.batch, s.heads, s.seq};
  const Shape sinks_shape{s.heads};
  const double scale = s.scale != 0 ? s.scale : 1.0 / std::sqrt(double(s.head_dim));
  const bool sinks = c.sinks != Sinks::none, documents = !docs.empty();
  const int64_t window = c.window;
  const std::string name = describe(c) + (documents ? describe_docs(docs) : "");
  const TensorSpec doc_start =
      in("doc_start", Shape{s.batch, s.seq}, Kind::i32, values(doc_starts(docs)));

  std::vector<TensorSpec> fwd{in("q", q_shape, Kind::floating, normal(s.input)),
                              in("k", k_shape, Kind::floating, normal(s.input)), in("v", v_shape)};
  if (sinks) fwd.push_back(in("sinks", sinks_shape, Kind::floating, sink_values(c.sinks)));
  if (documents) fwd.push_back(doc_start);
  fwd.push_back(out("out", out_shape));
  fwd.push_back(out("lse", lse_shape, Kind::state));
  OpCase forward{"attention_forward" + name, fwd,
                 [scale, window, sinks, documents](const std::vector<Tensor>& t, Stream& st) {
                   const size_t o = 3 + sinks + documents;  // index of out
                   const ops::AttentionVariant variant{window, sinks ? t[3] : Tensor(),
                                                       documents ? t[o - 1] : Tensor()};
                   ops::attention_forward(t[0], t[1], t[2], scale, variant, t[o], t[o + 1], st);
                 }};
  forward.tolerance = s.tolerance;
  forward.seed = seed++;
  cases.push_back(std::move(forward));

  std::vector<TensorSpec> bwd{in("q", q_shape, Kind::floating, normal(s.input)),
                              in("k", k_shape, Kind::floating, normal(s.input)), in("v", v_shape),
                              in("dout", out_shape)};
  if (sinks) bwd.push_back(in("sinks", sinks_shape, Kind::floating, sink_values(c.sinks)));
  if (documents) bwd.push_back(doc_start);
  for (const TensorSpec& spec : {out("out", out_shape), out("lse", lse_shape, Kind::state),
                                 out("dq", q_shape), out("dk", k_shape), out("dv", v_shape)})
    bwd.push_back(spec);
  // dsinks starts at values of the size of the sum it adds (see the file comment).
  if (sinks) bwd.push_back(inout("dsinks", sinks_shape, Kind::state, normal()));
  OpCase backward{"attention_backward" + name, bwd,
                  [scale, window, sinks, documents](const std::vector<Tensor>& t, Stream& st) {
                    const size_t o = 4 + sinks + documents;  // index of out
                    const ops::AttentionVariant variant{window, sinks ? t[4] : Tensor(),
                                                        documents ? t[o - 1] : Tensor()};
                    const Tensor dsinks = sinks ? t[o + 5] : Tensor();
                    ops::attention_forward(t[0], t[1], t[2], scale, variant, t[o], t[o + 1], st);
                    ops::attention_backward(t[0], t[1], t[2], t[o], t[o + 1], t[3], scale, variant,
                                            t[o + 2], t[o + 3], t[o + 4], dsinks, st);
                  }};
  backward.tolerance = s.tolerance;
  backward.seed = seed++;
  cases.push_back(std::move(backward));
}

// Masked tiles never read: the forward and backward run twice, on clean inputs and on inputs
// with NaN in k and v of the positions before `first_end` and in q and dout of those from
// `middle_end` on; the rows of positions [first_end, middle_end) of the second run (out, lse, dq,
// dk, dv) replace those of the first (ops::copy_2d), and the result is compared as any case's.
// The documents' edges at first_end and middle_end are multiples of 256 (every kernel's row
// block, key block and tile), so no tile mixes the runs: a row of the middle sees none of the
// NaN, and neither do its keys' gradients, unless a kernel visits a wholly masked (row block,
// key tile) pair (then P V, dS K, dS^T Q or P^T dout multiply its masked zeros by the NaN and
// the middle rows are NaN: the harness fails on any non-finite element). Tensors: q, k, v, dout,
// doc_start, the poisoned q, k, v, dout, their run's out, lse, dq, dk, dv (in: not compared),
// then out, lse, dq, dk, dv (forward: q, k, v, doc_start, poisoned q, k, v, their out, lse, then
// out, lse).
void add_document_skip_cases(const AttentionShape& s, int64_t first_end, int64_t middle_end,
                             const std::vector<std::vector<int64_t>>& docs, uint64_t& seed,
                             std::vector<OpCase>& cases) {
  const Shape q_shape{s.batch, s.seq, s.heads, s.head_dim};
  const Shape k_shape{s.batch, s.seq, s.kv_heads, s.head_dim};
  const Shape v_shape{s.batch, s.seq, s.kv_heads, s.dv()};
  const Shape out_shape{s.batch, s.seq, s.heads, s.dv()};
  const Shape lse_shape{s.batch, s.heads, s.seq};
  const double scale = 1.0 / std::sqrt(double(s.head_dim));
  const std::string name = describe(s) + describe_docs(docs) + " NaN outside [" +
                           std::to_string(first_end) + ", " + std::to_string(middle_end) + ")";
  const Generator nan = [](std::mt19937_64&, int64_t n) {
    return std::vector<double>(static_cast<size_t>(n), std::numeric_limits<double>::quiet_NaN());
  };
  const TensorSpec doc_start =
      in("doc_start", Shape{s.batch, s.seq}, Kind::i32, values(doc_starts(docs)));
  // Copies positions [from, to) of every sequence of a (B, T, width) tensor from `src` to `dst`.
  auto copy_positions = [](const Tensor& src, const Tensor& dst, int64_t from, int64_t to,
                           Stream& st) {
    const int64_t batch = src.size(0), seq = src.size(1), width = src.numel() / (batch * seq);
    ops::copy_2d(src, {from * width, seq * width}, dst, {from * width, seq * width}, batch,
                 (to - from) * width, st);
  };
  // ... and of an lse (B, nh, T).
  auto copy_lse = [](const Tensor& src, const Tensor& dst, int64_t from, int64_t to, Stream& st) {
    const int64_t seq = src.size(2);
    ops::copy_2d(src, {from, seq}, dst, {from, seq}, src.size(0) * src.size(1), to - from, st);
  };

  OpCase forward{
      "attention_forward" + name,
      {in("q", q_shape), in("k", k_shape), in("v", v_shape), doc_start,
       in("q_nan", q_shape, Kind::floating, nan), in("k_nan", k_shape, Kind::floating, nan),
       in("v_nan", v_shape, Kind::floating, nan), in("out_nan", out_shape),
       in("lse_nan", lse_shape, Kind::state), out("out", out_shape),
       out("lse", lse_shape, Kind::state)},
      [=](const std::vector<Tensor>& t, Stream& st) {
        const int64_t seq = t[0].size(1);
        copy_positions(t[0], t[4], 0, middle_end, st);
        copy_positions(t[1], t[5], first_end, seq, st);
        copy_positions(t[2], t[6], first_end, seq, st);
        const ops::AttentionVariant variant{0, Tensor(), t[3]};
        ops::attention_forward(t[0], t[1], t[2], scale, variant, t[9], t[10], st);
        ops::attention_forward(t[4], t[5], t[6], scale, variant, t[7], t[8], st);
        copy_positions(t[7], t[9], first_end, middle_end, st);
        copy_lse(t[8], t[10], first_end, middle_end, st);
      }};
  forward.tolerance = s.tolerance;
  forward.seed = seed++;
  cases.push_back(std::move(forward));

  OpCase backward{
      "attention_backward" + name,
      {in("q", q_shape), in("k", k_shape), in("v", v_shape), in("dout", out_shape), doc_start,
       in("q_nan", q_shape, Kind::floating, nan), in("k_nan", k_shape, Kind::floating, nan),
       in("v_nan", v_shape, Kind::floating, nan), in("dout_nan", out_shape, Kind::floating, nan),
       in("out_nan", out_shape), in("lse_nan", lse_shape, Kind::state), in("dq_nan", q_shape),
       in("dk_nan", k_shape), in("dv_nan", v_shape), out("out", out_shape),
       out("lse", lse_shape, Kind::state), out("dq", q_shape), out("dk", k_shape),
       out("dv", v_shape)},
      [=](const std::vector<Tensor>& t, Stream& st) {
        const int64_t seq = t[0].size(1);
        copy_positions(t[0], t[5], 0, middle_end, st);
        copy_positions(t[1], t[6], first_end, seq, st);
        copy_positions(t[2], t[7], first_end, seq, st);
        copy_positions(t[3], t[8], 0, middle_end, st);
        const ops::AttentionVariant variant{0, Tensor(), t[4]};
        ops::attention_forward(t[0], t[1], t[2], scale, variant, t[14], t[15], st);
        ops::attention_backward(t[0], t[1], t[2], t[14], t[15], t[3], scale, variant, t[16], t[17],
                                t[18], Tensor(), st);
        ops::attention_forward(t[5], t[6], t[7], scale, variant, t[9], t[10], st);
        ops::attention_backward(t[5], t[6], t[7], t[9], t[10], t[8], scale, variant, t[11], t[12],
                                t[13], Tensor(), st);
        for (size_t i : {0, 2, 3, 4})
          copy_positions(t[9 + i], t[14 + i], first_end, middle_end, st);
        copy_lse(t[10], t[15], first_end, middle_end, st);
      }};
  backward.tolerance = s.tolerance;
  backward.seed = seed++;
  cases.push_back(std::move(backward));
}

}  // namespace

MOEPEAK_BACKEND_OPS_CASES(attention) {
  // f32 errors: at most ~1.3e-6 relative (the CPU in f32, and the CUDA kernels' arithmetic run on
  // the CPU); the peaky case (|scale q.k| up to ~100) amplifies score rounding through exp, ~5e-6.
  const Tolerance standard{2e-5, 1e-2};
  const Tolerance peaky{1e-4, 1e-2};
  const AttentionShape shapes[] = {
      {1, 1, 1, 1, 8, 0, 1, standard},     // one query, one key
      {2, 37, 4, 2, 16, 0, 1, standard},   // G = 2, B = 2
      {1, 70, 6, 2, 64, 0, 1, standard},   // G = 3
      {1, 129, 8, 8, 32, 0, 1, standard},  // G = 1, T past 4 key tiles
      {1, 33, 4, 1, 128, 0, 1, standard},  // G = 4
      {2, 19, 3, 1, 24, 0, 1, standard},   // d = 24 (not a multiple of 32), G = 3
      {1, 45, 8, 1, 40, 0, 1, standard},   // d = 40, G = 8: one block holds 2 positions
      {1, 20, 2, 1, 256, 0, 1, standard},  // the largest head dim
      {1, 0, 4, 2, 16, 0, 1, standard},    // T = 0: nothing to do
      {0, 5, 4, 2, 16, 0, 1, standard},    // B = 0
      {1, 50, 4, 2, 32, 2.0, 2, peaky},    // peaky softmax
      // bf16 with d = 32, 64, 128 runs the tensor-core kernels (ops/cuda/attention_tc.cu):
      // 64-row blocks and 64-entry tiles, crossed here in both directions
      {2, 150, 4, 2, 64, 0, 1, standard},   // G = 2, B = 2, 5 row blocks, 3 key tiles
      {1, 130, 2, 2, 128, 0, 1, standard},  // G = 1, T one past 2 tiles
  };
  std::vector<OpCase> cases;
  uint64_t seed = 100;
  for (const AttentionShape& s : shapes) add_plain_cases(s, seed, cases);

  // Windows and sinks. f32 and bf16 d = 8, 16, 24, 40 run the SIMT kernels (16-row blocks,
  // 32-entry tiles), bf16 d = 32, 64, 128 the tensor-core ones (64-row blocks, 64-entry tiles).
  // With W = 1 a row's one key has p = 1 / (1 + exp(sink - score)) and dS = p (dP - D) =
  // p (1 - p) dP: D = dout . out reads the bf16-rounded out, and dP - D cancels by 1 - p, so rows
  // with p near 1 amplify out's rounding in dq and dk (measured 8.4e-3 on the tensor cores, 4.5e-3
  // SIMT); bf16 gets 2e-2 there. f32 keeps 2e-5 (measured <= 9.1e-7).
  const Tolerance one_key{2e-5, 2e-2};
  const AttentionVariantCase variants[] = {
      {{2, 37, 4, 2, 16, 0, 1, one_key}, 1, Sinks::normal},      // only itself (and the sink)
      {{2, 37, 4, 2, 16, 0, 1, standard}, 5, Sinks::normal},     // G = 2, B = 2
      {{1, 45, 8, 1, 40, 0, 1, standard}, 17, Sinks::normal},    // G = 8, W past a 16-row block
      {{2, 19, 3, 1, 24, 0, 1, standard}, 0, Sinks::normal},     // sinks alone, G = 3
      {{1, 33, 4, 2, 8, 0, 1, standard}, 0, Sinks::dominant},    // the sink takes most of p
      {{2, 20, 2, 1, 16, 0, 1, standard}, 7, Sinks::negative},   // exp(sink - m) = 0
      {{1, 129, 8, 8, 32, 0, 1, standard}, 40, Sinks::normal},   // G = 1, W across key tiles
      {{1, 300, 2, 2, 16, 0, 1, standard}, 20, Sinks::none},     // T >> W: most tiles skipped
      {{1, 45, 8, 1, 40, 0, 1, standard}, 45, Sinks::none},      // W = T: plain causal
      {{2, 23, 4, 1, 24, 0, 1, standard}, 1000, Sinks::normal},  // W > T, G = 4
      {{1, 50, 4, 2, 32, 2.0, 2, peaky}, 10, Sinks::normal},     // peaky softmax
      // bf16: the tensor-core kernels
      {{1, 70, 4, 1, 64, 0, 1, standard}, 33, Sinks::normal},     // G = 4: 280 rows, 5 blocks
      {{2, 150, 4, 2, 64, 0, 1, standard}, 70, Sinks::normal},    // W > a 64-entry tile, B = 2
      {{1, 70, 4, 2, 64, 0, 1, one_key}, 1, Sinks::normal},       // only itself (and the sink)
      {{1, 130, 4, 4, 128, 0, 1, standard}, 9, Sinks::dominant},  // G = 1, d = 128
      {{1, 100, 8, 1, 32, 0, 1, standard}, 3, Sinks::negative},   // G = 8, d = 32
      {{1, 130, 2, 1, 128, 0, 1, standard}, 0, Sinks::normal},    // sinks alone, G = 2
      // G = 1, W = 66: dk/dv's last row tile of key block 0 starts at row 128, the one row of it
      // that sees key 63 (the loop bound over row tiles must include it)
      {{1, 200, 2, 2, 64, 0, 1, standard}, 66, Sinks::none},
  };
  for (const AttentionVariantCase& c : variants) add_variant_cases(c, seed, cases);

  // A value head dim dv other than dqk (after the cases above, so that their seeds stay as they
  // were). SIMT: f32, and bf16 with dims the tensor cores do not take.
  const AttentionShape value_dim_shapes[] = {
      {2, 19, 3, 1, 24, 0, 1, standard, 16},  // dqk 24, dv 16, G = 3
      {2, 37, 4, 2, 12, 0, 1, standard, 8},   // dqk 12, dv 8
      {1, 45, 8, 1, 16, 0, 1, standard, 24},  // dv > dqk, G = 8
      // bf16 on the tensor cores: DeepSeek-V3's 192 / 128, dv < and > dqk, the largest dqk
      {1, 70, 4, 2, 192, 0, 1, standard, 128},  // G = 2, 140 rows: 3 row blocks, 2 key tiles
      {1, 130, 2, 1, 64, 0, 1, standard, 32},   // T one past 2 tiles
      {1, 75, 4, 4, 32, 0, 1, standard, 128},   // G = 1
      {1, 20, 2, 1, 256, 0, 1, standard, 64},
      // 128 / 256: past the tensor cores' shared-memory budget, SIMT in bf16 too
      {1, 20, 2, 1, 128, 0, 1, standard, 256},
  };
  for (const AttentionShape& s : value_dim_shapes) add_plain_cases(s, seed, cases);
  // With windows and sinks: SIMT (24 / 16, 8 / 24, 12 / 8), then the tensor cores in bf16
  // (192 / 128, 32 / 64).
  const AttentionVariantCase value_dim_variants[] = {
      {{2, 37, 4, 2, 24, 0, 1, standard, 16}, 5, Sinks::normal},
      {{1, 45, 8, 1, 8, 0, 1, standard, 24}, 17, Sinks::dominant},
      {{2, 23, 4, 1, 12, 0, 1, standard, 8}, 1000, Sinks::normal},  // W > T
      {{1, 70, 4, 2, 192, 0, 1, standard, 128}, 33, Sinks::normal},
      {{1, 130, 4, 1, 32, 0, 1, standard, 64}, 9, Sinks::negative},
  };
  for (const AttentionVariantCase& c : value_dim_variants) add_variant_cases(c, seed, cases);

  // Packed documents (AttentionVariant::doc_start), after the cases above (their seeds stay as
  // they were): SIMT (f32; bf16 with d = 16, 40, 24 and 24 / 16), then the tensor cores in bf16
  // (d = 64, 128, 192 / 128), with documents longer and shorter than the 16-row, 32-entry and
  // 64-entry tiles, starting on and inside them, one-token documents and consecutive
  // boundaries, a boundary at 1 and at T - 1, B = 2 with other boundaries per sequence, windows
  // and sinks, GQA and dqk != dv. Every token its own document with sinks: p = 1 / (1 + exp(sink
  // - score)) as for W = 1, so the one_key tolerance.
  struct AttentionDocumentsCase {
    AttentionVariantCase variant;
    std::vector<std::vector<int64_t>> docs;  // [b]: the document lengths, summing to T
  };
  const AttentionDocumentsCase document_variants[] = {
      {{{2, 70, 4, 2, 16, 0, 1, standard}, 0, Sinks::none}, {{5, 30, 1, 1, 33}, {40, 30}}},
      {{{1, 45, 8, 1, 40, 0, 1, standard}, 0, Sinks::normal}, {{44, 1}}},  // G = 8, T - 1
      {{{2, 37, 4, 2, 24, 0, 1, standard, 16}, 5, Sinks::normal}, {{1, 20, 16}, {12, 12, 13}}},
      {{{1, 40, 3, 1, 24, 0, 1, one_key}, 0, Sinks::normal}, {std::vector<int64_t>(40, 1)}},
      {{{1, 129, 8, 8, 16, 0, 1, standard}, 40, Sinks::none}, {{17, 80, 32}}},  // G = 1
      // bf16: the tensor-core kernels
      {{{2, 150, 4, 2, 64, 0, 1, standard}, 0, Sinks::normal}, {{64, 1, 85}, {100, 50}}},
      {{{1, 200, 2, 2, 64, 0, 1, standard}, 66, Sinks::none}, {{130, 70}}},
      {{{1, 130, 4, 1, 128, 0, 1, standard}, 0, Sinks::dominant}, {{3, 60, 67}}},  // G = 4
      {{{1, 70, 4, 2, 192, 0, 1, standard, 128}, 0, Sinks::normal}, {{20, 49, 1}}},
  };
  for (const AttentionDocumentsCase& c : document_variants)
    add_variant_cases(c.variant, seed, cases, c.docs);
  // Masked tiles never read (add_document_skip_cases): f32 on the SIMT kernels, bf16 d = 64 on
  // the tensor cores; on the CPU (the reference, and MOEPEAK_BACKEND_OPS=cpu) the default blocks
  // of 128 positions (G = 2) and 256 keys.
  add_document_skip_cases({1, 768, 2, 1, 64, 0, 1, standard}, 256, 512,
                          {{100, 156, 1, 200, 55, 256}}, seed, cases);
  return cases;
}

}  // namespace moepeak::testing::backend_ops
