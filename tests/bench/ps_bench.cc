// ps_bench: push and pull goodput of the parameter server against raw ZeroMQ, measured in
// the same run over the same transport (servers run in this process on their own threads,
// as the raw ZeroMQ echo peer does, so both pay for the same loopback path and cores).
//
//   ps_bench [--transport=tcp|ipc] [--shm=auto|off] [--seconds=0.5] [--sizes_mb=1,4,16,64]
//            [--json=FILE] [--chunk_kb=N] [--rounds=N] [--servers=1,2] [--sparse=false]
//            [--pull=false]
//   ps_bench --curve=compare [--io_threads=N]   dense push/pull with CURVE vs plain, same run
//   ps_bench --think_us=N   each request follows N us of busy work on the caller's thread
//                           (not counted), as in a job, where a worker computes between
//                           requests and the threads a request wakes have gone idle
//   ps_bench --server_threads=N   every in-process server applies and gathers rows with N
//                                 threads (server/apply_pool.h); default 1
//
// Dense rows: a table of 1024-float rows sized to the message; one Push/Pull covers it
// all and is split across the servers. Raw ZeroMQ: a DEALER sends the same bytes to a
// ROUTER that answers with an 8-byte ack, one message in flight (as a push waits for its
// ack), over the same transport (zmq_gbps, plain ZeroMQ: never the shared-memory path) and
// over TCP (zmq_tcp_gbps); memcpy_gbps is one
// thread copying the same bytes between warm buffers. Ratios to ps-lite are against the
// figures measured on this kind of machine (issue 10): push 2.41 / 2.14 / 1.87 GB/s and
// pull 1.82 / 1.99 / 1.58 at 1 / 4 / 16 MB over loopback TCP.
//
// Apply: a server applying a dense push of the same bytes (plain SGD) in process, without
// sockets: GB/s of gradient applied, against memcpy of the same bytes (an SGD update reads
// the gradient and reads and writes the values: 3 streams to memcpy's 2, so ~0.67 is the
// memory-bound ceiling).
//
// Sparse: pulls of 1000 random keys of a 16-float sparse table.
//
// Rounds (--rounds=N): each push/pull row is measured N times, each time right after raw
// ZeroMQ over the path and over TCP, and prints the medians of its GB/s, of raw ZeroMQ's and
// of the per-round ratios. On a shared machine raw ZeroMQ's own rate moves by 1.5x from one
// second to the next; a ratio of two figures taken seconds apart moves with it.
//
// --json=FILE writes one JSON object per row: mode (push|pull|apply|sparse_pull),
// size_bytes, servers, path (tcp|ipc|shm|inproc: shm is ipc with --shm=auto), rounds, gbps,
// zmq_gbps, zmq_tcp_gbps, vs_zmq and vs_zmq_tcp (the median ratios), memcpy_gbps,
// pslite_gbps (where known).
#include <gflags/gflags.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <tuple>

#include "common/job_config.h"
#include "common/security.h"
#include "common/transport.h"
#include "common/wire.h"
#include "server/server_core.h"
#include "server/server_node.h"
#include "worker/kv_client.h"

DEFINE_string(transport, "tcp", "tcp | ipc");
DEFINE_string(shm, "auto",
              "with --transport=ipc: auto carries payloads through shared memory, off through "
              "the socket");
DEFINE_double(seconds, 0.5, "time per measurement");
DEFINE_string(sizes_mb, "1,4,16,64", "dense payload sizes in MB");
DEFINE_string(json, "", "also write one JSON object per row to this file");
DEFINE_string(curve, "off",
              "off: plain ZeroMQ; on: every socket speaks CURVE; compare: dense push/pull "
              "both ways in the same run, with the ratio");
DEFINE_int32(io_threads, 1, "ZeroMQ I/O threads (CURVE encrypts on them)");
DEFINE_int32(server_threads, 1,
             "each in-process server's apply threads (ps_server --server_threads; 0: per core)");
DEFINE_int32(chunk_kb, -1,
             "KVClient chunk size for dense push/pull in KB (KVClientOptions::chunk_bytes); "
             "-1: the client's default, 0: no chunks");

DEFINE_string(servers, "1,2", "server counts of the push and pull rows");
DEFINE_bool(sparse, true, "also measure sparse pulls");
DEFINE_int32(rounds, 1,
             "measurements of each push/pull row, each right after its own raw ZeroMQ ones; "
             "a row prints the medians (of GB/s and of the per-round ratios)");
DEFINE_bool(pull, true, "measure dense pulls (false: pushes only, for a profile of one path)");
DEFINE_int64(think_us, 0,
             "busy microseconds on the calling thread before each request (not counted), as "
             "a worker computes between pulls: the threads a request wakes have gone idle");

namespace ps {
namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr int kRowFloats = 1024;

std::string Endpoint(const std::string& name) {
  if (FLAGS_transport == "ipc")
    return "ipc:///tmp/ps_bench_" + std::to_string(getpid()) + "_" + name;
  return "tcp://127.0.0.1:*";
}

// Keeps this thread busy for `us` microseconds, as a worker computing between requests.
void Think(int64_t us) {
  if (us <= 0) return;
  const auto until = SteadyClock::now() + std::chrono::microseconds(us);
  while (SteadyClock::now() < until) {
  }
}

// Runs `op` repeatedly for about FLAGS_seconds of its own time (after one warm-up) and
// returns calls/s. With --think_us each call follows a busy gap that is not counted.
template <typename F>
double Rate(F&& op) {
  op();
  int n = 0;
  double elapsed = 0;
  do {
    Think(FLAGS_think_us);
    auto start = SteadyClock::now();
    op();
    elapsed += std::chrono::duration<double>(SteadyClock::now() - start).count();
    ++n;
  } while (elapsed < FLAGS_seconds || n < 3);
  return n / elapsed;
}

// ps-lite's figures on this kind of machine (issue 10), 0 where not measured.
double PsLiteGbps(const std::string& mode, int mb) {
  const double push[] = {2.41, 2.14, 1.87}, pull[] = {1.82, 1.99, 1.58};
  const int i = mb == 1 ? 0 : mb == 4 ? 1 : mb == 16 ? 2 : -1;
  if (i < 0) return 0;
  return mode == "push" ? push[i] : mode == "pull" ? pull[i] : 0;
}

double MemcpyGbps(size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  double rate = Rate([&] {
    std::memcpy(b.data(), a.data(), bytes);
    // Keep the copy observable.
    a[bytes / 2] = static_cast<char>(b[bytes / 3] + 1);
  });
  return rate * bytes / 1e9;
}

StoreOptions BenchStore() {
  StoreOptions store;
  store.server_threads = FLAGS_server_threads;
  return store;
}

// A server applying dense pushes of `bytes` in process: GB/s of gradient applied.
double ApplyGbps(size_t bytes) {
  const uint64_t rows = bytes / (kRowFloats * sizeof(float));
  std::map<std::string, std::string> flags = {
      {"model", "none"},
      {"tables", "dense:" + std::to_string(rows) + ":" + std::to_string(kRowFloats)},
      {"num_servers", "1"},
      {"num_workers", "1"}};
  JobConfig config = JobConfig::FromFlagMap(flags).value();
  auto core = ServerCore::Create(config, 0, BenchStore()).value();
  std::vector<float> grads(rows * kRowFloats, 1e-6f);
  double applying = 0;
  uint64_t n = 0;
  while (applying < FLAGS_seconds || n < 3) {
    capnp::MallocMessageBuilder b;
    auto p = NewHeader(b, n + 1, 0).getBody().initPush();
    p.setTableId(0);
    p.setClock(0);
    p.setPulledVersion(0);
    p.getKeys().initRange().setBegin(0);
    p.getKeys().getRange().setEnd(rows);
    Frames f;
    f.push_back(EncodeFrame(b));
    f.push_back(CopyFrame(grads.data(), grads.size() * sizeof(float)));
    auto start = SteadyClock::now();
    Frames reply = core->HandleOne(f);
    if (n > 0) applying += std::chrono::duration<double>(SteadyClock::now() - start).count();
    ++n;
  }
  return (n - 1) * static_cast<double>(bytes) / applying / 1e9;
}

double RawZmqGbps(Transport& t, size_t bytes, const std::string& transport) {
  const std::string saved = FLAGS_transport;
  FLAGS_transport = transport;
  auto server = t.Listen(Endpoint("raw")).value();
  FLAGS_transport = saved;
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
      cores.push_back(ServerCore::Create(config, s, BenchStore()).value());
      sockets.push_back(t.Listen(Endpoint("s" + std::to_string(s))).value());
      endpoints.push_back(sockets.back()->BoundEndpoint());
    }
    for (int s = 0; s < servers; ++s) {
      threads.emplace_back([this, s] {
        (void)ServeUntilShutdown(*sockets[s], *cores[s], stop,
                                 {.poll_interval = std::chrono::milliseconds(50)});
      });
    }
    KVClientOptions o;
    if (FLAGS_chunk_kb >= 0) o.chunk_bytes = static_cast<size_t>(FLAGS_chunk_kb) << 10;
    client = KVClient::Create(&t, config, endpoints, o).value();
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

void CompareCurve(const std::vector<int>& sizes) {
  TransportOptions plain_opt;
  plain_opt.io_threads = FLAGS_io_threads;
  plain_opt.shm = FLAGS_shm == "off" ? ShmMode::kOff : ShmMode::kAuto;
  TransportOptions curve_opt = plain_opt;
  curve_opt.security = BenchCurve();
  Transport plain(plain_opt), curve(curve_opt);
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

// One measurement of a row and the raw ZeroMQ figures taken just before it.
struct Round {
  double gbps, raw, raw_tcp;
};

template <typename F>
double Median(const std::vector<Round>& rounds, F value) {
  std::vector<double> v;
  for (const Round& r : rounds) v.push_back(value(r));
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void Run(const std::vector<int>& sizes, const std::vector<int>& server_counts) {
  if (FLAGS_curve == "compare") return CompareCurve(sizes);
  TransportOptions topt;
  topt.io_threads = FLAGS_io_threads;
  if (FLAGS_curve == "on") topt.security = BenchCurve();
  topt.shm = FLAGS_shm == "off" ? ShmMode::kOff : ShmMode::kAuto;
  TransportOptions raw_opt = topt;
  raw_opt.shm = ShmMode::kOff;  // raw ZeroMQ is the socket alone
  Transport t(topt), raw_t(raw_opt);
  const std::string path =
      FLAGS_transport == "ipc" && topt.shm == ShmMode::kAuto ? "shm" : FLAGS_transport;
  std::vector<nlohmann::json> rows;
  std::printf("ps_bench over %s (each figure: %.1f s of back-to-back requests)\n", path.c_str(),
              FLAGS_seconds);
  std::printf("%-6s %7s %7s %7s %8s %8s %8s %9s %9s %9s %9s\n", "mode", "size_MB", "servers",
              "GB/s", "zmq_path", "zmq_tcp", "memcpy", "/zmq_path", "/zmq_tcp", "/memcpy",
              "/ps-lite");
  for (int mb : sizes) {
    size_t bytes = static_cast<size_t>(mb) << 20;
    const double copy = MemcpyGbps(bytes);
    // Raw ZeroMQ over this path and over TCP, measured just before the row they compare with.
    auto raw_pair = [&] {
      double raw = RawZmqGbps(raw_t, bytes, FLAGS_transport);
      double raw_tcp = FLAGS_transport == "tcp" ? raw : RawZmqGbps(raw_t, bytes, "tcp");
      return std::pair{raw, raw_tcp};
    };
    // One row: medians over the rounds of its GB/s, of raw ZeroMQ's, and of the per-round
    // ratios (each measured back to back, so a noisy neighbour moves both sides of a ratio).
    auto print = [&](const char* mode, int servers, const std::vector<Round>& rounds,
                     const std::string& row_path) {
      const double gbps = Median(rounds, [](const Round& r) { return r.gbps; });
      const double raw = Median(rounds, [](const Round& r) { return r.raw; });
      const double raw_tcp = Median(rounds, [](const Round& r) { return r.raw_tcp; });
      const double vs_raw = Median(rounds, [](const Round& r) { return r.gbps / r.raw; });
      const double vs_tcp = Median(rounds, [](const Round& r) { return r.gbps / r.raw_tcp; });
      const double pslite = PsLiteGbps(mode, mb);
      char vs_pslite[16] = "-";
      if (pslite > 0) std::snprintf(vs_pslite, sizeof(vs_pslite), "%.2f", gbps / pslite);
      std::printf("%-6s %7d %7d %7.2f %8.2f %8.2f %8.2f %9.2f %9.2f %9.2f %9s\n", mode, mb, servers,
                  gbps, raw, raw_tcp, copy, vs_raw, vs_tcp, gbps / copy, vs_pslite);
      nlohmann::json row = {{"mode", mode},         {"size_bytes", bytes},     {"servers", servers},
                            {"path", row_path},     {"rounds", rounds.size()}, {"gbps", gbps},
                            {"zmq_gbps", raw},      {"zmq_tcp_gbps", raw_tcp}, {"vs_zmq", vs_raw},
                            {"vs_zmq_tcp", vs_tcp}, {"memcpy_gbps", copy}};
      if (pslite > 0) row["pslite_gbps"] = pslite;
      rows.push_back(row);
    };
    {
      const auto [raw, raw_tcp] = raw_pair();
      print("apply", 1, {Round{ApplyGbps(bytes), raw, raw_tcp}}, "inproc");
    }
    for (int servers : server_counts) {
      uint64_t table_rows = bytes / (kRowFloats * sizeof(float));
      Cluster c(t, servers,
                "dense:" + std::to_string(table_rows) + ":" + std::to_string(kRowFloats));
      std::vector<float> buf(table_rows * kRowFloats, 0.0f);
      RowRange all{0, table_rows};
      std::vector<Round> push, pull;
      for (int round = 0; round < FLAGS_rounds; ++round) {
        const auto [raw, raw_tcp] = raw_pair();
        push.push_back(
            {Rate([&] { (void)c.client->Wait(c.client->PushRange(0, all, buf)); }) * bytes / 1e9,
             raw, raw_tcp});
        if (!FLAGS_pull) continue;
        pull.push_back(
            {Rate([&] { (void)c.client->Wait(c.client->PullRange(0, all, buf)); }) * bytes / 1e9,
             raw, raw_tcp});
      }
      print("push", servers, push, path);
      if (FLAGS_pull) print("pull", servers, pull, path);
    }
  }
  for (int servers : FLAGS_sparse ? server_counts : std::vector<int>{}) {
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
                    {"path", path},
                    {"rows_per_sec", rate * keys.size()}});
  }
  if (path == "shm") {
    const ShmStats st = t.shm_stats();
    std::printf("shared memory: %llu frames (%.1f GB) through rings, %llu inline (ring full)\n",
                static_cast<unsigned long long>(st.frames_sent), st.bytes_sent / 1e9,
                static_cast<unsigned long long>(st.frames_inline));
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
  // A bad list is the user's input: say so instead of aborting.
  if (FLAGS_shm != "auto" && FLAGS_shm != "off") {
    std::fprintf(stderr, "ps_bench: --shm=%s: expected auto or off\n", FLAGS_shm.c_str());
    return 2;
  }
  ps::Result<std::vector<int>> sizes = ps::ParseIntList("sizes_mb", FLAGS_sizes_mb);
  if (!sizes.ok()) {
    std::fprintf(stderr, "ps_bench: %s\n", sizes.status().ToString().c_str());
    return 2;
  }
  ps::Result<std::vector<int>> servers = ps::ParseIntList("servers", FLAGS_servers);
  if (!servers.ok() || servers->empty()) {
    std::fprintf(stderr, "ps_bench: --servers=%s: expected a list of server counts, such as 1,2\n",
                 FLAGS_servers.c_str());
    return 2;
  }
  for (int n : *servers) {
    if (n < 1 || n > 64) {
      std::fprintf(stderr, "ps_bench: --servers=%s: %d servers, expected 1 to 64\n",
                   FLAGS_servers.c_str(), n);
      return 2;
    }
  }
  if (FLAGS_rounds < 1 || FLAGS_rounds > 1000) {
    std::fprintf(stderr, "ps_bench: --rounds=%d: expected 1 to 1000\n", FLAGS_rounds);
    return 2;
  }
  ps::Run(*sizes, *servers);
  return 0;
}
