// test_backend_ops cases: matmul c (=|+=) a b (ops/matmul.h; the CUDA side is cuBLASLt,
// ops/cuda/matmul.cpp).
//   build/tests/ops/test_backend_ops --gtest_filter='*matmul*'
//   MOEPEAK_BACKEND_OPS=cpu build/tests/ops/test_backend_ops --gtest_filter='*matmul*'
//
// Shapes (M, K, N): a (M, K), b (K, N), c (M, N), written and accumulated. K == 0 writes zeros
// over the NaN-poisoned c (or leaves c with accumulate); M == 0 and N == 0 do nothing. bf16 keeps
// the default 1e-2 (inputs exact in bf16, fp32 accumulation, one rounding to bf16).
#include <string>
#include <vector>

#include "ops/matmul.h"
#include "tests/ops/backend_ops/harness.h"

namespace moepeak::testing::backend_ops {

MOEPEAK_BACKEND_OPS_CASES(matmul) {
  std::vector<OpCase> cases;
  struct Mkn {
    int64_t m, k, n;
  };
  for (const Mkn& s : std::vector<Mkn>{
           {37, 96, 50}, {1, 1, 1}, {0, 64, 32}, {130, 257, 65}, {37, 0, 50}, {5, 3, 0}}) {
    for (bool acc : {false, true}) {
      cases.push_back(OpCase{"matmul M=" + std::to_string(s.m) + " K=" + std::to_string(s.k) +
                                 " N=" + std::to_string(s.n) + (acc ? " accumulate" : ""),
                             {in("a", {s.m, s.k}), in("b", {s.k, s.n}),
                              acc ? inout("c", {s.m, s.n}) : out("c", {s.m, s.n})},
                             [acc](const std::vector<Tensor>& t, Stream& st) {
                               ops::matmul(t[0], t[1], t[2], acc, st);
                             }});
    }
  }
  return cases;
}

}  // namespace moepeak::testing::backend_ops
