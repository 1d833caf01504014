// The NCCL backend of all-reduce groups (labelled gpu): skips without a GPU or without NCCL
// in the build. A lent machine has one GPU, so the group is of one, which still runs the
// real NCCL path (unique id, communicator, reduce and broadcast through the device); groups
// of several GPUs need a machine with several.
#include <gtest/gtest.h>

#include <chrono>

#include "kernels/nccl_comm.h"
#include "worker/group_comm.h"
#include "worker/group_trainer.h"

namespace ps {
namespace {

using namespace std::chrono_literals;

std::vector<std::span<float>> Spans(std::vector<std::vector<float>>& t) {
  return {t.begin(), t.end()};
}

bool HaveGpu() {
  if (!NcclBuiltIn()) return false;
  Result<std::vector<char>> id = NcclNewUniqueId();
  if (!id.ok()) return false;
  return NcclComm::Create(*id, 0, 1, 0, 20s).ok();
}

TEST(NcclGroupComm, GroupOfOneRunsTheRealNcclPath) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU or no NCCL in this build";
  Transport transport;
  GroupCommOptions o;
  o.size = 1;
  o.device = "cuda:0";
  o.timeout = 30s;
  auto g = JoinGroup(&transport, o);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ((*g)->backend(), "nccl");
  std::vector<std::vector<float>> t = {{1.5f, -2.25f, 3e-7f}, std::vector<float>(4096, 0.1f)};
  auto want = t;
  ASSERT_TRUE((*g)->AllReduceSum(Spans(t)).ok());
  EXPECT_EQ(t, want);  // a sum over one rank is that rank's tensors, bit for bit
  std::vector<int64_t> words = {kGroupFinished};
  EXPECT_TRUE((*g)->BroadcastControl(&words).ok());
}

}  // namespace
}  // namespace ps
