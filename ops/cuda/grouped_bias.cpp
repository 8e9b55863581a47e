// CUDA grouped bias ops (see ops/grouped_bias.h): the loop over the non-empty groups of the CUDA
// bias ops (ops/cuda/bias.cu), one launch each on the group's rows, so every result is bitwise
// the per-expert calls'. Host code (C++20: std::span), like ops/cuda/grouped_linear.cpp.
// Test: ctest -L cuda -R test_backend_ops (cases in tests/ops/backend_ops/cases_bias.cpp).
#include "ops/grouped_bias.h"
#include "ops/bias.h"

namespace moepeak::ops {

void grouped_bias_broadcast_cuda(std::span<const Tensor> biases, std::span<const int64_t> offsets,
                                 const Tensor& y, Stream& stream) {
  check_grouped_bias_broadcast_args("grouped_bias_broadcast_cuda", biases, offsets, y);
  for (size_t g = 0; g < biases.size(); ++g) {
    if (offsets[g] == offsets[g + 1]) continue;
    bias_broadcast_cuda(biases[g], y.rows(offsets[g], offsets[g + 1]), stream);
  }
}

void grouped_bias_backward_cuda(const Tensor& dy, std::span<const int64_t> offsets,
                                std::span<const Tensor> dbiases, Stream& stream) {
  check_grouped_bias_backward_args("grouped_bias_backward_cuda", dy, offsets, dbiases);
  for (size_t g = 0; g < dbiases.size(); ++g) {
    if (offsets[g] == offsets[g + 1] || !dbiases[g].defined()) continue;
    bias_backward_cuda(dy.rows(offsets[g], offsets[g + 1]), dbiases[g], stream);
  }
}

}  // namespace moepeak::ops
