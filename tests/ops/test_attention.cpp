// Causal grouped-query attention on the CPU (ops/attention.h): forward against a materialised-
// softmax float64 reference, gradients against central finite differences, float vs double,
// bf16 storage as the float result rounded once (bitwise), causality, bitwise determinism and
// argument checks, each also with a value head dim dv other than the query/key one dqk. The
// sliding window and sinks: test_attention_variants.cpp; the helpers both share (the float64
// reference among them): tests/ops/attention_testing.h.
//
//   q, dq: (B, T, nh, dqk)    k, dk: (B, T, nkv, dqk)    v, dv: (B, T, nkv, dv)
//   out, dout: (B, T, nh, dv) lse: (B, nh, T)
//
// Shapes cross several blocks: the default blocks (256 query rows x 256 keys) with T = 300 or 600,
// and small blocks (detail::attention_*_cpu_blocked) so that T = 7 or 65 also spans many.
// Speed (not run by default): ./test_attention --gtest_also_run_disabled_tests
//                             --gtest_filter='*Speed*'
#include <gtest/gtest.h>

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#include "ops/attention.h"
#include "ops/fill.h"
#include "tests/ops/attention_testing.h"
#include "tests/ops/gradcheck.h"

namespace moepeak {
namespace {

using testing::AttentionTensors;  // tests/ops/attention_testing.h
using testing::AttentionTest;
using testing::bitwise_equal;
using testing::Dims;
using testing::Inputs;
using testing::kNaN;
using testing::kOddBlocks;
using testing::kSmallBlocks;
using testing::max_grad_rel_err;
using testing::max_rel_err;
using testing::norm_rel_err;
using testing::random_inputs;
using testing::reference;  // the materialised softmax in double, forward and backward
using testing::Reference;
using testing::rounded_to_bf16;

TEST_F(AttentionTest, ForwardMatchesMaterialisedSoftmax) {
  // float64 online softmax vs materialised softmax: the same sums in another order, so they agree
  // to a few ulp times log T; 1e-12 relative (values under 1e-3 compared at 1e-3). Head dims
  // (dqk, dv): equal, dv < dqk and dv > dqk.
  struct HeadDims {
    int64_t qk, v;
  };
  uint64_t seed = 100;
  for (int64_t seq : {1, 7, 65, 130})
    for (int64_t kv_heads : {4, 2, 1})
      for (HeadDims hd : {HeadDims{8, 8}, HeadDims{16, 16}, HeadDims{12, 8}, HeadDims{8, 20}}) {
        const Dims dims{2, seq, 4, kv_heads, hd.qk, hd.v};
        const Inputs in = random_inputs(dims, seed++);
        const Reference ref = reference(dims, in);
        AttentionTensors t = allocate(dims, DType::f64);
        upload_inputs(t, in);
        for (ops::AttentionBlocks blocks : {ops::kAttentionBlocks, kSmallBlocks, kOddBlocks}) {
          SCOPED_TRACE(::testing::Message()
                       << "T=" << seq << " nkv=" << kv_heads << " dqk=" << hd.qk << " dv=" << hd.v
                       << " blocks " << blocks.query_rows << "x" << blocks.keys);
          forward(t, dims, blocks);
          EXPECT_LT(max_rel_err(download(t.out), ref.out, 1e-3), 1e-12);
          EXPECT_LT(max_rel_err(download(t.lse), ref.lse, 1e-3), 1e-12);
        }
      }
}

TEST_F(AttentionTest, ForwardMatchesAcrossDefaultBlocks) {
  // Default blocks: with 4 query heads per kv head a block holds 64 positions (10 query blocks at
  // T = 600), with one it holds 256 (3 query blocks); 3 key blocks either way.
  for (int64_t kv_heads : {1, 4}) {
    const Dims dims{1, 600, 4, kv_heads, 8};
    const Inputs in = random_inputs(dims, 60 + kv_heads);
    const Reference ref = reference(dims, in);
    AttentionTensors t = allocate(dims, DType::f64);
    upload_inputs(t, in);
    forward(t, dims, ops::kAttentionBlocks);
    EXPECT_LT(max_rel_err(download(t.out), ref.out, 1e-3), 1e-12) << "nkv=" << kv_heads;
    EXPECT_LT(max_rel_err(download(t.lse), ref.lse, 1e-3), 1e-12) << "nkv=" << kv_heads;
  }
}

TEST_F(AttentionTest, DefaultEntryPointsUseDefaultBlocks) {
  const Dims dims{2, 300, 4, 2, 8};
  const Inputs in = random_inputs(dims, 7);
  AttentionTensors t = allocate(dims, DType::f64);
  upload_inputs(t, in);
  forward(t, dims, ops::kAttentionBlocks);
  backward(t, dims, ops::kAttentionBlocks);
  const auto out = download(t.out), dq = download(t.dq), dk = download(t.dk);
  ops::fill(t.out, kNaN, stream());
  ops::fill(t.dq, kNaN, stream());
  ops::fill(t.dk, kNaN, stream());
  ops::attention_forward_cpu(t.q, t.k, t.v, dims.scale(), {}, t.out, t.lse, stream());
  ops::attention_backward_cpu(t.q, t.k, t.v, t.out, t.lse, t.dout, dims.scale(), {}, t.dq, t.dk,
                              t.dv, Tensor(), stream());
  EXPECT_EQ(download(t.out), out);
  EXPECT_EQ(download(t.dq), dq);
  EXPECT_EQ(download(t.dk), dk);
}

// dq, dk, dv against central differences of L = sum(out * dout) (gradcheck.h), max rel err 1e-6.
// Step h = 1e-5 rather than gradcheck's 1e-6: moving one key changes every later row of its
// group, and their rounding (~1e-16 of L) divided by 2h reaches 1e-9 absolute, 2e-6 relative on
// the smallest gradients (~5e-5) at h = 1e-6. At 1e-5 that noise is 10x smaller while the
// truncation error h^2 f'''/6 (~1e-11) stays negligible; measured worst ~2e-7.
class AttentionGradTest : public AttentionTest {
 public:
  static constexpr double kStep = 1e-5;

  // Checks every coordinate of q, k and v, or with `positions` only those of these positions
  // (all heads and batches): long sequences check the block boundaries and stay fast.
  void check(const Dims& dims, ops::AttentionBlocks blocks, uint64_t seed,
             const std::vector<int64_t>& positions = {}) {
    Inputs in = random_inputs(dims, seed);
    AttentionTensors t = allocate(dims, DType::f64);
    upload_inputs(t, in);
    forward(t, dims, blocks);
    backward(t, dims, blocks);
    const auto dq = download(t.dq), dk = download(t.dk), dv = download(t.dv);

    // L in long double so that its rounding (not the op's) stays far below h * 1e-6.
    auto loss = [&] {
      upload(t.q, in.q);
      upload(t.k, in.k);
      upload(t.v, in.v);
      forward(t, dims, blocks);
      const auto out = download(t.out);
      long double sum = 0;
      for (size_t i = 0; i < out.size(); ++i) sum += static_cast<long double>(out[i]) * in.dout[i];
      return static_cast<double>(sum);
    };
    auto check_input = [&](std::vector<double>& input, const std::vector<double>& grad,
                           const char* name) {
      if (positions.empty()) {
        EXPECT_LT(max_grad_rel_err(input, grad, loss, kStep), 1e-6) << name;
        return;
      }
      // elements of one position: heads x (dqk or dv)
      const int64_t row = static_cast<int64_t>(input.size()) / (dims.batch * dims.seq);
      std::vector<size_t> chosen;
      for (int64_t b = 0; b < dims.batch; ++b)
        for (int64_t pos : positions)
          for (int64_t i = 0; i < row; ++i) chosen.push_back((b * dims.seq + pos) * row + i);
      std::vector<double> x, x_grad;
      for (size_t i : chosen) {
        x.push_back(input[i]);
        x_grad.push_back(grad[i]);
      }
      auto subset_loss = [&] {
        for (size_t j = 0; j < chosen.size(); ++j) input[chosen[j]] = x[j];
        return loss();
      };
      EXPECT_LT(max_grad_rel_err(x, x_grad, subset_loss, kStep), 1e-6) << name;
      for (size_t j = 0; j < chosen.size(); ++j) input[chosen[j]] = x[j];
    };
    check_input(in.q, dq, "dq");
    check_input(in.k, dk, "dk");
    check_input(in.v, dv, "dv");
  }
};

TEST_F(AttentionGradTest, GroupedQueryAcrossSmallBlocks) {
  // GQA (4 query heads on 2 kv heads); 8-row blocks hold 4 positions, so T = 13 spans 4 query
  // blocks and 3 key blocks of 5 (diagonal and fully visible blocks, a ragged last block).
  check(Dims{2, 13, 4, 2, 8}, ops::AttentionBlocks{8, 5}, 11);
}

TEST_F(AttentionGradTest, MultiQueryAcrossSmallBlocks) {
  check(Dims{1, 11, 4, 1, 4}, ops::AttentionBlocks{6, 4}, 12);
}

TEST_F(AttentionGradTest, ValueHeadDimOtherThanQueryKey) {
  // dv < dqk (DeepSeek-V3's MLA shape, small) and dv > dqk, GQA across small blocks.
  check(Dims{2, 13, 4, 2, 8, 6}, ops::AttentionBlocks{8, 5}, 14);
  check(Dims{1, 11, 4, 1, 4, 10}, ops::AttentionBlocks{6, 4}, 15);
}

TEST_F(AttentionGradTest, GroupedQueryDefaultBlocks) {
  // Default blocks: 64 positions per 256-row query block of 4 heads, so T = 300 spans five query
  // blocks and two key blocks of 256; positions on both sides of each boundary are checked.
  check(Dims{1, 300, 4, 1, 4}, ops::kAttentionBlocks, 13, {0, 63, 64, 191, 192, 255, 256, 299});
}

TEST_F(AttentionTest, FloatMatchesDouble) {
  // float32 vs float64 on the same inputs, error relative to each tensor's largest element. The
  // f32 path rounds every product and sum (eps 6e-8) and uses a ~2 ulp polynomial exp; errors grow
  // with the reduction lengths (d = 16 or 24, up to T = 300 keys, 256 rows in dK/dV's sums), so
  // about 1e-6 is expected; we allow 1e-5 (docs/design.md#exactness: float32 far under 1e-5).
  for (const Dims& dims : {Dims{2, 300, 4, 2, 16}, Dims{2, 300, 4, 2, 24, 16}}) {
    const Inputs in = random_inputs(dims, 21);
    AttentionTensors t64 = allocate(dims, DType::f64);
    AttentionTensors t32 = allocate(dims, DType::f32);
    upload_inputs(t64, in);
    upload_inputs(t32, in);
    for (ops::AttentionBlocks blocks : {ops::kAttentionBlocks, kSmallBlocks}) {
      SCOPED_TRACE(::testing::Message() << "dqk=" << dims.dqk() << " dv=" << dims.dv() << " blocks "
                                        << blocks.query_rows << "x" << blocks.keys);
      forward(t64, dims, blocks);
      backward(t64, dims, blocks);
      forward(t32, dims, blocks);
      backward(t32, dims, blocks);
      EXPECT_LT(norm_rel_err(download(t32.out), download(t64.out)), 1e-5);
      EXPECT_LT(norm_rel_err(download(t32.lse), download(t64.lse)), 1e-5);
      EXPECT_LT(norm_rel_err(download(t32.dq), download(t64.dq)), 1e-5);
      EXPECT_LT(norm_rel_err(download(t32.dk), download(t64.dk)), 1e-5);
      EXPECT_LT(norm_rel_err(download(t32.dv), download(t64.dv)), 1e-5);
    }
  }
}

TEST_F(AttentionTest, Bf16IsTheFloatResultRoundedOnce) {
  // bf16 storage is the f32 kernel with bf16 loads and stores (ops/attention.h): on inputs bf16
  // holds exactly, lse is the f32 run's bitwise and out, dq, dk, dv are the f32 run's rounded to
  // bf16 once — the two-pass bf16 backward included, as its passes repeat the one-pass loop's
  // products in its order. The f32 backward reads the bf16 run's out (widened), as the bf16
  // backward does. Shapes: groups 1, 2, 4; one query block and many; default, small and odd
  // blocks (key blocks cut at a query block's last position, rows not a multiple of the group).
  // NOTES: f32 reads k and v in place (rows nkv * d apart), bf16 from widened blocks (rows d
  // apart); equality relies on the GEMM's value for an element not depending on its operands'
  // leading dimensions or on M, true of OpenBLAS's packed kernels.
  struct Case {
    Dims dims;
    ops::AttentionBlocks blocks;
  };
  const Case cases[] = {
      {{2, 300, 4, 2, 16}, ops::kAttentionBlocks},  // 128 positions a block, 2 key blocks
      {{1, 600, 8, 2, 64}, ops::kAttentionBlocks},  // 64 positions a block, 3 key blocks
      {{2, 65, 4, 1, 8}, kSmallBlocks},
      {{1, 37, 4, 4, 24}, kOddBlocks},
      {{2, 13, 4, 2, 8}, ops::AttentionBlocks{8, 5}},
      // dv != dqk: DeepSeek-V3's 192 / 128 at the default blocks, small dims both ways
      {{1, 300, 8, 2, 192, 128}, ops::kAttentionBlocks},
      {{2, 65, 4, 1, 12, 8}, kSmallBlocks},
      {{1, 37, 4, 4, 16, 24}, kOddBlocks},
  };
  uint64_t seed = 70;
  for (const Case& c : cases) {
    const Dims& dims = c.dims;
    SCOPED_TRACE(::testing::Message()
                 << "B=" << dims.batch << " T=" << dims.seq << " nh=" << dims.heads
                 << " nkv=" << dims.kv_heads << " dqk=" << dims.dqk() << " dv=" << dims.dv()
                 << " blocks " << c.blocks.query_rows << "x" << c.blocks.keys);
    Inputs in = random_inputs(dims, seed++);
    for (std::vector<double>* x : {&in.q, &in.k, &in.v, &in.dout}) *x = rounded_to_bf16(*x);
    expect_bf16_is_f32_rounded_once(dims, in, c.blocks, /*window=*/0, {}, {});
  }
}

TEST_F(AttentionTest, FutureKeysDoNotChangeEarlierOutputs) {
  // Perturbing k and v at position s leaves out, lse and dq at t < s bitwise unchanged: masked
  // probabilities are exactly 0, never exp(-large). dv = dqk and dv != dqk.
  const int64_t s = 37;
  for (const Dims& dims : {Dims{2, 70, 4, 2, 8}, Dims{2, 70, 4, 2, 8, 12}})
    for (DType dtype : {DType::f64, DType::f32, DType::bf16})
      for (ops::AttentionBlocks blocks : {ops::kAttentionBlocks, kSmallBlocks}) {
        Inputs in = random_inputs(dims, 31);
        AttentionTensors t = allocate(dims, dtype);
        upload_inputs(t, in);
        forward(t, dims, blocks);
        backward(t, dims, blocks);
        const auto out = download(t.out), lse = download(t.lse), dq = download(t.dq);

        const int64_t k_row = dims.kv_heads * dims.dqk(), v_row = dims.kv_heads * dims.dv();
        for (int64_t b = 0; b < dims.batch; ++b) {
          for (int64_t i = 0; i < k_row; ++i) in.k[(b * dims.seq + s) * k_row + i] += 3.0;
          for (int64_t i = 0; i < v_row; ++i) in.v[(b * dims.seq + s) * v_row + i] -= 5.0;
        }
        upload_inputs(t, in);
        forward(t, dims, blocks);
        backward(t, dims, blocks);
        const auto out2 = download(t.out), lse2 = download(t.lse), dq2 = download(t.dq);

        const int64_t q_row = dims.heads * dims.dqk(), o_row = dims.heads * dims.dv();
        for (int64_t b = 0; b < dims.batch; ++b)
          for (int64_t pos = 0; pos < dims.seq; ++pos) {
            const auto first_q = static_cast<size_t>((b * dims.seq + pos) * q_row);
            const auto first_o = static_cast<size_t>((b * dims.seq + pos) * o_row);
            const bool same_out = std::equal(out.begin() + first_o, out.begin() + first_o + o_row,
                                             out2.begin() + first_o);
            const bool same_dq = std::equal(dq.begin() + first_q, dq.begin() + first_q + q_row,
                                            dq2.begin() + first_q);
            EXPECT_EQ(same_out, pos < s) << "out b=" << b << " t=" << pos;
            EXPECT_EQ(same_dq, pos < s) << "dq b=" << b << " t=" << pos;
            for (int64_t h = 0; h < dims.heads; ++h) {
              const size_t i = static_cast<size_t>((b * dims.heads + h) * dims.seq + pos);
              EXPECT_EQ(lse[i] == lse2[i], pos < s) << "lse b=" << b << " h=" << h << " t=" << pos;
            }
          }
      }
}

TEST_F(AttentionTest, RunsAreBitwiseIdentical) {
  for (const Dims& dims : {Dims{2, 300, 8, 2, 32}, Dims{2, 300, 8, 2, 48, 32}})
    for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
      const Inputs in = random_inputs(dims, 41);
      AttentionTensors t = allocate(dims, dtype);
      upload_inputs(t, in);
      std::vector<std::vector<char>> first;
      for (int run = 0; run < 2; ++run) {
        forward(t, dims, ops::kAttentionBlocks);
        backward(t, dims, ops::kAttentionBlocks);
        stream().synchronize();
        for (int i = 0; const OwnedTensor* r : {&t.out, &t.lse, &t.dq, &t.dk, &t.dv}) {
          const char* bytes = static_cast<const char*>(r->data());
          std::vector<char> copy(bytes, bytes + r->nbytes());
          if (run == 0) {
            first.push_back(std::move(copy));
          } else {
            EXPECT_TRUE(copy == first[i]) << "result " << i << " differs between runs";
          }
          ++i;
        }
      }
    }
}

TEST_F(AttentionTest, BadArgumentsThrowAtTheCall) {
  const Dims dims{2, 5, 4, 2, 8};
  AttentionTensors t = allocate(dims, DType::f64);
  const double scale = dims.scale();
  auto forward_throws = [&](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                            const Tensor& lse, double sc, const char* fragment) {
    try {
      ops::attention_forward_cpu(q, k, v, sc, {}, out, lse, stream());
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("attention_forward"), std::string::npos) << e.message();
      EXPECT_NE(e.message().find(fragment), std::string::npos) << e.message();
    }
  };
  // nh = 4 on nkv = 3 kv heads.
  OwnedTensor k3 =
      OwnedTensor::device(*backend_, Shape{2, 5, 3, 8}, DType::f64, LiveSet::workspace, "k3");
  forward_throws(t.q, k3, k3, t.out, t.lse, scale, "nkv = 3");
  // k with another sequence length, v unlike k, out unlike q, lse in (B, T, nh).
  OwnedTensor k_short =
      OwnedTensor::device(*backend_, Shape{2, 4, 2, 8}, DType::f64, LiveSet::workspace, "k_short");
  forward_throws(t.q, k_short, t.v, t.out, t.lse, scale, "f64(2, 4, 2, 8)");
  forward_throws(t.q, t.k, t.q, t.out, t.lse, scale, "v must be (B, T, nkv, dv)");
  forward_throws(t.q, t.k, t.v, t.dk, t.lse, scale, "out must be (B, T, nh, dv)");
  Tensor lse_wrong = t.lse.view().reshape(Shape{2, 5, 4});
  forward_throws(t.q, t.k, t.v, t.out, lse_wrong, scale, "lse must be (B, nh, T)");
  forward_throws(t.q.view().reshape(Shape{10, 4, 8}), t.k, t.v, t.out, t.lse, scale,
                 "q must be (B, T, nh, dqk)");
  forward_throws(t.q, t.k, t.v, t.out, t.lse, std::nan(""), "scale");
  // Mixed dtypes (bf16 q with f64 k; bf16 with an lse in bf16, not f32); an unsupported dtype.
  OwnedTensor v32 =
      OwnedTensor::device(*backend_, dims.v_shape(), DType::f32, LiveSet::workspace, "v32");
  forward_throws(t.q, t.k, v32, t.out, t.lse, scale, "f32(2, 5, 2, 8)");
  AttentionTensors t16 = allocate(dims, DType::bf16);
  forward_throws(t16.q, t.k, t.v, t.out, t.lse, scale, "bf16");
  OwnedTensor lse16 =
      OwnedTensor::device(*backend_, dims.lse_shape(), DType::bf16, LiveSet::workspace, "lse16");
  forward_throws(t16.q, t16.k, t16.v, t16.out, lse16, scale, "lse must be (B, nh, T) = f32");
  OwnedTensor q_int =
      OwnedTensor::device(*backend_, dims.q_shape(), DType::i32, LiveSet::workspace, "q_int");
  forward_throws(q_int, t.k, t.v, t.out, t.lse, scale, "supports f32, bf16 and f64");
  // Backward: dk of the query shape.
  try {
    ops::attention_backward_cpu(t.q, t.k, t.v, t.out, t.lse, t.dout, scale, {}, t.dq, t.dq, t.dv,
                                Tensor(), stream());
    ADD_FAILURE() << "no error for dk of the wrong shape";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("attention_backward: dk must be (B, T, nkv, dqk)"),
              std::string::npos)
        << e.message();
  }
  stream().synchronize();  // nothing was enqueued, nothing failed on the stream
}

TEST_F(AttentionTest, ValueHeadDimArgumentsAreChecked) {
  // dqk = 8, dv = 6: k must have q's dqk, v k's B, T and nkv (any dv), out, dout and dv the dv
  // width, dq and dk the dqk one; each mix-up names the tensor and the shape it must have.
  const Dims dims{2, 5, 4, 2, 8, 6};
  AttentionTensors t = allocate(dims, DType::f64);
  const double scale = dims.scale();
  auto expect_error = [](const auto& call, const char* fragment) {
    try {
      call();
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(e.message().find(fragment), std::string::npos) << e.message();
    }
  };
  auto forward_with = [&](const Tensor& k, const Tensor& v, const Tensor& out) {
    return
        [&, k, v, out] { ops::attention_forward_cpu(t.q, k, v, scale, {}, out, t.lse, stream()); };
  };
  auto backward_with = [&](const Tensor& dout, const Tensor& dq, const Tensor& dk,
                           const Tensor& dv) {
    return [&, dout, dq, dk, dv] {
      ops::attention_backward_cpu(t.q, t.k, t.v, t.out, t.lse, dout, scale, {}, dq, dk, dv,
                                  Tensor(), stream());
    };
  };
  expect_error(forward_with(t.v, t.v, t.out),
               "attention_forward: k must be (B, T, nkv, dqk) with B, T, dqk of q f64(2, 5, 4, 8)");
  expect_error(forward_with(t.k, t.out, t.out),
               "attention_forward: v must be (B, T, nkv, dv) with B, T, nkv of k f64(2, 5, 2, 8)");
  expect_error(
      forward_with(t.k, t.v, t.dq),
      "attention_forward: out must be (B, T, nh, dv) = f64(2, 5, 4, 6), got f64(2, 5, 4, 8)");
  expect_error(backward_with(t.dq, t.dq, t.dk, t.dv),
               "attention_backward: dout must be (B, T, nh, dv) = f64(2, 5, 4, 6)");
  expect_error(backward_with(t.dout, t.dout, t.dk, t.dv),
               "attention_backward: dq must be (B, T, nh, dqk) = f64(2, 5, 4, 8)");
  expect_error(backward_with(t.dout, t.dq, t.dv, t.dv),
               "attention_backward: dk must be (B, T, nkv, dqk) = f64(2, 5, 2, 8)");
  expect_error(backward_with(t.dout, t.dq, t.dk, t.dk),
               "attention_backward: dv must be (B, T, nkv, dv) = f64(2, 5, 2, 6)");
  stream().synchronize();  // nothing was enqueued, nothing failed on the stream
  // And the right ones pass.
  forward_with(t.k, t.v, t.out)();
  backward_with(t.dout, t.dq, t.dk, t.dv)();
  stream().synchronize();
}

// Forward + backward time in float32 at B=1, T=2048, nh=8, nkv=2, d=64, beside one large sgemm.
TEST_F(AttentionTest, DISABLED_SpeedFloat32) {
  using clock = std::chrono::steady_clock;
  const Dims dims{1, 2048, 8, 2, 64};
  const Inputs in = random_inputs(dims, 51);
  AttentionTensors t = allocate(dims, DType::f32);
  upload_inputs(t, in);
  auto seconds = [](clock::time_point since) {
    return std::chrono::duration<double>(clock::now() - since).count();
  };
  forward(t, dims, ops::kAttentionBlocks);  // warm-up: scratch, OpenBLAS threads
  backward(t, dims, ops::kAttentionBlocks);
  const int reps = 5;
  double fwd = 1e9, bwd = 1e9;
  for (int r = 0; r < reps; ++r) {
    auto start = clock::now();
    ops::attention_forward_cpu(t.q, t.k, t.v, dims.scale(), {}, t.out, t.lse, stream());
    stream().synchronize();
    fwd = std::min(fwd, seconds(start));
    start = clock::now();
    ops::attention_backward_cpu(t.q, t.k, t.v, t.out, t.lse, t.dout, dims.scale(), {}, t.dq, t.dk,
                                t.dv, Tensor(), stream());
    stream().synchronize();
    bwd = std::min(bwd, seconds(start));
  }
  const double fwd_flops =
      2.0 * 2.0 * dims.batch * dims.heads * dims.seq * dims.seq * dims.head_dim / 2.0;
  const double bwd_flops = 2.5 * fwd_flops;

  const int n = 2048;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n,
              0.f, c.data(), n);
  double gemm = 1e9;
  for (int r = 0; r < 3; ++r) {
    auto start = clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n,
                0.f, c.data(), n);
    gemm = std::min(gemm, seconds(start));
  }
  const double gemm_gflops = 2.0 * n * n * n / gemm / 1e9;
  std::printf("attention f32 B=1 T=2048 nh=8 nkv=2 d=64 (best of %d)\n", reps);
  std::printf("  forward   %7.1f ms  %6.1f GFLOP/s\n", fwd * 1e3, fwd_flops / fwd / 1e9);
  std::printf("  backward  %7.1f ms  %6.1f GFLOP/s\n", bwd * 1e3, bwd_flops / bwd / 1e9);
  std::printf("  fwd+bwd   %7.1f ms  %6.1f GFLOP/s\n", (fwd + bwd) * 1e3,
              (fwd_flops + bwd_flops) / (fwd + bwd) / 1e9);
  std::printf("  sgemm %d^3: %6.1f GFLOP/s (fwd+bwd at %.0f%%)\n", n, gemm_gflops,
              100.0 * (fwd_flops + bwd_flops) / (fwd + bwd) / 1e9 / gemm_gflops);
}

}  // namespace
}  // namespace moepeak
