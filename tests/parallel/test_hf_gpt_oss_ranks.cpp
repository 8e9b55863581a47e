// gpt-oss's Hub checkpoints read on 4 ranks (core/checkpoint/hf_import.h): each rank reads only
// what its ZeroParamStore keeps — with Ep 4 one expert of every layer whole, with Ep 2 two
// experts each cut in halves over the expert replicas (1-D pieces of strided params of the fused
// tensors), with Ep 1 every expert in quarters; dense params as data_shard shards, the LM head
// by vocabulary rows — from plain F32 fused tensors (an index over two files) and from the
// released MXFP4 form, into F32 and BF16 stores. Every stored element must be its element of the
// Hub's tensors by the layout's definition (tests/model/hf_gpt_oss_fixture.h), bit for bit.
// Each rank writes its own copy of the checkpoint (the same bytes) and reads it; no collective
// runs besides the groups' construction.
//     ctest -R hf_gpt_oss_ranks --output-on-failure
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/checkpoint/hf_import.h"
#include "core/checkpoint/safetensors.h"
#include "core/comm/comm.h"
#include "core/comm/process_group.h"
#include "core/model/parallel_layout.h"
#include "core/model/zero_params.h"
#include "core/runtime/backend.h"
#include "tests/model/hf_gpt_oss_fixture.h"
#include "tests/model/hf_import_testing.h"
#include "tests/temp_dir.h"

namespace moepeak {
namespace {

using test_support::HubValues;
using test_support::TempDir;

struct RanksCase {
  int ep, ds;
  LmHeadSharding head;
  bool mxfp4;
  DType dtype;
};

void PrintTo(const RanksCase& c, std::ostream* os) {
  *os << "Ep " << c.ep << ", data_shard " << c.ds << (c.mxfp4 ? ", MXFP4" : ", plain") << ", "
      << dtype_name(c.dtype) << " store";
}

class HfGptOssRanks : public testing::TestWithParam<RanksCase> {};

TEST_P(HfGptOssRanks, EachRankLoadsExactlyItsOwnPieces) {
  const RanksCase c = GetParam();
  const RankInfo ranks = init_process_group();
  ASSERT_EQ(ranks.world_size, 4);
  BackendOptions options;
  options.device_memory = 64ull << 20;
  options.cpu_threads = 1;
  std::unique_ptr<Backend> backend = Backend::create(options);
  Stream& stream = backend->default_stream();
  std::unique_ptr<Comm> comm = make_comm(*backend, ranks);
  const ParallelGroups groups(*comm, ParallelDegrees{4, c.ep, 4, c.ds}, BackendKind::cpu);

  const ModelConfig m = test_support::small_gpt_oss();
  HubValues hub = test_support::gpt_oss_hub_values(m);
  TempDir dir("moepeak_hf_ranks");
  if (c.mxfp4) {
    uint32_t seed = 7;
    for (const std::string& name : test_support::expert_weights(m)) {
      test_support::make_mxfp4_exact(hub, name, seed++);
    }
    test_support::write_hub_dir(dir.path() / "hf", m, hub, "F32", 2,
                                test_support::released_mxfp4_config(),
                                test_support::expert_weights(m));
  } else {
    test_support::write_hub_dir(dir.path() / "hf", m, hub, "F32", 2);
  }

  ZeroParamStore params(*backend, m, c.dtype, groups, c.head);
  load_hf_weights(HfCheckpoint((dir.path() / "hf").string()), params, stream);

  const auto& infos = params.layout().params();
  int experts_here = 0, partial_experts = 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    const auto range = params.stored_range(static_cast<int>(i));
    if (!range) continue;
    const auto [begin, end] = *range;
    std::vector<float> expect = test_support::expected_param(infos[i], hub, m);
    expect = std::vector<float>(expect.begin() + begin, expect.begin() + end);
    expect = test_support::as_stored(expect, c.dtype);
    std::vector<char> bytes(static_cast<size_t>(end - begin) * dtype_size(c.dtype));
    params.copy_piece_to_host(static_cast<int>(i), params.flat_values(), 0, end - begin,
                              bytes.data(), stream);
    std::vector<float> got(expect.size());
    convert_float_elements(bytes.data(), safetensors_dtype_name(c.dtype), got.data(), "F32",
                           got.size());
    EXPECT_EQ(std::memcmp(got.data(), expect.data(), got.size() * 4), 0)
        << infos[i].name << " elements " << begin << ".." << end << " on rank " << ranks.rank;
    if (params.is_expert(static_cast<int>(i))) {
      ++experts_here;
      partial_experts += end - begin < infos[i].shape.numel();
    }
  }
  // What the layout promises: E / Ep experts of every layer, cut over W / Ep replicas.
  const int per_expert = 6;  // gate, down, up and their biases
  EXPECT_EQ(experts_here, m.num_hidden_layers * (4 / c.ep) * per_expert);
  EXPECT_EQ(partial_experts > 0, c.ep < 4);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, HfGptOssRanks,
    testing::Values(RanksCase{4, 4, LmHeadSharding::zero3, false, DType::f32},
                    RanksCase{4, 4, LmHeadSharding::vocab_rows, true, DType::f32},
                    RanksCase{2, 2, LmHeadSharding::zero3, false, DType::bf16},
                    RanksCase{2, 4, LmHeadSharding::zero3, true, DType::f32},
                    RanksCase{1, 4, LmHeadSharding::zero3, true, DType::bf16},
                    RanksCase{1, 2, LmHeadSharding::vocab_rows, false, DType::f32}),
    [](const testing::TestParamInfo<RanksCase>& info) {
      const RanksCase& c = info.param;
      return "ep" + std::to_string(c.ep) + "_ds" + std::to_string(c.ds) +
             (c.head == LmHeadSharding::vocab_rows ? "_rows" : "") +
             (c.mxfp4 ? "_mxfp4" : "_plain") + "_" + std::string(dtype_name(c.dtype));
    });

}  // namespace
}  // namespace moepeak
