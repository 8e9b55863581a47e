// The offload placements on W real rank processes (ZeRO-3 shards of the dense weights, whole
// local experts), against resident AdamW:
//   - each rank's offload_stream (several beta, s) and offload_serial over its ZeRO-3 pieces;
//     after 3 steps the gathered weights, and the m and v a checkpoint gathers out of pinned host
//     memory, are bitwise those of resident AdamW over the whole model on one rank;
//   - train() on W ranks with each placement: losses bitwise resident's on the same W;
//   - a checkpoint of an offload_stream run on W ranks resumes bit for bit under offload_stream,
//     offload_serial and resident (the checkpoint does not depend on the placement either).
// Runs on 2 and 4 rank processes. Run: ctest -R adamw_offload_parallel --output-on-failure
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/sharded_checkpoint.h"
#include "core/checkpoint/train_checkpoint.h"
#include "core/comm/comm.h"
#include "core/comm/process_group.h"
#include "core/data/data_loader.h"
#include "core/model/optimizer_params.h"
#include "core/model/param_layout.h"
#include "core/model/zero_params.h"
#include "core/train/trainer.h"
#include "ops/schedules/adamw_offload_stream.h"
#include "ops/schedules/adamw_resident.h"
#include "ops/schedules/optimizer.h"
#include "tests/temp_dir.h"

namespace moepeak {
namespace {
namespace fs = std::filesystem;

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
float grad_value(int step, size_t p, int64_t j) {
  return 0.01f * static_cast<float>((static_cast<int64_t>(p) * 131 + j * 17 + step * 7) % 23 - 11) +
         1e-3f;
}

// A directory rank 0 creates (and removes), named on every rank.
class SharedDir {
 public:
  SharedDir() {
    const RankInfo ranks = init_process_group();
    std::string path;
    if (ranks.rank == 0) {
      dir_ = std::make_unique<test_support::TempDir>("moepeak_adamw_offload");
      path = dir_->path().string();
    }
    int size = static_cast<int>(path.size());
    MPI_Bcast(&size, 1, MPI_INT, 0, MPI_COMM_WORLD);
    path.resize(static_cast<size_t>(size));
    MPI_Bcast(path.data(), size, MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = path;
  }
  ~SharedDir() {
    MPI_Barrier(MPI_COMM_WORLD);
  }  // every rank is done with it before rank 0 removes it
  const fs::path& path() const { return path_; }

 private:
  std::unique_ptr<test_support::TempDir> dir_;
  fs::path path_;
};

void offload_pieces_are_bitwise_whole_resident(const OptimizerConfig& opt,
                                               const std::string& what) {
  const ModelConfig cfg = model_config();
  const RankInfo ranks = init_process_group();
  auto backend = Backend::create(BackendOptions{});
  Stream& stream = backend->default_stream();
  auto comm = make_comm(*backend, ranks);
  OptimizerConfig resident_opt = opt;
  resident_opt.placement = OptimizerPlacement::resident;

  ParamStore whole(*backend, cfg, DType::f32);
  whole.initialize(5, 0.5, stream);
  schedules::ResidentAdamW whole_adamw(*backend, optimizer_params(whole), resident_opt);
  ZeroParamStore zero(*backend, cfg, DType::f32, *comm);
  zero.initialize(5, 0.5, stream);
  auto zero_adamw = schedules::make_optimizer(*backend, optimizer_params(zero), opt, 1);
  ASSERT_EQ(zero_adamw->placement(), opt.placement);
  const ParamLayout& layout = whole.layout();

  for (int step = 1; step <= 3; ++step) {
    for (size_t p = 0; p < layout.params().size(); ++p) {
      const int64_t n = layout.params()[p].shape.numel();
      std::vector<float> full(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) full[j] = grad_value(step, p, j);
      std::memcpy(whole.grad(static_cast<int>(p)).data(), full.data(), full.size() * 4);
      if (!zero.is_local(static_cast<int>(p))) continue;
      float* dst = static_cast<float*>(zero.local_grad(static_cast<int>(p)).data());
      if (zero.is_expert(static_cast<int>(p))) {
        std::memcpy(dst, full.data(), full.size() * 4);
      } else {  // this rank's slice [r*s, (r+1)*s), zero past the end
        const int64_t s = zero.shard_elements(static_cast<int>(p));
        for (int64_t i = 0; i < s; ++i) {
          const int64_t j = ranks.rank * s + i;
          dst[i] = j < n ? full[j] : 0.0f;
        }
      }
    }
    const double clip = step == 2 ? 0.5 : 1.0;
    whole_adamw.step(step, 1e-2 / step, clip, stream);
    zero_adamw->step(step, 1e-2 / step, clip, stream);
    stream.synchronize();
  }
  for (size_t p = 0; p < layout.params().size(); ++p) {
    std::vector<char> gathered = zero.gather_full(static_cast<int>(p), stream);
    Tensor w = whole.value(static_cast<int>(p));
    ASSERT_EQ(gathered.size(), w.nbytes());
    EXPECT_EQ(std::memcmp(gathered.data(), w.data(), w.nbytes()), 0)
        << what << ": " << layout.params()[p].name << " differs after 3 steps on "
        << ranks.world_size << " ranks";
  }
  // m and v out of pinned host memory through every rank's shard file, read whole on rank 0.
  SharedDir dir;
  TrainingConfig training;
  training.batch_size = 2;
  training.seq_len = 8;
  auto loader = make_data_loader(training, cfg, 1);
  save_checkpoint(dir.path().string(), 3, cfg, zero, *zero_adamw, *loader, stream, 1);
  if (ranks.rank == 0) {
    ShardedCheckpoint file((dir.path() / checkpoint_dir_name(3)).string());
    EXPECT_EQ(file.metadata().at("optimizer_placement"), std::string(enum_name(opt.placement)));
    for (size_t p = 0; p < layout.params().size(); ++p) {
      const std::string& name = layout.params()[p].name;
      for (const auto& [prefix, flat] :
           {std::pair{"exp_avg.", whole_adamw.m()}, std::pair{"exp_avg_sq.", whole_adamw.v()}}) {
        const Tensor want =
            Tensor(static_cast<char*>(flat.data()) +
                       (static_cast<char*>(whole.value(static_cast<int>(p)).data()) -
                        static_cast<char*>(whole.flat_values().data())),
                   whole.value(static_cast<int>(p)).shape(), DType::f32, Placement::device);
        const std::vector<char> got = file.read(prefix + name);
        ASSERT_EQ(got.size(), want.nbytes());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0)
            << what << ": " << prefix << name;
      }
    }
  }
}

TEST(AdamWOffloadParallel, StreamOverZeroPiecesIsBitwiseWholeResident) {
  for (const auto& [bucket, slots] :
       std::vector<std::pair<int64_t, int64_t>>{{1 << 20, 3}, {50, 2}, {333, 4}}) {
    OptimizerConfig opt;
    opt.placement = OptimizerPlacement::offload_stream;
    opt.bucket_params = bucket;
    opt.staging_slots = slots;
    offload_pieces_are_bitwise_whole_resident(
        opt, "offload_stream beta " + std::to_string(bucket) + " s " + std::to_string(slots));
  }
}

TEST(AdamWOffloadParallel, SerialOverZeroPiecesIsBitwiseWholeResident) {
  OptimizerConfig opt;
  opt.placement = OptimizerPlacement::offload_serial;
  offload_pieces_are_bitwise_whole_resident(opt, "offload_serial");
}

Config train_config(const fs::path& run_dir, const std::string& name, OptimizerPlacement placement,
                    int64_t steps) {
  Config cfg = load_config({}, {"job.run_dir=" + run_dir.string(), "job.name=" + name,
                                "training.steps=" + std::to_string(steps), "training.seq_len=32",
                                "training.batch_size=8", "model.vocab_size=32",
                                "metrics.progress=\"off\"", "runtime.log_level=\"warn\"",
                                "optimizer.bucket_params=1000", "optimizer.staging_slots=2"});
  cfg.optimizer.placement = placement;
  return cfg;
}

TEST(AdamWOffloadParallel, TrainingLossesAreBitwiseResidentAndResumeAcrossPlacements) {
  SharedDir dir;
  const TrainResult resident =
      train(train_config(dir.path(), "resident", OptimizerPlacement::resident, 6), {});
  ASSERT_EQ(resident.losses.size(), 6u);
  for (OptimizerPlacement p :
       {OptimizerPlacement::offload_serial, OptimizerPlacement::offload_stream}) {
    const TrainResult r = train(train_config(dir.path(), std::string(enum_name(p)), p, 6), {});
    EXPECT_EQ(r.losses, resident.losses) << enum_name(p);
  }
  // A checkpoint of an offload_stream run after step 3, resumed under each placement.
  Config saver = train_config(dir.path(), "saver", OptimizerPlacement::offload_stream, 3);
  saver.checkpoint.enable = true;
  const TrainResult saved = train(saver, {});
  const std::string ckpt =
      (fs::path(saved.run_dir) / "checkpoints" / checkpoint_dir_name(3)).string();
  for (OptimizerPlacement p : {OptimizerPlacement::offload_stream,
                               OptimizerPlacement::offload_serial, OptimizerPlacement::resident}) {
    TrainOptions options;
    options.resume_from = ckpt;
    const TrainResult resumed =
        train(train_config(dir.path(), "resumed_" + std::string(enum_name(p)), p, 6), options);
    ASSERT_EQ(resumed.losses.size(), 3u) << enum_name(p);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(resumed.losses[i], resident.losses[3 + i]) << enum_name(p) << " step " << 4 + i;
    }
  }
}

}  // namespace
}  // namespace moepeak
