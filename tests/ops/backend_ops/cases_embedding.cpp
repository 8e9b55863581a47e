// test_backend_ops cases: embedding forward and backward (ops/embedding.h).
//
// The backward's dweight is accumulated (+=) onto random values; small vocabularies with many
// tokens (V = 5, N = 300; V = 3, H = 1, N = 1000) make most rows take many additions, whose order
// (increasing n) both backends share. V = 70000 has more rows than the CUDA kernel's 512 blocks,
// so blocks own several rows. Ids outside [0, V) are not comparable with the CPU (it throws in
// the stream task), so EmbeddingOnCuda below checks what CUDA does with them: a NaN row forward,
// nothing added backward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/runtime/backend.h"
#include "ops/embedding.h"
#include "tests/ops/backend_ops/harness.h"

namespace moepeak::testing::backend_ops {

namespace {

struct EmbeddingShape {
  int64_t vocab, hidden, tokens;
};

}  // namespace

MOEPEAK_BACKEND_OPS_CASES(embedding) {
  std::vector<OpCase> cases;
  const EmbeddingShape shapes[] = {{50, 96, 37}, {1, 1, 1},    {7, 1500, 64},    {1000, 33, 5},
                                   {5, 40, 300}, {3, 1, 1000}, {70000, 8, 2000}, {3, 64, 0}};
  for (const EmbeddingShape& e : shapes) {
    const std::string shape = " V=" + std::to_string(e.vocab) + " H=" + std::to_string(e.hidden) +
                              " N=" + std::to_string(e.tokens);
    cases.push_back(OpCase{"embedding_forward" + shape,
                           {in("ids", {e.tokens}, Kind::i64, integers(0, e.vocab - 1)),
                            in("weight", {e.vocab, e.hidden}), out("out", {e.tokens, e.hidden})},
                           [](const std::vector<Tensor>& t, Stream& s) {
                             ops::embedding_forward(t[0], t[1], t[2], s);
                           }});
    OpCase backward{"embedding_backward" + shape,
                    {in("ids", {e.tokens}, Kind::i64, integers(0, e.vocab - 1)),
                     in("dout", {e.tokens, e.hidden}), inout("dweight", {e.vocab, e.hidden})},
                    [](const std::vector<Tensor>& t, Stream& s) {
                      ops::embedding_backward(t[0], t[1], t[2], s);
                    }};
    // With bf16 storage every += rounds to bf16 (half an ulp, 2^-9 relative), so a row summing
    // ~9 tokens drifts by about 1% of its size from the f64 reference (V = 7, N = 64: 1.1% at
    // the worst of its 10500 elements), and one summing ~60 or ~330 tokens by a few percent; the
    // f32 run checks those sums at 1e-5.
    if (e.tokens > 10 * e.vocab) {
      backward.tolerance.bf16 = 0.1;
    } else if (e.tokens > 2 * e.vocab) {
      backward.tolerance.bf16 = 0.03;
    }
    cases.push_back(std::move(backward));
  }
  // The fp32 main gradient: an f32 dweight for bf16 dout (ops/embedding.h, both backends). The
  // additions are fp32 ones on bf16 values with no bf16 rounding, so the bf16 run holds the f32
  // tolerance.
  for (const EmbeddingShape& e : {EmbeddingShape{7, 1500, 64}, EmbeddingShape{3, 1, 1000}}) {
    OpCase main_grad{
        "embedding_backward f32 dweight V=" + std::to_string(e.vocab) +
            " H=" + std::to_string(e.hidden) + " N=" + std::to_string(e.tokens),
        {in("ids", {e.tokens}, Kind::i64, integers(0, e.vocab - 1)),
         in("dout", {e.tokens, e.hidden}), inout("dweight", {e.vocab, e.hidden}, Kind::state)},
        [](const std::vector<Tensor>& t, Stream& s) {
          ops::embedding_backward(t[0], t[1], t[2], s);
        }};
    main_grad.tolerance.bf16 = 1e-5;
    cases.push_back(std::move(main_grad));
  }
  return cases;
}

namespace {

// CUDA only: ids outside [0, V) give a NaN row forward and are skipped backward.
TEST(EmbeddingOnCuda, IdsOutsideTheVocabularyGiveNanRowsAndNoGradient) {
  if (cpu_under_test()) GTEST_SKIP() << "CUDA behaviour (the CPU throws for such ids)";
  if (std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  Backend& backend = backend_under_test();
  Stream& stream = backend.default_stream();
  constexpr int64_t V = 5, H = 3, N = 6;
  const std::vector<int64_t> ids = {2, -1, 4, 5, 2, 1000000};  // positions 1, 3, 5 invalid
  std::vector<float> weight(V * H), dout(N * H);
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = 0.5f + static_cast<float>(i);
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = 0.25f * static_cast<float>(i + 1);

  auto upload = [&](const void* data, Shape shape, DType dtype, const char* what) {
    auto t = OwnedTensor::device(backend, shape, dtype, LiveSet::workspace, what);
    backend.copy_async(t.data(), data, t.nbytes(), CopyKind::host_to_device, stream);
    return t;
  };
  OwnedTensor d_ids = upload(ids.data(), Shape{N}, DType::i64, "ids");
  OwnedTensor d_weight = upload(weight.data(), Shape{V, H}, DType::f32, "weight");
  OwnedTensor d_dout = upload(dout.data(), Shape{N, H}, DType::f32, "dout");
  std::vector<float> zeros(V * H, 0.0f);
  OwnedTensor d_dweight = upload(zeros.data(), Shape{V, H}, DType::f32, "dweight");
  OwnedTensor d_out =
      OwnedTensor::device(backend, Shape{N, H}, DType::f32, LiveSet::workspace, "out");

  ops::embedding_forward(d_ids, d_weight, d_out, stream);
  ops::embedding_backward(d_ids, d_dout, d_dweight, stream);
  std::vector<char> out_bytes = copy_to_host(d_out, backend, stream);
  std::vector<char> dweight_bytes = copy_to_host(d_dweight, backend, stream);
  std::vector<float> out(N * H), dweight(V * H);
  std::memcpy(out.data(), out_bytes.data(), out_bytes.size());
  std::memcpy(dweight.data(), dweight_bytes.data(), dweight_bytes.size());

  for (int64_t n = 0; n < N; ++n) {
    const bool valid = ids[n] >= 0 && ids[n] < V;
    for (int64_t h = 0; h < H; ++h) {
      const float got = out[n * H + h];
      if (valid) {
        EXPECT_EQ(got, weight[ids[n] * H + h]) << "out[" << n << ", " << h << "]";
      } else {
        EXPECT_TRUE(std::isnan(got))
            << "out[" << n << ", " << h << "] = " << got << " for id " << ids[n];
      }
    }
  }
  std::vector<float> want(V * H, 0.0f);
  for (int64_t n = 0; n < N; ++n) {
    if (ids[n] < 0 || ids[n] >= V) continue;
    for (int64_t h = 0; h < H; ++h) want[ids[n] * H + h] += dout[n * H + h];
  }
  for (int64_t i = 0; i < V * H; ++i) EXPECT_EQ(dweight[i], want[i]) << "dweight element " << i;
}

}  // namespace
}  // namespace moepeak::testing::backend_ops
