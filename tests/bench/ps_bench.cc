// ps_bench: push and pull goodput of the parameter server against raw ZeroMQ, measured in
// the same run over the same transport (servers run in this process on their own threads,
// as the raw ZeroMQ echo peer does, so both pay for the same loopback path and cores).
//
//   ps_bench [--transport=tcp|ipc] [--seconds=0.5] [--sizes_mb=1,4,16,64] [--json=FILE]
//   ps_bench --curve=compare [--io_threads=N]   dense push/pull with CURVE vs plain, same run
//
// Dense rows: a table of 1024-float rows sized to the message; one Push/Pull covers it
// all and is split across the servers. Raw ZeroMQ: a DEALER sends the same bytes to a
// ROUTER that answers with an 8-byte ack, one message in flight (as a push waits for its
// ack). Sparse: pulls of 1000 random keys of a 16-float sparse table.
#include <gflags/gflags.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <tuple>

#include "common/job_config.h"
#include "common/security.h"
#include "common/transport.h"
#include "server/server_core.h"
#include "server/server_node.h"
#include "worker/kv_client.h"

DEFINE_string(transport, "tcp", "tcp | ipc");
DEFINE_double(seconds, 0.5, "time per measurement");
DEFINE_string(sizes_mb, "1,4,16,64", "dense payload sizes in MB");
DEFINE_string(json, "", "also write one JSON object per row to this file");
DEFINE_string(curve, "off",
              "off: plain ZeroMQ; on: every socket speaks CURVE; compare: dense push/pull "
              "both ways in the same run, with the ratio");
DEFINE_int32(io_threads, 1, "ZeroMQ I/O threads (CURVE encrypts on them)");

namespace ps {
namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr int kRowFloats = 1024;

std::string Endpoint(const std::string& name) {
  if (FLAGS_transport == "ipc")
    return "ipc:///tmp/ps_bench_" + std::to_string(getpid()) + "_" + name;
  return "tcp://127.0.0.1:*";
}

// Runs `op` repeatedly for about FLAGS_seconds (after one warm-up) and returns calls/s.
template <typename F>
double Rate(F&& op) {
  op();
  int n = 0;
  auto start = SteadyClock::now();
  double elapsed = 0;
  do {
    op();
    ++n;
    elapsed = std::chrono::duration<double>(SteadyClock::now() - start).count();
  } while (elapsed < FLAGS_seconds || n < 3);
  return n / elapsed;
}

double RawZmqGbps(Transport& t, size_t bytes) {
  auto server = t.Listen(Endpoint("raw")).value();
  std::atomic<bool> stop{false};
  std::thread echo([&] {
    while (!stop.load()) {
      Result<Incoming> in = server->Recv(std::chrono::milliseconds(50));
      if (!in.ok()) continue;
      Frames ack;
      ack.push_back(zmq::message_t(8));
      (void)server->Send(in->peer, std::move(ack));
    }
  });
  auto client = t.Connect(server->BoundEndpoint()).value();
  std::vector<char> payload(bytes, 1);
  double rate = Rate([&] {
    Frames f;
    f.push_back(zmq::message_t(8));
    f.push_back(CopyFrame(payload.data(), bytes));  // ps copies once too
    (void)client->Send(std::move(f));
    (void)client->Recv(std::chrono::seconds(30));
  });
  stop = true;
  echo.join();
  return rate * bytes / 1e9;
}

struct Cluster {
  JobConfig config;
  std::vector<std::unique_ptr<ServerCore>> cores;
  std::vector<std::unique_ptr<ServerSocket>> sockets;
  std::vector<std::thread> threads;
  std::atomic<bool> stop{false};
  std::unique_ptr<KVClient> client;

  Cluster(Transport& t, int servers, const std::string& tables) {
    std::map<std::string, std::string> flags = {{"model", "none"},
                                                {"tables", tables},
                                                {"num_servers", std::to_string(servers)},
                                                {"num_workers", "1"}};
    config = JobConfig::FromFlagMap(flags).value();
    std::vector<std::string> endpoints;
    for (int s = 0; s < servers; ++s) {
      cores.push_back(ServerCore::Create(config, s).value());
      sockets.push_back(t.Listen(Endpoint("s" + std::to_string(s))).value());
      endpoints.push_back(sockets.back()->BoundEndpoint());
    }
    for (int s = 0; s < servers; ++s) {
      threads.emplace_back([this, s] {
        (void)ServeUntilShutdown(*sockets[s], *cores[s], stop, std::chrono::milliseconds(50));
      });
    }
    client = KVClient::Create(&t, config, endpoints, KVClientOptions{}).value();
  }
  ~Cluster() {
    client.reset();
    stop = true;
    for (auto& th : threads) th.join();
  }
};

// Security for a Transport whose listeners and clients are all of this process.
SecurityOptions BenchCurve() {
  SecurityOptions s;
  s.curve = true;
  CurveKeyPair server = GenerateCurveKeyPair().value();
  // One Transport has one SecurityOptions, so its listeners and clients share one pair
  // (as a job's coordinator and servers do); CURVE permits it.
  s.own = server;
  s.server_public_key = server.public_key;
  s.allowed_clients[server.public_key] = "worker";
  return s;
}

// Dense push and pull GB/s over `t` for one payload size and one server.
std::pair<double, double> DenseGbps(Transport& t, size_t bytes) {
  uint64_t table_rows = bytes / (kRowFloats * sizeof(float));
  Cluster c(t, 1, "dense:" + std::to_string(table_rows) + ":" + std::to_string(kRowFloats));
  std::vector<float> buf(table_rows * kRowFloats, 0.0f);
  RowRange all{0, table_rows};
  double push = Rate([&] { (void)c.client->Wait(c.client->PushRange(0, all, buf)); }) * bytes / 1e9;
  double pull = Rate([&] { (void)c.client->Wait(c.client->PullRange(0, all, buf)); }) * bytes / 1e9;
  return {push, pull};
}

void CompareCurve() {
  TransportOptions plain_opt;
  plain_opt.io_threads = FLAGS_io_threads;
  TransportOptions curve_opt = plain_opt;
  curve_opt.security = BenchCurve();
  Transport plain(plain_opt), curve(curve_opt);
  std::vector<int> sizes = ParseIntList("sizes_mb", FLAGS_sizes_mb).value();
  std::printf("ps_bench: CURVE vs plain over %s, 1 server, %d I/O thread(s), %.1f s each\n",
              FLAGS_transport.c_str(), FLAGS_io_threads, FLAGS_seconds);
  std::printf("%-6s %8s %12s %12s %8s\n", "mode", "size_MB", "plain_GB/s", "curve_GB/s", "ratio");
  std::ofstream json_out;
  if (!FLAGS_json.empty()) json_out.open(FLAGS_json);
  for (int mb : sizes) {
    size_t bytes = static_cast<size_t>(mb) << 20;
    auto [p_push, p_pull] = DenseGbps(plain, bytes);
    auto [c_push, c_pull] = DenseGbps(curve, bytes);
    for (auto [mode, p, c] : {std::tuple<const char*, double, double>{"push", p_push, c_push},
                              {"pull", p_pull, c_pull}}) {
      std::printf("%-6s %8d %12.3f %12.3f %8.3f\n", mode, mb, p, c, c / p);
      if (json_out) {
        json_out << nlohmann::json{{"mode", mode},
                                   {"size_bytes", bytes},
                                   {"path", FLAGS_transport},
                                   {"io_threads", FLAGS_io_threads},
                                   {"plain_gbps", p},
                                   {"curve_gbps", c},
                                   {"ratio", c / p}}
                        .dump()
                 << "\n";
      }
    }
  }
}

void Run() {
  if (FLAGS_curve == "compare") return CompareCurve();
  TransportOptions topt;
  topt.io_threads = FLAGS_io_threads;
  if (FLAGS_curve == "on") topt.security = BenchCurve();
  Transport t(topt);
  std::vector<int> sizes = ParseIntList("sizes_mb", FLAGS_sizes_mb).value();
  std::vector<nlohmann::json> rows;
  std::printf("ps_bench over %s (each figure: %.1f s of back-to-back requests)\n",
              FLAGS_transport.c_str(), FLAGS_seconds);
  std::printf("%-6s %8s %8s %10s %12s %8s\n", "mode", "size_MB", "servers", "GB/s", "raw_zmq_GB/s",
              "ratio");
  for (int mb : sizes) {
    size_t bytes = static_cast<size_t>(mb) << 20;
    double raw = RawZmqGbps(t, bytes);
    for (int servers : {1, 2}) {
      uint64_t table_rows = bytes / (kRowFloats * sizeof(float));
      Cluster c(t, servers,
                "dense:" + std::to_string(table_rows) + ":" + std::to_string(kRowFloats));
      std::vector<float> buf(table_rows * kRowFloats, 0.0f);
      RowRange all{0, table_rows};
      double push =
          Rate([&] { (void)c.client->Wait(c.client->PushRange(0, all, buf)); }) * bytes / 1e9;
      double pull =
          Rate([&] { (void)c.client->Wait(c.client->PullRange(0, all, buf)); }) * bytes / 1e9;
      for (auto [mode, gbps] : {std::pair<const char*, double>{"push", push}, {"pull", pull}}) {
        std::printf("%-6s %8d %8d %10.2f %12.2f %8.2f\n", mode, mb, servers, gbps, raw, gbps / raw);
        rows.push_back({{"mode", mode},
                        {"size_bytes", bytes},
                        {"servers", servers},
                        {"path", FLAGS_transport},
                        {"gbps", gbps},
                        {"zmq_gbps", raw}});
      }
    }
  }
  for (int servers : {1, 2}) {
    Cluster c(t, servers, "sparse:sparse:16");
    std::mt19937_64 rng(1);
    std::vector<uint64_t> keys(1000);
    std::vector<float> out(keys.size() * 16);
    for (auto& k : keys) k = rng() % 1000000;
    (void)c.client->Wait(c.client->Pull(0, keys, out));  // create the rows
    double rate = Rate([&] {
      for (auto& k : keys) k = rng() % 1000000;
      (void)c.client->Wait(c.client->Pull(0, keys, out));
    });
    std::printf("sparse pull, 1000 keys x 16 floats, %d server(s): %.0f rows/s\n", servers,
                rate * keys.size());
    rows.push_back({{"mode", "sparse_pull"},
                    {"keys", keys.size()},
                    {"servers", servers},
                    {"path", FLAGS_transport},
                    {"rows_per_sec", rate * keys.size()}});
  }
  if (!FLAGS_json.empty()) {
    std::ofstream out(FLAGS_json);
    for (const auto& r : rows) out << r.dump() << "\n";
  }
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  ps::Run();
  return 0;
}
