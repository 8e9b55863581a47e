// CPU embedding: a row copy per token (forward) and a row add per token in token order
// (backward). Ids are checked inside the stream task (see ops/embedding.h).
#include "ops/embedding.h"

#include "core/runtime/cpu_stream.h"

namespace moepeak::ops {
namespace {

// Throws naming the op, the position and the id unless 0 <= id < vocab_size.
void check_id(const char* op, int64_t position, int64_t id, int64_t vocab_size) {
  if (id < 0 || id >= vocab_size) {
    MOEPEAK_THROW(op, ": token id ", id, " at position ", position, " is outside [0, ", vocab_size,
                  ")");
  }
}

// ids: (N) i64; the float tensors: (N, H) rows and a (V, H) table of one float dtype.
void check_embedding_args(const char* op, const Tensor& ids, const Tensor& rows,
                          const char* rows_name, const Tensor& table, const char* table_name) {
  MOEPEAK_CHECK(ids.ndim() == 1 && ids.dtype() == DType::i64, op, ": ids must be i64 (N), got ",
                ids.str());
  MOEPEAK_CHECK(table.ndim() == 2, op, ": ", table_name, " must be (V, H), got ", table.str());
  int64_t n = ids.size(0), h = table.size(1);
  rows.expect(Shape{n, h}, table.dtype(), std::string(op) + ": " + rows_name);
}

}  // namespace

void check_embedding_forward_args(const char* op, const Tensor& ids, const Tensor& weight,
                                  const Tensor& out) {
  check_embedding_args(op, ids, out, "out", weight, "weight");
}

void check_embedding_backward_args(const char* op, const Tensor& ids, const Tensor& dout,
                                   const Tensor& dweight) {
  check_embedding_args(op, ids, dout, "dout", dweight, "dweight");
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
  dispatch_float(weight.dtype(), op, [&](auto zero) {
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

void embedding_backward_cpu(const Tensor& ids, const Tensor& dout, const Tensor& dweight,
                            Stream& stream) {
  const char* op = "embedding_backward_cpu";
  check_embedding_backward_args(op, ids, dout, dweight);
  dispatch_float(dweight.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const int64_t* id = ids.data_as<int64_t>();
    const T* dy = dout.data_as<T>();   // (N, H)
    T* dtable = dweight.data_as<T>();  // (V, H)
    int64_t n_tokens = ids.size(0), vocab = dweight.size(0), hidden = dweight.size(1);
    as_cpu_stream(stream).enqueue([=] {
      // Check every id before adding anything, so a bad id leaves dweight untouched.
      for (int64_t n = 0; n < n_tokens; ++n) check_id(op, n, id[n], vocab);
      for (int64_t n = 0; n < n_tokens; ++n) {
        const T* src = dy + n * hidden;
        T* dst = dtable + id[n] * hidden;
        for (int64_t h = 0; h < hidden; ++h) dst[h] += src[h];
      }
    });
  });
}

}  // namespace moepeak::ops
