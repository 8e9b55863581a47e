// Resident AdamW over ZeRO-3 pieces: each rank updates only its shards and local experts, and
// after several steps the gathered weights are bitwise equal to AdamW over the whole model on one
// rank (the update is element-wise, so the split cannot change a single bit). Runs on 2 and 4
// rank processes. Run: ctest -R zero_adamw --output-on-failure
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/comm/comm.h"
#include "core/comm/process_group.h"
#include "core/model/optimizer_params.h"
#include "core/model/param_layout.h"
#include "core/model/zero_params.h"
#include "ops/schedules/adamw_resident.h"

namespace moepeak {
namespace {

ModelConfig model_config() {
  ModelConfig m;
  m.vocab_size = 11;
  m.hidden_size = 7;  // odd sizes: shards need padding at W = 2 and 4
  m.intermediate_size = 6;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 4;
  m.num_local_experts = 4;
  m.num_experts_per_tok = 2;
  return m;
}

// The same gradient on every rank for element j of parameter p, a function of step, p and j.
double grad_value(int step, size_t p, int64_t j) {
  return 0.01 * static_cast<double>((static_cast<int64_t>(p) * 131 + j * 17 + step * 7) % 23 - 11);
}

template <typename T>
void run(DType dtype) {
  const ModelConfig cfg = model_config();
  const RankInfo ranks = init_process_group();
  auto backend = Backend::create(BackendOptions{});
  Stream& stream = backend->default_stream();
  auto comm = make_comm(*backend, ranks);
  OptimizerConfig opt;
  opt.weight_decay = 0.1;

  ParamStore whole(*backend, cfg, dtype);
  whole.initialize(5, 0.5, stream);
  schedules::ResidentAdamW whole_adamw(*backend, optimizer_params(whole), opt);
  ZeroParamStore zero(*backend, cfg, dtype, *comm);
  zero.initialize(5, 0.5, stream);
  const schedules::OptimizerParams zero_params = optimizer_params(zero);
  schedules::ResidentAdamW zero_adamw(*backend, zero_params.flat_values, zero_params.pieces, opt);
  const ParamLayout& layout = whole.layout();

  for (int step = 1; step <= 3; ++step) {
    for (size_t p = 0; p < layout.params().size(); ++p) {
      const int64_t n = layout.params()[p].shape.numel();
      std::vector<T> full(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) full[j] = static_cast<T>(grad_value(step, p, j));
      std::memcpy(whole.grad(static_cast<int>(p)).data(), full.data(), full.size() * sizeof(T));
      if (!zero.is_local(static_cast<int>(p))) continue;
      Tensor g = zero.local_grad(static_cast<int>(p));
      T* dst = static_cast<T*>(g.data());
      if (zero.is_expert(static_cast<int>(p))) {
        std::memcpy(dst, full.data(), full.size() * sizeof(T));
      } else {  // this rank's slice [r*s, (r+1)*s), zero past the end
        const int64_t s = zero.shard_elements(static_cast<int>(p));
        for (int64_t i = 0; i < s; ++i) {
          const int64_t j = ranks.rank * s + i;
          dst[i] = j < n ? full[j] : T(0);
        }
      }
    }
    whole_adamw.step(step, 1e-2, 0.5, stream);
    zero_adamw.step(step, 1e-2, 0.5, stream);
    stream.synchronize();
  }
  for (size_t p = 0; p < layout.params().size(); ++p) {
    std::vector<char> gathered = zero.gather_full(static_cast<int>(p), stream);
    Tensor w = whole.value(static_cast<int>(p));
    ASSERT_EQ(gathered.size(), w.nbytes());
    EXPECT_EQ(std::memcmp(gathered.data(), w.data(), w.nbytes()), 0)
        << layout.params()[p].name << " differs after 3 steps on " << ranks.world_size << " ranks";
  }
}

TEST(ZeroAdamW, ShardedUpdateIsBitwiseEqualToTheWholeModelF32) { run<float>(DType::f32); }
TEST(ZeroAdamW, ShardedUpdateIsBitwiseEqualToTheWholeModelF64) { run<double>(DType::f64); }

}  // namespace
}  // namespace moepeak
