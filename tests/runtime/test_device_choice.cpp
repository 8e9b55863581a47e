// visible_cuda_device: which CUDA ordinal a rank opens for the GPU it wants, under the launchers'
// two ways of showing GPUs (all of the node's to every rank, or one per rank). Pure host logic,
// so it runs without a GPU. Run: ctest -R test_device_choice
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "core/runtime/backend.h"

namespace moepeak {
namespace {

TEST(VisibleCudaDevice, EveryRankSeesTheNodesGpus) {
  for (int rank = 0; rank < 8; ++rank) EXPECT_EQ(visible_cuda_device(rank, 8, nullptr), rank);
  EXPECT_EQ(visible_cuda_device(3, 8, "0,1,2,3,4,5,6,7"), 3);
}

TEST(VisibleCudaDevice, EachRankSeesOneGpu) {
  // srun --gpus-per-task=1: local rank 5 sees one GPU, ordinal 0.
  for (int rank = 0; rank < 8; ++rank) EXPECT_EQ(visible_cuda_device(rank, 1, "5"), 0);
}

std::string message_of(int wanted, int visible, const char* env) {
  try {
    visible_cuda_device(wanted, visible, env);
  } catch (const Error& e) {
    return e.message();
  }
  ADD_FAILURE() << "wanted " << wanted << " of " << visible << " visible was accepted";
  return "";
}

TEST(VisibleCudaDevice, TooFewVisibleIsAnErrorNamingBoth) {
  const std::string m = message_of(3, 2, "4,5");
  EXPECT_NE(m.find("CUDA device 3"), std::string::npos) << m;
  EXPECT_NE(m.find("sees only 2"), std::string::npos) << m;
  EXPECT_NE(m.find("CUDA_VISIBLE_DEVICES=4,5"), std::string::npos) << m;
  const std::string none = message_of(0, 0, nullptr);
  EXPECT_NE(none.find("no CUDA device is usable"), std::string::npos) << none;
  EXPECT_NE(none.find("CUDA_VISIBLE_DEVICES unset"), std::string::npos) << none;
  EXPECT_NE(message_of(-1, 4, nullptr).find("CUDA device -1"), std::string::npos);
}

}  // namespace
}  // namespace moepeak
