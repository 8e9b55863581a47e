// CPU cross-entropy on materialised (N, V) logits: per row, max and log-sum-exp in double, then
// the loss (forward) or the softmax minus the one-hot label (backward, in place allowed); see
// ops/cross_entropy.h. Storage f32, bf16 or f64 (ops/cpu/cpu_storage.h): a bf16 logit is read
// exactly into double where it lies, and each result is rounded from double as the f32 path rounds
// it, then once more to bf16 (store(), as CUDA's store_from).
#include "ops/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/runtime/cpu_stream.h"
#include "ops/cpu/cpu_storage.h"
#include "ops/cpu/parallel_ranges.h"

namespace moepeak::ops {
namespace {

// logits: (N, V) float; labels: (N) i64.
void check_logits_and_labels(const char* op, const Tensor& logits, const Tensor& labels) {
  MOEPEAK_CHECK(logits.ndim() == 2 && logits.size(1) > 0, op,
                ": logits must be (N, V) with V > 0, got ", logits.str());
  MOEPEAK_CHECK(
      labels.ndim() == 1 && labels.dtype() == DType::i64 && labels.size(0) == logits.size(0), op,
      ": labels must be i64 (", logits.size(0), "), got ", labels.str());
}

// Throws unless the label is -100 or in [0, vocab).
void check_label(const char* op, int64_t position, int64_t label, int64_t vocab) {
  if (label != kIgnoreLabel && (label < 0 || label >= vocab)) {
    MOEPEAK_THROW(op, ": label ", label, " at position ", position, " is outside [0, ", vocab,
                  ") and is not the ignore label ", kIgnoreLabel);
  }
}

// Rows per parallel range: at least 2^16 logits each (V = 4096: 16 rows).
int64_t rows_per_task(int64_t vocab) { return std::max<int64_t>(1, (int64_t{1} << 16) / vocab); }

// One stored logit in double (exact for every storage type).
template <typename T>
double logit(const T* row, int64_t v) {
  return static_cast<double>(load(row[v]));
}

// log(sum_v exp(row[v])) with the row max subtracted, accumulated in double.
template <typename T>
double log_sum_exp(const T* row, int64_t vocab) {
  double row_max = logit(row, 0);
  for (int64_t v = 1; v < vocab; ++v) row_max = std::max(row_max, logit(row, v));
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(logit(row, v) - row_max);
  return row_max + std::log(sum);
}

}  // namespace

void check_cross_entropy_forward_args(const char* op, const Tensor& logits, const Tensor& labels,
                                      const Tensor& losses) {
  check_logits_and_labels(op, logits, labels);
  losses.expect(Shape{logits.size(0)}, logits.dtype(), std::string(op) + ": losses");
}

void check_cross_entropy_backward_args(const char* op, const Tensor& logits, const Tensor& labels,
                                       const Tensor& dlogits) {
  check_logits_and_labels(op, logits, labels);
  dlogits.expect(logits.shape(), logits.dtype(), std::string(op) + ": dlogits");
}

void cross_entropy_forward_cpu(const Tensor& logits, const Tensor& labels, const Tensor& losses,
                               Stream& stream) {
  const char* op = "cross_entropy_forward_cpu";
  check_cross_entropy_forward_args(op, logits, labels, losses);
  dispatch_storage(logits.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    using C = compute_t<T>;
    const T* lp = logits.data_as<T>();                 // (N, V)
    const int64_t* label = labels.data_as<int64_t>();  // (N)
    T* loss = losses.data_as<T>();                     // (N)
    int64_t tokens = logits.size(0), vocab = logits.size(1);
    as_cpu_stream(stream).enqueue([=] {
      for (int64_t n = 0; n < tokens; ++n) check_label(op, n, label[n], vocab);
      parallel_ranges(tokens, rows_per_task(vocab), [=](int64_t begin, int64_t end) {
        for (int64_t n = begin; n < end; ++n) {
          if (label[n] == kIgnoreLabel) {
            store(loss + n, C(0));
            continue;
          }
          const T* row = lp + n * vocab;
          store(loss + n, static_cast<C>(log_sum_exp(row, vocab) - logit(row, label[n])));
        }
      });
    });
  });
}

void cross_entropy_backward_cpu(const Tensor& logits, const Tensor& labels, double scale,
                                const Tensor& dlogits, Stream& stream) {
  const char* op = "cross_entropy_backward_cpu";
  check_cross_entropy_backward_args(op, logits, labels, dlogits);
  dispatch_storage(logits.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    using C = compute_t<T>;
    const T* lp = logits.data_as<T>();                 // (N, V), may be dlogits itself
    const int64_t* label = labels.data_as<int64_t>();  // (N)
    T* dlp = dlogits.data_as<T>();                     // (N, V)
    int64_t tokens = logits.size(0), vocab = logits.size(1);
    as_cpu_stream(stream).enqueue([=] {
      for (int64_t n = 0; n < tokens; ++n) check_label(op, n, label[n], vocab);
      parallel_ranges(tokens, rows_per_task(vocab), [=](int64_t begin, int64_t end) {
        for (int64_t n = begin; n < end; ++n) {
          T* drow = dlp + n * vocab;
          if (label[n] == kIgnoreLabel) {
            for (int64_t v = 0; v < vocab; ++v) store(drow + v, C(0));
            continue;
          }
          const T* row = lp + n * vocab;
          double lse = log_sum_exp(row, vocab);  // before the row is overwritten when in place
          for (int64_t v = 0; v < vocab; ++v) {
            double softmax = std::exp(logit(row, v) - lse);
            double onehot = v == label[n] ? 1.0 : 0.0;
            store(drow + v, static_cast<C>(scale * (softmax - onehot)));
          }
        }
      });
    });
  });
}

}  // namespace moepeak::ops
