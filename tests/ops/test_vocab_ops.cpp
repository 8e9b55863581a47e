// Vocabulary ops on the CPU backend: the token embedding (lookup and weight gradient) and the
// materialised cross-entropy (losses and dlogits, in place or not). Same checks as
// test_dense_ops.cpp: float64 forward against a plain reference, input gradients against central
// finite differences, float vs double, accumulation, and errors at the call or at synchronize().
// bf16 storage of the cross-entropy and of its vocabulary-strip fold (ops/cross_entropy_strip.h):
// bitwise the f32 result on the same values, rounded to bf16.
// Run: ./build-ops/tests/ops/test_vocab_ops
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/runtime/backend.h"
#include "ops/cross_entropy.h"
#include "ops/cross_entropy_strip.h"
#include "ops/embedding.h"
#include "tests/ops/dense_ops_testing.h"

namespace moepeak {
namespace {

using testing::dot;
using testing::grad_err;
using testing::kFloatVsDoubleTol;
using testing::kForwardTol;
using testing::kGradTol;
using testing::max_rel_err;
using testing::max_scaled_err;
using testing::OpEnv;
using testing::random_vector;
using testing::rounded_to_float;

using testing::expect_stream_error;

// ---------------------------------------------------------------------------------------------
// Embedding: ids (N) i64, weight (V, H)

constexpr int64_t kVocab = 9, kHidden = 4, kTokens = 7;
const std::vector<int64_t> kIds = {3, 0, 8, 3, 5, 3, 1};  // token 3 three times

std::vector<double> run_embedding_forward(OpEnv& env, DType dtype,
                                          const std::vector<double>& weight) {
  auto ids = env.indices({kTokens}, DType::i64, kIds);
  auto wt = env.input({kVocab, kHidden}, dtype, weight);
  auto out = env.output({kTokens, kHidden}, dtype);
  ops::embedding_forward_cpu(ids, wt, out, env.stream());
  return env.read(out);
}

std::vector<double> run_embedding_backward(OpEnv& env, DType dtype, const std::vector<double>& dout,
                                           const std::vector<double>& dweight_init) {
  auto ids = env.indices({kTokens}, DType::i64, kIds);
  auto doutt = env.input({kTokens, kHidden}, dtype, dout);
  auto dweight = env.input({kVocab, kHidden}, dtype, dweight_init);
  ops::embedding_backward_cpu(ids, doutt, dweight, env.stream());
  return env.read(dweight);
}

TEST(Embedding, ForwardCopiesRows) {
  OpEnv env;
  auto weight = random_vector(kVocab * kHidden, 110);
  for (DType dtype : {DType::f64, DType::f32}) {
    auto out = run_embedding_forward(env, dtype, rounded_to_float(weight));
    for (int64_t n = 0; n < kTokens; ++n) {
      for (int64_t h = 0; h < kHidden; ++h) {
        EXPECT_EQ(out[n * kHidden + h], static_cast<float>(weight[kIds[n] * kHidden + h]));
      }
    }
  }
}

TEST(Embedding, BackwardAccumulatesInTokenOrderAndMatchesFiniteDifferences) {
  OpEnv env;
  auto weight = random_vector(kVocab * kHidden, 111);
  auto probe = random_vector(kTokens * kHidden, 112);
  auto dweight =
      run_embedding_backward(env, DType::f64, probe, std::vector<double>(kVocab * kHidden, 0.0));
  auto loss = [&] { return dot(run_embedding_forward(env, DType::f64, weight), probe); };
  EXPECT_LT(grad_err(weight, dweight, loss), kGradTol);

  // += onto existing values, tokens in increasing order: the very same additions, bit for bit.
  auto init = random_vector(kVocab * kHidden, 113);
  auto ref = init;
  for (int64_t n = 0; n < kTokens; ++n) {
    for (int64_t h = 0; h < kHidden; ++h) ref[kIds[n] * kHidden + h] += probe[n * kHidden + h];
  }
  EXPECT_EQ(run_embedding_backward(env, DType::f64, probe, init), ref);
}

TEST(Embedding, FloatMatchesDouble) {
  OpEnv env;
  auto dout = rounded_to_float(random_vector(kTokens * kHidden, 114));
  auto init = rounded_to_float(random_vector(kVocab * kHidden, 115));
  EXPECT_LT(max_scaled_err(run_embedding_backward(env, DType::f32, dout, init),
                           run_embedding_backward(env, DType::f64, dout, init)),
            kFloatVsDoubleTol);
}

TEST(Embedding, RejectsBadShapesAtTheCall) {
  OpEnv env;
  auto ids = env.indices({kTokens}, DType::i64, kIds);
  auto ids_i32 = env.indices({kTokens}, DType::i32, kIds);
  auto weight = env.input({kVocab, kHidden}, DType::f64, random_vector(kVocab * kHidden, 116));
  auto out = env.output({kTokens, kHidden}, DType::f64);
  auto out_wide = env.output({kTokens, kHidden + 1}, DType::f64);
  auto out_f32 = env.output({kTokens, kHidden}, DType::f32);
  EXPECT_THROW(ops::embedding_forward_cpu(ids_i32, weight, out, env.stream()), Error);
  EXPECT_THROW(ops::embedding_forward_cpu(ids, weight, out_wide, env.stream()), Error);
  EXPECT_THROW(ops::embedding_forward_cpu(ids, weight, out_f32, env.stream()), Error);
  EXPECT_THROW(ops::embedding_backward_cpu(ids, out_wide, weight, env.stream()), Error);
  env.stream().synchronize();
}

TEST(Embedding, OutOfRangeIdsFailNamingPositionAndId) {
  OpEnv env;
  std::vector<int64_t> bad = kIds;
  bad[4] = kVocab;
  auto ids = env.indices({kTokens}, DType::i64, bad);
  auto weight = env.input({kVocab, kHidden}, DType::f64, random_vector(kVocab * kHidden, 117));
  auto out = env.output({kTokens, kHidden}, DType::f64);
  env.stream().synchronize();

  EXPECT_THROW(ops::embedding_check_ids_host(ids, kVocab), Error);  // at once, on the host
  auto good = env.indices({kTokens}, DType::i64, kIds);
  EXPECT_NO_THROW(ops::embedding_check_ids_host(good, kVocab));

  auto forward_stream = env.backend().create_stream("embedding forward errors");
  ops::embedding_forward_cpu(ids, weight, out, *forward_stream);
  expect_stream_error(*forward_stream, {"embedding_forward_cpu", "token id 9 at position 4"});

  auto backward_stream = env.backend().create_stream("embedding backward errors");
  bad[4] = -3;
  auto negative = env.indices({kTokens}, DType::i64, bad);
  auto before = env.read(weight);
  ops::embedding_backward_cpu(negative, out, weight, *backward_stream);
  expect_stream_error(*backward_stream, {"embedding_backward_cpu", "token id -3 at position 4"});
  EXPECT_EQ(env.read(weight), before);  // checked before anything was added
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy: logits (N, V), labels (N) i64 with -100 ignored

constexpr int64_t kRows = 6, kClasses = 11;
const std::vector<int64_t> kLabels = {4, -100, 0, 10, -100, 7};
constexpr double kScale = 1.0 / 4;  // 1 / number of labelled positions

std::vector<double> run_ce_forward(OpEnv& env, DType dtype, const std::vector<double>& logits) {
  auto lt = env.input({kRows, kClasses}, dtype, logits);
  auto labels = env.indices({kRows}, DType::i64, kLabels);
  auto losses = env.output({kRows}, dtype);
  ops::cross_entropy_forward_cpu(lt, labels, losses, env.stream());
  return env.read(losses);
}

// Out of place into a poisoned dlogits, or in place over the logits.
std::vector<double> run_ce_backward(OpEnv& env, DType dtype, const std::vector<double>& logits,
                                    bool in_place) {
  auto lt = env.input({kRows, kClasses}, dtype, logits);
  auto labels = env.indices({kRows}, DType::i64, kLabels);
  if (in_place) {
    ops::cross_entropy_backward_cpu(lt, labels, kScale, lt, env.stream());
    return env.read(lt);
  }
  auto dlogits = env.output({kRows, kClasses}, dtype);
  ops::cross_entropy_backward_cpu(lt, labels, kScale, dlogits, env.stream());
  return env.read(dlogits);
}

TEST(CrossEntropy, ForwardMatchesReferenceAndIgnoresLabelMinus100) {
  OpEnv env;
  auto logits = random_vector(kRows * kClasses, 120, 3.0);
  auto losses = run_ce_forward(env, DType::f64, logits);
  std::vector<double> ref(kRows, 0.0);
  for (int64_t n = 0; n < kRows; ++n) {
    if (kLabels[n] == ops::kIgnoreLabel) continue;
    const double* l = logits.data() + n * kClasses;
    double m = *std::max_element(l, l + kClasses), sum = 0;
    for (int64_t v = 0; v < kClasses; ++v) sum += std::exp(l[v] - m);
    ref[n] = m + std::log(sum) - l[kLabels[n]];
  }
  EXPECT_LT(max_rel_err(losses, ref), kForwardTol);
  EXPECT_EQ(losses[1], 0.0);
  EXPECT_EQ(losses[4], 0.0);

  // Max subtraction: logits far beyond exp's range give the same losses (shift invariance).
  auto shifted = logits;
  for (auto& v : shifted) v += 1000.0;
  EXPECT_LT(max_scaled_err(run_ce_forward(env, DType::f64, shifted), ref), 1e-12);
  EXPECT_LT(max_scaled_err(run_ce_forward(env, DType::f32, shifted), ref), 1e-3)
      << "float logits near 1000 keep only ~6e-5 absolute resolution";
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  OpEnv env;
  auto logits = random_vector(kRows * kClasses, 121, 3.0);
  auto dlogits = run_ce_backward(env, DType::f64, logits, false);
  // L = scale * sum_n losses[n]: the scale is dL/dlosses[n] for every labelled row.
  auto loss = [&] {
    auto losses = run_ce_forward(env, DType::f64, logits);
    return kScale * dot(losses, std::vector<double>(kRows, 1.0));
  };
  EXPECT_LT(grad_err(logits, dlogits, loss), kGradTol);
  for (int64_t v = 0; v < kClasses; ++v) {
    EXPECT_EQ(dlogits[1 * kClasses + v], 0.0);  // ignored rows: exactly zero
    EXPECT_EQ(dlogits[4 * kClasses + v], 0.0);
  }
}

TEST(CrossEntropy, InPlaceBackwardEqualsOutOfPlace) {
  OpEnv env;
  auto logits = random_vector(kRows * kClasses, 122, 3.0);
  for (DType dtype : {DType::f64, DType::f32}) {
    EXPECT_EQ(run_ce_backward(env, dtype, logits, true), run_ce_backward(env, dtype, logits, false))
        << dtype_name(dtype);
  }
}

TEST(CrossEntropy, FloatMatchesDouble) {
  OpEnv env;
  auto logits = rounded_to_float(random_vector(kRows * kClasses, 123, 3.0));
  EXPECT_LT(max_scaled_err(run_ce_forward(env, DType::f32, logits),
                           run_ce_forward(env, DType::f64, logits)),
            kFloatVsDoubleTol);
  EXPECT_LT(max_scaled_err(run_ce_backward(env, DType::f32, logits, false),
                           run_ce_backward(env, DType::f64, logits, false)),
            kFloatVsDoubleTol);
}

TEST(CrossEntropy, RejectsBadArguments) {
  OpEnv env;
  auto logits = env.input({kRows, kClasses}, DType::f64, random_vector(kRows * kClasses, 124));
  auto labels = env.indices({kRows}, DType::i64, kLabels);
  auto labels_i32 = env.indices({kRows}, DType::i32, kLabels);
  auto labels_short = env.indices({kRows - 1}, DType::i64, {1, 2, 3, 4, 5});
  auto losses = env.output({kRows}, DType::f64);
  auto losses_f32 = env.output({kRows}, DType::f32);
  auto dlogits_bad = env.output({kRows, kClasses - 1}, DType::f64);
  Stream& s = env.stream();
  EXPECT_THROW(ops::cross_entropy_forward_cpu(logits, labels_i32, losses, s), Error);
  EXPECT_THROW(ops::cross_entropy_forward_cpu(logits, labels_short, losses, s), Error);
  EXPECT_THROW(ops::cross_entropy_forward_cpu(logits, labels, losses_f32, s), Error);
  EXPECT_THROW(ops::cross_entropy_backward_cpu(logits, labels, kScale, dlogits_bad, s), Error);
  s.synchronize();

  std::vector<int64_t> bad = kLabels;
  bad[3] = kClasses;  // one past the vocabulary
  auto bad_labels = env.indices({kRows}, DType::i64, bad);
  auto forward_stream = env.backend().create_stream("ce forward errors");
  ops::cross_entropy_forward_cpu(logits, bad_labels, losses, *forward_stream);
  expect_stream_error(*forward_stream, {"cross_entropy_forward_cpu", "label 11 at position 3"});
  bad[3] = -1;  // negative, and not the ignore label
  auto negative = env.indices({kRows}, DType::i64, bad);
  auto dlogits = env.output({kRows, kClasses}, DType::f64);
  s.synchronize();
  auto backward_stream = env.backend().create_stream("ce backward errors");
  ops::cross_entropy_backward_cpu(logits, negative, kScale, dlogits, *backward_stream);
  expect_stream_error(*backward_stream, {"cross_entropy_backward_cpu", "label -1 at position 3"});
}

// ---------------------------------------------------------------------------------------------
// bf16 storage: logits read exactly, the f32 path's double arithmetic, each result stored
// double -> fp32 -> bf16 (ops/cross_entropy.h), so bitwise the f32 result rounded to bf16.

std::vector<double> rounded_to_bf16(std::vector<double> v) {
  for (auto& x : v) x = static_cast<float>(bf16(static_cast<float>(x)));
  return v;
}

// A bf16 tensor holding `values` rounded, or poisoned with NaN (written directly: CPU memory).
OwnedTensor bf16_tensor(OpEnv& env, Shape shape, const std::vector<double>& values = {}) {
  auto t = OwnedTensor::device(env.backend(), shape, DType::bf16, LiveSet::workspace, "bf16");
  bf16* p = t.data_as<bf16>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    p[i] = values.empty() ? bf16(NAN) : bf16(static_cast<float>(values[static_cast<size_t>(i)]));
  }
  return t;
}

std::vector<double> read_bf16(OpEnv& env, const Tensor& t) {
  env.stream().synchronize();
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(t.data_as<bf16>()[i]);
  return out;
}

TEST(CrossEntropy, Bf16IsTheFloatResultRoundedToBf16) {
  OpEnv env;
  auto logits = rounded_to_bf16(random_vector(kRows * kClasses, 125, 3.0));
  const auto losses32 = run_ce_forward(env, DType::f32, logits);
  const auto dlogits32 = run_ce_backward(env, DType::f32, logits, false);
  auto lt = bf16_tensor(env, {kRows, kClasses}, logits);
  auto labels = env.indices({kRows}, DType::i64, kLabels);
  auto losses = bf16_tensor(env, {kRows});
  auto dlogits = bf16_tensor(env, {kRows, kClasses});
  Stream& s = env.stream();
  ops::cross_entropy_forward_cpu(lt, labels, losses, s);
  ops::cross_entropy_backward_cpu(lt, labels, kScale, dlogits, s);
  EXPECT_EQ(read_bf16(env, losses), rounded_to_bf16(losses32));
  EXPECT_EQ(read_bf16(env, dlogits), rounded_to_bf16(dlogits32));
  ops::cross_entropy_backward_cpu(lt, labels, kScale, lt, s);  // in place
  EXPECT_EQ(read_bf16(env, lt), rounded_to_bf16(dlogits32));
}

TEST(CrossEntropyStrip, Bf16IsTheFloatResultRoundedToBf16) {
  // One strip of columns [100, 800) of a 900-word vocabulary folded into a state that already
  // holds another strip (so the rescaling runs), then its gradient; labels inside the strip,
  // outside it and ignored. The state is f64 for both: the bf16 fold equals the f32 fold bitwise.
  OpEnv env;
  constexpr int64_t kTokens = 5, kColumns = 700, kBegin = 100;
  const std::vector<int64_t> labels_v = {150, -100, 799, 3, 100};
  const auto strip_v = rounded_to_bf16(random_vector(kTokens * kColumns, 126, 2.0));
  const auto first_v = rounded_to_bf16(random_vector(kTokens * kBegin, 127, 2.0));
  auto labels = env.indices({kTokens}, DType::i64, labels_v);
  Stream& s = env.stream();
  auto fold = [&](const Tensor& first, const Tensor& strip, const Tensor& state) {
    ops::cross_entropy_state_init_cpu(state, s);
    ops::cross_entropy_strip_forward_cpu(first, labels, 0, state, s);
    ops::cross_entropy_strip_forward_cpu(strip, labels, kBegin, state, s);
  };
  auto state32 = env.output({kTokens, 3}, DType::f64);
  auto strip32 = env.input({kTokens, kColumns}, DType::f32, strip_v);
  auto first32 = env.input({kTokens, kBegin}, DType::f32, first_v);
  fold(first32, strip32, state32);
  auto dstrip32 = env.output({kTokens, kColumns}, DType::f32);
  ops::cross_entropy_strip_backward_cpu(strip32, labels, kBegin, state32, 0.3, dstrip32, s);

  auto state16 = env.output({kTokens, 3}, DType::f64);
  auto strip16 = bf16_tensor(env, {kTokens, kColumns}, strip_v);
  auto first16 = bf16_tensor(env, {kTokens, kBegin}, first_v);
  fold(first16, strip16, state16);
  auto dstrip16 = bf16_tensor(env, {kTokens, kColumns});
  ops::cross_entropy_strip_backward_cpu(strip16, labels, kBegin, state16, 0.3, dstrip16, s);

  const auto state = env.read(state32);
  EXPECT_EQ(env.read(state16), state);
  EXPECT_EQ(state[3 * 1], -std::numeric_limits<double>::infinity()) << "ignored: identity";
  const auto want = rounded_to_bf16(env.read(dstrip32));
  EXPECT_EQ(read_bf16(env, dstrip16), want);
  ops::cross_entropy_strip_backward_cpu(strip16, labels, kBegin, state16, 0.3, strip16, s);
  EXPECT_EQ(read_bf16(env, strip16), want) << "in place";
}

}  // namespace
}  // namespace moepeak
