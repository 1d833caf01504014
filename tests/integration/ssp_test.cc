// The staleness bound across real processes: a real coordinator and two real servers,
// three workers played by threads of this test, one of them 4x slower than the others.
// Each worker owns a row of a `counter` table and pushes a gradient of 1 into it once per
// clock; with SGD at base_lr 1, minus row w is the number of clocks worker w has pushed.
// Every pull therefore shows exactly which clocks of every worker it sees, and the test
// checks the SSP invariant of Ho et al. 2013 directly: a worker pulling at clock c sees
// every update of clocks <= c - S - 1 of every worker.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tests/integration/job_test_util.h"
#include "worker/kv_client.h"

namespace ps {
namespace {

using itest::Deadline;
using itest::DeadlineIn;
using itest::json;

constexpr int kWorkers = 3;
constexpr int kClocks = 24;
constexpr int kSlowWorker = 2;
constexpr auto kStep = std::chrono::milliseconds(3);  // a fast worker's "compute"

struct WorkerLog {
  Status status;
  // Over all pulls: the smallest margin (clocks seen of another worker) - (c - S), which
  // the invariant requires to be >= 0, and the largest lead c - (clocks seen of another).
  int64_t min_margin = INT64_MAX;
  int64_t max_lead = INT64_MIN;
  double held_seconds = 0;  // time the servers held this worker's pulls
};

class SspTest : public itest::JobTest, public ::testing::WithParamInterface<int> {};

Status RunWorker(Transport* transport, const std::string& coordinator, int staleness,
                 Deadline deadline, WorkerLog* log, Registration* reg_out) {
  RegisterRequest req;
  req.device = "test thread";
  PS_ASSIGN_OR_RETURN(Registration reg, RegisterWithCoordinator(transport, coordinator, req,
                                                                itest::TimeLeft(deadline)));
  KVClientOptions o;
  o.client_id = reg.id;
  o.request_timeout = itest::TimeLeft(deadline);
  PS_ASSIGN_OR_RETURN(auto client,
                      KVClient::Create(transport, reg.config, reg.server_endpoints, o));
  PS_ASSIGN_OR_RETURN(uint32_t counter, client->FindTable("counter"));
  const int w = reg.id;
  std::vector<float> rows(kWorkers);
  std::vector<float> one(1, 1.0f);
  std::vector<Ticket> in_flight;
  for (int c = 0; c < kClocks; ++c) {
    RequestInfo info;
    PS_RETURN_IF_ERROR(
        client->Wait(client->PullRange(counter, RowRange{0, kWorkers}, rows), &info));
    log->held_seconds += info.held_seconds;
    for (int j = 0; j < kWorkers; ++j) {
      if (j == w) continue;
      const int64_t seen = static_cast<int64_t>(-rows[static_cast<size_t>(j)]);
      log->max_lead = std::max(log->max_lead, c - seen);
      if (staleness >= 0) log->min_margin = std::min(log->min_margin, seen - (c - staleness));
    }
    std::this_thread::sleep_for(w == kSlowWorker ? kStep * 4 : kStep);  // the step's compute
    for (Ticket t : in_flight) PS_RETURN_IF_ERROR(client->Wait(t));
    in_flight = {
        client->PushRange(counter, RowRange{static_cast<uint64_t>(w), static_cast<uint64_t>(w) + 1},
                          one),
        client->Clock()};
  }
  for (Ticket t : in_flight) PS_RETURN_IF_ERROR(client->Wait(t));
  PS_RETURN_IF_ERROR(client->Wait(client->Leave()));
  PS_RETURN_IF_ERROR(itest::SendDone(*reg.coordinator, w, Status::Ok(), deadline));
  *reg_out = std::move(reg);
  return Status::Ok();
}

TEST_P(SspTest, EveryPullSeesTheUpdatesTheBoundPromises) {
  const int staleness = GetParam();
  const Deadline deadline = DeadlineIn(itest::kTestTimeout);
  std::string endpoint;
  auto coordinator =
      StartCoordinator({"--model=none", "--tables=counter:" + std::to_string(kWorkers) + ":1:zeros",
                        "--num_servers=2", "--num_workers=" + std::to_string(kWorkers),
                        "--staleness=" + std::to_string(staleness), "--optimizer=sgd",
                        "--lr_policy=fixed", "--base_lr=1", "--staleness_wait_seconds=30"},
                       deadline, &endpoint);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  auto s0 = StartServer(0, endpoint);
  auto s1 = StartServer(1, endpoint);
  ASSERT_TRUE(s0.ok() && s1.ok());

  Transport transport(ClientTransportOptions());
  std::vector<WorkerLog> logs(kWorkers);
  std::vector<Registration> regs(kWorkers);
  std::vector<std::thread> threads;
  // Registration order decides the ids, so each thread learns its id from the reply; the
  // logs are indexed by thread and re-keyed by id below.
  std::vector<int> ids(kWorkers, -1);
  for (int i = 0; i < kWorkers; ++i) {
    threads.emplace_back([&, i] {
      WorkerLog log;
      Registration reg;
      log.status = RunWorker(&transport, endpoint, staleness, deadline, &log, &reg);
      ids[static_cast<size_t>(i)] = log.status.ok() ? reg.id : -1;
      logs[static_cast<size_t>(i)] = log;
      regs[static_cast<size_t>(i)] = std::move(reg);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kWorkers; ++i) {
    ASSERT_TRUE(logs[i].status.ok()) << "worker thread " << i << ": " << logs[i].status.ToString();
  }
  // Worker 0 ends the job with the final report.
  for (int i = 0; i < kWorkers; ++i) {
    if (ids[i] == 0) {
      ASSERT_TRUE(
          itest::SendReport(*regs[i].coordinator, 0, itest::FinalEvalReport(), deadline).ok());
    }
  }
  ExpectCleanExit(*coordinator, "coordinator", deadline);
  ExpectCleanExit(*s0, "server 0", deadline);
  ExpectCleanExit(*s1, "server 1", deadline);

  double fast_held = 0;
  int64_t fast_lead = INT64_MIN;
  for (int i = 0; i < kWorkers; ++i) {
    const WorkerLog& log = logs[i];
    if (staleness >= 0) {
      EXPECT_GE(log.min_margin, 0) << "worker " << ids[i] << " pulled before seeing clocks the "
                                   << "bound promises (S=" << staleness << ")";
      EXPECT_LE(log.max_lead, staleness + 1) << "worker " << ids[i];
    }
    if (ids[i] != kSlowWorker) {
      fast_held += log.held_seconds;
      fast_lead = std::max(fast_lead, log.max_lead);
    }
  }
  auto summary = ReadSummary();
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  if (staleness >= 0) {
    // The fast workers waited on the slow one, and the servers never served a pull further
    // ahead than the bound.
    EXPECT_GT(fast_held, 0.0);
    EXPECT_LE((*summary)["max_clock_lag_seen"].get<int64_t>(), staleness);
    EXPECT_GT((*summary)["pulls_held"].get<uint64_t>(), 0u);
    if (staleness == 0) {
      EXPECT_LE(fast_lead, 1) << "BSP: two workers more than a clock apart";
    }
  } else {
    // ASP: nobody waits, and the fast workers run far ahead of the slow one.
    EXPECT_EQ(fast_held, 0.0);
    EXPECT_EQ((*summary)["pulls_held"].get<uint64_t>(), 0u);
    EXPECT_GT(fast_lead, 6) << "ASP: the fast workers should have run ahead freely";
  }
}

INSTANTIATE_TEST_SUITE_P(Bounds, SspTest, ::testing::Values(0, 1, 3, -1),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return p.param < 0 ? std::string("Asp")
                                              : "Staleness" + std::to_string(p.param);
                         });

}  // namespace
}  // namespace ps
