// CPU cross-entropy on materialised (N, V) logits: per row, the max and the log-sum-exp, then the
// loss (forward) or the softmax minus the one-hot label (backward, in place allowed); see
// ops/cross_entropy.h. Storage f32, bf16 or f64 (ops/cpu/cpu_storage.h).
//
// Two paths, chosen per storage type and CPU:
//   f64, or no AVX2: each logit read into double (exact for every storage), std::exp, the sum,
//     log-sum-exp, loss and gradient in double, each result rounded once to the storage (a bf16
//     twice: to fp32, then to bf16, as CUDA's store_from).
//   f32 and bf16 with AVX2 + FMA, 8 logits at a time: e^(x - max) in fp32 (ops/cpu/simd_exp.h,
//     within 1.5 ulp; x - max is rounded once), summed in double (4 double accumulators per half
//     vector, reduced in a fixed order), log-sum-exp and loss in double; the gradient
//     scale * (e^(x - max) / sum - onehot) in fp32. The loss is within about 1e-7 of the double
//     path's (each exponential's error is relative, so the sum's is too), a gradient element within
//     a few fp32 ulp. Each row is the same whatever rows run beside it (the threads split rows).
#include "ops/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "core/runtime/cpu_stream.h"
#include "ops/cpu/cpu_storage.h"
#include "ops/cpu/parallel_ranges.h"
#include "ops/cpu/simd_exp.h"
#include "ops/cpu/simd_lanes.h"

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

// Storage whose compute type is fp32 (f32, bf16): its rows run in AVX2 lanes where the CPU can.
template <typename T>
constexpr bool kFp32Compute = std::is_same_v<compute_t<T>, float>;

#if defined(__x86_64__)

// A row's max (fp32, exact) and sum of e^(x - max) (double).
struct RowStats {
  float max;
  double sum;
};

template <typename T>
MOEPEAK_AVX2_FMA RowStats row_stats_avx2(const T* row, int64_t vocab) {
  const float minus_inf = -std::numeric_limits<float>::infinity();
  __m256 best = _mm256_set1_ps(minus_inf);
  for (int64_t v = 0; v < vocab; v += 8)
    best = _mm256_max_ps(best, load8(row + v, vocab - v, minus_inf));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, best);
  float row_max = lanes[0];
  for (int l = 1; l < 8; ++l) row_max = std::max(row_max, lanes[l]);
  // NOTES: a NaN logit is lost by the max (max_ps keeps the other operand) but not by the sum:
  // e^(NaN - max) is NaN, so the loss and the gradient row come out NaN, as on the double path.
  const __m256 shift = _mm256_set1_ps(row_max);
  __m256d low = _mm256_setzero_pd(), high = _mm256_setzero_pd();
  for (int64_t v = 0; v < vocab; v += 8) {
    // Padded lanes are -inf: e^-inf = 0 adds nothing.
    const __m256 e = exp_avx2(_mm256_sub_ps(load8(row + v, vocab - v, minus_inf), shift));
    low = _mm256_add_pd(low, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    high = _mm256_add_pd(high, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double sums[8];
  _mm256_store_pd(sums, low);
  _mm256_store_pd(sums + 4, high);
  const double sum =
      ((sums[0] + sums[4]) + (sums[1] + sums[5])) + ((sums[2] + sums[6]) + (sums[3] + sums[7]));
  return {row_max, sum};
}

template <typename T>
MOEPEAK_AVX2_FMA double log_sum_exp_avx2(const T* row, int64_t vocab) {
  const RowStats stats = row_stats_avx2(row, vocab);
  return static_cast<double>(stats.max) + std::log(stats.sum);
}

// drow = scale * (softmax(row) - onehot(label)); drow may be row itself (each vector is read
// before it is written).
template <typename T>
MOEPEAK_AVX2_FMA void softmax_gradient_avx2(const T* row, int64_t vocab, int64_t label,
                                            double scale, T* drow) {
  const RowStats stats = row_stats_avx2(row, vocab);
  const __m256 shift = _mm256_set1_ps(stats.max);
  const __m256 inverse_sum = _mm256_set1_ps(static_cast<float>(1.0 / stats.sum));
  const __m256 scale_v = _mm256_set1_ps(static_cast<float>(scale));
  const __m256 lane_index = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t v = 0; v < vocab; v += 8) {
    const int64_t n = vocab - v;
    const __m256 e = exp_avx2(_mm256_sub_ps(load8(row + v, n, 0.0f), shift));
    // onehot: 1 in the lane holding the label (label - v is exact in fp32 below 2^24).
    const __m256 onehot = _mm256_and_ps(
        _mm256_cmp_ps(lane_index, _mm256_set1_ps(static_cast<float>(label - v)), _CMP_EQ_OQ),
        _mm256_set1_ps(1.0f));
    const __m256 d = _mm256_mul_ps(scale_v, _mm256_sub_ps(_mm256_mul_ps(e, inverse_sum), onehot));
    store8(drow + v, n, d);
  }
}

#endif  // __x86_64__

// The row's log-sum-exp on the path of this storage and CPU.
template <typename T>
double row_log_sum_exp(const T* row, int64_t vocab) {
#if defined(__x86_64__)
  if constexpr (kFp32Compute<T>) {
    if (cpu_has_avx2_fma()) return log_sum_exp_avx2(row, vocab);
  }
#endif
  return log_sum_exp(row, vocab);
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
          store(loss + n, static_cast<C>(row_log_sum_exp(row, vocab) - logit(row, label[n])));
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
#if defined(__x86_64__)
          if constexpr (kFp32Compute<T>) {
            if (cpu_has_avx2_fma()) {
              softmax_gradient_avx2(row, vocab, label[n], scale, drow);
              continue;
            }
          }
#endif
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
