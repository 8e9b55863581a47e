// CPU embedding: a row copy per token (forward) and a row add per token in token order
// (backward). Ids are checked inside the stream task (see ops/embedding.h). f32 | bf16 | f64
// storage (ops/cpu/cpu_storage.h): the forward copies elements as they are; each backward += is
// done in fp32 and rounded to dweight's dtype (bf16: one rounding per addition, as on CUDA; an f32
// dweight for bf16 dout: none).
#include "ops/embedding.h"

#include <type_traits>

#include "core/runtime/cpu_stream.h"
#include "ops/cpu/cpu_storage.h"

namespace moepeak::ops {
namespace {

// Throws naming the op, the position and the id unless 0 <= id < vocab_size.
void check_id(const char* op, int64_t position, int64_t id, int64_t vocab_size) {
  if (id < 0 || id >= vocab_size) {
    MOEPEAK_THROW(op, ": token id ", id, " at position ", position, " is outside [0, ", vocab_size,
                  ")");
  }
}

// ids: (N) i64; the float tensors: (N, H) rows and a (V, H) table of one float dtype, or with
// `f32_table_for_bf16` an f32 table for bf16 rows.
void check_embedding_args(const char* op, const Tensor& ids, const Tensor& rows,
                          const char* rows_name, const Tensor& table, const char* table_name,
                          bool f32_table_for_bf16 = false) {
  MOEPEAK_CHECK(ids.ndim() == 1 && ids.dtype() == DType::i64, op, ": ids must be i64 (N), got ",
                ids.str());
  MOEPEAK_CHECK(table.ndim() == 2, op, ": ", table_name, " must be (V, H), got ", table.str());
  int64_t n = ids.size(0), h = table.size(1);
  const bool main_grad =
      f32_table_for_bf16 && table.dtype() == DType::f32 && rows.dtype() == DType::bf16;
  rows.expect(Shape{n, h}, main_grad ? DType::bf16 : table.dtype(),
              std::string(op) + ": " + rows_name);
}

}  // namespace

void check_embedding_forward_args(const char* op, const Tensor& ids, const Tensor& weight,
                                  const Tensor& out) {
  check_embedding_args(op, ids, out, "out", weight, "weight");
}

void check_embedding_backward_args(const char* op, const Tensor& ids, const Tensor& dout,
                                   const Tensor& dweight) {
  check_embedding_args(op, ids, dout, "dout", dweight, "dweight", /*f32_table_for_bf16=*/true);
}

void embedding_check_ids_host(const Tensor& ids, int64_t vocab_size) {
  MOEPEAK_CHECK(ids.ndim() == 1 && ids.dtype() == DType::i64,
                "embedding_check_ids_host: ids must be i64 (N), got ", ids.str());
  const int64_t* id = ids.data_as<int64_t>();
  for (int64_t n = 0; n < ids.size(0); ++n) {
    check_id("embedding_check_ids_host", n, id[n], vocab_size);
  }
}

void embedding_forward_cpu(const Tensor& ids, const Tensor& weight, const Tensor& out,
                           Stream& stream) {
  const char* op = "embedding_forward_cpu";
  check_embedding_forward_args(op, ids, weight, out);
  dispatch_storage(weight.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const int64_t* id = ids.data_as<int64_t>();
    const T* table = weight.data_as<T>();  // (V, H)
    T* y = out.data_as<T>();               // (N, H)
    int64_t n_tokens = ids.size(0), vocab = weight.size(0), hidden = weight.size(1);
    as_cpu_stream(stream).enqueue([=] {
      for (int64_t n = 0; n < n_tokens; ++n) {
        check_id(op, n, id[n], vocab);
        const T* src = table + id[n] * hidden;
        T* dst = y + n * hidden;
        for (int64_t h = 0; h < hidden; ++h) dst[h] = src[h];
      }
    });
  });
}

namespace {

// dtable[ids[n]] += dy[n] for n in increasing order, each addition in the compute type of the
// table's dtype DW (T, or float for the fp32 main gradient of bf16 rows) and stored once.
template <typename T, typename DW>
void embedding_backward_loop(const char* op, const int64_t* id, const T* dy, DW* dtable,
                             int64_t n_tokens, int64_t vocab, int64_t hidden) {
  // Check every id before adding anything, so a bad id leaves dweight untouched.
  for (int64_t n = 0; n < n_tokens; ++n) check_id(op, n, id[n], vocab);
  for (int64_t n = 0; n < n_tokens; ++n) {
    const T* src = dy + n * hidden;
    DW* dst = dtable + id[n] * hidden;
    for (int64_t h = 0; h < hidden; ++h) {
      store(dst + h, load(dst[h]) + static_cast<compute_t<DW>>(load(src[h])));
    }
  }
}

}  // namespace

void embedding_backward_cpu(const Tensor& ids, const Tensor& dout, const Tensor& dweight,
                            Stream& stream) {
  const char* op = "embedding_backward_cpu";
  check_embedding_backward_args(op, ids, dout, dweight);
  dispatch_storage(dout.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const int64_t* id = ids.data_as<int64_t>();
    const T* dy = dout.data_as<T>();  // (N, H)
    int64_t n_tokens = ids.size(0), vocab = dweight.size(0), hidden = dweight.size(1);
    // dweight in dout's dtype, or the fp32 main gradient beside bf16 (checked above).
    with_accumulator<T>(dweight.dtype(), [&](auto dw_zero) {
      using DW = decltype(dw_zero);
      DW* dtable = dweight.data_as<DW>();  // (V, H)
      as_cpu_stream(stream).enqueue(
          [=] { embedding_backward_loop(op, id, dy, dtable, n_tokens, vocab, hidden); });
    });
  });
}

}  // namespace moepeak::ops
