// DeepSeek-V3's FP8 release read on 4 ranks (core/checkpoint/hf_import.h, hf_import_fp8.cpp):
// each rank dequantises only what its ZeroParamStore keeps — dense params as data_shard shards,
// which start and end inside rows where a shard is not whole rows (kv_a_proj_with_mqa's 15 rows
// of 32 in 2 or 4 shards), the experts whole or cut over the expert replicas — into F32 and BF16
// stores, each stored element the fp32 product of its code and block scale rounded to the
// store, bit for bit (tests/model/hf_deepseek_fixture.h). Then the MTP layers on 4 ranks:
// carry_mtp_layers writes the run's copy once (rank 0), a save on 4 ranks links it into the
// checkpoint and lists it in the manifest, and the export of that checkpoint holds its tensors as
// released.
//     ctest -R hf_deepseek_fp8_ranks --output-on-failure
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/checkpoint/hf_export.h"
#include "core/checkpoint/hf_import.h"
#include "core/checkpoint/mtp_layers.h"
#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/sharded_checkpoint.h"
#include "core/checkpoint/train_checkpoint.h"
#include "core/comm/comm.h"
#include "core/comm/process_group.h"
#include "core/data/data_loader.h"
#include "core/model/optimizer_params.h"
#include "core/model/parallel_layout.h"
#include "core/model/zero_params.h"
#include "core/runtime/backend.h"
#include "ops/schedules/optimizer_choice.h"
#include "tests/model/hf_deepseek_fixture.h"
#include "tests/model/hf_import_testing.h"
#include "tests/temp_dir.h"

namespace moepeak {
namespace {
namespace fs = std::filesystem;

// A directory every rank sees: rank 0's TempDir, its path broadcast; removed after every rank is
// done with it.
class SharedDir {
 public:
  SharedDir() {
    const RankInfo ranks = init_process_group();
    std::string path;
    if (ranks.rank == 0) {
      dir_ = std::make_unique<test_support::TempDir>("moepeak_fp8_ranks");
      path = dir_->path().string();
    }
    int size = static_cast<int>(path.size());
    MPI_Bcast(&size, 1, MPI_INT, 0, MPI_COMM_WORLD);
    path.resize(static_cast<size_t>(size));
    MPI_Bcast(path.data(), size, MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = path;
  }
  ~SharedDir() { MPI_Barrier(MPI_COMM_WORLD); }
  const fs::path& path() const { return path_; }

 private:
  std::unique_ptr<test_support::TempDir> dir_;
  fs::path path_;
};

struct RanksCase {
  int ep, ds;
  DType dtype;
};

void PrintTo(const RanksCase& c, std::ostream* os) {
  *os << "Ep " << c.ep << ", data_shard " << c.ds << ", " << dtype_name(c.dtype) << " store";
}

class HfDeepseekFp8Ranks : public testing::TestWithParam<RanksCase> {};

TEST_P(HfDeepseekFp8Ranks, EachRankDequantisesItsOwnPiecesAndRankZeroCarriesTheMtpLayers) {
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

  // Rows of kv_a_proj_with_mqa (11 + 4, 32) and of the dense MLP (42, 32) that the shards cut:
  // 15 rows in 2 shards of 7.5 or 4 of 3.75; 42 rows in 4 shards of 10.5.
  ModelConfig m = test_support::small_deepseek();
  m.kv_lora_rank = 11;
  m.intermediate_size = 42;
  const test_support::DeepseekHub hub = test_support::deepseek_hub(m, 5, 11);
  SharedDir shared;
  if (ranks.rank == 0) {
    test_support::write_deepseek_dir(shared.path() / "hf", hub, 2,
                                     test_support::fp8_quantization(5));
  }
  MPI_Barrier(MPI_COMM_WORLD);

  ZeroParamStore params(*backend, m, c.dtype, groups);
  const HfCheckpoint hf((shared.path() / "hf").string());
  load_hf_weights(hf, params, stream, m.num_nextn_predict_layers);
  const auto& infos = params.layout().params();
  int partial_rows = 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    const auto range = params.stored_range(static_cast<int>(i));
    if (!range) continue;
    const auto [begin, end] = *range;
    std::vector<float> expect = hub.expected.at(infos[i].name);
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
    const int64_t cols = infos[i].shape.dims().back();
    if (hub.fp8.count(infos[i].name) && end > begin && (begin % cols != 0 || end % cols != 0)) {
      ++partial_rows;
    }
  }
  // Some rank's shard of an FP8 projection starts or ends inside a row.
  int partial_anywhere = partial_rows;
  MPI_Allreduce(MPI_IN_PLACE, &partial_anywhere, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (c.ds > 1) {
    EXPECT_GT(partial_anywhere, 0);
  }

  // The MTP layers: written once by rank 0, linked into a checkpoint saved on 4 ranks.
  const fs::path folder = shared.path() / "ckpt";
  const std::optional<CarriedFile> carried =
      carry_mtp_layers(hf, m, folder.string(), params, stream);
  EXPECT_EQ(carried.has_value(), ranks.rank == 0);
  auto optimizer =
      schedules::make_optimizer(*backend, optimizer_params(params), OptimizerConfig{}, 1);
  TrainingConfig training;
  training.batch_size = 4;
  training.seq_len = 8;
  auto loader = make_data_loader(training, m, 1);
  save_checkpoint(folder.string(), 5, m, params, *optimizer, *loader, stream, 2, 1 << 20, carried);
  if (ranks.rank == 0) {
    const fs::path step = folder / checkpoint_dir_name(5);
    EXPECT_TRUE(fs::equivalent(step / kMtpLayersFile, folder / kMtpLayersFile));
    const ShardedCheckpoint saved(step.string());
    ASSERT_EQ(saved.manifest().carried.size(), 1u);
    EXPECT_EQ(saved.manifest().carried[0], carried->info);
    const fs::path out = shared.path() / "export";
    const HfExportSummary s = export_hf_checkpoint(step.string(), out.string(), {});
    EXPECT_EQ(s.carried_tensors, static_cast<int64_t>(hub.mtp.size()));
    const HfCheckpoint exported(out.string());
    for (const std::string& name : hub.mtp) {
      const SafetensorsFile& f = exported.stored_file(name);
      std::vector<uint8_t> bytes(f.info(name).bytes);
      f.read(name, bytes.data(), bytes.size());
      EXPECT_EQ(f.info(name).dtype, hub.stored.at(name).dtype) << name;
      EXPECT_EQ(bytes, hub.stored.at(name).bytes) << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, HfDeepseekFp8Ranks,
                         testing::Values(RanksCase{4, 4, DType::f32}, RanksCase{2, 2, DType::bf16},
                                         RanksCase{1, 4, DType::bf16}),
                         [](const testing::TestParamInfo<RanksCase>& info) {
                           const RanksCase& c = info.param;
                           return "ep" + std::to_string(c.ep) + "_ds" + std::to_string(c.ds) + "_" +
                                  std::string(dtype_name(c.dtype));
                         });

}  // namespace
}  // namespace moepeak
