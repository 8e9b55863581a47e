// test_backend_ops cases: the element-wise helpers (ops/elementwise.h) — add (also with out == a
// and out == b), scale, sum_squares (out (1) or (P) f64 partials accumulated, +=; also on views
// that start off a 16-byte boundary, for the kernel's unaligned head), copy (floating and i64;
// src == dst), scale_rows and row_dot (written and accumulated).
#include <string>
#include <utility>

#include "ops/elementwise.h"
#include "tests/ops/backend_ops/harness.h"

namespace moepeak::testing::backend_ops {

namespace {

std::string shape_name(const Shape& s) {
  std::string out;
  for (int i = 0; i < s.ndim(); ++i) out += (i ? "x" : " ") + std::to_string(s[i]);
  return out;
}

}  // namespace

MOEPEAK_BACKEND_OPS_CASES(elementwise) {
  std::vector<OpCase> cases;
  const Shape flat_shapes[] = {{37, 96}, {1}, {5, 7, 3}, {100003}, {3, 1500}, {0}};

  for (const Shape& s : flat_shapes) {
    cases.push_back(
        OpCase{"add" + shape_name(s),
               {in("a", s), in("b", s), out("out", s)},
               [](const std::vector<Tensor>& t, Stream& st) { ops::add(t[0], t[1], t[2], st); }});
    cases.push_back(
        OpCase{"add out=a" + shape_name(s),
               {inout("a_out", s), in("b", s)},
               [](const std::vector<Tensor>& t, Stream& st) { ops::add(t[0], t[1], t[0], st); }});
    cases.push_back(
        OpCase{"add out=b" + shape_name(s),
               {in("a", s), inout("b_out", s)},
               [](const std::vector<Tensor>& t, Stream& st) { ops::add(t[0], t[1], t[1], st); }});
  }

  for (auto [s, alpha] :
       {std::pair<Shape, double>{{37, 96}, -0.375}, {{1}, 3.0}, {{100003}, 1e-3}, {{0}, 2.0}}) {
    cases.push_back(
        OpCase{"scale alpha=" + std::to_string(alpha) + shape_name(s),
               {inout("x", s)},
               [alpha](const std::vector<Tensor>& t, Stream& st) { ops::scale(t[0], alpha, st); }});
  }

  for (const Shape& s : {Shape{37, 96}, Shape{1}, Shape{1, 1}, Shape{5, 7, 3}, Shape{100003},
                         Shape{1 << 20}, Shape{0}}) {
    cases.push_back(
        OpCase{"sum_squares" + shape_name(s),
               {in("x", s), inout("out", {1}, Kind::f64, values({2.5}))},
               [](const std::vector<Tensor>& t, Stream& st) { ops::sum_squares(t[0], t[1], st); }});
  }
  // Partial sums, one GPU block a part (ops::kSumSquaresParts, the gradient norm's): parts that
  // start off a 16-byte boundary (n / P not a multiple of 8), more parts than elements (empty
  // ones stay as they were), and the trainer's 256 over a million elements.
  for (auto [n, parts] :
       {std::pair<int64_t, int64_t>{100003, 7}, {5, 8}, {1 << 20, 256}, {4103, 256}}) {
    cases.push_back(
        OpCase{"sum_squares n=" + std::to_string(n) + " parts=" + std::to_string(parts),
               {in("x", {n}), inout("out", {parts}, Kind::f64)},
               [](const std::vector<Tensor>& t, Stream& st) { ops::sum_squares(t[0], t[1], st); }});
  }
  // Views starting 1..9 elements into the buffer: the head before the first 16-byte boundary
  // (up to 7 bf16 or 3 f32 elements), whole vectors, and a tail. Two calls accumulate.
  for (int64_t offset : {1, 3, 9}) {
    for (int64_t n : {int64_t{12}, int64_t{4103}}) {
      cases.push_back(
          OpCase{"sum_squares view offset=" + std::to_string(offset) + " n=" + std::to_string(n),
                 {in("x", {n}), inout("out", {1}, Kind::f64, values({-1.0}))},
                 [offset, n](const std::vector<Tensor>& t, Stream& st) {
                   ops::sum_squares(t[0].rows(offset, n), t[1], st);
                   ops::sum_squares(t[0].rows(0, n - offset), t[1], st);
                 }});
    }
  }

  for (const Shape& s : flat_shapes) {
    cases.push_back(
        OpCase{"copy" + shape_name(s),
               {in("src", s), out("dst", s)},
               [](const std::vector<Tensor>& t, Stream& st) { ops::copy(t[0], t[1], st); }});
  }
  {
    OpCase ids{"copy i64 37",
               {in("src", {37}, Kind::i64, integers(-5, 1000000)), out("dst", {37}, Kind::i64)},
               [](const std::vector<Tensor>& t, Stream& st) { ops::copy(t[0], t[1], st); }};
    ids.bf16 = false;
    cases.push_back(std::move(ids));
    cases.push_back(OpCase{
        "copy src=dst 5x7", {inout("x", {5, 7})}, [](const std::vector<Tensor>& t, Stream& st) {
          ops::copy(t[0], t[0], st);
        }});
  }

  const std::pair<int64_t, int64_t> row_shapes[] = {{37, 96},  {1, 1},    {5, 1500}, {300, 7},
                                                    {3, 5000}, {129, 33}, {0, 8},    {4, 0}};
  for (auto [m, c] : row_shapes) {
    const std::string shape = " M=" + std::to_string(m) + " C=" + std::to_string(c);
    cases.push_back(
        OpCase{"scale_rows" + shape,
               {inout("x", {m, c}), in("w", {m}, Kind::floating, uniform(-2, 2))},
               [](const std::vector<Tensor>& t, Stream& st) { ops::scale_rows(t[0], t[1], st); }});
    cases.push_back(OpCase{"row_dot" + shape,
                           {in("a", {m, c}), in("b", {m, c}), out("out", {m})},
                           [](const std::vector<Tensor>& t, Stream& st) {
                             ops::row_dot(t[0], t[1], t[2], false, st);
                           }});
    cases.push_back(OpCase{"row_dot accumulate" + shape,
                           {in("a", {m, c}), in("b", {m, c}), inout("out", {m})},
                           [](const std::vector<Tensor>& t, Stream& st) {
                             ops::row_dot(t[0], t[1], t[2], true, st);
                           }});
  }
  return cases;
}

}  // namespace moepeak::testing::backend_ops
