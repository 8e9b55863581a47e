// test_backend_ops cases: copy_2d (ops/copy_2d.h) — the Ulysses pack (a column block of
// (rows, heads * d) into a dense block), its unpack, both sides strided with offsets, a large
// block, integers, and empty blocks. dst is `inout`: the elements outside the block must keep
// their values, so a copy that writes past a row fails.
#include <string>

#include "ops/copy_2d.h"
#include "tests/ops/backend_ops/harness.h"

namespace moepeak::testing::backend_ops {

MOEPEAK_BACKEND_OPS_CASES(copy_2d) {
  std::vector<OpCase> cases;
  struct Layout {
    std::string name;
    int64_t src_numel, dst_numel;
    ops::Block2d from, to;
    int64_t rows, width;
  };
  // (6 tokens, 8 heads, d 4): heads [2, 5) packed densely, and unpacked back.
  const Layout layouts[] = {
      {"pack heads 2..5 of 8", 6 * 8 * 4, 6 * 3 * 4, {2 * 4, 8 * 4}, {0, 3 * 4}, 6, 3 * 4},
      {"unpack into heads 2..5 of 8", 6 * 3 * 4, 6 * 8 * 4, {0, 3 * 4}, {2 * 4, 8 * 4}, 6, 3 * 4},
      {"both strided with offsets", 200, 300, {7, 19}, {11, 29}, 9, 13},
      {"whole rows (pitch = width)", 96 * 40, 96 * 40, {0, 96}, {0, 96}, 40, 96},
      {"large block", 1000 * 136, 1000 * 96, {40, 136}, {0, 96}, 1000, 96},
      {"one row", 50, 60, {5, 40}, {9, 40}, 1, 33},
      {"no rows", 16, 16, {0, 4}, {0, 4}, 0, 4},
      {"empty rows", 16, 16, {0, 4}, {0, 4}, 4, 0},
  };
  for (const Layout& l : layouts) {
    cases.push_back(OpCase{"copy_2d " + l.name,
                           {in("src", {l.src_numel}), inout("dst", {l.dst_numel})},
                           [l](const std::vector<Tensor>& t, Stream& st) {
                             ops::copy_2d(t[0], l.from, t[1], l.to, l.rows, l.width, st);
                           },
                           Tolerance{0.0, 0.0}});
  }
  cases.push_back(OpCase{"copy_2d i64",
                         {in("src", {120}, Kind::i64, integers(-1000000, 1000000)),
                          inout("dst", {90}, Kind::i64, integers(-5, 5))},
                         [](const std::vector<Tensor>& t, Stream& st) {
                           ops::copy_2d(t[0], {3, 12}, t[1], {1, 10}, 8, 9, st);
                         }});
  return cases;
}

}  // namespace moepeak::testing::backend_ops
