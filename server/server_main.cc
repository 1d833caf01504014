// ps_server: holds shards of the model's tables and applies pushes through the optimizer.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <csignal>

#include "common/metrics.h"
#include "common/security_flags.h"
#include "server/server_node.h"

DEFINE_string(coordinator, "", "the coordinator's endpoint, e.g. tcp://127.0.0.1:7000 (required)");
DEFINE_string(listen, "tcp://127.0.0.1:*", "where to listen for workers; port * picks a free one");
DEFINE_int32(
    id, -1, "this process's id within its role, as a launcher numbers it (-1: registration order)");
DEFINE_int32(register_timeout_ms, 120000, "how long to wait for the job to assemble");
DEFINE_int32(io_threads, 1, "ZeroMQ I/O threads");
DEFINE_int32(metrics_port, 0,
             "serve Prometheus metrics at http://METRICS_HOST:PORT/metrics (0: off)");
DEFINE_string(metrics_host, "127.0.0.1", "the address the metrics endpoint binds to");
DEFINE_string(memory_budget, "",
              "bytes this server's rows may take in memory, e.g. 512MB or 4GB (0: no limit; "
              "empty: the job's --memory_budget); colder sparse rows spill to --spill_dir");
DEFINE_string(export_dir, "",
              "when set: at job end write this server's rows to DIR/server-ID.safetensors");
DEFINE_string(spill_dir, "",
              "parent directory of the spill tier, one directory per sparse table (empty: under "
              "the temp directory)");
DEFINE_string(spill_engine, "rocksdb",
              "what holds spilled rows: rocksdb, or file (an on-disk hash table of fixed-size "
              "rows read with pread: 2.4-3.7x faster spilled pulls)");
DEFINE_int32(server_threads, ps::kSharedServerThreads,
             "threads that apply pushes and gather pulls, rows split among them by key (-1: a "
             "quarter of the cores this process may use, 1 to 8, for a host shared with other "
             "servers and workers; 0: one per core, at most 16, for a host of its own; 1: all "
             "on the request thread); requests under 64 KB of rows stay on the request thread");
DEFINE_int64(max_frame_mb, 1024,
             "largest frame accepted, MB; a peer sending a larger one is disconnected");
DEFINE_int32(max_frames, 64,
             "most frames in one message; a longer one gets an error. A worker's batch (a "
             "step's requests to this server, up to 48 frames) counts as one message");
DEFINE_int32(receive_hwm, 1000,
             "requests queued per peer before its connection stops being read (backpressure)");
DEFINE_uint64(max_request_rows, ps::RequestLimits().max_rows, "rows one push or pull may address");
DEFINE_uint64(max_request_mb, ps::RequestLimits().max_value_bytes >> 20,
              "MB of values one push may carry or one pull return");

namespace {
std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }
}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("ps_server --coordinator=tcp://HOST:PORT [--listen=ENDPOINT]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_coordinator.empty()) {
    LOG(ERROR) << "--coordinator is required (e.g. --coordinator=tcp://127.0.0.1:7000)";
    return 2;
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  ps::ServerOptions options;
  options.coordinator = FLAGS_coordinator;
  options.listen = FLAGS_listen;
  options.register_timeout = std::chrono::milliseconds(FLAGS_register_timeout_ms);
  options.requested_id = FLAGS_id;
  auto metrics =
      ps::StartProcessMetrics("server", FLAGS_id, FLAGS_metrics_host, FLAGS_metrics_port);
  if (!metrics.ok()) {
    LOG(ERROR) << "ps_server: " << metrics.status().ToString();
    return 2;
  }
  options.metrics = metrics->get();
  if (!FLAGS_memory_budget.empty()) {
    ps::Result<uint64_t> budget = ps::ParseByteSize("memory_budget", FLAGS_memory_budget);
    if (!budget.ok()) {
      LOG(ERROR) << budget.status().message();
      return 2;
    }
    options.store.memory_budget = static_cast<int64_t>(budget.value());
  }
  options.store.spill_dir = FLAGS_spill_dir;
  ps::Result<ps::SpillEngine> engine = ps::ParseSpillEngine(FLAGS_spill_engine);
  if (!engine.ok()) {
    LOG(ERROR) << "--spill_engine: " << engine.status().message();
    return 2;
  }
  options.store.spill_engine = engine.value();
  ps::Result<int> threads = ps::ResolveServerThreads(FLAGS_server_threads);
  if (!threads.ok()) {
    LOG(ERROR) << threads.status().message();
    return 2;
  }
  options.store.server_threads = threads.value();
  if (threads.value() > 1) LOG(INFO) << "ps_server: " << threads.value() << " apply threads";
  options.export_dir = FLAGS_export_dir;
  ps::TransportOptions topt;
  topt.io_threads = FLAGS_io_threads;
  topt.max_frame_bytes = FLAGS_max_frame_mb << 20;
  topt.max_frames = static_cast<size_t>(std::max(FLAGS_max_frames, 1));
  topt.receive_hwm = FLAGS_receive_hwm;
  options.limits.max_rows = FLAGS_max_request_rows;
  options.limits.max_value_bytes = FLAGS_max_request_mb << 20;
  if (ps::Status sec = ps::InstallSecurityFromFlags(ps::SecurityRole::kServer,
                                                    {FLAGS_listen, FLAGS_coordinator}, &topt);
      !sec.ok()) {
    LOG(ERROR) << "ps_server: " << sec.message();
    return 2;
  }
  ps::Transport transport(topt);
  // A coordinator dead for longer than the job's --coordinator_restart_timeout (not
  // restarted) shuts nobody down: stop as on SIGTERM (writing the checkpoint).
  options.on_coordinator_lost = [] { g_stop.store(true); };
  ps::Status s = ps::RunServer(options, &transport, g_stop);
  if (!s.ok()) {
    LOG(ERROR) << "ps_server: " << s.ToString();
    return 1;
  }
  // Stopped by a signal after handing its shards to its backup (--replicas=2): 128 + 15, as
  // a shell reports a process ended by SIGTERM, so that a launcher starts it again (it
  // takes its shards back) while a server the job shut down exits 0.
  if (g_stop.load()) return 128 + SIGTERM;
  return 0;
}
