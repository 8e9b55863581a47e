// The Trainer's data on W real rank processes: each rank reads only its block of the batch, so a
// bad token id that one rank's block holds is seen by that rank alone — and still stops every
// rank at that step (the ranks agree before the step's first collective): that rank with the
// error naming the file, offset and value, the others naming that rank; the step before it ran.
// Run: ctest -R test_train_data --output-on-failure
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/error.h"
#include "core/train/trainer.h"
#include "tests/expect_contains.h"
#include "tests/parallel/shared_run_dir.h"

namespace moepeak {
namespace {
namespace fs = std::filesystem;

using test_support::SharedRunDir;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// 1,024 tokens < 32 with one 40 at stream position `bad` (rank 0 writes, every rank waits).
std::string write_tokens_with_bad_id(const fs::path& dir, size_t bad) {
  const fs::path path = dir / "bad_id.bin";
  if (world_rank() == 0) {
    std::vector<uint16_t> tokens(1024);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 5) % 32);
    tokens[bad] = 40;
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens.data()),
               static_cast<std::streamsize>(tokens.size() * 2));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path.string();
}

TEST(TrainData, ABadIdInOneRanksBlockStopsEveryRankAtThatStep) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  ASSERT_EQ(world, 4) << "the block arithmetic below is for 4 ranks";
  SharedRunDir dir;
  // B = 4, T = 32 in file order: step 2 reads stream [128, 256]; with Sp = W = 4 rank r holds
  // columns [8r, 8r + 8) of each row and reads 9 tokens. Row 0 of step 2 is [128, 160]: rank 2
  // reads [144, 152], rank 1 [136, 144], rank 3 [152, 160]; 148 is rank 2's alone.
  const std::string tokens = write_tokens_with_bad_id(dir.path(), 148);
  Config cfg = load_config(
      {}, {"job.run_dir=" + dir.path().string(), "job.name=bad_id", "training.steps=3",
           "training.seq_len=32", "training.batch_size=4", "training.dataset=\"bin\"",
           "training.dataset_path=\"" + tokens + "\"", "training.shuffle=false",
           "model.vocab_size=32", "metrics.progress=\"off\"", "runtime.log_level=\"warn\""});
  std::string error;
  try {
    train(cfg, {});
  } catch (const Error& e) {
    error = e.what();
  }
  if (world_rank() == 2) {
    EXPECT_CONTAINS(error, tokens + ": token 40 at offset 148 (byte 296) is >= model.vocab_size 32");
  } else {
    EXPECT_CONTAINS(error, "step 2: rank 2 could not read its block of the batch");
  }
  if (world_rank() == 0) {  // step 1 ran and was logged
    std::ifstream metrics(dir.path() / "bad_id" / "metrics.jsonl");
    int lines = 0;
    for (std::string line; std::getline(metrics, line);) lines += !line.empty();
    EXPECT_EQ(lines, 1);
  }
}

}  // namespace
}  // namespace moepeak
