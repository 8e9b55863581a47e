// test_backend_ops cases: rope forward and backward, in place (ops/rope.h).
//
// Plain RoPE: head dims from 2 (one pair) through 6 (three pairs, not a multiple of 32) to 128
// (Mixtral) and 2048 (more pairs than a block's threads); positions small and uniform in
// [0, 100000] (long context, where the angle needs double), with theta 1e4 and 1e6 (Mixtral's);
// N = 0.
// The scaling types (ops/rope_scaling.h), each with the parameters in its name: linear; dynamic
// with the batch's length below and above max_position_embeddings; yarn as gpt-oss (truncate
// false), as DeepSeek-V3 (mscale / mscale_all_dim, interleaved pairs) and with a given attention
// factor on a partial rotary dimension; llama3 as Llama-3.1 and partial + interleaved; the default
// type partial (an odd head_dim) and interleaved over 2048 elements; N = 0. The default
// tolerances hold: the frequencies, angles, cos and sin are double on both backends (CUDA's pow,
// cos and sin within an ulp of glibc's), so an f32 result differs from the f64 reference by the
// fp32 rounding of f * cos, f * sin and of the rotation (~1e-7 of the output's scale), bf16 by one
// bf16 rounding (2^-8).
#include <string>

#include "ops/rope.h"
#include "ops/rope_scaling.h"
#include "tests/ops/backend_ops/harness.h"

namespace moepeak::testing::backend_ops {

namespace {

struct RopeShape {
  int64_t tokens, heads, head_dim, max_position;
  double theta;
};

// One scaled case: the shape, and the RopeParams of rope_params(scaling, theta, rotary_dim,
// max_position_embeddings, seq_len = max_position + 1, interleaved).
struct ScaledRope {
  int64_t tokens, heads, head_dim, rotary_dim, max_position;
  double theta;
  int64_t max_position_embeddings;
  bool interleaved;
  ops::RopeScaling scaling;
};

std::string number(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

std::string describe(const ScaledRope& r) {
  const ops::RopeScaling& s = r.scaling;
  std::string name = std::string(" ") + ops::rope_type_name(s.type) +
                     " N=" + std::to_string(r.tokens) + " heads=" + std::to_string(r.heads) +
                     " d=" + std::to_string(r.head_dim) + " rot=" + std::to_string(r.rotary_dim) +
                     (r.interleaved ? " interleaved" : "") +
                     " max_pos=" + std::to_string(r.max_position) + " theta=" + number(r.theta) +
                     " mpe=" + std::to_string(r.max_position_embeddings);
  auto field = [&](const char* key, const auto& v) {
    if (v) name += std::string(" ") + key + "=" + number(static_cast<double>(*v));
  };
  field("factor", s.factor);
  field("orig", s.original_max_position_embeddings);
  field("beta_fast", s.beta_fast);
  field("beta_slow", s.beta_slow);
  field("mscale", s.mscale);
  field("mscale_all_dim", s.mscale_all_dim);
  field("attn", s.attention_factor);
  field("lff", s.low_freq_factor);
  field("hff", s.high_freq_factor);
  if (s.type == ops::RopeType::yarn && !s.truncate) name += " no_truncate";
  return name;
}

void add_cases(std::vector<OpCase>& cases, const std::string& shape, int64_t tokens, int64_t heads,
               int64_t head_dim, int64_t max_position, const ops::RopeParams& p) {
  cases.push_back(OpCase{
      "rope_forward" + shape,
      {inout("x", {tokens, heads, head_dim}),
       in("positions", {tokens}, Kind::i64, integers(0, max_position))},
      [p](const std::vector<Tensor>& t, Stream& s) { ops::rope_forward(t[0], t[1], p, s); }});
  cases.push_back(OpCase{
      "rope_backward" + shape,
      {inout("dx", {tokens, heads, head_dim}),
       in("positions", {tokens}, Kind::i64, integers(0, max_position))},
      [p](const std::vector<Tensor>& t, Stream& s) { ops::rope_backward(t[0], t[1], p, s); }});
}

ops::RopeScaling scaling(ops::RopeType type) {
  ops::RopeScaling s;
  s.type = type;
  return s;
}

std::vector<ScaledRope> scaled_shapes() {
  using ops::RopeType;
  std::vector<ScaledRope> shapes;
  ops::RopeScaling linear = scaling(RopeType::linear);
  linear.factor = 4;
  shapes.push_back({37, 4, 128, 128, 100000, 1e4, 4096, false, linear});
  ops::RopeScaling dynamic = scaling(RopeType::dynamic);
  dynamic.factor = 2;
  shapes.push_back({33, 2, 64, 64, 100000, 1e4, 4096, false, dynamic});  // L > max_pos
  shapes.push_back({33, 2, 64, 64, 2047, 1e4, 4096, false, dynamic});    // L <= max_pos
  ops::RopeScaling gpt_oss = scaling(RopeType::yarn);
  gpt_oss.factor = 32;
  gpt_oss.original_max_position_embeddings = 4096;
  gpt_oss.beta_fast = 32;
  gpt_oss.beta_slow = 1;
  gpt_oss.truncate = false;
  shapes.push_back({64, 8, 64, 64, 100000, 150000, 131072, false, gpt_oss});
  ops::RopeScaling deepseek = scaling(RopeType::yarn);
  deepseek.factor = 40;
  deepseek.original_max_position_embeddings = 4096;
  deepseek.beta_fast = 32;
  deepseek.beta_slow = 1;
  deepseek.mscale = 1.0;
  deepseek.mscale_all_dim = 1.0;
  shapes.push_back({19, 3, 64, 64, 100000, 1e4, 163840, true, deepseek});
  ops::RopeScaling yarn_attn = scaling(RopeType::yarn);
  yarn_attn.factor = 4;
  yarn_attn.original_max_position_embeddings = 32768;
  yarn_attn.attention_factor = 0.8;
  shapes.push_back({21, 3, 80, 32, 100000, 1e6, 131072, false, yarn_attn});
  ops::RopeScaling llama3 = scaling(RopeType::llama3);
  llama3.factor = 8;
  llama3.low_freq_factor = 1;
  llama3.high_freq_factor = 4;
  llama3.original_max_position_embeddings = 8192;
  shapes.push_back({37, 4, 128, 128, 100000, 500000, 131072, false, llama3});
  shapes.push_back({17, 2, 96, 64, 100000, 500000, 131072, true, llama3});
  shapes.push_back({5, 3, 7, 4, 100000, 1e4, 4096, false, scaling(RopeType::default_)});
  shapes.push_back({5, 2, 2048, 2048, 100000, 1e6, 4096, true, scaling(RopeType::default_)});
  shapes.push_back({0, 4, 64, 64, 0, 150000, 131072, false, gpt_oss});
  return shapes;
}

}  // namespace

MOEPEAK_BACKEND_OPS_CASES(rope) {
  std::vector<OpCase> cases;
  const RopeShape shapes[] = {
      {37, 4, 64, 4095, 1e4},    {1, 1, 2, 7, 1e4},         {19, 3, 6, 300, 1e4},
      {64, 8, 128, 100000, 1e6}, {33, 2, 128, 100000, 1e4}, {5, 2, 2048, 100000, 1e6},
      {300, 1, 16, 100000, 1e6}, {0, 4, 64, 0, 1e4},
  };
  for (const RopeShape& r : shapes) {
    const std::string shape =
        " N=" + std::to_string(r.tokens) + " heads=" + std::to_string(r.heads) +
        " d=" + std::to_string(r.head_dim) + " max_pos=" + std::to_string(r.max_position) +
        " theta=" + std::to_string(static_cast<int64_t>(r.theta));
    add_cases(cases, shape, r.tokens, r.heads, r.head_dim, r.max_position,
              ops::RopeParams::standard(r.theta, r.head_dim));
  }
  for (const ScaledRope& r : scaled_shapes()) {
    const ops::RopeParams p =
        ops::rope_params(r.scaling, r.theta, r.rotary_dim, r.max_position_embeddings,
                         r.max_position + 1, r.interleaved);
    add_cases(cases, describe(r), r.tokens, r.heads, r.head_dim, r.max_position, p);
  }
  return cases;
}

}  // namespace moepeak::testing::backend_ops
