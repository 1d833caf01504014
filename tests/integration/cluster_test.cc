// Multi-process tests on loopback: a real ps_coordinator and real ps_server processes,
// with workers played by threads of this test (RegisterWithCoordinator + KVClient), so
// that the test knows every gradient pushed and can demand exact final values.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/registration.h"
#include "common/shard_map.h"
#include "common/transport.h"
#include "common/wire.h"
#include "tests/integration/job_test_util.h"
#include "tests/integration/process.h"
#include "worker/kv_client.h"

namespace ps {
namespace {

using itest::ChildProcess;
using itest::Deadline;
using itest::DeadlineIn;
using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

using itest::CallExpecting;
using itest::FinalEvalReport;
using itest::kTestTimeout;
using itest::OneFrame;
using itest::SendDone;
using itest::SendReport;
using itest::TimeLeft;
using itest::WorkerRegisterFrames;

class ClusterTest : public itest::JobTest {};

// ---- the exact-values test ----

constexpr int kWorkers = 3;
constexpr int kServers = 2;
constexpr int kRounds = 3;  // each worker pushes everything this many times
constexpr uint64_t kDenseRows = 10;
constexpr uint32_t kDenseWidth = 4;
constexpr uint32_t kSparseWidth = 3;
constexpr uint64_t kTop = uint64_t{1} << 63;

// Rows of the dense table pushed again by key list (out of order, to test the scatter).
const std::vector<uint64_t> kDenseKeys = {9, 0, 4, 7};
// Sparse ids every worker pushes: small ones and ones only a uint64 holds.
const std::vector<uint64_t> kSparseKeys = {0,        1,        42,       kTop,
                                           kTop + 1, kTop + 2, kTop + 3, ~uint64_t{0}};
// Only worker w pushes sparse row kOwnKeyBase + w.
constexpr uint64_t kOwnKeyBase = uint64_t{1} << 40;
// Never pushed: must read as the initializer's zeros.
constexpr uint64_t kUntouchedKey = 7777;

// The gradients, as functions of (worker, row, column). Every value is a small multiple
// of 1/16, so every sum of them is exact in float whatever the order of application, and
// the final values can be compared with ==.
float RangeGrad(int w, uint64_t row, uint32_t c) {
  return static_cast<float>((w + 1) * (0.5 * static_cast<double>(row + 1) + 0.25 * c));
}
float DenseKeyGrad(int w, uint64_t row, uint32_t c) {
  return static_cast<float>((w + 1) * 0.125 * static_cast<double>(row + 1 + c));
}
float SparseGrad(int w, size_t index, uint32_t c) {
  return static_cast<float>((w + 1) * 0.0625 * static_cast<double>((index + 1) * (c + 1)));
}
float OwnKeyGrad(int w, uint32_t c) { return static_cast<float>(0.75 * (w + 1) + c); }

struct WorkerRun {
  Status status;
  Registration reg;         // its coordinator socket sends worker 0's final report
  uint64_t push_parts = 0;  // per-server push requests sent, from the shard map
  // Worker 0 pulls these after the barrier.
  std::vector<float> dense_range, dense_keys, sparse, own_keys, untouched;
};

Status PushEverything(KVClient& client, const ShardMap& shard, int w, uint64_t* parts) {
  PS_ASSIGN_OR_RETURN(uint32_t dense, client.FindTable("dense"));
  PS_ASSIGN_OR_RETURN(uint32_t emb, client.FindTable("emb"));
  std::vector<float> range_grads(kDenseRows * kDenseWidth);
  for (uint64_t r = 0; r < kDenseRows; ++r) {
    for (uint32_t c = 0; c < kDenseWidth; ++c) {
      range_grads[r * kDenseWidth + c] = RangeGrad(w, r, c);
    }
  }
  std::vector<float> key_grads(kDenseKeys.size() * kDenseWidth);
  for (size_t i = 0; i < kDenseKeys.size(); ++i) {
    for (uint32_t c = 0; c < kDenseWidth; ++c) {
      key_grads[i * kDenseWidth + c] = DenseKeyGrad(w, kDenseKeys[i], c);
    }
  }
  std::vector<float> sparse_grads(kSparseKeys.size() * kSparseWidth);
  for (size_t i = 0; i < kSparseKeys.size(); ++i) {
    for (uint32_t c = 0; c < kSparseWidth; ++c) {
      sparse_grads[i * kSparseWidth + c] = SparseGrad(w, i, c);
    }
  }
  const std::vector<uint64_t> own_key = {kOwnKeyBase + static_cast<uint64_t>(w)};
  std::vector<float> own_grads(kSparseWidth);
  for (uint32_t c = 0; c < kSparseWidth; ++c) own_grads[c] = OwnKeyGrad(w, c);

  // All rounds go out before any wait, so that many requests are in flight at once.
  std::vector<Ticket> tickets;
  for (int round = 0; round < kRounds; ++round) {
    tickets.push_back(client.PushRange(dense, RowRange{0, kDenseRows}, range_grads));
    *parts += shard.SplitRange(dense, RowRange{0, kDenseRows}).size();
    tickets.push_back(client.Push(dense, kDenseKeys, key_grads));
    *parts += shard.SplitKeys(dense, kDenseKeys).size();
    tickets.push_back(client.Push(emb, kSparseKeys, sparse_grads));
    *parts += shard.SplitKeys(emb, kSparseKeys).size();
  }
  tickets.push_back(client.Push(emb, own_key, own_grads));
  *parts += shard.SplitKeys(emb, own_key).size();
  Status first;
  for (Ticket t : tickets) {
    Status s = client.Wait(t);
    if (first.ok() && !s.ok()) first = s.WithContext("push");
  }
  return first;
}

Status PullEverything(KVClient& client, WorkerRun* out) {
  PS_ASSIGN_OR_RETURN(uint32_t dense, client.FindTable("dense"));
  PS_ASSIGN_OR_RETURN(uint32_t emb, client.FindTable("emb"));
  out->dense_range.assign(kDenseRows * kDenseWidth, -1.0f);
  out->dense_keys.assign(kDenseKeys.size() * kDenseWidth, -1.0f);
  out->sparse.assign(kSparseKeys.size() * kSparseWidth, -1.0f);
  out->own_keys.assign(kWorkers * kSparseWidth, -1.0f);
  out->untouched.assign(kSparseWidth, -1.0f);
  std::vector<uint64_t> own_keys;
  for (int w = 0; w < kWorkers; ++w) own_keys.push_back(kOwnKeyBase + static_cast<uint64_t>(w));
  const std::vector<uint64_t> untouched = {kUntouchedKey};
  std::vector<Ticket> tickets = {
      client.PullRange(dense, RowRange{0, kDenseRows}, out->dense_range),
      client.Pull(dense, kDenseKeys, out->dense_keys),
      client.Pull(emb, kSparseKeys, out->sparse),
      client.Pull(emb, own_keys, out->own_keys),
      client.Pull(emb, untouched, out->untouched),
  };
  Status first;
  for (Ticket t : tickets) {
    Status s = client.Wait(t);
    if (first.ok() && !s.ok()) first = s.WithContext("pull");
  }
  return first;
}

// One worker: register, push, wait at the barrier, and (worker 0) pull everything.
void RunWorker(Transport* transport, const std::string& coordinator, int thread_index,
               Deadline deadline, WorkerRun* out) {
  RegisterRequest req;
  req.device = "test thread " + std::to_string(thread_index);
  Result<Registration> reg =
      RegisterWithCoordinator(transport, coordinator, req, TimeLeft(deadline));
  if (!reg.ok()) {
    out->status = reg.status();
    return;
  }
  out->reg = std::move(reg).value();
  const int w = out->reg.id;
  const JobConfig& config = out->reg.config;
  KVClientOptions opt;
  opt.client_id = w;
  opt.request_timeout =
      std::min<std::chrono::milliseconds>(TimeLeft(deadline), std::chrono::seconds(30));
  Result<std::unique_ptr<KVClient>> client =
      KVClient::Create(transport, config, out->reg.server_endpoints, opt);
  Status pushed = client.ok()
                      ? PushEverything(**client, ShardMap(config.table_specs, config.num_servers),
                                       w, &out->push_parts)
                      : client.status();
  // Done even after a failure, as a real worker does, so that the others are not held at
  // the barrier until their deadline.
  Status done = SendDone(*out->reg.coordinator, w, pushed, deadline);
  out->status = !pushed.ok() ? pushed : done.WithContext("done");
  if (!out->status.ok() || w != 0) return;
  // Past the barrier every worker's pushes have been acknowledged, hence applied.
  out->status = PullEverything(**client, out);
}

TEST_F(ClusterTest, ThreeWorkersPushKnownGradientsAndFinalValuesAreExact) {
  const Deadline deadline = DeadlineIn(kTestTimeout);
  std::string endpoint;
  Result<ChildProcess> coordinator = StartCoordinator(
      {"--model=none", "--tables=dense:10:4:zeros,emb:sparse:3:zeros",
       "--num_servers=" + std::to_string(kServers), "--num_workers=" + std::to_string(kWorkers),
       // The expected values below assume plain SGD at a fixed rate of 1, applied as
       // soon as it arrives; pinned so that a change of defaults cannot move them.
       "--base_lr=1", "--optimizer=sgd", "--lr_policy=fixed", "--weight_decay=0",
       "--clip_grad_norm=0", "--staleness=-1", "--epochs=1"},
      deadline, &endpoint);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  std::vector<ChildProcess> servers;
  for (int i = 0; i < kServers; ++i) {
    Result<ChildProcess> s = StartServer(i, endpoint);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    servers.push_back(std::move(s).value());
  }

  Transport transport(ClientTransportOptions());
  std::vector<WorkerRun> runs(kWorkers);
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < kWorkers; ++i) {
      threads.emplace_back(RunWorker, &transport, endpoint, i, deadline, &runs[i]);
    }
    for (std::thread& t : threads) t.join();
  }
  std::vector<int> ids;
  uint64_t push_parts = 0;
  WorkerRun* worker0 = nullptr;
  for (int i = 0; i < kWorkers; ++i) {
    ASSERT_TRUE(runs[i].status.ok()) << "worker thread " << i << ": " << runs[i].status.ToString();
    ids.push_back(runs[i].reg.id);
    push_parts += runs[i].push_parts;
    if (runs[i].reg.id == 0) worker0 = &runs[i];
  }
  EXPECT_THAT(ids, ::testing::UnorderedElementsAre(0, 1, 2));
  ASSERT_NE(worker0, nullptr);
  ASSERT_EQ(worker0->reg.server_endpoints.size(), static_cast<size_t>(kServers));

  // The test must reach both servers with every kind of request, or it proves less than
  // it claims.
  const std::vector<TableSpec>& tables = worker0->reg.config.table_specs;
  ASSERT_EQ(tables.size(), 2u);
  ASSERT_EQ(tables[0].name, "dense");
  ASSERT_EQ(tables[1].name, "emb");
  ShardMap shard(tables, kServers);
  EXPECT_EQ(shard.SplitRange(0, RowRange{0, kDenseRows}).size(), 2u);
  EXPECT_EQ(shard.SplitKeys(0, kDenseKeys).size(), 2u);
  EXPECT_EQ(shard.SplitKeys(1, kSparseKeys).size(), 2u);

  // value = 0 - lr * (sum of every gradient pushed to it), lr = 1.
  for (uint64_t r = 0; r < kDenseRows; ++r) {
    for (uint32_t c = 0; c < kDenseWidth; ++c) {
      double sum = 0;
      for (int w = 0; w < kWorkers; ++w) {
        sum += kRounds * static_cast<double>(RangeGrad(w, r, c));
        if (std::find(kDenseKeys.begin(), kDenseKeys.end(), r) != kDenseKeys.end()) {
          sum += kRounds * static_cast<double>(DenseKeyGrad(w, r, c));
        }
      }
      EXPECT_EQ(worker0->dense_range[r * kDenseWidth + c], static_cast<float>(-sum))
          << "dense row " << r << " column " << c;
    }
  }
  for (size_t i = 0; i < kDenseKeys.size(); ++i) {
    for (uint32_t c = 0; c < kDenseWidth; ++c) {
      // The key-list pull must agree with the range pull.
      EXPECT_EQ(worker0->dense_keys[i * kDenseWidth + c],
                worker0->dense_range[kDenseKeys[i] * kDenseWidth + c])
          << "dense row " << kDenseKeys[i] << " column " << c << " pulled by key";
    }
  }
  for (size_t i = 0; i < kSparseKeys.size(); ++i) {
    for (uint32_t c = 0; c < kSparseWidth; ++c) {
      double sum = 0;
      for (int w = 0; w < kWorkers; ++w) sum += kRounds * static_cast<double>(SparseGrad(w, i, c));
      EXPECT_EQ(worker0->sparse[i * kSparseWidth + c], static_cast<float>(-sum))
          << "sparse key " << kSparseKeys[i] << " column " << c;
    }
  }
  for (int w = 0; w < kWorkers; ++w) {
    for (uint32_t c = 0; c < kSparseWidth; ++c) {
      EXPECT_EQ(worker0->own_keys[static_cast<size_t>(w) * kSparseWidth + c], -OwnKeyGrad(w, c))
          << "sparse key pushed only by worker " << w << ", column " << c;
    }
  }
  EXPECT_THAT(worker0->untouched, ::testing::Each(0.0f)) << "a sparse row nobody pushed";

  // The final evaluation ends the job: the coordinator shuts the servers down and writes
  // the summary.
  Status reported = SendReport(*worker0->reg.coordinator, 0, FinalEvalReport(), deadline);
  ASSERT_TRUE(reported.ok()) << reported.ToString();
  ExpectCleanExit(*coordinator, "ps_coordinator", deadline);
  for (int i = 0; i < kServers; ++i) {
    ExpectCleanExit(servers[i], "ps_server " + std::to_string(i), deadline);
  }

  Result<json> summary = ReadSummary();
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ(summary->value("status", ""), "ok") << summary->dump(2);
  EXPECT_EQ(summary->value("pushes_applied", uint64_t{0}), push_parts) << summary->dump(2);
  EXPECT_EQ(summary->value("pushes_rejected", uint64_t{1}), 0u) << summary->dump(2);
  EXPECT_EQ(summary->value("pushes_dropped", uint64_t{0}), 0u) << summary->dump(2);
  ASSERT_TRUE(summary->contains("servers") && (*summary)["servers"].is_array());
  EXPECT_EQ((*summary)["servers"].size(), static_cast<size_t>(kServers));
  for (const json& s : (*summary)["servers"]) {
    // Both servers took a share of the pushes.
    EXPECT_GT(s.value("pushes_applied", uint64_t{0}), 0u) << s.dump();
    EXPECT_FALSE(s.contains("error")) << s.dump();
  }
  ASSERT_TRUE(summary->contains("workers") && (*summary)["workers"].is_array());
  EXPECT_EQ((*summary)["workers"].size(), static_cast<size_t>(kWorkers));
}

// ---- refused registrations ----

// A one-server, one-worker job whose only table is small.
const std::vector<std::string> kTinyJob = {"--model=none", "--tables=t:4:2:zeros",
                                           "--num_servers=1", "--num_workers=1"};

// The rest of a one-worker job once its worker is registered: done (the barrier opens at
// once), then the final report; the coordinator then stops the server and exits.
Status FinishOneWorkerJob(ClientSocket& coordinator, int worker_id, Deadline deadline) {
  PS_RETURN_IF_ERROR(SendDone(coordinator, worker_id, Status::Ok(), deadline).WithContext("done"));
  return SendReport(coordinator, worker_id, FinalEvalReport(), deadline).WithContext("report");
}

TEST_F(ClusterTest, WorkerWithAnotherProtocolVersionIsRefused) {
  const Deadline deadline = DeadlineIn(kTestTimeout);
  std::string endpoint;
  Result<ChildProcess> coordinator = StartCoordinator(kTinyJob, deadline, &endpoint);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();

  Transport transport(ClientTransportOptions());
  Result<std::unique_ptr<ClientSocket>> socket = transport.Connect(endpoint);
  ASSERT_TRUE(socket.ok()) << socket.status().ToString();
  ASSERT_TRUE((*socket)->Send(WorkerRegisterFrames(999, 77, "from the future")).ok());
  Result<Frames> reply = (*socket)->Recv(TimeLeft(deadline));
  ASSERT_TRUE(reply.ok()) << "no answer to a registration of protocol 999: "
                          << reply.status().ToString();
  ASSERT_FALSE(reply->empty());
  Result<DecodedHeader> h = DecodedHeader::Decode((*reply)[0]);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->get().getRequestId(), 77u) << "the error must echo the request id";
  ASSERT_EQ(h->get().getBody().which(), wire::Header::Body::ERROR);
  EXPECT_EQ(h->get().getBody().getError().getCode(), wire::ErrorCode::VERSION_MISMATCH);
  EXPECT_THAT(std::string(h->get().getBody().getError().getMessage().cStr()),
              ::testing::HasSubstr("999"));

  // The refused peer took no worker slot: the job still assembles with a real worker and
  // runs to its end.
  Result<ChildProcess> server = StartServer(0, endpoint);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  RegisterRequest req;
  req.device = "test";
  Result<Registration> reg = RegisterWithCoordinator(&transport, endpoint, req, TimeLeft(deadline));
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  EXPECT_EQ(reg->id, 0);
  Status finished = FinishOneWorkerJob(*reg->coordinator, reg->id, deadline);
  ASSERT_TRUE(finished.ok()) << finished.ToString();
  ExpectCleanExit(*coordinator, "ps_coordinator", deadline);
  ExpectCleanExit(*server, "ps_server", deadline);
  Result<json> summary = ReadSummary();
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ(summary->value("status", ""), "ok") << summary->dump(2);
  EXPECT_EQ((*summary)["workers"].size(), 1u) << summary->dump(2);
}

TEST_F(ClusterTest, WorkerBeyondTheJobsWorkerCountIsRefused) {
  const Deadline deadline = DeadlineIn(kTestTimeout);
  std::string endpoint;
  Result<ChildProcess> coordinator = StartCoordinator(kTinyJob, deadline, &endpoint);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();

  Transport transport(ClientTransportOptions());
  // The first worker registers; its answer waits for the server, which is not started yet.
  Result<std::unique_ptr<ClientSocket>> first = transport.Connect(endpoint);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE((*first)->Send(WorkerRegisterFrames(wire::PROTOCOL_VERSION, 1, "first")).ok());
  // A second request on the same socket is answered only after the registration before it
  // was handled (one connection keeps its order), so the slot is surely taken when the
  // second worker comes. While the job assembles, the answer is an error; any answer will do.
  {
    capnp::MallocMessageBuilder b;
    NewHeader(b, 2, -1).getBody().setHeartbeat();
    ASSERT_TRUE((*first)->Send(OneFrame(b)).ok());
    Result<Frames> fence = (*first)->Recv(TimeLeft(deadline));
    ASSERT_TRUE(fence.ok()) << fence.status().ToString();
    Result<DecodedHeader> h = DecodedHeader::Decode((*fence)[0]);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    ASSERT_EQ(h->get().getRequestId(), 2u) << "the registration was answered before the job "
                                              "assembled";
  }

  RegisterRequest req;
  req.device = "second";
  Result<Registration> second =
      RegisterWithCoordinator(&transport, endpoint, req, std::chrono::seconds(10));
  ASSERT_FALSE(second.ok()) << "a second worker joined a job of one worker";
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition) << second.status().ToString();
  EXPECT_THAT(second.status().message(), ::testing::HasSubstr("it has all 1 of its workers"));

  // The refusal changed nothing: the job assembles with the first worker and ends well.
  Result<ChildProcess> server = StartServer(0, endpoint);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  Result<Frames> registered = (*first)->Recv(TimeLeft(deadline));
  ASSERT_TRUE(registered.ok()) << registered.status().ToString();
  Result<DecodedHeader> h = DecodedHeader::Decode((*registered)[0]);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->get().getRequestId(), 1u);
  ASSERT_EQ(h->get().getBody().which(), wire::Header::Body::REGISTER_REPLY);
  EXPECT_EQ(h->get().getBody().getRegisterReply().getId(), 0u);
  Status finished = FinishOneWorkerJob(**first, 0, deadline);
  ASSERT_TRUE(finished.ok()) << finished.ToString();
  ExpectCleanExit(*coordinator, "ps_coordinator", deadline);
  ExpectCleanExit(*server, "ps_server", deadline);
  Result<json> summary = ReadSummary();
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ(summary->value("status", ""), "ok") << summary->dump(2);
  ASSERT_EQ((*summary)["workers"].size(), 1u) << summary->dump(2);
  EXPECT_EQ((*summary)["workers"][0].value("device", ""), "first");
}

// Workers' reports are network input: one with a field of the wrong type, or not JSON at
// all, gets an error, and the coordinator goes on to end the job cleanly.
TEST_F(ClusterTest, MalformedReportsAreRefusedAndTheJobGoesOn) {
  const Deadline deadline = DeadlineIn(kTestTimeout);
  std::string endpoint;
  Result<ChildProcess> coordinator = StartCoordinator(kTinyJob, deadline, &endpoint);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  Result<ChildProcess> server = StartServer(0, endpoint);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  Transport transport(ClientTransportOptions());
  RegisterRequest req;
  req.device = "test";
  Result<Registration> reg = RegisterWithCoordinator(&transport, endpoint, req, TimeLeft(deadline));
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  for (const char* text : {R"({"kind":"train","examples":"many"})", R"({"kind":7})",
                           R"({"kind":"eval","final":"yes"})", "not json", "[1,2]"}) {
    capnp::MallocMessageBuilder b;
    NewHeader(b, 5, 0).getBody().initReport().setJson(text);
    Result<CallReply> reply = Call(*reg->coordinator, OneFrame(b), TimeLeft(deadline));
    ASSERT_FALSE(reply.ok()) << "the coordinator accepted " << text;
    EXPECT_EQ(reply.status().code(), StatusCode::kInvalidArgument) << reply.status().ToString();
  }
  Status finished = FinishOneWorkerJob(*reg->coordinator, 0, deadline);
  ASSERT_TRUE(finished.ok()) << finished.ToString();
  ExpectCleanExit(*coordinator, "ps_coordinator", deadline);
  ExpectCleanExit(*server, "ps_server", deadline);
}

}  // namespace
}  // namespace ps
