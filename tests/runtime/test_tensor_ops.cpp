// Tensor views, units, errors, and the first ops (fill, convert) on the CPU.
// Run: ctest -R test_tensor_ops
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#include "core/units.h"
#include "ops/convert.h"
#include "ops/fill.h"

namespace moepeak {
namespace {

TEST(Units, ParsesAndFormatsBytes) {
  EXPECT_EQ(parse_bytes("2GiB"), 2 * GiB);
  EXPECT_EQ(parse_bytes(" 512 MiB "), 512 * MiB);
  EXPECT_EQ(parse_bytes("1.5GiB"), 3 * GiB / 2);
  EXPECT_EQ(parse_bytes("4096"), 4096u);
  EXPECT_EQ(parse_bytes("16GB"), 16000000000ull);
  EXPECT_FALSE(parse_bytes("").has_value());
  EXPECT_FALSE(parse_bytes("-1GiB").has_value());
  EXPECT_FALSE(parse_bytes("2 gigs").has_value());
  EXPECT_FALSE(parse_bytes("1.5").has_value());
  EXPECT_FALSE(parse_bytes("GiB").has_value());
  EXPECT_EQ(format_bytes(17), "17 B");
  EXPECT_EQ(format_bytes(3 * GiB / 2), "1.50 GiB");
}

TEST(Errors, CarryLocationHostAndRank) {
  set_process_identity(3, 8);
  try {
    MOEPEAK_THROW("bad thing ", 42);
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("rank 3/8"), std::string::npos) << m;
    EXPECT_NE(m.find(process_host()), std::string::npos) << m;
    EXPECT_NE(m.find("tests/runtime/test_tensor_ops.cpp:"), std::string::npos) << m;
    EXPECT_EQ(e.message(), "bad thing 42");
  }
  set_process_identity(-1, 0);
}

TEST(Tensor, ShapesViewsAndChecks) {
  std::vector<float> data(4 * 3 * 2);
  Tensor t(data.data(), Shape{4, 3, 2}, DType::f32, Placement::host);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.size(-1), 2);
  EXPECT_EQ(t.str(), "f32(4, 3, 2)@host");
  Tensor r = t.rows(1, 3);
  EXPECT_EQ(r.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(r.data_as<float>(), data.data() + 6);
  EXPECT_EQ(t.reshape(Shape{12, 2}).size(0), 12);
  EXPECT_THROW(t.reshape(Shape{5, 5}), Error);
  EXPECT_THROW(t.rows(3, 5), Error);
  EXPECT_THROW(t.data_as<double>(), Error);
  EXPECT_THROW(t.expect(Shape{4, 3, 2}, DType::bf16, "x"), Error);
  EXPECT_NO_THROW(t.expect(Shape{4, 3, 2}, DType::f32, "x"));
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(static_cast<float>(bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(static_cast<float>(bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(static_cast<float>(bf16(std::nanf("")))));
  EXPECT_TRUE(std::isinf(static_cast<float>(bf16(INFINITY))));
}

TEST(Ops, FillWritesEveryElementInEachDtype) {
  auto backend = Backend::create(BackendOptions{});
  Stream& s = backend->default_stream();
  for (DType t : {DType::f32, DType::bf16, DType::f64, DType::i32, DType::i64}) {
    auto x = OwnedTensor::device(*backend, Shape{7, 5}, t, LiveSet::workspace, "x");
    ops::fill(x, 3.0, s);
    s.synchronize();
    for (int64_t i = 0; i < x.numel(); ++i) {
      double v = 0;
      switch (t) {
        case DType::f32:
          v = x.data_as<float>()[i];
          break;
        case DType::bf16:
          v = static_cast<float>(x.data_as<bf16>()[i]);
          break;
        case DType::f64:
          v = x.data_as<double>()[i];
          break;
        case DType::i32:
          v = x.data_as<int32_t>()[i];
          break;
        case DType::i64:
          v = static_cast<double>(x.data_as<int64_t>()[i]);
          break;
      }
      ASSERT_EQ(v, 3.0) << dtype_name(t) << " element " << i;
    }
  }
}

TEST(Ops, ConvertRoundTripsAndRoundsLikeBf16) {
  auto backend = Backend::create(BackendOptions{});
  Stream& s = backend->default_stream();
  std::mt19937 rng(7);
  std::normal_distribution<double> dist(0.0, 3.0);
  auto x64 = OwnedTensor::device(*backend, Shape{129}, DType::f64, LiveSet::workspace, "x64");
  for (int64_t i = 0; i < x64.numel(); ++i) x64.data_as<double>()[i] = dist(rng);
  auto x32 = OwnedTensor::device(*backend, Shape{129}, DType::f32, LiveSet::workspace, "x32");
  auto xb = OwnedTensor::device(*backend, Shape{129}, DType::bf16, LiveSet::workspace, "xb");
  auto back = OwnedTensor::device(*backend, Shape{129}, DType::f64, LiveSet::workspace, "back");
  ops::fill(x32, NAN, s);
  ops::fill(xb, NAN, s);
  ops::fill(back, NAN, s);
  ops::convert(x64, x32, s);
  ops::convert(x32, xb, s);
  ops::convert(xb, back, s);
  s.synchronize();
  for (int64_t i = 0; i < 129; ++i) {
    float f = static_cast<float>(x64.data_as<double>()[i]);
    EXPECT_EQ(x32.data_as<float>()[i], f);
    EXPECT_EQ(xb.data_as<bf16>()[i].bits, bf16(f).bits);
    EXPECT_EQ(back.data_as<double>()[i], static_cast<double>(static_cast<float>(bf16(f))));
  }
  auto wrong = OwnedTensor::device(*backend, Shape{128}, DType::f32, LiveSet::workspace, "wrong");
  EXPECT_THROW(ops::convert(x64, wrong, s), Error);
}

}  // namespace
}  // namespace moepeak
