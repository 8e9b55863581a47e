// test_backend_ops cases: cross_entropy forward and backward (ops/cross_entropy.h).
//
// Labels mix the ignore label -100 (about one in four, and one case of only ignored rows) with
// ids in [0, V). Logits are normal, or uniform in [-30, 30) for the max-subtracted log-sum-exp's
// stability. V = 1 (the gradient is exactly 0), V from a part of a warp to 5000 (one block per
// row walking many columns), N = 0. The backward also runs in place (dlogits = logits, passed
// twice as one inout tensor).
//
// On CUDA a label outside [0, V) other than -100 gives a NaN loss and a NaN gradient row instead
// of the CPU's throw; the harness compares finite values only, so the "bad labels" case checks
// that rule inside its run on the GPU (temporaries, read back, EXPECTs) before running the ops
// on the valid labels the comparison uses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/runtime/backend.h"
#include "ops/cross_entropy.h"
#include "ops/op_common.h"
#include "tests/ops/backend_ops/harness.h"

namespace moepeak::testing::backend_ops {

namespace {

// Labels uniform in [0, vocab), each -100 with probability `ignored`.
Generator labels(int64_t vocab, double ignored) {
  return [vocab, ignored](std::mt19937_64& rng, int64_t n) {
    std::uniform_int_distribution<int64_t> id(0, vocab - 1);
    std::bernoulli_distribution skip(ignored);
    std::vector<double> v(static_cast<size_t>(n));
    for (auto& x : v) x = skip(rng) ? double(ops::kIgnoreLabel) : double(id(rng));
    return v;
  };
}

// A float tensor's elements on the host (f32, bf16 or f64 storage).
std::vector<double> read_floats(const Tensor& t, Stream& stream) {
  std::vector<char> bytes = copy_to_host(t, *t.backend(), stream);
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    const char* p = bytes.data() + i * dtype_size(t.dtype());
    if (t.dtype() == DType::bf16) {
      uint16_t b;
      std::memcpy(&b, p, 2);
      v[i] = bf16::to_float(b);
    } else if (t.dtype() == DType::f32) {
      float f;
      std::memcpy(&f, p, 4);
      v[i] = f;
    } else {
      std::memcpy(&v[i], p, 8);
    }
  }
  return v;
}

// On CUDA: labels V and -2 in rows 0 and 1 (the others as given) give NaN losses and NaN
// gradient rows there, finite values elsewhere, and no fault.
void expect_bad_labels_give_nan(const Tensor& logits, const Tensor& labels, Stream& stream) {
  Backend& backend = *logits.backend();
  const int64_t tokens = logits.size(0), vocab = logits.size(1);
  std::vector<char> label_bytes = copy_to_host(labels, backend, stream);
  std::vector<int64_t> bad(static_cast<size_t>(tokens));
  std::memcpy(bad.data(), label_bytes.data(), bad.size() * sizeof(int64_t));
  bad[0] = vocab;
  bad[1] = -2;
  OwnedTensor bad_labels =
      OwnedTensor::device(backend, labels.shape(), DType::i64, LiveSet::workspace, "bad labels");
  OwnedTensor losses =
      OwnedTensor::device(backend, {tokens}, logits.dtype(), LiveSet::workspace, "losses");
  OwnedTensor dlogits =
      OwnedTensor::device(backend, logits.shape(), logits.dtype(), LiveSet::workspace, "dlogits");
  backend.copy_async(bad_labels.data(), bad.data(), bad.size() * sizeof(int64_t),
                     CopyKind::host_to_device, stream);
  ops::cross_entropy_forward(logits, bad_labels, losses, stream);
  ops::cross_entropy_backward(logits, bad_labels, 0.5, dlogits, stream);
  std::vector<double> loss = read_floats(losses, stream);
  std::vector<double> grad = read_floats(dlogits, stream);
  for (int64_t n = 0; n < tokens; ++n) {
    const bool nan_row = n < 2;
    EXPECT_EQ(std::isnan(loss[n]), nan_row) << "loss[" << n << "] = " << loss[n];
    for (int64_t v = 0; v < vocab; ++v) {
      double g = grad[n * vocab + v];
      EXPECT_EQ(std::isnan(g), nan_row) << "dlogits[" << n << ", " << v << "] = " << g;
      if (std::isnan(g) != nan_row) return;  // one message per case is enough
    }
  }
}

}  // namespace

MOEPEAK_BACKEND_OPS_CASES(cross_entropy) {
  std::vector<OpCase> cases;
  struct XentShape {
    std::string name;
    int64_t n, v;
    Generator logits;
    double ignored = 0.25;
  };
  const std::vector<XentShape> shapes{
      {"", 37, 100, normal(3.0)},
      {"", 8, 5000, normal(2.0)},
      {"", 5, 1, normal()},
      {"", 300, 20, normal()},
      {"", 0, 10, normal()},
      {" large", 16, 777, uniform(-30, 30)},
      {" large", 3, 4097, uniform(-30, 30)},
      {" all ignored", 6, 50, normal(), 1.0},
  };
  for (const auto& sh : shapes) {
    const int64_t n = sh.n, v = sh.v;
    std::string shape = sh.name + " N=" + std::to_string(n) + " V=" + std::to_string(v);
    cases.push_back(
        OpCase{"cross_entropy_forward" + shape,
               {in("logits", {n, v}, Kind::floating, sh.logits),
                in("labels", {n}, Kind::i64, labels(v, sh.ignored)), out("losses", {n})},
               [](const std::vector<Tensor>& t, Stream& s) {
                 ops::cross_entropy_forward(t[0], t[1], t[2], s);
               }});
    cases.push_back(
        OpCase{"cross_entropy_backward" + shape,
               {in("logits", {n, v}, Kind::floating, sh.logits),
                in("labels", {n}, Kind::i64, labels(v, sh.ignored)), out("dlogits", {n, v})},
               [](const std::vector<Tensor>& t, Stream& s) {
                 ops::cross_entropy_backward(t[0], t[1], 0.37, t[2], s);
               }});
    cases.push_back(OpCase{"cross_entropy_backward in place" + shape,
                           {inout("logits", {n, v}, Kind::floating, sh.logits),
                            in("labels", {n}, Kind::i64, labels(v, sh.ignored))},
                           [](const std::vector<Tensor>& t, Stream& s) {
                             ops::cross_entropy_backward(t[0], t[1], 1.0 / 7, t[0], s);
                           }});
  }

  // Bad labels on CUDA: NaN rows (checked in the run), then the compared ops on valid labels.
  for (int64_t v : {40, 3000}) {
    cases.push_back(OpCase{
        "cross_entropy bad labels N=9 V=" + std::to_string(v),
        {in("logits", {9, v}, Kind::floating, normal(2.0)),
         in("labels", {9}, Kind::i64, labels(v, 0.25)), out("losses", {9}), out("dlogits", {9, v})},
        [](const std::vector<Tensor>& t, Stream& s) {
          if (ops::runs_on_cuda(t[2])) expect_bad_labels_give_nan(t[0], t[1], s);
          ops::cross_entropy_forward(t[0], t[1], t[2], s);
          ops::cross_entropy_backward(t[0], t[1], 0.25, t[3], s);
        }});
  }
  return cases;
}

}  // namespace moepeak::testing::backend_ops
