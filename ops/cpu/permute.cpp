// CPU gather / scatter-add / weighted combine of rows by an i32 index (see ops/permute.h).
// f32 | bf16 | f64 storage (ops/cpu/cpu_storage.h). f32 and f64 add each routed row into its
// destination in increasing i. bf16 (fp32 arithmetic) follows the CUDA kernel's rule with one
// block owning every destination row: a run of consecutive positions within one chunk of
// kScatterChunk that land on one row is summed in fp32 and stored (rounded to bf16) once.
#include "ops/permute.h"

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "core/runtime/cpu_stream.h"
#include "ops/cpu/cpu_storage.h"

namespace moepeak::ops {
namespace {

// The CUDA scatter's chunk of index positions (its block size, cuda::kThreads): a run of
// consecutive hits on one row never spans two chunks (ops/permute.h).
constexpr int64_t kScatterChunk = 256;

// dst[index[i]] += (weight[i] *) src[i] with bf16 storage and fp32 arithmetic, in increasing i:
// each run [i, end) of consecutive positions on one row inside one chunk is added to the row in
// fp32 scratch (a row of H) and stored once, as the CUDA kernel does for a block that owns every
// row. The additions (acc + w * y, unfused) are those of the f32 path.
void scatter_rows_bf16(const bf16* src, const int32_t* index, const bf16* weight, bf16* dst,
                       int64_t routed, int64_t hidden) {
  thread_local std::vector<float> acc;
  acc.resize(static_cast<size_t>(hidden));
  for (int64_t i = 0; i < routed;) {
    const int32_t row = index[i];
    const int64_t chunk_end = std::min(routed, (i / kScatterChunk + 1) * kScatterChunk);
    int64_t end = i + 1;
    while (end < chunk_end && index[end] == row) ++end;
    bf16* to = dst + static_cast<int64_t>(row) * hidden;
    widen(to, acc.data(), hidden);
    for (int64_t j = i; j < end; ++j) {
      const bf16* from = src + j * hidden;
      if (weight != nullptr) {
        const float w = load(weight[j]);
        for (int64_t h = 0; h < hidden; ++h) acc[h] += w * load(from[h]);
      } else {
        for (int64_t h = 0; h < hidden; ++h) acc[h] += load(from[h]);
      }
    }
    narrow(acc.data(), to, hidden);
    i = end;
  }
}

// The token-side tensor is (N, H) and the routed side (M, H) with index (M) i32, one float dtype.
void check_rows_args(const char* op, const Tensor& tokens, const char* tokens_name,
                     const Tensor& routed, const char* routed_name, const Tensor& index) {
  MOEPEAK_CHECK(tokens.ndim() == 2, op, ": ", tokens_name, " must be (N, H), got ", tokens.str());
  MOEPEAK_CHECK(index.ndim() == 1 && index.dtype() == DType::i32, op,
                ": index must be i32 (M), got ", index.str());
  routed.expect(Shape{index.size(0), tokens.size(1)}, tokens.dtype(),
                std::string(op) + ": " + routed_name);
}

// Throws naming the op, the position and the index unless every index is in [0, rows).
void check_indices(const char* op, const int32_t* index, int64_t count, int64_t rows) {
  for (int64_t i = 0; i < count; ++i) {
    if (index[i] < 0 || index[i] >= rows) {
      MOEPEAK_THROW(op, ": index ", index[i], " at position ", i, " is outside [0, ", rows, ")");
    }
  }
}

}  // namespace

void check_gather_rows_args(const char* op, const Tensor& src, const Tensor& index,
                            const Tensor& dst) {
  check_rows_args(op, src, "src", dst, "dst", index);
}

void check_scatter_add_rows_args(const char* op, const Tensor& src, const Tensor& index,
                                 const Tensor& dst) {
  check_rows_args(op, dst, "dst", src, "src", index);
}

void check_combine_rows_args(const char* op, const Tensor& y, const Tensor& index,
                             const Tensor& weight, const Tensor& out) {
  check_rows_args(op, out, "out", y, "y", index);
  weight.expect(index.shape(), out.dtype(), std::string(op) + ": weight");
}

void check_combine_rows_backward_args(const char* op, const Tensor& dout, const Tensor& y,
                                      const Tensor& index, const Tensor& weight, const Tensor& dy,
                                      const Tensor& dweight) {
  check_rows_args(op, dout, "dout", y, "y", index);
  weight.expect(index.shape(), dout.dtype(), std::string(op) + ": weight");
  dy.expect(y.shape(), dout.dtype(), std::string(op) + ": dy");
  dweight.expect(index.shape(), dout.dtype(), std::string(op) + ": dweight");
}

void gather_rows_cpu(const Tensor& src, const Tensor& index, const Tensor& dst, Stream& stream) {
  const char* op = "gather_rows_cpu";
  check_gather_rows_args(op, src, index, dst);
  dispatch_storage(src.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* sp = src.data_as<T>();                // (N, H)
    const int32_t* ip = index.data_as<int32_t>();  // (M)
    T* dp = dst.data_as<T>();                      // (M, H)
    int64_t rows = src.size(0), routed = index.size(0), hidden = src.size(1);
    as_cpu_stream(stream).enqueue([=] {
      check_indices(op, ip, routed, rows);
      for (int64_t i = 0; i < routed; ++i) {
        const T* from = sp + static_cast<int64_t>(ip[i]) * hidden;
        T* to = dp + i * hidden;
        for (int64_t h = 0; h < hidden; ++h) to[h] = from[h];
      }
    });
  });
}

void scatter_add_rows_cpu(const Tensor& src, const Tensor& index, const Tensor& dst,
                          Stream& stream) {
  const char* op = "scatter_add_rows_cpu";
  check_scatter_add_rows_args(op, src, index, dst);
  dispatch_storage(dst.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* sp = src.data_as<T>();                // (M, H)
    const int32_t* ip = index.data_as<int32_t>();  // (M)
    T* dp = dst.data_as<T>();                      // (N, H)
    int64_t rows = dst.size(0), routed = index.size(0), hidden = dst.size(1);
    as_cpu_stream(stream).enqueue([=] {
      check_indices(op, ip, routed, rows);
      if constexpr (std::is_same_v<T, bf16>) {
        scatter_rows_bf16(sp, ip, nullptr, dp, routed, hidden);
      } else {
        for (int64_t i = 0; i < routed; ++i) {
          const T* from = sp + i * hidden;
          T* to = dp + static_cast<int64_t>(ip[i]) * hidden;
          for (int64_t h = 0; h < hidden; ++h) to[h] += from[h];
        }
      }
    });
  });
}

void combine_rows_cpu(const Tensor& y, const Tensor& index, const Tensor& weight, const Tensor& out,
                      Stream& stream) {
  const char* op = "combine_rows_cpu";
  check_combine_rows_args(op, y, index, weight, out);
  dispatch_storage(out.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* yp = y.data_as<T>();                  // (M, H)
    const int32_t* ip = index.data_as<int32_t>();  // (M)
    const T* wp = weight.data_as<T>();             // (M)
    T* outp = out.data_as<T>();                    // (N, H)
    int64_t rows = out.size(0), routed = index.size(0), hidden = out.size(1);
    as_cpu_stream(stream).enqueue([=] {
      check_indices(op, ip, routed, rows);
      if constexpr (std::is_same_v<T, bf16>) {
        scatter_rows_bf16(yp, ip, wp, outp, routed, hidden);
      } else {
        for (int64_t i = 0; i < routed; ++i) {
          const T* from = yp + i * hidden;
          T* to = outp + static_cast<int64_t>(ip[i]) * hidden;
          for (int64_t h = 0; h < hidden; ++h) to[h] += wp[i] * from[h];
        }
      }
    });
  });
}

void combine_rows_backward_cpu(const Tensor& dout, const Tensor& y, const Tensor& index,
                               const Tensor& weight, const Tensor& dy, const Tensor& dweight,
                               Stream& stream) {
  const char* op = "combine_rows_backward_cpu";
  check_combine_rows_backward_args(op, dout, y, index, weight, dy, dweight);
  dispatch_storage(dout.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* doutp = dout.data_as<T>();            // (N, H)
    const T* yp = y.data_as<T>();                  // (M, H)
    const int32_t* ip = index.data_as<int32_t>();  // (M)
    const T* wp = weight.data_as<T>();             // (M)
    T* dyp = dy.data_as<T>();                      // (M, H)
    T* dwp = dweight.data_as<T>();                 // (M)
    int64_t rows = dout.size(0), routed = index.size(0), hidden = dout.size(1);
    as_cpu_stream(stream).enqueue([=] {
      check_indices(op, ip, routed, rows);
      for (int64_t i = 0; i < routed; ++i) {
        const T* g = doutp + static_cast<int64_t>(ip[i]) * hidden;
        const T* yr = yp + i * hidden;
        T* dyr = dyp + i * hidden;
        double dot = 0;
        for (int64_t h = 0; h < hidden; ++h) {
          dot += static_cast<double>(load(g[h])) * load(yr[h]);
        }
        // dy may alias y (the expert output is no longer needed): y[i] is read above first.
        const compute_t<T> w = load(wp[i]);
        for (int64_t h = 0; h < hidden; ++h) store(dyr + h, w * load(g[h]));
        // Rounded to the compute type, then (bf16) to the storage type, as CUDA's store does.
        store(dwp + i, static_cast<compute_t<T>>(dot));
      }
    });
  });
}

}  // namespace moepeak::ops
