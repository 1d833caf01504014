// The all-reduce group backends: exact sums, broadcast, control words, a member killed
// mid-step (a real process, SIGKILL). NCCL: nccl_group_test.cc.
#include "worker/group_comm.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "worker/group_trainer.h"

namespace ps {
namespace {

using namespace std::chrono_literals;

std::string FreshIpc(const std::string& tag) {
  static int n = 0;
  return "ipc:///tmp/ps-group-test-" + std::to_string(getpid()) + "-" + tag + "-" +
         std::to_string(n++);
}

// Rank r's tensors: values a rank-order sum must reproduce bit for bit.
std::vector<std::vector<float>> Gradients(int rank) {
  std::vector<std::vector<float>> t = {std::vector<float>(1000), std::vector<float>(7)};
  for (auto& v : t) {
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = std::ldexp(static_cast<float>((i * 7 + 3 * rank) % 13) - 6.0f, rank - 3) +
             0.1f * static_cast<float>(rank);
    }
  }
  return t;
}

std::vector<std::span<float>> Spans(std::vector<std::vector<float>>& t) {
  return {t.begin(), t.end()};
}

TEST(CpuGroupComm, GroupOfThreeSumsKnownGradientsExactlyInRankOrder) {
  Transport transport;
  GroupCommOptions base;
  base.size = 3;
  base.leader_endpoint = FreshIpc("sum");
  base.timeout = 20s;
  std::vector<std::vector<std::vector<float>>> results(3);
  std::vector<Status> outcomes(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      GroupCommOptions o = base;
      o.rank = r;
      Result<std::unique_ptr<GroupComm>> g = JoinGroup(&transport, o);
      if (!g.ok()) {
        outcomes[r] = g.status();
        return;
      }
      auto t = Gradients(r);
      outcomes[r] = (*g)->AllReduceSum(Spans(t));
      results[r] = t;
    });
  }
  for (auto& t : threads) t.join();
  // The expected sum, added in rank order: ((g0 + g1) + g2).
  auto want = Gradients(0);
  for (int r = 1; r < 3; ++r) {
    auto g = Gradients(r);
    for (size_t k = 0; k < want.size(); ++k) {
      for (size_t i = 0; i < want[k].size(); ++i) want[k][i] += g[k][i];
    }
  }
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(outcomes[r].ok()) << "rank " << r << ": " << outcomes[r].ToString();
    ASSERT_EQ(results[r].size(), want.size());
    for (size_t k = 0; k < want.size(); ++k) {
      for (size_t i = 0; i < want[k].size(); ++i) {
        ASSERT_EQ(results[r][k][i], want[k][i]) << "rank " << r << " tensor " << k << " at " << i;
      }
    }
  }
}

TEST(CpuGroupComm, ControlWordsAndMemberSlices) {
  Transport transport;
  GroupCommOptions o;
  o.size = 2;
  o.leader_endpoint = FreshIpc("ctl");
  o.timeout = 20s;
  std::vector<int64_t> got;
  Status member_status;
  std::thread member([&] {
    GroupCommOptions m = o;
    m.rank = 1;
    auto g = JoinGroup(&transport, m);
    if (!g.ok()) {
      member_status = g.status();
      return;
    }
    member_status = (*g)->BroadcastControl(&got);
  });
  auto leader = JoinGroup(&transport, o);
  ASSERT_TRUE(leader.ok()) << leader.status().ToString();
  std::vector<int64_t> words = {kGroupStep, 3, 128, 100};
  ASSERT_TRUE((*leader)->BroadcastControl(&words).ok());
  member.join();
  ASSERT_TRUE(member_status.ok()) << member_status.ToString();
  EXPECT_EQ(got, words);
  // Slices cover the step once, in order.
  EXPECT_EQ(MemberSlice(100, 0, 3), std::make_pair(uint64_t{0}, uint64_t{34}));
  EXPECT_EQ(MemberSlice(100, 2, 3), std::make_pair(uint64_t{68}, uint64_t{100}));
  EXPECT_EQ(MemberSlice(1, 1, 2), std::make_pair(uint64_t{1}, uint64_t{1}));
}

TEST(CpuGroupComm, BadOptionsAreRefused) {
  Transport transport;
  GroupCommOptions o;
  o.rank = 3;
  o.size = 2;
  o.leader_endpoint = FreshIpc("bad");
  Result<std::unique_ptr<GroupComm>> g = JoinGroup(&transport, o);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("rank 3 of size 2"), std::string::npos);
}

// A member process killed mid-step (after it got the step, before it sent its gradient):
// the leader's sum fails within the timeout naming the dead rank and leaves the leader's
// gradient as it was (no partial sum); the surviving member is told the group dissolved.
TEST(CpuGroupComm, MemberKilledMidStepNeitherHangsNorSumsPartially) {
  const std::string endpoint = FreshIpc("kill");
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t victim = fork();
  ASSERT_GE(victim, 0);
  if (victim == 0) {
    // The child: rank 2, with its own ZeroMQ context (created after the fork).
    Transport transport;
    GroupCommOptions o;
    o.rank = 2;
    o.size = 3;
    o.leader_endpoint = endpoint;
    o.timeout = 20s;
    auto g = JoinGroup(&transport, o);
    if (!g.ok()) _exit(1);
    auto t = Gradients(2);
    if (!(*g)->ReduceSum(Spans(t)).ok()) _exit(2);  // step 1 completes
    std::vector<int64_t> words;
    if (!(*g)->BroadcastControl(&words).ok()) _exit(3);  // step 2 starts...
    char c = 'x';
    if (write(ready[1], &c, 1) != 1) _exit(4);
    pause();  // ...and this member dies before sending its gradient
    _exit(0);
  }
  close(ready[1]);
  Transport transport;
  GroupCommOptions o;
  o.size = 3;
  o.leader_endpoint = endpoint;
  o.timeout = 3s;
  Status survivor_step2;
  std::vector<float> survivor_sum1;
  std::thread survivor([&] {
    GroupCommOptions m = o;
    m.rank = 1;
    // Longer than the leader's, so that it hears the leader dissolve the group rather than
    // timing out on its own (which would dissolve it as well).
    m.timeout = 20s;
    auto g = JoinGroup(&transport, m);
    if (!g.ok()) {
      survivor_step2 = g.status();
      return;
    }
    auto t = Gradients(1);
    Status s = (*g)->ReduceSum(Spans(t));
    std::vector<int64_t> words;
    if (s.ok()) s = (*g)->BroadcastControl(&words);
    if (s.ok()) s = (*g)->ReduceSum(Spans(t));
    // The leader dissolves the group: the next call says so instead of waiting.
    if (s.ok()) s = (*g)->BroadcastControl(&words);
    survivor_step2 = s;
  });
  auto leader = JoinGroup(&transport, o);
  ASSERT_TRUE(leader.ok()) << leader.status().ToString();
  auto t = Gradients(0);
  ASSERT_TRUE((*leader)->ReduceSum(Spans(t)).ok());  // step 1: all three
  std::vector<int64_t> words = {kGroupStep, 1, 0, 192};
  ASSERT_TRUE((*leader)->BroadcastControl(&words).ok());
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);  // the victim is inside step 2
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(victim, &wstatus, 0), victim);
  auto mine = Gradients(0);
  auto before = mine;
  const auto start = std::chrono::steady_clock::now();
  Status s = (*leader)->ReduceSum(Spans(mine));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_NE(s.message().find("members 2 "), std::string::npos) << s.ToString();
  EXPECT_LT(seconds, 15.0);  // the 3 s timeout, generously: it did not hang
  EXPECT_EQ(mine, before);   // no partial sum of ranks 0 and 1
  (*leader)->Dissolve();
  survivor.join();
  EXPECT_EQ(survivor_step2.code(), StatusCode::kAborted) << survivor_step2.ToString();
  close(ready[0]);
}

}  // namespace
}  // namespace ps
