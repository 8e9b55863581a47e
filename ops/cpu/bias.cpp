// CPU bias ops (see ops/bias.h and ops/grouped_bias.h): the broadcast copies the bias into every
// row (widening bf16 to an f32 y exactly); the backward sums each column over rows in increasing
// m in double and adds the total to dbias once. The grouped forms are the loop over the
// non-empty groups of those two. Also the argument checks both backends share.
#include <string>
#include <type_traits>
#include <vector>

#include "core/runtime/cpu_stream.h"
#include "ops/bias.h"
#include "ops/cpu/cpu_storage.h"
#include "ops/grouped_bias.h"

namespace moepeak::ops {
namespace {

bool is_float_storage(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f64; }

// The dtype of an output that may be an fp32 accumulator beside bf16 `storage`: f32 when both
// hold, else `storage` (so a mismatch is reported against the storage dtype).
DType storage_or_f32(DType storage, DType out) {
  return storage == DType::bf16 && out == DType::f32 ? DType::f32 : storage;
}

std::string group_label(const char* op, size_t g) {
  return std::string(op) + ": group " + std::to_string(g);
}

// offsets: G + 1 non-decreasing row offsets from 0 to `rows`.
void check_offsets(const char* op, size_t groups, std::span<const int64_t> offsets, int64_t rows,
                   const char* tensor) {
  MOEPEAK_CHECK(offsets.size() == groups + 1, op, ": ", groups, " groups need ", groups + 1,
                " row offsets, got ", offsets.size());
  MOEPEAK_CHECK(offsets[0] == 0, op, ": offsets[0] must be 0, got ", offsets[0]);
  for (size_t g = 0; g < groups; ++g) {
    MOEPEAK_CHECK(offsets[g + 1] >= offsets[g], group_label(op, g), ": rows [", offsets[g], ", ",
                  offsets[g + 1], ") end before they begin (offsets must not decrease)");
  }
  MOEPEAK_CHECK(offsets[groups] == rows, op, ": offsets[", groups, "] = ", offsets[groups],
                " must be the rows of ", tensor, " (", rows, ")");
}

}  // namespace

void check_bias_broadcast_args(const char* op, const Tensor& bias, const Tensor& y) {
  MOEPEAK_CHECK(bias.ndim() == 1 && is_float_storage(bias.dtype()), op,
                ": bias must be f32, bf16 or f64 (N), got ", bias.str());
  MOEPEAK_CHECK(y.ndim() == 2, op, ": y must be (M, N), got ", y.str());
  y.expect(Shape{y.size(0), bias.size(0)}, storage_or_f32(bias.dtype(), y.dtype()),
           std::string(op) + ": y (bias's dtype, or f32 for a bf16 bias)");
}

void check_bias_backward_args(const char* op, const Tensor& dy, const Tensor& dbias) {
  MOEPEAK_CHECK(dy.ndim() == 2 && is_float_storage(dy.dtype()), op,
                ": dy must be f32, bf16 or f64 (M, N), got ", dy.str());
  dbias.expect(Shape{dy.size(1)}, storage_or_f32(dy.dtype(), dbias.dtype()),
               std::string(op) + ": dbias (dy's dtype, or f32 for bf16 dy)");
}

void check_grouped_bias_broadcast_args(const char* op, std::span<const Tensor> biases,
                                       std::span<const int64_t> offsets, const Tensor& y) {
  MOEPEAK_CHECK(!biases.empty(), op, ": needs at least one group (one bias), got none");
  MOEPEAK_CHECK(y.ndim() == 2, op, ": y must be (M, N), got ", y.str());
  check_offsets(op, biases.size(), offsets, y.size(0), "y");
  for (size_t g = 0; g < biases.size(); ++g) {
    MOEPEAK_CHECK(biases[g].ndim() == 1 && biases[g].dtype() == biases[0].dtype(),
                  group_label(op, g), ": bias must be ", dtype_name(biases[0].dtype()),
                  " (N) like group 0's, got ", biases[g].str());
    check_bias_broadcast_args(group_label(op, g).c_str(), biases[g], y);
  }
}

void check_grouped_bias_backward_args(const char* op, const Tensor& dy,
                                      std::span<const int64_t> offsets,
                                      std::span<const Tensor> dbiases) {
  MOEPEAK_CHECK(!dbiases.empty(), op, ": needs at least one group (one dbias entry), got none");
  MOEPEAK_CHECK(dy.ndim() == 2 && is_float_storage(dy.dtype()), op,
                ": dy must be f32, bf16 or f64 (M, N), got ", dy.str());
  check_offsets(op, dbiases.size(), offsets, dy.size(0), "dy");
  for (size_t g = 0; g < dbiases.size(); ++g) {
    if (dbiases[g].defined()) check_bias_backward_args(group_label(op, g).c_str(), dy, dbiases[g]);
  }
}

void bias_broadcast_cpu(const Tensor& bias, const Tensor& y, Stream& stream) {
  const char* op = "bias_broadcast_cpu";
  check_bias_broadcast_args(op, bias, y);
  const int64_t rows = y.size(0), cols = y.size(1);
  dispatch_storage(bias.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* bp = bias.data_as<T>();  // (N)
    // y in bias's dtype, or f32 beside a bf16 bias (checked above).
    with_accumulator<T>(y.dtype(), [&](auto y_zero) {
      using Y = decltype(y_zero);
      Y* yp = y.data_as<Y>();  // (M, N)
      as_cpu_stream(stream).enqueue([=] {
        for (int64_t m = 0; m < rows; ++m) {
          Y* yr = yp + m * cols;
          // load/store: exact (bf16 -> fp32 -> bf16 or f32; f32 and f64 unchanged).
          for (int64_t n = 0; n < cols; ++n) store(yr + n, load(bp[n]));
        }
      });
    });
  });
}

void bias_backward_cpu(const Tensor& dy, const Tensor& dbias, Stream& stream) {
  const char* op = "bias_backward_cpu";
  check_bias_backward_args(op, dy, dbias);
  const int64_t rows = dy.size(0), cols = dy.size(1);
  if (rows == 0) return;  // dbias unchanged (ops/bias.h)
  dispatch_storage(dy.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* dyp = dy.data_as<T>();  // (M, N)
    // dbias in dy's dtype, or the fp32 main gradient beside bf16 (checked above).
    with_accumulator<T>(dbias.dtype(), [&](auto db_zero) {
      using DB = decltype(db_zero);
      DB* dbp = dbias.data_as<DB>();  // (N)
      as_cpu_stream(stream).enqueue([=] {
        // One double per column: scratch of the layer's width, not of the token count.
        thread_local std::vector<double> col_sum;
        col_sum.assign(static_cast<size_t>(cols), 0.0);
        for (int64_t m = 0; m < rows; ++m) {
          const T* dyr = dyp + m * cols;
          for (int64_t n = 0; n < cols; ++n) col_sum[n] += load(dyr[n]);
        }
        // Rounded to dbias's compute type, added in it, stored (one bf16 rounding) once.
        for (int64_t n = 0; n < cols; ++n) {
          store(dbp + n, load(dbp[n]) + static_cast<compute_t<DB>>(col_sum[n]));
        }
      });
    });
  });
}

void grouped_bias_broadcast_cpu(std::span<const Tensor> biases, std::span<const int64_t> offsets,
                                const Tensor& y, Stream& stream) {
  const char* op = "grouped_bias_broadcast_cpu";
  check_grouped_bias_broadcast_args(op, biases, offsets, y);
  for (size_t g = 0; g < biases.size(); ++g) {
    if (offsets[g] == offsets[g + 1]) continue;
    bias_broadcast_cpu(biases[g], y.rows(offsets[g], offsets[g + 1]), stream);
  }
}

void grouped_bias_backward_cpu(const Tensor& dy, std::span<const int64_t> offsets,
                               std::span<const Tensor> dbiases, Stream& stream) {
  const char* op = "grouped_bias_backward_cpu";
  check_grouped_bias_backward_args(op, dy, offsets, dbiases);
  for (size_t g = 0; g < dbiases.size(); ++g) {
    if (offsets[g] == offsets[g + 1] || !dbiases[g].defined()) continue;
    bias_backward_cpu(dy.rows(offsets[g], offsets[g + 1]), dbiases[g], stream);
  }
}

}  // namespace moepeak::ops
